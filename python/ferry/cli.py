"""ferry: copy the ranges of a multi-stream KV-cache window to the device, not the span.

Every verb builds real windows with the library and reports exact byte counts."""

from __future__ import annotations

import argparse
import json
import sys
from typing import List

from . import plan_cli
from .errors import FerryError, InvalidArgumentError
from .tensor import Tensor
from .types import Type, row_size


def demo() -> int:
    """Build a 2-stream q8_0 K window and show span bytes against the bytes it reads."""
    head_dim, n_head_kv, kv_size, n_stream, n_kv = 128, 8, 16384, 2, 2176
    n_embd = head_dim * n_head_kv
    row = row_size(Type.Q8_0, n_embd)
    cache = Tensor.new(Type.Q8_0, [n_embd, kv_size, n_stream], name="cache")
    view = cache.view([head_dim, n_head_kv, n_kv, n_stream],
                      [Type.Q8_0.size, row_size(Type.Q8_0, head_dim), row, row * kv_size], name="k")
    span = view.nbytes
    read = n_stream * n_kv * row
    print(f"K window q8_0, {n_stream} streams of {kv_size} cells, {n_kv} cells read per stream")
    print(f"  bytes read {read:,}  span (nbytes) {span:,}  ratio {span / read:.2f}x")
    return 0


def table(args: argparse.Namespace) -> int:
    """Print, per number of sequences, the cells read and copied under flat and ranges (a dry run)."""
    from .table import build_table, format_table

    rows = build_table(args.c, args.npl, args.npp, args.ntg, pad=args.pad, type_k=args.type,
                       head_dim=args.head_dim, n_head_kv=args.kv_heads)
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
    else:
        print(f"K window {args.type}, head_dim {args.head_dim}, {args.kv_heads} KV heads, -c {args.c}, "
              f"{args.npp} + {args.ntg} tokens per sequence (pad {args.pad})")
        print(format_table(rows))
    return 0


def _int_list(text: str) -> List[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ferry", description=__doc__)
    sub = parser.add_subparsers(dest="verb", required=True)
    sub.add_parser("demo", help="show what a flat copy of a multi-stream window moves")
    tp = sub.add_parser("table", help="cells read and copied (flat vs ranges) per number of sequences, "
                                      "from a dry run of the scheduler")
    tp.add_argument("-npl", type=_int_list, required=True, metavar="N,N,...", help="numbers of sequences (streams)")
    plan_cli.add_window_args(tp, "q8_0", "K type")
    tp.add_argument("--json", action="store_true", help="a JSON list of objects instead of a table")
    pp = plan_cli.add_parser(sub)

    from . import bench, validate

    bp = bench.add_parser(sub, _int_list)
    vp = validate.add_parser(sub)
    args = parser.parse_args(argv)
    try:
        if args.verb == "demo":
            return demo()
        if args.verb == "table":
            try:
                return table(args)
            except FerryError as e:  # every failure here comes from the arguments
                tp.error(str(e))
        if args.verb == "plan":
            try:
                return plan_cli.run(args)
            except FerryError as e:  # every failure here comes from the arguments
                pp.error(str(e))
        if args.verb == "bench":
            try:
                return bench.main(args)
            except InvalidArgumentError as e:  # the options; a failure to run is a FerryError below
                bp.error(str(e))
        if args.verb == "validate":
            try:
                return validate.main(args)
            except InvalidArgumentError as e:
                vp.error(str(e))
    except FerryError as e:
        raise SystemExit(f"ferry: {e}") from None
    return 2


if __name__ == "__main__":
    sys.exit(main())
