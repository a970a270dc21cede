"""The KV spine (ferry.kv_layers): one for every cache. KVCache and PagedKVCache supply their layout
alone; what they share is refused the same way, each message naming the cache it comes from, and
neither reaches into the other's private names or rewrites the other's messages."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any, Callable, Dict

import numpy as np
import pytest

import ferry
from ferry.paged import PagedKVCache

SOURCES = Path(ferry.__file__).parent  # the package under test, as PYTHONPATH gives it
CACHE_MODULES = ["kv", "paged", "kv_layers"]


def make_kv(cls: Any = ferry.KVCache, **kw: Any) -> Any:
    return cls("f16", "f16", head_dim=4, n_head_kv=1, n_ctx=8, n_stream=1, **kw)


def make_paged(cls: Any = PagedKVCache, **kw: Any) -> Any:
    return cls("f16", "f16", head_dim=4, n_head_kv=1, block_size=4, n_blocks=2, n_seq=1, **kw)


MAKERS: Dict[str, Callable[..., Any]] = {"KVCache": make_kv, "PagedKVCache": make_paged}
SHAPES = {"KVCache": [(1, 8, 4), (1, 8, 4)], "PagedKVCache": [(2, 4, 1, 4), (2, 4, 1, 4)]}


@pytest.mark.parametrize("name", CACHE_MODULES)
def test_no_cache_module_imports_a_private_name_of_another(name: str) -> None:
    tree = ast.parse((SOURCES / f"{name}.py").read_text(encoding="utf-8"))
    private = [f"line {node.lineno}: {alias.name} of .{node.module}" for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module in CACHE_MODULES
               for alias in node.names if alias.name.startswith("_")]
    assert private == []


@pytest.mark.parametrize("name", CACHE_MODULES)
def test_no_cache_module_rewrites_a_message(name: str) -> None:
    """Each message is formatted with its cache's name, never made by replacing another's."""
    tree = ast.parse((SOURCES / f"{name}.py").read_text(encoding="utf-8"))
    rewrites = [f"line {node.lineno}" for node in ast.walk(tree)
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "replace"
                and any(isinstance(a, ast.Constant) and isinstance(a.value, str) and "Cache" in a.value
                        for a in node.args)]
    assert rewrites == []


@pytest.mark.parametrize("name", list(MAKERS))
def test_what_the_caches_share_is_refused_naming_the_cache(name: str) -> None:
    make = MAKERS[name]
    with pytest.raises(ferry.InvalidArgumentError, match=f"^{name}: give at most one of backend"):
        make(backend=ferry.CPUBackend(), pinned=True)
    with pytest.raises(ferry.InvalidArgumentError, match=f"^{name}: backend: expected a Backend, got str"):
        make(backend="cpu")
    with pytest.raises(ferry.InvalidArgumentError, match=f"^{name}: placement has 2 entries for 1 layers"):
        make(placement=[None, None])
    with pytest.raises(ferry.InvalidArgumentError, match=f"^{name}: n_layer"):
        make(n_layer="two")
    cache = make()
    with pytest.raises(ferry.OutOfBoundsError, match=rf"^{name}\.k: layer 1 is not in 0\.\.0"):
        cache.k(1)
    with pytest.raises(ferry.OutOfBoundsError, match=rf"^{name}\.layer_buffer: layer -1 is not in 0\.\.0"):
        cache.layer_buffer(-1)
    cache.close()
    assert repr(cache) == f"<{name} closed>"


@pytest.mark.parametrize("name", list(MAKERS))
def test_the_callers_arrays_are_refused_naming_the_cache_and_the_array(name: str) -> None:
    cls = ferry.KVCache if name == "KVCache" else PagedKVCache
    extra: Dict[str, Any] = {} if name == "KVCache" else {"n_seq": 1}
    k_shape, v_shape = SHAPES[name]
    k, v = np.zeros(k_shape, np.float16), np.zeros(v_shape, np.float16)
    with pytest.raises(ferry.InvalidArgumentError, match=rf"^{name}\.from_arrays: 1 K layers and 2 V layers"):
        cls.from_arrays([k], [v, v], **extra)
    with pytest.raises(ferry.InvalidArgumentError, match=rf"^{name}\.from_arrays: v_layers\[0\] is i32: attention"):
        cls.from_arrays([k], [v.astype(np.int32)], **extra)
    with pytest.raises(ferry.InvalidArgumentError, match=rf"^{name}\.from_arrays: k_layers\[1\] is f32, k_layers"):
        cls.from_arrays([k, k.astype(np.float32)], [v, v], **extra)
    cache = cls.from_arrays([k], [v], **extra)
    assert cache.layer_buffer(0) is cache.k(0)._buffer


def test_a_third_layout_is_a_subclass_whose_messages_name_it() -> None:
    """A layout with its own name: every message the spine makes for it says that name, with no
    string of the other caches' to rewrite."""
    class SlidingKVCache(ferry.KVCache):
        _layout = dataclasses.replace(ferry.KVCache._layout, name="SlidingKVCache")

    with pytest.raises(ferry.InvalidArgumentError, match="^SlidingKVCache: placement has 2 entries"):
        make_kv(SlidingKVCache, placement=[None, None])
    with pytest.raises(ferry.InvalidArgumentError, match="^SlidingKVCache: n_layer"):
        make_kv(SlidingKVCache, n_layer="two")
    k = np.zeros((1, 8, 4), np.float16)
    with pytest.raises(ferry.InvalidArgumentError, match=r"^SlidingKVCache\.from_arrays: 1 K layers and 2 V layers"):
        SlidingKVCache.from_arrays([k], [k, k])
    with pytest.raises(ferry.InvalidArgumentError, match=r"^SlidingKVCache\.from_arrays: n_head_kv must be positive"):
        SlidingKVCache.from_arrays([k], [k], n_head_kv=0)
    assert type(SlidingKVCache.from_arrays([k], [k])) is SlidingKVCache
    with make_kv(SlidingKVCache) as cache:
        assert isinstance(cache.params, ferry.kv.KVParams) and cache.params.n_embd_gqa == 4
        assert repr(cache).startswith("<SlidingKVCache K f16 V f16 head_dim=4 n_head_kv=1 1 x 8 cells")
        k, v = cache.window(0, 3)
        assert k.ne == (4, 3, 1, 1)
    assert cache.closed
