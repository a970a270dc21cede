"""ferry: copy the ranges of a multi-stream KV-cache window, not the span."""

from ._binding import ffi, lib

__all__ = ["ffi", "lib"]
