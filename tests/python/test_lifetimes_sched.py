"""Lifetimes of graphs, allocators, KV caches and schedulers: every C object freed once, after its dependents."""

from __future__ import annotations

import subprocess
import sys

from ferry._handle import Handle


def test_handle_with_several_parents_frees_them_after_the_child() -> None:
    freed = []
    a = Handle("a", freed.append)
    b = Handle("b", freed.append)
    child = Handle("child", freed.append, [a, b, None, a])  # a counted once
    a.release()
    b.release()
    assert freed == []
    child.release()
    assert freed == ["child", "a", "b"]


def test_scheduler_cycles_finalized_in_any_order_do_not_crash() -> None:
    """KV cache, window, graph, allocator, scheduler and its copies in one reference cycle, collected at
    once, in a child process: a use-after-free would crash it."""
    script = """
import gc, ferry, numpy as np
for i in range(100):
    cpu = ferry.CPUBackend()
    split = ferry.DummyBackend(real_memory=True)
    kv = ferry.KVCache("f32", "f32", 8, 2, 64, 4, backend=cpu)
    k, v = kv.window(0, 5, 1, 3)
    out = ferry.scale(ferry.dup(k) + ferry.dup(k), 0.5).set_output()
    g = ferry.Graph(out)
    sched = ferry.Scheduler([split, cpu], policy="ranges")
    sched.pin(out, split)
    sched.compute(g)
    copy = sched.inputs[0].copy
    a = ferry.Tensor.new("f32", [8]).set_input()
    g2 = ferry.Graph(ferry.scale(a, 2.0).set_output())
    galloc = ferry.GraphAllocator(cpu)
    galloc.alloc(g2)
    bag = [cpu, split, kv, k, v, out, g, sched, copy, a, g2, galloc, galloc.chunks()[0], kv.buffer]
    bag.append(bag)
    if i % 3 == 0:
        sched.close()
        galloc.close()
    del cpu, split, kv, k, v, out, g, sched, copy, a, g2, galloc, bag
    if i % 25 == 0:
        gc.collect()
gc.collect()
print("alive")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "alive"


def test_kv_cache_is_freed_without_the_collector() -> None:
    """A cache nobody holds is freed at once (no reference cycle keeps its memory, which may be
    pinned, until the collector runs); a tensor of it, or its buffer, keeps it alive."""
    import gc
    import weakref

    import ferry

    gc.disable()
    try:
        kv = ferry.KVCache("f16", "f16", 8, 2, 64, 2, n_layer=2)
        k = kv.k(1)
        assert kv.k(1) is k and kv.buffer is k.buffer  # one wrapper while it is held
        dead = weakref.ref(kv)
        del kv
        assert dead() is not None  # k keeps its cache
        k.set(b"\x01" * k.nbytes)
        assert k.get() == b"\x01" * k.nbytes
        del k
        assert dead() is None  # nothing else did: gone without a collection
    finally:
        gc.enable()
