"""The scheduler from Python: splits and assignments, the values a split computes from its copied inputs under
every copy policy, and the policy's names and refusals."""

from __future__ import annotations

import numpy as np
import pytest

import ferry


def test_graph_read_by_cpu_op_same_numbers_under_both_policies() -> None:
    """The copy feeds real kernels (dup, scale on the split backend): same values under flat and
    ranges, and those values are numpy's."""
    results = {}
    for policy in ("flat", "ranges"):
        cpu = ferry.CPUBackend()
        split = ferry.DummyBackend(real_memory=True)
        kv = ferry.KVCache("f32", "f32", 8, 2, 96, 4)
        # value = stream*1000 + cell + channel/100
        s, c, ch = np.meshgrid(np.arange(4), np.arange(24), np.arange(16), indexing="ij")
        cache = (1000 * s + c + ch / 100).astype(np.float32)  # numpy order [stream, cell, channel]
        for stream in range(4):
            kv.set_stream("k", 0, stream, cache[stream])
        k, _ = kv.window(0, 7, 1, 3)
        d = ferry.ops.dup(k, name="d")
        out = ferry.ops.scale(d, 0.5, name="out").set_output()
        g = ferry.Graph(out)
        sched = ferry.Scheduler([split, cpu], policy=policy)
        sched.assign(d, split)
        sched.compute(g)
        assert [(sp.backend, sp.n_nodes, len(sp.inputs)) for sp in sched.splits] == [(split, 2, 1)]
        assert sched.backend_of(out) is split
        results[policy] = out.to_numpy()
        # numpy: window [ns, n_head_kv, n_kv, head_dim] of streams 1..3, cells 0..6
        want = 0.5 * cache[1:4, :7, :].astype(np.float64).reshape(3, 7, 2, 8).transpose(0, 2, 1, 3)
        np.testing.assert_allclose(results[policy], want, rtol=1e-6)
    np.testing.assert_array_equal(results["flat"], results["ranges"])


def test_cleared_assignments_send_the_node_back_to_its_datas_backend() -> None:
    """An assignment moves a node to the split (its window becomes an input); cleared, the node goes back
    to the CPU next to its data, and the scheduler no longer holds the assigned tensor."""
    cpu, split = ferry.CPUBackend(), ferry.DummyBackend(real_memory=True)
    kv = ferry.KVCache("f32", "f32", 8, 1, 32, 2)
    k, _ = kv.window(0, 4, 0, 1)
    out = ferry.ops.dup(k, name="out").set_output()
    g = ferry.Graph(out)
    sched = ferry.Scheduler([cpu, split])
    sched.assign(out, split)
    sched.alloc(g)
    assert sched.backend_of(out) is split and len(sched.inputs) == 1 and sched.n_assigned == 1
    sched.clear_assignments()
    assert sched.n_assigned == 0
    sched.alloc(g)
    assert sched.backend_of(out) is cpu and sched.inputs == []


def test_a_policy_is_set_by_name_or_enum_and_an_unknown_one_is_refused() -> None:
    sched = ferry.Scheduler([ferry.CPUBackend()])
    assert sched.policy == ferry.CopyPolicy.FLAT and str(sched.policy) == "flat"
    sched.policy = "ranges"
    assert sched.policy == ferry.CopyPolicy.RANGES
    sched.policy = ferry.CopyPolicy.PLAN
    assert str(sched.policy) == "plan"
    with pytest.raises(ferry.InvalidArgumentError, match="unknown copy policy 'fast'"):
        sched.policy = "fast"
    with pytest.raises(ferry.InvalidArgumentError):
        sched.policy = 3  # type: ignore[assignment]
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.Scheduler([])
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.Scheduler(["cpu"])  # type: ignore[list-item]
    stranger = ferry.CPUBackend()
    with pytest.raises(ferry.InvalidArgumentError, match="not one of the scheduler's"):
        sched.assign(ferry.Tensor.new("f32", [4]), stranger)
