"""A stream's length outside 0..n_kv gets one answer everywhere (hypothesis, repeatable profile).

Any length, any copy policy, prefetching off, within a run or across runs (prefetch_next), a
cache paged or not, a first run or a later one: the step runs, and its outputs are a serial
flat run's byte for byte; or it is refused before a byte moves, with a FerryError naming the
stream, the length and the bound, every transfer counter, window copy and output as it was.
"""

from __future__ import annotations

from typing import Any, List, Tuple

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import ferry
from conftest import SENTINEL
from ferry.paged import PagedKVCache

N_KV, N_LAYER, N_STREAM, HEADS, HEAD_DIM = 12, 2, 2, 4, 32
GOOD = [5, N_KV]  # the lengths of a first run that goes before the one tested
EDGES = [-2**31, -3, -1, 0, 1, N_KV - 1, N_KV, N_KV + 1, 400, 2**31 - 1]
POLICIES = ["flat", "ranges", "plan", "ragged"]
PREFETCH = {"off": (0, False), "within": (1, False), "across": (1, True)}


def _cache(paged: bool) -> Any:
    """A cache of N_LAYER layers of fixed values: N_KV cells of each of N_STREAM streams (paged: each
    sequence's table holds exactly N_KV cells)."""
    if paged:
        cache: Any = PagedKVCache("f16", "f16", HEAD_DIM, 2, 4, 8, N_STREAM, n_layer=N_LAYER)
        for s in range(N_STREAM):
            cache.allocate(s, N_KV)
    else:
        cache = ferry.KVCache("f16", "f16", HEAD_DIM, 2, 16 * N_STREAM, N_STREAM, n_layer=N_LAYER)
    rng = np.random.default_rng(7)
    for layer in range(N_LAYER):
        for t in (cache.k(layer), cache.v(layer)):
            t.set(ferry.quantize(rng.uniform(-1, 1, t.nbytes // 2), "f16"))
    return cache


def _step(cache: Any, split: ferry.Backend, cpu: ferry.Backend, kv_len: ferry.Tensor, policy: str = "flat",
          prefetch: int = 0, prefetch_next: bool = False) -> Tuple[ferry.Scheduler, Any]:
    """A scheduler on (split, cpu) and the step's outputs over every layer of cache, queries fixed."""
    rng = np.random.default_rng(11)
    q = [ferry.Tensor.from_numpy(split, rng.uniform(-1, 1, (N_STREAM, 1, HEADS, HEAD_DIM)).astype(np.float32))
         for _ in range(N_LAYER)]
    sched = ferry.Scheduler([split, cpu], policy=policy, prefetch=prefetch, prefetch_next=prefetch_next)
    return sched, ferry.attention_step(sched, split, cache.windows(N_KV), q, kv_len)


def _counters(split: ferry.Backend, cpu: ferry.Backend, sched: ferry.Scheduler) -> List[int]:
    """Every transfer counter a run could move: the backends' and the window copies' buffers'."""
    stats = [split.stats, cpu.stats] + [i.copy.buffer.stats for i in sched.inputs]
    return [sum(s.calls.values()) + s.total_bytes for s in stats]


@settings(max_examples=200, deadline=None)
@given(policy=st.sampled_from(POLICIES), prefetch=st.sampled_from(sorted(PREFETCH)), paged=st.booleans(),
       later=st.booleans(), stream=st.integers(0, N_STREAM - 1),
       length=st.one_of(st.sampled_from(EDGES), st.integers(0, N_KV), st.integers(-2**31, 2**31 - 1)))
# the cases: a length clamped under flat, ranges and plan; refused once a copy is ahead
@example(policy="flat", prefetch="off", paged=False, later=False, stream=1, length=N_KV + 1)
@example(policy="ranges", prefetch="off", paged=False, later=True, stream=0, length=-3)
@example(policy="plan", prefetch="within", paged=False, later=True, stream=1, length=2**31 - 1)
@example(policy="flat", prefetch="across", paged=False, later=True, stream=0, length=-2**31)
@example(policy="ragged", prefetch="within", paged=False, later=False, stream=1, length=400)
@example(policy="ragged", prefetch="across", paged=True, later=True, stream=1, length=N_KV)
def test_a_length_runs_or_is_refused_before_a_byte_moves(policy: str, prefetch: str, paged: bool, later: bool,
                                                         stream: int, length: int) -> None:
    split, cpu = ferry.StandinBackend(), ferry.CPUBackend()
    cache = _cache(paged)
    kv_len = ferry.Tensor.from_numpy(cpu, np.array(GOOD, np.int32), name="kv_len")
    sched, outs = _step(cache, split, cpu, kv_len, policy, *PREFETCH[prefetch])
    if later:
        sched.compute(outs.graph)  # with prefetch_next, the first part's windows are now copied ahead
    else:
        sched.alloc(outs.graph)
        for i in sched.inputs:
            i.copy.memset(SENTINEL)
    lens = [7] * N_STREAM
    lens[stream] = length
    kv_len.set(np.array(lens, np.int32))
    copies = [i.copy.get() for i in sched.inputs]
    results = [o.get() for o in outs]
    before = _counters(split, cpu, sched)
    if 0 <= length <= N_KV:
        sched.compute(outs.graph)
        serial, serial_outs = _step(cache, split, cpu, kv_len)
        serial.compute(serial_outs.graph)
        assert [o.get() for o in outs] == [o.get() for o in serial_outs]
        return
    with pytest.raises(ferry.FerryError, match=rf"stream {stream}'s length {length} \(of its lengths 'kv_len'\) is not in "
                                               rf"0\.\.{N_KV}"):
        sched.compute(outs.graph)
    assert _counters(split, cpu, sched) == before, "a byte moved before the refusal"
    assert [i.copy.get() for i in sched.inputs] == copies
    assert [o.get() for o in outs] == results


@pytest.mark.parametrize("length", [-3, N_KV + 1])
def test_attention_reading_a_window_where_it_lies_refuses_it_too(length: int) -> None:
    """No scheduler, no copy: attention on the CPU over windows of a host cache carrying their lengths
    refuses a length outside 0..n_kv, naming the stream, and writes no output (it clamped it)."""
    cpu = ferry.CPUBackend()
    cache = _cache(False)
    kv_len = ferry.Tensor.from_numpy(cpu, np.array([7, length], np.int32), name="kv_len")
    k, v = cache.window(0, N_KV, lengths=kv_len)
    q = ferry.Tensor.from_numpy(cpu, np.ones((N_STREAM, 1, HEADS, HEAD_DIM), np.float32))
    out = ferry.ops.attn_decode(q, k, v, kv_len).set_output()
    graph = ferry.Graph(out)
    ferry.GraphAllocator(cpu).alloc(graph)
    out.set(bytes([SENTINEL]) * out.nbytes)
    with pytest.raises(ferry.OutOfBoundsError, match=rf"stream 1's length {length} \(of its lengths 'kv_len'\) is not in "
                                                     rf"0\.\.{N_KV}"):
        graph.compute(cpu)
    assert set(out.get()) == {SENTINEL}
    kv_len.set(np.array([7, N_KV], np.int32))
    graph.compute(cpu)
    assert set(out.get()) != {SENTINEL}
