"""A paged cache's blocks kept on a device, and the table attention reads them by (ferry/block-pool.h).

A BlockPool holds, per layer of a PagedKVCache, a K and a V pool of n_slots block slots in a
backend's memory (laid out as the cache's pools, V transposed where the cache's is), and a device
table, i32 [n_blocks, n_seq]: row s the slot of each block of sequence s's table. sync() sends only
what must cross: a block several sequences read crosses once, a block already in a slot and
unchanged not again, a block whose cells grew its new cells only. The caller says what changed,
as to a scheduler under prefetch across steps: drop_ahead() (every slot sent again) and
truncate(seq, length) (a rollback). stats says every byte sent, from the pool's buffers' own
transfer counters. close() frees the device memory at once.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _checks
from ._binding import ffi, lib
from ._handle import Closeable, Handle, Hold, holding, release_when_collected
from .backend import Backend
from .errors import InvalidArgumentError, check
from .graph import Graph
from .paged import PagedKVCache
from .sched import Scheduler
from .stats import Stats
from .step import StepOutputs, _Step
from .tensor import Tensor, _new_context


@dataclass(frozen=True)
class BlockPoolStats:
    """What a pool sent and kept since it was made or its stats reset (ferry_block_pool_stats).

    Attributes
    ----------
    syncs : int
        sync() calls that sent what they had to.
    cell_bytes : int
        K and V cells sent, every layer.
    table_bytes : int
        Device table entries sent.
    transfers : int
        Async sets made, cells and table.
    blocks_sent, blocks_grown, blocks_kept : int
        Blocks read that were sent from cell 0; that sent their new cells only; that did not cross.
    evictions : int
        Slots taken from a block the sync did not read.
    syncs_ahead, bytes_ahead : int
        Syncs made under prefetch (BlockPool.prefetch), and their bytes: sent on the copy queue ahead of
        the compute that reads them.
    buffers : Stats
        The pool's buffers' transfer counters: every byte that crossed.
    """

    syncs: int
    cell_bytes: int
    table_bytes: int
    transfers: int
    blocks_sent: int
    blocks_grown: int
    blocks_kept: int
    evictions: int
    syncs_ahead: int
    bytes_ahead: int
    buffers: Stats

    @classmethod
    def from_c(cls, s: Any) -> "BlockPoolStats":
        """A BlockPoolStats holding the values of the ferry_block_pool_stats cdata s."""
        return cls(syncs=int(s.syncs), cell_bytes=int(s.cell_bytes), table_bytes=int(s.table_bytes),
                   transfers=int(s.transfers), blocks_sent=int(s.blocks_sent), blocks_grown=int(s.blocks_grown),
                   blocks_kept=int(s.blocks_kept), evictions=int(s.evictions), syncs_ahead=int(s.syncs_ahead),
                   bytes_ahead=int(s.bytes_ahead), buffers=Stats.from_c(s.buffers))

    @property
    def bytes(self) -> int:
        """Bytes that crossed: cells and table."""
        return self.cell_bytes + self.table_bytes


def _int32s(values: object, n: Optional[int], what: str) -> List[int]:
    """values as int32s (n of them, when n is given), or InvalidArgumentError naming what."""
    items = list(values) if isinstance(values, (list, tuple, np.ndarray)) else None
    ok = items is not None and (n is None or len(items) == n) and all(
        isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) and -(2**31) <= int(x) < 2**31
        for x in items)
    if not ok or items is None:
        count = f"{n} " if n is not None else ""
        raise InvalidArgumentError(f"{what} must be a list of {count}int32 integers; got {values!r}")
    return [int(x) for x in items]


def _lengths(lengths: Optional[Sequence[int]], n: int, what: str) -> Any:
    """lengths as the int32 array C reads (NULL for None), one per synced sequence."""
    if lengths is None:
        return ffi.NULL
    return ffi.new("int32_t[]", _int32s(lengths, n, f"{what}: lengths (one per sequence)") or [0])


class BlockPool(Closeable):
    """A device pool of a paged cache's blocks and its table (ferry_block_pool_new).

    Parameters
    ----------
    cache : PagedKVCache
        The cache whose blocks it keeps; its pools in host memory. Kept alive by the pool.
    backend : Backend
        The device: the pools and table are in its default buffer type.
    n_slots : int
        Slots per layer's K and V pools, 1..the cache's n_blocks.

    Raises
    ------
    InvalidArgumentError
        For a cache or backend that is not one, a cache layer not in host memory.
    OutOfBoundsError
        For n_slots out of range.
    OutOfMemoryError
        When the device cannot hold the pools.
    """

    def __init__(self, cache: PagedKVCache, backend: Backend, n_slots: int) -> None:
        if not isinstance(cache, PagedKVCache):
            raise InvalidArgumentError(f"BlockPool: cache must be a PagedKVCache, not {type(cache).__name__}")
        _checks.c_object(backend, "ferry_backend *", "a Backend", "BlockPool")
        n = _checks.as_int64(n_slots, "BlockPool: n_slots")
        out = ffi.new("ferry_block_pool **")
        check(lib.ferry_block_pool_new(cache._p, backend._p, n, out))
        self._cache = cache
        self._backend = backend
        self._handle = Handle(out[0], lib.ferry_block_pool_free, (cache._handle, backend._handle))
        self._finalizer = weakref.finalize(self, self._handle.release)
        self._tensors: Dict[Any, Tensor] = {}

    def _after_close(self) -> None:
        self._tensors = {}

    def _describe(self) -> str:
        return "BlockPool"

    @property
    def cache(self) -> PagedKVCache:
        """The cache whose blocks the pool keeps."""
        return self._cache

    @property
    def backend(self) -> Backend:
        """The device the pool is on."""
        return self._backend

    @property
    @holding
    def n_slots(self) -> int:
        """Slots in each layer's K and V pools."""
        return int(lib.ferry_block_pool_n_slots(self._p))

    def _tensor(self, key: Any, get: Any, *args: Any) -> Tensor:
        t = self._tensors.get(key)
        if t is None:
            out = ffi.new("ferry_tensor **")
            check(get(self._p, *args, out))
            t = Tensor._borrow(out[0], self._handle, keep=self)
            self._tensors[key] = t
        return t

    @holding
    def k(self, layer: int = 0) -> Tensor:
        """Layer layer's device K pool, [n_embd_gqa, n_slots * block_size].

        Parameters
        ----------
        layer : int, optional

        Returns
        -------
        Tensor

        Raises
        ------
        OutOfBoundsError
            For a layer the cache does not have.
        """
        layer = _checks.as_c_int(layer, "BlockPool.k: layer")
        return self._tensor(("k", layer), lib.ferry_block_pool_k, layer)

    @holding
    def v(self, layer: int = 0) -> Tensor:
        """Layer layer's device V pool, as k, or transposed ([n_slots * block_size, n_embd_gqa]).

        Parameters
        ----------
        layer : int, optional

        Returns
        -------
        Tensor

        Raises
        ------
        OutOfBoundsError
            For a layer the cache does not have.
        """
        layer = _checks.as_c_int(layer, "BlockPool.v: layer")
        return self._tensor(("v", layer), lib.ferry_block_pool_v, layer)

    @property
    @holding
    def table(self) -> Tensor:
        """The device table, i32 [n_blocks, n_seq]: row s the slots of sequence s's blocks last synced."""
        return self._tensor("table", lib.ferry_block_pool_table)

    @holding
    def sync(self, s0: int = 0, s1: Optional[int] = None, lengths: Optional[Sequence[int]] = None) -> None:
        """Make sequences s0..s1 - 1's first lengths cells readable through the device table.

        Parameters
        ----------
        s0, s1 : int, optional
            The sequences (default: all of the cache's).
        lengths : sequence of int, optional
            One per sequence, each 0..the cells its table holds (default: those cells).

        Raises
        ------
        OutOfBoundsError
            For sequences the cache does not have, a length out of range.
        OutOfMemoryError
            When the distinct blocks read do not fit the slots the resident set leaves.
        InvalidArgumentError
            For lengths that are not one integer per sequence.
        """
        a = _checks.as_int64(s0, "BlockPool.sync: s0")
        b = self._cache.params.n_seq if s1 is None else _checks.as_int64(s1, "BlockPool.sync: s1")
        check(lib.ferry_block_pool_sync(self._p, a, b, _lengths(lengths, max(b - a, 0), "BlockPool.sync")))

    @property
    @holding
    def prefetch(self) -> bool:
        """Whether syncs send on the backend's copy queue, ahead of the compute (ferry_block_pool_set_prefetch)."""
        return bool(lib.ferry_block_pool_prefetch(self._p))

    @holding
    def set_prefetch(self, ahead: bool) -> None:
        """Send each sync's blocks on the backend's copy queue, an event after them, so that the next group's
        blocks (or the next step's first group's) cross while the current group computes; call wait() before
        the compute that reads them. The sync keeps the slots the sync before it read, and plan() gives groups
        whose streamed blocks fit half the streaming slots. The bytes and outputs are those of serial syncs.

        Parameters
        ----------
        ahead : bool
            On, or off (off waits for the sends in flight).

        Raises
        ------
        InvalidArgumentError
            For ahead not a bool.
        UnsupportedError
            For a backend whose queue cannot make events.
        """
        if not isinstance(ahead, bool):
            raise InvalidArgumentError(f"BlockPool.set_prefetch: ahead must be a bool, not {ahead!r}")
        check(lib.ferry_block_pool_set_prefetch(self._p, ahead))

    @holding
    def wait(self) -> None:
        """Make the backend's later work wait for the last sync's sends (at once when nothing is in flight)."""
        check(lib.ferry_block_pool_wait(self._p))

    @holding
    def drop_ahead(self) -> None:
        """Every slot's cells are sent again at the next sync (cells the last sync read were rewritten)."""
        check(lib.ferry_block_pool_drop_ahead(self._p))

    @holding
    def truncate(self, seq: int, length: int) -> None:
        """Sequence seq's cells at and above length may be rewritten: the next sync sends them again.

        Parameters
        ----------
        seq : int
        length : int
            Cells below it are unchanged; 0 or more.

        Raises
        ------
        OutOfBoundsError
            For a sequence the cache does not have, a negative length.
        """
        check(lib.ferry_block_pool_truncate(self._p, _checks.as_int64(seq, "BlockPool.truncate: seq"),
                                            _checks.as_int64(length, "BlockPool.truncate: length")))

    @holding
    def set_resident(self, blocks: Sequence[int]) -> None:
        """Keep these cache blocks in their slots from now on (an empty list clears the set).

        Parameters
        ----------
        blocks : sequence of int
            Cache block ids, each once, at most n_slots of them.

        Raises
        ------
        OutOfBoundsError
            For an id outside the cache's blocks, more blocks than slots.
        InvalidArgumentError
            For an id twice.
        """
        ids = _int32s(blocks, None, "BlockPool.set_resident: blocks")
        check(lib.ferry_block_pool_set_resident(self._p, ffi.new("int32_t[]", ids) if ids else ffi.NULL, len(ids)))

    @holding
    def choose_resident(self, n_resident: int, s0: int = 0, s1: Optional[int] = None,
                        lengths: Optional[Sequence[int]] = None) -> List[int]:
        """The blocks a resident set of n_resident slots should keep, best first: blocks more sequences
        read, then blocks of more cells read, then lower ids.

        Parameters
        ----------
        n_resident : int
            0..n_slots.
        s0, s1, lengths : optional
            The sequences read, and how far, as sync takes them.

        Returns
        -------
        list of int
            min(n_resident, the distinct blocks read) cache block ids.

        Raises
        ------
        OutOfBoundsError
            As sync, and for n_resident out of range.
        """
        n = _checks.as_int64(n_resident, "BlockPool.choose_resident: n_resident")
        a = _checks.as_int64(s0, "BlockPool.choose_resident: s0")
        b = self._cache.params.n_seq if s1 is None else _checks.as_int64(s1, "BlockPool.choose_resident: s1")
        cap = min(max(n, 0), self.n_slots)  # C refuses more; the list holds no more
        out = ffi.new("int32_t[]", max(cap, 1))
        n_out = ffi.new("int64_t *")
        check(lib.ferry_block_pool_choose_resident(self._p, a, b, _lengths(lengths, max(b - a, 0),
                                                                          "BlockPool.choose_resident"),
                                                   n, out, cap, n_out))
        return [int(out[i]) for i in range(int(n_out[0]))]

    @holding
    def plan(self, s0: int = 0, s1: Optional[int] = None,
             lengths: Optional[Sequence[int]] = None) -> List[Tuple[int, int]]:
        """Keep a resident set and stream the rest, for a pool smaller than the blocks read
        (ferry_block_pool_plan): sets the resident set (shared blocks first, then the blocks of more
        cells read) and splits the sequences into groups whose streamed blocks fit the slots left.
        Sync and compute one group at a time.

        Parameters
        ----------
        s0, s1, lengths : optional
            The sequences read, and how far, as sync takes them.

        Returns
        -------
        list of (int, int)
            Each group's sequences, g0..g1 - 1, in order; one group when every block fits.

        Raises
        ------
        OutOfBoundsError
            As sync.
        OutOfMemoryError
            When one sequence's blocks do not fit the streaming slots.
        """
        a = _checks.as_int64(s0, "BlockPool.plan: s0")
        b = self._cache.params.n_seq if s1 is None else _checks.as_int64(s1, "BlockPool.plan: s1")
        room = max(min(b - a, self._cache.params.n_seq), 1)  # C refuses more sequences than the cache has
        ends = ffi.new("int64_t[]", room)
        n = ffi.new("int64_t *")
        check(lib.ferry_block_pool_plan(self._p, a, b, _lengths(lengths, max(b - a, 0), "BlockPool.plan"), ends,
                                        room, n))
        bounds = [a] + [int(ends[i]) for i in range(int(n[0]))]
        return list(zip(bounds, bounds[1:]))

    def attention_step(self, sched: Scheduler, q: Sequence[Tensor], kv_len: Tensor, s0: int = 0,
                       s1: Optional[int] = None) -> StepOutputs:
        """A decode step's attention over the pool (ferry_block_pool_attention_step): per layer a paged
        attention node (ferry.ops.attn_paged) of q[layer] over the layer's device pools through the
        device table's rows s0..s1 - 1, assigned to the pool's backend, named attn<layer>. Call sync
        with the same sequences and lengths before each compute: the nodes read the pools and table
        as they are then, and only kv_len crosses when the graph computes.

        Parameters
        ----------
        sched : Scheduler
            Holds the pool's backend; the outputs are assigned there.
        q : sequence of Tensor
            Per layer (as many as the cache's or fewer), f32 [head_dim, n_head, n_tok, s1 - s0].
        kv_len : Tensor
            i32 [s1 - s0]: each sequence's length, in host memory (copied as any input is).
        s0, s1 : int, optional
            The sequences (default: all of the cache's).

        Returns
        -------
        StepOutputs
            One output per layer, and their Graph.

        Raises
        ------
        InvalidArgumentError
            For a scheduler without the pool's backend, a q that is not a Tensor.
        LayoutError
            For shapes attention cannot read.
        OutOfBoundsError
            For sequences or layers the cache does not have.
        """
        sched_p = _checks.instance(sched, Scheduler, "BlockPool.attention_step: sched")._p
        if isinstance(q, (str, bytes)) or not hasattr(q, "__len__"):
            raise InvalidArgumentError("BlockPool.attention_step: q is a sequence with a Tensor per layer")
        qs = list(q)
        for i, t in enumerate(qs):
            _checks.instance(t, Tensor, f"BlockPool.attention_step: q[{i}]")._check_retainable()
        _checks.instance(kv_len, Tensor, "BlockPool.attention_step: kv_len")._check_retainable()
        a = _checks.as_int64(s0, "BlockPool.attention_step: s0")
        b = self._cache.params.n_seq if s1 is None else _checks.as_int64(s1, "BlockPool.attention_step: s1")
        with Hold((self._handle, sched._handle)):
            n = len(qs)
            q_p = ffi.new("ferry_tensor *[]", [t._p for t in qs] or [ffi.NULL])
            ctx = _new_context([self._handle, kv_len._handle] + [t._handle for t in qs])
            owner = _Step(ctx, self, qs, kv_len)
            release_when_collected(owner, ctx)
            g = ffi.new("ferry_graph **")
            check(lib.ferry_graph_new(g))
            graph_handle = Handle(g[0], lib.ferry_graph_free)
            outs_p = ffi.new("ferry_tensor *[]", max(n, 1))
            n_assigned = lib.ferry_sched_n_assigned(sched_p)
            st = lib.ferry_block_pool_attention_step(self._p, ctx.ptr, n, a, b, q_p, kv_len._p, sched_p,
                                                     graph_handle.ptr, outs_p)
            if st != lib.FERRY_OK:
                graph_handle.release()
                if lib.ferry_sched_n_assigned(sched_p) != n_assigned:  # kept by address until cleared
                    sched._assigned[ctx.ptr] = owner  # type: ignore[assignment]
                check(st)
            outs = StepOutputs(Tensor._borrow(outs_p[i], ctx, keep=owner) for i in range(n))
            for t in outs:
                sched._assigned[t._ptr] = t
            outs._graph = Graph._built(graph_handle, list(outs), [(self._handle, self)])
            return outs

    @property
    @holding
    def stats(self) -> BlockPoolStats:
        """What the pool sent and kept since it was made or reset_stats()."""
        s = ffi.new("ferry_block_pool_stats *")
        check(lib.ferry_block_pool_get_stats(self._p, s))
        return BlockPoolStats.from_c(s)

    @holding
    def reset_stats(self) -> None:
        """Start the stats again from zero."""
        lib.ferry_block_pool_reset_stats(self._p)
