"""The remote tier's link, measured: batch reads of several sizes and piece counts, timed, the
per-piece cost and rate fitted by ferry.link's fit_link and the piece curve (a piece's rate by its
size) by fit_piece_curve (CopyCostModel.from_link makes the model pulls merge and predict by)."""

from __future__ import annotations

import math
from typing import List, Tuple

from .. import _checks
from ..errors import InvalidArgumentError
from ..link import LinkMeasurement, fit_link, fit_piece_curve
from .tier import RemoteTier

#: Plain reads of the measured size divided by these, and batches of this many pieces.
PLAIN_PARTS = (1, 16, 256)
#: The piece curve's batches: CURVE_PIECES pieces of the measured size divided by each of these.
CURVE_PARTS = (128, 512, 2048, 8192)
CURVE_PIECES = 64
PIECES = (16, 256, 1024)


def measure_remote_link(tier: RemoteTier, nbytes: int = 0, repeats: int = 3,
                        piece_bytes: int = 4096) -> LinkMeasurement:
    """Time batch reads from the tier's peer and fit what a batch, a piece and a byte cost.

    Plain reads (one piece) of nbytes, nbytes / 16 and nbytes / 256, batches of 16, 256 and 1024
    pieces of piece_bytes (fewer bytes where the region cannot hold 1024 of them with a gap as large
    after each), and batches of 64 pieces of nbytes / 128, / 512, / 2048 and / 8192 are each timed:
    a warm-up, then the fastest of `repeats`. fit_link fits latency (a batch), row_ns (a piece) and
    gbps to the plain reads and the first batches; fit_piece_curve the piece curve to what a piece
    of each size costs inside a batch (a batch's time / 64): the engine's rate by a piece's size,
    which the one merge rule prices pieces by. Plain reads are not the curve's: a read alone pays
    the batch's own cost, which no piece of a batch pays again.

    Parameters
    ----------
    tier : RemoteTier
    nbytes : int, optional
        The largest read; 0: the tier's smallest region, at most 4 MiB. At least 32768, at most the
        smallest region.
    repeats : int, optional
        Timed reads of each after the warm-up, at least 1.
    piece_bytes : int, optional
        Bytes of a batch's piece, at least 1: the size the tier's pulls read (a paged block, a row).

    Returns
    -------
    LinkMeasurement
        gbps and seconds of the largest read; fit: the LinkFit (its row_ns is the piece cost);
        pieces: the PieceCurve.

    Raises
    ------
    InvalidArgumentError
        For a tier that is not a RemoteTier, or nbytes, repeats or piece_bytes out of range.
    PeerGoneError, RemoteTimeoutError
        When the peer fails while being measured.
    """
    t = _checks.instance(tier, RemoteTier, "measure_remote_link: tier")
    reps = _checks.as_int(repeats, "measure_remote_link: repeats")
    piece = _checks.as_size(piece_bytes, "measure_remote_link: piece_bytes")
    region = t.region_bytes()
    n = _checks.as_size(nbytes, "measure_remote_link: nbytes") or min(region, 4 << 20)
    least = 32 * max(PIECES)
    if reps < 1:
        raise InvalidArgumentError(f"measure_remote_link: repeats {repeats} is less than 1")
    if piece < 1:
        raise InvalidArgumentError("measure_remote_link: piece_bytes must be at least 1")
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
    width = max(1, min(piece, region // (2 * max(PIECES))))
    for count in PIECES:
        points.append((width * count, count, fastest([(2 * width * i, width) for i in range(count)])))
    in_batch = [(max(1, n // part), fastest([(2 * max(1, n // part) * i, max(1, n // part))
                                              for i in range(CURVE_PIECES)]) / CURVE_PIECES)
                for part in CURVE_PARTS]
    return LinkMeasurement(gbps=n / times[0] / 1e9 if times[0] > 0 else math.inf, seconds=times[0], nbytes=n,
                           pinned=False, device=f"remote {t.peer}", times=tuple(times), fit=fit_link(points),
                           pieces=fit_piece_curve(in_batch))
