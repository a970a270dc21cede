"""Prefetching (Scheduler(prefetch=N)): windows copied on the split's copy queue while earlier
layers compute give the outputs and byte counts of the serial run; `ferry bench --overlap` and
`ferry validate` run both and say so; bad values are refused with a FerryError."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest

import ferry
from ferry.cli import bench as bench_cli
from ferry.cli import main as cli_main
from ferry.workloads.bench import run_bench
from ferry.workloads.bench_config import BenchConfig
from ferry.workloads.devices import DeviceConfig
from ferry.workloads.validate import ValidateConfig, run_validate

N_LAYER, N_STREAM, KV_SIZE, HEAD_DIM, N_HEAD_KV, N_HEAD, N_KV = 3, 3, 48, 16, 2, 4, 40


class Step:
    """A decode step of N_LAYER layers over a split cache on the host, attention on `split`."""

    def __init__(self, split: ferry.Backend, v_trans: bool = False) -> None:
        self.split, self.cpu, self.v_trans = split, ferry.CPUBackend(), v_trans
        self.kv = ferry.KVCache("f16", "f16", HEAD_DIM, N_HEAD_KV, N_STREAM * KV_SIZE, N_STREAM, N_LAYER,
                                v_trans=v_trans)
        rng = np.random.default_rng(5)
        for layer in range(N_LAYER):
            for t in (self.kv.k(layer), self.kv.v(layer)):
                t.set(rng.uniform(-1, 1, t.nbytes // 2).astype(np.float16))
        self.q = [ferry.Tensor.from_numpy(split, rng.uniform(-1, 1, (N_STREAM, 1, N_HEAD, HEAD_DIM))
                                          .astype(np.float32), name=f"q{i}") for i in range(N_LAYER)]
        self.kv_len = ferry.Tensor.from_numpy(split, np.array([N_KV, 7, 0], np.int32), name="kv_len")

    def run(self, policy: str, compact: bool, prefetch: int) -> Tuple[bytes, ferry.stats.SchedStats]:
        """One compute on a new scheduler: every output's bytes, and the run's stats."""
        with ferry.Scheduler([self.split, self.cpu], policy=policy, compact=compact, prefetch=prefetch) as sched:
            windows = [self.kv.window(layer, N_KV) for layer in range(N_LAYER)]
            outs = ferry.attention_step(sched, self.split, windows, self.q, self.kv_len, self.v_trans)
            graph = ferry.Graph(*outs)
            sched.compute(graph)
            return b"".join(o.get() for o in outs), sched.stats


BYTE_COUNTS = ("n_inputs", "bytes_read", "bytes_span", "bytes_copied", "copy_calls", "impl_calls", "predicted_seconds")


def same_as_serial(step: Step) -> None:
    for policy in ("flat", "ranges", "plan"):
        for compact in (False, True):
            serial, st0 = step.run(policy, compact, 0)
            assert (st0.prefetched, st0.ahead_inputs, st0.ahead_bytes) == (0, 0, 0)
            for depth in (1, 2, 8):
                out, st = step.run(policy, compact, depth)
                assert out == serial, (policy, compact, depth)
                assert {k: getattr(st, k) for k in BYTE_COUNTS} == {k: getattr(st0, k) for k in BYTE_COUNTS}
                # every window but the first layer's K, which the calling thread copies itself
                assert st.prefetched == 2 * N_LAYER - 1
                assert st.ahead_inputs == 2 * min(depth, N_LAYER - 1)
                assert st.ahead_bytes > 0 and st.copy_seconds >= 0


@pytest.mark.parametrize("v_trans", [False, True])
def test_standin_outputs_and_bytes_as_serial(v_trans: bool) -> None:
    same_as_serial(Step(ferry.StandinBackend(), v_trans))


@pytest.mark.skipif(not ferry.cuda_available(), reason="no CUDA device (or fake runtime)")
def test_cuda_outputs_and_bytes_as_serial() -> None:
    same_as_serial(Step(ferry.CUDABackend(0)))


def test_a_policy_change_drops_the_copies_ahead() -> None:
    """Across runs (prefetch_next) the first layer's windows are copied ahead by the policy of the run
    that queued them: setting another policy drops them, so the next run copies those windows by the
    policy asked, and reports its path and bytes (it reported ragged's and moved them by ragged's
    route). The outputs stay a serial run's; a compact change reallocates and keeps nothing ahead."""
    step = Step(ferry.StandinBackend())
    kv_len = ferry.Tensor.from_numpy(step.cpu, np.array([N_KV, 7, 0], np.int32), name="kv_len")
    serial = ferry.Scheduler([step.split, step.cpu], policy="flat")
    serial_outs = ferry.attention_step(serial, step.split, step.kv.windows(N_KV), step.q, kv_len)
    serial.compute(serial_outs.graph)
    sched = ferry.Scheduler([step.split, step.cpu], policy="ragged", prefetch=1, prefetch_next=True)
    outs = ferry.attention_step(sched, step.split, step.kv.windows(N_KV), step.q, kv_len)
    sched.compute(outs.graph)
    sched.compute(outs.graph)
    assert sched.stats.kept_ahead == 2  # layer 0's K and V, copied ahead under ragged

    def first_layer() -> List[ferry.sched.Input]:
        return [i for i in sched.inputs if i.src.name in ("window_k_l0", "window_v_l0")]

    assert [i.stats.path for i in first_layer()] == [ferry.CopyPolicy.RAGGED] * 2
    sched.policy = "flat"
    for _ in range(2):  # the run after the change, then one whose copies ahead were flat's
        sched.compute(outs.graph)
        assert [i.stats.path for i in first_layer()] == [ferry.CopyPolicy.FLAT] * 2
        assert [i.stats.bytes_copied for i in first_layer()] == [i.src.nbytes for i in first_layer()]
        assert [o.get() for o in outs] == [o.get() for o in serial_outs]
    assert sched.stats.kept_ahead == 2
    sched.policy = "flat"  # the same policy: its copies ahead stay
    sched.compute(outs.graph)
    assert sched.stats.kept_ahead == 2
    sched.compact = True
    sched.compute(outs.graph)
    assert sched.stats.kept_ahead == 0
    assert [o.get() for o in outs] == [o.get() for o in serial_outs]


def test_the_trace_shows_each_layers_copies_under_the_compute_before_it() -> None:
    """Scheduler.trace: a compute per layer in order; the first layer's windows copied by the calling
    thread and its queue before its compute; every later layer's windows queued after the first layer's
    own copies, each ending before its own layer's compute starts; every span inside the run."""
    split = ferry.StandinBackend(link_gbps=1.0)
    step = Step(split)
    with ferry.Scheduler([split, step.cpu], policy="ranges", prefetch=1) as sched:
        windows = [step.kv.window(layer, N_KV) for layer in range(N_LAYER)]
        graph = ferry.Graph(*ferry.attention_step(sched, split, windows, step.q, step.kv_len))
        assert sched.trace() == []  # no run yet
        t0 = time.perf_counter()
        sched.compute(graph)
        wall = time.perf_counter() - t0
        spans = sched.trace()
        inputs = sched.inputs
    computes = [sp for sp in spans if sp.kind == "compute"]
    assert [sp.part for sp in computes] == list(range(N_LAYER))
    assert all(a.end <= b.start for a, b in zip(computes, computes[1:]))
    copies = [sp for sp in spans if "copy" in sp.kind]
    assert sorted(sp.input for sp in copies) == [i for i, inp in enumerate(inputs) if inp.src.source is not None]
    assert all(0 <= sp.start <= sp.end <= wall for sp in spans)
    for sp in copies:
        assert sp.end <= computes[sp.part].start + 1e-6, sp  # a layer computes once its windows are in
        assert sp.part == 0 or sp.kind == "queued copy", sp
    # The layers ahead are queued once the first layer's own copies are done: queued before them, the
    # next layer's windows would take the one link and the first layer's small copies would wait behind
    # them. (Whether a copy starts under the compute before is timing, for `ferry bench --trace`.)
    first_own = max(sp.end for sp in copies if sp.part == 0 and sp.kind == "copy")
    assert all(first_own <= sp.start for sp in copies if sp.part > 0)
    assert {sp.kind for sp in copies if sp.part == 0} == {"copy", "queued copy"}
    assert {sp.kind for sp in spans} == {"copy", "queued copy", "wait", "compute"}


def test_prefetch_takes_a_depth_and_refuses_bad_ones_and_a_closed_scheduler() -> None:
    split, cpu = ferry.StandinBackend(), ferry.CPUBackend()
    sched = ferry.Scheduler([split, cpu])
    assert sched.prefetch == 0
    sched.prefetch = 3
    assert sched.prefetch == 3
    assert ferry.Scheduler([split, cpu], prefetch=2).prefetch == 2
    for bad in (-1, True, 1.5, "2", None, 2**40):
        with pytest.raises(ferry.InvalidArgumentError):
            ferry.Scheduler([split, cpu], prefetch=bad)  # type: ignore[arg-type]
        with pytest.raises(ferry.InvalidArgumentError):
            sched.prefetch = bad  # type: ignore[assignment]
    assert sched.prefetch == 3
    sched.close()
    with pytest.raises(ferry.FreedBufferError):
        sched.prefetch = 1


def test_cpu_split_has_nothing_to_prefetch() -> None:
    """A backend without a copy queue (the CPU reads host memory: no inputs at all) runs as without prefetching."""
    step = Step(ferry.CPUBackend())
    out0, st0 = step.run("ranges", False, 0)
    out, st = step.run("ranges", False, 2)
    assert out == out0 and st.prefetched == 0 and st.n_inputs == st0.n_inputs


SMALL = dict(n_ctx=512, npl=(2,), npp=32, ntg=3, n_layer=3, repeat=2, policies=("flat", "ranges"))
SMALL_CFG = BenchConfig.of(**SMALL)


def test_bench_overlap_adds_a_prefetched_row_with_the_serial_rows_outputs_and_its_bytes() -> None:
    """Within each step an overlapped run copies the serial run's bytes; across steps (the default) it also
    copies, per repetition, the first layer's K and V cells again at its first step (its lengths fell from
    the last step's: copied from cell 0) and each later step's new cell of every sequence (the copy ahead
    took the whole window, before that cell was written)."""
    res = run_bench(BenchConfig.of(**SMALL, overlap=True, prefetch=(1,),
                                prefetch_next=(True, False)))
    assert len(res.rows) == 2 * 2 * 3  # policies x layouts x (serial, across, within)
    cell = 2 * SMALL_CFG.n_embd * 2  # a cell of K and one of V, f16
    first = sum(p + 1 for p in SMALL_CFG.prompts(2))
    for r in res.rows:
        serial = res.serial_of(r)
        assert not serial.key.overlap and serial.key.prefetch == 0
        # the unified cache's window, one dense range, carries no lengths: nothing of it goes ahead
        ahead = r.key.prefetch_next and not r.key.unified
        assert r.counts.steps_ahead == (SMALL_CFG.sequences.ntg - 1 if ahead else 0)
        extra = (first + (SMALL_CFG.sequences.ntg - 1) * 2) * cell if ahead else 0
        assert (r.counts.bytes_copied, r.counts.bytes_read, r.output_sha256) == (serial.counts.bytes_copied + extra, serial.counts.bytes_read,
                                                                   serial.output_sha256)
        if r.key.overlap:
            assert r.key.prefetch == 1 and r.counts.ahead_bytes > 0
            assert res.bound(r) == max(serial.times.copy_s, serial.times.compute_s)
        else:
            assert r.counts.ahead_bytes == 0 and not r.key.prefetch_next
    assert res.outputs_identical(2)
    rows = res.as_dicts()
    assert {d["overlap"] for d in rows} == {False, True}
    for d in rows:
        assert {"overlap", "decode_s", "compute_s", "prefetch", "ahead_bytes"} <= d.keys()
        assert ("bound_s" in d) == d["overlap"] and ("serial_decode_s" in d) == d["overlap"]
    text = bench_cli.format_result(res)
    assert "overlap: each variant also ran prefetching 1 layer(s) ahead" in text and "-within" in text
    assert "serial and overlapped" in text


def test_bench_overlap_runs_each_prefetch_depth_and_says_how_much_stays_exposed() -> None:
    res = run_bench(BenchConfig.of(**SMALL, overlap=True, prefetch=(1, 2),
                                prefetch_next=(True, False)))
    assert len(res.rows) == 2 * 2 * 5  # policies x layouts x (serial, depth 1 and 2 across and within steps)
    assert {r.key.label for r in res.rows if r.key.prefetch == 2 and not r.key.unified} == {
        "flat+overlap2", "ranges+overlap2", "flat+overlap2-within", "ranges+overlap2-within"}
    overlapped = [(r, d) for r, d in zip(res.rows, res.as_dicts()) if r.key.overlap]
    assert len(overlapped) == 2 * 2 * 4
    for r, d in overlapped:
        s = res.serial_of(r)
        bound, hideable = max(s.times.copy_s, s.times.compute_s), min(s.times.copy_s, s.times.compute_s)
        assert d["over_bound"] == pytest.approx(r.times.decode_s / bound)
        assert d["over_serial"] == pytest.approx(r.times.decode_s / s.times.decode_s)
        assert d["exposed_share"] == pytest.approx((r.times.decode_s - bound) / hideable)
        # within a step: the first layer's copy and the last one's compute, and each layer's max between;
        # across steps, that at a repetition's first step alone (of 3), the bound at the others
        floor = s.times.copy_s / 3 + 2 * bound / 3 + s.times.compute_s / 3
        k = r.counts.steps_ahead
        assert k == (2 if r.key.prefetch_next and not r.key.unified else 0)  # all but each repetition's first of 3
        floor = ((3 - k) * floor + k * bound) / 3
        assert d["floor_s"] == pytest.approx(floor) and d["over_floor"] == pytest.approx(r.times.decode_s / floor)
        assert bound <= floor <= s.times.copy_s + s.times.compute_s
        # the same from the overlapped run's own copy and compute, which running side by side may slow
        own = r.times.copy_s / 3 + 2 * max(r.times.copy_s, r.times.compute_s) / 3 + r.times.compute_s / 3
        own = ((3 - k) * own + k * max(r.times.copy_s, r.times.compute_s)) / 3
        assert d["own_floor_s"] == pytest.approx(own) and d["over_own_floor"] == pytest.approx(r.times.decode_s / own)
        assert d["compute_over_serial"] == pytest.approx(r.times.compute_s / s.times.compute_s)
    assert all("exposed_share" not in d for r, d in zip(res.rows, res.as_dicts()) if not r.key.overlap)
    text = bench_cli.format_result(res)
    assert "prefetching 1, 2 layer(s) ahead" in text and "ranges+overlap2" in bench_cli.format_result(res, True)
    assert "exposed" in text
    assert "/ floor" in text and "compute x" in text


def test_the_floor_is_left_out_where_layers_are_not_alike() -> None:
    cfg = BenchConfig.of(**{**SMALL, "policies": ("flat",)}, overlap=True,
                      devices=DeviceConfig(kv_device_layers=1))
    res = run_bench(cfg)
    over = [d for d in res.as_dicts() if d["overlap"]]
    assert over and all(d["floor_s"] is None and d["over_floor"] is None and d["own_floor_s"] is None
                        and d["over_own_floor"] is None for d in over)
    assert res.floor(next(r for r in res.rows if r.key.overlap)) is None


def test_bench_trace_writes_each_variants_timeline_as_a_chrome_trace(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "trace.json"
    rc, _ = run_cli(["bench", "-c", "512", "-npl", "2", "-npp", "32", "-ntg", "2", "--layers", "3",
                     "--repeat", "1", "--rounds", "1", "--policy", "ranges", "--no-unified", "--overlap",
                     "--device", "cpu", "--trace", str(path)], capsys)
    assert rc == 0
    trace = json.loads(path.read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {"npl 2 ranges", "npl 2 ranges+overlap"}
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["cat"] for e in spans} == {"copy", "compute", "wait", "queued copy"}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    # each layer of each step computes once, in both runs
    per_run = {pid: sum(1 for e in spans if e["pid"] == pid and e["cat"] == "compute") for pid in {e["pid"] for e in spans}}
    assert len(set(per_run.values())) == 1 and min(per_run.values()) >= 3 * 2
    refused = tmp_path / "missing" / "trace.json"
    with pytest.raises(SystemExit) as e:
        run_cli(["bench", "--device", "cpu", "--trace", str(refused)], capsys)
    assert e.value.code == 2 and "--trace" in capsys.readouterr().err and not refused.parent.exists()


def test_bench_without_overlap_is_as_before() -> None:
    res = run_bench(BenchConfig.of(**SMALL))
    assert len(res.rows) == 2 * 2 and not any(r.key.overlap for r in res.rows)
    assert all(d["overlap"] is False and "bound_s" not in d for d in res.as_dicts())
    assert "overlap:" not in bench_cli.format_result(res)


def run_cli(argv: List[str], capsys: pytest.CaptureFixture[str]) -> Tuple[int, str]:
    rc = cli_main(argv)
    return rc, capsys.readouterr().out


def test_bench_overlap_on_the_command_line_adds_prefetched_json_rows(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = run_cli(["bench", "-c", "512", "-npl", "2", "-npp", "32", "-ntg", "2", "--layers", "2",
                                  "--repeat", "1", "--policy", "flat", "--no-unified", "--overlap",
                                  "--prefetch", "2",
                                  "--json"], capsys)
    assert rc == 0
    rows: List[Dict[str, object]] = json.loads(out)
    assert [(d["overlap"], d["prefetch"]) for d in rows] == [(False, 0), (True, 2)]


def test_validate_hashes_overlapped_runs() -> None:
    res = run_validate(ValidateConfig.of(n_seq=4, n_stream=2, n_layer=2, n_step=2, kv_size=16, policies=("flat", "ranges"),
                                      compact=True))
    assert set(res.hashes) == {"flat", "flat+overlap", "flat+overlap-within", "ranges", "ranges+overlap",
                               "ranges+overlap-within", "ranges+compact", "ranges+compact+overlap",
                               "ranges+compact+overlap-within"}
    assert res.passed
    off = run_validate(ValidateConfig.of(n_seq=4, n_stream=2, n_layer=2, n_step=2, kv_size=16, policies=("flat",),
                                      overlap=False))
    assert set(off.hashes) == {"flat"} and off.hashes["flat"] == res.hashes["flat"]


def test_validate_fails_a_copy_ahead_kept_over_a_new_wave(monkeypatch: pytest.MonkeyPatch) -> None:
    """Across steps, a wave's start writes new sequences over the streams, and serve drops what was copied
    ahead (Scheduler.drop_ahead). Without the drop, a stream whose new sequence is no shorter than the
    last one was reads that one's first-layer cells, and the gate fails: which shows that its runs copy
    ahead (pad 16: one graph for every step, as llama.cpp's padding gives) and that it would see a
    copy ahead misused. Within each step nothing is copied ahead, and that hash stays right."""
    cfg = ValidateConfig.of(n_seq=4, n_stream=2, n_layer=2, n_step=2, kv_size=16, policies=("ranges",), pad=16,
                         device="cpu")
    assert cfg.prompts() == [9, 4, 6, 9]  # stream 1: 4 + 2 cells, then 9 + 1, no shorter
    assert run_validate(cfg).passed
    monkeypatch.setattr(ferry.Scheduler, "drop_ahead", lambda self: None)
    res = run_validate(cfg)
    assert not res.passed and res.hashes["ranges+overlap"] != res.hashes["ranges"]
    assert res.hashes["ranges+overlap-within"] == res.hashes["ranges"]


def test_validate_hashes_overlapped_runs_unless_no_overlap_and_refuses_prefetch_0(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = run_cli(["validate", "--sequences", "4", "-npl", "2", "-ntg", "2", "-c", "32", "-npp", "14",
                                     "--policy", "ranges", "--json"], capsys)
    assert rc == 0 and set(json.loads(out)[0]["hashes"]) == {"ranges", "ranges+overlap", "ranges+overlap-within"}
    rc, out = run_cli(["validate", "--sequences", "4", "-npl", "2", "-ntg", "2", "-c", "32", "-npp", "14",
                                     "--policy", "ranges", "--no-overlap", "--json"], capsys)
    assert rc == 0 and set(json.loads(out)[0]["hashes"]) == {"ranges"}
    with pytest.raises(SystemExit) as e:
        run_cli(["validate", "--prefetch", "0"], capsys)
    assert e.value.code == 2
