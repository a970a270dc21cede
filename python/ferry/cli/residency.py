"""What `ferry residency-plan` and `ferry residency-bench` share: which layers' KV to keep on the
devices, by each strategy, predicted (the plan) and measured beside the prediction (the bench)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from ..copy_cost import CopyCostModel
from ..errors import InvalidArgumentError
from ..residency import LayerCost, ResidencyPlan
from ..residency.prediction import PlanDoesNotFitError
from ..workloads.common import n_kv_for, prefetch_depths
from ..workloads.devices import naming_device_memory
from ..workloads.model_file import ModelGeometry
from ..workloads.residency_bench import ResidencyResult, run_residency
from ..workloads.residency_plan import MEASURE, ResidencyModel, run_windows
from .options import devices_from_args, layer_windows
from .text_table import fmt_layers, fmt_link, fmt_mib, fmt_seconds, fmt_tps_digits, format_table

__all__ = ["BenchJob", "PlanJob", "bench_job", "format_bench", "format_plans", "model_from_args", "plan_job",
           "run_bench", "run_plan"]

#: Repetitions of each placement `ferry residency-bench` measures without --repeat.
REPEAT = 5


def model_from_args(args: argparse.Namespace, g: Optional[ModelGeometry]) -> ResidencyModel:
    """The ResidencyModel the parsed options describe (its n_stream, n_kv and prefetch set per run).

    Raises
    ------
    InvalidArgumentError
        For --swa-layers whose length is not --layers (when both are given).
    """
    windows = layer_windows(args, g)
    if windows is None:
        windows = [None] * args.layers
    elif getattr(args, "swa_layers", None) is not None and "layers" in getattr(args, "given", set()) and \
            len(windows) != args.layers:
        raise InvalidArgumentError(f"--swa-layers names {len(windows)} layers, --layers {args.layers}")
    return ResidencyModel.of(type_kv=args.type, head_dim=args.head_dim, n_head_kv=args.kv_heads, n_head=args.heads,
                             n_ctx=args.c, layer_windows=tuple(windows), v_trans=bool(getattr(args, "v_trans", False)),
                             compact=bool(getattr(args, "compact", False)), n_devices=args.devices,
                             link_gbps=args.link_gbps or (), latency_us=args.latency_us or (),
                             link_profile=getattr(args, "link_profile", None),
                             memory=args.device_memory or (), reserve=args.reserve or (),
                             compute_slowdown=args.compute_slowdown or (), compute_us=args.compute_us,
                             layer_devices=args.layer_devices, max_layers=args.kv_device_layers,
                             draft=args.draft, accept=args.accept, remote_link=args.remote_link,
                             host_memory=args.host_memory)


def _describe_model(m: ResidencyModel) -> str:
    g = m.kv
    sliding = [w for w in m.windows.layer_windows if w is not None]
    kinds = f"{m.n_layer} layers"
    if sliding:
        ws = ", ".join(f"{w:,}" for w in sorted(set(sliding)))
        kinds += f" ({len(sliding)} sliding, window {ws}; {m.n_layer - len(sliding)} full)"
    return (f"{kinds}, K/V {g.type_kv}, {g.n_head} heads x {g.head_dim}, {g.n_head_kv} KV heads"
            + (", V transposed" if g.v_trans else ""))


def describe_remote(m: ResidencyModel, link: Optional[CopyCostModel]) -> List[str]:
    """The line saying the remote tier's link and the host memory (none without a remote tier)."""
    if link is None:
        return []
    how = "measured on the loopback" if m.planner.remote_link == MEASURE else "given"
    host = "this host's, " if m.planner.host_memory is None else ""
    return [f"  remote tier ({how}): {link.call_us:.1f} µs a batch, {link.piece_ns / 1e3:.1f} µs a piece, "
            f"{fmt_link(link.gbps)}; host memory {host}{fmt_mib(m.host_memory())}"]


def _describe_devices(m: ResidencyModel, links: Sequence[float]) -> List[str]:
    specs = m.device_specs([0.0] * m.n_layer, links, token_share=1.0)  # described, not predicted: not measured
    slowdown = m.devices.compute_slowdown
    out = []
    for d, s in enumerate(specs):
        slow = slowdown[0 if len(slowdown) == 1 else d] if slowdown else 1.0
        memory = "unlimited" if s.memory is None else fmt_mib(s.memory)
        named = f"{m.devices.link_profile} at " if m.devices.link_profile else ""  # its small pieces slower too
        out.append(f"  device {d}: link {named}{fmt_link(s.link_gbps)}, latency {s.latency_us:g} µs, memory {memory}, "
                   f"reserve {fmt_mib(s.reserve)}, compute x{slow:g}")
    return out


def _memory(p: ResidencyPlan, d: int) -> str:
    budget = p.budgets[d]
    return fmt_mib(p.memory[d]) + ("" if budget is None else f" / {fmt_mib(budget)}")


def format_plans(plans: Sequence[ResidencyPlan], npl: int, accepted: float = 1.0) -> List[str]:
    """The lines of one table of plans (one prefetch depth): per strategy its step time, tokens/s
    (npl sequences keeping `accepted` tokens a step), step over the planner's, and per device its
    resident layers and memory (of its budget), with a line saying what the memory counts."""
    auto = next((p for p in plans if p.strategy == "auto"), None)
    n_dev = len(plans[0].budgets)
    head = ["strategy", "step", "tok/s", "/ auto"]
    tiered = plans[0].host_memory is not None  # a remote tier behind the host
    for d in range(n_dev):
        head += [f"dev {d} resident", f"dev {d} memory"]
    if tiered:
        head += ["host", "host memory", "remote", "pull"]
    body = []
    for p in plans:
        row = [p.strategy, fmt_seconds(p.step_seconds), fmt_tps_digits(p.tokens_per_second(npl, accepted)),
               f"{p.step_seconds / auto.step_seconds:.2f}x" if auto and auto.step_seconds > 0 else "-"]
        for d in range(n_dev):
            row += [fmt_layers(p.resident_layers(d)), _memory(p, d)]
        if tiered:
            pred = p.prediction
            row += [fmt_layers(p.host_layers()), f"{fmt_mib(pred.host_bytes)} / {fmt_mib(p.host_memory or 0)}",
                    fmt_layers(p.remote_layers()),
                    f"{fmt_seconds(pred.pull_seconds)}, {pred.remote_pieces} pieces" if pred.remote_pieces else "-"]
        body.append(row)
    left = (0,) + tuple(4 + 2 * d for d in range(n_dev)) + ((4 + 2 * n_dev, 6 + 2 * n_dev) if tiered else ())
    lines = format_table([head, *body], left=left)
    held = ("what a run of the plan holds on the device, measured by a dry run of its step (resident K/V, the "
            "scheduler's buffer, queries, lengths)" if plans[0].prediction.measured else
            "the model's least (resident K/V, window copies and outputs, queries)")
    lines.append(f"memory: {held}, plus the reserve; / the device's memory")
    if tiered:
        lines.append("host memory: the local layers' K/V and the staging of the pulls in flight; / --host-memory. "
                     "pull: the remote layers' batches (remote -> host), the scheduler's, each layer's before its "
                     "copies host -> device (prefetched as they are)")
    if auto is not None:
        lines.append("auto: " + ("the model's optimum" if auto.exact else
                                 f"the search stopped at its limit: within {auto.bound:g}x of the optimum "
                                 "(docs/design.md)" if not math.isinf(auto.bound) else
                                 "the optimum with the pulls priced whole; prefetching hides part of them, "
                                 "so the prediction is at most that" if auto.prefetch and auto.remote_layers() else
                                 "the search stopped at its limit"))
    return lines


def copied_per_token(plan: ResidencyPlan, layers: Sequence[LayerCost], npl: int, accepted: float) -> float:
    """Bytes the plan's step copies (its host layers' windows) per token kept: over npl sequences
    keeping `accepted` tokens each."""
    copied = sum(layer.window_bytes for layer, r in zip(layers, plan.resident) if not r)
    return copied / (npl * accepted)


def format_draft_changes(one: Sequence[ResidencyPlan], drafted: Sequence[ResidencyPlan],
                         one_layers: Sequence[LayerCost], draft_layers: Sequence[LayerCost], npl: int,
                         accepted: float) -> List[str]:
    """The lines saying, per strategy, how its plan for a draft's verification differs from its plan for
    one token a step: the layers it keeps, the step, tokens/s (tokens kept) and the bytes copied per
    token kept, each the draft's over one token's."""
    head = ["strategy", "layers kept", "step", "tok/s", "copied per token"]
    body = []
    for a, b in zip(one, drafted):
        same = a.resident == b.resident
        kept = "the same" if same else "; ".join(f"{d}: {fmt_layers(a.resident_layers(d))} -> "
                                               f"{fmt_layers(b.resident_layers(d))}" for d in range(len(a.budgets))
                                               if a.resident_layers(d) != b.resident_layers(d))
        bytes_a = copied_per_token(a, one_layers, npl, 1.0)
        bytes_b = copied_per_token(b, draft_layers, npl, accepted)
        copied = (f"{bytes_b / bytes_a:.2f}x ({bytes_a / 1024:,.1f} -> {bytes_b / 1024:,.1f} KiB)" if bytes_a > 0
                  else "nothing copied" if bytes_b == 0 else f"0 -> {bytes_b / 1024:,.1f} KiB")
        body.append([a.strategy, kept, _ratio(b.step_seconds, a.step_seconds),
                     _ratio(b.tokens_per_second(npl, accepted), a.tokens_per_second(npl)), copied])
    return format_table([head, *body], left=(0, 1))


def _ratio(x: float, y: float) -> str:
    return f"{x / y:.2f}x" if y > 0 and math.isfinite(x) and math.isfinite(y) else "-"


@dataclass(frozen=True)
class PlanJob:
    """What `ferry residency-plan` runs and prints."""

    model: ResidencyModel
    strategies: Tuple[str, ...]
    npl: Tuple[int, ...]
    npp: int
    ntg: int
    pad: int
    depths: Tuple[int, ...]
    json: bool


def _checked_model(args: argparse.Namespace, g: Optional[ModelGeometry]) -> ResidencyModel:
    """The model the parsed options describe, its devices checked as a run's are (DeviceConfig.check:
    one value per device or one for all, layer maps, a device with nothing to run)."""
    model = model_from_args(args, g)
    devices_from_args(args).check(model.n_layer, "cpu")
    model.check()
    for npl in args.npl:
        if args.c % npl:
            raise InvalidArgumentError(f"-npl {npl}: -c {args.c} is not a multiple of it")
        if args.draft and args.npp + args.ntg + args.draft > args.c // npl:
            raise InvalidArgumentError(f"-npl {npl}: a stream holds {args.c // npl} cells, fewer than -npp + -ntg + "
                                       f"--draft = {args.npp + args.ntg + args.draft}: lower --draft or raise -c")
    return model


def plan_job(args: argparse.Namespace, g: Optional[ModelGeometry]) -> PlanJob:
    """The PlanJob the parsed options args describe (g: --model's geometry, or None).

    Raises
    ------
    InvalidArgumentError
        For options the planner refuses.
    """
    return PlanJob(_checked_model(args, g), tuple(args.strategy), tuple(args.npl), args.npp, args.ntg, args.pad,
                   prefetch_depths(args.overlap, args.prefetch), args.json)


@contextlib.contextmanager
def naming_budget() -> Iterator[None]:
    """Within it, a plan that cannot fit a device's memory names the options that set the budget
    before the planner's message (which device, what it needs, by how much it is short).

    Raises
    ------
    PlanDoesNotFitError
        Its message led by the option: --device-memory and --reserve, or the host's memory for a
        remote tier's staging (a message that starts "host memory").
    """
    try:
        yield
    except PlanDoesNotFitError as e:
        option = "--host-memory" if e.message.startswith("host memory") else "--device-memory (less --reserve)"
        raise PlanDoesNotFitError(f"{option} too small: {e.message}") from None


def run_plan(j: PlanJob) -> int:
    """`ferry residency-plan`: per -npl and prefetch depth, each strategy's plan, as text or JSON.

    Raises
    ------
    PlanDoesNotFitError
        When a plan cannot fit.
    """
    model = j.model
    links = model.links()
    remote_link = model.remote_link()
    tier = model.remote_spec(remote_link)
    out: List[Dict[str, object]] = []
    text: List[str] = []
    draft = model.planner.draft
    for npl in j.npl:
        kv_size = model.windows.n_ctx // npl
        n_kv = n_kv_for(j.npp, j.ntg + draft, j.pad, kv_size)
        m = model.at(n_stream=npl, n_kv=n_kv, step_windows=run_windows(j.npp, j.ntg, j.pad, kv_size, model.n_tok))
        m.check()
        compute = m.compute_seconds()
        devices = m.device_specs(compute, links)
        layers = m.layers()
        how = "given (--compute-us)" if m.planner.compute_us is not None else "measured on the stand-in"
        per = ", ".join(fmt_seconds(c) for c in sorted(set(compute)))
        text += [f"residency: {_describe_model(m)}; -c {m.windows.n_ctx}, -npl {npl} (one stream each), n_kv {n_kv:,}",
                 f"  attention per layer on the host: {per} ({how}); a device's compute slowdown multiplies it",
                 *_describe_devices(m, links), *describe_remote(m, remote_link)]
        if m.planner.max_layers is not None:
            text.append(f"  at most {m.planner.max_layers} layers resident (--kv-device-layers)")
        if draft:
            text.append(f"  a draft of {draft} verified a step: {m.n_tok} query tokens per stream, one copy of each "
                        f"window; {m.accepted_per_step:.2f} tokens kept a step, expected (--accept "
                        f"{m.planner.accept:g}); attention {m.n_tok}x a token's")
            one_n_kv = n_kv_for(j.npp, j.ntg, j.pad, kv_size)
            one = m.at(draft=0, n_kv=one_n_kv, step_windows=run_windows(j.npp, j.ntg, j.pad, kv_size))
            one_layers = one.layers()
        for depth in j.depths:
            how = "serial (prefetch 0)" if depth == 0 else f"prefetching {depth} layer(s) ahead"
            plans = m.at(prefetch=depth).plans(j.strategies, devices, layers, tier)
            if draft:
                singles = one.at(prefetch=depth).plans(j.strategies, devices, one_layers, tier)
                out += [{**p.as_dict(npl), "n_kv": one_n_kv, "n_ctx": m.windows.n_ctx, "draft": 0} for p in singles]
                out += [{**p.as_dict(npl, m.accepted_per_step), "n_kv": n_kv, "n_ctx": m.windows.n_ctx,
                         "draft": draft} for p in plans]
                text += ["", f"{how}, one token a step:", *format_plans(singles, npl),
                         "", f"{how}, a draft of {draft} verified a step (tok/s: tokens kept):",
                         *format_plans(plans, npl, m.accepted_per_step),
                         "", f"{how}, the draft's plan over one token's:",
                         *format_draft_changes(singles, plans, one_layers, layers, npl, m.accepted_per_step)]
            else:
                out += [{**p.as_dict(npl), "n_kv": n_kv, "n_ctx": m.windows.n_ctx} for p in plans]
                text += ["", f"{how}:", *format_plans(plans, npl)]
        text.append("")
    print(json.dumps(out, indent=2) if j.json else "\n".join(text).rstrip())
    return 0


def _spread(r: Tuple[float, float, float]) -> str:
    return f"{fmt_seconds(r[0])} ({fmt_seconds(r[1])}..{fmt_seconds(r[2])})"


def format_bench(res: ResidencyResult, model: ResidencyModel, npl: Sequence[int], repeat: int) -> str:
    """`ferry residency-bench`'s report: per -npl and prefetch depth, each strategy's placement,
    its predicted and measured step time and their ratio."""
    lines = [f"residency: {_describe_model(model)}; -c {model.windows.n_ctx}; stand-in devices, copy policy ranges, "
             "split cache (one stream per sequence)",
             *_describe_devices(model, res.links), *describe_remote(model, res.remote_link),
             f"measured: a step's time, the median of {repeat} repetitions (least..greatest), each the mean of "
             "its steps; fastest: the mean over the steps of each step's fastest repetition; the placements take "
             "turns",
             "predicted: the model's step (ferry.residency.predict_step), the mean over the steps; its compute "
             "figure measured on the stand-in and scaled by an every-layer-resident run taking turns with these"]
    if model.planner.draft:
        lines.append(f"each step verifies a draft of {model.planner.draft}: {model.n_tok} query tokens per stream, one "
                     f"copy of each window; tok/s count {model.accepted_per_step:.2f} tokens kept a step, expected "
                     f"(--accept {model.planner.accept:g})")
    for n in npl:
        rows = [r for r in res.rows if r.npl == n]
        per = ", ".join(fmt_seconds(c) for c in sorted(set(res.compute_s[n])))
        lines += ["", f"-npl {n}: attention per layer (as the plans take it) {per}"]
        head = ["strategy", "prefetch", "resident", "predicted", "measured", "fastest", "measured / predicted",
                "tok/s"]
        body = []
        for r in rows:
            resident = "; ".join(f"{d}: {fmt_layers(r.plan.resident_layers(d))}" for d in range(len(r.plan.budgets)))
            if r.plan.remote_layers():
                resident += f"; remote: {fmt_layers(r.plan.remote_layers())}"
            body.append([r.strategy, str(r.plan.prefetch), resident, fmt_seconds(r.run.predicted_step_s),
                         _spread(r.run.spread), fmt_seconds(r.run.fastest_step_s), f"{r.run.ratio:.2f}x",
                         fmt_tps_digits(n * r.accepted / r.run.measured_step_s)])
        lines += format_table([head, *body], left=(0, 2))
        hosted = [f"{r.strategy} (prefetch {r.plan.prefetch}) {r.run.remote_host_us:.0f} µs" for r in rows
                  if r.run.remote_host_us is not None]
        if hosted:
            lines.append("the tier's own time a window pulled (planning, placing: the median over each run's "
                         "pulls), in its prediction: " + ", ".join(hosted))
        same = "identical" if res.outputs_identical(n) else "DIFFERENT"
        lines.append(f"attention outputs {same} across the placements")
    return "\n".join(lines)


@dataclass(frozen=True)
class BenchJob:
    """What `ferry residency-bench` runs and prints."""

    model: ResidencyModel
    strategies: Tuple[str, ...]
    npl: Tuple[int, ...]
    npp: int
    ntg: int
    pad: int
    repeat: int
    depths: Tuple[int, ...]
    json: bool


def bench_job(args: argparse.Namespace, g: Optional[ModelGeometry]) -> BenchJob:
    """The BenchJob the parsed options args describe (g: --model's geometry, or None).

    Raises
    ------
    InvalidArgumentError
        For options that cannot run. (It runs on stand-in devices, whose links and memory the model
        takes: the verb has no --device.)
    """
    model = _checked_model(args, g)
    if model.planner.remote_link is not None:
        from ..remote import engine_missing  # the engine is an extra
        why = engine_missing()
        if why is not None:
            raise InvalidArgumentError(f"--remote-link: residency-bench pulls the remote layers through the transfer "
                                       f"engine, which is missing ({why}); install it, or leave out --remote-link")
    for npl in args.npl:
        if args.npp + args.ntg > args.c // npl:  # with a --draft, _checked_model refused it
            raise InvalidArgumentError(f"-npl {npl}: a stream holds {args.c // npl} cells, fewer than -npp + -ntg = "
                                       f"{args.npp + args.ntg}")
    return BenchJob(model, tuple(args.strategy), tuple(args.npl), args.npp, args.ntg, args.pad,
                    REPEAT if args.repeat is None else args.repeat, prefetch_depths(args.overlap, args.prefetch),
                    args.json)


def run_bench(j: BenchJob) -> int:
    """`ferry residency-bench`: plan each strategy's placement and run it beside the prediction.

    Raises
    ------
    PlanDoesNotFitError
        When a plan cannot fit.
    """
    with naming_device_memory(j.model.devices):
        res = run_residency(j.model, j.strategies, j.npl, j.npp, j.ntg, j.pad, j.repeat, j.depths)
    if j.json:
        print(f"ferry residency-bench: links {', '.join(fmt_link(x) for x in res.links)}", file=sys.stderr)
        print(json.dumps(res.as_dicts(), indent=2))
    else:
        print(format_bench(res, j.model, j.npl, j.repeat))
    return 0
