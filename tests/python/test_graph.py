"""Ops and graphs from Python: end to end against numpy, shape errors, compute refusals, lifetimes."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import ferry
from ferry._binding import lib

RNG = np.random.default_rng(1234)


def _run(cpu: ferry.CPUBackend, *outputs: ferry.Tensor) -> ferry.GraphAllocator:
    """Place the graph of outputs with a fresh allocator and compute it on cpu; returns the allocator."""
    graph = ferry.Graph(*outputs)
    galloc = ferry.GraphAllocator(cpu)
    galloc.alloc(graph)
    for leaf in graph.leafs:
        leaf.set(leaf._values)  # type: ignore[attr-defined]
    graph.compute(cpu)
    return galloc


def _leaf(values: np.ndarray, name: str) -> ferry.Tensor:
    t = ferry.Tensor.new(ferry.to_type(values.dtype), list(reversed(values.shape)), name=name).set_input()
    t._values = np.ascontiguousarray(values)  # type: ignore[attr-defined]
    return t


@pytest.mark.parametrize("dtype,rtol,atol", [(np.float32, 1e-6, 1e-6), (np.float16, 2e-3, 2e-3)])
def test_small_graph_end_to_end_matches_numpy(cpu: ferry.CPUBackend, dtype: type, rtol: float, atol: float) -> None:
    a_np = RNG.standard_normal((3, 4, 8)).astype(dtype)
    b_np = RNG.standard_normal((1, 4, 8)).astype(dtype)
    c_np = RNG.standard_normal((3, 4, 8)).astype(dtype)
    a, b, c = _leaf(a_np, "a"), _leaf(b_np, "b"), _leaf(c_np, "c")
    s = ferry.ops.scale((a + b) * c, 0.25, name="s")
    m = ferry.ops.mean(s, name="m").set_output()
    p = ferry.ops.pad(s, 2, 1, name="p").set_output()
    j = ferry.ops.concat(a, c, 2, name="j").set_output()
    d = ferry.ops.dup(s, "f32", name="d").set_output()
    galloc = _run(cpu, m, p, j, d)
    a64, b64, c64 = (x.astype(np.float64) for x in (a_np, b_np, c_np))
    want_s = (a64 + b64) * c64 * 0.25
    np.testing.assert_allclose(m.to_numpy(), want_s.mean(axis=2, keepdims=True), rtol=rtol, atol=atol)
    want_p = np.zeros((3, 5, 10))
    want_p[:, :4, :8] = want_s
    np.testing.assert_allclose(p.to_numpy(), want_p, rtol=rtol, atol=atol)
    np.testing.assert_array_equal(j.to_numpy(), np.concatenate([a_np, c_np], axis=0))
    assert d.type == ferry.Type.F32
    np.testing.assert_allclose(d.to_numpy(), want_s, rtol=rtol, atol=atol)
    assert m.buffer is not None and m.buffer.owner is galloc and not m.buffer.closed


def test_ops_on_a_strided_permuted_view_compute_numpys_values(cpu: ferry.CPUBackend) -> None:
    x_np = RNG.standard_normal((4, 6, 8)).astype(np.float32)  # ne = [8, 6, 4]
    x = _leaf(x_np, "x")
    # every other row of each plane, then dimensions 0 and 1 swapped: a strided, permuted view
    v = x.view([8, 3, 4], [4, 64, 192], offset=32).permute(1, 0, 2, 3)
    assert not v.is_contiguous and v.ne == (3, 8, 4, 1)
    want_v = x_np[:, 1::2, :].transpose(0, 2, 1).astype(np.float64)
    y = ferry.ops.scale(ferry.ops.dup(v) + v, -1.5).set_output()
    m = ferry.ops.mean(v).set_output()
    _run(cpu, y, m)
    np.testing.assert_allclose(y.to_numpy(), want_v * 2 * -1.5, rtol=1e-6)
    np.testing.assert_allclose(m.to_numpy(), want_v.mean(axis=2, keepdims=True), rtol=1e-5, atol=1e-6)


def test_graph_lists_leafs_and_nodes_in_order() -> None:
    a = ferry.Tensor.new("f32", [4], name="a")
    b = ferry.Tensor.new("f32", [4], name="b")
    s = ferry.ops.add(a, b, name="s")
    t = ferry.ops.scale(s, 2.0, name="t")
    g = ferry.Graph(t)
    assert [x.name for x in g.leafs] == ["a", "b"]
    assert [x.name for x in g.nodes] == ["s", "t"]
    assert g.leafs[0] is a and g.nodes[1] is t and t.srcs == (s,) and s.srcs == (a, b)
    assert s in g and ferry.Tensor.new("f32", [4]) not in g
    g.build(ferry.ops.mean(t, name="u"), t)  # t again is not added twice
    assert [x.name for x in g.nodes] == ["s", "t", "u"]
    assert [ferry.ops.op_name(x.op) for x in g.nodes] == ["add", "scale", "mean"]


@pytest.mark.parametrize("make,match", [
    (lambda a, b, c: ferry.ops.add(a, b), "cannot be repeated"),
    (lambda a, b, c: ferry.ops.mul(a, b), "cannot be repeated"),
    (lambda a, b, c: a + c, "is f16"),
    (lambda a, b, c: ferry.ops.concat(a, b, 0), "concat along 0: ne\\[1\\] differs"),
    (lambda a, b, c: ferry.ops.concat(a, c, 1), "is f16"),
    (lambda a, b, c: ferry.ops.pad(a, -1), "negative"),
    (lambda a, b, c: ferry.ops.mean(ferry.Tensor.new("q8_0", [64, 2])), "blocks"),
    (lambda a, b, c: ferry.ops.dup(a, "q8_0"), "not whole q8_0 blocks"),
])
def test_wrong_shapes_raise_layout_error(make, match: str) -> None:  # type: ignore[no-untyped-def]
    a = ferry.Tensor.new("f32", [6, 4], name="a")
    b = ferry.Tensor.new("f32", [4, 3], name="b")
    c = ferry.Tensor.new("f16", [6, 4], name="c")
    with pytest.raises(ferry.LayoutError, match=match) as e:
        make(a, b, c)
    assert isinstance(e.value, ferry.FerryError) and e.value.status == lib.FERRY_ERR_LAYOUT


def test_bad_op_arguments_raise_ferry_errors() -> None:
    a = ferry.Tensor.new("f32", [4])
    with pytest.raises(ferry.InvalidArgumentError):
        a + 1  # type: ignore[operator]
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.ops.scale(a, "2")  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.ops.scale(a, float("inf"))
    with pytest.raises(ferry.InvalidArgumentError, match="dim 7"):
        ferry.ops.concat(a, a, 7)
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.ops.pad(a, 2**40)
    with pytest.raises(ferry.UnknownTypeError):
        ferry.ops.dup(a, "f64")
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.Graph(a, "b")  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.Graph(a).compute("cpu")  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.GraphAllocator()
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.GraphAllocator(ferry.CPUBackend()).alloc(a)  # type: ignore[arg-type]


def test_compute_without_memory_is_an_error(cpu: ferry.CPUBackend) -> None:
    a = ferry.Tensor.new("f32", [4], name="a")
    g = ferry.Graph(ferry.ops.scale(a, 2.0))
    with pytest.raises(ferry.NotAllocatedError):
        g.compute(cpu)


def test_op_result_keeps_operands_alive(cpu: ferry.CPUBackend) -> None:
    a = ferry.Tensor.new("f32", [4], name="a")
    b = ferry.Tensor.new("f32", [4], name="b")
    refs = weakref.ref(a), weakref.ref(b)
    s = a + b
    del a, b
    gc.collect()
    assert all(r() is not None for r in refs)
    assert [t.name for t in ferry.Graph(s).leafs] == ["a", "b"]
    del s
    gc.collect()
    assert all(r() is None for r in refs)
