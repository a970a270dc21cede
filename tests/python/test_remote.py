"""The remote tier (ferry.remote): a cache's layers in a server process, read through Mooncake's
transfer engine over TCP on the loopback, each window as the pieces of ferry's own plan.

The pieces (ferry.plan.copy_pieces, gather_pieces, merge_pieces) need no engine; the tier's tests
skip, saying why, where the engine cannot be imported (CI installs it: README's test command).
Each pull is checked against the same cache held locally: the bytes the copy path delivers from
the local window under the same policy, byte for byte, the pieces the plan's rows (or, paged, its
runs) and the bytes the cells read. Faults: a server killed at random points of a run of steps
(fixed seeds), a stopped server (the timeout), a registration refused: each refused pull names the
peer and the layer and writes nothing, and the pull after reconnect() is right again. A peer started
alone (`ferry remote-serve`, a separate process): the tier reads its published layout, refuses
another, names it when it is gone, and reconnects to it restarted.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Iterator, List, Tuple

import numpy as np
import pytest

import ferry
from ferry.paged import PagedKVCache
from ferry.pieces import _paged_piece_array
from ferry.plan import (
    CopyCostModel,
    Piece,
    copy_pieces,
    gather_pieces,
    merge_pieces,
    plan_copy,
    plan_paged,
)
from ferry.policy import GatherMethod
from ferry.remote import engine_missing

SENTINEL = 0xA5
HEAD_DIM, N_HEAD_KV, N_STREAM, CELLS, N_LAYER = 16, 2, 4, 64, 2
CELL = HEAD_DIM * N_HEAD_KV * 2  # f16 K row of one cell

needs_engine = pytest.mark.skipif(engine_missing() is not None, reason=f"no transfer engine: {engine_missing()}")


def test_the_engine_is_here_where_ci_requires_it_and_a_missing_library_is_named() -> None:
    """.ci/run sets FERRY_REQUIRE_REMOTE: there the tier's tests must run, not skip. A missing system
    library is named with the command that installs it."""
    if os.environ.get("FERRY_REQUIRE_REMOTE"):
        assert engine_missing() is None
    from ferry.remote.engine import _why_missing

    why = _why_missing(ImportError("libibverbs.so.1: cannot open shared object file: No such file or directory"))
    assert "libibverbs.so.1" in why and "apt-get install -y libibverbs1" in why
    assert "pip install 'ferry[remote]'" in _why_missing(ImportError("No module named 'mooncake'"))


# ------------------------------------------------------------ pieces (C, no engine)


def test_pieces_are_the_rows_of_the_copies_and_merge_by_the_model() -> None:
    """A piece per row, at its own offsets; merging joins touching pieces always, a gap only when
    the same in source and destination and cheaper than a piece, and counts the gap bytes."""
    assert copy_pieces([(10, 4, 3, 100)]) == [Piece(10, 10, 4), Piece(110, 110, 4), Piece(210, 210, 4)]
    assert gather_pieces([(500, 0, 8, 2, 64, 8)]) == [Piece(500, 0, 8), Piece(564, 8, 8)]
    assert copy_pieces([]) == []
    # a piece costs 1 us; a byte 1 ns (1 GB/s): gaps under 1000 bytes merge
    m = CopyCostModel(0.0, 0.0, 1.0, 0, 0, 1.0, 0, 0.0, piece_ns=1000.0)
    pieces = [Piece(0, 0, 10), Piece(10, 10, 10), Piece(500, 500, 10), Piece(5000, 5000, 10), Piece(5100, 7000, 10)]
    got, gaps = merge_pieces(pieces, m)
    assert got == [Piece(0, 0, 510), Piece(5000, 5000, 10), Piece(5100, 7000, 10)] and gaps == 480
    free = CopyCostModel(0.0, 0.0, 1.0, 0, 0, 1.0, 0, 0.0, piece_ns=0.0)
    assert merge_pieces(pieces, free) == ([Piece(0, 0, 20)] + pieces[2:], 0)
    # small pieces slow (a piece curve): 16 pieces of 4 KiB with gaps of 1 KiB are one span past the
    # knee, by the rule a paged gather's merged spans follow, though no gap alone costs less than a piece
    curved = CopyCostModel(0.0, 0.0, 1.0, 0, 0, 1.0, 0, 0.0, piece_ns=0.0, piece_floor_gbps=0.1,
                           piece_knee_bytes=16384.0, piece_steepness=4.0)
    small = [Piece(5120 * i, 5120 * i, 4096) for i in range(16)]
    assert merge_pieces(small, curved) == ([Piece(0, 0, 5120 * 15 + 4096)], 15 * 1024)
    with pytest.raises(ferry.InvalidArgumentError, match="piece 0 is not"):
        merge_pieces([(1, 2)], m)
    with pytest.raises(ferry.OutOfBoundsError, match="overflows"):
        copy_pieces([(2**64 - 8, 4, 2, 4)])


# ------------------------------------------------------------ caches


def random_kv(seed: int, v_trans: bool = False) -> ferry.KVCache:
    kv = ferry.KVCache("f16", "f16", HEAD_DIM, N_HEAD_KV, CELLS * N_STREAM, N_STREAM, N_LAYER, v_trans=v_trans)
    rng = np.random.default_rng(seed)
    for layer in range(N_LAYER):
        for t in (kv.k(layer), kv.v(layer)):
            t.set(rng.integers(0, 250, t.nbytes, dtype=np.uint8).tobytes())
    return kv


def delivered(window: ferry.Tensor, policy: str) -> bytes:
    """What the copy path delivers from a window under policy, into a destination of sentinels."""
    cpu = ferry.CPUBackend()
    dst = window.dup_layout()
    cpu.alloc_buffer_for(dst)
    dst.set(bytes([SENTINEL]) * dst.nbytes)
    ferry.copy_path.copy_input(cpu, policy, window, dst)
    return bytes(dst.get())


def sentinel_fill(kv: Any) -> None:
    for layer in range(N_LAYER):
        for t in (kv.k(layer), kv.v(layer)):
            t.set(bytes([SENTINEL]) * t.nbytes)


@pytest.fixture(scope="module")
def lens() -> ferry.Tensor:
    return ferry.Tensor.from_numpy(ferry.CPUBackend(), np.array([5, 17, 1, 24], np.int32), name="lens")


@needs_engine
@pytest.mark.parametrize("v_trans", [False, True])
def test_every_policy_pulls_the_local_windows_bytes_in_the_plans_pieces(v_trans: bool, lens: ferry.Tensor) -> None:
    """Under flat, ranges, plan and ragged, the pulled windows deliver what the local cache's do,
    byte for byte; the pieces are the rows of the policy's copies (no gap is merged with no
    model), the bytes the copies' bytes: under ragged, exactly the cells the lengths read."""
    from ferry.remote import RemoteTier

    ref, mirror = random_kv(1, v_trans), random_kv(2, v_trans)
    sentinel_fill(mirror)
    with RemoteTier(mirror) as tier:
        tier.upload(ref)
        for policy in ("flat", "ranges", "plan", "ragged"):
            k, v, st = tier.pull(1, 24, policy, lengths=lens)
            rk, rv = ref.window(1, 24, lengths=lens)
            assert delivered(k, policy) == delivered(rk, policy), policy
            assert delivered(v, policy) == delivered(rv, policy), policy
            assert st.gap_bytes == 0 and st.bytes == st.bytes_read
            if policy == "ragged":
                assert st.bytes == 2 * (5 + 17 + 1 + 24) * CELL
            if policy == "plan":
                rows = sum(c.count for w in (rk, rv) for c in plan_copy(w))
                assert st.pieces == st.plan_pieces == rows
                assert st.bytes == sum(c.nbytes for w in (rk, rv) for c in plan_copy(w))
            if policy == "ranges" and not v_trans:
                assert st.pieces == 2 * N_STREAM  # one range per stream, K and V


@needs_engine
@pytest.mark.parametrize("memory", ["standin", "pinned"])
def test_a_pull_into_pinned_or_a_devices_host_memory_delivers_the_local_bytes(memory: str,
                                                                             lens: ferry.Tensor) -> None:
    """The cache a pull lands in may be of another host buffer type than the CPU's: CUDA's pinned
    host memory (cudaMallocHost; where CUDA is built, the fake runtime's too) or the stand-in
    device's (host memory no other backend uses). Under every policy the windows land in that
    memory and deliver the local cache's bytes; a layer not pulled keeps its bytes."""
    from ferry.remote import RemoteTier

    if memory == "pinned" and not ferry.cuda_available():
        pytest.skip("no CUDA: no pinned host buffer type")
    kw: Any = {"pinned": True} if memory == "pinned" else {"backend": ferry.StandinBackend()}
    ref = random_kv(3)
    mirror = ferry.KVCache("f16", "f16", HEAD_DIM, N_HEAD_KV, CELLS * N_STREAM, N_STREAM, N_LAYER, **kw)
    expect_type = "CUDA_Host" if memory == "pinned" else "stand-in"
    assert expect_type in str(mirror.k(1).buffer), mirror.k(1).buffer
    with RemoteTier(mirror) as tier:
        tier.upload(ref)
        for policy in ("flat", "ranges", "plan", "ragged"):
            sentinel_fill(mirror)
            k, v, st = tier.pull(1, 24, policy, lengths=lens)
            assert k.buffer is mirror.k(1).buffer or str(k.buffer) == str(mirror.k(1).buffer)  # the cache's memory
            rk, rv = ref.window(1, 24, lengths=lens)
            assert delivered(k, policy) == delivered(rk, policy), policy
            assert delivered(v, policy) == delivered(rv, policy), policy
            assert st.bytes == st.bytes_read
            assert bytes(mirror.k(0).get()) == bytes([SENTINEL]) * mirror.k(0).nbytes


@needs_engine
def test_ragged_at_npl_8_uniform_pulls_at_most_0_6_of_ranges() -> None:
    """npl 8 streams, uniform lengths over a window of 64: ragged pulls each stream's cells, ranges
    the window's; the bytes are counted, never timed."""
    from ferry.remote import RemoteTier

    kv = ferry.KVCache("f16", "f16", HEAD_DIM, N_HEAD_KV, 64 * 8, 8, 1)
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 65, 8).astype(np.int32)
    lens8 = ferry.Tensor.from_numpy(ferry.CPUBackend(), lengths)
    with RemoteTier(kv) as tier:
        tier.upload()
        _, _, ragged = tier.pull(0, 64, "ragged", lengths=lens8)
        _, _, ranges = tier.pull(0, 64, "ranges", lengths=lens8)
    assert ragged.bytes == 2 * int(lengths.sum()) * CELL and ranges.bytes == 2 * 8 * 64 * CELL
    assert ragged.bytes <= 0.6 * ranges.bytes


def random_paged(seed: int, adjacency: float) -> Tuple[PagedKVCache, List[List[int]]]:
    """A paged cache of 64 blocks of 4 cells, 3 sequences of 20, 9 and 16 cells, tables drawn with
    the given adjacency (a block follows its predecessor with that probability where free)."""
    rng = np.random.default_rng(seed)
    ks = [rng.standard_normal((64, 4, N_HEAD_KV, HEAD_DIM)).astype(np.float16) for _ in range(N_LAYER)]
    vs = [rng.standard_normal((64, 4, N_HEAD_KV, HEAD_DIM)).astype(np.float16) for _ in range(N_LAYER)]
    c = PagedKVCache.from_arrays(ks, vs, n_seq=3)
    free = set(range(64))
    tables = []
    for s, n in enumerate((20, 9, 16)):
        table: List[int] = []
        for _ in range(-(-n // 4)):
            nxt = table[-1] + 1 if table else -1
            b = nxt if nxt in free and rng.random() < adjacency else int(rng.choice(sorted(free - {nxt})))
            free.discard(b)
            table.append(b)
        c.set_table(s, table, n)
        tables.append(table)
    return c, tables


@needs_engine
def test_a_paged_window_pulls_its_runs_and_gathers_the_local_bytes() -> None:
    """A paged window's pull is its gather's runs, K and V (per block under per_block), the dense
    window byte for byte the local gather's, the bytes the cells read; merged, no more pieces."""
    from ferry.remote import RemoteTier

    ref, tables = random_paged(4, 0.5)
    mirror, _ = random_paged(4, 0.5)
    sentinel_fill(mirror)
    with RemoteTier(mirror) as tier:
        tier.upload(ref)
        for method in ("runs", "per_block"):
            mirror.gather = method
            ref.gather = method
            merge = False  # a piece per row of the gather: per run, or per block (the baseline)
            k, v, _ = tier.pull(0, 24, merge=merge)
            for t in (k, v):  # the tier keeps its dense windows: the next pull writes only the cells read
                t.set(bytes([SENTINEL]) * t.nbytes)
            k, v, st = tier.pull(0, 24, merge=merge)
            rk, rv = ref.window(0, 24)
            assert bytes(k.get()) == delivered(rk, "flat")
            assert bytes(v.get()) == delivered(rv, "flat")
            plan = plan_paged(rk, ferry.CPUBackend())
            expect = plan.runs if method == "runs" else plan.blocks
            assert st.pieces == st.plan_pieces == 2 * expect, method
            assert st.bytes == 2 * (20 + 9 + 16) * CELL == 2 * plan.bytes
            assert len(gather_pieces(plan.copies)) == expect
            # the tier's pieces, kept in C's arrays (no object a run), are the plan's
            assert _paged_piece_array(rk, ferry.CPUBackend()).tolist() == [list(p) for p in gather_pieces(plan.copies)]
        # merged: the runs that touch in the pool join (they land in staging, so only the pool's gaps count)
        mirror.gather = "runs"
        k, _, st = tier.pull(0, 24)
        assert st.pieces <= st.plan_pieces and st.bytes == st.bytes_read
        assert st.pull_seconds >= st.seconds > 0  # the whole pull holds its transfer
        # the tier's own time: the pull but its transfer (plan, pieces, placing), what RemoteSpec.host_us models
        assert st.host_seconds > 0 and st.host_seconds + st.seconds == pytest.approx(st.pull_seconds, rel=1e-9)
        assert bytes(k.get()) == delivered(ref.window(0, 24)[0], "flat")


@needs_engine
def test_a_paged_pull_under_auto_leaves_the_caches_gather_auto_and_pulls_the_runs() -> None:
    """A pull plans its gather without setting the cache's method: under auto (a new cache's) the
    cache says auto afterwards, and the pull is the runs' (auto's choice for the host), the same
    pieces, bytes and dense windows as under runs, pull and pull_async alike."""
    from ferry.remote import RemoteTier

    ref, _ = random_paged(5, 0.5)
    mirror, _ = random_paged(5, 0.5)
    sentinel_fill(mirror)
    assert mirror.gather == GatherMethod.AUTO
    with RemoteTier(mirror) as tier:
        tier.upload(ref)

        def pulled(layer: int, sync: bool) -> Tuple[bytes, bytes, int, int, int]:
            k, v, _ = tier.pull(layer, 24, merge=False)
            for t in (k, v):  # the tier's dense windows, kept: the pull below writes only the cells read
                t.set(bytes([SENTINEL]) * t.nbytes)
            k, v, st = tier.pull(layer, 24, merge=False) if sync else tier.pull_async(layer, 24, merge=False).wait()
            return bytes(k.get()), bytes(v.get()), st.pieces, st.plan_pieces, st.bytes

        auto = [pulled(layer, sync) for layer, sync in ((0, True), (1, False))]
        assert mirror.gather == GatherMethod.AUTO
        for layer in (0, 1):
            rk, rv = ref.window(layer, 24)
            plan = plan_paged(rk, ferry.CPUBackend())
            assert plan.method == GatherMethod.RUNS
            assert auto[layer] == (delivered(rk, "flat"), delivered(rv, "flat"), 2 * plan.runs, 2 * plan.runs,
                                   2 * plan.bytes)
        mirror.gather = "runs"
        assert [pulled(layer, sync) for layer, sync in ((0, True), (1, False))] == auto


@needs_engine
def test_the_links_fit_gives_a_model_that_merges_gaps_cheaper_than_a_piece() -> None:
    """measure_remote_link fits a batch's cost, a piece's and a rate; the model made of
    it merges the ranges of a short window (gaps of a few cells cost less than a piece on TCP) and
    the merged pull still delivers the local bytes."""
    from ferry.remote import RemoteTier, measure_remote_link

    kv = ferry.KVCache("f16", "f16", HEAD_DIM, N_HEAD_KV, 1024 * N_STREAM, N_STREAM, 1)
    kv.k(0).set(np.arange(kv.k(0).nbytes, dtype=np.uint8).tobytes())
    with RemoteTier(kv) as tier:
        tier.upload()
        link = measure_remote_link(tier, nbytes=32768, repeats=1)
        # (bytes, pieces) of each of remote_link_shapes, its median fitted: no piece curve (the rate does not rise)
        assert link.fit is not None and link.fit.gbps > 0 and link.pieces is None
        assert [(b, k) for b, k, _ in link.fit.points] == [(32, 1), (512, 16), (8192, 256), (32768, 1024), (65536, 2048),
                                                         (32768, 4), (32768, 2), (65536, 2), (32768, 1)]
        model = CopyCostModel.from_link(link)
        assert model.piece_ns == link.fit.row_ns
        # a model whose piece costs 100 us at 1 GB/s merges gaps under 100 kB: the 4 ranges become 1
        tier.model = CopyCostModel(1.0, 0.0, 1.0, 0, 0, 1.0, 0, 0.0, piece_ns=100_000.0)
        k, _, st = tier.pull(0, 3, "ranges")
        assert st.pieces == 2 and st.plan_pieces == 2 * N_STREAM and st.gap_bytes > 0
        assert st.bytes == st.bytes_read + st.gap_bytes
        assert delivered(k, "ranges") == delivered(kv.window(0, 3)[0], "ranges")


@needs_engine
def test_pulls_timed_among_the_links_shapes_land_right_and_are_predicted_as_the_tier_predicts() -> None:
    """time_remote_pulls on the loopback: the shapes and a pull each once a round (the warm-up's not
    kept), the pull's bytes the local window's; remote_pull_seconds of the rounds' fit is the tier's
    own prediction of a pull under the model made of that fit."""
    from ferry.remote import RemoteTier, fit_remote_link, remote_pull_seconds, time_remote_pulls

    kv = ferry.KVCache("f16", "f16", HEAD_DIM, N_HEAD_KV, 1024 * N_STREAM, N_STREAM, 1)
    kv.k(0).set(np.arange(kv.k(0).nbytes, dtype=np.uint8).tobytes())
    with RemoteTier(kv) as tier:
        tier.upload()
        rounds = time_remote_pulls(tier, [lambda: tier.pull(0, 3, "ranges")[2]], nbytes=32768, repeats=2)
        assert [len(t.seconds) for t in rounds.timings] == [2] * 9 and len(rounds.pulls[0]) == 2
        fit = fit_remote_link(rounds.timings)
        tier.model = CopyCostModel.from_link(fit.fit)
        k, _, st = tier.pull(0, 3, "ranges")
        assert remote_pull_seconds(fit, st) == pytest.approx(st.predicted_seconds, rel=1e-9)
        assert delivered(k, "ranges") == delivered(kv.window(0, 3)[0], "ranges")


# ------------------------------------------------------------ the link's fit (synthetic timings, no engine)

#: A loopback's link as the lead measured it on a quiet host: a batch, a piece, a byte.
BATCH_S, PIECE_S, RATE = 80e-6, 13e-6, 1.75e9


def engine_seconds(pieces: int, nbytes: int) -> float:
    return BATCH_S + pieces * PIECE_S + nbytes / RATE


def predicted(model: CopyCostModel, shape: List[Tuple[int, int]]) -> float:
    """The tier's prediction of a batch of (pieces, bytes each) groups (RemoteTier.pull's sum)."""
    return model.call_us * 1e-6 + sum(k * (model.piece_ns * 1e-9 + model.piece_seconds(b)) for k, b in shape)


class SyntheticTier:
    """Stands in for a RemoteTier's timed reads: the link above, 3% of noise, and a burst of load
    that makes six reads in a row three times slower (from the 21st read on)."""

    def __init__(self) -> None:
        self.reads = 0
        self.rng = np.random.default_rng(45)
        self.peer = "synthetic:0"

    def region_bytes(self) -> int:
        return 4 << 20

    def timed_read(self, pieces: List[Tuple[int, int]]) -> float:
        self.reads += 1
        busy = 3.0 if 21 <= self.reads <= 26 else 1.0
        noise = 1.0 + float(self.rng.uniform(-0.03, 0.03))
        return engine_seconds(len(pieces), sum(n for _, n in pieces)) * noise * busy


def test_the_remote_link_fit_predicts_pulls_through_a_burst_of_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """measure_remote_link's fit, on timed reads of a known link with a burst of load among them,
    gives the link back and predicts a merged pull (2 pieces of 4 MiB), a piece per block (2,048 of
    4 KiB) and a pull of mid-sized spans within 10%. (Fitted as it was, to the fastest of 3 reads of
    one shape after another, the burst took all of one shape's reads and the fit followed it.)"""
    import ferry.remote.link as remote_link

    synthetic = SyntheticTier()
    monkeypatch.setattr(remote_link, "RemoteTier", SyntheticTier)  # the instance check takes the stand-in
    link = remote_link.measure_remote_link(synthetic)  # type: ignore[arg-type]
    assert link.fit is not None
    assert link.fit.latency_us * 1e-6 == pytest.approx(BATCH_S, rel=0.15)
    assert link.fit.row_ns * 1e-9 == pytest.approx(PIECE_S, rel=0.1)
    assert link.fit.gbps * 1e9 == pytest.approx(RATE, rel=0.1)
    model = CopyCostModel.from_link(link)
    for shape in ([(2, 4 << 20)], [(2048, 4096)], [(420, 33_000)]):
        truth = engine_seconds(sum(k for k, _ in shape), sum(k * b for k, b in shape))
        assert predicted(model, shape) == pytest.approx(truth, rel=0.1), shape


class OverlappingTier(SyntheticTier):
    """Stands in for an engine that overlaps a piece's own cost with other pieces' bytes, as the
    loopback's does (64 pieces of 16 KiB took a third less than their pieces and bytes): a batch
    costs BATCH_S, its pieces and its bytes less OVERLAP of the smaller of the two. No noise, no burst."""

    OVERLAP = 0.8

    @staticmethod
    def seconds(pieces: int, nbytes: int) -> float:
        own, moved = pieces * PIECE_S, nbytes / RATE
        return BATCH_S + own + moved - OverlappingTier.OVERLAP * min(own, moved)

    def timed_read(self, pieces: List[Tuple[int, int]]) -> float:
        return self.seconds(len(pieces), sum(n for _, n in pieces))


def test_the_remote_link_fit_prices_the_pulls_at_both_ends_where_pieces_overlap_bytes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the engine overlaps a piece's cost with other pieces' bytes, the tier's sum (a batch, each
    piece, each byte) cannot price every batch: fitted to small pieces for a piece and large ones for a
    byte, it predicts a merged pull (2 pieces of 4 MiB), a piece per block (2,048 of 4 KiB) and a lone
    block within 2%. (Fitted also to 16 KiB to 1 MiB pieces, whose pieces and bytes overlap most, it
    put a piece 24% cheaper and the rate 8% faster, and predicted those pulls 7 to 10% short.) A pull of
    middle-sized pieces is then predicted high, never low: the model's known error, on the safe side."""
    import ferry.remote.link as remote_link

    monkeypatch.setattr(remote_link, "RemoteTier", OverlappingTier)
    link = remote_link.measure_remote_link(OverlappingTier())  # type: ignore[arg-type]
    assert link.fit is not None
    model = CopyCostModel.from_link(link)
    for shape in ([(2, 4 << 20)], [(2048, 4096)], [(1, 4096)]):
        truth = OverlappingTier.seconds(sum(k for k, _ in shape), sum(k * b for k, b in shape))
        assert predicted(model, shape) == pytest.approx(truth, rel=0.02), shape
    for shape in ([(420, 33_000)], [(64, 16 << 10)]):
        assert predicted(model, shape) >= OverlappingTier.seconds(shape[0][0], shape[0][0] * shape[0][1]), shape


class DriftingTier(SyntheticTier):
    """Stands in for a tier on a host whose engine slows down: the link above, no noise, and every
    read and pull after the first DRIFT_AFTER ones 1.5 times slower (measure_remote_link's 6 rounds of
    9 shapes are the 54 before it). pull(pieces, nbytes) stands in for a pull of that batch; log
    records each call in order."""

    DRIFT_AFTER = 54

    def __init__(self) -> None:
        super().__init__()
        self.log: List[Tuple[str, int]] = []

    def slowed(self, seconds: float, what: str, pieces: int) -> float:
        self.log.append((what, pieces))
        return seconds * (1.5 if len(self.log) > self.DRIFT_AFTER else 1.0)

    def timed_read(self, pieces: List[Tuple[int, int]]) -> float:
        return self.slowed(engine_seconds(len(pieces), sum(n for _, n in pieces)), "read", len(pieces))

    def pull(self, pieces: int, nbytes: int) -> Any:
        from ferry.remote import PullStats

        sec = self.slowed(engine_seconds(pieces, nbytes), "pull", pieces)
        return PullStats(layer=0, policy="paged", pieces=pieces, plan_pieces=pieces, bytes=nbytes, bytes_read=nbytes,
                         gap_bytes=0, seconds=sec, predicted_seconds=0.0, pull_seconds=sec)


def test_pulls_timed_in_the_fits_own_rounds_are_predicted_through_a_drift(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine slows by half after a first fit: that fit predicts the pulls 33% short, while
    time_remote_pulls, reading the shapes and making the pulls in turn (each pull among the shapes,
    spread evenly, a warm-up round first), gives a fit of the same rounds that predicts them within
    2% (remote_pull_seconds: the tier's sum for the pull's pieces and bytes). Pulls that are not
    callables, or do not give a PullStats, and repeats under 1 are refused naming them."""
    import ferry.remote.link as remote_link
    from ferry.remote import remote_pull_seconds, time_remote_pulls

    tier = DriftingTier()
    monkeypatch.setattr(remote_link, "RemoteTier", DriftingTier)
    before = remote_link.measure_remote_link(tier)  # type: ignore[arg-type]
    assert len(tier.log) == DriftingTier.DRIFT_AFTER and before.fit is not None
    shapes = remote_link.remote_link_shapes(4 << 20, 4096)
    pulls = [lambda: tier.pull(2, 8 << 20), lambda: tier.pull(2048, 8 << 20)]  # merged; a piece per block
    rounds = time_remote_pulls(tier, pulls, repeats=3)  # type: ignore[arg-type]
    # 4 rounds, each: 3 shapes, the first pull, 3 shapes, the second, 3 shapes
    one = [("read", k) for _, k in shapes]
    one[6:6] = [("pull", 2048)]
    one[3:3] = [("pull", 2)]
    assert tier.log[DriftingTier.DRIFT_AFTER:] == one * 4
    assert [len(t.seconds) for t in rounds.timings] == [3] * len(shapes) and [len(p) for p in rounds.pulls] == [3, 3]
    fit = remote_link.fit_remote_link(rounds.timings)
    for stats in rounds.pulls:
        st = stats[1]
        assert remote_pull_seconds(fit, st) == pytest.approx(st.seconds, rel=0.02)
        assert remote_pull_seconds(before.fit, st) == pytest.approx(st.seconds / 1.5, rel=0.02)
    assert remote_pull_seconds(fit.fit, rounds.pulls[0][0]) == remote_pull_seconds(fit, rounds.pulls[0][0])
    with pytest.raises(ferry.FerryError, match=r"pulls\[1\] is not a callable"):
        time_remote_pulls(tier, [pulls[0], 3])  # type: ignore[arg-type, list-item]
    with pytest.raises(ferry.FerryError, match=r"pulls\[0\] returned"):
        time_remote_pulls(tier, [lambda: None])  # type: ignore[arg-type]
    with pytest.raises(ferry.FerryError, match="repeats 0"):
        time_remote_pulls(tier, pulls, repeats=0)  # type: ignore[arg-type]
    with pytest.raises(ferry.FerryError, match="remote_pull_seconds: stats"):
        remote_pull_seconds(fit, None)  # type: ignore[arg-type]


def test_fit_remote_link_leaves_out_one_shape_the_others_disagree_with() -> None:
    """Every shape's reads exact but one shape's all three times slower (read while the host was busy):
    the fit leaves that one out, names it, and gives the link back; its residuals say how far off each
    shape is. Too few shapes are refused, naming what is needed."""
    from ferry.remote.link import BatchTiming, fit_remote_link, remote_link_shapes

    shapes = remote_link_shapes(4 << 20, 4096)
    # a block's pieces, one up to a K and a V window's, and the largest read, twice (a K and a V span) and once last
    assert (4096, 1) in shapes and (4096, 2048) in shapes and (4 << 20, 2) in shapes and shapes[-1] == (4 << 20, 1)
    slow = shapes.index((2 << 20, 2))
    timings = [BatchTiming(b, k, tuple(engine_seconds(k, k * b) * (3.0 if i == slow else 1.0) * f
                                       for f in (0.98, 1.0, 1.5)))  # a read's spike: the median does not see it
               for i, (b, k) in enumerate(shapes)]
    got = fit_remote_link(timings)
    assert got.left_out == (slow,)
    assert got.fit.latency_us * 1e-6 == pytest.approx(BATCH_S, rel=0.02)
    assert got.fit.row_ns * 1e-9 == pytest.approx(PIECE_S, rel=0.02)
    assert got.fit.gbps * 1e9 == pytest.approx(RATE, rel=0.02)
    assert got.residuals[slow] == pytest.approx(1 / 3 - 1, abs=0.02)
    assert max(abs(r) for i, r in enumerate(got.residuals) if i != slow) < 0.02
    with pytest.raises(ferry.FerryError, match="at least 4"):
        fit_remote_link(timings[:3])
    with pytest.raises(ferry.FerryError, match="timing 1"):
        fit_remote_link([timings[0], BatchTiming(4096, 16, ()), *timings[2:]])


# ------------------------------------------------------------ faults


@needs_engine
def test_a_server_killed_at_random_points_refuses_or_gives_the_right_bytes(lens: ferry.Tensor) -> None:
    """Steps of random layers and policies while the server is killed at a random moment (fixed
    seeds; before the last pull at the latest): each pull is right, or refused naming the peer and
    the layer with the destination as it was; after reconnect() the next pull is right."""
    from ferry.remote import PeerGoneError, RemoteError, RemoteTier

    ref, mirror = random_kv(5), random_kv(6)
    rng = np.random.default_rng(7)
    right = refused = 0
    with RemoteTier(mirror, timeout_s=20.0) as tier:
        tier.upload(ref)
        for _ in range(3):
            pid = tier.server_pid
            assert pid is not None
            killer = threading.Timer(float(rng.uniform(0.0, 0.05)), os.kill, (pid, signal.SIGKILL))
            killer.start()
            for i in range(12):
                if i == 11:  # the kill lands before the last pull at the latest, however fast the pulls are
                    killer.join()
                layer = int(rng.integers(N_LAYER))
                policy = str(rng.choice(["flat", "ranges", "plan", "ragged"]))
                sentinel_fill(mirror)
                try:
                    k, v, _ = tier.pull(layer, 24, policy, lengths=lens)
                except RemoteError as e:
                    assert isinstance(e, PeerGoneError) and tier.peer in e.message and f"layer {layer}" in e.message
                    assert all(bytes(t.get()) == bytes([SENTINEL]) * t.nbytes
                               for t in (mirror.k(layer), mirror.v(layer)))
                    refused += 1
                    continue
                rk, rv = ref.window(layer, 24, lengths=lens)
                assert delivered(k, policy) == delivered(rk, policy)
                assert delivered(v, policy) == delivered(rv, policy)
                right += 1
            killer.join()
            tier.reconnect()
            k, _, _ = tier.pull(0, 24, "ragged", lengths=lens)
            assert delivered(k, "ragged") == delivered(ref.window(0, 24, lengths=lens)[0], "ragged")
    assert refused >= 3 and right + refused == 36


def scheduled_step(kv: Any, policy: str, prefetch: int, lengths: List[int], n_kv: int = 24) -> Tuple[List[bytes], Any]:
    """A decode step over every layer of kv, attention on a stand-in device, by a Scheduler."""
    from ferry.step import attention_step

    dev, cpu = ferry.StandinBackend(), ferry.CPUBackend()
    sched = ferry.Scheduler([dev, cpu], policy=policy, prefetch=prefetch)
    rng = np.random.default_rng(1)
    q = [ferry.Tensor.from_numpy(cpu, rng.standard_normal((len(lengths), 1, 4, HEAD_DIM)).astype(np.float32))
         for _ in range(N_LAYER)]
    kv_len = ferry.Tensor.from_numpy(cpu, np.array(lengths, np.int32))
    outs = attention_step(sched, dev, kv.windows(n_kv), q, kv_len)
    sched.compute(outs.graph)
    return [bytes(o.get()) for o in outs], sched.stats


@needs_engine
@pytest.mark.parametrize("layout", ["cells", "paged"])
def test_the_scheduler_pulls_the_remote_layers_itself_under_every_policy_and_prefetch(layout: str) -> None:
    """fetch_layers: the scheduler issues each remote window's pull (a part ahead of its copy with
    prefetch) and copies it on: the outputs of the cache held locally byte for byte, a pull per
    window; the pieces are the plan's (a stream's cells under ragged, the gather's runs paged, merged
    only where they touch), the bytes the cells the window reads."""
    from ferry.remote import RemoteTier

    if layout == "cells":
        ref, mirror = random_kv(1), random_kv(2)
        lengths = [5, 17, 1, 24]
    else:
        ref, _ = random_paged(4, 0.5)
        mirror, _ = random_paged(4, 0.5)
        lengths = [20, 9, 16]
    runs = plan_paged(ref.window(0, 24)[0], ferry.CPUBackend()).runs if layout == "paged" else 0
    with RemoteTier(mirror) as tier:
        tier.upload(ref)
        tier.fetch_layers([1])
        assert tier.fetching == (1,)
        tier.fetch_layers()  # every layer: replaces the one given before
        assert tier.fetching == tuple(range(N_LAYER))
        for policy in ("flat", "ranges", "ragged"):
            want, local = scheduled_step(ref, policy, 0, lengths)
            for prefetch in (0, 1):
                sentinel_fill(mirror)
                got, st = scheduled_step(mirror, policy, prefetch, lengths)
                pulls = tier.take_fetch_stats()
                assert got == want, (policy, prefetch)
                assert st.fetched == len(pulls) == 2 * N_LAYER and st.bytes_copied == local.bytes_copied
                assert all(p.gap_bytes == 0 and p.bytes == p.bytes_read for p in pulls)
                assert all(0 < p.host_seconds <= p.pull_seconds for p in pulls)  # planned, issued, placed here
                if layout == "paged":
                    assert all(p.policy == "paged" and p.plan_pieces == runs >= p.pieces for p in pulls)
                    assert all(p.bytes == sum(lengths) * CELL for p in pulls)
                elif policy == "ragged":
                    assert all(p.pieces == len(lengths) and p.bytes == sum(lengths) * CELL for p in pulls)  # a run a stream
        tier.stop_fetching()
        sentinel_fill(mirror)
        assert scheduled_step(mirror, "ragged", 1, lengths)[0] != want and tier.take_fetch_stats() == []


@needs_engine
def test_a_peer_killed_under_the_schedulers_pulls_fails_the_run_naming_it_and_the_layer() -> None:
    """The server killed: the scheduler's run raises the tier's PeerGoneError (the peer and the
    layer named); after reconnect() the next run gives the local outputs."""
    from ferry.remote import PeerGoneError, RemoteTier

    ref, mirror = random_kv(5), random_kv(6)
    lengths = [5, 17, 1, 24]
    want, _ = scheduled_step(ref, "ragged", 1, lengths)
    with RemoteTier(mirror, timeout_s=20.0) as tier:
        tier.upload(ref)
        tier.fetch_layers()
        pid = tier.server_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(PeerGoneError) as e:
            scheduled_step(mirror, "ragged", 1, lengths)
        # the layer whose pull first saw the peer gone: which one is the kill's timing's
        assert tier.peer in e.value.message and re.search(rf"layer [0-{N_LAYER - 1}]\b", e.value.message)
        tier.reconnect()
        sentinel_fill(mirror)
        assert scheduled_step(mirror, "ragged", 1, lengths)[0] == want


@needs_engine
def test_a_tier_handing_its_layers_to_the_scheduler_closes_in_either_order_with_its_cache() -> None:
    """close() ends the scheduler's pulls whether the cache was closed first (nothing left to mark)
    or is still open (its layers read locally again, no fetch left on them)."""
    from ferry.remote import RemoteTier

    kv = random_kv(8)
    tier = RemoteTier(kv)
    tier.fetch_layers()
    kv.close()
    tier.close()
    assert tier.fetching == ()
    kv = random_kv(9)
    with RemoteTier(kv) as tier:
        tier.fetch_layers([0])
    assert tier.fetching == () and kv.k(0)._p.fetch == ferry._binding.ffi.NULL
    kv.close()


def stopped(pid: int) -> None:
    """Wait until every thread of process pid has stopped (a signal reaches a busy thread late)."""
    for _ in range(500):
        states = [open(f"/proc/{pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()[0]
                  for t in os.listdir(f"/proc/{pid}/task")]
        if all(st in "tT" for st in states):
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"process {pid} did not stop")


@needs_engine
def test_a_stopped_server_times_out_and_a_second_tier_over_the_same_memory_is_refused(lens: ferry.Tensor) -> None:
    """A server that stops answering: the pull is refused after timeout_s (naming the peer and the
    layer), nothing written, and refused again until reconnect(); a second tier over memory the
    first registered is refused (RegistrationError)."""
    from ferry.remote import PeerGoneError, RegistrationError, RemoteTier, RemoteTimeoutError

    ref, mirror = random_kv(8), random_kv(9)
    with RemoteTier(mirror, timeout_s=0.5) as tier:
        with pytest.raises(RegistrationError, match="refused to register layer 0's K"):
            RemoteTier(mirror)
        tier.upload(ref)
        sentinel_fill(mirror)
        pid = tier.server_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        stopped(pid)
        try:
            with pytest.raises(RemoteTimeoutError, match=rf"peer {tier.peer}: layer 1: no answer within 0.5 s"):
                tier.pull(1, 24, "ragged", lengths=lens)
            with pytest.raises(PeerGoneError, match="reconnect"):
                tier.pull(0, 24, "ragged", lengths=lens)
        finally:
            os.kill(pid, signal.SIGKILL)
        assert bytes(mirror.k(1).get()) == bytes([SENTINEL]) * mirror.k(1).nbytes
        tier.reconnect()
        k, _, _ = tier.pull(1, 24, "ragged", lengths=lens)
        assert delivered(k, "ragged") == delivered(ref.window(1, 24, lengths=lens)[0], "ragged")


def test_the_engine_worker_reports_a_call_that_raised_as_a_thread_would_and_serves_the_next(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A call that raises on the tier's worker: reported through threading.excepthook (as it was
    when each call had a thread of its own), the caller sees it ended with no result (the tier
    refuses it as a failed transfer), and the worker runs the next call; stop() ends it."""
    from ferry.remote.engine_worker import _EngineWorker

    reported: List[Any] = []
    monkeypatch.setattr(threading, "excepthook", reported.append)
    worker = _EngineWorker(engine=None)
    assert worker.run(lambda engine: 1 // 0, 10.0) == (True, [])
    assert worker.run(lambda engine: 7 if engine is None else 0, 10.0) == (True, [7])
    assert [type(args.exc_value) for args in reported] == [ZeroDivisionError]
    worker.stop(wait_s=10.0)
    assert not worker.thread.is_alive()


@needs_engine
def test_a_call_stuck_past_the_timeout_leaves_its_worker_and_the_next_call_runs_on_another(
        lens: ferry.Tensor) -> None:
    """The engine's calls run on one worker thread per tier: a call still running at the timeout is
    refused (the tier broken until reconnect) and its worker let go; the pull after reconnect()
    runs on a new worker while the stuck call still holds the old one, and is right; close() ends
    the worker."""
    from ferry.remote import PeerGoneError, RemoteTier, RemoteTimeoutError

    ref, mirror = random_kv(13), random_kv(14)
    release = threading.Event()
    with RemoteTier(mirror, timeout_s=0.3) as tier:
        tier.upload(ref)
        first = tier._worker
        assert first is not None and first.thread.is_alive()
        try:
            with pytest.raises(RemoteTimeoutError, match=rf"peer {tier.peer}: a stuck call: no answer within 0.3 s"):
                tier._batch("a stuck call", lambda engine: release.wait(30.0))
            with pytest.raises(PeerGoneError, match="reconnect"):
                tier.pull(0, 24, "ragged", lengths=lens)
            tier.reconnect()
            k, v, _ = tier.pull(1, 24, "ragged", lengths=lens)
            rk, rv = ref.window(1, 24, lengths=lens)
            assert (delivered(k, "ragged"), delivered(v, "ragged")) == (delivered(rk, "ragged"),
                                                                        delivered(rv, "ragged"))
            assert first.thread.is_alive() and tier._worker is not first  # still in the stuck call
        finally:
            release.set()
        first.thread.join(10.0)
        assert not first.thread.is_alive()  # let go: it ended once its call returned
        second = tier._worker
        assert second is not None and second.thread.is_alive()
    assert tier._worker is None and not second.thread.is_alive()


@needs_engine
def test_a_call_made_while_another_threads_call_runs_gets_a_worker_of_its_own() -> None:
    """Two threads' calls at once: the second does not wait behind the first (its timeout counts
    its own call, as when each call had a thread of its own); a worker whose thread is gone is
    replaced by the next call."""
    from ferry.remote import RemoteTier

    started, release = threading.Event(), threading.Event()
    with RemoteTier(random_kv(15), timeout_s=5.0) as tier:
        def held(engine: Any) -> int:
            started.set()
            release.wait(30.0)
            return 0

        first = threading.Thread(target=tier._call_engine, args=(held,))
        first.start()
        try:
            assert started.wait(10.0)
            assert tier._call_engine(lambda engine: 7) == (True, [7])
        finally:
            release.set()
            first.join(10.0)
        assert tier._worker is not None and tier._call_engine(lambda engine: 8) == (True, [8])
        tier._worker.stop(wait_s=10.0)  # a worker that is gone (a forked child has none): the next call starts one
        assert tier._call_engine(lambda engine: 9) == (True, [9])


# ------------------------------------------------------------ the async batch, prefetched under compute


@needs_engine
def test_the_next_layers_async_pull_travels_while_this_one_computes_and_lands_as_the_sync_pulls(
        lens: ferry.Tensor) -> None:
    """Each layer's pull issued as the engine's async batch while the layer before it is used (the
    prefetch of a decode step's next layer), waited before use: every window, cell-per-stream
    under every policy and paged, the same bytes and the same counts as the sync pull's; a window
    is untouched until its wait."""
    from ferry.remote import RemoteTier

    ref, mirror = random_kv(10), random_kv(11)
    with RemoteTier(mirror) as tier:
        tier.upload(ref)
        for policy in ("flat", "ranges", "plan", "ragged"):
            sync = [tier.pull(layer, 24, policy, lengths=lens) for layer in range(N_LAYER)]
            want = [(delivered(k, policy), delivered(v, policy), st) for k, v, st in sync]
            sentinel_fill(mirror)
            pending = tier.pull_async(0, 24, policy, lengths=lens)
            for layer in range(N_LAYER):
                nxt = tier.pull_async(layer + 1, 24, policy, lengths=lens) if layer + 1 < N_LAYER else None
                if nxt is not None:  # in flight while this layer computes: its window not written yet
                    assert bytes(mirror.k(layer + 1).get()) == bytes([SENTINEL]) * mirror.k(layer + 1).nbytes
                k, v, st = pending.wait()
                wk, wv, wst = want[layer]
                assert (delivered(k, policy), delivered(v, policy)) == (wk, wv), (policy, layer)
                assert (st.layer, st.pieces, st.bytes, st.bytes_read) == (layer, wst.pieces, wst.bytes, wst.bytes_read)
                assert pending.wait()[2] is st  # waiting again gives the same
                if nxt is not None:
                    pending = nxt
    ref_p, _ = random_paged(12, 0.5)
    mirror_p, _ = random_paged(12, 0.5)
    sentinel_fill(mirror_p)
    with RemoteTier(mirror_p) as tier:
        tier.upload(ref_p)
        for t in tier.pull(0, 24)[:2]:  # the tier's dense windows (one K and one V for every layer): cells unread stay
            t.set(bytes([SENTINEL]) * t.nbytes)
        first = tier.pull_async(0, 24)
        second = tier.pull_async(1, 24)
        for layer, pending in ((0, first), (1, second)):
            k, v, st = pending.wait()
            rk, rv = ref_p.window(layer, 24)
            assert bytes(k.get()) == delivered(rk, "flat") and bytes(v.get()) == delivered(rv, "flat")
            assert st.bytes == st.bytes_read == 2 * (20 + 9 + 16) * CELL


@needs_engine
def test_a_peer_killed_under_an_async_batch_refuses_its_wait_naming_the_layer_and_writes_nothing(
        lens: ferry.Tensor) -> None:
    """The server stopped, a layer's async batch issued to it, the server killed: the wait is
    refused naming the peer and the layer, the window untouched; after reconnect() the next async
    pull is right."""
    from ferry.remote import PeerGoneError, RemoteError, RemoteTier

    ref, mirror = random_kv(14), random_kv(15)
    with RemoteTier(mirror, timeout_s=5.0) as tier:
        tier.upload(ref)
        sentinel_fill(mirror)
        pid = tier.server_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        stopped(pid)
        try:
            pending = tier.pull_async(1, 24, "ragged", lengths=lens)
        finally:
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(RemoteError, match=rf"peer {tier.peer}: layer 1 \(async\)") as err:
            pending.wait()
        assert isinstance(err.value, PeerGoneError) and "nothing was written" in err.value.message
        with pytest.raises(PeerGoneError, match="layer 1"):
            pending.wait()  # the same refusal again, still nothing written
        assert bytes(mirror.k(1).get()) == bytes([SENTINEL]) * mirror.k(1).nbytes
        assert bytes(mirror.v(1).get()) == bytes([SENTINEL]) * mirror.v(1).nbytes
        tier.reconnect()
        k, v, _ = tier.pull_async(1, 24, "ragged", lengths=lens).wait()
        rk, rv = ref.window(1, 24, lengths=lens)
        assert delivered(k, "ragged") == delivered(rk, "ragged") and delivered(v, "ragged") == delivered(rv, "ragged")


# ------------------------------------------------------------ the command line


@needs_engine
def test_bench_and_validate_remote_pull_every_policy_and_find_the_local_bytes(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`ferry bench --remote` adds a row per npl and policy, each pulled window identical to the local
    cache's; ragged moves fewer bytes than flat; `ferry validate --remote` passes its gate with them."""
    from ferry.cli import main

    tiny = ["-c", "128", "-npl", "2", "-npp", "16", "-ntg", "2", "--head-dim", "32", "--kv-heads", "1",
            "--heads", "2", "--layers", "2"]
    assert main(["bench", *tiny, "--rounds", "1", "--repeat", "1", "--policy", "flat,ragged", "--lengths",
                 "uniform", "--remote", "--json"]) == 0
    remote = json.loads(capsys.readouterr().out)[-1]["remote"]
    rows = remote["rows"]
    assert [(r["npl"], r["policy"], r["identical"]) for r in rows] == [(2, "flat", True), (2, "ragged", True)]
    assert [(s["policy"], s["prefetch"], s["pulls_per_step"], s["identical"]) for s in remote["steps"]] == \
        [("flat", 0, 4, True), ("flat", 1, 4, True), ("ragged", 0, 4, True), ("ragged", 1, 4, True)]
    assert rows[1]["bytes_per_step"] < rows[0]["bytes_per_step"]
    assert main(["validate", *tiny, "--no-overlap", "--policy", "flat,ranges,ragged", "--remote"]) == 0
    out = capsys.readouterr().out
    assert "remote tier" in out and "DIFFERENT" not in out and out.count("identical") >= 3
    # the decode steps whose layers the scheduler pulled: each policy's outputs, serial and prefetching
    assert "pulled by the scheduler" in out and out.count("identical / identical") == 3


@needs_engine
def test_the_remote_steps_check_finds_a_tier_that_does_not_land_its_pulls(monkeypatch: pytest.MonkeyPatch,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The scheduler's steps in `validate --remote` can fail: with fetch_layers doing nothing, the tier's
    own cache (wrong until pulled) is read, the outputs differ from the local cache's, and the gate
    fails saying DIFFERENT."""
    from ferry.cli import main
    from ferry.remote import RemoteTier

    monkeypatch.setattr(RemoteTier, "fetch_layers", lambda self, layers=None, merge=True: None)
    tiny = ["-c", "128", "-npl", "2", "-npp", "16", "-ntg", "2", "--head-dim", "32", "--kv-heads", "1",
            "--heads", "2", "--layers", "2"]
    assert main(["validate", *tiny, "--no-overlap", "--policy", "ragged", "--remote"]) != 0
    out = capsys.readouterr().out
    assert "DIFFERENT / DIFFERENT" in out


# ------------------------------------------------------------ a peer started alone


SERVE = ["-c", "128", "-npl", "2", "--head-dim", "32", "--kv-heads", "1", "--layers", "2"]


def serve(*extra: str, args: Tuple[str, ...] = (*SERVE, "--json")) -> Tuple["subprocess.Popen[str]", str]:
    """`ferry remote-serve` of a tiny cache (SERVE) as a separate process on the loopback, and the
    segment name it prints (its first line: JSON, or the text's)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(ferry.__file__).parent.parent), *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = subprocess.Popen([sys.executable, "-m", "ferry.cli", "remote-serve", *args, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"remote-serve exited with {proc.wait()}"
    return proc, str(json.loads(line)["peer"]) if line.startswith("{") else line.split()[1]


@needs_engine
def test_remote_serve_runs_with_no_arguments_until_sigterm() -> None:
    """Every verb runs with no arguments (test_cli.py runs the others in-process; this one serves until
    killed): it says the segment name to give a client, and SIGTERM ends it with status 0."""
    proc, name = serve(args=())
    try:
        assert name.startswith("127.0.0.1:")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def peer() -> Iterator[Tuple["subprocess.Popen[str]", str]]:
    proc, name = serve()
    yield proc, name
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def served_cache(seed: int = 0) -> ferry.KVCache:
    """The cache `ferry remote-serve` of SERVE holds at seed: made here from the seed alone."""
    from ferry.workloads.common import KVGeometry
    from ferry.workloads.remote import random_cache

    return random_cache(KVGeometry(n_layer=2, head_dim=32, n_head_kv=1), 128, 2, seed)


@needs_engine
def test_a_peer_started_alone_serves_its_cache_and_refuses_another_layout(
        peer: Tuple["subprocess.Popen[str]", str], lens: ferry.Tensor) -> None:
    """A tier pointed at `ferry remote-serve` (its own process) reads the published layout and pulls
    windows byte-identical to the same cache held locally, under every policy; a tier whose cache
    has another layout is refused, naming the peer and each field that differs; SIGTERM ends the
    server cleanly (status 0)."""
    from ferry.remote import EngineUnavailableError, PeerLayoutError, RemoteTier

    proc, name = peer
    ref = served_cache()
    mirror = served_cache(1)
    sentinel_fill(mirror)
    lens2 = ferry.Tensor.from_numpy(ferry.CPUBackend(), np.array([7, 30], np.int32))
    with RemoteTier(mirror, peer=name) as tier:
        assert tier.peer == name and tier.server_pid is None
        assert tier.peer_layout is not None and tier.peer_layout["contents"] == {"seed": 0}
        for policy in ("flat", "ranges", "plan", "ragged"):
            k, v, st = tier.pull(1, 32, policy, lengths=lens2)
            rk, rv = ref.window(1, 32, lengths=lens2)
            assert delivered(k, policy) == delivered(rk, policy), policy
            assert delivered(v, policy) == delivered(rv, policy), policy
            assert st.bytes == st.bytes_read > 0
    other = ferry.KVCache("f16", "f16", 32, 1, 128, 4, 2)  # 4 streams where the peer has 2
    with pytest.raises(PeerLayoutError, match=rf"peer {name} holds another layout .*n_stream: 2 at the peer, 4 here"):
        RemoteTier(other, peer=name)
    with pytest.raises(ferry.InvalidArgumentError, match="peer must be HOST:PORT"):
        RemoteTier(other, peer="localhost")
    with pytest.raises(ferry.InvalidArgumentError, match="protocol must be one of tcp, rdma, got 'udp'"):
        RemoteTier(other, peer=name, protocol="udp")
    with pytest.raises(EngineUnavailableError, match="engine runs over tcp; a tier over rdma needs a process"):
        RemoteTier(other, peer=name, protocol="rdma")  # the transport is the process's: chosen when it starts
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


@needs_engine
def test_a_peer_started_alone_killed_is_named_and_reconnect_reads_it_restarted(
        peer: Tuple["subprocess.Popen[str]", str], lens: ferry.Tensor) -> None:
    """The peer killed: the pull is refused (PeerGoneError naming the peer and the layer), nothing
    written; refused again until reconnect(); reconnect() to the restarted peer (the engine picks
    its port) reads the right bytes again; reconnect() with no peer answering names the address."""
    from ferry.remote import PeerGoneError, RemoteTier

    proc, name = peer
    ref, mirror = served_cache(), served_cache(1)
    lens2 = ferry.Tensor.from_numpy(ferry.CPUBackend(), np.array([7, 30], np.int32))
    with RemoteTier(mirror, peer=name) as tier:
        tier.pull(0, 32, "ragged", lengths=lens2)
        proc.kill()
        proc.wait()
        sentinel_fill(mirror)
        with pytest.raises(PeerGoneError, match=rf"peer {name}: layer 1: .*the peer is gone"):
            tier.pull(1, 32, "ragged", lengths=lens2)
        assert all(bytes(t.get()) == bytes([SENTINEL]) * t.nbytes for t in (mirror.k(1), mirror.v(1)))
        with pytest.raises(PeerGoneError, match=rf"peer {name}: .*reconnect\(\) first"):
            tier.pull(0, 32, "ragged", lengths=lens2)
        with pytest.raises(PeerGoneError, match=rf"peer {name}: no peer answers there"):
            tier.reconnect()
        again, again_name = serve()
        try:
            tier.reconnect(again_name)
            assert tier.peer == again_name
            for layer in range(N_LAYER):
                k, v, _ = tier.pull(layer, 32, "ragged", lengths=lens2)
                rk, rv = ref.window(layer, 32, lengths=lens2)
                assert delivered(k, "ragged") == delivered(rk, "ragged")
                assert delivered(v, "ragged") == delivered(rv, "ragged")
        finally:
            again.kill()
            again.wait()


@needs_engine
def test_bench_and_validate_remote_read_a_peer_started_alone_and_refuse_another_layout_or_seed(
        peer: Tuple["subprocess.Popen[str]", str], capsys: pytest.CaptureFixture[str]) -> None:
    """`--remote HOST:PORT` reads the peer instead of starting one: every pulled window identical to
    the local cache made from the same seed; another -npl or --seed than the peer's is refused,
    naming the peer and what differs."""
    from ferry.cli import main

    _, name = peer
    tiny = ["-c", "128", "-npl", "2", "-npp", "16", "-ntg", "2", "--head-dim", "32", "--kv-heads", "1",
            "--heads", "2", "--layers", "2"]
    assert main(["bench", *tiny, "--rounds", "1", "--repeat", "1", "--policy", "flat,ragged", "--lengths",
                 "uniform", "--remote", name, "--json"]) == 0
    remote = json.loads(capsys.readouterr().out)[-1]["remote"]
    assert remote["peer"] == name and [r["identical"] for r in remote["rows"]] == [True, True]
    assert main(["validate", *tiny, "--no-overlap", "--policy", "flat,ragged", "--remote", name]) == 0
    assert f"remote tier ({name}" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=rf"peer {name} holds another layout .*n_stream: 2 at the peer, 4 here"):
        main(["validate", *tiny[:2], "-npl", "4", *tiny[4:], "--no-overlap", "--remote", name])
    with pytest.raises(SystemExit, match=rf"peer {name} holds {{'seed': 0}}.*--seed 3"):
        main(["validate", *tiny, "--no-overlap", "--seed", "3", "--remote", name])
    with pytest.raises(SystemExit) as e:
        main(["bench", *tiny, "--remote", "nohost"])
    assert e.value.code == 2 and "--remote takes HOST:PORT" in capsys.readouterr().err
