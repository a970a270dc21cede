"""The `ferry` command."""

from __future__ import annotations

import argparse
import sys

from .errors import FerryError
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ferry", description=__doc__)
    sub = parser.add_subparsers(dest="verb", required=True)
    sub.add_parser("demo", help="show what a flat copy of a multi-stream window moves")
    args = parser.parse_args(argv)
    try:
        if args.verb == "demo":
            return demo()
    except FerryError as e:
        raise SystemExit(f"ferry: {e}") from None
    return 2


if __name__ == "__main__":
    sys.exit(main())
