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
from typing import Callable, List, Tuple

import numpy as np
import pytest

import ferry

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


def wait_for_the_link(link: ferry.StandinBackend, thread: threading.Thread) -> None:
    """Return once a transfer on the stand-in's link has begun (the thread is inside C, in the call
    that transfers), or the thread ended. An ordering, not a time: the loop only polls."""
    while thread.is_alive() and link.link_stats.modelled_seconds == 0:
        time.sleep(0.001)


def test_closing_a_scheduler_while_another_thread_runs_it_frees_it_after_the_run() -> None:
    """Scheduler.close() from one thread while another's compute() is inside C: the run completes, the
    scheduler is closed at once for Python and freed when the run returns (it was freed under the
    run: a segfault, use after free in ferry_sched_free)."""
    cpu = ferry.CPUBackend()
    split = ferry.StandinBackend(latency_us=200_000)  # each transfer holds the run inside C
    kv = ferry.KVCache("f16", "f16", 32, 2, 96, 4)
    kv_len = ferry.Tensor.from_numpy(cpu, np.array([5, 9, 5, 9], np.int32))
    q = ferry.Tensor.from_numpy(split, np.zeros((4, 1, 2, 32), np.float32))
    k, v = kv.window(0, 12)
    graph = ferry.Graph([ferry.ops.attn_decode(q, k, v, kv_len)])
    sched = ferry.Scheduler([split, cpu])
    split.reset_link_stats()
    out: List[str] = []
    thread = run_in_thread(lambda: sched.compute(graph), out)
    wait_for_the_link(split, thread)
    sched.close()
    assert sched.closed
    thread.join()
    assert out == ["ok"]
    assert sched._handle.ptr is None  # freed, once the run returned
    with pytest.raises(ferry.FreedBufferError, match="Scheduler was closed"):
        sched.compute(graph)
