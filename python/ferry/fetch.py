"""A remote tier's stage of the scheduler's copy path, for a transport written in Python.

set_fetch(tensor, fetcher) marks a host tensor whose memory is a local copy of bytes held
elsewhere (ferry_tensor_set_fetch): each Scheduler run whose input window reads it calls
fetcher.begin(window, policy) for the bytes a copy of that window reads, then fetcher.wait(ticket)
before the copy. With Scheduler.prefetch n, the begins run n + 1 parts ahead, so that a pull
travels under compute. ferry.remote.RemoteTier.fetch_layers is such a fetcher, over Mooncake's
transfer engine.

An exception a fetcher raises fails the run: Scheduler.compute raises that exception itself (it
names what the transport knows: the peer, the layer), once every fetch begun was waited for.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Optional, Protocol

from . import _checks
from ._binding import ffi, lib
from ._handle import Handle
from .errors import InvalidArgumentError, check
from .policy import CopyPolicy
from .tensor import Tensor


class Fetcher(Protocol):
    """A transport that brings a window's bytes into its tensor's host memory."""

    def begin(self, window: Tensor, policy: CopyPolicy) -> int:
        """Start bringing in the bytes a copy of window under policy reads, each at its own offset
        in the window's root tensor; return a ticket (an int from 0 to 2**64 - 1) for wait. The
        window is valid only during this call."""

    def wait(self, ticket: int) -> None:
        """Return once the fetch begun with ticket has landed; raise if it failed."""


#: Per thread: the first exception a fetcher raised in the run under way (the scheduler waits for
#: the other fetches after it, which may raise again).
_failed = threading.local()

#: By the tensor's C struct: what keeps its fetch's callbacks alive while C holds them.
_installed: Dict[int, Any] = {}


def _fail(exc: BaseException) -> int:
    if getattr(_failed, "error", None) is None:
        _failed.error = exc
    return int(lib.FERRY_ERR_BACKEND)


def take_error() -> Optional[BaseException]:
    """The exception a fetcher raised in this thread's last run, once (None if none)."""
    err = getattr(_failed, "error", None)
    _failed.error = None
    return err


class _Installed:
    """A fetcher's ferry_fetch struct and the callbacks in it."""

    def __init__(self, tensor: Tensor, fetcher: Fetcher) -> None:
        self.fetcher = fetcher
        self.tensor = tensor
        self.begin = ffi.callback("ferry_status(void *, const ferry_tensor *, ferry_copy_policy, uint64_t *)",
                                  self._begin)
        self.wait = ffi.callback("ferry_status(void *, uint64_t)", self._wait)
        self.struct = ffi.new("ferry_fetch *", {"begin": self.begin, "wait": self.wait, "ctx": ffi.NULL})

    def _begin(self, ctx: Any, window: Any, policy: int, ticket: Any) -> int:
        try:
            handle = Handle(window, lambda _: None)  # the window is the scheduler's: usable for this call only
            try:
                root = Tensor._borrow(window.view_src, handle, keep=self) if window.view_src != ffi.NULL else None
                got = self.fetcher.begin(Tensor._borrow(window, handle, keep=self, source=root), CopyPolicy(policy))
            finally:
                handle.release()
            ticket[0] = _checks.as_size(got, "fetcher.begin's ticket")
            return int(lib.FERRY_OK)
        except BaseException as e:  # an exception may not cross C: the run fails with it
            return _fail(e)

    def _wait(self, ctx: Any, ticket: int) -> int:
        try:
            self.fetcher.wait(int(ticket))
            return int(lib.FERRY_OK)
        except BaseException as e:
            return _fail(e)


def set_fetch(tensor: Tensor, fetcher: Optional[Fetcher]) -> None:
    """Have the scheduler fetch tensor's windows through fetcher before it copies them.

    Parameters
    ----------
    tensor : Tensor
        A host tensor that owns its memory (a KV cache's layer K or V, a paged cache's pool).
    fetcher : Fetcher or None
        Its begin and wait; None: tensor's bytes are here again.

    Raises
    ------
    InvalidArgumentError
        For tensor not a Tensor, a view (set it on the tensor that owns the memory), a tensor not
        in host memory, or a fetcher without begin and wait methods.
    """
    _checks.instance(tensor, Tensor, "set_fetch: tensor")
    key = int(ffi.cast("uintptr_t", tensor._p))
    if fetcher is None:
        check(lib.ferry_tensor_set_fetch(tensor._p, ffi.NULL))
        _installed.pop(key, None)
        return
    if not callable(getattr(fetcher, "begin", None)) or not callable(getattr(fetcher, "wait", None)):
        raise InvalidArgumentError(f"set_fetch: fetcher must have begin(window, policy) and wait(ticket) methods, "
                                   f"got {type(fetcher).__name__}")
    inst = _Installed(tensor, fetcher)
    check(lib.ferry_tensor_set_fetch(tensor._p, inst.struct))
    _installed[key] = inst
