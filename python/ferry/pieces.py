"""A plan's pieces: 2-D copies and a paged window's gather copies as the contiguous pieces of one batch
transfer, and pieces merged across gaps where the link's cost model says one piece costs less.

copy_pieces, gather_pieces and merge_pieces give Piece rows (ferry_copy_pieces, ferry_gather_pieces,
ferry_copy_pieces_merge); the private helpers give the same pieces as numpy rows in bulk, for a pull
of thousands of pieces (the remote tier's), and place them between host addresses.
"""

from __future__ import annotations

from typing import Any, Iterable, List, NamedTuple, Sequence, Tuple

import numpy as np

from . import _checks
from ._binding import ffi, lib
from .backend import Backend
from .copy2d import to_c
from .copy_cost import ModelLike, cost_model
from .errors import InvalidArgumentError, UnsupportedError, check
from .paged_plan import GatherCopy
from .tensor import Tensor


class Piece(NamedTuple):
    """One piece of a batch transfer (ferry_copy_piece): size contiguous bytes from src_offset of
    the source to dst_offset of the destination.

    Attributes
    ----------
    src_offset, dst_offset : int
        Bytes from the source's and the destination's first byte.
    size : int
        Bytes.
    """

    src_offset: int
    dst_offset: int
    size: int


#: The most pieces copy_pieces and gather_pieces list (24 bytes each in C, a tuple each here): a batch
#: transfer of more is no plan a link pays for.
MAX_PIECES = 1 << 22


def _piece_array(fill: Any, what: str) -> np.ndarray:
    """fill(pieces, max, n) counted, then filled: C's pieces as rows (src_offset, dst_offset, size) of
    a size_t (uintp) array, in bulk (a pull of thousands of pieces pays no Python object a piece)."""
    n = ffi.new("size_t *")
    check(fill(ffi.NULL, 0, n))
    if n[0] > MAX_PIECES:
        raise UnsupportedError(f"{what}: the copies are {n[0]} pieces, more than {MAX_PIECES} (ferry.plan.MAX_PIECES): "
                               "copy the span instead")
    out = np.zeros((n[0], 3), dtype=np.uintp)
    if n[0]:
        check(fill(ffi.cast("ferry_copy_piece *", out.ctypes.data), n[0], n))
    return out


def _pieces_of(fill: Any, what: str) -> List[Piece]:
    """fill(pieces, max, n) counted, then filled: C's pieces as Piece rows."""
    return [Piece(*row) for row in _piece_array(fill, what).tolist()]


def _gather_piece_array(copies: Sequence[GatherCopy]) -> np.ndarray:
    """gather_pieces of a plan's own copies (plan_paged(...).copies, already checked), as _piece_array's rows."""
    arr = np.ascontiguousarray(np.array([tuple(c) for c in copies], dtype=np.uintp).reshape(-1, 6))
    c = ffi.cast("ferry_gather_copy *", arr.ctypes.data)
    return _piece_array(lambda out, mx, cnt: lib.ferry_gather_pieces(c, len(arr), out, mx, cnt), "gather_pieces")


def _paged_piece_array(window: Tensor, backend: Backend) -> np.ndarray:
    """gather_pieces of plan_paged(window, backend)'s copies, as _piece_array's rows, the copies kept
    in a C array (a pull's thousands of runs pay no Python object each)."""
    n = ffi.new("size_t *")
    check(lib.ferry_copy_paged_plan(window._p, backend._p, ffi.new("ferry_paged_plan *"), ffi.NULL, 0, n))
    copies = ffi.new("ferry_gather_copy[]", max(n[0], 1))
    check(lib.ferry_copy_paged_plan(window._p, backend._p, ffi.new("ferry_paged_plan *"), copies, n[0], n))
    return _piece_array(lambda out, mx, cnt: lib.ferry_gather_pieces(copies, n[0], out, mx, cnt), "gather_pieces")


def _place_pieces(dst: int, dst_bytes: int, src: int, src_bytes: int, pieces: np.ndarray) -> None:
    """Each of pieces' rows (src_offset, dst_offset, size: a uintp array) copied from src + src_offset
    to dst + dst_offset, host addresses, in one call (ferry_copy_pieces_place: all checked first)."""
    arr = np.ascontiguousarray(pieces, dtype=np.uintp).reshape(-1, 3)
    check(lib.ferry_copy_pieces_place(ffi.cast("void *", dst), dst_bytes, ffi.cast("const void *", src), src_bytes,
                                      ffi.cast("const ferry_copy_piece *", arr.ctypes.data), len(arr)))


def _copy_piece_array(copies: Iterable[Sequence[int]]) -> np.ndarray:
    """copy_pieces of 2-D copies, as _piece_array's rows."""
    arr, n = to_c(copies, "copy_pieces")
    return _piece_array(lambda out, mx, cnt: lib.ferry_copy_pieces(arr, n, out, mx, cnt), "copy_pieces")


def _merge_piece_array(pieces: np.ndarray, model: ModelLike) -> Tuple[np.ndarray, int]:
    """merge_pieces of _piece_array's rows: the rows left (a new array) and the gap bytes."""
    m = cost_model(model)._c()
    arr = np.array(pieces, dtype=np.uintp, order="C").reshape(-1, 3)
    n = ffi.new("size_t *", len(arr))
    gaps = ffi.new("uint64_t *")
    check(lib.ferry_copy_pieces_merge(m, ffi.cast("ferry_copy_piece *", arr.ctypes.data) if len(arr) else ffi.NULL,
                                      n, gaps))
    return arr[:n[0]].copy(), int(gaps[0])


def copy_pieces(copies: Iterable[Sequence[int]]) -> List[Piece]:
    """The pieces of 2-D copies (ferry_copy_pieces): a piece per row, each to the offset it is read
    from (a destination of the source's layout), in the copies' order.

    Parameters
    ----------
    copies : iterable of Copy2D or of (offset, size, count, stride)
        plan_copy's, plan_ragged's or copy_ranges_of's copies, say.

    Returns
    -------
    list of Piece

    Raises
    ------
    InvalidArgumentError
        For rows that are not 4 sizes.
    OutOfBoundsError
        For a row whose end overflows.
    UnsupportedError
        For more than MAX_PIECES pieces.
    """
    arr, n = to_c(copies, "copy_pieces")
    return _pieces_of(lambda out, mx, cnt: lib.ferry_copy_pieces(arr, n, out, mx, cnt), "copy_pieces")


def gather_pieces(copies: Iterable[GatherCopy]) -> List[Piece]:
    """The pieces of a paged window's gather copies (ferry_gather_pieces, PagedPlan.copies): from the
    pool to the dense window, a piece per row.

    Parameters
    ----------
    copies : iterable of GatherCopy
        plan_paged(...).copies.

    Returns
    -------
    list of Piece

    Raises
    ------
    InvalidArgumentError
        For rows that are not 6 sizes.
    OutOfBoundsError
        For a row whose end overflows.
    UnsupportedError
        For more than MAX_PIECES pieces.
    """
    rows = [[_checks.as_size(v, f"gather_pieces: copy {i}") for v in _six(c, i)] for i, c in enumerate(copies)]
    arr = ffi.new("ferry_gather_copy[]", max(len(rows), 1))
    for a, (so, do, size, count, ss, ds) in zip(arr, rows):
        a.src_offset, a.dst_offset, a.size, a.count, a.src_stride, a.dst_stride = so, do, size, count, ss, ds
    return _pieces_of(lambda out, mx, cnt: lib.ferry_gather_pieces(arr, len(rows), out, mx, cnt), "gather_pieces")


def _six(c: Any, i: int) -> Sequence[Any]:
    if isinstance(c, (str, bytes)) or not hasattr(c, "__len__") or len(c) != 6:
        raise InvalidArgumentError(f"gather_pieces: copy {i} is not a GatherCopy "
                                   f"(src_offset, dst_offset, size, count, src_stride, dst_stride): {c!r}")
    return list(c)


def merge_pieces(pieces: Iterable[Sequence[int]], model: ModelLike = "cpu") -> Tuple[List[Piece], int]:
    """Pieces merged across gaps by the one rule a paged gather's merged spans follow too
    (ferry_copy_pieces_merge): pieces that touch join; then, among pieces whose gaps are the same in
    the source and the destination, a piece joins those after it (at most 64 on) where one piece
    through them costs less than a piece each, a piece priced piece_ns and its bytes at its size's
    rate (the model's piece curve, or gbps).

    Parameters
    ----------
    pieces : iterable of Piece or of (src_offset, dst_offset, size)
    model : CopyCostModel, str or Backend, optional
        The link's model (CopyCostModel.from_link of the remote tier's measure, say).

    Returns
    -------
    (list of Piece, int)
        The pieces left, and the gap bytes they carry beyond the plan's.

    Raises
    ------
    InvalidArgumentError
        For rows that are not 3 sizes, or a model C refuses.
    OutOfBoundsError
        For a piece whose end overflows.
    """
    m = cost_model(model)._c()
    rows = []
    for i, p in enumerate(pieces):
        if isinstance(p, (str, bytes)) or not hasattr(p, "__len__") or len(p) != 3:
            raise InvalidArgumentError(f"merge_pieces: piece {i} is not (src_offset, dst_offset, size): {p!r}")
        rows.append([_checks.as_size(v, f"merge_pieces: piece {i}") for v in p])
    arr = ffi.new("ferry_copy_piece[]", max(len(rows), 1))
    for a, (so, do, size) in zip(arr, rows):
        a.src_offset, a.dst_offset, a.size = so, do, size
    n = ffi.new("size_t *", len(rows))
    gaps = ffi.new("uint64_t *")
    check(lib.ferry_copy_pieces_merge(m, arr, n, gaps))
    return [Piece(int(p.src_offset), int(p.dst_offset), int(p.size)) for p in arr[0:n[0]]], int(gaps[0])
