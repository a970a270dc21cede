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


def attn_decode(q: Tensor, k: Tensor, v: Tensor, kv_len: Tensor, scale: Optional[float] = None,
                v_trans: bool = False, name: Optional[str] = None) -> Tensor:
    """Decode attention, one query token per stream: f32 [head_dim, n_head, 1, ns],
    softmax(scale * q.k) . v per query head, over the first kv_len[s] cells of stream s.

    q is f32 [head_dim, n_head, 1, ns]; k a permuted K window [head_dim, n_kv, n_head_kv, ns]
    (KVCache.window); v the same, or with v_trans [n_kv, head_dim, n_head_kv, ns]; kv_len i32
    [ns] (clamped to 0..n_kv; 0 gives a zero row). K and V are f32, f16 or q8_0 (q8_0 V not
    transposed); query head h reads KV head h // (n_head // n_head_kv). scale defaults to
    1/sqrt(head_dim). Deterministic: the same bytes in give the same bytes out on a backend.
    """
    pq, pk = _check_tensor(q, "attn_decode: q")._p, _check_tensor(k, "attn_decode: k")._p
    pv, pl = _check_tensor(v, "attn_decode: v")._p, _check_tensor(kv_len, "attn_decode: kv_len")._p
    if not isinstance(v_trans, bool):
        raise InvalidArgumentError(f"attn_decode: v_trans must be a bool, got {v_trans!r}")
    if scale is None:
        head_dim = q.ne[0]
        if head_dim <= 0:
            raise InvalidArgumentError(f"attn_decode: q has head_dim {head_dim}: give scale")
        f = 1.0 / math.sqrt(head_dim)
    else:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise InvalidArgumentError(f"attn_decode: scale must be a number, got {type(scale).__name__} {scale!r}")
        f = float(scale)
        if not math.isfinite(f) or abs(f) > 3.4028234663852886e38:
            raise InvalidArgumentError(f"attn_decode: scale {scale!r} is not a finite f32")
    return _op(lambda ctx, out: lib.ferry_attn_decode(ctx, pq, pk, pv, pl, f, v_trans, out), (q, k, v, kv_len), name)


def op_name(op: int) -> str:
    """ferry's name for a ferry_op number (Tensor.op)."""
    n = _args.as_c_int(op, "op_name")
    p = lib.ferry_op_name(ffi.cast("ferry_op", n))  # a cast: the enum is unsigned, C names a negative one
    if p == ffi.NULL:
        raise_last()
    return ffi.string(p).decode()


__all__ = ["add", "mul", "scale", "dup", "concat", "pad", "mean", "attn_decode", "op_name"]
