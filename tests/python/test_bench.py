"""`ferry bench` on the CPU stand-in device: exact bytes per policy and layout, outputs that agree,
the table, --json, --plot, the progress bar, and every bad option refused."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import struct
import sys
from pathlib import Path
from typing import List

import pytest

import ferry
from ferry.cli import bench, main
from ferry.workloads import bench as bench_workload

TINY = ["-c", "256", "-npl", "2,4", "-npp", "16", "-ntg", "3", "--layers", "2", "--heads", "4",
        "--head-dim", "32", "--kv-heads", "2", "--device", "cpu"]
KEYS = {"npl", "policy", "unified", "tokens_per_s", "copy_s", "bytes_copied", "bytes_read", "compact",
        "split_memory_bytes", "repeats", "tokens_per_s_median", "tokens_per_s_min", "tokens_per_s_max", "gain",
        "gain_median", "gain_min", "gain_max", "statistic", "spread", "host_s", "tokens_per_s_end_to_end", "rebuilds",
        "overlap", "prefetch", "decode_s", "compute_s", "ahead_bytes", "devices"}


def tiny(**kw: object) -> bench.BenchConfig:
    base = dict(n_ctx=256, npl=(2, 4), npp=16, ntg=3, n_layer=2, n_head=4, head_dim=32, n_head_kv=2,
                policies=("flat", "ranges", "plan"), device="cpu")
    base.update(kw)
    return bench.BenchConfig(**base)  # type: ignore[arg-type]


def expected_bytes(cfg: bench.BenchConfig, npl: int) -> dict:
    """What the split cache's windows read, what flat moves (the span), and what the unified cache
    moves, summed over steps, layers, K and V: from the layout, not from the library."""
    row = ferry.row_size(cfg.type_kv, cfg.n_embd)
    kv_size = cfg.n_ctx // npl
    windows = 2 * cfg.n_layer
    read = sum(npl * cfg.n_kv(npl, t) for t in range(cfg.ntg)) * row * windows
    span = sum((npl - 1) * kv_size + cfg.n_kv(npl, t) for t in range(cfg.ntg)) * row * windows
    unified = cfg.ntg * npl * cfg.cells * row * windows
    return {"read": read, "span": span, "unified": unified}


@pytest.mark.parametrize("type_kv,pad", [("f16", 1), ("q8_0", 8), ("f32", 1)])
def test_bytes_per_policy_and_layout_are_exact(type_kv: str, pad: int) -> None:
    cfg = tiny(type_kv=type_kv, pad=pad)
    res = bench.run_bench(cfg)
    assert res.split_name == "CPU (stand-in device)" and res.cache_memory == "pageable host memory"
    assert [(r.npl, r.unified, r.policy) for r in res.rows] == [
        (npl, u, p) for npl in (2, 4) for u in (False, True) for p in ("flat", "ranges", "plan")]
    for npl in (2, 4):
        want = expected_bytes(cfg, npl)
        flat, ranges, plan = (res.row(npl, p) for p in ("flat", "ranges", "plan"))
        assert flat.bytes_read == ranges.bytes_read == plan.bytes_read == want["read"]
        assert flat.bytes_copied == want["span"] > want["read"]
        assert ranges.bytes_copied == plan.bytes_copied == want["read"]
        for p in ("flat", "ranges", "plan"):  # one dense range: the same under every policy
            u = res.row(npl, p, True)
            assert u.bytes_copied == u.bytes_read == want["unified"]
        assert res.outputs_identical(npl)
        for r in res.rows:
            assert r.tokens_per_s == pytest.approx(r.npl * cfg.ntg / r.decode_s, rel=1e-12)
            assert 0 < r.copy_s < r.decode_s and 0 < r.compute_s < r.decode_s
    assert res.gain(res.row(2, "flat")) == 0.0
    r = res.row(4, "ranges", True)
    assert res.gain(r) == r.tokens_per_s / res.row(4, "flat", True).tokens_per_s - 1.0


def test_outputs_differ_when_content_differs() -> None:
    """The output hash is a real check: another seed (other cache bytes and queries) changes it."""
    a = bench.run_bench(tiny(npl=(2,), policies=("ranges",), unified=False))
    b = bench.run_bench(tiny(npl=(2,), policies=("ranges",), unified=False, seed=1))
    assert a.rows[0].output_sha256 != b.rows[0].output_sha256


def test_variants_take_turns_after_a_warm_up() -> None:
    """Per npl and layout, one repetition (ntg steps) of each variant at a time, the order reversed every
    other repetition: a warm-up, then --repeat timed ones."""
    labels: List[str] = []
    cfg = tiny(npl=(2,), policies=("flat", "ranges"), repeat=3)
    res = bench_workload.run_bench(cfg, on_step=labels.append)
    assert len(labels) == cfg.n_steps == 2 * 2 * cfg.ntg * (1 + 3)
    reps = labels[::cfg.ntg]
    assert all(labels[i:i + cfg.ntg] == [reps[i // cfg.ntg]] * cfg.ntg for i in range(0, len(labels), cfg.ntg))
    turns = ["flat", "ranges", "ranges", "flat"] * 2
    assert reps == [f"npl 2 {p}" for p in turns] + [f"npl 2 {p} unified" for p in turns]
    assert all(r.repeats == 3 for r in res.rows)


def test_figures_are_each_steps_fastest_and_the_spread_is_the_repetitions() -> None:
    """tokens/s sums each step's fastest time over the repetitions, so no repetition of its own is
    faster; the spread is the repetitions' own tokens/s, and the gain's spread their paired ratios."""
    assert bench_workload._fastest_steps([[3.0, 1.0, 5.0], [2.0, 4.0, 6.0]]) == 2.0 + 1.0 + 5.0
    cfg = tiny(npl=(2,), policies=("flat", "ranges"), repeat=5, unified=False)
    res = bench.run_bench(cfg)
    flat, ranges = res.row(2, "flat"), res.row(2, "ranges")
    for r in (flat, ranges):
        assert len(r.runs_tokens_per_s) == 5
        assert r.tokens_per_s >= max(r.runs_tokens_per_s)
        median, low, high = r.tokens_per_s_spread
        assert (low, high) == (min(r.runs_tokens_per_s), max(r.runs_tokens_per_s)) and low <= median <= high
        assert r.tokens_per_s == pytest.approx(r.npl * cfg.ntg / r.decode_s, rel=1e-12)
    paired = sorted(v / f - 1.0 for f, v in zip(flat.runs_tokens_per_s, ranges.runs_tokens_per_s))
    assert res.gain_spread(ranges) == (paired[2], paired[0], paired[-1])
    assert res.gain(ranges) == ranges.tokens_per_s / flat.tokens_per_s - 1.0
    assert res.gain_spread(flat) == (0.0, 0.0, 0.0)


def test_no_flat_no_gain() -> None:
    res = bench.run_bench(tiny(npl=(2,), policies=("ranges",), unified=False, ntg=1))
    assert len(res.rows) == 1 and res.gain(res.rows[0]) is None
    assert " - " in bench.format_result(res).splitlines()[8]  # the table's first row, after the header lines


def run_cli(args: List[str], capsys: pytest.CaptureFixture[str]) -> tuple:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_text_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["bench", *TINY, "--policy", "flat,ranges"], capsys)
    assert code == 0 and err == ""  # no bar when stderr is not a terminal
    lines = out.splitlines()
    assert lines[0] == "split backend: CPU (stand-in device); KV cache in pageable host memory (CPU backend)"
    assert lines[1] == "-c 256, -npp 16, -ntg 3, 2 layers, K/V f16, 4 heads x 32, 2 KV heads, pad 1"
    assert lines[2] == ("tok/s, gain, decode, copy, compute: each step's fastest of the repetitions, summed over "
                        "the steps (31 timed repetitions of each variant, taking turns, after a warm-up)")
    assert lines[3].startswith("per repetition: median (min..max) of the repetitions")
    assert lines[5].startswith("host: getting each step's graph (built and allocated when the padded n_kv changes")
    assert lines[7].split() == ["npl", "policy", "tok/s", "per", "repetition", "gain", "per", "repetition", "decode",
                                "host", "e2e", "tok/s", "copy", "compute", "copied", "read", "copy", "bw", "split", "mem", "unified", "tok/s",
                                "gain", "per", "repetition", "copy", "copied"]
    rows = [ln.split() for ln in lines[8:12]]
    assert [(r[0], r[1], r[5], r[6]) for r in rows] == [
        ("2", "flat", "+0.0%", "+0.0%"), ("2", "ranges", rows[1][5], rows[1][6]),
        ("4", "flat", "+0.0%", "+0.0%"), ("4", "ranges", rows[3][5], rows[3][6])]
    assert all(re.fullmatch(r"\([\d,]+\.\.[\d,]+\)", r[4]) for r in rows)  # tok/s: median (min..max)
    assert all("MiB" in ln and "GB/s" in ln for ln in lines[8:12])
    cfg = tiny(policies=("flat", "ranges"))
    row_ranges_2 = lines[9]
    assert f"{expected_bytes(cfg, 2)['read'] / 2**20:,.1f} MiB" in row_ranges_2
    assert lines[13:] == [f"npl {n}: attention outputs identical across policies and both caches; the graph was "
                          "rebuilt at 2 of a repetition's 2 later steps (pad 1)" for n in (2, 4)]


def test_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["bench", *TINY, "--policy", "ranges,flat", "--json"], capsys)
    assert code == 0
    assert err == "ferry bench: split backend CPU (stand-in device), KV cache in pageable host memory\n"
    rows = json.loads(out)
    assert [(r["npl"], r["unified"], r["policy"]) for r in rows] == [
        (n, u, p) for n in (2, 4) for u in (False, True) for p in ("ranges", "flat")]
    cfg = tiny()
    for r in rows:
        assert set(r) == KEYS
        want = expected_bytes(cfg, r["npl"])
        assert r["bytes_read"] == (want["unified"] if r["unified"] else want["read"])
        if not r["unified"]:
            assert r["bytes_copied"] == (want["span"] if r["policy"] == "flat" else want["read"])
        assert r["tokens_per_s"] > 0 and r["copy_s"] > 0
        assert r["repeats"] == 31 and r["tokens_per_s"] >= r["tokens_per_s_max"] >= r["tokens_per_s_min"] > 0
        assert r["statistic"] == "each step's fastest of the repetitions, summed over the steps"
        assert (r["gain"] == 0.0) == (r["policy"] == "flat") and r["gain_min"] <= r["gain_median"] <= r["gain_max"]


def test_json_without_unified(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["bench", *TINY, "--no-unified", "--policy", "flat,ranges", "--json"], capsys)
    rows = json.loads(out)
    assert code == 0 and [(r["npl"], r["policy"], r["unified"]) for r in rows] == [
        (2, "flat", False), (2, "ranges", False), (4, "flat", False), (4, "ranges", False)]


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "bench.png"
    code, out, err = run_cli(["bench", *TINY, "-npl", "2", "--plot", str(path)], capsys)
    assert code == 0 and err == f"ferry bench: wrote {path}\n"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (700, 400)


def test_plot_without_matplotlib_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    path = tmp_path / "bench.png"
    with pytest.raises(SystemExit, match=r"ferry: --plot needs matplotlib: pip install 'ferry\[plot\]'"):
        main(["bench", *TINY, "--plot", str(path)])
    assert not path.exists()
    with pytest.raises(ferry.UnsupportedError):
        bench.check_plot_available()


@pytest.mark.parametrize("args,message", [
    (["-npl", "3"], "-npl 3: the context of 256 cells does not split into 3 equal streams"),
    (["-npp", "200"], "-npl 2: a stream holds 128 cells, fewer than -npp + -ntg = 203"),
    (["--policy", "flat,bogus"], "--policy 'bogus': known policies are flat, ranges, plan"),
    (["--policy", "flat,flat"], "--policy lists a policy twice: flat,flat"),
    (["-ntg", "0"], "argument -ntg: 0 is out of range: 1.."),
    (["--repeat", "0"], "argument --repeat: 0 is out of range: 1.."),
    (["--heads", "5"], "--heads 5 is not a multiple of --kv-heads 2"),
    (["--type", "q8_0", "--head-dim", "48"], "--type q8_0 needs --head-dim a multiple of 32, got 48"),
    (["--type", "q4_0"], "--type 'q4_0': attention reads f32, f16, q8_0"),
    (["-npl", "2,x"], "expected integers separated by commas"),
])
def test_bad_options_are_refused(args: List[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["bench", *TINY, *args])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(ferry.cuda_available(), reason="a CUDA device is present")
def test_cuda_backend_without_a_device_fails_cleanly() -> None:
    with pytest.raises(SystemExit, match=r"^ferry: .*cuda_backend_new"):
        main(["bench", *TINY, "--device", "cuda"])


def test_config_check_raises_invalid_argument() -> None:
    with pytest.raises(ferry.InvalidArgumentError, match="-npl 0 is not a positive integer"):
        tiny(npl=(0,)).check()
    with pytest.raises(ferry.InvalidArgumentError, match="--device 'tpu'"):
        tiny(device="tpu").check()
    with pytest.raises(ferry.InvalidArgumentError, match="-c must be a positive integer, got True"):
        tiny(n_ctx=True).check()


def test_progress_bar() -> None:
    s = io.StringIO()
    p = bench.Progress(4, s, width=8)
    p.step(label="npl 2 flat")
    p.step(3, label="npl 2 ranges")
    p.close()
    assert s.getvalue().startswith("\r[##------] 1/4 npl 2 flat")  # tqdm's bar, drawn on the stream given
    assert s.getvalue().endswith("\r[########] 4/4 npl 2 ranges\n")
    quiet = bench.Progress(4, None)
    quiet.step()
    quiet.close()  # nothing to write to, nothing written


def test_units() -> None:
    assert bench.fmt_seconds(0.0001234) == "123.4 µs"
    assert bench.fmt_seconds(0.01234) == "12.34 ms"
    assert bench.fmt_seconds(12.5) == "12.500 s"
    assert bench.fmt_mib(3 * 2**20 // 2) == "1.5 MiB"
    assert bench.fmt_gbps(54.9e9) == "54.90 GB/s"
    assert bench.fmt_gain(0.516) == "+51.6%" and bench.fmt_gain(-0.004) == "-0.4%" and bench.fmt_gain(None) == "-"


def test_v_trans_plan_moves_the_bytes_read() -> None:
    """V stored transposed: a gap after every channel row, so ranges goes flat while plan moves the
    bytes read in one 2-D copy per window; the outputs agree everywhere."""
    cfg = tiny(v_trans=True, npl=(1, 2), n_ctx=1024)
    res = bench.run_bench(cfg)
    elem = 2  # f16
    for npl in (1, 2):
        kv_size = cfg.n_ctx // npl
        read_v = sum(npl * cfg.n_kv(npl, t) for t in range(cfg.ntg)) * cfg.n_embd * elem * cfg.n_layer
        span_v = sum((npl * cfg.n_embd - 1) * kv_size + cfg.n_kv(npl, t) for t in range(cfg.ntg)) * elem * cfg.n_layer
        flat, ranges, plan = (res.row(npl, p) for p in ("flat", "ranges", "plan"))
        k_read = flat.bytes_read - read_v
        assert plan.bytes_copied == plan.bytes_read == flat.bytes_read
        assert ranges.bytes_copied == k_read + span_v  # K by the ranges rule, V flat: the rule cannot see it
        assert flat.bytes_copied - plan.bytes_copied >= span_v - read_v
        assert res.outputs_identical(npl)
    assert res.row(1, "flat").bytes_copied > 10 * res.row(1, "plan").bytes_copied


def test_compact_split_memory_is_the_bytes_read() -> None:
    """--compact: each non-flat policy also runs with compact staging; the split then holds each
    window's bytes read where it held its span, and the outputs do not change. The split holds one
    layer's windows at a time (each layer's copies take the memory of the layer before's) and
    every layer's output."""
    cfg = tiny(compact=True, npl=(2,), policies=("flat", "ranges"), unified=False)
    res = bench.run_bench(cfg)
    assert [(r.policy, r.compact) for r in res.rows] == [("flat", False), ("ranges", False), ("ranges", True)]
    row = ferry.row_size(cfg.type_kv, cfg.n_embd)
    n_kv, kv_size, windows = cfg.n_kv(2, cfg.ntg - 1), cfg.n_ctx // 2, 2
    span, read = ((2 - 1) * kv_size + n_kv) * row * windows, 2 * n_kv * row * windows
    outputs = cfg.n_layer * 2 * cfg.n_head * cfg.head_dim * 4
    slack = 64 * (2 * cfg.n_layer + cfg.n_layer)  # the allocator's alignment, per tensor
    plain, compact = res.row(2, "ranges"), res.row(2, "ranges", compact=True)
    assert abs(plain.split_memory - (span + outputs)) <= slack
    assert abs(compact.split_memory - (read + outputs)) <= slack
    assert compact.bytes_copied == compact.bytes_read == plain.bytes_copied
    assert res.outputs_identical(2)
    assert "ranges+compact" in bench.format_result(res)


@pytest.mark.skipif(not ferry.cuda_available(), reason="no CUDA device")
@pytest.mark.parametrize("type_kv", ["f16", "q8_0"])
def test_cuda_split_bytes_are_exact_and_outputs_agree(type_kv: str) -> None:
    """The same workload with the split on CUDA and the cache pinned: the bytes of every policy and
    layout are the stand-in's, and the attention outputs agree across policies and caches."""
    cfg = tiny(type_kv=type_kv, device="cuda")
    res = bench.run_bench(cfg)
    assert res.split_name.startswith("CUDA") and res.cache_memory == "pinned host memory"
    for npl in (2, 4):
        want = expected_bytes(cfg, npl)
        flat, ranges, plan = (res.row(npl, p) for p in ("flat", "ranges", "plan"))
        assert flat.bytes_read == ranges.bytes_read == plan.bytes_read == want["read"]
        assert flat.bytes_copied == want["span"] > ranges.bytes_copied == plan.bytes_copied == want["read"]
        assert all(res.row(npl, p, True).bytes_copied == want["unified"] for p in ("flat", "ranges", "plan"))
        assert res.outputs_identical(npl)
    cpu = bench.run_bench(tiny(type_kv=type_kv, npl=(2,), policies=("ranges",), unified=False))
    assert cpu.rows[0].bytes_copied == res.row(2, "ranges").bytes_copied


def crossings(npp: int, ntg: int, pad: int) -> int:
    """Steps 1..ntg-1 whose length npp + t + 1 needs one more multiple of pad than the step before."""
    return sum(1 for t in range(1, ntg) if -(-(npp + t + 1) // pad) != -(-(npp + t) // pad))


@pytest.mark.parametrize("npp, ntg", [(250, 12), (200, 320)])
def test_with_pad_256_the_graph_is_rebuilt_only_where_n_kv_crosses_a_multiple(npp: int, ntg: int) -> None:
    assert crossings(npp, ntg, 256) == (1 if ntg == 12 else 2)  # 257; 257 and 513
    cfg = tiny(n_ctx=2048, npl=(2,), npp=npp, ntg=ntg, n_layer=1, pad=256, policies=("ranges",), repeat=1)
    res = bench.run_bench(cfg)
    assert [(r.unified, r.rebuilds) for r in res.rows] == [(False, crossings(npp, ntg, 256)),
                                                          (True, crossings(npp, ntg, 256))]
    assert all(r.host_s > 0 and r.tokens_per_s_end_to_end < r.tokens_per_s for r in res.rows)
    exact = bench.run_bench(dataclasses.replace(cfg, pad=1))
    assert all(r.rebuilds == ntg - 1 for r in exact.rows)


def test_reused_graphs_give_the_outputs_of_graphs_built_every_step() -> None:
    cfg = tiny(n_ctx=2048, npl=(2,), npp=250, ntg=12, pad=256, repeat=1)
    reused, rebuilt = bench.run_bench(cfg), bench.run_bench(dataclasses.replace(cfg, reuse=False))
    assert [r.rebuilds for r in rebuilt.rows] == [cfg.ntg - 1] * len(rebuilt.rows)
    assert [r.output_sha256 for r in reused.rows] == [r.output_sha256 for r in rebuilt.rows]
    assert reused.outputs_identical(2)


def test_no_reuse_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["bench", *TINY, "--policy", "ranges", "--no-unified", "--no-reuse", "--pad", "256",
                            "--repeat", "1", "--json"], capsys)
    assert code == 0 and [r["rebuilds"] for r in json.loads(out)] == [2, 2]  # 3 steps, each built
    code, out, _ = run_cli(["bench", *TINY, "--policy", "ranges", "--no-unified", "--pad", "256", "--repeat", "1",
                            "--json"], capsys)
    assert code == 0 and [r["rebuilds"] for r in json.loads(out)] == [0, 0]
    assert all(r["host_s"] > 0 and r["tokens_per_s_end_to_end"] < r["tokens_per_s"] for r in json.loads(out))
