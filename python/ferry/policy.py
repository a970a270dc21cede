"""Copy policies: how the scheduler copies a split input to the backend that runs the split.

flat copies the whole nbytes() span, gaps included; ranges copies a source whose last
dimension is evenly spaced dense ranges as those ranges (one 2-D set from host memory; staged
through the host from another device), else flat; plan copies any view
by its copy plan when the cost model says that beats flat; ragged copies a window that carries
its streams' used lengths (Tensor.set_used_cells; KVCache.window(lengths=...); every window of
attention_step) as each stream's used cells and nothing after them, and any other view by its
copy plan whether or not that beats flat. The destination's gap bytes are never written.
"""

from __future__ import annotations

import enum
from typing import Union

from . import _checks
from ._binding import ffi, lib
from .errors import InvalidArgumentError


class CopyPolicy(enum.IntEnum):
    """A ferry_copy_policy; str() gives its name ("ranges")."""

    FLAT = lib.FERRY_COPY_FLAT
    RANGES = lib.FERRY_COPY_RANGES
    PLAN = lib.FERRY_COPY_PLAN
    RAGGED = lib.FERRY_COPY_RAGGED

    def __str__(self) -> str:
        return ffi.string(lib.ferry_copy_policy_name(self.value)).decode()


PolicyLike = Union[CopyPolicy, str]


def to_policy(value: object) -> CopyPolicy:
    """The CopyPolicy named by value (itself, or "flat", "ranges", "plan", "ragged"); InvalidArgumentError
    for anything else.
    """
    if isinstance(value, CopyPolicy):
        return value
    if isinstance(value, str):
        return _checks.from_c_name(CopyPolicy, "ferry_copy_policy", lib.ferry_copy_policy_from_name, value)
    raise InvalidArgumentError(f"copy policy: expected a name (flat, ranges, plan, ragged) or a CopyPolicy, "
                               f"got {value!r}")
