"""The remote tier's link, measured: batch reads of the shapes the tier's pulls take (one piece of
a paged block up to twice a region's blocks, and a few pieces of a quarter of the largest read up to
two of all of it), timed several times in turn, and a batch's cost, a piece's and a rate fitted to
the medians (fit_remote_link), leaving out a timing the others disagree with. CopyCostModel.from_link
makes the model pulls merge and predict by; time_remote_pulls times pulls in the same rounds as the
shapes, so a fit can be held to the pulls of its own minute (remote_pull_seconds predicts them).

Why medians, turn by turn, and a fit that leaves one out: the bar a pull is held to is its median
time, and a model predicts that only when fitted to medians too (the fastest of a few reads is the
lucky tail, which moves from run to run as the host's load does); taking turns spreads a burst of
load over every shape instead of all of one shape's reads; and one shape read while the host was
busy would otherwise pull every figure toward it, since a least-squares fit follows its worst point.

Why small pieces and large ones and nothing between: the engine overlaps a piece's own cost with
other pieces' bytes (on the loopback 64 pieces of 16 KiB took some 30% less than their pieces and
their bytes), so a batch of middle-sized pieces costs less than the sum the tier predicts by, and a fit
that includes them lowers the piece and raises the rate for every pull (by 5 to 10% where the two
overlap by half or more). Small pieces give what a piece costs (their bytes are a sixth of it), large
ones what a byte costs (their pieces under a hundredth): the sum is right at both ends, where a merged
pull (a few large spans) and a piece per block sit; a pull of middle-sized pieces is predicted high.
And why the largest count and the largest read also doubled: a pull reads a layer's K and V windows
in one batch, twice a region's pieces and bytes, and the fit should hold the batches it predicts.
"""

from __future__ import annotations

import math
import statistics
from typing import Callable, List, NamedTuple, Sequence, Tuple, Union

import numpy as np

from .. import _checks
from ..copy_cost import CopyCostModel
from ..errors import InvalidArgumentError
from ..link import LinkFit, LinkMeasurement, _relative_nonneg_lstsq
from .pulls import PullStats
from .tier import RemoteTier

#: Batches of this many pieces of the tier's piece size (a paged block, a row): what a batch and a
#: piece cost (the lone piece is the batch's own cost, not left to the others' intercept).
PIECES = (1, 16, 256, 1024)
#: The largest read in batches of this many pieces (then in one, and WINDOWS times): what a byte costs.
LARGE_PIECES = (4, 2)
#: A pull's batch holds a K and a V window: the largest count and the largest read, this many times.
WINDOWS = 2
#: A timing is left out when its relative error is this many times the median one and above
#: OUTLIER_FLOOR; at most a quarter of the timings are.
OUTLIER_FACTOR = 4.0
OUTLIER_FLOOR = 0.1


class BatchTiming(NamedTuple):
    """One batch read's shape and its timed reads.

    Attributes
    ----------
    piece_bytes : int
        Bytes of each piece.
    pieces : int
        Pieces in the batch.
    seconds : tuple of float
        Each timed read's wall time.
    """

    piece_bytes: int
    pieces: int
    seconds: Tuple[float, ...]


class RemoteLinkFit(NamedTuple):
    """What fit_remote_link found.

    Attributes
    ----------
    fit : LinkFit
        latency_us: a batch; row_ns: a piece of it (every piece, the first too); gbps: its bytes.
        points: (bytes, pieces, median seconds) of every timing.
    residuals : tuple of float
        Each timing's relative error under the fit: predicted / median - 1.
    left_out : tuple of int
        The timings the fit left out (their residuals are still given).
    """

    fit: LinkFit
    residuals: Tuple[float, ...]
    left_out: Tuple[int, ...]


def remote_link_shapes(nbytes: int, piece_bytes: int) -> List[Tuple[int, int]]:
    """The (piece bytes, pieces) of the batches measure_remote_link times for a largest read of
    nbytes: small pieces by PIECES and WINDOWS times the most of them, then nbytes in LARGE_PIECES
    pieces and WINDOWS pieces of nbytes, the one read of nbytes last. time_remote_link reads them
    from a region of nbytes, a gap as large as a piece after each where the region holds it, and
    from its start again where it does not.

    Parameters
    ----------
    nbytes : int
        The largest read, at least 32768.
    piece_bytes : int
        Bytes of the small pieces (a paged block, a row), at least 1.

    Returns
    -------
    list of (int, int)

    Raises
    ------
    InvalidArgumentError
        For nbytes under 32768 or piece_bytes under 1.
    """
    n = _checks.as_size(nbytes, "remote_link_shapes: nbytes")
    piece = _checks.as_size(piece_bytes, "remote_link_shapes: piece_bytes")
    if n < 32 * max(PIECES) or piece < 1:
        raise InvalidArgumentError(f"remote_link_shapes: nbytes {n} must be at least {32 * max(PIECES)} and "
                                   f"piece_bytes {piece} at least 1")
    width = max(1, min(piece, n // max(PIECES)))
    shapes = [(width, count) for count in PIECES] + [(width, WINDOWS * max(PIECES))]
    return shapes + [(n // k, k) for k in LARGE_PIECES] + [(n, WINDOWS), (n, 1)]


def fit_remote_link(timings: Sequence[BatchTiming]) -> RemoteLinkFit:
    """The batch cost, piece cost and rate that best give batch reads' median times.

    A batch of k pieces of b bytes is modelled as latency + k * piece + k * b / rate (the sum the
    tier predicts a pull by). Each timing's median is fitted, least squares on the relative error
    (a batch of 16 small pieces counts as much as one of 8 MiB), no figure below 0; then the timing
    furthest off is left out and the rest fitted again while it is off by more than OUTLIER_FACTOR
    times the median timing's error and by more than OUTLIER_FLOOR, at most a quarter of them.

    Parameters
    ----------
    timings : sequence of BatchTiming
        At least 4, of at least 2 piece counts and 2 piece sizes, each with at least one timed read.

    Returns
    -------
    RemoteLinkFit

    Raises
    ------
    InvalidArgumentError
        For fewer timings or shapes than that, or a timing that is not a BatchTiming of positive
        sizes and times.
    """
    rows: List[Tuple[int, int, float]] = []
    for i, t in enumerate(timings):
        if not isinstance(t, BatchTiming):
            raise InvalidArgumentError(f"fit_remote_link: timing {i} is not a BatchTiming: {t!r}")
        b = _checks.as_size(t.piece_bytes, f"fit_remote_link: timing {i}'s piece_bytes")
        k = _checks.as_size(t.pieces, f"fit_remote_link: timing {i}'s pieces")
        if isinstance(t.seconds, (str, bytes)) or not hasattr(t.seconds, "__iter__"):
            raise InvalidArgumentError(f"fit_remote_link: timing {i}'s seconds is not a sequence of times: "
                                       f"{t.seconds!r}")
        secs = [_checks.as_double(s, f"fit_remote_link: timing {i}'s seconds") for s in t.seconds]
        if b < 1 or k < 1 or not secs or not all(s > 0 and math.isfinite(s) for s in secs):
            raise InvalidArgumentError(f"fit_remote_link: timing {i} has {k} pieces of {b} bytes and seconds "
                                       f"{t.seconds!r}; each must be positive, and one time at least")
        rows.append((b, k, statistics.median(secs)))
    counts, sizes = len({k for _, k, _ in rows}), len({b for b, _, _ in rows})
    if len(rows) < 4 or counts < 2 or sizes < 2:
        raise InvalidArgumentError(f"fit_remote_link: {len(rows)} timings of {counts} piece counts and {sizes} sizes: "
                                   "at least 4, 2 and 2 are needed to tell a batch, a piece and a byte apart")
    a = np.array([[1.0, float(k), float(k * b)] for b, k, _ in rows])
    med = np.array([s for _, _, s in rows])
    keep = list(range(len(rows)))
    while True:
        coef = _relative_nonneg_lstsq(a[keep], med[keep])
        err = np.abs(a @ coef / med - 1.0)
        worst = max(keep, key=lambda i: err[i])
        typical = float(np.median(err[keep]))
        if (len(rows) - len(keep) < len(rows) // 4 and len(keep) > 4
                and err[worst] > max(OUTLIER_FACTOR * typical, OUTLIER_FLOOR)):
            keep.remove(worst)
            continue
        break
    per_byte = float(coef[2])
    fit = LinkFit(latency_us=float(coef[0]) * 1e6, row_ns=float(coef[1]) * 1e9,
                  gbps=1.0 / per_byte / 1e9 if per_byte > 0 else math.inf,
                  points=tuple((k * b, k, s) for b, k, s in rows))
    return RemoteLinkFit(fit=fit, residuals=tuple(float(x) for x in a @ coef / med - 1.0),
                         left_out=tuple(i for i in range(len(rows)) if i not in keep))


class RemoteRounds(NamedTuple):
    """What time_remote_pulls timed.

    Attributes
    ----------
    timings : list of BatchTiming
        Each of remote_link_shapes' batches and its timed reads, one a round.
    pulls : list of tuple of PullStats
        Each pull's stats, one a round, in the order the pulls were given.
    """

    timings: List[BatchTiming]
    pulls: List[Tuple[PullStats, ...]]


def time_remote_pulls(tier: RemoteTier, pulls: Sequence[Callable[[], PullStats]], nbytes: int = 0,
                      repeats: int = 5, piece_bytes: int = 4096) -> RemoteRounds:
    """Batch reads of remote_link_shapes from the tier's peer and the given pulls, timed taking turns:
    a warm-up round, then `repeats` rounds, each reading every shape once with each pull made once
    among them (spread evenly). A fit of these rounds' shapes (fit_remote_link) then predicts the pulls
    of the same rounds (remote_pull_seconds), not those of a later minute the host made slower or faster.

    Parameters
    ----------
    tier : RemoteTier
    pulls : sequence of callables
        Each makes one pull and returns its PullStats (say, ``lambda: tier.pull(0, 256)[2]``); may be
        empty.
    nbytes : int, optional
        The largest read; 0: the tier's smallest region, at most 4 MiB. At least 32768, at most the
        smallest region.
    repeats : int, optional
        Timed rounds after the warm-up, at least 1.
    piece_bytes : int, optional
        Bytes of the small pieces, at least 1: the size the tier's pulls read (a paged block, a row).

    Returns
    -------
    RemoteRounds
        The shapes' timings in remote_link_shapes' order, and each pull's stats of every timed round.

    Raises
    ------
    InvalidArgumentError
        For a tier that is not a RemoteTier, pulls that are not a sequence of callables or a pull that
        does not return a PullStats (naming pulls[i]), or nbytes, repeats or piece_bytes out of range.
    PeerGoneError, RemoteTimeoutError
        When the peer fails while being measured (and whatever a pull raises).
    """
    return _rounds("time_remote_pulls", tier, pulls, nbytes, repeats, piece_bytes)


def _rounds(what: str, tier: RemoteTier, pulls: Sequence[Callable[[], PullStats]], nbytes: int, repeats: int,
            piece_bytes: int) -> RemoteRounds:
    """time_remote_pulls, its errors beginning with what (the entry point the caller called)."""
    tr = _checks.instance(tier, RemoteTier, f"{what}: tier")
    if isinstance(pulls, (str, bytes)) or not isinstance(pulls, Sequence):
        raise InvalidArgumentError(f"{what}: pulls must be a sequence of callables, got {pulls!r}")
    for i, pull in enumerate(pulls):
        if not callable(pull):
            raise InvalidArgumentError(f"{what}: pulls[{i}] is not a callable: {pull!r}")
    reps = _checks.as_int(repeats, f"{what}: repeats")
    piece = _checks.as_size(piece_bytes, f"{what}: piece_bytes")
    region = tr.region_bytes()
    n = _checks.as_size(nbytes, f"{what}: nbytes") or min(region, 4 << 20)
    least = 32 * max(PIECES)
    if reps < 1:
        raise InvalidArgumentError(f"{what}: repeats {repeats} is less than 1")
    if piece < 1:
        raise InvalidArgumentError(f"{what}: piece_bytes must be at least 1")
    if not least <= n <= region:
        raise InvalidArgumentError(f"{what}: nbytes {n} must be from {least} to the tier's smallest "
                                   f"region, {region} bytes")
    shapes = remote_link_shapes(n, piece)
    reads = []
    for b, k in shapes:  # a gap as large as a piece after each where the region holds it; else from its start again
        step, span = (2 * b if 2 * b * k <= n else b), n - n % b
        reads.append([(step * i % span, b) for i in range(k)])
    turns: List[Tuple[str, int]] = [("shape", i) for i in range(len(shapes))]
    for j in reversed(range(len(pulls))):  # pull j after shape (j + 1) * shapes / (pulls + 1): spread evenly
        turns.insert((j + 1) * len(shapes) // (len(pulls) + 1), ("pull", j))
    times: List[List[float]] = [[] for _ in shapes]
    stats: List[List[PullStats]] = [[] for _ in pulls]
    for round_ in range(reps + 1):
        for kind, i in turns:
            if kind == "shape":
                sec = tr.timed_read(reads[i])
                if round_ > 0:  # the first round warms the engine's connections and the staging buffer
                    times[i].append(sec)
                continue
            got = pulls[i]()
            if not isinstance(got, PullStats):
                raise InvalidArgumentError(f"{what}: pulls[{i}] returned {got!r}, not a PullStats")
            if round_ > 0:
                stats[i].append(got)
    return RemoteRounds([BatchTiming(b, k, tuple(ts)) for (b, k), ts in zip(shapes, times)],
                        [tuple(s) for s in stats])


def time_remote_link(tier: RemoteTier, nbytes: int = 0, repeats: int = 5, piece_bytes: int = 4096) -> List[BatchTiming]:
    """Batch reads of remote_link_shapes from the tier's peer, timed: a warm-up round, then
    `repeats` rounds, each reading every shape once in turn (time_remote_pulls with no pulls).

    Parameters
    ----------
    tier : RemoteTier
    nbytes : int, optional
        The largest read; 0: the tier's smallest region, at most 4 MiB. At least 32768, at most the
        smallest region.
    repeats : int, optional
        Timed rounds after the warm-up, at least 1.
    piece_bytes : int, optional
        Bytes of the small pieces, at least 1: the size the tier's pulls read (a paged block, a row).

    Returns
    -------
    list of BatchTiming
        In remote_link_shapes' order.

    Raises
    ------
    InvalidArgumentError
        For a tier that is not a RemoteTier, or nbytes, repeats or piece_bytes out of range.
    PeerGoneError, RemoteTimeoutError
        When the peer fails while being measured.
    """
    return _rounds("measure_remote_link", tier, (), nbytes, repeats, piece_bytes).timings


def remote_pull_seconds(fit: Union[LinkFit, RemoteLinkFit], stats: PullStats) -> float:
    """What a fit predicts of a pull's transfer: the tier's prediction (a batch, each piece, each byte)
    under CopyCostModel.from_link of the fit, for the pull's pieces and bytes (its merged gaps too).
    The model of a LinkFit has no piece curve, so the pieces' sizes do not matter, only their sum.

    Parameters
    ----------
    fit : LinkFit or RemoteLinkFit
        fit_remote_link's, or its fit.
    stats : PullStats
        The pull's: its pieces and bytes are priced.

    Returns
    -------
    float
        Seconds.

    Raises
    ------
    InvalidArgumentError
        For a fit or stats of another kind, a fit's figure below 0 or not finite (gbps: not above 0), or
        stats whose pieces or bytes are not sizes.
    """
    link = _checks.instance(fit.fit if isinstance(fit, RemoteLinkFit) else fit, LinkFit, "remote_pull_seconds: fit")
    figures = []
    for name in ("latency_us", "row_ns", "gbps"):
        x = _checks.as_double(getattr(link, name), f"remote_pull_seconds: fit's {name}")
        if not (x >= 0 and (math.isfinite(x) or name == "gbps")) or (name == "gbps" and x == 0):
            raise InvalidArgumentError(f"remote_pull_seconds: fit's {name} is {x!r}; a fit_remote_link figure is "
                                       "finite and not below 0 (gbps above 0, or inf)")
        figures.append(x)
    link = LinkFit(figures[0], figures[1], figures[2], ())  # plain floats (numpy's are numbers too)
    st = _checks.instance(stats, PullStats, "remote_pull_seconds: stats")
    pieces = _checks.as_size(st.pieces, "remote_pull_seconds: stats' pieces")
    nbytes = _checks.as_size(st.bytes, "remote_pull_seconds: stats' bytes")
    model = CopyCostModel.from_link(link)
    return model.call_us * 1e-6 + pieces * model.piece_ns * 1e-9 + model.piece_seconds(nbytes)


def measure_remote_link(tier: RemoteTier, nbytes: int = 0, repeats: int = 5,
                        piece_bytes: int = 4096) -> LinkMeasurement:
    """Time batch reads of the shapes the tier's pulls take and fit what a batch, a piece and a
    byte cost (time_remote_link, then fit_remote_link).

    Parameters
    ----------
    tier : RemoteTier
    nbytes : int, optional
        The largest read; 0: the tier's smallest region, at most 4 MiB. At least 32768, at most the
        smallest region.
    repeats : int, optional
        Timed rounds after the warm-up, at least 1 (5: a median that one busy moment does not move).
    piece_bytes : int, optional
        Bytes of the small pieces, at least 1: the size the tier's pulls read (a paged block, a row).

    Returns
    -------
    LinkMeasurement
        gbps and seconds: the median read of nbytes in one piece; times: its reads; fit: the
        LinkFit (latency_us a batch, row_ns a piece, gbps); pieces: None (the engine's rate does
        not rise with a piece's size past what a piece costs: no piece curve is fitted).

    Raises
    ------
    InvalidArgumentError
        For a tier that is not a RemoteTier, or nbytes, repeats or piece_bytes out of range.
    PeerGoneError, RemoteTimeoutError
        When the peer fails while being measured.
    """
    timings = time_remote_link(tier, nbytes, repeats, piece_bytes)
    whole = timings[-1]
    sec = statistics.median(whole.seconds)
    return LinkMeasurement(gbps=whole.piece_bytes / sec / 1e9, seconds=sec, nbytes=whole.piece_bytes, pinned=False,
                           device=f"remote {tier.peer}", times=whole.seconds, fit=fit_remote_link(timings).fit)
