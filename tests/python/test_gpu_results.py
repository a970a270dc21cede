"""tools/gpu-results: the report of a gpu-check run puts each bar next to the figures it came from.

The cuda-bench and paged-copy-bench JSON here is written by hand in the keys
cuda_window_bench.c and paged_copy_bench.c document; the
`ferry bench` JSON is real output of this machine's CPU stand-in run, run here or (the overlap
acceptance runs and the ragged sweep) recorded from such runs and trimmed to the keys the report
reads; link-fit.json is gpu-check's step's output against the fake CUDA runtime, trimmed.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "gpu-results"


def load_tool() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("gpu_results", str(TOOL))
    spec = importlib.util.spec_from_loader("gpu_results", loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def stream(ns: int, flat_us: float, ranges_us: float, contig_us: float) -> dict:
    row = 1088
    n_kv, kv = 2176, 32768 // ns
    fb, rb = ((ns - 1) * kv + n_kv) * row, ns * n_kv * row
    byte_ratio, time_ratio = fb / rb, flat_us / ranges_us
    return {"ns": ns, "kv_size": kv, "flat_bytes": fb, "flat_us": flat_us, "flat_gbps": fb / (flat_us * 1e3),
            "ranges_bytes": rb, "ranges_us": ranges_us, "ranges_gbps": rb / (ranges_us * 1e3),
            "contiguous_bytes": rb, "contiguous_us": contig_us, "contiguous_gbps": rb / (contig_us * 1e3),
            "ranges_over_contiguous": ranges_us / contig_us, "flat_over_ranges": time_ratio,
            "byte_ratio": byte_ratio, "flat_over_ranges_of_byte_ratio": time_ratio / byte_ratio,
            "bar_ranges_within_3pct": ranges_us / contig_us <= 1.03,
            "bar_ratio_095": ns == 1 or time_ratio / byte_ratio >= 0.95}


def way(group: str, us: float | None, contig: float) -> dict:
    return {"group": group, "us": us, "gbps_read": None if us is None else 4456448 / (us * 1e3),
            "over_contiguous": None if us is None else us / contig,
            "within_10pct": None if us is None else us / contig <= 1.10, "check": "ok" if us else "not run",
            "not_timed": None if us else "no huge-page memory"}


@pytest.fixture
def files_at(tmp_path: Path) -> Path:
    streams = [stream(1, 90.0, 45.0, 44.9), stream(2, 372.0, 91.0, 90.5), stream(4, 535.0, 177.0, 176.0),
               stream(8, 620.0, 352.0, 300.0)]  # 8 streams: ranges 17% over contiguous, a bar not met
    bench = {"tool": "cuda-bench", "backend": "CUDA0", "type": "q8_0", "n_embd": 1024, "n_ctx": 32768,
             "n_kv": 2176, "runs": 25, "statistic": "median", "hold_us": 200, "contiguous_gbps_at_8_streams": 50.5,
             "streams": streams, "bars_met": False,
             "v_trans": {"type": "f16", "n_ctx": 32768, "n_embd": 1024, "n_kv": 2176, "rows": 1024,
                         "row_bytes": 4352, "pitch_bytes": 65536, "span_bytes": 67104768, "read_bytes": 4456448,
                         "huge_pages": "none", "ways": {"flat": way("a", 1212.0, 85.0), "copy2d": way("b", 128.0, 85.0),
                                                       "gather_l4": way("d1", 93.0, 85.0),
                                                       "huge_2d": way("d3", None, 85.0),
                                                       "contiguous": way("c", 85.0, 85.0)},
                         "best": "gather_l4", "best_us": 93.0, "best_over_contiguous": 93.0 / 85.0,
                         "bar_within_10pct": True,
                         "pitch_sweep": [{"pitch_bytes": 65536, "kv_size": 32768, "plan_us": 140.0, "copy2d_us": 128.0,
                                          "gather_us": 93.0, "contiguous_us": 85.0, "plan_over_contiguous": 1.65,
                                          "copy2d_over_contiguous": 1.51, "gather_over_contiguous": 1.09,
                                          "copy2d_extra_ns_per_row": 42.0, "model_copy2d_us": 127.5}]}}
    (tmp_path / "bench.json").write_text(json.dumps(bench, indent=2))
    sweep = subprocess.run([sys.executable, "-m", "ferry.cli", "bench", "-c", "4096", "-npl", "2,4", "-npp", "256",
                            "-ntg", "2", "--layers", "1", "--device", "cpu", "--repeat", "3", "--json"],
                           capture_output=True, text=True, check=True)
    cmd = "ferry bench -c 4096 -npl 2,4 -npp 256 -ntg 2 --layers 1 --json"
    (tmp_path / "bench.txt").write_text(
        "K window q8_0 ...\nbars (...): NOT met (marked !)\n\n## ferry validate --device cuda\nidentical: yes\n\n"
        f"## {cmd}\n{sweep.stdout}{sweep.stderr}\n## ferry bench --v-trans --policy flat,ranges,plan\n(table)\n")
    (tmp_path / "build.log").write_text("# environment\nname, driver_version, memory.total\n"
                                        "NVIDIA H200, 580.159.04, 143771 MiB, 5, 16\n")
    (tmp_path / "summary.md").write_text("# ferry gpu-check, 2026-12-01T10:00Z, 300 s\n\ncommit abc1234\n\n"
                                         "| step | result | note |\n| --- | --- | --- |\n| build | pass | 30 s |\n")
    (tmp_path / "sweep.json").write_text(sweep.stdout)
    return tmp_path


def test_report_puts_bars_beside_their_figures(files_at: Path) -> None:
    text = load_tool().report(files_at, "bash tools/gpu-check")
    assert "NVIDIA H200, 580.159.04" in text and "commit abc1234" in text and "| build | pass | 30 s |" in text
    lines = text.splitlines()

    def row(start: str) -> str:
        return next(ln for ln in lines if ln.startswith(start))

    assert "| 372.0 | 91.0 | 90.5 |" in row("| 2 |") and "1.0055 (met)" in row("| 2 |")
    assert "1.1733 (**NOT met**)" in row("| 8 |")
    assert "Both K-window bars: **NOT met**" in text
    assert "Best way: **gather_l4**, 93.00 us, 1.0941x contiguous: bar (<= 1.10) met" in text
    # ways sorted by time, the untimed one last with its reason
    names = {"flat", "copy2d", "gather_l4", "huge_2d", "contiguous"}
    ways = [ln.split("|")[1].strip() for ln in lines if ln.startswith("| ") and ln.split("|")[1].strip() in names]
    assert ways == ["contiguous", "gather_l4", "copy2d", "flat", "huge_2d"]


def test_report_reads_the_sweep_json_and_computes_gains(files_at: Path) -> None:
    rows = json.loads((files_at / "sweep.json").read_text())
    tokens = {(r["npl"], r["policy"], r["unified"]): r["tokens_per_s"] for r in rows if not r.get("compact")}
    text = load_tool().report(files_at, "bash tools/gpu-check")
    for npl in (2, 4):
        gain = tokens[(npl, "ranges", False)] / tokens[(npl, "flat", False)] - 1.0
        vs_unified = tokens[(npl, "ranges", False)] / tokens[(npl, "ranges", True)]
        line = next(ln for ln in text.splitlines() if ln.startswith(f"| {npl} | {tokens[(npl, 'flat', False)]:.1f} |"))
        assert f"| {gain:+.1%} |" in line and f"| {vs_unified:.3f} |" in line
    assert "## Output: ferry validate --device cuda" in text and "identical: yes" in text


def test_report_puts_overlapped_decode_beside_its_bound(files_at: Path) -> None:
    sweep = subprocess.run([sys.executable, "-m", "ferry.cli", "bench", "-c", "4096", "-npl", "2", "-npp", "256",
                            "-ntg", "2", "--layers", "2", "--device", "cpu", "--policy", "flat", "--no-unified",
                            "--overlap", "--prefetch", "1,2", "--repeat", "1", "--json"], capture_output=True,
                           text=True, check=True)
    cmd = "ferry bench -c 4096 -npl 2 -npp 256 -ntg 2 --layers 2 --policy flat --overlap --prefetch 1,2 --json"
    with open(files_at / "bench.txt", "a") as f:
        f.write(f"\n## {cmd}\n{sweep.stdout}")
    text = load_tool().report(files_at, "bash tools/gpu-check")
    overlapped = [r for r in json.loads(sweep.stdout) if r["overlap"]]
    assert [o["prefetch"] for o in overlapped] == [1, 2]
    for o in overlapped:  # a line per depth, each with its own floor and exposed share
        line = next(ln for ln in text.splitlines() if ln.startswith(f"| 2 | split | flat | {o['prefetch']} |"))
        assert f"| {o['serial_decode_s'] * 1e3:.2f} | {o['bound_s'] * 1e3:.2f} | {o['decode_s'] * 1e3:.2f} |" in line
        assert (f"| {o['over_serial']:.2f}x | {o['over_bound']:.2f}x | {o['over_floor']:.2f}x | "
                f"{o['exposed_share']:.0%} | {o['compute_over_serial']:.2f}x | {o['over_own_floor']:.2f}x |") in line
    # the first sweep's table takes serial rows only
    assert "## Copies under compute" in text


# Three runs of `ferry bench -c 4096 -npl 2,4 -npp 256 -ntg 2 --layers 2 --policy flat --overlap --prefetch 1,2
# --repeat 1 --device cpu --json` in a row, trimmed to the split cache's rows and the keys the report reads:
# (npl, prefetch) -> (over_bound, exposed_share)
ACCEPTANCE_RUNS = [
    {(2, 1): (1.4902776, 0.5516218), (2, 2): (1.4857784, 0.5465597), (4, 1): (1.4768532, 0.6439954),
     (4, 2): (1.4535785, 0.6125627)},
    {(2, 1): (1.4984181, 0.5511557), (2, 2): (1.5022637, 0.5554083), (4, 1): (1.4625652, 0.6154751),
     (4, 2): (1.4119136, 0.5480797)},
    {(2, 1): (1.546372, 0.5962192), (2, 2): (1.713379, 0.7784628), (4, 1): (1.479066, 0.6263178),
     (4, 2): (1.4730403, 0.6184399)},
]


def acceptance_rows(run: dict) -> list:
    serial = [{"npl": npl, "policy": "flat", "unified": False, "overlap": False, "prefetch": 0} for npl in (2, 4)]
    return serial + [{"npl": npl, "policy": "flat", "unified": False, "overlap": True, "prefetch": depth,
                      "over_bound": bound, "exposed_share": share} for (npl, depth), (bound, share) in run.items()]


def write_acceptance(folder: Path, runs: list) -> None:
    """bench.txt's sections as gpu-check writes them: a header per run, the bench's JSON below."""
    with open(folder / "bench.txt", "a") as f:
        for i, run in enumerate(runs, 1):
            trace = " --trace $OUT/overlap-trace.json" if i == 1 else ""
            f.write(f"\n## overlap acceptance, run {i} of 3: ferry bench -c 4096 -npl 2,4 --policy flat --overlap "
                    f"--prefetch 1,2 --device cuda --json{trace}\n")
            f.write("ferry bench: split backend CUDA0\n" + (json.dumps(acceptance_rows(run)) if run else "Killed")
                    + "\n")


def test_report_gives_the_acceptance_runs_side_by_side(files_at: Path) -> None:
    write_acceptance(files_at, ACCEPTANCE_RUNS)
    (files_at / "overlap-trace.json").write_text('{"traceEvents": []}')
    text = load_tool().report(files_at, "bash tools/gpu-check")
    section = text.split("## Overlap acceptance")[1].split("\n## ")[0]
    # the command once, without run 1's --trace
    assert "`ferry bench -c 4096 -npl 2,4 --policy flat --overlap --prefetch 1,2 --device cuda --json`, 3 runs" \
        in section
    for key in ACCEPTANCE_RUNS[0]:
        bounds = [run[key][0] for run in ACCEPTANCE_RUNS]
        # recorded before prefetch across steps: their rows carry no prefetch_next, and were within each step
        line = next(ln for ln in section.splitlines()
                    if ln.startswith(f"| {key[0]} | split | flat | {key[1]} within |"))
        assert " | ".join(f"{b:.2f}x" for b in bounds) in line
        assert f"| {min(bounds):.2f}-{max(bounds):.2f}x |" in line
        assert " / ".join(f"{run[key][1]:.0%}" for run in ACCEPTANCE_RUNS) in line
    # serial rows have no line of their own
    assert "| 2 | split | flat | 0 |" not in section
    assert "`overlap-trace.json`" in section and "Perfetto" in section


def test_acceptance_section_says_which_run_is_missing_and_that_no_trace_was_written(files_at: Path) -> None:
    write_acceptance(files_at, [ACCEPTANCE_RUNS[0], ACCEPTANCE_RUNS[1], {}])
    text = load_tool().report(files_at, "bash tools/gpu-check")
    section = text.split("## Overlap acceptance")[1].split("\n## ")[0]
    b1, b2 = ACCEPTANCE_RUNS[0][(4, 2)][0], ACCEPTANCE_RUNS[1][(4, 2)][0]
    line = next(ln for ln in section.splitlines() if ln.startswith("| 4 | split | flat | 2 within |"))
    assert f"| {b1:.2f}x | {b2:.2f}x | n/a | {min(b1, b2):.2f}-{max(b1, b2):.2f}x |" in line and "/ n/a |" in line
    assert "Run(s) 3 printed no JSON" in section
    assert "No overlap-trace.json: run 1 wrote no timeline." in section


# `ferry bench -c 4096 -npl 2,4 -npp 256 -ntg 2 --layers 1 --policy flat,ranges,ragged --lengths L --device cpu
# --no-unified --repeat 1 --json`, trimmed: (lengths, npl, policy, copy_s_per_step, predicted_copy_s_per_step,
# bytes_copied_per_step)
RAGGED_ROWS = [
    ("equal", 2, "flat", 0.00016568, 0.000163841, 1310720.0),
    ("equal", 2, "ranges", 6.8007e-05, 6.5537e-05, 524288.0),
    ("equal", 2, "ragged", 3.6294e-05, 3.2961e-05, 263680.0),
    ("equal", 4, "flat", 0.000231364, 0.000229378, 1835008.0),
    ("equal", 4, "ranges", 0.00013383, 0.000131074, 1048576.0),
    ("equal", 4, "ragged", 7.0087e-05, 6.5922e-05, 527360.0),
    ("uniform", 2, "flat", 0.000149766, 0.000147457, 1179648.0),
    ("uniform", 2, "ranges", 3.5167e-05, 3.2769e-05, 262144.0),
    ("uniform", 2, "ragged", 1.9042e-05, 1.1009e-05, 88064.0),
    ("uniform", 4, "flat", 0.000215238, 0.000212994, 1703936.0),
    ("uniform", 4, "ranges", 6.8804e-05, 6.5538e-05, 524288.0),
    ("uniform", 4, "ragged", 3.7996e-05, 2.5922e-05, 207360.0),
]
# link-fit.json as gpu-check's step writes it (from a fake-runtime run), its points trimmed to two
LINK_FIT = {"device": "CUDA0", "pinned": True, "nbytes": 1048576, "gbps": 3.3033714940650443,
            "seconds": 0.00031742600003781263,
            "fit": {"latency_us": 47.28838743974588, "row_ns": 1.7039433430557023, "gbps": 3.8041213165227017,
                    "points": [[1048576, 1, 0.00031742600003781263], [65536, 2048, 6.791700070607476e-05]]},
            "builtin_model": {"call_us": 4.0, "row_ns": 0.0, "gbps": 54.9, "line_bytes": 64}}


def test_report_puts_ragged_copies_beside_their_prediction_and_the_fitted_link(files_at: Path) -> None:
    with open(files_at / "bench.txt", "a") as f:
        for lengths in ("equal", "uniform"):
            rows = [{"npl": npl, "policy": policy, "unified": False, "overlap": False, "compact": False, "prefetch": 0,
                     "copy_s_per_step": copy, "predicted_copy_s_per_step": predicted, "bytes_copied_per_step": nbytes,
                     "config": {"lengths": mode}} for mode, npl, policy, copy, predicted, nbytes in RAGGED_ROWS
                    if mode == lengths]
            f.write(f"\n## ragged windows, lengths {lengths}: ferry bench --policy flat,ranges,ragged "
                    f"--lengths {lengths} --json\n{json.dumps(rows)}\n")
    (files_at / "link-fit.json").write_text(json.dumps(LINK_FIT))
    text = load_tool().report(files_at, "bash tools/gpu-check")
    section = text.split("## Ragged windows on CUDA")[1].split("\n## ")[0]
    ranges = {(m, npl): nbytes for m, npl, policy, _, _, nbytes in RAGGED_ROWS if policy == "ranges"}
    for mode, npl, policy, copy, predicted, nbytes in RAGGED_ROWS:
        line = next(ln for ln in section.splitlines() if ln.startswith(f"| {mode} | {npl} | {policy} |"))
        assert (f"| {nbytes / 2**20:.2f} | {copy * 1e3:.3f} | {predicted * 1e3:.3f} | {copy / predicted:.2f} | "
                f"{nbytes / ranges[(mode, npl)]:.3f} |") in line
    fit = LINK_FIT["fit"]
    assert f"| fitted link | {fit['latency_us']:.2f} | {fit['row_ns']:.2f} | {fit['gbps']:.2f} |" in section
    model = LINK_FIT["builtin_model"]
    assert (f"| built-in (the predictions above) | {model['call_us']:.2f} | {model['row_ns']:.2f} | "
            f"{model['gbps']:.2f} |") in section
    assert "to 2 copies (the largest, 1048576 B, at 3.30 GB/s)" in section


PAGED_TOTAL = 16 << 20
BATCHED_REASON = "tensor_gather_async: this CUDA runtime (before 12.8) has no batched copies"


def paged_way(us: float | None, contig_us: float, calls: int, copies: int, predicted: float | None,
              check: str = "ok", not_run: str | None = None) -> dict:
    return {"us": us, "gbps": None if us is None else PAGED_TOTAL / (us * 1e3),
            "over_contiguous": None if us is None else us / contig_us, "submit_us": None if us is None else us / 3,
            "calls": calls, "copies": copies, "predicted_us": predicted, "check": check, "not_run": not_run}


def paged_case(run_bytes: int, us: dict, auto: str) -> dict:
    """A run length's case as paged_copy_bench.c writes it; us: per way (None: not run)."""
    n_runs, blocks, contig = PAGED_TOTAL // run_bytes, PAGED_TOTAL // 256, us["contiguous"]
    calls = {"per_block": blocks, "runs": n_runs, "batched": 1, "kernel": 1, "contiguous": 1}
    copies = {"per_block": blocks, "runs": n_runs, "batched": n_runs, "kernel": n_runs, "contiguous": 1}
    ways = {name: paged_way(t, contig, calls[name] if t is not None else 0, copies[name],
                            None if name == "batched" else 2.0 * calls[name] + 300.0, "ok" if t else "not run",
                            None if t else BATCHED_REASON) for name, t in us.items()}
    timed = {name: t for name, t in us.items() if t is not None and name != "contiguous"}
    fastest = min(timed, key=timed.__getitem__)
    return {"run_bytes": run_bytes, "n_runs": n_runs, "blocks": blocks, "auto_method": auto, "fastest": fastest,
            "fastest_over_contiguous": timed[fastest] / contig, "ways": ways}


# Two run lengths on a runtime without batched copies: below the crossover the kernel wins, above it runs
# do, where the cost model would still take the kernel
PAGED_CASES = [paged_case(256, {"per_block": 150000.0, "runs": 149000.0, "batched": None, "kernel": 900.0,
                                "contiguous": 305.0}, "kernel"),
               paged_case(2097152, {"per_block": 151000.0, "runs": 312.0, "batched": None, "kernel": 780.0,
                                    "contiguous": 305.0}, "kernel")]


def paged_json(**over: object) -> dict:
    d = {"tool": "paged-copy-bench", "backend": "CUDA0", "type": "f16", "cell_bytes": 16, "block_cells": 16,
         "block_bytes": 256, "total_bytes": PAGED_TOTAL, "pool_bytes": 2 * PAGED_TOTAL, "runs": 11,
         "statistic": "median", "hold_us": 200, "ways": ["per_block", "runs", "batched", "kernel", "contiguous"],
         "batched_available": False, "wrong_bytes": False, "way_errors": False, "error": None, "cases": PAGED_CASES}
    d.update(over)
    return d


def paged_text(folder: Path, doc: dict) -> str:
    (folder / "paged-copy.json").write_text(json.dumps(doc, indent=1))
    (folder / "paged-copy.txt").write_text("paged KV window, f16 cells of 16 B ...\nrun 2097152 B: fastest gather runs\n")
    text = load_tool().report(folder, "bash tools/gpu-check")
    return text.split("## A paged window's gather")[1].split("\n## ")[0]


def test_report_gives_each_paged_way_against_the_contiguous_peak(tmp_path: Path) -> None:
    section = paged_text(tmp_path, paged_json())
    assert "16,777,216 B read per run length from a 33,554,432 B pinned pool" in section
    assert "median of 11 runs, stream held 200 us" in section and "(cudaMemcpyBatchAsync): not offered" in section
    lines = section.splitlines()
    for case in PAGED_CASES:
        for name, w in case["ways"].items():
            line = next(ln for ln in lines if ln.startswith(f"| {case['run_bytes']} | {case['n_runs']} | {name} |"))
            if w["us"] is None:  # not run, with the runtime's reason
                assert f"| {w['calls']} | n/a | n/a | n/a | n/a | n/a | not run: {BATCHED_REASON} |" in line
                continue
            assert (f"| {w['calls']} | {w['us']:.1f} | {w['gbps']:.2f} | {w['over_contiguous']:.3f} | "
                    f"{w['submit_us']:.1f} | {w['predicted_us']:.1f} | ok |") in line
    assert "| 256 | kernel | 2.951 | kernel |" in section and "| 2097152 | runs | 1.023 | kernel |" in section
    assert "moved wrong bytes" not in section and "failed with an error" not in section and "stopped" not in section
    text = load_tool().report(tmp_path, "x")
    assert "## Output: paged-copy-bench" in text and "run 2097152 B: fastest gather runs" in text


def test_paged_section_says_wrong_bytes_and_where_the_run_stopped(tmp_path: Path) -> None:
    bad = json.loads(json.dumps(PAGED_CASES[:1]))
    bad[0]["ways"]["runs"].update(us=None, gbps=None, over_contiguous=None, submit_us=None,
                                  check="wrong bytes: first at byte 4096 (block 16)",
                                  not_run="check failed: wrong bytes: first at byte 4096 (block 16)")
    bad[0]["ways"]["kernel"].update(us=None, gbps=None, over_contiguous=None, submit_us=None,
                                    check="error: tensor_gather_async: launch failed",
                                    not_run="error: tensor_gather_async: launch failed")
    section = paged_text(tmp_path, paged_json(cases=bad, wrong_bytes=True, way_errors=True,
                                              error="after a failed way: an illegal memory access"))
    assert "**A way moved wrong bytes**" in section and "**A way failed with an error**" in section
    assert "**paged-copy-bench stopped**: after a failed way: an illegal memory access" in section
    line = next(ln for ln in section.splitlines() if ln.startswith("| 256 | 65536 | runs |"))
    assert line.endswith("| n/a | n/a | 131372.0 | wrong bytes: first at byte 4096 (block 16) |")
    line = next(ln for ln in section.splitlines() if ln.startswith("| 256 | 65536 | kernel |"))
    assert line.endswith("| n/a | 302.0 | error: tensor_gather_async: launch failed |")
    assert "| 2097152 |" not in section


@pytest.mark.parametrize("garbled", ["{\"tool\": \"paged-copy-bench\", \"cases\": [", "{\"tool\": \"x\"}", "[1, 2]"])
def test_paged_section_says_an_unreadable_file_and_still_reports(tmp_path: Path, garbled: str) -> None:
    (tmp_path / "paged-copy.json").write_text(garbled)
    text = load_tool().report(tmp_path, "x")
    assert "paged-copy.json cannot be read" in text and "## The K window" in text


def test_paged_fixture_keys_are_those_the_tool_documents() -> None:
    """The JSON above is written by hand: each of its keys is one paged_copy_bench.c's header names."""
    header = (TOOL.parent / "paged_copy_bench.c").read_text().split("*/")[0]
    keys = set(paged_json()) | set(PAGED_CASES[0]) | set(PAGED_CASES[0]["ways"]["runs"])
    missing = sorted(k for k in keys if not re.search(rf"\b{k}\b", header))
    assert not missing, missing


def test_missing_files_are_said_not_invented(tmp_path: Path) -> None:
    text = load_tool().report(tmp_path, "x")
    assert "No bench.json: cuda-bench did not finish." in text
    assert "No paged-copy.json: paged-copy-bench did not finish." in text
    assert "The sweep did not run or printed no JSON." in text
    assert "The overlapped sweep did not run or printed no JSON." in text
    assert "The overlap acceptance runs did not run or printed no JSON." in text
    assert "The ragged sweep did not run or printed no JSON." in text and "No link-fit.json" in text
    assert "unknown (no nvidia-smi row in build.log)" in text


def test_cli_refuses_a_missing_folder(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(TOOL), str(tmp_path / "nope")], capture_output=True, text=True)
    assert r.returncode == 2 and "is not a folder" in r.stderr


def pack(folder: Path, names: list, truncate: bool = False) -> None:
    """Move names into gpu-check.tar.gz as tools/gpu-check writes it (tar -C WORK -czf ... .)."""
    archive = folder / "gpu-check.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in names:
            tar.add(folder / name, arcname=f"./{name}")
    for name in names:
        (folder / name).unlink()
    if truncate:  # a run stopped while writing it
        archive.write_bytes(archive.read_bytes()[:200])


def test_report_reads_what_gpu_check_brings_back_from_its_archive(files_at: Path) -> None:
    write_acceptance(files_at, ACCEPTANCE_RUNS)
    (files_at / "overlap-trace.json").write_text('{"traceEvents": []}')
    (files_at / "link-fit.json").write_text(json.dumps(LINK_FIT))
    paged_text(files_at, paged_json())
    loose = load_tool().report(files_at, "x")
    pack(files_at, ["bench.json", "bench.txt", "build.log", "paged-copy.json", "paged-copy.txt", "link-fit.json",
                    "overlap-trace.json"])
    assert sorted(p.name for p in files_at.iterdir()) == ["gpu-check.tar.gz", "summary.md", "sweep.json"]
    assert load_tool().report(files_at, "x") == loose
    assert "NVIDIA H200, 580.159.04" in loose and "Perfetto" in loose and "| 2097152 | runs | 1.023 |" in loose


def test_a_cut_archive_is_said_missing_not_a_traceback(files_at: Path) -> None:
    pack(files_at, ["bench.json", "bench.txt"], truncate=True)
    text = load_tool().report(files_at, "x")
    assert "No bench.json: cuda-bench did not finish." in text and "The sweep did not run" in text


def test_steps_are_the_summarys_table_and_its_budget_not_the_bench_output_it_quotes(tmp_path: Path) -> None:
    (tmp_path / "summary.md").write_text(
        "# ferry gpu-check, 2026-12-01T10:00Z, 300 s\n\ncommit abc1234\n\nbudget 450 s on a GPU, the steps' limits "
        "add to 443 s\n\n| step | result | note | limit s | took s |\n| --- | --- | --- | ---: | ---: |\n"
        "| build | pass | x | 70 | 41 |\n| pytest | not run | the budget had 20 s left | 50 | 0 |\n\n```\n"
        "| npl | flat |\n| 2 | 3.0 |\n```\n")
    text = load_tool().report(tmp_path, "x")
    steps = text.split("## Steps")[1].split("\n## ")[0]
    assert "| pytest | not run | the budget had 20 s left | 50 | 0 |" in steps and "| npl | flat |" not in steps
    assert "budget 450 s on a GPU, the steps' limits add to 443 s." in steps


def test_the_archive_is_the_one_gpu_check_writes() -> None:
    script = (TOOL.parent / "gpu-check").read_text()
    assert re.search(rf"^ARCHIVE={re.escape(load_tool().ARCHIVE)}$", script, flags=re.M)


def test_report_puts_draft_and_chunk_rows_beside_their_single_rows_and_prediction(files_at: Path) -> None:
    """Each draft (chunk) row of gpu-check's draft step: tok/s beside its single row's, and bench's own
    ratios (tok/s and bytes per token over the single row's, measured over predicted) copied, the accepted
    tokens measured and predicted; the single rows are not rows of the table."""
    tiny = ["bench", "-c", "256", "-npl", "2", "-npp", "16", "-ntg", "2", "--layers", "1", "--device", "cpu",
            "--policy", "ragged", "--no-unified", "--repeat", "1", "--rounds", "1", "--json"]
    runs = {"drafts verified over host windows, the 1.8x bar's geometry": ["--draft", "2", "--accept", "0.5"],
            "drafts verified over host windows": ["--draft", "2", "--accept", "0.5"],
            "prefill chunks over host windows": ["--chunk", "3"]}
    labels = ["draft 2, the bar's geometry", "draft 2", "chunk 3"]
    with open(files_at / "bench.txt", "a") as f:
        for what, opts in runs.items():
            out = subprocess.run([sys.executable, "-m", "ferry.cli", *tiny, *opts], capture_output=True, text=True,
                                 check=True).stdout
            f.write(f"\n## {what}: ferry {' '.join(tiny + opts)}\n{out}\n")
            runs[what] = json.loads(out)
    text = load_tool().report(files_at, "bash tools/gpu-check")
    section = text.split("## Several tokens a copy: drafts and chunks on CUDA")[1].split("\n## ")[0]
    lines = [ln for ln in section.splitlines() if ln.startswith(("| draft ", "| chunk "))]
    assert len(lines) == 3
    for rows, line, label in zip(runs.values(), lines, labels):
        single, r = rows  # type: ignore[misc]
        assert not single["draft"] and not single["chunk"] and (r["draft"] or r["chunk"])
        assert line == (f"| {label} | 2 | ragged | {r['tokens_per_s']:.1f} | "
                        f"{single['tokens_per_s']:.1f} | {r['tokens_per_s_over_single']:.2f} | "
                        f"{r['bytes_per_token_over_single']:.3f} | {r['accepted_per_step']:.2f} "
                        f"({r['expected_accepted_per_step']:.2f}) | {r['predicted_tokens_per_s']:.1f} | "
                        f"{r['tokens_per_s_over_predicted']:.2f} |")


def test_the_several_section_says_when_no_draft_step_ran(files_at: Path) -> None:
    text = load_tool().report(files_at, "bash tools/gpu-check")
    assert "The draft and chunk rows did not run or printed no JSON." in text
