"""keep_inputs: inputs freed after their last use by default, kept to the end on request."""

from __future__ import annotations

import numpy as np
import pytest

import ferry
from ferry._binding import lib


def _graph() -> tuple:
    """x (an input) read only by y = dup(x); z = dup(y) may then take x's bytes."""
    x = ferry.Tensor.new("f32", [256], name="x").set_input()
    y = ferry.dup(x, name="y")
    z = ferry.dup(y, name="z").set_output()
    return x, z, ferry.Graph(z)


def test_allocator_frees_an_input_after_its_last_use(cpu: ferry.CPUBackend) -> None:
    x, z, g = _graph()
    galloc = ferry.GraphAllocator(cpu)
    assert not lib.ferry_gallocr_get_keep_inputs(galloc._p)
    galloc.alloc(g)
    assert galloc.placement(z) == galloc.placement(x)  # z in x's bytes
    assert galloc.buffer_size() == 2 * 1024
    x.set(np.arange(256, dtype=np.float32))
    g.compute(cpu)
    np.testing.assert_array_equal(z.to_numpy(), np.arange(256, dtype=np.float32))


def test_allocator_keeps_inputs_on_request(cpu: ferry.CPUBackend) -> None:
    x, z, g = _graph()
    galloc = ferry.GraphAllocator(cpu, keep_inputs=True)
    assert lib.ferry_gallocr_get_keep_inputs(galloc._p)
    galloc.alloc(g)
    px, pz = galloc.placement(x), galloc.placement(z)
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
    hs = [ferry.scale(x, float(layer), name=f"h{layer}").set_output() for layer in range(4)]
    outs = [ferry.dup(h, name=f"out{layer}").set_output() for layer, h in enumerate(hs)]
    g = ferry.Graph(*hs, *outs)
    sizes = {}
    for keep in (False, True):
        sched = ferry.Scheduler([cpu, standin], keep_inputs=keep)
        assert bool(lib.ferry_sched_get_keep_inputs(sched._p)) is keep
        for out in outs:
            sched.pin(out, standin)
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
