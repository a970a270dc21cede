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
from typing import Callable, List, Tuple

import pytest

import ferry
from ferry.cli import bench, main, text_table
from ferry.workloads import bench as bench_workload
from ferry.workloads import estimate

TINY = ["-c", "256", "-npl", "2,4", "-npp", "16", "-ntg", "3", "--layers", "2", "--heads", "4",
        "--head-dim", "32", "--kv-heads", "2", "--device", "cpu", "--pad", "1"]
KEYS = {"npl", "policy", "unified", "tokens_per_s", "copy_s", "bytes_copied", "bytes_read", "compact",
        "split_memory", "gain", "host_s", "tokens_per_s_end_to_end", "rebuilds", "overlap", "prefetch", "decode_s",
        "compute_s", "ahead_bytes", "devices", "ntg", "output_sha256", "decode_s_per_step", "copy_s_per_step",
        "compute_s_per_step", "host_s_per_step", "bytes_copied_per_step", "bytes_read_per_step", "gain_low",
        "gain_high", "gain_within_noise", "gain_claimed", "over_unified", "over_unified_low", "over_unified_high",
        "config", "replicas", "tokens_per_s_replicas", "predicted_copy_s", "predicted_copy_s_per_step",
        "copy_calls", "copy_calls_per_step", "label", "gather", "gather_used", "prefetch_next", "steps_ahead"}
#: A quick run: 3 replicas of 2 timed rounds.
QUICK = ["--repeat", "3", "--rounds", "2"]


def tiny(**kw: object) -> bench.BenchConfig:
    base = dict(n_ctx=256, npl=(2, 4), npp=16, ntg=3, n_layer=2, n_head=4, head_dim=32, n_head_kv=2,
                policies=("flat", "ranges", "plan"), device="cpu", repeat=3, rounds=2, pad=1)
    base.update(kw)
    return bench.BenchConfig.of(**base)


def expected_bytes(cfg: bench.BenchConfig, npl: int) -> dict:
    """What attention reads of the split cache (each sequence's own cells: what ragged copies), its
    padded windows (what ranges and plan copy), what flat moves (the span), and what the unified
    cache moves, summed over steps, layers, K and V: from the layout, not from the library."""
    row = ferry.row_size(cfg.kv.type_kv, cfg.n_embd)
    kv_size = cfg.sequences.n_ctx // npl
    windows = 2 * cfg.kv.n_layer
    read = sum(p + t + 1 for p in cfg.prompts(npl) for t in range(cfg.sequences.ntg)) * row * windows
    window = sum(npl * cfg.n_kv(npl, t) for t in range(cfg.sequences.ntg)) * row * windows
    span = sum((npl - 1) * kv_size + cfg.n_kv(npl, t) for t in range(cfg.sequences.ntg)) * row * windows
    unified = cfg.sequences.ntg * npl * cfg.cells * row * windows
    return {"read": read, "window": window, "span": span, "unified": unified}


@pytest.mark.parametrize("type_kv,pad", [("f16", 1), ("q8_0", 8), ("f32", 1)])
def test_bytes_per_policy_and_layout_are_exact(type_kv: str, pad: int) -> None:
    cfg = tiny(type_kv=type_kv, pad=pad)
    res = bench.run_bench(cfg)
    assert res.split_name == "CPU (stand-in device)" and res.cache_memory == "pageable host memory"
    assert [(r.key.npl, r.key.unified, r.key.policy) for r in res.rows] == [
        (npl, u, p) for npl in (2, 4) for u in (False, True) for p in ("flat", "ranges", "plan")]
    for npl in (2, 4):
        want = expected_bytes(cfg, npl)
        flat, ranges, plan = (res.row(npl, p) for p in ("flat", "ranges", "plan"))
        assert flat.counts.bytes_read == ranges.counts.bytes_read == plan.counts.bytes_read == want["read"]
        assert flat.counts.bytes_copied == want["span"] > want["window"] >= want["read"]
        assert ranges.counts.bytes_copied == plan.counts.bytes_copied == want["window"]
        assert (want["window"] > want["read"]) == (pad > 1)  # padding copies cells nobody reads
        for p in ("flat", "ranges", "plan"):  # one dense range: the same under every policy
            u = res.row(npl, p, True)
            assert u.counts.bytes_copied == u.counts.bytes_read == want["unified"]
        assert res.outputs_identical(npl)
        for r in res.rows:
            assert r.tokens_per_s == pytest.approx(r.key.npl * cfg.sequences.ntg / r.times.decode_s, rel=1e-12)
            assert 0 < r.times.copy_s < r.times.decode_s and 0 < r.times.compute_s < r.times.decode_s
    assert res.gain(res.row(2, "flat")) == 0.0
    r = res.row(4, "ranges", True)
    flat = res.row(4, "flat", True)
    assert res.gain(r) == estimate.gain_interval(r.replicas_tokens_per_s, flat.replicas_tokens_per_s).estimate


@pytest.mark.parametrize("lengths,pad", [("equal", 1), ("equal", 16), ("uniform", 1), ("uniform", 16),
                                         ((16, 3, 9, 1), 4)])
def test_ragged_copies_exactly_the_cells_attention_reads_and_no_padded_row(lengths: object, pad: int) -> None:
    """Issue 35: under ragged a row's bytes copied are each sequence's own cells, whatever the lengths and
    the pad; ranges copies the padded window, flat the span; the outputs agree."""
    cfg = tiny(policies=("flat", "ranges", "ragged"), lengths=lengths, pad=pad, type_kv="f16")
    res = bench.run_bench(cfg)
    for npl in cfg.sequences.npl:
        want = expected_bytes(cfg, npl)
        ragged, ranges, flat = (res.row(npl, p) for p in ("ragged", "ranges", "flat"))
        assert ragged.counts.bytes_copied == ragged.counts.bytes_read == ranges.counts.bytes_read == want["read"]
        assert ranges.counts.bytes_copied == want["window"] and flat.counts.bytes_copied == want["span"]
        assert (ranges.counts.bytes_copied > ragged.counts.bytes_copied) == (pad > 1 or lengths != "equal")
        assert res.outputs_identical(npl)


def test_the_unified_row_says_it_copies_whole_slots_when_the_lengths_differ() -> None:
    """Issue 41: the unified cache holds every sequence in a slot of npp + ntg cells and copies the slots
    whole; under unequal lengths that is more than the sequences hold, and the report says so beside
    the table. Under equal lengths (or equal given ones, or no unified run) it says nothing."""
    assert tiny().unified_note is None and tiny(lengths=(9, 9, 9, 9)).unified_note is None
    assert tiny(lengths="uniform", unified=False).unified_note is None
    cfg = tiny(lengths="uniform", policies=("flat", "ragged"), repeat=1, rounds=1)
    note = cfg.unified_note
    assert note is not None and f"a slot of {cfg.cells} cells" in note[0] and "over unified" in note[1]
    res = bench.run_bench(cfg)
    lines = bench.format_result(res).splitlines()
    assert all(line in lines and len(line) < 100 for line in note)
    for npl in cfg.sequences.npl:  # what it says: the unified row copies more than the sequences hold, which ragged copies
        assert res.row(npl, "flat", True).counts.bytes_copied > res.row(npl, "ragged").counts.bytes_copied


def test_outputs_differ_when_content_differs() -> None:
    """The output hash is a real check: another seed (other cache bytes and queries) changes it."""
    a = bench.run_bench(tiny(npl=(2,), policies=("ranges",), unified=False))
    b = bench.run_bench(tiny(npl=(2,), policies=("ranges",), unified=False, seed=1))
    assert a.rows[0].output_sha256 != b.rows[0].output_sha256


def _turn_order(monkeypatch: pytest.MonkeyPatch) -> Tuple[List[str], List[str], Callable[[int, int], List[str]]]:
    """Run 2 replicas of npl 2 and 4 (flat, ranges; both layouts), 3 timed rounds; returns each
    repetition's label, the steps' labels, and rounds(npl, r): the labels of round r of
    balanced_orders."""
    labels: List[str] = []
    cfg = tiny(policies=("flat", "ranges"), repeat=2, rounds=3)
    bench_workload.run_bench(cfg, on_step=labels.append)
    assert len(labels) == cfg.n_steps
    names = ["flat", "ranges", "flat unified", "ranges unified"]
    orders = estimate.balanced_orders(len(names))

    def rounds(npl: int, r: int) -> List[str]:
        return [f"npl {npl} {names[i]}" for i in orders[r % len(orders)]]

    return labels[::cfg.sequences.ntg], labels, rounds


def test_variants_take_turns_repetition_by_repetition(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every variant of both layouts takes turns with the others one repetition at a time, in the
    rounds of estimate.balanced_orders; an npl's replicas are made together (a warm-up round each)
    and take turns round by round; then the next npl."""
    reps, labels, rounds = _turn_order(monkeypatch)
    assert labels == [r for r in reps for _ in range(len(labels) // len(reps))]  # a repetition's steps together
    expected = []
    for npl in (2, 4):
        expected += rounds(npl, 0) + rounds(npl, 0)  # each replica's warm-up: its own schedulers' first round
        for r in range(1, 4):
            expected += rounds(npl, r) + rounds(npl, r)
    assert reps == expected


def test_replicas_too_large_to_hold_together_run_one_after_another(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond TOGETHER_BYTES of cache memory, one replica at a time: made, warmed up, timed, freed."""
    monkeypatch.setattr(bench_workload, "TOGETHER_BYTES", 1)
    reps, _, rounds = _turn_order(monkeypatch)
    expected = []
    for npl in (2, 4):
        for _ in range(2):
            expected += [x for r in range(4) for x in rounds(npl, r)]
    assert reps == expected


def test_figures_are_the_median_of_the_replicas_floors() -> None:
    """A row's decode time is the median of its replicas' floors, its tokens/s npl * ntg over that; the
    gain over flat is the median of the replicas' ratios, within their range."""
    cfg = tiny(npl=(2,), policies=("flat", "ranges"), repeat=5, unified=False)
    res = bench.run_bench(cfg)
    flat, ranges = res.row(2, "flat"), res.row(2, "ranges")
    for r in (flat, ranges):
        assert r.replicas == 5 and len(r.replicas_tokens_per_s) == 5
        decodes = sorted(r.key.npl * cfg.sequences.ntg / t for t in r.replicas_tokens_per_s)
        assert r.times.decode_s == pytest.approx(decodes[2], rel=1e-12)
        assert r.tokens_per_s == pytest.approx(r.key.npl * cfg.sequences.ntg / r.times.decode_s, rel=1e-12)
        assert 0 < r.times.copy_s and 0 < r.times.compute_s and r.times.copy_s + r.times.compute_s <= r.times.decode_s * (1 + 1e-9)
    paired = sorted(v / f - 1.0 for f, v in zip(flat.replicas_tokens_per_s, ranges.replicas_tokens_per_s))
    g = res.gain_interval(ranges)
    assert g is not None and g.estimate == paired[2] and g.low is not None and g.high is not None
    assert g.low <= paired[0] and paired[-1] <= g.high and g.n == 5


def test_without_a_flat_run_there_is_no_gain_and_the_table_prints_a_dash() -> None:
    res = bench.run_bench(tiny(npl=(2,), policies=("ranges",), unified=False, ntg=1))
    assert len(res.rows) == 1 and res.gain(res.rows[0]) is None
    row = next(line for line in bench.format_result(res).splitlines() if line.split()[:2] == ["2", "ranges"])
    assert " - " in row
    row = next(line for line in bench.format_result(res, wide=True).splitlines() if line.split()[:2] == ["2", "ranges"])
    assert " - " in row


def run_cli(args: List[str], capsys: pytest.CaptureFixture[str]) -> tuple:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_table_heads_the_run_and_gives_each_npl_and_policy_a_row_of_exact_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["bench", *TINY, *QUICK, "--policy", "flat,ranges"], capsys)
    assert code == 0
    assert all("past the modelled link" in line for line in err.splitlines() if "warning" in line), err
    lines = out.splitlines()
    assert re.fullmatch(r"split on CPU \(stand-in device\), link 8 GB/s; KV cache in pageable host memory; 3 "
                        r"replicas, \d+\.\d s", lines[0])
    assert lines[1] == "-c 256 -npp 16 -ntg 3, 2 layers, K/V f16, 4 heads x 32, 2 KV heads, pad 1"
    assert lines[2].split() == ["npl", "policy", "tok/s", "over", "flat", "over", "unified", "copy/step",
                                "copied/step", "read/step"]
    rows = [ln.split() for ln in lines[3:9]]
    assert [r[:2] for r in rows] == [["2", "flat"], ["2", "ranges"], ["2", "unified"], ["4", "flat"],
                                     ["4", "ranges"], ["4", "unified"]]
    assert rows[0][3] == "-" and rows[2][3:5] == ["-", "-"]
    assert re.fullmatch(r"~?[+-]\d+(\.\d)?%", rows[1][3]) and re.fullmatch(r"±\d+(\.\d)?", rows[1][4])  # whole points past 100
    cfg = tiny(policies=("flat", "ranges"))
    per_step = expected_bytes(cfg, 2)["read"] / cfg.sequences.ntg
    assert lines[4].split()[-4:] == bench.fmt_bytes(per_step).split() * 2
    assert lines[-2:] == [f"npl {n}: outputs identical across policies and both caches; graph rebuilt at "
                          "2 of 2 later steps" for n in (2, 4)]
    assert max(len(ln) for ln in lines) < 100


def test_default_table_fits_100_columns(capsys: pytest.CaptureFixture[str]) -> None:
    """At the default options (but a quick run), every printed line is under 100 columns; --wide is wider."""
    code, out, _ = run_cli(["bench", "--device", "cpu", *QUICK], capsys)
    assert code == 0 and len(out.splitlines()) > 10
    assert max(len(ln) for ln in out.splitlines()) < 100
    code, wide, _ = run_cli(["bench", "--device", "cpu", *QUICK, "--wide"], capsys)
    assert code == 0 and max(len(ln) for ln in wide.splitlines()) > 100


def test_wide_table_prints_every_column(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["bench", *TINY, *QUICK, "--policy", "flat,ranges", "--wide"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[2] == "times over a repetition (ntg steps): floors, the median over replicas"
    assert lines[3].split() == ["npl", "policy", "tok/s", "gain", "replicas'", "gains", "decode", "host", "e2e",
                                "tok/s", "copy", "model", "compute", "copied", "read", "copy", "bw", "split", "mem", "unified",
                                "tok/s", "copy", "copied", "over", "unified"]
    rows = [ln.split() for ln in lines[4:8]]
    assert [(r[0], r[1], r[3], r[4]) for r in rows] == [
        ("2", "flat", "-", "-"), ("2", "ranges", rows[1][3], rows[1][4]), ("4", "flat", "-", "-"),
        ("4", "ranges", rows[3][3], rows[3][4])]
    assert re.fullmatch(r"~?[+-]\d+(\.\d)?%", rows[1][3]) and re.fullmatch(r"\[[+-]\d+(\.\d)?,[+-]\d+(\.\d)?\]", rows[1][4])
    assert re.fullmatch(r"[+-]\d+\.\d(,[+-]\d+\.\d){2}", rows[1][5])  # each of the 3 replicas' gains
    assert all("MiB" in ln and "GB/s" in ln for ln in lines[4:8])
    cfg = tiny(policies=("flat", "ranges"))
    assert f"{expected_bytes(cfg, 2)['read'] / 2**20:,.1f} MiB" in lines[5]


def test_json_rows_have_every_key_exact_bytes_and_gains_their_replicas_give_again(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["bench", *TINY, *QUICK, "--policy", "ranges,flat", "--json"], capsys)
    assert code == 0
    assert err.startswith("ferry bench: split backend CPU (stand-in device), KV cache in pageable host memory\n")
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
        assert r["bytes_read_per_step"] == r["bytes_read"] / cfg.sequences.ntg
        assert r["copy_s_per_step"] == pytest.approx(r["copy_s"] / cfg.sequences.ntg)
        assert r["tokens_per_s"] > 0 and r["copy_s"] > 0 and r["replicas"] == 3
        assert min(r["tokens_per_s_replicas"]) <= r["tokens_per_s"] <= max(r["tokens_per_s_replicas"])
        assert (r["gain"] == 0.0) == (r["policy"] == "flat")
        assert r["gain_low"] <= r["gain"] <= r["gain_high"]
        assert r["gain_claimed"] == (r["policy"] == "ranges" and not r["unified"])
        assert (r["over_unified"] is None) == r["unified"]
        c = r["config"]
        assert (c["n_ctx"], c["npl"], c["npp"], c["ntg"], c["n_layer"], c["type_kv"], c["n_head"], c["head_dim"],
                c["n_head_kv"], c["repeat"], c["rounds"]) == (256, [2, 4], 16, 3, 2, "f16", 4, 32, 2, 3, 2)
        assert c["devices"]["n_devices"] == 1 and c["policies"] == ["ranges", "flat"]
    # each replica's tokens/s: the gains can be found again from them alone
    for r in rows:
        flat = next(f for f in rows if (f["npl"], f["unified"], f["policy"]) == (r["npl"], r["unified"], "flat"))
        again = estimate.gain_interval(r["tokens_per_s_replicas"], flat["tokens_per_s_replicas"])
        assert (again.estimate, again.low, again.high) == (r["gain"], r["gain_low"], r["gain_high"])


def test_no_unified_leaves_the_unified_rows_out_of_the_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["bench", *TINY, *QUICK, "--no-unified", "--policy", "flat,ranges", "--json"], capsys)
    rows = json.loads(out)
    assert code == 0 and [(r["npl"], r["policy"], r["unified"]) for r in rows] == [
        (2, "flat", False), (2, "ranges", False), (4, "flat", False), (4, "ranges", False)]


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "bench.png"
    code, out, err = run_cli(["bench", *TINY, *QUICK, "-npl", "2", "--plot", str(path)], capsys)
    assert code == 0 and err.endswith(f"ferry bench: wrote {path}\n")
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
    (["--rounds", "0"], "argument --rounds: 0 is out of range: 1.."),
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


def test_the_progress_bar_draws_on_the_stream_given_and_nothing_without_one() -> None:
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


def test_the_bar_counts_every_decode_step(capsys: pytest.CaptureFixture[str]) -> None:
    s = io.StringIO()
    cfg = tiny(npl=(2,), policies=("flat", "ranges"), unified=False, repeat=2, rounds=2)
    bench.run_bench(cfg, s)
    out = s.getvalue()
    assert cfg.n_steps == 2 * (1 + 2) * 2 * 3  # replicas x (warm-up + rounds) x variants x ntg
    assert f" 1/{cfg.n_steps} npl 2 " in out and out.rstrip().split("\r")[-1].startswith("[") and \
        f"{cfg.n_steps}/{cfg.n_steps} npl 2" in out


def test_each_figure_is_written_in_its_unit_with_its_digits() -> None:
    assert text_table.fmt_seconds(0.0001234) == "123.4 µs"
    assert text_table.fmt_seconds(0.01234) == "12.34 ms"
    assert text_table.fmt_seconds(12.5) == "12.500 s"
    assert text_table.fmt_mib(3 * 2**20 // 2) == "1.5 MiB"
    assert [text_table.fmt_link(x) for x in (6.80844, 0.33, 24.5, 8.0)] == ["6.81 GB/s", "0.33 GB/s", "24.5 GB/s",
                                                                           "8 GB/s"]
    assert [text_table.fmt_tps_digits(x) for x in (7.1234, 71.234, 712.34, 7123.4)] == ["7.123", "71.23", "712.3",
                                                                                        "7,123"]
    assert [text_table.fmt_layers(x) for x in ([], [3], [0, 1, 2, 5])] == ["none", "layer 3", "layers 0-2,5"]
    assert bench.fmt_bytes(1536) == "1.5 KiB" and bench.fmt_bytes(3 * 2**20) == "3.00 MiB"
    g = estimate.Interval(0.358, 0.331, 0.380, 20)
    assert bench.fmt_interval(g) == "+35.8% ±2.7" and bench.fmt_interval(g, exact=True) == "+35.8% [+33.1,+38.0]"
    assert bench.fmt_interval(estimate.Interval(0.008, -0.012, 0.029, 20)) == "~+0.8% ±2.1"
    assert bench.fmt_interval(estimate.Interval(0.1, None, None, 3)) == "~+10.0% ±?" and bench.fmt_interval(None) == "-"
    wild = estimate.Interval(37.176, 16.7, 57.6, 3)  # a replica the host stalled: whole points past 100
    assert bench.fmt_interval(wild) == "+3718% ±2048" and bench.fmt_interval(wild, exact=True) == "+3718% [+1670,+5760]"


def test_v_trans_plan_moves_the_bytes_read() -> None:
    """V stored transposed: a gap after every channel row, so ranges goes flat while plan moves the
    bytes read in one 2-D copy per window; the outputs agree everywhere."""
    cfg = tiny(v_trans=True, npl=(1, 2), n_ctx=1024)
    res = bench.run_bench(cfg)
    elem = 2  # f16
    for npl in (1, 2):
        kv_size = cfg.sequences.n_ctx // npl
        read_v = sum(npl * cfg.n_kv(npl, t) for t in range(cfg.sequences.ntg)) * cfg.n_embd * elem * cfg.kv.n_layer
        span_v = sum((npl * cfg.n_embd - 1) * kv_size + cfg.n_kv(npl, t) for t in range(cfg.sequences.ntg)) * elem * cfg.kv.n_layer
        flat, ranges, plan = (res.row(npl, p) for p in ("flat", "ranges", "plan"))
        k_read = flat.counts.bytes_read - read_v
        assert plan.counts.bytes_copied == plan.counts.bytes_read == flat.counts.bytes_read
        assert ranges.counts.bytes_copied == k_read + span_v  # K by the ranges rule, V flat: the rule cannot see it
        assert flat.counts.bytes_copied - plan.counts.bytes_copied >= span_v - read_v
        assert res.outputs_identical(npl)
    assert res.row(1, "flat").counts.bytes_copied > 10 * res.row(1, "plan").counts.bytes_copied


def test_compact_split_memory_is_the_bytes_read() -> None:
    """--compact: each non-flat policy also runs with compact staging; the split then holds each
    window's bytes read where it held its span, and the outputs do not change. The split holds one
    layer's windows at a time (each layer's copies take the memory of the layer before's) and
    every layer's output."""
    cfg = tiny(compact=True, npl=(2,), policies=("flat", "ranges"), unified=False)
    res = bench.run_bench(cfg)
    assert [(r.key.policy, r.key.compact) for r in res.rows] == [("flat", False), ("ranges", False), ("ranges", True)]
    row = ferry.row_size(cfg.kv.type_kv, cfg.n_embd)
    n_kv, kv_size, windows = cfg.n_kv(2, cfg.sequences.ntg - 1), cfg.sequences.n_ctx // 2, 2
    span, read = ((2 - 1) * kv_size + n_kv) * row * windows, 2 * n_kv * row * windows
    outputs = cfg.kv.n_layer * 2 * cfg.kv.n_head * cfg.kv.head_dim * 4
    slack = 64 * (2 * cfg.kv.n_layer + cfg.kv.n_layer)  # the allocator's alignment, per tensor
    plain, compact = res.row(2, "ranges"), res.row(2, "ranges", compact=True)
    assert abs(plain.counts.split_memory - (span + outputs)) <= slack
    assert abs(compact.counts.split_memory - (read + outputs)) <= slack
    assert compact.counts.bytes_copied == compact.counts.bytes_read == plain.counts.bytes_copied
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
        assert flat.counts.bytes_read == ranges.counts.bytes_read == plan.counts.bytes_read == want["read"]
        assert flat.counts.bytes_copied == want["span"] > ranges.counts.bytes_copied == plan.counts.bytes_copied == want["read"]
        assert all(res.row(npl, p, True).counts.bytes_copied == want["unified"] for p in ("flat", "ranges", "plan"))
        assert res.outputs_identical(npl)
    cpu = bench.run_bench(tiny(type_kv=type_kv, npl=(2,), policies=("ranges",), unified=False))
    assert cpu.rows[0].counts.bytes_copied == res.row(2, "ranges").counts.bytes_copied


def crossings(npp: int, ntg: int, pad: int) -> int:
    """Steps 1..ntg-1 whose length npp + t + 1 needs one more multiple of pad than the step before."""
    return sum(1 for t in range(1, ntg) if -(-(npp + t + 1) // pad) != -(-(npp + t) // pad))


# llama.cpp's pad of 256 crossed once; a pad of 64 twice in 80 steps (256 crossed twice takes 263)
@pytest.mark.parametrize("pad, npp, ntg, crossed", [(256, 250, 12, 1), (64, 120, 80, 2)])
def test_with_a_pad_the_graph_is_rebuilt_only_where_n_kv_crosses_a_multiple(pad: int, npp: int, ntg: int,
                                                                             crossed: int) -> None:
    assert crossings(npp, ntg, pad) == crossed  # 257; 129 and 193
    cfg = tiny(n_ctx=2048, npl=(2,), npp=npp, ntg=ntg, n_layer=1, pad=pad, policies=("ranges",), repeat=1)
    res = bench.run_bench(cfg)
    assert [(r.key.unified, r.counts.rebuilds) for r in res.rows] == [(False, crossed), (True, crossed)]
    assert all(r.times.host_s > 0 and r.tokens_per_s_end_to_end < r.tokens_per_s for r in res.rows)
    exact = bench.run_bench(dataclasses.replace(cfg, sequences=dataclasses.replace(cfg.sequences, pad=1)))
    assert all(r.counts.rebuilds == ntg - 1 for r in exact.rows)


def test_reused_graphs_give_the_outputs_of_graphs_built_every_step() -> None:
    cfg = tiny(n_ctx=2048, npl=(2,), npp=250, ntg=12, pad=256, repeat=1)
    reused, rebuilt = bench.run_bench(cfg), bench.run_bench(dataclasses.replace(cfg, variants=dataclasses.replace(cfg.variants, reuse=False)))
    assert [r.counts.rebuilds for r in rebuilt.rows] == [cfg.sequences.ntg - 1] * len(rebuilt.rows)
    assert [r.output_sha256 for r in reused.rows] == [r.output_sha256 for r in rebuilt.rows]
    assert reused.outputs_identical(2)


def test_no_reuse_rebuilds_every_steps_graph_and_reuse_none(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["bench", *TINY, "--policy", "ranges", "--no-unified", "--no-reuse", "--pad", "256",
                            "--repeat", "1", "--json"], capsys)
    assert code == 0 and [r["rebuilds"] for r in json.loads(out)] == [2, 2]  # 3 steps, each built
    code, out, _ = run_cli(["bench", *TINY, "--policy", "ranges", "--no-unified", "--pad", "256", "--repeat", "1",
                            "--json"], capsys)
    assert code == 0 and [r["rebuilds"] for r in json.loads(out)] == [0, 0]
    assert all(r["host_s"] > 0 and r["tokens_per_s_end_to_end"] < r["tokens_per_s"] for r in json.loads(out))


#: `ferry bench --json`'s keys of a row, of an overlapped row's figures (after the row's own), and of
#: "config", in the order it wrote them before the rows and the configuration were grouped into records
#: (issue 42, item 3): a reader of the JSON sees no change.
ROW_KEYS = ["npl", "policy", "unified", "tokens_per_s", "decode_s", "copy_s", "compute_s", "bytes_copied",
            "bytes_read", "output_sha256", "compact", "split_memory", "host_s", "rebuilds", "prefetch", "ahead_bytes",
            "ntg", "predicted_copy_s", "copy_calls", "gather", "gather_used", "prefetch_next", "steps_ahead",
            "overlap", "tokens_per_s_end_to_end", "replicas", "tokens_per_s_replicas", "devices", "decode_s_per_step",
            "copy_s_per_step", "compute_s_per_step", "host_s_per_step", "predicted_copy_s_per_step",
            "copy_calls_per_step", "label", "bytes_copied_per_step", "bytes_read_per_step"]
OVERLAP_KEYS = ["serial_decode_s", "bound_s", "over_bound", "over_serial", "exposed_share", "floor_s", "over_floor",
                "own_floor_s", "over_own_floor", "compute_over_serial"]
GAIN_KEYS = ["gain", "gain_low", "gain_high", "gain_within_noise", "gain_claimed", "over_unified", "over_unified_low",
             "over_unified_high", "config"]
CONFIG_KEYS = ["n_ctx", "npl", "npp", "ntg", "n_layer", "type_kv", "n_head", "head_dim", "n_head_kv", "policies",
               "unified", "device", "pad", "lengths", "repeat", "rounds", "seed", "v_trans", "compact", "reuse",
               "overlap", "prefetch", "prefetch_next", "devices", "trace", "paged", "block_size", "adjacency"]
DEVICE_KEYS = ["index", "name", "layers", "resident_layers", "bytes_copied", "kv_bytes_copied", "copy_s",
               "memory_bytes", "link_gbps"]


@pytest.mark.parametrize("extra", [["--overlap", "--compact"], ["--paged"]], ids=["overlap", "paged"])
def test_json_keys_keep_their_names_and_order(capsys: pytest.CaptureFixture[str], extra: List[str]) -> None:
    code, out, _ = run_cli(["bench", *TINY, "-npl", "2", "--repeat", "1", "--rounds", "1", "--json", *extra], capsys)
    assert code == 0
    rows = json.loads(out)
    for r in rows:
        # its first step's bytes, and its syncs' own host time
        own = ["first_step_bytes", "sync_host_s"] if r["label"] == "paged device table" else []
        assert list(r) == ROW_KEYS + own + (OVERLAP_KEYS if r["overlap"] else []) + GAIN_KEYS
        paged_keys = ["shared_prefix", "device_blocks", "pool_prefetch"] if "--paged" in extra else []  # a paged run's own, after
        assert list(r["config"]) == CONFIG_KEYS + paged_keys and [list(d) for d in r["devices"]] == [DEVICE_KEYS]
    assert any(r["overlap"] for r in rows) == ("--overlap" in extra)
    c = rows[0]["config"]
    assert (c["npl"], c["overlap"], c["compact"], c["paged"], c["policies"], c["trace"]) == (
        [2], "--overlap" in extra, "--compact" in extra, "--paged" in extra,
        ["ragged"] if "--paged" in extra else ["flat", "ranges", "ragged"], False)


def test_a_config_is_its_groups_and_reads_back_from_its_json_names() -> None:
    cfg = tiny(npl=(2,), overlap=True, block_size=8, seed=3)
    assert (cfg.sequences.npl, cfg.variants.overlap, cfg.paged_cache.block_size, cfg.sampling.seed) == ((2,), True, 8, 3)
    flat = cfg.as_dict()
    assert list(flat) == CONFIG_KEYS
    again = bench.BenchConfig.of(**{k: v for k, v in flat.items() if k != "devices"}, devices=cfg.devices)
    assert again == cfg
    with pytest.raises(TypeError):
        bench.BenchConfig.of(n_ctxx=4)
