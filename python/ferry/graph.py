"""Graphs: the tensors an output depends on, in the order a backend computes them.

A Graph holds every Tensor it lists (the C graph only points at them), so nothing in
it can be freed while the graph lives. Leafs are tensors with data of their own (op
NONE); nodes are the rest, views included.
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _checks
from ._binding import ffi, lib, query
from ._handle import Handle, Hold
from .backend import Backend
from .errors import FreedBufferError, InvalidArgumentError, check
from .tensor import Tensor

#: What Graph and build take per argument: an output, or a list (or tuple) of them, such as the
#: StepOutputs attention_step returns.
Outputs = Union[Tensor, Sequence[Tensor]]


class Graph:
    """Graph(out1, out2, ...): everything the outputs depend on, topologically ordered.

    build() adds more outputs (tensors already in the graph are not added twice).
    compute(backend) runs the nodes on one backend; every tensor must have memory the
    backend can use (place them with a GraphAllocator, or run through a Scheduler).

    Parameters
    ----------
    *outputs : Tensor, or list or tuple of Tensor
        The outputs, in order; a list stands for its tensors (Graph(attention_step(...)) is the
        graph of a step's outputs; its StepOutputs.graph is the one the step built already).

    Raises
    ------
    InvalidArgumentError
        For an output that is neither a Tensor nor a list or tuple of Tensors (naming it).
    """

    def __init__(self, *outputs: Outputs) -> None:
        out = ffi.new("ferry_graph **")
        check(lib.ferry_graph_new(out))
        self._handle = Handle(out[0], lib.ferry_graph_free)
        self._finalizer = weakref.finalize(self, self._handle.release)
        self._outputs: List[Tensor] = []
        self._tensors: Dict[Any, Tensor] = {}  # by C pointer: every tensor the graph points at
        # The handles of borrowed tensors (a KV cache's layers), each with its owner: checked before a reuse.
        self._owners: Dict[int, Tuple[Handle, object]] = {}
        self._unindexed = False  # True while _tensors holds only the outputs (_built)
        self._memory: Optional[Tuple[Handle, ...]] = None  # _memory_handles, found once per build
        self.build(*outputs)

    @classmethod
    def _built(cls, handle: Handle, outputs: List[Tensor], owners: Sequence[Tuple[Handle, object]]) -> "Graph":
        """Internal: a graph C built already (ferry_kv_attention_step), over handle, with its outputs
        in order and the owners its borrowed tensors belong to (checked before a reuse). Only the
        outputs are indexed now (they are all the scheduler places); the rest, when first asked
        for (_complete), so a step pays for no Python object it never looks at."""
        g = cls.__new__(cls)
        g._handle = handle
        g._finalizer = weakref.finalize(g, handle.release)
        g._outputs = outputs
        g._tensors = {t._ptr: t for t in outputs}
        g._owners = {id(h): (h, owner) for h, owner in owners}
        g._unindexed = True
        g._memory = None
        return g

    def _complete(self) -> None:
        """Index what a graph made by _built has beyond its outputs."""
        if self._unindexed:
            self._unindexed = False
            self._tensors.clear()  # the outputs are indexed again, with what they read
            for t in self._outputs:
                self._index(t)

    @property
    def _p(self) -> Any:
        return self._handle.ptr

    def build(self, *outputs: Outputs) -> "Graph":
        """Add each output and what it depends on. Returns self.

        Parameters
        ----------
        *outputs : Tensor, or list or tuple of Tensor
            As Graph takes them.

        Returns
        -------
        Graph
            self.

        Raises
        ------
        InvalidArgumentError
            For an output that is neither a Tensor nor a list or tuple of Tensors (naming it).
        """
        flat: List[Tensor] = []
        for i, out in enumerate(outputs):
            if isinstance(out, (list, tuple)):
                flat.extend(_checks.instance(t, Tensor, f"graph build: output {i}[{j}]") for j, t in enumerate(out))
            elif not isinstance(out, Tensor):
                raise InvalidArgumentError(f"graph build: output {i}: expected a Tensor or a list of Tensors, got "
                                           f"{type(out).__name__}")
            else:
                flat.append(out)
        for t in flat:
            t._check_retainable()
        self._complete()
        self._memory = None
        for t in flat:
            check(lib.ferry_graph_build(self._p, t._p))
            self._outputs.append(t)
            self._index(t)
        return self

    def _index(self, out: Tensor) -> None:
        """Map every C tensor reachable from out to a Python Tensor: the ones Python made, and
        borrowed wrappers (kept alive by the tensor that points at them) for structs made in C,
        like the inner view of a KV-cache window. Keys are the C pointers themselves (cffi hashes
        and compares a pointer by its address)."""
        tensors = self._tensors
        found: List[Tensor] = []
        known: Dict[int, object] = {}

        def walk(stack: List[Tensor]) -> None:
            while stack:
                t = stack.pop()
                key = t._p  # refused for a tensor whose owner was closed
                if key in tensors:
                    continue
                tensors[key] = t
                found.append(t)
                for d in t._deps:
                    if isinstance(d, Tensor):
                        stack.append(d)
                    elif t._finalizer is None and id(d) not in known and hasattr(d, "_known_tensors"):
                        known[id(d)] = d  # a step's owner: it knows the Python objects of what its nodes read
                        stack.extend(d._known_tensors())
                if t._source is not None:
                    stack.append(t._source)

        walk([out])
        # C sources no Python object stands for. An op made in Python (a tensor of its own, with
        # operands) reads exactly its operands, all found above: only the others are looked at.
        i = 0
        while i < len(found):
            t = found[i]
            i += 1
            if t._deps and t._finalizer is not None:
                continue
            for src in t._ptr.src:
                if not src or src in tensors:  # NULL is false
                    continue
                view_src = src.view_src
                root = tensors.get(view_src) if view_src else None
                b = Tensor._borrow(src, t._handle, keep=t, source=root)
                tensors[src] = b
                found.append(b)
        for t in found:
            if t._finalizer is None and not isinstance(t._deps[0], Tensor):  # borrowed from a cache, ...
                self._owners.setdefault(id(t._handle), (t._handle, t._deps[0]))

    def _memory_handles(self) -> Tuple[Handle, ...]:
        """The handles of the memory a run reads and writes: each tensor's buffer (its own, or the
        owner's for a cache's or scheduler's), found once per build; for a step C built, from the
        tensors its owner knows (queries, kv_len, the cache's layers) without indexing the rest."""
        if self._memory is None:
            tensors = list(self._tensors.values())
            for t in self._outputs:
                owner = t._deps[0] if t._finalizer is None and t._deps else None
                if hasattr(owner, "_known_tensors"):
                    tensors.extend(owner._known_tensors())  # type: ignore[union-attr]
            found = {}
            for t in tensors:
                buf = t.root._buffer
                if buf is not None:
                    found[id(buf._handle)] = buf._handle
            self._memory = tuple(found.values())
        return self._memory

    def _hold(self, also: Sequence[Handle] = ()) -> Hold:
        """A Hold of the graph's memory (_memory_handles) and of also (the backend or scheduler that
        runs it), for the run: a buffer closed from another thread meanwhile is freed once it returns."""
        return Hold(self._memory_handles() + tuple(also))

    def _check_live(self) -> None:
        """Raise FreedBufferError when an object that owns one of the graph's tensors was closed
        (a KV cache whose layers a window reads): before a graph built earlier runs again."""
        for handle, owner in self._owners.values():
            if not handle.alive:
                raise FreedBufferError(f"graph: a tensor of it belongs to {type(owner).__name__}, which was "
                                       "closed; build the graph again")

    def _tensor(self, ptr: Any) -> Tensor:
        t = self._tensors.get(ptr)
        if t is None:
            self._complete()
            t = self._tensors[ptr]
        return t

    n_nodes = query(lib.ferry_graph_n_nodes, int, "Nodes (ops and views).")
    n_leafs = query(lib.ferry_graph_n_leafs, int, "Leafs (tensors with data of their own).")

    @property
    def nodes(self) -> List[Tensor]:
        """The nodes (ops and views) in the order they are computed."""
        return [self._tensor(lib.ferry_graph_node(self._p, i)) for i in range(self.n_nodes)]

    @property
    def leafs(self) -> List[Tensor]:
        """Tensors with data of their own (op NONE)."""
        return [self._tensor(lib.ferry_graph_leaf(self._p, i)) for i in range(self.n_leafs)]

    @property
    def outputs(self) -> List[Tensor]:
        """The tensors build() was given, in order."""
        return list(self._outputs)

    @property
    def tensors(self) -> List[Tensor]:
        """Leafs then nodes."""
        return self.leafs + self.nodes

    def __contains__(self, t: object) -> bool:
        if not isinstance(t, Tensor) or not t._handle.alive:
            return False
        self._complete()
        return self._tensors.get(t._ptr) is t

    def __len__(self) -> int:
        return self.n_nodes

    def __iter__(self) -> Iterator[Tensor]:
        return iter(self.nodes)

    def compute(self, backend: Backend) -> None:
        """Run every node on one backend, then wait for it.

        Parameters
        ----------
        backend : Backend
            Every tensor must have memory it can use.

        Raises
        ------
        InvalidArgumentError
            For anything but a Backend.
        FreedBufferError
            When an object that owns a tensor of the graph (a KV cache its windows read) was closed.
        FerryError
            When an op fails or a tensor has no usable memory.
        """
        _checks.instance(backend, Backend, "graph compute")
        self._check_live()
        with self._hold((backend._handle,)):
            check(lib.ferry_backend_graph_compute(backend._p, self._p))
            backend.synchronize()

    def __repr__(self) -> str:
        return f"<Graph {self.n_leafs} leafs {self.n_nodes} nodes>"
