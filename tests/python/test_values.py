"""Values of every type: q8_0 and q4_0 against references written here from the block formats'
definition (ggml's round-to-nearest), bf16 against ml_dtypes, and the type check that keeps
a float32 array from being written, as bytes, into an f16 cache."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import ferry

QK = 32


def test_ml_dtypes_is_imported_only_for_bf16() -> None:
    """Importing ml_dtypes takes about a second: `import ferry`, every command and f16 values go
    without it (a bench worker process starts that much faster); the first bf16 dtype brings it."""
    code = ("import sys, numpy as np, ferry, ferry.cli, ferry.workloads.bench\n"
            "t = ferry.Tensor.from_numpy(ferry.CPUBackend(), np.ones(4, np.float16)); t.to_numpy(); ferry.to_type(np.float32)\n"
            "print('ml_dtypes' in sys.modules)\n"
            "print(ferry.Type.BF16.numpy_dtype == ferry.to_type(ferry.Type.BF16.numpy_dtype).numpy_dtype, 'ml_dtypes' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "True", "True"], done.stderr


def f16_bytes(d: np.ndarray) -> np.ndarray:
    return d.astype(np.float16).view(np.uint8).reshape(-1, 2)


def round_away(v: np.ndarray) -> np.ndarray:
    """C's roundf: halves away from zero (numpy's round goes to even). In float64, exactly."""
    v64 = v.astype(np.float64)
    return np.sign(v64) * np.floor(np.abs(v64) + 0.5)


def inverse(d: np.ndarray) -> np.ndarray:
    out = np.zeros_like(d)
    np.divide(np.float32(1), d, out=out, where=d != 0)
    return out


def ref_q8_0(x: np.ndarray) -> bytes:
    """Blocks of 32: the f16 scale d = amax / 127, then int8 q = round(x * (1 / d)), computed in f32."""
    b = x.astype(np.float32).reshape(-1, QK)
    d = (np.abs(b).max(axis=1) / np.float32(127)).astype(np.float32)
    q = round_away(b * inverse(d)[:, None]).astype(np.int8)
    return np.concatenate([f16_bytes(d), q.view(np.uint8)], axis=1).tobytes()


def ref_q4_0(x: np.ndarray) -> bytes:
    """Blocks of 32: m the value of largest magnitude (the first of equals), sign kept; the f16
    scale d = m / -8; q = min(15, trunc(x * (1 / d) + 8.5)); byte j: value j low, value j + 16 high."""
    b = x.astype(np.float32).reshape(-1, QK)
    m = b[np.arange(len(b)), np.argmax(np.abs(b), axis=1)]
    d = (m / np.float32(-8)).astype(np.float32)
    v = (b * inverse(d)[:, None]).astype(np.float32) + np.float32(8.5)
    q = np.minimum(15, np.trunc(v)).astype(np.uint8)
    nibbles = q[:, :16] | (q[:, 16:] << 4)
    return np.concatenate([f16_bytes(d), nibbles], axis=1).tobytes()


def ref_dequant(raw: bytes, type: str) -> np.ndarray:
    size = 34 if type == "q8_0" else 18
    blocks = np.frombuffer(raw, np.uint8).reshape(-1, size)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    if type == "q8_0":
        q = blocks[:, 2:].view(np.int8).astype(np.float32)
    else:
        lo, hi = blocks[:, 2:] & 0x0F, blocks[:, 2:] >> 4
        q = np.concatenate([lo, hi], axis=1).astype(np.float32) - 8
    return (q * d).reshape(-1)


def sample(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32) * rng.choice([1e-3, 1.0, 40.0], n // QK).repeat(QK)
    x[:QK] = 0  # an all-zero block: d = 0
    x[QK:2 * QK] = np.linspace(-8, 8, QK)  # halves and ties of magnitude
    x[2 * QK + 3] = -x[2 * QK:3 * QK].__abs__().max() - 1  # a negative largest magnitude
    x[3 * QK:4 * QK] = np.r_[127.0, np.arange(31) - 15.5]  # q8_0's d = 1: exact halves, rounded away from 0
    return x


@pytest.mark.parametrize("type, ref", [("q8_0", ref_q8_0), ("q4_0", ref_q4_0)])
def test_quantize_matches_the_reference(type: str, ref) -> None:
    x = sample(32 * 64, seed=3)
    got = ferry.quantize(x, type)
    assert got.tobytes() == ref(x)
    np.testing.assert_array_equal(ferry.dequantize(got, type), ref_dequant(ref(x), type))


@pytest.mark.parametrize("type, ref", [("q8_0", ref_q8_0), ("q4_0", ref_q4_0)])
def test_round_trip_through_the_scheduler(type: str, ref) -> None:
    """Quantize on the host, let the scheduler copy a window of rows to the stand-in device, where
    a dup reads it; the bytes that arrive are the reference's, and so are their values."""
    x = sample(8 * 128, seed=7).reshape(8, 128)  # 8 rows of 4 blocks
    cpu, dev = ferry.CPUBackend(), ferry.StandinBackend()
    q = ferry.Tensor.from_numpy(cpu, x, type=type, name="q")
    assert q.get() == ref(x)
    rows = q.view([128, 3], [q.type.size, 2 * q.nb[1]], q.nb[1], name="rows 1, 3, 5")
    out = ferry.ops.dup(rows, name="out").set_output()
    sched = ferry.Scheduler([dev, cpu], policy="plan")
    sched.assign(out, dev)
    sched.compute(ferry.Graph(out))
    assert len(sched.inputs) == 1 and sched.backend_of(out) is dev
    want_bytes = ref(x[1:6:2])
    assert out.get() == want_bytes
    np.testing.assert_array_equal(out.to_numpy(), ref_dequant(want_bytes, type).reshape(3, 128))
    np.testing.assert_array_equal(rows.to_numpy(), ref_dequant(want_bytes, type).reshape(3, 128))
    assert out.raw().__class__ is ferry.export.TensorBytes  # its bytes stay available


def test_bf16_values_match_ml_dtypes() -> None:
    cpu = ferry.CPUBackend()
    x = np.array([1.0, -2.5, 3.14159, 1e-40, 65504.0, 1e38, -0.0, 1.0 / 3.0], np.float32)
    t = ferry.Tensor.from_numpy(cpu, x, type="bf16")
    want = x.astype(ml_dtypes.bfloat16)
    assert t.get() == want.tobytes()
    got = t.to_numpy()
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    u = ferry.Tensor.from_numpy(cpu, want)  # bf16 arrays are bf16 tensors
    assert u.type == ferry.Type.BF16 and u.get() == want.tobytes()
    f = ferry.Tensor.from_numpy(cpu, x[:5], type="f16")  # C's rounding, as numpy's
    assert f.get() == x[:5].astype(np.float16).tobytes()


def test_quantize_refusals_write_nothing() -> None:
    cpu = ferry.CPUBackend()
    with pytest.raises(ferry.LayoutError, match="33 values is not a whole number of q8_0 blocks"):
        ferry.quantize(np.zeros(33, np.float32), "q8_0")
    with pytest.raises(ferry.InvalidArgumentError, match="value 5 is nan"):
        ferry.quantize(np.r_[np.zeros(5), np.nan, np.zeros(26)], "q4_0")
    with pytest.raises(ferry.InvalidArgumentError, match="values are <U1"):
        ferry.quantize(np.array(list("ab")), "f16")
    with pytest.raises(ferry.UnsupportedError, match="i32 holds integers"):
        ferry.dequantize(b"\0" * 8, "i32")
    with pytest.raises(ferry.LayoutError):  # ne[0] = 48 is not whole blocks: refused before anything is made
        ferry.Tensor.from_numpy(cpu, np.zeros((2, 48), np.float32), type="q8_0")


def test_writing_another_type_is_refused(cpu: ferry.CPUBackend) -> None:
    kv = ferry.KVCache("f16", "f16", head_dim=8, n_head_kv=2, n_ctx=16, n_stream=2)
    K = kv.k(0)
    K.set(np.arange(K.nelements, dtype=np.float16))
    before = K.get()
    cases = [
        (lambda: K.set(np.ones(K.nelements // 2, np.float32)), "tensor_set: data is a float32 array but 'cache_k_l0' holds f16"),
        (lambda: K.set_2d(np.ones(8, np.int32), 0, 16, 2, 32), "tensor_set_2d: data is a int32 array"),
        (lambda: cpu.set_async(K, np.ones(4, np.float64)), "set_async: data is a float64 array"),
        (lambda: cpu.set_2d_async(K, np.ones(8, ml_dtypes.bfloat16), 0, 8, 2, 32), "set_2d_async: data is a bfloat16"),
        (lambda: K.set(memoryview(np.ones(4, np.float32))), "data is a float32 array"),
    ]
    for call, why in cases:
        with pytest.raises(ferry.InvalidArgumentError, match=why):
            call()
        assert K.get() == before  # nothing written
    q = cpu.alloc_tensor("q8_0", [64], name="q")
    with pytest.raises(ferry.InvalidArgumentError, match="holds q8_0; convert the values"):
        q.set(np.zeros(64, np.float32))
    # raw bytes stay allowed: bytes, bytearray, uint8 arrays
    K.set(bytes(8))
    K.set(np.zeros(8, np.uint8), offset=8)
    K.set(np.zeros(4, np.float16), offset=16)
    assert K.get()[:24] == bytes(24)
    q.set(ferry.quantize(np.full(64, 127.0, np.float32), "q8_0"))  # d = 1 exactly
    np.testing.assert_array_equal(q.to_numpy(), np.full(64, 127.0, np.float32))


@pytest.fixture
def cpu() -> ferry.CPUBackend:
    return ferry.CPUBackend()


@pytest.mark.parametrize("type", ["q8_0", "q4_0"])
def test_pack_blocks_reads_back_as_q_times_scale(type: str) -> None:
    rng = np.random.default_rng(7)
    lo, hi = (-128, 128) if type == "q8_0" else (-8, 8)
    q = rng.integers(lo, hi, size=(3, 64))
    scales = rng.uniform(0.01, 0.1, size=(3, 2)).astype(np.float16)
    packed = ferry.quant.pack_blocks(scales, q, type)
    assert packed.nbytes == 6 * ferry.to_type(type).size
    expected = (q.reshape(6, 32) * scales.reshape(6, 1).astype(np.float32)).reshape(-1)
    assert (ferry.dequantize(packed, type) == expected.astype(np.float32)).all()


def test_pack_blocks_refuses_values_that_do_not_fit_naming_why() -> None:
    q = np.zeros(64, np.int64)
    with pytest.raises(ferry.InvalidArgumentError, match="1 scales for 2 blocks"):
        ferry.quant.pack_blocks([1.0], q, "q8_0")
    with pytest.raises(ferry.InvalidArgumentError, match="8 bits"):
        ferry.quant.pack_blocks([1.0, 1.0], q + 200, "q8_0")
    with pytest.raises(ferry.InvalidArgumentError, match="-8..7"):
        ferry.quant.pack_blocks([1.0, 1.0], q + 8, "q4_0")
    with pytest.raises(ferry.LayoutError):
        ferry.quant.pack_blocks([1.0], q[:40], "q8_0")
    with pytest.raises(ferry.UnsupportedError, match="not a block type"):
        ferry.quant.pack_blocks([1.0], q, "f16")
