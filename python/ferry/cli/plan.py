"""`ferry plan`: the copy plan of a KV-cache window, what it moves, what it costs, and why.

One plan per number of sequences (-npl 1: a unified cache). --model reads -c (the model's
context length), --head-dim (K's, or V's with --which v) and --kv-heads from a GGUF file."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import FerryError
from ..workloads.plan import WindowPlan, window_plan
from .options import add_kv_args, add_shape_args, add_verb_parser, apply_model, stream_range
from .text_table import format_table

#: Every failure of this verb comes from its arguments: reported as a usage error (exit 2).
ARGUMENT_ERRORS = FerryError

#: Copies listed in the text output before "... N more".
SHOWN_COPIES = 16


def add_parser(sub: "argparse._SubParsersAction[Any]") -> argparse.ArgumentParser:
    """Add the `plan` verb to the `ferry` command's subparsers sub; returns the verb's parser."""
    pp = add_verb_parser(sub, "plan", "the copy plan of a KV-cache window: copies, bytes moved, cost, and why",
                         __doc__, "ferry plan -c 32768 -npl 1 -npp 2048 -ntg 128 --v-trans --which v")
    add_shape_args(pp)
    add_kv_args(pp, run=False)
    pp.add_argument("--v-trans", action="store_true", help="V stored transposed (flash attention off)")
    pp.add_argument("--which", choices=("k", "v"), default="k", help="the K or the V window (default k)")
    pp.add_argument("--stream", type=stream_range, metavar="S0-S1", help="streams read (default all)")
    pp.add_argument("--cost-model", choices=("cpu", "gpu"), default="gpu",
                    help="whose cost model decides plan or flat (default gpu: host to device)")
    pp.add_argument("--json", action="store_true", help="a JSON list of objects, one per -npl, instead of text")
    return pp


def format_plan(p: WindowPlan) -> str:
    """The WindowPlan p as text: the window, the span against what is read, the copies, the costs, the why."""
    name = "V (transposed)" if p.which == "v" and p.v_trans else p.which.upper()
    cache = "unified, 1 stream" if p.n_stream == 1 else f"{p.n_stream} streams"
    lines = [
        f"{name} window {p.type}, head_dim {p.head_dim}, {p.n_head_kv} KV heads, -c {p.n_ctx} "
        f"({cache} of {p.kv_size:,} cells), streams {p.streams[0]}-{p.streams[1]}, n_kv {p.n_kv:,}",
        f"  ne {p.ne}  nb {p.nb}  offset {p.offset:,}",
        f"  span (nbytes) {p.nbytes:,} B  read {p.bytes_read:,} B  span/read {p.span_read_ratio:.2f}x",
    ]
    if not p.plannable:
        lines.append("  plan: none (rows tangle over more than 2^20 rows): the copy path copies the span")
    else:
        lines.append(f"  plan: {p.n_copies:,} cop{'y' if p.n_copies == 1 else 'ies'} "
                     f"moving {p.bytes_moved_plan:,} B (flat moves {p.nbytes:,} B)")
        head = ("offset", "size", "count", "stride")
        body = [tuple(f"{c[k]:,}" for k in head) for c in p.copies[:SHOWN_COPIES]]
        lines += format_table([head, *body], indent="    ")
        if p.n_copies > SHOWN_COPIES:
            lines.append(f"    ... {p.n_copies - SHOWN_COPIES:,} more")
        lines.append(f"  cost ({p.cost_model} model): plan {p.cost_plan_us:,.1f} µs, flat {p.cost_flat_us:,.1f} µs "
                     f"-> {p.choice}")
    lines.append(f"  why: {p.explanation}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Print the plan (or a JSON list of plans) of the window the parsed options args describe, one per
    -npl. Returns the exit status 0; a FerryError for values the dry run refuses, or a --model file
    that cannot be read (a usage error).
    """
    apply_model(args, {"c": lambda g: g.n_ctx, "kv_heads": lambda g: g.n_head_kv,
                       "head_dim": lambda g: g.head_dim_v if args.which == "v" else g.head_dim_k})
    plans = [window_plan(args.c, npl, args.npp, args.ntg, pad=args.pad, type=args.type, head_dim=args.head_dim,
                         n_head_kv=args.kv_heads, v_trans=args.v_trans, which=args.which, streams=args.stream,
                         cost_model=args.cost_model) for npl in args.npl]
    print(json.dumps([p.as_dict() for p in plans], indent=2) if args.json
          else "\n\n".join(format_plan(p) for p in plans))
    return 0
