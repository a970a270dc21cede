"""docs/architecture.md names every folder of the library's sources: a folder added under lib/src or
python/ferry without a word in the architecture page fails here. The examples in the docstrings of
the main entry points run, and print what they say."""

from __future__ import annotations

import doctest
from pathlib import Path
from typing import Any, List

import pytest

import ferry
from ferry.paged import PagedKVCache

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
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
