"""`ferry table`: what a flat copy and a ranges copy of the K window move, per number of sequences.

A dry run: the KV cache is laid out at full size on a backend with no memory behind it, and
the scheduler's copy path counts the cells each policy would copy. --model reads -c (the
model's context length), --head-dim (K's) and --kv-heads from a GGUF file, and which layers
slide and their window; with sliding layers the table has a row per layer kind and counts
every layer, each at its own size, in cells and bytes."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple, Union

from ..errors import FerryError
from ..workloads.table import CopyCounts, TableRow, build_table
from .options import apply_model, layer_windows
from .reference import Verb, add_verb_parser
from .text_table import format_table

#: Every failure of this verb comes from its arguments: reported as a usage error (exit 2).
ARGUMENT_ERRORS = FerryError


VERB = Verb("table", "cells read and copied (flat vs ranges) per number of sequences, from a dry run of the "
            "scheduler", " ".join((__doc__ or "").split("\n\n", 1)[-1].split()),
            "ferry table -c 32768 -npl 2,4,8 -npp 2048 -ntg 128")


def add_parser(sub: "argparse._SubParsersAction[Any]") -> argparse.ArgumentParser:
    """Add the `table` verb to the `ferry` command's subparsers sub; returns the verb's parser."""
    return add_verb_parser(sub, VERB)


@dataclass(frozen=True)
class Job:
    """What `ferry table` runs and prints: build_table's arguments, and JSON or text."""

    n_ctx: int
    npl: Tuple[int, ...]
    npp: int
    ntg: int
    pad: int
    type_k: str
    head_dim: int
    n_head_kv: int
    layer_windows: Optional[Tuple[Optional[int], ...]]
    lengths: Union[str, Tuple[int, ...]]
    json: bool


def job(args: argparse.Namespace) -> Job:
    """The Job the parsed options args describe (--model read)."""
    g = apply_model(args, {"c": lambda g: g.n_ctx, "head_dim": lambda g: g.head_dim_k,
                           "kv_heads": lambda g: g.n_head_kv})
    windows = layer_windows(args, g)
    return Job(args.c, tuple(args.npl), args.npp, args.ntg, args.pad, args.type, args.head_dim, args.kv_heads,
               None if windows is None else tuple(windows), args.lengths, args.json)


def _counts(c: CopyCounts) -> Tuple[str, ...]:
    """Read, then copied under flat, ranges and ragged, with thousands separators."""
    return tuple(f"{n:,}" for n in (c.read, c.flat, c.ranges, c.ragged))


def format_rows(rows: Sequence[TableRow]) -> List[str]:
    """The TableRows rows as aligned text lines with thousands separators, under a header."""
    head = ("sequences", "cells read", "copied flat", "copied ranges", "copied ragged", "flat/ranges", "flat/ragged")
    body = [(str(r.npl), *_counts(r.cells), f"{r.flat_over_ranges:.2f}x", f"{r.flat_over_ragged:.2f}x")
            for r in rows]
    return format_table([head, *body])


def format_layer_rows(rows: Sequence[TableRow]) -> List[str]:
    """The TableRows rows of layers of different sizes: per number of sequences a line per layer kind
    and one for all layers, cells and bytes over the layers counted."""
    head = ("sequences", "layers", "cells read", "copied flat", "copied ranges", "copied ragged", "flat/ragged",
            "bytes read", "bytes copied flat", "bytes copied ranges", "bytes copied ragged")
    body = []
    for r in rows:
        kinds = r.layers or []
        for k in kinds:
            name = f"{k.n_layer} full" if k.window is None else f"{k.n_layer} sliding {k.window}"
            body.append((str(r.npl), name, *_counts(k.cells), f"{k.cells.flat / k.cells.ragged:.2f}x",
                         *_counts(k.bytes)))
        assert r.bytes is not None  # a row with layers counts bytes too
        body.append((str(r.npl), f"{sum(k.n_layer for k in kinds)} all", *_counts(r.cells),
                     f"{r.cells.flat / r.cells.ragged:.2f}x", *_counts(r.bytes)))
    return format_table([head, *body])


def run(j: Job) -> int:
    """Print, for the Job j, the cells read and copied under flat and ranges per number of sequences.
    Returns the exit status 0; a FerryError for values the dry run refuses (a usage error)."""
    windows = None if j.layer_windows is None else list(j.layer_windows)
    rows = build_table(j.n_ctx, list(j.npl), j.npp, j.ntg, pad=j.pad, type_k=j.type_k, head_dim=j.head_dim,
                       n_head_kv=j.n_head_kv, layer_windows=windows, lengths=j.lengths)
    if j.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
    else:
        prompts = f"{j.npp}" if j.lengths == "equal" else ("up to " + str(j.npp) + (" (uniform)" if j.lengths ==
                                                                                       "uniform" else " (given)"))
        print(f"K window {j.type_k}, head_dim {j.head_dim}, {j.n_head_kv} KV heads, -c {j.n_ctx}, "
              f"{prompts} + {j.ntg} tokens per sequence (pad {j.pad})")
        if windows is None:
            print("\n".join(format_rows(rows)))
        else:
            print("layers of different sizes: a sliding layer holds and reads its window + 1 cell per sequence "
                  "(a decode step's new token), at most n_kv; cells and bytes count every layer")
            print("\n".join(format_layer_rows(rows)))
    return 0


def main(args: argparse.Namespace) -> int:
    """`ferry table` with the parsed options args: run(job(args)). A --model file that cannot be read
    is a usage error."""
    return run(job(args))
