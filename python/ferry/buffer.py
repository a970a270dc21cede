"""Buffer types and buffers: where tensors' bytes live."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from . import _checks
from ._binding import ffi, lib, query
from ._handle import Closeable, Handle, holding
from .errors import FreedBufferError, InvalidArgumentError, UnsupportedError, check
from .stats import Counted
from .tensor import Tensor
from .types import TypeLike

if TYPE_CHECKING:
    from .backend import Backend

_USAGES = {"any": lib.FERRY_BUFFER_USAGE_ANY, "weights": lib.FERRY_BUFFER_USAGE_WEIGHTS,
           "compute": lib.FERRY_BUFFER_USAGE_COMPUTE}


def _raw(bt: "BufferType") -> Any:
    return bt._ptr


class BufferType:
    """A kind of memory (CPU host memory, a dummy backend's memory) that buffers are allocated from.

    A backend's buffer type lives inside the backend, so this keeps that Backend alive.
    """

    def __init__(self, ptr: Any, backend: Optional["Backend"] = None) -> None:
        """Internal: wrap a ferry_buffer_type*; use Backend.buffer_type or cpu_buffer_type().

        Parameters
        ----------
        ptr : cdata ferry_buffer_type *
        backend : Backend, optional
            The backend it lives in (kept alive by this object).
        """
        self._raw = ptr
        self._backend = backend

    @property
    def _ptr(self) -> Any:
        """The ferry_buffer_type*, which lives inside its backend (if any): refused once that is freed."""
        if self._backend is not None and self._backend._handle.ptr is None:
            raise FreedBufferError(f"the buffer type of {self._backend._describe()}, which was freed")
        return self._raw

    @property
    def name(self) -> str:
        """The buffer type's name ("CPU", "CUDA0", ...)."""
        return ffi.string(lib.ferry_buffer_type_name(self._ptr)).decode()

    alignment = query(lib.ferry_buffer_type_alignment, int,
                      "Offsets of tensors placed in its buffers must be multiples of this.", of=_raw)

    @property
    def max_size(self) -> Optional[int]:
        """The largest buffer it allocates, or None if unbounded."""
        n = int(lib.ferry_buffer_type_max_size(self._ptr))
        return None if n == _checks.SIZE_MAX else n

    is_host = query(lib.ferry_buffer_type_is_host, bool,
                    "Whether its buffers are host memory the CPU can read.", of=_raw)

    @property
    def backend(self) -> Optional["Backend"]:
        """The backend it belongs to, or None for a global buffer type."""
        return self._backend

    def alloc_size(self, tensor: Tensor) -> int:
        """Bytes the Tensor tensor takes in a buffer of this type."""
        return int(lib.ferry_buffer_type_alloc_size(self._ptr, tensor._p))

    def alloc_buffer(self, size: int) -> "Buffer":
        """A new buffer of this type.

        Parameters
        ----------
        size : int
            Bytes.

        Returns
        -------
        Buffer

        Raises
        ------
        OutOfMemoryError
            Past max_size, or when the allocation fails.
        FreedBufferError
            Once its backend is closed.
        """
        if self._backend is not None and self._backend.closed:
            raise FreedBufferError(f"the buffer type of {self._backend._describe()}, which was closed")
        out = ffi.new("ferry_buffer **")
        check(lib.ferry_buffer_type_alloc_buffer(self._ptr, _checks.as_size(size, "alloc_buffer: size"), out))
        return Buffer(out[0], self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BufferType) and self._raw == other._raw

    def __hash__(self) -> int:
        return hash(int(ffi.cast("uintptr_t", self._raw)))

    def __repr__(self) -> str:
        max_size = "unbounded" if self.max_size is None else f"max {self.max_size}"
        return f"<BufferType {self.name} alignment={self.alignment} {max_size}{' host' if self.is_host else ''}>"


def cpu_buffer_type() -> BufferType:
    """The host buffer type every CPU backend allocates from."""
    return BufferType(lib.ferry_cpu_buffer_type())


class Buffer(Closeable, Counted):
    """A block of memory of one buffer type, with the tensors placed in it and its transfer counters.

    close() frees the memory now, pinned memory included, and a second
    call does nothing; the buffer is also freed when no longer referenced. After it, the buffer
    and the tensors placed in it raise FreedBufferError on every use. Closed while another thread's
    call (a transfer, a run) is inside C with it, it is freed when that call returns. Used in a
    `with` block, it is closed at the block's end.
    """

    _finalizer: Optional[weakref.finalize]
    #: Whether its owner may replace the memory while tensors still point into it (an
    #: allocator that grows): such memory is never exported to other libraries (ferry.export).
    _memory_may_move = False
    _get_stats = lib.ferry_buffer_get_stats
    _reset_stats = lib.ferry_buffer_reset_stats

    def __init__(self, ptr: Any, buffer_type: BufferType, free: Callable[[Any], None] = lib.ferry_buffer_free) -> None:
        """Internal: take ownership of a ferry_buffer*; use Backend.alloc_buffer or BufferType.alloc_buffer.

        Parameters
        ----------
        ptr : cdata ferry_buffer *
        buffer_type : BufferType
            Its type (whose backend the buffer keeps alive).
        free : callable, optional
            Frees ptr (ferry_buffer_free; for memory another library owns, that and more).
        """
        self._type = buffer_type
        parent = buffer_type._backend._handle if buffer_type._backend is not None else None
        self._handle = Handle(ptr, free, parent)
        self._finalizer = weakref.finalize(self, self._handle.release)
        self._size = int(lib.ferry_buffer_size(ptr))
        self._id = int(lib.ferry_buffer_id(ptr))
        self._type_name = buffer_type.name

    @property
    def _p(self) -> Any:
        """The live ferry_buffer*; FreedBufferError once freed (C must never see a freed pointer)."""
        ptr = self._handle.ptr if self._handle.alive else None
        if ptr is None:
            raise FreedBufferError(f"{self._type_name} buffer {self._id} was freed")
        return ptr

    def _describe(self) -> str:
        return f"{self._type_name} buffer {self._id}"

    @property
    def type(self) -> BufferType:
        """The buffer's BufferType."""
        return self._type

    @property
    def backend(self) -> Optional["Backend"]:
        """The backend of the buffer's type, or None."""
        return self._type._backend

    @property
    def size(self) -> int:
        """Bytes."""
        return self._size

    @property
    def id(self) -> int:
        """ferry's serial for this buffer; tensors recognise a freed buffer by it."""
        return self._id

    @property
    def base(self) -> int:
        """The first byte's address (synthetic for a dummy backend without real memory)."""
        return int(ffi.cast("uintptr_t", lib.ferry_buffer_base(self._p)))

    is_host = query(lib.ferry_buffer_is_host, bool, "Whether the buffer is host memory the CPU can read.")

    @property
    def usage(self) -> str:
        """"any", "weights" or "compute"."""
        value = int(lib.ferry_buffer_get_usage(self._p))
        return next(k for k, v in _USAGES.items() if v == value)

    @usage.setter
    def usage(self, usage: str) -> None:
        if not isinstance(usage, str) or usage not in _USAGES:
            raise InvalidArgumentError(f"buffer usage {usage!r} is not one of {', '.join(_USAGES)}")
        check(lib.ferry_buffer_set_usage(self._p, _USAGES[usage]))

    @holding
    def clear(self, value: int = 0) -> None:
        """Set every byte of the buffer to one value.

        Parameters
        ----------
        value : int, optional
            0..255.

        Raises
        ------
        InvalidArgumentError
            For a value that is not a byte.
        FreedBufferError
            Once the buffer is freed.
        """
        v = _checks.as_byte(value, "clear: value")
        check(lib.ferry_buffer_clear(self._p, v))

    def place(self, tensor: Tensor, offset: int = 0) -> Tensor:
        """Give a tensor memory in this buffer.

        Parameters
        ----------
        tensor : Tensor
            Not a view, not yet placed.
        offset : int, optional
            Bytes from the buffer's start, a multiple of the buffer type's alignment.

        Returns
        -------
        Tensor
            tensor, which now keeps this buffer alive.

        Raises
        ------
        InvalidArgumentError, OutOfBoundsError
            For a misaligned offset or a tensor that does not fit.
        """
        _checks.instance(tensor, Tensor, "place")
        check(lib.ferry_buffer_place_tensor(self._p, tensor._p, _checks.as_size(offset, "place: offset")))
        tensor._buffer = self  # the tensor keeps its memory alive
        return tensor

    def new_tensor(self, type: TypeLike, ne: Sequence[int], offset: int = 0, name: Optional[str] = None) -> Tensor:
        """A new contiguous tensor placed in this buffer.

        Parameters
        ----------
        type : Type, str or int
        ne : sequence of int
        offset : int, optional
            As for place.
        name : str, optional

        Returns
        -------
        Tensor
        """
        return self.place(Tensor.new(type, ne, name=name), offset)

    def __repr__(self) -> str:
        if self.closed:
            return f"<Buffer {self._type_name} id={self._id} {self._size} bytes, freed>"
        return f"<Buffer {self._type_name} id={self._id} {self._size} bytes at {self.base:#x}>"


class BorrowedBuffer(Buffer):
    """A buffer that another object owns: a graph allocator's chunk, a scheduler's compute
    memory, a KV cache's storage. Tensors placed in it hold this, and this holds the owner,
    so the memory lives as long as they do. It is usable while the owner is open and C
    still knows its id (an allocator that grows replaces its chunks); after that every use,
    and every use of a tensor in it, raises FreedBufferError. close() belongs to the owner.
    """

    def __init__(self, ptr: Any, buffer_type: BufferType, owner: object, owner_handle: Handle) -> None:
        """Internal: wrap a ferry_buffer* that another object owns and frees.

        Parameters
        ----------
        ptr : cdata ferry_buffer *
        buffer_type : BufferType
        owner : object
            The allocator, scheduler or KV cache that frees it (kept alive by this object).
        owner_handle : Handle
            The owner's handle: the buffer is usable while it is alive.
        """
        self._type = buffer_type
        self._owner = owner
        self._handle = owner_handle
        self._finalizer = None
        self._ptr = ptr
        self._size = int(lib.ferry_buffer_size(ptr))
        self._id = int(lib.ferry_buffer_id(ptr))
        self._type_name = buffer_type.name

    @property
    def _p(self) -> Any:
        if self.closed:
            raise FreedBufferError(f"{self._type_name} buffer {self._id} was freed by its owner")
        return self._ptr

    @property
    def closed(self) -> bool:
        """True once the owner is closed or C no longer knows the buffer's id."""
        return not self._handle.alive or not lib.ferry_buffer_id_is_live(self._id)

    @property
    def owner(self) -> object:
        """The object that allocated and frees this buffer."""
        return self._owner

    @property
    def _memory_may_move(self) -> bool:  # type: ignore[override]
        """A graph allocator's or scheduler's memory moves when it allocates again; a KV cache's stays."""
        return not getattr(self._owner, "_memory_stays", False)

    def close(self) -> None:
        """Refused (UnsupportedError): the owner frees it (close the allocator,
        scheduler or cache)."""
        raise UnsupportedError(f"{self._type_name} buffer {self._id} belongs to {type(self._owner).__name__}; "
                               "free that instead")


def buffer_type_of(ptr: Any, known: Sequence[BufferType]) -> BufferType:
    """The BufferType of a ferry_buffer*.

    Parameters
    ----------
    ptr : cdata ferry_buffer *
    known : sequence of BufferType
        Types to reuse when one matches (they keep their backends alive).

    Returns
    -------
    BufferType
    """
    raw = lib.ferry_buffer_get_type(ptr)
    for bt in known:
        if bt._raw == raw:
            return bt
    return BufferType(raw)
