"""Ownership of C objects: each is freed exactly once, and never before what depends on it.

A Python object (Tensor, Buffer, Backend) owns a Handle and releases it from a
weakref.finalize (or an explicit close()). A handle with a parent (a buffer's backend,
a view's source context) keeps the parent's C object alive until the child is freed;
a handle may have several parents (an op's result needs both operands, a scheduler
every backend it was given).
Python references already keep parents alive in normal use; this also holds when the
garbage collector finalizes a whole reference cycle in arbitrary order.

Closeable is the one lifetime API of every object that owns memory or a device resource
(Backend, Buffer, KVCache, Scheduler, GraphAllocator, Event): close(), closed, and `with`.
close() releases the object's handle at once, without waiting for the collector: the C
object is freed then, or, when objects made from it still hold it (a backend's buffers and
events, a cache's window views), as soon as the last of those is freed. The closed object
refuses every use with FreedBufferError naming it; what was made from it before keeps
working until it is closed or dropped in turn.

A call into C that may run while another thread closes the object (a scheduler's run, a
transfer) holds its handles for the call (Hold, holding): a close() meanwhile is done at
once for Python, and frees the C object when the call returns, never under it.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any, Callable, Iterable, Optional, Sequence, Set, Tuple, Type, TypeVar, Union

from .errors import FreedBufferError

_lock = threading.RLock()  # finalizers may run on any thread


class Handle:
    """One C pointer, its free function, and the count of child handles that need it."""

    __slots__ = ("ptr", "_free", "_parents", "_children", "_released", "__weakref__")

    def __init__(self, ptr: Any, free: Callable[[Any], None],
                 parent: Union["Handle", Sequence[Optional["Handle"]], None] = None) -> None:
        self.ptr = ptr
        self._free = free
        if parent is None:
            parents: Tuple["Handle", ...] = ()
        elif isinstance(parent, Handle):
            parents = (parent,)
        elif len(parent) == 1:
            parents = (parent[0],) if parent[0] is not None else ()
        else:
            parents = tuple(dict.fromkeys(p for p in parent if p is not None))  # each parent counted once
        self._parents = parents
        self._children = 0
        self._released = False
        if parents:
            with _lock:
                for p in parents:
                    p._children += 1

    def add_parent(self, parent: "Handle") -> None:
        """Need parent from now on too (a C object that took a pointer to the parent's), once."""
        with _lock:
            if parent is self or parent in self._parents:
                return
            parent._children += 1
            self._parents = self._parents + (parent,)

    @property
    def alive(self) -> bool:
        """True until the owner released it (the C object may outlive that for its children)."""
        return not self._released

    def release(self) -> None:
        """The owner is done with it; free the C object now or when the last child goes. Idempotent."""
        with _lock:
            if self._released:
                return
            self._released = True
            self._maybe_free()

    def _maybe_free(self) -> None:
        if not self._released or self._children or self.ptr is None:
            return
        ptr, self.ptr = self.ptr, None
        self._free(ptr)
        parents, self._parents = self._parents, ()
        for parent in parents:
            parent._children -= 1
            parent._maybe_free()


class Hold:
    """Handles kept from being freed while this thread is inside C with them: a release() meanwhile
    (a close() on another thread) frees each only at the hold's end. Take it before the liveness
    check (Closeable._live) that gives C the pointer, and use it as a `with` block around the call.
    A handle already freed is not held: that check then refuses the object.
    """

    __slots__ = ("_handles",)

    def __init__(self, handles: Iterable[Optional[Handle]]) -> None:
        with _lock:
            held = tuple(h for h in dict.fromkeys(handles) if h is not None and h.ptr is not None)
            for h in held:
                h._children += 1  # counted as a child is: the C object waits for it
        self._handles = held

    def __enter__(self) -> "Hold":
        return self

    def __exit__(self, *exc: object) -> None:
        with _lock:
            held, self._handles = self._handles, ()
            for h in held:
                h._children -= 1
                h._maybe_free()


_F = TypeVar("_F", bound=Callable[..., Any])


def holding(method: _F) -> _F:
    """A Closeable's method that calls into C, run holding the object's handle (Hold): closed from
    another thread meanwhile, the C object is freed once the method returns, not under it."""
    @functools.wraps(method)
    def held(self: "Closeable", *args: Any, **kwargs: Any) -> Any:
        with Hold((self._handle,)):
            return method(self, *args, **kwargs)
    return held  # type: ignore[return-value]


_C = TypeVar("_C", bound="Closeable")


class Closeable:
    """close(), closed and `with` over a Handle released by a weakref.finalize.

    A subclass sets self._handle and self._finalizer (a weakref.finalize that releases the
    handle, and may wait for queued work first) in its constructor, and may override
    _after_close (drop Python references to what C just freed) and _describe (how messages
    name the object).
    """

    _handle: Handle
    _finalizer: Optional[weakref.finalize]

    def close(self) -> None:
        """Free the C object now (or when the last object made from it goes). A second call does nothing."""
        if self._finalizer is not None:
            self._finalizer()
        self._after_close()

    def _after_close(self) -> None:
        """Called by every close(); drops what the subclass keeps of the freed C object."""

    @property
    def closed(self) -> bool:
        """True once close() ran (or the object was finalized)."""
        return not self._handle.alive

    def _describe(self) -> str:
        """The object as FreedBufferError's message names it."""
        return type(self).__name__

    def _live(self) -> Any:
        """The C pointer; FreedBufferError once closed (C must never see a freed pointer)."""
        ptr = self._handle.ptr if self._handle.alive else None
        if ptr is None:
            raise FreedBufferError(f"{self._describe()} was closed")
        return ptr

    @property
    def _p(self) -> Any:
        """The C pointer every call takes: _live()."""
        return self._live()

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Any) -> None:
        self.close()


#: The weak references of release_when_collected, kept alive until their objects go.
_tracked: Set["weakref.ref[Any]"] = set()


def release_when_collected(obj: object, handle: Handle) -> "weakref.ref[Any]":
    """Release handle when obj is collected (a cycle included): weakref.finalize's job, at a
    fifth of its cost, for objects made by the hundred per decode step (tensors). Unlike
    weakref.finalize it does not run at interpreter exit, when the process frees everything.

    Returns
    -------
    weakref.ref
        The reference whose callback releases the handle (obj is not None while it lives).
    """
    def release(ref: "weakref.ref[Any]") -> None:
        _tracked.discard(ref)
        handle.release()

    ref = weakref.ref(obj, release)
    _tracked.add(ref)
    return ref
