"""The copy path: a window's input copy under each copy policy (docs/design.md's heart test and its
neighbours), the ranges rule, compact staging, copy_input called directly, and how long a
scheduler's copies live."""

from __future__ import annotations

from typing import Tuple

import numpy as np
import pytest

import ferry
from conftest import SENTINEL, pattern


def _heart(policy: str, type_k: str, n_stream: int, n_kv: int, s0: int = 0, s1: int | None = None,
           head_dim: int = 32, n_head_kv: int = 2, cells: int = 16):
    """A host cache full of a pattern, the K window of streams s0..s1 read by a dup assigned to a
    real-memory dummy backend, its input copy filled with a sentinel, run once. Returns what is needed
    to check it."""
    cpu = ferry.CPUBackend()
    split = ferry.DummyBackend(real_memory=True)
    kv = ferry.KVCache(type_k, type_k, head_dim, n_head_kv, cells * n_stream, n_stream)
    kv.buffer.clear(0)
    k_layer = kv.k(0)
    k_layer.set(pattern(k_layer.nbytes))
    k, _ = kv.window(0, n_kv, s0, s1)
    out = ferry.ops.dup(k, name="out").set_output()
    graph = ferry.Graph(out)
    sched = ferry.Scheduler([split, cpu], policy=policy)
    sched.assign(out, split)
    sched.alloc(graph)
    (inp,) = sched.inputs
    assert inp.src is k and inp.copy.same_layout(k)
    inp.copy.memset(SENTINEL)
    sched.compute(graph)
    return kv, k, out, sched, inp.copy


def _check_heart(kv: ferry.KVCache, k: ferry.Tensor, copy: ferry.Tensor, n_kv: int) -> Tuple[int, int]:
    """docs/design.md's assertions on the copy; returns (bytes moved, bytes the graph reads)."""
    row = ferry.row_size(kv.params.type_k, kv.params.n_embd_gqa)
    stride, used = kv.kv_size * row, n_kv * row
    ns = k.ne[3]
    got = copy.get()
    src = pattern(kv.k(0).nbytes)
    for s in range(ns):
        base = k.offset + s * stride
        assert got[s * stride:s * stride + used] == src[base:base + used], f"stream {s} did not arrive whole"
        gap = got[s * stride + used:(s + 1) * stride] if s + 1 < ns else b""
        assert set(gap) <= {SENTINEL}, f"gap after stream {s} was written"
    return ns * used, ns * used


def test_ranges_copy_exactly_the_bytes_an_ordered_multi_stream_window_reads() -> None:
    kv, k, out, sched, copy = _heart("ranges", "f16", 4, 5)
    st = sched.stats
    assert st.bytes_copied == st.bytes_read == 4 * 5 * 128  # exactly the bytes the graph reads
    assert st.bytes_span == 3 * 16 * 128 + 5 * 128 and st.copy_calls == 1 and st.n_inputs == 1
    assert sched.inputs[0].stats.path == ferry.CopyPolicy.RANGES
    _check_heart(kv, k, copy, 5)
    # and the node read the right bytes: out is the window made contiguous
    np.testing.assert_array_equal(out.to_numpy().view(np.uint16), k.to_numpy().view(np.uint16))


def test_ordered_multi_stream_flat_moves_the_span() -> None:
    kv, k, out, sched, copy = _heart("flat", "f16", 4, 5)
    st = sched.stats
    assert st.bytes_copied == st.bytes_span == 3 * 16 * 128 + 5 * 128 > st.bytes_read
    assert sched.inputs[0].stats.path == ferry.CopyPolicy.FLAT
    with pytest.raises(AssertionError, match="gap after stream 0"):
        _check_heart(kv, k, copy, 5)  # flat writes the gaps: the heart test fails under it


@pytest.mark.parametrize("type_k,n_stream,n_kv,s0,s1", [
    ("q8_0", 2, 11, 0, 1), ("f16", 8, 7, 3, 5), ("f32", 8, 16, 6, 7), ("q4_0", 2, 5, 0, 1), ("f16", 2, 1, 0, 1),
])
def test_ranges_copy_exactly_the_bytes_read_of_every_type_and_stream_subset(type_k: str, n_stream: int, n_kv: int, s0: int, s1: int) -> None:
    kv, k, out, sched, copy = _heart("ranges", type_k, n_stream, n_kv, s0, s1)
    row = ferry.row_size(type_k, 64)
    st = sched.stats
    assert st.bytes_copied == st.bytes_read == (s1 - s0 + 1) * n_kv * row
    assert k.offset == s0 * kv.kv_size * row
    _check_heart(kv, k, copy, n_kv)


@pytest.mark.parametrize("n_stream,s", [(1, 0), (4, 2)])
def test_unified_and_single_sequence_same_as_flat(n_stream: int, s: int) -> None:
    runs = {p: _heart(p, "q8_0", n_stream, 9, s, s)[3].stats for p in ("flat", "ranges")}
    flat, ranges = runs["flat"], runs["ranges"]
    assert ranges.bytes_copied == flat.bytes_copied == flat.bytes_read == 9 * ferry.row_size("q8_0", 64)
    assert ranges.copy_calls == flat.copy_calls == 1
    assert ranges.impl_calls == flat.impl_calls


def test_device_side_source_copies_its_ranges() -> None:
    """A source in another device's memory (a layer resident on one device, read by another) takes the
    ranges path too: its ranges staged through the host, not the span, landing where the graph reads."""
    device = ferry.DummyBackend(real_memory=True)
    split = ferry.DummyBackend(real_memory=True)
    kv = ferry.KVCache("f16", "f16", 32, 2, 64, 4, backend=device)
    assert not kv.buffer.is_host
    for stream in range(4):
        kv.set_stream("k", 0, stream, np.random.default_rng(stream).integers(0, 255, 16 * 128, np.uint8))
    k, _ = kv.window(0, 5, 0, 3)
    outs = {}
    for policy in ("flat", "ranges"):
        out = ferry.ops.dup(k).set_output()
        sched = ferry.Scheduler([split, device], policy=policy)
        sched.assign(out, split)
        sched.compute(ferry.Graph(out))
        (inp,) = sched.inputs
        outs[policy] = out.get()
    assert inp.stats.path == ferry.CopyPolicy.RANGES
    assert inp.stats.bytes_copied == inp.stats.bytes_read == 4 * 5 * 128 < k.nbytes
    assert outs["ranges"] == outs["flat"]  # dup reads only the window's cells


def test_compact_staging_holds_the_bytes_read() -> None:
    """compact=True: the split's copy of the window holds the bytes read, the split's memory drops by
    the gaps, and the graph's numbers do not change."""
    runs = {}
    for compact in (False, True):
        cpu = ferry.CPUBackend()
        split = ferry.DummyBackend(real_memory=True)
        kv = ferry.KVCache("f32", "f32", 8, 2, 256, 4)
        for stream in range(4):
            kv.set_stream("k", 0, stream, np.random.default_rng(stream).random((64, 16), dtype=np.float32))
        k, _ = kv.window(0, 7, 0, 3)
        d = ferry.ops.dup(k, name="d")
        out = ferry.ops.scale(d, 0.5, name="out").set_output()
        g = ferry.Graph(out)
        sched = ferry.Scheduler([split, cpu], policy="ranges", compact=compact)
        assert sched.compact is compact
        sched.assign(d, split)
        sched.compute(g)
        (inp,) = sched.inputs
        st = inp.stats
        assert st.bytes_copied == st.bytes_read == 4 * 7 * 64
        assert inp.copy.nbytes == (st.bytes_read if compact else st.bytes_span)
        assert inp.copy.same_layout(k) is not compact
        runs[compact] = (out.to_numpy(), sched.buffer_size(split), st.bytes_span - st.bytes_read)
    np.testing.assert_array_equal(runs[False][0], runs[True][0])
    saved, gaps = runs[False][1] - runs[True][1], runs[True][2]
    assert gaps - 64 <= saved <= gaps + 64  # the gaps, up to the allocator's alignment
    with pytest.raises(ferry.InvalidArgumentError, match="bool"):
        ferry.Scheduler([ferry.CPUBackend()], compact="yes")  # type: ignore[arg-type]


def test_copy_ranges_of_is_one_2d_copy_of_the_bytes_read_or_none_for_a_transposed_v() -> None:
    kv = ferry.KVCache("q8_0", "q8_0", 128, 8, 32768, 2)
    k, v = kv.window(0, 2176, 0, 1)
    row = 1088
    assert ferry.copy_path.copy_ranges_of(k) == ferry.Copy2D(0, 2176 * row, 2, 16384 * row)
    assert ferry.copy_path.bytes_read(k) == 2 * 2176 * row
    assert k.nbytes == (16384 + 2176) * row
    k1, _ = kv.window(0, 2176, 1, 1)
    assert ferry.copy_path.copy_ranges_of(k1) == ferry.Copy2D(0, 2176 * row, 1, 2176 * row)
    vt = ferry.KVCache("f16", "f16", 128, 8, 32768, 1, v_trans=True)
    _, v_tr = vt.window(0, 2176, 0, 0)
    assert v_tr.ne == (2176, 128, 8, 1)
    assert ferry.copy_path.copy_ranges_of(v_tr) is None  # a gap after every channel row: not one range
    assert v_tr.nbytes // ferry.copy_path.bytes_read(v_tr) == 15
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.copy_path.copy_ranges_of("k")  # type: ignore[arg-type]


def test_copy_input_alone_copies_the_ranges_and_refuses_another_layout() -> None:
    split = ferry.DummyBackend(real_memory=True)
    kv = ferry.KVCache("f16", "f16", 32, 2, 64, 4)
    kv.k(0).set(pattern(kv.k(0).nbytes))
    k, _ = kv.window(0, 5)
    dst = k.dup_layout(name="dst")
    split.alloc_buffer_for(dst)
    dst.memset(SENTINEL)
    st = ferry.copy_path.copy_input(split, "ranges", k, dst)
    assert (st.path, st.bytes_copied, st.copy_calls) == (ferry.CopyPolicy.RANGES, 4 * 5 * 128, 1)
    _check_heart(kv, k, dst, 5)
    with pytest.raises(ferry.LayoutError):
        ferry.copy_path.copy_input(split, "flat", k, split.alloc_tensor("f16", [4]))


def test_scheduler_copies_end_at_the_next_alloc() -> None:
    kv, k, out, sched, copy = _heart("ranges", "f16", 4, 5)
    g = ferry.Graph(out)
    sched.alloc(g)
    with pytest.raises(ferry.FreedBufferError):
        copy.get()
    fresh = sched.inputs[0].copy
    assert fresh is not copy and fresh is sched.inputs[0].copy
    with pytest.raises(ferry.UnsupportedError, match="belongs to a scheduler"):
        fresh.view([4])
    with pytest.raises(ferry.UnsupportedError):
        ferry.ops.dup(fresh)
    sched.close()
    with pytest.raises(ferry.FreedBufferError):
        fresh.get()
    with pytest.raises(ferry.FreedBufferError):
        sched.compute(g)
    with pytest.raises(ferry.FreedBufferError):
        out.to_numpy()  # its memory was the scheduler's
