"""docs/architecture.md names every folder of the library's sources: a folder added under lib/src or
python/ferry without a word in the architecture page fails here."""

from __future__ import annotations

from pathlib import Path
from typing import List

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
