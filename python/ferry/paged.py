"""A paged KV cache, as serving systems keep theirs (vLLM, SGLang, LMCache), and its windows.

Per layer a K and a V pool of n_blocks blocks of block_size cells, laid out as vLLM lays them
out: [num_blocks, block_size, n_kv_heads, head_dim] in C order (ferry's [n_embd_gqa, n_blocks *
block_size]); a transposed V (v_trans) is [n_embd_gqa, n_blocks * block_size] in C order, a row
per channel holding every pool cell. Each of n_seq sequences has a block table: the ids of its
blocks in the order of its cells, and how many cells it holds. allocate, append and free keep
tables from the cache's free list (lowest ids first: a fresh cache's sequences get adjacent
blocks); set_table takes the caller's own.

A window over sequences s0..s1 (one stream each) has the dense layout attention reads, and no
bytes of its own: the scheduler (or ferry.copy_path.copy_input) gathers each sequence's used
cells from its blocks into a dense copy on the split's backend, the CPU's too, under any copy
policy, so that attention runs unchanged and the bytes copied are the cells read. How it is
gathered is the cache's gather (a GatherMethod: auto by default); ferry.plan.plan_paged says
what a gather does and costs. The cache's tensors and windows keep it alive; close() frees it
at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _checks
from ._binding import ffi, lib
from ._handle import holding
from .backend import Backend
from .buffer import BufferType
from .errors import InvalidArgumentError, LayoutError, OutOfBoundsError, check
from .kv_layers import CacheLayout, LayerCache, LayerParams, LayerWindows
from .policy import GatherLike, GatherMethod, to_gather_method
from .tensor import Tensor
from .types import TypeLike, row_size


@dataclass(frozen=True)
class PagedParams(LayerParams):
    """The layout of a paged KV cache (ferry_paged_params), as C keeps it: PagedKVCache.params.

    Attributes
    ----------
    type_k, type_v, head_dim, n_head_kv : Type, Type, int, int
        A cell's K and V types, values per head and KV heads (ferry.kv_layers.LayerParams).
    block_size : int
        Cells per block.
    n_blocks : int
        Blocks in each layer's K and V pools.
    n_seq : int
        Sequences, a block table each.
    n_layer : int
        Layers, each with its K and V pools.
    v_trans : bool
        Whether V is stored transposed: a row per channel of every pool cell.
    share_blocks : bool
        Whether two tables may hold one block (a common prefix).
    """

    block_size: int
    n_blocks: int
    n_seq: int
    n_layer: int
    v_trans: bool
    share_blocks: bool

    @property
    def pool_cells(self) -> int:
        """Cells in a pool: n_blocks * block_size."""
        return self.n_blocks * self.block_size


class PagedKVCache(LayerCache):
    """Per layer a K and a V pool of blocks, a block table per sequence, and their windows.

    The memory is the backend's default buffer type, or buffer_type, or with pinned=True CUDA's
    pinned host memory (the gather kernel reads it); the CPU's host memory when none is given. A
    new cache reads zeros, every table empty, every block free.

    Parameters
    ----------
    type_k, type_v : Type, str or int
        The K and V types (q8_0 rows whole; a transposed V of an unblocked type).
    head_dim : int
        Values per head.
    n_head_kv : int
        KV heads; a cell holds head_dim * n_head_kv values of K and of V.
    block_size : int
        Cells per block.
    n_blocks : int
        Blocks in each layer's pools.
    n_seq : int
        Sequences: one block table each.
    n_layer : int, optional
        Layers.
    v_trans : bool, optional
        V stored transposed, a row per channel holding every pool cell.
    share_blocks : bool, optional
        Let two tables hold one block (refused otherwise, naming both sequences).
    backend, buffer_type, pinned, placement : optional
        Where the pools live, as KVCache takes them (at most one of the first three; placement:
        per layer None or a Backend whose memory holds that layer).

    Raises
    ------
    InvalidArgumentError
        For values that cannot reach C or C refuses (naming them), more than one of backend,
        buffer_type and pinned, a placement of another length than n_layer.
    LayoutError
        For rows that are not whole blocks of the type, or a transposed V of a blocked type.
    OutOfMemoryError
        When the pools cannot be allocated.

    Examples
    --------
    Eight blocks of 4 cells: sequence 0 takes 6 cells (two blocks from the free list), sequence 1
    three, then two more, which fill its block and take the next:

    >>> from ferry.paged import PagedKVCache
    >>> c = PagedKVCache("f16", "f16", head_dim=4, n_head_kv=1, block_size=4, n_blocks=8, n_seq=2)
    >>> c.allocate(0, 6)
    >>> c.allocate(1, 3)
    >>> c.append(1, 2)
    >>> c.table(0), c.table(1), c.free_blocks
    (([0, 1], 6), ([2, 3], 5), 4)
    """

    _layout = CacheLayout(name="PagedKVCache", c_type="ferry_paged_cache", params_type="ferry_paged_params",
                          params_class=PagedParams, free=lib.ferry_paged_cache_free,
                          params=lib.ferry_paged_cache_params, k=lib.ferry_paged_cache_k, v=lib.ferry_paged_cache_v,
                          layer_buffer=lib.ferry_paged_cache_layer_buffer)

    def __init__(self, type_k: TypeLike, type_v: TypeLike, head_dim: int, n_head_kv: int, block_size: int,
                 n_blocks: int, n_seq: int, n_layer: int = 1, v_trans: bool = False, share_blocks: bool = False,
                 backend: Optional[Backend] = None, buffer_type: Optional[BufferType] = None, pinned: bool = False,
                 placement: Optional[Sequence[Optional[Backend]]] = None) -> None:
        buft = self._memory(backend, buffer_type, pinned)
        p = self._c_params(type_k=type_k, type_v=type_v, head_dim=head_dim, n_head_kv=n_head_kv,
                           block_size=block_size, n_blocks=n_blocks, n_seq=n_seq, n_layer=n_layer, v_trans=v_trans,
                           share_blocks=share_blocks)
        layer_bufts = self._placement_bufts(placement, int(p.n_layer))
        out = ffi.new("ferry_paged_cache **")
        check(lib.ferry_paged_cache_new(p, buft._ptr, self._c_layer_bufts(layer_bufts), out))
        self._own(out[0], buft, layer_bufts, int(p.n_layer))

    @classmethod
    def from_arrays(cls, k_layers: Sequence[Any], v_layers: Sequence[Any], n_seq: int, v_trans: bool = False,
                    type_k: Optional[TypeLike] = None, type_v: Optional[TypeLike] = None,
                    n_head_kv: Optional[int] = None, share_blocks: bool = False) -> "PagedKVCache":
        """A paged cache over pools the caller owns, one K and one V per layer, without a copy.

        Each array is what ferry.from_array takes (numpy, PyTorch or CuPy; host or CUDA device),
        dense, in vLLM's layout: [num_blocks, block_size, n_kv_heads, head_dim]; or [num_blocks,
        block_size, n_embd_gqa] with n_head_kv given (q8_0 as uint8 bytes, [..., row bytes], with
        type_k / type_v); a transposed V (v_trans) [n_embd_gqa, num_blocks * block_size], its blocks
        of K's size. Every
        layer's K is of one type and every layer's V of one, a type attention reads (f32, f16,
        q8_0). A layer lives where its arrays are. The tables start empty: the caller's come by
        set_table. Writes through either side are seen by the other; the cache holds the arrays.

        Parameters
        ----------
        k_layers, v_layers : sequence of array
            Per layer, its K and V pools.
        n_seq : int
            Sequences: one block table each.
        v_trans : bool, optional
            V is transposed.
        type_k, type_v : Type, str or int, optional
            The types the arrays hold (default: their dtype's).
        n_head_kv : int, optional
            KV heads, for arrays of 3 dimensions (default 1); a 4-D array says it itself.
        share_blocks : bool, optional
            Let two tables hold one block.

        Returns
        -------
        PagedKVCache

        Raises
        ------
        InvalidArgumentError
            For lists of different lengths or empty, an array of another shape, memory or type than
            its layer's (or the first layer's), of a type attention cannot read, or one from_array
            refuses; each naming the array (k_layers[i], v_layers[i]).
        LayoutError
            For arrays that are not dense (naming the stride that is not) or of another number of
            dimensions.
        """
        what = f"{cls._layout.name}.from_arrays"
        shapes: Dict[Tuple[str, int], Tuple[int, int, int, int]] = {}  # each array's, as _pool_array reads it

        def parse() -> Tuple[bool, Optional[int]]:  # v_trans, n_head_kv
            vt = _checks.as_bool(v_trans, f"{what}: v_trans")
            heads = None if n_head_kv is None else _checks.as_int64(n_head_kv, f"{what}: n_head_kv")
            if heads is not None and heads <= 0:
                raise InvalidArgumentError(f"{what}: n_head_kv must be positive, got {heads}")
            return vt, heads

        def array(a: Any, which: str, layer: int, args: Tuple[bool, Optional[int]]) -> Tensor:
            vt, heads = args
            t, shapes[which, layer] = cls._pool_array(a, which, layer, type_k if which == "k" else type_v, heads,
                                                      vt and which == "v")
            return t

        def over(ks: List[Tensor], vs: List[Tensor], args: Tuple[bool, Optional[int]]) -> Callable[..., int]:
            vt, _ = args
            n_embd, bs, nblk, k_heads = shapes["k", 0]
            for i in range(len(ks)):
                e, b, m, h = shapes["k", i]
                if (e, b, m, h) != (n_embd, bs, nblk, k_heads):
                    raise InvalidArgumentError(f"{what}: k_layers[{i}] holds {m} blocks of {b} cells of {e} values "
                                               f"in {h} heads, k_layers[0] {nblk} of {bs} of {n_embd} in {k_heads}: "
                                               "every layer's pools have one shape")
            for i in range(len(vs)):
                e, b, m, h = shapes["v", i]
                want = (n_embd, bs * nblk) if vt else (n_embd, bs, nblk, k_heads)
                got = (e, b * m) if vt else (e, b, m, h)
                if got != want:
                    shape = (f"[{n_embd}, {bs * nblk}]" if vt else
                             f"[{nblk}, {bs}, {k_heads}, {n_embd // k_heads}] (or [{nblk}, {bs}, {n_embd}])")
                    raise InvalidArgumentError(f"{what}: v_layers[{i}] is not {shape} values as k_layers[{i}]'s "
                                               f"pool{' transposed (v_trans)' if vt else ''}")
            p = cls._c_params(type_k=ks[0].type, type_v=vs[0].type, head_dim=n_embd // k_heads, n_head_kv=k_heads,
                              block_size=bs, n_blocks=nblk, n_seq=n_seq, n_layer=len(ks), v_trans=vt,
                              share_blocks=share_blocks)
            return lambda *bufs: lib.ferry_paged_cache_new_over(p, *bufs)

        return cls._from_arrays(k_layers, v_layers, "give one K and one V pool per layer", parse, array, over)

    @classmethod
    def _pool_array(cls, a: Any, which: str, layer: int, type: Optional[TypeLike], heads: Optional[int],
                    trans: bool) -> Tuple[Tensor, Tuple[int, int, int, int]]:
        """The tensor of a layer's K (which "k") or V pool (LayerCache._layer_array), checked dense, and its
        shape: (n_embd_gqa, block_size, n_blocks, n_head_kv); a transposed V's (n_embd_gqa, pool cells, 1,
        1). Each FerryError names the array ("k_layers[1]")."""
        what = cls._array_what(which, layer)
        shape = getattr(a, "shape", None)
        want = (2,) if trans else (3, 4)
        if shape is not None and len(shape) not in want:
            raise LayoutError(f"{what} has {len(shape)} dimensions (shape {tuple(shape)}); a pool is " +
                              ("[n_embd_gqa, num_blocks * block_size] (v_trans)" if trans else
                               "[num_blocks, block_size, n_kv_heads, head_dim] or [num_blocks, block_size, "
                               "n_embd_gqa]"))
        t = cls._layer_array(a, which, layer, type, f"paged_{which}_l{layer}")
        ne, nb = list(t.ne), list(t.nb)
        four = shape is not None and len(shape) == 4
        if four and heads is not None and heads != ne[1]:
            raise InvalidArgumentError(f"{what} holds {ne[1]} heads (axis 2), not n_head_kv={heads}")
        dims = 4 if four else (2 if trans else 3)
        n_embd = ne[0] * ne[1] if four else (ne[1] if trans else ne[0])
        h = ne[1] if four else (heads or 1)
        expect = row_size(t.type, ne[0])
        for axis in range(1, dims):  # each axis one dense step from the last
            if ne[axis] > 1 and nb[axis] != expect:
                raise LayoutError(f"{what}: its axis {dims - 1 - axis} steps {nb[axis]} bytes, a dense array "
                                  f"{expect}: pass a contiguous array (np.ascontiguousarray)")
            expect *= ne[axis]
        if n_embd % h:
            raise InvalidArgumentError(f"{what}: its {n_embd} values a cell are not n_head_kv={h} heads")
        if trans:
            return t, (ne[1], ne[0], 1, h)
        return t, (n_embd, ne[2] if four else ne[1], ne[3] if four else ne[2], h)

    @property
    def params(self) -> PagedParams:
        """The cache's layout."""
        return self._params

    def _last_stream(self) -> int:
        return self._params.n_seq - 1

    # ------------------------------------------------------------ block tables

    def _seq(self, seq: int, what: str) -> int:
        return _checks.as_int64(seq, f"{what}: seq")

    @holding
    def allocate(self, seq: int, n_cells: int) -> None:
        """Give an empty sequence n_cells cells, in blocks from the free list.

        Parameters
        ----------
        seq : int
        n_cells : int

        Raises
        ------
        InvalidArgumentError
            For a sequence that holds cells already, or n_cells negative or past a pool's cells.
        OutOfBoundsError
            For a sequence the cache does not have.
        OutOfMemoryError
            When too few blocks are free, naming the sequence and what it needs; nothing changes.
        """
        check(lib.ferry_paged_cache_allocate(self._p, self._seq(seq, "paged_cache_allocate"),
                                             _checks.as_int64(n_cells, "paged_cache_allocate: n_cells")))

    @holding
    def append(self, seq: int, n_cells: int) -> None:
        """Grow a sequence by n_cells cells: into the blocks its table holds first (set_table may give
        it more than its cells fill), then taking blocks from the free list as its last one fills;
        raises as allocate does (but for a sequence that holds cells), changing nothing when it does."""
        check(lib.ferry_paged_cache_append(self._p, self._seq(seq, "paged_cache_append"),
                                           _checks.as_int64(n_cells, "paged_cache_append: n_cells")))

    @holding
    def free(self, seq: int) -> None:
        """Let a sequence's blocks go back to the free list (a shared block when no table holds it).

        Raises
        ------
        OutOfBoundsError
            For a sequence the cache does not have.
        """
        check(lib.ferry_paged_cache_free_seq(self._p, self._seq(seq, "paged_cache_free_seq")))

    @holding
    def set_table(self, seq: int, blocks: Sequence[int], n_cells: Optional[int] = None) -> None:
        """Make a sequence's table the caller's: its block ids in the order of its cells.

        Parameters
        ----------
        seq : int
        blocks : sequence of int
            Block ids, each in 0..n_blocks - 1, none twice: a list, tuple or range, or an array of
            one dimension (of an integer dtype).
        n_cells : int, optional
            The cells the sequence holds, 0..len(blocks) * block_size (default: all of them). Blocks
            past them stay the sequence's: append fills them before it takes more.

        Raises
        ------
        OutOfBoundsError
            For a sequence the cache does not have, or an id out of range (naming the sequence and
            the block).
        InvalidArgumentError
            For an id twice in the table or in another sequence's table (unless share_blocks), or
            n_cells past the table's cells, each naming the sequence and the block; blocks that are
            not a sequence of int (a 0-d array, a set, an array of floats), naming blocks. Nothing
            changes when refused.
        """
        what = "paged_cache_set_table"
        s = self._seq(seq, what)
        ids = _block_ids(blocks, what)
        for i, b in enumerate(ids):
            if not -(2**31) <= b < 2**31:
                raise OutOfBoundsError(f"{what}: sequence {s}'s block {i} is id {b}, not in 0.."
                                       f"{self._params.n_blocks - 1} (the pool's blocks)")
        cells = len(ids) * self._params.block_size if n_cells is None else _checks.as_int64(n_cells,
                                                                                          f"{what}: n_cells")
        check(lib.ferry_paged_cache_set_table(self._p, s, ffi.new("int32_t[]", ids) if ids else ffi.NULL, len(ids),
                                              cells))

    @holding
    def table(self, seq: int) -> Tuple[List[int], int]:
        """A sequence's table: its block ids and the cells it holds.

        Raises
        ------
        OutOfBoundsError
            For a sequence the cache does not have.
        """
        what = "paged_cache_table"
        s = self._seq(seq, what)
        n, cells = ffi.new("int64_t *"), ffi.new("int64_t *")
        check(lib.ferry_paged_cache_table(self._p, s, ffi.NULL, 0, n, cells))
        ids = ffi.new("int32_t[]", max(int(n[0]), 1))
        check(lib.ferry_paged_cache_table(self._p, s, ids, n[0], n, cells))
        return [int(b) for b in ids[0:n[0]]], int(cells[0])

    def table_tensor(self, backend: Backend, s0: int = 0, s1: Optional[int] = None,
                     max_blocks: Optional[int] = None, name: str = "table") -> Tensor:
        """The tables of sequences s0..s1 as ferry.ops.attn_paged reads them: an i32 tensor
        [max_blocks, ns] on backend, row s sequence s0 + s's block ids (table) and -1 past them. Read
        when made: a table that changes after needs a new one (or Tensor.set).

        Parameters
        ----------
        backend : Backend
            Where the tensor's memory is allocated (the host's, for the CPU's kernel).
        s0 : int, optional
            The first sequence.
        s1 : int, optional
            The last (default: the cache's last).
        max_blocks : int, optional
            Entries per sequence, from the longest table's blocks to the pool's blocks (default: the
            longest table's blocks, at least 1).
        name : str, optional

        Returns
        -------
        Tensor

        Raises
        ------
        OutOfBoundsError
            For sequences the cache does not have, or a max_blocks below a table's blocks or past the
            pool's.
        """
        what = "PagedKVCache.table_tensor"
        a = _checks.as_int64(s0, f"{what}: s0")
        b = self._last_stream() if s1 is None else _checks.as_int64(s1, f"{what}: s1")
        if not 0 <= a <= b <= self._last_stream():
            raise OutOfBoundsError(f"{what}: sequences {a}..{b} are not in the cache's 0..{self._last_stream()}")
        tables = [self.table(s)[0] for s in range(a, b + 1)]
        longest = max(max(len(t) for t in tables), 1)
        n = longest if max_blocks is None else _checks.as_int64(max_blocks, f"{what}: max_blocks")
        if n < longest:
            raise OutOfBoundsError(f"{what}: max_blocks {n} is below the {longest} blocks of a table among "
                                   f"sequences {a}..{b}: give at least {longest}")
        if n > self._params.n_blocks:  # a table holds each block once
            raise OutOfBoundsError(f"{what}: max_blocks {n} is past the pool's {self._params.n_blocks} blocks, "
                                   "the most a table holds")
        ids = np.full((len(tables), n), -1, np.int32)
        for s, t in enumerate(tables):
            ids[s, :len(t)] = t
        return Tensor.from_numpy(_checks.instance(backend, Backend, f"{what}: backend"), ids, name=name)

    @property
    @holding
    def free_blocks(self) -> int:
        """Blocks on the free list."""
        return int(lib.ferry_paged_cache_free_blocks(self._p))

    @holding
    def cell_offset(self, which: str, seq: int, cell: int) -> int:
        """Where a cell of a sequence lies, through its table, in each layer's K (which "k") or V pool
        (ferry_paged_cache_cell_offset).

        Returns
        -------
        int
            Bytes from the pool's first byte to the cell's first value, or for a transposed V to its
            value of channel 0 (channel c lies c * n_blocks * block_size values on).

        Raises
        ------
        InvalidArgumentError, OutOfBoundsError
            For which not "k" or "v", a sequence the cache does not have, or a cell past those its
            table holds.
        """
        v = self._which_is_v(which, "paged_cache_cell_offset")
        out = ffi.new("size_t *")
        check(lib.ferry_paged_cache_cell_offset(self._p, v, self._seq(seq, "paged_cache_cell_offset"),
                                                _checks.as_int64(cell, "paged_cache_cell_offset: cell"), out))
        return int(out[0])

    # ------------------------------------------------------------ windows

    @property
    @holding
    def gather(self) -> GatherMethod:
        """How the cache's windows are gathered: AUTO (the cheapest the split's backend offers, by its
        cost model), or the method forced (a copy into a backend that does not offer it is refused).
        Set with a GatherMethod or its name; InvalidArgumentError for anything else."""
        return GatherMethod(lib.ferry_paged_cache_get_gather(self._p))

    @gather.setter
    @holding
    def gather(self, method: GatherLike) -> None:
        check(lib.ferry_paged_cache_set_gather(self._p, to_gather_method(method, "PagedKVCache.gather").value))

    @holding
    def window(self, layer: int, n_kv: int, s0: int = 0, s1: Optional[int] = None,
               lengths: Optional[Tensor] = None, limit: Optional[int] = None) -> Tuple[Tensor, Tensor]:
        """The K and V windows of sequences s0..s1, a stream each: what attention reads, gathered when
        copied.

        Parameters
        ----------
        layer : int
        n_kv : int
            Cells a stream, 1..a pool's cells.
        s0 : int, optional
            The first sequence.
        s1 : int, optional
            The last (default: the cache's last).
        lengths : Tensor, optional
            The kv_len attention reads (i32 [ns], in host memory): stream s gathers its sequence's
            first min(lengths[s], n_kv) cells. Without it, the cells its table holds.
        limit : int, optional
            Lengths above it are refused when gathered (default n_kv).

        Returns
        -------
        (Tensor, Tensor)
            K [head_dim, n_kv, n_head_kv, ns]; V likewise, or transposed [n_kv, head_dim, n_head_kv,
            ns]: the dense layout of a KVCache window's compact copy. Refused for any read in place
            (to_numpy, a view, an export, a kernel): copy them, or let a Scheduler do it.

        Raises
        ------
        InvalidArgumentError, OutOfBoundsError
            For a layer, n_kv or sequences the cache does not have, lengths that are not a Tensor or
            a limit below n_kv.
        LayoutError
            For lengths that are not i32 [ns].
        """
        what = "paged_cache_window"
        if lengths is not None:
            _checks.instance(lengths, Tensor, f"{what}: lengths")
        li = _checks.as_c_int(layer, f"{what}: layer")
        nk = _checks.as_int64(n_kv, f"{what}: n_kv")
        a = _checks.as_int64(s0, f"{what}: s0")
        b = self._last_stream() if s1 is None else _checks.as_int64(s1, f"{what}: s1")
        cache = self._p

        def one_length_each(k: Tensor) -> None:
            if lengths is not None and lengths.ne[0] != k.ne[3]:
                raise LayoutError(f"{what}: lengths '{lengths.name}' holds {lengths.ne[0]} values, but s0..s1 "
                                  f"({a}..{b}) are {k.ne[3]} sequences: give one length per sequence")

        return self._window_pair(self._layer(li, what),
                                 lambda ctx, k, v: lib.ferry_paged_cache_window(cache, ctx, li, nk, a, b, k, v),
                                 lengths, limit, one_length_each)

    def windows(self, n_kv: int, s0: int = 0, s1: Optional[int] = None) -> "PagedWindows":
        """Every layer's K and V windows of a step, as ferry.attention_step reads them in one C call
        (ferry_paged_attention_step_on), each window carrying the step's kv_len.

        Parameters
        ----------
        n_kv, s0, s1 : int
            As window() takes them.

        Returns
        -------
        PagedWindows

        Raises
        ------
        InvalidArgumentError
            For values that cannot reach C.
        """
        return PagedWindows(self, n_kv, s0, s1)

    def _repr_layout(self) -> str:
        p = self._params
        return (f"{p.n_blocks} blocks of {p.block_size} cells, {p.n_seq} sequences, {p.n_layer} layers, "
                f"{self.free_blocks} blocks free in {self._buffer_type.name}")


class PagedWindows(LayerWindows):
    """Every layer's K and V windows over sequences s0..s1 (PagedKVCache.windows): indexing makes a
    layer's pair with PagedKVCache.window; ferry.attention_step makes them all in one C call.

    Made of a PagedKVCache, n_kv, s0 and s1 as LayerWindows says; InvalidArgumentError for another
    cache.
    """

    _what = "paged windows"
    _cache_class = PagedKVCache
    _window_what = "paged_cache_window"
    cache: PagedKVCache

    def _window(self, layer: int) -> Tuple[Tensor, Tensor]:
        return self.cache.window(layer, self.n_kv, self.s0, self.s1)

    def __repr__(self) -> str:
        return f"<PagedWindows n_kv={self.n_kv} sequences {self.s0}..{self.s1} of {self.cache!r}>"


def _block_ids(blocks: object, what: str) -> List[int]:
    """A table's block ids as Python ints: blocks is a list, tuple or range of integers, or an array
    of one dimension (numpy's of an integer dtype); anything else is an InvalidArgumentError naming
    blocks (or the id: blocks[i]). A 0-d array, a dict or a set has a length but no order of ids."""
    ndim = getattr(blocks, "ndim", 1)
    if (isinstance(blocks, (str, bytes, bytearray, Mapping, AbstractSet)) or not hasattr(blocks, "__len__")
            or not hasattr(blocks, "__iter__") or ndim != 1):
        kind = f"a {ndim}-d {type(blocks).__name__}" if ndim != 1 else type(blocks).__name__
        raise InvalidArgumentError(f"{what}: blocks is a sequence of block ids (a list, or an array of one "
                                   f"dimension), not {kind}")
    if isinstance(blocks, np.ndarray) and blocks.dtype.kind not in "iu":
        raise InvalidArgumentError(f"{what}: blocks is an array of {blocks.dtype}: give block ids of an integer "
                                   "dtype")
    return [_checks.as_int64(b, f"{what}: blocks[{i}]") for i, b in enumerate(blocks)]

