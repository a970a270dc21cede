"""Python objects keep alive what they point into, and every C object is freed once, after its dependents."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from typing import List, Union

import numpy as np
import pytest

import ferry
from conftest import pattern
from ferry._handle import Handle, Hold
from ferry.paged import PagedKVCache


def test_view_keeps_its_source_alive(cpu: ferry.CPUBackend) -> None:
    root = cpu.alloc_tensor("f32", [8, 4], name="root")
    root.set(pattern(root.nbytes))
    view = root.view([4, 2], [4, 32], offset=16).permute(1, 0, 2, 3)
    alive = weakref.ref(root)
    del root
    gc.collect()
    assert alive() is not None and view.root is alive()
    values = np.frombuffer(pattern(128), np.float32).reshape(4, 8)
    np.testing.assert_array_equal(view.to_numpy(), values[0:2, 4:8].T)
    del view
    gc.collect()
    assert alive() is None


def test_tensor_keeps_its_buffer_and_buffer_its_backend_alive() -> None:
    backend = ferry.DummyBackend(real_memory=True)
    t = backend.alloc_tensor("f16", [64])
    buf_ref, backend_ref = weakref.ref(t.buffer), weakref.ref(backend)
    del backend
    gc.collect()
    assert buf_ref() is not None and backend_ref() is not None
    t.set(pattern(128))
    assert t.get() == pattern(128)
    assert t.buffer.backend is backend_ref()
    del t
    gc.collect()
    assert buf_ref() is None and backend_ref() is None


def test_buffer_type_keeps_backend_alive() -> None:
    buft = ferry.DummyBackend(alignment=128).buffer_type
    gc.collect()
    buf = buft.alloc_buffer(1000)
    assert buft.alignment == 128 and buf.base % 128 == 0


def test_free_is_idempotent_and_final(cpu: ferry.CPUBackend) -> None:
    buf = cpu.alloc_buffer(64)
    t = buf.new_tensor("f32", [16])
    buf.close()
    buf.close()
    assert buf._handle.ptr is None and buf.closed
    with pytest.raises(ferry.FreedBufferError):
        t.get()
    del buf
    gc.collect()  # the finalizer already ran: no second ferry_buffer_free


def test_handle_frees_once_and_children_first() -> None:
    freed = []
    parent = Handle("parent", freed.append)
    child = Handle("child", freed.append, parent)
    grandchild = Handle("grandchild", freed.append, child)
    parent.release()  # its owner went first (as the GC may do in a cycle): must wait for the child
    assert freed == []
    child.release()
    assert freed == []
    grandchild.release()
    assert freed == ["grandchild", "child", "parent"]
    for h in (parent, child, grandchild):
        h.release()
    assert freed == ["grandchild", "child", "parent"]


def test_cycles_finalized_in_any_order_do_not_crash() -> None:
    """Backend, buffer, tensors and views in one reference cycle, collected at once, in a child process
    (a use-after-free would crash it or show under ASan; here it must at least exit cleanly)."""
    script = """
import gc, ferry
for i in range(200):
    b = ferry.DummyBackend(real_memory=True, alignment=64)
    t = b.alloc_tensor("f32", [64, 4], name="t")
    v = t.view([16, 4], [4, 256]).transpose()
    t.set(bytes(t.nbytes))
    bag = [b, t, v, t.buffer, b.buffer_type]
    bag.append(bag)
    del b, t, v, bag
    if i % 50 == 0:
        gc.collect()
gc.collect()
print("alive")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "alive"


def test_async_transfers_hold_their_data_until_synchronize(dummy_real: ferry.DummyBackend) -> None:
    t = dummy_real.alloc_tensor("f32", [16])
    data = bytearray(pattern(32))
    ref_holder = memoryview(data)
    dummy_real.set_2d_async(t, ref_holder, 0, 16, 2, 32)
    assert len(dummy_real._pending) == 1
    dummy_real.synchronize()
    assert dummy_real._pending == []
    assert t.get(0, 16) == pattern(16) and t.get(32, 16) == pattern(32)[16:]


def test_transfer_data_in_reference_cycles_does_not_crash_the_collector() -> None:
    """The binding gives C its data through a memoryview exported to cffi. A transfer that fails
    after taking it, whose exception stays in a reference cycle (a frame that keeps its own
    exception, as `except E as e: err = e` does), must not leave that export alive in the cycle:
    the collector would clear the memoryview while cffi still holds it, a segfault. Data of async
    transfers never synchronized, on a backend dropped in a cycle, is the same case. Run in a
    child, so that a crash fails the test instead of ending pytest."""
    script = """
import gc, numpy as np, ferry, ferry._binding
cpu = ferry.CPUBackend()
t = cpu.alloc_tensor("f32", [4])
calls = [
    lambda: t.set(np.zeros(3, np.float32), -1),
    lambda: t.set(b"x" * 99),
    lambda: t.readinto(bytearray(99)),
    lambda: t.set_2d(bytearray(64), 0, 8, 2, 4),
    lambda: t.get_2d(0, 8, 2, 4, out=bytearray(64)),
    lambda: cpu.set_async(t, memoryview(b"x" * 99)),
    lambda: cpu.get_2d_async(t, bytearray(99), 0, 8, 2, 99),
    lambda: ferry.DummyBackend().set_async(t, np.zeros(4, np.float32)),
]

def keep(call):
    try:
        call()
    except ferry.FerryError as e:
        err = e  # the frame holds the exception, whose traceback holds the frame

for i in range(20):
    for call in calls:
        keep(call)
    gc.collect()
for i in range(20):
    b = ferry.DummyBackend(real_memory=True)
    u = b.alloc_tensor("f32", [4])
    b.set_async(u, np.zeros(4, np.float32))
    b.get_async(u, bytearray(16))
    b.set_2d_async(u, memoryview(bytearray(16)), 0, 8, 2, 8)
    bag = [b, u]
    bag.append(bag)
    del b, u, bag
    gc.collect()
print("alive")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "alive", out.stderr[-3000:]
    assert "BufferError" not in out.stderr, out.stderr[-3000:]


def test_backend_finalizer_runs_while_cffi_is_busy() -> None:
    """The collector may run a Backend's finalizer while this thread holds cffi's lock (it is
    parsing a type); the finalizer must not look up a lib function then, which takes that lock:
    the interpreter hung (found by test_fuzz_api)."""
    script = """
import gc, numpy as np, ferry, ferry._binding
b = ferry.DummyBackend(real_memory=True)
u = b.alloc_tensor("f32", [4])
b.set_async(u, np.zeros(4, np.float32))  # pending: the finalizer synchronizes the backend
bag = [b, u]
bag.append(bag)
del b, u, bag
with ferry._binding.ffi._lock:
    gc.collect()
print("alive")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "alive", out.stderr[-3000:]


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
    out = ferry.ops.scale(ferry.ops.dup(k) + ferry.ops.dup(k), 0.5).set_output()
    g = ferry.Graph(out)
    sched = ferry.Scheduler([split, cpu], policy="ranges")
    sched.assign(out, split)
    sched.compute(g)
    copy = sched.inputs[0].copy
    a = ferry.Tensor.new("f32", [8]).set_input()
    g2 = ferry.Graph(ferry.ops.scale(a, 2.0).set_output())
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


def test_a_hold_defers_the_free_of_what_is_released_meanwhile() -> None:
    """A call into C holds its handles (Hold): a release() meanwhile (a close() on another thread)
    frees the C object, and then its parents, when the hold ends; each handle is held once; a
    handle freed already is not held (the liveness check refuses the object instead)."""
    freed: List[str] = []
    parent = Handle("parent", freed.append)
    child = Handle("child", freed.append, parent)
    with Hold([child, None, child, parent]):
        child.release()
        parent.release()
        assert freed == [] and not child.alive and child.ptr == "child"
    assert freed == ["child", "parent"]
    with Hold([child]):  # freed: nothing to hold, and nothing freed twice
        assert child.ptr is None
    assert freed == ["child", "parent"]


@pytest.mark.parametrize("paged", [False, True], ids=["kv", "paged"])
def test_a_window_keeps_its_lengths_alive(paged: bool) -> None:
    """window(lengths=t) keeps t (and so its memory) alive: with every other reference to t dropped
    and collected, a copy and a scheduler's step read the lengths from the window alone (the copy
    used to fail with "its lengths ... have no memory", t's buffer freed under the window)."""
    cpu, split = ferry.CPUBackend(), ferry.StandinBackend()
    if paged:
        paged_cache = PagedKVCache("f16", "f16", 32, 2, block_size=4, n_blocks=16, n_seq=2)
        paged_cache.allocate(0, 5)
        paged_cache.allocate(1, 9)
        cache: Union[ferry.KVCache, PagedKVCache] = paged_cache
        policy, lens = "flat", [5, 9]  # a paged window's gather reads the lengths under every policy
    else:
        cache = ferry.KVCache("f16", "f16", 32, 2, 96, 4)
        policy, lens = "ragged", [5, 9, 5, 9]
    lengths = ferry.Tensor.from_numpy(cpu, np.array(lens, np.int32), name="lens")
    alive = weakref.ref(lengths)
    k, v = cache.window(0, 12, lengths=lengths)
    del lengths
    gc.collect()
    used = sum(lens) * 32 * 2 * 2  # bytes of the cells the lengths say are used
    dst = k.dup_layout(name="dst")
    split.alloc_buffer_for(dst)
    assert ferry.copy_path.copy_input(split, policy, k, dst).bytes_copied == used
    # a step: attention reads its own kv_len, so only the windows hold the lengths
    kv_len = ferry.Tensor.from_numpy(cpu, np.array(lens, np.int32), name="kv_len")
    q = ferry.Tensor.from_numpy(split, np.zeros((len(lens), 1, 2, 32), np.float32))
    graph = ferry.Graph([ferry.ops.attn_decode(q, k, v, kv_len)])
    del k, v, dst
    gc.collect()
    assert alive() is not None  # the graph holds the windows, and they the lengths
    sched = ferry.Scheduler([split, cpu], policy=policy)
    sched.compute(graph)
    assert [i.stats.bytes_copied for i in sched.inputs if i.src.used_cells is not None] == [used] * 2
    del graph, sched
    gc.collect()
    assert alive() is None
