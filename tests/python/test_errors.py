"""Bad input from Python raises a FerryError subclass with a useful message, changes nothing, and
the interpreter goes on."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import ferry
from conftest import SENTINEL, pattern
from ferry._binding import lib


@pytest.fixture
def t(cpu: ferry.CPUBackend) -> ferry.Tensor:
    """A 48-byte f32 tensor full of the sentinel."""
    t = cpu.alloc_tensor("f32", [4, 3], name="t")
    t.buffer.clear(SENTINEL)
    return t


def unchanged(t: ferry.Tensor) -> bool:
    return t.get() == bytes([SENTINEL]) * t.nbytes


def test_every_error_is_a_ferry_error() -> None:
    for cls in (ferry.InvalidArgumentError, ferry.OutOfBoundsError, ferry.NotAllocatedError, ferry.LayoutError,
                ferry.UnknownTypeError, ferry.FreedBufferError, ferry.OutOfMemoryError, ferry.UnsupportedError,
                ferry.BackendError):
        assert issubclass(cls, ferry.FerryError)


# ------------------------------------------------------------ out of bounds


def test_a_set_past_the_end_is_out_of_bounds_and_writes_nothing(t: ferry.Tensor) -> None:
    with pytest.raises(ferry.OutOfBoundsError, match=r"16 bytes at offset 40 reach past the 48 bytes of 't'") as e:
        t.set(pattern(16), offset=40)
    assert e.value.status == lib.FERRY_ERR_OUT_OF_BOUNDS
    assert unchanged(t)
    t.set(pattern(8), offset=40)  # the edge itself is fine, and we are still alive
    assert t.get(40, 8) == pattern(8)


def test_a_get_or_memset_past_the_end_is_out_of_bounds(t: ferry.Tensor) -> None:
    with pytest.raises(ferry.OutOfBoundsError, match="reach past"):
        t.get(40, 9)
    with pytest.raises(ferry.OutOfBoundsError):
        t.get(49)
    with pytest.raises(ferry.OutOfBoundsError):
        t.memset(0, 47, 2)
    assert unchanged(t)


def test_huge_reads_refused_before_python_allocates(t: ferry.Tensor, cpu: ferry.CPUBackend) -> None:
    """A read whose output Python would allocate first: a size past the tensor is its
    OutOfBoundsError (not MemoryError or OverflowError from bytearray), and an output too
    large to hold is an OutOfMemoryError."""
    with pytest.raises(ferry.OutOfBoundsError, match=r"1099511627776 bytes at offset 0 reach past the 48 bytes"):
        t.get(0, 2**40)
    with pytest.raises(ferry.InvalidArgumentError, match="not a valid size"):
        t.get(0, 2**63)
    with pytest.raises(ferry.OutOfBoundsError, match=r"4294967296 rows of 4 bytes at offset 0, stride 4,"):
        t.get_2d(0, 4, 2**32, 4, 16)
    with pytest.raises(ferry.LayoutError, match=r"strides \(tensor 0, data 16\) are smaller than the row of 4"):
        t.get_2d(0, 4, 2**32, 0, 16)
    with pytest.raises(ferry.OutOfBoundsError, match="reach past"):
        cpu.get_2d(t, 2**32, 8, 2**32, 39)
    with pytest.raises(ferry.OutOfMemoryError, match=r"2 rows of 4 bytes at a stride_data of 4611686018427387904: a "
                       r"result of 4611686018427387908 bytes, .* is more than the \d+ bytes of memory available"):
        t.get_2d(0, 4, 2, 4, 2**62)  # the rows fit the tensor; the packed output cannot exist
    with pytest.raises(ferry.NotAllocatedError):
        ferry.Tensor.new("f32", [4]).get(0, 2**40)
    huge = ferry.DummyBackend().alloc_tensor("f32", [2**60])  # synthetic: 2^62 bytes of nothing
    with pytest.raises(ferry.OutOfMemoryError, match=r"to_numpy: a result of 4611686018427387904 bytes is more than"):
        huge.to_numpy()
    assert unchanged(t) and t.get(0, 4) == bytes([SENTINEL]) * 4


# In a process of its own whose address space may grow by 4 GiB: a read whose rows fit a 384-byte
# tensor but whose output, at a stride of 2^32, is 21.5 GB. Zero-filled, then copied into the
# bytes returned, it had the kernel kill the process (tools/fuzz); with the limit, the old code's
# bytearray failed at once, with a refusal that named neither the rows nor the stride.
HUGE_STRIDE_READS = """
import resource, ferry
with open("/proc/self/statm") as f:
    used = int(f.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + (4 << 30), resource.getrlimit(resource.RLIMIT_AS)[1]))
cpu = ferry.CPUBackend()
t = cpu.alloc_tensor("f32", [96])
for read in (lambda: t.get_2d(0, 4, 6, 64, 2**32), lambda: cpu.get_2d(t, 0, 4, 6, 64, 2**32)):
    try:
        read()
        print("read")
    except ferry.FerryError as e:
        print(type(e).__name__, e)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="the address-space limit is set from /proc")
def test_a_2d_read_whose_output_memory_cannot_hold_is_refused_naming_its_rows_and_stride() -> None:
    out = subprocess.run([sys.executable, "-c", HUGE_STRIDE_READS], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 2, out.stdout
    for line, call in zip(lines, ("tensor_get_2d", "get_2d")):
        assert line.startswith(f"OutOfMemoryError {call}: 6 rows of 4 bytes at a stride_data of 4294967296: a result "
                               "of 21474836484 bytes, held 2 times while it is made (42949672968 bytes), is more than "
                               "the "), line
        assert line.endswith(("give a smaller stride_data, or an out to read into",
                              "give a smaller stride_data, or read into memory of yours with get_2d_async")), line
    avail = ferry._pybuffer.memory_available()  # here, without a limit: the system's memory
    assert 0 < avail < 2**60


def test_2d_rows_past_the_end_are_out_of_bounds(t: ferry.Tensor, cpu: ferry.CPUBackend) -> None:
    # rows at 0, 20, 40 of 10 bytes: the last ends at 50 > 48
    with pytest.raises(ferry.OutOfBoundsError, match=r"3 rows of 10 bytes at offset 0, stride 20"):
        t.set_2d(pattern(30), 0, 10, 3, 20)
    with pytest.raises(ferry.OutOfBoundsError, match="rows of"):
        t.get_2d(0, 10, 3, 20)
    with pytest.raises(ferry.OutOfBoundsError, match="rows of"):
        cpu.set_2d_async(t, pattern(30), 0, 10, 3, 20)
    with pytest.raises(ferry.OutOfBoundsError, match="rows of"):
        cpu.get_2d(t, 0, 10, 3, 20)
    assert unchanged(t)


def test_2d_data_shorter_than_its_rows_is_out_of_bounds(t: ferry.Tensor, cpu: ferry.CPUBackend) -> None:
    """C cannot see a Python object's length; the binding checks it."""
    with pytest.raises(ferry.OutOfBoundsError, match=r"the data holds 29 bytes but the transfer needs 30"):
        t.set_2d(pattern(29), 0, 10, 3, 16)
    with pytest.raises(ferry.OutOfBoundsError, match="needs 50"):
        t.set_2d(pattern(40), 0, 10, 3, 16, stride_data=20)
    with pytest.raises(ferry.OutOfBoundsError, match="needs 30"):
        cpu.set_2d_async(t, pattern(29), 0, 10, 3, 16)
    with pytest.raises(ferry.OutOfBoundsError, match="needs 30"):
        t.get_2d(0, 10, 3, 16, out=bytearray(29))
    with pytest.raises(ferry.OutOfBoundsError, match="needs 30"):
        cpu.get_2d_async(t, bytearray(29), 0, 10, 3, 16)
    assert unchanged(t)


def test_2d_strides_smaller_than_the_row_are_a_layout_error(t: ferry.Tensor, cpu: ferry.CPUBackend) -> None:
    with pytest.raises(ferry.LayoutError, match="smaller than the row"):
        t.set_2d(pattern(30), 0, 10, 3, 8)
    with pytest.raises(ferry.LayoutError, match="smaller than the row"):
        cpu.set_2d_async(t, pattern(30), 0, 10, 3, 16, stride_data=5)
    assert unchanged(t)


# ------------------------------------------------------------ negative and overflowing sizes


@pytest.mark.parametrize("call", [
    pytest.param(lambda t, b: t.set(b"x", offset=-1), id='set offset'),
    pytest.param(lambda t, b: t.get(-1), id='get offset'),
    pytest.param(lambda t, b: t.get(0, -4), id='get size'),
    pytest.param(lambda t, b: t.memset(0, -1), id='memset offset'),
    pytest.param(lambda t, b: t.memset(256), id='memset value'),
    pytest.param(lambda t, b: t.set_2d(b"x" * 8, 0, 4, -2, 8), id='set_2d n_copies'),
    pytest.param(lambda t, b: t.set_2d(b"x" * 8, 0, -4, 2, 8), id='set_2d size'),
    pytest.param(lambda t, b: t.get_2d(0, 4, 2, -8), id='get_2d stride_tensor'),
    pytest.param(lambda t, b: t.get_2d(0, 4, 2, 8, stride_data=-1), id='get_2d stride_data'),
    pytest.param(lambda t, b: b.set_2d_async(t, b"x" * 8, -1, 4, 2, 8), id='backend set_2d offset'),
    pytest.param(lambda t, b: b.get_2d(t, 0, 4, 2, -8), id='backend get_2d stride'),
    pytest.param(lambda t, b: b.alloc_buffer(-1), id='alloc_buffer size'),
    pytest.param(lambda t, b: t.view([4], offset=-4), id='view offset'),
    pytest.param(lambda t, b: t.view([2, 2], [4, -8]), id='view stride'),
    pytest.param(lambda t, b: t.buffer.place(ferry.Tensor.new("f32", [1]), -64), id='place offset'),
    pytest.param(lambda t, b: ferry.DummyBackend(alignment=-1), id='dummy alignment'),
    pytest.param(lambda t, b: ferry.DummyBackend(max_buffer_size=-1), id='dummy max size'),
])
def test_a_negative_size_or_offset_is_an_invalid_argument(t: ferry.Tensor, cpu: ferry.CPUBackend, call) -> None:
    with pytest.raises(ferry.InvalidArgumentError, match="negative|not a byte"):
        call(t, cpu)
    assert unchanged(t)


@pytest.mark.parametrize("call", [
    pytest.param(lambda t, b: t.set(b"x", offset=2**64), id='set offset'),
    pytest.param(lambda t, b: t.get(0, 2**64), id='get size'),
    pytest.param(lambda t, b: t.get_2d(0, 4, 2**70, 8), id='get_2d n_copies'),
    pytest.param(lambda t, b: b.set_2d_async(t, b"x", 0, 1, 1, 2**64), id='backend set_2d stride'),
    pytest.param(lambda t, b: b.alloc_buffer(2**64), id='alloc_buffer size'),
    pytest.param(lambda t, b: t.view([4], offset=2**65), id='view offset'),
    pytest.param(lambda t, b: ferry.Tensor.new("f32", [2**63]), id='tensor ne'),
    pytest.param(lambda t, b: t.permute(0, 1, 2, 2**40), id='permute axis'),
])
def test_a_size_overflowing_its_c_type_is_an_invalid_argument_not_overflow_error(t: ferry.Tensor, cpu: ferry.CPUBackend, call) -> None:
    """cffi would raise OverflowError; the binding raises FerryError first."""
    with pytest.raises(ferry.InvalidArgumentError, match="overflows"):
        call(t, cpu)
    assert unchanged(t)


def test_sizes_past_ferrys_limits_raise_cs_own_messages(t: ferry.Tensor, cpu: ferry.CPUBackend) -> None:
    """Sizes that fit size_t but not the tensor or ferry's limits: C's own checks and messages."""
    with pytest.raises(ferry.InvalidArgumentError, match="not a valid size"):
        t.set(b"x", offset=2**64 - 1)
    with pytest.raises(ferry.OutOfBoundsError, match="overflows"):
        ferry.Tensor.new("f32", [2**40, 2**40])
    with pytest.raises(ferry.InvalidArgumentError, match="is negative"):
        ferry.Tensor.new("f32", [4, -1])
    with pytest.raises(ferry.InvalidArgumentError, match="not a valid size"):
        cpu.alloc_buffer(2**63)
    with pytest.raises(ferry.OutOfBoundsError, match="reach past"):
        t.get_2d(0, 4, 2**62, 2**62, stride_data=0)  # no data needed; C finds the extent overflows
    assert unchanged(t)


def test_a_non_integer_size_offset_or_data_is_an_invalid_argument(t: ferry.Tensor) -> None:
    for call in (lambda: t.set(b"x", offset=1.5), lambda: t.get("0"), lambda: t.view([4.0]),
                 lambda: t.set("text"), lambda: ferry.Tensor.new("f32", 4), lambda: t.set(b"x", offset=True)):
        with pytest.raises(ferry.InvalidArgumentError):
            call()
    assert unchanged(t)


# ------------------------------------------------------------ views and layouts


def test_a_view_reaching_outside_its_source_is_out_of_bounds(t: ferry.Tensor) -> None:
    with pytest.raises(ferry.OutOfBoundsError, match="reaches past the 48 bytes of its source 't'"):
        t.view([4], offset=36)
    first = t.view([4])  # bytes 0..16 of t
    with pytest.raises(ferry.OutOfBoundsError, match="reaches past the 16 bytes"):
        first.view([4], offset=8)  # inside t, but past the view it is taken from
    with pytest.raises(ferry.OutOfBoundsError, match="reaches past"):
        t.view([4, 2], [4, 32], offset=8)  # rows at 8 and 40: ends at 56
    inner = t.view([4, 2], [4, 16], offset=16)  # the last 32 bytes
    with pytest.raises(ferry.OutOfBoundsError, match="reaches past"):
        inner.view([4], offset=20)  # 20 + 16 bytes: past inner's 32
    with pytest.raises(ferry.OutOfBoundsError, match="strides overflow"):
        t.view([2, 2], [4, 2**64 - 1])
    ok = inner.view([2], offset=24)
    ok.set(pattern(8))
    assert t.get(40, 8) == pattern(8)


def test_a_copy_between_different_layouts_is_a_layout_error(cpu: ferry.CPUBackend, t: ferry.Tensor) -> None:
    other = cpu.alloc_tensor("f32", [3, 4], name="other")
    other.set(pattern(48))
    with pytest.raises(ferry.LayoutError, match=r"'other' \(f32 \[3, 4, 1, 1\]\) and 't' \(f32 \[4, 3, 1, 1\]\)"):
        other.copy_to(t)
    with pytest.raises(ferry.LayoutError):
        other.copy_to(t.transpose())  # same ne, other strides
    with pytest.raises(ferry.LayoutError):
        cpu.copy_async(other, t)
    f16 = cpu.alloc_tensor("f16", [4, 3])
    with pytest.raises(ferry.LayoutError):
        f16.copy_to(t)
    assert unchanged(t)


def test_an_impossible_view_reshape_or_permute_says_why(t: ferry.Tensor) -> None:
    with pytest.raises(ferry.LayoutError, match="not contiguous"):
        t.transpose().reshape([12])
    with pytest.raises(ferry.LayoutError, match="12 elements cannot become 10"):
        t.reshape([10])
    with pytest.raises(ferry.LayoutError, match="nb\\[0\\] is 8"):
        t.view([2, 2], [8, 16])
    with pytest.raises(ferry.LayoutError, match="whole number"):
        ferry.Tensor.new("q8_0", [33])
    with pytest.raises(ferry.InvalidArgumentError, match="not a permutation"):
        t.permute(0, 0, 1, 2)
    with pytest.raises(ferry.InvalidArgumentError, match="4 axes"):
        t.permute(1, 0)
    with pytest.raises(ferry.InvalidArgumentError, match="1 to 4 dimensions"):
        ferry.Tensor.new("f32", [1, 1, 1, 1, 1])


def test_a_shape_or_strides_that_is_no_sequence_names_the_argument(t: ferry.Tensor) -> None:
    # a 0-d or 2-D array has a len() that raises or means something else: refused like any non-sequence
    for ne in (np.array(3), np.array([[4, 3]])):
        with pytest.raises(ferry.InvalidArgumentError, match="tensor_new: a shape is a sequence"):
            ferry.Tensor.new("f32", ne)
    with pytest.raises(ferry.InvalidArgumentError, match="view: 1 dimensions need 1 strides"):
        t.view([4], np.array(4))
    assert t.view(np.array([4]), np.array([4])).ne[0] == 4  # a 1-D array is a sequence


def test_an_unknown_type_name_or_number_is_an_unknown_type_error() -> None:
    with pytest.raises(ferry.UnknownTypeError, match=r"unknown type name 'f64' \(known: f32, f16"):
        ferry.Tensor.new("f64", [4])
    with pytest.raises(ferry.UnknownTypeError, match="unknown type 99"):
        ferry.to_type(99)
    with pytest.raises(ferry.UnknownTypeError, match="unknown type 6"):
        ferry.row_size(6, 32)
    with pytest.raises(ferry.UnknownTypeError):
        ferry.to_type("Q8_0")
    with pytest.raises(ferry.UnsupportedError, match="float64"):
        ferry.Tensor.from_numpy(ferry.CPUBackend(), np.zeros(3))
    with pytest.raises(ferry.UnsupportedError, match="q8_0 has no numpy dtype"):
        _ = ferry.to_type("q8_0").numpy_dtype  # its values are float32 (to_numpy), its bytes uint8 (raw)


# ------------------------------------------------------------ allocation and placement


def test_an_unallocated_tensor_raises_not_allocated_naming_it() -> None:
    t = ferry.Tensor.new("f32", [4], name="loose")
    assert not t.allocated and t.address is None and t.buffer is None
    with pytest.raises(ferry.NotAllocatedError, match="tensor 'loose' is not allocated"):
        t.set(pattern(4))
    with pytest.raises(ferry.NotAllocatedError):
        t.view([2]).get()
    with pytest.raises(ferry.NotAllocatedError):
        t.to_numpy()
    assert "unallocated" in repr(t)


def test_a_misaligned_or_overflowing_placement_is_refused(cpu: ferry.CPUBackend) -> None:
    buf = cpu.alloc_buffer(256)
    t = ferry.Tensor.new("f32", [16], name="p")
    with pytest.raises(ferry.InvalidArgumentError, match="not a multiple of the alignment 64"):
        buf.place(t, 32)
    with pytest.raises(ferry.OutOfBoundsError, match="'p' needs 64 bytes at offset 256 of a 256-byte buffer"):
        buf.place(t, 256)
    buf.place(t, 192)
    with pytest.raises(ferry.InvalidArgumentError, match="is a view"):
        buf.place(t.view([4]), 0)
    with pytest.raises(ferry.InvalidArgumentError):
        buf.place("not a tensor")
    assert t.address == buf.base + 192


def test_tensor_on_a_backend_that_cannot_use_its_buffer(cpu: ferry.CPUBackend, dummy_real: ferry.DummyBackend) -> None:
    t = cpu.alloc_tensor("f32", [16], name="host")
    with pytest.raises(ferry.UnsupportedError, match="cannot use buffer type CPU of 'host'"):
        dummy_real.set_2d_async(t, pattern(16), 0, 8, 2, 16)


# ------------------------------------------------------------ freed buffers


def test_a_freed_buffer_refuses_every_use_until_the_tensor_is_placed_again(cpu: ferry.CPUBackend, t: ferry.Tensor) -> None:
    buf = t.buffer
    view = t.view([2, 2], [4, 16], offset=4)
    other = cpu.alloc_tensor("f32", [4, 3])
    buf.close()
    assert buf.closed and not t.allocated and t.address is None
    for call in (lambda: t.set(pattern(4)), lambda: t.get(), lambda: t.memset(0), lambda: view.get(),
                 lambda: t.set_2d(pattern(8), 0, 4, 2, 8), lambda: t.get_2d(0, 4, 2, 8), lambda: t.to_numpy(),
                 lambda: t.copy_to(other), lambda: other.copy_to(t),
                 lambda: cpu.set_2d_async(t, pattern(8), 0, 4, 2, 8), lambda: cpu.copy_async(other, t)):
        with pytest.raises(ferry.FreedBufferError, match="lies in a buffer that was freed"):
            call()
    for call in (lambda: buf.clear(), lambda: buf.place(ferry.Tensor.new("f32", [1])), lambda: buf.stats,
                 lambda: buf.base, lambda: buf.reset_stats()):
        with pytest.raises(ferry.FreedBufferError, match="was freed"):
            call()
    buf.close()  # a second close is a no-op
    assert "freed" in repr(buf) and "in freed CPU buffer" in repr(t)
    # the tensor can be given new memory, and works again
    fresh = cpu.alloc_buffer(64)
    fresh.place(t)
    t.set(pattern(48))
    assert view.to_numpy().tobytes() == pattern(48)[4:12] + pattern(48)[20:28]


# ------------------------------------------------------------ arguments of the wrong kind


@pytest.mark.parametrize("call", [
    lambda t, cpu: ferry.Tensor.new(-1, [4]),                      # cffi: negative enum -> OverflowError
    lambda t, cpu: ferry.to_type(-7),
    lambda t, cpu: ferry.row_size(-1, 4),
    lambda t, cpu: ferry.ops.op_name(-1),
    lambda t, cpu: t.view([4], 1.5),                               # len() of a float -> TypeError
    lambda t, cpu: ferry.plan.explain("f32", [4], None),
    lambda t, cpu: ferry.Scheduler([cpu]).compute(None),            # AttributeError
    lambda t, cpu: setattr(cpu.alloc_buffer(8), "usage", []),       # unhashable -> TypeError
    lambda t, cpu: ferry.to_type(np.dtype("float64")),             # a dtype ferry has no type for
    lambda t, cpu: ferry.to_type(1.5),
    lambda t, cpu: ferry.Tensor.from_numpy(None, np.zeros(2, np.float32)),  # AttributeError
    lambda t, cpu: ferry.KVCache("f32", "f32", 4, 1, 8, 2, v_trans=np.zeros(3)),  # ambiguous truth value
    lambda t, cpu: ferry.KVCache("f32", "f32", 4, 1, 8, 2, pinned=np.zeros(3)),
    lambda t, cpu: ferry.KVCache("f32", "f32", 4, 1, 8, 2).set_stream(np.zeros(3), 0, 0, b""),
    lambda t, cpu: ferry.Scheduler(np.zeros(3)),
    lambda t, cpu: ferry.plan.cost_model(np.zeros(3)),
    lambda t, cpu: ferry.plan.flat_cost(4, np.zeros(3)),
    lambda t, cpu: ferry.DummyBackend(real_memory=np.zeros(3)),
    lambda t, cpu: cpu.event(timing=np.zeros(3)),
])
def test_an_argument_of_the_wrong_kind_is_a_ferry_error_not_a_type_error(t: ferry.Tensor, cpu: ferry.CPUBackend, call) -> None:
    """Found by test_fuzz_api's type confusion: each raised TypeError, ValueError, AttributeError
    or OverflowError from cffi or numpy instead of a FerryError."""
    with pytest.raises(ferry.FerryError):
        call(t, cpu)
    assert unchanged(t)


def test_unknown_type_numbers_keep_c_messages() -> None:
    with pytest.raises(ferry.UnknownTypeError, match="unknown type -1"):
        ferry.to_type(-1)
    with pytest.raises(ferry.UnknownTypeError, match="unknown type 99"):
        ferry.to_type(99)
    with pytest.raises(ferry.InvalidArgumentError, match="unknown op -3"):
        ferry.ops.op_name(-3)
    assert ferry.to_type(5) == ferry.Type.Q4_0 and ferry.ops.op_name(5) == "add"
    assert ferry.KVCache("f32", "f32", 4, 1, 8, 2, v_trans=np.bool_(True)).params.v_trans


def test_to_numpy_of_a_shape_numpy_cannot_hold_is_out_of_memory(cpu: ferry.CPUBackend) -> None:
    """Views ferry allows whose values numpy cannot hold: an empty view with a dimension of 2^62
    (numpy's ValueError 'array is too big') and a broadcast one of 2^42 values in 8 bytes
    (numpy's MemoryError). Found by test_fuzz_api; both are OutOfMemoryError."""
    t = cpu.alloc_tensor("f16", [8], name="t")
    empty = t.view([2**62, 0], [2, 8])
    assert empty.nelements == 0 and empty.nbytes == 0
    with pytest.raises(ferry.OutOfMemoryError, match="numpy cannot hold"):
        empty.to_numpy()
    broadcast = t.view([4, 2**40], [2, 0])
    assert broadcast.nbytes == 8
    with pytest.raises(ferry.OutOfMemoryError, match="numpy cannot hold"):
        broadcast.to_numpy()
    assert t.view([4, 3], [2, 0]).to_numpy().shape == (3, 4)
