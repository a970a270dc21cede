"""How a split input reaches the backend that runs the split: the ranges rule, the bytes a view
reads, and the scheduler's copy of one input by a copy policy (see ferry.policy).
"""

from __future__ import annotations

from typing import Optional

from . import _checks
from ._binding import ffi, lib
from .backend import Backend
from .copy2d import Copy2D
from .errors import check
from .policy import PolicyLike, to_policy
from .stats import CopyStats
from .tensor import Tensor


def copy_ranges_of(tensor: Tensor) -> Optional[Copy2D]:
    """The ranges policy's rule on layout alone: dimensions 0..2 one dense range repeated along
    dimension 3 at a stride no smaller than it.

    Parameters
    ----------
    tensor : Tensor

    Returns
    -------
    Copy2D or None
        The one 2-D copy, offsets from the tensor's own first byte; None when the rule does not apply.
    """
    t = _checks.instance(tensor, Tensor, "copy_ranges_of")
    out = ffi.new("ferry_copy_2d *")
    if not lib.ferry_copy_ranges_of(t._p, out):
        return None
    return Copy2D.from_c(out)


def bytes_read(tensor: Tensor) -> int:
    """Bytes a graph reads through the Tensor tensor: the distinct bytes of its elements (blocks whole),
    by its layout alone; a copy's CopyStats.bytes_read counts a window's lengths instead, where it
    carries them."""
    return int(lib.ferry_tensor_bytes_read(_checks.instance(tensor, Tensor, "bytes_read")._p))


def copy_input(split_backend: Backend, policy: PolicyLike, src: Tensor, dst: Tensor) -> CopyStats:
    """The scheduler's ordered copy of one input, blocking, with the split backend synchronized
    before and after.

    Parameters
    ----------
    split_backend : Backend
        The backend that runs the split (dst's).
    policy : CopyPolicy or str
    src, dst : Tensor
        Same type, ne and nb.

    Returns
    -------
    CopyStats
        What the copy did.

    Raises
    ------
    InvalidArgumentError
        For arguments of the wrong kind or an unknown policy.
    LayoutError
        When the layouts differ.
    """
    _checks.instance(split_backend, Backend, "copy_input")
    pol = to_policy(policy)
    s, d = _checks.instance(src, Tensor, "copy_input: src"), _checks.instance(dst, Tensor, "copy_input: dst")
    out = ffi.new("ferry_copy_stats *")
    check(lib.ferry_copy_input(split_backend._p, pol.value, s._p, d._p, out))
    return CopyStats.from_c(out)

