"""The paged KV caches the workloads run (`--paged`): block tables drawn by adjacency, the cells
written through them, and the checks of the paged options.

A serving system's tables are neither all adjacent (a fresh cache's free list) nor all scattered
(a cache long in use): `--adjacency F` says which share of a sequence's blocks follow their
predecessor in the pool (block b, then b + 1). adjacent_tables draws such tables from a seed:
of a sequence's m blocks, exactly round(F * (m - 1)) follow their predecessor, the others start a
run of their own, no block is in two tables, and the runs lie in the pool in a seeded order with
the free blocks among them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..backend import Backend
from ..errors import InvalidArgumentError
from ..paged import PagedKVCache
from ..paged_plan import plan_paged
from ..types import Type

#: Cells per block (--block-size's default): vLLM's default block size.
BLOCK_SIZE = 16
#: The share of a sequence's blocks that follow their predecessor (--adjacency's default).
ADJACENCY = 0.5


@dataclass(frozen=True)
class PagedOptions:
    """--paged: a paged cache beside the cells cache, in the verbs that run one.

    Attributes
    ----------
    paged : bool
        Whether the paged cache runs.
    block_size : int
        Cells per block.
    adjacency : float
        Share of a sequence's blocks right after their predecessor in the pool.
    shared_prefix : int
        Cells every sequence starts with, the same values in one set of blocks every table holds
        (--shared-prefix, whole blocks; 0: none).
    device_blocks : float
        The share of the working set's blocks the device table's pool holds (--device-blocks, 0..1;
        1: all of them).
    pool_prefetch : bool
        Whether the device table's row also runs with its pool prefetching (--pool-prefetch): each group's
        blocks sent under the group before it (BlockPool.set_prefetch).
    """

    paged: bool = False
    block_size: int = BLOCK_SIZE
    adjacency: float = ADJACENCY
    shared_prefix: int = 0
    device_blocks: float = 1.0
    pool_prefetch: bool = False

#: The paged cache's blocks kept in a device pool and read through its device table (ferry.block_pool),
#: beside the gathers in the workloads' rows and hashes.
DEVICE_TABLE = "device_table"
#: The device table's row with its pool prefetching (--pool-prefetch).
DEVICE_TABLE_PREFETCH = "device_table_prefetch"

#: The gathers a paged window can be forced to, the baseline first (GatherMethod's names but auto).
GATHERS: Tuple[str, ...] = ("per_block", "runs", "batched", "kernel", "merged")


def check_paged(block_size: int, adjacency: float) -> None:
    """Raise InvalidArgumentError, naming the option, for a block size that is not a positive
    integer or an adjacency outside 0..1.

    Parameters
    ----------
    block_size : int
        Cells per block (--block-size).
    adjacency : float
        The share of a sequence's blocks that follow their predecessor (--adjacency).

    Raises
    ------
    InvalidArgumentError
        For the first value out of range.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise InvalidArgumentError(f"--block-size must be a positive integer, got {block_size!r}")
    if isinstance(adjacency, bool) or not isinstance(adjacency, (int, float)) or not 0 <= adjacency <= 1:
        raise InvalidArgumentError(f"--adjacency must be a number from 0 to 1, got {adjacency!r}")


def blocks_for(cells: int, block_size: int) -> int:
    """Blocks that hold cells cells: cells / block_size rounded up."""
    return -(-cells // block_size)


def check_pool(n_ctx: int, npl: int, cells: int, block_size: int) -> int:
    """The blocks of a pool of n_ctx cells (-c, rounded up to whole blocks), after checking that they
    hold npl sequences of cells cells each in whole blocks: the rule of --block-size under every verb.

    Raises
    ------
    InvalidArgumentError
        When they do not, naming -npl, -c and --block-size.
    """
    n_blocks = blocks_for(n_ctx, block_size)
    per_seq = blocks_for(cells, block_size)
    if npl * per_seq > n_blocks:
        raise InvalidArgumentError(f"-npl {npl} sequences of {cells} cells take {npl * per_seq} blocks of "
                                   f"{block_size} cells; -c {n_ctx} holds {n_blocks}: give a larger -c or a smaller "
                                   "--block-size")
    return n_blocks


def adjacent_count(blocks: int, adjacency: float) -> int:
    """Of a table of blocks blocks, how many follow their predecessor: adjacency * (blocks - 1),
    rounded half up (0 for an empty table)."""
    return math.floor(adjacency * max(blocks - 1, 0) + 0.5)


def runs_of(table: Sequence[int]) -> int:
    """Runs in a table: blocks that do not follow their predecessor in the pool (b, then b + 1)."""
    return sum(1 for j, b in enumerate(table) if j == 0 or b != table[j - 1] + 1)


def adjacent_tables(blocks: Sequence[int], n_blocks: int, adjacency: float, seed: int) -> List[List[int]]:
    """Block tables drawn by adjacency from a seed (see the module).

    Parameters
    ----------
    blocks : sequence of int
        Each sequence's blocks.
    n_blocks : int
        Blocks in the pool, at least their sum.
    adjacency : float
        0..1: the share of a sequence's blocks that follow their predecessor.
    seed : int
        The same seed gives the same tables.

    Returns
    -------
    list of list of int
        Per sequence its block ids, in the order of its cells.

    Raises
    ------
    InvalidArgumentError
        For an adjacency outside 0..1, a negative count, or more blocks than the pool holds.
    """
    check_paged(1, adjacency)
    if any(isinstance(m, bool) or not isinstance(m, int) or m < 0 for m in blocks):
        raise InvalidArgumentError(f"adjacent_tables: blocks are counts >= 0, got {list(blocks)!r}")
    if sum(blocks) > n_blocks:
        raise InvalidArgumentError(f"adjacent_tables: {sum(blocks)} blocks asked of a pool of {n_blocks}")
    rng = np.random.default_rng([seed, 36])
    # the runs: (sequence, run index, blocks), a sequence's blocks split where they do not follow
    runs: List[Optional[Tuple[int, int, int]]] = []
    for s, m in enumerate(blocks):
        joined = {int(j) for j in rng.choice(np.arange(1, m), adjacent_count(m, adjacency), replace=False)} \
            if m > 1 else set()
        starts = [j for j in range(m) if j not in joined]
        runs += [(s, i, (starts[i + 1] if i + 1 < len(starts) else m) - start) for i, start in enumerate(starts)]
    items = runs + [None] * (n_blocks - sum(blocks))  # None: a free block, in the pool among the runs
    pending = [items[i] for i in rng.permutation(len(items))]

    def follows(a: Optional[Tuple[int, int, int]], b: Optional[Tuple[int, int, int]]) -> bool:
        """Whether run b, laid right after run a, would join it: b is a's sequence's next run."""
        return a is not None and b is not None and (a[0], a[1] + 1) == b[:2]

    # lay them out in order, never a run right after its sequence's previous run (they would be one);
    # a successor is unique, so the item after it never is one too
    placed: List[Optional[Tuple[int, int, int]]] = []
    for i in range(len(pending)):
        if placed and follows(placed[-1], pending[i]) and i + 1 < len(pending):
            pending[i], pending[i + 1] = pending[i + 1], pending[i]
        if placed and follows(placed[-1], pending[i]):  # the last item: put it where it joins nothing
            at = next(p for p in range(len(placed) + 1) if not (p > 0 and follows(placed[p - 1], pending[i]))
                      and not (p < len(placed) and follows(pending[i], placed[p])))
            placed.insert(at, pending[i])
        else:
            placed.append(pending[i])
    tables: List[List[List[int]]] = [[[] for _ in range(len(runs))] for _ in blocks]
    first = 0
    for item in placed:
        if item is None:
            first += 1
            continue
        s, i, n = item
        tables[s][i] = list(range(first, first + n))
        first += n
    return [[b for run in per_seq for b in run] for per_seq in tables]


def new_paged_cache(type_: Type, head_dim: int, n_head_kv: int, block_size: int, n_blocks: int, n_seq: int,
                    n_layer: int, v_trans: bool, pinned: bool, share_blocks: bool = False) -> PagedKVCache:
    """A paged KV cache in host memory (pinned for CUDA, whose gather kernel reads it), every byte 0,
    every table empty.

    Parameters
    ----------
    type_ : Type
        K and V type.
    head_dim, n_head_kv, block_size, n_blocks, n_seq, n_layer : int
    v_trans : bool
    pinned : bool
    share_blocks : bool, optional
        Let tables hold one block (a shared prefix).

    Returns
    -------
    PagedKVCache

    Raises
    ------
    FerryError
        As PagedKVCache raises.
    """
    return PagedKVCache(type_, type_, head_dim, n_head_kv, block_size, n_blocks, n_seq, n_layer, v_trans=v_trans,
                        pinned=pinned, share_blocks=share_blocks)


def check_shared(block_size: int, shared_prefix: int, device_blocks: float, shortest: int) -> None:
    """Raise InvalidArgumentError, naming the option, for a --shared-prefix that is not whole blocks of
    at most the shortest prompt, or a --device-blocks outside 0 (excluded) to 1.

    Parameters
    ----------
    block_size : int
        --block-size.
    shared_prefix : int
        --shared-prefix: cells.
    device_blocks : float
        --device-blocks: the share of the working set's blocks the pool holds.
    shortest : int
        The shortest prompt's cells.

    Raises
    ------
    InvalidArgumentError
        For the first value out of range.
    """
    if isinstance(shared_prefix, bool) or not isinstance(shared_prefix, int) or shared_prefix < 0 or \
            shared_prefix % block_size:
        raise InvalidArgumentError(f"--shared-prefix must be whole --block-size {block_size} blocks of cells, got "
                                   f"{shared_prefix!r}")
    if shared_prefix > shortest:
        raise InvalidArgumentError(f"--shared-prefix {shared_prefix} is longer than the shortest prompt "
                                   f"({shortest} cells): give at most -npp's cells")
    if isinstance(device_blocks, bool) or not isinstance(device_blocks, (int, float)) or \
            not 0 < device_blocks <= 1:
        raise InvalidArgumentError(f"--device-blocks must be a share above 0 and at most 1, got {device_blocks!r}")


def prefix_tables(own: Sequence[int], shared: int, n_blocks: int, adjacency: float, seed: int) -> List[List[int]]:
    """Tables of sequences that start with the same shared blocks: those drawn once, then each
    sequence's own own[i] blocks, all by adjacency (adjacent_tables) from one pool.

    Parameters
    ----------
    own : sequence of int
        Each sequence's blocks past the shared ones.
    shared : int
        The blocks every table starts with.
    n_blocks, adjacency, seed
        As adjacent_tables takes them.

    Returns
    -------
    list of list of int
        Per sequence its block ids.
    """
    drawn = adjacent_tables([shared, *own], n_blocks, adjacency, seed)
    return [drawn[0] + t for t in drawn[1:]]


def write_paged_cells(cache: PagedKVCache, which: str, layer: int, seq: int, cell0: int, data: bytes) -> None:
    """Write rows of cells [cell0, cell0 + n) of a sequence of a layer's K ("k") or V ("v") through its
    table: data holds n rows of n_embd_gqa values, written a run of adjacent blocks at a time; a
    transposed V receives each run as one row of cells per channel.

    Raises
    ------
    FerryError
        For cells past the sequence's table (as PagedKVCache.cell_offset raises).
    """
    p = cache.params
    pool = cache.k(layer) if which == "k" else cache.v(layer)
    trans = which == "v" and p.v_trans
    elem = p.type_v.size
    row = p.n_embd_gqa * elem if trans else pool.nb[1]  # bytes of one cell's values in data
    n = len(data) // row
    table, _ = cache.table(seq)
    cell = cell0
    while cell < cell0 + n:  # a run: cells of blocks that follow each other in the pool
        end = min(cell0 + n, (cell // p.block_size + 1) * p.block_size)
        while end < cell0 + n and table[end // p.block_size] == table[(end - 1) // p.block_size] + 1:
            end = min(cell0 + n, end + p.block_size)
        chunk = data[(cell - cell0) * row:(end - cell0) * row]
        offset = cache.cell_offset(which, seq, cell)
        if trans:
            cells = end - cell
            runs = np.ascontiguousarray(np.frombuffer(chunk, np.uint8).reshape(cells, p.n_embd_gqa, elem)
                                        .transpose(1, 0, 2))
            pool.set_2d(runs.tobytes(), offset, cells * elem, p.n_embd_gqa, p.pool_cells * elem, cells * elem)
        else:
            pool.set(chunk, offset)
        cell = end


def offered_gathers(type_: Type, v_trans: bool, pinned: bool, split: Backend) -> Tuple[str, ...]:
    """The gathers split offers for a paged cache's pools in host memory (pinned or not), by name, the
    baseline first: per_block and runs always, batched, kernel and merged where split has them for that
    memory (found by planning a one-block window's gather).

    Raises
    ------
    FerryError
        When the probe cache cannot be made.
    """
    probe = new_paged_cache(type_, type_.blck_size, 1, 1, 1, 1, 1, v_trans, pinned)
    try:
        probe.set_table(0, [0])
        k, _ = probe.window(0, 1)
        seconds = plan_paged(k, split).method_seconds
        return tuple(m for m in GATHERS if seconds[m] is not None)
    finally:
        probe.close()
