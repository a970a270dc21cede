"""Backends and buffer types: which backend uses which buffer type, buffer usage, host or not, and the
dummy backend (synthetic addresses, alignment, max buffer size; transfers counted, not done)."""

from __future__ import annotations

import pytest

import ferry
from conftest import pattern


@pytest.mark.parametrize("alignment", [16, 64, 4096, 1 << 20])
def test_synthetic_placements_respect_alignment(alignment: int) -> None:
    backend = ferry.DummyBackend(alignment=alignment)
    assert backend.alignment == alignment and backend.buffer_type.alignment == alignment
    buf = backend.alloc_buffer(8 * alignment)
    assert buf.base % alignment == 0 and buf.base != 0
    for k in range(4):
        t = buf.new_tensor("f32", [alignment // 4], offset=k * alignment)
        assert t.address == buf.base + k * alignment
        assert t.address % alignment == 0
    if alignment > 1:
        with pytest.raises(ferry.InvalidArgumentError, match=f"alignment {alignment}"):
            buf.new_tensor("f32", [1], offset=alignment // 2)


def test_alignment_must_be_a_power_of_two() -> None:
    with pytest.raises(ferry.InvalidArgumentError, match="alignment 48 is not a power of two"):
        ferry.DummyBackend(alignment=48)
    assert ferry.DummyBackend(alignment=0).alignment == 64  # 0 means the default


def test_max_buffer_size_is_respected() -> None:
    backend = ferry.DummyBackend(max_buffer_size=1 << 20)
    assert backend.max_buffer_size == 1 << 20
    assert backend.alloc_buffer(1 << 20).size == 1 << 20
    with pytest.raises(ferry.OutOfMemoryError, match=r"1048577 bytes exceed Dummy\(synthetic\)'s max buffer size 1048576"):
        backend.alloc_buffer((1 << 20) + 1)
    with pytest.raises(ferry.OutOfMemoryError):
        backend.alloc_tensor("f32", [1 << 18, 2])
    assert ferry.DummyBackend().max_buffer_size is None


def test_real_memory_buffers_respect_alignment_and_max_size() -> None:
    backend = ferry.DummyBackend(real_memory=True, alignment=256, max_buffer_size=4096)
    bufs = [backend.alloc_buffer(n) for n in (1, 300, 4096)]
    assert all(b.base % 256 == 0 for b in bufs)
    with pytest.raises(ferry.OutOfMemoryError):
        backend.alloc_buffer(4097)


def test_synthetic_buffers_are_distinct_and_do_not_overlap() -> None:
    backend = ferry.DummyBackend()
    a, b = backend.alloc_buffer(3 << 30), backend.alloc_buffer(1 << 30)
    assert a.base + a.size <= b.base or b.base + b.size <= a.base
    assert a.id != b.id


def test_full_scale_cache_transfers_are_checked_and_counted_not_done() -> None:
    """A 2-stream q8_0 cache at -c 32768, 32 layers' worth: no memory behind it, every byte counted."""
    backend = ferry.DummyBackend()
    cache = backend.alloc_tensor("q8_0", [1024, 16384, 2 * 32], name="cache")
    assert cache.nbytes == 1088 * 16384 * 64 and not cache.buffer.is_host
    row, n_kv = 1088, 2176
    backend.set_2d_async(cache, bytes(n_kv * row * 2), 0, n_kv * row, 2, 16384 * row)
    backend.synchronize()
    s = cache.buffer.stats
    assert s.bytes["set_2d"] == 2 * n_kv * row and s.impl_calls["set_2d"] == 1
    assert cache.get(0, 16) == bytes(16)  # nothing behind it: reads give zeros
    with pytest.raises(ferry.OutOfBoundsError):  # but the bounds are still checked
        backend.set_2d_async(cache, bytes(n_kv * row * 2), 64 * 16384 * row - n_kv * row + 1, n_kv * row, 2,
                             16384 * row)
    assert repr(cache).endswith("in Dummy(synthetic) buffer>")


def test_synthetic_writes_do_not_land() -> None:
    t = ferry.DummyBackend().alloc_tensor("i32", [8])
    t.set(pattern(32))
    assert t.get() == bytes(32)
    assert t.buffer.stats.bytes["set"] == 32 and t.buffer.stats.bytes["get"] == 32


def test_a_backend_supports_its_own_buffer_type_and_no_other() -> None:
    cpu, dummy = ferry.CPUBackend(), ferry.DummyBackend(real_memory=True)
    assert cpu.buffer_type == ferry.cpu_buffer_type() and cpu.buffer_type.is_host
    assert dummy.buffer_type.name == "Dummy" and not dummy.buffer_type.is_host
    assert ferry.DummyBackend().buffer_type.name == "Dummy(synthetic)"
    assert cpu.supports_buffer_type(ferry.cpu_buffer_type())
    assert not cpu.supports_buffer_type(dummy.buffer_type)
    assert dummy.supports_buffer_type(dummy.buffer_type)
    assert not dummy.supports_buffer_type(ferry.DummyBackend(real_memory=True).buffer_type)
    assert cpu.has_2d and not ferry.DummyBackend(has_2d=False).has_2d


def test_a_buffer_takes_a_known_usage_and_refuses_another(cpu: ferry.CPUBackend) -> None:
    buf = cpu.alloc_buffer(100)
    assert buf.size == 100 and buf.is_host and buf.usage == "any"
    buf.usage = "weights"
    assert buf.usage == "weights"
    with pytest.raises(ferry.InvalidArgumentError, match="'scratch' is not one of any, weights, compute"):
        buf.usage = "scratch"
    assert buf.usage == "weights"


def test_a_dummy_is_host_memory_only_when_asked() -> None:
    host = ferry.DummyBackend(is_host=True)
    assert host.is_host and host.buffer_type.is_host and host.alloc_buffer(64).is_host
    assert not ferry.DummyBackend().buffer_type.is_host
