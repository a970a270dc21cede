"""How fast host memory reaches a device: one large host-to-device copy, timed (measure_link).

A runtime that keeps KV in host memory measures each device's link once at start, from the
storage its cache is delivered from (pageable, or pinned on CUDA); this is that measurement.
On a stand-in device it recovers the modelled link, or shows that the host cannot reach it.
"""

from __future__ import annotations

import builtins
import math
import time
from typing import Any, Callable, NamedTuple, Optional, Tuple, TypeVar

import numpy as np

from . import _checks
from .backend import Backend, StandinBackend
from .cuda import CUDABackend, cuda_host_buffer_type
from .errors import FerryError, FreedBufferError, InvalidArgumentError, OutOfMemoryError, UnsupportedError

T = TypeVar("T")

#: measure_link's default copy: large enough that a call's own cost is lost in it on a GPU's
#: link (64 MiB is 2.7 ms at 24.5 GB/s), small enough for a stand-in's slow one (0.2 s at 0.33).
DEFAULT_NBYTES = 64 << 20


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
    """

    gbps: float
    seconds: float
    nbytes: int
    pinned: bool
    device: str
    times: Tuple[float, ...]
    modelled_gbps: Optional[float] = None
    reached: Optional[bool] = None


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


def measure_link(device: Backend, pinned: bool = False, nbytes: int = DEFAULT_NBYTES,
                 repeats: int = 5) -> LinkMeasurement:
    """Time one large host-to-device copy: a warm-up, then the fastest of `repeats`.

    Each copy is Backend.set_async of nbytes into a buffer of the device, then synchronize().
    The source is pageable host memory (a numpy array), or with pinned pinned host memory
    (cudaMallocHost), which only a CUDA device has.

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

    Returns
    -------
    LinkMeasurement

    Raises
    ------
    InvalidArgumentError
        For a device that is not a Backend, or nbytes or repeats out of range (naming it).
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
    if n < 4:
        raise InvalidArgumentError(f"measure_link: nbytes {nbytes} is less than 4")
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
    finally:
        dst_buf.close()
        if src_buf is not None:
            src_buf.close()
    best = min(range(reps), key=lambda i: times[i])
    return LinkMeasurement(
        gbps=n / times[best] / 1e9 if times[best] > 0 else math.inf, seconds=times[best], nbytes=n,
        pinned=want_pinned, device=dev.name,
        times=tuple(times), modelled_gbps=modelled, reached=on_model[best] if watched else None)
