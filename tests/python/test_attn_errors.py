"""attn_decode's layout errors name the operand at fault (q, k, v or kv_len), show what it got
(type, ne and nb) and say what it should be: for a window, a KV window permuted (0, 2, 1, 3)."""

from __future__ import annotations

from typing import Tuple

import numpy as np
import pytest

import ferry

HEAD_DIM, N_HEAD_KV, N_HEAD, NS = 8, 4, 16, 4
WINDOW = r"must be a KV window permuted \(0, 2, 1, 3\): ne = \[head_dim, n_kv, n_head_kv, ns\]"


def _cache(head_dim: int = HEAD_DIM, kv_size: int = 100) -> ferry.KVCache:
    return ferry.KVCache("f16", "f16", head_dim, N_HEAD_KV, kv_size * NS, NS)


def _q(head_dim: int = HEAD_DIM, n_head: int = N_HEAD, ns: int = NS) -> ferry.Tensor:
    return ferry.Tensor.from_numpy(ferry.CPUBackend(), np.zeros((ns, 1, n_head, head_dim), np.float32), name="q")


def _lens(ns: int = NS) -> ferry.Tensor:
    return ferry.Tensor.from_numpy(ferry.CPUBackend(), np.full(ns, 5, np.int32), name="kv_len")


@pytest.fixture
def window() -> Tuple[ferry.KVCache, ferry.Tensor, ferry.Tensor]:
    kv = _cache()
    k, v = kv.window(0, 100)
    return kv, k, v


def test_a_window_left_unpermuted_blames_k(window: Tuple[ferry.KVCache, ferry.Tensor, ferry.Tensor]) -> None:
    """The view before its permute, [head_dim, n_head_kv, n_kv, ns]: its 100 cells are not kv heads."""
    _, k, v = window
    flat = k.permute(0, 2, 1, 3)  # its own inverse: back to [8, 4, 100, 4]
    with pytest.raises(ferry.LayoutError, match=r"^attn_decode: k is f16 ne \[8, 4, 100, 4\] nb \[2, 16, 64, ") as e:
        ferry.ops.attn_decode(_q(), flat, v, _lens())
    assert "k " + "must be a KV window permuted (0, 2, 1, 3)" in e.value.message
    assert "not permuted" in e.value.message and "group" not in e.value.message


def test_a_query_of_another_head_dim_blames_q(window: Tuple[ferry.KVCache, ferry.Tensor, ferry.Tensor]) -> None:
    _, k, v = window
    with pytest.raises(ferry.LayoutError, match=r"^attn_decode: q is f32 ne \[4, 16, 1, 4\].* q must be "
                                               r"f32 \[head_dim, n_head, 1, ns\] with the head_dim 8 of k and v"):
        ferry.ops.attn_decode(_q(head_dim=4), k, v, _lens())


def test_a_window_of_another_head_dim_blames_k(window: Tuple[ferry.KVCache, ferry.Tensor, ferry.Tensor]) -> None:
    _, _, v = window
    other, _ = _cache(head_dim=16).window(0, 100)
    with pytest.raises(ferry.LayoutError, match=rf"^attn_decode: k is f16 ne \[16, 100, 4, 4\].* k {WINDOW}, "
                                               r"with q's head_dim 8"):
        ferry.ops.attn_decode(_q(), other, v, _lens())


def test_a_window_of_other_streams_blames_k(window: Tuple[ferry.KVCache, ferry.Tensor, ferry.Tensor]) -> None:
    kv, _, v = window
    k2, _ = kv.window(0, 100, 0, 1)
    with pytest.raises(ferry.LayoutError, match=rf"^attn_decode: k is f16 ne \[8, 100, 4, 2\].* k {WINDOW}, "
                                               r"with q's ns 4"):
        ferry.ops.attn_decode(_q(), k2, v, _lens())


def test_v_of_other_cells_blames_v_and_says_its_shape(window: Tuple[ferry.KVCache, ferry.Tensor,
                                                                    ferry.Tensor]) -> None:
    kv, k, _ = window
    _, v2 = kv.window(0, 20)
    with pytest.raises(ferry.LayoutError, match=r"^attn_decode: v is f16 ne \[8, 20, 4, 4\].* v must be .*matching k, "
                                               r"\[8, 100, 4, 4\]"):
        ferry.ops.attn_decode(_q(), k, v2, _lens())


def test_kv_len_of_other_streams_blames_kv_len(window: Tuple[ferry.KVCache, ferry.Tensor, ferry.Tensor]) -> None:
    _, k, v = window
    with pytest.raises(ferry.LayoutError, match=r"^attn_decode: kv_len is i32 ne \[3, 1, 1, 1\].* kv_len must be "
                                               r"i32 \[ns\] with q's ns 4"):
        ferry.ops.attn_decode(_q(), k, v, _lens(3))


def test_query_heads_that_do_not_group_blame_q(window: Tuple[ferry.KVCache, ferry.Tensor, ferry.Tensor]) -> None:
    """A permuted window with 4 kv heads and a query of 6 heads: the query's count is at fault."""
    _, k, v = window
    with pytest.raises(ferry.LayoutError, match=r"^attn_decode: q's 6 query heads do not group over 4 kv heads "
                                               r"\(k's ne\[2\]\); q's n_head \(ne\[1\]\) must be a multiple"):
        ferry.ops.attn_decode(_q(n_head=6), k, v, _lens())


@pytest.mark.parametrize("t", list(ferry.Type), ids=str)
def test_attention_takes_a_type_iff_the_lists_have_it(t: ferry.Type) -> None:
    """kv.ATTENTION_TYPES and the command line's KV_TYPES are C's list (ferry_attn_reads_type):
    attn_decode takes K and V windows of a type iff both list it, and refuses it naming k."""
    from ferry.kv import ATTENTION_TYPES
    from ferry.workloads.common import KV_TYPES

    assert (t in ATTENTION_TYPES) == (str(t) in KV_TYPES) == t.read_by_attention
    k, v = ferry.KVCache(t, t, 32, N_HEAD_KV, 100 * NS, NS).window(0, 100)
    q = ferry.Tensor.from_numpy(ferry.CPUBackend(), np.zeros((NS, 1, N_HEAD, 32), np.float32), name="q")
    if t in ATTENTION_TYPES:
        ferry.ops.attn_decode(q, k, v, _lens())
    else:
        with pytest.raises(ferry.LayoutError, match=rf"^attn_decode: k is {t} "):
            ferry.ops.attn_decode(q, k, v, _lens())
