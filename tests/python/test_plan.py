"""Copy plans from Python: KV-cache windows, the transposed V, contiguous and permuted views, views
too tangled to plan, the cost model against docs/design.md's anchors, bad input, and `ferry plan`."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import ferry
from conftest import SENTINEL, pattern
from ferry.cli import main

ROW_Q8 = 1088  # a q8_0 row of 1024 channels


def test_k_window_is_one_copy_the_ranges_rule_finds() -> None:
    kv = ferry.KVCache("q8_0", "q8_0", 128, 8, 32768, 2)
    k, _ = kv.window(0, 2176, 0, 1)
    assert ferry.plan.plan_copy(k) == [ferry.Copy2D(0, 2176 * ROW_Q8, 2, 16384 * ROW_Q8)]
    assert tuple(ferry.plan.plan_copy(k)[0]) == tuple(ferry.copy_path.copy_ranges_of(k))
    assert ferry.plan.plan_copy("q8_0", k.ne, k.nb, k.offset) == ferry.plan.plan_copy(k)
    # streams 1..3 of 4: offsets from the layer's first byte (the window starts a stream in)
    kv4 = ferry.KVCache("q8_0", "q8_0", 128, 8, 32768, 4)
    k4, _ = kv4.window(0, 2176, 1, 3)
    assert k4.offset == 8192 * ROW_Q8
    assert ferry.plan.plan_copy(k4) == [ferry.Copy2D(8192 * ROW_Q8, 2176 * ROW_Q8, 3, 8192 * ROW_Q8)]
    assert ferry.plan.plan_copy(k4)[0].nbytes == ferry.copy_path.bytes_read(k4) == 3 * 2176 * ROW_Q8
    assert ferry.plan.plan_copy(k4)[0].end == k4.offset + k4.nbytes


def test_transposed_v_unified_is_one_copy_of_a_fifteenth_of_the_span() -> None:
    kv = ferry.KVCache("f16", "f16", 128, 8, 32768, 1, v_trans=True)
    _, v = kv.window(0, 2176, 0, 0)
    (c,) = ferry.plan.plan_copy(v)
    assert c == ferry.Copy2D(0, 2176 * 2, 1024, 32768 * 2)  # 1024 channel rows of 4352 B, pitch 64 KiB
    assert c.nbytes == ferry.copy_path.bytes_read(v) == 1024 * 4352
    assert v.nbytes / c.nbytes > 15
    assert ferry.plan.plan_pays(v, "gpu") and ferry.plan.plan_pays(v, "cpu")
    ex = ferry.plan.explain(v)
    assert (ex.row, ex.row_dims, ex.folds, ex.nested, ex.n_copies) == (4352, (0,), (((1,), (2,)),), True, 1)


def test_contiguous_and_unified_k_are_one_flat_copy_that_does_not_pay() -> None:
    t = ferry.Tensor.new("f32", [5, 3, 2])
    assert ferry.plan.plan_copy(t) == [ferry.Copy2D(0, 120, 1, 120)]
    assert ferry.plan.plan_copy("q4_0", [64, 3], [18, 36]) == [ferry.Copy2D(0, 108, 1, 108)]
    kv = ferry.KVCache("q8_0", "q8_0", 128, 8, 32768, 1)
    k, _ = kv.window(0, 2176)
    assert ferry.plan.plan_copy(k) == [ferry.Copy2D(0, k.nbytes, 1, k.nbytes)]
    # the same bytes as flat in the same one call: a tie, and a tie stays flat (the path must not change)
    assert not ferry.plan.plan_pays(k, "gpu") and not ferry.plan.plan_pays(k, "cpu")
    assert ferry.plan.plan_copy("f32", [0, 3], [4, 16]) == []  # an empty view reads nothing


def test_window_layout_is_the_view_a_window_takes() -> None:
    """The layout and cell offsets C gives make the window's own view, and the view layout_view plans."""
    kv = ferry.KVCache("f16", "f16", 64, 2, 96, 3, v_trans=True)
    for which in ("k", "v"):
        ne, nb, offset = kv.window_layout(which, 5, 1, 2)
        k, v = kv.window(0, 5, 1, 2)
        w = k if which == "k" else v
        t = kv.k(0) if which == "k" else kv.v(0)
        view = t.view(ne, nb, offset).permute(0, 2, 1, 3)
        assert (view.ne, view.nb, view.offset) == (w.ne, w.nb, w.offset)
        assert ferry.plan.plan_copy(view) == ferry.plan.plan_copy(w)
        assert offset == kv.cell_offset(which, 1, 0)
    assert kv.cell_offset("k", 2, 3) == (2 * 32 + 3) * 256  # a cell: 128 f16 values
    assert kv.cell_offset("v", 2, 32) == (2 * 32 * 128 + 32) * 2  # transposed: cells are values
    with pytest.raises(ferry.OutOfBoundsError, match="cell 33 of stream 0"):
        kv.cell_offset("k", 0, 33)
    with pytest.raises(ferry.InvalidArgumentError, match="which is 'k' or 'v'"):
        kv.window_layout("q", 1)


def test_permuted_overlapping_and_broadcast_layouts_plan_each_byte_once() -> None:
    # every other f32 of 3 rows, then rows and columns swapped (dimension 0 no longer innermost)
    assert ferry.plan.plan_copy("f32", [3, 4], [32, 8], 4) == [ferry.Copy2D(4, 4, 12, 8)]
    assert ferry.plan.plan_copy("f32", [4, 3], [8, 32], 4) == ferry.plan.plan_copy("f32", [3, 4], [32, 8], 4)
    src = ferry.Tensor.new("f32", [64], name="src")
    view = src.view([4, 3], [4, 40], 8).permute(1, 0, 2, 3)
    assert view.ne[:2] == (3, 4) and view.nb[:2] == (40, 4)
    assert ferry.plan.plan_copy(view) == ferry.plan.plan_copy("f32", [3, 4], [40, 4], 8) == [ferry.Copy2D(8, 16, 3, 40)]
    lv = ferry.plan.layout_view("f32", [3, 4], [40, 4], 8)
    assert (lv.ne, lv.nb[:2], lv.offset, lv.root.nbytes) == (view.ne, view.nb[:2], 8, 8 + 2 * 40 + 16)
    # no dimension steps by one element, but a one-value dimension can be put first and permuted
    assert ferry.plan.plan_copy("f32", [2, 2], [8, 16]) == [ferry.Copy2D(0, 4, 4, 8)]
    # giant strides are metadata: nothing is allocated
    assert ferry.plan.plan_copy("f32", [4, 2], [4, 2**62]) == [ferry.Copy2D(0, 16, 2, 2**62)]
    # overlapping rows (stride 2 under a 4-byte element) merge into one range
    assert ferry.plan.plan_copy("f16", [2, 5], [2, 2]) == [ferry.Copy2D(0, 12, 1, 12)]
    # broadcast: stride 0 adds no bytes
    assert ferry.plan.plan_copy("i32", [4, 6], [4, 0], 12) == [ferry.Copy2D(12, 16, 1, 16)]


def _tangled() -> tuple:
    """An f32 view whose two dimensions interleave over 1100 x 1100 rows: too many to plan."""
    return "f32", [1, 1100, 1100], [4, 12, 20]


def test_too_tangled_raises_and_the_plan_policy_copies_flat() -> None:
    ty, ne, nb = _tangled()
    with pytest.raises(ferry.UnsupportedError, match="more than 1048576 rows; copy the span instead"):
        ferry.plan.plan_copy(ty, ne, nb)
    view = ferry.plan.layout_view(ty, ne, nb)
    assert not ferry.plan.plan_pays(view, "gpu")
    assert ferry.copy_path.bytes_read(view) == 4 * 1100 * 1100  # element bytes, as ferry.h says for these
    assert not ferry.plan.explain(ty, ne, nb).nested
    outs = {}
    for policy in ("flat", "plan"):
        cpu, split = ferry.CPUBackend(), ferry.DummyBackend(real_memory=True)
        src = cpu.alloc_tensor("f32", [view.nbytes // 4])
        src.set(pattern(view.nbytes))
        v = ferry.plan.layout_view(ty, ne, nb, source=src)
        out = ferry.ops.dup(v, name="out").set_output()
        g = ferry.Graph(out)
        sched = ferry.Scheduler([split, cpu], policy=policy)
        sched.assign(out, split)
        sched.compute(g)
        (inp,) = sched.inputs
        assert inp.stats.path == ferry.CopyPolicy.FLAT and inp.stats.bytes_copied == view.nbytes
        outs[policy] = out.get()
    assert outs["flat"] == outs["plan"]


def test_scheduler_plan_path_moves_the_plan() -> None:
    """The transposed V window of a small cache through the scheduler: the plan's one 2-D copy, gaps untouched."""
    cpu, split = ferry.CPUBackend(), ferry.DummyBackend(real_memory=True)
    kv = ferry.KVCache("f16", "f16", 64, 2, 8192, 1, v_trans=True)
    kv.v(0).set(pattern(kv.v(0).nbytes))
    _, v = kv.window(0, 2048)
    (c,) = ferry.plan.plan_copy(v)
    assert c == ferry.Copy2D(0, 4096, 128, 16384)
    out = ferry.ops.dup(v, name="out").set_output()
    g = ferry.Graph(out)
    sched = ferry.Scheduler([split, cpu], policy="plan")
    sched.assign(out, split)
    sched.alloc(g)
    (inp,) = sched.inputs
    inp.copy.memset(SENTINEL)
    sched.compute(g)
    st = sched.inputs[0].stats
    assert (st.path, st.bytes_copied, st.copy_calls) == (ferry.CopyPolicy.PLAN, c.nbytes, 1)
    got = np.frombuffer(inp.copy.get(), np.uint8)
    src = np.frombuffer(pattern(kv.v(0).nbytes), np.uint8)
    rows = c.offset + np.arange(c.count)[:, None] * c.stride + np.arange(c.size)
    read = np.zeros(v.nbytes, bool)
    read[rows.ravel()] = True
    assert np.array_equal(got[read], src[: v.nbytes][read]) and (got[~read] == SENTINEL).all()
    np.testing.assert_array_equal(out.to_numpy(), v.to_numpy())


def test_a_models_c_struct_is_built_once_and_its_copies_and_pickles_price_the_same() -> None:
    """CopyCostModel keeps the struct C reads (built on first use: the model is frozen); a copy, a
    deep copy, a pickle and a replace each carry the figures, not the struct, and price as it does."""
    import copy
    import pickle

    gpu = ferry.plan.CopyCostModel.gpu()
    m = gpu._c()
    assert gpu._c() is m and m.kernel_gbps == gpu.kernel_gbps
    for other in (copy.copy(gpu), copy.deepcopy(gpu), pickle.loads(pickle.dumps(gpu))):
        assert other == gpu and other.piece_seconds(4096) == gpu.piece_seconds(4096)
        assert other._c() is not m
    dear = dataclasses.replace(gpu, call_us=1e6)
    assert dear._c() is not m and dear._c().call_us == 1e6 and m.call_us == gpu.call_us


def test_the_cost_models_are_frozen_presets_that_give_design_mds_copy_times() -> None:
    cpu, gpu = ferry.plan.CopyCostModel.cpu(), ferry.plan.CopyCostModel.gpu()
    assert cpu == ferry.plan.CopyCostModel(0.2, 30.0, 11.8, 64, 8192, 0.6, 0, 0.0, piece_ns=30.0)
    assert gpu == ferry.plan.CopyCostModel(4.0, 0.0, 54.9, 64, 256, 0.73, 65536, 42.0, piece_ns=1200.0,
                                           kernel_gbps=47.7)
    assert ferry.plan.CopyCostModel.of_backend(ferry.CPUBackend()) == cpu == ferry.plan.cost_model("cpu")
    assert ferry.plan.cost_model(ferry.DummyBackend()) == cpu and ferry.plan.cost_model(gpu) is gpu
    with pytest.raises(dataclasses.FrozenInstanceError):
        cpu.gbps = 1.0  # type: ignore[misc]
    assert cpu.as_dict()["row_ns"] == 30.0
    # docs/design.md's anchors on the GPU model: the q8_0 K window over 2 streams, flat 372 us against 91 us
    kv = ferry.KVCache("q8_0", "q8_0", 128, 8, 32768, 2)
    k, _ = kv.window(0, 2176, 0, 1)
    assert ferry.plan.flat_cost(k.nbytes, "gpu") * 1e6 == pytest.approx(372, rel=0.03)
    assert ferry.plan.plan_cost(ferry.plan.plan_copy(k), "gpu") * 1e6 == pytest.approx(91, rel=0.03)
    # the transposed V at a 64 KiB pitch: 128 us as one 2-D copy
    assert ferry.plan.plan_cost([(0, 4352, 1024, 65536)], gpu) * 1e6 == pytest.approx(128, rel=0.03)
    assert ferry.plan.plan_cost([], "gpu") == 0.0 and ferry.plan.flat_cost(0, "gpu") == 0.0
    # a plan with a custom model: a call so dear that one flat copy always wins
    dear = dataclasses.replace(gpu, call_us=1e6)
    assert ferry.plan.plan_pays(k, "gpu") and ferry.plan.plan_pays(k, dear) is True  # one copy vs one call: bytes decide
    assert not ferry.plan.plan_pays(kv.window(0, 2176, 0, 0)[0], dear)


@pytest.mark.parametrize("make,exc,message", [
    (lambda: ferry.plan.plan_copy("q9", [4], [4]), ferry.UnknownTypeError, "unknown type name 'q9'"),
    (lambda: ferry.plan.plan_copy(99, [4], [4]), ferry.UnknownTypeError, "unknown type"),
    (lambda: ferry.plan.plan_copy("q8_0", [33], [34]), ferry.LayoutError, "not a whole number of q8_0 blocks of 32"),
    (lambda: ferry.plan.plan_copy("f32", [-1], [4]), ferry.InvalidArgumentError, "ne[0] = -1 is negative"),
    (lambda: ferry.plan.plan_copy("f32", [4, 2], [4, -8]), ferry.InvalidArgumentError, "nb[1]: -8 is negative"),
    (lambda: ferry.plan.plan_copy("f32", [4], [4], -1), ferry.InvalidArgumentError, "offset: -1 is negative"),
    (lambda: ferry.plan.plan_copy("f32", [4], [4], 2**64), ferry.InvalidArgumentError, "overflows a 64-bit size"),
    (lambda: ferry.plan.plan_copy("f32", [4, 3], [4, 2**63]), ferry.OutOfBoundsError, "view: strides overflow"),
    (lambda: ferry.plan.plan_copy("f32", [4, 2], [4, 2**63]), ferry.OutOfBoundsError, "reaches past"),
    (lambda: ferry.plan.plan_copy("f32", [4], [4, 4]), ferry.InvalidArgumentError, "1 dimensions need 1 strides"),
    (lambda: ferry.plan.plan_copy("f32", [1.5], [4]), ferry.InvalidArgumentError, "expected an integer"),
    (lambda: ferry.plan.plan_copy("f32", [2] * 4, [8, 16, 32, 64]), ferry.LayoutError, "no dimension has stride 4"),
    (lambda: ferry.plan.plan_copy("q8_0", [32, 2], [68, 34]), ferry.LayoutError, "block types keep dimension 0"),
    (lambda: ferry.Tensor.new("f32", [8]).view([2], [8]), ferry.LayoutError, "nb[0] is 8 but a f32 element is 4"),
    (lambda: ferry.plan.plan_copy("f32", [1, 2, 3, 4, 5], [4] * 5), ferry.InvalidArgumentError, "1 to 4 dimensions"),
    (lambda: ferry.plan.plan_copy("f32"), ferry.InvalidArgumentError, "a type needs ne and nb (or give a Tensor)"),
    (lambda: ferry.plan.plan_copy(ferry.Tensor.new("f32", [4]), [4], [4]), ferry.InvalidArgumentError,
     "a tensor's layout is its own"),
    (lambda: ferry.plan.explain(ferry.Tensor.new("f32", [4]), [4]), ferry.InvalidArgumentError,
     "a tensor's layout is its own"),
    (lambda: ferry.plan.layout_view("f16", [4], [2], source=ferry.Tensor.new("f32", [8])), ferry.LayoutError,
     "the source is f32, the view f16"),
    (lambda: ferry.plan.plan_cost([(0, 4, 1)]), ferry.InvalidArgumentError, "copy 0 is not (offset, size, count, stride)"),
    (lambda: ferry.plan.plan_cost([(0, 4, -1, 4)]), ferry.InvalidArgumentError, "copy 0: -1 is negative"),
    (lambda: ferry.plan.plan_cost("x"), ferry.InvalidArgumentError, "expected a list of copies"),
    (lambda: ferry.plan.flat_cost(-1), ferry.InvalidArgumentError, "span: -1 is negative"),
    (lambda: ferry.plan.cost_model("tpu"), ferry.InvalidArgumentError, "expected 'cpu', 'gpu'"),
    (lambda: ferry.plan.CopyCostModel(1, 1, 0, 1, 1, 1, 1, 1), ferry.InvalidArgumentError, "gbps must be positive"),
    (lambda: ferry.plan.CopyCostModel(1, 1, 1, -1, 1, 1, 1, 1), ferry.InvalidArgumentError, "line_bytes: -1 is negative"),
    (lambda: ferry.plan.CopyCostModel(float("nan"), 1, 1, 1, 1, 1, 1, 1), ferry.InvalidArgumentError, "call_us"),
    (lambda: ferry.plan.CopyCostModel(1, 1, 1, 1, 1, 1.5, 1, 1), ferry.InvalidArgumentError, "small_row_efficiency"),
    (lambda: ferry.plan.explain("q4_0", [31], [18]), ferry.LayoutError, "not a shape of whole q4_0 blocks"),
])
def test_bad_input_raises_ferry_errors(make: object, exc: type, message: str) -> None:
    with pytest.raises(exc) as e:
        make()  # type: ignore[operator]
    assert message in str(e.value)


# ---------------------------------------------------------------- ferry plan

GEOMETRY = ["--head-dim", "128", "--kv-heads", "8"]  # docs/design.md's
V_ARGS = ["plan", "-c", "32768", "-npp", "2048", "-ntg", "128", "--pad", "1", "--v-trans", "--which", "v", *GEOMETRY]
K_ARGS = ["plan", "-c", "32768", "-npl", "4", "-npp", "2048", "-ntg", "128", "--pad", "1", "--type", "q8_0", *GEOMETRY]


def test_plan_prints_a_transposed_v_windows_one_copy_its_cost_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(V_ARGS + ["-npl", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "V (transposed) window f16, head_dim 128, 8 KV heads, -c 32768 (unified, 1 stream of 32,768 cells), "
        "streams 0-0, n_kv 2,176",
        "  ne [2176, 128, 8, 1]  nb [2, 65536, 8388608, 67108864]  offset 0",
        "  span (nbytes) 67,047,680 B  read 4,456,448 B  span/read 15.05x",
        "  plan: 1 copy moving 4,456,448 B (flat moves 67,047,680 B)",
        "    offset   size  count  stride",
        "         0  4,352  1,024  65,536",
        "  cost (gpu model): plan 128.2 µs, flat 1,225.3 µs -> plan",
        "  why: dim 0 merged into one 4,352-byte row; dim 2 folded into dim 1: one 2-D copy of 1,024 rows of "
        "4,352 B at stride 65,536 B (dims 1,2)",
    ]


def test_plan_prints_a_k_windows_streams_as_one_2d_copy_on_the_cpu_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(K_ARGS + ["--stream", "1-3", "--cost-model", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "ne [128, 2176, 8, 3]  nb [34, 1088, 136, 8912896]  offset 8,912,896" in out
    assert "plan: 1 copy moving 7,102,464 B (flat moves 20,193,280 B)" in out
    assert "    8,912,896  2,367,488      3  8,912,896" in out
    assert "cost (cpu model)" in out and out.rstrip().endswith(
        "why: dims 0,2,1 merged into one 2,367,488-byte row: one 2-D copy of 3 rows of 2,367,488 B "
        "at stride 8,912,896 B (dim 3)")


def test_plan_json_has_every_field_and_chooses_plan_for_v_and_flat_for_unified_k(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(V_ARGS + ["--json", "-npl", "1"]) == 0
    (p,) = json.loads(capsys.readouterr().out)
    assert list(p) == ["which", "type", "v_trans", "n_ctx", "n_stream", "kv_size", "n_kv", "streams", "head_dim",
                       "n_head_kv", "ne", "nb", "offset", "nbytes", "bytes_read", "span_read_ratio", "plannable",
                       "n_copies", "copies", "bytes_moved_plan", "cost_model", "cost_plan_us", "cost_flat_us", "choice",
                       "explanation"]
    assert p["copies"] == [{"offset": 0, "size": 4352, "count": 1024, "stride": 65536}]
    assert (p["n_copies"], p["bytes_moved_plan"], p["bytes_read"], p["nbytes"]) == (1, 4456448, 4456448, 67047680)
    assert p["span_read_ratio"] > 15 and p["choice"] == "plan" and p["streams"] == [0, 0]
    assert main(K_ARGS + ["--json", "-npl", "1"]) == 0  # unified K: one range, nothing to gain
    (u,) = json.loads(capsys.readouterr().out)
    assert (u["n_copies"], u["span_read_ratio"], u["choice"]) == (1, 1.0, "flat")


@pytest.mark.parametrize("args,message", [
    (["--stream", "2-5"], "--stream 2-5: streams are 0..3 and s0 <= s1"),
    (["--stream", "3-1"], "--stream 3-1"),
    (["--stream", "a-b"], "expected S0-S1 or S"),
    (["--stream", "1-2-3"], "expected S0-S1 or S"),
    (["-npl", "3"], "does not split into 3 equal streams"),
    (["-npl", "0"], "argument -npl: 0 is out of range"),
    (["--type", "q9"], "unknown type name 'q9'"),
    (["--head-dim", "100"], "kv_cache: head_dim 100 is not whole q8_0 blocks"),
    (["--which", "q"], "invalid choice: 'q'"),
    (["--cost-model", "tpu"], "invalid choice: 'tpu'"),
    (["-ntg", "-1"], "argument -ntg: -1 is out of range"),
    (["--pad", "0"], "argument --pad: 0 is out of range"),
])
def test_plan_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str], args: list, message: str) -> None:
    with pytest.raises(SystemExit) as e:
        main(K_ARGS + args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_installed_command_plans() -> None:
    exe = shutil.which("ferry", path=os.path.dirname(sys.executable)) or shutil.which("ferry")
    cmd = [exe] if exe else [sys.executable, "-m", "ferry.cli"]
    done = subprocess.run(cmd + V_ARGS + ["--json", "-npl", "1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0]["n_copies"] == 1
