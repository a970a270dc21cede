"""Argument checks shared by every module, made in Python before a value reaches C.

cffi raises OverflowError (or TypeError) for a negative or too large value passed as
size_t / int64_t, and AttributeError for an object of the wrong class; ferry promises a
FerryError with a message instead, so every argument that goes to C passes through here
first. Each check returns the value as C will take it, or raises InvalidArgumentError.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable, List, Optional, Sequence, Tuple, Type, TypeVar

import numpy as np

from ._binding import ffi
from .errors import InvalidArgumentError, check

T = TypeVar("T")

SIZE_MAX = 2**64 - 1
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
INT_MAX = 2**31 - 1
INT_MIN = -(2**31)
F32_MAX = 3.4028234663852886e38


def as_int(value: object, what: str) -> int:
    """value as a Python int (bools and floats refused), else InvalidArgumentError."""
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{what}: expected an integer, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgumentError(f"{what}: expected an integer, got {type(value).__name__} {value!r}") from None


def as_bool(value: object, what: str) -> bool:
    """A bool argument: True or False (numpy's too), not any object Python would call truthy."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise InvalidArgumentError(f"{what}: expected a bool, got {type(value).__name__} {value!r}")


def as_size(value: object, what: str) -> int:
    """A size_t argument: an integer in 0..2**64-1."""
    n = as_int(value, what)
    if n < 0:
        raise InvalidArgumentError(f"{what}: {n} is negative")
    if n > SIZE_MAX:
        raise InvalidArgumentError(f"{what}: {n} overflows a 64-bit size")
    return n


def as_int64(value: object, what: str) -> int:
    """An int64_t argument (C itself refuses negative shapes, with its own message)."""
    n = as_int(value, what)
    if not INT64_MIN <= n <= INT64_MAX:
        raise InvalidArgumentError(f"{what}: {n} overflows a 64-bit integer")
    return n


def as_c_int(value: object, what: str) -> int:
    """A C int argument."""
    n = as_int(value, what)
    if not INT_MIN <= n <= INT_MAX:
        raise InvalidArgumentError(f"{what}: {n} overflows a C int")
    return n


def _is_sequence(x: object) -> bool:
    """A sequence of numbers: not a string, and an array only when 1-D (len() of a 0-d array
    raises, and a 2-D array's len() counts rows)."""
    return not isinstance(x, (str, bytes)) and hasattr(x, "__len__") and getattr(x, "ndim", 1) == 1


def as_shape(ne: Sequence[object], what: str) -> List[int]:
    """A shape of 1 to 4 int64 values (ggml order: ne[0] fastest)."""
    if not _is_sequence(ne):
        raise InvalidArgumentError(f"{what}: a shape is a sequence of 1 to 4 integers, got {ne!r}")
    if not 1 <= len(ne) <= 4:
        raise InvalidArgumentError(f"{what}: a shape has 1 to 4 dimensions, got {len(ne)}")
    return [as_int64(v, f"{what}: ne[{i}]") for i, v in enumerate(ne)]


def as_strides(nb: Sequence[object], n: int, what: str) -> List[int]:
    """n byte strides, each a size_t: a view's nb for a shape of n dimensions."""
    if not _is_sequence(nb) or len(nb) != n:
        raise InvalidArgumentError(f"{what}: {n} dimensions need {n} strides, got {nb!r}")
    return [as_size(v, f"{what}: nb[{i}]") for i, v in enumerate(nb)]


def as_byte(value: object, what: str) -> int:
    """A byte value to fill memory with: an integer in 0..255."""
    v = as_int(value, what)
    if not 0 <= v <= 255:
        raise InvalidArgumentError(f"{what} {v} is not a byte (0..255)")
    return v


def as_f32(value: object, what: str) -> float:
    """A number C takes as a finite float (f32): ints and floats, not bools."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(f"{what}: expected a number, got {type(value).__name__} {value!r}")
    f = float(value)
    if not math.isfinite(f) or abs(f) > F32_MAX:
        raise InvalidArgumentError(f"{what}: {value!r} is not a finite f32")
    return f


def as_double(value: object, what: str) -> float:
    """A number C takes as a double: ints and floats (numpy's too), not bools; C checks its range."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidArgumentError(f"{what}: expected a number, got {type(value).__name__} {value!r}")
    return float(value)


def transfer_2d(what: str, offset: object, size: object, n_copies: object, stride_tensor: object,
                stride_data: Optional[object]) -> Tuple[int, int, int, int, int]:
    """The (offset, size, n_copies, stride_tensor, stride_data) of a 2-D transfer, each a size_t;
    stride_data None means packed rows (the row size)."""
    n = as_size(size, f"{what}: size")
    return (
        as_size(offset, f"{what}: offset"),
        n,
        as_size(n_copies, f"{what}: n_copies"),
        as_size(stride_tensor, f"{what}: stride_tensor"),
        n if stride_data is None else as_size(stride_data, f"{what}: stride_data"),
    )


def instance(value: object, cls: Type[T], what: str, article: str = "a") -> T:
    """value itself when it is a cls, else InvalidArgumentError ("what: expected a cls, got ...")."""
    if not isinstance(value, cls):
        raise InvalidArgumentError(f"{what}: expected {article} {cls.__name__}, got {type(value).__name__}")
    return value


def c_object(value: object, ctype: str, noun: str, what: str) -> Any:
    """value itself when it wraps a live C object of type ctype ("ferry_backend *"), else
    InvalidArgumentError ("what: expected noun, got ...").

    For a module that takes an object of a higher layer (an Event takes a Backend): it checks
    the C object the call needs without importing the class. A freed object raises its own
    FerryError, as any use of it does.
    """
    ptr = getattr(value, "_p", None)
    if not isinstance(ptr, ffi.CData) or ffi.typeof(ptr) is not ffi.typeof(ctype):
        raise InvalidArgumentError(f"{what}: expected {noun}, got {type(value).__name__}")
    return value


_E = TypeVar("_E")


def from_c_name(cls: Callable[[int], _E], ctype: str, from_name: Callable[[bytes, Any], int], name: str) -> _E:
    """The cls member C's from_name (ferry_type_from_name, ferry_copy_policy_from_name) gives for
    name, whose enum is ctype; the FerryError C leaves for a name it does not know."""
    out = ffi.new(f"{ctype} *")
    check(from_name(name.encode(), out))
    return cls(out[0])
