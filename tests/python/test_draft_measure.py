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
