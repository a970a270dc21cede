"""tools/draft-measure, the script that prints issue 43's bars side by side: run on tiny geometries (its runs'
options overridden), each table row holds the figures of the bench JSON it ran, over its repeats."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import statistics
import sys
from pathlib import Path
from types import ModuleType

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "draft-measure"
TINY = ["-c", "256", "-npp", "16", "-ntg", "3", "--layers", "2", "--heads", "2", "--head-dim", "32", "--kv-heads",
        "1", "--pad", "1", "--repeat", "1", "--rounds", "1"]


def load_tool() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("draft_measure", str(TOOL))
    spec = importlib.util.spec_from_loader("draft_measure", loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def test_draft_measure_prints_each_runs_figures_over_its_repeats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    tool = load_tool()
    monkeypatch.setattr(sys, "argv", ["draft-measure", "--repeats", "2", "--runs", "A,B", "--out", str(tmp_path),
                                      "--", *TINY])
    tool.main()
    out = capsys.readouterr().out
    assert out.startswith("# Drafts over host windows: A, B, 2 repeats taking turns")
    for run in ("A", "B"):
        runs = [json.loads((tmp_path / f"{run}{i}.json").read_text()) for i in (1, 2)]
        section = out.split(f"## {run}: ferry bench ")[1].split("\n## ")[0]
        assert "Bar: " + tool.BARS[run] in section
        for npl in (2, 4):  # B takes the default -npl
            drafts = [next(r for r in rows if r["npl"] == npl and r["draft"]) for rows in runs]
            ratios = [d["tokens_per_s_over_predicted"] for d in drafts]
            cells = next(ln for ln in section.splitlines() if ln.startswith(f"| {npl} | ")).split(" | ")
            assert cells[5] == (f"{statistics.median(ratios):.2f} ({min(ratios):.2f}..{max(ratios):.2f})")
            assert cells[7] == f"{drafts[0]['accepted_per_step']:.2f} ({drafts[0]['expected_accepted_per_step']:.2f})"
            assert drafts[0]["bytes_per_token_over_single"] == drafts[1]["bytes_per_token_over_single"]  # exact


def test_draft_measure_refuses_an_unknown_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["draft-measure", "--runs", "A,C"])
    with pytest.raises(SystemExit) as e:
        load_tool().main()
    assert e.value.code == 2


def rows(npl: int, e: float, single: tuple, draft: tuple) -> tuple:
    """A single and a draft bench row with their steps' compute A and other time O (seconds): (A, O) each."""
    (a_s, o_s), (a_d, o_d) = single, draft
    s = {"npl": npl, "compute_s_per_step": a_s, "tokens_per_s": npl / (a_s + o_s)}
    d = {"npl": npl, "compute_s_per_step": a_d, "tokens_per_s": e * npl / (a_d + o_d), "accepted_per_step": e}
    d["tokens_per_s_over_single"] = d["tokens_per_s"] / s["tokens_per_s"]
    return s, d


@pytest.mark.parametrize("npl,e,single,draft", [(2, 3.0, (1.0, 1.0), (4.0, 1.0)), (4, 2.62, (0.8, 2.1), (9.2, 2.2))])
def test_speedup_for_is_the_compute_factor_that_reaches_the_bar(npl: int, e: float, single: tuple,
                                                                 draft: tuple) -> None:
    speedup_for = load_tool().speedup_for
    s, d = rows(npl, e, single, draft)
    k = speedup_for(s, d)
    assert k > 1.0
    faster_s, faster_d = rows(npl, e, (single[0] / k, single[1]), (draft[0] / k, draft[1]))
    assert faster_d["tokens_per_s_over_single"] == pytest.approx(1.8)
    assert speedup_for(faster_s, faster_d) == pytest.approx(1.0)


def test_speedup_for_says_met_and_never() -> None:
    speedup_for = load_tool().speedup_for
    assert speedup_for(*rows(2, 3.0, (1.0, 1.0), (1.0, 1.0))) == 1.0  # 3x already
    assert speedup_for(*rows(2, 3.0, (1.0, 1.0), (4.0, 2.0))) == float("inf")  # E O_s = 3 <= 1.8 O_d = 3.6
