"""Tokens/s of greedy generation with and without speculation, beside Hugging Face ``generate``.

The plain-script form of ``02_speedups.ipynb``: for prompts that copy from the prompt and
open-ended ones, the engine with no speculation, n-gram and early-exit self-draft for each k, and
HF ``generate`` plain and with ``prompt_lookup_num_tokens``, at each batch size. Prints a table
(speedup over the engine without speculation, measured alpha and c, Leviathan's prediction);
``--json`` writes every measurement, ``--plot PREFIX`` saves the three figures as PNG files.

    python examples/compare_speedups.py --quick
    python examples/compare_speedups.py --ks 1 2 4 8 --batch-sizes 1 16 --json speedups.json
"""

from __future__ import annotations

import argparse
import json

import _repo_path  # noqa: F401  (the repository root on sys.path)
import speedup_lib as lib


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="auto (GPU when there is one), cpu, cuda")
    parser.add_argument("--kinds", nargs="+", default=["copy", "open"], choices=["copy", "open"])
    parser.add_argument("--methods", nargs="+", default=list(lib.METHODS), choices=lib.METHODS)
    parser.add_argument("--ks", nargs="+", type=int, default=list(range(1, 9)),
                        help="draft lengths k (default 1..8)")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--policy-k", type=int, default=4, help="also run each proposer with "
                        "the default policy (adaptive k), at most this many drafts a step "
                        "(0: not)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per prompt at most")
    parser.add_argument("--num-prompts", type=int, default=None,
                        help="prompts of each kind (default: all three)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: k 2 and 4, batch 1 and 4, 12 tokens, one prompt")
    parser.add_argument("--json", metavar="PATH", help="write the measurements as JSON")
    parser.add_argument("--plot", metavar="PREFIX", help="save PREFIX_tokens_per_s.png, "
                        "PREFIX_acceptance.png and PREFIX_vs_theory.png")
    args = parser.parse_args(argv)
    if args.quick:
        args.ks, args.batch_sizes, args.max_tokens, args.num_prompts = [2, 4], [1, 4], 12, 1
    for name in ("ks", "batch_sizes"):
        bad = [v for v in getattr(args, name) if v < 1 or (name == "ks" and v > 32)]
        if bad:
            parser.error(f"--{name.replace('_', '-')} {bad}: allowed integers "
                         f"{'in [1, 32]' if name == 'ks' else '>= 1'}")
    if args.max_tokens < 1:
        parser.error(f"--max-tokens {args.max_tokens}: allowed an integer >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = lib.default_device() if args.device == "auto" else args.device
    print(f"# {lib.machine_description()}", flush=True)
    model, tokenizer = lib.load_default_model(device)

    def log(m: lib.Measurement) -> None:
        k = f"<={m.k} (policy)" if m.policy else str(m.k)
        print(f"  {m.kind:<4} batch {m.batch_size:>2} {m.method:<16} k={k}: "
              f"{m.tokens_per_s:7.2f} tokens/s", flush=True)

    results = lib.run_sweep(model, tokenizer, args.kinds, args.methods, args.ks,
                            args.batch_sizes, args.max_tokens, args.num_prompts, log,
                            policy_k=args.policy_k or None)
    print(lib.format_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": lib.machine_description(), "args": vars(args),
                       "results": [m.to_dict() for m in results]}, f, indent=1)
    if args.plot:
        import speedup_plots as plots

        plots.plot_tokens_per_s(results).savefig(f"{args.plot}_tokens_per_s.png", dpi=100)
        plots.plot_acceptance_per_position(results).savefig(f"{args.plot}_acceptance.png",
                                                             dpi=100)
        plots.plot_speedup_vs_theory(results).savefig(f"{args.plot}_vs_theory.png", dpi=100)


if __name__ == "__main__":
    main()
