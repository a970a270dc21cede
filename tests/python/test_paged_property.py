"""The paged KV cache's entry points under random arguments (hypothesis, the repeatable profile), as
test_api_property.py asks of the other newer ones: PagedKVCache(...), PagedKVCache.from_arrays, the
block tables (allocate, append, free, set_table), window and the gather setting.

Each test starts from a call that succeeds and gives one of its arguments a drawn value, valid or
not. The call succeeds, or raises a FerryError whose message names that argument (an
OutOfMemoryError may name the bytes it could not have instead); never another exception. A refused
call writes nothing: the caller's arrays, the pools' bytes, every table and the free list, and the
device's memory are as they were.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

import ferry
from ferry.paged import PagedKVCache
from test_api_property import SCALE, SETTINGS, TYPE_NAMES, changed, ints, junk, outcome

# ---------------------------------------------------------------- PagedKVCache(...)

CACHE_ARGS = ["type_k", "type_v", "head_dim", "n_head_kv", "block_size", "n_blocks", "n_seq", "n_layer", "v_trans",
              "share_blocks", "placement"]
#: What else a message may call an argument.
CACHE_NAMES = {"n_layer": ("layers",), "placement": ("placement",), "n_blocks": ("blocks",), "n_seq": ("sequences",)}


@st.composite
def cache_change(draw: st.DrawFn) -> Tuple[str, Any]:
    arg = draw(st.sampled_from(CACHE_ARGS))
    if arg in ("type_k", "type_v"):
        value = draw(st.one_of(st.sampled_from(TYPE_NAMES), junk()))
    elif arg in ("v_trans", "share_blocks"):
        value = draw(st.one_of(st.booleans(), junk()))
    elif arg == "placement":
        value = draw(st.one_of(st.lists(st.sampled_from([None, "dev", "cpu", "text"]), max_size=3), junk()))
    else:
        value = draw(st.one_of(ints(-2, 40), junk()))
    return arg, value


@settings(max_examples=300 * SCALE, **SETTINGS)
@given(cache_change())
@example(("n_blocks", 2**31))  # past an int32 block id: refused naming n_blocks
@example(("type_v", "q8_0"))  # q8_0 rows of head_dim 16: refused naming type_v
def test_paged_cache(change: Tuple[str, Any]) -> None:
    """A paged cache of any arguments: made, reading zeros with every block free, or refused naming the
    argument with none of the device's memory kept."""
    arg, value = change
    dev = ferry.StandinBackend(memory=1 << 20)
    host = ferry.StandinBackend(memory=1 << 22)  # of a budget: no huge pool is touched
    if isinstance(value, list) and all(v in (None, "dev", "cpu", "text") for v in value):
        value = [{"dev": dev, "cpu": ferry.CPUBackend(), "text": "dev"}.get(v) if v else None for v in value]
    base: Dict[str, Any] = dict(type_k="f16", type_v="f16", head_dim=16, n_head_kv=2, block_size=4, n_blocks=16,
                                n_seq=3, n_layer=2, v_trans=False, share_blocks=False, placement=[None, dev],
                                backend=host)
    free = dev.memory().free
    c, _ = outcome(lambda: PagedKVCache(**changed(base, arg, value)), (arg,) + CACHE_NAMES.get(arg, ()))
    if c is None:
        assert dev.memory().free == free, "a refused cache kept device memory"
        return
    p = c.params
    assert c.free_blocks == p.n_blocks and c.table(p.n_seq - 1) == ([], 0)
    for layer in range(p.n_layer):
        assert not any(c.k(layer).get()) and not any(c.v(layer).get())  # a new cache reads zeros
    c.close()


# ---------------------------------------------------------------- PagedKVCache.from_arrays

ARRAY_ARGS = ["k_layers", "v_layers", "n_seq", "v_trans", "type_k", "type_v", "n_head_kv", "share_blocks"]
ARRAY_NAMES = {"k_layers": ("K layers",), "v_layers": ("V layers",), "n_seq": ("sequences",)}


def bad_pool(kind: int) -> Any:
    """A pool from_arrays may refuse (or, for a few, take): each of another kind than the base's."""
    a = np.full((8, 4, 2, 16), 3.0, np.float16)
    ro = a.copy()
    ro.flags.writeable = False
    return [a.astype(np.float32), a.astype(np.int32), a.view(np.uint8), a.astype(np.float64), a[:, ::2].copy(),
            np.full((8, 8, 2, 16), 1, np.float16)[:, ::2], a.reshape(8, 4, 32).copy(), a.reshape(32, 32).copy(),
            a[None].copy(), np.full((9, 4, 2, 16), 1, np.float16), ro, None, "x", [1.0, 2.0], a.copy()][kind]


@st.composite
def arrays_change(draw: st.DrawFn) -> Tuple[str, Any]:
    arg = draw(st.sampled_from(ARRAY_ARGS))
    if arg in ("k_layers", "v_layers"):
        value = draw(st.one_of(st.tuples(st.just("replace"), st.integers(0, 1), st.integers(0, 14)),
                               st.tuples(st.just("length"), st.integers(0, 3)), junk()))
    elif arg in ("v_trans", "share_blocks"):
        value = draw(st.one_of(st.booleans(), junk()))
    elif arg in ("type_k", "type_v"):
        value = draw(st.one_of(st.none(), st.sampled_from(TYPE_NAMES), junk()))
    elif arg == "n_head_kv":
        value = draw(st.one_of(st.none(), ints(-2, 5), junk()))
    else:
        value = draw(st.one_of(ints(-2, 5), junk()))
    return arg, value


@settings(max_examples=300 * SCALE, **SETTINGS)
@given(arrays_change())
@example(("v_layers", ("replace", 1, 6)))  # a later layer of another rank: refused naming v_layers[1]
@example(("v_trans", True))  # 4-D V pools for a transposed V
def test_paged_from_arrays(change: Tuple[str, Any]) -> None:
    """Pools over the caller's arrays: made, gathering the arrays' bytes, or refused naming the argument
    (the array: k_layers[i]); the arrays hold what they held either way."""
    arg, value = change
    ks = [np.full((8, 4, 2, 16), 1.0 + i, np.float16) for i in range(2)]
    vs = [np.full((8, 4, 2, 16), -1.0 - i, np.float16) for i in range(2)]
    base: Dict[str, Any] = dict(k_layers=ks, v_layers=vs, n_seq=2, v_trans=False, type_k=None, type_v=None,
                                n_head_kv=None, share_blocks=False)
    if isinstance(value, tuple) and value[:1] == ("replace",):
        layers = list(base[arg])
        layers[value[1]] = bad_pool(value[2])
        value = layers
    elif isinstance(value, tuple) and value[:1] == ("length",):
        value = [np.full((8, 4, 2, 16), 5.0, np.float16) for _ in range(value[1])]
    args = changed(base, arg, value)
    arrays = [a for key in ("k_layers", "v_layers") if isinstance(args[key], list)
              for a in args[key] if isinstance(a, np.ndarray)]
    before = [a.copy() for a in arrays]
    c, _ = outcome(lambda: PagedKVCache.from_arrays(**args), (arg,) + ARRAY_NAMES.get(arg, ()))
    assert all(np.array_equal(a, b) for a, b in zip(arrays, before)), "the caller's arrays were written"
    if c is None:
        return
    last = c.params.n_seq - 1
    c.set_table(last, [3, 2], 6)
    k, _ = c.window(1, 8, last, last)
    pool = np.ascontiguousarray(args["k_layers"][1]).view(np.uint8).reshape(c.params.n_blocks * c.params.block_size, -1)
    split = ferry.DummyBackend(real_memory=True)
    dst = k.dup_layout()
    split.alloc_buffer_for(dst)
    stats = ferry.copy_path.copy_input(split, "flat", k, dst)
    got = np.frombuffer(dst.get(), np.uint8).reshape(8, -1)
    np.testing.assert_array_equal(got[:4], pool[12:16])
    np.testing.assert_array_equal(got[4:6], pool[8:10])
    assert stats.bytes_copied == 6 * pool.shape[1]


# ---------------------------------------------------------------- the block tables

#: Values the integer arguments of the table entry points refuse, of another kind or out of range.
INT_JUNK = [np.array([1, 2]), np.float64(2.0), np.bool_(True), 1.5, True, "1", 2**64, -(2**63) - 1]
#: Tables set_table refuses: no sequence of ids of one dimension, or ids of another kind.
BLOCKS_JUNK = [np.array(3), np.array([[1, 2]]), np.array([1.0, 2.0]), np.array([True]), {1: 2}, {1, 2}, "12", 3,
               [np.float64(1.0)], [2**64]]

TABLE_CALLS = {"allocate": ["seq", "n_cells"], "append": ["seq", "n_cells"], "free": ["seq"],
               "set_table": ["seq", "blocks", "n_cells"]}
TABLE_NAMES = {"seq": ("seq", "sequence"), "n_cells": ("n_cells", "cells"), "blocks": ("blocks", "block")}


@st.composite
def table_change(draw: st.DrawFn) -> Tuple[str, str, Any]:
    call = draw(st.sampled_from(sorted(TABLE_CALLS)))
    arg = draw(st.sampled_from(TABLE_CALLS[call]))
    if arg == "blocks":
        value = draw(st.one_of(st.lists(st.one_of(ints(-2, 20), junk()), max_size=8), junk(),
                               st.sampled_from(BLOCKS_JUNK)))
    elif arg == "n_cells" and call == "set_table":
        value = draw(st.one_of(st.none(), ints(-2, 40), junk(), st.sampled_from(INT_JUNK)))
    else:
        value = draw(st.one_of(ints(-2, 40), junk(), st.sampled_from(INT_JUNK)))
    return call, arg, value


def tables_of(c: PagedKVCache) -> Tuple[List[Tuple[List[int], int]], int]:
    return [c.table(s) for s in range(c.params.n_seq)], c.free_blocks


@settings(max_examples=500 * SCALE, **SETTINGS)
@given(table_change())
@example(("set_table", "blocks", [4, 5, 0]))  # sequence 0's block: refused naming the sequence holding it
@example(("set_table", "blocks", [4, 5, 4]))  # a block twice
@example(("set_table", "blocks", [4, 2**31]))  # past an int32 id
@example(("set_table", "blocks", np.array(3)))  # a 0-d array: refused naming blocks, not a TypeError
@example(("allocate", "n_cells", 60))  # more blocks than are free: an OutOfMemoryError naming the sequence
def test_paged_tables(change: Tuple[str, str, Any]) -> None:
    """A table changed, or the change refused naming the argument with every table and the free list as
    they were."""
    call, arg, value = change
    c = PagedKVCache("f32", "f32", 8, 1, block_size=4, n_blocks=16, n_seq=3)
    c.allocate(0, 9)
    c.set_table(1, [10, 11], 6)
    base: Dict[str, Any] = {"allocate": dict(seq=2, n_cells=5), "append": dict(seq=1, n_cells=3),
                            "free": dict(seq=0), "set_table": dict(seq=2, blocks=[4, 5, 7], n_cells=10)}[call]
    before = tables_of(c)
    names = TABLE_NAMES[arg] + (("blocks", "free") if call in ("allocate", "append") else ())
    _, err = outcome(lambda: getattr(c, call)(**changed(base, arg, value)), names)
    if err is not None:
        assert tables_of(c) == before, "a refused call changed the tables"
        return
    tables, free = tables_of(c)
    held = [b for t, _ in tables for b in t]
    assert len(held) == len(set(held)) and free == 16 - len(held)  # no block twice, none lost
    assert all(cells <= len(t) * 4 for t, cells in tables)


# ---------------------------------------------------------------- window and the gather setting

WINDOW_ARGS = ["layer", "n_kv", "s0", "s1", "lengths", "limit", "gather"]
WINDOW_NAMES = {"n_kv": ("n_kv",), "s0": ("s0", "sequences"), "s1": ("s1", "sequences"), "layer": ("layer",),
                "lengths": ("lengths",), "limit": ("limit",), "gather": ("gather",)}


@st.composite
def window_change(draw: st.DrawFn) -> Tuple[str, Any]:
    arg = draw(st.sampled_from(WINDOW_ARGS))
    if arg == "lengths":
        value = draw(st.one_of(st.tuples(st.just("lengths"), st.integers(0, 3)), junk()))
    elif arg == "gather":
        value = draw(st.one_of(st.sampled_from(["auto", "per_block", "runs", "batched", "kernel", "fast", 2]),
                               junk()))
    elif arg in ("s1", "limit"):
        value = draw(st.one_of(st.none(), ints(-2, 70), junk()))
    else:
        value = draw(st.one_of(ints(-2, 70), junk()))
    return arg, value


@settings(max_examples=300 * SCALE, **SETTINGS)
@given(window_change())
@example(("n_kv", 65))  # past a pool's cells
@example(("gather", "kernel"))  # not offered by the stand-in: refused when gathered, naming it
def test_paged_window(change: Tuple[str, Any]) -> None:
    """Windows of any arguments: made and gathered (exactly the cells read), or refused naming the
    argument, the destination then as it was."""
    arg, value = change
    cpu = ferry.CPUBackend()
    c = PagedKVCache("f32", "f32", 8, 1, block_size=4, n_blocks=16, n_seq=2, n_layer=2)
    c.allocate(0, 9)
    c.allocate(1, 3)
    lens = ferry.Tensor.from_numpy(cpu, np.array([9, 3], np.int32), name="lens")
    if isinstance(value, tuple) and value[:1] == ("lengths",):
        value = [lens, ferry.Tensor.from_numpy(cpu, np.array([9, 3, 1], np.int32)),
                 ferry.Tensor.from_numpy(cpu, np.array([9.0, 3.0], np.float32)),
                 ferry.Tensor.from_numpy(cpu, np.array([12, 3], np.int32))][value[1]]
    base: Dict[str, Any] = dict(layer=1, n_kv=12, s0=0, s1=None, lengths=lens, limit=None)
    if arg == "gather":
        _, err = outcome(lambda: setattr(c, "gather", value), ("gather",))
        if err is not None:
            assert c.gather == ferry.policy.GatherMethod.AUTO
        args = base
    else:
        args = changed(base, arg, value)
    pair, err = outcome(lambda: c.window(**args), WINDOW_NAMES[arg])
    if pair is None:
        return
    split = ferry.StandinBackend()
    dst = pair[0].dup_layout()
    split.alloc_buffer_for(dst)
    dst.memset(0xA5)
    got, err = outcome(lambda: ferry.copy_path.copy_input(split, "ranges", pair[0], dst),
                       WINDOW_NAMES[arg] + ("length", "block", "gather"))
    if got is None:
        assert set(dst.get()) == {0xA5}, "a refused gather wrote"
        return
    first, last = args["s0"], 1 if args["s1"] is None else args["s1"]
    lengths = args["lengths"]  # the kv_len carried, else each sequence's cells
    used = [int(n) for n in lengths.to_numpy()] if lengths is not None else [9, 3][first:last + 1]
    used = [min(n, args["n_kv"]) for n in used]
    assert got.bytes_copied == got.bytes_read == sum(used) * 8 * 4
