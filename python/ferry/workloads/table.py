"""The dry run `ferry table` runs: what flat, ranges and ragged copies move per number of sequences.

Nothing is computed on real memory: the cache lives in synthetic host memory (a DummyBackend
with is_host, no memory behind it) and the split in a synthetic device-like DummyBackend; only
the streams' lengths, which the ragged policy reads, are real host memory. The cells of
`build_table` come from the scheduler's copy statistics, not from a formula. Each stream's
sequence has its prompt (-npp, or drawn as --lengths says) plus ntg cells; the window holds the
longest rounded up to --pad; attention reads each stream's own cells (cells read), which ragged
copies alone.

Layers of different sizes (a model with sliding-window layers): each distinct layer size gets
its own dry run over a cache of its own size, a sliding layer of window W holding and reading
min(W + 1, n_kv) cells per stream (the 1: the cell a decode step adds to each sequence). The
figures then count every layer, each at its own size, per kind and over all layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..backend import CPUBackend, DummyBackend
from ..errors import InvalidArgumentError
from ..graph import Graph
from ..kv import KVCache
from ..ops import dup
from ..sched import SchedStats, Scheduler
from ..tensor import Tensor
from ..types import TypeLike, row_size, to_type
from .common import JsonRecord, Lengths, check_positive, check_streams, n_kv_for, prompt_lengths
from .model_file import layer_sizes

__all__ = ["CopyCounts", "LayerKindRow", "TableRow", "build_table", "n_kv_for", "window_stats"]

#: Cells a decode step adds to each sequence's stream: what a sliding layer holds beyond its window.
DECODE_NEW_CELLS = 1


@dataclass(frozen=True)
class CopyCounts:
    """What attention reads of a window and what each policy copies of it, in one unit (cells or bytes).

    Attributes
    ----------
    read : int
        What attention reads: each stream's own cells.
    flat, ranges, ragged : int
        What each policy copies.
    """

    read: int
    flat: int
    ranges: int
    ragged: int

    def times(self, k: int) -> "CopyCounts":
        """Each count times k (k layers alike, or k bytes a cell)."""
        return CopyCounts(read=self.read * k, flat=self.flat * k, ranges=self.ranges * k, ragged=self.ragged * k)

    def named(self, unit: str) -> Dict[str, int]:
        """The counts by the names `ferry table --json` gives them: "<unit>_read", "<unit>_copied_<policy>"."""
        return {f"{unit}_read": self.read, f"{unit}_copied_flat": self.flat, f"{unit}_copied_ranges": self.ranges,
                f"{unit}_copied_ragged": self.ragged}


@dataclass(frozen=True)
class LayerKindRow(JsonRecord):
    """The layers of one kind at one number of sequences: cells and bytes over all of them.

    Attributes
    ----------
    kind : str
        "full" or "sliding".
    window : int or None
        A sliding layer's window; None for a full one.
    n_layer : int
        The layers of the kind.
    kv_size, n_kv : int
        The cells per stream a layer holds, and those it reads.
    cells, bytes : CopyCounts
        What every layer of the kind reads and each policy copies, in cells and in bytes.
    """

    kind: str
    window: Optional[int]
    n_layer: int
    kv_size: int
    n_kv: int
    cells: CopyCounts
    bytes: CopyCounts

    def as_dict(self) -> Dict[str, Any]:
        """The fields by name, the counts flattened (CopyCounts.named)."""
        return {"kind": self.kind, "window": self.window, "n_layer": self.n_layer, "kv_size": self.kv_size,
                "n_kv": self.n_kv, **self.cells.named("cells"), **self.bytes.named("bytes")}


@dataclass(frozen=True)
class TableRow(JsonRecord):
    """One number of sequences: cells attention reads, cells each policy copied, and their ratios.

    Without layers of different sizes the cells are one layer's K window. With them, the cells count every
    layer at its own size, bytes gives the same in bytes and layers each kind's share; those two are left
    out of as_dict() otherwise.

    Attributes
    ----------
    npl : int
        Sequences, one stream each.
    cells : CopyCounts
        Cells attention reads and each policy copies.
    bytes : CopyCounts or None
        The same in bytes, with layers of different sizes; None otherwise.
    layers : list of LayerKindRow or None
        Each kind's share, with layers of different sizes; None otherwise.
    """

    npl: int
    cells: CopyCounts
    bytes: Optional[CopyCounts] = None
    layers: Optional[List[LayerKindRow]] = None

    @property
    def flat_over_ranges(self) -> float:
        """Cells flat copies over cells ranges copies."""
        return self.cells.flat / self.cells.ranges

    @property
    def flat_over_ragged(self) -> float:
        """Cells flat copies over cells ragged copies."""
        return self.cells.flat / self.cells.ragged

    def as_dict(self) -> Dict[str, Any]:
        """The fields by name, the counts flattened (CopyCounts.named), with "ratio" (flat_over_ranges under its
        first name, kept for the scripts that read `ferry table --json`); bytes and layers only for layers of
        different sizes."""
        d: Dict[str, Any] = {"npl": self.npl, **self.cells.named("cells"), "ratio": self.flat_over_ranges,
                             "flat_over_ranges": self.flat_over_ranges, "flat_over_ragged": self.flat_over_ragged}
        if self.bytes is not None:
            d.update(self.bytes.named("bytes"))
        if self.layers is not None:
            d["layers"] = [k.as_dict() for k in self.layers]
        return d


def window_stats(n_ctx: int, npl: int, n_kv: int, type_k: TypeLike = "q8_0", head_dim: int = 128,
                 n_head_kv: int = 8, used: Optional[Sequence[int]] = None) -> Dict[str, SchedStats]:
    """Run the K window of npl streams through the scheduler under flat, ranges and ragged (a dry run).

    Parameters
    ----------
    n_ctx : int
        Cells in all streams.
    npl : int
        Streams.
    n_kv : int
        Cells of each stream the window holds.
    type_k : Type, str or int, optional
    head_dim, n_head_kv : int, optional
    used : sequence of int, optional
        Each stream's cells attention reads (at most n_kv): what ragged copies (default n_kv each).

    Returns
    -------
    dict of str to SchedStats
        Keyed "flat", "ranges" and "ragged".
    """
    host = DummyBackend(is_host=True)  # synthetic memory that claims to be host memory
    split = DummyBackend()  # synthetic, device-like
    lengths = Tensor.from_numpy(CPUBackend(), np.array([n_kv] * npl if used is None else list(used), np.int32),
                                name="kv_len")
    kv = KVCache(type_k, type_k, head_dim, n_head_kv, n_ctx, npl, backend=host)
    k, _ = kv.window(0, n_kv, 0, npl - 1, lengths=lengths)
    out = dup(k, name="k_dup").set_output()
    graph = Graph(out)
    stats = {}
    for policy in ("flat", "ranges", "ragged"):
        sched = Scheduler([split, host], policy=policy)
        sched.assign(out, split)
        sched.compute(graph)
        stats[policy] = sched.stats
        sched.close()
    return stats


def _kinds(windows: Sequence[Optional[int]]) -> List[Tuple[Optional[int], int]]:
    """(window, layers) of each distinct window, full (None) first, then the windows in increasing order."""
    counts: Dict[Optional[int], int] = {}
    for w in windows:
        counts[w] = counts.get(w, 0) + 1
    return sorted(counts.items(), key=lambda kv: -1 if kv[0] is None else kv[0])


def build_table(n_ctx: int, npls: Sequence[int], npp: int, ntg: int, pad: int = 1, type_k: TypeLike = "q8_0",
                head_dim: int = 128, n_head_kv: int = 8, layer_windows: Optional[Sequence[Optional[int]]] = None,
                lengths: Lengths = "equal", seed: int = 0) -> List[TableRow]:
    """Cells attention reads and cells flat, ranges and ragged copy, per number of sequences (a dry run).

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
    layer_windows : sequence of (int or None), optional
        Each layer's sliding window, None for a full-attention layer. With a sliding layer among
        them the rows count every layer at its own size; otherwise (and by default) one layer.
    lengths : str or tuple of int, optional
        Each sequence's prompt (common.prompt_lengths): "equal" (npp each), "uniform", or given.
    seed : int, optional
        The draws of "uniform".

    Returns
    -------
    list of TableRow
        One per number of sequences.

    Raises
    ------
    InvalidArgumentError
        For values that are not positive, an npl that does not divide n_ctx, or a window that is
        not positive.
    """
    check_positive((("-c", n_ctx), ("-npp", npp), ("--pad", pad), ("--head-dim", head_dim),
                    ("--kv-heads", n_head_kv)), integer=False)
    if ntg < 0:
        raise InvalidArgumentError(f"-ntg must not be negative, got {ntg}")
    for w in layer_windows or ():
        if w is not None and w <= 0:
            raise InvalidArgumentError(f"a sliding window must be positive, got {w}")
    mixed = layer_windows is not None and any(w is not None for w in layer_windows)
    row = row_size(to_type(type_k), head_dim * n_head_kv)

    def cells(n_ctx_l: int, npl: int, n_kv: int, prompts: Sequence[int]) -> CopyCounts:
        used = [min(p + ntg, n_kv) for p in prompts]
        st = window_stats(n_ctx_l, npl, n_kv, type_k, head_dim, n_head_kv, used)
        if st["flat"].bytes_read != st["ranges"].bytes_read:
            raise AssertionError("the two runs read different windows")
        return CopyCounts(read=st["ragged"].bytes_read // row, flat=st["flat"].bytes_copied // row,
                          ranges=st["ranges"].bytes_copied // row, ragged=st["ragged"].bytes_copied // row)

    rows = []
    for npl in npls:
        check_streams(n_ctx, npl)
        kv_size = n_ctx // npl
        prompts = prompt_lengths(lengths, npl, npp, seed)
        n_kv = n_kv_for(max(prompts), ntg, pad, kv_size)
        if not mixed:
            rows.append(TableRow(npl=npl, cells=cells(n_ctx, npl, n_kv, prompts)))
            continue
        kinds = []
        for window, n_layer in _kinds(layer_windows or ()):
            # a sliding layer holds its window and the step's new cells, never more than a stream
            held = kv_size if window is None else min(window + DECODE_NEW_CELLS, kv_size)
            (n_kv_l,) = layer_sizes([window], n_kv, kv_size, DECODE_NEW_CELLS)
            kind = cells(npl * held, npl, n_kv_l, prompts).times(n_layer)
            kinds.append(LayerKindRow(kind="full" if window is None else "sliding", window=window, n_layer=n_layer,
                                      kv_size=held, n_kv=n_kv_l, cells=kind, bytes=kind.times(row)))
        total = CopyCounts(**{f: sum(getattr(k.cells, f) for k in kinds) for f in ("read", "flat", "ranges", "ragged")})
        rows.append(TableRow(npl=npl, cells=total, bytes=total.times(row), layers=kinds))
    return rows
