"""The binding's cdef must be the public header as the preprocessor sees it."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from ferry import _binding

HEADER = os.path.join(os.path.dirname(__file__), "..", "..", "lib", "include", "ferry.h")


def _normalise(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to preprocess the header")
def test_installed_cdef_matches_header() -> None:
    fresh = subprocess.run(
        ["cc", "-E", "-P", "-DFERRY_CDEF", "-x", "c", HEADER],
        check=True, capture_output=True, text=True,
    ).stdout
    with open(_binding.CDEF_PATH, encoding="utf-8") as f:
        installed = f.read()
    assert _normalise(installed) == _normalise(fresh), "reinstall ferry: its cdef is older than lib/include/ferry.h"


def test_struct_sizes_agree_with_library() -> None:
    assert _binding.ffi.sizeof("ferry_tensor") == _binding.lib.ferry_sizeof_tensor()
    assert _binding.ffi.sizeof("ferry_stats") == _binding.lib.ferry_sizeof_stats()
