"""Op constructors: each makes a new, unallocated, contiguous result Tensor that records the op.

Nothing is computed until a backend (Graph.compute) or a Scheduler runs the graph. The
result keeps its operands alive. Shapes that do not fit the op raise LayoutError with
C's message; arguments that cannot reach C raise InvalidArgumentError.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

from . import _args
from ._binding import ffi, lib
from .errors import InvalidArgumentError, raise_last
from .tensor import Tensor, _check_tensor
from .types import TypeLike, to_type


def _op(make: Callable[[Any, Any], int], operands: tuple, name: Optional[str]) -> Tensor:
    """The result of make in a new context, keeping operands alive."""
    for t in operands:
        t._check_retainable()
    return Tensor(make, deps=operands, name=name)


def add(a: Tensor, b: Tensor, name: Optional[str] = None) -> Tensor:
    """a + b, b repeated over a (each b.ne[i] divides a.ne[i]); same type."""
    pa, pb = _check_tensor(a, "add: a")._p, _check_tensor(b, "add: b")._p
    return _op(lambda ctx, out: lib.ferry_add(ctx, pa, pb, out), (a, b), name)


def mul(a: Tensor, b: Tensor, name: Optional[str] = None) -> Tensor:
    """a * b elementwise, b repeated over a; same type."""
    pa, pb = _check_tensor(a, "mul: a")._p, _check_tensor(b, "mul: b")._p
    return _op(lambda ctx, out: lib.ferry_mul(ctx, pa, pb, out), (a, b), name)


def scale(a: Tensor, s: float, name: Optional[str] = None) -> Tensor:
    """a * s for a finite float s (stored as f32)."""
    pa = _check_tensor(a, "scale")._p
    if isinstance(s, bool) or not isinstance(s, (int, float)):
        raise InvalidArgumentError(f"scale: expected a number, got {type(s).__name__} {s!r}")
    f = float(s)
    if not math.isfinite(f) or abs(f) > 3.4028234663852886e38:
        raise InvalidArgumentError(f"scale: {s!r} is not a finite f32")
    return _op(lambda ctx, out: lib.ferry_scale(ctx, pa, f, out), (a,), name)


def dup(a: Tensor, type: Optional[TypeLike] = None, name: Optional[str] = None) -> Tensor:
    """A contiguous copy of a (any strides), of a's type or converted to type."""
    pa = _check_tensor(a, "dup")._p
    if type is None:
        return _op(lambda ctx, out: lib.ferry_dup(ctx, pa, out), (a,), name)
    ty = to_type(type)
    return _op(lambda ctx, out: lib.ferry_dup_as(ctx, pa, ty.value, out), (a,), name)


def concat(a: Tensor, b: Tensor, dim: int, name: Optional[str] = None) -> Tensor:
    """a and b joined along dim (0..3): same type, same ne in every other dimension."""
    pa, pb = _check_tensor(a, "concat: a")._p, _check_tensor(b, "concat: b")._p
    d = _args.as_c_int(dim, "concat: dim")
    return _op(lambda ctx, out: lib.ferry_concat(ctx, pa, pb, d, out), (a, b), name)


def pad(a: Tensor, p0: int = 0, p1: int = 0, p2: int = 0, p3: int = 0, name: Optional[str] = None) -> Tensor:
    """a with p_i zeros appended at the end of dimension i."""
    pa = _check_tensor(a, "pad")._p
    p = [_args.as_c_int(v, f"pad: p{i}") for i, v in enumerate((p0, p1, p2, p3))]
    return _op(lambda ctx, out: lib.ferry_pad(ctx, pa, p[0], p[1], p[2], p[3], out), (a,), name)


def mean(a: Tensor, name: Optional[str] = None) -> Tensor:
    """The mean over dimension 0: ne[0] becomes 1."""
    pa = _check_tensor(a, "mean")._p
    return _op(lambda ctx, out: lib.ferry_mean(ctx, pa, out), (a,), name)


def op_name(op: int) -> str:
    """ferry's name for a ferry_op number (Tensor.op)."""
    n = _args.as_c_int(op, "op_name")
    p = lib.ferry_op_name(n)
    if p == ffi.NULL:
        raise_last()
    return ffi.string(p).decode()


__all__ = ["add", "mul", "scale", "dup", "concat", "pad", "mean", "op_name"]
