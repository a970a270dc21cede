"""The scheduler: runs a graph split across backends and copies each split's inputs by a policy.

Each node gets a backend (the one it is assigned to, else the first in priority order that
supports its op and can use its sources' memory); consecutive nodes on one backend form a
split; a source the split's backend cannot use is an input, copied (same ne and nb) to
memory the scheduler allocates. The copies belong to the scheduler and live until its
next alloc: Input.copy Tensors raise FreedBufferError after that.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from . import _checks, fetch
from ._binding import ffi, lib
from ._handle import Closeable, Handle, holding
from ._placements import adopt_placements
from .backend import Backend
from .buffer import BorrowedBuffer
from .errors import InvalidArgumentError, check
from .graph import Graph
from .policy import CopyPolicy, PolicyLike, to_policy
from .stats import CopyStats, SchedStats
from .tensor import Tensor


@dataclass(frozen=True)
class Input:
    """A split input (Scheduler.inputs): a source the split's backend cannot read where it is, or a paged
    window (ferry.paged), which is always gathered into a dense copy.

    Attributes
    ----------
    split : int
        Index of the split that reads it (Scheduler.splits).
    src : Tensor
        What the graph reads.
    copy : Tensor
        Its copy on the split's backend, of the same layout (or src's compact layout).
    stats : CopyStats
        What its copy did in the last run.
    """

    split: int
    src: Tensor
    copy: Tensor
    stats: CopyStats


@dataclass(frozen=True)
class Split:
    """A run of consecutive nodes on one backend (Scheduler.splits).

    Attributes
    ----------
    backend : Backend
        The backend that computes them.
    first_node : int
        Index into the graph's nodes of its first node.
    n_nodes : int
        Nodes it computes (views excluded).
    inputs : list of Input
        The sources copied to its backend.
    compute_seconds : float
        Seconds its backend computed in the last run, synchronized.
    """

    backend: Backend
    first_node: int
    n_nodes: int
    inputs: List[Input]
    compute_seconds: float


#: A span's kind (Span.kind), by ferry_span_kind.
SPAN_KINDS = {lib.FERRY_SPAN_COPY: "copy", lib.FERRY_SPAN_QUEUED_COPY: "queued copy", lib.FERRY_SPAN_WAIT: "wait",
              lib.FERRY_SPAN_COMPUTE: "compute", lib.FERRY_SPAN_FETCH_WAIT: "fetch wait"}


@dataclass(frozen=True)
class Span:
    """One span of the last run's timeline (Scheduler.trace).

    Attributes
    ----------
    kind : str
        "copy" (an input copied by the calling thread, at its part), "queued copy" (an input copied
        ahead on its backend's copy queue), "wait" (the calling thread waiting for a part's queued
        copies), "compute" (a part's compute, synchronized) or "fetch wait" (the calling thread
        waiting for a remote tier's fetch of an input's window: ferry.fetch).
    part : int
        The part it belongs to (a layer's attention, in a decode step).
    input : int
        The input copied or fetched (an index into Scheduler.inputs), or -1.
    start, end : float
        Seconds from the run's start, on the host's clock; before it (negative) for a copy made for
        this run under the last one (Scheduler.prefetch_next).
    """

    kind: str
    part: int
    input: int
    start: float
    end: float


def _release(handles: List[Handle]) -> None:
    for h in handles:
        h.release()


class Scheduler(Closeable):
    """Runs a graph split across backends, copying each split's inputs by a copy policy.

    Parameters
    ----------
    backends : sequence of Backend
        In priority order (a node not pinned runs on the first that can run it).
    policy : CopyPolicy or str, optional
        How each input is copied (CopyPolicy): "flat" its whole span; "ranges" one range per
        stream of a window; "plan" the fewest 2-D copies of what it reads, where the cost model
        says they pay; "ragged" only the cells each stream holds, by the lengths a window carries
        (Tensor.set_used_cells; any other input is copied as under "plan").
    compact : bool, optional
        Input copies hold only the bytes their source reads (compact staging) where the source's
        plan is one 2-D copy: the split's memory then holds bytes read, not the span.
    keep_inputs : bool, optional
        Input copies (and leafs the scheduler places) live to the end of compute, to read them
        afterwards; by default each is placed just before its first reader and freed after its
        last use.
    prefetch : int, optional
        Copy inputs ahead of compute on their backend's copy queue, up to this many parts ahead
        of the part computing (a part: a split, or the piece of one from a node that first reads
        an input; one layer's attention in a decode step). Only inputs whose source is ready
        before the graph runs (memory of its own that no node writes: a KV window) go ahead, and
        only onto backends with a copy queue (a CUDA backend's second stream, the stand-in
        device's worker thread); each part's compute waits for its own inputs. 0 (the default):
        off, every figure and byte as without it.
    prefetch_next : bool, optional
        Prefetch across runs, for a decode loop running one graph step after step: while a run's
        last part computes, the first part's windows are copied for the next run, which then
        copies only the cells each stream gained since (a stream whose length fell: from cell 0
        again, unless truncate() said which cells it kept). Only windows carrying their streams'
        lengths (Tensor.set_used_cells, lengths in host memory), not paged ones, go ahead, and
        their copies keep their memory for the whole run. The caller's side: cells below a
        stream's length are not rewritten between two runs, or drop_ahead() is called first; a
        stream rolled back (speculative verification) says so with truncate(), and the next run
        copies it from the kept length, not from cell 0. A run returns once its copies for the
        next have landed: nothing reads the caller's memory between runs. Needs a prefetch of 1
        or more; off by default.

    close() (or a `with` block's end) frees the scheduler's copies and compute memory now; its
    Input.copy tensors and the outputs it placed raise FreedBufferError after. Closed from another
    thread while a run (or any call) is inside C, it is closed at once and freed when that returns.

    Raises
    ------
    InvalidArgumentError
        For an empty list, anything but Backends, an unknown policy, a keep_inputs or
        prefetch_next that is not a bool, a prefetch that is not an int of 0 or more, or
        prefetch_next with a prefetch of 0.

    Examples
    --------
    A copy of a 2-stream K window (3 cells of 8 bytes a stream, streams 64 bytes apart) to the
    stand-in device: flat moves the span, gap included; ranges the 48 bytes read:

    >>> import ferry
    >>> kv = ferry.KVCache("f16", "f16", head_dim=4, n_head_kv=1, n_ctx=16, n_stream=2)
    >>> k, _ = kv.window(0, 3)
    >>> out = ferry.ops.dup(k).set_output()
    >>> gpu = ferry.StandinBackend(link_gbps=8)
    >>> for policy in ("flat", "ranges"):
    ...     with ferry.Scheduler([gpu, ferry.CPUBackend()], policy=policy) as sched:
    ...         sched.assign(out, gpu)
    ...         sched.compute(ferry.Graph(out))
    ...         print(policy, sched.stats.bytes_copied, sched.stats.bytes_read)
    flat 88 48
    ranges 48 48
    """

    def __init__(self, backends: Sequence[Backend], policy: PolicyLike = "flat", compact: bool = False,
                 keep_inputs: bool = False, prefetch: int = 0, prefetch_next: bool = False) -> None:
        if isinstance(backends, Backend):
            backends = [backends]
        if isinstance(backends, (str, bytes)) or not hasattr(backends, "__len__") or len(backends) == 0:
            raise InvalidArgumentError(f"Scheduler: expected a non-empty list of backends, got {backends!r}")
        for i, b in enumerate(backends):
            if not isinstance(b, Backend):
                raise InvalidArgumentError(f"Scheduler: backend {i} is not a Backend but {type(b).__name__}")
        self._backends: List[Backend] = list(backends)
        self._buffer_types = [b.buffer_type for b in self._backends]
        arr = ffi.new("ferry_backend *[]", [b._p for b in self._backends])
        out = ffi.new("ferry_sched **")
        check(lib.ferry_sched_new(arr, len(self._backends), out))
        self._handle = Handle(out[0], lib.ferry_sched_free, [b._handle for b in self._backends])
        # The copies of the current allocation: borrowed tensors check this handle, replaced at each alloc.
        self._generation = Handle(object(), lambda _: None)
        self._handles = [self._generation, self._handle]
        self._finalizer = weakref.finalize(self, _release, self._handles)
        self._assigned: Dict[Any, Tensor] = {}  # C compares assigned tensors by address: keep them alive
        self._graph: Optional[Graph] = None
        self._copies: Dict[Any, Tensor] = {}
        self._buffers: Dict[int, BorrowedBuffer] = {}
        self.policy = policy
        self.compact = compact
        if not isinstance(keep_inputs, bool):
            raise InvalidArgumentError(f"keep_inputs: expected a bool, got {type(keep_inputs).__name__}")
        check(lib.ferry_sched_set_keep_inputs(self._p, keep_inputs))
        self.prefetch = prefetch
        self.prefetch_next = prefetch_next

    @property
    def _p(self) -> Any:
        return self._live()

    @property
    def backends(self) -> List[Backend]:
        """The backends, in priority order."""
        return list(self._backends)

    @property
    def policy(self) -> CopyPolicy:
        """The copy policy of split inputs (set with a CopyPolicy or a name). A change drops the copies
        made ahead for the next run (prefetch_next), which the next run makes by the new policy."""
        return CopyPolicy(lib.ferry_sched_get_policy(self._p))

    @policy.setter
    def policy(self, policy: PolicyLike) -> None:
        check(lib.ferry_sched_set_policy(self._p, to_policy(policy).value))

    @property
    @holding
    def compact(self) -> bool:
        """Whether input copies take the compact layout (only the bytes read)."""
        return bool(lib.ferry_sched_get_compact(self._p))

    @compact.setter
    @holding
    def compact(self, compact: bool) -> None:
        if not isinstance(compact, bool):
            raise InvalidArgumentError(f"compact: expected a bool, got {type(compact).__name__}")
        check(lib.ferry_sched_set_compact(self._p, compact))

    @property
    @holding
    def prefetch(self) -> int:
        """Parts ahead whose inputs are copied on copy queues (0: off); setting it takes effect at
        the next alloc."""
        return int(lib.ferry_sched_get_prefetch(self._p))

    @prefetch.setter
    @holding
    def prefetch(self, n_parts: int) -> None:
        if isinstance(n_parts, bool):
            raise InvalidArgumentError("prefetch: expected an int of 0 or more, got bool")
        check(lib.ferry_sched_set_prefetch(self._p, _checks.as_c_int(n_parts, "prefetch")))

    @property
    @holding
    def prefetch_next(self) -> bool:
        """Whether the first part's windows are copied for the next run under this run's last part
        (the constructor's prefetch_next); setting it takes effect at the next alloc. Turning it on
        with a prefetch of 0, or the prefetch to 0 while it is on, raises InvalidArgumentError."""
        return bool(lib.ferry_sched_get_prefetch_next(self._p))

    @prefetch_next.setter
    @holding
    def prefetch_next(self, on: bool) -> None:
        if not isinstance(on, bool):
            raise InvalidArgumentError(f"prefetch_next: expected a bool, got {type(on).__name__}")
        check(lib.ferry_sched_set_prefetch_next(self._p, on))

    @holding
    def drop_ahead(self) -> None:
        """Forget the copies made ahead for the next run: the next run copies its first part whole.
        Call it before rewriting cells below a stream's length that the last run read (a stream
        given a new sequence, or cut back and written again); without prefetch_next there is
        nothing to drop."""
        check(lib.ferry_sched_drop_ahead(self._p))

    @holding
    def truncate(self, stream: int, length: int) -> None:
        """Roll a stream back without copying it again: its cells below length are unchanged since
        the last run, those at or above may be written again (after speculative verification, the
        rejected tokens' cells, which the next step's tokens rewrite).

        Every window copied ahead for the next run (prefetch_next) takes it: that run copies the
        stream's cells from length (or from its cells at the copy ahead, where fewer) to its length
        then, as from a length the last run had; a length then below that is copied again from cell
        0. Truncates before a run add up, the lowest standing. A cell rewritten below length still
        takes drop_ahead(). With nothing copied ahead (prefetch_next off, before the first run,
        after drop_ahead) it does nothing.

        Parameters
        ----------
        stream : int
            The stream, an index into the lengths the windows carry (Tensor.set_used_cells).
        length : int
            The cells it keeps: 0 up to its length when the last run copied it ahead.

        Returns
        -------
        None

        Raises
        ------
        OutOfBoundsError
            For a length below 0 or above the stream's length at the copy ahead, or a stream that is
            not one of a window's copied ahead; nothing changes.
        InvalidArgumentError
            For a stream or length that is not an int of 64 bits.
        FreedBufferError
            When the scheduler is closed.
        """
        check(lib.ferry_sched_truncate(self._p, _checks.as_int64(stream, "truncate: stream"),
                                       _checks.as_int64(length, "truncate: length")))

    def _wrap_backend(self, ptr: Any) -> Optional[Backend]:
        return next((b for b in self._backends if b._handle.ptr == ptr), None)

    @holding
    def assign(self, tensor: Tensor, backend: Backend) -> None:
        """Run a node on a backend; takes effect at the next alloc.

        Parameters
        ----------
        tensor : Tensor
            A node of the graph to come.
        backend : Backend
            One of the scheduler's.

        Raises
        ------
        InvalidArgumentError
            For anything but a Tensor and a Backend, or a backend not the scheduler's.
        """
        t = _checks.instance(tensor, Tensor, "assign")
        b = _checks.instance(backend, Backend, "assign")
        check(lib.ferry_sched_set_tensor_backend(self._p, t._p, b._p))
        self._assigned[t._p] = t

    @holding
    def clear_assignments(self) -> None:
        """Forget every assignment (C keeps them by address): for a new graph each step, whose old
        tensors may go. Takes effect at the next alloc."""
        lib.ferry_sched_clear_assignments(self._p)
        self._assigned.clear()

    @property
    @holding
    def n_assigned(self) -> int:
        """Nodes assigned to a backend."""
        return int(lib.ferry_sched_n_assigned(self._p))

    @holding
    def alloc(self, graph: Graph) -> None:
        """Assign backends, find splits and inputs, allocate the input copies and the outputs.

        Parameters
        ----------
        graph : Graph
            Kept alive until the next alloc: C knows it by address.

        Raises
        ------
        InvalidArgumentError
            For anything but a Graph.
        OutOfMemoryError
            When the copies or outputs do not fit.
        """
        _checks.instance(graph, Graph, "sched alloc")
        p = self._p
        self._new_generation()
        self._graph = None
        check(lib.ferry_sched_alloc_graph(p, graph._p))
        self._graph = graph  # C remembers it by address: keep it (and its tensors) alive
        # The input copies get their Buffer when first asked for (_copy): most loops never ask.
        adopt_placements(graph._tensors.values(), self, self._handle, self._buffer_types, self._buffers)

    def _new_generation(self) -> None:
        self._generation.release()
        self._generation = Handle(object(), lambda _: None)
        self._handles[0] = self._generation
        self._copies.clear()

    def _after_close(self) -> None:
        """Drop the copies and graph of the last allocation, which close() freed in C."""
        self._copies.clear()
        self._graph = None

    @holding
    def compute(self, graph: Graph) -> None:
        """Run the Graph graph: allocate if it is not the one last allocated (or it grew), copy the inputs
        by the policy, run every split. A graph run again is neither rebuilt nor reallocated, but its
        inputs are copied again (their bytes change between steps). Raises as alloc does, the
        FerryError of a failed copy or split, or FreedBufferError when an object that owns a tensor
        of the graph (a KV cache its windows read) was closed.
        """
        _checks.instance(graph, Graph, "sched compute")
        graph._check_live()
        if lib.ferry_sched_needs_alloc(self._p, graph._p):
            self.alloc(graph)
        fetch.take_error()  # one left by a run that did not ask for it
        with graph._hold():
            status = lib.ferry_sched_graph_compute(self._p, graph._p)
        transport = fetch.take_error()
        if status != lib.FERRY_OK and transport is not None:
            raise transport  # the fetcher's own error (ferry.fetch): what it names, the peer and layer say
        check(status)

    # ------------------------------------------------------------ what the last alloc and run did

    def _copy(self, ptr: Any) -> Tensor:
        key = ptr
        t = self._copies.get(key)
        if t is None:
            t = Tensor._borrow(ptr, self._generation, keep=self, retainable=False)
            self._copies[key] = t
            adopt_placements((t,), self, self._handle, self._buffer_types, self._buffers)
        return t

    @property
    @holding
    def inputs(self) -> List[Input]:
        """Every split input of the last allocated graph, in split order."""
        p = self._p
        out = []
        info = ffi.new("ferry_sched_input_info *")
        for i in range(lib.ferry_sched_n_inputs(p)):
            check(lib.ferry_sched_input(p, i, info))
            assert self._graph is not None
            out.append(Input(int(info.split), self._graph._tensor(info.src), self._copy(info.copy),
                             CopyStats.from_c(info.stats)))
        return out

    @property
    @holding
    def splits(self) -> List[Split]:
        """The splits of the last allocated graph, in run order."""
        p = self._p
        inputs = self.inputs
        out = []
        info = ffi.new("ferry_sched_split_info *")
        for i in range(lib.ferry_sched_n_splits(p)):
            check(lib.ferry_sched_split(p, i, info))
            backend = self._wrap_backend(info.backend)
            assert backend is not None
            mine = inputs[info.first_input:info.first_input + info.n_inputs]
            out.append(Split(backend, int(info.first_node), int(info.n_nodes), mine, float(info.compute_seconds)))
        return out

    @property
    @holding
    def stats(self) -> SchedStats:
        """Totals of the last run."""
        s = ffi.new("ferry_sched_stats *")
        check(lib.ferry_sched_get_stats(self._p, s))
        return SchedStats.from_c(s)

    @holding
    def trace(self) -> List[Span]:
        """The last run's timeline: what the calling thread and each copy queue did, and when.

        Returns
        -------
        list of Span
            Ordered by start: each input's copy (by the calling thread, or on its backend's copy
            queue when prefetched, its times from the queue's events), each wait for queued copies
            and each part's compute, in seconds from the run's start. Empty before a run and after
            a new alloc.

        Raises
        ------
        FreedBufferError
            When the scheduler is closed.
        """
        p = self._p
        n = ffi.new("size_t *")
        check(lib.ferry_sched_trace(p, ffi.NULL, 0, n))
        spans = ffi.new("ferry_sched_span[]", max(int(n[0]), 1))
        check(lib.ferry_sched_trace(p, spans, n[0], n))
        return sorted((Span(SPAN_KINDS[int(x.kind)], int(x.part), int(x.input), float(x.start), float(x.end))
                       for x in spans[0:n[0]]), key=lambda sp: (sp.start, sp.end))

    @holding
    def buffer_size(self, backend: Backend) -> int:
        """Bytes of compute memory (copies and outputs) the scheduler holds on the Backend backend, with the
        staging area its merged gathers' spans land in there (the largest gather's spans; on the stand-in the
        area a device would hold); 0 for one not its own.
        """
        return int(lib.ferry_sched_buffer_size(self._p, _checks.instance(backend, Backend, "buffer_size")._p))

    @holding
    def backend_of(self, tensor: Tensor) -> Optional[Backend]:
        """The Backend the Tensor tensor of the last allocated graph was given, or None."""
        t = _checks.instance(tensor, Tensor, "backend_of")
        return self._wrap_backend(lib.ferry_sched_get_tensor_backend(self._p, t._p))

    def __repr__(self) -> str:
        if not self._handle.alive:
            return "<Scheduler closed>"
        names = ", ".join(b.name for b in self._backends)
        return f"<Scheduler [{names}] policy={self.policy}>"
