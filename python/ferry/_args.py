"""Argument checks done in Python before a value reaches C.

cffi raises OverflowError (or TypeError) for a negative or too large value passed
as size_t / int64_t; ferry promises FerryError instead, so every integer that goes
to C passes through here first.
"""

from __future__ import annotations

import operator
from typing import List, Sequence

import numpy as np

from .errors import InvalidArgumentError

SIZE_MAX = 2**64 - 1
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
INT_MAX = 2**31 - 1
INT_MIN = -(2**31)


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


def as_shape(ne: Sequence[object], what: str) -> List[int]:
    """A shape of 1 to 4 int64 values (ggml order: ne[0] fastest)."""
    if isinstance(ne, (str, bytes)) or not hasattr(ne, "__len__"):
        raise InvalidArgumentError(f"{what}: a shape is a sequence of 1 to 4 integers, got {ne!r}")
    if not 1 <= len(ne) <= 4:
        raise InvalidArgumentError(f"{what}: a shape has 1 to 4 dimensions, got {len(ne)}")
    return [as_int64(v, f"{what}: ne[{i}]") for i, v in enumerate(ne)]
