"""The binding releases the GIL around calls into the library (cffi's ABI mode does): two
threads' long copies run at the same time. Each thread times each of its copies, with the
interpreter's switch interval made so long that a thread holding the GIL keeps it until it
gives it up itself. Were the GIL held through a call, the thread that took it after the
start would run all its copies before the other could record a time, and no two
intervals of the two threads could overlap. The test asserts that some do: an ordering
fact, not a speed. A loaded machine may run the threads one after the other by chance,
so it tries a few times before it fails."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, List, NamedTuple, Sequence, Tuple

import numpy as np
import pytest

import ferry
from ferry._handle import Handle

MIB = 1 << 20
COPY_BYTES = 32 * MIB  # tens of milliseconds a copy: long beside a thread switch
COPIES = 4
TRIES = 5


def copy_intervals(barrier: threading.Barrier, out: List[Tuple[float, float]]) -> None:
    backend = ferry.CPUBackend()
    src = backend.alloc_tensor("f32", [COPY_BYTES // 4])
    dst = backend.alloc_tensor("f32", [COPY_BYTES // 4])
    src.memset(0x5A)
    barrier.wait()
    for _ in range(COPIES):
        start = time.perf_counter()
        src.copy_to(dst)
        out.append((start, time.perf_counter()))
    if dst.get(COPY_BYTES - 4, 4) != b"\x5a" * 4:
        out.clear()  # wrong bytes: the caller sees the copies missing (a thread's assert would not reach it)


def overlapping(a: List[Tuple[float, float]], b: List[Tuple[float, float]]) -> bool:
    return any(s1 < e2 and s2 < e1 for s1, e1 in a for s2, e2 in b)


def one_try() -> bool:
    intervals: List[List[Tuple[float, float]]] = [[], []]
    barrier = threading.Barrier(2, timeout=60)
    threads = [threading.Thread(target=copy_intervals, args=(barrier, iv)) for iv in intervals]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(len(iv) == COPIES for iv in intervals)
    return overlapping(intervals[0], intervals[1])


def test_two_threads_copies_overlap() -> None:
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)  # no forced hand-over: only a thread that lets go passes the GIL on
    try:
        assert any(one_try() for _ in range(TRIES)), (
            f"in {TRIES} tries no copy of one thread ran while the other's did: is the GIL held?")
    finally:
        sys.setswitchinterval(switch)


LATENCY_US = 300_000  # each transfer on the stand-in's link holds the thread inside C this long


def run_in_thread(call: Callable[[], None], out: List[str]) -> threading.Thread:
    """A started thread running call, which appends "ok" to out, or the FerryError it raised."""
    def run() -> None:
        try:
            call()
            out.append("ok")
        except ferry.FerryError as e:
            out.append(repr(e))
    thread = threading.Thread(target=run)
    thread.start()
    return thread


class CloseCase(NamedTuple):
    """What close_while_inside_c runs: call, on a thread, transfers over link; closes are closed
    meanwhile; handles are their C objects; after checks the closed objects refuse use."""

    link: ferry.StandinBackend
    call: Callable[[], None]
    closes: Sequence[Any]
    handles: Sequence[Handle]
    after: Callable[[], None]


def close_while_inside_c(setup: Callable[[], CloseCase]) -> None:
    """Run a case's call in a thread; once a transfer on the stand-in's link has begun (the thread is
    inside C, in the call), close each of closes from this thread. The call completes, the C
    objects (handles) outlive the close until it returns, and are freed then. An ordering, not a
    time: the loop only polls, and a transfer holds the thread inside C for LATENCY_US, far longer
    than a close takes; a host so busy that the call returned first is tried again."""
    for _ in range(TRIES):
        case = setup()
        case.link.reset_link_stats()
        out: List[str] = []
        thread = run_in_thread(case.call, out)
        while thread.is_alive() and case.link.link_stats.modelled_seconds == 0:
            time.sleep(0.001)
        inside = thread.is_alive()
        for c in case.closes:
            c.close()
        held = [h.ptr is not None for h in case.handles]  # were they freed under the call, it could crash
        thread.join()
        assert out == ["ok"]
        assert all(c.closed for c in case.closes)
        assert all(h.ptr is None for h in case.handles)  # freed, once the call returned
        case.after()
        if inside:
            assert held == [True] * len(held), "closed while the call was inside C with it, and freed at once"
            return
    pytest.fail(f"in {TRIES} tries the call had returned each time before the close came")


def test_closing_a_scheduler_while_another_thread_runs_it_frees_it_after_the_run() -> None:
    """Scheduler.close() from one thread while another's compute() is inside C: the run completes, the
    scheduler is closed at once for Python and freed when the run returns (it was freed under the
    run: a segfault, use after free in ferry_sched_free)."""
    def setup() -> CloseCase:
        cpu, split = ferry.CPUBackend(), ferry.StandinBackend(latency_us=LATENCY_US)
        kv = ferry.KVCache("f16", "f16", 32, 2, 96, 4)
        kv_len = ferry.Tensor.from_numpy(cpu, np.array([5, 9, 5, 9], np.int32))
        q = ferry.Tensor.from_numpy(split, np.zeros((4, 1, 2, 32), np.float32))
        k, v = kv.window(0, 12)
        graph = ferry.Graph([ferry.ops.attn_decode(q, k, v, kv_len)])
        sched = ferry.Scheduler([split, cpu])

        def after() -> None:
            with pytest.raises(ferry.FreedBufferError, match="Scheduler was closed"):
                sched.compute(graph)
        return CloseCase(split, lambda: sched.compute(graph), [sched], [sched._handle], after)

    close_while_inside_c(setup)


@pytest.mark.parametrize("owner", ["KVCache", "Buffer", "Backend"])
def test_closing_the_memory_a_transfer_runs_on_frees_it_after_the_transfer(owner: str) -> None:
    """A KV cache, a buffer, or a backend and its buffer, closed from one thread while another
    thread's transfer to or from their memory is inside C: the transfer completes, and the memory (and
    backend) is freed when it returns, not under the transfer (a use after free, or a segfault)."""
    data = np.ones(1 << 16, np.float32)

    def setup() -> CloseCase:
        split = ferry.StandinBackend(latency_us=LATENCY_US)
        if owner == "KVCache":
            kv = ferry.KVCache("f32", "f32", 256, 1, 256, 1, backend=split)

            def refused() -> None:
                with pytest.raises(ferry.FreedBufferError, match="KVCache was closed"):
                    kv.k(0)
            return CloseCase(split, lambda: kv.set_stream("k", 0, 0, data.reshape(256, 256)), [kv], [kv._handle],
                             refused)
        t = split.alloc_tensor("f32", [data.size])
        buf = t.buffer
        assert buf is not None

        def freed() -> None:
            with pytest.raises(ferry.FreedBufferError, match="lies in a buffer that was freed"):
                t.get()
        if owner == "Buffer":
            return CloseCase(split, lambda: t.set(data), [buf], [buf._handle], freed)
        out = bytearray(data.nbytes)  # a read: the stand-in's get_async returns once the link carried it
        return CloseCase(split, lambda: split.get_async(t, out), [split, buf], [split._handle, buf._handle], freed)

    close_while_inside_c(setup)
