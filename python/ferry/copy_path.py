"""How a split input reaches the backend that runs the split: copy policies, the ranges rule, copy statistics.

flat copies the whole nbytes() span, gaps included; ranges copies a host source whose
last dimension is evenly spaced dense ranges with one 2-D set (else flat); plan is the
later any-view planner. The destination's gap bytes are never written.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple, Optional, Union

from ._binding import ffi, lib
from .backend import Backend
from .errors import InvalidArgumentError, check
from .tensor import Tensor, _check_tensor


class CopyPolicy(enum.IntEnum):
    """A ferry_copy_policy; str() gives its name ("ranges")."""

    FLAT = lib.FERRY_COPY_FLAT
    RANGES = lib.FERRY_COPY_RANGES
    PLAN = lib.FERRY_COPY_PLAN

    def __str__(self) -> str:
        return ffi.string(lib.ferry_copy_policy_name(self.value)).decode()


PolicyLike = Union[CopyPolicy, str]


def to_policy(value: object) -> CopyPolicy:
    """A CopyPolicy from itself or its name ("flat", "ranges", "plan"); InvalidArgumentError otherwise."""
    if isinstance(value, CopyPolicy):
        return value
    if isinstance(value, str):
        out = ffi.new("ferry_copy_policy *")
        check(lib.ferry_copy_policy_from_name(value.encode(), out))
        return CopyPolicy(out[0])
    raise InvalidArgumentError(f"copy policy: expected a name (flat, ranges, plan) or a CopyPolicy, got {value!r}")


class CopyRanges(NamedTuple):
    """count rows of size bytes, row i at offset + i*stride (bytes from the tensor's first byte)."""

    offset: int
    size: int
    count: int
    stride: int


def copy_ranges_of(tensor: Tensor) -> Optional[CopyRanges]:
    """The seed's rule on layout alone: dimensions 0..2 one dense range repeated along dimension 3
    at a stride no smaller than it. None when the rule does not apply."""
    t = _check_tensor(tensor, "copy_ranges_of")
    out = ffi.new("ferry_copy_2d *")
    if not lib.ferry_copy_ranges_of(t._p, out):
        return None
    return CopyRanges(int(out.offset), int(out.size), int(out.count), int(out.stride))


def bytes_read(tensor: Tensor) -> int:
    """Bytes a graph reads through tensor: the distinct bytes of its elements (blocks whole)."""
    return int(lib.ferry_tensor_bytes_read(_check_tensor(tensor, "bytes_read")._p))


@dataclass(frozen=True)
class CopyStats:
    """What one input copy did: the path taken (FLAT when the policy's rule did not apply), the
    bytes the graph reads, the span a flat copy moves, the bytes that arrived, transfer requests
    and the operations that carried them out, and the wall time (synchronize included)."""

    path: CopyPolicy
    bytes_read: int
    bytes_span: int
    bytes_copied: int
    copy_calls: int
    impl_calls: int
    copy_seconds: float

    @classmethod
    def from_c(cls, s: object) -> "CopyStats":
        return cls(CopyPolicy(s.path), int(s.bytes_read), int(s.bytes_span),  # type: ignore[attr-defined]
                   int(s.bytes_copied), int(s.copy_calls), int(s.impl_calls),  # type: ignore[attr-defined]
                   float(s.copy_seconds))  # type: ignore[attr-defined]


def copy_input(split_backend: Backend, policy: PolicyLike, src: Tensor, dst: Tensor) -> CopyStats:
    """The scheduler's ordered copy of one input: src into dst (same type, ne and nb) by policy,
    blocking, with split_backend synchronized before and after."""
    if not isinstance(split_backend, Backend):
        raise InvalidArgumentError(f"copy_input: expected a Backend, got {type(split_backend).__name__}")
    pol = to_policy(policy)
    s, d = _check_tensor(src, "copy_input: src"), _check_tensor(dst, "copy_input: dst")
    out = ffi.new("ferry_copy_stats *")
    check(lib.ferry_copy_input(split_backend._p, pol.value, s._p, d._p, out))
    return CopyStats.from_c(out)

