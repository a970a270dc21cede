"""Copy policies: how the scheduler copies a split input to the backend that runs the split.

flat copies the whole nbytes() span, gaps included; ranges copies a source whose last
dimension is evenly spaced dense ranges as those ranges (one 2-D set from host memory; staged
through the host from another device), else flat; plan copies any view
by its copy plan when the cost model says that beats flat; ragged copies a window that carries
its streams' used lengths (Tensor.set_used_cells; KVCache.window(lengths=...); every window of
attention_step) as each stream's used cells and nothing after them, and any other view by its
copy plan whether or not that beats flat. The destination's gap bytes are never written.

A paged window (ferry.paged) is gathered whatever the policy: its cells lie in the blocks of its
sequences' tables, and how it is gathered is its cache's GatherMethod: auto (the cheapest the
split's backend offers, by its cost model), per_block (a copy per block, the baseline serving
systems use), runs (a copy per run of adjacent blocks), batched (every run in one call), kernel
(a gather kernel reading pinned host memory, CUDA).
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


class GatherMethod(enum.IntEnum):
    """A ferry_gather_method: how a paged window is gathered; str() gives its name ("runs")."""

    AUTO = lib.FERRY_GATHER_AUTO
    PER_BLOCK = lib.FERRY_GATHER_PER_BLOCK
    RUNS = lib.FERRY_GATHER_RUNS
    BATCHED = lib.FERRY_GATHER_BATCHED
    KERNEL = lib.FERRY_GATHER_KERNEL
    MERGED = lib.FERRY_GATHER_MERGED

    def __str__(self) -> str:
        return ffi.string(lib.ferry_gather_method_name(self.value)).decode()


GatherLike = Union[GatherMethod, str]


def to_gather_method(value: object, what: str = "gather method") -> GatherMethod:
    """The GatherMethod named by value (itself, or "auto", "per_block", "runs", "batched", "kernel",
    "merged").

    Parameters
    ----------
    value : GatherMethod or str
    what : str, optional
        What the caller calls the argument, for the message.

    Returns
    -------
    GatherMethod

    Raises
    ------
    InvalidArgumentError
        For anything else, naming what.
    """
    if isinstance(value, GatherMethod):
        return value
    if isinstance(value, str):
        try:
            return _checks.from_c_name(GatherMethod, "ferry_gather_method", lib.ferry_gather_method_from_name, value)
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"{what}: {e.message}") from None
    raise InvalidArgumentError(f"{what}: expected a name (auto, per_block, runs, batched, kernel, merged) or a "
                               f"GatherMethod, got {value!r}")


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
