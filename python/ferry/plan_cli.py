"""`ferry plan`: the copy plan of a KV-cache window, what it moves, what it costs, and why.

A dry run: the cache lives in synthetic host memory (a DummyBackend with is_host, no
memory behind it), the window is the one kv.window hands attention, and the plan, the
bytes read and the costs come from the library (ferry_copy_plan, ferry_copy_plan_cost,
ferry_copy_flat_cost, ferry_copy_plan_pays) as the plan copy policy uses them.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Tuple

from .backend import DummyBackend
from .copy_path import bytes_read
from .errors import InvalidArgumentError, UnsupportedError
from .kv import KVCache
from .plan import Copy2D, cost_model, explain_tensor, flat_cost, plan_cost, plan_of, plan_pays
from .table import n_kv_for
from .types import to_type

#: Copies listed in the text output before "... N more".
SHOWN_COPIES = 16


@dataclass(frozen=True)
class WindowPlan:
    """The plan of one KV-cache window (the JSON output, key for key). Offsets are bytes from
    the first byte of the layer's K or V tensor; costs are microseconds by the backend's model;
    choice is what the plan copy policy takes there ("plan" or "flat")."""

    which: str
    type: str
    v_trans: bool
    n_ctx: int
    n_stream: int
    kv_size: int
    n_kv: int
    streams: List[int]
    head_dim: int
    n_head_kv: int
    ne: List[int]
    nb: List[int]
    offset: int
    nbytes: int
    bytes_read: int
    span_read_ratio: float
    plannable: bool
    n_copies: int
    copies: List[Dict[str, int]]
    bytes_moved_plan: int
    backend: str
    cost_plan_us: float
    cost_flat_us: float
    choice: str
    explanation: str

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def parse_streams(text: str) -> Tuple[int, int]:
    """"S0-S1" or "S" as (s0, s1)."""
    parts = text.split("-")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected S0-S1 or S (stream numbers), got {text!r}") from None
    if len(values) == 1:
        return values[0], values[0]
    if len(values) != 2:
        raise argparse.ArgumentTypeError(f"expected S0-S1 or S (stream numbers), got {text!r}")
    return values[0], values[1]


def window_plan(n_ctx: int, npl: int, npp: int, ntg: int, pad: int = 1, type: str = "f16", head_dim: int = 128,
                n_head_kv: int = 8, v_trans: bool = False, which: str = "k", streams: Tuple[int, int] | None = None,
                backend: str = "gpu") -> WindowPlan:
    """Plan the K or V window of a cache of npl streams (kv_size = n_ctx / npl cells each; npl 1:
    unified) for sequences of npp + ntg tokens (n_kv rounded up to pad), streams s0..s1 (default all)."""
    for name, value in (("-c", n_ctx), ("-npl", npl), ("-npp", npp), ("--pad", pad), ("--head-dim", head_dim),
                        ("--kv-heads", n_head_kv)):
        if value <= 0:
            raise InvalidArgumentError(f"{name} must be positive, got {value}")
    if ntg < 0:
        raise InvalidArgumentError(f"-ntg must not be negative, got {ntg}")
    if n_ctx % npl != 0:
        raise InvalidArgumentError(f"-npl {npl}: the context of {n_ctx} cells does not split into {npl} equal streams")
    if which not in ("k", "v"):
        raise InvalidArgumentError(f"--which is k or v, not {which!r}")
    if backend not in ("cpu", "gpu"):
        raise InvalidArgumentError(f"--backend is cpu or gpu, not {backend!r}")
    s0, s1 = streams if streams is not None else (0, npl - 1)
    if not 0 <= s0 <= s1 < npl:
        raise InvalidArgumentError(f"--stream {s0}-{s1}: streams are 0..{npl - 1} and s0 <= s1")
    ty = to_type(type)
    kv_size = n_ctx // npl
    n_kv = n_kv_for(npp, ntg, pad, kv_size)
    kv = KVCache(ty, ty, head_dim, n_head_kv, n_ctx, npl, v_trans=v_trans, backend=DummyBackend(is_host=True))
    k, v = kv.window(0, n_kv, s0, s1)
    t = k if which == "k" else v
    model = cost_model(backend)
    try:
        copies: List[Copy2D] = plan_of(t)
        plannable = True
    except UnsupportedError:
        copies, plannable = [], False
    read, span = bytes_read(t), t.nbytes
    pays = plannable and plan_pays(t, model)
    return WindowPlan(
        which=which, type=str(ty), v_trans=v_trans, n_ctx=n_ctx, n_stream=npl, kv_size=kv_size, n_kv=n_kv,
        streams=[s0, s1], head_dim=head_dim, n_head_kv=n_head_kv, ne=list(t.ne), nb=list(t.nb), offset=t.offset,
        nbytes=span, bytes_read=read, span_read_ratio=span / read if read else 1.0, plannable=plannable,
        n_copies=len(copies), copies=[c._asdict() for c in copies], bytes_moved_plan=sum(c.nbytes for c in copies),
        backend=backend, cost_plan_us=plan_cost(copies, model) * 1e6 if plannable else float("nan"),
        cost_flat_us=flat_cost(span, model) * 1e6, choice="plan" if pays else "flat",
        explanation=explain_tensor(t).text)


def format_plan(p: WindowPlan) -> str:
    """The plan as text: the window, the span against what is read, the copies, the costs, the why."""
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
        widths = [max(len(x) for x in col) for col in zip(head, *body)]
        for line in [head, *body]:
            lines.append("    " + "  ".join(x.rjust(w) for x, w in zip(line, widths)))
        if p.n_copies > SHOWN_COPIES:
            lines.append(f"    ... {p.n_copies - SHOWN_COPIES:,} more")
        lines.append(f"  cost ({p.backend} model): plan {p.cost_plan_us:,.1f} us, flat {p.cost_flat_us:,.1f} us "
                     f"-> {p.choice}")
    lines.append(f"  why: {p.explanation}")
    return "\n".join(lines)


def add_window_args(p: argparse.ArgumentParser, type_default: str, type_help: str) -> None:
    """The options that say which KV-cache window a dry-run verb builds (table and plan):
    -c, -npp, -ntg, --pad, --type, --head-dim, --kv-heads (-npl is each verb's own)."""
    p.add_argument("-c", type=int, required=True, metavar="N_CTX", help="cells in all streams together")
    p.add_argument("-npp", type=int, required=True, help="prompt tokens per sequence")
    p.add_argument("-ntg", type=int, required=True, help="generated tokens per sequence")
    p.add_argument("--pad", type=int, default=1, help="round n_kv up to this (llama.cpp: 256; default 1)")
    p.add_argument("--type", default=type_default, help=f"{type_help} (default {type_default})")
    p.add_argument("--head-dim", type=int, default=128, help="default 128")
    p.add_argument("--kv-heads", type=int, default=8, help="default 8")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The `plan` verb's arguments on the `ferry` command's subparsers."""
    pp = sub.add_parser("plan", help="the copy plan of a KV-cache window: copies, bytes moved, cost, and why")
    pp.add_argument("-npl", type=int, default=1, help="sequences, one stream each (default 1: a unified cache)")
    add_window_args(pp, "f16", "cache type")
    pp.add_argument("--v-trans", action="store_true", help="V stored transposed (flash attention off)")
    pp.add_argument("--which", choices=("k", "v"), default="k", help="the K or the V window (default k)")
    pp.add_argument("--stream", type=parse_streams, metavar="S0-S1", help="streams read (default all)")
    pp.add_argument("--backend", choices=("cpu", "gpu"), default="gpu",
                    help="whose cost model decides plan or flat (default gpu: host to device)")
    pp.add_argument("--json", action="store_true", help="a JSON object instead of text")
    return pp


def run(args: argparse.Namespace) -> int:
    """Print the plan of the window args describe; FerryError for bad values (the caller exits 2)."""
    p = window_plan(args.c, args.npl, args.npp, args.ntg, pad=args.pad, type=args.type, head_dim=args.head_dim,
                    n_head_kv=args.kv_heads, v_trans=args.v_trans, which=args.which, streams=args.stream,
                    backend=args.backend)
    print(json.dumps(p.as_dict(), indent=2) if args.json else format_plan(p))
    return 0
