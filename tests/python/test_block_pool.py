"""The device block pool (ferry.block_pool): every cell read through the device table is the cache's;
a block several sequences read crosses once, an unchanged block not again, a grown block its new
cells only; drop_ahead and truncate send again what they say changed; the counted bytes are the
buffers' own; slots of blocks not read go least recently read first, never the resident set's;
refusals name what to change and leave the pool as it was."""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import ferry
from ferry.block_pool import BlockPool
from ferry.paged import PagedKVCache

BS, N_BLOCKS, HEAD_DIM, N_HEAD_KV = 4, 24, 32, 1
N_EMBD = HEAD_DIM * N_HEAD_KV


def cache(type_: str = "f16", v_trans: bool = False, n_seq: int = 3, n_layer: int = 2) -> PagedKVCache:
    """A cache whose pools hold distinct random bytes."""
    c = PagedKVCache(type_, type_, HEAD_DIM, N_HEAD_KV, block_size=BS, n_blocks=N_BLOCKS, n_seq=n_seq,
                     n_layer=n_layer, v_trans=v_trans, share_blocks=True)
    rng = np.random.default_rng(7)
    for layer in range(n_layer):
        for t in (c.k(layer), c.v(layer)):
            t.set(rng.integers(0, 256, t.nbytes, dtype=np.uint8).tobytes())
    return c


def cell_bytes(c: PagedKVCache) -> int:
    """One cell's K and V bytes, every layer."""
    return (c.k(0).nbytes + c.v(0).nbytes) // c.params.pool_cells * c.params.n_layer


def cells_of(t: ferry.Tensor, trans: bool, n_cells: int) -> np.ndarray:
    """A pool's bytes as one row per cell."""
    raw = np.frombuffer(t.get(), np.uint8)
    if trans:
        return raw.reshape(t.ne[1], n_cells, -1).transpose(1, 0, 2).reshape(n_cells, -1)  # ne[1]: the embedding
    return raw.reshape(n_cells, -1)


def check_reads(c: PagedKVCache, p: BlockPool, seqs: Sequence[int], lengths: Sequence[int]) -> None:
    """Each sequence's first cells, read through the device table, are the cache's."""
    table = p.table.to_numpy()
    for layer in range(c.params.n_layer):
        for which in ("k", "v"):
            trans = which == "v" and c.params.v_trans
            host = cells_of(getattr(c, which)(layer), trans, c.params.pool_cells)
            dev = cells_of(getattr(p, which)(layer), trans, p.n_slots * BS)
            for s, n in zip(seqs, lengths):
                blocks, _ = c.table(s)
                for cell in range(n):
                    slot = table[s, cell // BS]
                    assert (dev[slot * BS + cell % BS] == host[blocks[cell // BS] * BS + cell % BS]).all(), \
                        (layer, which, s, cell)


def shared(c: PagedKVCache) -> None:
    """Sequences 0 and 1 share blocks 0 and 1 (8 cells), then own one each; 2 owns one."""
    c.set_table(0, [0, 1, 2], 10)
    c.set_table(1, [0, 1, 3], 11)
    c.set_table(2, [9], 3)


@pytest.mark.parametrize("type_,v_trans", [("f16", False), ("f16", True), ("f32", True), ("q8_0", False)])
@pytest.mark.parametrize("backend", ["cpu", "standin"])
def test_a_shared_block_crosses_once_and_every_cell_reads_the_caches(type_: str, v_trans: bool,
                                                                      backend: str) -> None:
    c = cache(type_, v_trans)
    shared(c)
    dev = ferry.CPUBackend() if backend == "cpu" else ferry.StandinBackend()
    with BlockPool(c, dev, 8) as p:
        p.sync()
        s = p.stats
        # blocks 0, 1 whole, 2 and 3 holding 2 and 3 cells, 9 three: 8 + 8 cells
        assert (s.blocks_sent, s.blocks_kept, s.cell_bytes) == (5, 0, 16 * cell_bytes(c))
        # rows [0, 1, 2], [0, 1, 3], [4] over a table of zeros: slot 0 is there already
        assert s.table_bytes == (2 + 2 + 1) * 4
        assert s.buffers.bytes["set"] + s.buffers.bytes["set_2d"] == s.bytes
        check_reads(c, p, [0, 1, 2], [10, 11, 3])


def test_an_unchanged_block_does_not_cross_again_and_a_grown_one_sends_its_new_cells() -> None:
    c = cache()
    shared(c)
    with BlockPool(c, ferry.StandinBackend(), 8) as p:
        p.sync()
        p.reset_stats()
        p.sync()
        assert (p.stats.bytes, p.stats.blocks_kept, p.stats.transfers) == (0, 5, 0)
        c.append(0, 3)  # block 2 gets cells 2, 3; a new block gets cell 0
        c.append(2, 1)  # block 9 gets cell 3
        p.sync()
        s = p.stats
        assert (s.blocks_grown, s.blocks_sent, s.cell_bytes) == (2, 1, 4 * cell_bytes(c))
        assert s.table_bytes == 4  # sequence 0's new block
        check_reads(c, p, [0, 1, 2], [13, 11, 4])


def test_reading_fewer_cells_sends_those_and_the_rest_when_read() -> None:
    c = cache()
    shared(c)
    with BlockPool(c, ferry.CPUBackend(), 8) as p:
        p.sync(0, 1, [5])  # block 0 whole, one cell of block 1
        assert p.stats.cell_bytes == 5 * cell_bytes(c)
        p.sync(0, 2, [10, 11])
        assert p.stats.cell_bytes == 13 * cell_bytes(c)  # blocks 0, 1 whole, 2 cells of 2, 3 of 3
        check_reads(c, p, [0, 1], [10, 11])


def test_drop_ahead_sends_everything_again_and_truncate_the_cells_from_its_length() -> None:
    c = cache()
    shared(c)
    with BlockPool(c, ferry.CPUBackend(), 8) as p:
        p.sync()
        p.reset_stats()
        p.drop_ahead()
        p.sync()
        assert (p.stats.cell_bytes, p.stats.blocks_sent, p.stats.table_bytes) == (16 * cell_bytes(c), 5, 0)
        # a rollback of sequence 0 to 6 cells: cells 6, 7 of shared block 1 and block 2's are rewritten
        k = c.k(1)
        row = k.nbytes // c.params.pool_cells
        k.set(b"\x11" * (2 * row), offset=(1 * BS + 2) * row)
        p.truncate(0, 6)
        p.reset_stats()
        p.sync()
        # block 1 sends its cells 2, 3; block 2 its two from cell 0
        assert (p.stats.cell_bytes, p.stats.blocks_grown, p.stats.blocks_sent) == (4 * cell_bytes(c), 1, 1)
        check_reads(c, p, [0, 1, 2], [10, 11, 3])


def test_without_a_truncate_a_rewritten_cell_is_not_sent() -> None:
    """The contract's other side: what the caller does not announce is taken as unchanged."""
    c = cache()
    shared(c)
    with BlockPool(c, ferry.CPUBackend(), 8) as p:
        p.sync()
        k = c.k(0)
        k.set(b"\x33" * (k.nbytes // c.params.pool_cells), offset=0)
        p.reset_stats()
        p.sync()
        assert p.stats.bytes == 0
        with pytest.raises(AssertionError):
            check_reads(c, p, [0], [1])


def test_slots_of_blocks_not_read_go_least_recently_read_first_never_the_resident_sets() -> None:
    c = cache(n_seq=4)
    for s in range(4):
        c.set_table(s, [2 * s, 2 * s + 1], 8)
    with BlockPool(c, ferry.CPUBackend(), 4) as p:
        p.set_resident([0, 1])
        p.sync(0, 2)  # 4 blocks in 4 slots
        p.sync(1, 2)  # sequence 1 read again: sequence 0's are older, but resident
        with pytest.raises(ferry.OutOfMemoryError, match="read 4 blocks.*4 slots.*2 kept"):
            p.sync(2, 4)
        p.reset_stats()
        p.sync(2, 3)  # takes sequence 1's slots, not sequence 0's
        assert (p.stats.evictions, p.stats.blocks_sent) == (2, 2)
        p.reset_stats()
        p.sync(0, 1)
        assert (p.stats.bytes, p.stats.blocks_kept) == (0, 2)
        check_reads(c, p, [0], [8])
        p.set_resident([])
        p.sync(3, 4)  # takes sequence 2's slots: read before sequence 0's
        assert p.stats.evictions == 2
        check_reads(c, p, [3], [8])
        p.reset_stats()
        p.sync(0, 1)
        assert (p.stats.bytes, p.stats.blocks_kept) == (0, 2)


def test_the_resident_choice_is_shared_blocks_first_then_the_most_cells_read() -> None:
    c = cache()
    shared(c)
    with BlockPool(c, ferry.CPUBackend(), 6) as p:
        assert p.choose_resident(6) == [0, 1, 3, 9, 2]
        assert p.choose_resident(3) == [0, 1, 3]
        assert p.choose_resident(2, 2, 3) == [9]
        assert p.choose_resident(3, 0, 2, [4, 8]) == [0, 1]
        c.set_table(0, [6, 0], 8)
        c.set_table(1, [6, 1], 5)
        assert p.choose_resident(3, 0, 2) == [6, 0, 1]  # the shared block first, though of a higher id


def test_the_resident_choice_is_the_links_cost_where_cells_and_cost_disagree() -> None:
    """On the H100 profile's link, a block of 3 cells alone in the host pool costs a call and its small
    pieces (below the curve's knee); each of two blocks of 4 cells that follow each other in the host
    pool adds only its bytes to their one piece, at the link's peak. The cost model keeps the small
    block first; cells alone would keep the larger ones."""
    c = cache(n_seq=2)
    c.set_table(0, [5, 6], 8)  # 6 follows 5 in the host pool: one piece of both
    c.set_table(1, [10], 3)    # alone, 3 cells
    with BlockPool(c, ferry.StandinBackend(link_profile="h100-pcie5"), 6) as p:
        assert p.choose_resident(3) == [10, 5, 6]
        assert p.choose_resident(1) == [10]  # by cells (more cells first): [5]


def test_refusals_name_what_to_change_and_change_nothing() -> None:
    c = cache()
    shared(c)
    dev = ferry.CPUBackend()
    with pytest.raises(ferry.OutOfBoundsError, match="n_slots 0"):
        BlockPool(c, dev, 0)
    with pytest.raises(ferry.OutOfBoundsError, match="n_slots 25"):
        BlockPool(c, dev, N_BLOCKS + 1)
    with pytest.raises(ferry.InvalidArgumentError, match="PagedKVCache"):
        BlockPool(dev, dev, 4)  # type: ignore[arg-type]
    with BlockPool(c, dev, 4) as p:
        with pytest.raises(ferry.OutOfMemoryError, match="read 5 blocks, but the pool has 4 slots"):
            p.sync()
        with pytest.raises(ferry.OutOfBoundsError, match="sequence 0's length 11"):
            p.sync(0, 1, [11])
        with pytest.raises(ferry.OutOfBoundsError, match="sequences 2..4"):
            p.sync(2, 4)
        with pytest.raises(ferry.InvalidArgumentError, match="lengths .one per sequence. must be a list of 2"):
            p.sync(0, 2, [1])
        with pytest.raises(ferry.OutOfBoundsError, match="negative"):
            p.truncate(0, -1)
        with pytest.raises(ferry.InvalidArgumentError, match="block 3 is in the set twice"):
            p.set_resident([3, 3])
        with pytest.raises(ferry.OutOfBoundsError, match="block 24"):
            p.set_resident([24])
        with pytest.raises(ferry.OutOfBoundsError, match="5 blocks"):
            p.set_resident([0, 1, 2, 3, 4])
        s = p.stats
        assert (s.syncs, s.bytes, s.buffers.total_bytes) == (0, 0, 0)
        assert (p.table.to_numpy() == 0).all()
    assert p.closed
    with pytest.raises(ferry.FreedBufferError):
        p.sync()


Op = Tuple[str, int, int]


@st.composite
def ops(draw: st.DrawFn) -> List[Op]:
    """Appends, rollbacks (truncate, then new cells written) and syncs of three sequences."""
    return draw(st.lists(st.tuples(st.sampled_from(["append", "rollback", "sync", "drop"]), st.integers(0, 2),
                                   st.integers(0, 9)), max_size=14))


@settings(max_examples=60, deadline=None)
@given(ops(), st.booleans())
@example([("append", 0, 9), ("sync", 0, 0), ("rollback", 0, 3), ("sync", 0, 0)], True)
def test_any_loop_of_appends_and_rollbacks_reads_the_caches_cells(loop: List[Op], v_trans: bool) -> None:
    c = cache(v_trans=v_trans, n_layer=1)
    rng = np.random.default_rng(1)
    row = c.k(0).nbytes // c.params.pool_cells

    def write(s: int, first: int, n: int) -> None:
        blocks, _ = c.table(s)
        for cell in range(first, first + n):
            c.k(0).set(rng.integers(0, 256, row, dtype=np.uint8).tobytes(),
                       offset=(blocks[cell // BS] * BS + cell % BS) * row)

    with BlockPool(c, ferry.CPUBackend(), N_BLOCKS) as p:
        for what, s, n in loop:
            cells = c.table(s)[1]
            if what == "append" and cells + n <= 24:
                c.append(s, n)
                write(s, cells, n)
            elif what == "rollback":
                keep = min(n, cells)
                p.truncate(s, keep)
                write(s, keep, cells - keep)
            elif what == "drop":
                write(s, 0, cells)
                p.drop_ahead()
            elif what == "sync":
                p.sync()
        p.sync()
        check_reads(c, p, [0, 1, 2], [c.table(s)[1] for s in range(3)])


def prefix_cache(n_seq: int = 4, own_blocks: int = 4) -> PagedKVCache:
    """n_seq sequences sharing blocks 0, 1 (8 cells), then own_blocks full blocks each."""
    c = PagedKVCache("f16", "f16", HEAD_DIM, N_HEAD_KV, block_size=BS, n_blocks=N_BLOCKS, n_seq=n_seq, n_layer=1,
                     share_blocks=True)
    c.k(0).set(np.arange(c.k(0).nbytes // 2, dtype=np.uint16).tobytes())
    for s in range(n_seq):
        own = list(range(2 + s * own_blocks, 2 + (s + 1) * own_blocks))
        c.set_table(s, [0, 1, *own], (2 + own_blocks) * BS)
    return c


def test_a_pool_smaller_than_the_blocks_read_keeps_shared_blocks_and_streams_the_rest_in_groups() -> None:
    c = prefix_cache()  # 2 shared + 16 own blocks read
    with BlockPool(c, ferry.CPUBackend(), 9) as p:
        # 4 streaming slots (a sequence's own blocks), 5 resident: the shared two, then the blocks that
        # cost most to send again: each sequence's own blocks follow each other in the host pool (0..5
        # one run), so the ends of runs (5, 6, 9: their bytes), not their middles (which would split a
        # run in two), lower ids first
        groups = p.plan()
        assert p.choose_resident(5) == [0, 1, 5, 6, 9]
        # sequence 0 streams one block, each other four: none joins another's group
        assert groups == [(0, 1), (1, 2), (2, 3), (3, 4)]
        step = []
        for _ in range(3):
            p.reset_stats()
            for g0, g1 in groups:
                p.sync(g0, g1)
                check_reads(c, p, range(g0, g1), [24] * (g1 - g0))
            step.append((p.stats.blocks_sent, p.stats.evictions))
        # after the first step only the streamed blocks cross, 1 + 4 + 4 + 4, never the resident five
        assert step == [(18, 9), (13, 13), (13, 13)]
        dense = 4 * 6  # blocks a dense gather copies a step
        assert p.stats.cell_bytes == 13 * BS * cell_bytes(c) and 13 / dense <= 0.55
    with BlockPool(c, ferry.CPUBackend(), 18) as p:
        assert p.plan() == [(0, 4)]  # every block fits: all resident
        p.sync()
        p.reset_stats()
        p.sync()
        assert p.stats.bytes == 0
    with BlockPool(c, ferry.CPUBackend(), 5) as p, pytest.raises(ferry.OutOfMemoryError, match="make the pool"):
        p.plan()  # 4 streaming slots leave 1 for 2 shared blocks: a sequence's 6 do not fit in 5


def test_least_recently_read_thrashes_where_the_plan_does_not() -> None:
    """The same pool synced a sequence at a time with no resident set: each step reads the 16 own blocks
    in the same order through 7 slots, so each is gone when read again; the plan sends 13."""
    c = prefix_cache()
    with BlockPool(c, ferry.CPUBackend(), 9) as p:
        for _ in range(2):
            p.reset_stats()
            for s in range(4):
                p.sync(s, s + 1)
        assert (p.stats.blocks_sent, p.stats.blocks_kept) == (16, 8)


def random_cache(type_: str, v_trans: bool) -> PagedKVCache:
    """Values attention reads: f16 (or q8_0) of uniform floats, two KV heads."""
    c = PagedKVCache(type_, type_, HEAD_DIM, 2, block_size=BS, n_blocks=N_BLOCKS, n_seq=3, n_layer=2,
                     v_trans=v_trans, share_blocks=True)
    rng = np.random.default_rng(3)
    for layer in range(2):
        for t in (c.k(layer), c.v(layer)):
            n = t.ne[0] * t.ne[1]
            t.set(ferry.Tensor.from_numpy(ferry.CPUBackend(), rng.uniform(-1, 1, n).astype(np.float32).reshape(
                t.ne[1], t.ne[0]), type=type_).get())
    shared(c)
    return c


@pytest.mark.parametrize("type_,v_trans", [("f16", False), ("f16", True), ("q8_0", False)])
def test_attention_through_the_device_table_is_the_dense_gathers_byte_for_byte_step_after_step(
        type_: str, v_trans: bool) -> None:
    c = random_cache(type_, v_trans)
    dev, cpu = ferry.StandinBackend(), ferry.CPUBackend()
    rng = np.random.default_rng(5)
    q = [ferry.Tensor.from_numpy(dev, rng.uniform(-1, 1, (3, 1, 4, HEAD_DIM)).astype(np.float32)) for _ in range(2)]
    kv_len = ferry.Tensor.from_numpy(cpu, np.zeros(3, np.int32), name="kv_len")
    with ferry.Scheduler([dev, cpu], policy="ragged") as dense, ferry.Scheduler([dev, cpu]) as sched, \
            BlockPool(c, dev, 12) as pool:
        outs = pool.attention_step(sched, q, kv_len)
        for step in range(3):
            if step:
                for s in range(3):
                    c.append(s, 1)
            lengths = np.array([c.table(s)[1] for s in range(3)], np.int32)
            kv_len.set(lengths.tobytes())
            ref = ferry.attention_step(dense, dev, c.windows(16), q, kv_len)
            dense.compute(ref.graph)
            pool.sync(lengths=lengths)
            sched.compute(outs.graph)
            assert [o.get() for o in outs] == [r.get() for r in ref], step
            assert [i.src.name for i in sched.inputs] == ["kv_len"]  # K and V never cross in the step
            dense.clear_assignments()


def test_attention_through_a_pool_smaller_than_the_blocks_read_a_group_at_a_time() -> None:
    """--device-blocks below 1: each group synced, then its own step; the rows are the dense gather's."""
    c = random_cache("f16", True)
    dev, cpu = ferry.StandinBackend(), ferry.CPUBackend()
    rng = np.random.default_rng(5)
    q = [ferry.Tensor.from_numpy(dev, rng.uniform(-1, 1, (3, 1, 4, HEAD_DIM)).astype(np.float32)) for _ in range(2)]
    lengths = np.array([10, 11, 3], np.int32)
    kv_len = ferry.Tensor.from_numpy(cpu, lengths, name="kv_len")
    with ferry.Scheduler([dev, cpu], policy="ragged") as dense, BlockPool(c, dev, 4) as pool:
        ref = ferry.attention_step(dense, dev, c.windows(12), q, kv_len)
        dense.compute(ref.graph)
        groups = pool.plan(lengths=lengths)
        assert groups == [(0, 2), (2, 3)]  # blocks 0, 1, 3 resident; 2, then 9 streamed through one slot
        for g0, g1 in groups:
            with ferry.Scheduler([dev, cpu]) as sched:
                qg = [t.view([HEAD_DIM, 4, 1, g1 - g0], [4, 4 * HEAD_DIM, 16 * HEAD_DIM, 16 * HEAD_DIM],
                             offset=g0 * 16 * HEAD_DIM) for t in q]
                lg = ferry.Tensor.from_numpy(cpu, lengths[g0:g1], name="kv_len")
                outs = pool.attention_step(sched, qg, lg, g0, g1)
                pool.sync(g0, g1, lengths[g0:g1])
                sched.compute(outs.graph)
                for o, r in zip(outs, ref):
                    row = 16 * HEAD_DIM
                    assert o.get() == r.get()[g0 * row:g1 * row]


def test_the_step_is_refused_naming_what_to_change() -> None:
    c = random_cache("f16", False)
    dev, cpu = ferry.StandinBackend(), ferry.CPUBackend()
    q = [ferry.Tensor.from_numpy(dev, np.zeros((3, 1, 4, HEAD_DIM), np.float32)) for _ in range(2)]
    kv_len = ferry.Tensor.from_numpy(cpu, np.zeros(3, np.int32))
    with BlockPool(c, dev, 8) as pool, ferry.Scheduler([cpu]) as other, ferry.Scheduler([dev, cpu]) as sched:
        with pytest.raises(ferry.InvalidArgumentError, match="the pool's backend .* not one of the scheduler's"):
            pool.attention_step(other, q, kv_len)
        with pytest.raises(ferry.OutOfBoundsError, match="3 layers, but the cache has 1..2"):
            pool.attention_step(sched, [*q, q[0]], kv_len)
        with pytest.raises(ferry.OutOfBoundsError, match="sequences 1..4"):
            pool.attention_step(sched, q, kv_len, 1, 4)


def pipelined_steps(c: PagedKVCache, pool: BlockPool, groups: List[Tuple[int, int]], steps: int, ahead: bool,
                    dev: ferry.Backend, cpu: ferry.Backend) -> List[List[bytes]]:
    """steps decode steps a group at a time (each sequence one cell longer a step), the outputs of each
    group's step. ahead: the next group's sync (the next step's first group's after the last) is made
    before this group computes, as prefetch does, and the group checks that its cells read through the
    table are still the cache's after it; else each group syncs, then computes."""
    rng = np.random.default_rng(5)
    q = [ferry.Tensor.from_numpy(dev, rng.uniform(-1, 1, (3, 1, 4, HEAD_DIM)).astype(np.float32)) for _ in range(2)]
    base = [c.table(s)[1] - steps for s in range(3)]
    order = [(t, g0, g1) for t in range(steps) for g0, g1 in groups]
    lengths = [[base[s] + t + 1 for s in range(g0, g1)] for t, g0, g1 in order]
    outs: List[List[bytes]] = []
    if ahead:
        pool.sync(order[0][1], order[0][2], lengths[0])
    for i, (_, g0, g1) in enumerate(order):
        if not ahead:
            pool.sync(g0, g1, lengths[i])
        elif i + 1 < len(order):
            pool.sync(order[i + 1][1], order[i + 1][2], lengths[i + 1])  # the next group's, ahead
        with ferry.Scheduler([dev, cpu]) as sched:
            qg = [x.view([HEAD_DIM, 4, 1, g1 - g0], [4, 4 * HEAD_DIM, 16 * HEAD_DIM, 16 * HEAD_DIM],
                         offset=g0 * 16 * HEAD_DIM) for x in q]
            kv_len = ferry.Tensor.from_numpy(cpu, np.array(lengths[i], np.int32), name="kv_len")
            step = pool.attention_step(sched, qg, kv_len, g0, g1)
            pool.wait()
            sched.compute(step.graph)
            outs.append([o.get() for o in step])
        if ahead:
            dev.synchronize()
            check_reads(c, pool, range(g0, g1), lengths[i])  # the sync ahead took no slot this group reads
    return outs


def test_prefetch_sends_the_next_groups_blocks_ahead_the_same_bytes_and_outputs() -> None:
    """Under prefetch a group's sync is made before the group before it computes: the plan halves the
    streaming slots (3 groups, not 2), the sync ahead keeps the slots the last one read, and the bytes,
    transfers and outputs are those of the same groups synced serially; the syncs count as made ahead."""
    c = random_cache("f16", True)
    dev, cpu = ferry.StandinBackend(), ferry.CPUBackend()
    with BlockPool(c, dev, 4) as ahead, BlockPool(c, dev, 4) as serial:
        assert ahead.plan() == [(0, 2), (2, 3)]
        ahead.set_prefetch(True)
        assert ahead.prefetch and not serial.prefetch
        groups = ahead.plan()
        assert groups == [(0, 1), (1, 2), (2, 3)] and ahead.choose_resident(2) == [0, 1]
        serial.set_resident([0, 1])
        ahead.reset_stats()
        got = pipelined_steps(c, ahead, groups, 3, True, dev, cpu)
        want = pipelined_steps(c, serial, groups, 3, False, dev, cpu)
        assert got == want
        a, s = ahead.stats, serial.stats
        sent = ("set", "set_2d")  # (the ahead run's checks read the pools back: gets)
        assert (a.cell_bytes, a.table_bytes, a.transfers, [a.buffers.bytes[k] for k in sent]) == \
            (s.cell_bytes, s.table_bytes, s.transfers, [s.buffers.bytes[k] for k in sent])
        assert sum(a.buffers.bytes[k] for k in sent) == a.bytes
        assert (a.syncs_ahead, a.bytes_ahead) == (9, a.bytes) and (s.syncs_ahead, s.bytes_ahead) == (0, 0)
        ahead.set_prefetch(False)
        assert not ahead.prefetch
        with pytest.raises(ferry.InvalidArgumentError, match="ahead must be a bool"):
            ahead.set_prefetch(1)  # type: ignore[arg-type]
    with BlockPool(c, dev, 4) as serial_plan:
        groups = serial_plan.plan()  # one streaming slot: the groups' streamed blocks take it in turn
        serial_plan.set_prefetch(True)
        serial_plan.sync(0, 2)
        with pytest.raises(ferry.OutOfMemoryError, match="under prefetch the last sync's"):
            serial_plan.sync(2, 3)  # ahead, it would take the slot of block 2, which group 0 reads
        assert serial_plan.stats.syncs == 1
        serial_plan.wait()
        check_reads(c, serial_plan, [0, 1], [10, 11])
    with BlockPool(c, dev, 3) as small:
        small.set_prefetch(True)
        with pytest.raises(ferry.OutOfMemoryError, match="turn prefetch off"):
            small.plan()  # two groups' streamed blocks and the shared two do not fit 3 slots
