"""Rollback after speculative verification (Scheduler.truncate): a verify loop that appends a few
cells per stream, keeps some and truncates to them, prefetching across steps, gives the serial
scheduler's outputs byte for byte and copies, at each step, only the cells since each stream's kept
length; rewrites below it announced with drop_ahead() copy the window again. Random loops under
hypothesis (the repeatable profile)."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import ferry

N_LAYER, N_STREAM, N_CTX, HEAD_DIM, N_HEAD_KV, N_HEAD, N_KV = 2, 3, 32, 16, 2, 4, 24
ROW_BYTES = HEAD_DIM * N_HEAD_KV * 2  # an f16 cell of K (or V) over its heads
FIRST_LAYER = ("window_k_l0", "window_v_l0")  # the windows copied ahead for the next step

# A step: tokens appended per stream, tokens accepted per stream, and a rewrite below the kept
# length (stream, cell) announced with drop_ahead, or None.
StepDraw = Tuple[int, List[int], Optional[Tuple[int, int]]]

steps_st = st.lists(
    st.tuples(st.integers(1, 4), st.lists(st.integers(0, 4), min_size=N_STREAM, max_size=N_STREAM),
              st.one_of(st.none(), st.tuples(st.integers(0, N_STREAM - 1), st.integers(0, N_KV - 1)))),
    min_size=2, max_size=7)


class Loop:
    """A cache on the host, attention on the stand-in device; a scheduler prefetching across steps
    and a serial one over the same windows."""

    def __init__(self, policy: str, start: List[int]) -> None:
        self.split, self.cpu = ferry.StandinBackend(link_gbps=0.0), ferry.CPUBackend()
        self.kv = ferry.KVCache("f16", "f16", HEAD_DIM, N_HEAD_KV, N_STREAM * N_CTX, N_STREAM, N_LAYER)
        self.rng = np.random.default_rng(11)
        self.cells: Dict[Tuple[str, int, int], Any] = {}
        for w in "kv":
            for layer in range(N_LAYER):
                for s in range(N_STREAM):
                    self.cells[(w, layer, s)] = self.rng.uniform(-1, 1, (N_CTX, HEAD_DIM * N_HEAD_KV)).astype(np.float16)
                    self.kv.set_stream(w, layer, s, self.cells[(w, layer, s)])
        q = [ferry.Tensor.from_numpy(self.split, self.rng.uniform(-1, 1, (N_STREAM, 1, N_HEAD, HEAD_DIM))
                                     .astype(np.float32)) for _ in range(N_LAYER)]
        self.lens = np.array(start, np.int32)
        self.kv_len = ferry.Tensor.from_numpy(self.cpu, self.lens)
        self.sched = ferry.Scheduler([self.split, self.cpu], policy=policy, prefetch=1, prefetch_next=True)
        self.serial = ferry.Scheduler([self.split, self.cpu], policy=policy)
        self.outs = ferry.attention_step(self.sched, self.split, self.kv.windows(N_KV), q, self.kv_len)
        self.ref = ferry.attention_step(self.serial, self.split, self.kv.windows(N_KV), q, self.kv_len)

    def write(self, s: int, lo: int, hi: int) -> None:
        """New values in cells [lo, hi) of stream s, every layer's K and V."""
        for w in "kv":
            for layer in range(N_LAYER):
                a = self.cells[(w, layer, s)]
                a[lo:hi] = self.rng.uniform(-1, 1, (hi - lo, HEAD_DIM * N_HEAD_KV)).astype(np.float16)
                self.kv.set_stream(w, layer, s, a)

    def first_layer(self) -> List[ferry.sched.Input]:
        return [i for i in self.sched.inputs if i.src.name in FIRST_LAYER]

    def close(self) -> None:
        self.sched.close()
        self.serial.close()


def verify_loop(policy: str, start: List[int], steps: List[StepDraw], truncate: bool = True) -> None:
    """Run the loop; each step's outputs are the serial ones, and under ragged the first layer's K
    and V each copy at the step exactly the new cells since the kept lengths beyond the copy made
    for it under the last step (which took the last step's used cells: its bytes_read)."""
    loop = Loop(policy, start)
    try:
        kept = list(start)
        read_before: Optional[List[int]] = None  # the first layer's bytes_read at the last step
        for n_tok, accepted, rewrite in steps:
            grown = [min(k + n_tok, N_KV) for k in kept]
            for s in range(N_STREAM):
                loop.write(s, kept[s], grown[s])
            dropped = False
            if rewrite is not None and rewrite[1] < kept[rewrite[0]]:
                loop.sched.drop_ahead()  # a real rewrite below the kept length, announced
                loop.write(rewrite[0], rewrite[1], rewrite[1] + 1)
                dropped = True
            loop.lens[:] = grown
            loop.kv_len.set(loop.lens)
            loop.sched.compute(loop.outs.graph)
            loop.serial.compute(loop.ref.graph)
            assert [o.get() for o in loop.outs] == [o.get() for o in loop.ref], f"outputs differ: {kept} {grown}"
            first = loop.first_layer()
            assert len(first) == 2
            if policy == "ragged":
                assert [i.stats.bytes_read for i in first] == [ROW_BYTES * sum(grown)] * 2
                if read_before is None or dropped:  # nothing ahead: the window whole
                    assert [i.stats.bytes_copied for i in first] == [i.stats.bytes_read for i in first]
                else:
                    new_cells = sum(g - k for g, k in zip(grown, kept))
                    since = [i.stats.bytes_copied - b for i, b in zip(first, read_before)]
                    assert since == [new_cells * ROW_BYTES] * 2, f"copied {since}, not the new cells: {kept} {grown}"
                    assert loop.sched.stats.kept_ahead == 2
            read_before = [i.stats.bytes_read for i in first]
            for s in range(N_STREAM):  # verification: keep the accepted cells, drop the rest
                kept[s] = kept[s] + min(accepted[s], grown[s] - kept[s])
                if truncate:
                    loop.sched.truncate(s, kept[s])
    finally:
        loop.close()


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(["ragged", "flat", "ranges"]), st.lists(st.integers(0, 12), min_size=N_STREAM,
                                                                 max_size=N_STREAM), steps_st)
@example("ragged", [5, 0, 12], [(3, [1, 0, 3], None), (2, [0, 2, 1], None), (4, [2, 4, 0], (0, 1)),
                                (1, [0, 0, 0], None), (3, [3, 1, 2], None)])
def test_a_random_verify_loop_gives_the_serial_outputs_and_copies_only_the_new_cells(
        policy: str, start: List[int], steps: List[StepDraw]) -> None:
    verify_loop(policy, start, steps)


@pytest.mark.parametrize("steps, fails", [
    ([(3, [1, 0, 3], None), (3, [1, 1, 1], None)], "outputs differ"),  # back to the length or past it
    ([(3, [0, 0, 0], None), (2, [1, 1, 1], None)], "not the new cells"),  # below it, every stream
])
def test_without_the_truncate_the_loop_reads_stale_cells_or_copies_again(steps: List[StepDraw], fails: str) -> None:
    """The same loop with no truncate (today's contract broken: lengths fall and cells are rewritten
    below the last step's lengths, unannounced) fails: a stream that comes back to its length or past
    it is read stale; one below it is copied again from cell 0."""
    with pytest.raises(AssertionError, match=fails):
        verify_loop("ragged", [5, 0, 12], steps, truncate=False)
    verify_loop("ragged", [5, 0, 12], steps)


def test_truncate_refuses_a_length_or_stream_outside_the_copy_ahead_and_changes_nothing() -> None:
    """Refusals name the stream and the length; the next step then copies what it would have; a
    truncate with nothing copied ahead (before the first run, after drop_ahead) does nothing; a closed
    scheduler refuses it."""
    loop = Loop("ragged", [5, 0, 12])
    loop.sched.truncate(0, 3)  # nothing ahead yet
    loop.sched.compute(loop.outs.graph)
    for stream, length, says in [(0, -1, "stream 0's length -1"), (2, 13, "stream 2's length 13 is above its "
                                                                     "length 12"), (3, 0, "stream 3 (length 0)")]:
        with pytest.raises(ferry.OutOfBoundsError, match=re.escape(says)):
            loop.sched.truncate(stream, length)
    for bad in ("1", 1.5, None, 2**64):
        with pytest.raises(ferry.InvalidArgumentError, match="truncate: stream"):
            loop.sched.truncate(bad, 0)  # type: ignore[arg-type]
        with pytest.raises(ferry.InvalidArgumentError, match="truncate: length"):
            loop.sched.truncate(0, bad)  # type: ignore[arg-type]
    loop.sched.compute(loop.outs.graph)  # the refusals changed nothing: only the copy ahead's bytes
    assert [i.stats.bytes_copied for i in loop.first_layer()] == [i.stats.bytes_read for i in loop.first_layer()]
    assert loop.sched.stats.kept_ahead == 2
    loop.sched.drop_ahead()
    loop.sched.truncate(2, 40)  # nothing ahead to hold it to
    loop.close()
    with pytest.raises(ferry.FerryError, match="closed"):
        loop.sched.truncate(0, 0)
