"""Copy2D: the Python type of ferry_copy_2d, the 2-D copy that plans and the ranges rule are made of."""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple, Sequence, Tuple

from . import _checks
from ._binding import ffi
from .errors import InvalidArgumentError


class Copy2D(NamedTuple):
    """One 2-D copy (ferry_copy_2d): count rows of size bytes, row i at offset + i*stride.

    What offset is counted from depends on who made it: a plan's offsets are from the first
    byte of the view's source (its root), copy_ranges_of's from the tensor's own first byte.

    Attributes
    ----------
    offset : int
        Bytes to the first row.
    size : int
        Bytes per row.
    count : int
        Rows.
    stride : int
        Bytes from one row's start to the next.
    """

    offset: int
    size: int
    count: int  # type: ignore[assignment]  # the field hides tuple.count, as ferry_copy_2d names it
    stride: int

    @property
    def nbytes(self) -> int:
        """Bytes this copy moves: size * count."""
        return self.size * self.count

    @property
    def end(self) -> int:
        """One past the last byte it moves."""
        return self.offset + (self.count - 1) * self.stride + self.size if self.count else self.offset

    @classmethod
    def from_c(cls, c: Any) -> "Copy2D":
        """A Copy2D holding the values of the ferry_copy_2d cdata c."""
        return cls(int(c.offset), int(c.size), int(c.count), int(c.stride))


def to_c(copies: Iterable[Sequence[int]], what: str) -> Tuple[Any, int]:
    """A ferry_copy_2d array for C.

    Parameters
    ----------
    copies : iterable of Copy2D or of (offset, size, count, stride)
    what : str
        The caller's name, for messages.

    Returns
    -------
    (cdata ferry_copy_2d[], int)
        The array (at least one element, for C's sake) and the number of copies in it.

    Raises
    ------
    InvalidArgumentError
        For anything but 4-number rows, or numbers that are not sizes.
    """
    if isinstance(copies, (str, bytes)) or not hasattr(copies, "__iter__"):
        raise InvalidArgumentError(f"{what}: expected a list of copies (offset, size, count, stride), got {copies!r}")
    rows = []
    for i, c in enumerate(copies):
        if isinstance(c, (str, bytes)) or not hasattr(c, "__len__") or len(c) != 4:
            raise InvalidArgumentError(f"{what}: copy {i} is not (offset, size, count, stride): {c!r}")
        rows.append([_checks.as_size(v, f"{what}: copy {i}") for v in c])
    arr = ffi.new("ferry_copy_2d[]", max(len(rows), 1))
    for a, (off, size, count, stride) in zip(arr, rows):
        a.offset, a.size, a.count, a.stride = off, size, count, stride
    return arr, len(rows)
