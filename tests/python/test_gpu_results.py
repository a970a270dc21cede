"""tools/gpu-results: the report of a gpu-check run puts each bar next to the figures it came from.

The cuda-bench JSON here is written by hand in the keys cuda_window_bench.c documents; the
`ferry bench` JSON is real output of this machine's CPU stand-in run.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import subprocess
import sys
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
                            "--overlap", "--repeat", "1", "--json"], capture_output=True,
                           text=True, check=True)
    cmd = "ferry bench -c 4096 -npl 2 -npp 256 -ntg 2 --layers 2 --policy flat --overlap --json"
    with open(files_at / "bench.txt", "a") as f:
        f.write(f"\n## {cmd}\n{sweep.stdout}")
    text = load_tool().report(files_at, "bash tools/gpu-check")
    o = next(r for r in json.loads(sweep.stdout) if r["overlap"])
    line = next(ln for ln in text.splitlines() if ln.startswith("| 2 | split | flat |"))
    assert f"| {o['serial_decode_s'] * 1e3:.2f} | {o['bound_s'] * 1e3:.2f} | {o['decode_s'] * 1e3:.2f} |" in line
    assert f"| {o['decode_s'] / o['serial_decode_s']:.2f}x |" in line
    # the first sweep's table takes serial rows only
    assert "## Copies under compute" in text


def test_missing_files_are_said_not_invented(tmp_path: Path) -> None:
    text = load_tool().report(tmp_path, "x")
    assert "No bench.json: cuda-bench did not finish." in text
    assert "The sweep did not run or printed no JSON." in text
    assert "The overlapped sweep did not run or printed no JSON." in text
    assert "unknown (no nvidia-smi row in build.log)" in text


def test_cli_refuses_a_missing_folder(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(TOOL), str(tmp_path / "nope")], capture_output=True, text=True)
    assert r.returncode == 2 and "is not a folder" in r.stderr
