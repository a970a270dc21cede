"""How `ferry bench` turns timed repetitions into figures: floors, the order of turns, gains.

The figure of a step is its floor: the fastest time each of a repetition's steps took over a
replica's repetitions, summed (`StepFloor`). A shared host only ever adds time to a step, and in
bursts, so the fastest of each step stays near what a quiet machine gives while a median follows
the load, and a gain of medians falls as the load adds to both sides of its ratio.

A floor still moves by about 1% with where a run's buffers land in memory, so a run is made of
replicas, each with its own caches and schedulers. A gain is the median over replicas of each
one's ratio of floors, minus 1 (`gain_interval`); its interval is the replicas' range (for n
replicas it holds the median with probability 1 - 2^(1-n): 96.9% for 6), moved out by what
varies between runs and no run's replicas show (the host's state over minutes, which a run's
replicas share): each end's distance d from the estimate becomes sqrt(d^2 + (1.96 * BETWEEN_RUNS
* (1 + gain))^2), as a type B uncertainty in the GUM's terms, known from earlier runs rather
than from this one.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import List, Optional, Sequence

#: The relative standard deviation of 1 + gain between runs that a run's replicas do not show,
#: measured over default runs on the 2-vCPU VM (tools/results/2026-12-03-bench-light.md).
BETWEEN_RUNS = 0.004
#: A 95% interval's half-width in standard deviations of a normal (1.96).
Z95 = statistics.NormalDist().inv_cdf(0.975)


@dataclass(frozen=True)
class Interval:
    """A median with an interval around it.

    Attributes
    ----------
    estimate : float
        The median.
    low, high : float or None
        The interval's ends; None with a single replica (no range).
    n : int
        The replicas behind it.
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


def gain_interval(rates: Sequence[float], reference: Sequence[float], between_runs: float = BETWEEN_RUNS) -> Interval:
    """The gain of rates over reference, replica by replica: the median of each replica's rate over the
    reference's minus 1, and the range of those, widened by what varies between runs (see the
    module).

    Parameters
    ----------
    rates, reference : sequence of float
        Per replica, in the order they were made: tokens/s of each one's floor (at least one each;
        extra replicas of the longer are left out).
    between_runs : float, optional
        The relative standard deviation of 1 + gain from one run to the next beyond the replicas'
        (default BETWEEN_RUNS; 0: the replicas' range alone).

    Returns
    -------
    Interval
        Without ends for a single replica.
    """
    gains = [a / b - 1.0 for a, b in zip(rates, reference)]
    mid = statistics.median(gains)
    if len(gains) < 2:
        return Interval(estimate=mid, low=None, high=None, n=len(gains))
    runs = Z95 * between_runs * (1.0 + mid)
    return Interval(estimate=mid, low=mid - math.hypot(mid - min(gains), runs),
                    high=mid + math.hypot(max(gains) - mid, runs), n=len(gains))


def balanced_orders(n: int) -> List[List[int]]:
    """Orders in which n variants take turns, one round each, so that what runs before a variant (and
    leaves its data in the host's caches) falls on every variant alike.

    A Williams design: over the rounds each variant holds each place equally often and follows every
    other variant equally often within a round (once for even n, twice for odd n, whose design takes 2n
    rounds); the rounds are ordered so that no variant runs twice in a row across their boundaries
    either. Two variants simply alternate.

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
