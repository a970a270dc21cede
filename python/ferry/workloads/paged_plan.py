"""The dry run `ferry paged-plan` runs: how a paged KV cache's window is gathered into a stand-in
device, and what each gather method would cost there.

npl sequences of npp + ntg cells each lie in a paged cache whose pools hold -c cells in blocks of
block_size, each sequence's table drawn with `adjacency` of its blocks right after their
predecessor (paged_tables.adjacent_tables). The pools are one layer's, in the CPU's host memory
(the one-call gathers are offered only for memory a copy can read, never synthetic memory); the
plan reads the tables, never the cells. The blocks, runs, calls, bytes and predictions are the
library's (ferry.plan.plan_paged) for a stand-in of the link asked for, whose copies charge what
it predicts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..backend import Backend, StandinBackend
from ..errors import InvalidArgumentError
from ..paged import PagedKVCache
from ..paged_plan import plan_paged
from ..types import to_type
from .common import JsonRecord, check_positive
from .devices import DeviceConfig
from .paged_tables import adjacent_tables, blocks_for, check_paged, check_pool

__all__ = ["GatherChoice", "PagedWindow", "PagedWindowPlan", "StandinLink", "paged_cache", "paged_window_plan",
           "standin"]


@dataclass(frozen=True)
class PagedWindow:
    """Which paged window is planned, and the cache it lies in.

    Attributes
    ----------
    which : str
        "k" or "v".
    type : str
        The cache's type.
    v_trans : bool
        V stored transposed.
    head_dim, n_head_kv : int
        Values per head, and K/V heads.
    n_ctx, n_seq, cells : int
        Cells of the pool asked for, sequences, and cells each sequence's window holds.
    block_size, n_blocks : int
        Cells a block, and blocks in the pool.
    adjacency : float
        Share of a sequence's blocks right after their predecessor in the pool.
    streams : list of int
        The first and last sequence read.
    """

    which: str
    type: str
    v_trans: bool
    head_dim: int
    n_head_kv: int
    n_ctx: int
    n_seq: int
    cells: int
    block_size: int
    n_blocks: int
    adjacency: float
    streams: List[int]


@dataclass(frozen=True)
class StandinLink:
    """The stand-in device's link the gather is predicted on.

    Attributes
    ----------
    link_gbps : float
        Its bandwidth (0: unmodelled, the host's memcpy).
    latency_us, row_ns : float
        A call's latency, and a row's cost.
    link_profile : str or None
        The named link it is (--link-profile), at link_gbps; None: the figures alone.
    piece_floor_gbps : float
        The rate its small pieces run at (its piece curve's floor); 0: every piece at link_gbps.
    """

    link_gbps: float
    latency_us: float
    row_ns: float
    link_profile: Optional[str] = None
    piece_floor_gbps: float = 0.0


@dataclass(frozen=True)
class GatherChoice:
    """The window's gather: what it copies and the method taken.

    Attributes
    ----------
    blocks, runs : int
        The blocks the window reads, and the runs of adjacent ones.
    calls, bytes : int
        The method's copy calls and the bytes they move into the window (the cells read).
    crossed_bytes : int
        The bytes that cross the link: bytes, and a merged gather's gaps (crossed, never read).
    spans : int
        A merged gather's spans of the pool (0 for the other methods).
    method : str
        The method taken (auto: the cheapest the stand-in offers).
    seconds : float
        Its predicted time.
    method_seconds : dict of str to float or None
        Each method's predicted time (None where the stand-in does not offer it).
    """

    blocks: int
    runs: int
    calls: int
    bytes: int
    crossed_bytes: int
    spans: int
    method: str
    seconds: float
    method_seconds: Dict[str, Optional[float]]


@dataclass(frozen=True)
class PagedWindowPlan(JsonRecord):
    """The gather plan of one paged window: the window, the link, the gather.

    Attributes
    ----------
    window : PagedWindow
        Which window, in which cache.
    link : StandinLink
        The stand-in's link.
    gather : GatherChoice
        The gather taken and each method's prediction.
    """

    window: PagedWindow
    link: StandinLink
    gather: GatherChoice

    def as_dict(self) -> Dict[str, Any]:
        """The JSON output, key for key: the records' fields flattened, in order."""
        return {**asdict(self.window), **asdict(self.link), **asdict(self.gather)}


def standin(link_gbps: Tuple[float, ...] = (), latency_us: Tuple[float, ...] = (),
            row_ns: Tuple[float, ...] = (), link_profile: Optional[str] = None) -> StandinBackend:
    """The stand-in device the plan is for: --link-gbps (default 8), --latency-us and --row-ns, one
    value each, or the named link --link-profile at its own peak or --link-gbps (as `ferry bench`
    makes it).

    Raises
    ------
    InvalidArgumentError
        For more than one value of an option, an unknown link_profile, or --latency-us or --row-ns
        beside one.
    """
    cfg = DeviceConfig(link_gbps=link_gbps, latency_us=latency_us, row_ns=row_ns, link_profile=link_profile)
    cfg.check(1, "cpu")
    split = cfg.make("cpu")[0]
    assert isinstance(split, StandinBackend)
    return split


def paged_cache(n_ctx: int, npl: int, cells: int, type: str = "f16", head_dim: int = 128, n_head_kv: int = 8,
                v_trans: bool = False, block_size: int = 16, adjacency: float = 0.5, seed: int = 0,
                backend: Optional[Backend] = None) -> PagedKVCache:
    """The paged cache the plan lays out: pools of n_ctx cells (rounded up to whole blocks), npl
    sequences of cells cells each, tables drawn by adjacency from seed.

    Parameters
    ----------
    n_ctx : int
        Cells in the pools.
    npl, cells : int
        Sequences, and the cells each holds.
    type, head_dim, n_head_kv, v_trans, block_size, adjacency, seed : optional
        The cache's geometry and how its tables are drawn.
    backend : Backend, optional
        Whose memory holds the pools (default: the CPU's host memory).

    Returns
    -------
    PagedKVCache

    Raises
    ------
    InvalidArgumentError
        For values out of range, or sequences the pools cannot hold (naming what to change).
    """
    check_positive((("-c", n_ctx), ("-npl", npl), ("-npp + -ntg", cells), ("--head-dim", head_dim),
                    ("--kv-heads", n_head_kv)))
    check_paged(block_size, adjacency)
    n_blocks = check_pool(n_ctx, npl, cells, block_size)
    per_seq = blocks_for(cells, block_size)
    ty = to_type(type)
    cache = PagedKVCache(ty, ty, head_dim, n_head_kv, block_size, n_blocks, npl, v_trans=v_trans, backend=backend)
    try:
        for s, table in enumerate(adjacent_tables([per_seq] * npl, n_blocks, adjacency, seed)):
            cache.set_table(s, table, cells)
    except BaseException:
        cache.close()
        raise
    return cache


def paged_window_plan(n_ctx: int, npl: int, npp: int, ntg: int, type: str = "f16", head_dim: int = 128,
                      n_head_kv: int = 8, v_trans: bool = False, which: str = "k",
                      streams: Optional[Tuple[int, int]] = None, block_size: int = 16, adjacency: float = 0.5,
                      link_gbps: Tuple[float, ...] = (), latency_us: Tuple[float, ...] = (),
                      row_ns: Tuple[float, ...] = (), seed: int = 0,
                      link_profile: Optional[str] = None) -> PagedWindowPlan:
    """The gather plan of a paged window of layer 0 over sequences streams (default all), each of npp +
    ntg cells, into a stand-in of the link given (a dry run).

    Parameters
    ----------
    n_ctx, npl, npp, ntg : int
        Cells in the pools, sequences, and the cells of each (npp + ntg).
    type, head_dim, n_head_kv, v_trans, block_size, adjacency, seed : optional
        As paged_cache takes them.
    which : str, optional
        "k" or "v".
    streams : (int, int), optional
        The first and last sequence read.
    link_gbps, latency_us, row_ns : tuple of float, optional
        The stand-in's link (standin).
    link_profile : str, optional
        The stand-in's named link (standin).

    Returns
    -------
    PagedWindowPlan

    Raises
    ------
    InvalidArgumentError
        For values out of range.
    """
    if isinstance(ntg, bool) or not isinstance(ntg, int) or ntg < 0:
        raise InvalidArgumentError(f"-ntg must be an integer >= 0, got {ntg!r}")
    check_positive((("-npp", npp),))
    if which not in ("k", "v"):
        raise InvalidArgumentError(f"--which is k or v, not {which!r}")
    s0, s1 = streams if streams is not None else (0, npl - 1)
    if not 0 <= s0 <= s1 < npl:
        raise InvalidArgumentError(f"--stream {s0}-{s1}: sequences are 0..{npl - 1} and s0 <= s1")
    split = standin(link_gbps, latency_us, row_ns, link_profile)
    cells = npp + ntg
    cache = paged_cache(n_ctx, npl, cells, type, head_dim, n_head_kv, v_trans, block_size, adjacency, seed)
    try:
        k, v = cache.window(0, cells, s0, s1)
        p = plan_paged(k if which == "k" else v, split)
        params = cache.params
        return PagedWindowPlan(
            window=PagedWindow(which=which, type=str(params.type_k), v_trans=v_trans, head_dim=head_dim,
                               n_head_kv=n_head_kv, n_ctx=n_ctx, n_seq=npl, cells=cells, block_size=block_size,
                               n_blocks=params.n_blocks, adjacency=adjacency, streams=[s0, s1]),
            link=StandinLink(link_gbps=split.link_gbps or 0.0, latency_us=split.latency_us, row_ns=split.row_ns,
                             link_profile=link_profile,
                             piece_floor_gbps=split.piece_curve[0] if split.piece_curve else 0.0),
            gather=GatherChoice(blocks=p.blocks, runs=p.runs, calls=p.calls, bytes=p.bytes,
                                crossed_bytes=p.crossed_bytes, spans=p.spans, method=str(p.method),
                                seconds=p.seconds, method_seconds=dict(p.method_seconds)))
    finally:
        cache.close()
