"""Copy plans: the fewest 2-D copies that move exactly the bytes a view reads, and what they cost.

plan_copy(tensor) plans an existing view, plan_copy(type, ne, nb, offset) a view given by its
layout alone (metadata only: nothing is allocated). Both return Copy2D rows with offsets from
the first byte of the view's source, as ferry_copy_plan computes them
(lib/src/copy-plan.c). CopyCostModel is ferry_copy_cost_model; plan_cost, flat_cost and
plan_pays are the rule the plan copy policy uses to choose between the plan and flat.
explain() says in words how the planner reduces a layout to its copies. plan_paged says how a
paged window's gather goes into a backend: its blocks, runs, calls, bytes and each method's
predicted time.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _checks
from ._binding import ffi, lib
from .backend import Backend
from .copy2d import Copy2D, to_c
from .errors import InvalidArgumentError, LayoutError, UnsupportedError, check
from .link import LinkFit, LinkMeasurement, PieceCurve
from .policy import GatherMethod
from .tensor import Tensor
from .types import TypeLike, to_type

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


# ---------------------------------------------------------------- cost


#: CopyCostModel.from_link takes a measured piece curve where small pieces ran below this share of the
#: fitted bandwidth: above it the curve is within a measurement's noise, and pieces are priced flat.
PIECE_CURVE_SLOWER = 0.8


def _curve_error(curve: PieceCurve) -> float:
    """A fitted piece curve's largest relative residual over its points: |C's time - measured| / measured."""
    return max((abs(curve.seconds(size) - t) / t for size, t in curve.points if t > 0), default=0.0)


@dataclass(frozen=True)
class CopyCostModel:
    """ferry_copy_cost_model: what a copy costs. Each call costs call_us; each row of a 2-D copy
    row_ns plus its bytes (rounded up to whole line_bytes, at most its stride) at gbps GB/s,
    times small_row_efficiency below small_row_bytes, plus wide_pitch_row_ns for rows at least
    wide_pitch_bytes apart. A flat copy is one call and the span at gbps. A paged window's gather
    in one call costs a call, piece_ns a row of its pieces and its bytes at gbps (batched copies),
    or two calls and its bytes at kernel_gbps (the gather kernel; 0: gbps). CopyCostModel.cpu()
    and .gpu() are ferry's figures (copy-plan.c); of_backend(b) the one b's copies are costed by.

    Attributes
    ----------
    call_us : float
        Microseconds per call (a 2-D copy, or the flat copy).
    row_ns : float
        Nanoseconds per row of a 2-D copy.
    gbps : float
        Bandwidth in GB/s (1e9 bytes per second).
    line_bytes : int
        A row's bytes are rounded up to whole lines of this many (0: exact), at most its stride.
    small_row_bytes : int
        Rows narrower than this move at gbps * small_row_efficiency.
    small_row_efficiency : float
        The fraction of gbps narrow rows reach.
    wide_pitch_bytes : int
        Rows at least this far apart cost wide_pitch_row_ns more each (0: no such cost).
    wide_pitch_row_ns : float
        Nanoseconds more per row of a wide pitch.
    piece_ns : float
        Nanoseconds per row of a batched copy's pieces (a paged window's gather in one call).
    kernel_gbps : float
        The gather kernel's rate reading pinned host memory, GB/s; 0: gbps.
    piece_floor_gbps, piece_knee_bytes, piece_steepness : float
        A piece's rate by its size, as DMA engines move pieces (piece_seconds): a plain copy, a
        batched copy's every row and a merged span run at piece_floor_gbps when small, rising to
        gbps past piece_knee_bytes, as sharply as piece_steepness says; piece_floor_gbps 0: every
        piece at gbps.
    merge_margin : float
        How much faster than every other method a paged window's merged spans must be predicted for
        the auto gather to take them, as a share (0.05: 5%): the model's own error (from_link: its
        piece curve's largest relative residual); 0: ferry's 10%.
    """

    call_us: float
    row_ns: float
    gbps: float
    line_bytes: int
    small_row_bytes: int
    small_row_efficiency: float
    wide_pitch_bytes: int
    wide_pitch_row_ns: float
    piece_ns: float = 0.0
    kernel_gbps: float = 0.0
    piece_floor_gbps: float = 0.0
    piece_knee_bytes: float = 0.0
    piece_steepness: float = 0.0
    merge_margin: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type == "int":
                _checks.as_size(v, f"CopyCostModel: {f.name}")
            elif isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise InvalidArgumentError(f"CopyCostModel: {f.name} must be a finite number >= 0, got {v!r}")
        if self.gbps <= 0:
            raise InvalidArgumentError(f"CopyCostModel: gbps must be positive, got {self.gbps!r}")
        if not 0 < self.small_row_efficiency <= 1:
            raise InvalidArgumentError("CopyCostModel: small_row_efficiency must be in (0, 1], got "
                                       f"{self.small_row_efficiency!r}")
        if self.piece_floor_gbps > 0:  # the curve's bounds are C's (ferry_copy_cost_model_check)
            check(lib.ferry_copy_cost_model_check(self._c(), b"CopyCostModel"))

    @classmethod
    def from_c(cls, m: Any) -> "CopyCostModel":
        """A CopyCostModel holding the values of the ferry_copy_cost_model cdata m."""
        return cls(float(m.call_us), float(m.row_ns), float(m.gbps), int(m.line_bytes), int(m.small_row_bytes),
                   float(m.small_row_efficiency), int(m.wide_pitch_bytes), float(m.wide_pitch_row_ns),
                   float(m.piece_ns), float(m.kernel_gbps), float(m.piece_floor_gbps), float(m.piece_knee_bytes),
                   float(m.piece_steepness), float(m.merge_margin))

    def piece_seconds(self, size: int) -> float:
        """Seconds the bytes of one piece of size bytes take by the model's size curve
        (ferry_copy_piece_seconds): size / gbps without a floor.

        Parameters
        ----------
        size : int
            The piece's bytes.

        Returns
        -------
        float

        Raises
        ------
        InvalidArgumentError
            For a size that is not a size.
        """
        return float(lib.ferry_copy_piece_seconds(self._c(), _checks.as_size(size, "CopyCostModel.piece_seconds")))

    @classmethod
    def cpu(cls) -> "CopyCostModel":
        """Host to host, measured on a 2-core EPYC (tools/results/2026-11-30-copy-cost-cpu.md)."""
        return cls.from_c(lib.ferry_copy_cost_model_cpu())

    @classmethod
    def gpu(cls) -> "CopyCostModel":
        """Host to device over PCIe gen 5, from the H200 figures in docs/design.md ("Measured anchors")."""
        return cls.from_c(lib.ferry_copy_cost_model_gpu())

    @classmethod
    def from_link(cls, link: Union[LinkMeasurement, LinkFit]) -> "CopyCostModel":
        """The model of a measured link: a call its latency, a row its row cost, bytes at its
        bandwidth, exactly (no line rounding, no narrow-row or wide-pitch terms): what the link
        was measured to charge. A batched copy's piece is charged a row (as the stand-in's link
        charges it; on CUDA a measure of the batch's own pieces is gpu-check's), the gather
        kernel the bandwidth. A measurement's piece curve (its pieces) prices pieces by size,
        rising to the fitted bandwidth, where small pieces ran below PIECE_CURVE_SLOWER of it; the
        merge margin is then the curve's own error, its largest relative residual over the copies
        it was fitted to (else 0: ferry's 10%).

        Parameters
        ----------
        link : LinkMeasurement or LinkFit
            measure_link(device, fit=True), or its fit.

        Returns
        -------
        CopyCostModel

        Raises
        ------
        InvalidArgumentError
            For a measurement made without fit, or anything else.
        """
        fit = link.fit if isinstance(link, LinkMeasurement) else link
        if not isinstance(fit, LinkFit):
            raise InvalidArgumentError("CopyCostModel.from_link: expected measure_link(..., fit=True) or its LinkFit, "
                                       f"got {'a measurement made without fit' if fit is None else repr(link)}")
        # a bandwidth too fast to measure: the model's largest, so bytes cost (next to) nothing
        gbps = fit.gbps if math.isfinite(fit.gbps) else 1e12
        # the measured piece curve, rising to the fitted bandwidth, where small pieces ran measurably slower
        curve = link.pieces if isinstance(link, LinkMeasurement) else None
        slower = curve is not None and curve.floor_gbps < PIECE_CURVE_SLOWER * gbps
        floor = min(curve.floor_gbps, gbps) if curve is not None and slower else 0.0
        return cls(call_us=fit.latency_us, row_ns=fit.row_ns, gbps=gbps, line_bytes=0, small_row_bytes=0,
                   small_row_efficiency=1.0, wide_pitch_bytes=0, wide_pitch_row_ns=0.0, piece_ns=fit.row_ns,
                   kernel_gbps=0.0, piece_floor_gbps=floor,
                   piece_knee_bytes=curve.knee_bytes if floor > 0 and curve is not None else 0.0,
                   piece_steepness=curve.steepness if floor > 0 and curve is not None else 0.0,
                   merge_margin=_curve_error(curve) if floor > 0 and curve is not None else 0.0)

    def use_for(self, backend: Backend) -> None:
        """Cost the copies into backend, and into its copy queue, by this model in place of its own
        (ferry_backend_set_copy_cost_model): the plan and ragged policies then choose by it.
        CopyCostModel.restore(backend) gives it back its own.

        Parameters
        ----------
        backend : Backend

        Raises
        ------
        InvalidArgumentError
            For anything but a Backend, or figures C refuses (past 1e12).
        FreedBufferError
            For a closed backend.
        """
        b = _checks.instance(backend, Backend, "CopyCostModel.use_for")
        check(lib.ferry_backend_set_copy_cost_model(b._p, self._c()))

    @staticmethod
    def restore(backend: Backend) -> None:
        """Cost the copies into backend by its own model again (undoing use_for).

        Parameters
        ----------
        backend : Backend

        Raises
        ------
        InvalidArgumentError
            For anything but a Backend.
        FreedBufferError
            For a closed backend.
        """
        b = _checks.instance(backend, Backend, "CopyCostModel.restore")
        check(lib.ferry_backend_set_copy_cost_model(b._p, ffi.NULL))

    @classmethod
    def of_backend(cls, backend: Backend) -> "CopyCostModel":
        """The model copies into a backend are costed by.

        Parameters
        ----------
        backend : Backend

        Returns
        -------
        CopyCostModel
            The one set with use_for; else a GPU's for CUDA, a stand-in's link's when it models
            one, else the CPU's.

        Raises
        ------
        InvalidArgumentError
            For anything but a Backend.
        """
        _checks.instance(backend, Backend, "CopyCostModel.of_backend")
        return cls.from_c(lib.ferry_backend_copy_cost_model(backend._p))

    def _c(self) -> Any:
        """The model as C's struct, built once: the model is frozen, and C only reads it (const)."""
        m = self.__dict__.get("_c_struct")
        if m is None:
            m = ffi.new("ferry_copy_cost_model *")
            for f in fields(self):
                setattr(m, f.name, getattr(self, f.name))
            object.__setattr__(self, "_c_struct", m)
        return m

    def __getstate__(self) -> Dict[str, object]:
        # the cached struct is C memory: a copy or pickle carries the figures and builds its own
        return {k: v for k, v in self.__dict__.items() if k != "_c_struct"}

    def as_dict(self) -> Dict[str, object]:
        """The model's figures by field name."""
        return asdict(self)


ModelLike = Union[CopyCostModel, str, Backend]


def cost_model(model: ModelLike = "cpu") -> CopyCostModel:
    """A CopyCostModel from any of the ways to name one.

    Parameters
    ----------
    model : CopyCostModel, str or Backend, optional
        The cost model: "cpu", "gpu", a model, or a Backend (the one its copies are costed by).

    Returns
    -------
    CopyCostModel

    Raises
    ------
    InvalidArgumentError
        For anything else.
    """
    if isinstance(model, CopyCostModel):
        return model
    if isinstance(model, Backend):
        return CopyCostModel.of_backend(model)
    if isinstance(model, str) and model == "cpu":
        return CopyCostModel.cpu()
    if isinstance(model, str) and model == "gpu":
        return CopyCostModel.gpu()
    raise InvalidArgumentError(f"cost model: expected 'cpu', 'gpu', a CopyCostModel or a Backend, got {model!r}")


def plan_cost(copies: Iterable[Sequence[int]], model: ModelLike = "cpu") -> float:
    """Estimated seconds to carry out some copies (ferry_copy_plan_cost).

    Parameters
    ----------
    copies : iterable of Copy2D or of (offset, size, count, stride)
    model : CopyCostModel, str or Backend, optional
        The cost model, as cost_model takes it.

    Returns
    -------
    float
        The copies' seconds, each call and row costed as the model says.
    """
    m = cost_model(model)._c()
    arr, n = to_c(copies, "plan_cost")
    return float(lib.ferry_copy_plan_cost(m, arr, n))


def flat_cost(span: int, model: ModelLike = "cpu") -> float:
    """Estimated seconds of one flat copy (ferry_copy_flat_cost).

    Parameters
    ----------
    span : int
        Bytes from the first to the last.
    model : CopyCostModel, str or Backend, optional
        As for plan_cost.

    Returns
    -------
    float
        One call and the span at the model's bandwidth.
    """
    m = cost_model(model)._c()
    return float(lib.ferry_copy_flat_cost(m, _checks.as_size(span, "flat_cost: span")))


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


# ---------------------------------------------------------------- a paged window's gather


class GatherCopy(NamedTuple):
    """One copy of a paged window's gather (ferry_gather_copy): count rows of size bytes from
    src_offset of the pool (rows src_stride apart) to dst_offset of the dense window (rows
    dst_stride apart).

    Attributes
    ----------
    src_offset : int
        Bytes from the pool tensor's first byte to the first row read.
    dst_offset : int
        Bytes from the dense window's first byte to where it lands.
    size : int
        Bytes per row.
    count : int
        Rows (1: a plain copy).
    src_stride, dst_stride : int
        Bytes from one row's start to the next, in the pool and in the window.
    """

    src_offset: int
    dst_offset: int
    size: int
    count: int  # type: ignore[assignment]  # the field hides tuple.count, as ferry_gather_copy names it
    src_stride: int
    dst_stride: int


@dataclass(frozen=True)
class PagedPlan:
    """How a paged window is gathered into a backend (ferry_copy_paged_plan): plan_paged's result.

    Attributes
    ----------
    method : GatherMethod
        The method taken: the cache's, or under auto the cheapest the backend offers.
    blocks : int
        Blocks read (a partly used last block included).
    runs : int
        Runs of blocks adjacent in the pool, in table order.
    calls : int
        Transfer calls, as the buffers count them (batched and kernel: 1).
    bytes : int
        Bytes moved into the window: exactly the cells read.
    seconds : float
        The prediction of the backend's cost model.
    method_seconds : dict of str to float
        Each method's prediction by name (per_block, runs, batched, kernel, merged; auto: the
        cheapest offered); None where the backend does not offer it.
    copies : tuple of GatherCopy
        The method's copies: per block, per run (equal runs at even strides as one 2-D copy), the
        pieces its one call carries, or merged's spans (dst_offset into the staging area they land
        in, one after another).
    crossed_bytes : int
        Bytes that cross the link: bytes, and a merged gather's gaps too (crossed, never read).
    spans : int
        A merged gather's spans of the pool; 0 for the other methods.
    """

    method: GatherMethod
    blocks: int
    runs: int
    calls: int
    bytes: int
    seconds: float
    method_seconds: Dict[str, Optional[float]]
    copies: Tuple[GatherCopy, ...]
    crossed_bytes: int = 0
    spans: int = 0


def plan_paged(window: Tensor, backend: Backend) -> PagedPlan:
    """The gather of a paged window (ferry.paged.PagedKVCache.window) into a backend, as the copy path
    would make it now: its lengths and tables read now, the method its cache is set to.

    Parameters
    ----------
    window : Tensor
        A paged window.
    backend : Backend
        The split's backend: its cost model and the methods it offers for the pool's memory.

    Returns
    -------
    PagedPlan

    Raises
    ------
    InvalidArgumentError
        For a tensor that is not a paged window, anything but a Backend, or lengths not in host memory.
    OutOfBoundsError
        For a length outside 0..the window's limit, or a table shorter than its sequence's length
        (naming the sequence and the block).
    UnsupportedError
        For a method the backend does not offer for the pool (the cache's gather forced).
    """
    t = _checks.instance(window, Tensor, "plan_paged: window")
    b = _checks.instance(backend, Backend, "plan_paged: backend")
    plan = ffi.new("ferry_paged_plan *")
    n = ffi.new("size_t *")
    check(lib.ferry_copy_paged_plan(t._p, b._p, plan, ffi.NULL, 0, n))
    copies = ffi.new("ferry_gather_copy[]", max(n[0], 1))
    check(lib.ferry_copy_paged_plan(t._p, b._p, plan, copies, n[0], n))
    seconds = {str(m): (float(plan.method_seconds[m]) if plan.method_seconds[m] >= 0 else None)
               for m in GatherMethod}
    return PagedPlan(GatherMethod(plan.method), int(plan.blocks), int(plan.runs), int(plan.calls), int(plan.bytes),
                     float(plan.seconds), seconds,
                     tuple(GatherCopy(int(c.src_offset), int(c.dst_offset), int(c.size), int(c.count),
                                      int(c.src_stride), int(c.dst_stride)) for c in copies[0:n[0]]),
                     int(plan.crossed_bytes), int(plan.spans))


# ---------------------------------------------------------------- a plan's pieces


class Piece(NamedTuple):
    """One piece of a batch transfer (ferry_copy_piece): size contiguous bytes from src_offset of
    the source to dst_offset of the destination.

    Attributes
    ----------
    src_offset, dst_offset : int
        Bytes from the source's and the destination's first byte.
    size : int
        Bytes.
    """

    src_offset: int
    dst_offset: int
    size: int


#: The most pieces copy_pieces and gather_pieces list (24 bytes each in C, a tuple each here): a batch
#: transfer of more is no plan a link pays for.
MAX_PIECES = 1 << 22


def _piece_array(fill: Any, what: str) -> np.ndarray:
    """fill(pieces, max, n) counted, then filled: C's pieces as rows (src_offset, dst_offset, size) of
    a size_t (uintp) array, in bulk (a pull of thousands of pieces pays no Python object a piece)."""
    n = ffi.new("size_t *")
    check(fill(ffi.NULL, 0, n))
    if n[0] > MAX_PIECES:
        raise UnsupportedError(f"{what}: the copies are {n[0]} pieces, more than {MAX_PIECES} (ferry.plan.MAX_PIECES): "
                               "copy the span instead")
    out = np.zeros((n[0], 3), dtype=np.uintp)
    if n[0]:
        check(fill(ffi.cast("ferry_copy_piece *", out.ctypes.data), n[0], n))
    return out


def _pieces_of(fill: Any, what: str) -> List[Piece]:
    """fill(pieces, max, n) counted, then filled: C's pieces as Piece rows."""
    return [Piece(*row) for row in _piece_array(fill, what).tolist()]


def _gather_piece_array(copies: Sequence[GatherCopy]) -> np.ndarray:
    """gather_pieces of a plan's own copies (plan_paged(...).copies, already checked), as _piece_array's rows."""
    arr = np.ascontiguousarray(np.array([tuple(c) for c in copies], dtype=np.uintp).reshape(-1, 6))
    c = ffi.cast("ferry_gather_copy *", arr.ctypes.data)
    return _piece_array(lambda out, mx, cnt: lib.ferry_gather_pieces(c, len(arr), out, mx, cnt), "gather_pieces")


def _paged_piece_array(window: Tensor, backend: Backend) -> np.ndarray:
    """gather_pieces of plan_paged(window, backend)'s copies, as _piece_array's rows, the copies kept
    in a C array (a pull's thousands of runs pay no Python object each)."""
    n = ffi.new("size_t *")
    check(lib.ferry_copy_paged_plan(window._p, backend._p, ffi.new("ferry_paged_plan *"), ffi.NULL, 0, n))
    copies = ffi.new("ferry_gather_copy[]", max(n[0], 1))
    check(lib.ferry_copy_paged_plan(window._p, backend._p, ffi.new("ferry_paged_plan *"), copies, n[0], n))
    return _piece_array(lambda out, mx, cnt: lib.ferry_gather_pieces(copies, n[0], out, mx, cnt), "gather_pieces")


def _place_pieces(dst: int, dst_bytes: int, src: int, src_bytes: int, pieces: np.ndarray) -> None:
    """Each of pieces' rows (src_offset, dst_offset, size: a uintp array) copied from src + src_offset
    to dst + dst_offset, host addresses, in one call (ferry_copy_pieces_place: all checked first)."""
    arr = np.ascontiguousarray(pieces, dtype=np.uintp).reshape(-1, 3)
    check(lib.ferry_copy_pieces_place(ffi.cast("void *", dst), dst_bytes, ffi.cast("const void *", src), src_bytes,
                                      ffi.cast("const ferry_copy_piece *", arr.ctypes.data), len(arr)))


def _copy_piece_array(copies: Iterable[Sequence[int]]) -> np.ndarray:
    """copy_pieces of 2-D copies, as _piece_array's rows."""
    arr, n = to_c(copies, "copy_pieces")
    return _piece_array(lambda out, mx, cnt: lib.ferry_copy_pieces(arr, n, out, mx, cnt), "copy_pieces")


def _merge_piece_array(pieces: np.ndarray, model: ModelLike) -> Tuple[np.ndarray, int]:
    """merge_pieces of _piece_array's rows: the rows left (a new array) and the gap bytes."""
    m = cost_model(model)._c()
    arr = np.array(pieces, dtype=np.uintp, order="C").reshape(-1, 3)
    n = ffi.new("size_t *", len(arr))
    gaps = ffi.new("uint64_t *")
    check(lib.ferry_copy_pieces_merge(m, ffi.cast("ferry_copy_piece *", arr.ctypes.data) if len(arr) else ffi.NULL,
                                      n, gaps))
    return arr[:n[0]].copy(), int(gaps[0])


def copy_pieces(copies: Iterable[Sequence[int]]) -> List[Piece]:
    """The pieces of 2-D copies (ferry_copy_pieces): a piece per row, each to the offset it is read
    from (a destination of the source's layout), in the copies' order.

    Parameters
    ----------
    copies : iterable of Copy2D or of (offset, size, count, stride)
        plan_copy's, plan_ragged's or copy_ranges_of's copies, say.

    Returns
    -------
    list of Piece

    Raises
    ------
    InvalidArgumentError
        For rows that are not 4 sizes.
    OutOfBoundsError
        For a row whose end overflows.
    UnsupportedError
        For more than MAX_PIECES pieces.
    """
    arr, n = to_c(copies, "copy_pieces")
    return _pieces_of(lambda out, mx, cnt: lib.ferry_copy_pieces(arr, n, out, mx, cnt), "copy_pieces")


def gather_pieces(copies: Iterable[GatherCopy]) -> List[Piece]:
    """The pieces of a paged window's gather copies (ferry_gather_pieces, PagedPlan.copies): from the
    pool to the dense window, a piece per row.

    Parameters
    ----------
    copies : iterable of GatherCopy
        plan_paged(...).copies.

    Returns
    -------
    list of Piece

    Raises
    ------
    InvalidArgumentError
        For rows that are not 6 sizes.
    OutOfBoundsError
        For a row whose end overflows.
    UnsupportedError
        For more than MAX_PIECES pieces.
    """
    rows = [[_checks.as_size(v, f"gather_pieces: copy {i}") for v in _six(c, i)] for i, c in enumerate(copies)]
    arr = ffi.new("ferry_gather_copy[]", max(len(rows), 1))
    for a, (so, do, size, count, ss, ds) in zip(arr, rows):
        a.src_offset, a.dst_offset, a.size, a.count, a.src_stride, a.dst_stride = so, do, size, count, ss, ds
    return _pieces_of(lambda out, mx, cnt: lib.ferry_gather_pieces(arr, len(rows), out, mx, cnt), "gather_pieces")


def _six(c: Any, i: int) -> Sequence[Any]:
    if isinstance(c, (str, bytes)) or not hasattr(c, "__len__") or len(c) != 6:
        raise InvalidArgumentError(f"gather_pieces: copy {i} is not a GatherCopy "
                                   f"(src_offset, dst_offset, size, count, src_stride, dst_stride): {c!r}")
    return list(c)


def merge_pieces(pieces: Iterable[Sequence[int]], model: ModelLike = "cpu") -> Tuple[List[Piece], int]:
    """Pieces merged across gaps by the one rule a paged gather's merged spans follow too
    (ferry_copy_pieces_merge): pieces that touch join; then, among pieces whose gaps are the same in
    the source and the destination, a piece joins those after it (at most 64 on) where one piece
    through them costs less than a piece each, a piece priced piece_ns and its bytes at its size's
    rate (the model's piece curve, or gbps).

    Parameters
    ----------
    pieces : iterable of Piece or of (src_offset, dst_offset, size)
    model : CopyCostModel, str or Backend, optional
        The link's model (CopyCostModel.from_link of the remote tier's measure, say).

    Returns
    -------
    (list of Piece, int)
        The pieces left, and the gap bytes they carry beyond the plan's.

    Raises
    ------
    InvalidArgumentError
        For rows that are not 3 sizes, or a model C refuses.
    OutOfBoundsError
        For a piece whose end overflows.
    """
    m = cost_model(model)._c()
    rows = []
    for i, p in enumerate(pieces):
        if isinstance(p, (str, bytes)) or not hasattr(p, "__len__") or len(p) != 3:
            raise InvalidArgumentError(f"merge_pieces: piece {i} is not (src_offset, dst_offset, size): {p!r}")
        rows.append([_checks.as_size(v, f"merge_pieces: piece {i}") for v in p])
    arr = ffi.new("ferry_copy_piece[]", max(len(rows), 1))
    for a, (so, do, size) in zip(arr, rows):
        a.src_offset, a.dst_offset, a.size = so, do, size
    n = ffi.new("size_t *", len(rows))
    gaps = ffi.new("uint64_t *")
    check(lib.ferry_copy_pieces_merge(m, arr, n, gaps))
    return [Piece(int(p.src_offset), int(p.dst_offset), int(p.size)) for p in arr[0:n[0]]], int(gaps[0])


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
