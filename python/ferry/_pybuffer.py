"""Python byte containers as C pointers, with their lengths checked.

C cannot know how long a foreign pointer's memory is, so every transfer checks here
that the Python object holds what C will read or write.

The pointer is cffi's export of a memoryview, and it is given back (release(), or the
with-block's end) as soon as C is done with it: after a blocking call, failed or not, and
for async transfers at synchronize. An export left alive must never reach the cyclic
garbage collector: a failed call's traceback kept in a reference cycle (a frame holding its
own exception) would take it there, and the collector clears a memoryview while cffi still
holds it, which crashes the interpreter.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Union

import numpy as np

from ._binding import ffi, lib
from .errors import InvalidArgumentError, OutOfBoundsError, OutOfMemoryError

BytesLike = Union[bytes, bytearray, memoryview, np.ndarray]


class CData:
    """A contiguous view of a Python object as char*, and its size in bytes.

    Holds the Python object (and cffi's view of it) so it lives until release(); use it as a
    context manager around a blocking call.
    """

    __slots__ = ("obj", "ptr", "nbytes")

    def __init__(self, obj: memoryview, ptr: Any, nbytes: int) -> None:
        self.obj = obj
        self.ptr = ptr
        self.nbytes = nbytes

    def release(self) -> None:
        """Give back cffi's export and the memoryview; ptr is unusable after. Idempotent."""
        if self.ptr is not None:
            ffi.release(self.ptr)
            self.ptr = None
            self.obj.release()

    def __enter__(self) -> "CData":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def need(self, nbytes: int, what: str) -> None:
        """Raise OutOfBoundsError unless this holds at least nbytes."""
        if nbytes > self.nbytes:
            raise OutOfBoundsError(f"{what}: the data holds {self.nbytes} bytes but the transfer needs {nbytes}")


def _memoryview(data: Any, what: str) -> memoryview:
    if isinstance(data, str):
        raise InvalidArgumentError(f"{what}: expected bytes-like data or a numpy array, got str")
    if isinstance(data, np.ndarray) and data.dtype.kind == "V" and data.dtype.fields is None \
            and data.dtype.itemsize in (1, 2, 4, 8):
        data = data.view(f"u{data.dtype.itemsize}")  # ml_dtypes' bfloat16: no buffer format of its own
    try:
        return memoryview(data)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"{what}: expected bytes-like data or a numpy array ({e})") from None


def readable(data: Any, what: str) -> CData:
    """Data C will read: any buffer-protocol object; a non-contiguous one is copied in C order."""
    mv = _memoryview(data, what)
    if not mv.c_contiguous:
        mv = memoryview(mv.tobytes())
    mv = mv.cast("B") if mv.nbytes else memoryview(b"")
    return CData(mv, ffi.from_buffer(mv), mv.nbytes)


def writable(out: Any, what: str) -> CData:
    """Memory C will write into: a writable, C-contiguous buffer-protocol object."""
    mv = _memoryview(out, what)
    if mv.readonly:
        raise InvalidArgumentError(f"{what}: the output buffer is read-only")
    if not mv.c_contiguous:
        raise InvalidArgumentError(f"{what}: the output buffer is not contiguous")
    mv = mv.cast("B") if mv.nbytes else memoryview(bytearray())
    return CData(mv, ffi.from_buffer(mv, require_writable=True), mv.nbytes)


# Results up to this size are not checked against the memory there is (reading /proc costs
# more than making them).
_UNCHECKED_RESULT_BYTES = 64 << 20


def memory_available() -> int:
    """Bytes of memory this process could still take: the system's available memory and swap
    (/proc/meminfo's MemAvailable and SwapFree; where there is none, the physical memory), within
    what the process's address-space limit (RLIMIT_AS) leaves, when it has one."""
    avail = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        avail = (int(fields["MemAvailable"].split()[0]) + int(fields.get("SwapFree", "0 kB").split()[0])) * 1024
    except (OSError, KeyError, ValueError):
        try:
            avail = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            avail = sys.maxsize  # nothing to go by: the allocation's own MemoryError
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            with open("/proc/self/statm", encoding="ascii") as f:
                used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            avail = min(avail, max(soft - used, 0))
    except (ImportError, OSError, ValueError):
        pass
    return avail


def new_bytes(n: int, what: str, copies: int = 1, remedy: str = "ask for fewer bytes") -> bytearray:
    """n zeroed bytes for C to read into.

    Parameters
    ----------
    n : int
        Bytes.
    what : str
        The request, as a refusal names it (its function and what made n so large).
    copies : int, optional
        How many copies of n bytes the caller holds at once (2 where it returns bytes made from them).
    remedy : str, optional
        What the caller can change, ending the refusal.

    Raises
    ------
    OutOfMemoryError
        (not MemoryError or OverflowError, nor the kernel's OOM killer after zero-filling them)
        when the copies are more than the memory available (memory_available), or Python cannot
        allocate them.
    """
    if n * copies > _UNCHECKED_RESULT_BYTES:
        avail = memory_available()
        if n * copies > avail:
            held = f", held {copies} times while it is made ({n * copies} bytes)," if copies > 1 else ""
            raise OutOfMemoryError(f"{what}: a result of {n} bytes{held} is more than the {avail} bytes of memory "
                                   f"available; {remedy}")
    try:
        return bytearray(n)
    except (MemoryError, OverflowError):
        raise OutOfMemoryError(f"{what}: cannot allocate {n} bytes to read into") from None


def extent_2d(size: int, n_copies: int, stride: int, what: str = "2-D transfer") -> int:
    """Bytes of data n_copies rows of size bytes at a stride span (ferry_rows_extent): what a
    2-D transfer reads or writes on the data side.

    Raises
    ------
    OutOfBoundsError
        When that is more than a 64-bit size.
    """
    out = ffi.new("size_t *")
    if not lib.ferry_rows_extent(size, n_copies, stride, out):
        raise OutOfBoundsError(f"{what}: {n_copies} rows of {size} bytes at a stride of {stride} span more "
                               "than a 64-bit size")
    return int(out[0])
