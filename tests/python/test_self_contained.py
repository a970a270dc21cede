"""A clone of the repository is all a user has: no file may point outside it."""

from __future__ import annotations

import os
from typing import Iterator

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
# spelled in parts, so that this file does not name them itself
OUTSIDE = ("../" + "shared", "SPEC" + ".md")
SKIP_DIRS = {".git", "build", "dist", "__pycache__", ".hypothesis", ".pytest_cache", ".whl", ".mypy_cache",
             ".ruff_cache"}


def repo_files(root: str) -> Iterator[str]:
    for top, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for name in files:
            yield os.path.join(top, name)


def test_no_file_points_outside_the_repository() -> None:
    found = []
    for path in repo_files(ROOT):
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue  # binary files
        for i, line in enumerate(text.splitlines(), 1):
            found += [f"{os.path.relpath(path, ROOT)}:{i}: {word}" for word in OUTSIDE if word in line]
    assert not found, "files that point outside the repository:\n" + "\n".join(found)
