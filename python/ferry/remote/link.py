"""The remote tier's link, measured: batch reads of several sizes and piece counts, timed, and the
per-piece cost and rate fitted by ferry.link's fit_link (CopyCostModel.from_link makes the model
pulls merge and predict by)."""

from __future__ import annotations

import math
from typing import List, Tuple

from .. import _checks
from ..errors import InvalidArgumentError
from ..link import LinkMeasurement, fit_link
from .tier import RemoteTier

#: Plain reads of the measured size divided by these, and batches of size / 16 in this many pieces.
PLAIN_PARTS = (1, 16, 256)
PIECES = (16, 256, 1024)


def measure_remote_link(tier: RemoteTier, nbytes: int = 0, repeats: int = 3) -> LinkMeasurement:
    """Time batch reads from the tier's peer and fit what a batch, a piece and a byte cost.

    Plain reads (one piece) of nbytes, nbytes / 16 and nbytes / 256, and batches of nbytes / 16 bytes
    in 16, 256 and 1024 pieces, each piece followed by a gap as large, are each timed: a warm-up,
    then the fastest of `repeats`. fit_link fits latency (a batch), row_ns (a piece) and gbps.

    Parameters
    ----------
    tier : RemoteTier
    nbytes : int, optional
        The largest read; 0: the tier's smallest region, at most 4 MiB. At least 32768 (each of
        1024 pieces then holds 2 bytes), at most the smallest region.
    repeats : int, optional
        Timed reads of each after the warm-up, at least 1.

    Returns
    -------
    LinkMeasurement
        gbps and seconds of the largest read; fit: the LinkFit (its row_ns is the piece cost).

    Raises
    ------
    InvalidArgumentError
        For a tier that is not a RemoteTier, or nbytes or repeats out of range.
    PeerGoneError, RemoteTimeoutError
        When the peer fails while being measured.
    """
    t = _checks.instance(tier, RemoteTier, "measure_remote_link: tier")
    reps = _checks.as_int(repeats, "measure_remote_link: repeats")
    region = t.region_bytes()
    n = _checks.as_size(nbytes, "measure_remote_link: nbytes") or min(region, 4 << 20)
    least = 32 * max(PIECES)
    if reps < 1:
        raise InvalidArgumentError(f"measure_remote_link: repeats {repeats} is less than 1")
    if not least <= n <= region:
        raise InvalidArgumentError(f"measure_remote_link: nbytes {n} must be from {least} to the tier's smallest "
                                   f"region, {region} bytes")

    def fastest(pieces: List[Tuple[int, int]]) -> float:
        t.timed_read(pieces)
        return min(t.timed_read(pieces) for _ in range(reps))

    points: List[Tuple[int, int, float]] = []
    times: List[float] = []
    for part in PLAIN_PARTS:
        size = n // part
        sec = fastest([(0, size)])
        points.append((size, 1, sec))
        if part == 1:
            times.append(sec)
    total = n // 16
    for count in PIECES:
        width = total // count
        points.append((width * count, count, fastest([(2 * width * i, width) for i in range(count)])))
    return LinkMeasurement(gbps=n / times[0] / 1e9 if times[0] > 0 else math.inf, seconds=times[0], nbytes=n,
                           pinned=False, device=f"remote {t.peer}", times=tuple(times), fit=fit_link(points))
