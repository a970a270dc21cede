"""Transfers on real memory: plain and 2-D set/get, memset, copies, and the counters of each."""

from __future__ import annotations

import numpy as np
import pytest

import ferry
from conftest import SENTINEL, pattern


def test_set_get_round_trip(real_backend: ferry.Backend) -> None:
    t = real_backend.alloc_tensor("f32", [16, 4])
    data = pattern(t.nbytes)
    t.set(data)
    assert t.get() == data
    t.set(b"\x01\x02\x03", offset=10)
    assert t.get(8, 6) == data[8:10] + b"\x01\x02\x03" + data[13:14]


def test_set_accepts_bytearray_memoryview_and_numpy(cpu: ferry.CPUBackend) -> None:
    t = cpu.alloc_tensor("i32", [6])
    t.set(bytearray(pattern(8)), offset=0)
    t.set(memoryview(pattern(8, 1)), offset=8)
    t.set(np.array([7, 9], dtype=np.int32), offset=16)
    got = t.get()
    assert got[:8] == pattern(8) and got[8:16] == pattern(8, 1)
    assert np.frombuffer(got[16:], np.int32).tolist() == [7, 9]


def test_memset_writes_its_range_and_leaves_the_rest(real_backend: ferry.Backend) -> None:
    t = real_backend.alloc_tensor("f16", [32])
    t.set(pattern(64))
    t.memset(0x11, offset=5, size=7)
    assert t.get() == pattern(64)[:5] + b"\x11" * 7 + pattern(64)[12:]


def fill_sentinel(t: ferry.Tensor) -> None:
    t.buffer.clear(SENTINEL)
    t.buffer.reset_stats()


@pytest.mark.parametrize("via", ["tensor", "backend"])
def test_set_2d_lands_rows_and_leaves_gaps(real_backend: ferry.Backend, via: str) -> None:
    """Each row lands at offset + i*stride_tensor; every other byte keeps the sentinel."""
    t = real_backend.alloc_tensor("q8_0", [64, 40])  # 68-byte rows, 2720 bytes
    fill_sentinel(t)
    offset, size, n, stride_t, stride_d = 100, 150, 5, 500, 160
    data = pattern((n - 1) * stride_d + size)
    if via == "tensor":
        t.set_2d(data, offset, size, n, stride_t, stride_d)
    else:
        real_backend.set_2d_async(t, data, offset, size, n, stride_t, stride_d)
        real_backend.synchronize()
    expect = bytearray([SENTINEL]) * t.nbytes
    for i in range(n):
        at = offset + i * stride_t
        expect[at:at + size] = data[i * stride_d:i * stride_d + size]
    assert t.get() == bytes(expect)

    back = t.get_2d(offset, size, n, stride_t) if via == "tensor" else real_backend.get_2d(t, offset, size, n, stride_t)
    assert back == b"".join(data[i * stride_d:][:size] for i in range(n))


def test_get_2d_into_strided_output(cpu: ferry.CPUBackend) -> None:
    t = cpu.alloc_tensor("f32", [32, 8])
    t.set(pattern(t.nbytes))
    out = bytearray([SENTINEL]) * 100
    assert t.get_2d(4, 10, 3, 128, 40, out=out) is None
    expect = bytearray([SENTINEL]) * 100
    for i in range(3):
        expect[i * 40:i * 40 + 10] = pattern(t.nbytes)[4 + i * 128:][:10]
    assert out == expect


def test_a_views_2d_set_lands_at_offsets_from_the_views_first_byte(dummy_real: ferry.DummyBackend) -> None:
    """Offsets of a view's 2-D transfer are relative to the view's first byte in the root."""
    cache = dummy_real.alloc_tensor("f16", [64, 16, 3], name="cache")  # 128-byte rows, 16 cells per stream
    fill_sentinel(cache)
    row, kv, n_kv = 128, 16, 5
    win = cache.view([64, n_kv, 2], [2, row, row * kv], offset=row * kv)  # streams 1 and 2
    data = pattern(2 * n_kv * row)
    win.set_2d(data, 0, n_kv * row, 2, row * kv)
    got = cache.get()
    for s in range(3):
        stream = got[s * row * kv:(s + 1) * row * kv]
        if s == 0:
            assert stream == bytes([SENTINEL]) * (row * kv)
        else:
            assert stream[:n_kv * row] == data[(s - 1) * n_kv * row:][:n_kv * row]
            assert stream[n_kv * row:] == bytes([SENTINEL]) * ((kv - n_kv) * row)


@pytest.mark.parametrize("has_2d", [True, False])
def test_a_backend_without_2d_makes_a_plain_call_per_row_and_counts_one_2d_call(has_2d: bool) -> None:
    """Without a 2-D implementation a 2-D set is n plain sets: impl_calls == n_copies."""
    backend = ferry.DummyBackend(real_memory=True, has_2d=has_2d)
    assert backend.has_2d is has_2d
    t = backend.alloc_tensor("f32", [16, 32])  # 64-byte rows
    fill_sentinel(t)
    n, size = 7, 48
    backend.set_2d_async(t, pattern(n * size), 8, size, n, 64)
    backend.synchronize()
    out = bytearray(n * size)
    backend.get_2d_async(t, out, 8, size, n, 64)
    backend.synchronize()
    assert bytes(out) == pattern(n * size)
    for stats in (backend.stats, t.buffer.stats):
        assert stats.calls["set_2d"] == 1 and stats.calls["get_2d"] == 1
        assert stats.bytes["set_2d"] == n * size and stats.bytes["get_2d"] == n * size
        assert stats.impl_calls["set_2d"] == (1 if has_2d else n)
        assert stats.impl_calls["get_2d"] == (1 if has_2d else n)


def test_a_tensors_2d_set_without_2d_loops_in_its_buffer_not_the_backend() -> None:
    backend = ferry.DummyBackend(real_memory=True, has_2d=False)
    t = backend.alloc_tensor("i32", [8, 8])
    t.buffer.reset_stats()
    t.set_2d(pattern(5 * 12), 4, 12, 5, 32)
    s = t.buffer.stats
    assert (s.calls["set_2d"], s.bytes["set_2d"], s.impl_calls["set_2d"]) == (1, 60, 5)
    assert backend.stats.total_bytes == 0  # tensor.set_2d goes through the buffer, not the backend


def test_counters_equal_bytes_requested(real_backend: ferry.Backend) -> None:
    t = real_backend.alloc_tensor("f32", [32, 4])  # 512 bytes
    buf = t.buffer
    buf.reset_stats()
    before = buf.stats
    t.set(pattern(100), offset=12)
    t.get(3, 77)
    t.memset(0, 400, 50)
    t.set_2d(pattern(3 * 20), 0, 20, 3, 128)
    t.get_2d(64, 16, 4, 100)
    delta = buf.stats - before
    assert delta.bytes == {"set": 100, "get": 77, "set_2d": 60, "get_2d": 64, "copy": 0, "memset": 50}
    assert delta.calls == {"set": 1, "get": 1, "set_2d": 1, "get_2d": 1, "copy": 0, "memset": 1}
    assert delta.total_bytes == 351
    buf.reset_stats()
    assert buf.stats.total_bytes == 0


def test_backend_async_set_and_get_count_their_bytes_and_calls(dummy_real: ferry.DummyBackend) -> None:
    t = dummy_real.alloc_tensor("f32", [16])
    dummy_real.set_async(t, pattern(24), offset=8)
    out = bytearray(24)
    dummy_real.get_async(t, out, offset=8)
    dummy_real.synchronize()
    assert bytes(out) == pattern(24)
    s = dummy_real.stats
    assert (s.bytes["set"], s.bytes["get"], s.calls["set"], s.calls["get"]) == (24, 24, 1, 1)


def test_a_copy_between_backends_lands_the_bytes_and_counts_them(cpu: ferry.CPUBackend, dummy_real: ferry.DummyBackend) -> None:
    src = cpu.alloc_tensor("f16", [32, 3])
    src.set(pattern(src.nbytes))
    dst = dummy_real.alloc_tensor("f16", [32, 3])
    dst.buffer.reset_stats()
    src.copy_to(dst)
    assert dst.get() == pattern(src.nbytes)
    assert dst.buffer.stats.bytes["set"] == src.nbytes  # host source: a plain set into dst

    again = dummy_real.alloc_tensor("f16", [32, 3])
    dummy_real.copy_async(dst, again)
    dummy_real.synchronize()
    assert again.get() == pattern(src.nbytes)
    assert dummy_real.stats.bytes["copy"] == src.nbytes


def test_copy_of_a_strided_view_keeps_the_destination_gaps(cpu: ferry.CPUBackend) -> None:
    """dup_layout gives the same ne/nb; a copy moves the nbytes span (ggml's flat copy)."""
    src_root = cpu.alloc_tensor("f32", [8, 10])
    src_root.set(pattern(src_root.nbytes))
    src = src_root.view([8, 3], [4, 96], offset=32)
    dst = src.dup_layout(name="dst")
    assert dst.same_layout(src) and not dst.is_view
    cpu.alloc_buffer_for(dst)
    src.copy_to(dst)
    assert dst.get() == pattern(src_root.nbytes)[32:32 + src.nbytes]


# ------------------------------------------------------------ numpy


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_numpy_round_trip(real_backend: ferry.Backend, dtype: type) -> None:
    arr = (np.arange(2 * 3 * 32) % 97).astype(dtype).reshape(2, 3, 32)
    t = ferry.Tensor.from_numpy(real_backend, arr, name="a")
    assert t.ne == (32, 3, 2, 1) and t.type == ferry.to_type(np.dtype(dtype))
    back = t.to_numpy()
    assert back.shape == (2, 3, 32) and back.dtype == dtype
    np.testing.assert_array_equal(back, arr)


def test_to_numpy_of_views_gives_the_view_values(cpu: ferry.CPUBackend) -> None:
    arr = np.arange(3 * 10 * 8, dtype=np.float32).reshape(3, 10, 8)  # streams, cells, channels
    cache = ferry.Tensor.from_numpy(cpu, arr)
    win = cache.view([8, 4, 2], [4, 32, 320], offset=320)  # cells 0..3 of streams 1..2
    np.testing.assert_array_equal(win.to_numpy(), arr[1:3, :4, :])
    np.testing.assert_array_equal(cache.transpose().to_numpy(), arr.transpose(0, 2, 1))
    np.testing.assert_array_equal(win.permute(0, 2, 1, 3).to_numpy(), arr[1:3, :4, :].transpose(1, 0, 2))
    np.testing.assert_array_equal(cache.reshape([80, 3]).to_numpy(), arr.reshape(3, 80))


def test_set_from_a_non_contiguous_array_copies_it_in_c_order(cpu: ferry.CPUBackend) -> None:
    arr = np.arange(12, dtype=np.int32).reshape(3, 4)
    t = cpu.alloc_tensor("i32", [3, 4])
    t.set(arr.T)  # copied in C order
    np.testing.assert_array_equal(t.to_numpy(), arr.T)
