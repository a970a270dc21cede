"""How `ferry bench` turns timed samples into figures: calibration, medians, intervals, warnings.

A sample is one variant's decode steps timed together, long enough that a scheduler hiccup of
the host is small beside it: `calibrate` finds how many repetitions of the ntg steps one sample
holds (as pyperf does, doubling until a sample lasts the minimum).

The statistic is the median everywhere: a variant's tokens/s is the median of its samples'
tokens/s, and a gain is the median of the paired ratios (each sample's tokens/s over the
reference's sample of the same turn), minus 1. Its 95% confidence interval is the
distribution-free one for a median (`median_interval`): the order statistics x(j) and
x(n+1-j) with j the largest rank for which a Binomial(n, 1/2) count falls below j with
probability at most 2.5%. It needs no resampling and no random numbers, so the same samples
always give the same interval, and it holds for any distribution of the ratios (needing only
that the samples are independent), covering at least 95% exactly rather than asymptotically.

Samples of a shared machine are not independent: its speed drifts over seconds, so neighbouring
turns resemble each other and the sign test's interval comes out too narrow. A gain's interval
is therefore the wider of that one and a batch-means interval (`batch_interval`): the ratios,
in the order their turns ran, cut into BATCHES consecutive batches, and Student's t interval
of the batches' medians around the median of all. Drift within the run widens it; drift
slower than the run cannot show in it (docs/design.md).
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
#: A robust z-score (|x - median| / (1.4826 MAD)) beyond this makes a sample an outlier
#: (Iglewicz and Hoaglin's cut-off).
OUTLIER_Z = 3.5
#: More than this share of outliers among a gain's paired ratios makes the samples unstable.
OUTLIER_SHARE = 0.1
#: The most repetitions a sample may hold: calibration stops doubling here.
MAX_LOOPS = 1 << 16
#: Consecutive batches of a gain's ratios for its batch-means interval (batch_interval).
BATCHES = 5
#: Student's t at 97.5% with BATCHES - 1 degrees of freedom: the two-sided 95% interval's factor.
T_975_BATCHES = 2.7764451
#: A reference's speed moving more than this between batches makes the run's speed unsteady: on
#: the 2-vCPU VM quiet runs moved 0 to 6%, busy ones 6 to 32%.
DRIFT_SHARE = 0.10


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


def batch_medians(values: Sequence[float]) -> List[float]:
    """The medians of values cut, in order, into BATCHES consecutive batches as equal as can be (at
    least BATCHES values)."""
    n = len(values)
    return [statistics.median(values[i * n // BATCHES:(i + 1) * n // BATCHES]) for i in range(BATCHES)]


def batch_interval(values: Sequence[float]) -> Interval:
    """The median of values with a 95% batch-means interval, which holds when neighbouring values
    drift together: values, in the order they were taken, cut into BATCHES consecutive batches (as
    equal as can be), and the median of all ± t(97.5%, BATCHES - 1) times the standard deviation of
    the batches' medians over sqrt(BATCHES).

    Parameters
    ----------
    values : sequence of float
        In the order they were taken.

    Returns
    -------
    Interval
        Without ends for fewer than BATCHES values (a batch would be empty).

    Raises
    ------
    ValueError
        For no values.
    """
    if not values:
        raise ValueError("batch_interval: no values")
    n, mid = len(values), statistics.median(values)
    if n < BATCHES:
        return Interval(mid, None, None, n)
    half = T_975_BATCHES * statistics.stdev(batch_medians(values)) / math.sqrt(BATCHES)
    return Interval(mid, mid - half, mid + half, n)


def batch_drift(values: Sequence[float]) -> float:
    """How far values moved over the run: the largest of the BATCHES consecutive batches' medians
    over the smallest, minus 1 (0 for fewer than BATCHES values, or values not all positive).

    Parameters
    ----------
    values : sequence of float
        Rates (tokens/s), in the order they were taken.
    """
    if len(values) < BATCHES:
        return 0.0
    medians = batch_medians(values)
    return max(medians) / min(medians) - 1.0 if min(medians) > 0 else 0.0


def wider(a: Interval, b: Interval) -> Interval:
    """a's estimate with the farther of each end of a and b (an end of either missing: none)."""
    if a.low is None or a.high is None or b.low is None or b.high is None:
        return Interval(a.estimate, None, None, a.n)
    return Interval(a.estimate, min(a.low, b.low), max(a.high, b.high), a.n)


def paired_gain(samples: Sequence[float], reference: Sequence[float]) -> Interval:
    """The gain of samples over reference: the median of the paired ratios minus 1, with its interval:
    the wider of the distribution-free one (median_interval) and the batch-means one
    (batch_interval), the ratios taken in the order of their turns; both 95%.

    Parameters
    ----------
    samples, reference : sequence of float
        Rates (tokens/s), sample i of each taken in the same turn, in the order of the turns; extra
        samples of the longer are left out.

    Returns
    -------
    Interval
    """
    ratios = [a / b - 1.0 for a, b in zip(samples, reference)]
    return wider(median_interval(ratios), batch_interval(ratios))


def outlier_share(values: Sequence[float], z: float = OUTLIER_Z) -> float:
    """The share of values whose robust z-score exceeds z (0 when the spread is 0).

    The robust z-score is |x - median| / (1.4826 * MAD), MAD the median absolute deviation: 1.4826
    MAD estimates a normal distribution's standard deviation without letting outliers widen it.
    """
    if not values:
        return 0.0
    mid = statistics.median(values)
    mad = statistics.median(abs(x - mid) for x in values)
    if mad == 0:
        return 0.0
    return sum(abs(x - mid) / (1.4826 * mad) > z for x in values) / len(values)


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
