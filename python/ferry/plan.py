"""Copy plans: the fewest 2-D copies that move exactly the bytes a view reads, and what they cost.

plan_copy(tensor) plans an existing view, plan_copy(type, ne, nb, offset) a view given by its
layout alone (metadata only: nothing is allocated). Both return Copy2D rows with offsets from
the first byte of the view's source, as ferry_copy_plan computes them
(lib/src/copy-plan.c). CopyCostModel is ferry_copy_cost_model; plan_cost, flat_cost and
plan_pays are the rule the plan copy policy uses to choose between the plan and flat.
explain() says in words how the planner reduces a layout to its copies. plan_paged says how a
paged window's gather goes into a backend: its blocks, runs, calls, bytes and each method's
predicted time. The cost models live in ferry.copy_cost, paged plans in ferry.paged_plan and a plan's
pieces in ferry.pieces; ferry.plan gives their public names too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple, Union

from . import _checks
from ._binding import ffi, lib
from .copy2d import Copy2D, to_c
from .copy_cost import PIECE_CURVE_SLOWER, CopyCostModel, ModelLike, cost_model, flat_cost, plan_cost
from .errors import InvalidArgumentError, LayoutError, UnsupportedError, check
from .paged_plan import GatherCopy, PagedPlan, plan_paged
from .pieces import MAX_PIECES, Piece, copy_pieces, gather_pieces, merge_pieces
from .tensor import Tensor
from .types import TypeLike, to_type

__all__ = [
    # plans of a view, and the plan against flat or a ragged window's, by a cost model
    "plan_copy", "layout_view", "plan_pays", "plan_ragged", "Explanation", "explain",
    # the cost models (ferry.copy_cost)
    "CopyCostModel", "ModelLike", "cost_model", "plan_cost", "flat_cost", "PIECE_CURVE_SLOWER",
    # a paged window's gather (ferry.paged_plan)
    "GatherCopy", "PagedPlan", "plan_paged",
    # a plan's pieces for a batch transfer (ferry.pieces)
    "Piece", "MAX_PIECES", "copy_pieces", "gather_pieces", "merge_pieces",
]

# ---------------------------------------------------------------- planning


def _c_plan(t: Tensor) -> List[Copy2D]:
    """ferry_copy_plan of t: count, then fill; offsets relative to t's own data."""
    p = t._p
    n = ffi.new("size_t *")
    check(lib.ferry_copy_plan(p, ffi.NULL, 0, n))
    if n[0] == 0:
        return []
    copies = ffi.new("ferry_copy_2d[]", n[0])
    check(lib.ferry_copy_plan(p, copies, n[0], n))
    return [Copy2D.from_c(c) for c in copies[0:n[0]]]


def _plan_of(t: Tensor) -> List[Copy2D]:
    """plan_copy of a tensor: offsets from the first byte of its root."""
    base = t.offset
    return [c._replace(offset=c.offset + base) for c in _c_plan(t)]


def layout_view(type: TypeLike, ne: Sequence[int], nb: Sequence[int], offset: int = 0,
                name: str = "planned", source: Optional[Tensor] = None) -> Tensor:
    """A view with exactly a given layout (metadata only: nothing is allocated).

    nb may be any permutation a ferry view can reach: nb[0] is the element size, or, for plain
    (non-block) types, some dimension has stride = element size or one value, and the view is
    made with it first and permuted.

    Parameters
    ----------
    type : Type, str or int
    ne : sequence of int
        1 to 4 values per dimension.
    nb : sequence of int
        Byte strides, one per dimension.
    offset : int, optional
        Where the view starts in its source, in bytes.
    name : str, optional
        The view's name.
    source : Tensor, optional
        The tensor to view; None: an unallocated tensor just large enough for the view.

    Returns
    -------
    Tensor

    Raises
    ------
    LayoutError, InvalidArgumentError, OutOfBoundsError
        With C's message, for a layout no ferry view has.
    """
    ty = to_type(type)
    if source is not None and _checks.instance(source, Tensor, "plan_copy: source").type != ty:
        raise LayoutError(f"plan_copy: the source is {source.type}, the view {ty}")
    shape = _checks.as_shape(ne, "plan_copy: ne")
    strides = _checks.as_strides(nb, len(shape), "plan_copy")
    off = _checks.as_size(offset, "plan_copy: offset")
    unit = ty.size
    shape4 = shape + [1] * (4 - len(shape))
    strides4 = _view_strides(ty, shape, strides)
    first = 0
    swap = strides4[0] != unit and not ty.is_quantized  # block types: the view refuses nb[0] itself
    if swap:
        first = next((i for i in range(4) if strides4[i] == unit or shape4[i] == 1), -1)
        if first < 0:
            raise LayoutError(f"plan_copy: no dimension has stride {unit} (one {ty} element) or one value; "
                              "a ferry view cannot have this layout")
    order = list(range(4))
    order[0], order[first] = order[first], order[0]
    vne = [shape4[i] for i in order]
    vnb = [strides4[i] for i in order]
    if swap:
        vnb[0] = unit  # the dimension put first steps by one element, or holds one value
    src = source if source is not None else _source_for(ty, off, vne, vnb, name)
    view = src.view(vne, vnb, off, name=name if first == 0 else f"{name}_unpermuted")
    if first == 0:
        return view
    axes = list(range(4))  # swapping two axes is its own inverse
    axes[0], axes[first] = axes[first], axes[0]
    return view.permute(axes, name=name)


def _view_strides(ty: Any, shape: List[int], strides: List[int]) -> List[int]:
    """ferry_view_strides: the four strides a view of this shape and these strides has."""
    out = ffi.new("size_t[4]")
    check(lib.ferry_view_strides(ty.value, len(shape), ffi.new("int64_t[]", shape), ffi.new("size_t[]", strides),
                                 out))
    return [int(v) for v in out]


def _source_for(ty: Any, off: int, ne: Sequence[int], nb: Sequence[int], name: str) -> Tensor:
    """An unallocated 1-D tensor of whole blocks covering off plus the span of (ne, nb); if that
    cannot be a tensor, a minimal one, so that C's view check says what is wrong (strides that
    overflow, or a view that leaves its source)."""
    unit, blck = ty.size, ty.blck_size
    span = ffi.new("size_t *")  # ferry_layout_nbytes: ggml's nbytes of the layout
    if lib.ferry_layout_nbytes(ty.value, len(ne), ffi.new("int64_t[]", list(ne)), ffi.new("size_t[]", list(nb)),
                               span) == lib.FERRY_OK:
        blocks = max(-(-(off + int(span[0])) // unit), 1)
    else:  # negative counts or a span past size_t: no tensor covers it
        lib.ferry_clear_error()
        blocks = 1
    if blocks > _checks.INT64_MAX // (unit * blck):
        blocks = 1
    return Tensor.new(ty, [blocks * blck], name=f"{name}_src")


def plan_copy(view: Union[Tensor, TypeLike], ne: Optional[Sequence[int]] = None, nb: Optional[Sequence[int]] = None,
              offset: int = 0) -> List[Copy2D]:
    """The copy plan of a view: the fewest 2-D copies that move exactly the bytes it reads, each byte once.

    Nothing is allocated.

    Parameters
    ----------
    view : Tensor, or Type, str or int
        A tensor (a view or not: ne, nb and offset are its own), or the type of a layout given by ne
        and nb.
    ne : sequence of int, optional
        With a type: 1 to 4 values per dimension, ne[0] fastest.
    nb : sequence of int, optional
        With a type: byte strides.
    offset : int, optional
        With a type: where the view starts in its source.

    Returns
    -------
    list of Copy2D
        Offsets from the first byte of the view's source (a tensor's root: the tensor whose memory
        it reads); [] for an empty view.

    Raises
    ------
    InvalidArgumentError
        For a tensor with ne, nb or offset beside it, or a type without them; negative numbers.
    UnknownTypeError
    LayoutError
        ne[0] not whole blocks, or a layout no ferry view has.
    InvalidArgumentError
        Negative numbers.
    OutOfBoundsError
        Strides that overflow.
    UnsupportedError
        Rows tangled over more than 2^20 rows: copy the span instead.
    """
    if isinstance(view, Tensor):
        if ne is not None or nb is not None or offset:
            raise InvalidArgumentError("plan_copy: a tensor's layout is its own: give the tensor alone, or a type "
                                       "with ne and nb")
        return _plan_of(view)
    if ne is None or nb is None:
        raise InvalidArgumentError("plan_copy: a type needs ne and nb (or give a Tensor)")
    return _plan_of(layout_view(view, ne, nb, offset))


# ---------------------------------------------------------------- plans chosen by cost


def plan_pays(tensor: Tensor, model: ModelLike = "cpu") -> bool:
    """Whether the plan copy policy moves a tensor by its plan rather than flat (ferry_copy_plan_pays).

    Parameters
    ----------
    tensor : Tensor
    model : CopyCostModel, str or Backend, optional
        As for plan_cost.

    Returns
    -------
    bool
        False for an empty tensor or one too tangled to plan.
    """
    t = _checks.instance(tensor, Tensor, "plan_pays")
    m = cost_model(model)._c()
    try:
        copies = _c_plan(t)
    except UnsupportedError:
        return False
    arr, n = to_c(copies, "plan_pays")
    return bool(lib.ferry_copy_plan_pays(m, t._p, arr, n))


def plan_ragged(tensor: Tensor, model: ModelLike = "cpu") -> List[Copy2D]:
    """The copies the ragged policy makes of a window that carries its streams' used lengths
    (Tensor.set_used_cells): each stream's first used cells and no other byte, by the cheaper for
    model of a copy per stream and the shortest length over every stream plus the tails (equal
    lengths: the one plan over every stream). The lengths are read now.

    Parameters
    ----------
    tensor : Tensor
        A window carrying used cells, its lengths in host memory.
    model : CopyCostModel, str or Backend, optional
        As for plan_cost.

    Returns
    -------
    list of Copy2D
        Offsets from the first byte of the window's root, as plan_copy gives them.

    Raises
    ------
    InvalidArgumentError
        For a tensor without used cells, lengths not in host memory, or anything but a Tensor.
    OutOfBoundsError
        For a length outside 0..the window's limit.
    """
    t = _checks.instance(tensor, Tensor, "plan_ragged")
    m = cost_model(model)._c()
    n = ffi.new("size_t *")
    check(lib.ferry_copy_ragged_plan(t._p, m, ffi.NULL, 0, n))
    copies = ffi.new("ferry_copy_2d[]", max(n[0], 1))
    check(lib.ferry_copy_ragged_plan(t._p, m, copies, n[0], n))
    base = t.offset
    return [c._replace(offset=c.offset + base) for c in (Copy2D.from_c(x) for x in copies[0:n[0]])]


# ---------------------------------------------------------------- explanation


@dataclass(frozen=True)
class Explanation:
    """How the planner reduces a layout (ferry_copy_plan_explain, for display): explain's result.

    Attributes
    ----------
    row : int
        Bytes of the row every copy moves (0 for an empty layout).
    row_dims : tuple of int
        The dimensions merged into the row, in the order merged (their strides lie within it).
    dropped : tuple of (int, str)
        Dimensions that add no bytes, with why ("broadcast": stride 0).
    folds : tuple of (tuple of int, tuple of int)
        (inner, outer) pairs: outer's rows continue inner's even progression, one dimension.
    dims : tuple of (int, int, tuple of int)
        What is left, by stride: (count, stride in bytes, the dimensions it stands for).
    nested : bool
        Whether dims nest (then n_copies 2-D copies) or tangle (enumerated as byte intervals).
    text : str
        All of it as one sentence.
    """

    row: int
    row_dims: Tuple[int, ...]
    dropped: Tuple[Tuple[int, str], ...]
    folds: Tuple[Tuple[Tuple[int, ...], Tuple[int, ...]], ...]
    dims: Tuple[Tuple[int, int, Tuple[int, ...]], ...]
    nested: bool
    text: str

    @property
    def n_copies(self) -> Optional[int]:
        """Copies the planner makes when the dimensions nest, as C counts them (None when they
        tangle, or for an Explanation not made by explain)."""
        return self.__dict__.get("_n_copies") if self.nested else None


def _dims(dims: Any) -> Tuple[int, ...]:
    """A ferry_dim_list as a tuple of dimension indices."""
    return tuple(int(d) for d in dims.dim[0:dims.n])


def _names(dims: Sequence[int]) -> str:
    return ("dim " if len(dims) == 1 else "dims ") + ",".join(str(d) for d in dims)


def explain(view: Union[Tensor, TypeLike], ne: Optional[Sequence[int]] = None,
            nb: Optional[Sequence[int]] = None) -> Explanation:
    """Say how the planner reduces a layout: dimensions that add no bytes are dropped, those whose
    stride is within the row merge into it, evenly spaced pairs fold into one, and what is left is
    one 2-D copy per index of all but the dimension with the most rows (when they nest) or is
    enumerated as intervals (when they tangle). Same rules as copy-plan.c.

    Parameters
    ----------
    view : Tensor, or Type, str or int
        A tensor (its ne and nb), or the type of a layout given by ne and nb.
    ne, nb : sequence of int, optional
        With a type: the layout.

    Returns
    -------
    Explanation

    Raises
    ------
    InvalidArgumentError
        For a tensor with ne or nb beside it, or a type without them.
    LayoutError
        For ne[0] not whole blocks.
    """
    if isinstance(view, Tensor):
        if ne is not None or nb is not None:
            raise InvalidArgumentError("explain: a tensor's layout is its own: give the tensor alone, or a type "
                                       "with ne and nb")
        ne, nb, view = view.ne, view.nb, view.type
    elif ne is None or nb is None:
        raise InvalidArgumentError("explain: a type needs ne and nb (or give a Tensor)")
    ty = to_type(view)
    shape = _checks.as_shape(ne, "explain: ne")
    strides = _checks.as_strides(nb, len(shape), "explain")
    unit, blck = ty.size, ty.blck_size
    what = "block" if blck > 1 else "element"
    if any(n < 0 for n in shape) or shape[0] % blck:
        raise LayoutError(f"explain: ne {shape} is not a shape of whole {ty} blocks")
    ex = ffi.new("ferry_copy_explanation *")
    check(lib.ferry_copy_plan_explain(ty.value, len(shape), ffi.new("int64_t[]", shape), ffi.new("size_t[]", strides),
                                      ex))
    if ex.empty:
        return _explanation(ex, 0, (), (), (), (), True, "an empty view: nothing to copy")
    row, row_dims = int(ex.row), _dims(ex.row_dims)
    dropped = tuple((d, "broadcast") for d in _dims(ex.broadcast))
    folds = tuple((_dims(f.inner), _dims(f.outer)) for f in ex.folds[0:ex.n_folds])
    dims = tuple((int(d.count), int(d.stride), _dims(d.dims)) for d in ex.dims[0:ex.n_dims])
    nested = bool(ex.nested)
    parts = [f"{_names(row_dims)} merged into one {row:,}-byte row" if row_dims
             else f"the row is one {ty} {what} ({unit} B)"]
    for inner, outer in folds:
        parts.append(f"{_names(outer)} folded into {_names(inner)}")
    bc = sorted({d for d, _ in dropped})
    if bc:
        parts.append(f"{_names(bc)} broadcast (stride 0: no new bytes)")
    if not dims:
        tail = f"one copy of {row:,} B"
    elif nested:
        p = int(ex.dim_2d)
        n, s, lab = dims[p]
        others = int(ex.n_copies)
        rows = f"{n:,} rows of {row:,} B at stride {s:,} B ({_names(lab)})"
        if others == 1:
            tail = f"one 2-D copy of {rows}"
        else:
            over = [d for i, dd in enumerate(dims) if i != p for d in dd[2]]
            tail = f"{others:,} 2-D copies (one per index of {_names(over)}) of {rows}"
    else:
        tangled = [d for dd in dims for d in dd[2]]
        tail = (f"rows of {_names(tangled)} overlap or interleave: enumerated as byte intervals, merged, "
                "and grouped into evenly spaced runs")
    text = "; ".join(parts) + ": " + tail
    return _explanation(ex, row, row_dims, dropped, folds, dims, nested, text)


def _explanation(ex: Any, *fields: Any) -> Explanation:
    """An Explanation of these fields that keeps C's copy count for n_copies."""
    e = Explanation(*fields)
    object.__setattr__(e, "_n_copies", int(ex.n_copies))
    return e
