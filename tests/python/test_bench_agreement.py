"""tools/bench-agreement's verdict: the spread of the headline gains and the intervals' honesty,
on canned runs (a stand-in for `ferry bench --json` that prints given rows), so every bar is
seen to pass and to fail."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench-agreement"

#: Prints the next run's rows (runs.json beside it), counting runs in a file.
FAKE = '''import json, pathlib, sys
here = pathlib.Path(sys.argv[1])
n = int((here / "count").read_text()) if (here / "count").exists() else 0
(here / "count").write_text(str(n + 1))
print(json.dumps(json.loads((here / "runs.json").read_text())[n]))
'''


def rows(gain: float, low: float, high: float) -> List[dict]:
    """One npl's flat and ranges rows of a run, ranges' gain over flat with its interval."""
    base = {"npl": 2, "unified": False, "compact": False, "overlap": False, "replicas": 6, "over_unified": None,
            "over_unified_low": None, "over_unified_high": None, "tokens_per_s": 3000.0}
    flat = {**base, "policy": "flat", "gain": 0.0, "gain_low": 0.0, "gain_high": 0.0, "gain_claimed": False}
    ranges = {**base, "policy": "ranges", "gain": gain, "gain_low": low, "gain_high": high, "gain_claimed": True}
    return [flat, ranges]


def agreement(tmp_path: Path, runs: List[Tuple[float, ...]]) -> Tuple[int, str]:
    (tmp_path / "runs.json").write_text(json.dumps([rows(*r) for r in runs]))
    (tmp_path / "fake.py").write_text(FAKE)
    ferry = f"{shlex.quote(sys.executable)} {shlex.quote(str(tmp_path / 'fake.py'))} {shlex.quote(str(tmp_path))}"
    out = subprocess.run([sys.executable, str(TOOL), "--runs", str(len(runs)), "--ferry", ferry,
                          "--save", str(tmp_path / "saved")], capture_output=True, text=True, check=False)
    return out.returncode, out.stdout


def test_runs_whose_gains_agree_pass_both_bars_and_are_saved(tmp_path: Path) -> None:
    code, out = agreement(tmp_path, [(0.30 + 0.01 * i, 0.26 + 0.01 * i, 0.34 + 0.01 * i) for i in range(4)])
    assert code == 0, out
    assert "| 2 | ranges over flat | +30.0 +31.0 +32.0 +33.0 | 3.0 | 3 3 3 3 | 3 |" in out
    assert "bar 1, headline gains (over flat) of every pair of runs within 5 points at every npl: PASS" in out
    assert "bar 2, each run's interval contains at least 3 of the other 3 estimates: PASS" in out
    assert out.rstrip().endswith("verdict: the runs agree")
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == [f"run-{i}.json" for i in range(1, 5)]


@pytest.mark.parametrize("runs, bar1, bar2", [
    ([(0.30, 0.20, 0.40), (0.36, 0.26, 0.46), (0.31, 0.21, 0.41)], "FAIL", "PASS"),  # 6 points apart
    ([(0.30, 0.299, 0.301), (0.32, 0.319, 0.321), (0.31, 0.309, 0.311)], "PASS", "FAIL"),  # intervals too narrow
])
def test_runs_too_far_apart_or_too_narrow_fail_their_bar_and_exit_1(tmp_path: Path, runs: List[Tuple[float, float, float]], bar1: str, bar2: str) -> None:
    code, out = agreement(tmp_path, runs)
    assert code == 1, out
    assert f"within 5 points at every npl: {bar1}" in out and f"of the other 2 estimates: {bar2}" in out
    assert out.rstrip().endswith("verdict: the runs do NOT agree")


def test_each_runs_wall_time_is_printed_and_busy_keeps_a_core_spinning(tmp_path: Path) -> None:
    """Each run's wall time is printed and their range; --busy keeps another process spinning on a core
    while they run, and says so."""
    (tmp_path / "runs.json").write_text(json.dumps([rows(0.67, 0.66, 0.68), rows(0.66, 0.65, 0.67)]))
    (tmp_path / "fake.py").write_text(FAKE)
    ferry = f"{shlex.quote(sys.executable)} {shlex.quote(str(tmp_path / 'fake.py'))} {shlex.quote(str(tmp_path))}"
    out = subprocess.run([sys.executable, str(TOOL), "--runs", "2", "--busy", "--ferry", ferry],
                         capture_output=True, text=True, check=False).stdout
    assert "another process keeps one core busy" in out and "run 1: " in out and ", 6 replicas" in out
    assert "a run's wall time: " in out and "s, one core kept busy" in out
