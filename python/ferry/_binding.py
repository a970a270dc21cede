"""The cffi ABI-mode binding: the cdef generated from ferry.h and the library beside it."""

from __future__ import annotations

import os

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
