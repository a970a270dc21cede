"""Zero-copy import: tensors over memory another library owns.

from_array() makes a tensor over a numpy array, a PyTorch or CuPy tensor (host or CUDA device,
through __cuda_array_interface__ or DLPack), without a copy. The buffer behind it (a
ForeignBuffer) holds the owner, and for DLPack calls the producer's deleter, until it is freed;
ferry never frees the memory itself.
"""

from __future__ import annotations

import builtins
import weakref
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from ._binding import ffi, lib
from .buffer import Buffer, BufferType, cpu_buffer_type
from .cuda import cuda_buffer_type, cuda_device_count
from .errors import FerryError, InvalidArgumentError, LayoutError, UnsupportedError, check
from .export import (
    _CAPSULE_NAME,
    _DL_TYPES,
    _DL_UINT,
    _USED_NAME,
    DL_CPU,
    DL_CUDA,
    DL_CUDA_HOST,
    TensorBytes,
    _buffer_free,
    _capsule_pointer_of,
    _capsule_set_name,
)
from .quant import value_dtype
from .tensor import Tensor
from .types import Type, TypeLike, to_type, type_of_dtype


class ForeignBuffer(Buffer):
    """A buffer over memory another library owns. It holds the owner (and for DLPack, calls the
    producer's deleter) until the C buffer is freed, which leaves the memory itself alone."""

    def __init__(self, ptr: Any, buffer_type: BufferType, owner: object,
                 release: Optional[Callable[[], None]] = None) -> None:
        """Internal: take a ferry_buffer* from ferry_*_buffer_from_ptr; use from_array."""
        guards = _resize_guards(owner)

        def free(p: Any, owner: object = owner, guards: object = guards) -> None:  # both held until the C buffer goes
            _buffer_free(p)
            if release is not None:
                release()

        super().__init__(ptr, buffer_type, free)
        self._owner = owner

    @property
    def owner(self) -> object:
        """The object whose memory this is."""
        return self._owner


def _resize_guards(owner: object) -> List["weakref.ref[np.ndarray]"]:
    """A weak reference to owner and to each numpy array its memory is a view of (its bases): numpy
    refuses to resize an array that has one, refcheck=False or not, so none of them is reallocated
    while ferry's buffer points into it."""
    guards = []
    while isinstance(owner, np.ndarray):
        guards.append(weakref.ref(owner))
        owner = owner.base
    return guards


def _foreign_buffer(address: int, size: int, device: Optional[int], owner: object,
                    release: Optional[Callable[[], None]], what: str) -> ForeignBuffer:
    out = ffi.new("ferry_buffer **")
    base = ffi.cast("void *", address)
    try:
        if device is None:
            check(lib.ferry_host_buffer_from_ptr(base, size, out))
            return ForeignBuffer(out[0], cpu_buffer_type(), owner, release)
        check(lib.ferry_cuda_buffer_from_ptr(device, base, size, out))
        return ForeignBuffer(out[0], cuda_buffer_type(device), owner, release)
    except FerryError as e:
        if release is not None:
            release()
        raise type(e)(f"{what}: {e.message}", e.status) from None


def _cuda_device_of(obj: Any, address: int, size: int) -> int:
    """The device of a CUDA array: its own say (torch's device.index, CuPy's device.id), else
    the device CUDA says the memory is on."""
    dev = getattr(obj, "device", None)
    for attr in ("index", "id"):
        value = getattr(dev, attr, None)
        if isinstance(value, int):
            return value
    out = ffi.new("ferry_buffer **")
    for d in range(cuda_device_count()):
        if lib.ferry_cuda_buffer_from_ptr(d, ffi.cast("void *", address), size, out) == lib.FERRY_OK:
            lib.ferry_buffer_free(out[0])
            return d
    lib.ferry_clear_error()
    return 0  # ferry_cuda_buffer_from_ptr then says why not


def _span(shape: Sequence[int], strides: Sequence[int], itemsize: int) -> int:
    return itemsize + sum((n - 1) * s for n, s in zip(shape, strides))


def _tensor_over(what: str, address: int, dtype: np.dtype, shape: Sequence[int], strides: Optional[Sequence[int]],
                 device: Optional[int], owner: object, release: Optional[Callable[[], None]],
                 type: Optional[TypeLike], name: Optional[str]) -> "Tensor":
    """A ferry tensor over foreign memory of dtype, shape and byte strides (numpy order)."""
    try:
        ty, ne, nb, span = _foreign_layout(dtype, shape, strides, type)
    except FerryError as e:
        if release is not None:
            release()
        raise builtins.type(e)(f"{what}: {e.message}") from None
    buf = _foreign_buffer(address, span, device, owner, release, what)
    dense = ffi.new("size_t[]", len(ne))
    check(lib.ferry_contiguous_strides(ty.value, len(ne), ffi.new("int64_t[]", ne), dense))
    if all(n == 1 or s == d for n, s, d in zip(ne[1:], nb[1:], list(dense)[1:])):  # a unit axis is never stepped
        return buf.place(Tensor.new(ty, ne, name=name))  # dense: the tensor itself, not a view
    root = buf.place(Tensor.new(ty, [span // ty.size * ty.blck_size], name=f"{name or 'array'} memory"))
    return root.view(ne, nb, 0, name=name)


def _foreign_layout(dtype: np.dtype, shape: Sequence[int], strides: Optional[Sequence[int]],
                    type: Optional[TypeLike]) -> Tuple[Type, List[int], List[int], int]:
    """ferry's type, ne, nb and the bytes spanned of an array (numpy order in)."""
    shape = [int(n) for n in shape] or [1]
    if strides is None:  # C order
        strides = [dtype.itemsize * int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(len(shape))]
    strides = [int(s) for s in strides] or [dtype.itemsize]
    if len(shape) > 4:
        raise InvalidArgumentError(f"{len(shape)} dimensions; ferry tensors have at most 4")
    if 0 in shape:
        raise InvalidArgumentError(f"the array is empty (shape {tuple(shape)}): no memory to place a tensor in")
    if any(s < 0 for s in strides):
        raise LayoutError(f"negative strides {tuple(strides)}; ferry's strides are bytes forward")
    own = type_of_dtype(dtype)
    ty = to_type(type) if type is not None else own
    if ty is None:
        raise UnsupportedError(f"dtype {dtype} has no ferry type (float32, float16, bfloat16 and int32 have; "
                               "uint8 bytes need type=)")
    if ty != own and dtype != np.uint8:
        raise InvalidArgumentError(f"type is {ty} but the array holds {dtype}; a view cannot convert "
                                   "(Tensor.from_numpy(..., type=) copies and converts)")
    ne, nb = shape[::-1], strides[::-1]
    if ne[0] > 1 and nb[0] != dtype.itemsize:
        raise LayoutError(f"the last axis has a stride of {nb[0]} bytes; ferry needs its elements adjacent "
                          f"({dtype.itemsize} bytes apart)")
    if ty != own:  # uint8 bytes: each row is whole blocks of ty
        if ne[0] % ty.size:
            raise LayoutError(f"rows of {ne[0]} bytes are not whole {ty} blocks of {ty.size} bytes")
        ne[0] = ne[0] // ty.size * ty.blck_size
    nb[0] = ty.size
    out = ffi.new("size_t *")
    check(lib.ferry_layout_nbytes(ty.value, len(ne), ffi.new("int64_t[]", ne), ffi.new("size_t[]", nb), out))
    span = int(out[0])
    if span % ty.size:
        raise LayoutError(f"strides {tuple(strides)} span {span} bytes, not whole {ty.size}-byte elements")
    return ty, ne, nb, span


def _typestr_dtype(typestr: str, what: str) -> np.dtype:
    try:
        return np.dtype(typestr)
    except TypeError:
        raise UnsupportedError(f"{what}: typestr {typestr!r} is not a dtype") from None


def _from_cuda_array_interface(obj: Any, type: Optional[TypeLike], name: Optional[str]) -> "Tensor":
    what = "from_array (__cuda_array_interface__)"
    cai = obj.__cuda_array_interface__
    address, readonly = cai["data"]
    if readonly:
        raise InvalidArgumentError(f"{what}: the array is read-only; ferry tensors are written")
    dtype = _typestr_dtype(cai["typestr"], what)
    shape = cai["shape"]
    strides = cai.get("strides")
    size = _span(shape, strides, dtype.itemsize) if strides else dtype.itemsize * int(np.prod(shape or (1,)))
    device = _cuda_device_of(obj, address, max(size, 1))
    return _tensor_over(what, address, dtype, shape, strides, device, obj, None, type, name)


def _from_dlpack(obj: Any, type: Optional[TypeLike], name: Optional[str]) -> "Tensor":
    what = "from_array (DLPack)"
    try:
        capsule = obj.__dlpack__()
        address = _capsule_pointer_of(capsule, _CAPSULE_NAME)
    except Exception as e:
        raise InvalidArgumentError(f"{what}: {builtins.type(obj).__name__}.__dlpack__ gave no 'dltensor' "
                                   f"capsule ({e})") from None
    _capsule_set_name(capsule, _USED_NAME)  # consumed: the deleter is ours to call now
    managed = ffi.cast("ferry_dl_managed_tensor *", address)

    def release() -> None:
        if managed.deleter != ffi.NULL:
            managed.deleter(managed)

    dl = managed.dl_tensor
    dev_type, dev_id = int(dl.device.device_type), int(dl.device.device_id)
    code, bits, lanes = int(dl.dtype.code), int(dl.dtype.bits), int(dl.dtype.lanes)
    ty_dl = _DL_TYPES.get((code, bits))
    if lanes != 1 or (ty_dl is None and (code, bits) != (_DL_UINT, 8)):
        release()
        raise UnsupportedError(f"{what}: DLPack dtype (code {code}, {bits} bits, {lanes} lanes) has no ferry type")
    dtype = np.dtype(np.uint8) if ty_dl is None else value_dtype(ty_dl)  # an element type: its own dtype
    if dev_type in (DL_CPU, DL_CUDA_HOST):
        device = None
    elif dev_type == DL_CUDA:
        device = dev_id
    else:
        release()
        raise UnsupportedError(f"{what}: DLPack device type {dev_type} is neither host memory nor CUDA")
    ndim = int(dl.ndim)
    shape = [int(dl.shape[i]) for i in range(ndim)]
    strides = None if dl.strides == ffi.NULL else [int(dl.strides[i]) * dtype.itemsize for i in range(ndim)]
    address = int(ffi.cast("uintptr_t", dl.data)) + int(dl.byte_offset)
    return _tensor_over(what, address, dtype, shape, strides, device, obj, release, type, name)


def from_array(obj: Any, type: Optional[TypeLike] = None, name: Optional[str] = None) -> "Tensor":
    """A tensor over obj's memory, without a copy: a numpy array (or anything numpy views without
    copying), a PyTorch or CuPy tensor on the host or a CUDA device (__cuda_array_interface__ or
    DLPack). ne is obj's shape reversed and nb its byte strides reversed; the last axis must be
    dense. type: for uint8 bytes, the type their rows hold (q8_0 blocks); otherwise it must be
    obj's own. The tensor's buffer (a ForeignBuffer) holds obj until it is freed, and numpy
    meanwhile refuses to resize obj or an array it is a view of; writes through either side are
    seen by the other. Device arrays must be ready: synchronize their stream
    first (torch.cuda.synchronize())."""
    if isinstance(obj, (Tensor, TensorBytes)):
        raise InvalidArgumentError("from_array: this is ferry's own tensor; use it, or a view of it")
    if not isinstance(obj, np.ndarray) and not hasattr(obj, "__array_interface__"):
        if hasattr(obj, "__dlpack__"):  # PyTorch, CuPy, JAX: host or device, bf16 too
            return _from_dlpack(obj, type, name)
        if hasattr(obj, "__cuda_array_interface__"):
            return _from_cuda_array_interface(obj, type, name)
    what = "from_array"
    if isinstance(obj, (bytes, str)):
        raise InvalidArgumentError(f"{what}: {builtins.type(obj).__name__} is immutable; ferry tensors are written")
    try:
        arr = np.asarray(obj)
    except Exception as e:
        raise InvalidArgumentError(f"{what}: {builtins.type(obj).__name__} is not an array ({e})") from None
    if arr.dtype == object or (arr.base is None and arr is not obj):
        raise InvalidArgumentError(f"{what}: numpy could not view {builtins.type(obj).__name__} without a copy")
    if not arr.flags.writeable:
        raise InvalidArgumentError(f"{what}: the array is read-only; ferry tensors are written")
    address = int(arr.__array_interface__["data"][0])
    return _tensor_over(what, address, arr.dtype, arr.shape, arr.strides, None, arr, None, type, name)
