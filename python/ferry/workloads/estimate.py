"""How `ferry bench` turns timed repetitions into figures: calibration, floors, replicas, intervals.

A sample is one variant's decode steps timed together, long enough that a scheduler hiccup of
the host is small beside it: `calibrate` finds how many repetitions of the ntg steps one sample
holds (as pyperf does, doubling until a sample lasts the minimum).

The figure of a step is its floor: the fastest time each of the ntg steps took over a replica's
samples, summed (`StepFloor`). A shared host only ever adds time to a step (another tenant on the
core, an interrupt, a descheduled vCPU), and in bursts: on the 2-vCPU VM a loaded hour made the
median step 20 to 60% slower while the fastest of each step stayed within 1% of a quiet hour's.
A gain measured on medians follows that load (it falls as the added time grows, since the load
adds to both sides of the ratio); a gain of floors does not.

A floor moves by about 1% with where the run's buffers land in memory (a fresh allocation, not
the load), which no repetition within one allocation can show. So a run is made of replicas,
each with its own caches and schedulers; a gain is the median over replicas of each replica's
ratio of floors, minus 1, and its 95% confidence interval is the distribution-free one for a
median (`median_interval`): the order statistics x(j) and x(n+1-j) with j the largest rank for
which a Binomial(n, 1/2) count falls below j with probability at most 2.5%. It needs no
resampling and no random numbers, so the same replicas always give the same interval, and it
holds for any distribution of the replicas' gains (needing only that they are independent);
for 6 to 8 replicas it is their range, covering 96.9 to 99.2%. A replica whose floor of a
variant is more than FLOOR_SPREAD slower than that variant's fastest replica did not reach it
(the host left some step no quiet moment: `reached`). It is left out of the estimate, which
it would pull toward the host's load, and kept in the interval, which it widens: the
replicas the host happened to spare alone give intervals narrower than the spread between
runs.

Runs still differ by more than one run's replicas show, even with each replica in a process
of its own: the host's state over minutes is shared by a run's replicas and not by the next
run's. Ten default runs on the 2-vCPU VM put 1 + gain's estimates 0.14 to 0.38% apart (their
standard deviation, per claim), while in the quietest of them the replicas' interval of plan
over flat at npl 4 ended 0.2 points above its estimate and held 5 of the other 9 estimates.
That part is a standard uncertainty known from those runs, not from this one (in the terms of
metrology's GUM, type B beside the replicas' type A): the interval's ends are moved out from the estimate to
sqrt(d^2 + (1.96 * BETWEEN_RUNS * (1 + gain))^2), d each end's distance from the replicas'
interval, so that it says where another run on such a machine would put the gain. A quieter
machine has less of it, and there the intervals are wider than they need be.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, List, Optional, Sequence, Tuple

#: The interval's confidence.
CONFIDENCE = 0.95
#: The most repetitions a sample may hold: calibration stops doubling here.
MAX_LOOPS = 1 << 16
#: A variant's floor more than this share slower in one replica than in its fastest: the host
#: left some step of that replica no quiet moment (on the 2-vCPU VM fresh allocations moved
#: floors 0.3 to 1.1%, a replica with no quiet moment 3 to 40%).
FLOOR_SPREAD = 0.03
#: The relative standard deviation of 1 + gain between runs that no run's replicas show: the
#: largest of the four claims' in ten default runs on the 2-vCPU VM, a replica per worker process
#: (0.38%, tools/results/2026-12-02-bench-workers.md), rounded up.
BETWEEN_RUNS = 0.004
#: A CONFIDENCE interval's half-width in standard deviations of a normal (1.96).
Z95 = statistics.NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)


@dataclass(frozen=True)
class Interval:
    """A median with its confidence interval.

    Attributes
    ----------
    estimate : float
        The median.
    low, high : float or None
        The interval's ends; None when there are too few samples for one (fewer than
        `fewest_samples`).
    n : int
        The samples behind it.
    """

    estimate: float
    low: Optional[float]
    high: Optional[float]
    n: int

    @property
    def half_width(self) -> float:
        """The larger distance from the estimate to an end (inf without an interval)."""
        if self.low is None or self.high is None:
            return math.inf
        return max(self.estimate - self.low, self.high - self.estimate)

    def contains(self, x: float) -> bool:
        """Whether x lies in the interval (False without one)."""
        return self.low is not None and self.high is not None and self.low <= x <= self.high

    @property
    def within_noise(self) -> bool:
        """Whether the interval contains 0 (a gain no larger than its own noise), or there is none."""
        return self.low is None or self.contains(0.0)


@functools.lru_cache(maxsize=None)
def interval_rank(n: int, confidence: float = CONFIDENCE) -> Optional[int]:
    """The rank j (1-based) of the lower end of the median's interval over n sorted samples.

    Parameters
    ----------
    n : int
        Samples.
    confidence : float, optional

    Returns
    -------
    int or None
        The largest j with 2 * P(B <= j - 1) <= 1 - confidence, B ~ Binomial(n, 1/2); the interval
        is [x(j), x(n + 1 - j)]. None when even [x(1), x(n)] covers less than confidence.
    """
    limit = (1 - Fraction(confidence)) / 2 * 2**n  # in counts of the 2**n equally likely outcomes; exact
    j = below = 0  # below: outcomes with B <= j - 1
    while j < n // 2 and below + math.comb(n, j) <= limit:  # rank j + 1 is still valid
        below += math.comb(n, j)
        j += 1
    return j or None


def fewest_samples(confidence: float = CONFIDENCE) -> int:
    """The fewest samples with a median interval at confidence (6 at 95%)."""
    n = 1
    while interval_rank(n, confidence) is None:
        n += 1
    return n


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """The median of values and its distribution-free confidence interval (see the module).

    Parameters
    ----------
    values : sequence of float
        At least one.
    confidence : float, optional

    Returns
    -------
    Interval
        Without ends when there are too few values for the confidence.

    Raises
    ------
    ValueError
        For no values.
    """
    xs = sorted(values)
    if not xs:
        raise ValueError("median_interval: no values")
    j = interval_rank(len(xs), confidence)
    if j is None:
        return Interval(statistics.median(xs), None, None, len(xs))
    return Interval(statistics.median(xs), xs[j - 1], xs[len(xs) - j], len(xs))


class StepFloor:
    """The fastest time of each of a repetition's steps, over every repetition added, and their sum.

    Parameters
    ----------
    steps : int
        Steps of a repetition (ntg).
    """

    def __init__(self, steps: int) -> None:
        self.fastest: List[float] = [math.inf] * steps

    def add(self, step: int, seconds: float) -> None:
        """Count one timing of step (0-based)."""
        if seconds < self.fastest[step]:
            self.fastest[step] = seconds

    @property
    def total(self) -> float:
        """The floor of a repetition: every step's fastest time, summed (inf before every step has one)."""
        return math.fsum(self.fastest)


def reached(rates: Sequence[float]) -> List[bool]:
    """Which replicas reached a variant's floor: those whose floor's tokens/s is within FLOOR_SPREAD of
    its fastest replica's (the others are left out of the estimates, kept in the intervals).

    Parameters
    ----------
    rates : sequence of float
        Tokens/s of each replica's floor.
    """
    best = max(rates, default=0.0)
    return [r * (1.0 + FLOOR_SPREAD) >= best for r in rates]


def replica_gain(rates: Sequence[float], reference: Sequence[float], between_runs: float = BETWEEN_RUNS) -> Interval:
    """The gain of rates over reference: the median, over the replicas that reached both floors
    (`reached`), of each one's rate over the reference's in the same replica, minus 1 (when none
    did, the ratio of the two variants' own figures, each the median over the replicas that
    reached it, minus 1); with the 95% distribution-free interval over every replica
    (median_interval: no ends for fewer than 6), widened to hold the estimate and then by what
    varies between runs (each end's distance d from the estimate made sqrt(d^2 + (Z95 *
    between_runs * (1 + estimate))^2)).

    Parameters
    ----------
    rates, reference : sequence of float
        Per replica, in the order they ran: tokens/s of each one's floor (at least one). Extra
        replicas of the longer are left out.
    between_runs : float, optional
        The relative standard deviation of 1 + gain from one run to the next beyond the replicas'
        (default BETWEEN_RUNS; 0: the replicas' interval alone).

    Returns
    -------
    Interval
    """
    n = min(len(rates), len(reference))
    ratios = [a / b - 1.0 for a, b in zip(rates[:n], reference[:n])]
    ok_rates, ok_reference = reached(rates[:n]), reached(reference[:n])
    clean = [g for g, ok_a, ok_b in zip(ratios, ok_rates, ok_reference) if ok_a and ok_b]
    every = median_interval(ratios)
    if clean:
        mid = statistics.median(clean)
    else:  # a host busy enough that no replica was quiet for both: unpaired, but not pulled by the load
        mid = (statistics.median(a for a, ok in zip(rates, ok_rates) if ok)
               / statistics.median(b for b, ok in zip(reference, ok_reference) if ok) - 1.0)
    if every.low is None or every.high is None:
        return Interval(mid, None, None, n)
    runs = Z95 * between_runs * (1.0 + mid)
    return Interval(mid, mid - math.hypot(mid - min(every.low, mid), runs),
                    mid + math.hypot(max(every.high, mid) - mid, runs), n)


def calibrate(measure: Callable[[int], float], min_seconds: float, max_loops: int = MAX_LOOPS) -> int:
    """How many repetitions one sample holds, found as pyperf finds its loops.

    Parameters
    ----------
    measure : callable
        measure(loops) runs every variant for loops repetitions and returns the shortest variant's
        time (seconds).
    min_seconds : float
        What a sample must last at least; 0 or less: one repetition, nothing measured.
    max_loops : int, optional
        Doubling stops here.

    Returns
    -------
    int
        The loops of the first measurement lasting min_seconds, doubling from 1; max_loops when none
        did.
    """
    loops = 1
    if min_seconds <= 0:
        return loops
    while loops < max_loops and measure(loops) < min_seconds:
        loops *= 2
    return min(loops, max_loops)


def ratio_spread(values: Sequence[float]) -> Tuple[float, float, float]:
    """The median, least and greatest of values (at least one)."""
    return statistics.median(values), min(values), max(values)


def balanced_orders(n: int) -> List[List[int]]:
    """Orders in which n variants take turns, one round each, so that what runs before a variant
    (and leaves its data in the host's caches) falls on every variant alike.

    A Williams design: over the rounds each variant holds each place equally often and follows
    every other variant equally often within a round (once for even n, twice for odd n, whose
    design takes 2n rounds); the rounds are ordered so that no variant runs twice in a row across
    their boundaries either. Two variants simply alternate.

    Parameters
    ----------
    n : int
        Variants, 1 or more.

    Returns
    -------
    list of list of int
        The rounds, each a permutation of range(n), to be used in turn and cyclically.
    """
    if n <= 2:
        return [list(range(n))]
    base, lo, hi = [0], 1, n - 1
    while len(base) < n:  # 0, 1, n-1, 2, n-2, ...
        base.append(lo)
        lo += 1
        if len(base) < n:
            base.append(hi)
            hi -= 1
    rows = [[(x + i) % n for x in base] for i in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    ordered = [rows.pop(0)]
    while rows:  # each next round starts with another variant than the last one ended with
        nxt = next((r for r in rows if r[0] != ordered[-1][-1] and (len(rows) > 1 or r[-1] != ordered[0][0])),
                   rows[0])
        rows.remove(nxt)
        ordered.append(nxt)
    return ordered
