"""The graph allocator: placements that share memory, two buffer types, its chunks closed with it, and
keep_inputs (inputs freed after their last use by default, kept to the end on request)."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import ferry
from ferry._binding import lib


def _graph() -> tuple:
    """x (an input) read only by y = dup(x); z = dup(y) may then take x's bytes."""
    x = ferry.Tensor.new("f32", [256], name="x").set_input()
    y = ferry.ops.dup(x, name="y")
    z = ferry.ops.dup(y, name="z").set_output()
    return x, z, ferry.Graph(z)


def test_allocator_frees_an_input_after_its_last_use(cpu: ferry.CPUBackend) -> None:
    x, z, g = _graph()
    galloc = ferry.GraphAllocator(cpu)
    assert not lib.ferry_gallocr_get_keep_inputs(galloc._p)
    galloc.alloc(g)
    assert galloc.slot(z) == galloc.slot(x)  # z in x's bytes
    assert galloc.buffer_size() == 2 * 1024
    x.set(np.arange(256, dtype=np.float32))
    g.compute(cpu)
    np.testing.assert_array_equal(z.to_numpy(), np.arange(256, dtype=np.float32))


def test_allocator_keeps_inputs_on_request(cpu: ferry.CPUBackend) -> None:
    x, z, g = _graph()
    galloc = ferry.GraphAllocator(cpu, keep_inputs=True)
    assert lib.ferry_gallocr_get_keep_inputs(galloc._p)
    galloc.alloc(g)
    px, pz = galloc.slot(x), galloc.slot(z)
    assert px is not None and pz is not None and px.offset != pz.offset
    assert galloc.buffer_size() == 3 * 1024
    values = np.arange(256, dtype=np.float32)
    x.set(values)
    g.compute(cpu)
    np.testing.assert_array_equal(x.to_numpy(), values)  # still there after compute
    with pytest.raises(ferry.InvalidArgumentError, match="keep_inputs"):
        ferry.GraphAllocator(cpu, keep_inputs=1)  # type: ignore[arg-type]


def test_scheduler_keeps_input_copies_on_request() -> None:
    """Layers on the stand-in device reading CPU results by copy: one copy at a time, all kept."""
    cpu, standin = ferry.CPUBackend(), ferry.StandinBackend()
    x = ferry.Tensor.new("f32", [1024], name="x")
    hs = [ferry.ops.scale(x, float(layer), name=f"h{layer}").set_output() for layer in range(4)]
    outs = [ferry.ops.dup(h, name=f"out{layer}").set_output() for layer, h in enumerate(hs)]
    g = ferry.Graph(*hs, *outs)
    sizes = {}
    for keep in (False, True):
        sched = ferry.Scheduler([cpu, standin], keep_inputs=keep)
        assert bool(lib.ferry_sched_get_keep_inputs(sched._p)) is keep
        for out in outs:
            sched.assign(out, standin)
        sched.alloc(g)
        assert len(sched.inputs) == 4
        sizes[keep] = sched.buffer_size(standin)
        x.set(np.ones(1024, np.float32))
        sched.compute(g)
        for layer, out in enumerate(outs):
            np.testing.assert_array_equal(out.to_numpy(), np.full(1024, layer, np.float32))
        if keep:
            for layer, inp in enumerate(sched.inputs):
                np.testing.assert_array_equal(inp.copy.to_numpy(), np.full(1024, layer, np.float32))
        sched.close()
    assert sizes == {False: 5 * 4096, True: 8 * 4096}  # the outputs and one copy, or all four copies
    with pytest.raises(ferry.InvalidArgumentError, match="keep_inputs"):
        ferry.Scheduler([cpu, standin], keep_inputs="yes")  # type: ignore[arg-type]


def test_allocator_reuses_memory_and_reports_placements(cpu: ferry.CPUBackend) -> None:
    a = ferry.Tensor.new("f32", [256], name="a").set_input()
    x = ferry.ops.scale(a, 2.0, name="x")
    y = ferry.ops.mean(x, name="y")  # x is freed after y ran, so z may take x's memory
    z = ferry.ops.scale(y, 3.0, name="z").set_output()
    g = ferry.Graph(z)
    galloc = ferry.GraphAllocator(cpu, keep_inputs=True)  # a stays apart (else x works in place over it)
    galloc.reserve(g)
    size = galloc.buffer_size()
    galloc.alloc(g)
    assert galloc.buffer_size() == size == galloc.chunks()[0].size and galloc.n_chunks() == 1
    pa, px = galloc.slot(a), galloc.slot(x)
    assert pa is not None and px is not None
    assert pa.size == 1024 and px.size == 1024 and pa.offset != px.offset
    assert size < 1024 + 1024 + 64 + 64  # less than every tensor apart: memory was shared
    a.set(np.arange(256, dtype=np.float32))
    g.compute(cpu)
    np.testing.assert_allclose(z.to_numpy(), [255.0 * 3.0], rtol=1e-6)
    assert galloc.slot(ferry.Tensor.new("f32", [4])) is None
    with pytest.raises(ferry.InvalidArgumentError, match="needs 3"):
        galloc.reserve(g, node_types=[0])
    with pytest.raises(ferry.InvalidArgumentError, match="not a buffer type index"):
        galloc.reserve(g, node_types=[0, 1, 0])


def test_allocator_close_makes_its_tensors_raise_freed(cpu: ferry.CPUBackend) -> None:
    a = ferry.Tensor.new("f32", [8], name="a").set_input()
    out = ferry.ops.scale(a, 2.0).set_output()
    g = ferry.Graph(out)
    galloc = ferry.GraphAllocator(cpu)
    galloc.alloc(g)
    a.set(np.ones(8, np.float32))
    chunk = galloc.chunks()[0]
    galloc.close()
    galloc.close()
    assert chunk.closed and out.buffer is chunk and not out.allocated
    with pytest.raises(ferry.FreedBufferError):
        out.to_numpy()
    with pytest.raises(ferry.FreedBufferError):
        chunk.clear(0)
    with pytest.raises(ferry.FreedBufferError):
        g.compute(cpu)
    with pytest.raises(ferry.FreedBufferError):
        galloc.alloc(g)
    with pytest.raises(ferry.UnsupportedError):
        chunk.close()
    # a new allocator places the graph again
    galloc2 = ferry.GraphAllocator(cpu)
    galloc2.alloc(g)
    assert out.buffer is not chunk and out.buffer.owner is galloc2
    a.set(np.full(8, 3, np.float32))
    g.compute(cpu)
    np.testing.assert_array_equal(out.to_numpy(), np.full(8, 6, np.float32))


def test_placed_tensor_keeps_the_allocator_alive(cpu: ferry.CPUBackend) -> None:
    a = ferry.Tensor.new("f32", [8], name="a").set_input()
    out = ferry.ops.scale(a, 0.5).set_output()
    g = ferry.Graph(out)
    galloc = ferry.GraphAllocator(cpu)
    galloc.alloc(g)
    alive = weakref.ref(galloc)
    del galloc, g
    gc.collect()
    assert alive() is not None
    a.set(np.arange(8, dtype=np.float32))
    ferry.Graph(out).compute(cpu)
    np.testing.assert_array_equal(out.to_numpy(), np.arange(8, dtype=np.float32) / 2)
    del a, out
    gc.collect()
    assert alive() is None


def test_allocator_places_each_tensor_in_the_buffer_type_reserved_for_it(cpu: ferry.CPUBackend) -> None:
    dummy = ferry.DummyBackend(real_memory=True)
    a = ferry.Tensor.new("f32", [16], name="a").set_input()
    out = ferry.ops.scale(a, 2.0, name="out").set_output()
    g = ferry.Graph(out)
    galloc = ferry.GraphAllocator(cpu, dummy)
    galloc.reserve(g, node_types=[1], leaf_types=[0])
    galloc.alloc(g)
    assert a.buffer.type == cpu.buffer_type and out.buffer.type == dummy.buffer_type
    assert out.buffer.backend is dummy
    assert galloc.buffer_size(0) >= 64 and galloc.buffer_size(1) >= 64
    with pytest.raises(ferry.InvalidArgumentError):
        galloc.buffer_size(2)
