"""Every Python block of README.md runs, in order, in one namespace: the README's example
cannot drift from the API it shows."""

from __future__ import annotations

import contextlib
import io
import os
import re
from typing import List

import pytest

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")


def python_blocks(text: str) -> List[str]:
    """The bodies of the ```python fenced blocks of a Markdown text."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_readme_python_blocks_run() -> None:
    with open(README, encoding="utf-8") as f:
        blocks = python_blocks(f.read())
    assert blocks, "README.md has no ```python block"
    namespace: dict = {"__name__": "__readme__"}
    for i, block in enumerate(blocks):
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)
            except Exception as e:  # the block and its error, not only a traceback into exec
                pytest.fail(f"README.md's python block {i + 1} fails: {type(e).__name__}: {e}\n{block}")


def test_readme_and_package_docstring_show_the_same_python_sweep() -> None:
    """The README runs a sweep with the API the package's docstring names for it."""
    import ferry
    import ferry.workloads.bench as bench

    with open(README, encoding="utf-8") as f:
        blocks = python_blocks(f.read())
    sweep = [b for b in blocks if "from ferry.workloads.bench import BenchConfig, run_bench" in b]
    assert len(sweep) == 1 and "run_bench(cfg)" in sweep[0]
    doc = " ".join((ferry.__doc__ or "").split())
    assert "a sweep in Python builds one ferry.workloads.bench.BenchConfig per point" in doc
    assert "calls run_bench(cfg)" in doc
    assert callable(bench.run_bench) and bench.BenchConfig().check() is None
