"""How fast host memory reaches a device: one large host-to-device copy, timed (measure_link), and
with fit=True what a call, a row of a 2-D copy and a byte cost, from copies of several sizes and
row counts (LinkFit, fit_link; CopyCostModel.from_link makes the copy path's model of it), and how a
piece's rate rises with its size (PieceCurve, fit_piece_curve).

A runtime that keeps KV in host memory measures each device's link once at start, from the
storage its cache is delivered from (pageable, or pinned on CUDA); this is that measurement.
On a stand-in device it recovers the modelled link, or shows that the host cannot reach it.
"""

from __future__ import annotations

import builtins
import functools
import math
import time
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple, TypeVar

import numpy as np

from . import _checks
from ._binding import ffi, lib
from .backend import Backend, StandinBackend
from .cuda import CUDABackend, cuda_host_buffer_type
from .errors import FerryError, FreedBufferError, InvalidArgumentError, OutOfMemoryError, UnsupportedError

T = TypeVar("T")

#: measure_link's default copy: large enough that a call's own cost is lost in it on a GPU's
#: link (64 MiB is 2.7 ms at 24.5 GB/s), small enough for a stand-in's slow one (0.2 s at 0.33).
DEFAULT_NBYTES = 64 << 20


class LinkFit(NamedTuple):
    """A link's cost fitted to timed copies (fit_link): a copy of b bytes in r rows takes
    latency_us + r * row_ns + b / gbps, r counted only for a 2-D copy of more than one row (as
    the stand-in's link and ferry_copy_cost_model charge).

    Attributes
    ----------
    latency_us : float
        Microseconds a copy (a call), at least 0.
    row_ns : float
        Nanoseconds a row of a 2-D copy of more than one row, at least 0.
    gbps : float
        The bandwidth, in GB/s (1e9 bytes a second); inf when the bytes cost nothing measurable.
    points : tuple of (int, int, float)
        The copies fitted: (bytes, rows, seconds), rows 1 for a plain copy.
    """

    latency_us: float
    row_ns: float
    gbps: float
    points: Tuple[Tuple[int, int, float], ...]


def _relative_nonneg_lstsq(a: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The coefficients x >= 0 that best give t = a @ x, least squares on the relative error (each
    row's residual over its t); a figure the rows put below 0 is taken as 0 and the others fitted
    again without it (fit_link's, fit_piece_curve's and the remote tier's fits)."""
    weights = 1.0 / t
    free = list(range(a.shape[1]))
    coef = np.zeros(a.shape[1])
    while free:
        m = a[:, free] * weights[:, None]
        scale = np.linalg.norm(m, axis=0)  # columns of like size: a huge row count or size stays exact
        scale[scale == 0] = 1.0
        sol = np.linalg.lstsq(m / scale, t * weights, rcond=None)[0] / scale
        if (sol >= 0).all():
            coef[:] = 0
            coef[free] = sol
            break
        free.pop(int(np.argmin(sol)))  # the most negative figure is 0: fit the others again
    return coef


def fit_link(points: Sequence[Tuple[int, int, float]]) -> LinkFit:
    """The latency, row cost and bandwidth that best give some copies' times.

    Least squares on each copy's relative error (a small copy's microseconds count as much as a
    large one's milliseconds: the latency is read off the small ones), of seconds = latency +
    rows * row + bytes / bandwidth, rows counted only above 1. A figure the copies put below 0 is
    taken as 0 and the others fitted again without it.

    Parameters
    ----------
    points : sequence of (int, int, float)
        (bytes, rows, seconds) of each copy: plain copies (rows 1) of at least two sizes, and 2-D
        copies of more than one row at at least two row counts, seconds positive.

    Returns
    -------
    LinkFit

    Raises
    ------
    InvalidArgumentError
        For points that cannot tell the three apart, or a point that is not (bytes, rows, seconds).
    """
    pts: List[Tuple[int, int, float]] = []
    for i, p in enumerate(points):
        if isinstance(p, (str, bytes)) or not hasattr(p, "__len__") or len(p) != 3:
            raise InvalidArgumentError(f"fit_link: point {i} is not (bytes, rows, seconds): {p!r}")
        b = _checks.as_size(p[0], f"fit_link: point {i}'s bytes")
        r = _checks.as_size(p[1], f"fit_link: point {i}'s rows")
        sec = _checks.as_double(p[2], f"fit_link: point {i}'s seconds")
        if not (sec > 0 and math.isfinite(sec)) or r < 1:
            raise InvalidArgumentError(f"fit_link: point {i} has {r} rows and {sec!r} seconds; rows 1 or more, "
                                       "seconds positive")
        pts.append((b, r, sec))
    plain_sizes = {b for b, r, _ in pts if r == 1}
    row_counts = {r for _, r, _ in pts if r > 1}
    if len(plain_sizes) < 2 or len(row_counts) < 2:
        raise InvalidArgumentError(f"fit_link: {len(plain_sizes)} sizes of plain copies and {len(row_counts)} row "
                                   "counts of 2-D copies: at least 2 of each are needed to tell a call, a row and a "
                                   "byte apart")
    a = np.array([[1.0, float(r) if r > 1 else 0.0, float(b)] for b, r, _ in pts])
    coef = _relative_nonneg_lstsq(a, np.array([s for _, _, s in pts]))
    per_byte = float(coef[2])
    return LinkFit(latency_us=float(coef[0]) * 1e6, row_ns=float(coef[1]) * 1e9,
                   gbps=1.0 / per_byte / 1e9 if per_byte > 0 else math.inf, points=tuple(pts))


class PieceCurve(NamedTuple):
    """A link's piece curve fitted to timed copies of several sizes (fit_piece_curve): a copy of one
    piece of b bytes takes latency_us + b * (1 / gbps + (1 / floor_gbps - 1 / gbps) /
    (1 + (b / knee_bytes) ** steepness)), its rate rising from floor_gbps for small pieces to gbps,
    as a DMA engine's does (ferry_copy_piece_seconds; the stand-in's piece curve).

    Attributes
    ----------
    latency_us : float
        Microseconds a copy (a call), at least 0.
    gbps : float
        The rate large pieces reach, GB/s; inf when their bytes cost nothing measurable.
    floor_gbps : float
        The rate small pieces run at, GB/s; gbps when size does not change the rate.
    knee_bytes : float
        The size the rate rises around.
    steepness : float
        How sharply it rises there (1: gently; 40: a step).
    points : tuple of (int, float)
        The copies fitted: (bytes, seconds).
    """

    latency_us: float
    gbps: float
    floor_gbps: float
    knee_bytes: float
    steepness: float
    points: Tuple[Tuple[int, float], ...]

    def seconds(self, size: int) -> float:
        """The curve's time for a copy of one piece, latency included (its bytes as C computes them:
        ferry_copy_piece_seconds).

        Parameters
        ----------
        size : int
            The piece's bytes.

        Returns
        -------
        float
            Seconds.

        Raises
        ------
        InvalidArgumentError
            For a size that is not a size.
        """
        m = ffi.new("ferry_copy_cost_model *")
        m.gbps = min(self.gbps, 1e12)
        m.piece_floor_gbps = self.floor_gbps if self.floor_gbps < self.gbps else 0.0
        m.piece_knee_bytes, m.piece_steepness = self.knee_bytes, self.steepness
        piece = lib.ferry_copy_piece_seconds(m, _checks.as_size(size, "PieceCurve.seconds"))
        return self.latency_us * 1e-6 + float(piece)


#: fit_piece_curve's search: log2 of the knee from 256 B to 64 MiB and of the steepness from 1 to 128,
#: a grid of quarter steps, then twice a grid four times finer around the best point (a fixed search:
#: the same points give the same curve, call after call).
_KNEE_LOG2 = (8.0, 26.0)
_STEEP_LOG2 = (0.0, 7.0)
_GRID_STEP = 0.25
_REFINE = (1, 4)  # each round: steps either side, and how many times finer


def _curve_fit(sizes: np.ndarray, t: np.ndarray, knee: float, steep: float) -> Tuple[float, np.ndarray]:
    """The latency, 1/peak and (1/floor - 1/peak) that best give times t for this knee and steepness
    (relative least squares, figures below 0 taken as 0 and the rest fitted again), and the residual."""
    with np.errstate(over="ignore"):  # a piece far past the knee: its share of the floor is 0
        small = 1.0 / (1.0 + np.power(sizes / knee, steep))
    a = np.stack([np.ones_like(sizes), sizes, sizes * small], axis=1)
    coef = _relative_nonneg_lstsq(a, t)
    w = 1.0 / t
    resid = float(np.sum(((a @ coef) - t) ** 2 * w ** 2))
    return resid, coef


def fit_piece_curve(points: Sequence[Tuple[int, float]]) -> PieceCurve:
    """The latency and piece curve that best give some plain copies' times.

    For each knee and steepness of a fixed search (a log grid, refined twice around its best), the
    latency, peak and floor are a least-squares fit on each copy's relative error, as fit_link's;
    the best of all is taken, the first on a tie. The same points give the same curve every call.

    Parameters
    ----------
    points : sequence of (int, float)
        (bytes, seconds) of each copy: plain copies (one piece each) of at least 4 sizes, seconds
        positive.

    Returns
    -------
    PieceCurve

    Raises
    ------
    InvalidArgumentError
        For fewer than 4 sizes, or a point that is not (bytes, seconds) of a positive size and time.
    """
    pts: List[Tuple[int, float]] = []
    for i, p in enumerate(points):
        if isinstance(p, (str, bytes)) or not hasattr(p, "__len__") or len(p) != 2:
            raise InvalidArgumentError(f"fit_piece_curve: point {i} is not (bytes, seconds): {p!r}")
        b = _checks.as_size(p[0], f"fit_piece_curve: point {i}'s bytes")
        sec = _checks.as_double(p[1], f"fit_piece_curve: point {i}'s seconds")
        if not (sec > 0 and math.isfinite(sec)) or b < 1:
            raise InvalidArgumentError(f"fit_piece_curve: point {i} has {b} bytes and {sec!r} seconds; both must be "
                                       "positive")
        pts.append((b, sec))
    if len({b for b, _ in pts}) < 4:
        raise InvalidArgumentError(f"fit_piece_curve: {len({b for b, _ in pts})} sizes of copies: at least 4 are "
                                   "needed to tell a call, a floor, a peak and where the rate rises apart")
    sizes = np.array([float(b) for b, _ in pts])
    t = np.array([s for _, s in pts])
    best: Optional[Tuple[float, float, float, np.ndarray]] = None

    def search(knees: np.ndarray, steeps: np.ndarray) -> None:
        nonlocal best
        for lk in knees:
            for ls in steeps:
                resid, coef = _curve_fit(sizes, t, 2.0 ** lk, 2.0 ** ls)
                if best is None or resid < best[0]:
                    best = (resid, float(lk), float(ls), coef)

    step = _GRID_STEP
    search(np.arange(_KNEE_LOG2[0], _KNEE_LOG2[1] + step / 2, step),
           np.arange(_STEEP_LOG2[0], _STEEP_LOG2[1] + step / 2, step))
    for _ in range(2):
        assert best is not None
        around, finer = _REFINE
        fine = step / finer
        offsets = np.arange(-around * finer, around * finer + 1) * fine
        search(np.clip(best[1] + offsets, *_KNEE_LOG2), np.clip(best[2] + offsets, *_STEEP_LOG2))
        step = fine
    assert best is not None
    _, lk, ls, coef = best
    per_byte, extra = float(coef[1]), float(coef[2])
    gbps = 1.0 / per_byte / 1e9 if per_byte > 0 else math.inf
    floor = 1.0 / (per_byte + extra) / 1e9 if per_byte + extra > 0 else math.inf
    return PieceCurve(latency_us=float(coef[0]) * 1e6, gbps=gbps, floor_gbps=floor, knee_bytes=2.0 ** lk,
                      steepness=2.0 ** ls, points=tuple(pts))


class LinkMeasurement(NamedTuple):
    """What measure_link found.

    Attributes
    ----------
    gbps : float
        The fastest timed copy's rate, in GB/s (1e9 bytes a second).
    seconds : float
        The fastest timed copy's time, synchronize included.
    nbytes : int
        Bytes each copy moved.
    pinned : bool
        Whether the source was pinned host memory.
    device : str
        The backend's name.
    times : tuple of float
        Every timed copy's seconds, in order.
    modelled_gbps : float or None
        A stand-in device's modelled link; None for any other device or an unlimited link.
    reached : bool or None
        On a stand-in with a modelled link: whether the fastest copy kept to the model (the
        host copied at least as fast as the link); False says the link is beyond this host.
        None elsewhere.
    fit : LinkFit or None
        With measure_link's fit: the latency, row cost and bandwidth fitted to copies of several
        sizes and row counts (CopyCostModel.from_link takes them); None without.
    pieces : PieceCurve or None
        With measure_link's fit: the piece curve fitted to plain copies of PIECE_SIZES (those up
        to nbytes, at least 4 of them); None without, or with nbytes below the fourth.
    """

    gbps: float
    seconds: float
    nbytes: int
    pinned: bool
    device: str
    times: Tuple[float, ...]
    modelled_gbps: Optional[float] = None
    reached: Optional[bool] = None
    fit: Optional[LinkFit] = None
    pieces: Optional[PieceCurve] = None


def _allocated(alloc: Callable[[], T], n: int, where: str) -> T:
    """alloc()'s memory for the copy; a refusal (an OutOfMemoryError, a size the memory cannot have)
    names nbytes, and numpy's MemoryError becomes an OutOfMemoryError."""
    try:
        return alloc()
    except FreedBufferError:
        raise
    except FerryError as e:
        raise builtins.type(e)(f"measure_link: nbytes {n}: {where}: {e.message}") from None
    except MemoryError:
        raise OutOfMemoryError(f"measure_link: nbytes {n}: {where} cannot hold {n} bytes") from None


def _fastest(dev: Backend, copy: Callable[[], None], reps: int) -> float:
    """A warm-up of copy, then the fastest of reps, each synchronize included."""
    copy()
    dev.synchronize()
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        copy()
        dev.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


#: The copies fit=True times besides the large one: plain copies of nbytes / 256 and nbytes / 16,
#: and 2-D copies of nbytes / 16 in 16, 256 and 2048 rows (every other row of the device's buffer).
FIT_PLAIN_PARTS = (256, 16)
FIT_ROWS = (16, 256, 2048)


#: The plain copies fit=True times for the piece curve: the sizes where DMA engines' rates rise (4 to
#: 32 KiB on an H100) and a few past them, those up to nbytes.
PIECE_SIZES = (1 << 10, 4 << 10, 8 << 10, 16 << 10, 24 << 10, 28 << 10, 32 << 10, 64 << 10, 256 << 10, 1 << 20,
               4 << 20)


def _piece_points(dev: Backend, dst: Any, src: Any, n: int, reps: int) -> List[Tuple[int, float]]:
    """(bytes, fastest seconds) of plain copies of each of PIECE_SIZES up to n."""
    src = src.view(np.uint8)
    return [(size, _fastest(dev, functools.partial(dev.set_async, dst, src[:size]), reps))
            for size in PIECE_SIZES if size <= n]


def _fit_points(dev: Backend, dst: Any, src: Any, n: int, reps: int, largest: float) -> List[Tuple[int, int, float]]:
    """(bytes, rows, fastest seconds) of fit=True's copies, and the large copy's (largest)."""
    src = src.view(np.uint8)  # sliced by bytes, pinned or not
    points = [(n, 1, largest)]
    for part in FIT_PLAIN_PARTS:
        size = max(4, n // part // 4 * 4)
        points.append((size, 1, _fastest(dev, functools.partial(dev.set_async, dst, src[:size]), reps)))
    total = n // 16
    for rows in FIT_ROWS:
        width = total // rows
        copy = functools.partial(dev.set_2d_async, dst, src[:width * rows], 0, width, rows, 2 * width, width)
        points.append((width * rows, rows, _fastest(dev, copy, reps)))
    return points


def measure_link(device: Backend, pinned: bool = False, nbytes: int = DEFAULT_NBYTES,
                 repeats: int = 5, fit: bool = False) -> LinkMeasurement:
    """Time one large host-to-device copy: a warm-up, then the fastest of `repeats`; with fit,
    also smaller copies and 2-D copies of several row counts, and the link's cost fitted to them.

    Each copy is Backend.set_async of nbytes into a buffer of the device, then synchronize().
    The source is pageable host memory (a numpy array), or with pinned pinned host memory
    (cudaMallocHost), which only a CUDA device has. With fit, the same is timed (a warm-up, then
    the fastest of `repeats`) for plain copies of nbytes / 256 and nbytes / 16 bytes and for
    Backend.set_2d_async of nbytes / 16 bytes in 16, 256 and 2048 rows (each row followed by a gap
    in the device's buffer), and fit_link fits latency, row cost and bandwidth to them all; and
    plain copies of each of PIECE_SIZES up to nbytes, to which fit_piece_curve fits the piece curve
    (a piece's rate by its size, as a DMA engine's: the pieces of measure_link's result).

    Parameters
    ----------
    device : Backend
        The device whose link is measured (CUDABackend, StandinBackend, ...).
    pinned : bool, optional
        Copy from pinned host memory (CUDA only).
    nbytes : int, optional
        Bytes per copy, at least 4 (rounded down to a multiple of 4).
    repeats : int, optional
        Timed copies after the warm-up, at least 1.
    fit : bool, optional
        Also time the copies of several sizes and row counts and fit the link's cost (the
        LinkMeasurement's fit); nbytes must then be at least 8192, so that every 2-D row holds a
        value.

    Returns
    -------
    LinkMeasurement

    Raises
    ------
    InvalidArgumentError
        For a device that is not a Backend, or nbytes, repeats or fit out of range or of the wrong
        kind (naming it).
    UnsupportedError
        For pinned on a device that is not CUDA's.
    OutOfMemoryError
        When the device, or the host, cannot hold the copy (naming nbytes).
    FreedBufferError
        For a closed device.
    """
    dev = _checks.instance(device, Backend, "measure_link: device")
    want_pinned = _checks.as_bool(pinned, "measure_link: pinned")
    n = _checks.as_size(nbytes, "measure_link: nbytes") // 4 * 4
    reps = _checks.as_int(repeats, "measure_link: repeats")
    want_fit = _checks.as_bool(fit, "measure_link: fit")
    if n < 4:
        raise InvalidArgumentError(f"measure_link: nbytes {nbytes} is less than 4")
    if want_fit and n < 16 * max(FIT_ROWS) // 4:
        raise InvalidArgumentError(f"measure_link: nbytes {nbytes} is less than {16 * max(FIT_ROWS) // 4}, too few "
                                   f"for fit's 2-D copies of nbytes / 16 in {max(FIT_ROWS)} rows")
    if reps < 1:
        raise InvalidArgumentError(f"measure_link: repeats {repeats} is less than 1")
    if want_pinned and not isinstance(dev, CUDABackend):
        raise UnsupportedError(f"measure_link: pinned host memory is CUDA's, and {dev.name} is not a CUDA device")
    standin = dev if isinstance(dev, StandinBackend) else None
    modelled = standin.link_gbps if standin is not None else None
    watched = standin is not None and (modelled is not None or standin.latency_us > 0)

    dst_buf = _allocated(lambda: dev.alloc_buffer(n), n, f"{dev.name}'s memory")
    src_buf = None
    try:
        dst = dst_buf.new_tensor("f32", [n // 4])
        src: Any
        if want_pinned:
            src_buf = _allocated(lambda: cuda_host_buffer_type().alloc_buffer(n), n, "pinned host memory")
            src = np.asarray(src_buf.new_tensor("f32", [n // 4]).raw())
            src[:] = 1  # every page touched before the timing
        else:
            src = _allocated(lambda: np.ones(n, dtype=np.uint8), n, "host memory")
        dev.set_async(dst, src)  # warm-up: the device's pages, the first call's setup
        dev.synchronize()
        times = []
        on_model = []
        for _ in range(reps):
            if standin is not None:
                standin.reset_link_stats()
            t0 = time.perf_counter()
            dev.set_async(dst, src)
            dev.synchronize()
            times.append(time.perf_counter() - t0)
            if standin is not None:
                on_model.append(standin.link_stats.reached)
        points = _fit_points(dev, dst, src, n, reps, min(times)) if want_fit else None
        pieces = _piece_points(dev, dst, src, n, reps) if want_fit else []
    finally:
        dst_buf.close()
        if src_buf is not None:
            src_buf.close()
    best = min(range(reps), key=lambda i: times[i])
    return LinkMeasurement(
        gbps=n / times[best] / 1e9 if times[best] > 0 else math.inf, seconds=times[best], nbytes=n,
        pinned=want_pinned, device=dev.name,
        times=tuple(times), modelled_gbps=modelled, reached=on_model[best] if watched else None,
        fit=fit_link(points) if points is not None else None,
        pieces=fit_piece_curve(pieces) if len(pieces) >= 4 else None)
