"""Every verb's default run gives what it gave when its golden file was recorded: the whole text of
the verbs whose text holds no measured figure, and for the JSON forms every key (nested) with the
values that do not depend on a clock (byte counts, call counts, hashes, the rows' identities).

A refactor of the command line or of the workloads' records must leave these unchanged. After a
deliberate change of an output, re-record the golden files and review their diff:

    cd tests/python && FERRY_REGEN_GOLDEN=1 PYTHONPATH=../../python python -m pytest -q \
        -p no:cacheprovider test_cli_golden.py && git diff golden/

Smaller than the default run, to keep the test in seconds (each change documented in CASES):
bench runs `--repeat 1 --rounds 1` (keys, bytes and calls are those of the default's 6 replicas of 10
rounds; only the times and their spreads differ), `--device cpu` pins the stand-in where a GPU would
be chosen; validate runs `--device cpu`, and `validate --paged` `-npl 2` (the default also runs npl 4).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Dict, List, NamedTuple

import pytest

from ferry.cli import main

GOLDEN = Path(__file__).parent / "golden"
REGEN = os.environ.get("FERRY_REGEN_GOLDEN") == "1"

# Leaves of a JSON record whose value is compared wherever a clock may move the others: what was
# moved and how often, what was computed, and which row it is. Every other leaf is compared by its
# key only (written "~").
EXACT_KEYS = re.compile(
    r"bytes|calls|sha256|^(npl|policy|label|unified|compact|prefetch|prefetch_next|overlap|gather|ntg"
    r"|steps_ahead|rebuilds|split_memory|strategy|layers|resident_layers|index|name|memory|exact"
    r"|memory_measured|n_kv|n_ctx|repeats|replicas)$"
)


class Case(NamedTuple):
    name: str  # the golden file's stem
    argv: List[str]
    form: str  # "text": the whole stdout; "json": keys and values (every value, or EXACT_KEYS')
    every_value: bool = True  # json: compare every non-float value, not only EXACT_KEYS'


CASES = [
    Case("demo", ["demo"], "text"),
    Case("table", ["table"], "text"),
    Case("table.json", ["table", "--json"], "json"),
    Case("plan", ["plan"], "text"),
    Case("plan.json", ["plan", "--json"], "json"),
    Case("plan-paged", ["plan", "--paged"], "text"),
    Case("plan-paged.json", ["plan", "--paged", "--json"], "json"),
    # Its text states the attention time measured on the stand-in: JSON only.
    Case("plan-residency.json", ["plan", "--residency", "--json"], "json", every_value=False),
    Case("bench.json", ["bench", "--repeat", "1", "--rounds", "1", "--device", "cpu", "--json"], "json",
         every_value=False),
    Case("bench-paged.json",
         ["bench", "--paged", "--repeat", "1", "--rounds", "1", "--device", "cpu", "--json"], "json",
         every_value=False),
    Case("bench-residency.json", ["bench", "--residency", "--repeat", "1", "--json"], "json", every_value=False),
    Case("validate", ["validate", "--device", "cpu"], "text"),
    Case("validate-paged", ["validate", "--paged", "--device", "cpu", "-npl", "2"], "text"),
]


def leaves(value: Any, every_value: bool, path: str = "", key: str = "") -> Dict[str, str]:
    """Each leaf of a JSON value as {path: value written out}; "~" where the value is not compared.

    Lists of records are walked by index; a list of plain values is one leaf (its length is in
    its value when compared)."""
    if isinstance(value, dict):
        out: Dict[str, str] = {}
        if not value:
            out[path] = "{}"
        for k, v in value.items():
            out.update(leaves(v, every_value, f"{path}.{k}", k))
        return out
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        out = {}
        for i, v in enumerate(value):
            out.update(leaves(v, every_value, f"{path}[{i}]", key))
        return out
    compared = EXACT_KEYS.search(key) is not None or (every_value and not _has_float(value))
    return {path: json.dumps(value) if compared else "~"}


def _has_float(value: Any) -> bool:
    if isinstance(value, list):
        return any(_has_float(v) for v in value)
    return isinstance(value, float)


def run_case(case: Case, capsys: pytest.CaptureFixture[str]) -> str:
    """The case's stdout, as its golden file holds it."""
    capsys.readouterr()
    assert main(case.argv) == 0, f"ferry {' '.join(case.argv)} failed"
    out = capsys.readouterr().out
    if case.form == "text":
        return out
    flat = leaves(json.loads(out), case.every_value)
    return "".join(f"{path} = {value}\n" for path, value in flat.items())


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_default_run_is_golden(case: Case, capsys: pytest.CaptureFixture[str]) -> None:
    got = run_case(case, capsys)
    golden = GOLDEN / f"{case.name}.txt"
    if REGEN:
        golden.write_text(got)
        return
    want = golden.read_text()
    if got == want:
        return
    verb = "ferry " + " ".join(case.argv)
    if case.form == "text":
        got_lines, want_lines = got.splitlines(), want.splitlines()
        for i, (g, w) in enumerate(zip(got_lines, want_lines)):
            if g != w:
                pytest.fail(f"{verb}: line {i + 1} changed\n  was: {w}\n  now: {g}\n(golden file {golden})")
        pytest.fail(f"{verb}: {len(want_lines)} lines were recorded, {len(got_lines)} now (golden file {golden})")
    got_map = dict(line.split(" = ", 1) for line in got.splitlines())
    want_map = dict(line.split(" = ", 1) for line in want.splitlines())
    problems = [f"  key {k} is gone" for k in want_map if k not in got_map]
    problems += [f"  key {k} is new" for k in got_map if k not in want_map]
    problems += [f"  {k} was {want_map[k]}, now {got_map[k]}" for k in want_map
                 if k in got_map and got_map[k] != want_map[k]]
    pytest.fail(f"{verb}: its JSON changed (golden file {golden})\n" + "\n".join(problems[:40]))
