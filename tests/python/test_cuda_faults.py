"""CUDA's failures as Python sees them, against the fake runtime (tools/test's fake build):
the runtime is made to fail a call (tests/fake-cudart's fake_cudart_inject, which the fake
build of libferry exports), and the binding raises the FerryError of the status, carrying
CUDA's message; after a sticky error the backend refuses further work, saying why, and a
new arm (a fresh context, as in a new process) makes it usable again. The C side of this,
every call failed in turn, is tests/c/test_cuda_faults.c."""

from __future__ import annotations

import ctypes

import pytest

import ferry
from ferry import _binding

pytestmark = pytest.mark.skipif(not ferry.build_info()["fake_cudart"], reason="needs the fake CUDA runtime's build")

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_MEMORY_ALLOCATION = 2
CUDA_ERROR_LAUNCH_FAILURE = 719


def fake() -> ctypes.CDLL:
    so = ctypes.CDLL(_binding.LIB_PATH)  # the library the binding loaded: the same copy in the process
    so.fake_cudart_inject.argtypes = [ctypes.c_long, ctypes.c_int]
    return so


def test_out_of_memory_is_out_of_memory_error_with_cuda_message() -> None:
    backend = ferry.CUDABackend()
    so = fake()
    so.fake_cudart_inject(2, CUDA_ERROR_MEMORY_ALLOCATION)  # cudaSetDevice, then cudaMalloc
    try:
        with pytest.raises(ferry.OutOfMemoryError) as e:
            backend.alloc_tensor("f32", [1024])
        assert "cudaErrorMemoryAllocation" in e.value.message and "out of memory" in e.value.message
    finally:
        so.fake_cudart_inject(0, 0)
    t = backend.alloc_tensor("f32", [1024])  # the fault spent: the same call succeeds
    t.set(b"\x01" * 4096)
    assert t.get() == b"\x01" * 4096


def test_invalid_value_is_backend_error_with_cuda_message() -> None:
    backend = ferry.CUDABackend()
    t = backend.alloc_tensor("f32", [256])
    so = fake()
    so.fake_cudart_inject(1, CUDA_ERROR_INVALID_VALUE)
    try:
        with pytest.raises(ferry.BackendError) as e:
            t.set(b"\x02" * 1024)
        assert "cudaErrorInvalidValue" in e.value.message
    finally:
        so.fake_cudart_inject(0, 0)
    t.set(b"\x02" * 1024)
    assert t.get() == b"\x02" * 1024


def test_sticky_error_refuses_further_work() -> None:
    backend = ferry.CUDABackend()
    t = backend.alloc_tensor("f32", [256])
    so = fake()
    so.fake_cudart_inject(1, CUDA_ERROR_LAUNCH_FAILURE)
    try:
        with pytest.raises(ferry.BackendError) as e:
            t.set(b"\x03" * 1024)
        assert "cudaErrorLaunchFailure" in e.value.message and "sticky" in e.value.message
        with pytest.raises(ferry.BackendError) as e:
            backend.synchronize()
        assert "refused" in e.value.message and "sticky" in e.value.message
    finally:
        so.fake_cudart_inject(0, 0)
    t.set(b"\x03" * 1024)  # a fresh context
    assert t.get() == b"\x03" * 1024
