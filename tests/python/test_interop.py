"""Bring your own arrays: zero-copy export (numpy's array interface, DLPack, the CUDA array
interface), zero-copy import (from_array), and the refusals that keep both honest.

PyTorch is optional: its tests skip where it is not installed. CUDA tests skip without a
device; against the fake CUDA runtime (FERRY_FAKE_CUDART=1) device memory is closed to the
host, so they never read it but through ferry's copies.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import ferry
from ferry import export
from ferry._binding import lib

try:
    import torch
except ImportError:  # pragma: no cover - torch is not a dependency
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
needs_device = pytest.mark.skipif(not ferry.cuda_available(), reason="no CUDA device")
FAKE_CUDART = ferry.build_info()["fake_cudart"]


@pytest.fixture
def cpu() -> ferry.CPUBackend:
    return ferry.CPUBackend()


def strided_window(backend: ferry.Backend) -> tuple:
    """A [6, 4] f32 root and the [3, 2] view of its columns 1..3 of rows 1 and 3 (a gap between rows)."""
    values = np.arange(24, dtype=np.float32).reshape(4, 6)
    root = ferry.Tensor.from_numpy(backend, values, name="root")
    view = root.view([3, 2], [4, 48], 4 + 24, name="window")
    return values, root, view


def settled() -> int:
    gc.collect()
    return export.n_live_exports()


# ------------------------------------------------------------ export to numpy


@pytest.mark.parametrize("how", ["asarray", "from_dlpack"])
def test_numpy_views_share_memory_with_ferry(cpu: ferry.CPUBackend, how: str) -> None:
    values, root, view = strided_window(cpu)
    arr = np.asarray(view) if how == "asarray" else np.from_dlpack(view)
    assert arr.shape == (2, 3) and arr.strides == (48, 4) and arr.dtype == np.float32
    np.testing.assert_array_equal(arr, values[1::2, 1:4])
    assert arr.ctypes.data == view.address  # ferry's memory, not a copy
    arr[1, 2] = -7.0  # written through numpy, read back by ferry
    assert np.frombuffer(root.get(), np.float32)[3 * 6 + 3] == -7.0
    root.set(np.full(24, 2.5, np.float32))  # and the other way round
    assert (arr == 2.5).all()


@pytest.mark.parametrize("how", ["asarray", "from_dlpack", "raw"])
def test_view_outlives_the_tensor_object(cpu: ferry.CPUBackend, how: str) -> None:
    values, root, view = strided_window(cpu)
    arr = {"asarray": np.asarray, "from_dlpack": np.from_dlpack,
           "raw": lambda t: np.asarray(t.raw()).view(np.float32)}[how](view)
    buffer_id = root.buffer.id
    del root, view
    gc.collect()
    assert lib.ferry_buffer_id_is_live(buffer_id)
    np.testing.assert_array_equal(arr, values[1::2, 1:4])
    del arr
    assert settled() == 0
    assert not lib.ferry_buffer_id_is_live(buffer_id)  # and nothing is held past the consumer


def test_explicit_free_waits_for_the_consumer(cpu: ferry.CPUBackend) -> None:
    """Freeing a buffer while numpy holds a view of it lets the memory go only with the view (the
    ASan run of this suite sees any read of freed memory)."""
    values, root, view = strided_window(cpu)
    arr = np.asarray(view)
    capsule_view = np.from_dlpack(root)
    buf = root.buffer
    buf.close()
    assert buf.closed and lib.ferry_buffer_id_is_live(buf.id)  # C frees it when the views go
    with pytest.raises(ferry.FreedBufferError):
        buf.clear()
    np.testing.assert_array_equal(arr, values[1::2, 1:4])
    np.testing.assert_array_equal(capsule_view, values)
    bid = buf.id
    del arr, capsule_view, view, root
    assert settled() == 0
    assert not lib.ferry_buffer_id_is_live(bid)
    # the hold is the view's, not the tensor's: with the views gone, a free frees at once
    t = cpu.alloc_tensor("f32", [4], name="t")
    for exporter in (np.asarray, np.from_dlpack):
        exporter(t)
    gc.collect()  # its callback lets go of DLPack exports whose consumer called the deleter
    t.buffer.close()
    with pytest.raises(ferry.FreedBufferError):
        t.get()


def test_dlpack_capsules_consumed_or_not_leak_nothing(cpu: ferry.CPUBackend) -> None:
    _, root, view = strided_window(cpu)
    before = settled()
    capsule = view.__dlpack__()
    assert export.n_live_exports() == before + 1
    del capsule  # never consumed: its destructor deletes it
    assert settled() == before
    consumed = np.from_dlpack(view)
    assert export.n_live_exports() == before + 1
    del consumed  # numpy calls the deleter
    assert settled() == before
    assert view.__dlpack_device__() == (1, 0)


def test_pinned_memory_exports_as_host() -> None:
    if not ferry.cuda_available():
        pytest.skip("pinned memory needs a CUDA device")
    kv = ferry.KVCache("f32", "f32", 4, 1, 8, 1, pinned=True)
    k = kv.k(0)
    assert k.__dlpack_device__() == (1, 0)
    arr = np.asarray(k)
    arr[...] = 3.0
    assert (np.frombuffer(k.get(), np.float32) == 3.0).all()


def test_block_types_export_only_their_bytes(cpu: ferry.CPUBackend) -> None:
    q = ferry.Tensor.from_numpy(cpu, np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64), type="q8_0",
                                name="q")
    for exporter in (np.asarray, np.from_dlpack, lambda t: t.__array_interface__):
        with pytest.raises(ferry.UnsupportedError, match="q8_0 has no array dtype; t.raw"):
            exporter(q)
    raw = np.asarray(q.raw())
    assert raw.dtype == np.uint8 and raw.shape == (2, 68)
    assert raw.tobytes() == q.get()
    assert np.from_dlpack(q.raw()).tobytes() == q.get()
    raw[0, 2] = 0x7F  # the first block's first int8, through the view
    assert q.get()[2] == 0x7F


def test_bf16_exports_as_ml_dtypes(cpu: ferry.CPUBackend) -> None:
    x = np.array([[1.5, -2.25], [3.0, 1e-3]], np.float32)
    t = ferry.Tensor.from_numpy(cpu, x, type="bf16")
    arr = np.asarray(t)
    assert arr.dtype == ml_dtypes.bfloat16 and arr.ctypes.data == t.address
    np.testing.assert_array_equal(arr, x.astype(ml_dtypes.bfloat16))
    assert not hasattr(t, "__array_interface__")  # numpy has no typestr for it: __array__ serves it
    assert np.array(t, dtype=np.float32).dtype == np.float32


def test_memory_no_one_reads_is_refused(cpu: ferry.CPUBackend) -> None:
    synthetic = ferry.DummyBackend(is_host=True).alloc_tensor("f32", [8], name="synth")
    standin = ferry.StandinBackend().alloc_tensor("f32", [8], name="dev")
    loose = ferry.Tensor.new("f32", [8], name="loose")
    freed = cpu.alloc_tensor("f32", [8], name="gone")
    freed.buffer.close()
    cases = [(synthetic, ferry.UnsupportedError, "synthetic addresses"),
             (standin, ferry.UnsupportedError, "neither the host nor a CUDA device"),
             (loose, ferry.NotAllocatedError, "'loose' is not allocated"),
             (freed, ferry.FreedBufferError, "freed")]
    for t, err, why in cases:
        for exporter in (np.asarray, np.from_dlpack, lambda t: t.__dlpack__(), lambda t: t.raw().__array_interface__):
            with pytest.raises(err, match=why):
                exporter(t)
        assert not hasattr(t, "__cuda_array_interface__")


def test_scheduler_memory_is_refused(cpu: ferry.CPUBackend) -> None:
    """A scheduler's compute tensors move when it allocates again: a view of them could dangle."""
    a = ferry.Tensor.from_numpy(cpu, np.ones(8, np.float32), name="a")
    out = ferry.ops.scale(a, 2.0, name="out").set_output()
    graph = ferry.Graph(out)
    sched = ferry.Scheduler([cpu])
    sched.compute(graph)
    with pytest.raises(ferry.UnsupportedError, match="Scheduler owns and replaces"):
        np.asarray(out)
    np.testing.assert_array_equal(out.to_numpy(), np.full(8, 2.0, np.float32))


# ------------------------------------------------------------ export to PyTorch


@needs_torch
def test_torch_from_dlpack_shares_host_memory(cpu: ferry.CPUBackend) -> None:
    values, root, view = strided_window(cpu)
    tt = torch.from_dlpack(view)
    assert tuple(tt.shape) == (2, 3) and tt.stride() == (12, 1)
    tt[0, 0] = 99.0
    assert np.frombuffer(root.get(), np.float32)[7] == 99.0
    del root, view
    gc.collect()
    assert tt[1, 2].item() == values[3, 3]
    bf = ferry.Tensor.from_numpy(cpu, np.array([0.5, -3.0, 7.0, 1e-2], np.float32), type="bf16")
    tb = torch.from_dlpack(bf)
    assert tb.dtype == torch.bfloat16
    np.testing.assert_array_equal(tb.float().numpy(), bf.to_numpy().astype(np.float32))
    del tt, tb
    assert settled() == 0


# ------------------------------------------------------------ import


def test_from_array_is_a_view_of_numpy_memory(cpu: ferry.CPUBackend) -> None:
    backing = np.arange(48, dtype=np.float32).reshape(6, 8)
    window = backing[1:5:2, 2:7]  # rows 1 and 3, columns 2..6: strided
    t = ferry.from_array(window, name="w")
    assert t.ne[:2] == (5, 2) and t.nb[:2] == (4, 64)
    np.testing.assert_array_equal(t.to_numpy(), window)
    t.set_2d(np.full(5, -1, np.float32), 0, 20, 1, 64)  # row 0 of the view
    assert (backing[1, 2:7] == -1).all() and backing[1, 1] == 9 and backing[1, 7] == 15
    backing[3, 2] = 1234
    assert t.to_numpy()[1, 0] == 1234
    del backing, window
    gc.collect()
    assert t.to_numpy()[1, 0] == 1234  # the tensor holds the array
    assert isinstance(t.buffer, ferry.interop.ForeignBuffer) and t.buffer.is_host


def test_from_array_of_raw_blocks_reads_their_dequantized_values(cpu: ferry.CPUBackend) -> None:
    values = np.linspace(-2, 2, 64, dtype=np.float32)
    blocks = ferry.quantize(values, "q4_0").reshape(2, 18)
    t = ferry.from_array(blocks, type="q4_0")
    assert t.type == ferry.Type.Q4_0 and t.ne[:2] == (32, 2)
    np.testing.assert_array_equal(t.to_numpy().reshape(-1), ferry.dequantize(blocks, "q4_0"))


def test_from_array_refuses_what_it_cannot_view_without_a_copy_naming_why() -> None:
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    cases = [
        (ro, {}, ferry.InvalidArgumentError, "read-only"),
        (np.zeros((2, 2, 2, 2, 2), np.float32), {}, ferry.InvalidArgumentError, "5 dimensions"),
        (np.zeros((4, 8), np.float32)[:, ::2], {}, ferry.LayoutError, "last axis has a stride of 8"),
        (np.zeros(8, np.float32), {"type": "f16"}, ferry.InvalidArgumentError, "type is f16 but the array holds float32"),
        (np.zeros(8, np.float64), {}, ferry.UnsupportedError, "float64 has no ferry type"),
        (np.zeros((2, 30), np.uint8), {"type": "q8_0"}, ferry.LayoutError, "not whole q8_0 blocks"),
        (np.zeros(0, np.float32), {}, ferry.InvalidArgumentError, "empty"),
        ([1.0, 2.0], {}, ferry.InvalidArgumentError, "without a copy"),
        (b"abcd", {}, ferry.InvalidArgumentError, "immutable"),
    ]
    for obj, kw, err, why in cases:
        with pytest.raises(err, match=why):
            ferry.from_array(obj, **kw)
    assert settled() == 0


@needs_torch
def test_from_array_of_a_torch_host_slice_writes_in_place_and_keeps_it_alive() -> None:
    x = torch.arange(24, dtype=torch.bfloat16).reshape(4, 6)
    t = ferry.from_array(x[1:3, 2:5])
    assert t.type == ferry.Type.BF16 and t.ne[:2] == (3, 2) and t.nb[:2] == (2, 12)
    t.set_2d(np.full(3, 5.0, np.float32).astype(ml_dtypes.bfloat16), 0, 6, 1, 12)
    assert x[1, 2:5].tolist() == [5.0, 5.0, 5.0]
    del x
    gc.collect()
    np.testing.assert_array_equal(t.to_numpy().astype(np.float32), [[5, 5, 5], [14, 15, 16]])


def test_a_window_of_a_users_numpy_cache_arrives_by_the_schedulers_copy_with_later_writes() -> None:
    """K of 2 streams x 16 cells x (2 heads x 8) lives in the user's array; the window of the first
    6 cells of each stream, read by a dup on the stand-in device, arrives by the scheduler's copy."""
    head_dim, n_head, kv_size, ns, n_kv = 8, 2, 16, 2, 6
    k_user = np.random.default_rng(1).standard_normal((ns, kv_size, n_head * head_dim)).astype(np.float16)
    k = ferry.from_array(k_user, name="k_user")  # [n_embd, kv_size, ns]
    es = k.type.size
    window = k.view([head_dim, n_head, n_kv, ns], [es, head_dim * es, k.nb[1], k.nb[2]], name="win")
    window = window.permute(0, 2, 1, 3)  # [head_dim, n_kv, n_head, ns]
    out = ferry.ops.dup(window, name="out").set_output()
    dev, cpu = ferry.StandinBackend(), ferry.CPUBackend()
    sched = ferry.Scheduler([dev, cpu])
    sched.assign(out, dev)
    for policy in ("flat", "ranges"):
        sched.policy = policy
        sched.compute(ferry.Graph(out))
        assert len(sched.inputs) == 1
        want = k_user[:, :n_kv].reshape(ns, n_kv, n_head, head_dim).transpose(0, 2, 1, 3)
        np.testing.assert_array_equal(out.to_numpy(), want)
    k_user[1, 0, :] = 0  # the user's write, seen by the next step
    sched.compute(ferry.Graph(out))
    assert (out.to_numpy()[1, :, 0, :] == 0).all()


# ------------------------------------------------------------ CUDA


def cuda_tensor(values: np.ndarray) -> ferry.Tensor:
    return ferry.Tensor.from_numpy(ferry.CUDABackend(), values, name="dev")


@needs_device
def test_cuda_tensor_refuses_host_protocols_and_speaks_cuda_ones() -> None:
    t = cuda_tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    for exporter in (np.asarray, lambda t: t.__array_interface__, lambda t: np.asarray(t.raw())):
        with pytest.raises(ferry.UnsupportedError, match="device memory of CUDA0, which the host cannot read"):
            exporter(t)
    cai = t.__cuda_array_interface__
    assert cai["shape"] == (3, 4) and cai["strides"] == (16, 4) and cai["typestr"] == "<f4"
    assert cai["data"] == (t.address, False)
    assert t.__dlpack_device__() == (2, 0)
    with pytest.raises((RuntimeError, BufferError, TypeError)):  # numpy refuses the device; the capsule is freed
        np.from_dlpack(t)
    assert settled() == 0


class CudaArray:
    """A minimal producer of __cuda_array_interface__, as CuPy and PyTorch are."""

    def __init__(self, cai: dict) -> None:
        self.__cuda_array_interface__ = cai


@needs_device
def test_from_array_over_cuda_memory_reads_and_writes_it_in_place() -> None:
    """Device memory another library owns (here ferry's own, through the interface): a tensor over
    it reads and writes in place, and holds its owner."""
    owner = cuda_tensor(np.arange(32, dtype=np.float32).reshape(4, 8))
    cai = dict(owner.__cuda_array_interface__, shape=(2, 8), strides=(64, 4))  # rows 0 and 2
    t = ferry.from_array(CudaArray(cai), name="rows")
    assert t.nb[:2] == (4, 64) and not t.buffer.is_host
    np.testing.assert_array_equal(t.to_numpy(), np.arange(32, dtype=np.float32).reshape(4, 8)[::2])
    t.set_2d(np.full(8, -1, np.float32), 0, 32, 1, 64)
    assert (owner.to_numpy()[0] == -1).all()
    with pytest.raises(ferry.InvalidArgumentError, match="not memory of CUDA0"):
        ferry.from_array(CudaArray(dict(cai, data=(np.zeros(16, np.float32).ctypes.data, False))))


@needs_device
@needs_torch
def test_torch_cuda_tensors_and_ferry_share_device_memory_both_ways() -> None:
    if FAKE_CUDART or not torch.cuda.is_available():
        pytest.skip("this PyTorch cannot use the GPU (a CPU wheel, or the fake runtime)")
    t = cuda_tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    tt = torch.as_tensor(t, device="cuda")  # __cuda_array_interface__
    td = torch.from_dlpack(t)
    assert tt.data_ptr() == td.data_ptr() == t.address
    td[0, 0] = 42.0
    torch.cuda.synchronize()
    assert t.to_numpy()[0, 0] == 42.0
    del t
    gc.collect()
    assert tt[2, 3].item() == 11.0
    x = torch.arange(16, device="cuda", dtype=torch.float16).reshape(4, 4)
    torch.cuda.synchronize()
    u = ferry.from_array(x[:, 1:3])
    np.testing.assert_array_equal(u.to_numpy(), x[:, 1:3].cpu().numpy())


@needs_device
def test_cupy_arrays_and_ferry_share_device_memory_both_ways() -> None:
    cupy = pytest.importorskip("cupy")
    if FAKE_CUDART:
        pytest.skip("CuPy needs a real device")
    t = cuda_tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    c = cupy.asarray(t)  # __cuda_array_interface__
    assert c.data.ptr == t.address and c.strides == (16, 4)
    c[0, 0] = 42.0
    cupy.cuda.runtime.deviceSynchronize()
    assert t.to_numpy()[0, 0] == 42.0
    x = cupy.arange(16, dtype=cupy.float32).reshape(4, 4)
    cupy.cuda.runtime.deviceSynchronize()
    u = ferry.from_array(x[:, 1:3])  # DLPack
    np.testing.assert_array_equal(u.to_numpy(), cupy.asnumpy(x[:, 1:3]))


@pytest.mark.skipif(not os.environ.get("FERRY_FAKE_CUDART"), reason="the fake runtime's own check")
def test_fake_runtime_device_memory_never_read_by_the_host() -> None:
    t = cuda_tensor(np.ones(8, np.float32))
    with pytest.raises(ferry.UnsupportedError):
        np.asarray(t)


def test_importing_ferry_adds_no_collector_callback_and_the_first_dlpack_export_does() -> None:
    """The collector's callback that lets go of consumed DLPack exports costs every collection of a
    program; it comes with the first export, not with `import ferry`."""
    code = ("import gc; before = len(gc.callbacks)\n"
            "import numpy as np, ferry\n"
            "print(len(gc.callbacks) - before)\n"
            "t = ferry.Tensor.from_numpy(ferry.CPUBackend(), np.ones(4, np.float32))\n"
            "a = np.from_dlpack(t); a = np.from_dlpack(t)\n"
            "print(len(gc.callbacks) - before)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["0", "1"], done.stderr
