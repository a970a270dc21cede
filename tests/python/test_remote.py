"""The remote tier (ferry.remote): a cache's layers in a server process, read through Mooncake's
transfer engine over TCP on the loopback, each window as the pieces of ferry's own plan.

The pieces (ferry.plan.copy_pieces, gather_pieces, merge_pieces) need no engine; the tier's tests
skip, saying why, where the engine cannot be imported (CI installs it: README's test command).
Each pull is checked against the same cache held locally: the bytes the copy path delivers from
the local window under the same policy, byte for byte, the pieces the plan's rows (or, paged, its
runs) and the bytes the cells read. Faults: a server killed at random points of a run of steps
(fixed seeds), a stopped server (the timeout), a registration refused: each refused pull names the
peer and the layer and writes nothing, and the pull after reconnect() is right again.
"""

from __future__ import annotations

import pytest

import ferry
from ferry.plan import CopyCostModel, Piece, copy_pieces, gather_pieces, merge_pieces

# ------------------------------------------------------------ pieces (C, no engine)


def test_pieces_are_the_rows_of_the_copies_and_merge_by_the_model() -> None:
    """A piece per row, at its own offsets; merging joins touching pieces always, a gap only when
    the same in source and destination and cheaper than a piece, and counts the gap bytes."""
    assert copy_pieces([(10, 4, 3, 100)]) == [Piece(10, 10, 4), Piece(110, 110, 4), Piece(210, 210, 4)]
    assert gather_pieces([(500, 0, 8, 2, 64, 8)]) == [Piece(500, 0, 8), Piece(564, 8, 8)]
    assert copy_pieces([]) == []
    # a piece costs 1 us; a byte 1 ns (1 GB/s): gaps under 1000 bytes merge
    m = CopyCostModel(0.0, 0.0, 1.0, 0, 0, 1.0, 0, 0.0, piece_ns=1000.0)
    pieces = [Piece(0, 0, 10), Piece(10, 10, 10), Piece(500, 500, 10), Piece(5000, 5000, 10), Piece(5100, 7000, 10)]
    got, gaps = merge_pieces(pieces, m)
    assert got == [Piece(0, 0, 510), Piece(5000, 5000, 10), Piece(5100, 7000, 10)] and gaps == 480
    free = CopyCostModel(0.0, 0.0, 1.0, 0, 0, 1.0, 0, 0.0, piece_ns=0.0)
    assert merge_pieces(pieces, free) == ([Piece(0, 0, 20)] + pieces[2:], 0)
    with pytest.raises(ferry.InvalidArgumentError, match="piece 0 is not"):
        merge_pieces([(1, 2)], m)
    with pytest.raises(ferry.OutOfBoundsError, match="overflows"):
        copy_pieces([(2**64 - 8, 4, 2, 4)])
