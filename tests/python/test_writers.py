"""Every public writer of user data into ferry memory takes data through the one check of dtype,
shape and size: data of the wrong dtype, shape or size is refused with a FerryError that says
which, and nothing is written."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import pytest

import ferry
from conftest import SENTINEL

# An f16 tensor [8, 4] (numpy shape (4, 8): 4 rows of 8 values, 64 bytes) and one stream of an
# f16 KV cache with head_dim 4, n_head_kv 2 and 4 cells per stream (numpy shape (4, 8), 64 bytes).
ROWS, COLS = 4, 8

#: The wrong data for each fault, and a word its message must hold. Wrong dtype: as many bytes, the
#: same shape (int16), or the issue's float32 array of as many bytes. Wrong shape: the right dtype
#: and bytes, transposed. Wrong size: more rows than the target has.
WRONG: Dict[str, List[Tuple[Any, str]]] = {
    "dtype": [(np.ones((ROWS, COLS), np.int16), "int16"),
              (np.ones((ROWS, COLS // 2), np.float32), "float32")],
    "shape": [(np.ones((COLS, ROWS), np.float16), "shaped")],
    "size": [(np.ones((ROWS + 1, COLS), np.float16), "bytes"),
             (np.ones(ROWS * COLS + 1, np.float16), "bytes")],
}
CASES = [(fault, data, word) for fault, items in WRONG.items() for data, word in items]


def _tensor(backend: ferry.Backend) -> ferry.Tensor:
    t = backend.alloc_tensor("f16", [COLS, ROWS], name="t")
    t.buffer.clear(SENTINEL)
    return t


def _set(t: ferry.Tensor, data: Any) -> None:
    t.set(data)


def _set_2d(t: ferry.Tensor, data: Any) -> None:
    t.set_2d(data, 0, COLS * 2, ROWS, COLS * 2)


def _set_async(t: ferry.Tensor, data: Any) -> None:
    b = t.buffer.backend
    assert b is not None
    b.set_async(t, data)
    b.synchronize()


def _set_2d_async(t: ferry.Tensor, data: Any) -> None:
    b = t.buffer.backend
    assert b is not None
    b.set_2d_async(t, data, 0, COLS * 2, ROWS, COLS * 2)
    b.synchronize()


def _backend_set_2d(t: ferry.Tensor, data: Any) -> None:
    b = t.buffer.backend
    assert b is not None
    b.set_2d(t, data, 0, COLS * 2, ROWS, COLS * 2)


TENSOR_WRITERS: Dict[str, Callable[[ferry.Tensor, Any], None]] = {
    "Tensor.set": _set, "Tensor.set_2d": _set_2d, "Backend.set_async": _set_async,
    "Backend.set_2d_async": _set_2d_async, "Backend.set_2d": _backend_set_2d,
}


@pytest.mark.parametrize("writer", list(TENSOR_WRITERS))
@pytest.mark.parametrize("fault,data,word", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_tensor_writers_refuse_wrong_data(real_backend: ferry.Backend, writer: str, fault: str, data: Any,
                                          word: str) -> None:
    t = _tensor(real_backend)
    with pytest.raises(ferry.FerryError, match=word):
        TENSOR_WRITERS[writer](t, data)
    assert t.get() == bytes([SENTINEL]) * t.nbytes  # nothing written


@pytest.mark.parametrize("writer", list(TENSOR_WRITERS))
def test_tensor_writers_take_right_data(real_backend: ferry.Backend, writer: str) -> None:
    """The check refuses only what is wrong: the right dtype and shape, flat values and raw bytes pass."""
    values = np.arange(ROWS * COLS, dtype=np.float16).reshape(ROWS, COLS)
    for data in (values, values.reshape(-1), values.view(np.uint8), values.tobytes()):
        t = _tensor(real_backend)
        TENSOR_WRITERS[writer](t, data)
        np.testing.assert_array_equal(t.to_numpy(), values)


def _stream_cases(want: Tuple[int, int]) -> List[Tuple[str, Any, str]]:
    """WRONG's faults for a stream shaped want."""
    rows, cols = want
    return [("dtype", np.ones(want, np.int16), "int16"), ("dtype", np.ones((rows, cols // 2), np.float32), "float32"),
            ("shape", np.ones((cols, rows), np.float16), "shaped"),
            ("size", np.ones((rows + 1, cols), np.float16), "bytes"), ("size", np.ones(rows * cols - 1, np.float16), "bytes")]


@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("case", range(5))
def test_set_stream_refuses_wrong_data(case: int, v_trans: bool) -> None:
    kv = ferry.KVCache("f16", "f16", head_dim=4, n_head_kv=2, n_ctx=2 * ROWS, n_stream=2, v_trans=v_trans)
    kv.buffer.clear(SENTINEL)
    which = "v" if v_trans else "k"
    want = (COLS, ROWS) if v_trans else (ROWS, COLS)  # a transposed V stream is [n_embd_gqa, kv_size]
    _, data, word = _stream_cases(want)[case]
    with pytest.raises(ferry.FerryError, match=word):
        kv.set_stream(which, 0, 1, data)
    assert kv.get_stream(which, 0, 1) == bytes([SENTINEL]) * (ROWS * COLS * 2)  # nothing written
    ok = np.arange(ROWS * COLS, dtype=np.float16).reshape(want)
    kv.set_stream(which, 0, 1, ok)
    assert kv.get_stream(which, 0, 1) == ok.tobytes()


def test_from_numpy_refuses_wrong_data(cpu: ferry.CPUBackend) -> None:
    """from_numpy makes the tensor it writes, so what it refuses it refuses before allocating."""
    with pytest.raises(ferry.UnsupportedError, match="float64"):  # dtype
        ferry.Tensor.from_numpy(cpu, np.zeros(4))
    with pytest.raises(ferry.InvalidArgumentError, match="5 dimensions"):  # shape
        ferry.Tensor.from_numpy(cpu, np.zeros((1, 1, 1, 1, 2), np.float32))
    with pytest.raises(ferry.LayoutError):  # size: 31 values are not whole q8_0 blocks
        ferry.Tensor.from_numpy(cpu, np.zeros(31, np.float32), type="q8_0")


def test_set_takes_what_raw_returns(cpu: ferry.CPUBackend, dummy_real: ferry.DummyBackend) -> None:
    """t.set(u.raw()) writes u's bytes: raw() and set are counterparts, block types and views too."""
    for ty, values in (("f16", np.arange(32, dtype=np.float32).reshape(4, 8)),
                       ("q8_0", np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32))):
        u = ferry.Tensor.from_numpy(cpu, values, type=ty)
        t = dummy_real.alloc_tensor(ty, list(u.ne), name="t")
        t.set(u.raw())
        assert t.get() == u.get()
    u = ferry.Tensor.from_numpy(cpu, np.arange(32, dtype=np.float16).reshape(4, 8))
    half = u.view([4, 4], [2, 16], offset=8)  # a strided view: raw() gives its rows, packed
    t = cpu.alloc_tensor("f16", [4, 4], name="t")
    t.set(half.raw())
    np.testing.assert_array_equal(t.to_numpy(), half.to_numpy())
    t.buffer.clear(SENTINEL)
    with pytest.raises(ferry.InvalidArgumentError, match="f32"):  # another type's bytes
        t.set(ferry.Tensor.from_numpy(cpu, np.zeros((2, 4), np.float32)).raw())
    with pytest.raises(ferry.FerryError, match="shaped"):  # rows of another length
        t.set(ferry.Tensor.from_numpy(cpu, np.zeros((2, 8), np.float16)).raw())
    assert t.get() == bytes([SENTINEL]) * t.nbytes
