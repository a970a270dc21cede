"""The cffi ABI-mode binding: the cdef generated from ferry.h and the library beside it."""

from __future__ import annotations

import os
from typing import Any, Callable, Generic, NoReturn, Optional, TypeVar, Union, overload

import cffi

_HERE = os.path.dirname(os.path.abspath(__file__))
CDEF_PATH = os.path.join(_HERE, "ferry_cdef.h")
LIB_PATH = os.path.join(_HERE, "libferry.so")

ffi = cffi.FFI()
with open(CDEF_PATH, encoding="utf-8") as _f:
    ffi.cdef(_f.read())
lib = ffi.dlopen(LIB_PATH)

if ffi.sizeof("ferry_tensor") != lib.ferry_sizeof_tensor() or ffi.sizeof("ferry_stats") != lib.ferry_sizeof_stats():
    raise ImportError(
        "ferry: the installed cdef does not match the library it sits beside; reinstall ferry"
    )


T = TypeVar("T")


def _pointer(obj: Any) -> Any:
    return obj._p


class query(Generic[T]):
    """A read-only attribute whose value is a C query of its object: convert(fn(of(obj))).

    For the attributes that only ask C (a tensor's nbytes, a backend's name): one line each
    instead of a property apiece. of gives what fn takes (default: the object's live C
    pointer, obj._p, which refuses a freed object).
    """

    def __init__(self, fn: Callable[[Any], Any], convert: Callable[[Any], T], doc: str,
                 of: Callable[[Any], Any] = _pointer) -> None:
        self._fn = fn
        self._convert = convert
        self._of = of
        self.__doc__ = doc

    @overload
    def __get__(self, obj: None, owner: Optional[type] = None) -> "query[T]": ...

    @overload
    def __get__(self, obj: object, owner: Optional[type] = None) -> T: ...

    def __get__(self, obj: Optional[object], owner: Optional[type] = None) -> Union[T, "query[T]"]:
        if obj is None:
            return self
        return self._convert(self._fn(self._of(obj)))

    def __set__(self, obj: object, value: NoReturn) -> None:
        raise AttributeError("a C query is read-only")


def c_str(p: Any) -> str:
    """A C string as str (what query's convert takes for a name)."""
    return ffi.string(p).decode()
