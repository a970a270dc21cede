"""One lifetime API on every object that owns memory or a device resource: close(), closed, `with`.

Each class is checked the same way: close() frees at once (C says the buffer id is dead, or the
handle gave its pointer back), a second close() does nothing, a use after close() raises
FreedBufferError naming the object, and a `with` block closes it. Then what _handle.py's design
says about closing a parent whose children are alive, and a CPUBackend freed with the collector
off.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import pytest

import ferry
from ferry._binding import lib


@dataclass
class Case:
    """An object that owns something, how to see C freed it, and one use of it."""

    obj: Any
    freed: Callable[[], bool]
    use: Callable[[], object]
    name: str  # what FreedBufferError's message must name


def _dead(buffer_id: int) -> Callable[[], bool]:
    return lambda: not lib.ferry_buffer_id_is_live(buffer_id)


def _handle_gone(obj: Any) -> Callable[[], bool]:
    handle = obj._handle
    return lambda: handle.ptr is None


def backend_case() -> Case:
    b = ferry.CPUBackend()
    return Case(b, _handle_gone(b), lambda: b.alloc_buffer(64), "CPUBackend 'CPU'")


def buffer_case() -> Case:
    buf = ferry.CPUBackend().alloc_buffer(4096)
    return Case(buf, _dead(buf.id), lambda: buf.clear(1), f"CPU buffer {buf.id}")


def kv_case() -> Case:
    kv = ferry.KVCache("f16", "f16", 8, 2, 64, 2, n_layer=2)
    return Case(kv, _dead(kv.buffer.id), lambda: kv.k(0), "KVCache")


def pinned_kv_case() -> Case:
    if not ferry.cuda_available():
        pytest.skip("no CUDA device: pinned memory is CUDA's")
    kv = ferry.KVCache("f16", "f16", 8, 2, 64, 2, n_layer=2, pinned=True)
    assert kv.buffer.type.name == ferry.cuda_host_buffer_type().name
    return Case(kv, _dead(kv.buffer.id), lambda: kv.k(0), "KVCache")


def _graph(cpu: ferry.CPUBackend) -> ferry.Graph:
    a = ferry.Tensor.from_numpy(cpu, np.arange(16, dtype=np.float32), name="a")
    return ferry.Graph(ferry.ops.add(a, a, name="out").set_output())


def scheduler_case() -> Case:
    cpu = ferry.CPUBackend()
    sched = ferry.Scheduler([cpu])
    graph = _graph(cpu)
    sched.compute(graph)
    out_buffer = graph.outputs[0].buffer.id
    return Case(sched, lambda: _handle_gone(sched)() and _dead(out_buffer)(), lambda: sched.stats, "Scheduler")


def allocator_case() -> Case:
    cpu = ferry.CPUBackend()
    galloc = ferry.GraphAllocator(cpu)
    galloc.alloc(_graph(cpu))
    chunk = galloc.chunks(0)[0].id
    return Case(galloc, _dead(chunk), lambda: galloc.buffer_size(0), "GraphAllocator")


def event_case() -> Case:
    if not ferry.cuda_available():
        pytest.skip("no CUDA device: only CUDA backends make events")
    event = ferry.CUDABackend().event()
    return Case(event, _handle_gone(event), lambda: event.record(), "Event of CUDABackend")


CASES = {"Backend": backend_case, "Buffer": buffer_case, "KVCache": kv_case, "KVCache pinned": pinned_kv_case,
         "Scheduler": scheduler_case, "GraphAllocator": allocator_case, "Event": event_case}


@pytest.fixture(params=list(CASES))
def case(request: pytest.FixtureRequest) -> Iterator[Case]:
    gc.disable()  # what is freed here is freed by close(), not by a collection
    try:
        yield CASES[request.param]()
    finally:
        gc.enable()


def test_close_frees_at_once_and_twice_is_fine(case: Case) -> None:
    case.use()
    assert not case.freed() and not case.obj.closed
    case.obj.close()
    assert case.freed() and case.obj.closed
    case.obj.close()
    assert case.freed() and case.obj.closed


def test_use_after_close_raises_freed_naming_the_object(case: Case) -> None:
    case.obj.close()
    with pytest.raises(ferry.FreedBufferError, match=f"^{case.name}"):
        case.use()
    assert repr(case.obj).endswith((" closed>", ", freed>"))  # still printable, and says it is closed


def test_with_gives_the_object_and_closes_it_at_the_end(case: Case) -> None:
    with case.obj as entered:
        assert entered is case.obj
        case.use()
    assert case.freed() and case.obj.closed


def test_with_closes_when_the_block_raises(case: Case) -> None:
    with pytest.raises(KeyError):
        with case.obj:
            raise KeyError("the block failed")
    assert case.freed()


# ------------------------------------------------------------ parents closed while children live


def test_closing_a_backend_leaves_its_buffers_working_and_frees_it_after_them() -> None:
    """_handle.py's design: the closed backend refuses every use at once; the C backend is freed
    when its last buffer goes, and until then those buffers work."""
    backend = ferry.DummyBackend(real_memory=True)
    t = backend.alloc_tensor("f32", [16])
    buffer = t.buffer
    backend.close()
    assert backend.closed and backend._handle.ptr is not None  # C keeps it for the buffer
    with pytest.raises(ferry.FreedBufferError, match="DummyBackend"):
        backend.alloc_buffer(64)
    with pytest.raises(ferry.FreedBufferError, match="DummyBackend"):
        buffer.type.alloc_buffer(64)  # its buffer type too
    t.set(bytes(range(64)))
    assert t.get() == bytes(range(64))
    buffer.close()
    assert backend._handle.ptr is None  # the last child went: the backend with it
    with pytest.raises(ferry.FreedBufferError):
        t.get()


def test_closing_a_backend_leaves_its_scheduler_working() -> None:
    cpu = ferry.CPUBackend()
    sched = ferry.Scheduler([cpu])
    graph = _graph(cpu)
    cpu.close()
    sched.compute(graph)
    np.testing.assert_array_equal(graph.outputs[0].to_numpy(), 2 * np.arange(16, dtype=np.float32))
    handle = cpu._handle
    sched.close()
    del graph
    assert handle.ptr is None


# ------------------------------------------------------------ no cycle keeps a backend


@pytest.mark.parametrize("touch", ["nothing", "buffer_type", "buffer", "repr"])
def test_a_cpu_backend_nobody_holds_is_freed_without_a_collection(touch: str) -> None:
    gc.disable()
    try:
        backend = ferry.CPUBackend()
        if touch == "buffer_type":
            assert backend.buffer_type.is_host
        elif touch == "buffer":
            backend.alloc_buffer(64).clear(0)
        elif touch == "repr":
            repr(backend)
        handle = backend._handle
        del backend
        assert handle.ptr is None
    finally:
        gc.enable()
