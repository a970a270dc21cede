"""A stand-in device on a link with a memory size, what every backend says of its memory, and
ferry.measure_link.

The link's checks here are what its model guarantees on any host, busy or not: a transfer
never completes sooner than latency + bytes / bandwidth (each run, strictly), measure_link
never finds the link faster than modelled, and a link faster than the host can copy is
reported not reached. How close to the model the host comes is measured, not asserted:
tools/link-accuracy prints it.
"""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import replace
from typing import Callable

import numpy as np
import pytest

import ferry

MIB = 1 << 20
LATENCY_US = 30.0
RUNS = 3
FAKE = os.environ.get("FERRY_FAKE_CUDART") == "1"


def check_times(run: Callable[[], None], modelled: float) -> None:
    """A warm-up, then RUNS runs, every one at least the modelled time."""
    run()
    for _ in range(RUNS):
        t0 = time.perf_counter()
        run()
        took = time.perf_counter() - t0
        assert took >= modelled, f"{took * 1e3:.3f} ms is sooner than the modelled {modelled * 1e3:.3f} ms"


@pytest.mark.parametrize("gbps", [2.45, 0.33])
@pytest.mark.parametrize("kind", ["set", "get", "set_2d", "get_2d"])
def test_transfer_takes_the_modelled_time(gbps: float, kind: str) -> None:
    nbytes, row = 4 * MIB, 4096
    dev = ferry.StandinBackend(link_gbps=gbps, latency_us=LATENCY_US)
    t = dev.alloc_tensor("f32", [2 * nbytes // 4])  # room for every other row
    host = np.ones(nbytes, np.uint8)
    out = np.empty(nbytes, np.uint8)

    def get() -> None:  # into memory of ours: a new bytes would add a copy the link does not make
        dev.get_async(t, out)
        dev.synchronize()

    def get_2d() -> None:
        dev.get_2d_async(t, out, 0, row, nbytes // row, 2 * row)
        dev.synchronize()

    runs = {
        "set": lambda: t.set(host),
        "get": get,
        "set_2d": lambda: dev.set_2d(t, host, 0, row, nbytes // row, 2 * row),
        "get_2d": get_2d,
    }
    modelled = LATENCY_US * 1e-6 + nbytes / (gbps * 1e9)
    check_times(runs[kind], modelled)
    stats = dev.link_stats
    assert stats.transfers >= 1 + RUNS
    assert stats.modelled_seconds >= (1 + RUNS) * modelled * 0.999


@pytest.mark.parametrize("gbps", [2.45, 0.33])
def test_measure_link_is_never_faster_than_the_model(gbps: float) -> None:
    dev = ferry.StandinBackend(link_gbps=gbps)
    m = ferry.measure_link(dev, nbytes=16 * MIB)
    assert m.nbytes == 16 * MIB and m.device == "CPU (stand-in device)" and not m.pinned
    assert len(m.times) == 5 and m.seconds == min(m.times)
    assert m.modelled_gbps == gbps
    assert m.gbps <= gbps, m  # never faster than the link
    assert all(t >= m.nbytes / (gbps * 1e9) for t in m.times), m
    assert m.reached is not None  # modelled: reached or not, it says which


def test_link_beyond_the_host_is_reported() -> None:
    dev = ferry.StandinBackend(link_gbps=1e5)  # 100 TB/s
    m = ferry.measure_link(dev, nbytes=16 * MIB, repeats=2)
    assert m.reached is False
    assert m.gbps < 1e5
    stats = dev.link_stats  # the last timed copy's
    assert stats.transfers == 1 and stats.late == 1 and not stats.reached
    assert stats.late_seconds > 0 and stats.copy_seconds > stats.modelled_seconds
    assert stats.host_gbps is not None and stats.host_gbps < 1e5


def test_no_link_is_measured_not_modelled() -> None:
    dev = ferry.StandinBackend()
    assert (dev.link_gbps, dev.latency_us, dev.memory_size) == (None, 0.0, None)
    m = ferry.measure_link(dev, nbytes=MIB, repeats=1)
    assert m.gbps > 0 and m.modelled_gbps is None and m.reached is None
    assert dev.link_stats == ferry.stats.LinkStats(0, 0, 0.0, 0.0, 0, 0.0)  # nothing modelled, nothing counted
    assert dev.link_stats.host_gbps is None


def test_a_standin_tells_back_its_link_latency_and_memory_and_refuses_bad_ones() -> None:
    dev = ferry.StandinBackend(link_gbps=3.3, latency_us=12.5, memory=5 * MIB)
    assert (dev.link_gbps, dev.latency_us, dev.memory_size) == (3.3, 12.5, 5 * MIB)
    for bad in ({"link_gbps": -1.0}, {"link_gbps": 2e6}, {"link_gbps": float("nan")}, {"latency_us": -1.0},
                {"link_gbps": "fast"}, {"latency_us": True}, {"memory": -1}, {"memory": 1.5}):
        with pytest.raises(ferry.InvalidArgumentError):
            ferry.StandinBackend(**bad)  # type: ignore[arg-type]


def test_memory_past_the_device_is_refused_and_freeing_returns_it() -> None:
    memory, ask = 64 * MIB, 40 * MIB
    dev = ferry.StandinBackend(memory=memory)
    assert dev.memory() == ferry.stats.MemoryInfo(free=memory, total=memory)
    a = dev.alloc_buffer(ask)
    assert dev.memory() == (memory - ask, memory) and dev.memory().used == ask
    with pytest.raises(ferry.OutOfMemoryError) as e:
        dev.alloc_buffer(ask)
    assert "CPU (stand-in device)" in e.value.message
    assert re.search(rf"\b{ask} bytes asked, {memory - ask} of its {memory} bytes free", e.value.message), e.value.message
    assert dev.memory().free == memory - ask  # the refusal took nothing
    with pytest.raises(ferry.OutOfMemoryError):  # nor does a tensor's buffer
        dev.alloc_tensor("f32", [ask // 4])
    a.close()
    assert dev.memory().free == memory
    b = dev.alloc_buffer(ask)  # the same ask, now that the bytes are back
    c = dev.alloc_buffer(memory - ask)
    assert dev.memory().free == 0
    del b, c
    assert dev.memory().free == memory  # a dropped Buffer frees its memory


def test_kv_cache_past_the_device_is_refused() -> None:
    """A cache on the device's own buffer type: the refusal names the device and leaves it whole."""
    dev = ferry.StandinBackend(memory=MIB)
    with pytest.raises(ferry.OutOfMemoryError, match=r"stand-in device.*bytes asked"):
        ferry.KVCache("f16", "f16", 64, 8, 4096, 1, 4, buffer_type=dev.buffer_type)
    assert dev.memory().free == MIB


def test_cpu_memory_is_the_hosts() -> None:
    mem = ferry.CPUBackend().memory()
    assert mem.total > mem.free > 0 and not mem.unlimited
    assert ferry.StandinBackend().memory().total == mem.total  # no memory of its own: the host's
    assert ferry.DummyBackend(real_memory=True).memory().total == mem.total
    synthetic = ferry.DummyBackend().memory()
    assert synthetic.unlimited and synthetic.free == synthetic.total == 2**64 - 1


def test_memory_of_a_closed_backend_raises_freed() -> None:
    dev = ferry.StandinBackend(memory=MIB)
    dev.close()
    with pytest.raises(ferry.FreedBufferError):
        dev.memory()


def test_measure_link_refuses_what_it_cannot_measure() -> None:
    dev = ferry.StandinBackend()
    with pytest.raises(ferry.UnsupportedError, match="pinned"):
        ferry.measure_link(dev, pinned=True)
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.measure_link(dev, nbytes=3)
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.measure_link(dev, repeats=0)
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.measure_link("CUDA0")  # type: ignore[arg-type]
    with pytest.raises(ferry.OutOfMemoryError):
        ferry.measure_link(ferry.StandinBackend(memory=MIB), nbytes=2 * MIB)


def test_prefetched_steps_on_a_link_give_the_same_bytes() -> None:
    """The link holds copies back, never changes them: a decode step on a slow linked stand-in,
    serial and prefetched on its copy queue, gives the bytes of an unlinked one, and the link
    carried every window."""
    head_dim, n_head_kv, n_head, n_stream, n_layer, n_kv = 16, 2, 4, 3, 3, 40
    kv = ferry.KVCache("f16", "f16", head_dim, n_head_kv, n_stream * 48, n_stream, n_layer)
    rng = np.random.default_rng(7)
    for layer in range(n_layer):
        for t in (kv.k(layer), kv.v(layer)):
            t.set(rng.uniform(-1, 1, t.nbytes // 2).astype(np.float16))
    q = rng.uniform(-1, 1, (n_stream, 1, n_head, head_dim)).astype(np.float32)

    def run(split: ferry.Backend, prefetch: int) -> bytes:
        qs = [ferry.Tensor.from_numpy(split, q, name=f"q{i}") for i in range(n_layer)]
        kv_len = ferry.Tensor.from_numpy(split, np.array([n_kv, 7, 0], np.int32), name="kv_len")
        with ferry.Scheduler([split, ferry.CPUBackend()], policy="ranges", prefetch=prefetch) as sched:
            windows = [kv.window(layer, n_kv) for layer in range(n_layer)]
            outs = ferry.attention_step(sched, split, windows, qs, kv_len, False)
            sched.compute(ferry.Graph(*outs))
            return b"".join(o.get() for o in outs)

    plain = run(ferry.StandinBackend(), 0)
    for prefetch in (0, 2):
        linked = ferry.StandinBackend(link_gbps=0.33, latency_us=20)
        assert run(linked, prefetch) == plain
        stats = linked.link_stats
        assert stats.transfers >= 2 * n_layer and stats.modelled_seconds >= stats.transfers * 20e-6


needs_cuda = pytest.mark.skipif(not ferry.cuda_available(), reason="no CUDA device (or fake runtime)")


@needs_cuda
def test_a_cuda_buffer_takes_its_bytes_from_the_devices_free_memory() -> None:
    dev = ferry.CUDABackend()
    before = dev.memory()
    assert before.total >= before.free > 64 * MIB
    buf = dev.alloc_buffer(64 * MIB)
    after = dev.memory()
    if FAKE:  # the fake runtime's device: 1 TiB, each allocation taking what it asks
        assert before.total == 1 << 40
        assert before.free - after.free == 64 * MIB
    else:
        assert after.free < before.free
    buf.close()
    if FAKE:
        assert dev.memory() == before


@needs_cuda
@pytest.mark.parametrize("pinned", [False, True])
def test_measure_link_on_cuda_measures_from_pageable_and_pinned_memory(pinned: bool) -> None:
    """Runs on CUDA from pageable and pinned memory, its fit too; under the fake runtime its figures mean
    nothing."""
    m = ferry.measure_link(ferry.CUDABackend(), pinned=pinned, nbytes=4 * MIB, repeats=2, fit=True)
    assert m.gbps > 0 and m.pinned is pinned and m.device.startswith("CUDA")
    assert m.modelled_gbps is None and m.reached is None
    assert m.fit is not None and len(m.fit.points) == 6  # its 2-D copies are cudaMemcpy2DAsync's
    assert m.fit.latency_us >= 0 and m.fit.row_ns >= 0 and m.fit.gbps > 0


# ---------------------------------------------------------------- a link that charges per row


def test_link_charges_per_row() -> None:
    """A 2-D transfer of n rows costs latency + n * row_ns + bytes / bandwidth, by the link's own
    counters; a plain transfer, or a 2-D one of a single row, pays no row."""
    dev = ferry.StandinBackend(link_gbps=2.0, latency_us=10.0, row_ns=5000.0)
    assert (dev.link_gbps, dev.latency_us, dev.row_ns) == (2.0, 10.0, 5000.0)
    t = dev.alloc_tensor("f32", [16384])
    rows, row = 64, 256
    dev.set_2d(t, np.ones(rows * row, np.uint8), 0, row, rows, 2 * row)
    s = dev.link_stats
    assert (s.transfers, s.rows) == (1, rows)
    assert s.modelled_seconds == pytest.approx(10e-6 + rows * 5e-6 + rows * row / 2e9, rel=1e-9)
    dev.reset_link_stats()
    t.set(np.ones(rows * row, np.uint8))
    dev.set_2d(t, np.ones(row, np.uint8), 0, row, 1, 2 * row)
    s = dev.link_stats
    assert (s.transfers, s.rows) == (2, 0)
    assert s.modelled_seconds == pytest.approx(2 * 10e-6 + (rows + 1) * row / 2e9, rel=1e-9)
    # the copy path weighs its routes by the link's figures
    m = ferry.plan.CopyCostModel.of_backend(dev)
    assert (m.call_us, m.row_ns, m.gbps, m.line_bytes, m.small_row_bytes) == (10.0, 5000.0, 2.0, 0, 0)
    for bad in (-1.0, 2e6, float("nan")):
        with pytest.raises(ferry.InvalidArgumentError, match="row_ns"):
            ferry.StandinBackend(row_ns=bad)
    with pytest.raises(ferry.InvalidArgumentError, match="row_ns"):
        ferry.StandinBackend(row_ns="5")  # type: ignore[arg-type]


def test_fit_link_recovers_the_modelled_link() -> None:
    """fit_link on copies timed by the link's own model (its modelled_seconds, no wall clock): the
    stand-in's latency, row cost and bandwidth, back to rounding."""
    dev = ferry.StandinBackend(link_gbps=3.0, latency_us=40.0, row_ns=2500.0)
    t = dev.alloc_tensor("f32", [1 << 18])
    points = []
    for nbytes, rows in ((4096, 1), (65536, 1), (1 << 20, 1), (65536, 16), (65536, 256), (65536, 2048)):
        dev.reset_link_stats()
        width = nbytes // rows
        dev.set_2d(t, np.ones(nbytes, np.uint8), 0, width, rows, 2 * width)
        points.append((nbytes, rows, dev.link_stats.modelled_seconds))
    fit = ferry.link.fit_link(points)
    assert fit.latency_us == pytest.approx(40.0, rel=1e-6)
    assert fit.row_ns == pytest.approx(2500.0, rel=1e-6)
    assert fit.gbps == pytest.approx(3.0, rel=1e-6)
    model = ferry.plan.CopyCostModel.from_link(fit)
    assert ferry.plan.plan_cost([ferry.Copy2D(0, 32, 2048, 64)], model) == pytest.approx(points[-1][2], rel=1e-6)
    with pytest.raises(ferry.InvalidArgumentError, match="at least 2 of each"):
        ferry.link.fit_link(points[:3])
    with pytest.raises(ferry.InvalidArgumentError, match="seconds positive"):
        ferry.link.fit_link(points + [(4096, 1, 0.0)])
    with pytest.raises(ferry.InvalidArgumentError, match="not \\(bytes, rows, seconds\\)"):
        ferry.link.fit_link(points + [(4096, 1)])  # type: ignore[list-item]


def test_fit_link_recovers_a_large_row_cost_from_given_points() -> None:
    """fit_link on the times the link's model gives (no copy, no clock) for measure_link(fit=True)'s
    copies of 1 MiB: plain ones of 1 MiB, 4 KiB and 64 KiB, 2-D ones of 64 KiB in 16, 256 and 2048
    rows, on a link of 500 us a call, 20 us a row and 1 GB/s: its three figures, back to rounding."""
    def seconds(nbytes: int, rows: int) -> float:
        return 500e-6 + (rows * 20e-6 if rows > 1 else 0.0) + nbytes / 1e9

    shape = [(MIB, 1), (MIB // 256, 1), (MIB // 16, 1), (MIB // 16, 16), (MIB // 16, 256), (MIB // 16, 2048)]
    fit = ferry.link.fit_link([(b, r, seconds(b, r)) for b, r in shape])
    assert fit.latency_us == pytest.approx(500.0, rel=1e-6)
    assert fit.row_ns == pytest.approx(20000.0, rel=1e-6)
    assert fit.gbps == pytest.approx(1.0, rel=1e-6)
    model = ferry.plan.CopyCostModel.from_link(fit)
    assert (model.call_us, model.row_ns, model.gbps) == (fit.latency_us, fit.row_ns, fit.gbps)
    dev = ferry.StandinBackend(link_gbps=1.0, latency_us=500.0, row_ns=20000.0)
    model.use_for(dev)
    assert ferry.plan.CopyCostModel.of_backend(dev) == model
    ferry.plan.CopyCostModel.restore(dev)
    assert ferry.plan.CopyCostModel.of_backend(dev).row_ns == 20000.0
    # times that leave nothing to the bytes (a busy host's can): a bandwidth too fast to measure,
    # which the model takes as its largest
    assert ferry.plan.CopyCostModel.from_link(fit._replace(gbps=math.inf)).gbps == 1e12


def test_measure_link_fits_a_row_cost() -> None:
    """measure_link(fit=True) on a stand-in charging a large row cost: the copies it times, and the
    figures fit_link gives for those times (what the times are is the host's: a busy host only adds
    to them, so no bound on them is asserted; test_fit_link_* check the fit, and the copy cost model
    taking it, on given points)."""
    dev = ferry.StandinBackend(link_gbps=1.0, latency_us=500.0, row_ns=20000.0)
    m = ferry.measure_link(dev, nbytes=MIB, repeats=2, fit=True)
    assert m.fit is not None and len(m.fit.points) == 6
    assert [(b, r) for b, r, _ in m.fit.points] == [(MIB, 1), (MIB // 256, 1), (MIB // 16, 1), (MIB // 16, 16),
                                                    (MIB // 16, 256), (MIB // 16, 2048)]
    assert m.fit.points[0][2] == m.seconds and all(s > 0 for _, _, s in m.fit.points)
    assert m.fit == ferry.link.fit_link(m.fit.points)
    no_curve = dict(piece_floor_gbps=0.0, piece_knee_bytes=0.0, piece_steepness=0.0, merge_margin=0.0)  # m.pieces
    assert replace(ferry.plan.CopyCostModel.from_link(m), **no_curve) == ferry.plan.CopyCostModel.from_link(m.fit)
    assert ferry.measure_link(dev, nbytes=MIB, repeats=1).fit is None
    with pytest.raises(ferry.InvalidArgumentError, match="without fit"):
        ferry.plan.CopyCostModel.from_link(ferry.measure_link(dev, nbytes=MIB, repeats=1))
    with pytest.raises(ferry.InvalidArgumentError, match="nbytes 4096 is less than 8192"):
        ferry.measure_link(dev, nbytes=4096, fit=True)
    with pytest.raises(ferry.InvalidArgumentError, match="fit"):
        ferry.measure_link(dev, fit="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["flat", "ranges", "plan", "ragged"])
def test_each_input_copy_predicts_its_time_by_the_links_model_and_takes_no_less(policy: str) -> None:
    """CopyStats.predicted_seconds is the copies the route made costed by the stand-in's model
    (a call's latency, a row's cost past the first, bytes at the link's rate): the flat copy one
    call of the span, ranges one 2-D copy of a range per stream, ragged its plan of used cells.
    The link holds each transfer at least that long, so the measured copy is never shorter."""
    dev = ferry.StandinBackend(link_gbps=2.0, latency_us=20.0, row_ns=2000.0)
    model = ferry.plan.CopyCostModel.of_backend(dev)
    kv = ferry.KVCache("f16", "f16", 64, 2, 4 * 256, 4, 1)
    lens = ferry.Tensor.from_numpy(ferry.CPUBackend(), np.array([40, 200, 0, 130], np.int32))
    k, _ = kv.window(0, 200, lengths=lens)
    dst = k.dup_layout(name="dst")
    dev.alloc_buffer_for(dst)
    ranges = ferry.copy_path.copy_ranges_of(k)
    want = {"flat": ferry.plan.flat_cost(k.nbytes, model),
            "ranges": ferry.plan.plan_cost([ranges], model),
            "plan": ferry.plan.plan_cost(ferry.plan.plan_copy(k), model),
            "ragged": ferry.plan.plan_cost(ferry.plan.plan_ragged(k, model), model)}[policy]
    st = ferry.copy_path.copy_input(dev, policy, k, dst)
    assert st.predicted_seconds == pytest.approx(want, rel=1e-9) and want > 0
    assert st.copy_seconds >= st.predicted_seconds * (1 - 1e-9)
    if policy == "ragged":
        assert st.bytes_copied == (40 + 200 + 0 + 130) * 256


# ---------------------------------------------------------------- pieces priced by size, named links


def curve_model(latency_us: float, gbps: float, floor: float, knee: float, steep: float) -> ferry.plan.CopyCostModel:
    """A copy cost model of nothing but a latency and a piece curve."""
    return ferry.plan.CopyCostModel(call_us=latency_us, row_ns=0.0, gbps=gbps, line_bytes=0, small_row_bytes=0,
                                    small_row_efficiency=1.0, wide_pitch_bytes=0, wide_pitch_row_ns=0.0,
                                    piece_floor_gbps=floor, piece_knee_bytes=knee, piece_steepness=steep)


PIECE_SIZES = ferry.link.PIECE_SIZES + (2 << 10, 12 << 10)


@pytest.mark.parametrize("curve", [(10.0, 8.0, 1.0, 16384.0, 4.0), (2.0, 24.5, 3.0, 8192.0, 2.0),
                                   (0.5, 50.0, 6.0, 2048.0, 1.0)])
def test_fit_piece_curve_recovers_a_known_curve_the_same_every_call(curve: tuple) -> None:
    """Exact times of plain copies over a known curve (its knee and steepness on the search's grid) fit
    back to it, and the same points give the same curve, call after call."""
    m = curve_model(*curve)
    pts = [(b, curve[0] * 1e-6 + m.piece_seconds(b)) for b in PIECE_SIZES]
    got = ferry.link.fit_piece_curve(pts)
    assert (got.latency_us, got.gbps, got.floor_gbps, got.knee_bytes, got.steepness) == pytest.approx(curve, rel=1e-6)
    assert all(ferry.link.fit_piece_curve(pts) == got for _ in range(3))
    assert [got.seconds(b) for b, _ in pts] == pytest.approx([s for _, s in pts], rel=1e-6)


def test_fit_piece_curve_gives_the_h100_step_within_its_published_rates() -> None:
    """The H100 PCIe 5 profile's step (between 24 and 28 KiB, no point between): the fit gives every
    copy's time within 3%, and the published rates: 5 to 7 GB/s small, 40 to 52 large."""
    dev = ferry.StandinBackend(link_profile="h100-pcie5")
    m = ferry.plan.CopyCostModel.of_backend(dev)
    pts = [(b, m.call_us * 1e-6 + m.piece_seconds(b)) for b in PIECE_SIZES]
    got = ferry.link.fit_piece_curve(pts)
    assert [got.seconds(b) for b, _ in pts] == pytest.approx([s for _, s in pts], rel=0.03)
    assert 5 <= got.floor_gbps <= 7 and 40 <= got.gbps <= 52 and 24 << 10 <= got.knee_bytes <= 28 << 10


def test_a_named_link_is_recovered_from_what_its_link_charges() -> None:
    """Plain copies of each size over the H100 profile slowed to 5 GB/s: what the link charges (its
    modelled seconds, no clock) fits back to the profile's latency, peak and floor, ten times slower."""
    dev = ferry.StandinBackend(link_profile="h100-pcie5", link_gbps=5.0)
    assert dev.link_gbps == 5.0 and dev.latency_us == pytest.approx(40.0)
    buf = dev.alloc_buffer(8 * MIB)
    dst = buf.new_tensor("f32", [2 * MIB])
    src = np.ones(8 * MIB, np.uint8)
    pts = []
    for b in PIECE_SIZES:
        dev.reset_link_stats()
        dev.set_async(dst, src[:b])
        dev.synchronize()
        pts.append((b, dev.link_stats.modelled_seconds))
    buf.close()
    got = ferry.link.fit_piece_curve(pts)
    assert got.latency_us == pytest.approx(40.0, rel=0.03)
    assert got.gbps == pytest.approx(5.0, rel=0.03) and got.floor_gbps == pytest.approx(0.6, rel=0.1)


def test_measure_link_fits_the_piece_curve() -> None:
    """measure_link(fit=True) also times plain copies of PIECE_SIZES up to nbytes and fits their curve
    (none with fewer than 4 sizes); what the times are is the host's, so only the fit is checked."""
    dev = ferry.StandinBackend(link_profile="h100-pcie5", link_gbps=2.0)
    m = ferry.measure_link(dev, nbytes=4 * MIB, repeats=1, fit=True)
    assert m.pieces is not None and [b for b, _ in m.pieces.points] == list(ferry.link.PIECE_SIZES)
    assert m.pieces == ferry.link.fit_piece_curve(m.pieces.points)
    assert ferry.measure_link(dev, nbytes=8192, repeats=1, fit=True).pieces is None  # 1, 4 and 8 KiB alone
    assert ferry.measure_link(dev, nbytes=8192, repeats=1).pieces is None


def test_fit_piece_curve_refuses_what_cannot_tell_the_curve_apart() -> None:
    with pytest.raises(ferry.InvalidArgumentError, match="3 sizes of copies: at least 4"):
        ferry.link.fit_piece_curve([(1024, 1e-6), (2048, 2e-6), (4096, 3e-6), (4096, 3e-6)])
    for bad, match in [((1024, -1.0), "point 1 has 1024 bytes"), ((0, 1e-6), "point 1 has 0 bytes"),
                       ((1024,), "point 1 is not"), ("ab", "point 1 is not"), ((1024, "x"), "point 1's seconds")]:
        with pytest.raises(ferry.InvalidArgumentError, match=match):
            ferry.link.fit_piece_curve([(512, 1e-6), bad, (4096, 3e-6), (8192, 4e-6), (16384, 5e-6)])


def test_named_links_are_listed_told_back_and_refused_naming_what_to_change() -> None:
    assert ferry.backend.link_profiles() == ["h100-pcie5", "pcie4", "gh200-c2c"]
    dev = ferry.StandinBackend(link_profile="pcie4", memory=MIB)
    assert dev.link_gbps == 24.5 and dev.piece_curve == (3.0, 26112.0, 40.0) and dev.memory_size == MIB
    assert ferry.StandinBackend(link_gbps=8).piece_curve is None
    with pytest.raises(ferry.InvalidArgumentError, match="unknown link 'h100' .known: h100-pcie5, pcie4, gh200-c2c"):
        ferry.StandinBackend(link_profile="h100")
    for bad in (5, "pcie4\0x", b"pcie4"):
        with pytest.raises(ferry.InvalidArgumentError, match="link_profile must be a name"):
            ferry.StandinBackend(link_profile=bad)  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgumentError, match="latency_us and row_ns are the link_profile's"):
        ferry.StandinBackend(link_profile="pcie4", latency_us=3.0)
    with pytest.raises(ferry.InvalidArgumentError, match="latency_us and row_ns are the link_profile's"):
        ferry.StandinBackend(link_profile="pcie4", row_ns=3.0)
    with pytest.raises(ferry.InvalidArgumentError, match="peak_gbps"):
        ferry.StandinBackend(link_profile="pcie4", link_gbps=-1.0)
    with pytest.raises(ferry.InvalidArgumentError, match="piece curve"):
        curve_model(0.0, 8.0, 9.0, 4096.0, 4.0)


def test_a_measured_piece_curve_prices_the_copy_models_pieces() -> None:
    """CopyCostModel.from_link of a measurement whose small pieces ran slower (given points, no clock):
    the model's pieces rise from the measured floor to the fitted bandwidth past the measured knee; a
    curve within PIECE_CURVE_SLOWER of the bandwidth, or none, leaves pieces flat."""
    latency, gbps = 10.0, 8.0
    m = curve_model(latency, gbps, 1.0, 16384.0, 4.0)
    pieces = ferry.link.fit_piece_curve([(b, latency * 1e-6 + m.piece_seconds(b)) for b in PIECE_SIZES])
    sizes = [1 << 20, 4 << 20, (1 << 20) // 16]
    pts = [(b, 1, latency * 1e-6 + b / (gbps * 1e9)) for b in sizes] + \
          [((1 << 20) // 16, r, latency * 1e-6 + (1 << 20) // 16 / (gbps * 1e9)) for r in (16, 256)]
    fit = ferry.link.fit_link(pts)
    measured = ferry.link.LinkMeasurement(gbps=gbps, seconds=pts[0][2], nbytes=1 << 20, pinned=False, device="x",
                                          times=(pts[0][2],), fit=fit, pieces=pieces)
    model = ferry.plan.CopyCostModel.from_link(measured)
    assert model.piece_floor_gbps == pytest.approx(1.0, rel=1e-6) and model.gbps == pytest.approx(gbps, rel=1e-6)
    assert (model.piece_knee_bytes, model.piece_steepness) == pytest.approx((16384.0, 4.0), rel=1e-6)
    assert model.piece_seconds(4096) == pytest.approx(m.piece_seconds(4096), rel=1e-5)
    flat = ferry.plan.CopyCostModel.from_link(measured._replace(pieces=pieces._replace(floor_gbps=0.9 * gbps)))
    assert flat.piece_floor_gbps == 0.0 and ferry.plan.CopyCostModel.from_link(fit).piece_floor_gbps == 0.0
    # the merge margin is the curve's own error: its largest relative residual (a curve that misses a point
    # by 7% asks merged spans to be predicted 7% faster); no curve, ferry's 10% (0)
    assert model.merge_margin == max(abs(pieces.seconds(b) - t) / t for b, t in pieces.points) < 0.01
    off = pieces._replace(points=tuple((b, t * (1.07 if b == PIECE_SIZES[0] else 1.0)) for b, t in pieces.points))
    assert ferry.plan.CopyCostModel.from_link(measured._replace(pieces=off)).merge_margin == \
        pytest.approx(0.07 / 1.07, rel=0.05)
    assert flat.merge_margin == 0.0 == ferry.plan.CopyCostModel.from_link(fit).merge_margin
