"""Tensors: type, 4-D shape and byte strides (ggml order: ne[0] fastest), views, transfers.

Each Tensor owns a ferry_context holding its one C struct; a view keeps its source
Tensor (and so the source's context) alive, and a placed tensor keeps its Buffer alive.
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _checks, _pybuffer, export
from ._binding import ffi, lib, query
from ._handle import Handle, Hold, release_when_collected
from .errors import (
    FreedBufferError,
    InvalidArgumentError,
    LayoutError,
    OutOfBoundsError,
    OutOfMemoryError,
    UnsupportedError,
    check,
)
from .quant import dequantize, quantize, value_dtype
from .types import Type, TypeLike, array_dtype, row_size, to_type, type_of_dtype

if TYPE_CHECKING:
    from .backend import Backend
    from .buffer import Buffer


def _new_context(parent: Sequence[Handle]) -> Handle:
    out = ffi.new("ferry_context **")
    check(lib.ferry_context_new(out))
    return Handle(out[0], lib.ferry_context_free, parent)


def _numpy_strides(t: "Tensor") -> Tuple[int, ...]:
    """t's byte strides in numpy order (all 4 dimensions), 0 for a dimension of one index or none:
    it is never stepped, C accepts any stride there, and numpy refuses one past its index type."""
    return tuple(s if n > 1 else 0 for n, s in zip(reversed(t.ne), reversed(t.nb)))


class Tensor:
    """A ferry tensor. Create with Tensor.new, Backend.alloc_tensor or Tensor.from_numpy.

    Offsets and sizes of transfers are bytes relative to the tensor's first byte; the
    tensor spans nbytes (ggml's rule: first byte to last, gaps of a strided view included).
    """

    _handle: Handle
    _finalizer: Optional["weakref.ref[Any]"]  # None for a borrowed struct
    _ptr: Any

    def __init__(self, make: Callable[[Any, Any], int], source: Optional["Tensor"] = None,
                 name: Optional[str] = None, deps: Sequence["Tensor"] = ()) -> None:
        """Internal: a new tensor struct made by a C constructor; use the constructors, view methods and ops.

        Parameters
        ----------
        make : callable
            make(ctx, out) fills out with a struct in ctx and returns a ferry_status.
        source : Tensor, optional
            The tensor this one is a view of (kept alive as long as this one).
        name : str, optional
            The tensor's name.
        deps : sequence of Tensor, optional
            The tensors an op reads (kept alive as long as this one).

        Raises
        ------
        FerryError
            The subclass for the status make returned.
        """
        self._source = source
        self._deps: Tuple["Tensor", ...] = tuple(deps)
        self._buffer: Optional["Buffer"] = None
        parents = [t._handle for t in ((source,) if source is not None else ()) + self._deps]
        handle = _new_context(parents)
        self._handle = handle
        self._finalizer = release_when_collected(self, handle)
        out = ffi.new("ferry_tensor **")
        check(make(handle.ptr, out))
        self._ptr = out[0]
        if name is not None:
            self.name = name

    @classmethod
    def _borrow(cls, ptr: Any, handle: Handle, keep: object, source: Optional["Tensor"] = None,
                buffer: Optional["Buffer"] = None, retainable: bool = True) -> "Tensor":
        """Internal: a Tensor over a struct someone else owns (a KV cache's layer, a scheduler's
        input copy, the inner view of a window). It is usable while handle is alive and keeps
        keep (the owner) alive; it frees nothing itself."""
        t = cls.__new__(cls)
        t._source = source
        t._deps = (keep,)  # type: ignore[assignment]
        t._buffer = buffer
        t._handle = handle
        t._finalizer = None
        t._ptr = ptr
        t._retainable = retainable
        return t

    @property
    def _p(self) -> Any:
        """The C struct; refused once its context (or the owner of a borrowed struct) is gone."""
        if not self._handle.alive:
            raise FreedBufferError("tensor used after its owner was freed (or it was finalized)")
        return self._ptr

    # ------------------------------------------------------------ construction

    @classmethod
    def new(cls, type: TypeLike, ne: Sequence[int], name: Optional[str] = None) -> "Tensor":
        """An unallocated contiguous tensor; give it memory with Buffer.place or Backend.alloc_buffer_for.

        Parameters
        ----------
        type : Type, str or int
            The element type ("f32", Type.Q8_0, ...).
        ne : sequence of int
            1 to 4 values per dimension, ne[0] fastest.
        name : str, optional
            The tensor's name.

        Returns
        -------
        Tensor

        Raises
        ------
        UnknownTypeError, InvalidArgumentError, LayoutError
            For an unknown type, a shape that is not 1 to 4 integers, or ne[0] not whole blocks.
        """
        ty = to_type(type)
        shape = _checks.as_shape(ne, "tensor_new")
        return cls(lambda ctx, out: lib.ferry_tensor_new(ctx, ty.value, len(shape), ffi.new("int64_t[]", shape), out),
                   name=name)

    @classmethod
    def from_numpy(cls, backend: "Backend", array: Any, name: Optional[str] = None,
                   type: Optional[TypeLike] = None) -> "Tensor":
        """A tensor on a backend holding an array's values.

        Parameters
        ----------
        backend : Backend
            Where the tensor's memory is allocated.
        array : array_like
            At most 4 dimensions.
        name : str, optional
            The tensor's name.
        type : Type, str or int, optional
            The tensor's type (default: the array's own, float32, float16, ml_dtypes.bfloat16 or
            int32); values of another dtype are converted, for q8_0 and q4_0 quantized (ferry.quant).

        Returns
        -------
        Tensor
            ne is array.shape reversed (numpy's last axis is ne[0]).

        Raises
        ------
        InvalidArgumentError
            For a backend that is not one, more than 4 dimensions, or values the type cannot hold.
        UnsupportedError
            For a dtype ferry has no type for, and no type given.
        LayoutError
            For a last axis that is not whole blocks of a block type.
        """
        _checks.c_object(backend, "ferry_backend *", "a Backend", "from_numpy")
        arr = np.asarray(array)
        if arr.ndim > 4:
            raise InvalidArgumentError(f"from_numpy: {arr.ndim} dimensions; ferry tensors have at most 4")
        if type is None:
            ty = type_of_dtype(arr.dtype)
            if ty is None:
                raise UnsupportedError(f"from_numpy: numpy dtype {arr.dtype} has no ferry type (float32, float16, "
                                       "bfloat16 and int32 have); give type= to convert the values")
        else:
            ty = to_type(type)
        ne = list(reversed(arr.shape)) or [1]
        data = np.ascontiguousarray(arr) if type_of_dtype(arr.dtype) == ty else quantize(arr, ty)
        t = backend.alloc_tensor(ty, ne, name=name)
        t.set(data if data.size else b"")
        return t

    #: False for a struct that lives only until its owner's next step (a scheduler's input copy):
    #: nothing may keep a pointer to it, so no views or ops are built on it.
    _retainable = True
    #: The lengths set_used_cells gave: the Python object keeps their memory (its buffer) alive, which
    #: the C struct the window points at does not.
    _used_lengths: Optional["Tensor"] = None

    def _check_retainable(self) -> None:
        if not self._retainable:
            raise UnsupportedError(f"'{self.name}' belongs to a scheduler and lives only until its next alloc: "
                                   "read or write it, but build no views or ops on it")

    def _derive(self, make: Callable[[Any, Any], int], name: Optional[str]) -> "Tensor":
        self._check_retainable()
        return Tensor(make, source=self, name=name)

    def view(self, ne: Sequence[int], nb: Optional[Sequence[int]] = None, offset: int = 0,
             name: Optional[str] = None) -> "Tensor":
        """A view of this tensor's memory with its own shape and byte strides.

        Parameters
        ----------
        ne : sequence of int
            1 to 4 values per dimension.
        nb : sequence of int, optional
            Byte strides, one per dimension; nb[0] is the type's element (block) size. None: contiguous.
        offset : int, optional
            Bytes from this tensor's first byte to the view's.
        name : str, optional
            The view's name.

        Returns
        -------
        Tensor
            The view; its span must stay inside this tensor's span.

        Raises
        ------
        InvalidArgumentError, LayoutError, OutOfBoundsError
            For values that cannot be sizes, nb[0] not the element size, or a view that leaves this tensor.
        UnsupportedError
            For a scheduler's input copy, on which nothing may be built.
        """
        shape = _checks.as_shape(ne, "view")
        if nb is None:
            strides = self._contiguous_strides(shape)
        else:
            strides = _checks.as_strides(nb, len(shape), "view")  # C refuses an nb[0] not the type's size
        off = _checks.as_size(offset, "view: offset")
        src = self._p
        return self._derive(lambda ctx, out: lib.ferry_tensor_view(
            ctx, src, len(shape), ffi.new("int64_t[]", shape), ffi.new("size_t[]", strides), off, out), name)

    def _contiguous_strides(self, shape: List[int]) -> List[int]:
        """ferry_contiguous_strides of shape, a negative count taken as 0 (the view refuses it)."""
        nb = ffi.new("size_t[]", len(shape))
        counts = ffi.new("int64_t[]", [max(n, 0) for n in shape])
        check(lib.ferry_contiguous_strides(self.type.value, len(shape), counts, nb))
        return [int(v) for v in nb]

    def permute(self, *axes: Union[int, Sequence[int]], name: Optional[str] = None) -> "Tensor":
        """ggml's permute: dimension i of this tensor becomes dimension axes[i] of the view.

        Parameters
        ----------
        *axes : int, or one sequence of 4 int
            A permutation of 0..3.
        name : str, optional
            The view's name.

        Returns
        -------
        Tensor
            The view: dimension i of this tensor at axes[i].

        Raises
        ------
        InvalidArgumentError
            For anything but 4 axes forming a permutation.
        """
        if len(axes) == 1 and not isinstance(axes[0], int) and hasattr(axes[0], "__len__"):
            axes = tuple(axes[0])
        if len(axes) != 4:
            raise InvalidArgumentError(f"permute: expected 4 axes, got {len(axes)}")
        a = [_checks.as_c_int(x, f"permute: axis {i}") for i, x in enumerate(axes)]
        src = self._p
        return self._derive(lambda ctx, out: lib.ferry_tensor_permute(ctx, src, a[0], a[1], a[2], a[3], out), name)

    def transpose(self, name: Optional[str] = None) -> "Tensor":
        """A view with dimensions 0 and 1 swapped, named name."""
        src = self._p
        return self._derive(lambda ctx, out: lib.ferry_tensor_transpose(ctx, src, out), name)

    def reshape(self, ne: Sequence[int], name: Optional[str] = None) -> "Tensor":
        """A view with another shape of the same element count.

        Parameters
        ----------
        ne : sequence of int
            1 to 4 values per dimension.
        name : str, optional
            The view's name.

        Returns
        -------
        Tensor
            The view, over this tensor's memory.

        Raises
        ------
        LayoutError
            When this tensor is not contiguous or the counts differ.
        """
        shape = _checks.as_shape(ne, "reshape")
        src = self._p
        return self._derive(lambda ctx, out: lib.ferry_tensor_reshape(
            ctx, src, len(shape), ffi.new("int64_t[]", shape), out), name)

    def dup_layout(self, name: Optional[str] = None) -> "Tensor":
        """A new unallocated tensor named name with this one's type, ne and nb (not a view)."""
        src = self._p
        return Tensor(lambda ctx, out: lib.ferry_tensor_dup_layout(ctx, src, out), name=name)

    # ------------------------------------------------------------ metadata

    @property
    def type(self) -> Type:
        """The element type."""
        return Type(self._p.type)

    @property
    def ne(self) -> Tuple[int, int, int, int]:
        """Values per dimension, ne[0] fastest."""
        p = self._p
        return (int(p.ne[0]), int(p.ne[1]), int(p.ne[2]), int(p.ne[3]))

    @property
    def nb(self) -> Tuple[int, int, int, int]:
        """Byte stride per dimension; nb[0] is the element (block) size."""
        p = self._p
        return (int(p.nb[0]), int(p.nb[1]), int(p.nb[2]), int(p.nb[3]))

    @property
    def ndim(self) -> int:
        """ggml's n_dims: 1 + the last dimension whose ne is not 1 (at least 1)."""
        ne = self.ne
        return next((i + 1 for i in range(3, 0, -1) if ne[i] != 1), 1)

    nbytes = query(lib.ferry_tensor_nbytes, int, "The span from the first byte to the last (ggml's nbytes).")

    @property
    def row_size(self) -> int:
        """Bytes of one row of ne[0] values (row_size(type, ne[0]))."""
        return row_size(self.type, self.ne[0])

    nelements = query(lib.ferry_tensor_nelements, int, "Values (elements) in all dimensions.")
    nrows = query(lib.ferry_tensor_nrows, int, "Rows: ne[1] * ne[2] * ne[3].")
    is_contiguous = query(lib.ferry_tensor_is_contiguous, bool,
                          "Whether the elements are packed in ggml order, without gaps.")
    is_view = query(lib.ferry_tensor_is_view, bool, "Whether the tensor views another's memory.")

    def same_layout(self, other: "Tensor") -> bool:
        """Whether the Tensor other has this tensor's type, ne and nb."""
        return bool(lib.ferry_tensor_same_layout(self._p, _checks.instance(other, Tensor, "same_layout")._p))

    @property
    def op(self) -> int:
        """The ferry_op that made it (FERRY_OP_VIEW, ..._PERMUTE, ...; FERRY_OP_NONE for a leaf)."""
        return int(self._p.op)

    @property
    def name(self) -> str:
        """The tensor's name (InvalidArgumentError for a non-str or one with NUL when set)."""
        return ffi.string(self._p.name).decode("utf-8", "replace")

    @name.setter
    def name(self, name: str) -> None:
        if not isinstance(name, str) or "\0" in name:
            raise InvalidArgumentError(f"tensor name must be a str without NUL, got {name!r}")
        check(lib.ferry_tensor_set_name(self._p, name.encode()))

    @property
    def source(self) -> Optional["Tensor"]:
        """The tensor this view was made from (None for a root)."""
        return self._source

    def set_used_cells(self, lengths: Optional["Tensor"], cell_dim: int = 1, stream_dim: int = 3,
                       limit: Optional[int] = None) -> "Tensor":
        """Say that this window reads, of stream s (index s of dimension stream_dim), only the first
        min(lengths[s], ne[cell_dim]) cells of dimension cell_dim: attention's own clamp of kv_len.
        The ragged copy policy then copies those cells and nothing after them; every policy refuses
        a length outside 0..limit it can read, before a byte moves. KVCache.window(lengths=...) and
        attention_step set it on the windows they make.

        Parameters
        ----------
        lengths : Tensor or None
            i32 [ne[stream_dim]], the kv_len written before each step; kept alive with this tensor.
            It must be in host memory when the ragged policy copies this window (its values are read
            then, or when a prefetched copy is queued). None clears.
        cell_dim : int, optional
            The dimension of cells: 1 for K and a V not transposed as KVCache.window hands them on,
            0 for a transposed V.
        stream_dim : int, optional
            The dimension of streams (3 for KVCache's windows).
        limit : int, optional
            Lengths above it are refused when read; lengths from ne[cell_dim] to it read all
            ne[cell_dim] cells (a sliding layer's window is shorter than the step's n_kv). Default:
            ne[cell_dim].

        Returns
        -------
        Tensor
            This tensor.

        Raises
        ------
        InvalidArgumentError
            For lengths that are not a Tensor, dimensions outside 0..3 or equal, a limit below
            ne[cell_dim].
        LayoutError
            For lengths not i32 with one value per stream, or cells on dimension 0 of a block type.
        """
        if lengths is None:
            check(lib.ferry_tensor_set_used_cells(self._p, ffi.NULL, 0, 0, 0))
            self._used_lengths = None
            return self
        lens = _checks.instance(lengths, Tensor, "set_used_cells: lengths")
        cd = _checks.as_c_int(cell_dim, "set_used_cells: cell_dim")
        sd = _checks.as_c_int(stream_dim, "set_used_cells: stream_dim")
        lim = 0 if limit is None else _checks.as_int64(limit, "set_used_cells: limit")
        if limit is not None and lim <= 0:
            raise InvalidArgumentError(f"set_used_cells: limit {limit} is not positive")
        check(lib.ferry_tensor_set_used_cells(self._p, lens._p, cd, sd, lim))
        self._handle.add_parent(lens._handle)  # this struct points at the lengths' struct now
        self._used_lengths = lens  # ... and reads their memory
        return self

    @property
    def used_cells(self) -> Optional[Tuple[int, int, int]]:
        """(cell_dim, stream_dim, limit) of the used cells this window carries (set_used_cells, or the
        one-call step's), or None when every cell is read."""
        p = self._p
        if not p.used_lengths:
            return None
        return int(p.used_cell_dim), int(p.used_stream_dim), int(p.used_limit)

    @property
    def root(self) -> "Tensor":
        """The tensor whose memory this one reads (itself unless a view)."""
        t = self
        while t._source is not None:
            t = t._source
        return t

    @property
    def offset(self) -> int:
        """Byte offset of the first byte in the root's memory (0 for a root)."""
        return int(self._p.view_offs)

    @property
    def buffer(self) -> Optional["Buffer"]:
        """The Buffer holding the memory (the root's), or None if never placed."""
        return self.root._buffer

    @property
    def allocated(self) -> bool:
        """True if the tensor has memory behind it in a live buffer."""
        st = lib.ferry_tensor_check_allocated(self._p)
        if st != lib.FERRY_OK:
            lib.ferry_clear_error()  # a query, not a failure
        return st == lib.FERRY_OK

    @property
    def address(self) -> Optional[int]:
        """Address of the first byte (synthetic in a synthetic dummy buffer), None if unallocated or freed."""
        if not self.allocated:
            return None
        return int(ffi.cast("uintptr_t", self.root._p.data)) + self.offset

    # ------------------------------------------------------------ blocking transfers

    def set(self, data: _pybuffer.BytesLike, offset: int = 0) -> None:
        """Write all of data into the tensor, checked as every write is (writable_data).

        Parameters
        ----------
        data : bytes-like, numpy.ndarray or TensorBytes
            Values of the tensor's dtype, shaped as the tensor (or leading rows of it) or flat;
            raw bytes (bytes, uint8 arrays); or another tensor's raw(), of the same type. A
            non-contiguous array is written in C order.
        offset : int, optional
            Bytes from the tensor's first byte.

        Raises
        ------
        InvalidArgumentError
            For data of another dtype.
        LayoutError
            For data of another shape, or values at an offset inside an element.
        NotAllocatedError, FreedBufferError
            For a tensor without live memory.
        OutOfBoundsError
            When the bytes reach past the tensor's span.
        """
        self._write(data, _checks.as_size(offset, "tensor_set: offset"), "tensor_set")

    def _write(self, data: Any, offset: int, what: str, region: Optional[Sequence[int]] = None) -> None:
        """set's write, through the one check (writable_data): region, the numpy shape data must fill."""
        with writable_data(self, data, what, offset, region) as d, hold_memory(self):
            check(lib.ferry_tensor_set(self._p, d.ptr, offset, d.nbytes))

    def get(self, offset: int = 0, size: Optional[int] = None) -> bytes:
        """Read bytes of the tensor.

        Parameters
        ----------
        offset : int, optional
            Bytes from the tensor's first byte.
        size : int, optional
            Bytes to read; None reads to the end of the span.

        Returns
        -------
        bytes

        Raises
        ------
        NotAllocatedError, FreedBufferError
            For a tensor without live memory.
        OutOfBoundsError
            When the bytes reach past the tensor's span.
        """
        off = _checks.as_size(offset, "tensor_get: offset")
        n = max(self.nbytes - off, 0) if size is None else _checks.as_size(size, "tensor_get: size")
        self._check_transfer("tensor_get", off, n)
        out = _pybuffer.new_bytes(n, "tensor_get")
        self.readinto(out, off)
        return bytes(out)

    def _check_transfer(self, what: str, offset: int, size: int, n_copies: int = 1, stride: int = 0,
                        stride_data: int = 0) -> None:
        """C's checks of a transfer (ferry_tensor_check_transfer), made before Python allocates a
        read's output (a request C refuses must not first ask Python for its size in memory) and
        before a write's data is taken."""
        check(lib.ferry_tensor_check_transfer(self._p, offset, size, n_copies, stride, stride_data,
                                              what.encode()))

    def readinto(self, out: Any, offset: int = 0) -> None:
        """Fill a writable buffer from the tensor.

        Parameters
        ----------
        out : writable, C-contiguous bytes-like
            Filled entirely.
        offset : int, optional
            Bytes from the tensor's first byte.

        Raises
        ------
        InvalidArgumentError
            For a read-only or non-contiguous out.
        OutOfBoundsError, NotAllocatedError, FreedBufferError
            As for get.
        """
        with _pybuffer.writable(out, "tensor_get") as d, hold_memory(self):
            check(lib.ferry_tensor_get(self._p, d.ptr, _checks.as_size(offset, "tensor_get: offset"), d.nbytes))

    def memset(self, value: int, offset: int = 0, size: Optional[int] = None) -> None:
        """Set bytes of the tensor to one value.

        Parameters
        ----------
        value : int
            0..255.
        offset : int, optional
            Bytes from the tensor's first byte.
        size : int, optional
            Bytes to set; None sets to the end of the span.

        Raises
        ------
        InvalidArgumentError
            For a value that is not a byte.
        OutOfBoundsError, NotAllocatedError, FreedBufferError
            As for set.
        """
        v = _checks.as_byte(value, "tensor_memset: value")
        off = _checks.as_size(offset, "tensor_memset: offset")
        n = max(self.nbytes - off, 0) if size is None else _checks.as_size(size, "tensor_memset: size")
        with hold_memory(self):
            check(lib.ferry_tensor_memset(self._p, v, off, n))

    def set_2d(self, data: _pybuffer.BytesLike, offset: int, size: int, n_copies: int, stride_tensor: int,
               stride_data: Optional[int] = None) -> None:
        """Write n_copies rows of size bytes; nothing else in the tensor changes.

        Parameters
        ----------
        data : bytes-like, numpy.ndarray or TensorBytes
            Row i is data[i*stride_data:][:size]; checked as set's data is, an array's rows being
            the rows written.
        offset : int
            Where row 0 goes, in bytes from the tensor's first byte.
        size : int
            Bytes per row.
        n_copies : int
            Rows.
        stride_tensor : int
            Bytes from one row to the next in the tensor.
        stride_data : int, optional
            Bytes from one row to the next in data (default size: packed rows).

        Raises
        ------
        InvalidArgumentError
            For data of another dtype.
        OutOfBoundsError
            When data is shorter or longer than the rows, or the rows reach past the tensor's span.
        LayoutError
            For strides smaller than a row, or data of another shape.
        """
        args = _checks.transfer_2d("tensor_set_2d", offset, size, n_copies, stride_tensor, stride_data)
        with writable_data(self, data, "tensor_set_2d", rows=args) as d, hold_memory(self):
            check(lib.ferry_tensor_set_2d(self._p, d.ptr, *args))

    def get_2d(self, offset: int, size: int, n_copies: int, stride_tensor: int,
               stride_data: Optional[int] = None, out: Any = None) -> Optional[bytes]:
        """Read n_copies rows of size bytes from offset + i*stride_tensor, row i to i*stride_data.

        Parameters
        ----------
        offset, size, n_copies, stride_tensor : int
            As for set_2d.
        stride_data : int, optional
            Bytes from one row to the next in the output (default size: packed rows).
        out : writable bytes-like, optional
            Filled with the rows; None returns new bytes.

        Returns
        -------
        bytes or None
            The rows ((n_copies-1)*stride_data + size bytes), or None when out was given.

        Raises
        ------
        OutOfBoundsError, LayoutError, NotAllocatedError, FreedBufferError
            As for set_2d and get.
        OutOfMemoryError
            Without out, when the new bytes (twice: the bytes returned are a copy) are more than
            the memory available, naming the rows and stride_data.
        """
        args = _checks.transfer_2d("tensor_get_2d", offset, size, n_copies, stride_tensor, stride_data)
        need = _pybuffer.extent_2d(args[1], args[2], args[4])
        if out is None:
            self._check_transfer("tensor_get_2d", *args)
        request = f"tensor_get_2d: {args[2]} rows of {args[1]} bytes at a stride_data of {args[4]}"
        target = out if out is not None else _pybuffer.new_bytes(
            need, request, copies=2, remedy="give a smaller stride_data, or an out to read into")
        with _pybuffer.writable(target, "tensor_get_2d") as d, hold_memory(self):
            d.need(need, "tensor_get_2d")
            check(lib.ferry_tensor_get_2d(self._p, d.ptr, *args))
        return bytes(target) if out is None else None

    def copy_to(self, dst: "Tensor") -> None:
        """Copy the tensor's nbytes span into the Tensor dst, of the same type, ne and nb (else LayoutError)."""
        d = _checks.instance(dst, Tensor, "copy_to")
        with hold_memory(self, d):
            check(lib.ferry_tensor_copy(self._p, d._p))

    # ------------------------------------------------------------ numpy

    def to_numpy(self) -> np.ndarray:
        """The values as a new array shaped reversed ne (numpy order); strided views give their own
        values, gaps skipped. bf16 as ml_dtypes.bfloat16; q8_0 and q4_0 dequantized to float32
        (their bytes: raw())."""
        ty = self.type
        shape = tuple(reversed(self.ne[: self.ndim]))
        dtype = value_dtype(ty)
        try:
            if self.nelements == 0:
                self.get(0, 0)  # still refuses an unallocated or freed tensor
                return np.zeros(shape, dtype)
            raw = _pybuffer.new_bytes(self.nbytes, "to_numpy")
            self.readinto(raw)
            elem = array_dtype(ty)
            if elem is not None:
                if self.is_contiguous:
                    return np.frombuffer(raw, elem).reshape(shape)
                return np.ndarray(shape, elem, buffer=raw, strides=_numpy_strides(self)[::-1][: self.ndim][::-1]).copy()
            # block types: each row of ne[0] values is ne[0]/blck blocks of type_size bytes at nb[0]
            ne = self.ne
            blocks = np.ndarray((ne[3], ne[2], ne[1], ne[0] // ty.blck_size, ty.size), np.uint8, buffer=raw,
                                strides=_numpy_strides(self) + (1,))
            values = dequantize(np.ascontiguousarray(blocks), ty, self.nelements)
            return values.reshape(shape)
        except (ValueError, MemoryError):
            # numpy's 'array is too big' (even with no values), or no memory for the values of a
            # broadcast view: shapes ferry allows and numpy cannot hold
            raise OutOfMemoryError(f"to_numpy: numpy cannot hold {self.nelements} {dtype} values shaped "
                                   f"{list(shape)}") from None

    # ------------------------------------------------------------ zero-copy export (ferry.export)

    def raw(self) -> "export.TensorBytes":
        """The tensor's bytes as uint8, each row its row_size bytes, exported without a copy.

        Returns
        -------
        TensorBytes
            Speaks the tensor's protocols: np.asarray(t.raw()), np.from_dlpack(t.raw()),
            torch.from_dlpack(t.raw()). The block types export only this way.
        """
        return export.TensorBytes(self)

    @property
    def __array_interface__(self) -> Dict[str, Any]:
        """numpy's view of host memory (ferry.export.array_interface)."""
        return export.array_interface(self)

    def __array__(self, dtype: Any = None, copy: Optional[bool] = None) -> np.ndarray:
        """numpy's view of host memory, bf16 too (ferry.export.as_array)."""
        return export.as_array(self, dtype, copy)

    def __dlpack__(self, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Optional[bool] = None) -> Any:
        """A DLPack capsule of host or CUDA memory (ferry.export.dlpack)."""
        return export.dlpack(self, False, stream, max_version, dl_device, copy)

    def __dlpack_device__(self) -> Tuple[int, int]:
        """(1, 0) for host memory, (2, n) for CUDA device n."""
        return export.dlpack_device(self)

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        """The view of CUDA device memory PyTorch and CuPy take (ferry.export.cuda_array_interface)."""
        return export.cuda_array_interface(self)

    # ------------------------------------------------------------ graphs: flags and ops (see ferry.ops)

    @property
    def flags(self) -> int:
        """FERRY_TENSOR_FLAG_INPUT | FERRY_TENSOR_FLAG_OUTPUT bits."""
        return int(self._p.flags)

    @property
    def is_input(self) -> bool:
        """Whether set_input() marked it."""
        return bool(self.flags & lib.FERRY_TENSOR_FLAG_INPUT)

    @property
    def is_output(self) -> bool:
        """Whether set_output() marked it."""
        return bool(self.flags & lib.FERRY_TENSOR_FLAG_OUTPUT)

    def set_input(self) -> "Tensor":
        """Mark it written before compute: an allocator keeps it for the whole graph. Returns self."""
        check(lib.ferry_tensor_set_input(self._p))
        return self

    def set_output(self) -> "Tensor":
        """Mark it read after compute: an allocator never reuses its memory. Returns self."""
        check(lib.ferry_tensor_set_output(self._p))
        return self

    @property
    def srcs(self) -> Tuple["Tensor", ...]:
        """The tensors an op reads (empty for leafs, views, and structs borrowed from their owner, but
        the nodes of a step made in C: ferry.attention_step's outputs from KVCache.windows)."""
        if self._finalizer is None:  # borrowed: _deps holds the owner, not operands
            srcs_of = getattr(self._deps[0], "_srcs_of", None)
            return srcs_of(self) if srcs_of is not None else ()
        return tuple(t for t in self._deps if isinstance(t, Tensor))

    # ------------------------------------------------------------ ops: ferry.ops builds each through these

    def _op(self, make: Callable[[Any, Any], int], operands: Tuple["Tensor", ...], name: Optional[str]) -> "Tensor":
        """The result of make in a new context: an op's node, keeping its operands alive."""
        for t in operands:
            t._check_retainable()
        return Tensor(make, deps=operands, name=name)

    def _binary(self, fn: Callable[[Any, Any, Any, Any], int], other: "Tensor", what: str,
                name: Optional[str]) -> "Tensor":
        """An elementwise op of self (a) and other (b), checked as ferry.ops checks them."""
        pa, pb = self._p, _checks.instance(other, Tensor, f"{what}: b")._p
        return self._op(lambda ctx, out: fn(ctx, pa, pb, out), (self, other), name)

    def __add__(self, other: "Tensor") -> "Tensor":
        """ops.add: self + other, other repeated over self."""
        return self._binary(lib.ferry_add, other, "add", None)

    def __mul__(self, other: "Tensor") -> "Tensor":
        """ops.mul: self * other elementwise, other repeated over self."""
        return self._binary(lib.ferry_mul, other, "mul", None)

    # ------------------------------------------------------------ display

    def __repr__(self) -> str:
        if not self._handle.alive:
            return "<Tensor (finalized)>"
        parts = [f"<Tensor {self.name!r} {self.type} ne={list(self.ne)} nb={list(self.nb)}"]
        if self._source is not None:
            parts.append(f"view of {self.root.name!r} +{self.offset}")
        buf = self.buffer
        if buf is None:
            parts.append("unallocated")
        elif buf.closed:
            parts.append(f"in freed {buf._type_name} buffer")
        else:
            parts.append(f"in {buf._type_name} buffer")
        return " ".join(parts) + ">"


# ------------------------------------------------------------ the one check of every write


def _payload(data: Any, what: str) -> Tuple[Any, Optional[Type], Optional[Tuple[int, ...]]]:
    """data as a buffer C can read, the ferry type of its elements (None: raw bytes) and its shape
    in numpy order with the last axis in bytes (None: flat).

    The bytes of Tensor.raw() (a TensorBytes) are its tensor's rows, packed; they carry that
    tensor's type and shape."""
    if isinstance(data, export.TensorBytes):
        src = data.tensor
        shape = tuple(reversed(src.ne[: src.ndim]))
        payload = src.get() if src.is_contiguous else np.asarray(data)  # a view's rows, packed
        return payload, src.type, shape[:-1] + (src.row_size,)
    if isinstance(data, np.ndarray):
        dt, shape = data.dtype, data.shape
    elif isinstance(data, memoryview) and data.format not in ("B", "b", "c"):
        try:
            dt = np.dtype(data.format)
        except TypeError:
            return data, None, None
        shape = data.shape or ()
    else:
        return data, None, None
    if dt in (np.dtype(np.uint8), np.dtype(np.int8)):
        ty = None  # raw bytes: the target's bytes as they stand
    else:
        ty = type_of_dtype(dt)
        if ty is None:
            raise InvalidArgumentError(f"{what}: data is a {dt} array, which no ferry type holds")
    if len(shape) < 2:
        return data, ty, None
    return data, ty, tuple(shape[:-1]) + (shape[-1] * dt.itemsize,)


def _squeezed(shape: Sequence[int]) -> Tuple[int, ...]:
    """shape without its axes of one index but the last: the same bytes in the same order."""
    return tuple(n for n in shape[:-1] if n != 1) + tuple(shape[-1:])


def _fits(data: Tuple[int, ...], region: Tuple[int, ...], whole: bool) -> bool:
    """Whether data (a byte shape) lays out as rows of region along data's first axis: of all of
    region when whole, else of its last len(data) axes. How many rows is the size check's."""
    k = len(data)
    return (k == len(region) or (not whole and k < len(region))) and data[1:] == region[len(region) - k + 1:]


def hold_memory(*tensors: Tensor, also: Sequence[Optional[Handle]] = ()) -> Hold:
    """A Hold, for a call into C that reads or writes the tensors, of each one's struct and memory
    (its root's buffer: its own handle, or for a borrowed buffer its owner's, a cache or scheduler)
    and of the handles also names (the backend that transfers): closed from another thread
    meanwhile, a buffer or owner is freed once the call returns. What was freed before is not held:
    C refuses it (a buffer by its id, a tensor by Tensor._p)."""
    handles = list(also)
    for t in tensors:
        buf = t.root._buffer
        handles.append(t._handle)
        if buf is not None:
            handles.append(buf._handle)
    return Hold(handles)


def writable_data(tensor: Tensor, data: Any, what: str, offset: int = 0, region: Optional[Sequence[int]] = None,
                  rows: Optional[Tuple[int, int, int, int, int]] = None) -> _pybuffer.CData:
    """The one check of every write of user data into ferry memory (Tensor.set and set_2d,
    Backend.set_async and set_2d_async, KVCache.set_stream, Tensor.from_numpy): dtype, shape and
    size, all before a byte moves.

    - dtype: typed data (a numpy array, a typed memoryview, another tensor's raw()) holds the
      tensor's type; raw bytes (bytes, bytearray, uint8 arrays) pass as the tensor's bytes.
    - shape: data of two or more dimensions lays out as the region it is written to (axes of one
      index aside): the tensor's shape, or leading rows of it from offset; a 2-D write's rows are
      data's rows. Flat data (one dimension, bytes) is values (bytes) in C order.
    - size: C's check of the transfer (ferry_tensor_check_transfer): the bytes stay inside the
      tensor; an exact region is filled exactly; a 2-D write's data holds its rows and no more.

    Every writer calls this, and C only after it: what it refuses leaves the memory as it was.

    Parameters
    ----------
    tensor : Tensor
        Where the data goes.
    data : bytes-like, numpy.ndarray or TensorBytes
    what : str
        The writer's name, which begins every message.
    offset : int, optional
        Bytes from the tensor's first byte.
    region : sequence of int, optional
        The numpy shape (in the tensor's values) the data must fill exactly; None: the tensor's
        own shape, of which data may fill leading rows.
    rows : (offset, size, n_copies, stride_tensor, stride_data), optional
        A 2-D write's rows, as _checks.transfer_2d gives them (offset is then rows[0]).

    Returns
    -------
    CData
        The data as C reads it; release it after the call (a context manager).

    Raises
    ------
    InvalidArgumentError
        For data of another type.
    LayoutError
        For data of another shape, or typed data at an offset inside an element.
    OutOfBoundsError, NotAllocatedError, FreedBufferError
        For data of another size, or a tensor without live memory.
    """
    payload, ty, shape = _payload(data, what)
    target = tensor.type
    if ty is not None and ty != target:
        hint = (f"convert the values (ferry.quantize(values, '{target}'), Tensor.from_numpy(..., type='{target}'))"
                if target != Type.I32 else "convert them to int32")
        held = f"{ty} bytes (a raw())" if isinstance(data, export.TensorBytes) else f"a {array_dtype(ty)} array"
        raise InvalidArgumentError(f"{what}: data is {held} but '{tensor.name}' holds {target}; {hint}, "
                                   "or pass its bytes (a uint8 view)")
    if ty is not None and offset % target.size:
        raise LayoutError(f"{what}: {target} values written at byte {offset} of '{tensor.name}' would start "
                          f"inside an element of {target.size} bytes")
    if rows is not None:
        offset = rows[0]
        expect: Tuple[int, ...] = (rows[2], rows[4])
    else:
        values = tuple(reversed(tensor.ne[: tensor.ndim])) if region is None else tuple(region)
        expect = values[:-1] + (row_size(target, values[-1]),)
    if shape is not None and not _fits(_squeezed(shape), _squeezed(expect), region is not None or rows is not None):
        given = data.shape if hasattr(data, "shape") else shape
        raise LayoutError(f"{what}: data shaped {tuple(given)} does not lay out as '{tensor.name}' takes it: "
                          f"{_describe(expect, target, region is None and rows is None)}")
    d = _pybuffer.readable(payload, what)
    try:
        _check_size(tensor, d.nbytes, what, offset, expect, region is not None, rows)
    except BaseException:
        d.release()
        raise
    return d


def _describe(expect: Tuple[int, ...], ty: Type, partial: bool) -> str:
    """The region a write fills, in words: its shape in values (rows of bytes for block types)."""
    dt = array_dtype(ty)
    shape = expect[:-1] + (expect[-1] // dt.itemsize,) if dt is not None else expect
    unit = f"{dt} values" if dt is not None else "bytes in the last axis"
    return f"shaped {shape} ({unit}){', or leading rows of that' if partial else ''}, or flat"


def _check_size(tensor: Tensor, nbytes: int, what: str, offset: int, expect: Tuple[int, ...], whole: bool,
                rows: Optional[Tuple[int, int, int, int, int]]) -> None:
    """C's check of the bytes written inside the tensor, then the data's length against it."""
    if rows is None:
        tensor._check_transfer(what, offset, nbytes)
        if whole and nbytes != math.prod(expect):
            raise OutOfBoundsError(f"{what}: the part of '{tensor.name}' written holds {math.prod(expect)} bytes, "
                                   f"the data {nbytes}")
        return
    tensor._check_transfer(what, *rows)
    _, size, n_copies, _, stride_data = rows
    need = _pybuffer.extent_2d(size, n_copies, stride_data, what)
    if nbytes < need:
        raise OutOfBoundsError(f"{what}: the data holds {nbytes} bytes but the transfer needs {need}")
    if need and nbytes > n_copies * stride_data:
        raise OutOfBoundsError(f"{what}: the data holds {nbytes} bytes but the transfer takes at most "
                               f"{n_copies * stride_data}: {n_copies} rows, {stride_data} bytes apart")
