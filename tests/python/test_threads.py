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
from typing import List, Tuple

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
