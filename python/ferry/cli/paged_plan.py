"""`ferry paged-plan`: a paged cache's window gathered into a stand-in, planned.

One plan per number of sequences: a pool of --block-size blocks, each sequence's table drawn with
--adjacency of its blocks right after their predecessor, and the window gathered into a stand-in
(--link-gbps, --latency-us, --row-ns, or a named link: --link-profile): its blocks, runs, calls and
bytes, and each gather method's predicted time, the one ferry chooses marked (ferry.workloads.paged_plan).
A merged gather's spans carry the unused blocks between runs across too: their bytes are said as
crossed, never read."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from ..errors import FerryError
from ..workloads.paged_plan import PagedWindowPlan, paged_window_plan
from .options import apply_model
from .reference import Verb, add_verb_parser
from .text_table import fmt_link, fmt_seconds, format_table

#: Every failure of this verb comes from its arguments: reported as a usage error (exit 2).
ARGUMENT_ERRORS = FerryError


VERB = Verb("paged-plan", "a paged cache's window: blocks, runs, calls, bytes and each gather method's predicted time",
            " ".join((__doc__ or "").split("\n\n", 1)[-1].split()),
            "ferry paged-plan -c 32768 -npl 4 -npp 2048 --block-size 16 --adjacency 0.5 --latency-us 5")


def add_parser(sub: "argparse._SubParsersAction[Any]") -> argparse.ArgumentParser:
    """Add the `paged-plan` verb to the `ferry` command's subparsers sub; returns the verb's parser."""
    return add_verb_parser(sub, VERB)


def format_paged(p: PagedWindowPlan) -> str:
    """The PagedWindowPlan p as text: the window and its cache, the stand-in's link, the gather's blocks,
    runs, calls and bytes, and each method's predicted time, the one chosen marked."""
    w, stand_in, g = p.window, p.link, p.gather
    name = "V (transposed)" if w.which == "v" and w.v_trans else w.which.upper()
    link = fmt_link(stand_in.link_gbps) if stand_in.link_gbps else "unmodelled"
    if stand_in.link_profile:
        link = (f"{stand_in.link_profile} at {link}, pieces from {fmt_link(stand_in.piece_floor_gbps)} small"
                if stand_in.piece_floor_gbps else f"{stand_in.link_profile} at {link}")
    spans = (f" in {g.spans:,} span{'' if g.spans == 1 else 's'} crossing {g.crossed_bytes:,} B "
             f"({g.crossed_bytes - g.bytes:,} B of gaps, never read)" if g.method == "merged" else "")
    lines = [f"{name} paged window {w.type}, head_dim {w.head_dim}, {w.n_head_kv} KV heads, sequences "
             f"{w.streams[0]}-{w.streams[1]} of {w.n_seq}, {w.cells:,} cells each",
             f"  pool of {w.n_blocks:,} blocks of {w.block_size} cells (-c {w.n_ctx:,}), adjacency {w.adjacency:g}",
             f"  stand-in link {link}, {stand_in.latency_us:g} µs a call, {stand_in.row_ns:g} ns a row",
             f"  gather: {g.blocks:,} blocks in {g.runs:,} runs; {g.method}: {g.calls:,} "
             f"call{'' if g.calls == 1 else 's'} moving {g.bytes:,} B{spans}, predicted {fmt_seconds(g.seconds)}"]
    def note(m: str, s: Optional[float]) -> str:
        if m == g.method:
            return "<- chosen"
        if m == "merged" and s is not None and s < g.seconds:  # auto asks merged for more than the model's error
            return "cheaper, but by less than auto asks of merged (docs/design.md)"
        return ""

    body = [[m, "not offered" if s is None else fmt_seconds(s), note(m, s)]
            for m, s in g.method_seconds.items() if m != "auto"]
    lines += [ln.rstrip() for ln in format_table([["method", "predicted", ""], *body], left=(0,), indent="    ")]
    return "\n".join(lines)


@dataclass(frozen=True)
class Job:
    """What `ferry paged-plan` runs and prints: paged_window_plan's arguments for each plan, and JSON or
    text."""

    plans: Tuple[Tuple[Tuple[str, Any], ...], ...]
    json: bool


def job(args: argparse.Namespace) -> Job:
    """The Job the parsed options args describe, --model read.

    Raises
    ------
    FerryError
        For a --model file that cannot be read.
    """
    apply_model(args, {"c": lambda g: g.n_ctx, "kv_heads": lambda g: g.n_head_kv,
                       "head_dim": lambda g: g.head_dim_v if args.which == "v" else g.head_dim_k})
    return Job(tuple(tuple({"n_ctx": args.c, "npl": npl, "npp": args.npp, "ntg": args.ntg, "type": args.type,
                            "head_dim": args.head_dim, "n_head_kv": args.kv_heads, "v_trans": args.v_trans,
                            "which": args.which, "streams": args.stream, "block_size": args.block_size,
                            "adjacency": args.adjacency, "link_gbps": args.link_gbps or (),
                            "latency_us": args.latency_us or (), "row_ns": args.row_ns or (),
                            "link_profile": args.link_profile}.items())
                       for npl in args.npl), args.json)


def run(j: Job) -> int:
    """Print the paged plan (or a JSON list of them) of each window of the job, one per -npl. Returns the
    exit status 0; a FerryError for values the plan refuses (a usage error)."""
    paged = [paged_window_plan(**dict(kwargs)) for kwargs in j.plans]
    print(json.dumps([p.as_dict() for p in paged], indent=2) if j.json
          else "\n\n".join(format_paged(p) for p in paged))
    return 0


def main(args: argparse.Namespace) -> int:
    """`ferry paged-plan` with the parsed options args: run(job(args))."""
    return run(job(args))
