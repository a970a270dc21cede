"""After an allocator placed tensors in C, give their Python objects a Buffer that holds the allocator.

C sets data, buffer and buffer_id; Python only learns of it here. Every tensor placed
from Python or by a KV cache already has a Buffer whose id matches; a root whose C
buffer id does not match its Python Buffer was placed by the allocator that just ran.
"""

from __future__ import annotations

from typing import Dict, Iterable, Sequence

from ._binding import ffi, lib
from ._handle import Handle
from .buffer import BorrowedBuffer, BufferType, buffer_type_of
from .tensor import Tensor


def adopt_placements(tensors: Iterable[Tensor], owner: object, owner_handle: Handle,
                     known: Sequence[BufferType], cache: Dict[int, BorrowedBuffer]) -> None:
    """Set tensor._buffer for each root tensor the owner placed; cache maps buffer ids to wrappers."""
    for dead in [i for i in cache if not lib.ferry_buffer_id_is_live(i)]:
        del cache[dead]  # chunks the allocator replaced
    for t in tensors:
        if t._source is not None or not t._handle.alive:
            continue  # views follow their root
        p = t._ptr
        if p.buffer == ffi.NULL or p.view_src != ffi.NULL:
            continue
        bid = p.buffer_id
        if t._buffer is not None and t._buffer._id == bid:
            continue  # placed before, in the buffer it knows
        if not lib.ferry_buffer_id_is_live(bid):
            continue
        bid = int(bid)
        buf = cache.get(bid)
        if buf is None:
            buf = BorrowedBuffer(p.buffer, buffer_type_of(p.buffer, known), owner, owner_handle)
            cache[bid] = buf
        t._buffer = buf
