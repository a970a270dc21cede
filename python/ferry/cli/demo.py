"""`ferry demo`: what a flat copy of a 2-stream q8_0 K window moves, against what attention reads."""

from __future__ import annotations

import argparse
from typing import Any, Tuple

from ..tensor import Tensor
from ..types import Type, row_size
from .reference import Verb, add_verb_parser

#: demo takes no arguments: no failure of it is a usage error.
ARGUMENT_ERRORS = ()


VERB = Verb("demo", "show what a flat copy of a multi-stream window moves",
            "Builds a 2-stream q8_0 K window of 2,176 cells a stream over 16,384-cell streams and prints the "
            "bytes attention reads against the span a flat copy moves. No options.", "ferry demo")


def add_parser(sub: "argparse._SubParsersAction[Any]") -> argparse.ArgumentParser:
    """Add the `demo` verb to the `ferry` command's subparsers sub; returns the verb's parser."""
    return add_verb_parser(sub, VERB)


def job(args: argparse.Namespace) -> Tuple[()]:
    """demo's job: nothing to choose (args: none)."""
    return ()


def main(args: argparse.Namespace) -> int:
    """`ferry demo`: run(job(args))."""
    return run(job(args))


def run(j: Tuple[()]) -> int:
    """Build the window and print its span against the bytes it reads (j: the empty job). Returns the exit
    status 0.
    """
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
