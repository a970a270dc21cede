"""Decode attention (ferry.ops.attn_decode) against a float64 numpy reference, on the CPU backend,
on the stand-in device through the Scheduler under every copy policy, and on CUDA when present.

The reference is computed from the raw bytes of the KV cache read back (q8_0 dequantized here:
per 34-byte block an f16 scale then 32 int8), and every cell the op must not read (the gaps
between streams, cells at or past a stream's length, streams outside the window) holds NaN,
so a read of any of them shows as NaN in the output.
"""

from __future__ import annotations

import gc
import math
import weakref
from dataclasses import dataclass, replace
from typing import Tuple

import numpy as np
import pytest

import ferry

CUDA = ferry.cuda_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")

Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", 32)])  # one q8_0 block: 34 bytes
TOL = 2e-6  # what the C tests hold the kernels to, relative to 1 + |value|


@dataclass(frozen=True)
class Case:
    """A cache of n_stream streams of kv_size cells, the window of n_kv cells of streams s0..s1,
    and per window stream a length (clamped to 0..n_kv by the op)."""

    type_k: str
    type_v: str
    v_trans: bool = False
    head_dim: int = 64
    n_head_kv: int = 2
    group: int = 4  # query heads per KV head
    n_stream: int = 4
    kv_size: int = 24
    n_kv: int = 20
    s0: int = 0
    lens: Tuple[int, ...] = (20, 7, 0, 13)
    scale: float | None = None
    seed: int = 0

    @property
    def ns(self) -> int:
        return len(self.lens)

    @property
    def n_head(self) -> int:
        return self.n_head_kv * self.group

    @property
    def n_embd(self) -> int:
        return self.head_dim * self.n_head_kv

    def length(self, si: int) -> int:
        return min(max(self.lens[si], 0), self.n_kv)


def _encode(rng: np.random.Generator, type_: str, valid: np.ndarray, n_embd: int, trans: bool) -> bytes:
    """Random values for the cells marked valid (shape [kv_size]), NaN for the rest, as the
    bytes of one stream: rows of n_embd per cell, or channel rows of kv_size when trans."""
    kv_size = valid.shape[0]
    if type_ == "q8_0":
        blocks = np.zeros((kv_size, n_embd // 32), Q8_0)
        sign = rng.choice([-1.0, 1.0], size=blocks.shape)
        blocks["d"] = (sign * rng.uniform(2.0 ** -9, 2.0 ** -7, size=blocks.shape)).astype(np.float16)
        blocks["qs"] = rng.integers(-127, 128, size=(kv_size, n_embd // 32, 32))
        blocks["d"][~valid] = np.float16("nan")
        return blocks.tobytes()
    dtype = np.float32 if type_ == "f32" else np.float16
    values = rng.uniform(-1.0, 1.0, size=(kv_size, n_embd)).astype(dtype)
    values[~valid] = np.nan
    return (values.T if trans else values).tobytes()


def _decode(raw: bytes, type_: str, kv_size: int, n_embd: int, trans: bool) -> np.ndarray:
    """The float64 values of one stream's bytes, shaped [kv_size, n_embd]."""
    if type_ == "q8_0":
        blocks = np.frombuffer(raw, Q8_0).reshape(kv_size, n_embd // 32)
        values = blocks["d"].astype(np.float64)[..., None] * blocks["qs"].astype(np.float64)
        return values.reshape(kv_size, n_embd)
    dtype = np.dtype("<f4") if type_ == "f32" else np.dtype("<f2")
    flat = np.frombuffer(raw, dtype).astype(np.float64)
    return flat.reshape(n_embd, kv_size).T if trans else flat.reshape(kv_size, n_embd)


@dataclass
class Built:
    """A filled cache, its window, the query and lengths, and the reference output [ns, n_head, head_dim]."""

    kv: ferry.KVCache
    k: ferry.Tensor
    v: ferry.Tensor
    q: np.ndarray  # float32 [ns, n_head, head_dim]
    lens: np.ndarray  # int32 [ns]
    ref: np.ndarray  # float64 [ns, n_head, head_dim]


def build(c: Case) -> Built:
    rng = np.random.default_rng(c.seed)
    kv = ferry.KVCache(c.type_k, c.type_v, c.head_dim, c.n_head_kv, c.kv_size * c.n_stream, c.n_stream,
                       v_trans=c.v_trans)
    assert kv.kv_size == c.kv_size
    k_vals, v_vals = [], []
    for s in range(c.n_stream):
        si = s - c.s0
        valid = np.zeros(c.kv_size, bool)
        if 0 <= si < c.ns:
            valid[:c.length(si)] = True
        kv.set_stream("k", 0, s, _encode(rng, c.type_k, valid, c.n_embd, False))
        kv.set_stream("v", 0, s, _encode(rng, c.type_v, valid, c.n_embd, c.v_trans))
        k_vals.append(_decode(kv.get_stream("k", 0, s), c.type_k, c.kv_size, c.n_embd, False))
        v_vals.append(_decode(kv.get_stream("v", 0, s), c.type_v, c.kv_size, c.n_embd, c.v_trans))
    k, v = kv.window(0, c.n_kv, c.s0, c.s0 + c.ns - 1)
    q = rng.uniform(-1.0, 1.0, size=(c.ns, c.n_head, c.head_dim)).astype(np.float32)
    lens = np.array(c.lens, np.int32)
    scale = 1.0 / math.sqrt(c.head_dim) if c.scale is None else c.scale
    scale = float(np.float32(scale))  # the op keeps it as an f32
    ref = np.zeros((c.ns, c.n_head, c.head_dim))
    for si in range(c.ns):
        n = c.length(si)
        if n == 0:
            continue
        for h in range(c.n_head):
            ch = slice(h // c.group * c.head_dim, (h // c.group + 1) * c.head_dim)
            kk, vv = k_vals[c.s0 + si][:n, ch], v_vals[c.s0 + si][:n, ch]
            scores = scale * (kk @ q[si, h].astype(np.float64))
            p = np.exp(scores - scores.max())
            ref[si, h] = (p / p.sum()) @ vv
    assert np.isfinite(ref).all()
    return Built(kv, k, v, q, lens, ref)


def _operands(b: Built, backend: ferry.Backend) -> Tuple[ferry.Tensor, ferry.Tensor]:
    q = ferry.Tensor.from_numpy(backend, b.q.reshape(b.q.shape[0], 1, *b.q.shape[1:]), name="q")
    return q, ferry.Tensor.from_numpy(backend, b.lens, name="kv_len")


def run_cpu(c: Case, b: Built) -> np.ndarray:
    """attn_decode on the CPU backend, reading the cache in place; [ns, n_head, head_dim] float32."""
    cpu = ferry.CPUBackend()
    q, lens = _operands(b, cpu)
    out = ferry.ops.attn_decode(q, b.k, b.v, lens, scale=c.scale, v_trans=c.v_trans, name="attn").set_output()
    assert out.type == ferry.Type.F32 and out.ne == (c.head_dim, c.n_head, 1, c.ns)
    graph = ferry.Graph(out)
    galloc = ferry.GraphAllocator(cpu)
    galloc.alloc(graph)
    graph.compute(cpu)
    return out.to_numpy().reshape(c.ns, c.n_head, c.head_dim)


def run_sched(c: Case, b: Built, split: ferry.Backend, policy: str) -> Tuple[np.ndarray, ferry.stats.SchedStats]:
    """attn_decode assigned to split through a Scheduler([split, cpu]): K, V, q and kv_len are
    copied in by policy."""
    cpu = ferry.CPUBackend()
    q, lens = _operands(b, cpu)
    out = ferry.ops.attn_decode(q, b.k, b.v, lens, scale=c.scale, v_trans=c.v_trans, name="attn").set_output()
    graph = ferry.Graph(out)
    sched = ferry.Scheduler([split, cpu], policy=policy)
    sched.assign(out, split)
    sched.compute(graph)
    assert sched.backend_of(out) is split
    got = out.to_numpy().reshape(c.ns, c.n_head, c.head_dim)
    return got, sched.stats


def assert_close(got: np.ndarray, ref: np.ndarray) -> None:
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert np.isfinite(got).all(), "the op read a cell it must not (NaN reached the output)"
    err = np.abs(got.astype(np.float64) - ref) / (1.0 + np.abs(ref))
    assert err.max() <= TOL, f"max error {err.max():.3g} over {TOL}"


CASES = [
    Case("f32", "f32"),
    Case("f16", "f16"),
    Case("q8_0", "q8_0"),
    Case("f32", "f32", v_trans=True),
    Case("f16", "f16", v_trans=True),
    Case("q8_0", "f16", v_trans=True, seed=5),
    # a window of streams 2..4 of 6, lengths past n_kv and below 0 clamped, explicit scale, MHA
    Case("f16", "q8_0", n_stream=6, s0=2, lens=(99, -3, 1), scale=0.3, group=1, seed=1),
    Case("q8_0", "q8_0", head_dim=32, n_head_kv=4, group=2, n_stream=8, kv_size=8, n_kv=8, s0=3,
         lens=(8, 3, 5, 0, 1), seed=2),
    Case("f16", "f16", v_trans=True, n_stream=5, s0=1, n_kv=24, lens=(24, 11, 2), seed=3),
]
IDS = [f"{c.type_k}-{c.type_v}{'-vT' if c.v_trans else ''}-s0{c.s0}-ns{c.ns}" for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_cpu_matches_numpy(case: Case) -> None:
    b = build(case)
    got = run_cpu(case, b)
    assert_close(got, b.ref)
    for si in range(case.ns):  # length 0: exactly zero, not merely small
        if case.length(si) == 0:
            assert not got[si].any()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_standin_through_scheduler_every_policy_byte_identical(case: Case) -> None:
    b = build(case)
    want = run_cpu(case, b)
    row_k = ferry.row_size(case.type_k, case.n_embd)
    outs = {}
    for policy in ("flat", "ranges", "plan"):
        got, st = run_sched(case, b, ferry.StandinBackend(), policy)
        assert st.n_inputs == 4  # K, V, q and kv_len all arrive by copy
        outs[policy] = got.tobytes()
        if policy == "ranges" and not case.v_trans:
            # K and V each move exactly the cells the window reads (plus q and kv_len)
            small = case.ns * case.n_head * case.head_dim * 4 + case.ns * 4
            row_v = ferry.row_size(case.type_v, case.n_embd)
            assert st.bytes_copied == case.ns * case.n_kv * (row_k + row_v) + small
    assert outs["flat"] == outs["ranges"] == outs["plan"] == want.tobytes()


@needs_cuda
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_cuda_matches_numpy_every_policy(case: Case) -> None:
    b = build(case)
    cpu = run_cpu(case, b)
    outs = {}
    for policy in ("flat", "ranges", "plan"):
        got, _ = run_sched(case, b, ferry.CUDABackend(), policy)
        assert_close(got, b.ref)
        assert (np.abs(got.astype(np.float64) - cpu) / (1.0 + np.abs(cpu))).max() <= TOL
        outs[policy] = got.tobytes()
    assert outs["flat"] == outs["ranges"] == outs["plan"]


def test_same_bytes_in_same_bytes_out() -> None:
    c = Case("q8_0", "q8_0", seed=7)
    b = build(c)
    assert run_cpu(c, b).tobytes() == run_cpu(c, b).tobytes()


def test_default_scale_is_one_over_sqrt_head_dim() -> None:
    c = Case("f32", "f32", seed=8)
    b = build(c)
    explicit = run_cpu(replace(c, scale=1.0 / math.sqrt(c.head_dim)), b)
    assert run_cpu(c, b).tobytes() == explicit.tobytes()
    assert run_cpu(replace(c, scale=0.5), b).tobytes() != explicit.tobytes()


@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("where", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_scores_that_overflow_give_the_overflowed_cells_the_weight(where: str, v_trans: bool) -> None:
    """A scale so large that scale * q.k overflows f32 (a finite scale the op takes): the cells whose
    scores reached +inf share the weight equally, the limit of a growing scale in f32, and the others
    none; the output is their V's mean, finite (inf - inf in the softmax once made it NaN: tools/fuzz)."""
    head_dim, cells = 32, 6
    # q.k per cell, exact in f32: 16, 64, -32, 64, 0.5, then 0.5 (scaled by 1e38: inf, inf, -inf, inf, 5e37, 5e37)
    per = np.array([0.5, 2.0, -1.0, 2.0, 2.0 ** -6, 2.0 ** -6])
    kv = ferry.KVCache("f32", "f32", head_dim, 1, cells, 1, v_trans=v_trans)
    kv.set_stream("k", 0, 0, np.repeat(per[:, None], head_dim, axis=1).astype(np.float32).tobytes())
    values = np.random.default_rng(0).uniform(-1, 1, (cells, head_dim)).astype(np.float32)
    kv.set_stream("v", 0, 0, (values.T if v_trans else values).tobytes())
    k, v = kv.window(0, cells)
    backend = ferry.CPUBackend() if where == "cpu" else ferry.CUDABackend()
    q = ferry.Tensor.from_numpy(ferry.CPUBackend(), np.ones((1, 1, 1, head_dim), np.float32))
    lens = ferry.Tensor.from_numpy(ferry.CPUBackend(), np.array([cells], np.int32))
    out = ferry.ops.attn_decode(q, k, v, lens, scale=1e38, v_trans=v_trans).set_output()
    graph = ferry.Graph(out)
    if where == "cpu":
        ferry.GraphAllocator(backend).alloc(graph)
        graph.compute(backend)
    else:
        sched = ferry.Scheduler([backend, ferry.CPUBackend()])
        sched.assign(out, backend)
        sched.compute(graph)
    got = out.to_numpy().reshape(head_dim)
    want = values[[0, 1, 3]].astype(np.float64).mean(axis=0)
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() <= TOL * 4


# ------------------------------------------------------------ bad input


@pytest.fixture
def parts() -> Tuple[ferry.Tensor, ...]:
    """q, k, v (untransposed), kv_len of a small f16 case, on the CPU."""
    c = Case("f16", "f16")
    b = build(c)
    q, lens = _operands(b, ferry.CPUBackend())
    return q, b.k, b.v, lens


def test_v_trans_must_match_the_shape(parts: Tuple[ferry.Tensor, ...]) -> None:
    q, k, v, lens = parts
    plain = v.view(list(v.ne), v.nb)  # a view of the window's layout, not the window a cache made
    with pytest.raises(ferry.LayoutError, match=r"attn_decode: v .*\(v_trans\)"):
        ferry.ops.attn_decode(q, k, plain, lens, v_trans=True)


@pytest.mark.parametrize("v_trans", [False, True])
def test_a_caches_window_says_how_its_v_lies(v_trans: bool) -> None:
    """With n_kv == head_dim both layouts give V the same shape, so attention takes the layout from
    the cache's V window: a v_trans that disagrees is refused naming v_trans (it used to read the V
    of a transposed cache as not transposed, and give other outputs), and none gives the cache's."""
    c = Case("f32", "f32", v_trans=v_trans, head_dim=32, kv_size=32, n_kv=32, lens=(32, 7, 0, 13))
    b = build(c)
    assert b.v.ne[0] == b.v.ne[1] == 32  # the shape fits both layouts
    cpu = ferry.CPUBackend()
    q, lens = _operands(b, cpu)
    with pytest.raises(ferry.InvalidArgumentError,
                       match=rf"attn_decode: v_trans={not v_trans}, but v is the V window of a KV cache whose V is "
                             rf"{'' if v_trans else 'not '}transposed \(v_trans={v_trans}\)"):
        ferry.ops.attn_decode(q, b.k, b.v, lens, v_trans=not v_trans)
    out = ferry.ops.attn_decode(q, b.k, b.v, lens).set_output()  # v_trans left out: the window's
    graph = ferry.Graph(out)
    ferry.GraphAllocator(cpu).alloc(graph)
    graph.compute(cpu)
    assert_close(out.to_numpy().reshape(c.ns, c.n_head, c.head_dim), b.ref)


def test_bad_shapes_and_types_raise_layout_error(parts: Tuple[ferry.Tensor, ...]) -> None:
    q, k, v, lens = parts
    cpu = ferry.CPUBackend()
    with pytest.raises(ferry.LayoutError, match="attn_decode: kv_len"):
        ferry.ops.attn_decode(q, k, v, ferry.Tensor.from_numpy(cpu, np.zeros(4, np.float32)))
    with pytest.raises(ferry.LayoutError, match="attn_decode: kv_len"):
        ferry.ops.attn_decode(q, k, v, ferry.Tensor.from_numpy(cpu, np.zeros(3, np.int32)))
    with pytest.raises(ferry.LayoutError, match="attn_decode: q"):
        ferry.ops.attn_decode(ferry.Tensor.from_numpy(cpu, np.zeros((4, 1, 8, 64), np.float16)), k, v, lens)
    with pytest.raises(ferry.LayoutError, match="do not group over 2 kv heads"):
        ferry.ops.attn_decode(ferry.Tensor.from_numpy(cpu, np.zeros((4, 1, 3, 64), np.float32)), k, v, lens)
    with pytest.raises(ferry.LayoutError, match="attn_decode: v"):
        ferry.ops.attn_decode(q, k, k.view([64, 19, 2, 4], k.nb), lens)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), 1e39, "0.5", True])
def test_bad_scale_raises_invalid_argument(parts: Tuple[ferry.Tensor, ...], scale: object) -> None:
    q, k, v, lens = parts
    with pytest.raises(ferry.InvalidArgumentError, match="attn_decode: scale"):
        ferry.ops.attn_decode(q, k, v, lens, scale=scale)  # type: ignore[arg-type]


def test_non_tensors_and_non_bool_v_trans_raise_invalid_argument(parts: Tuple[ferry.Tensor, ...]) -> None:
    q, k, v, lens = parts
    with pytest.raises(ferry.InvalidArgumentError, match="attn_decode: v: expected a Tensor"):
        ferry.ops.attn_decode(q, k, None, lens)  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgumentError, match="attn_decode: v_trans must be a bool or None"):
        ferry.ops.attn_decode(q, k, v, lens, v_trans=1)  # type: ignore[arg-type]


def test_result_keeps_its_sources_alive() -> None:
    c = Case("f16", "f16", seed=9)
    b = build(c)
    cpu = ferry.CPUBackend()
    q, lens = _operands(b, cpu)
    out = ferry.ops.attn_decode(q, b.k, b.v, lens).set_output()
    cache = weakref.ref(b.kv)
    assert out.srcs == (q, b.k, b.v, lens)
    ref = b.ref
    del q, lens, b
    gc.collect()
    assert cache() is not None  # the window, and so the cache, lives as long as out
    graph = ferry.Graph(out)
    galloc = ferry.GraphAllocator(cpu)
    galloc.alloc(graph)
    graph.compute(cpu)
    assert_close(out.to_numpy().reshape(c.ns, c.n_head, c.head_dim), ref)


def test_standin_backend_uses_only_its_own_memory() -> None:
    standin, cpu = ferry.StandinBackend(), ferry.CPUBackend()
    assert standin.name == "CPU (stand-in device)" and standin.has_2d
    assert not standin.supports_buffer_type(ferry.cpu_buffer_type())
    assert standin.supports_buffer_type(standin.buffer_type)
    assert not cpu.supports_buffer_type(standin.buffer_type)
