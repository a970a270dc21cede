"""Type names, block and row sizes, and nbytes of every type, including the permuted K window of docs/design.md."""

from __future__ import annotations

import pytest

import ferry

# (name, bytes per block, values per block), written out here rather than read from ferry.
TYPES = [("f32", 4, 1), ("f16", 2, 1), ("bf16", 2, 1), ("i32", 4, 1), ("q8_0", 34, 32), ("q4_0", 18, 32)]


@pytest.mark.parametrize("name,size,blck", TYPES)
def test_type_traits(name: str, size: int, blck: int) -> None:
    t = ferry.to_type(name)
    assert str(t) == name and ferry.to_type(t).type_name == name
    assert ferry.to_type(name).size == size and ferry.to_type(name).blck_size == blck
    assert ferry.to_type(int(t)) is t


@pytest.mark.parametrize("name,size,blck", TYPES)
def test_row_size(name: str, size: int, blck: int) -> None:
    for n in (0, 32, 64, 128, 1024, 4096):
        assert ferry.row_size(name, n) == n // blck * size


@pytest.mark.parametrize("name,size,blck", [t for t in TYPES if t[2] > 1])
def test_row_size_of_partial_block_is_a_layout_error(name: str, size: int, blck: int) -> None:
    with pytest.raises(ferry.LayoutError, match="whole number"):
        ferry.row_size(name, blck + 1)


@pytest.mark.parametrize("name,size,blck", TYPES)
def test_contiguous_nbytes_and_strides(name: str, size: int, blck: int) -> None:
    t = ferry.Tensor.new(name, [64, 3, 2, 5])
    row = 64 // blck * size
    assert t.ne == (64, 3, 2, 5)
    assert t.nb == (size, row, 3 * row, 6 * row)
    assert t.nbytes == 30 * row
    assert t.row_size == row
    assert t.type == ferry.to_type(name)
    assert t.is_contiguous and not t.is_view


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
def test_permuted_k_window_nbytes(name: str, size: int, blck: int, n_stream: int) -> None:
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


def test_k_window_repr() -> None:
    _, k, _, _ = k_window(ferry.DummyBackend(real_memory=True), "q8_0", 32768, 2, 2176)
    assert repr(k) == ("<Tensor 'k' q8_0 ne=[128, 2176, 8, 2] nb=[34, 1088, 136, 17825792] "
                       "view of 'cache' +0 in Dummy buffer>")


def test_numpy_dtypes() -> None:
    import numpy as np

    assert ferry.numpy_dtype("f32") == np.float32
    assert ferry.numpy_dtype("f16") == np.float16
    assert ferry.numpy_dtype("i32") == np.int32
    assert ferry.type_from_dtype(np.float16) == ferry.Type.F16
    import ml_dtypes

    assert ferry.numpy_dtype("bf16") == ml_dtypes.bfloat16  # numpy has none of its own
    assert ferry.type_from_dtype(ml_dtypes.bfloat16) == ferry.Type.BF16
    for name in ("q8_0", "q4_0"):
        with pytest.raises(ferry.UnsupportedError, match=f"{name} has no numpy dtype"):
            ferry.numpy_dtype(name)
