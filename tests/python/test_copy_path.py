"""The copy path: a window's input copy under each copy policy (docs/design.md's heart test and its
neighbours), the ranges rule, compact staging, copy_input called directly, and how long a
scheduler's copies live."""

from __future__ import annotations

from typing import List, Sequence, Tuple

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


# ---------------------------------------------------------------- ragged windows

N_KV, CELLS, N_STREAM = 19, 24, 4


def _ragged_lengths(seed: int) -> List[int]:
    """4 lengths in 0..N_KV from a fixed seed: seed 0 holds a 0 and an N_KV, seed 1 is every length
    equal (below N_KV), seed 2 has two streams at the shortest."""
    lens = [int(x) for x in np.random.default_rng([35, seed]).integers(0, N_KV + 1, N_STREAM)]
    if seed == 0:
        lens[1], lens[2] = 0, N_KV
    if seed == 1:
        lens = [7] * N_STREAM
    if seed == 2:
        lens[3] = lens[0]
    return lens


def _used_bytes(w: ferry.Tensor, used: Sequence[int]) -> np.ndarray:
    """Byte offsets, within w's span, of the used cells of a window carrying used cells (its own
    layout: one row of every block of each cell of each stream)."""
    cell, stream, _ = w.used_cells  # type: ignore[misc]
    blk, size = w.type.blck_size, w.type.size
    ne = (w.ne[0] // blk,) + w.ne[1:]
    idx = np.indices(ne).reshape(4, -1)
    keep = idx[cell] < np.asarray(used)[idx[stream]]
    starts = (idx[:, keep] * np.asarray(w.nb)[:, None]).sum(axis=0)
    return (starts[:, None] + np.arange(size)[None, :]).ravel()


def _ragged_step(policy: str, type_kv: str, v_trans: bool, lens: Sequence[int]):
    """A one-layer step on the stand-in over a host cache of real values, kv_len in host memory, its
    windows' copies filled with the sentinel before the run. Returns the cache, the output's bytes,
    the windows' inputs and the scheduler."""
    split, cpu = ferry.StandinBackend(), ferry.CPUBackend()
    kv = ferry.KVCache(type_kv, type_kv, 32, 2, CELLS * N_STREAM, N_STREAM, v_trans=v_trans)
    rng = np.random.default_rng(3)
    for t in (kv.k(0), kv.v(0)):
        t.set(ferry.quantize(rng.uniform(-1, 1, t.nbytes // t.type.size * t.type.blck_size), type_kv))
    q = ferry.Tensor.from_numpy(split, rng.uniform(-1, 1, (N_STREAM, 1, 4, 32)).astype(np.float32), name="q")
    kv_len = ferry.Tensor.from_numpy(cpu, np.array(lens, np.int32), name="kv_len")
    sched = ferry.Scheduler([split, cpu], policy=policy)
    outs = ferry.attention_step(sched, split, kv.windows(N_KV), [q], kv_len)
    graph = outs.graph
    sched.alloc(graph)
    windows = [i for i in sched.inputs if i.src.used_cells is not None]
    assert len(windows) == 2
    for i in windows:
        i.copy.memset(SENTINEL)
    sched.compute(graph)
    windows = [i for i in sched.inputs if i.src.used_cells is not None]  # with the run's stats
    return kv, outs[0].get(), windows, sched


@pytest.mark.parametrize("type_kv,v_trans", [("f16", False), ("q8_0", False), ("f16", True)])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_ragged_windows_copy_the_used_cells_alone(type_kv: str, v_trans: bool, seed: int) -> None:
    """docs/design.md's heart test on ragged windows, through KVCache and attention_step: each stream's
    used cells arrive from their own offsets, every other byte of the copy keeps the sentinel, bytes
    copied are the used cells' bytes; the outputs are flat's and ranges' byte for byte."""
    lens = _ragged_lengths(seed)
    kv, out, windows, sched = _ragged_step("ragged", type_kv, v_trans, lens)
    row = ferry.row_size(type_kv, 64)
    for inp, layer in zip(windows, (kv.k(0), kv.v(0))):
        w, copy = inp.src, inp.copy
        assert w.used_cells == (0 if v_trans and layer is kv.v(0) else 1, 3, N_KV)
        used = _used_bytes(w, lens)
        src = np.frombuffer(layer.get(), np.uint8)[w.offset:w.offset + w.nbytes]
        got = np.frombuffer(copy.get(), np.uint8)
        np.testing.assert_array_equal(got[used], src[used])  # each used cell from its own offset
        rest = np.ones(w.nbytes, bool)
        rest[used] = False
        assert (got[rest] == SENTINEL).all(), "a byte past a stream's used cells was written"
        assert inp.stats.path == ferry.CopyPolicy.RAGGED
        assert inp.stats.bytes_copied == inp.stats.bytes_read == used.size == sum(lens) * row
    for policy in ("flat", "ranges"):
        _, other, others, _ = _ragged_step(policy, type_kv, v_trans, lens)
        assert other == out
        if sum(lens) < N_STREAM * N_KV:  # the same check fails under ranges, on its byte count
            assert all(i.stats.bytes_copied > sum(lens) * row for i in others)


@pytest.mark.parametrize("lens", [(5, 5), (3, 6)])
def test_ragged_compact_copy_of_windows_as_long_as_their_streams(lens: Tuple[int, int]) -> None:
    """A window of every cell of its streams is one dense range, so its compact copy is its own layout:
    the ragged copy lands each stream's used cells there, exactly (it was refused as 'does not pack',
    found by the command line's property test at -c 64 -npl 2 --compact)."""
    split, cpu = ferry.StandinBackend(), ferry.CPUBackend()
    kv = ferry.KVCache("f16", "f16", 32, 1, 2 * 8, 2)
    rng = np.random.default_rng(5)
    for t in (kv.k(0), kv.v(0)):
        t.set(ferry.quantize(rng.uniform(-1, 1, t.nbytes // 2), "f16"))
    q = ferry.Tensor.from_numpy(split, rng.uniform(-1, 1, (2, 1, 2, 32)).astype(np.float32))
    kv_len = ferry.Tensor.from_numpy(cpu, np.array(lens, np.int32))
    outs = {}
    for policy, compact in (("flat", False), ("ragged", True)):
        sched = ferry.Scheduler([split, cpu], policy=policy, compact=compact)
        step = ferry.attention_step(sched, split, kv.windows(8), [q], kv_len)
        sched.compute(step.graph)
        outs[policy] = step[0].get()
        if policy == "ragged":
            windows = [i for i in sched.inputs if i.src.used_cells is not None]
            assert [i.stats.bytes_copied for i in windows] == [sum(lens) * 64] * 2
    assert outs["ragged"] == outs["flat"]


def test_ragged_window_by_hand_and_its_refusals() -> None:
    """KVCache.window(lengths=...) carries the lengths on both windows; plan_ragged gives the copies by
    model; refusals name what to change, and a refused copy writes nothing."""
    cpu, split = ferry.CPUBackend(), ferry.DummyBackend(real_memory=True)
    kv = ferry.KVCache("f16", "f16", 32, 2, 96, 4)
    kv.k(0).set(pattern(kv.k(0).nbytes))
    lens = ferry.Tensor.from_numpy(cpu, np.array([5, 9, 5, 9], np.int32), name="lens")
    k, v = kv.window(0, 12, lengths=lens)
    assert k.used_cells == v.used_cells == (1, 3, 12)
    cell, stream = 128, 24 * 128
    calls = ferry.plan.CopyCostModel(100.0, 0.0, 10.0, 0, 0, 1.0, 0, 0.0)
    rows = ferry.plan.CopyCostModel(0.01, 1000.0, 10.0, 0, 0, 1.0, 0, 0.0)
    assert ferry.plan.plan_ragged(k, calls) == [ferry.Copy2D(0, 5 * cell, 4, stream),
                                              ferry.Copy2D(stream + 5 * cell, 4 * cell, 1, 4 * cell),
                                              ferry.Copy2D(3 * stream + 5 * cell, 4 * cell, 1, 4 * cell)]
    assert [c.size for c in ferry.plan.plan_ragged(k, rows)] == [5 * cell, 9 * cell, 5 * cell, 9 * cell]
    dst = k.dup_layout(name="dst")
    split.alloc_buffer_for(dst)
    dst.memset(SENTINEL)
    rows.use_for(split)
    st = ferry.copy_path.copy_input(split, "ragged", k, dst)
    assert (st.path, st.bytes_copied, st.copy_calls) == (ferry.CopyPolicy.RAGGED, 28 * cell, 4)
    ferry.plan.CopyCostModel.restore(split)
    # refusals: at set time, and at copy time with nothing written
    with pytest.raises(ferry.LayoutError, match=r"i32 \[4\]"):
        k.set_used_cells(ferry.Tensor.from_numpy(cpu, np.zeros(3, np.int32)))
    with pytest.raises(ferry.InvalidArgumentError, match="two different dimensions"):
        k.set_used_cells(lens, 3, 3)
    with pytest.raises(ferry.InvalidArgumentError, match="limit 11 is below"):
        kv.window(0, 12, lengths=lens, limit=11)
    with pytest.raises(ferry.InvalidArgumentError, match="lengths"):
        kv.window(0, 12, lengths=[5, 9, 5, 9])  # type: ignore[arg-type]
    dst.memset(SENTINEL)
    lens.set(np.array([5, 13, 5, 9], np.int32))
    with pytest.raises(ferry.OutOfBoundsError, match="stream 1's length 13 .* is not in 0..12"):
        ferry.copy_path.copy_input(split, "ragged", k, dst)
    lens.set(np.array([5, -1, 5, 9], np.int32))
    with pytest.raises(ferry.OutOfBoundsError, match="stream 1's length -1"):
        ferry.copy_path.copy_input(split, "ragged", k, dst)
    on_device = ferry.Tensor.from_numpy(split, np.array([5, 9, 5, 9], np.int32), name="kv_len")
    k.set_used_cells(on_device)
    with pytest.raises(ferry.InvalidArgumentError, match="host memory"):
        ferry.copy_path.copy_input(split, "ragged", k, dst)
    assert set(dst.get()) == {SENTINEL}
    k.set_used_cells(None)
    assert k.used_cells is None
    with pytest.raises(ferry.InvalidArgumentError, match="no used lengths"):
        ferry.plan.plan_ragged(k)


def test_the_lengths_are_named_and_a_closed_buffer_is_said_closed() -> None:
    """Issue 41, item 10: unnamed lengths are not named '', and lengths whose buffer was closed are not
    told to be allocated in host memory."""
    cpu, split = ferry.CPUBackend(), ferry.DummyBackend(real_memory=True)
    kv = ferry.KVCache("f16", "f16", 32, 2, 96, 4)
    lens = ferry.Tensor.from_numpy(cpu, np.array([5, 13, 5, 9], np.int32))  # no name
    k, _ = kv.window(0, 12, lengths=lens)
    dst = k.dup_layout(name="dst")
    split.alloc_buffer_for(dst)
    with pytest.raises(ferry.OutOfBoundsError) as e:
        ferry.copy_path.copy_input(split, "ragged", k, dst)
    assert "stream 1's length 13 (of its unnamed lengths) is not in 0..12" in str(e.value)
    assert "''" not in str(e.value)
    lens.buffer.close()
    with pytest.raises(ferry.FreedBufferError) as e:
        ferry.copy_path.copy_input(split, "ragged", k, dst)
    assert "its unnamed lengths lie in a buffer that was freed (closed)" in str(e.value)
    assert "allocate" not in str(e.value)
    named = ferry.Tensor.from_numpy(cpu, np.array([5, 9, 5, 9], np.int32), name="kv_len")
    k.set_used_cells(named)
    named.buffer.close()
    with pytest.raises(ferry.FreedBufferError, match="its lengths 'kv_len' lie in a buffer that was freed"):
        ferry.copy_path.copy_input(split, "ragged", k, dst)


def test_ragged_step_refuses_lengths_on_the_device() -> None:
    """The ragged policy reads kv_len on the host as it copies: a kv_len in a device's memory is refused,
    naming it, and the other policies go on as before."""
    split, cpu = ferry.StandinBackend(), ferry.CPUBackend()
    kv = ferry.KVCache("f16", "f16", 32, 2, 96, 4)
    q = ferry.Tensor.from_numpy(split, np.zeros((4, 1, 4, 32), np.float32))
    kv_len = ferry.Tensor.from_numpy(split, np.array([3, 4, 5, 6], np.int32), name="kv_len")
    for policy in ("ranges", "ragged"):
        sched = ferry.Scheduler([split, cpu], policy=policy)
        graph = ferry.attention_step(sched, split, kv.windows(8), [q], kv_len).graph
        if policy == "ragged":
            with pytest.raises(ferry.InvalidArgumentError, match="'kv_len' are in CPU \\(stand-in device\\) memory"):
                sched.compute(graph)
        else:
            sched.compute(graph)
