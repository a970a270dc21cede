"""docs/architecture.md names every folder of the library's sources: a folder added under lib/src or
python/ferry without a word in the architecture page fails here. The examples in the docstrings of
the main entry points run, and print what they say. docs/design.md's table of a draft's tokens per
step is what ferry.residency.expected_accepted_tokens gives."""

from __future__ import annotations

import doctest
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

import ferry
from ferry.paged import PagedKVCache
from ferry.residency import expected_accepted_tokens

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
DESIGN = ROOT / "docs" / "design.md"
SOURCE_SUFFIXES = {".c", ".h", ".cu", ".py"}


def source_folders(top: str) -> List[str]:
    """Every folder under top (top included) that holds a source file, as a path from the root."""
    folders = {p.parent for p in (ROOT / top).rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()}
    return sorted(f.relative_to(ROOT).as_posix() for f in folders if "__pycache__" not in f.parts)


def unnamed(folders: List[str], text: str) -> List[str]:
    """The folders text names nowhere (as `lib/src/cpu`, with or without a trailing slash)."""
    return [f for f in folders if f"`{f}`" not in text and f"`{f}/" not in text]


def test_the_source_folders_are_found() -> None:
    assert {"lib/src", "lib/src/cuda", "python/ferry", "python/ferry/cli"} <= set(
        source_folders("lib/src") + source_folders("python/ferry"))


def test_architecture_names_every_source_folder() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert unnamed(source_folders("lib/src") + source_folders("python/ferry"), text) == []


def test_a_folder_left_out_is_seen() -> None:
    text = "`lib/src` and `lib/src/cuda/`"
    assert unnamed(["lib/src", "lib/src/cuda", "lib/src/cpu"], text) == ["lib/src/cpu"]


#: The main entry points: each docstring has an example, run here as a doctest.
ENTRY_POINTS = [ferry.KVCache, PagedKVCache, ferry.Scheduler, ferry.attention_step]


def run_examples(obj: Any) -> doctest.TestResults:
    """Run the examples of obj's own docstring (not its methods') in a fresh namespace; a failure's
    report goes to stdout, where pytest shows it."""
    test = doctest.DocTestParser().get_doctest(obj.__doc__ or "", {}, obj.__qualname__, None, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    return runner.summarize(verbose=False)


@pytest.mark.parametrize("obj", ENTRY_POINTS, ids=lambda o: o.__qualname__)
def test_each_entry_point_s_example_runs_and_prints_what_it_says(obj: Any) -> None:
    failed, attempted = run_examples(obj)
    assert attempted > 0, f"{obj.__qualname__}'s docstring has no example"
    assert failed == 0


def test_an_example_that_prints_something_else_fails() -> None:
    def wrong() -> None:
        """>>> 1 + 1
        3
        """

    assert run_examples(wrong) == doctest.TestResults(failed=1, attempted=1)


# ---------------------------------------------------------------- design.md's table of a draft's tokens

def draft_table(text: str) -> Dict[Tuple[int, float], str]:
    """The cells of design.md's table of tokens per step, by (draft N, acceptance P): each "E (1/E)"."""
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| draft N | P "))
    ps = [float(c.strip()[2:]) for c in lines[head].strip("|").split("|")[1:]]
    cells: Dict[Tuple[int, float], str] = {}
    for line in lines[head + 2:]:
        if not line.startswith("|"):
            break
        n, *values = [c.strip() for c in line.strip("|").split("|")]
        cells.update({(int(n), p): v for p, v in zip(ps, values)})
    return cells


def expected_cell(n: int, p: float) -> str:
    e = expected_accepted_tokens(n, p)
    return f"{e:.2f} ({1 / e:.2f})"


def test_designs_table_of_a_drafts_tokens_is_what_the_library_gives() -> None:
    """Draft 0 to 8 against acceptance 0.5 to 0.9, each cell E(N, P) and 1 / E as the function gives them."""
    cells = draft_table(DESIGN.read_text(encoding="utf-8"))
    want = {(n, p): expected_cell(n, p) for n in range(9) for p in (0.5, 0.6, 0.7, 0.8, 0.9)}
    assert cells == want


def test_a_wrong_cell_of_the_table_is_seen() -> None:
    text = "| draft N | P 0.5 | P 0.9 |\n|---:|---:|---:|\n| 4 | 1.94 (0.52) | 4.10 (0.24) |\n| 5 | 2.00 (0.50) | x |\n"
    cells = draft_table(text)
    assert cells[(4, 0.5)] == expected_cell(4, 0.5) and cells[(4, 0.9)] == expected_cell(4, 0.9)
    assert cells[(5, 0.5)] != expected_cell(5, 0.5) and len(cells) == 4
