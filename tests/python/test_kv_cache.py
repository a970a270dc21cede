"""The KV cache: its layers and windows (shape, strides, offset, nbytes of docs/design.md's permuted K
window), writing and reading a stream, its refusals, and its lifetime (closed, freed, exported)."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import ferry
from conftest import TYPES
from ferry._binding import lib


def k_window(backend: ferry.Backend, type_name: str, n_ctx: int, n_stream: int, n_kv: int, s0: int = 0,
             head_dim: int = 128, n_head_kv: int = 8):
    """docs/design.md's K window over a non-unified cache, permuted (0, 2, 1, 3)."""
    n_embd = head_dim * n_head_kv
    kv_size = n_ctx // n_stream
    ty = ferry.to_type(type_name)
    cache = ferry.Tensor.new(ty, [n_embd, kv_size, n_stream], name="cache")
    backend.alloc_buffer_for(cache)
    row = ferry.row_size(ty, n_embd)
    ns = n_stream - s0
    k = cache.view([head_dim, n_head_kv, n_kv, ns], [ty.size, ferry.row_size(ty, head_dim), row, row * kv_size],
                   offset=row * kv_size * s0)
    return cache, k.permute(0, 2, 1, 3, name="k"), row, kv_size


# docs/design.md's table at -c 32768, n_kv = 2176: streams -> cells copied flat (the nbytes span).
SPAN_CELLS = {2: 18560, 4: 26752, 8: 30848}


@pytest.mark.parametrize("name,size,blck", TYPES)
@pytest.mark.parametrize("n_stream", [2, 4, 8])
def test_a_permuted_k_window_has_design_mds_shape_strides_and_span(name: str, size: int, blck: int, n_stream: int) -> None:
    backend = ferry.DummyBackend()  # synthetic: full scale without the memory
    cache, k, row, kv_size = k_window(backend, name, 32768, n_stream, 2176)
    assert row == 1024 // blck * size
    head = 128 // blck * size
    assert k.ne == (128, 2176, 8, n_stream)
    assert k.nb == (size, row, head, row * kv_size)
    assert k.nbytes == SPAN_CELLS[n_stream] * row
    assert k.nbytes == ((n_stream - 1) * kv_size + 2176) * row
    assert k.row_size == head
    assert not k.is_contiguous and k.is_view
    assert k.root is cache and k.offset == 0


def test_k_window_from_a_later_stream_starts_at_its_offset() -> None:
    _, k, row, kv_size = k_window(ferry.DummyBackend(), "q8_0", 32768, 4, 2176, s0=1)
    assert k.offset == row * kv_size
    assert k.ne[3] == 3
    assert k.nbytes == (2 * kv_size + 2176) * row


def test_a_k_windows_repr_gives_its_shape_strides_and_source() -> None:
    _, k, _, _ = k_window(ferry.DummyBackend(real_memory=True), "q8_0", 32768, 2, 2176)
    assert repr(k) == ("<Tensor 'k' q8_0 ne=[128, 2176, 8, 2] nb=[34, 1088, 136, 17825792] "
                       "view of 'cache' +0 in Dummy buffer>")


def test_a_window_keeps_its_cache_alive_until_the_window_goes() -> None:
    kv = ferry.KVCache("f16", "f16", 32, 2, 64, 4, n_layer=2)
    alive = weakref.ref(kv)
    k, v = kv.window(1, 3, 1, 2)
    assert k.ne == (32, 3, 2, 2) and v.ne == (32, 3, 2, 2) and k.root is kv.k(1)
    assert kv.v(1).buffer is kv.buffer and kv.k(0).name == "cache_k_l0"
    del kv
    gc.collect()
    assert alive() is not None  # the window keeps the cache
    assert k.buffer.owner is alive()
    del k, v
    gc.collect()
    assert alive() is None


def test_a_cache_refuses_out_of_range_use_and_impossible_geometries_and_still_works() -> None:
    kv = ferry.KVCache("f16", "f16", 32, 2, 64, 4)
    with pytest.raises(ferry.OutOfBoundsError):
        kv.window(0, 17)
    with pytest.raises(ferry.OutOfBoundsError):
        kv.window(0, 4, 2, 1)
    with pytest.raises(ferry.OutOfBoundsError):
        kv.k(1)
    with pytest.raises(ferry.OutOfBoundsError, match="holds 2048 bytes"):
        kv.set_stream("k", 0, 0, b"x")
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.KVCache("f16", "f16", 32, 2, 63, 4)
    with pytest.raises(ferry.LayoutError):
        ferry.KVCache("q8_0", "q8_0", 16, 2, 64, 4)
    with pytest.raises(ferry.LayoutError):
        ferry.KVCache("f16", "q8_0", 32, 2, 64, 4, v_trans=True)
    with pytest.raises(ferry.UnsupportedError):
        kv.buffer.close()
    data = np.arange(16 * 64, dtype=np.float16).reshape(16, 64)
    kv.set_stream("v", 0, 3, data)
    assert kv.get_stream("v", 0, 3) == data.tobytes()


def test_closing_a_kv_cache_keeps_the_windows_taken_before() -> None:
    kv = ferry.KVCache("f32", "f32", 4, 1, 16, 2)
    layer = kv.k(0)
    layer.set(bytes(range(layer.nbytes)))
    k, v = kv.window(0, 3)
    buffer_id = kv.buffer.id
    kv.close()
    with pytest.raises(ferry.FreedBufferError, match="KVCache"):
        kv.window(0, 3)
    with pytest.raises(ferry.FreedBufferError):
        layer.get()  # the layer tensors are the cache's own
    assert lib.ferry_buffer_id_is_live(buffer_id)  # the windows hold the memory
    assert k.get(0, 16) == bytes(range(16))
    del k, v
    assert not lib.ferry_buffer_id_is_live(buffer_id)


def test_kv_cache_is_freed_without_the_collector() -> None:
    """A cache nobody holds is freed at once (no reference cycle keeps its memory, which may be
    pinned, until the collector runs); a tensor of it, or its buffer, keeps it alive."""
    import gc
    import weakref

    import ferry

    gc.disable()
    try:
        kv = ferry.KVCache("f16", "f16", 8, 2, 64, 2, n_layer=2)
        k = kv.k(1)
        assert kv.k(1) is k and kv.buffer is k.buffer  # one wrapper while it is held
        dead = weakref.ref(kv)
        del kv
        assert dead() is not None  # k keeps its cache
        k.set(b"\x01" * k.nbytes)
        assert k.get() == b"\x01" * k.nbytes
        del k
        assert dead() is None  # nothing else did: gone without a collection
    finally:
        gc.enable()


def test_kv_cache_exports_and_outlives_its_wrapper() -> None:
    kv = ferry.KVCache("f16", "f16", head_dim=8, n_head_kv=2, n_ctx=16, n_stream=2)
    k = kv.k(0)
    k.set(np.arange(k.nelements, dtype=np.float16))
    arr = np.asarray(k)
    assert arr.shape == (2, 8, 16) and arr.dtype == np.float16
    del kv, k
    gc.collect()
    np.testing.assert_array_equal(arr.reshape(-1), np.arange(256, dtype=np.float16))
