"""Zero-copy export of tensors to numpy, PyTorch and CuPy.

A tensor in host memory (pinned included) speaks numpy's array interface and DLPack; one in
CUDA device memory speaks __cuda_array_interface__ and DLPack. The consumer sees ferry's
memory with ferry's strides (shape and strides reversed: numpy order). Each export holds the
memory while its consumer holds the view: freeing the buffer (or closing the KV cache that
owns it) lets the memory go only when the last view does, so a view never dangles. The block
types (q8_0, q4_0) have no array dtype: Tensor.raw() exports their bytes as uint8, never the
tensor itself. Memory no one reads directly (synthetic addresses, the stand-in device's) and
memory an allocator or scheduler may replace at its next alloc are refused with a FerryError
that says why.

DLPack's structs are ferry.h's (ferry_dl_*). Exported managed tensors, their deleter and the
capsule's destructor are C (dlpack.c): consumers call them where no Python may run. Capsules
are made and read through the Python C API by ctypes, as cffi's ABI mode has no Python object
type. The module sits beside Tensor, whose protocol methods call it; it reaches buffers only
through the tensor.
"""

from __future__ import annotations

import ctypes
import gc
import weakref
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

import numpy as np

from . import _checks
from ._binding import ffi, lib
from ._handle import Handle
from .errors import FerryError, InvalidArgumentError, LayoutError, UnsupportedError, check, error_class
from .types import Type, array_dtype, bfloat16

if TYPE_CHECKING:
    from .tensor import Tensor

DL_CPU, DL_CUDA, DL_CUDA_HOST = 1, 2, 3
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT = 0, 1, 2, 4
_DL_CODES = {Type.F32: (_DL_FLOAT, 32), Type.F16: (_DL_FLOAT, 16), Type.BF16: (_DL_BFLOAT, 16),
             Type.I32: (_DL_INT, 32)}
_DL_TYPES = {v: k for k, v in _DL_CODES.items()}


class NoInterfaceError(UnsupportedError, AttributeError):
    """A protocol this tensor does not speak (__cuda_array_interface__ of host memory). It is an
    AttributeError too, so that a consumer asking hasattr() moves on to the next protocol."""


# ------------------------------------------------------------ export: what memory, and holding it


def _memory(t: "Tensor", what: str) -> Tuple[int, int, int]:
    """(kind, device, address) of t's first byte; the C refusal, prefixed with what, otherwise."""
    kind = ffi.new("ferry_memory_kind *")
    dev = ffi.new("int *")
    data = ffi.new("void **")
    st = lib.ferry_tensor_memory(t._p, kind, dev, data)
    if st != lib.FERRY_OK:
        message = ffi.string(lib.ferry_last_error()).decode("utf-8", "replace")
        raise error_class(st)(f"{what}: {message}", int(st))
    return int(kind[0]), int(dev[0]), int(ffi.cast("uintptr_t", data[0]))


def _host_address(t: "Tensor", what: str) -> int:
    kind, device, address = _memory(t, what)
    if kind != lib.FERRY_MEMORY_HOST:
        raise UnsupportedError(f"{what}: '{t.name}' is device memory of CUDA{device}, which the host cannot read; "
                               "PyTorch and CuPy take it through __cuda_array_interface__ or DLPack, and "
                               "to_numpy() copies it to the host")
    return address


class _Held:
    """What one export keeps alive while its consumer holds it: the tensor (and through it the
    Python objects of its memory: Buffer, KV cache, a foreign array) and a child of the handle that
    frees that memory, so an explicit free of it waits for the consumer to let go."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: Optional["Tensor"], child: Handle) -> None:
        self.tensor = tensor
        weakref.finalize(self, child.release)


def _hold(t: "Tensor", what: str) -> _Held:
    """A hold of t's memory for one export; refused for memory that an owner may move."""
    buf = t.buffer
    if buf is None:
        raise UnsupportedError(f"{what}: '{t.name}' was placed by an allocator ferry's Python side does not "
                               "know of; export a tensor of a Buffer, a KV cache or from_array")
    if buf._memory_may_move:
        owner = type(getattr(buf, "owner", None)).__name__
        raise UnsupportedError(f"{what}: '{t.name}' lies in memory the {owner} owns and replaces when it "
                               "allocates again, so a view of it could dangle; to_numpy() copies it")
    return _Held(t, Handle(object(), lambda _: None, buf._handle))


def _layout(t: "Tensor", raw: bool, what: str) -> Tuple[np.dtype, Tuple[int, ...], Tuple[int, ...]]:
    """dtype, shape and byte strides in numpy order; raw: uint8, each row of ne[0] values as its bytes."""
    n = t.ndim
    ne, nb = list(t.ne[:n]), list(t.nb[:n])
    if raw:
        dtype = np.dtype(np.uint8)
        ne[0], nb[0] = t.row_size, 1
    else:
        elem = array_dtype(t.type)
        if elem is None:
            raise UnsupportedError(f"{what}: {t.type} has no array dtype; t.raw() exports its bytes as uint8 and "
                                   "t.to_numpy() gives its values as float32")
        dtype = elem
    nb = [s if n > 1 else 0 for n, s in zip(ne, nb)]  # never stepped: any stride is right, 0 fits every consumer
    return dtype, tuple(reversed(ne)), tuple(reversed(nb))


# ------------------------------------------------------------ export: numpy's array interface


def array_interface(t: "Tensor", raw: bool = False) -> Dict[str, Any]:
    """numpy's __array_interface__ (version 3) of a host tensor: its memory, writable."""
    what = "__array_interface__"
    if not raw and t.type == Type.BF16:
        raise NoInterfaceError(f"{what}: the array interface has no name for bf16; numpy takes a bf16 tensor "
                               "through __array__, as ml_dtypes.bfloat16")
    dtype, shape, strides = _layout(t, raw, what)
    address = _host_address(t, what)
    # the data as a buffer object: numpy makes it the array's base, so the hold lasts as long as
    # this one view, not as long as the tensor
    memory = (ctypes.c_char * t.nbytes).from_address(address)
    setattr(memory, "_ferry_held", _hold(t, what))  # noqa: B010 - a ctypes array takes attributes
    return {"version": 3, "shape": shape, "typestr": dtype.str, "descr": dtype.descr,
            "data": memory, "strides": strides}


def as_array(t: "Tensor", dtype: Any = None, copy: Optional[bool] = None) -> np.ndarray:
    """numpy's __array__: a view of t's memory (bf16 as ml_dtypes.bfloat16); a copy when asked."""
    if copy is False and dtype is not None and np.dtype(dtype) != array_dtype(t.type):
        raise InvalidArgumentError(f"__array__: a view of '{t.name}' is {t.type}; dtype {np.dtype(dtype)} needs a copy")
    if t.type == Type.BF16:
        arr = np.asarray(TensorBytes(t, "__array__")).view(bfloat16())
    else:
        arr = np.asarray(_Values(t))
    if dtype is not None:
        arr = arr.astype(dtype, copy=bool(copy))
    return arr.copy() if copy else arr


class _Values:
    """t's values through the array interface, for __array__ (numpy's base holds this, this holds t)."""

    __slots__ = ("_t",)

    def __init__(self, t: "Tensor") -> None:
        self._t = t

    @property
    def __array_interface__(self) -> Dict[str, Any]:
        return array_interface(self._t)


# ------------------------------------------------------------ export: DLPack

_live: Dict[int, Any] = {}  # address of each exported managed tensor -> (it, its _Held)
# Looked up now: collecting and freeing run from the garbage collector too, and the first
# lookup of a lib function takes cffi's lock, which this thread may hold then.
_dlpack_deleted, _dlpack_free, _buffer_free = lib.ferry_dlpack_deleted, lib.ferry_dlpack_free, lib.ferry_buffer_free


def _collect() -> None:
    """Let go of the exports whose consumer called the deleter (or whose capsule went unconsumed):
    the deleter (ferry_dlpack_new's) only marks them, as it may run where no Python can."""
    for key in [k for k, (m, _) in list(_live.items()) if _dlpack_deleted(m)]:  # threads may add
        entry = _live.pop(key, None)  # or collect at the same time
        if entry is not None:
            _dlpack_free(entry[0])


def _collect_after_gc(phase: str, info: Dict[str, Any]) -> None:
    if phase == "stop":  # the collector runs with no exception pending: Python may run here
        _collect()


def _collect_after_each_gc() -> None:
    """From the first DLPack export on, collect after each garbage collection, so that a hold ends
    soon after its consumer lets go, not at the next export (an import of ferry adds nothing to
    the collector's work)."""
    if _collect_after_gc not in gc.callbacks:
        gc.callbacks.append(_collect_after_gc)


_CAPSULE_NAME = b"dltensor"  # module constants: a capsule keeps a pointer to its name
_VERSIONED_NAME = b"dltensor_versioned"
_USED_NAME = b"used_dltensor"


def _pythonapi(name: str, restype: Any, *argtypes: Any) -> Any:
    """A private prototype of a Python C API function (ctypes.pythonapi's own are shared by every
    user, who may set other argtypes on them)."""
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


_capsule_new = _pythonapi("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
_capsule_pointer_of = _pythonapi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)
_capsule_set_name = _pythonapi("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
# the capsule destructor is C (dlpack.c) and asks the capsule's name through these
check(lib.ferry_dlpack_set_capsule_api(
    ffi.cast("ferry_capsule_is_valid_fn", ctypes.cast(ctypes.pythonapi.PyCapsule_IsValid, ctypes.c_void_p).value),
    ffi.cast("ferry_capsule_pointer_fn", ctypes.cast(ctypes.pythonapi.PyCapsule_GetPointer, ctypes.c_void_p).value)))
_DESTRUCTOR = int(ffi.cast("uintptr_t", lib.ferry_dlpack_capsule_destructor))


def dlpack_device(t: "Tensor") -> Tuple[int, int]:
    """(DLDeviceType, device id): (1, 0) for host memory, pinned included; (2, n) for CUDAn."""
    kind, device, _ = _memory(t, "__dlpack_device__")
    return (DL_CPU, 0) if kind == lib.FERRY_MEMORY_HOST else (DL_CUDA, device)


def dlpack(t: "Tensor", raw: bool = False, stream: Any = None, max_version: Any = None, dl_device: Any = None,
           copy: Optional[bool] = None) -> Any:
    """A capsule viewing t's memory, writable: "dltensor_versioned" (DLPack 1.0) when max_version
    allows, else "dltensor". The consumer's deleter (or the capsule's end, if no one consumed it)
    lets go of what the export holds. stream is accepted and not waited on: ferry's transfers and
    computes have finished when they return."""
    what = "__dlpack__"
    if copy:
        raise UnsupportedError(f"{what}: ferry exports its own memory (copy=True); to_numpy() makes a copy")
    kind, device, address = _memory(t, what)
    dev = (DL_CPU, 0) if kind == lib.FERRY_MEMORY_HOST else (DL_CUDA, device)
    if dl_device is not None and tuple(dl_device) != dev:
        raise UnsupportedError(f"{what}: '{t.name}' lives on DLPack device {dev}, not {tuple(dl_device)}")
    dtype, shape, strides = _layout(t, raw, what)
    code, bits = (_DL_UINT, 8) if raw else _DL_CODES[t.type]
    for s in strides:
        if s % dtype.itemsize:
            raise LayoutError(f"{what}: the byte stride {s} of '{t.name}' is not a whole number of "
                              f"{dtype.itemsize}-byte elements, as DLPack counts strides")
    held = _hold(t, what)
    _collect()
    # DLPack 1.0 when the consumer takes it: only a versioned capsule can say the memory is writable
    versioned = max_version is not None and int(max_version[0]) >= 1
    out = ffi.new("void **")
    check(lib.ferry_dlpack_new(len(shape), versioned, out))
    managed = out[0]
    dl = ffi.cast("ferry_dl_managed_tensor_versioned *" if versioned else "ferry_dl_managed_tensor *",
                  managed).dl_tensor
    dl.data = ffi.cast("void *", address)
    dl.device.device_type, dl.device.device_id = dev
    dl.dtype.code, dl.dtype.bits, dl.dtype.lanes = code, bits, 1
    for i, (n, s) in enumerate(zip(shape, strides)):
        dl.shape[i], dl.strides[i] = n, s // dtype.itemsize
    dl.byte_offset = 0
    key = int(ffi.cast("uintptr_t", managed))
    _live[key] = (managed, held)
    _collect_after_each_gc()
    try:
        return _capsule_new(key, _VERSIONED_NAME if versioned else _CAPSULE_NAME, _DESTRUCTOR)
    except BaseException:
        del _live[key]
        lib.ferry_dlpack_free(managed)
        raise


def n_live_exports() -> int:
    """DLPack exports whose deleter has not run yet (0 once every consumer let go)."""
    _collect()
    return len(_live)


# ------------------------------------------------------------ export: CUDA array interface


def cuda_array_interface(t: "Tensor", raw: bool = False) -> Dict[str, Any]:
    """__cuda_array_interface__ (version 3) of a tensor in CUDA device memory. For other memory it
    raises NoInterfaceError, an AttributeError, so PyTorch and CuPy try their next protocol."""
    what = "__cuda_array_interface__"
    try:
        kind, _, address = _memory(t, what)
    except FerryError as e:
        raise NoInterfaceError(str(e)) from None
    if kind != lib.FERRY_MEMORY_CUDA:
        raise NoInterfaceError(f"{what}: '{t.name}' is host memory, which numpy's array interface and DLPack export")
    if not raw and t.type == Type.BF16:
        raise UnsupportedError(f"{what}: the interface has no name for bf16; DLPack exports it (torch.from_dlpack)")
    dtype, shape, strides = _layout(t, raw, what)
    if getattr(t, "_cai_held", None) is None:  # the consumer holds t itself: t holds the memory
        held = _hold(t, what)
        held.tensor = None  # no cycle: the hold goes with t
        setattr(t, "_cai_held", held)  # noqa: B010 - the tensor holds it, and nothing reads it
    # stream None: nothing to wait for, ferry's blocking calls have finished their work on return
    return {"version": 3, "shape": shape, "typestr": dtype.str, "data": (address, False), "strides": strides,
            "stream": None}


class TensorBytes:
    """A tensor's bytes as uint8, each row of ne[0] values its row_size bytes (Tensor.raw()): the
    export of the block types, whose elements no array dtype names. It speaks the same protocols
    as the tensor (array interface, DLPack, CUDA array interface) and holds the tensor;
    Tensor.set takes it back, writing those rows packed into a tensor of the same type.

    Its exported shape is the tensor's, reversed (numpy order), with the last axis the row's
    bytes; its strides are the tensor's, so a view exports its own rows, gaps skipped.

    Attributes
    ----------
    tensor : Tensor
        The tensor whose bytes it exports (kept alive by it).
    """

    def __init__(self, tensor: "Tensor", what: str = "raw") -> None:
        self.tensor = _checks.c_object(tensor, "ferry_tensor *", "a Tensor", what)

    @property
    def __array_interface__(self) -> Dict[str, Any]:
        return array_interface(self.tensor, raw=True)

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        return cuda_array_interface(self.tensor, raw=True)

    def __dlpack__(self, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Optional[bool] = None) -> Any:
        return dlpack(self.tensor, True, stream, max_version, dl_device, copy)

    def __dlpack_device__(self) -> Tuple[int, int]:
        return dlpack_device(self.tensor)

    def __repr__(self) -> str:
        return f"<TensorBytes of {self.tensor!r}>"
