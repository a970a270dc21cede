"""Paged attention (ferry.ops.attn_paged): attention reading K and V through a block table in a
paged cache's pools, so that no dense window is built.

On the CPU its output is byte for byte attn_decode's over the dense window the paged cache's
gather builds (ferry.copy_path.copy_input of PagedKVCache.window) from the same pools and tables:
random ragged lengths, random tables whose blocks streams share, n_tok 1..16, every type attention
reads, V transposed or not. Every pool cell no stream reads holds NaN, and every table entry past
what a stream's length reaches holds junk (-1, a slot past the pools, or a slot of NaN), so a read
the op must not make shows. Then the refusals: shapes naming the operand, and a table entry that is
read and is not a slot, refused at compute naming the stream and the entry, writing nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Tuple

import numpy as np
import pytest
from hypothesis import example, given, settings

import ferry
from ferry.paged import PagedKVCache
from test_api_property import SCALE, SETTINGS
from test_attn_tokens import Case, _values, cases

HEAD_DIM = 32
BLOCK = 4  # cells per block (slot)


@dataclass
class Pools:
    """One case's paged cache (pools of NaN where no stream reads), its tables, and its queries."""

    case: Case
    paged: PagedKVCache
    tables: List[List[int]]  # each stream's slots, as many as its window's cells need
    n_blocks: int
    q: np.ndarray  # float32 [ns, n_tok, n_head, head_dim]

    @property
    def max_blocks(self) -> int:
        return -(-self.case.n_kv // BLOCK)


def build(c: Case) -> Pools:
    """Tables drawn at random from a pool smaller than the streams' blocks together, so that streams
    share blocks; pool cells that no stream's length reaches are NaN."""
    rng = np.random.default_rng(c.seed)
    per = -(-c.n_kv // BLOCK)
    n_blocks = per + c.ns  # fewer than ns * per: streams share blocks
    tables = [[int(b) for b in rng.choice(n_blocks, per, replace=False)] for _ in range(c.ns)]
    read = np.zeros((n_blocks, BLOCK), bool)
    for s, ids in enumerate(tables):
        for cell in range(c.lens[s]):
            read[ids[cell // BLOCK], cell % BLOCK] = True
    k_pool, _ = _values(rng, c.type_k, (n_blocks, BLOCK), c.n_embd, read)
    v_pool, _ = _values(rng, c.type_v, (n_blocks, BLOCK), c.n_embd, read)
    if c.v_trans:
        v_pool = np.ascontiguousarray(v_pool.reshape(n_blocks * BLOCK, c.n_embd).T)
    paged = PagedKVCache.from_arrays([k_pool], [v_pool], n_seq=c.ns, v_trans=c.v_trans, type_k=c.type_k,
                                     type_v=c.type_v, n_head_kv=c.n_head_kv, share_blocks=True)
    for s, ids in enumerate(tables):
        paged.set_table(s, ids, c.lens[s])
    q = rng.uniform(-1.0, 1.0, size=(c.ns, c.n_tok, c.n_head, HEAD_DIM)).astype(np.float32)
    return Pools(c, paged, tables, n_blocks, q)


def compute(out: ferry.Tensor, cpu: ferry.Backend) -> np.ndarray:
    out.set_output()
    graph = ferry.Graph(out)
    ferry.GraphAllocator(cpu).alloc(graph)
    graph.compute(cpu)
    return out.to_numpy()


def dense_gathered(p: Pools) -> np.ndarray:
    """attn_decode on the CPU over the window the paged cache's gather builds."""
    c, cpu = p.case, ferry.CPUBackend()
    kv_len = ferry.Tensor.from_numpy(cpu, np.array(c.lens, np.int32), name="kv_len")
    windows = []
    for w in p.paged.window(0, c.n_kv, lengths=kv_len):
        dst = w.dup_layout(name=f"dense_{w.name}")
        cpu.alloc_buffer_for(dst)
        ferry.copy_path.copy_input(cpu, "flat", w, dst)
        windows.append(dst)
    q = ferry.Tensor.from_numpy(cpu, p.q, name="q")
    return compute(ferry.ops.attn_decode(q, windows[0], windows[1], kv_len, v_trans=c.v_trans), cpu)


def junk_past_lengths(p: Pools, rng: np.random.Generator) -> np.ndarray:
    """The tables [ns, max_blocks] as table_tensor gives them, each entry past what its stream's
    length reaches replaced by junk: -1, a slot past the pools, or a slot (of NaN cells, maybe)."""
    cpu = ferry.CPUBackend()
    ids = p.paged.table_tensor(cpu, max_blocks=p.max_blocks).to_numpy().reshape(p.case.ns, p.max_blocks).copy()
    for s, n in enumerate(p.case.lens):
        for i in range(-(-n // BLOCK), p.max_blocks):
            ids[s, i] = rng.choice([-1, p.n_blocks, 2**31 - 1, int(rng.integers(0, p.n_blocks))])
    return ids


def paged(p: Pools, table: np.ndarray) -> np.ndarray:
    c, cpu = p.case, ferry.CPUBackend()
    q = ferry.Tensor.from_numpy(cpu, p.q, name="q")
    kv_len = ferry.Tensor.from_numpy(cpu, np.array(c.lens, np.int32), name="kv_len")
    t = ferry.Tensor.from_numpy(cpu, table.astype(np.int32), name="table")
    out = ferry.ops.attn_paged(q, p.paged.k(0), p.paged.v(0), t, kv_len, BLOCK, v_trans=c.v_trans)
    assert out.ne == (HEAD_DIM, c.n_head, c.n_tok, c.ns)
    return compute(out, cpu)


@settings(max_examples=60 * SCALE, **SETTINGS)
@example(Case("q8_0", "q8_0", False, 2, 3, 24, 16, (24, 0, 16, 19), 1))  # the most tokens, an idle stream
@example(Case("f16", "f32", True, 1, 1, 16, 16, (16,), 2))  # n_tok = len: the whole window new
@example(Case("f32", "f16", True, 2, 2, 7, 1, (7, 1, 0), 3))  # one token, a length inside the first block
@example(Case("f16", "q8_0", False, 1, 2, 9, 2, (9, 9, 9, 9), 4))  # every stream full: most blocks shared
@given(cases())
def test_byte_identical_to_attn_decode_over_the_gathered_window(c: Case) -> None:
    """The dense gather's output byte for byte, finite (no NaN cell was read), over the tables as
    table_tensor gives them and with junk in every entry no length reaches."""
    p = build(c)
    want = dense_gathered(p)
    assert np.isfinite(want).all()
    got = paged(p, junk_past_lengths(p, np.random.default_rng(c.seed)))
    assert got.tobytes() == want.tobytes()
    cpu = ferry.CPUBackend()
    exact = p.paged.table_tensor(cpu, max_blocks=p.max_blocks).to_numpy().reshape(c.ns, p.max_blocks)
    assert paged(p, exact).tobytes() == want.tobytes()


def test_table_tensor_is_the_caches_tables() -> None:
    """Row s is sequence s0 + s's block ids, -1 past them; its max_blocks refused below the longest."""
    c = PagedKVCache("f16", "f16", HEAD_DIM, 1, block_size=BLOCK, n_blocks=16, n_seq=3)
    c.allocate(0, 9)
    c.set_table(2, [7, 3], 5)
    cpu = ferry.CPUBackend()
    t = c.table_tensor(cpu)
    assert t.type == ferry.Type.I32 and t.ne == (3, 3, 1, 1)
    assert t.to_numpy().tolist() == [[0, 1, 2], [-1, -1, -1], [7, 3, -1]]
    assert c.table_tensor(cpu, 1, 2, max_blocks=4).to_numpy().tolist() == [[-1, -1, -1, -1], [7, 3, -1, -1]]
    with pytest.raises(ferry.OutOfBoundsError, match="max_blocks 2 is below the 3 blocks"):
        c.table_tensor(cpu, max_blocks=2)
    with pytest.raises(ferry.OutOfBoundsError, match="sequences 1..3 are not in the cache's 0..2"):
        c.table_tensor(cpu, 1, 3)


# ---------------------------------------------------------------- refusals


def _operands(n_tok: int = 1) -> Tuple[ferry.Tensor, ...]:
    """q of 2 streams, 4 query heads over 2 kv heads; pools of 6 slots of 4 cells; a table of 3 blocks."""
    cpu = ferry.CPUBackend()
    c = PagedKVCache("f16", "f16", HEAD_DIM, 2, block_size=BLOCK, n_blocks=6, n_seq=2)
    q = ferry.Tensor.from_numpy(cpu, np.zeros((2, n_tok, 4, HEAD_DIM), np.float32), name="q")
    table = ferry.Tensor.from_numpy(cpu, np.array([[0, 1, 2], [3, 4, 5]], np.int32), name="table")
    kv_len = ferry.Tensor.from_numpy(cpu, np.array([12, 5], np.int32), name="kv_len")
    return q, c.k(0), c.v(0), table, kv_len


@pytest.mark.parametrize("which, bad, match", [
    ("k_pool", np.zeros((24, 48), np.float16), r"k_pool is f16 ne \[48, 24, 1, 1\].*k_pool must be .*with q's "
                                               r"head_dim 32 and block_size 4"),
    ("k_pool", np.zeros((22, 64), np.float16), r"k_pool .*cells whole|k_pool must be .*block_size 4"),
    ("v_pool", np.zeros((20, 64), np.float16), r"v_pool is f16 ne \[64, 20, 1, 1\].*matching k_pool, \[64, 24, 1, 1\]"),
    ("table", np.zeros((3, 3), np.int32), r"table is i32 ne \[3, 3, 1, 1\].*q's ns 2"),
    ("table", np.zeros((2, 3), np.float32), r"table is f32 .*must be i32 \[max_blocks, ns\]"),
    ("kv_len", np.zeros(3, np.int32), r"kv_len is i32 ne \[3, 1, 1, 1\].*q's ns 2"),
])
def test_shapes_that_do_not_fit_are_refused_naming_the_operand(which: str, bad: np.ndarray, match: str) -> None:
    q, k, v, table, kv_len = _operands()
    ops = {"k_pool": k, "v_pool": v, "table": table, "kv_len": kv_len}
    ops[which] = ferry.Tensor.from_numpy(ferry.CPUBackend(), bad)
    with pytest.raises(ferry.LayoutError, match="attn_paged: " + match):
        ferry.ops.attn_paged(q, ops["k_pool"], ops["v_pool"], ops["table"], ops["kv_len"], BLOCK)


def test_arguments_refused_naming_them() -> None:
    q, k, v, table, kv_len = _operands()
    with pytest.raises(ferry.InvalidArgumentError, match=r"attn_paged: block_size 0 is not in 1\.\.2147483647"):
        ferry.ops.attn_paged(q, k, v, table, kv_len, 0)
    with pytest.raises(ferry.LayoutError, match=r"k_pool .*block_size 5"):
        ferry.ops.attn_paged(q, k, v, table, kv_len, 5)  # 24 cells are not whole blocks of 5
    with pytest.raises(ferry.InvalidArgumentError, match="attn_paged: v_trans: expected a bool"):
        ferry.ops.attn_paged(q, k, v, table, kv_len, BLOCK, v_trans=1)  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgumentError, match="attn_paged: table"):
        ferry.ops.attn_paged(q, k, v, [0, 1], kv_len, BLOCK)  # type: ignore[arg-type]
    with pytest.raises(ferry.LayoutError, match=r"v_pool .*v_trans: one row per channel"):
        ferry.ops.attn_paged(q, k, v, table, kv_len, BLOCK, v_trans=True)
    with pytest.raises(ferry.LayoutError, match=r"q is f32 .*n_tok at most the 12 cells the table's 3 blocks reach"):
        ferry.ops.attn_paged(_operands(13)[0], k, v, table, kv_len, BLOCK)
    q3 = ferry.Tensor.from_numpy(ferry.CPUBackend(), np.zeros((2, 1, 3, HEAD_DIM), np.float32))
    with pytest.raises(ferry.LayoutError, match="q's 3 query heads do not group over the 2 kv heads"):
        ferry.ops.attn_paged(q3, k, v, table, kv_len, BLOCK)


@pytest.mark.parametrize("entry", [-1, 6, 2**31 - 1])
def test_a_read_entry_that_is_not_a_slot_is_refused_at_compute_naming_the_stream_writing_nothing(entry: int) -> None:
    """Stream 1 (length 5) reads its entries 0 and 1: entry 1 out of the pools' 6 slots is refused,
    and the output keeps what it held; the same entry past its length (entry 2) is never read."""
    q, k, v, table, kv_len = _operands()
    cpu = ferry.CPUBackend()
    table.set(np.array([[0, 1, 2], [3, entry, 5]], np.int32))
    out = ferry.ops.attn_paged(q, k, v, table, kv_len, BLOCK).set_output()
    graph = ferry.Graph(out)
    ferry.GraphAllocator(cpu).alloc(graph)
    out.set(np.full(out.ne[::-1], 42.0, np.float32))
    with pytest.raises(ferry.OutOfBoundsError, match=rf"attn_paged: stream 1's table entry 1 \(its cells 4..7, below "
                                                     rf"its length 5\) is slot {entry}, outside the pools' slots 0..5"):
        graph.compute(cpu)
    assert (out.to_numpy() == 42.0).all()
    table.set(np.array([[0, 1, 2], [3, 4, entry]], np.int32))
    graph.compute(cpu)
    assert np.isfinite(out.to_numpy()).all() and not (out.to_numpy() == 42.0).any()


def test_the_op_has_its_name() -> None:
    q, k, v, table, kv_len = _operands()
    out = ferry.ops.attn_paged(q, k, v, table, kv_len, BLOCK, scale=1.0 / math.sqrt(HEAD_DIM))
    assert ferry.ops.op_name(out.op) == "attn_paged"
