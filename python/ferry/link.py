"""How fast host memory reaches a device: one large host-to-device copy, timed (measure_link), and
with fit=True what a call, a row of a 2-D copy and a byte cost, from copies of several sizes and
row counts (LinkFit, fit_link; CopyCostModel.from_link makes the copy path's model of it).

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
    t = np.array([s for _, _, s in pts])
    weights = 1.0 / t
    free = [0, 1, 2]
    coef = np.zeros(3)
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
    per_byte = float(coef[2])
    return LinkFit(latency_us=float(coef[0]) * 1e6, row_ns=float(coef[1]) * 1e9,
                   gbps=1.0 / per_byte / 1e9 if per_byte > 0 else math.inf, points=tuple(pts))


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
    in the device's buffer), and fit_link fits latency, row cost and bandwidth to them all.

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
    finally:
        dst_buf.close()
        if src_buf is not None:
            src_buf.close()
    best = min(range(reps), key=lambda i: times[i])
    return LinkMeasurement(
        gbps=n / times[best] / 1e9 if times[best] > 0 else math.inf, seconds=times[best], nbytes=n,
        pinned=want_pinned, device=dev.name,
        times=tuple(times), modelled_gbps=modelled, reached=on_model[best] if watched else None,
        fit=fit_link(points) if points is not None else None)
