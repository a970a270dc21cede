"""The dry run `ferry plan` runs: the copy plan of one KV-cache window, what it moves and costs.

Nothing is computed on real memory: the cache lives in synthetic host memory (a DummyBackend
with is_host, no memory behind it). The plan, bytes and costs come from the library
(ferry_copy_plan, ferry_copy_plan_cost, ferry_copy_flat_cost, ferry_copy_plan_pays) as the plan
copy policy uses them.

A sliding-window layer of window W has a cache of its own size: each stream holds
min(W + 1, kv_size) cells (its window and the cell a decode step adds) and the window reads at
most that many.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..backend import DummyBackend
from ..copy2d import Copy2D
from ..copy_cost import cost_model as model_named
from ..copy_cost import flat_cost, plan_cost
from ..copy_path import bytes_read
from ..errors import InvalidArgumentError, UnsupportedError
from ..kv import KVCache
from ..plan import explain, plan_copy, plan_pays
from ..types import to_type
from .common import JsonRecord, check_positive, check_streams, n_kv_for
from .model_file import layer_sizes

__all__ = ["PlanChoice", "PlannedWindow", "WindowPlan", "WindowSpan", "window_plan"]


@dataclass(frozen=True)
class PlannedWindow:
    """Which window is planned.

    Attributes
    ----------
    which : str
        "k" or "v".
    type : str
        The cache's type.
    v_trans : bool
        V stored transposed.
    n_ctx, n_stream, kv_size, n_kv : int
        Cells in all streams, streams, cells a stream, and cells of each stream the window holds.
    streams : list of int
        The first and last stream read.
    head_dim, n_head_kv : int
        Values per head, and K/V heads.
    """

    which: str
    type: str
    v_trans: bool
    n_ctx: int
    n_stream: int
    kv_size: int
    n_kv: int
    streams: List[int]
    head_dim: int
    n_head_kv: int


@dataclass(frozen=True)
class WindowSpan:
    """The window as a tensor view: its shape, where it lies and what attention reads of it.

    Attributes
    ----------
    ne, nb : list of int
        Its extents and byte strides.
    offset : int
        Bytes from the first byte of the layer's K or V tensor.
    nbytes, bytes_read : int
        Its span, and the bytes attention reads.
    span_read_ratio : float
        nbytes over bytes_read.
    """

    ne: List[int]
    nb: List[int]
    offset: int
    nbytes: int
    bytes_read: int
    span_read_ratio: float


@dataclass(frozen=True)
class PlanChoice:
    """The window's copy plan, its cost beside flat's, and what the plan copy policy takes.

    Attributes
    ----------
    plannable : bool
        Whether a plan exists.
    n_copies : int
        Its 2-D copies.
    copies : list of dict
        Each copy's fields (Copy2D), offsets in bytes from the tensor's first byte.
    bytes_moved_plan : int
        The bytes the plan moves.
    cost_model : str
        The cost model named ("cpu" or "gpu").
    cost_plan_us, cost_flat_us : float
        The plan's and flat's cost by that model, in microseconds.
    choice : str
        What the plan copy policy takes there: "plan" or "flat".
    explanation : str
        Why (ferry.plan.explain).
    """

    plannable: bool
    n_copies: int
    copies: List[Dict[str, int]]
    bytes_moved_plan: int
    cost_model: str
    cost_plan_us: float
    cost_flat_us: float
    choice: str
    explanation: str


@dataclass(frozen=True)
class WindowPlan(JsonRecord):
    """The plan of one KV-cache window: the window, its span, the plan. For a model with layers of
    different sizes, sliding_window is the layer's window (None: full attention) and n_layer the layers
    of that kind; both are left out of as_dict() otherwise.

    Attributes
    ----------
    window : PlannedWindow
        Which window.
    span : WindowSpan
        Where it lies and what is read of it.
    plan : PlanChoice
        Its plan, costs and the policy's choice.
    sliding_window : int or None
        The layer's window (None: full attention).
    n_layer : int or None
        The layers of this kind (None: the model's layers are alike).
    """

    window: PlannedWindow
    span: WindowSpan
    plan: PlanChoice
    sliding_window: Optional[int] = None
    n_layer: Optional[int] = None

    def as_dict(self) -> Dict[str, Any]:
        """The JSON output, key for key: the records' fields flattened, in order; sliding_window and n_layer
        only for layers of different sizes."""
        d = {**asdict(self.window), **asdict(self.span), **asdict(self.plan)}
        if self.n_layer is not None:
            d.update(sliding_window=self.sliding_window, n_layer=self.n_layer)
        return d


def window_plan(n_ctx: int, npl: int, npp: int, ntg: int, pad: int = 1, type: str = "f16", head_dim: int = 128,
                n_head_kv: int = 8, v_trans: bool = False, which: str = "k", streams: Optional[Tuple[int, int]] = None,
                cost_model: str = "gpu", window: Optional[int] = None, n_layer: Optional[int] = None) -> WindowPlan:
    """The copy plan of a KV-cache window, what it moves, what it costs, and why (a dry run).

    Parameters
    ----------
    n_ctx : int
        Cells in all streams.
    npl : int
        Streams, kv_size = n_ctx / npl cells each (1: unified).
    npp, ntg : int
        Prompt and generated tokens per sequence.
    pad : int, optional
        n_kv is rounded up to a multiple of this.
    type : str, optional
        The cache's type.
    head_dim, n_head_kv : int, optional
    v_trans : bool, optional
        V stored transposed.
    which : str, optional
        "k" or "v".
    streams : (int, int), optional
        The first and last stream read (default all).
    cost_model : str, optional
        "cpu" or "gpu": whose cost model decides plan or flat.
    window : int, optional
        The layer's sliding window: its streams hold min(window + 1, kv_size) cells each (a
        decode step adds one), and the window reads at most that. None: full attention.
    n_layer : int, optional
        Layers of this kind, recorded in the plan (for a model with layers of different sizes).

    Returns
    -------
    WindowPlan

    Raises
    ------
    InvalidArgumentError
        For values out of range.
    """
    check_positive((("-c", n_ctx), ("-npl", npl), ("-npp", npp), ("--pad", pad), ("--head-dim", head_dim),
                    ("--kv-heads", n_head_kv)), integer=False)
    if ntg < 0:
        raise InvalidArgumentError(f"-ntg must not be negative, got {ntg}")
    check_streams(n_ctx, npl)
    if which not in ("k", "v"):
        raise InvalidArgumentError(f"--which is k or v, not {which!r}")
    if cost_model not in ("cpu", "gpu"):
        raise InvalidArgumentError(f"--cost-model is cpu or gpu, not {cost_model!r}")
    s0, s1 = streams if streams is not None else (0, npl - 1)
    if not 0 <= s0 <= s1 < npl:
        raise InvalidArgumentError(f"--stream {s0}-{s1}: streams are 0..{npl - 1} and s0 <= s1")
    if window is not None and window <= 0:
        raise InvalidArgumentError(f"a sliding window must be positive, got {window}")
    ty = to_type(type)
    kv_size = n_ctx // npl
    n_kv = n_kv_for(npp, ntg, pad, kv_size)
    if window is not None:
        # a sliding layer's cache: its window and the decode step's new cell per stream
        kv_size = min(window + 1, kv_size)
        (n_kv,) = layer_sizes([window], n_kv, kv_size)
        n_ctx = kv_size * npl
    kv = KVCache(ty, ty, head_dim, n_head_kv, n_ctx, npl, v_trans=v_trans, backend=DummyBackend(is_host=True))
    k, v = kv.window(0, n_kv, s0, s1)
    t = k if which == "k" else v
    model = model_named(cost_model)
    try:
        copies: List[Copy2D] = plan_copy(t)
        plannable = True
    except UnsupportedError:
        copies, plannable = [], False
    read, span = bytes_read(t), t.nbytes
    pays = plannable and plan_pays(t, model)
    return WindowPlan(
        window=PlannedWindow(which=which, type=str(ty), v_trans=v_trans, n_ctx=n_ctx, n_stream=npl, kv_size=kv_size,
                             n_kv=n_kv, streams=[s0, s1], head_dim=head_dim, n_head_kv=n_head_kv),
        span=WindowSpan(ne=list(t.ne), nb=list(t.nb), offset=t.offset, nbytes=span, bytes_read=read,
                        span_read_ratio=span / read if read else 1.0),
        plan=PlanChoice(plannable=plannable, n_copies=len(copies), copies=[c._asdict() for c in copies],
                        bytes_moved_plan=sum(c.nbytes for c in copies), cost_model=cost_model,
                        cost_plan_us=plan_cost(copies, model) * 1e6 if plannable else float("nan"),
                        cost_flat_us=flat_cost(span, model) * 1e6, choice="plan" if pays else "flat",
                        explanation=explain(t).text),
        sliding_window=window, n_layer=n_layer)
