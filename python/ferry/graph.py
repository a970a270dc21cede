"""Graphs: the tensors an output depends on, in the order a backend computes them.

A Graph holds every Tensor it lists (the C graph only points at them), so nothing in
it can be freed while the graph lives. Leafs are tensors with data of their own (op
NONE); nodes are the rest, views included.
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, Iterator, List

from . import _checks
from ._binding import ffi, lib
from ._handle import Handle
from .backend import Backend
from .errors import check
from .tensor import Tensor

_MAX_SRC = lib.FERRY_MAX_SRC


def _addr(ptr: Any) -> int:
    return int(ffi.cast("uintptr_t", ptr))


class Graph:
    """Graph(out1, out2, ...): everything the outputs depend on, topologically ordered.

    build() adds more outputs (tensors already in the graph are not added twice).
    compute(backend) runs the nodes on one backend; every tensor must have memory the
    backend can use (place them with a GraphAllocator, or run through a Scheduler).
    """

    def __init__(self, *outputs: Tensor) -> None:
        out = ffi.new("ferry_graph **")
        check(lib.ferry_graph_new(out))
        self._handle = Handle(out[0], lib.ferry_graph_free)
        self._finalizer = weakref.finalize(self, self._handle.release)
        self._outputs: List[Tensor] = []
        self._tensors: Dict[int, Tensor] = {}  # by C address: every tensor the graph points at
        self.build(*outputs)

    @property
    def _p(self) -> Any:
        return self._handle.ptr

    def build(self, *outputs: Tensor) -> "Graph":
        """Add each output and what it depends on. Returns self."""
        for i, t in enumerate(outputs):
            _checks.instance(t, Tensor, f"graph build: output {i}")._check_retainable()
        for t in outputs:
            check(lib.ferry_graph_build(self._p, t._p))
            self._outputs.append(t)
            self._index(t)
        return self

    def _index(self, out: Tensor) -> None:
        """Map every C tensor reachable from out to a Python Tensor: the ones Python made, and
        borrowed wrappers (kept alive by the tensor that points at them) for structs made in C,
        like the inner view of a KV-cache window."""
        stack = [out]
        found: List[Tensor] = []
        while stack:
            t = stack.pop()
            key = _addr(t._p)
            if key in self._tensors:
                continue
            self._tensors[key] = t
            found.append(t)
            stack.extend(d for d in t._deps if isinstance(d, Tensor))
            if t._source is not None:
                stack.append(t._source)
        # C sources no Python object stands for
        i = 0
        while i < len(found):
            t = found[i]
            i += 1
            for j in range(_MAX_SRC):
                src = t._p.src[j]
                if src == ffi.NULL or _addr(src) in self._tensors:
                    continue
                view_src = src.view_src
                root = self._tensors.get(_addr(view_src)) if view_src != ffi.NULL else None
                b = Tensor._borrow(src, t._handle, keep=t, source=root)
                self._tensors[_addr(src)] = b
                found.append(b)

    def _tensor(self, ptr: Any) -> Tensor:
        return self._tensors[_addr(ptr)]

    @property
    def n_nodes(self) -> int:
        """Nodes (ops and views)."""
        return int(lib.ferry_graph_n_nodes(self._p))

    @property
    def n_leafs(self) -> int:
        """Leafs (tensors with data of their own)."""
        return int(lib.ferry_graph_n_leafs(self._p))

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
        return isinstance(t, Tensor) and t._handle.alive and self._tensors.get(_addr(t._ptr)) is t

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
        FerryError
            When an op fails or a tensor has no usable memory.
        """
        _checks.instance(backend, Backend, "graph compute")
        check(lib.ferry_backend_graph_compute(backend._p, self._p))
        backend.synchronize()

    def __repr__(self) -> str:
        return f"<Graph {self.n_leafs} leafs {self.n_nodes} nodes>"
