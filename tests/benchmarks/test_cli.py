"""The one entry: every suite and case is listed and parses its arguments; one record format."""

from __future__ import annotations

import json

import pytest

from benchmarks import registry
from benchmarks.__main__ import main, suite_parser
from tests.benchmarks.suite_helpers import run_suite


def test_list_names_every_suite(capsys):
    assert main(["--list"]) is None
    printed = capsys.readouterr().out
    for name, (_, summary) in registry.SUITES.items():
        assert f"{name}" in printed and summary in printed


@pytest.mark.parametrize("name", sorted(registry.SUITES))
def test_every_suite_and_case_builds_its_parser(name, capsys):
    """Each suite's module imports, and every case answers --help with --json among its
    options."""
    module = registry.load(name)
    cases = getattr(module, "CASES", None)
    for argv in ([[case, "--help"] for case in cases] if cases else [["--help"]]):
        with pytest.raises(SystemExit) as exit_:
            suite_parser(name).parse_args(argv)
        assert exit_.value.code == 0
        assert "--json" in capsys.readouterr().out


def test_an_unknown_suite_names_the_allowed_ones():
    with pytest.raises(SystemExit, match="unknown suite 'e3e'.*e2e"):
        main(["e3e"])


def test_the_record_names_what_ran_where_and_holds_the_rows(tmp_path):
    """One writer: suite, command, commit, machine, model, arguments, contention, rows."""
    out = tmp_path / "r.json"
    record = run_suite("controller", "cost", "--batch-sizes", "2", "--number", "2",
                       "--json", out)
    doc = json.loads(out.read_text())
    assert set(doc) == {"suite", "command", "commit", "machine", "model", "args", "contention",
                        "rows", "summary"}
    assert doc["suite"] == "controller" and doc["args"]["case"] == "cost"
    assert doc["command"].startswith("python -m benchmarks controller cost --batch-sizes 2")
    assert doc["machine"]["device"] in ("cpu", "cuda") and doc["machine"]["torch"]
    assert doc["rows"] == json.loads(json.dumps(record.rows)) and len(doc["rows"]) == 1
    steal = doc["contention"]["steal"]
    assert steal is None or 0.0 <= steal <= 1.0
