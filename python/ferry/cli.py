"""The `ferry` command."""

from __future__ import annotations

import argparse
import sys

from ._binding import ffi, lib


def _check(status: int) -> None:
    if status != 0:
        raise SystemExit(f"ferry: {ffi.string(lib.ferry_last_error()).decode()}")


def demo() -> int:
    """Build a 2-stream q8_0 K window and show span bytes against the bytes it reads."""
    ctx = ffi.new("ferry_context **")
    _check(lib.ferry_context_new(ctx))
    head_dim, n_head_kv, kv_size, n_stream, n_kv = 128, 8, 16384, 2, 2176
    n_embd = head_dim * n_head_kv
    row = ffi.new("size_t *")
    _check(lib.ferry_row_size(lib.FERRY_TYPE_Q8_0, n_embd, row))
    cache = ffi.new("ferry_tensor **")
    _check(lib.ferry_tensor_new(ctx[0], lib.FERRY_TYPE_Q8_0, 3, ffi.new("int64_t[3]", [n_embd, kv_size, n_stream]), cache))
    head = ffi.new("size_t *")
    _check(lib.ferry_row_size(lib.FERRY_TYPE_Q8_0, head_dim, head))
    view = ffi.new("ferry_tensor **")
    _check(lib.ferry_tensor_view(ctx[0], cache[0], 4, ffi.new("int64_t[4]", [head_dim, n_head_kv, n_kv, n_stream]),
                                 ffi.new("size_t[4]", [0, head[0], row[0], row[0] * kv_size]), 0, view))
    span = lib.ferry_tensor_nbytes(view[0])
    read = n_stream * n_kv * row[0]
    print(f"K window q8_0, {n_stream} streams of {kv_size} cells, {n_kv} cells read per stream")
    print(f"  bytes read {read:,}  span (nbytes) {span:,}  ratio {span / read:.2f}x")
    lib.ferry_context_free(ctx[0])
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ferry", description=__doc__)
    sub = parser.add_subparsers(dest="verb", required=True)
    sub.add_parser("demo", help="show what a flat copy of a multi-stream window moves")
    args = parser.parse_args(argv)
    if args.verb == "demo":
        return demo()
    return 2


if __name__ == "__main__":
    sys.exit(main())
