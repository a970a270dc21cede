"""The CUDA backend, its buffer types, and events that order work between backends.

Declared in every build: without CUDA compiled in, constructors raise UnsupportedError
("built without CUDA"); with CUDA but no usable device they raise BackendError with
CUDA's message. cuda_device_count() is 0 then, never an error.
"""

from __future__ import annotations

import weakref
from typing import Any, Optional

from . import _args
from ._binding import ffi, lib
from ._handle import Handle
from .backend import Backend
from .buffer import BufferType
from .errors import FerryError, InvalidArgumentError, check


def cuda_available() -> bool:
    """True if CUDA was compiled in and a device is usable now."""
    return bool(lib.ferry_cuda_available())


def cuda_device_count() -> int:
    """CUDA devices ferry can use (0 when there is none, no driver, or no CUDA in this build)."""
    out = ffi.new("int *")
    check(lib.ferry_cuda_device_count(out))
    return int(out[0])


def cuda_buffer_type(device: int = 0) -> BufferType:
    """Device memory (cudaMalloc) of a device; one per device, never freed."""
    out = ffi.new("ferry_buffer_type **")
    check(lib.ferry_cuda_buffer_type(_args.as_c_int(device, "cuda_buffer_type: device"), out))
    return BufferType(out[0])


def cuda_host_buffer_type() -> BufferType:
    """Pinned host memory (cudaMallocHost): host memory, so the CPU backend uses it too."""
    out = ffi.new("ferry_buffer_type **")
    check(lib.ferry_cuda_host_buffer_type(out))
    return BufferType(out[0])


class CUDABackend(Backend):
    """A backend with its own stream on a CUDA device."""

    def __init__(self, device: int = 0) -> None:
        out = ffi.new("ferry_backend **")
        check(lib.ferry_cuda_backend_new(_args.as_c_int(device, "CUDABackend: device"), out))
        super().__init__(out[0])

    @property
    def name(self) -> str:
        """CUDA<device>; a build against the test-only fake runtime says so, so that no figure
        from it passes for a GPU's."""
        base = super().name
        return base + " (fake CUDA runtime: host memory, timings mean nothing)" if lib.ferry_built_with_fake_cudart() \
            else base

    @property
    def device(self) -> int:
        out = ffi.new("int *")
        check(lib.ferry_cuda_backend_device(self._p, out))
        return int(out[0])

    def hold(self, microseconds: float) -> None:
        """Queue a wait of `microseconds` (0 to 1e6) on the device, at the end of the stream.

        A timing aid: work queued while the stream is held starts back to back, so events
        recorded around it time the device alone, not the host's submission of the work.
        """
        if isinstance(microseconds, bool) or not isinstance(microseconds, (int, float)):
            raise InvalidArgumentError(f"hold: microseconds must be a number, got {type(microseconds).__name__}")
        check(lib.ferry_cuda_backend_hold(self._p, float(microseconds)))


class Event:
    """A point in a backend's queued work. Make one with backend.event(timing=False).

    It belongs to (and keeps alive) the backend that made it; a backend that cannot make
    events raises UnsupportedError.
    """

    def __init__(self, backend: Backend, timing: bool = False) -> None:
        if not isinstance(backend, Backend):
            raise InvalidArgumentError(f"Event: expected a Backend, got {type(backend).__name__}")
        timing = _args.as_bool(timing, "Event: timing")
        out = ffi.new("ferry_event **")
        flags = lib.FERRY_EVENT_TIMING if timing else 0
        check(lib.ferry_event_new(backend._p, flags, out))
        self._backend = backend
        self.timing = bool(timing)
        self._handle = Handle(out[0], lib.ferry_event_free, backend._handle)
        self._finalizer = weakref.finalize(self, self._handle.release)

    @property
    def _p(self) -> Any:
        if not self._handle.alive:
            raise FerryError("event used after it was freed")
        return self._handle.ptr

    @property
    def backend(self) -> Backend:
        return self._backend

    def free(self) -> None:
        """Free it now. A second call does nothing."""
        self._finalizer()

    def record(self, backend: Optional[Backend] = None) -> "Event":
        """Mark the current end of backend's queued work (default: the event's own backend). Returns self."""
        b = self._backend if backend is None else backend
        if not isinstance(b, Backend):
            raise InvalidArgumentError(f"event record: expected a Backend, got {type(b).__name__}")
        check(lib.ferry_event_record(self._p, b._p))
        return self

    def wait(self, backend: Backend) -> None:
        """Make backend's later work wait for this event (on the device where it can)."""
        if not isinstance(backend, Backend):
            raise InvalidArgumentError(f"event wait: expected a Backend, got {type(backend).__name__}")
        check(lib.ferry_event_wait(backend._p, self._p))

    def synchronize(self) -> None:
        """Block until the work before the event is done."""
        check(lib.ferry_event_synchronize(self._p))

    @staticmethod
    def elapsed_ms(start: "Event", end: "Event") -> float:
        """Milliseconds between two recorded timing events."""
        for name, e in (("start", start), ("end", end)):
            if not isinstance(e, Event):
                raise InvalidArgumentError(f"elapsed_ms: {name} is not an Event but {type(e).__name__}")
        out = ffi.new("float *")
        check(lib.ferry_event_elapsed_ms(start._p, end._p, out))
        return float(out[0])

    def __repr__(self) -> str:
        return f"<Event of {self._backend.name}{' timing' if self.timing else ''}>"
