"""`ferry table`: what a flat copy and a ranges copy of the K window move, per number of sequences.

A dry run through the library itself: the KV cache lives in synthetic host memory (a
DummyBackend with is_host), a one-node graph (dup of the K window) is pinned to a
synthetic device-like DummyBackend, and the Scheduler runs it under flat, then under
ranges. The cells come from the scheduler's copy statistics, not from a formula.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, List, Sequence

from .backend import DummyBackend
from .errors import InvalidArgumentError
from .graph import Graph
from .kv import KVCache
from .sched import SchedStats, Scheduler
from .types import TypeLike, row_size, to_type


@dataclass(frozen=True)
class TableRow:
    """One number of sequences: cells the graph reads, cells each policy copied, and flat / ranges."""

    npl: int
    cells_read: int
    cells_copied_flat: int
    cells_copied_ranges: int
    ratio: float

    def as_dict(self) -> Dict[str, object]:
        return asdict(self)


def n_kv_for(npp: int, ntg: int, pad: int, kv_size: int) -> int:
    """Cells a sequence's window reads: npp + ntg rounded up to pad, at most the stream's size."""
    need = npp + ntg
    return min((need + pad - 1) // pad * pad, kv_size)


def window_stats(n_ctx: int, npl: int, n_kv: int, type_k: TypeLike = "q8_0", head_dim: int = 128,
                 n_head_kv: int = 8) -> Dict[str, SchedStats]:
    """Run the K window of npl streams through the scheduler under flat and ranges (a dry run)."""
    host = DummyBackend(is_host=True)  # synthetic memory that claims to be host memory
    split = DummyBackend()  # synthetic, device-like
    kv = KVCache(type_k, type_k, head_dim, n_head_kv, n_ctx, npl, backend=host)
    k, _ = kv.window(0, n_kv, 0, npl - 1)
    out = k.dup(name="k_dup").set_output()
    graph = Graph(out)
    stats = {}
    for policy in ("flat", "ranges"):
        sched = Scheduler([split, host], policy=policy)
        sched.pin(out, split)
        sched.compute(graph)
        stats[policy] = sched.stats
        sched.close()
    return stats


def build_table(n_ctx: int, npls: Sequence[int], npp: int, ntg: int, pad: int = 1, type_k: TypeLike = "q8_0",
                head_dim: int = 128, n_head_kv: int = 8) -> List[TableRow]:
    """One TableRow per number of sequences; kv_size = n_ctx / npl."""
    for name, value in (("-c", n_ctx), ("-npp", npp), ("--pad", pad), ("--head-dim", head_dim),
                        ("--kv-heads", n_head_kv)):
        if value <= 0:
            raise InvalidArgumentError(f"{name} must be positive, got {value}")
    if ntg < 0:
        raise InvalidArgumentError(f"-ntg must not be negative, got {ntg}")
    row = row_size(to_type(type_k), head_dim * n_head_kv)
    rows = []
    for npl in npls:
        if npl <= 0 or n_ctx % npl != 0:
            raise InvalidArgumentError(f"-npl {npl}: the context of {n_ctx} cells does not split into {npl} "
                                       "equal streams")
        n_kv = n_kv_for(npp, ntg, pad, n_ctx // npl)
        st = window_stats(n_ctx, npl, n_kv, type_k, head_dim, n_head_kv)
        if st["flat"].bytes_read != st["ranges"].bytes_read:
            raise AssertionError("the two runs read different windows")
        read, flat, ranges = st["ranges"].bytes_read // row, st["flat"].bytes_copied // row, \
            st["ranges"].bytes_copied // row
        rows.append(TableRow(npl, read, flat, ranges, flat / ranges))
    return rows


def format_table(rows: Sequence[TableRow]) -> str:
    """The rows as an aligned text table with thousands separators."""
    head = ("sequences", "cells read", "cells copied flat", "cells copied ranges", "flat/ranges")
    body = [(str(r.npl), f"{r.cells_read:,}", f"{r.cells_copied_flat:,}", f"{r.cells_copied_ranges:,}",
             f"{r.ratio:.2f}x") for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    return "\n".join("  ".join(x.rjust(w) for x, w in zip(line, widths)) for line in [head, *body])
