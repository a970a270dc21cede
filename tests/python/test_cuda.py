"""The CUDA entry points through the raw binding: present in every build, graceful without a device."""

from __future__ import annotations

import pytest

from ferry._binding import ffi, lib

BUILT = bool(lib.ferry_built_with_cuda())
AVAILABLE = bool(lib.ferry_cuda_available())
needs_device = pytest.mark.skipif(not AVAILABLE, reason="no CUDA device")


def _error() -> str:
    return ffi.string(lib.ferry_last_error()).decode()


def test_device_count_agrees_with_available() -> None:
    n = ffi.new("int *", -1)
    assert lib.ferry_cuda_device_count(n) == lib.FERRY_OK
    assert n[0] >= 0
    assert AVAILABLE == (n[0] > 0)
    assert BUILT or not AVAILABLE


@pytest.mark.skipif(AVAILABLE, reason="a CUDA device is present")
def test_backend_new_without_device_fails_with_a_message() -> None:
    out = ffi.new("ferry_backend **")
    st = lib.ferry_cuda_backend_new(0, out)
    assert st == (lib.FERRY_ERR_BACKEND if BUILT else lib.FERRY_ERR_UNSUPPORTED)
    assert out[0] == ffi.NULL
    msg = _error()
    assert "cuda_backend_new" in msg
    assert ("CUDA" in msg) if BUILT else ("without CUDA" in msg)
    buft = ffi.new("ferry_buffer_type **")
    assert lib.ferry_cuda_host_buffer_type(buft) != lib.FERRY_OK
    assert _error()


def test_cpu_backend_has_no_events() -> None:
    cpu = ffi.new("ferry_backend **")
    assert lib.ferry_cpu_backend_new(cpu) == lib.FERRY_OK
    try:
        ev = ffi.new("ferry_event **")
        assert lib.ferry_event_new(cpu[0], 0, ev) == lib.FERRY_ERR_UNSUPPORTED
        assert "no events" in _error()
    finally:
        lib.ferry_backend_free(cpu[0])


@needs_device
def test_a_c_2d_set_on_the_device_lands_rows_at_their_pitch_and_leaves_the_gaps() -> None:
    backend = ffi.new("ferry_backend **")
    assert lib.ferry_cuda_backend_new(0, backend) == lib.FERRY_OK, _error()
    b = backend[0]
    ctx = ffi.new("ferry_context **")
    buf = ffi.new("ferry_buffer **")
    t = ffi.new("ferry_tensor **")
    assert lib.ferry_context_new(ctx) == lib.FERRY_OK
    try:
        row, pitch, n = 1088, 4 * 1088, 5
        nbytes = pitch * n
        assert lib.ferry_backend_alloc_buffer(b, nbytes, buf) == lib.FERRY_OK, _error()
        ne = ffi.new("int64_t[1]", [nbytes // 4])
        assert lib.ferry_tensor_new(ctx[0], lib.FERRY_TYPE_I32, 1, ne, t) == lib.FERRY_OK
        assert lib.ferry_buffer_place_tensor(buf[0], t[0], 0) == lib.FERRY_OK
        assert lib.ferry_tensor_memset(t[0], 0xA5, 0, nbytes) == lib.FERRY_OK
        src = bytes((i * 7 + 3) % 251 for i in range(row * n))
        assert lib.ferry_backend_tensor_set_2d_async(b, t[0], src, 0, row, n, pitch, row) == lib.FERRY_OK, _error()
        assert lib.ferry_backend_synchronize(b) == lib.FERRY_OK
        back = ffi.new("uint8_t[]", nbytes)
        assert lib.ferry_tensor_get(t[0], back, 0, nbytes) == lib.FERRY_OK
        got = bytes(back)
        for r in range(n):
            assert got[r * pitch:r * pitch + row] == src[r * row:(r + 1) * row]
            assert set(got[r * pitch + row:(r + 1) * pitch]) == {0xA5}
    finally:
        lib.ferry_buffer_free(buf[0])
        lib.ferry_context_free(ctx[0])
        lib.ferry_backend_free(b)


@needs_device
def test_a_failed_cuda_malloc_is_out_of_memory_naming_the_cuda_call() -> None:
    backend = ffi.new("ferry_backend **")
    assert lib.ferry_cuda_backend_new(0, backend) == lib.FERRY_OK, _error()
    try:
        buf = ffi.new("ferry_buffer **")
        assert lib.ferry_backend_alloc_buffer(backend[0], 1 << 52, buf) == lib.FERRY_ERR_OUT_OF_MEMORY
        assert "cudaMalloc" in _error()
    finally:
        lib.ferry_backend_free(backend[0])
