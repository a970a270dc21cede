"""How `ferry bench` turns samples into figures: the median's interval on samples with known
answers, the calibration with a fake clock, the gains it claims, and its warnings."""

from __future__ import annotations

import dataclasses
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


def test_paired_gain() -> None:
    """The median of the per-turn ratios minus 1: a turn where both are slow cancels out."""
    flat = [100.0, 50.0, 100.0, 100.0, 100.0, 100.0, 100.0]
    other = [110.0, 55.0, 112.0, 108.0, 110.0, 111.0, 109.0]
    g = estimate.paired_gain(other, flat)
    assert g.estimate == pytest.approx(0.10) and g.low == pytest.approx(0.08) and g.high == pytest.approx(0.12)
    assert g.n == 7 and not g.within_noise
    same = estimate.paired_gain([100.0, 101.0, 99.0, 100.0, 102.0, 98.0], [100.0] * 6)
    assert same.within_noise  # -2%..+2% holds 0


def test_batch_interval_of_known_samples() -> None:
    """A step half-way through: the five batches' medians are 0.10, 0.10, 0.15, 0.20, 0.20 (standard
    deviation 0.05), so the half-width is t(97.5%, 4) 0.05 / sqrt(5)."""
    iv = estimate.batch_interval([0.10] * 5 + [0.20] * 5)
    half = 2.7764451 * 0.05 / 5**0.5
    assert iv.estimate == pytest.approx(0.15) and iv.n == 10
    assert iv.low == pytest.approx(0.15 - half) and iv.high == pytest.approx(0.15 + half)
    assert estimate.batch_interval([1.0, 2.0, 3.0, 4.0]).low is None  # fewer values than batches
    with pytest.raises(ValueError):
        estimate.batch_interval([])


def test_paired_gain_covers_drifting_samples() -> None:
    """Ratios that drift (an AR(1) series, each turn 0.5 of the last plus fresh noise, median 0) break
    the sign test's independence: over 2,000 series of 40 (fixed seed) its interval alone holds the
    median in under 88% of them; the gain's interval, widened by the batch means, in at least 93%."""
    rng = np.random.default_rng(2026)
    alone = widened = 0
    for _ in range(2000):
        x = np.empty(40)
        x[0] = rng.normal() / np.sqrt(0.75)
        for i in range(1, 40):
            x[i] = 0.5 * x[i - 1] + rng.normal()
        alone += estimate.median_interval(list(x)).contains(0.0)
        widened += estimate.paired_gain(list(1.0 + x), [1.0] * 40).contains(0.0)
    assert alone < 0.88 * 2000 <= 0.93 * 2000 <= widened


def test_outlier_share() -> None:
    assert estimate.outlier_share([1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 1.02, 0.98, 5.0]) == 0.1
    assert estimate.outlier_share([2.0] * 8) == 0.0 and estimate.outlier_share([]) == 0.0


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
    """The run times samples of the calibrated repetitions: each of ntg steps times the loops."""
    monkeypatch.setattr(bench_workload, "calibrate", lambda measure, seconds: 3)
    labels: List[str] = []
    cfg = BenchConfig(n_ctx=256, npl=(2,), npp=16, ntg=2, n_layer=1, n_head=4, head_dim=32, policies=("flat",),
                      unified=False, device="cpu", repeat=4)
    res = bench_workload.run_bench(cfg, on_step=labels.append)
    assert len(labels) == cfg.ntg * (1 + 3 * 4)  # the warm-up's repetition, then 4 samples of 3
    r = res.rows[0]
    assert r.steps_per_sample == 6 and r.repeats == 4 and res.sampling[2].loops == 3
    assert r.as_dict()["steps_per_sample"] == 6


def test_a_tiny_minimum_takes_one_repetition() -> None:
    cfg = BenchConfig(n_ctx=256, npl=(2,), npp=16, ntg=2, n_layer=1, n_head=4, head_dim=32, policies=("flat",),
                      unified=False, device="cpu", repeat=2, min_sample_ms=1e-6)
    res = bench_workload.run_bench(cfg)
    assert res.rows[0].steps_per_sample == 2 and res.sampling[2].loops == 1


def row(npl: int, policy: str, unified: bool, tps: List[float]) -> BenchRow:
    return BenchRow(npl, policy, unified, statistics.median(tps), 1.0, 0.1, 0.5, 100, 50, "x",
                    runs_tokens_per_s=tuple(tps), steps_per_sample=8, ntg=8)


def synthetic(flat: List[float], ranges: List[float], capped: bool, unified: bool = True) -> BenchResult:
    cfg = BenchConfig(npl=(2,), policies=("flat", "ranges"), unified=unified, max_time=1.0)
    rows = [row(2, "flat", False, flat), row(2, "ranges", False, ranges)]
    if unified:
        rows += [row(2, "flat", True, flat), row(2, "ranges", True, flat)]
    return BenchResult(cfg, "CPU", "pageable host memory", rows, sampling={2: Sampling(2, 1, len(flat), 1.0, capped)})


def test_claims_leave_out_the_unified_gain_over_flat() -> None:
    keys = [("flat", False, 0, False), ("ranges", False, 0, False), ("flat", False, 0, True),
            ("ranges", False, 0, True)]
    assert claim_pairs(keys) == [(0, 2, "unified"), (1, 0, "flat"), (1, 3, "unified")]


def test_warnings_name_the_cap_and_the_outliers() -> None:
    narrow = synthetic([100.0] * 12, [120.0] * 12, capped=False)
    assert narrow.warnings() == []
    d = narrow.as_dicts()[1]
    assert (d["gain"], d["gain_low"], d["gain_high"]) == pytest.approx((0.2, 0.2, 0.2))
    assert d["gain_within_noise"] is False and d["gain_claimed"] is True
    assert d["warnings"] == [] and d["over_unified"] == pytest.approx(0.2)
    wide = synthetic([100.0] * 12, [100.0, 140.0] * 6, capped=True)
    (cap,) = wide.warnings()
    assert cap.startswith("npl 2: the time cap (--max-time 1 s) came first: 2 of 3 gains wider "
                          "than ±2.5 points, the widest ranges over flat")
    assert wide.as_dicts()[0]["warnings"] == [cap]
    bursts = [120.0, 121.0, 119.0, 120.0, 122.0, 118.0, 120.0, 121.0, 119.0, 120.0, 60.0, 240.0]
    unstable = synthetic([100.0] * 12, bursts, capped=False, unified=False)
    (w,) = unstable.warnings()
    assert w == ("npl 2: many outliers (robust z above 3.5) among the paired samples of ranges over flat (17% of 12): "
                 "the machine was busy or the samples unstable; rerun when it is quiet")


def test_a_warning_when_the_hosts_speed_moves() -> None:
    """flat's tokens/s 11% higher in the last fifth of the run than in the first (ranges' with it): a
    warning naming it; 9% is not warned of, nor a burst inside one fifth."""
    moved = synthetic([100.0] * 8 + [111.0] * 2, [120.0] * 8 + [133.2] * 2, capped=False, unified=False)
    (w,) = moved.warnings()
    assert w == ("npl 2: the host's speed moved 11% during the run (flat's tokens/s, fastest fifth of the run "
                 "against slowest): the gains over flat follow it, so another run may differ by more than these "
                 "intervals; rerun when it is quiet")
    assert synthetic([100.0] * 8 + [109.0] * 2, [120.0] * 8 + [130.8] * 2, capped=False, unified=False).warnings() == []
    burst = synthetic([100.0] * 19 + [150.0], [120.0] * 19 + [180.0], capped=False, unified=False)
    assert burst.warnings() == []  # one sample of a fifth's four
    assert estimate.batch_drift([1.0, 2.0, 3.0, 4.0]) == 0.0  # fewer values than batches
    assert estimate.batch_drift([2.0] * 5 + [3.0] * 5) == pytest.approx(0.5)


def test_a_warning_when_the_standin_cannot_keep_to_its_link() -> None:
    """A link no host reaches (1e6 GB/s): every timed copy ends past its modelled end, and the run says
    so, in every npl's warnings; a result within LINK_OVERRUN does not."""
    cfg = BenchConfig(n_ctx=256, npl=(2,), npp=16, ntg=2, n_layer=1, n_head=4, head_dim=32,
                      policies=("flat", "ranges"), unified=False, device="cpu", repeat=2,
                      min_sample_ms=0.0, devices=DeviceConfig(link_gbps=(1e6,)))
    res = bench_workload.run_bench(cfg)
    assert res.link_overrun > 1.0 and res.standin_link_gbps == 1e6
    (w,) = [w for w in res.warnings() if "past the modelled link" in w]
    assert w.startswith(f"the stand-in's copies ran {res.link_overrun:.0%} past the modelled link's time")
    assert w in res.warnings(2) and all(w in d["warnings"] for d in res.as_dicts())
    kept = dataclasses.replace(res, link_overrun=bench_workload.LINK_OVERRUN)
    assert not any("past the modelled link" in x for x in kept.warnings())


def test_a_tiny_cap_stops_the_samples_and_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a goal no interval can reach, the samples stop at the cap, which the result says."""
    monkeypatch.setattr(bench_workload, "TARGET_HALF_WIDTH", -1.0)
    cfg = BenchConfig(n_ctx=256, npl=(2,), npp=16, ntg=2, n_layer=1, n_head=4, head_dim=32,
                      policies=("flat", "ranges"), unified=False, device="cpu", min_sample_ms=0.0, max_time=0.0)
    res = bench_workload.run_bench(cfg)
    assert res.sampling[2].capped and res.rows[0].repeats == bench_workload.MIN_SAMPLES
    assert any(w.startswith("npl 2: the time cap (--max-time 0 s) came first") for w in res.warnings())
    assert all(d["capped"] is True and d["warnings"] for d in res.as_dicts())
