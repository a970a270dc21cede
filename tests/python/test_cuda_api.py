"""The CUDA objects of the Python API: present in every build, a FerryError without a device.

Tests marked needs_device run only where ferry.cuda_available() (a GPU machine); here they skip.
"""

from __future__ import annotations

import numpy as np
import pytest

import ferry
from conftest import SENTINEL, pattern

needs_device = pytest.mark.skipif(not ferry.cuda_available(), reason="no CUDA device")


def test_device_count_agrees_with_available() -> None:
    n = ferry.cuda_device_count()
    assert n >= 0 and (n > 0) == ferry.cuda_available()
    assert ferry.build_info()["cuda"] or n == 0


@pytest.mark.skipif(ferry.cuda_available(), reason="a CUDA device is present")
def test_cuda_backend_without_device_raises_cuda_message() -> None:
    expected = ferry.BackendError if ferry.build_info()["cuda"] else ferry.UnsupportedError
    with pytest.raises(expected) as e:
        ferry.CUDABackend()
    assert "cuda_backend_new" in e.value.message
    assert ("CUDA" in e.value.message) if ferry.build_info()["cuda"] else ("without CUDA" in e.value.message)
    with pytest.raises(ferry.FerryError):
        ferry.cuda_host_buffer_type()
    with pytest.raises(ferry.FerryError):
        ferry.cuda_buffer_type(0)
    with pytest.raises(ferry.FerryError):
        ferry.KVCache("f16", "f16", 32, 2, 64, 2, pinned=True)


def test_bad_cuda_arguments_are_ferry_errors() -> None:
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.CUDABackend("0")  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.CUDABackend(2**40)
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.cuda_buffer_type(-2**40)
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.KVCache("f16", "f16", 32, 2, 64, 2, backend=ferry.CPUBackend(), pinned=True)


def test_a_backend_without_events_refuses_them_as_ferry_errors() -> None:
    cpu = ferry.CPUBackend()
    with pytest.raises(ferry.UnsupportedError, match="no events"):
        cpu.event()
    with pytest.raises(ferry.InvalidArgumentError):
        cpu.wait("event")  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.Event.elapsed_ms(None, None)  # type: ignore[arg-type]


@needs_device
def test_a_2d_set_on_the_device_lands_rows_at_their_pitch_and_reads_back() -> None:
    cuda = ferry.CUDABackend(0)
    assert cuda.device == 0 and cuda.has_2d
    row, pitch, n = 1088, 4 * 1088, 5
    t = cuda.alloc_tensor("i32", [pitch * n // 4])
    t.memset(SENTINEL)
    src = pattern(row * n)
    cuda.set_2d(t, src, 0, row, n, pitch)
    got = t.get()
    for r in range(n):
        assert got[r * pitch:r * pitch + row] == src[r * row:(r + 1) * row]
        assert set(got[r * pitch + row:(r + 1) * pitch]) == {SENTINEL}
    assert cuda.get_2d(t, 0, row, n, pitch) == src


def _check_window_copy(got: bytes, src: bytes, ns: int, stride: int, used: int, gaps_kept: bool) -> None:
    for s in range(ns):
        assert got[s * stride:s * stride + used] == src[s * stride:s * stride + used], f"stream {s}"
        if gaps_kept and s + 1 < ns:
            assert set(got[s * stride + used:(s + 1) * stride]) == {SENTINEL}, f"gap after stream {s}"


@needs_device
@pytest.mark.parametrize("pinned", [False, True])
def test_ranges_to_a_cuda_split_copy_each_streams_cells_and_leave_the_gaps(pinned: bool) -> None:
    """docs/design.md's heart test on the copy path with CUDA as the split backend, host cache pageable or pinned."""
    cuda = ferry.CUDABackend(0)
    kv = ferry.KVCache("q8_0", "q8_0", 128, 8, 4 * 64, 4, pinned=pinned)
    assert kv.buffer.is_host
    src = pattern(kv.k(0).nbytes)
    kv.k(0).set(src)
    k, _ = kv.window(0, 40, 0, 3)
    row = 1088
    for policy in ("flat", "ranges"):
        dst = k.dup_layout()
        cuda.alloc_buffer_for(dst)
        dst.memset(SENTINEL)
        st = ferry.copy_path.copy_input(cuda, policy, k, dst)
        _check_window_copy(dst.get(), src, 4, 64 * row, 40 * row, gaps_kept=policy == "ranges")
        if policy == "ranges":
            assert (st.path, st.bytes_copied, st.copy_calls) == (ferry.CopyPolicy.RANGES, 4 * 40 * row, 1)
        else:
            assert st.bytes_copied == k.nbytes > st.bytes_read


@needs_device
def test_cudas_dup_of_a_scheduled_window_holds_each_streams_cells_under_each_policy() -> None:
    """The scheduler places the input copy in CUDA memory, copies it by policy, and CUDA's dup reads it
    through its own ne/nb: out holds each stream's cells, head by head, whatever the policy."""
    cpu, cuda = ferry.CPUBackend(), ferry.CUDABackend(0)
    kv = ferry.KVCache("q8_0", "q8_0", 128, 8, 4 * 64, 4, pinned=True)
    src = pattern(kv.k(0).nbytes)
    kv.k(0).set(src)
    k, _ = kv.window(0, 40, 0, 3)
    out = ferry.ops.dup(k, name="out").set_output()
    g = ferry.Graph(out)
    for policy in ("flat", "ranges"):
        sched = ferry.Scheduler([cuda, cpu], policy=policy)
        sched.assign(out, cuda)
        sched.alloc(g)
        (inp,) = sched.inputs
        assert inp.copy.buffer.type == cuda.buffer_type and sched.buffer_size(cuda) >= k.nbytes
        inp.copy.memset(SENTINEL)
        sched.compute(g)
        st = sched.stats
        # out = contiguous [head_dim (136 B of q8_0), cells, heads, streams] of the window
        want_out = np.frombuffer(src, np.uint8).reshape(4, 64, 8, 136)[:, :40].transpose(0, 2, 1, 3).tobytes()
        assert out.get() == want_out
        _check_window_copy(inp.copy.get(), src, 4, 64 * 1088, 40 * 1088, gaps_kept=policy == "ranges")
        want = 4 * 40 * 1088 if policy == "ranges" else k.nbytes
        assert st.bytes_copied == want and st.bytes_read == 4 * 40 * 1088


@needs_device
def test_events_order_and_time_work() -> None:
    cuda = ferry.CUDABackend(0)
    other = ferry.CUDABackend(0)
    start, end = cuda.event(timing=True), cuda.event(timing=True)
    t = cuda.alloc_tensor("f32", [1 << 20])
    start.record()
    cuda.set_async(t, np.ones(1 << 20, np.float32))
    end.record(cuda)
    other.wait(end)
    end.synchronize()
    ms = ferry.Event.elapsed_ms(start, end)
    assert ms >= 0.0
    np.testing.assert_array_equal(t.to_numpy(), np.ones(1 << 20, np.float32))
    with pytest.raises(ferry.FerryError):
        ferry.Event.elapsed_ms(cuda.event(), cuda.event())  # not timing events


@needs_device
def test_hold_delays_queued_work_and_rejects_bad_input() -> None:
    """The held stream runs what is queued behind the hold after it: at least the hold's time
    passes between two events around it, and the copy still arrives."""
    cuda = ferry.CUDABackend(0)
    start, end = cuda.event(timing=True), cuda.event(timing=True)
    t = cuda.alloc_tensor("f32", [1 << 16])
    start.record()
    cuda.hold(1500)
    cuda.set_async(t, np.full(1 << 16, 3.0, np.float32))
    end.record()
    end.synchronize()
    assert ferry.Event.elapsed_ms(start, end) >= 1.4  # cycles at the peak clock: never less than asked
    np.testing.assert_array_equal(t.to_numpy(), np.full(1 << 16, 3.0, np.float32))
    for bad in (-1, 2e6, float("nan")):
        with pytest.raises(ferry.InvalidArgumentError):
            cuda.hold(bad)
    with pytest.raises(ferry.InvalidArgumentError):
        cuda.hold("10")  # type: ignore[arg-type]


@needs_device
def test_a_fake_runtime_says_so_in_the_backend_name() -> None:
    """What ferry bench and validate print as the split backend: never a fake passing for a GPU."""
    name = ferry.CUDABackend(0).name
    assert name.startswith("CUDA0")
    assert ("fake CUDA runtime" in name) is ferry.build_info()["fake_cudart"]
