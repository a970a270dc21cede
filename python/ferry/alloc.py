"""The graph allocator: places a graph's tensors in buffers it owns, reusing memory as ggml's gallocr does.

Tensors it places hold one of its buffers (a BorrowedBuffer), which holds the
allocator: the memory lives as long as any of them. close() frees it now; after that
those tensors raise FreedBufferError (C refuses them too: their buffer id is dead).
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Union

from . import _checks
from ._binding import ffi, lib
from ._handle import Closeable, Handle, holding
from ._placements import adopt_placements
from .backend import Backend
from .buffer import BorrowedBuffer, BufferType
from .errors import InvalidArgumentError, check
from .graph import Graph
from .tensor import Tensor


class Slot(NamedTuple):
    """Where a GraphAllocator put a tensor (GraphAllocator.slot): a buffer type's chunk and the bytes in it.

    Attributes
    ----------
    buffer_type : int
        Index of the buffer type in the allocator's buffer_types.
    chunk : int
        Index of the chunk (one buffer) of that type.
    offset : int
        Bytes from the chunk's start.
    size : int
        Bytes taken (the buffer type's alloc_size of the tensor).
    """

    buffer_type: int
    chunk: int
    offset: int
    size: int


def _buffer_type(x: object, i: int) -> BufferType:
    if isinstance(x, Backend):
        return x.buffer_type
    if isinstance(x, BufferType):
        return x
    raise InvalidArgumentError(f"graph allocator: item {i} is not a Backend or BufferType but {type(x).__name__}")


class GraphAllocator(Closeable):
    """Places graphs' tensors in buffers it owns, reusing memory as ggml's gallocr does.

    With one buffer type every tensor goes there. With several, reserve() says which type each
    node and leaf uses (indices into buffer_types) and alloc() reuses that assignment. Inputs
    (leafs, tensors flagged input) are freed after their last use, so set them before each
    compute.

    Parameters
    ----------
    *types : Backend or BufferType, or one sequence of them
        The buffer types (a Backend stands for its default one).
    keep_inputs : bool, optional
        Keep inputs to the end of the graph, to read them after compute.

    Raises
    ------
    InvalidArgumentError
        For no types, anything but Backends and BufferTypes, or a keep_inputs that is not a bool.
    """

    def __init__(self, *types: Union[Backend, BufferType], keep_inputs: bool = False) -> None:
        if len(types) == 1 and isinstance(types[0], (list, tuple)):
            types = tuple(types[0])
        if not types:
            raise InvalidArgumentError("graph allocator: needs at least one Backend or BufferType")
        self._types: List[BufferType] = [_buffer_type(x, i) for i, x in enumerate(types)]
        arr = ffi.new("ferry_buffer_type *[]", [bt._ptr for bt in self._types])
        out = ffi.new("ferry_gallocr **")
        if not isinstance(keep_inputs, bool):
            raise InvalidArgumentError(f"keep_inputs: expected a bool, got {type(keep_inputs).__name__}")
        check(lib.ferry_gallocr_new_n(arr, len(self._types), out))
        parents = [bt._backend._handle for bt in self._types if bt._backend is not None]
        self._handle = Handle(out[0], lib.ferry_gallocr_free, parents)
        check(lib.ferry_gallocr_set_keep_inputs(out[0], keep_inputs))
        self._finalizer = weakref.finalize(self, self._handle.release)
        self._chunks: Dict[int, BorrowedBuffer] = {}
        self._graph: Optional[Graph] = None  # C remembers the last graph's tensors by address

    def _after_close(self) -> None:
        self._chunks.clear()
        self._graph = None

    def _ids(self, ids: Optional[Sequence[int]], n: int, what: str) -> Any:
        if ids is None:
            return ffi.NULL
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__") or len(ids) != n:
            raise InvalidArgumentError(f"reserve: {what} needs {n} buffer type indices, got {ids!r}")
        vals = [_checks.as_c_int(v, f"reserve: {what}[{i}]") for i, v in enumerate(ids)]
        for i, v in enumerate(vals):
            if not 0 <= v < len(self._types):
                raise InvalidArgumentError(f"reserve: {what}[{i}] = {v} is not a buffer type index "
                                           f"(0..{len(self._types) - 1})")
        return ffi.new("int[]", vals)

    @holding
    def reserve(self, graph: Graph, node_types: Optional[Sequence[int]] = None,
                leaf_types: Optional[Sequence[int]] = None) -> None:
        """Measure a graph and make the buffers big enough for it.

        Parameters
        ----------
        graph : Graph
        node_types, leaf_types : sequence of int, optional
            The buffer type index of each node / leaf (None: all 0).

        Raises
        ------
        InvalidArgumentError
            For anything but a Graph, or indices that do not match the graph or the buffer types.
        """
        g = _checks.instance(graph, Graph, "reserve")
        nodes = self._ids(node_types, g.n_nodes, "node_types")
        leafs = self._ids(leaf_types, g.n_leafs, "leaf_types")
        check(lib.ferry_gallocr_reserve(self._p, g._p, nodes, leafs))
        self._graph = g

    @holding
    def alloc(self, graph: Graph) -> None:
        """Place every tensor of the Graph graph that has no memory yet, growing the buffers if needed
        (OutOfMemoryError when one cannot grow).
        """
        g = _checks.instance(graph, Graph, "alloc")
        check(lib.ferry_gallocr_alloc_graph(self._p, g._p))
        self._graph = g
        adopt_placements(g._tensors.values(), self, self._handle, self._types, self._chunks)

    @property
    def buffer_types(self) -> List[BufferType]:
        """The buffer types, in the order reserve()'s indices count them."""
        return list(self._types)

    @holding
    def buffer_size(self, buffer_type: int = 0) -> int:
        """Bytes over all chunks of the buffer type at index buffer_type."""
        return int(lib.ferry_gallocr_buffer_size(self._p, self._index(buffer_type)))

    @holding
    def n_chunks(self, buffer_type: int = 0) -> int:
        """Chunks (buffers) of the buffer type at index buffer_type."""
        return int(lib.ferry_gallocr_n_chunks(self._p, self._index(buffer_type)))

    @holding
    def chunks(self, buffer_type: int = 0) -> List[BorrowedBuffer]:
        """The BorrowedBuffers of the buffer type at index buffer_type, each usable while this allocator
        keeps it.
        """
        b = self._index(buffer_type)
        out = []
        for c in range(self.n_chunks(b)):
            ptr = lib.ferry_gallocr_chunk_buffer(self._p, b, c)
            if ptr == ffi.NULL:
                continue
            bid = int(lib.ferry_buffer_id(ptr))
            if bid not in self._chunks:
                self._chunks[bid] = BorrowedBuffer(ptr, self._types[b], self, self._handle)
            out.append(self._chunks[bid])
        return out

    @holding
    def slot(self, tensor: Tensor) -> Optional[Slot]:
        """Where the last measured graph put a tensor.

        Parameters
        ----------
        tensor : Tensor
            A node or leaf of that graph.

        Returns
        -------
        Slot or None
            None for views and tensors it left alone.
        """
        t = _checks.instance(tensor, Tensor, "slot")
        vals = ffi.new("int[2]")
        sizes = ffi.new("size_t[2]")
        st = lib.ferry_gallocr_tensor_placement(self._p, t._p, vals, vals + 1, sizes, sizes + 1)
        if st == lib.FERRY_ERR_NOT_ALLOCATED:
            lib.ferry_clear_error()
            return None
        check(st)
        return Slot(int(vals[0]), int(vals[1]), int(sizes[0]), int(sizes[1]))

    def _index(self, buffer_type: int) -> int:
        i = _checks.as_c_int(buffer_type, "buffer type index")
        if not 0 <= i < len(self._types):
            raise InvalidArgumentError(f"buffer type index {i} is not in 0..{len(self._types) - 1}")
        return i

    def __repr__(self) -> str:
        if self.closed:
            return "<GraphAllocator closed>"
        sizes = ", ".join(f"{bt.name}: {self.buffer_size(i)} B" for i, bt in enumerate(self._types))
        return f"<GraphAllocator {sizes}>"
