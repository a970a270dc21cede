"""Type names, block and row sizes, nbytes and strides of every type, and their numpy dtypes."""

from __future__ import annotations

import pytest

import ferry
from conftest import TYPES


@pytest.mark.parametrize("name,size,blck", TYPES)
def test_each_type_has_its_name_size_and_block_size_both_ways(name: str, size: int, blck: int) -> None:
    t = ferry.to_type(name)
    assert str(t) == name and ferry.to_type(t).type_name == name
    assert ferry.to_type(name).size == size and ferry.to_type(name).blck_size == blck
    assert ferry.to_type(int(t)) is t


@pytest.mark.parametrize("name,size,blck", TYPES)
def test_a_row_is_whole_blocks_of_the_types_size(name: str, size: int, blck: int) -> None:
    for n in (0, 32, 64, 128, 1024, 4096):
        assert ferry.row_size(name, n) == n // blck * size


@pytest.mark.parametrize("name,size,blck", [t for t in TYPES if t[2] > 1])
def test_row_size_of_partial_block_is_a_layout_error(name: str, size: int, blck: int) -> None:
    with pytest.raises(ferry.LayoutError, match="whole number"):
        ferry.row_size(name, blck + 1)


@pytest.mark.parametrize("name,size,blck", TYPES)
def test_a_new_tensors_strides_and_nbytes_are_whole_rows(name: str, size: int, blck: int) -> None:
    t = ferry.Tensor.new(name, [64, 3, 2, 5])
    row = 64 // blck * size
    assert t.ne == (64, 3, 2, 5)
    assert t.nb == (size, row, 3 * row, 6 * row)
    assert t.nbytes == 30 * row
    assert t.row_size == row
    assert t.type == ferry.to_type(name)
    assert t.is_contiguous and not t.is_view


def test_each_type_has_its_numpy_dtype_and_block_types_none() -> None:
    import numpy as np

    assert ferry.Type.F32.numpy_dtype == np.float32
    assert ferry.to_type("f16").numpy_dtype == np.float16
    assert ferry.Type.I32.numpy_dtype == np.int32
    assert ferry.to_type(np.float16) == ferry.to_type(np.dtype("float16")) == ferry.Type.F16
    import ml_dtypes

    assert ferry.Type.BF16.numpy_dtype == ml_dtypes.bfloat16  # numpy has none of its own
    assert ferry.to_type(ml_dtypes.bfloat16) == ferry.Type.BF16
    for name in ("q8_0", "q4_0"):
        with pytest.raises(ferry.UnsupportedError, match=f"{name} has no numpy dtype"):
            _ = ferry.to_type(name).numpy_dtype
    with pytest.raises(ferry.UnsupportedError, match="numpy dtype float64 has no ferry type"):
        ferry.to_type(np.float64)
    with pytest.raises(ferry.UnknownTypeError):
        ferry.to_type("float16")  # a string is ferry's name: one spelling per type
