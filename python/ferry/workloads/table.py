"""The dry run `ferry table` runs: what flat and ranges copies move per number of sequences.

Nothing is computed on real memory: the cache lives in synthetic host memory (a DummyBackend
with is_host, no memory behind it) and the split in a synthetic device-like DummyBackend. The
cells of `build_table` come from the scheduler's copy statistics, not from a formula.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence

from ..backend import DummyBackend
from ..errors import InvalidArgumentError
from ..graph import Graph
from ..kv import KVCache
from ..ops import dup
from ..sched import SchedStats, Scheduler
from ..types import TypeLike, row_size, to_type
from .common import JsonRecord, check_positive, check_streams, n_kv_for

__all__ = ["TableRow", "build_table", "n_kv_for", "window_stats"]


@dataclass(frozen=True)
class TableRow(JsonRecord):
    """One number of sequences: cells the graph reads, cells each policy copied, and flat / ranges."""

    npl: int
    cells_read: int
    cells_copied_flat: int
    cells_copied_ranges: int
    ratio: float


def window_stats(n_ctx: int, npl: int, n_kv: int, type_k: TypeLike = "q8_0", head_dim: int = 128,
                 n_head_kv: int = 8) -> Dict[str, SchedStats]:
    """Run the K window of npl streams through the scheduler under flat and under ranges (a dry run).

    Parameters
    ----------
    n_ctx : int
        Cells in all streams.
    npl : int
        Streams.
    n_kv : int
        Cells read per stream.
    type_k : Type, str or int, optional
    head_dim, n_head_kv : int, optional

    Returns
    -------
    dict of str to SchedStats
        Keyed "flat" and "ranges".
    """
    host = DummyBackend(is_host=True)  # synthetic memory that claims to be host memory
    split = DummyBackend()  # synthetic, device-like
    kv = KVCache(type_k, type_k, head_dim, n_head_kv, n_ctx, npl, backend=host)
    k, _ = kv.window(0, n_kv, 0, npl - 1)
    out = dup(k, name="k_dup").set_output()
    graph = Graph(out)
    stats = {}
    for policy in ("flat", "ranges"):
        sched = Scheduler([split, host], policy=policy)
        sched.assign(out, split)
        sched.compute(graph)
        stats[policy] = sched.stats
        sched.close()
    return stats


def build_table(n_ctx: int, npls: Sequence[int], npp: int, ntg: int, pad: int = 1, type_k: TypeLike = "q8_0",
                head_dim: int = 128, n_head_kv: int = 8) -> List[TableRow]:
    """Cells read and copied under flat and ranges, per number of sequences (a dry run).

    Parameters
    ----------
    n_ctx : int
        Cells in all streams; kv_size = n_ctx / npl.
    npls : sequence of int
        Numbers of sequences, one stream each.
    npp, ntg : int
        Prompt and generated tokens per sequence.
    pad : int, optional
        n_kv is rounded up to a multiple of this.
    type_k : Type, str or int, optional
    head_dim, n_head_kv : int, optional

    Returns
    -------
    list of TableRow
        One per number of sequences.

    Raises
    ------
    InvalidArgumentError
        For values that are not positive, or an npl that does not divide n_ctx.
    """
    check_positive((("-c", n_ctx), ("-npp", npp), ("--pad", pad), ("--head-dim", head_dim),
                    ("--kv-heads", n_head_kv)), integer=False)
    if ntg < 0:
        raise InvalidArgumentError(f"-ntg must not be negative, got {ntg}")
    row = row_size(to_type(type_k), head_dim * n_head_kv)
    rows = []
    for npl in npls:
        check_streams(n_ctx, npl)
        n_kv = n_kv_for(npp, ntg, pad, n_ctx // npl)
        st = window_stats(n_ctx, npl, n_kv, type_k, head_dim, n_head_kv)
        if st["flat"].bytes_read != st["ranges"].bytes_read:
            raise AssertionError("the two runs read different windows")
        read, flat, ranges = st["ranges"].bytes_read // row, st["flat"].bytes_copied // row, \
            st["ranges"].bytes_copied // row
        rows.append(TableRow(npl, read, flat, ranges, flat / ranges))
    return rows
