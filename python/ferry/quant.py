"""Values of every type: the numpy dtype of each type's elements (bf16 as ml_dtypes.bfloat16),
conversion of values to and from each type (q8_0 and q4_0 quantized and dequantized by the C
library's ferry_quantize / ferry_dequantize, the one home of that arithmetic).

It sits beside types.py, below Tensor: what it does with tensors and backends it does
through their methods, importing neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from . import _checks, _pybuffer
from ._binding import ffi, lib
from .errors import InvalidArgumentError, OutOfBoundsError, check
from .types import Type, TypeLike, array_dtype, to_type

if TYPE_CHECKING:
    pass


def value_dtype(ty: TypeLike) -> np.dtype:
    """The dtype of ty's values as to_numpy gives them: the element dtype, float32 for block types."""
    dt = array_dtype(ty)
    return np.dtype(np.float32) if dt is None else dt


def quantize(values: Any, type: TypeLike) -> np.ndarray:
    """Values as the bytes of a type (ferry_quantize).

    Parameters
    ----------
    values : array_like
        Numbers, taken in C order: floats (ints too) for f32, f16, bf16, q8_0 and q4_0, integers
        that fit 32 bits for i32. Their count must be a whole number of blocks.
    type : Type, str or int
        f16 and bf16 round to nearest even; q8_0 and q4_0 are ggml's round-to-nearest reference,
        byte for byte.

    Returns
    -------
    numpy.ndarray
        uint8, the type's bytes (row_size(type, count) of them).

    Raises
    ------
    InvalidArgumentError
        For values that are not numbers, or not finite for q8_0 and q4_0.
    LayoutError
        For a count that is not whole blocks.
    """
    ty = to_type(type)
    arr = np.asarray(values)
    if ty == Type.I32:
        if arr.dtype.kind not in "iu" or not np.array_equal(arr.astype(np.int32).astype(arr.dtype), arr):
            raise InvalidArgumentError(f"quantize: values are {arr.dtype} but i32 holds integers that fit 32 bits")
        return np.ascontiguousarray(arr, np.int32).reshape(-1).view(np.uint8)
    if arr.dtype.kind not in "fiu" and arr.dtype.name != "bfloat16":
        raise InvalidArgumentError(f"quantize: values are {arr.dtype}, not numbers {ty} can hold")
    flat = np.ascontiguousarray(arr, np.float32).reshape(-1)
    n = flat.size
    out = np.empty(-(-n // ty.blck_size) * ty.size, np.uint8)  # whole blocks: C refuses a partial one
    check(lib.ferry_quantize(ty.value, ffi.from_buffer("float[]", flat), n, ffi.from_buffer(out), out.nbytes))
    return out


def pack_blocks(scales: Any, q: Any, type: TypeLike) -> np.ndarray:
    """Blocks of a block type from their parts: a scale per block and an integer per value
    (ferry_pack_blocks), for content whose blocks are chosen rather than quantized.

    Parameters
    ----------
    scales : array_like
        One scale per block, in C order; stored as f16.
    q : array_like
        Integers, one per value, in C order (a whole number of blocks): -128..127 for q8_0,
        -8..7 for q4_0. A value reads back as q * its block's scale.
    type : Type, str or int
        q8_0 or q4_0.

    Returns
    -------
    numpy.ndarray
        uint8, the type's bytes.

    Raises
    ------
    InvalidArgumentError
        For integers out of the type's range, or a count of scales other than one per block.
    LayoutError
        For a count of integers that is not whole blocks.
    UnsupportedError
        For a type that is not a block type.
    """
    ty = to_type(type)
    qa, sa = np.asarray(q).reshape(-1), np.ascontiguousarray(scales, np.float32).reshape(-1)
    if qa.dtype.kind not in "iu" or (qa.size and (qa.min() < -128 or qa.max() > 127)):
        raise InvalidArgumentError(f"pack_blocks: q holds {qa.dtype} values; {ty} blocks hold integers of 8 bits")
    qs = np.ascontiguousarray(qa, np.int8)
    out = np.empty(-(-qs.size // ty.blck_size) * ty.size, np.uint8)
    check(lib.ferry_pack_blocks(ty.value, ffi.from_buffer("float[]", sa), sa.size, ffi.from_buffer("int8_t[]", qs),
                                qs.size, ffi.from_buffer(out), out.nbytes))
    return out


def dequantize(data: Any, type: TypeLike, n: Optional[int] = None) -> np.ndarray:
    """The values that bytes of a type hold, as float32 (ferry_dequantize).

    Parameters
    ----------
    data : bytes-like or numpy.ndarray
        The type's bytes.
    type : Type, str or int
        f32, f16, bf16, q8_0 or q4_0 (i32 holds integers, not values).
    n : int, optional
        Values to read (default: all that data holds).

    Returns
    -------
    numpy.ndarray
        float32, n values.

    Raises
    ------
    OutOfBoundsError
        When data holds fewer than n values.
    UnsupportedError
        For i32.
    """
    ty = to_type(type)
    with _pybuffer.readable(data, "dequantize") as d:
        held = d.nbytes // ty.size * ty.blck_size
        n = held if n is None else _checks.as_int64(n, "dequantize: n")
        if n > held:  # before numpy is asked for n floats
            raise OutOfBoundsError(f"dequantize: {n} {ty} values need more than the {d.nbytes} bytes given")
        out = np.empty(max(n, 0), np.float32)
        check(lib.ferry_dequantize(ty.value, d.ptr, d.nbytes, n, ffi.from_buffer("float[]", out)))
    return out
