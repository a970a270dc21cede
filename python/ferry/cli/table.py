"""`ferry table`: what a flat copy and a ranges copy of the K window move, per number of sequences.

A dry run: the KV cache is laid out at full size on a backend with no memory behind it, and
the scheduler's copy path counts the cells each policy would copy. --model reads -c (the
model's context length), --head-dim (K's) and --kv-heads from a GGUF file, and which layers
slide and their window; with sliding layers the table has a row per layer kind and counts
every layer, each at its own size, in cells and bytes."""

from __future__ import annotations

import argparse
import json
from typing import Any, List, Sequence

from ..errors import FerryError
from ..workloads.table import TableRow, build_table
from .options import add_kv_args, add_shape_args, add_swa_args, add_verb_parser, apply_model, layer_windows
from .text_table import format_table

#: Every failure of this verb comes from its arguments: reported as a usage error (exit 2).
ARGUMENT_ERRORS = FerryError


def add_parser(sub: "argparse._SubParsersAction[Any]") -> argparse.ArgumentParser:
    """Add the `table` verb to the `ferry` command's subparsers sub; returns the verb's parser."""
    tp = add_verb_parser(sub, "table", "cells read and copied (flat vs ranges) per number of sequences, from a "
                         "dry run of the scheduler", __doc__, "ferry table -c 32768 -npl 2,4,8 -npp 2048 -ntg 128")
    add_shape_args(tp)
    add_kv_args(tp, run=False)
    add_swa_args(tp)
    tp.add_argument("--json", action="store_true", help="a JSON list of objects instead of a table")
    return tp


def format_rows(rows: Sequence[TableRow]) -> List[str]:
    """The TableRows rows as aligned text lines with thousands separators, under a header."""
    head = ("sequences", "cells read", "cells copied flat", "cells copied ranges", "flat/ranges")
    body = [(str(r.npl), f"{r.cells_read:,}", f"{r.cells_copied_flat:,}", f"{r.cells_copied_ranges:,}",
             f"{r.ratio:.2f}x") for r in rows]
    return format_table([head, *body])


def format_layer_rows(rows: Sequence[TableRow]) -> List[str]:
    """The TableRows rows of layers of different sizes: per number of sequences a line per layer kind
    and one for all layers, cells and bytes over the layers counted."""
    head = ("sequences", "layers", "cells read", "cells copied flat", "cells copied ranges", "flat/ranges",
            "bytes read", "bytes copied flat", "bytes copied ranges")
    body = []
    for r in rows:
        for k in r.layers or []:
            name = f"{k.n_layer} full" if k.window is None else f"{k.n_layer} sliding {k.window}"
            body.append((str(r.npl), name, f"{k.cells_read:,}", f"{k.cells_copied_flat:,}",
                         f"{k.cells_copied_ranges:,}", f"{k.cells_copied_flat / k.cells_copied_ranges:.2f}x",
                         f"{k.bytes_read:,}", f"{k.bytes_copied_flat:,}", f"{k.bytes_copied_ranges:,}"))
        n_layer = sum(k.n_layer for k in r.layers or [])
        body.append((str(r.npl), f"{n_layer} all", f"{r.cells_read:,}", f"{r.cells_copied_flat:,}",
                     f"{r.cells_copied_ranges:,}", f"{r.ratio:.2f}x", f"{r.bytes_read:,}",
                     f"{r.bytes_copied_flat:,}", f"{r.bytes_copied_ranges:,}"))
    return format_table([head, *body])


def main(args: argparse.Namespace) -> int:
    """Print, for the parsed options args, the cells read and copied under flat and ranges per number
    of sequences. Returns the exit status 0; a FerryError for values the dry run refuses, or a
    --model file that cannot be read (a usage error).
    """
    g = apply_model(args, {"c": lambda g: g.n_ctx, "head_dim": lambda g: g.head_dim_k,
                           "kv_heads": lambda g: g.n_head_kv})
    windows = layer_windows(args, g)
    rows = build_table(args.c, args.npl, args.npp, args.ntg, pad=args.pad, type_k=args.type,
                       head_dim=args.head_dim, n_head_kv=args.kv_heads, layer_windows=windows)
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
    else:
        print(f"K window {args.type}, head_dim {args.head_dim}, {args.kv_heads} KV heads, -c {args.c}, "
              f"{args.npp} + {args.ntg} tokens per sequence (pad {args.pad})")
        if windows is None:
            print("\n".join(format_rows(rows)))
        else:
            print("layers of different sizes: a sliding layer holds and reads its window + 1 cell per sequence "
                  "(a decode step's new token), at most n_kv; cells and bytes count every layer")
            print("\n".join(format_layer_rows(rows)))
    return 0
