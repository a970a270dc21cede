"""The residency planner's third tier: a layer's KV in a remote tier, pulled to the host and then
copied to its device (ferry.residency.RemoteSpec). The pull's arithmetic is the tier's own (its
pieces C's, merged by the one rule, priced as RemoteTier.pull predicts), checked by hand and, where
the transfer engine is here, against a pull of the same window; the split between host memory and
the tier is checked against every split of small problems (hypothesis, derandomized)."""

from __future__ import annotations

import itertools
import json
import math
from typing import List

import numpy as np
import pytest
from hypothesis import example, given, settings
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


def test_the_tiers_own_time_a_window_is_the_calling_threads_serial_or_prefetching() -> None:
    """RemoteSpec.host_us: the tier plans, issues and places each window's pull on the calling thread,
    so serially a step pays it once a window of each remote layer on top of the pulls' link time, and
    prefetching under long computes too (the link's time hidden, the thread's not); under short ones
    part of it fills the thread's wait for the link. It counts in pull_seconds."""
    layers = geometry()
    link = remote_link_model(BATCH_US, PIECE_US, GBPS)
    host_us = 300.0
    resident, remote = [True, False, False, False], [False, False, True, True]
    windows = 2 * 2  # K and V of each of the two remote layers
    for dev in ([DeviceSpec(2.0, 10.0, 1e-4)], [DeviceSpec(2.0, 10.0, 5e-3)]):
        for prefetch in (0, 1):
            bare = predict_step(layers, dev, resident, prefetch=prefetch, remote=remote, remote_tier=RemoteSpec(link))
            hosted = predict_step(layers, dev, resident, prefetch=prefetch, remote=remote,
                                  remote_tier=RemoteSpec(link, host_us=host_us))
            assert math.isclose(hosted.pull_seconds, bare.pull_seconds + windows * host_us * 1e-6, rel_tol=1e-12)
            if prefetch == 0 or dev[0].compute_s == 5e-3:  # serial, or pulls hidden whole under 5 ms layers
                assert math.isclose(hosted.step_seconds, bare.step_seconds + windows * host_us * 1e-6,
                                    rel_tol=1e-12), (prefetch, dev)
            # where the calling thread waits for the link anyway, its own work fills part of that wait
            assert bare.step_seconds < hosted.step_seconds <= bare.step_seconds + windows * host_us * 1e-6 + 1e-12
    with pytest.raises(ferry.InvalidArgumentError, match=r"RemoteSpec: host_us is a finite number of microseconds"):
        RemoteSpec(link, host_us=-1.0)


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


def test_auto_places_the_devices_with_the_pulls_it_saves() -> None:
    """One device slot and a host that holds a pull's staging but no layer beside it: the layer kept
    on the device is the one whose copies and pull together cost most, not the one whose copies
    alone do. X copies 200 KB in one piece a window, Y 160 KB in 40 pieces a window (gaps of 100 KB,
    dearer than a piece: no merge). Kept for its copies, X leaves Y remote: 80 us of copies and a
    1,340 us pull; kept for both, Y leaves X remote: 100 us and 424 us (a batch a window). The plan
    is the optimum (exact, serially; prefetched with nothing to hide the pull under, the same plan)
    with its sizes of two kinds."""
    x = LayerCost((100_000, 100_000), 1 << 20, pieces=(((0, 100_000),), ((0, 100_000),)))
    rows = tuple((k * 102_000, 2_000) for k in range(40))
    y = LayerCost((80_000, 80_000), 1 << 20, pieces=(rows, rows))
    tier = RemoteSpec(remote_link_model(BATCH_US, PIECE_US, GBPS), host_memory=200_000)
    for prefetch in (0, 1):
        plan = choose_residency("auto", [x, y], [DeviceSpec(2.0)], prefetch=prefetch, max_layers=1, remote_tier=tier)
        assert plan.resident == (False, True) and plan.remote_layers() == [0], prefetch
        assert math.isclose(plan.step_seconds, 100e-6 + 424e-6, rel_tol=1e-9)
        assert plan.exact == (prefetch == 0)
    # the same geometry of two kinds (a sliding layer beside full ones) is claimed exact too
    mixed = layers_from_geometry("f16", "f16", HEAD_DIM, N_HEAD_KV, N_CTX, N_STREAM, N_KV, [None, 64, None, None])
    tier = RemoteSpec(tier.link, host_memory=mixed[0].resident_bytes + 2 * N_STREAM * N_KV * ROW)
    plan = choose_residency("auto", mixed, [DeviceSpec(2.0)], max_layers=1, remote_tier=tier)
    assert plan.remote_layers() and plan.exact and plan.bound == 1.0


@st.composite
def tiered_problems(draw: st.DrawFn) -> tuple:
    """A few layers of drawn sizes (a window's bytes and its pieces, each layer's K and V at least
    its window's), one or two devices with drawn memory, a host memory, a count cap and a prefetch
    depth."""
    n = draw(st.integers(1, 5))
    layers = []
    for _ in range(n):
        cells = draw(st.sampled_from([1, 8, 40]))
        pieces = draw(st.sampled_from([1, 4]))
        rows = tuple((k * 50_000, cells * 100) for k in range(pieces))
        window = pieces * cells * 100
        layers.append(LayerCost((window, window), draw(st.sampled_from([2, 3])) * 2 * window,
                                output_bytes=draw(st.sampled_from([0, 64])), pieces=(rows, rows)))
    n_dev = draw(st.integers(1, 2))
    staging = max(layer.window_bytes for layer in layers)  # a pull's, or a device's copies of a window
    total = sum(layer.resident_bytes for layer in layers)
    devices = [DeviceSpec(draw(st.sampled_from([1.0, 4.0])), 2.0, draw(st.sampled_from([0.0, 3e-5])),
                          draw(st.sampled_from([None, staging + 64 * n, staging + 64 * n + total // 3])))
               for _ in range(n_dev)]
    layer_device = draw(st.lists(st.integers(0, n_dev - 1), min_size=n, max_size=n))
    host = staging + total * draw(st.sampled_from([0, 1, 2, 3])) // 4 - draw(st.sampled_from([0, 1]))
    max_layers = draw(st.sampled_from([None, 0, 1, 2]))
    return layers, devices, layer_device, host, max_layers, draw(st.integers(0, 1))


@example(([LayerCost((800, 800), 3200, pieces=(((0, 800),),) * 2),
           LayerCost((400, 400), 2400, pieces=(tuple((k * 50_000, 100) for k in range(4)),) * 2)],
          [DeviceSpec(2.0, memory=5_000)], [0, 0], 1_600, 1, 0))  # the cheaper copies, the dearer pull, on the device
@settings(max_examples=60, deadline=None)
@given(tiered_problems())
def test_auto_is_the_least_of_every_device_host_and_remote_assignment(problem: tuple) -> None:
    """Every layer on its device, in host memory or remote (3^n assignments), priced by predict_step:
    auto's plan fits (each device's memory, the host memory, max_layers) and its step is the least
    of every assignment that does, serial and prefetched with no layer remote, and it says it is
    exact; prefetched with layers remote it claims nothing and is no better than the least; where
    none fits, it is refused naming what cannot hold it."""
    layers, devices, layer_device, host_memory, max_layers, prefetch = problem
    tier = RemoteSpec(remote_link_model(BATCH_US, PIECE_US, GBPS), host_memory=host_memory)
    best, best_resident = None, None
    for where in itertools.product("dhr", repeat=len(layers)):
        resident = [w == "d" for w in where]
        if max_layers is not None and sum(resident) > max_layers:
            continue
        got = predict_step(layers, devices, resident, layer_device, prefetch, remote=[w == "r" for w in where],
                           remote_tier=tier)
        if got.host_bytes > host_memory or any(s.memory is not None and m > s.memory
                                               for s, m in zip(devices, got.memory)):
            continue
        if best is None or got.step_seconds < best:
            best, best_resident = got.step_seconds, resident
    try:
        plan = choose_residency("auto", layers, devices, layer_device, prefetch, max_layers, remote_tier=tier)
    except PlanDoesNotFitError as e:
        # refused: nothing fits, or only placements keeping no layer where a device has a budget
        assert best is None or ("no layer fits" in str(e) and not any(best_resident or ())), str(e)
        return
    assert best is not None
    pred = plan.prediction
    assert pred.host_bytes <= host_memory and (max_layers is None or len(plan.resident_layers()) <= max_layers)
    assert all(s.memory is None or m <= s.memory for s, m in zip(devices, pred.memory))
    if prefetch and plan.remote_layers():
        # the search prices the pulls whole, the scheduler hides part of them: no claim, never better
        assert not plan.exact and math.isinf(plan.bound)
        assert plan.step_seconds >= best * (1 - 1e-9)
        return
    assert plan.exact and plan.bound == 1.0
    assert math.isclose(plan.step_seconds, best, rel_tol=1e-9, abs_tol=1e-15), (plan.step_seconds, best)


def test_auto_says_where_the_joint_search_stopped_short(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the serial enumeration's limit the search over layers finds the same optimum (small
    here); where that search stops at its limit, or a split is made greedily, the plan is not
    claimed exact and no bound is claimed (the bound's proof leaves the pulls out); without a host
    memory to fit, the prefetched bound stands as before."""
    import ferry.residency.model as model
    import ferry.residency.planner as planner

    layers = [LayerCost((c * 100, c * 100), 4 * c * 100, pieces=(tuple((k * 50_000, c * 100) for k in range(p)),) * 2)
              for c, p in ((40, 1), (8, 4), (20, 2), (1, 4), (30, 1), (8, 1))]
    dev = [DeviceSpec(2.0, 2.0)]
    tier = RemoteSpec(remote_link_model(BATCH_US, PIECE_US, GBPS), host_memory=10_000)
    exact = choose_residency("auto", layers, dev, max_layers=2, remote_tier=tier)
    assert exact.exact and exact.remote_layers()
    monkeypatch.setattr(planner, "JOINT_LIMIT", 0)
    searched = choose_residency("auto", layers, dev, max_layers=2, remote_tier=tier)
    assert searched.exact and math.isclose(searched.step_seconds, exact.step_seconds, rel_tol=1e-12)
    ahead = RemoteSpec(tier.link, host_memory=20_000)  # prefetching, three pulls' staging at once
    stopped = planner.choose_auto(layers, dev, prefetch=1, max_layers=2, search_limit=1, remote_tier=ahead)
    assert not stopped.exact and math.isinf(stopped.bound)
    alone = planner.choose_auto(layers, dev, prefetch=1, max_layers=2, search_limit=1)
    assert not alone.exact and alone.bound == 2.0
    monkeypatch.setattr(model, "SPLIT_LIMIT", 0)
    greedy = choose_residency("auto", layers, dev, max_layers=2, remote_tier=tier)
    assert not greedy.exact and math.isinf(greedy.bound) and greedy.prediction.host_bytes <= 10_000


def test_residency_plan_prints_the_joint_optimum_for_layers_of_two_kinds(capsys: pytest.CaptureFixture[str]) -> None:
    """`ferry residency-plan` with a sliding layer beside full ones and a remote tier: auto's plan is
    the library's joint one, and the note says it is the optimum."""
    from ferry.cli import main

    args = ["residency-plan", "-c", "256", "-npl", "1", "-npp", "120", "-ntg", "8", "--pad", "1", "--layers", "4",
            "--heads", "2", "--head-dim", "32", "--kv-heads", "2", "--type", "f16", "--compute-us", "20",
            "--kv-device-layers", "1", "--swa-window", "16", "--swa-layers", "sfff", "--remote-link", "150,12,2",
            "--host-memory", "100KiB", "--strategy", "auto"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "auto: the model's optimum" in out
    assert main(args + ["--json"]) == 0
    plan = json.loads(capsys.readouterr().out)[0]
    assert plan["exact"] and plan["bound"] == 1.0 and plan["remote_layers"]


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
