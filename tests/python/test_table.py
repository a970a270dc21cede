"""`ferry table`: docs/design.md's numbers from a dry run of the scheduler, its JSON, and its argument errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from ferry import row_size
from ferry.cli import main
from ferry.workloads.table import build_table, n_kv_for, window_stats

SPEC_ARGS = ["table", "-c", "32768", "-npl", "2,4,8", "-npp", "2048", "-ntg", "128", "--pad", "1"]


def test_table_prints_spec_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(SPEC_ARGS) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split("  ") == ["sequences", "cells read", "copied flat", "copied ranges", "copied ragged",
                                    "flat/ranges", "flat/ragged"]
    rows = [line.split() for line in lines[2:]]
    assert rows == [
        ["2", "4,352", "18,560", "4,352", "4,352", "4.26x", "4.26x"],
        ["4", "8,704", "26,752", "8,704", "8,704", "3.07x", "3.07x"],
        ["8", "17,408", "30,848", "17,408", "17,408", "1.77x", "1.77x"],
    ]


def test_table_json_gives_design_mds_cells_per_npl(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(SPEC_ARGS + ["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [sorted(r) for r in rows] == [sorted(["npl", "cells_read", "cells_copied_flat", "cells_copied_ranges",
                                                 "cells_copied_ragged", "ratio", "flat_over_ranges",
                                                 "flat_over_ragged"])] * 3
    assert [(r["npl"], r["cells_read"], r["cells_copied_flat"], r["cells_copied_ranges"], r["cells_copied_ragged"])
            for r in rows] == [(2, 4352, 18560, 4352, 4352), (4, 8704, 26752, 8704, 8704),
                               (8, 17408, 30848, 17408, 17408)]
    assert [round(r["ratio"], 2) for r in rows] == [4.26, 3.07, 1.77]


def test_each_ratio_is_named_for_what_it_divides(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 41: at the default pad the ranges copy its padded window and ragged the cells read, so the two
    ratios differ; the text's columns and the JSON's keys say which is which, and `ratio` keeps its
    first meaning, flat / ranges."""
    args = ["table", "-c", "32768", "-npl", "2,4,8", "-npp", "2048", "-ntg", "128"]
    assert main(args + ["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    for r in rows:
        assert r["flat_over_ranges"] == r["ratio"] == r["cells_copied_flat"] / r["cells_copied_ranges"]
        assert r["flat_over_ragged"] == r["cells_copied_flat"] / r["cells_copied_ragged"]
        assert r["flat_over_ranges"] < r["flat_over_ragged"]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    head = lines[1].split("  ")
    for line, r in zip(lines[2:], rows):
        cells = dict(zip(head, line.split()))
        assert cells["flat/ranges"] == f"{r['flat_over_ranges']:.2f}x"
        assert cells["flat/ragged"] == f"{r['flat_over_ragged']:.2f}x"


def test_table_pads_n_kv_and_caps_it_at_the_stream() -> None:
    assert n_kv_for(2048, 128, 256, 16384) == 2304
    assert n_kv_for(2048, 128, 1, 16384) == 2176
    assert n_kv_for(2048, 128, 256, 2048) == 2048
    (row,) = build_table(32768, [2], 2048, 128, pad=256)  # attention reads 2,176 cells a stream of 2,304
    assert (row.cells.read, row.cells.flat, row.cells.ranges, row.cells.ragged) == (
        4352, 16384 + 2304, 4608, 4352)
    (full,) = build_table(4096, [2], 2048, 128, pad=256)  # n_kv capped at kv_size: no gap, nothing to gain
    assert (full.cells.read, full.cells.flat, full.cells.ranges) == (4096, 4096, 4096)


def test_table_counts_uneven_lengths_and_ragged_copies_only_them() -> None:
    """Issue 35: prompts drawn up to -npp (seeded), or given: attention reads each stream's own cells,
    which ragged copies alone; ranges copies the longest, padded, in every stream; at npl 8 with lengths
    spread up to 2,048, ragged moves at most 0.6x the cells of ranges."""
    rows = build_table(32768, [2, 4, 8], 2048, 128, pad=256, type_k="f16", head_dim=64, n_head_kv=2,
                       lengths="uniform")
    for r in rows:
        assert r.cells.ragged == r.cells.read < r.cells.ranges < r.cells.flat
    assert rows[2].cells.ragged <= 0.6 * rows[2].cells.ranges
    again = build_table(32768, [8], 2048, 128, pad=256, type_k="f16", head_dim=64, n_head_kv=2, lengths="uniform")
    assert again == rows[2:]  # seeded: the same draws every run
    (given,) = build_table(32768, [2], 2048, 128, pad=256, type_k="f16", head_dim=64, n_head_kv=2,
                           lengths=(100, 2000))
    assert given.cells.read == given.cells.ragged == 100 + 128 + 2000 + 128
    assert given.cells.ranges == 2 * 2304
    (f16,) = build_table(8192, [4], 100, 28, type_k="f16", head_dim=64, n_head_kv=2)
    assert (f16.cells.read, f16.cells.flat) == (4 * 128, 3 * 2048 + 128)


@pytest.mark.parametrize("args,message", [
    (["-c", "32768", "-npl", "3", "-npp", "2048", "-ntg", "128"], "does not split into 3 equal streams"),
    (["-c", "32768", "-npl", "2,x", "-npp", "2048", "-ntg", "128"], "integers separated by commas"),
    (["-c", "32768", "-npl", "2", "-npp", "2048", "-ntg", "128", "--type", "q9"], "unknown type name 'q9'"),
    (["-c", "32768", "-npl", "2", "-npp", "2048", "-ntg", "128", "--head-dim", "100", "--type", "q8_0"],
     "not a whole number of q8_0 blocks"),
    (["-c", "32768", "-npl", "2", "-npp", "2048", "-ntg", "128", "--pad", "0"], "argument --pad: 0 is out of range"),
    (["-c", "0", "-npl", "2", "-npp", "2048", "-ntg", "128"], "argument -c: 0 is out of range"),
    (["-c", "32768", "-npl", "2", "-npp", "2048", "-ntg", "-1"], "argument -ntg: -1 is out of range"),
])
def test_table_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str], args: list, message: str) -> None:
    with pytest.raises(SystemExit) as e:
        main(["table"] + args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_installed_command_runs() -> None:
    exe = shutil.which("ferry", path=os.path.dirname(sys.executable)) or shutil.which("ferry")
    cmd = [exe] if exe else [sys.executable, "-m", "ferry.cli"]
    done = subprocess.run(cmd + SPEC_ARGS + ["--json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [r["cells_copied_flat"] for r in json.loads(done.stdout)] == [18560, 26752, 30848]
    bad = subprocess.run(cmd + ["table", "-c", "100", "-npl", "3", "-npp", "1", "-ntg", "1"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "equal streams" in bad.stderr


def test_bytes_read_is_the_cells_the_lengths_cover_under_every_policy() -> None:
    """Issue 41: bytes_read has one definition, whatever the policy: a window carrying its streams'
    lengths reads the cells they cover (100 + 250 here), not the window's layout (2 x 300) nor its
    span; what each policy copies beyond it is bytes_copied's to say."""
    row = row_size("f16", 64 * 2)
    st = window_stats(4096, 2, 300, "f16", 64, 2, used=[100, 250])
    assert {p: s.bytes_read for p, s in st.items()} == {"flat": 350 * row, "ranges": 350 * row, "ragged": 350 * row}
    assert (st["flat"].bytes_copied, st["ranges"].bytes_copied, st["ragged"].bytes_copied) == (
        st["flat"].bytes_span, 600 * row, 350 * row)
