"""The residency cost model, the planner and the named rules (ferry.residency), and the stand-in's
compute slowdown.

The planner's claim is checked by enumeration: on every configuration of a grid (fixed seeds; up
to 12 layers on 2 devices; links, latencies, budgets, sliding and full layers, prefetch 0/1/2)
its predicted step time is the least of all placements that fit, and every plan fits."""

from __future__ import annotations

import itertools
import math
import random
from typing import Any, List, Optional, Sequence, Tuple

import pytest

import ferry
from ferry.plan import CopyCostModel
from ferry.residency import (
    DeviceSpec,
    LayerCost,
    PlanDoesNotFitError,
    choose_auto,
    choose_first,
    choose_residency,
    choose_round_robin,
    choose_slowest_link,
    expected_accepted_tokens,
    link_groups,
    predict_step,
)
from ferry.residency import model as residency  # the model's own functions, checked directly

MIB = 1 << 20
FULL = LayerCost((4 * MIB, 4 * MIB), 16 * MIB)         # a full-attention layer: its window half of what it holds
SLIDING = LayerCost((1 * MIB, 1 * MIB), 2 * MIB + 4096)  # a sliding layer: it holds its window (and a cell)


def _fits(plan: ferry.residency.ResidencyPlan, devices: Sequence[DeviceSpec]) -> bool:
    return all(d.memory is None or m <= d.memory for m, d in zip(plan.memory, devices))


def _enumerate(layers: Sequence[LayerCost], devices: Sequence[DeviceSpec], dev: Sequence[int],
               prefetch: int, max_layers: Optional[int] = None,
               tokens_per_step: float = 1.0) -> Tuple[Optional[float], List[Tuple[bool, ...]]]:
    """The least step time of every placement that fits, and the placements that fit."""
    best, fitting = None, []
    # predict_step's own, checked once
    problem = residency._problem(layers, devices, dev, prefetch, tokens_per_step=tokens_per_step)
    for resident in itertools.product((False, True), repeat=len(layers)):
        if max_layers is not None and sum(resident) > max_layers:
            continue
        host = [not r for r in resident]
        held, windows, inputs = residency._memory(problem, host)
        if all(d.memory is None or h + w + i + d.reserve <= d.memory
               for h, w, i, d in zip(held, windows, inputs, devices)):
            fitting.append(resident)
            t = residency._step_time(problem, host)
            best = t if best is None else min(best, t)
    return best, fitting


def _grid() -> List[Tuple[List[LayerCost], List[DeviceSpec], List[int], int]]:
    rng = random.Random(23)
    configs = []
    links = (0.33, 1.0, 2.45, 2.6)
    for case in range(60):
        n = rng.choice((1, 2, 3, 5, 8, 10, 12) if case % 4 else (12,))
        layers = [rng.choice((FULL, FULL, SLIDING)) for _ in range(n)]
        if case % 5 == 0:
            layers = [FULL if i % 3 != 2 else SLIDING for i in range(n)]
        if case % 7 == 0:  # layers of the same kind but more sizes: a bigger and a smaller full layer
            layers = [rng.choice((FULL, SLIDING, LayerCost((6 * MIB, 6 * MIB), 24 * MIB))) for _ in range(n)]
        copy_s = 8 * MIB / 1e9  # a full layer's copy at 1 GB/s
        held = sum(layer.resident_bytes for layer in layers) // 2  # about a device's share
        devices = []
        for d in range(2):
            link = rng.choice(links)
            compute = rng.choice((0.1, 0.5, 1.0, 3.0)) * copy_s
            memory = None if rng.random() < 0.1 else int(rng.uniform(0.05, 0.6) * held) + 24 * MIB
            devices.append(DeviceSpec(link, rng.choice((0.0, 10.0, 200.0)), compute, memory,
                                      rng.choice((0, MIB)), f"dev{d}"))
        if n > 1 and case % 3 == 0:
            dev = [rng.randrange(2) for _ in range(n)]  # any map, not only contiguous ranges
        else:
            dev = [i * 2 // n for i in range(n)]
        configs.append((layers, devices, dev, case % 3))
    return configs


GRID = _grid()


@pytest.mark.parametrize("case", range(len(GRID)))
def test_planner_is_the_least_of_every_placement(case: int) -> None:
    layers, devices, dev, prefetch = GRID[case]
    best, fitting = _enumerate(layers, devices, dev, prefetch)
    try:
        plan = choose_auto(layers, devices, dev, prefetch)
    except PlanDoesNotFitError:
        # refused: nothing fits, or nothing but every layer in host memory
        assert all(not any(r) for r in fitting), (case, fitting[:3])
        return
    assert best is not None
    assert _fits(plan, devices)
    assert plan.exact and plan.bound == 1.0
    assert plan.step_seconds <= best * (1 + 1e-12), (case, plan.step_seconds, best)
    for strategy in ("first", "round-robin", "slowest-link"):
        try:
            rule = choose_residency(strategy, layers, devices, dev, prefetch)
        except PlanDoesNotFitError:
            continue
        assert _fits(rule, devices), strategy
        assert rule.step_seconds >= plan.step_seconds * (1 - 1e-12), strategy


@pytest.mark.parametrize("case", range(0, len(GRID), 2))
def test_planner_is_the_least_of_every_placement_for_a_drafts_verification(case: int) -> None:
    """A draft of 4 verified a step (5 query tokens per stream): the planner is still the least of
    every placement that fits, its prediction is for 5 tokens, and no rule beats it."""
    layers, devices, dev, prefetch = GRID[case]
    best, fitting = _enumerate(layers, devices, dev, prefetch, tokens_per_step=5)
    try:
        plan = choose_auto(layers, devices, dev, prefetch, tokens_per_step=5)
    except PlanDoesNotFitError:
        assert all(not any(r) for r in fitting), (case, fitting[:3])
        return
    assert best is not None and plan.prediction.tokens_per_step == 5.0
    assert plan.step_seconds <= best * (1 + 1e-12), (case, plan.step_seconds, best)
    assert plan.step_seconds == predict_step(layers, devices, plan.resident, dev, prefetch,
                                             tokens_per_step=5).step_seconds
    for strategy in ("first", "round-robin", "slowest-link"):
        try:
            rule = choose_residency(strategy, layers, devices, dev, prefetch, tokens_per_step=5)
        except PlanDoesNotFitError:
            continue
        assert rule.prediction.tokens_per_step == 5.0, strategy
        assert rule.step_seconds >= plan.step_seconds * (1 - 1e-12), strategy


def test_a_draft_moves_the_planners_choice_to_the_copy_attention_cannot_hide() -> None:
    """One device, prefetch 1, one layer kept (max_layers): layer 0's copies take 1 s, layer 1's 3 s.
    One token (attention 0.5 s a layer): keeping layer 1, layer 0 arrives at 1 and the step ends at
    2 s; keeping layer 0, layer 1 arrives at 3 and ends at 3.5 s: keep layer 1. Ten tokens (5 s a
    layer): keeping layer 1 ends at 1 + 10 = 11 s; keeping layer 0, layer 1 arrives at 3 while layer
    0 computes 0-5, and the step ends at 10 s: keep layer 0, whose copy nothing hides."""
    layers = [LayerCost((5 * 10**8, 5 * 10**8), MIB), LayerCost((15 * 10**8, 15 * 10**8), MIB)]
    dev = [DeviceSpec(1.0, 0.0, 0.5)]
    one = choose_auto(layers, dev, prefetch=1, max_layers=1)
    ten = choose_auto(layers, dev, prefetch=1, max_layers=1, tokens_per_step=10)
    assert one.resident == (False, True) and one.step_seconds == pytest.approx(2.0)
    assert ten.resident == (True, False) and ten.step_seconds == pytest.approx(10.0)
    assert predict_step(layers, dev, one.resident, prefetch=1, tokens_per_step=10).step_seconds == pytest.approx(11.0)
    # the plan's tokens/s count the tokens kept, not the step's query tokens
    assert ten.tokens_per_second(2, accepted=2.5) == pytest.approx(2 * 2.5 / 10.0)
    data = ten.as_dict(2, 2.5)
    assert data["tokens_per_step"] == 10.0 and data["accepted_per_step"] == 2.5
    assert data["tokens_per_second"] == pytest.approx(0.5)
    with pytest.raises(ferry.InvalidArgumentError, match="tokens_per_second: accepted is a finite number of tokens > 0"):
        ten.tokens_per_second(1, accepted=0)


def test_grid_has_what_it_claims() -> None:
    """The grid covers prefetch 0/1/2, sliding layers, 12 layers, tight and loose budgets."""
    assert {c[3] for c in GRID} == {0, 1, 2}
    assert any(SLIDING in c[0] and FULL in c[0] for c in GRID)
    assert max(len(c[0]) for c in GRID) == 12
    assert any(d.memory is None for c in GRID for d in c[1])
    refused = 0
    partial = 0
    for layers, devices, dev, prefetch in GRID:
        try:
            plan = choose_auto(layers, devices, dev, prefetch)
            partial += 0 < len(plan.resident_layers()) < len(layers)
        except PlanDoesNotFitError:
            refused += 1
    print(f"{partial} of {len(GRID)} keep some layers, {refused} refused")
    assert partial >= len(GRID) // 2  # most configurations must choose, not keep all or nothing


def test_keeping_a_layer_or_prefetching_never_makes_a_step_slower() -> None:
    """A resident layer never makes a step slower; prefetching never makes a placement slower than
    serial; a serial step is the sum of copies and compute."""
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randrange(1, 9)
        layers = [rng.choice((FULL, SLIDING)) for _ in range(n)]
        devices = [DeviceSpec(rng.choice((0.33, 2.45)), rng.choice((0.0, 50.0)), rng.uniform(0, 0.02))
                   for _ in range(2)]
        dev = [rng.randrange(2) for _ in range(n)]
        resident = [rng.random() < 0.5 for _ in range(n)]
        serial = predict_step(layers, devices, resident, dev, 0)
        assert serial.step_seconds == pytest.approx(serial.compute_seconds + sum(serial.copy_seconds))
        for prefetch in (1, 2, 3):
            t = predict_step(layers, devices, resident, dev, prefetch).step_seconds
            assert t <= serial.step_seconds * (1 + 1e-12)
            assert t >= max(serial.compute_seconds, max(serial.copy_seconds)) * (1 - 1e-12)
            for i in range(n):
                more = list(resident)
                more[i] = True
                assert predict_step(layers, devices, more, dev, prefetch).step_seconds <= t * (1 + 1e-12)


def test_prefetched_steps_take_the_times_worked_out_by_hand() -> None:
    """Two layers on two devices, each transfer 0.5 s (a layer's K and V 1 s), each compute 1 s.
    Serially 4 s. With prefetch 1, layer 0's K (the calling thread) and V (the queue) take device
    0's link 0-1 s while layer 1's windows cross device 1's own link 0-1 s: compute 1-2 and 2-3,
    3 s. Device 1's copies 1.5 s: serially 4.5 s, prefetched still 3 s (they arrive at 1.5 s, while
    layer 0 computes)."""
    layers = [LayerCost((10**9, 10**9), 1)] * 2
    one_s = DeviceSpec(2.0, 0.0, 1.0)
    assert predict_step(layers, [one_s, one_s], [False, False], None, 0).step_seconds == pytest.approx(4.0)
    assert predict_step(layers, [one_s, one_s], [False, False], None, 1).step_seconds == pytest.approx(3.0)
    slow = DeviceSpec(2.0 / 1.5, 0.0, 1.0)
    assert predict_step(layers, [one_s, slow], [False, False], None, 0).step_seconds == pytest.approx(4.5)
    assert predict_step(layers, [one_s, slow], [False, False], None, 1).step_seconds == pytest.approx(3.0)
    # on one device they share its link: layer 1's windows arrive at 3 s, after layer 0's (1.5 s)
    assert predict_step(layers, [slow], [False, False], None, 1).step_seconds == pytest.approx(4.0)
    # one device, 3 layers, copies 2 s a layer, compute 2 s, prefetch 1: layer 0 arrives at 2 and
    # computes 2-4; layer 1 (queued at 0) arrives at 4, computes 4-6; layer 2, queued as part 1
    # begins (4), arrives at 6, computes 6-8: 8 s, serially 12 s
    layers3 = [LayerCost((10**9, 10**9), 1)] * 3
    dev = DeviceSpec(1.0, 0.0, 2.0)
    assert predict_step(layers3, [dev], [False] * 3, None, 1).step_seconds == pytest.approx(8.0)
    assert predict_step(layers3, [dev], [False] * 3, None, 0).step_seconds == pytest.approx(12.0)
    # compute 3 s: layer 2 is queued at 5 (part 1 begins), arrives at 7, before part 2 begins (8)
    dev3 = DeviceSpec(1.0, 0.0, 3.0)
    assert predict_step(layers3, [dev3], [False] * 3, None, 1).step_seconds == pytest.approx(11.0)
    # latency: one per transfer, 2 per layer
    lat = DeviceSpec(4.0, 1e6, 0.0)
    assert predict_step(layers3, [lat], [False] * 3, None, 0).step_seconds == pytest.approx(3 * 2 * 1.25)


def test_a_copy_serves_every_token_of_a_step_and_attention_grows_with_them() -> None:
    """A step of 3 query tokens per stream: each window is copied once (copy seconds as for one
    token), each layer's attention takes 3 times its one-token figure. Three layers, copies 2 s a
    layer, compute 2 s a token: serially 6 + 18 s. Prefetch 1: layer 0 arrives at 2 and computes
    2-8; layer 1 (queued at 0) arrives at 4, computes 8-14; layer 2, queued at 8, arrives at 10,
    computes 14-20: 20 s, the copies but the first hidden behind attention."""
    layers3 = [LayerCost((10**9, 10**9), 1)] * 3
    dev = DeviceSpec(1.0, 0.0, 2.0)
    one = predict_step(layers3, [dev], [False] * 3, None, 0)
    three = predict_step(layers3, [dev], [False] * 3, None, 0, tokens_per_step=3)
    assert three.step_seconds == pytest.approx(24.0) and three.copy_seconds == one.copy_seconds == (6.0,)
    assert three.compute_seconds == pytest.approx(3 * one.compute_seconds) and three.tokens_per_step == 3.0
    assert one.tokens_per_step == 1.0 and one == predict_step(layers3, [dev], [False] * 3, None, 0, tokens_per_step=1)
    assert predict_step(layers3, [dev], [False] * 3, None, 1, tokens_per_step=3).step_seconds == pytest.approx(20.0)
    # a mean over steps of several sizes: linear in it
    assert predict_step(layers3, [dev], [False] * 3, None, 0, tokens_per_step=2.5).step_seconds == pytest.approx(21.0)
    # per layer figures too, on two devices: each layer's own figure times the tokens
    two = [DeviceSpec(1.0, 0.0, (1.0, 2.0, 3.0)), DeviceSpec(1.0, 0.0, (1.0, 2.0, 3.0))]
    assert predict_step(layers3, two, [True] * 3, None, 0, tokens_per_step=4).step_seconds == pytest.approx(24.0)


def test_each_further_token_adds_the_devices_token_share_of_a_one_token_attention() -> None:
    """A device whose tokens share work (token_share 0.5): a step of 3 tokens computes 2 s a layer
    * (1 + 2 * 0.5) = 4 s, not 6; copies as for one token. Serially 3 layers: 6 + 12 s. Per-layer
    figures and a mean token count alike; token_share 1 (the default) is the linear model, 0 a step
    whatever its tokens."""
    layers3 = [LayerCost((10**9, 10**9), 1)] * 3
    half = DeviceSpec(1.0, 0.0, 2.0, token_share=0.5)
    pred = predict_step(layers3, [half], [False] * 3, None, 0, tokens_per_step=3)
    assert pred.step_seconds == pytest.approx(18.0) and pred.compute_seconds == pytest.approx(12.0)
    assert pred.copy_seconds == (6.0,)
    assert predict_step(layers3, [half], [False] * 3, tokens_per_step=1).compute_seconds == pytest.approx(6.0)
    assert predict_step(layers3, [half], [True] * 3, tokens_per_step=2.5).compute_seconds == pytest.approx(10.5)
    per_layer = DeviceSpec(1.0, 0.0, (1.0, 2.0, 3.0), token_share=0.25)
    assert predict_step(layers3, [per_layer], [True] * 3, tokens_per_step=5).step_seconds == pytest.approx(12.0)
    assert DeviceSpec(1.0, 0.0, 2.0).token_share == 1.0
    assert predict_step(layers3, [DeviceSpec(1.0, 0.0, 2.0, token_share=0)], [True] * 3,
                        tokens_per_step=9).step_seconds == pytest.approx(6.0)


@pytest.mark.parametrize("share, message", [
    (-0.1, "got -0.1"), (float("nan"), "got nan"), (float("inf"), "got inf"), (True, "got True"), ("1", "got '1'"),
])
def test_token_share_is_refused_naming_it(share: object, message: str) -> None:
    with pytest.raises(ferry.InvalidArgumentError, match=r"DeviceSpec: token_share is a finite number >= 0 \(of a "
                                                         r"one-token step's attention\), " + message):
        DeviceSpec(1.0, token_share=share)  # type: ignore[arg-type]


def test_measure_compute_times_several_tokens_and_the_share_is_their_growth(monkeypatch: pytest.MonkeyPatch) -> None:
    """measure_compute(n_tok=) times a step of n_tok query tokens a stream (the CPU's kernel, its
    outputs of that shape); measure_token_share is (T_n / T_1 - 1) / (n_tok - 1) of the fastest of
    each (here of stubbed times: 1 ms and 3.4 ms at 5 tokens give 0.6), at least 0."""
    shapes: List[Tuple[int, ...]] = []
    real = ferry.residency.measure.attention_step

    def step(sched: Any, backend: Any, windows: Any, q: Any, kv_len: Any, *a: Any) -> Any:
        shapes.append(tuple(q[0].ne))
        return real(sched, backend, windows, q, kv_len, *a)

    monkeypatch.setattr(ferry.residency.measure, "attention_step", step)
    got = ferry.residency.measure_compute(ferry.CPUBackend(), head_dim=8, n_head_kv=1, n_head=2, n_ctx=64,
                                          n_stream=2, n_layer=1, runs=1, n_tok=5)
    assert got > 0 and shapes == [(8, 2, 5, 2)]
    for bad in (0, 33, 1.5, True):
        with pytest.raises(ferry.InvalidArgumentError, match="measure_compute: n_tok is the query tokens per stream"):
            ferry.residency.measure_compute(ferry.CPUBackend(), n_ctx=32, n_tok=bad)  # type: ignore[arg-type]
    times = {1: [1.2e-3, 1e-3], 5: [3.4e-3, 3.5e-3]}
    monkeypatch.setattr(ferry.residency.measure, "measure_compute",
                        lambda backend, *a, n_tok=1, **kw: times[n_tok].pop(0))
    assert ferry.residency.measure_token_share(ferry.CPUBackend(), 5) == pytest.approx(0.6)
    times = {1: [1e-3, 1e-3], 5: [0.9e-3, 0.9e-3]}  # faster with more tokens: no share, not a negative one
    assert ferry.residency.measure_token_share(ferry.CPUBackend(), 5) == 0.0
    with pytest.raises(ferry.InvalidArgumentError, match="measure_token_share: n_tok"):
        ferry.residency.measure_token_share(ferry.CPUBackend(), 1)


def test_a_steps_scheduler_run_pays_its_fixed_cost_once() -> None:
    """run_seconds, the host's fixed cost of the step's one scheduler run, is added once to the step,
    whatever its layers, tokens, prefetching or devices: three layers copying 2 s and computing 2 s a
    token, 3 tokens: 24 s serially, 20 s prefetching (as above), each plus 0.5 s."""
    layers3 = [LayerCost((10**9, 10**9), 1)] * 3
    dev = DeviceSpec(1.0, 0.0, 2.0)
    for prefetch, step in ((0, 24.0), (1, 20.0)):
        pred = predict_step(layers3, [dev], [False] * 3, None, prefetch, tokens_per_step=3, run_seconds=0.5)
        assert pred.step_seconds == pytest.approx(step + 0.5) and pred.run_seconds == 0.5
        assert pred.copy_seconds == (6.0,) and pred.compute_seconds == pytest.approx(18.0)  # neither holds it
    two = [DeviceSpec(1.0, 0.0, 1.0), DeviceSpec(1.0, 0.0, 1.0)]
    assert predict_step(layers3, two, [True] * 3, run_seconds=0.25).step_seconds == pytest.approx(3.25)
    assert predict_step(layers3, [dev], [True] * 3).run_seconds == 0.0  # left out unless given


@pytest.mark.parametrize("run, message", [
    (-1e-6, "got -1e-06"), (float("nan"), "got nan"), (float("inf"), "got inf"), (True, "got True"), ("0", "got '0'"),
])
def test_run_seconds_is_refused_naming_it(run: object, message: str) -> None:
    with pytest.raises(ferry.InvalidArgumentError,
                       match=r"predict_step: run_seconds is a finite number of seconds >= 0, " + message):
        predict_step([FULL], [DeviceSpec(1.0)], [False], run_seconds=run)  # type: ignore[arg-type]


@pytest.mark.parametrize("tokens, message", [
    (0.5, "got 0.5"), (0, "got 0"), (float("nan"), "got nan"), (float("inf"), "got inf"), (True, "got True"),
    ("2", "got '2'"), (None, "got None"),
])
def test_tokens_per_step_is_refused_naming_it(tokens: object, message: str) -> None:
    with pytest.raises(ferry.InvalidArgumentError, match=r"residency: tokens_per_step is a finite number >= 1 "
                                                         r"\(query tokens per stream per step\), " + message):
        predict_step([FULL], [DeviceSpec(1.0)], [False], tokens_per_step=tokens)  # type: ignore[arg-type]


def test_expected_accepted_tokens_is_the_geometric_prefix_and_the_targets_token() -> None:
    """A draft of N tokens each accepted with probability P until the first rejection yields
    1 + P + ... + P^N tokens a step: the sum, by the closed form, is what the function gives."""
    assert expected_accepted_tokens(4, 0.7) == pytest.approx(2.77310, abs=1e-5)
    for n in range(9):
        assert expected_accepted_tokens(n, 0.0) == 1.0 and expected_accepted_tokens(n, 1.0) == n + 1
        for p in (0.1, 0.5, 0.7, 0.9, 0.99):
            assert expected_accepted_tokens(n, p) == pytest.approx(sum(p ** k for k in range(n + 1)), rel=1e-12)
    assert expected_accepted_tokens(0, 0.5) == 1.0
    import numpy as np
    assert expected_accepted_tokens(np.int64(2), np.float32(0.5)) == pytest.approx(1.75)  # numpy's numbers too


@pytest.mark.parametrize("draft, accept, message", [
    (-1, 0.5, r"draft is a count of tokens \(an integer >= 0\), got -1"),
    (2.0, 0.5, r"draft is a count of tokens \(an integer >= 0\), got 2.0"),
    (True, 0.5, r"draft is a count of tokens \(an integer >= 0\), got True"),
    (2, 1.5, r"accept is a probability \(a number from 0 to 1\), got 1.5"),
    (2, -0.1, r"accept is a probability \(a number from 0 to 1\), got -0.1"),
    (2, float("nan"), r"accept is a probability \(a number from 0 to 1\), got nan"),
    (2, "0.7", r"accept is a probability \(a number from 0 to 1\), got '0.7'"),
])
def test_expected_accepted_tokens_refuses_naming_the_argument(draft: object, accept: object, message: str) -> None:
    with pytest.raises(ferry.InvalidArgumentError, match="expected_accepted_tokens: " + message):
        expected_accepted_tokens(draft, accept)  # type: ignore[arg-type]


def test_memory_counts_windows_ahead_and_reserve() -> None:
    layers = [FULL, FULL, SLIDING, FULL]
    dev = [0, 0, 0, 0]
    spec = [DeviceSpec(1.0, reserve=MIB)]
    serial = predict_step(layers, spec, [False, False, False, True], dev, 0)
    assert serial.window_bytes == (8 * MIB,)
    assert serial.resident_bytes == (16 * MIB,)
    assert serial.memory == (25 * MIB,)
    ahead = predict_step(layers, spec, [False, False, False, True], dev, 2)
    assert ahead.window_bytes == (18 * MIB,)  # layers 0, 1 and 2 at once
    assert predict_step(layers, spec, [False] * 4, dev, 1).window_bytes == (16 * MIB,)


def test_memory_follows_the_schedulers_parts() -> None:
    """A part begins at each layer in host memory and at each device's first layer; a resident layer
    computes in the part before it. So prefetching one part ahead, the copies of the next host layer
    past a resident one are placed while that part computes: layers 0 (host), 1 (resident) and 2
    (host) hold both host layers' copies at once (16 MiB), serially one's (8 MiB). Outputs stay to
    the step's end, queries beside the scheduler's buffer."""
    layers = [FULL] * 3
    spec = [DeviceSpec(1.0)]
    gap = [False, True, False]
    assert predict_step(layers, spec, gap, None, 0).window_bytes == (8 * MIB,)
    assert predict_step(layers, spec, gap, None, 1).window_bytes == (16 * MIB,)
    assert predict_step(layers, spec, [False, False, True], None, 1).window_bytes == (16 * MIB,)
    # two devices: device 1's first layer begins a part, which device 0's last part queues ahead
    two = [DeviceSpec(1.0), DeviceSpec(1.0)]
    split = predict_step(layers + [FULL], two, [False, True, True, False], None, 1)
    assert split.window_bytes == (8 * MIB, 8 * MIB)
    out = LayerCost((4 * MIB, 4 * MIB), 16 * MIB, None, output_bytes=4096, query_bytes=1000)
    step = predict_step([out] * 3, spec, gap, None, 1)
    assert step.window_bytes == (16 * MIB + 4096,)  # layer 0 computing: both copies and its output
    assert step.input_bytes == (3000,)
    assert step.memory == (16 * MIB + 16 * MIB + 4096 + 3000,)
    assert predict_step([out] * 3, spec, [True] * 3, None, 1).window_bytes == (3 * 4096,)  # the outputs at the end


def test_a_measure_decides_what_fits() -> None:
    """With a measure, a placement fits when what it measures fits (after the model's least and the
    measure's own least), and the plan's memory is the measured one; the measure is asked once per
    placement."""
    layers = [FULL] * 4
    asked: List[Tuple[bool, ...]] = []

    def measure(resident: Tuple[bool, ...]) -> List[Tuple[int, int]]:
        asked.append(resident)
        host = sum(not r for r in resident)
        return [(host * 8 * MIB + MIB, 4096)]  # every host layer's copies at once, and a MiB of gaps

    spec = [DeviceSpec(1.0, 0.0, 1e-3, memory=16 * MIB + 3 * 8 * MIB + MIB + 4096)]
    plan = choose_auto(layers, spec, None, 0, measure=measure)
    assert plan.resident_layers() == [0] and plan.prediction.measured
    assert plan.memory == (16 * MIB + 3 * 8 * MIB + MIB + 4096,)
    assert len(asked) == len(set(asked))
    without = choose_auto(layers, spec, None, 0)  # the model's least: two layers fit (32 MiB + 8 MiB)
    assert without.resident_layers() == [0, 1] and not without.prediction.measured

    class WithLeast:
        def __init__(self) -> None:
            self.full = 0

        def __call__(self, resident: Tuple[bool, ...]) -> List[Tuple[int, int]]:
            self.full += 1
            return measure(resident)

        def least(self, resident: Tuple[bool, ...]) -> List[Tuple[int, int]]:
            return [(measure(resident)[0][0] - MIB, 0)]

    cheap = WithLeast()
    assert choose_first(layers, spec, None, 0, measure=cheap).resident_layers() == [0]
    assert cheap.full == 2  # every layer in host memory and layer 0 alone; the least refused layers 0-1
    with pytest.raises(ferry.InvalidArgumentError, match="measure gave 2 devices"):
        choose_auto(layers, spec, None, 0, measure=lambda r: [(0, 0), (0, 0)])


def test_first_round_robin_and_slowest_link_keep_the_layers_their_rules_name() -> None:
    layers = [FULL] * 8
    fast, slow = DeviceSpec(2.45, memory=39 * MIB, name="fast"), DeviceSpec(0.33, memory=39 * MIB, name="slow")
    first = choose_first(layers, [fast, slow])
    assert first.resident_layers() == [0]  # 2 x 16 MiB + 8 MiB of window copies: the second does not fit
    big = DeviceSpec(2.45, memory=60 * MIB)
    assert choose_first(layers, [big, slow]).resident_layers() == [0, 1, 2]  # then layer 3 does not fit
    assert choose_first(layers, [big, slow]).resident_layers(1) == []  # the rule leaves device 1's memory
    rr = choose_round_robin(layers, [big, big])
    assert rr.resident_layers() == [0, 1, 2, 4, 5, 6]
    sl = choose_slowest_link(layers, [big, DeviceSpec(0.33, memory=60 * MIB)])
    assert sl.resident_layers() == [0, 1, 2, 4, 5, 6]  # both budgets spent
    assert link_groups([2.45, 0.33, 2.6, 0.36]) == [[1, 3], [0, 2]]
    assert link_groups([1.0, 1.15, 1.16]) == [[0, 1], [2]]
    with pytest.raises(ferry.InvalidArgumentError, match="unknown strategy"):
        choose_residency("fastest", layers, [big])
    with pytest.raises(ferry.InvalidArgumentError, match="max_layers"):
        choose_first(layers, [big], None, 0, -1)


def test_each_rule_given_a_count_keeps_that_many_layers_where_it_says() -> None:
    """With N layers to keep (--kv-gpu-layers N): first takes the first N, round-robin one per
    device in turn, slowest-link the slowest group's first, its devices in turn."""
    layers = [FULL] * 12
    room = 200 * MIB
    devices = [DeviceSpec(2.45, memory=room), DeviceSpec(0.33, memory=room), DeviceSpec(0.36, memory=room)]
    assert choose_first(layers, devices, None, 0, 3).resident_layers() == [0, 1, 2]
    assert choose_round_robin(layers, devices, None, 0, 4).resident_layers() == [0, 1, 4, 8]
    assert choose_slowest_link(layers, devices, None, 0, 3).resident_layers() == [4, 5, 8]
    assert choose_slowest_link(layers, devices, None, 0, 9).resident_layers() == [0] + list(range(4, 12))
    auto = choose_auto(layers, devices, None, 0, 3)
    assert len(auto.resident_layers()) == 3 and set(auto.resident_layers()) <= set(range(4, 8))  # 0.33 GB/s
    assert choose_auto(layers, devices, None, 0, 0).resident_layers() == []
    for prefetch in (0, 1, 2):
        for n in (0, 1, 2, 5):
            best, fitting = _enumerate(layers[:6], devices[:2], [0, 0, 0, 1, 1, 1], prefetch, n)
            assert choose_auto(layers[:6], devices[:2], [0, 0, 0, 1, 1, 1], prefetch, n).step_seconds == \
                pytest.approx(best, rel=1e-12)


def test_prefetch_changes_the_answer() -> None:
    """Four layers to keep of 12 (6 per device), the second device's link 2.45 times slower, its
    compute slow enough (1.2 times its copy) to hide its own copies. Serially slowest-link is right:
    a slow-link layer saves the most. With prefetching a slow-link layer saves next to nothing (its
    copy is hidden; only the first is not), the fast link's copies are not hidden (compute 0.1 times
    them): the planner keeps the fast device's layers and the slow device's first and is more than
    10% faster."""
    layers = [FULL] * 12
    copy_fast, copy_slow = 8 * MIB / 2.45e9, 8 * MIB / 1.0e9
    fast = DeviceSpec(2.45, 0.0, 0.1 * copy_fast, name="fast")
    slow = DeviceSpec(1.0, 0.0, 1.2 * copy_slow, name="slow")
    serial = choose_auto(layers, [fast, slow], None, 0, 4)
    assert serial.resident_layers() == choose_slowest_link(layers, [fast, slow], None, 0, 4).resident_layers()
    for prefetch in (1, 2):
        auto = choose_auto(layers, [fast, slow], None, prefetch, 4)
        rule = choose_slowest_link(layers, [fast, slow], None, prefetch, 4)
        assert auto.exact and rule.resident_layers() == [6, 7, 8, 9]
        assert len(auto.resident_layers(0)) >= 3
        assert auto.step_seconds < 0.9 * rule.step_seconds, (auto.resident_layers(), rule.resident_layers())


def test_large_serial_plan_is_exact_by_kinds() -> None:
    """24 layers of 2 sizes on 2 devices (2^24 placements): the serial planner counts kinds; its
    time is the best over every count of each kind on each device (by brute force over the counts:
    serially, layers of one kind on one device are interchangeable)."""
    layers = [FULL if i % 2 else SLIDING for i in range(24)]
    devices = [DeviceSpec(2.45, 5.0, 1e-3, memory=100 * MIB), DeviceSpec(0.33, 5.0, 1e-3, memory=50 * MIB)]
    plan = choose_auto(layers, devices)
    assert plan.exact and _fits(plan, devices)
    problem = residency._problem(layers, devices, None, 0)
    best = math.inf
    for f0, s0, f1, s1 in itertools.product(range(7), repeat=4):
        host = [True] * 24
        for d, (f, s) in enumerate(((f0, s0), (f1, s1))):
            mine = range(12 * d, 12 * d + 12)
            for i in [i for i in mine if i % 2][:f] + [i for i in mine if not i % 2][:s]:
                host[i] = False
        if residency._fits(problem, host):
            best = min(best, residency._step_time(problem, host))
    assert plan.step_seconds == pytest.approx(best, rel=1e-12)
    assert 0 < len(plan.resident_layers(1)) < 12


def test_large_prefetched_plan_states_its_bound() -> None:
    layers = [FULL if i % 3 else SLIDING for i in range(40)]
    devices = [DeviceSpec(2.45, 5.0, 1e-3, memory=200 * MIB), DeviceSpec(0.33, 5.0, 2e-2, memory=100 * MIB)]
    plan = choose_auto(layers, devices, None, 2, search_limit=50)
    assert not plan.exact and plan.bound == 3.0 and _fits(plan, devices)
    for strategy in ("first", "round-robin", "slowest-link"):
        assert plan.step_seconds <= choose_residency(strategy, layers, devices, None, 2).step_seconds
    full = choose_auto(layers, devices, None, 2)
    assert full.step_seconds <= plan.step_seconds


def test_refusals_name_what_does_not_fit() -> None:
    layers = [FULL] * 4
    tight = DeviceSpec(1.0, memory=6 * MIB, reserve=MIB, name="gpu1")
    roomy = DeviceSpec(1.0, memory=None, name="gpu0")
    for rule in (choose_auto, choose_first, choose_round_robin, choose_slowest_link):
        with pytest.raises(PlanDoesNotFitError, match=r"gpu1 needs 9437184 bytes for its split's window copies .* "
                                                      r"short by 3145728 bytes"):
            rule(layers, [roomy, tight])
    with pytest.raises(PlanDoesNotFitError, match="window copies"):
        choose_auto(layers, [DeviceSpec(1.0, memory=17 * MIB, name="a")] * 2, None, 1)  # 2 windows ahead: 16 MiB
    below_one = DeviceSpec(1.0, memory=20 * MIB, name="small")
    with pytest.raises(PlanDoesNotFitError, match=r"no layer fits: small .* 4194304 bytes over its 20971520"):
        choose_auto(layers, [below_one, below_one])
    assert isinstance(PlanDoesNotFitError("x"), ferry.InvalidArgumentError)
    with pytest.raises(ferry.InvalidArgumentError, match="layer_device"):
        choose_auto(layers, [roomy], [0, 0])
    with pytest.raises(ferry.InvalidArgumentError, match="device 2"):
        choose_auto(layers, [roomy], [0, 0, 0, 2])
    with pytest.raises(ferry.InvalidArgumentError, match="link_gbps"):
        choose_auto(layers, [DeviceSpec(0.0)])
    with pytest.raises(ferry.InvalidArgumentError, match="prefetch"):
        choose_auto(layers, [roomy], None, -1)
    with pytest.raises(ferry.InvalidArgumentError, match="no layers"):
        choose_auto([], [roomy])


@pytest.mark.parametrize("make,message", [
    (lambda: DeviceSpec(link_gbps="fast"), r"DeviceSpec: link_gbps is a positive finite number of GB/s, got 'fast'"),
    (lambda: DeviceSpec(0.0), r"DeviceSpec: link_gbps is a positive finite number of GB/s, got 0.0"),
    (lambda: DeviceSpec(float("nan")), r"DeviceSpec: link_gbps is a positive finite number of GB/s, got nan"),
    (lambda: DeviceSpec(True), r"DeviceSpec: link_gbps is a positive finite number of GB/s, got True"),
    (lambda: DeviceSpec(1.0, latency_us=-1), r"DeviceSpec: latency_us is a finite number of microseconds >= 0"),
    (lambda: DeviceSpec(1.0, compute_s="1"), r"DeviceSpec: compute_s is a finite number of seconds >= 0, or a "
                                             r"sequence of them \(one per layer\), got '1'"),
    (lambda: DeviceSpec(1.0, compute_s=(1e-3, None)), r"DeviceSpec: compute_s\[1\] is a finite number of seconds"),
    (lambda: DeviceSpec(1.0, compute_s=()), r"DeviceSpec: compute_s is a number of seconds, or one per layer"),
    (lambda: DeviceSpec(1.0, memory=-1), r"DeviceSpec: memory is None or a count of bytes \(an integer >= 0\), got -1"),
    (lambda: DeviceSpec(1.0, memory=1.5e9), r"DeviceSpec: memory is None or a count of bytes"),
    (lambda: DeviceSpec(1.0, reserve=None), r"DeviceSpec: reserve is a count of bytes \(an integer >= 0\), got None"),
    (lambda: DeviceSpec(1.0, name=0), r"DeviceSpec: name is a str, got int 0"),
    (lambda: LayerCost(4096, 8192), r"LayerCost: transfers is a non-empty sequence of byte counts"),
    (lambda: LayerCost((), 8192), r"LayerCost: transfers is a non-empty sequence of byte counts"),
    (lambda: LayerCost((4096, -1), 8192), r"LayerCost: transfers\[1\] is a count of bytes \(an integer >= 0\), got -1"),
    (lambda: LayerCost((4096,), "8192"), r"LayerCost: resident_bytes is a count of bytes"),
    (lambda: LayerCost((4096,), 8192, 1.5), r"LayerCost: staging_bytes is None or a count of bytes"),
])
def test_fields_are_checked_where_they_are_given(make: object, message: str) -> None:
    """A DeviceSpec or LayerCost of a field the model cannot take is refused when it is made, naming
    the field and what it takes: not by a TypeError from inside predict_step."""
    with pytest.raises(ferry.InvalidArgumentError, match=message):
        make()  # type: ignore[operator]


def test_fields_keep_the_kinds_the_model_reads() -> None:
    import numpy as np

    spec = DeviceSpec(np.float32(2.5), 3, [1, np.float64(2.0)], np.int64(1 << 30), 0, "gpu")
    assert spec == DeviceSpec(2.5, 3.0, (1.0, 2.0), 1 << 30, 0, "gpu") and hash(spec) == hash(DeviceSpec(
        2.5, 3.0, (1.0, 2.0), 1 << 30, 0, "gpu"))
    assert type(spec.link_gbps) is float and type(spec.memory) is int and isinstance(spec.compute_s, tuple)
    assert LayerCost([np.int64(4096), 0], 8192).transfers == (4096, 0)


def test_sequences_are_refused_naming_the_argument() -> None:
    with pytest.raises(ferry.InvalidArgumentError, match="residency: resident is a sequence of bool"):
        predict_step([FULL], [DeviceSpec(1.0)], None)  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgumentError, match="residency: layers is a sequence of LayerCost"):
        choose_auto(None, [DeviceSpec(1.0)])  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgumentError, match="residency: devices is a sequence of DeviceSpec"):
        choose_first([FULL], DeviceSpec(1.0))  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgumentError, match="residency: layer_device is a sequence"):
        predict_step([FULL], [DeviceSpec(1.0)], [True], layer_device=0)  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgumentError, match="unknown strategy"):
        choose_residency([], [FULL], [DeviceSpec(1.0)])  # type: ignore[arg-type]


def test_a_plans_tokens_per_second_placement_and_dict_agree_with_it() -> None:
    layers = [FULL] * 4
    devices = [DeviceSpec(1.0, 0.0, 1e-3, memory=64 * MIB), DeviceSpec(0.5, 0.0, 1e-3, memory=64 * MIB)]
    plan = choose_auto(layers, devices)
    assert plan.tokens_per_second(4) == pytest.approx(4 / plan.step_seconds)
    assert plan.placement(["a", "b"]) == [("a" if plan.resident[i] else None) if i < 2 else
                                          ("b" if plan.resident[i] else None) for i in range(4)]
    assert plan.budgets == (64 * MIB, 64 * MIB)
    data = plan.as_dict(4)
    assert data["tokens_per_second"] == plan.tokens_per_second(4) and data["exact"] is True
    assert [d["resident_layers"] for d in data["devices"]] == [plan.resident_layers(0), plan.resident_layers(1)]
    assert [d["memory"] for d in data["devices"]] == list(plan.memory)
    assert choose_first(layers, devices).as_dict()["bound"] is None
    with pytest.raises(ferry.InvalidArgumentError):
        plan.tokens_per_second(0)


def test_layers_from_geometry_gives_a_sliding_layer_its_own_sizes() -> None:
    """A sliding layer's window and cache are its own size; the bytes are the dry-run cache's."""
    layers = ferry.residency.layers_from_geometry("f16", "f16", 128, 8, 8192, 2, 2048, [None, 1024])
    row = 2 * 128 * 8
    assert layers[0].transfers == (2 * 2048 * row, 2 * 2048 * row)
    assert layers[0].resident_bytes == 2 * 8192 * row
    assert layers[1].transfers == (2 * 1025 * row, 2 * 1025 * row)
    assert layers[1].resident_bytes == 2 * 2 * 1025 * row
    flat = ferry.residency.layers_from_geometry("q8_0", "q8_0", 128, 8, 8192, 2, 2048, [None], compact=False)
    assert flat[0].staging > flat[0].window_bytes  # the spans, gaps included


def test_layers_from_geometry_gives_a_step_of_several_tokens_their_query_and_output() -> None:
    """A step of n_new tokens per stream: its query and attention output are n_new tokens' (f32
    [head_dim, n_head, n_new, n_stream]); its windows are as for one token."""
    one = ferry.residency.layers_from_geometry("f16", "f16", 128, 8, 8192, 2, 2048, [None, 1024], n_head=32)
    five = ferry.residency.layers_from_geometry("f16", "f16", 128, 8, 8192, 2, 2048, [None, 1024], n_new=5,
                                                n_head=32)
    assert one[0].query_bytes == one[0].output_bytes == 4 * 128 * 32 * 2
    assert five[0].query_bytes == five[0].output_bytes == 5 * one[0].query_bytes
    assert five[0].transfers == one[0].transfers


def test_a_slowed_standin_computes_at_least_that_many_times_slower() -> None:
    """Compute on a stand-in with slowdown F takes at least F times the host's own time for it: the
    wall time of a measured step against the host time the stand-in counted (link_stats), a bound
    that holds on a busy host. Unslowed, the count is the compute itself."""
    import time

    host = ferry.StandinBackend()
    slowed = ferry.StandinBackend(compute_slowdown=3)
    assert slowed.compute_slowdown == 3.0 and host.compute_slowdown == 1.0
    for dev, factor in ((host, 1.0), (slowed, 3.0)):
        dev.reset_link_stats()
        t0 = time.perf_counter()
        ferry.residency.measure_compute(dev, n_ctx=2048, n_layer=2, runs=1)
        wall = time.perf_counter() - t0
        st = dev.link_stats
        assert st.computes >= 1 and st.compute_host_seconds > 0, st
        assert wall >= factor * st.compute_host_seconds, (factor, wall, st)
    for bad in (0.5, -1.0, float("nan"), float("inf")):
        with pytest.raises(ferry.InvalidArgumentError, match="compute_slowdown"):
            ferry.StandinBackend(compute_slowdown=bad)
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.StandinBackend(compute_slowdown="fast")  # type: ignore[arg-type]


def test_device_from_backend_takes_the_standins_memory_latency_and_measured_link() -> None:
    dev = ferry.StandinBackend(link_gbps=1.0, latency_us=20, memory=64 * MIB)
    spec = ferry.residency.device_from_backend(dev, compute_s=1e-3, reserve=MIB)
    assert spec.memory == 64 * MIB and spec.latency_us == 20 and spec.reserve == MIB
    assert 0 < spec.link_gbps <= 1.0  # measured: never above the link's rate, and as far below as the host is busy


def test_a_links_piece_curve_prices_its_windows_by_their_pieces() -> None:
    """A device whose link has a piece curve (the h100-pcie5 profile's) is charged each window copy as C's
    curve prices its size: latency + CopyCostModel.piece_seconds(bytes), small pieces near the curve's floor,
    large ones at the peak, and the plan's predicted copy time changes by that and nothing else."""
    named = ferry.StandinBackend(link_profile="h100-pcie5")
    gbps, latency, curve = named.link_gbps, named.latency_us, named.piece_curve
    named.close()
    assert gbps is not None and curve is not None
    costs = CopyCostModel(0.0, 0.0, gbps, 0, 0, 1.0, 0, 0.0, piece_floor_gbps=curve[0],
                                piece_knee_bytes=curve[1], piece_steepness=curve[2])
    small, large = (8 << 10,) * 16, (64 * MIB,) * 2  # a paged window's blocks; two long streams
    for transfers in (small, large):
        layers = [LayerCost(transfers, MIB)] * 3
        plain = predict_step(layers, [DeviceSpec(gbps, latency)], [False] * 3)
        priced = predict_step(layers, [DeviceSpec(gbps, latency, piece_curve=curve)], [False] * 3)
        want = 3 * sum(latency * 1e-6 + costs.piece_seconds(b) for b in transfers)
        assert priced.copy_seconds[0] == pytest.approx(want, rel=1e-12)
        assert plain.copy_seconds[0] == pytest.approx(3 * sum(latency * 1e-6 + b / (gbps * 1e9) for b in transfers),
                                                      rel=1e-12)
        assert priced.step_seconds - plain.step_seconds == pytest.approx(priced.copy_seconds[0] - plain.copy_seconds[0])
    bytes_s = 16 * (8 << 10) / (gbps * 1e9)  # the small pieces' bytes at the peak: the curve charges them more
    small_layers = [LayerCost(small, MIB)] * 3
    slow = predict_step(small_layers, [DeviceSpec(gbps, latency, piece_curve=curve)], [False] * 3).copy_seconds[0]
    assert slow - 3 * 16 * latency * 1e-6 > 2 * 3 * bytes_s  # 8 KiB pieces below half the peak (design.md)


@pytest.mark.parametrize("curve", [(1.0, 2.0), (0.0, 4096.0, 2.0), (1.0, -1.0, 2.0), "abc", (1.0, math.inf, 2.0)])
def test_a_piece_curve_out_of_range_is_refused(curve: object) -> None:
    """DeviceSpec's piece_curve: three positive finite numbers, else InvalidArgumentError naming it."""
    with pytest.raises(ferry.InvalidArgumentError, match="piece_curve"):
        DeviceSpec(8.0, piece_curve=curve)  # type: ignore[arg-type]
