"""How `ferry bench` turns repetitions into figures: floors on steps with known answers, floors
against a host that adds time, the gain's interval over replicas and what varies between runs,
the order of turns, and the warning of a link the host does not keep to."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import List

import numpy as np
import pytest

from ferry.workloads import bench as bench_workload
from ferry.workloads import estimate
from ferry.workloads.bench_config import LINK_OVERRUN, BenchConfig
from ferry.workloads.devices import DeviceConfig


def test_step_floor_sums_each_steps_fastest_time() -> None:
    f = estimate.StepFloor(3)
    assert f.total == float("inf")  # no step timed yet
    for step, t in ((0, 5.0), (1, 2.0), (2, 4.0), (0, 3.0), (1, 6.0), (2, 1.0)):
        f.add(step, t)
    assert f.fastest == [3.0, 2.0, 1.0] and f.total == 6.0


def test_the_gain_is_the_median_of_the_replicas_ratios_and_its_interval_their_range() -> None:
    flat = [100.0] * 6
    other = [110.0, 110.0, 111.0, 109.0, 109.5, 110.5]
    g = estimate.gain_interval(other, flat, between_runs=0.0)
    assert g.estimate == pytest.approx(0.10) and g.low == pytest.approx(0.09) and g.high == pytest.approx(0.11)
    assert g.n == 6 and not g.within_noise and g.half_width == pytest.approx(0.01)
    same = estimate.gain_interval([100.0, 101.0, 99.0, 100.0, 101.5, 99.5], [100.0] * 6, between_runs=0.0)
    assert same.within_noise  # -1%..+1.5% holds 0
    five = estimate.gain_interval(other[:5], flat)  # extra replicas of the longer are left out
    assert five.n == 5
    one = estimate.gain_interval([120.0], [100.0])  # one replica: an estimate, no interval
    assert one.estimate == pytest.approx(0.2) and one.low is None and one.within_noise
    assert one.half_width == math.inf and not one.contains(0.2)


def test_the_interval_adds_what_varies_between_runs() -> None:
    """Each end moves out from the estimate to sqrt(d^2 + (1.96 * BETWEEN_RUNS * (1 + gain))^2): replicas
    that agree exactly still get an interval as wide as runs differ; a wide end grows little."""
    agree = estimate.gain_interval([168.0] * 6, [100.0] * 6)
    runs = estimate.Z95 * estimate.BETWEEN_RUNS * 1.68
    assert estimate.BETWEEN_RUNS > 0
    assert (agree.estimate, agree.low, agree.high) == pytest.approx((0.68, 0.68 - runs, 0.68 + runs))
    wide = estimate.gain_interval([158.0, 167.0, 168.0, 168.0, 168.0, 169.0], [100.0] * 6)
    assert wide.low == pytest.approx(0.68 - math.hypot(0.10, runs))
    assert wide.high == pytest.approx(0.68 + math.hypot(0.01, runs))
    assert estimate.gain_interval([100.2] * 6, [100.0] * 6).within_noise  # +0.2%: within what runs differ by
    assert not estimate.gain_interval([100.2] * 6, [100.0] * 6, between_runs=0.0).within_noise


def _loaded_run(rng: np.random.Generator, work: List[float], load: float, reps: int) -> List[List[float]]:
    """reps repetitions of steps costing work (seconds each), the host adding to a share `load` of them
    a burst of its own, 0.2 to 1 ms whatever the step, and timer jitter to every one."""
    out = []
    for _ in range(reps):
        out.append([w * (1 + rng.uniform(0, 0.002)) + (rng.uniform(0.2e-3, 1e-3) if rng.random() < load else 0.0)
                    for w in work])
    return out


def test_floors_do_not_follow_the_hosts_load() -> None:
    """Two variants (one 40% slower at every step) on a host that adds time to 10% of the steps, then
    to 60%: the gain of the floors moves by under half a point; the gain of the mean rates, which
    a loaded host pulls toward 0, by more than 5 points (fixed seed)."""
    rng = np.random.default_rng(24)
    fast, slow = [1.0e-3, 1.1e-3, 1.2e-3], [1.4e-3, 1.54e-3, 1.68e-3]
    gains, means = [], []
    for load in (0.1, 0.6):
        runs = {}
        for name, work in (("fast", fast), ("slow", slow)):
            floor = estimate.StepFloor(len(work))
            reps = _loaded_run(rng, work, load, 200)
            for rep in reps:
                for step, t in enumerate(rep):
                    floor.add(step, t)
            runs[name] = (floor.total, float(np.mean([sum(r) for r in reps])))
        gains.append(runs["slow"][0] / runs["fast"][0] - 1)
        means.append(runs["slow"][1] / runs["fast"][1] - 1)
    assert gains[0] == pytest.approx(0.4, abs=0.005) and abs(gains[0] - gains[1]) < 0.005
    assert abs(means[0] - means[1]) > 0.05


@pytest.mark.parametrize("n", range(1, 25))
def test_balanced_orders_spread_what_runs_before_each_variant(n: int) -> None:
    """A Williams design: each round a permutation; each variant equally often in each place and
    after each other variant; never twice in a row, across rounds and their cycle too."""
    orders = estimate.balanced_orders(n)
    assert all(sorted(r) == list(range(n)) for r in orders)
    seq = [i for r in orders for i in r]
    if n >= 2:
        assert all(a != b for a, b in zip(seq, seq[1:] + seq[:1]))
    if n >= 3:
        places = Counter((p, i) for r in orders for p, i in enumerate(r))
        assert len(places) == n * n and len(set(places.values())) == 1
        after = Counter((a, b) for r in orders for a, b in zip(r, r[1:]))
        assert len(after) == n * (n - 1) and len(set(after.values())) == 1


def test_a_warning_when_the_standin_cannot_keep_to_its_link() -> None:
    """A link no host reaches (1e6 GB/s): every timed copy ends past its modelled end, and the run says
    so; a result within LINK_OVERRUN does not."""
    cfg = BenchConfig.of(n_ctx=256, npl=(2,), npp=16, ntg=2, n_layer=1, n_head=4, head_dim=32,
                      policies=("flat", "ranges"), unified=False, device="cpu", repeat=2,
                      devices=DeviceConfig(link_gbps=(1e6,)))
    res = bench_workload.run_bench(cfg)
    assert res.link_overrun > 1.0 and res.standin_link_gbps == 1e6
    (w,) = res.warnings()
    assert w.startswith(f"the stand-in's copies ran {res.link_overrun:.0%} past the modelled link's time")
    kept = dataclasses.replace(res, link_overrun=LINK_OVERRUN)
    assert kept.warnings() == []
