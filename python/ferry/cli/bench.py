"""`ferry bench`: the analogue of llama.cpp's batched-bench generation phase, with real copies and timings."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any, Callable, List, Optional, TextIO, Tuple

from ..errors import InvalidArgumentError, UnsupportedError
from ..workloads import bench as bench_workload
from ..workloads.bench import SPREAD, TARGET_HALF_WIDTH, BenchConfig, BenchResult, BenchRow
from ..workloads.common import run_name
from ..workloads.estimate import Interval
from . import residency
from .options import (
    POSITIVE,
    accepting,
    add_device_arg,
    add_devices_args,
    add_kv_args,
    add_policy_arg,
    add_residency_args,
    add_shape_args,
    add_v_trans_arg,
    add_verb_parser,
    apply_model,
    check_one_head_dim,
    devices_from_args,
    run_fields,
)
from .progress import Progress, progress_stream
from .text_table import fmt_layers, format_table

__all__ = ["BenchConfig", "BenchResult", "BenchRow", "Progress", "add_parser", "check_plot_available",
           "config_from_args", "fmt_bytes", "fmt_gain", "fmt_gbps", "fmt_interval", "fmt_layers", "fmt_mib",
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


def fmt_seconds(s: float) -> str:
    """The duration s (seconds) with a unit that keeps 3-4 significant digits: µs, ms or s."""
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1.0:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.3f} s"


def fmt_mib(n: int) -> str:
    """The n bytes in MiB with one decimal."""
    return f"{n / 2**20:,.1f} MiB"


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


def fmt_tps_digits(tps: float) -> str:
    """Tokens/s with at least 4 significant digits (7.123, 71.23, 712.3, 7,123): a difference of a few
    tenths of a percent shows, as the gains claim."""
    for limit, decimals in ((10.0, 3), (100.0, 2), (1000.0, 1)):
        if abs(tps) < limit:
            return f"{tps:,.{decimals}f}"
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
    link = [] if res.standin_link_gbps is None else [
        f"stand-in link: {res.standin_link_gbps:g} GB/s each way, modelled (--link-gbps; 0: the host's memcpy)"]
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
    head = ["npl", "policy", "device", "runs", "resident", "copied", "KV copied", "copy", "memory", "link"]
    body = []
    for r in res.rows:
        if r.unified:
            continue
        for d in r.devices:
            body.append([str(r.npl), r.label, f"{d.index}: {d.name}", fmt_layers(d.layers),
                         fmt_layers(d.resident_layers), fmt_mib(d.bytes_copied), fmt_mib(d.kv_bytes_copied),
                         fmt_seconds(d.copy_s), fmt_mib(d.memory_bytes),
                         "-" if d.link_gbps is None else f"{d.link_gbps:g} GB/s"])
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


@accepting("number >= 0")
def non_negative(text: str) -> float:
    """An argparse type: a finite number of at least 0; ArgumentTypeError for anything else."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text} is out of range: a finite number of at least 0")
    return value


def add_parser(sub: "argparse._SubParsersAction[Any]") -> argparse.ArgumentParser:
    """Add the `bench` verb to the `ferry` command's subparsers sub; returns the verb's parser."""
    d = BenchConfig()
    bp = add_verb_parser(sub, "bench", "decode steps over a host KV cache: tokens/s, copy time and bytes per copy "
                         "policy (llama-batched-bench's generation phase)", __doc__,
                         "ferry bench -c 16384 -npl 2,4,8 -npp 1024 --type q8_0 --heads 32 --head-dim 128 "
                         "--kv-heads 8 --policy flat,ranges --repeat 5", bench_workload.__doc__)
    add_shape_args(bp, ntg_minimum=1)
    add_kv_args(bp, run=True)
    add_policy_arg(bp, "to compare")
    bp.add_argument("--unified", action=argparse.BooleanOptionalAction, default=d.unified,
                    help="also run a unified cache of the same sequences, for comparison (default on; one device "
                         "with every layer on the host only: skipped, with a note, otherwise)")
    add_device_arg(bp)
    add_devices_args(bp)
    bp.add_argument("--repeat", type=POSITIVE, default=d.repeat, metavar="N",
                    help="replicas of each npl, exactly: each its own caches and schedulers, warmed up, then "
                         f"samples of each variant, about {bench_workload.REPS_PER_REPLICA} repetitions; figures are "
                         "floors, the "
                         f"median of the replicas (default none: {bench_workload.REPLICAS}, more until every gain's "
                         f"95%% interval is within ±{TARGET_HALF_WIDTH * 100:g} points or --max-time passes)")
    bp.add_argument("--min-sample-ms", type=non_negative, default=d.min_sample_ms, metavar="MS",
                    help="what one timed sample lasts at least, in ms of decode time: the calibration doubles the "
                         "repetitions a sample holds until it does; 0: one repetition, and 2 samples a replica (the "
                         f"quickest run) (default {d.min_sample_ms:g})")
    bp.add_argument("--max-time", type=non_negative, metavar="SECONDS",
                    help="seconds the run may take: replicas are added only while they would end within it (the "
                         f"first {bench_workload.REPLICAS} always run); refused with --repeat, which fixes the "
                         f"replicas (default {d.max_time:g})")
    bp.add_argument("--in-process", action="store_true",
                    help="make every replica in this process (quicker to start); without it each replica of the "
                         "npls runs in a worker process of its own, so that the intervals hold what moves from one "
                         "process to the next (one replica runs here either way)")
    add_v_trans_arg(bp)
    bp.add_argument("--compact", action="store_true",
                    help="also run each non-flat policy with compact staging (the split holds only the bytes read)")
    bp.add_argument("--no-reuse", dest="reuse", action="store_false",
                    help="build and allocate every step's graph, even while the padded n_kv holds")
    bp.add_argument("--overlap", action="store_true",
                    help="also run each variant prefetching its windows on the split's copy queue while earlier "
                         "layers compute, and compare its decode time with the serial run's")
    bp.add_argument("--prefetch", type=POSITIVE, default=d.prefetch, metavar="N",
                    help=f"layers an overlapped run queues ahead (default {d.prefetch})")
    bp.add_argument("--wide", action="store_true",
                    help="the table with every figure (spreads, decode, host and e2e, copy and compute time, "
                         "copy bandwidth, memory, the unified cache's), wider than 100 columns")
    bp.add_argument("--json", action="store_true", help="a JSON list of objects instead of the table")
    bp.add_argument("--plot", metavar="FILE.png", help="also write a PNG chart of tokens/s (needs matplotlib)")
    add_residency_args(bp, "run each placement and print measured beside predicted (ferry.workloads.residency_bench)")
    return bp


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The BenchConfig the parsed options args describe (not yet checked)."""
    return BenchConfig(n_ctx=args.c, npl=tuple(args.npl), npp=args.npp, ntg=args.ntg, n_layer=args.layers,
                       type_kv=args.type, n_head=args.heads, head_dim=args.head_dim, n_head_kv=args.kv_heads,
                       policies=tuple(args.policy), unified=args.unified, device=args.device, pad=args.pad,
                       repeat=args.repeat, min_sample_ms=args.min_sample_ms,
                       max_time=BenchConfig.max_time if args.max_time is None else args.max_time,
                       in_process=args.in_process, v_trans=args.v_trans, compact=args.compact, reuse=args.reuse,
                       overlap=args.overlap, prefetch=args.prefetch, devices=devices_from_args(args))


def main(args: argparse.Namespace) -> int:
    """Run `ferry bench` with the parsed options args: the table (or JSON) on stdout, the bar on
    stderr, the chart to --plot. Returns the exit status 0; InvalidArgumentError for options that
    cannot run or a --model file that cannot be read (a usage error), another FerryError when a run
    fails.
    """
    g = apply_model(args, run_fields())
    check_one_head_dim(g, args)
    if args.residency is not None:
        return residency.bench_main(args, g)
    if args.repeat is not None and args.max_time is not None:
        raise InvalidArgumentError("--max-time caps the replicas added without --repeat; with --repeat "
                                   f"{args.repeat} it does nothing: give one of them")
    cfg = config_from_args(args)
    cfg.check()
    if args.plot:
        check_plot_available()
    res = run_bench(cfg, progress_stream())
    if args.json:
        print(f"ferry bench: split backend {res.split_name}, KV cache in {res.cache_memory}", file=sys.stderr)
        print(json.dumps(res.as_dicts(), indent=2))
    else:
        print(format_result(res, args.wide))
    for warning in res.warnings():
        print(f"ferry bench: warning: {warning}", file=sys.stderr)
    if args.plot:
        plot_result(res, args.plot)
        print(f"ferry bench: wrote {args.plot}", file=sys.stderr)
    return 0
