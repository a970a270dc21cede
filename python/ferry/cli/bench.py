"""`ferry bench`: the analogue of llama.cpp's batched-bench generation phase, with real copies and timings."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, TextIO, Tuple, Union

from ..errors import InvalidArgumentError, UnsupportedError
from ..workloads import bench as bench_workload
from ..workloads.bench import SPREAD, TARGET_HALF_WIDTH, BenchConfig, BenchResult, BenchRow
from ..workloads.common import run_name
from ..workloads.estimate import Interval
from . import residency
from .options import apply_model, check_one_head_dim, devices_from_args, run_fields
from .progress import Progress, progress_stream
from .reference import Verb, add_verb_parser
from .text_table import fmt_layers, fmt_link, fmt_mib, fmt_seconds, fmt_tps_digits, format_table

__all__ = ["BenchConfig", "BenchResult", "BenchRow", "Progress", "add_parser", "check_plot_available",
           "config_from_args", "job", "run", "fmt_bytes", "fmt_gain", "fmt_gbps", "fmt_interval", "fmt_layers",
           "fmt_mib",
           "fmt_ratio", "fmt_seconds", "fmt_spread", "fmt_tps", "fmt_tps_digits", "format_devices", "format_wide",
           "format_overlap", "format_result", "main", "plot_result", "run_bench"]

#: Failures that come from the options: reported as usage errors (exit 2); others end the run.
ARGUMENT_ERRORS = InvalidArgumentError


def run_bench(cfg: BenchConfig, progress: Optional[TextIO] = None,
              clock: Callable[[], float] = time.perf_counter) -> BenchResult:
    """`bench_workload.run_bench` with a progress bar: of the time cap's seconds when replicas are
    added until the intervals narrow (the run may end before it), else of the decode steps.

    Parameters
    ----------
    cfg : BenchConfig
        What to run.
    progress : TextIO, optional
        Where to draw the bar; None draws none.
    clock : callable, optional
        Seconds, for the bar of a capped run.

    Returns
    -------
    BenchResult
        As `bench_workload.run_bench` returns it.
    """
    total = max(math.ceil(cfg.max_time), 1) if cfg.adaptive else cfg.n_steps
    bar = Progress(total, progress, unit="s" if cfg.adaptive else "")
    start, shown = clock(), 0

    def on_step(label: str) -> None:
        nonlocal shown
        if not cfg.adaptive:
            bar.step(label=label)
            return
        now = min(int(clock() - start), total)
        bar.step(now - shown, label=label)
        shown = now

    try:
        return bench_workload.run_bench(cfg, on_step=on_step)
    finally:
        bar.close()


# ------------------------------------------------------------ output






def fmt_gbps(bps: float) -> str:
    """The bandwidth bps (bytes per second) in GB/s."""
    return f"{bps / 1e9:.2f} GB/s"


def fmt_gain(g: Optional[float]) -> str:
    """The gain g (0.1 for +10%) as a signed percentage, or "-" for None."""
    if g is None:
        return "-"
    return f"{g * 100:+.1f}%"


def fmt_spread(spread: Optional[Tuple[float, float, float]], fmt: Callable[[float], str]) -> str:
    """A (median, least, greatest) spread as "median (least..greatest)", each written by fmt; "-" for None."""
    if spread is None:
        return "-"
    return f"{fmt(spread[0])} ({fmt(spread[1])}..{fmt(spread[2])})"


def fmt_tps(tps: float) -> str:
    """Tokens/s with thousands separators, no decimals."""
    return f"{tps:,.0f}"




def fmt_bytes(n: float) -> str:
    """n bytes in KiB below a MiB (one decimal), else in MiB (two decimals)."""
    if n < 2**20:
        return f"{n / 2**10:,.1f} KiB"
    return f"{n / 2**20:,.2f} MiB"


def fmt_interval(g: Optional[Interval], exact: bool = False) -> str:
    """A gain with its interval: "+35.8% ±2.4" (± the farther end), or with exact "+35.8% [+33.4,+38.2]";
    "~" before it when the interval holds 0 (a gain within its own noise), "±?" without an interval
    (too few replicas), "-" for None."""
    if g is None:
        return "-"
    mark = "~" if g.within_noise else ""
    if g.low is None or g.high is None:
        return f"{mark}{g.estimate * 100:+.1f}% ±?"
    if exact:
        return f"{mark}{g.estimate * 100:+.1f}% [{g.low * 100:+.1f},{g.high * 100:+.1f}]"
    return f"{mark}{g.estimate * 100:+.1f}% ±{g.half_width * 100:.1f}"


def _samples_line(res: BenchResult) -> str:
    """How many replicas each npl took, of how many samples of how many steps."""
    parts = [f"npl {s.npl}: {s.replicas} x {s.samples // max(s.replicas, 1)} of {s.loops * res.config.ntg} steps"
             + (" (capped)" if s.capped else "") for s in res.sampling.values()]
    return "replicas x samples: " + "; ".join(parts) + "; variants taking turns"


def _footer(res: BenchResult) -> List[str]:
    """Per npl, whether the outputs agreed, and at how many of a repetition's later steps the graph was
    rebuilt (the padded n_kv changed)."""
    cfg = res.config
    lines = []
    for npl in cfg.npl:
        runs = "policies and both caches" if cfg.runs_unified else "policies"
        runs += ", serial and overlapped" if cfg.overlap else ""
        same = "identical" if res.outputs_identical(npl) else "DIFFERENT"
        r = res.row(npl, res.variants()[0][0], False, res.variants()[0][1])
        lines.append(f"npl {npl}: attention outputs {same} across {runs}; rebuilt at {r.rebuilds} of {cfg.ntg - 1} "
                     "later steps")
    return lines


def _extra_tables(res: BenchResult) -> List[str]:
    lines: List[str] = []
    if not res.config.devices.default:
        lines += format_devices(res) + [""]
    if res.config.overlap:
        lines += format_overlap(res) + [""]
    return lines


def _head(res: BenchResult) -> List[str]:
    cfg = res.config
    dc = cfg.devices
    links = [dc.standin_link(d) for d in range(dc.n_devices)]
    named = ", ".join(f"device {d} {fmt_link(x)}" if x else f"device {d} the host's memcpy"
                      for d, x in enumerate(links)) if len(links) > 1 else fmt_link(links[0])
    link = [] if res.standin_link_gbps is None else [
        f"stand-in link{'s' if len(links) > 1 else ''}: {named} each way, modelled (--link-gbps; 0: the host's "
        "memcpy)"]
    return [f"split backend: {res.split_name}; KV cache in {res.cache_memory} (CPU backend)", *link,
            f"-c {cfg.n_ctx}, -npp {cfg.npp}, -ntg {cfg.ntg}, {cfg.n_layer} layers, K/V {cfg.type_kv}, "
            f"{cfg.n_head} heads x {cfg.head_dim}, {cfg.n_head_kv} KV heads, pad {cfg.pad}"
            + (", V transposed" if cfg.v_trans else "")]


def format_result(res: BenchResult, wide: bool = False) -> str:
    """The report of the BenchResult res, under 100 columns: the header, per npl a row per split-cache
    variant (tokens/s, its gain over flat and over the unified cache with their intervals, copy
    time and bytes copied and read per step) and one for the unified cache, then whether the
    outputs agreed.
    With wide, format_wide's report instead.
    """
    if wide:
        return format_wide(res)
    cfg = res.config
    lines = _head(res) + [
        "tok/s: the floor (each step's fastest time in a replica, summed), median of the replicas; each",
        "replica has its own caches. gain: median of the replicas' gains, ± the farther end of its 95%",
        f"interval; ~: the interval holds 0 (within noise). Goal: ±{TARGET_HALF_WIDTH * 100:g} points",
        _samples_line(res),
        "copy, copied, read: per decode step, every layer's K and V windows",
        "",
    ]
    head = ["npl", "policy", "tok/s", "over flat", "over unified" if cfg.runs_unified else "", "copy", "copied",
            "read"]
    body = []
    for npl in cfg.npl:
        for policy, compact in res.variants():
            r = res.row(npl, policy, False, compact)
            gain = res.gain_interval(r) if policy != "flat" else None
            body.append([str(npl), r.label, fmt_tps_digits(r.tokens_per_s), fmt_interval(gain),
                         fmt_interval(res.unified_gain(r)) if cfg.runs_unified else "",
                         fmt_seconds(r.per_step(r.copy_s)),
                         fmt_bytes(r.per_step(r.bytes_copied)), fmt_bytes(r.per_step(r.bytes_read))])
        if cfg.runs_unified:
            policy, compact = res.variants()[0]
            u = res.row(npl, policy, True, compact)
            body.append([str(npl), "unified", fmt_tps_digits(u.tokens_per_s), "noise", "-",
                         fmt_seconds(u.per_step(u.copy_s)),
                         fmt_bytes(u.per_step(u.bytes_copied)), fmt_bytes(u.per_step(u.bytes_read))])
    lines += [ln.rstrip() for ln in format_table([head, *body], left=(1,))]
    if cfg.runs_unified:
        lines.append(f"unified: the cache under {res.variants()[0][0]}; one dense range, copied alike under every "
                     "policy,")
        lines.append("so its gain over flat is noise and not claimed (--wide, --json show it)")
    lines.append("")
    lines += _extra_tables(res)
    lines += _footer(res)
    return "\n".join(lines)


def format_wide(res: BenchResult) -> str:
    """The report with every figure: per npl and policy the tokens/s and gain over flat with their spread
    (over the samples, and over the replicas) and the gain's interval, decode, host, end-to-end, copy and
    compute time, bytes
    copied and read over a repetition, copy bandwidth and the split's memory, then the unified
    cache's figures and the split's gain over it; then whether the outputs agreed."""
    cfg = res.config
    lines = _head(res) + [
        "tok/s, decode, host, copy, compute: floors (each step's fastest time in a replica, summed), median of",
        "the replicas; gain: median of the replicas' gains with its 95% interval; ~: it holds 0 (noise)",
        _samples_line(res),
        f"per sample, per replica: {SPREAD}",
        "copy and bytes: every layer's K and V windows over the ntg steps of a repetition",
        "host: getting each step's graph (built and allocated when the padded n_kv changes"
        + (", else reused" if cfg.reuse else ", every step: --no-reuse") + ") and writing its lengths; "
        "e2e tok/s counts decode and host time",
        "",
    ]
    head = ["npl", "policy", "tok/s", "per sample", "gain", "per replica", "decode", "host", "e2e tok/s",
            "copy", "compute", "copied", "read", "copy bw", "split mem"]
    if cfg.runs_unified:
        head += ["unified tok/s", "gain (noise)", "per replica", "copy", "copied", "over unified"]
    body = []
    for npl in cfg.npl:
        for policy, compact in res.variants():
            r = res.row(npl, policy, False, compact)
            g = res.gain_interval(r)
            cells = [str(npl), r.label, fmt_tps_digits(r.tokens_per_s), fmt_spread(r.tokens_per_s_spread, fmt_tps),
                     fmt_gain(res.gain(r)) if policy == "flat" or g is None else fmt_interval(g, exact=True),
                     fmt_spread(res.gain_spread(r), fmt_gain), fmt_seconds(r.decode_s),
                     fmt_seconds(r.host_s), fmt_tps(r.tokens_per_s_end_to_end), fmt_seconds(r.copy_s),
                     fmt_seconds(r.compute_s), fmt_mib(r.bytes_copied), fmt_mib(r.bytes_read),
                     fmt_gbps(r.copy_bandwidth), fmt_mib(r.split_memory)]
            if cfg.runs_unified:
                u = res.row(npl, policy, True, compact)
                cells += [fmt_tps_digits(u.tokens_per_s), fmt_gain(res.gain(u)),
                          fmt_spread(res.gain_spread(u), fmt_gain), fmt_seconds(u.copy_s), fmt_mib(u.bytes_copied),
                          fmt_interval(res.unified_gain(r), exact=True)]
            body.append(cells)
    lines += format_table([head, *body], left=(1,))
    lines.append("")
    lines += _extra_tables(res)
    lines += _footer(res)
    return "\n".join(lines)


def format_devices(res: BenchResult) -> List[str]:
    """The lines of the per-device table (with --devices, a placement or a modelled link): per npl,
    variant and device, the layers it runs and holds, the bytes its splits received over a
    repetition (of them, KV windows'), their copy time, and the memory it held."""
    cfg = res.config
    dc = cfg.devices
    lines = [f"devices: {dc.n_devices}; KV placement {dc.describe(cfg.n_layer)} "
             f"({', '.join('h' if p is None else str(p) for p in dc.places(cfg.n_layer))}: per layer, h host memory "
             "or the device holding it)",
             "per device: layers run and resident, bytes its splits received over a repetition's steps (of them KV "
             "windows), their copy time, memory held (the scheduler's buffer at its most plus resident KV)"]
    if cfg.unified and not cfg.runs_unified:
        lines.append("unified cache: not run (one device with every layer on the host only)")
    head = ["npl", "policy", "device", "runs", "holds KV of", "copied", "KV copied", "copy", "memory", "link"]
    body = []
    for r in res.rows:
        if r.unified:
            continue
        for d in r.devices:
            body.append([str(r.npl), r.label, f"{d.index}: {d.name}", fmt_layers(d.layers),
                         fmt_layers(d.resident_layers), fmt_mib(d.bytes_copied), fmt_mib(d.kv_bytes_copied),
                         fmt_seconds(d.copy_s), fmt_mib(d.memory_bytes),
                         "-" if d.link_gbps is None else fmt_link(d.link_gbps)])
    return lines + format_table([head, *body], left=(1, 2))


def fmt_ratio(x: float) -> str:
    """A ratio x as "0.83x"."""
    return f"{x:.2f}x"


def format_overlap(res: BenchResult) -> List[str]:
    """The lines of the overlap table (--overlap): per npl, layout and variant, the serial run's decode,
    copy and compute times and its bound max(copy, compute), the overlapped run's decode time over
    each, and the memory both held on the split backend."""
    cfg = res.config
    lines = [f"overlap: each variant also ran prefetching {cfg.prefetch} layer(s) ahead on the split's copy queue, "
             "taking turns with the serial run; bound = max(copy, compute) of the serial run",
             "overlapped copy: the copy queue's time on the copies; ahead: what prefetching held on the split "
             "beyond the layer computing"]
    head = ["npl", "cache", "policy", "serial decode", "copy", "compute", "bound", "overlapped decode",
            "/ serial", "/ bound", "overlapped copy", "compute", "split mem", "overlapped", "ahead"]
    body = []
    for npl in cfg.npl:
        for unified in cfg.layouts:
            for policy, compact in res.variants():
                s = res.row(npl, policy, unified, compact)
                o = res.row(npl, policy, unified, compact, overlap=True)
                bound = res.bound(o)
                body.append([str(npl), "unified" if unified else "split", s.label, fmt_seconds(s.decode_s),
                             fmt_seconds(s.copy_s), fmt_seconds(s.compute_s), fmt_seconds(bound),
                             fmt_seconds(o.decode_s), fmt_ratio(o.decode_s / s.decode_s),
                             fmt_ratio(o.decode_s / bound) if bound > 0 else "-", fmt_seconds(o.copy_s),
                             fmt_seconds(o.compute_s), fmt_mib(s.split_memory), fmt_mib(o.split_memory),
                             fmt_mib(o.ahead_bytes)])
    return lines + format_table([head, *body], left=(1, 2))


def check_plot_available() -> None:
    """Raise UnsupportedError, saying how to install it, when matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UnsupportedError("--plot needs matplotlib: pip install 'ferry[plot]' (or matplotlib)") from None


def plot_result(res: BenchResult, path: str) -> None:
    """Write a PNG bar chart of tokens/s by npl, one bar per policy (and per policy on the unified cache).

    Parameters
    ----------
    res : BenchResult
    path : str
        The PNG file to write.

    Raises
    ------
    UnsupportedError
        Without matplotlib.
    """
    check_plot_available()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = res.config
    series = [(p, c, False) for p, c in res.variants()] + (
        [(p, c, True) for p, c in res.variants()] if cfg.runs_unified else [])
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for i, (policy, compact, unified) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(cfg.npl))]
        ys = [res.row(npl, policy, unified, compact).tokens_per_s for npl in cfg.npl]
        name = run_name(policy, compact) + (" (unified)" if unified else "")
        ax.bar(xs, ys, width, label=name, hatch="//" if unified else None)
    ax.set_xticks(range(len(cfg.npl)))
    ax.set_xticklabels([str(n) for n in cfg.npl])
    ax.set_xlabel("sequences (npl)")
    ax.set_ylabel("generated tokens / s")
    ax.set_title(f"ferry bench on {res.split_name}: -c {cfg.n_ctx} -npp {cfg.npp} -ntg {cfg.ntg}, "
                 f"{cfg.n_layer} layers, {cfg.type_kv}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


# ------------------------------------------------------------ the command


VERB = Verb("bench", "decode steps over a host KV cache: tokens/s, copy time and bytes per copy policy "
            "(llama-batched-bench's generation phase)",
            "Decode steps over a KV cache in host memory split into one stream per sequence: each step copies "
            "every layer's K and V windows to the split's device under each copy policy, and attention runs "
            "there; beside them a unified cache of the same sequences. Prints tokens/s, the gain over flat with "
            "its 95% interval, and the bytes copied and read per step.",
            "ferry bench -c 16384 -npl 2,4,8 -npp 1024 --type q8_0 --heads 32 --head-dim 128 --kv-heads 8 "
            "--policy flat,ranges --repeat 5")


def add_parser(sub: "argparse._SubParsersAction[Any]") -> argparse.ArgumentParser:
    """Add the `bench` verb to the `ferry` command's subparsers sub; returns the verb's parser."""
    return add_verb_parser(sub, VERB)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The BenchConfig the parsed options args describe (not yet checked)."""
    return BenchConfig(n_ctx=args.c, npl=tuple(args.npl), npp=args.npp, ntg=args.ntg, n_layer=args.layers,
                       type_kv=args.type, n_head=args.heads, head_dim=args.head_dim, n_head_kv=args.kv_heads,
                       policies=tuple(args.policy), unified=args.unified, device=args.device, pad=args.pad,
                       repeat=args.repeat, min_sample_ms=args.min_sample_ms,
                       max_time=BenchConfig.max_time if args.max_time is None else args.max_time,
                       in_process=args.in_process, v_trans=args.v_trans, compact=args.compact, reuse=args.reuse,
                       overlap=args.overlap, prefetch=args.prefetch, devices=devices_from_args(args))


@dataclass(frozen=True)
class Job:
    """What `ferry bench` runs and prints: the run's BenchConfig, and the table, the wide table or
    JSON, and a chart or none."""

    config: BenchConfig
    json: bool
    wide: bool
    plot: Optional[str]


def job(args: argparse.Namespace) -> Union[Job, residency.BenchJob]:
    """The Job (with --residency, the residency.BenchJob) the parsed options args describe, --model read
    and the config checked.

    Raises
    ------
    InvalidArgumentError
        For options that cannot run, or a --model file that cannot be read.
    UnsupportedError
        For --plot without matplotlib.
    """
    g = apply_model(args, run_fields())
    check_one_head_dim(g, args)
    if args.residency is not None:
        return residency.bench_job(args, g)
    cfg = config_from_args(args)
    cfg.check()
    if args.plot:
        check_plot_available()
    return Job(cfg, args.json, args.wide, args.plot)


def run(j: Union[Job, residency.BenchJob]) -> int:
    """Run the job: the table (or JSON) on stdout, the bar and warnings on stderr, the chart to its file.
    Returns the exit status 0; a FerryError when a run fails."""
    if isinstance(j, residency.BenchJob):
        return residency.run_bench(j)
    res = run_bench(j.config, progress_stream())
    if j.json:
        print(f"ferry bench: split backend {res.split_name}, KV cache in {res.cache_memory}", file=sys.stderr)
        print(json.dumps(res.as_dicts(), indent=2))
    else:
        print(format_result(res, j.wide))
    for warning in res.warnings():
        print(f"ferry bench: warning: {warning}", file=sys.stderr)
    if j.plot:
        plot_result(res, j.plot)
        print(f"ferry bench: wrote {j.plot}", file=sys.stderr)
    return 0


def main(args: argparse.Namespace) -> int:
    """`ferry bench` with the parsed options args: run(job(args)). InvalidArgumentError for options that
    cannot run (a usage error), another FerryError when a run fails."""
    return run(job(args))
