"""Paged plans: how a paged window's gather goes into a backend, as the copy path would make it now.

plan_paged says it as a PagedPlan: its blocks, runs, calls and bytes, the method taken and each
method's predicted time, and the method's copies (GatherCopy rows, ferry_copy_paged_plan).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, NamedTuple, Optional, Tuple

from . import _checks
from ._binding import ffi, lib
from .backend import Backend
from .errors import check
from .policy import GatherMethod
from .tensor import Tensor


class GatherCopy(NamedTuple):
    """One copy of a paged window's gather (ferry_gather_copy): count rows of size bytes from
    src_offset of the pool (rows src_stride apart) to dst_offset of the dense window (rows
    dst_stride apart).

    Attributes
    ----------
    src_offset : int
        Bytes from the pool tensor's first byte to the first row read.
    dst_offset : int
        Bytes from the dense window's first byte to where it lands.
    size : int
        Bytes per row.
    count : int
        Rows (1: a plain copy).
    src_stride, dst_stride : int
        Bytes from one row's start to the next, in the pool and in the window.
    """

    src_offset: int
    dst_offset: int
    size: int
    count: int  # type: ignore[assignment]  # the field hides tuple.count, as ferry_gather_copy names it
    src_stride: int
    dst_stride: int


@dataclass(frozen=True)
class PagedPlan:
    """How a paged window is gathered into a backend (ferry_copy_paged_plan): plan_paged's result.

    Attributes
    ----------
    method : GatherMethod
        The method taken: the cache's, or under auto the cheapest the backend offers.
    blocks : int
        Blocks read (a partly used last block included).
    runs : int
        Runs of blocks adjacent in the pool, in table order.
    calls : int
        Transfer calls, as the buffers count them (batched and kernel: 1).
    bytes : int
        Bytes moved into the window: exactly the cells read.
    seconds : float
        The prediction of the backend's cost model.
    method_seconds : dict of str to float
        Each method's prediction by name (per_block, runs, batched, kernel, merged; auto: the
        cheapest offered); None where the backend does not offer it.
    copies : tuple of GatherCopy
        The method's copies: per block, per run (equal runs at even strides as one 2-D copy), the
        pieces its one call carries, or merged's spans (dst_offset into the staging area they land
        in, one after another).
    crossed_bytes : int
        Bytes that cross the link: bytes, and a merged gather's gaps too (crossed, never read).
    spans : int
        A merged gather's spans of the pool; 0 for the other methods.
    """

    method: GatherMethod
    blocks: int
    runs: int
    calls: int
    bytes: int
    seconds: float
    method_seconds: Dict[str, Optional[float]]
    copies: Tuple[GatherCopy, ...]
    crossed_bytes: int = 0
    spans: int = 0


def plan_paged(window: Tensor, backend: Backend) -> PagedPlan:
    """The gather of a paged window (ferry.paged.PagedKVCache.window) into a backend, as the copy path
    would make it now: its lengths and tables read now, the method its cache is set to.

    Parameters
    ----------
    window : Tensor
        A paged window.
    backend : Backend
        The split's backend: its cost model and the methods it offers for the pool's memory.

    Returns
    -------
    PagedPlan

    Raises
    ------
    InvalidArgumentError
        For a tensor that is not a paged window, anything but a Backend, or lengths not in host memory.
    OutOfBoundsError
        For a length outside 0..the window's limit, or a table shorter than its sequence's length
        (naming the sequence and the block).
    UnsupportedError
        For a method the backend does not offer for the pool (the cache's gather forced).
    """
    t = _checks.instance(window, Tensor, "plan_paged: window")
    b = _checks.instance(backend, Backend, "plan_paged: backend")
    plan = ffi.new("ferry_paged_plan *")
    n = ffi.new("size_t *")
    check(lib.ferry_copy_paged_plan(t._p, b._p, plan, ffi.NULL, 0, n))
    copies = ffi.new("ferry_gather_copy[]", max(n[0], 1))
    check(lib.ferry_copy_paged_plan(t._p, b._p, plan, copies, n[0], n))
    seconds = {str(m): (float(plan.method_seconds[m]) if plan.method_seconds[m] >= 0 else None)
               for m in GatherMethod}
    return PagedPlan(GatherMethod(plan.method), int(plan.blocks), int(plan.runs), int(plan.calls), int(plan.bytes),
                     float(plan.seconds), seconds,
                     tuple(GatherCopy(int(c.src_offset), int(c.dst_offset), int(c.size), int(c.count),
                                      int(c.src_stride), int(c.dst_stride)) for c in copies[0:n[0]]),
                     int(plan.crossed_bytes), int(plan.spans))
