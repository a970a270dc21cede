"""Every Python block of README.md runs, in order, in one namespace: the README's example
cannot drift from the API it shows; its first table is what the command it cites prints."""

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


def test_the_readme_is_a_first_page() -> None:
    """At most 150 lines; the two commands under their markers; its Python example at most 25 lines."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    assert len(text.splitlines()) <= 150
    assert "<!-- main-command -->\n```\npython3 -m pip install . && ferry bench\n```" in text
    assert ("<!-- test-command -->\n```\ntools/system-deps && python3 -m pip install \".[test,remote]\" && tools/test\n```"
            in text)
    assert all(len(b.splitlines()) <= 25 for b in python_blocks(text))


def test_the_readme_example_prints_what_the_readme_says() -> None:
    with open(README, encoding="utf-8") as f:
        text = f.read()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(python_blocks(text)[0], "README.md", "exec"), {"__name__": "__readme__"})
    said = re.search(r"It prints `([^`]+)`", text)
    assert said is not None and out.getvalue().strip() == said.group(1)


def test_the_readme_sample_output_has_the_bench_table_s_columns(capsys: pytest.CaptureFixture[str]) -> None:
    """The sample of `ferry bench` output is the table the code prints now: its header lines and
    columns (a quick run here; the figures are the README's own run)."""
    from ferry.cli import main

    with open(README, encoding="utf-8") as f:
        text = f.read()
    sample = text.split("<!-- main-command -->", 1)[1].split("```\n", 3)[3].split("```", 1)[0].splitlines()
    assert main(["bench", "--repeat", "2", "--rounds", "1", "--device", "cpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert sample[0].split(";")[0] == out[0].split(";")[0] and sample[1] == out[1]
    assert sample[2].split() == out[2].split()
    assert [ln.split()[:2] for ln in sample[3:]] == [ln.split()[:2] for ln in out[3:11]]


def test_the_readme_table_is_what_its_command_prints(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 41: the first table's header and cells are those `ferry table` prints for the command the
    README cites just above it, option for option (it gave another --pad's numbers)."""
    from ferry.cli import main

    with open(README, encoding="utf-8") as f:
        text = f.read()
    cited = re.search(r"`(ferry table [^`]*)` prints:\n\n((?:\|.*\n)+)", text)
    assert cited is not None, "README.md cites no `ferry table ...` command above a table"
    lines = cited.group(2).splitlines()
    table = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines[:1] + lines[2:]]
    assert main(cited.group(1).split()[1:]) == 0
    printed = [re.split(r"\s{2,}", line.strip()) for line in capsys.readouterr().out.splitlines()[1:]]
    assert table == printed


def test_how_to_read_it_explains_every_column_of_the_sample() -> None:
    """Issue 41: each column of the bench table the README shows is named in bold under "How to read it"
    (over unified and copy/step were not)."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    sample = text.split("<!-- main-command -->", 1)[1].split("```\n", 3)[3].split("```", 1)[0].splitlines()
    columns = re.split(r"\s{2,}", sample[2].strip())
    explained = set(re.findall(r"\*\*([^*]+)\*\*", text.split("How to read it:", 1)[1].split("\n\n", 2)[1]))
    assert len(columns) == 8 and [c for c in columns if c not in explained] == []
