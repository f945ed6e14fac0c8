"""``python -m benchmarks <suite> [case] [options] [--json PATH]``; ``--list`` names the suites."""

from __future__ import annotations

import argparse
import shlex
import sys

from benchmarks import registry
from benchmarks.record import Record, commit, machine, plain_args
from benchmarks.timing import Contention


def suite_parser(name: str) -> argparse.ArgumentParser:
    """The suite's parser: its own arguments (per case), and ``--json`` everywhere."""
    module = registry.load(name)
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks {name}",
                                     description=registry.SUITES[name][1])
    cases = getattr(module, "CASES", None)
    if cases is None:
        module.add_arguments(parser)
        parser.add_argument("--json", metavar="PATH", help="write the result record here")
        parser.set_defaults(run=module.run)
        return parser
    sub = parser.add_subparsers(dest="case", required=True)
    for case_name, case in cases.items():
        p = sub.add_parser(case_name, help=case.help, description=case.help)
        case.add_arguments(p)
        p.add_argument("--json", metavar="PATH", help="write the result record here")
        p.set_defaults(run=case.run)
    return parser


def main(argv: list[str] | None = None) -> Record | None:
    """Run one suite; return its record (None: the suite measured nothing, e.g. it saved a
    checkpoint, or this process is not the one that reports)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "--list"):
        width = max(map(len, registry.SUITES))
        print("python -m benchmarks <suite> [options]; suites:" if argv[:1] != ["--list"]
              else "suites:")
        for name, (_, summary) in registry.SUITES.items():
            print(f"  {name:<{width}}  {summary}")
        return None
    if argv[0] not in registry.SUITES:
        raise SystemExit(f"unknown suite {argv[0]!r}: allowed {', '.join(registry.SUITES)} "
                         "(python -m benchmarks --list)")
    args = suite_parser(argv[0]).parse_args(argv[1:])
    contention = Contention()
    result = args.run(args)
    if result is None:
        return None
    record = Record(suite=argv[0], command=shlex.join(["python", "-m", "benchmarks", *argv]),
                    commit=commit(), machine=machine(getattr(args, "device", None)),
                    model=result.model, args=plain_args(args), contention=contention.notes(),
                    rows=result.rows, summary=result.summary)
    if args.json:
        record.write(args.json)
        print(f"wrote {args.json}")
    return record


if __name__ == "__main__":
    main()
