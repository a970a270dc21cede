"""Ownership of C objects: each is freed exactly once, and never before what depends on it.

A Python object (Tensor, Buffer, Backend) owns a Handle and releases it from a
weakref.finalize (or an explicit free()). A handle with a parent (a buffer's backend,
a view's source context) keeps the parent's C object alive until the child is freed;
a handle may have several parents (an op's result needs both operands, a scheduler
every backend it was given).
Python references already keep parents alive in normal use; this also holds when the
garbage collector finalizes a whole reference cycle in arbitrary order.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Sequence, Tuple, Union

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
        else:
            parents = tuple(dict.fromkeys(p for p in parent if p is not None))  # each parent counted once
        self._parents = parents
        self._children = 0
        self._released = False
        with _lock:
            for p in parents:
                p._children += 1

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
