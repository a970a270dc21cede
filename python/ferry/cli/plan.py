"""`ferry plan`: the copy plan of a KV-cache window, what it moves, what it costs, and why.

One plan per number of sequences (-npl 1: a unified cache). --model reads -c (the model's
context length), --head-dim (K's, or V's with --which v) and --kv-heads from a GGUF file, and
which layers slide and their window: with sliding layers, one plan per layer kind, each over a
cache of that kind's size, with the bytes of all its layers. (A paged cache's window:
`ferry paged-plan`; where each layer's KV should live: `ferry residency-plan`.)"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..errors import FerryError
from ..workloads.plan import WindowPlan, window_plan
from .options import apply_model, layer_windows
from .reference import Verb, add_verb_parser
from .text_table import format_table

#: Every failure of this verb comes from its arguments: reported as a usage error (exit 2).
ARGUMENT_ERRORS = FerryError

#: Copies listed in the text output before "... N more".
SHOWN_COPIES = 16


VERB = Verb("plan", "the copy plan of a KV-cache window: copies, bytes moved, cost, and why",
            " ".join((__doc__ or "").split("\n\n", 1)[-1].split()),
            "ferry plan -c 32768 -npl 1 -npp 2048 -ntg 128 --v-trans --which v")


def add_parser(sub: "argparse._SubParsersAction[Any]") -> argparse.ArgumentParser:
    """Add the `plan` verb to the `ferry` command's subparsers sub; returns the verb's parser."""
    return add_verb_parser(sub, VERB)


def format_plan(p: WindowPlan) -> str:
    """The WindowPlan p as text: the window, the span against what is read, the copies, the costs, the why."""
    w, span, plan = p.window, p.span, p.plan
    name = "V (transposed)" if w.which == "v" and w.v_trans else w.which.upper()
    cache = "unified, 1 stream" if w.n_stream == 1 else f"{w.n_stream} streams"
    lines = [
        f"{name} window {w.type}, head_dim {w.head_dim}, {w.n_head_kv} KV heads, -c {w.n_ctx} "
        f"({cache} of {w.kv_size:,} cells), streams {w.streams[0]}-{w.streams[1]}, n_kv {w.n_kv:,}",
        f"  ne {span.ne}  nb {span.nb}  offset {span.offset:,}",
        f"  span (nbytes) {span.nbytes:,} B  read {span.bytes_read:,} B  span/read {span.span_read_ratio:.2f}x",
    ]
    if not plan.plannable:
        lines.append("  plan: none (rows tangle over more than 2^20 rows): the copy path copies the span")
    else:
        lines.append(f"  plan: {plan.n_copies:,} cop{'y' if plan.n_copies == 1 else 'ies'} "
                     f"moving {plan.bytes_moved_plan:,} B (flat moves {span.nbytes:,} B)")
        head = ("offset", "size", "count", "stride")
        body = [tuple(f"{c[k]:,}" for k in head) for c in plan.copies[:SHOWN_COPIES]]
        lines += format_table([head, *body], indent="    ")
        if plan.n_copies > SHOWN_COPIES:
            lines.append(f"    ... {plan.n_copies - SHOWN_COPIES:,} more")
        lines.append(f"  cost ({plan.cost_model} model): plan {plan.cost_plan_us:,.1f} µs, "
                     f"flat {plan.cost_flat_us:,.1f} µs -> {plan.choice}")
    lines.append(f"  why: {plan.explanation}")
    if p.n_layer is not None:
        plural = "" if p.n_layer == 1 else "s"
        kind = f"full layer{plural}" if p.sliding_window is None else \
            f"sliding layer{plural} (window {p.sliding_window:,})"
        moved = plan.bytes_moved_plan if plan.choice == "plan" else span.nbytes
        lines.insert(0, f"{p.n_layer} {kind}:")
        lines.append(f"  over its {p.n_layer} layer{plural}: read {p.n_layer * span.bytes_read:,} B, "
                     f"the plan policy moves {p.n_layer * moved:,} B")
    return "\n".join(lines)


def layer_kinds(windows: Optional[List[Optional[int]]]) -> List[Dict[str, Optional[int]]]:
    """window_plan's window and n_layer per kind of layer: full first, then each window in increasing
    order; one entry of neither without layers of different sizes."""
    if windows is None:
        return [{}]
    counts: Dict[Optional[int], int] = {}
    for w in windows:
        counts[w] = counts.get(w, 0) + 1
    return [{"window": w, "n_layer": n} for w, n in sorted(counts.items(), key=lambda kv: -1 if kv[0] is None
                                                             else kv[0])]


@dataclass(frozen=True)
class Job:
    """What `ferry plan` runs and prints: window_plan's arguments for each plan, and JSON or text."""

    plans: Tuple[Tuple[Tuple[str, Any], ...], ...]
    json: bool


def job(args: argparse.Namespace) -> Job:
    """The Job the parsed options args describe, --model read.

    Raises
    ------
    FerryError
        For a --model file that cannot be read.
    """
    g = apply_model(args, {"c": lambda g: g.n_ctx, "kv_heads": lambda g: g.n_head_kv,
                           "head_dim": lambda g: g.head_dim_v if args.which == "v" else g.head_dim_k})
    kinds = layer_kinds(layer_windows(args, g))
    plans = tuple(tuple({"n_ctx": args.c, "npl": npl, "npp": args.npp, "ntg": args.ntg, "pad": args.pad,
                         "type": args.type, "head_dim": args.head_dim, "n_head_kv": args.kv_heads,
                         "v_trans": args.v_trans, "which": args.which, "streams": args.stream,
                         "cost_model": args.cost_model, "window": kind.get("window"),
                         "n_layer": kind.get("n_layer")}.items())
                  for npl in args.npl for kind in kinds)
    return Job(plans, args.json)


def run(j: Job) -> int:
    """Print the plan (or a JSON list of plans) of each window of the job, one per -npl. Returns the exit
    status 0; a FerryError for values the dry run refuses (a usage error)."""
    plans = [window_plan(**dict(kwargs)) for kwargs in j.plans]
    print(json.dumps([p.as_dict() for p in plans], indent=2) if j.json
          else "\n\n".join(format_plan(p) for p in plans))
    return 0


def main(args: argparse.Namespace) -> int:
    """`ferry plan` with the parsed options args: run(job(args))."""
    return run(job(args))
