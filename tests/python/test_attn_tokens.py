"""Attention over several query tokens per stream (ferry.ops.attn_decode with q of n_tok tokens):
token t of stream s reads the stream's cells [0, len_s - n_tok + t], the step's new cells written
before it.

Random ragged windows, dense (KVCache) and paged (PagedKVCache), every type attention reads, V
transposed or not, n_tok 1..16, checked three ways: against a float64 numpy reference (and
PyTorch's scaled_dot_product_attention with the same mask, where torch is installed); token t
against a one-token step at length len_s - n_tok + t + 1, byte for byte (the kernel sums each
token in a one-token step's order); and byte for byte across copy policies, prefetching and
layouts through the scheduler (ferry.attention_step). Every cell the op must not read holds NaN.

Each check runs on the CPU kernel and, where a CUDA device is (the fake runtime's too), on the CUDA
kernel through the scheduler: its bytes are its own one-token steps' and the same under every
policy and layout, and within CUDA_TOL of the CPU's (its exp and its order of sums are the device's).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import ferry
from ferry.paged import PagedKVCache
from ferry.stats import SchedStats
from test_api_property import SCALE, SETTINGS

Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", 32)])  # one q8_0 block: 34 bytes
# Relative to 1 + |value|, as the issue asks: the f32 kernel's worst over 1,500 random cases of
# these sizes was 1.2e-7.
TOL = 1e-6
# The CUDA kernel against the CPU kernel, relative to 1 + |value| too: an output near 0 sums terms
# that cancel, so no bound relative to |value| alone holds for either against the other.
CUDA_TOL = 1e-5
HEAD_DIM = 32
BLOCK = 4  # cells per block of the paged caches
POLICIES = ["flat", "ranges", "ragged", "plan"]
# Where attention runs: the CPU kernel ("cpu": in place, or through the scheduler on the stand-in
# device, which runs the CPU's kernels), and the CUDA kernel where a device is.
CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not ferry.cuda_available(), reason="no CUDA device"))
DEVICES = ["cpu", CUDA]


@dataclass(frozen=True)
class Case:
    """A window of len(lens) streams of n_kv cells, n_tok query tokens per stream."""

    type_k: str
    type_v: str
    v_trans: bool
    n_head_kv: int
    group: int
    n_kv: int
    n_tok: int
    lens: Tuple[int, ...]  # each 0 (no part in the step) or n_tok..n_kv
    seed: int

    @property
    def ns(self) -> int:
        return len(self.lens)

    @property
    def n_head(self) -> int:
        return self.n_head_kv * self.group

    @property
    def n_embd(self) -> int:
        return HEAD_DIM * self.n_head_kv


@st.composite
def cases(draw: st.DrawFn) -> Case:
    type_k = draw(st.sampled_from(["f32", "f16", "q8_0"]))
    v_trans = draw(st.booleans())
    type_v = draw(st.sampled_from(["f32", "f16"] if v_trans else ["f32", "f16", "q8_0"]))
    n_tok = draw(st.integers(1, 16))
    n_kv = draw(st.integers(n_tok, 24))
    lens = draw(st.lists(st.one_of(st.just(0), st.integers(n_tok, n_kv)), min_size=1, max_size=4))
    return Case(type_k, type_v, v_trans, draw(st.integers(1, 2)), draw(st.integers(1, 3)), n_kv, n_tok, tuple(lens),
                draw(st.integers(0, 2**16)))


def _values(rng: np.random.Generator, type_: str, shape: Tuple[int, ...], n_embd: int,
            valid: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Random rows of n_embd values over shape (the cells), NaN where not valid: (their storage,
    uint8 bytes per row for q8_0, and their float64 values)."""
    if type_ == "q8_0":
        blocks = np.zeros(shape + (n_embd // 32,), Q8_0)
        sign = rng.choice([-1.0, 1.0], size=blocks.shape)
        blocks["d"] = (sign * rng.uniform(2.0 ** -9, 2.0 ** -7, size=blocks.shape)).astype(np.float16)
        blocks["qs"] = rng.integers(-127, 128, size=blocks.shape + (32,))
        blocks["d"][~valid] = np.float16("nan")
        exact = (blocks["d"].astype(np.float64)[..., None] * blocks["qs"].astype(np.float64)).reshape(shape + (n_embd,))
        return blocks.view(np.uint8).reshape(shape + (n_embd // 32 * 34,)), exact
    stored = rng.uniform(-1.0, 1.0, size=shape + (n_embd,)).astype(np.float32 if type_ == "f32" else np.float16)
    stored[~valid] = np.nan
    return stored, stored.astype(np.float64)


@dataclass
class Built:
    """One case's caches (dense and paged, the same values), queries and reference."""

    case: Case
    dense: ferry.KVCache
    paged: PagedKVCache
    q: np.ndarray  # float32 [ns, n_tok, n_head, head_dim]
    ref: np.ndarray  # float64, the same shape
    k64: np.ndarray  # float64 [ns, n_kv, n_embd], NaN past each length
    v64: np.ndarray

    @property
    def scale(self) -> float:
        return float(np.float32(1.0 / math.sqrt(HEAD_DIM)))  # the op's default, kept as an f32


def build(c: Case) -> Built:
    rng = np.random.default_rng(c.seed)
    valid = np.arange(c.n_kv)[None, :] < np.array(c.lens)[:, None]  # [ns, n_kv]
    k_store, k64 = _values(rng, c.type_k, (c.ns, c.n_kv), c.n_embd, valid)
    v_store, v64 = _values(rng, c.type_v, (c.ns, c.n_kv), c.n_embd, valid)
    # dense: a cache of n_kv + 3 cells a stream, its cells past the window NaN too
    pad = [(0, 0), (0, 3), (0, 0)]
    k_d = np.pad(k_store, pad, constant_values=0xFF if c.type_k == "q8_0" else np.nan)  # q8_0: f16 d = NaN
    v_d = np.pad(v_store, pad, constant_values=0xFF if c.type_v == "q8_0" else np.nan)
    if c.v_trans:
        v_d = np.ascontiguousarray(v_d.transpose(0, 2, 1))
    dense = ferry.KVCache.from_arrays([k_d], [v_d], n_stream=c.ns, v_trans=c.v_trans, type_k=c.type_k,
                                      type_v=c.type_v, n_head_kv=c.n_head_kv)
    # paged: each stream's blocks in a shuffled pool with a spare block, never read, of NaN
    per = -(-c.n_kv // BLOCK)
    n_blocks = c.ns * per + 1
    order = rng.permutation(n_blocks)
    k_pool = np.full((n_blocks, BLOCK) + k_store.shape[2:], 0xFF if c.type_k == "q8_0" else np.nan, k_store.dtype)
    v_pool = np.full((n_blocks, BLOCK) + v_store.shape[2:], 0xFF if c.type_v == "q8_0" else np.nan, v_store.dtype)
    tables: List[List[int]] = []
    for s in range(c.ns):
        ids = [int(b) for b in order[s * per:(s + 1) * per]]
        tables.append(ids)
        for i, blk in enumerate(ids):
            cells = slice(i * BLOCK, min((i + 1) * BLOCK, c.n_kv))
            n = cells.stop - cells.start
            k_pool[blk, :n], v_pool[blk, :n] = k_store[s, cells], v_store[s, cells]
    if c.v_trans:
        v_pool = np.ascontiguousarray(v_pool.reshape(n_blocks * BLOCK, c.n_embd).T)
    paged = PagedKVCache.from_arrays([k_pool], [v_pool], n_seq=c.ns, v_trans=c.v_trans, type_k=c.type_k,
                                           type_v=c.type_v, n_head_kv=c.n_head_kv)
    for s, ids in enumerate(tables):
        paged.set_table(s, ids, c.lens[s])
    q = rng.uniform(-1.0, 1.0, size=(c.ns, c.n_tok, c.n_head, HEAD_DIM)).astype(np.float32)
    b = Built(c, dense, paged, q, np.zeros(q.shape), k64, v64)
    b.ref = reference(b)
    return b


def reference(b: Built) -> np.ndarray:
    """float64, written from the definition: token t of stream s over cells [0, len - n_tok + t]."""
    c = b.case
    out = np.zeros(b.q.shape)
    for s in range(c.ns):
        if c.lens[s] == 0:
            continue
        for t in range(c.n_tok):
            n = c.lens[s] - c.n_tok + t + 1
            for h in range(c.n_head):
                ch = slice(h // c.group * HEAD_DIM, (h // c.group + 1) * HEAD_DIM)
                scores = b.scale * (b.k64[s, :n, ch] @ b.q[s, t, h].astype(np.float64))
                p = np.exp(scores - scores.max())
                out[s, t, h] = (p / p.sum()) @ b.v64[s, :n, ch]
    assert np.isfinite(out).all()
    return out


def run_cpu(b: Built, q: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """attn_decode on the CPU backend over the dense window in place: [ns, n_tok, n_head, head_dim]."""
    c, cpu = b.case, ferry.CPUBackend()
    k, v = b.dense.window(0, c.n_kv)
    qt = ferry.Tensor.from_numpy(cpu, q, name="q")
    kv_len = ferry.Tensor.from_numpy(cpu, lens.astype(np.int32), name="kv_len")
    out = ferry.ops.attn_decode(qt, k, v, kv_len, name="attn").set_output()
    assert out.ne == (HEAD_DIM, c.n_head, q.shape[1], c.ns)
    graph = ferry.Graph(out)
    ferry.GraphAllocator(cpu).alloc(graph)
    graph.compute(cpu)
    return out.to_numpy().reshape(c.ns, q.shape[1], c.n_head, HEAD_DIM)


def run_counted(b: Built, paged: bool, policy: str, prefetch: int = 0, device: str = "cpu",
                q: Optional[np.ndarray] = None, lens: Optional[np.ndarray] = None) -> Tuple[np.ndarray, SchedStats]:
    """ferry.attention_step over the dense or paged windows, on the stand-in device ("cpu") or on
    CUDA ("cuda"), its windows copied by policy; q [ns, n_tok, n_head, head_dim] and lens default
    to the case's. The outputs, and the scheduler's counters of the step."""
    c = b.case
    q_np = b.q if q is None else q
    split = ferry.CUDABackend() if device == "cuda" else ferry.StandinBackend()
    cpu = ferry.CPUBackend()
    qt = ferry.Tensor.from_numpy(split, q_np, name="q")
    kv_len = ferry.Tensor.from_numpy(cpu, np.array(c.lens if lens is None else lens, np.int32), name="kv_len")
    cache = b.paged if paged else b.dense
    with ferry.Scheduler([split, cpu], policy=policy, prefetch=prefetch) as sched:
        outs = ferry.attention_step(sched, split, cache.windows(c.n_kv), [qt], kv_len)
        sched.compute(outs.graph)
        assert sched.backend_of(outs[0]) is split  # not run elsewhere: the device's own kernel
        return outs[0].to_numpy().reshape(q_np.shape), sched.stats


def run_step(b: Built, paged: bool, policy: str, prefetch: int, device: str = "cpu",
             q: Optional[np.ndarray] = None, lens: Optional[np.ndarray] = None) -> np.ndarray:
    """run_counted's outputs alone."""
    return run_counted(b, paged, policy, prefetch, device, q, lens)[0]


def run_on(device: str, b: Built, q: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """attn_decode over the dense window: the CPU kernel in place, or the CUDA kernel through the
    scheduler (ranges)."""
    if device == "cuda":
        return run_step(b, False, "ranges", 0, "cuda", q, lens)
    return run_cpu(b, q, lens)


EXAMPLES = [
    Case("q8_0", "q8_0", False, 2, 3, 24, 16, (24, 0, 16, 19), 1),  # the most tokens, an idle stream
    Case("f16", "f32", True, 1, 1, 16, 16, (16,), 2),  # n_tok = n_kv = len: the whole window is new
    Case("f32", "f16", True, 2, 2, 7, 1, (7, 1, 0), 3),  # one token
]


def with_examples(f: Callable[[Case], None]) -> Callable[[Case], None]:
    """The explicit cases, before hypothesis's own."""
    for e in EXAMPLES:
        f = example(e)(f)
    return f


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=60 * SCALE, **SETTINGS)
@with_examples
@given(c=cases())
def test_matches_a_float64_reference(device: str, c: Case) -> None:
    """The kernel over a dense window, every token within TOL of the float64 reference; NaN in any
    cell it must not read would reach the output. CUDA's within CUDA_TOL of the CPU's too."""
    b = build(c)
    got = run_on(device, b, b.q, np.array(c.lens))
    assert got.dtype == np.float32 and got.shape == b.ref.shape
    assert np.isfinite(got).all(), "the op read a cell it must not (NaN reached the output)"
    err = np.abs(got.astype(np.float64) - b.ref) / (1.0 + np.abs(b.ref))
    assert err.max() <= TOL, f"max error {err.max():.3g} over {TOL}"
    if device == "cuda":
        cpu = run_cpu(b, b.q, np.array(c.lens)).astype(np.float64)
        vs_cpu = np.abs(got - cpu) / (1.0 + np.abs(cpu))
        assert vs_cpu.max() <= CUDA_TOL, f"{vs_cpu.max():.3g} from the CPU's"


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=60 * SCALE, **SETTINGS)
@with_examples
@given(c=cases())
def test_each_token_is_a_one_token_step_at_its_length_byte_for_byte(device: str, c: Case) -> None:
    """Token t's output is the bytes of a one-token step, on the same kernel, whose streams are
    len - n_tok + t + 1 long (an idle stream, 0, stays 0 and zeros)."""
    b = build(c)
    got = run_on(device, b, b.q, np.array(c.lens))
    lens = np.array(c.lens)
    for t in range(c.n_tok):
        one = run_on(device, b, np.ascontiguousarray(b.q[:, t:t + 1]), np.where(lens > 0, lens - c.n_tok + t + 1, 0))
        assert got[:, t:t + 1].tobytes() == one.tobytes(), f"token {t}"


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=25 * SCALE, **SETTINGS)
@with_examples
@given(c=cases())
def test_byte_identical_across_policies_prefetching_and_layouts(device: str, c: Case) -> None:
    """Through the scheduler (attention_step on the stand-in device or CUDA), dense and paged windows
    (paged ones arrive gathered dense) under every copy policy, with and without prefetch: the
    bytes of the kernel reading the dense window in place (the CPU's), or of its first run (CUDA's)."""
    b = build(c)
    want = run_on(device, b, b.q, np.array(c.lens)).tobytes()
    for paged in (False, True):
        for policy in POLICIES:
            for prefetch in (0, 1):
                got = run_step(b, paged, policy, prefetch, device)
                assert got.tobytes() == want, (paged, policy, prefetch)


def test_matches_torch_scaled_dot_product_attention() -> None:
    """PyTorch's scaled_dot_product_attention in float64 with the same causal mask over the cells,
    where torch is installed."""
    torch = pytest.importorskip("torch")
    for c in EXAMPLES:
        b = build(c)
        got = run_cpu(b, b.q, np.array(c.lens))
        for s in range(c.ns):
            if c.lens[s] == 0:
                continue
            n = c.lens[s]
            heads = np.arange(c.n_head) // c.group
            kk = torch.from_numpy(np.stack([b.k64[s, :n, h * HEAD_DIM:(h + 1) * HEAD_DIM] for h in heads]))
            vv = torch.from_numpy(np.stack([b.v64[s, :n, h * HEAD_DIM:(h + 1) * HEAD_DIM] for h in heads]))
            qq = torch.from_numpy(b.q[s].transpose(1, 0, 2).astype(np.float64))  # [n_head, n_tok, head_dim]
            mask = torch.from_numpy(np.arange(n)[None, :] <= (n - c.n_tok + np.arange(c.n_tok))[:, None])
            want = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, scale=b.scale)
            want = want.numpy().transpose(1, 0, 2)
            err = np.abs(got[s].astype(np.float64) - want) / (1.0 + np.abs(want))
            assert err.max() <= TOL


# ---------------------------------------------------------------- refusals


def _parts(n_tok: int, lens: Tuple[int, ...]) -> Tuple[ferry.Tensor, ...]:
    """A dense window of 3 streams of 8 cells (2 query heads over 1 KV head), q of n_tok tokens in
    CPU memory, and lens as kv_len."""
    b = build(Case("f16", "f16", False, 1, 2, 8, 1, (8, 8, 8), 0))
    cpu = ferry.CPUBackend()
    k, v = b.dense.window(0, 8)
    q = ferry.Tensor.from_numpy(cpu, np.zeros((3, n_tok, 2, HEAD_DIM), np.float32), name="q")
    kv_len = ferry.Tensor.from_numpy(cpu, np.array(lens, np.int32), name="kv_len")
    return q, k, v, kv_len


def test_a_length_below_n_tok_is_refused_naming_the_stream_writing_nothing() -> None:
    q, k, v, kv_len = _parts(5, (8, 0, 3))
    out = ferry.ops.attn_decode(q, k, v, kv_len).set_output()
    graph = ferry.Graph(out)
    cpu = ferry.CPUBackend()
    ferry.GraphAllocator(cpu).alloc(graph)
    out.set(np.full(out.ne[::-1], 42.0, np.float32))
    with pytest.raises(ferry.OutOfBoundsError, match=r"stream 2's length 3 .* below q's 5 query tokens"):
        graph.compute(cpu)
    assert (out.to_numpy() == 42.0).all()


def _bytes_into_copies(sched: ferry.Scheduler) -> int:
    """Bytes moved into the memory of the scheduler's input copies, every kind of transfer."""
    total = 0
    for i in sched.inputs:
        buf = i.copy.buffer
        assert buf is not None
        total += sum(buf.stats.bytes.values())
    return total


@pytest.mark.parametrize("device", DEVICES)
def test_a_scheduled_length_below_n_tok_is_refused_before_a_byte_moves(device: str) -> None:
    """In a scheduled run a stream shorter than the step's tokens is refused before the first copy
    (the CUDA kernel could not refuse it at all): nothing moves into the device's copies, the
    scheduler's stats stay the last run's, and the next run with good lengths goes on."""
    c = Case("f16", "f16", False, 1, 2, 8, 5, (8, 0, 6), 0)
    b = build(c)
    split = ferry.CUDABackend() if device == "cuda" else ferry.StandinBackend()
    cpu = ferry.CPUBackend()
    q = ferry.Tensor.from_numpy(split, b.q, name="q")
    kv_len = ferry.Tensor.from_numpy(cpu, np.array(c.lens, np.int32), name="kv_len")
    with ferry.Scheduler([split, cpu], policy="ranges") as sched:
        outs = ferry.attention_step(sched, split, b.dense.windows(c.n_kv), [q], kv_len)
        sched.compute(outs.graph)
        stats, moved = sched.stats, _bytes_into_copies(sched)
        assert moved > 0
        kv_len.set(np.array([8, 0, 3], np.int32))
        with pytest.raises(ferry.OutOfBoundsError) as refused:
            sched.compute(outs.graph)
        assert _bytes_into_copies(sched) == moved
        assert sched.stats == stats
        assert re.search(r"sched_graph_compute: attention .*stream 2's length 3 \(of its kv_len 'kv_len'.* below "
                         r"q's 5 query tokens", str(refused.value))
        kv_len.set(np.array(c.lens, np.int32))
        sched.compute(outs.graph)
        assert outs[0].to_numpy().reshape(b.q.shape).tobytes() == run_on(device, b, b.q, np.array(c.lens)).tobytes()


@pytest.mark.skipif(not ferry.cuda_available(), reason="no CUDA device")
def test_cuda_gives_a_short_stream_nan_rows_where_the_host_cannot_read_its_length() -> None:
    """kv_len in device memory: no check before the run can read it, and the device cannot refuse,
    so a stream shorter than the step's tokens gets NaN rows, never a plausible answer; the other
    streams get their bytes."""
    c = Case("f16", "f16", False, 1, 2, 8, 5, (8, 0, 6), 0)
    b = build(c)
    want = run_on("cuda", b, b.q, np.array(c.lens))
    split, cpu = ferry.CUDABackend(), ferry.CPUBackend()
    q = ferry.Tensor.from_numpy(split, b.q, name="q")
    kv_len = ferry.Tensor.from_numpy(split, np.array([8, 0, 3], np.int32), name="kv_len")
    with ferry.Scheduler([split, cpu], policy="ranges") as sched:
        outs = ferry.attention_step(sched, split, b.dense.windows(c.n_kv), [q], kv_len)
        sched.compute(outs.graph)
        got = outs[0].to_numpy().reshape(b.q.shape)
    assert np.isnan(got[2]).all()
    assert got[:2].tobytes() == want[:2].tobytes()


def test_more_tokens_than_the_windows_cells_is_refused_naming_n_tok() -> None:
    q, k, v, kv_len = _parts(9, (8, 0, 8))
    with pytest.raises(ferry.LayoutError, match=r"q is f32 .*n_tok at most the window's 8 cells"):
        ferry.ops.attn_decode(q, k, v, kv_len)


def test_no_tokens_is_refused_naming_n_tok() -> None:
    q, k, v, kv_len = _parts(0, (8, 8, 8))
    with pytest.raises(ferry.LayoutError, match=r"q is f32 ne \[32, 2, 0, 3\].*n_tok query tokens per stream, none of "
                                                r"them 0"):
        ferry.ops.attn_decode(q, k, v, kv_len)


@settings(max_examples=25 * SCALE, **SETTINGS)
@with_examples
@given(cases())
def test_a_step_of_n_tok_tokens_copies_each_window_once(c: Case) -> None:
    """One copy per verification: a step of n_tok tokens per stream moves the bytes, in the calls, of
    a one-token step at the same lengths (each stream's window once), under every policy, dense and
    paged."""
    b = build(c)
    one_token = np.ascontiguousarray(b.q[:, -1:])  # the last token reads every cell the step reads
    for paged in (False, True):
        for policy in POLICIES:
            _, many = run_counted(b, paged, policy)
            _, one = run_counted(b, paged, policy, q=one_token)
            assert (many.bytes_copied, many.copy_calls, many.bytes_read) == \
                (one.bytes_copied, one.copy_calls, one.bytes_read), (paged, policy)
            assert many.bytes_copied > 0 or not any(c.lens), (paged, policy)
