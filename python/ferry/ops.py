"""Op constructors: each makes a new, unallocated, contiguous result Tensor that records the op.

Nothing is computed until a backend (Graph.compute) or a Scheduler runs the graph. The
result keeps its operands alive. Shapes that do not fit the op raise LayoutError with
C's message; arguments that cannot reach C raise InvalidArgumentError. Each takes name,
the result's name (optional), and returns the result, unallocated. a + b and a * b are
add(a, b) and mul(a, b), Python's operators for them.
"""

from __future__ import annotations

import math
import weakref
from typing import Optional

from . import _checks
from ._binding import ffi, lib
from .errors import InvalidArgumentError, raise_last
from .tensor import Tensor
from .types import TypeLike, to_type


def add(a: Tensor, b: Tensor, name: Optional[str] = None) -> Tensor:
    """a + b, b repeated over a.

    Parameters
    ----------
    a, b : Tensor
        Same type; each b.ne[i] divides a.ne[i].
    name : str, optional

    Returns
    -------
    Tensor
        a's shape and type.

    Raises
    ------
    InvalidArgumentError
        For operands that are not Tensors.
    LayoutError
        For shapes that do not repeat.
    """
    return _checks.instance(a, Tensor, "add: a")._binary(lib.ferry_add, b, "add", name)


def mul(a: Tensor, b: Tensor, name: Optional[str] = None) -> Tensor:
    """a * b elementwise, b repeated over a: as add, with the same parameters, result and errors."""
    return _checks.instance(a, Tensor, "mul: a")._binary(lib.ferry_mul, b, "mul", name)


def scale(a: Tensor, s: float, name: Optional[str] = None) -> Tensor:
    """a * s.

    Parameters
    ----------
    a : Tensor
    s : float
        A finite number, stored as f32.
    name : str, optional

    Returns
    -------
    Tensor
        Each value of a times s, in a's type.

    Raises
    ------
    InvalidArgumentError
        For a that is not a Tensor, or s not a finite f32.
    """
    pa = _checks.instance(a, Tensor, "scale")._p
    f = _checks.as_f32(s, "scale")
    return a._op(lambda ctx, out: lib.ferry_scale(ctx, pa, f, out), (a,), name)


def dup(a: Tensor, type: Optional[TypeLike] = None, name: Optional[str] = None) -> Tensor:
    """A contiguous copy of a (any strides).

    Parameters
    ----------
    a : Tensor
    type : Type, str or int, optional
        The copy's type; None keeps a's.
    name : str, optional

    Returns
    -------
    Tensor
        a's shape, contiguous, of type (or a's).
    """
    pa = _checks.instance(a, Tensor, "dup")._p
    if type is None:
        return a._op(lambda ctx, out: lib.ferry_dup(ctx, pa, out), (a,), name)
    ty = to_type(type)
    return a._op(lambda ctx, out: lib.ferry_dup_as(ctx, pa, ty.value, out), (a,), name)


def concat(a: Tensor, b: Tensor, dim: int, name: Optional[str] = None) -> Tensor:
    """a and b joined along a dimension.

    Parameters
    ----------
    a, b : Tensor
        Same type, same ne in every other dimension.
    dim : int
        0..3.
    name : str, optional

    Returns
    -------
    Tensor
        a's shape but ne[dim] = a.ne[dim] + b.ne[dim].

    Raises
    ------
    LayoutError
        For shapes that do not join.
    """
    pa = _checks.instance(a, Tensor, "concat: a")._p
    pb = _checks.instance(b, Tensor, "concat: b")._p
    d = _checks.as_c_int(dim, "concat: dim")
    return a._op(lambda ctx, out: lib.ferry_concat(ctx, pa, pb, d, out), (a, b), name)


def pad(a: Tensor, p0: int = 0, p1: int = 0, p2: int = 0, p3: int = 0, name: Optional[str] = None) -> Tensor:
    """a with zeros appended at the end of each dimension.

    Parameters
    ----------
    a : Tensor
    p0, p1, p2, p3 : int, optional
        Zeros after dimension 0, 1, 2, 3.
    name : str, optional

    Returns
    -------
    Tensor
        [ne0 + p0, ne1 + p1, ne2 + p2, ne3 + p3], unallocated.
    """
    pa = _checks.instance(a, Tensor, "pad")._p
    p = [_checks.as_c_int(v, f"pad: p{i}") for i, v in enumerate((p0, p1, p2, p3))]
    return a._op(lambda ctx, out: lib.ferry_pad(ctx, pa, p[0], p[1], p[2], p[3], out), (a,), name)


def mean(a: Tensor, name: Optional[str] = None) -> Tensor:
    """The mean of Tensor a over dimension 0 (ne[0] becomes 1): a new unallocated Tensor named name."""
    pa = _checks.instance(a, Tensor, "mean")._p
    return a._op(lambda ctx, out: lib.ferry_mean(ctx, pa, out), (a,), name)


#: The V windows a KV cache made (KVCache.window), each with whether its cache stores V transposed.
#: A window's shape cannot tell (with n_kv == head_dim both layouts have the same ne), so attention
#: takes the layout from here and refuses a v_trans that disagrees.
_V_WINDOWS: "weakref.WeakKeyDictionary[Tensor, bool]" = weakref.WeakKeyDictionary()


def mark_v_window(v: Tensor, v_trans: bool) -> None:
    """Record that v is a KV cache's V window, transposed or not (for KVCache.window)."""
    _V_WINDOWS[v] = bool(v_trans)


def window_v_trans(v: object) -> Optional[bool]:
    """Whether v, a KV cache's V window, is transposed; None for any other tensor (or object)."""
    return _V_WINDOWS.get(v) if isinstance(v, Tensor) else None


def v_layout(v: Tensor, v_trans: Optional[bool], what: str) -> bool:
    """The v_trans attention reads v with: its cache's, for a cache's V window, else v_trans (default
    False); InvalidArgumentError naming v_trans for one that is not a bool or disagrees with v's cache."""
    if v_trans is not None and not isinstance(v_trans, bool):
        raise InvalidArgumentError(f"{what}: v_trans must be a bool or None, got {v_trans!r}")
    known = window_v_trans(v)
    if known is None:
        return bool(v_trans)
    if v_trans is not None and v_trans != known:
        raise InvalidArgumentError(f"{what}: v_trans={v_trans}, but v is the V window of a KV cache whose V is "
                                   f"{'' if known else 'not '}transposed (v_trans={known}): leave v_trans out, or "
                                   "pass the cache's")
    return known


def attn_decode(q: Tensor, k: Tensor, v: Tensor, kv_len: Tensor, scale: Optional[float] = None,
                v_trans: Optional[bool] = None, name: Optional[str] = None) -> Tensor:
    """Decode attention, n_tok query tokens per stream: softmax(scale * q.k) . v per query head and
    token, token t of stream s over the stream's first kv_len[s] - n_tok + t + 1 cells (its own cell
    and those before it: causal within the step's new tokens, whose cells were written to the cache
    before the step). Query head h reads KV head h // (n_head // n_head_kv). Deterministic: the same
    bytes in give the same bytes out on a backend; on the CPU token t's output is byte for byte a
    one-token step's at length kv_len[s] - n_tok + t + 1. CUDA takes one token only (the scheduler
    runs more on the CPU).

    Parameters
    ----------
    q : Tensor
        f32 [head_dim, n_head, n_tok, ns], n_tok from 1 to the window's n_kv.
    k : Tensor
        A permuted K window [head_dim, n_kv, n_head_kv, ns] (KVCache.window): f32, f16 or q8_0.
    v : Tensor
        The same as k, or transposed [n_kv, head_dim, n_head_kv, ns] (not q8_0).
    kv_len : Tensor
        i32 [ns]: cells of each stream, the step's new ones counted (clamped to 0..n_kv; 0 gives zero
        rows). A k carrying its lengths (Tensor.set_used_cells) refuses one outside 0..its limit
        instead. A length of 1..n_tok - 1 is refused when computed (OutOfBoundsError, naming the
        stream).
    scale : float, optional
        Default 1/sqrt(head_dim).
    v_trans : bool, optional
        v is transposed. A KV cache's V window (KVCache.window) says itself whether it is, and a
        v_trans that disagrees is refused (with n_kv == head_dim both layouts have v's shape);
        default: the window's, or False for any other v.
    name : str, optional

    Returns
    -------
    Tensor
        f32 [head_dim, n_head, n_tok, ns], unallocated.

    Raises
    ------
    InvalidArgumentError
        For operands that are not Tensors, a scale that is not a finite f32, v_trans neither a bool
        nor None, or a v_trans other than v's cache's.
    LayoutError
        For shapes or types that do not fit (q of no token or of more tokens than k's n_kv cells
        among them).
    """
    pq, pk = _checks.instance(q, Tensor, "attn_decode: q")._p, _checks.instance(k, Tensor, "attn_decode: k")._p
    pv = _checks.instance(v, Tensor, "attn_decode: v")._p
    pl = _checks.instance(kv_len, Tensor, "attn_decode: kv_len")._p
    vt = v_layout(v, v_trans, "attn_decode")
    if scale is None:
        head_dim = int(pq.ne[0])
        if head_dim <= 0:
            raise InvalidArgumentError(f"attn_decode: q has head_dim {head_dim}: give scale")
        f = 1.0 / math.sqrt(head_dim)
    else:
        f = _checks.as_f32(scale, "attn_decode: scale")
    return q._op(lambda ctx, out: lib.ferry_attn_decode(ctx, pq, pk, pv, pl, f, vt, out), (q, k, v, kv_len), name)


def attn_paged(q: Tensor, k_pool: Tensor, v_pool: Tensor, table: Tensor, kv_len: Tensor, block_size: int,
               scale: Optional[float] = None, v_trans: bool = False, name: Optional[str] = None) -> Tensor:
    """Paged attention: attn_decode's attention (n_tok query tokens per stream, causal within them,
    GQA, the same types), reading each stream's K and V cells through its block table in a paged
    cache's pools (PagedKVCache.k, .v), so that no dense window is built. On the CPU the output is
    byte for byte attn_decode's over the window the paged cache's gather builds.

    Parameters
    ----------
    q : Tensor
        f32 [head_dim, n_head, n_tok, ns], n_tok from 1 to the cells the table's blocks reach.
    k_pool : Tensor
        [head_dim * n_head_kv, n_slots * block_size]: a paged cache's K pool (PagedKVCache.k), f32,
        f16 or q8_0; cell c of slot b is pool cell b * block_size + c.
    v_pool : Tensor
        The same, or with v_trans [n_slots * block_size, head_dim * n_head_kv] (not q8_0).
    table : Tensor
        i32 [max_blocks, ns] (PagedKVCache.table_tensor): stream s's i-th block's slot. Entries past
        what a stream's length reaches are never read (-1 is fine there).
    kv_len : Tensor
        i32 [ns]: cells of each stream, the step's new ones counted (clamped to 0..max_blocks *
        block_size). A length of 1..n_tok - 1 is refused when computed (OutOfBoundsError, naming the
        stream).
    block_size : int
        Cells per block (slot), 1 to 2**31 - 1.
    scale : float, optional
        Default 1/sqrt(head_dim).
    v_trans : bool, optional
        v_pool is transposed (one row per channel). Default False.
    name : str, optional

    Returns
    -------
    Tensor
        f32 [head_dim, n_head, n_tok, ns], unallocated.

    Raises
    ------
    InvalidArgumentError
        For operands that are not Tensors, a block_size not in 1..2**31 - 1, a scale that is not a
        finite f32, or v_trans not a bool.
    LayoutError
        For shapes or types that do not fit (each names the operand). A table entry that a stream's
        length reaches and that is not a slot of the pools is refused when computed
        (OutOfBoundsError, naming the stream and the entry), before any output is written.
    """
    what = "attn_paged"
    pq = _checks.instance(q, Tensor, f"{what}: q")._p
    pk = _checks.instance(k_pool, Tensor, f"{what}: k_pool")._p
    pv = _checks.instance(v_pool, Tensor, f"{what}: v_pool")._p
    pt = _checks.instance(table, Tensor, f"{what}: table")._p
    pl = _checks.instance(kv_len, Tensor, f"{what}: kv_len")._p
    bs = _checks.as_int64(block_size, f"{what}: block_size")
    vt = _checks.as_bool(v_trans, f"{what}: v_trans")
    if scale is None:
        head_dim = int(pq.ne[0])
        if head_dim <= 0:
            raise InvalidArgumentError(f"{what}: q has head_dim {head_dim}: give scale")
        f = 1.0 / math.sqrt(head_dim)
    else:
        f = _checks.as_f32(scale, f"{what}: scale")
    return q._op(lambda ctx, out: lib.ferry_attn_paged(ctx, pq, pk, pv, pt, pl, bs, f, vt, out),
                 (q, k_pool, v_pool, table, kv_len), name)


def op_name(op: int) -> str:
    """ferry's name for an op.

    Parameters
    ----------
    op : int
        A ferry_op number (Tensor.op).

    Returns
    -------
    str

    Raises
    ------
    InvalidArgumentError
        For a number that is not an op.
    """
    n = _checks.as_c_int(op, "op_name")
    p = lib.ferry_op_name(ffi.cast("ferry_op", n))  # a cast: the enum is unsigned, C names a negative one
    if p == ffi.NULL:
        raise_last()
    return ffi.string(p).decode()


__all__ = ["add", "mul", "scale", "dup", "concat", "pad", "mean", "attn_decode", "attn_paged", "op_name"]
