"""Element types: names and numbers, block and row sizes, numpy dtypes.

Quantized types are stored in blocks (q8_0: 32 values in 34 bytes); a row of n
values takes row_size(type, n) bytes and n must be a whole number of blocks.
"""

from __future__ import annotations

import enum
import functools
from typing import Dict, Optional, Tuple, Union

import numpy as np

from . import _checks
from ._binding import ffi, lib
from .errors import UnsupportedError, check, raise_last


class Type(enum.IntEnum):
    """A ferry_type. str() gives ferry's name for it ("q8_0")."""

    F32 = lib.FERRY_TYPE_F32
    F16 = lib.FERRY_TYPE_F16
    BF16 = lib.FERRY_TYPE_BF16
    I32 = lib.FERRY_TYPE_I32
    Q8_0 = lib.FERRY_TYPE_Q8_0
    Q4_0 = lib.FERRY_TYPE_Q4_0

    @property
    def type_name(self) -> str:
        """ferry's name for the type, as ferry_type_name gives it."""
        return ffi.string(lib.ferry_type_name(self.value)).decode()

    @property
    def size(self) -> int:
        """Bytes per block (per value for non-block types)."""
        return int(lib.ferry_type_size(self.value))

    @property
    def blck_size(self) -> int:
        """Values per block (1 for non-block types)."""
        return int(lib.ferry_blck_size(self.value))

    @property
    def is_quantized(self) -> bool:
        """Whether values are stored in blocks of more than one."""
        return self.blck_size > 1

    @property
    def numpy_dtype(self) -> np.dtype:
        """The numpy dtype of the type's values: float32, float16, ml_dtypes.bfloat16 or int32.

        Raises
        ------
        UnsupportedError
            For the block types, q8_0 and q4_0 (Tensor.to_numpy gives their values as float32,
            Tensor.raw their bytes).
        """
        dt = array_dtype(self)
        if dt is None:
            raise UnsupportedError(f"type {self} has no numpy dtype (only f32, f16, bf16 and i32 have)")
        return dt

    @property
    def read_by_attention(self) -> bool:
        """Whether decode attention reads K and V of this type, as ferry_attn_reads_type says."""
        return bool(lib.ferry_attn_reads_type(self.value))

    @classmethod
    def attention_types(cls) -> Tuple["Type", ...]:
        """The types decode attention reads K and V of, in ferry_type order, asked of C.

        Returns
        -------
        tuple of Type
            Every type whose read_by_attention is true (f32, f16, q8_0).
        """
        return tuple(t for t in cls if t.read_by_attention)

    def __str__(self) -> str:
        return self.type_name


#: What to_type takes: a Type, ferry's name for one, a ferry_type number, or a numpy dtype.
TypeLike = Union[Type, str, int, np.dtype, type]

#: The types numpy has a dtype of its own for; bf16's comes from ml_dtypes (bfloat16()).
_NUMPY_OWN: Dict[Type, np.dtype] = {
    Type.F32: np.dtype(np.float32),
    Type.F16: np.dtype(np.float16),
    Type.I32: np.dtype(np.int32),
}


@functools.lru_cache(maxsize=None)
def bfloat16() -> np.dtype:
    """ml_dtypes.bfloat16 (numpy has no bf16 of its own), imported on first use: importing ml_dtypes
    takes about a second, which every `import ferry` and every `ferry` command would otherwise pay."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def array_dtype(t: TypeLike) -> Optional[np.dtype]:
    """The numpy dtype of t's elements: float32, float16, bfloat16 or int32; None for the block types."""
    ty = to_type(t)
    return bfloat16() if ty == Type.BF16 else _NUMPY_OWN.get(ty)


def type_of_dtype(dt: np.dtype) -> Optional[Type]:
    """The Type whose elements dt holds, None for none (ml_dtypes is imported only for a dtype
    named bfloat16)."""
    for ty, known in _NUMPY_OWN.items():
        if dt == known:
            return ty
    return Type.BF16 if dt.name == "bfloat16" and dt == bfloat16() else None


def to_type(value: TypeLike) -> Type:
    """A Type from a Type, ferry's name for one, a number, or a numpy dtype.

    Parameters
    ----------
    value : Type, str, int, numpy.dtype or numpy scalar type
        A Type, ferry's name for one ("f16"), a ferry_type number, or the dtype of values
        (np.float16, np.dtype("float32"), ml_dtypes.bfloat16). A string is always ferry's name
        (one spelling per type: "f16", not "float16").

    Returns
    -------
    Type

    Raises
    ------
    UnknownTypeError
        For a name or number ferry does not know.
    UnsupportedError
        For a numpy dtype ferry has no type for.
    """
    if isinstance(value, Type):
        return value
    if isinstance(value, str):
        return _checks.from_c_name(Type, "ferry_type", lib.ferry_type_from_name, value)
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        dt = np.dtype(value)
        ty = type_of_dtype(dt)
        if ty is None:
            raise UnsupportedError(f"numpy dtype {dt} has no ferry type (float32, float16, bfloat16 and int32 have)")
        return ty
    n = _checks.as_c_int(value, "type")
    if n not in Type._value2member_map_:
        lib.ferry_type_name(ffi.cast("ferry_type", n))  # leaves C's message (a cast: the enum is unsigned)
        raise_last()
    return Type(n)


def row_size(t: TypeLike, n: int) -> int:
    """Bytes taken by a row of n values of a type.

    Parameters
    ----------
    t : Type, str or int
    n : int
        Values, a whole number of blocks.

    Returns
    -------
    int

    Raises
    ------
    LayoutError
        When n is not a whole number of blocks.
    """
    out = ffi.new("size_t *")
    check(lib.ferry_row_size(to_type(t).value, _checks.as_int64(n, "row_size: n"), out))
    return int(out[0])
