"""Events: points in a backend's queued work that order work between backends and time it.

Events are generic (lib/src/event.c): any backend that can make them does (CUDA's are CUDA
events); one that cannot raises UnsupportedError. This module sits below backend.py, which
makes events (Backend.event), so it checks the backends it is given by the C object they
wrap rather than by their class.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Optional

from . import _checks
from ._binding import ffi, lib
from ._handle import Closeable, Handle, Hold, holding
from .errors import InvalidArgumentError, check

if TYPE_CHECKING:
    from .backend import Backend


class Event(Closeable):
    """A point in a backend's queued work. Make one with backend.event(timing=False).

    It belongs to (and keeps alive) the backend that made it; a backend that cannot make
    events raises UnsupportedError. close() (or the end of a `with` block) frees
    it now; after that every use raises FreedBufferError.

    Parameters
    ----------
    backend : Backend
        The backend it belongs to (kept alive by the event).
    timing : bool, optional
        Whether elapsed_ms can time it.

    Raises
    ------
    InvalidArgumentError
        For anything but a Backend, or a timing that is not a bool.
    UnsupportedError
        For a backend that cannot make events.
    """

    def __init__(self, backend: "Backend", timing: bool = False) -> None:
        _checks.c_object(backend, "ferry_backend *", "a Backend", "Event")
        timing = _checks.as_bool(timing, "Event: timing")
        out = ffi.new("ferry_event **")
        flags = lib.FERRY_EVENT_TIMING if timing else 0
        check(lib.ferry_event_new(backend._p, flags, out))
        self._backend = backend
        self.timing = bool(timing)
        self._handle = Handle(out[0], lib.ferry_event_free, backend._handle)
        self._finalizer = weakref.finalize(self, self._handle.release)

    def _describe(self) -> str:
        return f"Event of {self._backend._describe()}"

    @property
    def backend(self) -> "Backend":
        """The backend the event belongs to."""
        return self._backend

    def record(self, backend: Optional["Backend"] = None) -> "Event":
        """Mark the current end of a backend's queued work.

        Parameters
        ----------
        backend : Backend, optional
            Default: the event's own backend.

        Returns
        -------
        Event
            self.
        """
        b = _checks.c_object(self._backend if backend is None else backend, "ferry_backend *", "a Backend",
                             "event record")
        with Hold((self._handle, b._handle)):
            check(lib.ferry_event_record(self._p, b._p))
        return self

    def wait(self, backend: "Backend") -> None:
        """Make the Backend backend's later work wait for this event (on the device where it can)."""
        _checks.c_object(backend, "ferry_backend *", "a Backend", "event wait")
        with Hold((self._handle, backend._handle)):
            check(lib.ferry_event_wait(backend._p, self._p))

    @holding
    def synchronize(self) -> None:
        """Block until the work before the event is done."""
        check(lib.ferry_event_synchronize(self._p))

    @staticmethod
    def elapsed_ms(start: "Event", end: "Event") -> float:
        """Milliseconds between two recorded timing events.

        Parameters
        ----------
        start, end : Event
            Both made with timing=True and recorded.

        Returns
        -------
        float

        Raises
        ------
        InvalidArgumentError
            For anything but Events.
        FerryError
            For events that were not made for timing or not recorded.
        """
        for name, e in (("start", start), ("end", end)):
            if not isinstance(e, Event):
                raise InvalidArgumentError(f"elapsed_ms: {name} is not an Event but {type(e).__name__}")
        out = ffi.new("float *")
        check(lib.ferry_event_elapsed_ms(start._p, end._p, out))
        return float(out[0])

    def __repr__(self) -> str:
        if self.closed or self._backend.closed:
            return f"<{self._describe()}{' closed' if self.closed else ''}>"
        return f"<Event of {self._backend.name}{' timing' if self.timing else ''}>"
