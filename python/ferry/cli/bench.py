"""`ferry bench`: the analogue of llama.cpp's batched-bench generation phase, with real copies and timings."""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, TextIO, Tuple

from ..errors import InvalidArgumentError, UnsupportedError
from ..residency import expected_accepted_tokens
from ..workloads import bench as bench_workload
from ..workloads.bench_config import PAGED_GATHERS, REPLICAS, BenchConfig, Sampling, Sequences
from ..workloads.bench_report import BenchReport, BenchResult
from ..workloads.bench_rows import BenchRow
from ..workloads.common import PREFETCH_NEXT, KVGeometry, VariantOptions, run_name
from ..workloads.estimate import Interval
from ..workloads.paged_tables import DEVICE_TABLE, DEVICE_TABLE_PREFETCH, PagedOptions
from ..workloads.trace import chrome_trace
from . import remote_hook
from .options import apply_model, check_one_head_dim, check_output_path, devices_from_args, run_fields, write_output
from .progress import Progress, progress_stream
from .reference import WIDTH, Verb, add_verb_parser
from .text_table import fmt_layers, fmt_link, fmt_mib, fmt_seconds, fmt_tps_digits, format_table

__all__ = ["BenchConfig", "BenchResult", "BenchRow", "Job", "add_parser", "check_plot_available", "config_from_args",
           "fmt_bytes", "fmt_interval", "format_devices", "format_draft", "format_overlap", "format_paged",
           "format_result",
           "format_wide", "job",
           "main", "plot_result", "run", "run_bench"]

#: Failures that come from the options: reported as usage errors (exit 2); others end the run.
ARGUMENT_ERRORS = InvalidArgumentError


def run_bench(cfg: BenchConfig, progress: Optional[TextIO] = None) -> BenchResult:
    """`bench_workload.run_bench` with a progress bar of its decode steps drawn on progress (None: none)."""
    bar = Progress(cfg.n_steps, progress)
    try:
        return bench_workload.run_bench(cfg, on_step=lambda label: bar.step(label=label))
    finally:
        bar.close()


# ------------------------------------------------------------ output


def fmt_bytes(n: float) -> str:
    """n bytes in KiB below a MiB (one decimal), else in MiB (two decimals)."""
    if n < 2**20:
        return f"{n / 2**10:,.1f} KiB"
    return f"{n / 2**20:,.2f} MiB"


def fmt_interval(g: Optional[Interval], exact: bool = False) -> str:
    """A gain with its interval: "+35.8% ±2.4" (± the farther end), or with exact "+35.8% [+33.4,+38.2]";
    "~" before it when the interval holds 0 (a gain within its own noise), "±?" without an interval
    (one replica), "-" for None."""
    if g is None:
        return "-"
    mark = "~" if g.within_noise else ""

    def points(x: float, sign: str = "+") -> str:  # tenths below 100 points; whole points beyond (a wild run)
        return f"{x * 100:{sign}.{1 if abs(x) < 1 else 0}f}"

    if g.low is None or g.high is None:
        return f"{mark}{points(g.estimate)}% ±?"
    if exact:
        return f"{mark}{points(g.estimate)}% [{points(g.low)},{points(g.high)}]"
    return f"{mark}{points(g.estimate)}% ±{points(g.half_width, '')}"


def _footer(res: BenchResult, rep: BenchReport) -> List[str]:
    """Per npl, whether the outputs agreed and how often the step's graph was rebuilt."""
    cfg = res.config
    runs = ("policies and both caches" if cfg.runs_unified else "policies") + (", serial and overlapped"
                                                                               if cfg.variants.overlap else "")
    if cfg.paged_cache.paged:
        runs = "the paged gathers and the cells cache"
    return [f"npl {s.npl}: outputs {'identical' if s.outputs_identical else 'DIFFERENT'} across {runs}; graph "
            f"rebuilt at {s.rebuilds} of {cfg.sequences.ntg - 1} later steps" for s in rep.per_npl]


def _head(res: BenchResult) -> List[str]:
    cfg = res.config
    dc, q = cfg.devices, cfg.sequences
    where = f"split on {res.split_name}"
    if res.standin_link_gbps is not None and dc.link_profile is not None:  # the named link, at its peak or G
        peak = res.standin_link_gbps  # the split's own: the named link's peak where --link-gbps gives none
        where += f", link {dc.link_profile} at " + ", ".join(fmt_link(x or peak) for x in (dc.link_gbps or (0.0,)))
    elif res.standin_link_gbps is not None:
        links = [dc.standin_link(d) for d in range(dc.n_devices)]
        where += ", link " + ", ".join(fmt_link(x) if x else "unmodelled" for x in links)
    replicas = f"{cfg.sampling.repeat} replica{'s' if cfg.sampling.repeat != 1 else ''}"
    return [f"{where}; KV cache in {res.cache_memory}; {replicas}, {res.seconds:.1f} s",
            f"-c {q.n_ctx} -npp {q.npp} -ntg {q.ntg}, {cfg.kv.n_layer} layers, K/V {cfg.kv.type_kv}, "
            f"{cfg.kv.n_head} heads x {cfg.kv.head_dim}, {cfg.kv.n_head_kv} KV heads, pad {q.pad}"
            + (", V transposed" if cfg.kv.v_trans else "")]


def _tail(res: BenchResult, rep: BenchReport, wide: bool = False) -> List[str]:
    lines: List[str] = list(res.config.unified_note or ())
    if not res.config.devices.default:
        lines += [""] + format_devices(res)
    if res.config.variants.overlap:
        lines += [""] + format_overlap(res, rep, wide)
    if res.config.tokens_per_step > 1:
        lines += [""] + format_draft(res, rep, wide)
    return lines + [""] + [w for line in _footer(res, rep) for w in _prose(line, wide)]


def _prose(line: str, wide: bool = False) -> List[str]:
    """A line of prose in lines of at most WIDTH columns (as it is with wide)."""
    return [line] if wide else textwrap.wrap(line, WIDTH, break_on_hyphens=False, subsequent_indent="  ")


def format_result(res: BenchResult, wide: bool = False) -> str:
    """The report of the BenchResult res, under 100 columns: a header, per npl a row per split-cache
    variant (tokens/s, its gain over flat and over the unified cache with their intervals, copy time
    and bytes copied and read per step) and one for the unified cache, then whether the outputs
    agreed. With wide, format_wide's report instead."""
    rep = res.finished()  # everything the formatters read of the result, once
    if wide:
        return format_wide(res, rep)
    cfg = res.config
    if cfg.paged_cache.paged:
        return format_paged(res, rep)
    head = ["npl", "policy", "tok/s", "over flat", "over unified" if cfg.runs_unified else "", "copy/step",
            "copied/step", "read/step"]
    body = []
    for f in rep.rows:
        r, k = f.row, f.row.key
        if not f.is_serial_cells or (k.unified and (k.policy, k.compact) != rep.variants[0]):
            continue
        gains = ["-", "-"] if k.unified else ["-" if k.policy == "flat" else fmt_interval(f.gain),
                                               fmt_interval(f.over_unified) if cfg.runs_unified else ""]
        body.append([str(k.npl), "unified" if k.unified else k.label, fmt_tps_digits(r.tokens_per_s), *gains,
                     fmt_seconds(r.per_step(r.times.copy_s)), fmt_bytes(r.per_step(r.counts.bytes_copied)),
                     fmt_bytes(r.per_step(r.counts.bytes_read))])
    lines = _head(res) + [ln.rstrip() for ln in format_table([head, *body], left=(1,))]
    return "\n".join(lines + _tail(res, rep))


def _against(measured: float, predicted: float) -> str:
    """A measured time as a multiple of its prediction ("1.04x"), "-" with no prediction."""
    return f"{measured / predicted:.2f}x" if predicted > 0 else "-"


def format_paged(res: BenchResult, rep: BenchReport) -> str:
    """The report of a --paged run: per npl the paged cache's per-block, batched and merged gathers (the
    method taken named) and the cells cache's ragged copy, each with tokens/s, and per step its copy calls, its
    copy time against the copies' predicted time, and the bytes copied and read."""
    cfg = res.config
    head = ["npl", "cache", "tok/s", "calls/step", "copy/step", "predicted", "copied/step", "read/step"]
    serial = {(f.row.key.npl, f.row.key.gather): f.row for f in rep.rows  # the serial ragged runs
              if f.row.key.policy == "ragged" and not (f.row.key.unified or f.row.key.compact or f.row.key.prefetch)}
    body = []
    for npl in cfg.sequences.npl:  # each npl's paged gathers, then the cells cache's ragged copy
        for gather in (*PAGED_GATHERS, DEVICE_TABLE, DEVICE_TABLE_PREFETCH,
                       ""):
            if (npl, gather) not in serial:  # batched, on a device that does not offer it
                continue
            r = serial[npl, gather]
            t, n = r.times, r.counts
            named = gather in ("auto", DEVICE_TABLE, DEVICE_TABLE_PREFETCH)
            name = r.key.label + (f" ({n.gather_used})" if named else "") if gather else "cells ragged"
            body.append([str(npl), name, fmt_tps_digits(r.tokens_per_s), f"{r.per_step(n.copy_calls):,.0f}",
                         fmt_seconds(r.per_step(t.copy_s)), fmt_seconds(r.per_step(t.predicted_copy_s)),
                         fmt_bytes(r.per_step(n.bytes_copied)), fmt_bytes(r.per_step(n.bytes_read))])
    paged = cfg.paged_cache
    shared = f", a {paged.shared_prefix}-cell prefix shared" if paged.shared_prefix else ""
    lines = _head(res) + [f"paged cache: {paged.block_size}-cell blocks, adjacency {paged.adjacency:g}{shared}; "
                          f"device table's pool {paged.device_blocks:g} of the working set; per step, the K and V "
                          "windows' copies (the device table's: what its pool was sent)"]
    lines += [ln.rstrip() for ln in format_table([head, *body], left=(1,))]
    for npl in cfg.sequences.npl:  # a decode loop's first step sends the prompts; each after, what is new
        r, dense = serial[npl, DEVICE_TABLE], serial[npl, "per_block"]
        n, steps = r.counts, max(r.ntg - 1, 1)
        later = (n.bytes_copied - n.first_step_bytes) / steps
        lines.append(f"npl {npl} device table: first step {fmt_bytes(n.first_step_bytes)}, then "
                     f"{fmt_bytes(later)} a step; {r.counts.bytes_copied / max(dense.counts.bytes_copied, 1):.3f}x "
                     f"the dense gather's bytes; copy {_against(r.times.copy_s, r.times.predicted_copy_s)} its "
                     "link's prediction, "
                     f"{_against(r.times.copy_s, r.times.predicted_copy_s + r.times.sync_host_s)} with its syncs' "
                     f"own host time ({fmt_seconds(r.per_step(r.times.sync_host_s))} a step, timed as a sync "
                     "sending nothing)")
        ahead = serial.get((npl, DEVICE_TABLE_PREFETCH))
        if ahead is not None:  # its sends made under the group before's compute: what is left exposed
            waited = _against(ahead.times.copy_s, ahead.times.predicted_copy_s)
            lines.append(f"npl {npl} device table+prefetch: {ahead.counts.bytes_copied / max(n.bytes_copied, 1):.3f}x "
                         f"the device table's bytes; waited {waited} its sends' prediction")
    return "\n".join(lines + _tail(res, rep))


def format_wide(res: BenchResult, rep: BenchReport) -> str:
    """The report with every figure: per npl and variant its tokens/s, gain over flat with its interval's
    ends, each replica's gain, decode, host, end-to-end, copy and compute time, bytes copied and read
    over a repetition, copy bandwidth and the split's memory; the unified cache's beside it. model is the
    copies' time by the split's copy cost model (CopyCostModel.of_backend), beside the measured copy."""
    cfg = res.config
    head = ["npl", "policy", "tok/s", "gain", "replicas' gains", "decode", "host", "e2e tok/s", "copy", "model",
            "compute", "copied", "read", "copy bw", "split mem"]
    if cfg.runs_unified:
        head += ["unified tok/s", "copy", "copied", "over unified"]
    body = []
    for f in rep.rows:
        r, k, t, n = f.row, f.row.key, f.row.times, f.row.counts
        if not f.is_serial_cells or k.unified:
            continue
        cells = [str(k.npl), k.label, fmt_tps_digits(r.tokens_per_s),
                 "-" if k.policy == "flat" else fmt_interval(f.gain, exact=True),
                 ",".join(f"{g * 100:+.1f}" for g in f.replica_gains) or "-",
                 fmt_seconds(t.decode_s), fmt_seconds(t.host_s), fmt_tps_digits(r.tokens_per_s_end_to_end),
                 fmt_seconds(t.copy_s), fmt_seconds(t.predicted_copy_s), fmt_seconds(t.compute_s),
                 fmt_mib(n.bytes_copied), fmt_mib(n.bytes_read), f"{r.copy_bandwidth / 1e9:.2f} GB/s",
                 fmt_mib(n.split_memory)]
        if f.unified is not None:
            u = f.unified
            cells += [fmt_tps_digits(u.tokens_per_s), fmt_seconds(u.times.copy_s), fmt_mib(u.counts.bytes_copied),
                      fmt_interval(f.over_unified, exact=True)]
        body.append(cells)
    lines = _head(res) + ["times over a repetition (ntg steps): floors, the median over replicas"]
    return "\n".join(lines + format_table([head, *body], left=(1, 4)) + _tail(res, rep, wide=True))


def format_devices(res: BenchResult) -> List[str]:
    """The lines of the per-device table (with --devices, a placement or a modelled link): per npl,
    variant and device, the layers it runs and holds, the bytes its splits received over a
    repetition (of them, KV windows'), their copy time, and the memory it held."""
    cfg = res.config
    dc = cfg.devices
    lines = [f"devices: {dc.n_devices}; KV placement {dc.describe(cfg.kv.n_layer)} "
             f"({', '.join('h' if p is None else str(p) for p in dc.places(cfg.kv.n_layer))}: per layer, h host memory "
             "or the device holding it)",
             "per device: layers run and resident, bytes its splits received over a repetition's steps (of them KV "
             "windows), their copy time, memory held (the scheduler's buffer at its most plus resident KV)"]
    if cfg.unified and not cfg.runs_unified and not cfg.paged_cache.paged:
        lines.append("unified cache: not run (one device with every layer on the host only)")
    head = ["npl", "policy", "device", "runs", "holds KV of", "copied", "KV copied", "copy", "memory", "link"]
    body = []
    for r in res.rows:
        if r.key.unified:
            continue
        for d in r.devices:
            body.append([str(r.key.npl), r.key.label, f"{d.index}: {d.name}", fmt_layers(d.layers),
                         fmt_layers(d.resident_layers), fmt_mib(d.bytes_copied), fmt_mib(d.kv_bytes_copied),
                         fmt_seconds(d.copy_s), fmt_mib(d.memory_bytes),
                         "-" if d.link_gbps is None else fmt_link(d.link_gbps)])
    return lines + format_table([head, *body], left=(1, 2))


def format_overlap(res: BenchResult, rep: BenchReport, wide: bool = False) -> List[str]:
    """The lines of the overlap table (--overlap): per npl, layout, variant, prefetch depth and scope, the serial
    run's decode time, the overlapped run's decode time, over the bound max(copy, compute) and over the
    pipeline's floor (BenchResult.floor), the exposed share of what prefetching could hide and the
    overlapped run's compute over the serial run's: within WIDTH columns. With wide, also the serial run's
    copy and compute times, the overlapped run over the serial run, and what prefetching held on the split
    ahead of the layer computing, each row named by its run's label."""
    cfg = res.config
    depths = ", ".join(map(str, cfg.variants.prefetch))
    scopes: Dict[Tuple[bool, ...], str] = {(True,): "across steps (each step's first layer copied under the step "
                                                    "before)", (False,): "within each step (-within)"}
    scope = scopes.get(tuple(cfg.variants.prefetch_next), "across steps, and within each step (-within)")
    prose = [f"overlap: each variant also ran prefetching {depths} layer(s) ahead on the split's copy queue, {scope}, "
             "taking turns with the serial run;",
             "bound = max(copy, compute) of the serial run; floor = the bound plus what no layer hides (the first "
             "layer's copy and the last's compute: of every step within steps, of a repetition's first across them);",
             "exposed = (overlapped - bound) / min(copy, compute): 0 hides all; compute x = the overlapped run's "
             "compute over the serial run's (the copies beside it slowing it)"
             + ("" if wide else "; --wide adds the serial run's copy and compute, / serial and what was held ahead")]
    lines = [w for line in prose for w in _prose(line, wide)]
    if wide:
        head = ["npl", "cache", "policy", "serial", "copy", "compute", "overlapped", "/ bound", "/ floor", "/ serial",
                "exposed", "compute x", "ahead"]
    else:  # the policy without "+overlap", the depth and scope beside it: the rows fit WIDTH
        head = ["npl", "cache", "policy", "prefetch", "serial", "overlapped", "/ bound", "/ floor", "exposed",
                "compute x"]
    body = []
    for f in rep.rows:
        if f.overlap is None:
            continue
        o, k, s, figures = f.row.times, f.row.key, f.overlap.serial, f.overlap
        bound, floor = figures.bound_s, figures.floor_s
        over_bound = f"{o.decode_s / bound:.2f}x" if bound > 0 else "-"
        over_floor = f"{o.decode_s / floor:.2f}x" if floor else "-"
        compute_x = f"{o.compute_s / s.compute_s:.2f}x" if s.compute_s > 0 else "-"
        cache = "unified" if k.unified else "split"
        if wide:
            body.append([str(k.npl), cache, k.label, fmt_seconds(s.decode_s), fmt_seconds(s.copy_s),
                         fmt_seconds(s.compute_s), fmt_seconds(o.decode_s), over_bound, over_floor,
                         f"{o.decode_s / s.decode_s:.2f}x", f"{figures.exposed_share:.0%}", compute_x,
                         fmt_mib(f.row.counts.ahead_bytes)])
        else:
            prefetch = f"{k.prefetch} {'across' if k.prefetch_next else 'within'}"
            body.append([str(k.npl), cache, run_name(k.policy, k.compact), prefetch, fmt_seconds(s.decode_s),
                         fmt_seconds(o.decode_s), over_bound, over_floor, f"{figures.exposed_share:.0%}", compute_x])
    return lines + format_table([head, *body], left=(1, 2, 3) if not wide else (1, 2))


def format_draft(res: BenchResult, rep: BenchReport, wide: bool = False) -> List[str]:
    """The lines of the draft table (--draft N; --chunk N's alike): per npl and variant, the draft (chunk) row
    beside its single-token row: tokens/s counted on accepted tokens and over the single row's, the tokens
    accepted per step and sequence, the K and V windows' bytes copied per step and per token (per accepted
    token) from the scheduler's counters and over the single row's, and the draft's own windows' bytes over
    a repetition."""
    q = res.config.sequences
    if q.draft:
        prose = [f"draft: each verification checks {q.draft} draft tokens drawn on the split device, each accepted "
                 f"with chance {q.accept:g} (its predecessors accepted), in one step of {q.draft + 1} tokens over "
                 "the host windows; the rejected cells rolled back (Scheduler.truncate). tok/s and bytes/token "
                 "count accepted tokens; draft KV = the draft's windows' bytes copied (its KV on the device: 0); "
                 f"predicted: the cost model's tok/s of the same run (predict_step, tokens_per_step {q.draft + 1}: "
                 "the single row's compute a layer, each further token adding the split's measured token share of "
                 "it; the draft steps beside; each run paying the single row's fixed cost of a run) over the "
                 "tokens its seeded draws kept (tok/step); expected: the same step over the expected accepted "
                 f"tokens, {expected_accepted_tokens(q.draft, q.accept):.2f} a step"]
    else:
        prose = [f"chunk: prefill in steps of {q.chunk} tokens a sequence over the host windows, each window "
                 "copied once a step for all of them; tok/s and bytes/token count every token; predicted: the cost "
                 f"model's tok/s (predict_step, tokens_per_step {q.chunk}: the single row's compute a layer, each "
                 "further token adding the split's measured token share of it, and its fixed cost of a run)"]
    lines = [w for line in prose for w in _prose(line, wide)]
    head = ["npl", "policy", "tok/s", "single", "x", "predicted", "x", "tok/step", "expected", "copied/step",
            "per token", "single", "x", "draft KV"]
    body = []
    for f in rep.rows:
        s = f.single
        if s is None:
            continue
        r, k, p = f.row, f.row.key, f.predicted
        body.append([str(k.npl), run_name(k.policy, k.compact, k.prefetch, k.prefetch_next),
                     fmt_tps_digits(r.tokens_per_s), fmt_tps_digits(s.tokens_per_s), f"{f.speedup_over_single:.2f}",
                     "-" if p is None else fmt_tps_digits(p.tokens_per_s),
                     "-" if p is None or not p.tokens_per_s else f"{r.tokens_per_s / p.tokens_per_s:.2f}",
                     f"{r.tokens / r.ntg / k.npl:.2f}", "-" if p is None else fmt_tps_digits(p.expected_tokens_per_s),
                     fmt_bytes(r.per_step(r.counts.bytes_copied)),
                     fmt_bytes(r.bytes_per_token), fmt_bytes(s.bytes_per_token),
                     "-" if f.bytes_over_single is None else f"{f.bytes_over_single:.2f}",
                     fmt_bytes(r.counts.draft_bytes_copied)])
    return lines + format_table([head, *body], left=(1,))


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

    cfg, rep = res.config, res.finished()
    tps = {(k.npl, k.policy, k.unified, k.compact): f.row.tokens_per_s
           for f in rep.rows for k in (f.row.key,) if f.is_serial_cells}
    series = [(p, c, False) for p, c in rep.variants] + (
        [(p, c, True) for p, c in rep.variants] if cfg.runs_unified else [])
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for i, (policy, compact, unified) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(cfg.sequences.npl))]
        ys = [tps[npl, policy, unified, compact] for npl in cfg.sequences.npl]
        name = run_name(policy, compact) + (" (unified)" if unified else "")
        ax.bar(xs, ys, width, label=name, hatch="//" if unified else None)
    ax.set_xticks(range(len(cfg.sequences.npl)))
    ax.set_xticklabels([str(n) for n in cfg.sequences.npl])
    ax.set_xlabel("sequences (npl)")
    ax.set_ylabel("generated tokens / s")
    q = cfg.sequences
    ax.set_title(f"ferry bench on {res.split_name}: -c {q.n_ctx} -npp {q.npp} -ntg {q.ntg}, "
                 f"{cfg.kv.n_layer} layers, {cfg.kv.type_kv}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


# ------------------------------------------------------------ the command


VERB = Verb("bench", "decode steps over a host KV cache: tokens/s, copy time and bytes per copy policy "
            "(llama-batched-bench's generation phase)",
            "Decode steps over a KV cache in host memory, one stream per sequence: each layer's K and V windows "
            "copied to the split's device under each copy policy, beside a unified cache. Prints tokens/s, the "
            "gain over flat with its interval, and the bytes copied and read per step.",
            "ferry bench -c 16384 -npl 2,4,8 -npp 1024 --type q8_0 --head-dim 128 --kv-heads 8 --policy flat,ranges")


def add_parser(sub: "argparse._SubParsersAction[Any]") -> argparse.ArgumentParser:
    """Add the `bench` verb to the `ferry` command's subparsers sub; returns the verb's parser. Its cache
    is the cells cache (`ferry paged-bench` runs the paged one through this verb's job)."""
    p = add_verb_parser(sub, VERB)
    p.set_defaults(paged=False, block_size=PagedOptions.block_size, adjacency=PagedOptions.adjacency,
                   shared_prefix=PagedOptions.shared_prefix, device_blocks=PagedOptions.device_blocks,
                   pool_prefetch=PagedOptions.pool_prefetch)
    return p


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The BenchConfig the parsed options args describe (not yet checked)."""
    policies = tuple(args.policy) if "policy" in getattr(args, "given", ()) or not args.paged else ("ragged",)
    return BenchConfig(
        sequences=Sequences(n_ctx=args.c, npl=tuple(args.npl), npp=args.npp, ntg=args.ntg, pad=args.pad,
                            lengths=args.lengths, draft=args.draft, accept=args.accept,
                            chunk=args.chunk),
        kv=KVGeometry(n_layer=args.layers, type_kv=args.type, n_head=args.heads, head_dim=args.head_dim,
                      n_head_kv=args.kv_heads, v_trans=args.v_trans),
        variants=VariantOptions(policies=policies, compact=args.compact, reuse=args.reuse, overlap=args.overlap,
                                prefetch=tuple(args.prefetch), prefetch_next=PREFETCH_NEXT[args.prefetch_next]),
        unified=args.unified,
        sampling=Sampling(repeat=REPLICAS if args.repeat is None else args.repeat, rounds=args.rounds,
                          trace=args.trace is not None),
        paged_cache=PagedOptions(paged=args.paged, block_size=args.block_size, adjacency=args.adjacency,
                                 shared_prefix=args.shared_prefix, device_blocks=args.device_blocks,
                                 pool_prefetch=args.pool_prefetch),
        device=args.device, devices=devices_from_args(args))


@dataclass(frozen=True)
class Job:
    """What `ferry bench` runs and prints: the run's BenchConfig, and the table, the wide table or
    JSON, and a chart or none."""

    config: BenchConfig
    json: bool
    wide: bool
    plot: Optional[str]
    trace: Optional[str] = None
    remote: Optional[str] = None  # --remote: "" a server on the loopback, or the peer's HOST:PORT


def job(args: argparse.Namespace) -> Job:
    """The Job the parsed options args describe, --model read and the config checked.

    Raises
    ------
    InvalidArgumentError
        For options that cannot run, or a --model file that cannot be read.
    UnsupportedError
        For --plot without matplotlib.
    """
    g = apply_model(args, run_fields())
    check_one_head_dim(g, args)
    cfg = config_from_args(args)
    cfg.check()
    for flag, path in (("--plot", args.plot), ("--trace", args.trace)):
        check_output_path(flag, path)
    if args.plot is not None and args.trace is not None and os.path.realpath(args.plot) == os.path.realpath(args.trace):
        raise InvalidArgumentError(f"--plot and --trace name one file, {args.trace}: name two")
    if args.plot is not None:
        check_plot_available()
    return Job(cfg, args.json, args.wide, args.plot, args.trace, remote_hook.check(args))


def run(j: Job) -> int:
    """Run the job: the table (or JSON) on stdout, the bar and warnings on stderr, the chart and the trace
    to their files (each written whole, then put in place: options.write_output). Returns the exit
    status 0; a FerryError when a run fails."""
    res = run_bench(j.config, progress_stream())
    q = j.config.sequences
    remote = (remote_hook.run(q.n_ctx, q.npl, q.npp, q.ntg, q.pad, q.lengths, j.config.kv, j.config.variants.policies,
                              0, j.remote, j.config.paged_cache) if j.remote is not None else None)
    if j.json:
        print(f"ferry bench: split backend {res.split_name}, KV cache in {res.cache_memory}", file=sys.stderr)
        print(json.dumps(res.as_dicts() + ([remote_hook.as_json(remote)] if remote else []), indent=2))
    else:
        print(format_result(res, j.wide) + (f"\n\n{remote_hook.text(remote)}" if remote else ""))
    for warning in res.warnings():
        print(f"ferry bench: warning: {warning}", file=sys.stderr)
    if j.plot is not None:
        write_output("--plot", j.plot, lambda name: plot_result(res, name))
        print(f"ferry bench: wrote {j.plot}", file=sys.stderr)
    if j.trace is not None:

        def write_trace(name: str) -> None:
            with open(name, "w", encoding="utf-8") as f:
                json.dump(chrome_trace(res.traces), f)

        write_output("--trace", j.trace, write_trace)
        print(f"ferry bench: wrote {j.trace} (open it in https://ui.perfetto.dev or chrome://tracing)", file=sys.stderr)
    return 0


def main(args: argparse.Namespace) -> int:
    """`ferry bench` with the parsed options args: run(job(args)). InvalidArgumentError for options that
    cannot run (a usage error), another FerryError when a run fails."""
    return run(job(args))
