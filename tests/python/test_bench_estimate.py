"""How `ferry bench` turns repetitions into figures: floors and the median's interval on samples
with known answers, floors against a host that adds time, the calibration with a fake clock, the
gains it claims, and its warnings."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import Counter
from typing import List

import numpy as np
import pytest

from ferry.workloads import bench as bench_workload
from ferry.workloads import estimate
from ferry.workloads.bench import BenchConfig, BenchResult, BenchRow, Sampling, claim_pairs
from ferry.workloads.devices import DeviceConfig


def test_interval_ranks_match_the_binomial_table() -> None:
    """The ranks of a median's 95% interval, as the tables of the sign test give them."""
    assert [estimate.interval_rank(n) for n in range(1, 21)] == [
        None, None, None, None, None, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 5, 5, 5, 6]
    assert estimate.fewest_samples() == 6
    assert estimate.interval_rank(100) == 40  # [x(40), x(61)]: 1 - 2 P(B <= 39) = 0.9648


def test_median_interval_of_known_samples() -> None:
    iv = estimate.median_interval([9.0, 1.0, 5.0, 3.0, 7.0, 2.0, 10.0, 4.0, 8.0, 6.0])
    assert (iv.estimate, iv.low, iv.high, iv.n) == (5.5, 2.0, 9.0, 10)
    assert iv.half_width == 3.5 and iv.contains(2.0) and not iv.contains(9.5) and not iv.within_noise
    few = estimate.median_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (few.estimate, few.low, few.high) == (3.0, None, None) and few.half_width == float("inf")
    assert few.within_noise  # no interval: nothing is claimed
    with pytest.raises(ValueError):
        estimate.median_interval([])


def test_median_interval_covers_95_percent() -> None:
    """On skewed samples with a known median (exponential: ln 2), 2,000 draws of 25 (fixed seed): the
    interval holds it in at least 95% of them, and not in all (it is not needlessly wide)."""
    rng = np.random.default_rng(12345)
    hits = sum(estimate.median_interval(list(rng.exponential(1.0, 25))).contains(np.log(2.0)) for _ in range(2000))
    assert 0.95 * 2000 <= hits <= 0.985 * 2000


def test_step_floor_sums_each_steps_fastest_time() -> None:
    f = estimate.StepFloor(3)
    assert f.total == float("inf")  # no step timed yet
    for step, t in ((0, 5.0), (1, 2.0), (2, 4.0), (0, 3.0), (1, 6.0), (2, 1.0)):
        f.add(step, t)
    assert f.fastest == [3.0, 2.0, 1.0] and f.total == 6.0


def test_replica_gain() -> None:
    """The median over replicas of the ratios minus 1; with 6 replicas the interval is their range."""
    flat = [100.0] * 6
    other = [110.0, 110.0, 111.0, 109.0, 109.5, 110.5]
    g = estimate.replica_gain(other, flat, between_runs=0.0)
    assert g.estimate == pytest.approx(0.10) and g.low == pytest.approx(0.09) and g.high == pytest.approx(0.11)
    assert g.n == 6 and not g.within_noise
    same = estimate.replica_gain([100.0, 101.0, 99.0, 100.0, 101.5, 99.5], [100.0] * 6, between_runs=0.0)
    assert same.within_noise  # -2%..+2% holds 0
    five = estimate.replica_gain(other[:5], flat)  # extra replicas of the longer are left out
    assert five.n == 5 and five.low is None and five.within_noise


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


def test_replicas_that_missed_the_floor_widen_the_interval() -> None:
    """A replica more than 3% slower than the variant's fastest did not reach its floor: it is left out of
    the estimate and kept in the interval (the range of all 8), which reaches out to it."""
    assert estimate.reached([100.0, 97.5, 96.0, 99.0]) == [True, True, False, True]
    assert estimate.reached([]) == []
    flat = [100.0, 100.5, 99.5, 100.0, 80.0, 100.0, 100.0, 100.0]  # replica 4: the host never left flat alone
    ranges = [150.0, 150.0, 150.0, 110.0, 150.0, 150.0, 150.0, 150.0]  # replica 3: nor ranges
    g = estimate.replica_gain(ranges, flat, between_runs=0.0)
    assert g.n == 8 and g.estimate == pytest.approx(0.5)
    assert g.low == pytest.approx(0.1) and g.high == pytest.approx(0.875)


def test_with_no_replica_quiet_for_both_the_gain_is_the_ratio_of_the_variants_figures() -> None:
    """Each replica reached one variant's floor and missed the other's: the paired ratios (+10% and
    +87.5%) would put the gain between them, where the load put it; the variants' own figures (each
    the median of the replicas that reached it) give +50%. The interval still spans every replica."""
    flat = [100.0, 80.0, 100.0, 80.0, 100.0, 80.0]
    ranges = [110.0, 150.0, 110.0, 150.0, 110.0, 150.0]
    g = estimate.replica_gain(ranges, flat, between_runs=0.0)
    assert g.estimate == pytest.approx(0.5)
    assert g.low == pytest.approx(0.1) and g.high == pytest.approx(0.875)


def test_the_interval_adds_what_varies_between_runs() -> None:
    """Each end moves out from the estimate to sqrt(d^2 + (1.96 * BETWEEN_RUNS * (1 + gain))^2): replicas
    that agree exactly still get an interval as wide as runs differ; a wide end grows little."""
    agree = estimate.replica_gain([168.0] * 8, [100.0] * 8)
    runs = estimate.Z95 * estimate.BETWEEN_RUNS * 1.68
    assert estimate.BETWEEN_RUNS > 0 and runs == pytest.approx(0.0132, abs=1e-4)
    assert (agree.estimate, agree.low, agree.high) == pytest.approx((0.68, 0.68 - runs, 0.68 + runs))
    wide = estimate.replica_gain([158.0, 167.0, 168.0, 168.0, 168.0, 169.0], [100.0] * 6)
    assert wide.low == pytest.approx(0.68 - math.hypot(0.10, runs)) and wide.high == pytest.approx(0.68 + math.hypot(0.01, runs))
    assert estimate.replica_gain([100.5] * 6, [100.0] * 6).within_noise  # +0.5%: within what runs differ by
    assert not estimate.replica_gain([100.5] * 6, [100.0] * 6, between_runs=0.0).within_noise


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


def test_calibration_doubles_until_a_sample_lasts_the_minimum() -> None:
    """A fake clock: each repetition takes 3 ms, so 20 ms needs 8 (24 ms); the loops tried double."""
    tried: List[int] = []

    def measure(loops: int) -> float:
        tried.append(loops)
        return 0.003 * loops

    assert estimate.calibrate(measure, 0.020) == 8 and tried == [1, 2, 4, 8]
    tried.clear()
    assert estimate.calibrate(measure, 0.0) == 1 and tried == []  # 0: one repetition, nothing run
    assert estimate.calibrate(measure, 0.001) == 1 and tried == [1]
    assert estimate.calibrate(lambda loops: 0.0, 1.0, max_loops=16) == 16  # a clock that never moves


def test_samples_hold_the_calibrated_repetitions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run times, in each of --repeat replicas, samples_per_replica samples of the calibrated
    repetitions: each of ntg steps times the loops."""
    monkeypatch.setattr(bench_workload, "calibrate", lambda measure, seconds: 3)
    labels: List[str] = []
    cfg = BenchConfig(n_ctx=256, npl=(2,), npp=16, ntg=2, n_layer=1, n_head=4, head_dim=32, policies=("flat",),
                      unified=False, device="cpu", in_process=True, repeat=4)
    res = bench_workload.run_bench(cfg, on_step=labels.append)
    per_replica = bench_workload.samples_per_replica(3)
    assert len(labels) == cfg.ntg * 4 * (1 + 3 * per_replica)  # per replica a warm-up's repetition, then samples
    r = res.rows[0]
    assert r.steps_per_sample == 6 and r.repeats == 4 * per_replica and res.sampling[2].loops == 3
    assert r.replicas == res.sampling[2].replicas == 4 and len(r.replicas_tokens_per_s) == 4
    assert r.tokens_per_s == pytest.approx(2 * cfg.ntg / r.decode_s)
    assert r.as_dict()["steps_per_sample"] == 6 and r.as_dict()["replicas"] == 4


def test_a_tiny_minimum_takes_one_repetition() -> None:
    cfg = BenchConfig(n_ctx=256, npl=(2,), npp=16, ntg=2, n_layer=1, n_head=4, head_dim=32, policies=("flat",),
                      unified=False, device="cpu", in_process=True, repeat=2, min_sample_ms=1e-6)
    res = bench_workload.run_bench(cfg)
    assert res.rows[0].steps_per_sample == 2 and res.sampling[2].loops == 1
    assert res.rows[0].repeats == 2 * bench_workload.samples_per_replica(1) == 20  # 24 repetitions aimed at, 10 at most
    quick = bench_workload.run_bench(dataclasses.replace(cfg, min_sample_ms=0.0))  # 0: the quickest run
    assert quick.rows[0].repeats == 2 * bench_workload.MIN_SAMPLES_PER_REPLICA == 4


def row(npl: int, policy: str, unified: bool, tps: List[float]) -> BenchRow:
    """A row whose replicas' floors ran at tps (and each replica's samples too)."""
    return BenchRow(npl, policy, unified, statistics.median(tps), 1.0, 0.1, 0.5, 100, 50, "x",
                    runs_tokens_per_s=tuple(tps), steps_per_sample=8, ntg=8, replicas_tokens_per_s=tuple(tps))


def synthetic(flat: List[float], ranges: List[float], capped: bool, unified: bool = True) -> BenchResult:
    cfg = BenchConfig(npl=(2,), policies=("flat", "ranges"), unified=unified, max_time=1.0)
    rows = [row(2, "flat", False, flat), row(2, "ranges", False, ranges)]
    if unified:
        rows += [row(2, "flat", True, flat), row(2, "ranges", True, flat)]
    return BenchResult(cfg, "CPU", "pageable host memory", rows,
                       sampling={2: Sampling(2, 1, len(flat), 1.0, capped, len(flat))})


def test_claims_leave_out_the_unified_gain_over_flat() -> None:
    keys = [("flat", False, 0, False), ("ranges", False, 0, False), ("flat", False, 0, True),
            ("ranges", False, 0, True)]
    assert claim_pairs(keys) == [(0, 2, "unified"), (1, 0, "flat"), (1, 3, "unified")]


def test_warnings_name_the_cap() -> None:
    narrow = synthetic([100.0] * 6, [120.0] * 6, capped=False)
    assert narrow.warnings() == []
    d = narrow.as_dicts()[1]
    runs = estimate.Z95 * estimate.BETWEEN_RUNS * 1.2  # replicas that agree: what runs differ by alone
    assert (d["gain"], d["gain_low"], d["gain_high"]) == pytest.approx((0.2, 0.2 - runs, 0.2 + runs))
    assert d["gain_within_noise"] is False and d["gain_claimed"] is True
    assert d["warnings"] == [] and d["over_unified"] == pytest.approx(0.2)
    wide = synthetic([100.0] * 6, [200.0, 206.0] * 3, capped=True)
    (cap,) = wide.warnings()
    assert cap.startswith("npl 2: the time cap (--max-time 1 s) came first: 2 of 3 gains wider "
                          "than ±2.5 points, the widest ranges over flat")
    assert wide.as_dicts()[0]["warnings"] == [cap]
    few = synthetic([100.0] * 5, [120.0] * 5, capped=True)  # fewer than 6 replicas: no interval
    assert "no interval (fewer than 6 replicas)" in few.warnings()[0]


def test_a_warning_when_a_replica_never_reached_the_floor() -> None:
    """flat's floor 4% slower in one of 7 replicas than in its fastest: a warning says so; 1.5% is not
    warned of (nor is its interval wider than the goal)."""
    moved = synthetic([100.0] * 6 + [96.0], [120.0] * 6 + [115.2], capped=False, unified=False)
    (w,) = moved.warnings()
    assert w == ("npl 2: replicas where the host left some step no quiet moment (a floor over 3% slower than the "
                 "variant's fastest replica): up to 1 of 7, for flat; they widen the intervals, a quieter machine "
                 "has fewer")
    assert moved.row(2, "flat").missed == 1 and moved.gain_interval(moved.row(2, "ranges")).n == 7
    assert synthetic([100.0] * 6 + [98.5], [120.0] * 7, capped=False, unified=False).warnings() == []


def test_a_warning_when_the_standin_cannot_keep_to_its_link() -> None:
    """A link no host reaches (1e6 GB/s): every timed copy ends past its modelled end, and the run says
    so, in every npl's warnings; a result within LINK_OVERRUN does not."""
    cfg = BenchConfig(n_ctx=256, npl=(2,), npp=16, ntg=2, n_layer=1, n_head=4, head_dim=32,
                      policies=("flat", "ranges"), unified=False, device="cpu", in_process=True, repeat=2,
                      min_sample_ms=0.0, devices=DeviceConfig(link_gbps=(1e6,)))
    res = bench_workload.run_bench(cfg)
    assert res.link_overrun > 1.0 and res.standin_link_gbps == 1e6
    (w,) = [w for w in res.warnings() if "past the modelled link" in w]
    assert w.startswith(f"the stand-in's copies ran {res.link_overrun:.0%} past the modelled link's time")
    assert w in res.warnings(2) and all(w in d["warnings"] for d in res.as_dicts())
    kept = dataclasses.replace(res, link_overrun=bench_workload.LINK_OVERRUN)
    assert not any("past the modelled link" in x for x in kept.warnings())


def test_a_tiny_cap_stops_the_replicas_and_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a goal no interval can reach, the replicas stop at the cap, which the result says."""
    monkeypatch.setattr(bench_workload, "TARGET_HALF_WIDTH", -1.0)
    cfg = BenchConfig(n_ctx=256, npl=(2,), npp=16, ntg=2, n_layer=1, n_head=4, head_dim=32,
                      policies=("flat", "ranges"), unified=False, device="cpu", min_sample_ms=0.0, max_time=0.0,
                      in_process=True)
    res = bench_workload.run_bench(cfg)
    assert res.sampling[2].capped and res.sampling[2].replicas == res.rows[0].replicas == bench_workload.REPLICAS
    assert res.rows[0].repeats == bench_workload.REPLICAS * bench_workload.MIN_SAMPLES_PER_REPLICA
    assert any(w.startswith("npl 2: the time cap (--max-time 0 s) came first") for w in res.warnings())
    assert all(d["capped"] is True and d["warnings"] for d in res.as_dicts())


def test_a_replica_aims_at_24_repetitions_in_2_to_10_samples() -> None:
    per = bench_workload.samples_per_replica
    assert [per(n) for n in (1, 3, 4, 8, 16, 64)] == [10, 8, 6, 3, 2, 2]
