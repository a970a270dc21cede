"""The residency planner's third tier: a layer's KV in a remote tier, pulled to the host and then
copied to its device (ferry.residency.RemoteSpec). The pull's arithmetic is the tier's own (its
pieces C's, merged by the one rule, priced as RemoteTier.pull predicts), checked by hand and, where
the transfer engine is here, against a pull of the same window; the split between host memory and
the tier is checked against every split of small problems (hypothesis, derandomized)."""

from __future__ import annotations

import itertools
import math
from typing import List

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import ferry
from ferry.plan import copy_pieces
from ferry.remote import engine_missing
from ferry.residency import (
    STRATEGIES,
    DeviceSpec,
    LayerCost,
    PlanDoesNotFitError,
    RemoteSpec,
    choose_residency,
    layers_from_geometry,
    predict_step,
    remote_link_model,
)

needs_engine = pytest.mark.skipif(engine_missing() is not None, reason=f"no transfer engine: {engine_missing()}")

#: The loopback's fit, rounded (tools/results/2026-12-07-remote-tier.md): a batch, a piece, the rate.
BATCH_US, PIECE_US, GBPS = 150.0, 12.0, 2.0
HEAD_DIM, N_HEAD_KV, N_CTX, N_STREAM, N_KV = 64, 2, 4096, 4, 200
ROW = HEAD_DIM * N_HEAD_KV * 2  # an f16 cell of K (or V)


def geometry(n_layer: int = 4, n_kv: int = N_KV) -> List[LayerCost]:
    return layers_from_geometry("f16", "f16", HEAD_DIM, N_HEAD_KV, N_CTX, N_STREAM, n_kv, [None] * n_layer)


def test_a_layers_pieces_are_cs_one_range_per_stream() -> None:
    """The pieces layers_from_geometry gives are C's pieces of each window's one range per stream:
    n_kv cells at the start of each stream's kv_size cells."""
    kv_size = N_CTX // N_STREAM
    layer = geometry()[0]
    want = tuple((s * kv_size * ROW, N_KV * ROW) for s in range(N_STREAM))
    assert layer.pieces == (want, want)
    assert [p.size for p in copy_pieces([(0, N_KV * ROW, N_STREAM, kv_size * ROW)])] == [n for _, n in want]


def test_a_remote_layer_pays_its_pull_before_the_step_then_its_copies() -> None:
    """A remote layer adds a batch a window, a piece each of its (unmerged: the gaps are far dearer
    than a piece) pieces and their bytes to the host layer it would be; nothing else changes."""
    layers = geometry()
    link = remote_link_model(BATCH_US, PIECE_US, GBPS)
    tier = RemoteSpec(link)
    dev = [DeviceSpec(2.0, 10.0, 1e-4)]
    resident = [True, False, False, False]
    host = predict_step(layers, dev, resident, remote_tier=tier)
    two = predict_step(layers, dev, resident, remote=[False, False, True, True], remote_tier=tier)
    pull = 2 * BATCH_US * 1e-6 + 2 * N_STREAM * (PIECE_US * 1e-6 + N_KV * ROW / (GBPS * 1e9))
    assert two.remote_pieces == 2 * 2 * N_STREAM and two.pulled_bytes == 2 * 2 * N_STREAM * N_KV * ROW
    assert math.isclose(two.pull_seconds, 2 * pull, rel_tol=1e-12)
    assert math.isclose(two.step_seconds, host.step_seconds + 2 * pull, rel_tol=1e-12)
    assert host.pull_seconds == 0 and host.remote_pieces == 0
    # host memory: the one local layer's K and V, and one remote pull's staging
    assert two.host_bytes == layers[1].resident_bytes + 2 * N_STREAM * N_KV * ROW


def test_prefetching_the_pulls_travel_under_the_compute_of_the_layers_before() -> None:
    """With a prefetch of 1 the scheduler issues a layer's pull two parts ahead and waits for it
    only as it queues the layer's copies: where each layer's compute outlasts a pull, the remote
    layers cost the step nothing more than host layers would, though their staging is held for the
    pulls in flight (three: the first part begins those of parts 0..2); where the compute is short,
    the pulls show, but never more than serially."""
    layers = geometry()
    tier = RemoteSpec(remote_link_model(BATCH_US, PIECE_US, GBPS))
    resident, remote = [True, False, False, False], [False, False, True, True]
    window = 2 * N_STREAM * N_KV * ROW
    slow = [DeviceSpec(2.0, 10.0, 5e-3)]  # 5 ms a layer: a pull (~0.5 ms) hides under it
    host = predict_step(layers, slow, resident, prefetch=1)
    two = predict_step(layers, slow, resident, prefetch=1, remote=remote, remote_tier=tier)
    assert math.isclose(two.step_seconds, host.step_seconds, rel_tol=1e-12)
    assert two.host_bytes == layers[1].resident_bytes + 2 * window
    fast = [DeviceSpec(2.0, 10.0, 1e-5)]
    host = predict_step(layers, fast, resident, prefetch=1)
    two = predict_step(layers, fast, resident, prefetch=1, remote=remote, remote_tier=tier)
    serial = predict_step(layers, fast, resident, remote=remote, remote_tier=tier)
    assert host.step_seconds < two.step_seconds <= serial.step_seconds


def test_small_gaps_merge_by_the_links_model() -> None:
    """A window of nearly the whole stream: the gaps between streams cost less than a piece at the
    link's rate, so the pull reads one span per window, gaps included (ferry_copy_pieces_merge)."""
    kv_size = N_CTX // N_STREAM
    layers = geometry(2, kv_size - 8)  # gaps of 8 cells: 4 KiB, 2 us at 2 GB/s, under the 12 us piece
    tier = RemoteSpec(remote_link_model(BATCH_US, PIECE_US, GBPS))
    got = predict_step(layers, [DeviceSpec(2.0)], [True, False], remote=[False, True], remote_tier=tier)
    span = ((N_STREAM - 1) * kv_size + kv_size - 8) * ROW
    assert got.remote_pieces == 2 and got.pulled_bytes == 2 * span
    assert math.isclose(got.pull_seconds, 2 * BATCH_US * 1e-6 + 2 * (PIECE_US * 1e-6 + span / (GBPS * 1e9)),
                        rel_tol=1e-12)


@st.composite
def host_problems(draw: st.DrawFn) -> tuple:
    n = draw(st.integers(1, 6))
    sizes = draw(st.lists(st.sampled_from([1000, 3000, 8000]), min_size=n, max_size=n))
    cells = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    budget = draw(st.integers(0, 30000))
    return sizes, cells, budget


@example(([8000, 1000, 1000], [40, 1, 1], 9000))  # the large layer local, the small ones remote, not the reverse
@given(host_problems())
def test_the_split_is_the_least_pull_that_fits_the_host(problem: tuple) -> None:
    """With no device memory to keep a layer (--kv-device-layers 0), every layer is in host memory or
    remote: the planner's split has the least total pull of every split that fits the host memory
    (local layers' bytes and the largest remote pull's staging), and is refused, naming the host
    memory, only where none fits."""
    sizes, cells, budget = problem
    layers = [LayerCost((c * 100, c * 100), s, pieces=(((0, c * 100),), ((0, c * 100),)))
              for s, c in zip(sizes, cells)]
    tier = RemoteSpec(remote_link_model(BATCH_US, PIECE_US, GBPS), host_memory=budget)
    dev = [DeviceSpec(2.0)]
    n = len(layers)

    def pull(i: int) -> float:
        return 2 * BATCH_US * 1e-6 + 2 * (PIECE_US * 1e-6 + cells[i] * 100 / (GBPS * 1e9))

    best = None
    for remote in itertools.product([False, True], repeat=n):
        held = sum(s for s, r in zip(sizes, remote) if not r) + max((2 * c * 100 for c, r in zip(cells, remote) if r),
                                                                   default=0)
        if held <= budget:
            total = sum(pull(i) for i in range(n) if remote[i])
            best = total if best is None else min(best, total)
    if best is None:
        with pytest.raises(PlanDoesNotFitError, match="host memory"):
            choose_residency("auto", layers, dev, max_layers=0, remote_tier=tier)
        return
    plan = choose_residency("auto", layers, dev, max_layers=0, remote_tier=tier)
    assert plan.prediction.host_bytes <= budget
    assert math.isclose(plan.prediction.pull_seconds, best, rel_tol=1e-9, abs_tol=1e-15)
    assert sorted(plan.host_layers() + plan.remote_layers()) == list(range(n))


def test_every_strategy_sends_what_the_host_cannot_hold_remote() -> None:
    """A host memory of two layers and a pull's staging: each strategy keeps its device layer, two
    layers local and sends the rest remote; the plan's data says which."""
    layers = geometry(6)
    staging = 2 * N_STREAM * N_KV * ROW
    tier = RemoteSpec(remote_link_model(BATCH_US, PIECE_US, GBPS), host_memory=2 * layers[0].resident_bytes + staging)
    for s in STRATEGIES:
        plan = choose_residency(s, layers, [DeviceSpec(2.0)], max_layers=1, remote_tier=tier)
        assert len(plan.resident_layers()) == 1 and len(plan.host_layers()) == 2 and len(plan.remote_layers()) == 3
        d = plan.as_dict()
        assert d["remote_layers"] == plan.remote_layers() and d["host_memory"] == tier.host_memory
        assert d["remote_pieces"] == 3 * 2 * N_STREAM


def test_auto_claims_the_optimum_with_layers_remote_only_where_the_layers_are_of_one_kind() -> None:
    """The devices' placement is chosen without the pulls: with every layer alike, any placement of
    as many layers is the same, and the plan is the optimum; with a sliding layer beside the full
    ones, that is not proven, and the plan says so (exact False, no bound)."""
    link = remote_link_model(BATCH_US, PIECE_US, GBPS)
    alike = geometry(4)
    tier = RemoteSpec(link, host_memory=alike[0].resident_bytes + 2 * N_STREAM * N_KV * ROW)
    plan = choose_residency("auto", alike, [DeviceSpec(2.0)], max_layers=1, remote_tier=tier)
    assert plan.remote_layers() and plan.exact and plan.bound == 1.0
    mixed = layers_from_geometry("f16", "f16", HEAD_DIM, N_HEAD_KV, N_CTX, N_STREAM, N_KV, [None, 64, None, None])
    plan = choose_residency("auto", mixed, [DeviceSpec(2.0)], max_layers=1, remote_tier=tier)
    assert plan.remote_layers() and not plan.exact and math.isinf(plan.bound)
    assert choose_residency("auto", mixed, [DeviceSpec(2.0)], max_layers=1).exact  # without the tier, as before


def test_bad_remote_inputs_are_refused_naming_them() -> None:
    layers = geometry(2)
    dev = [DeviceSpec(2.0)]
    link = remote_link_model(BATCH_US, PIECE_US, GBPS)
    with pytest.raises(ferry.InvalidArgumentError, match="both resident and remote"):
        predict_step(layers, dev, [True, False], remote=[True, False], remote_tier=RemoteSpec(link))
    with pytest.raises(ferry.InvalidArgumentError, match="need a remote_tier"):
        predict_step(layers, dev, [True, False], remote=[False, True])
    with pytest.raises(ferry.InvalidArgumentError, match="entries in remote"):
        predict_step(layers, dev, [True, False], remote=[False], remote_tier=RemoteSpec(link))
    with pytest.raises(ferry.InvalidArgumentError, match="RemoteSpec: link is a CopyCostModel"):
        RemoteSpec(3.0)
    with pytest.raises(ferry.InvalidArgumentError, match="host_memory"):
        RemoteSpec(link, host_memory=-1)
    with pytest.raises(ferry.InvalidArgumentError, match="remote_tier is a RemoteSpec"):
        choose_residency("auto", layers, dev, remote_tier=link)  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgumentError, match="gbps"):
        remote_link_model(1.0, 1.0, 0.0)
    with pytest.raises(ferry.InvalidArgumentError, match=r"pieces has 1 entries for 2 transfers"):
        LayerCost((10, 10), 20, pieces=(((0, 10),),))
    with pytest.raises(ferry.InvalidArgumentError, match=r"pieces\[0\]\[0\] is an \(offset, bytes\) pair"):
        LayerCost((10, 10), 20, pieces=(((0, 10, 3),), ((0, 10),)))
    with pytest.raises(PlanDoesNotFitError, match="host memory: 10 bytes cannot hold"):
        choose_residency("first", layers, dev, max_layers=1, remote_tier=RemoteSpec(link, host_memory=10))


def test_the_design_pages_figures_are_the_models() -> None:
    """docs/design.md's table ("Three tiers"): 2 KiB cells, 2,048 a stream, the rounded loopback fit
    beside a 25 GB/s link: the pull and the host -> device copies of one layer, in us."""
    tier = RemoteSpec(remote_link_model(BATCH_US, PIECE_US, GBPS))
    rows = {(8, 1024): (16, 17269, 1342), (8, 64): (16, 1541, 84), (1, 64): (2, 455, 10)}
    for (npl, n_kv), (pieces, pull_us, copy_us) in rows.items():
        layers = layers_from_geometry("f16", "f16", 128, 8, npl * 2048, npl, n_kv, [None] * 2)
        got = predict_step(layers, [DeviceSpec(25.0)], [True, False], remote=[False, True], remote_tier=tier)
        host = predict_step(layers, [DeviceSpec(25.0)], [True, False])
        assert (got.remote_pieces, round(got.pull_seconds * 1e6), round(host.step_seconds * 1e6)) == \
            (pieces, pull_us, copy_us)
    # n_kv 2,040: gaps of 16 KiB, dearer to skip than to read, so one span per window
    layers = layers_from_geometry("f16", "f16", 128, 8, 8 * 2048, 8, 2040, [None] * 2)
    got = predict_step(layers, [DeviceSpec(25.0)], [True, False], remote=[False, True], remote_tier=tier)
    assert got.remote_pieces == 2 and got.pulled_bytes - layers[1].window_bytes == 224 << 10


@needs_engine
def test_the_prediction_is_the_tiers_own_pulls_in_a_schedulers_step() -> None:
    """A remote layer's pieces, bytes and predicted pulls are what the tier reads and predicts when a
    scheduler pulls the same windows under ranges (fetch_layers), merged by the same link: windows
    of nearly the whole stream (one span each) and of part of it (a piece per stream)."""
    from ferry.remote import RemoteTier
    from ferry.step import attention_step

    link = remote_link_model(BATCH_US, PIECE_US, GBPS)
    kv = ferry.KVCache("f16", "f16", HEAD_DIM, N_HEAD_KV, N_CTX, N_STREAM, 2)
    dev, cpu = ferry.StandinBackend(), ferry.CPUBackend()
    try:
        with RemoteTier(kv, model=link) as tier:
            tier.upload()
            tier.fetch_layers([1])
            for n_kv in (N_KV, N_CTX // N_STREAM - 8):
                sched = ferry.Scheduler([dev, cpu], policy="ranges")
                q = [ferry.Tensor.from_numpy(cpu, np.zeros((N_STREAM, 1, 4, HEAD_DIM), np.float32))
                     for _ in range(2)]
                kv_len = ferry.Tensor.from_numpy(cpu, np.full(N_STREAM, n_kv, np.int32))
                sched.compute(attention_step(sched, dev, kv.windows(n_kv), q, kv_len).graph)
                got = tier.take_fetch_stats()
                want = predict_step(geometry(2, n_kv), [DeviceSpec(2.0)], [True, False], remote=[False, True],
                                    remote_tier=RemoteSpec(link))
                assert len(got) == 2 and {p.layer for p in got} == {1}
                assert (sum(p.pieces for p in got), sum(p.bytes for p in got)) == \
                    (want.remote_pieces, want.pulled_bytes), n_kv
                assert math.isclose(sum(p.predicted_seconds for p in got), want.pull_seconds, rel_tol=1e-12), n_kv
    finally:
        kv.close()
