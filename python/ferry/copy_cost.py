"""Copy cost models: what a copy costs, as ferry_copy_cost_model says, and the seconds of a plan or a flat copy.

CopyCostModel is ferry_copy_cost_model: ferry's CPU and GPU figures (lib/src/copy-plan.c), a measured
link's (from_link), or the one a backend's copies are costed by (of_backend); cost_model names one
any of the ways a caller may. plan_cost and flat_cost are the seconds it predicts for some 2-D copies
and for one flat copy: the two sides of the rule the plan copy policy chooses by (ferry.plan.plan_pays).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, Iterable, Sequence, Union

from . import _checks
from ._binding import ffi, lib
from .backend import Backend
from .copy2d import to_c
from .errors import InvalidArgumentError, check
from .link import LinkFit, LinkMeasurement, PieceCurve

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
