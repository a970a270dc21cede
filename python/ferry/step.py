"""A decode step's graph, built and allocated once per shape and run again while the shape holds.

A decode loop's graph changes shape only when its windows do: with n_kv padded (llama.cpp
rounds it up to 256), many steps in a row read windows of the same n_kv, and their graphs
differ only in data: each stream's length and the query, which live in input tensors the
loop writes before each step. StepGraph keeps the last graph under its key (the padded
n_kv, or anything that says what the graph's shape depends on) and builds a new one only
when the key changes. The scheduler keeps the allocation of the graph it last allocated,
so a reused graph is neither rebuilt nor reallocated; its input copies are made at every
compute, since the bytes of the windows change every step.

    steps = StepGraph(sched, build)       # build(n_kv) assigns and returns the outputs
    for t in range(n_steps):
        kv_len.set(lengths(t))            # what changed: data, written in place
        graph = steps.get(padded_n_kv(t)) # the same graph while n_kv holds
        sched.compute(graph)

A reused graph is checked before it runs: when an object that owns its tensors (the KV
cache its windows read) or the scheduler was closed, Scheduler.compute raises
FreedBufferError instead of reading freed memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Hashable, List, Optional, Sequence, Tuple, Union

from . import _checks
from ._binding import ffi, lib
from ._handle import Handle, Hold, release_when_collected
from .backend import Backend
from .errors import InvalidArgumentError, check
from .graph import Graph
from .kv import KVCache, KVWindows
from .ops import attn_decode, window_v_trans
from .paged import PagedKVCache, PagedWindows
from .sched import Scheduler
from .tensor import Tensor, _new_context

if TYPE_CHECKING:
    from .block_pool import BlockPool

#: Builds a step's graph for a key: assigns its nodes on the scheduler and returns the outputs (or a Graph).
Build = Callable[[Hashable], Union[Graph, Sequence[Tensor]]]

#: Where a step's attention runs: one backend for every layer, or one per layer.
Backends = Union[Backend, Sequence[Backend]]


def layer_split(n_layer: int, devices: Sequence[Backend]) -> List[Backend]:
    """The default map of layers to devices: contiguous ranges, in device order, as llama.cpp's
    layer split (``-sm layer``) assigns them with an even tensor split.

    llama.cpp gives layer l the first device whose cumulative share ((d + 1) / n_dev, each
    device an equal share) exceeds l / n_layer; in whole numbers, device ``l * n_dev // n_layer``.
    Device d so takes layers ceil(d * n_layer / n_dev) up to ceil((d + 1) * n_layer / n_dev):
    n_layer // n_dev of them or one more, the extra layers spread where the shares' boundaries
    fall (5 layers on 2 devices: 3 and 2; 10 on 4: 3, 2, 3, 2). llama.cpp also counts its
    output layer among the layers when every layer is offloaded; a step of attention has none.
    Any other map is a list of the same length.

    Parameters
    ----------
    n_layer : int
        Layers, 1 or more.
    devices : sequence of Backend
        The devices, 1 or more, in the order their ranges go.

    Returns
    -------
    list of Backend
        Per layer, its device: what attention_step takes.

    Raises
    ------
    InvalidArgumentError
        For n_layer below 1, no devices, or devices that are not Backends.
    """
    if isinstance(n_layer, bool) or not isinstance(n_layer, int) or n_layer < 1:
        raise InvalidArgumentError(f"layer_split: n_layer must be a positive int, got {n_layer!r}")
    if isinstance(devices, (str, bytes)) or not hasattr(devices, "__len__") or len(devices) == 0:
        raise InvalidArgumentError("layer_split: devices is a non-empty sequence of Backends")
    devs = [_checks.instance(d, Backend, f"layer_split: devices[{i}]") for i, d in enumerate(devices)]
    return [devs[layer * len(devs) // n_layer] for layer in range(n_layer)]


def _per_layer(backend: Backends, n_layer: int) -> List[Backend]:
    """backend as one Backend per layer; InvalidArgumentError for a list of the wrong length or
    an item that is not a Backend."""
    if isinstance(backend, Backend):
        return [backend] * n_layer
    if isinstance(backend, (str, bytes)) or not hasattr(backend, "__len__"):
        raise InvalidArgumentError(f"attention_step: expected a Backend or one per layer, got {type(backend).__name__}")
    if len(backend) != n_layer:
        raise InvalidArgumentError(f"attention_step: {len(backend)} backends for {n_layer} layers")
    return [_checks.instance(b, Backend, f"attention_step: layer {i}'s backend") for i, b in enumerate(backend)]


def attention_step(sched: Scheduler, backend: Backends, windows: Sequence[Tuple[Tensor, Tensor]],
                   q: Sequence[Tensor], kv_len: Tensor, v_trans: Optional[bool] = None) -> "StepOutputs":
    """A decode step's outputs: per layer, decode attention over its K and V windows, marked as an
    output and assigned to a backend (the same for every layer, or one per layer: several devices
    in one step); what a StepGraph's build returns.

    With a backend per layer, the scheduler makes a split per run of layers on one backend and
    copies into each split what its layers read from elsewhere (windows, q, kv_len), through its
    ordinary input copies.

    Given KVCache.windows(n_kv), the whole step (windows, nodes, assignments and its Graph) is made by
    one C call (ferry_kv_attention_step) and only the outputs get Python objects: the fast way,
    for a step built often; given PagedKVCache.windows(n_kv), the same over a paged cache
    (ferry_paged_attention_step_on: each split gathers its windows' used cells). Given any other
    sequence of pairs, it is built layer by layer.

    Parameters
    ----------
    sched : Scheduler
        Where the outputs are pinned.
    backend : Backend, or sequence of Backend
        The scheduler's: where attention runs, for every layer or per layer (layer_split makes
        llama.cpp's map of contiguous ranges).
    windows : KVWindows, PagedWindows, or sequence of (Tensor, Tensor)
        Per layer, its K and V windows (KVCache.windows or PagedKVCache.windows, or their window per
        layer).
    q : sequence of Tensor
        Per layer, its query (f32 [head_dim, n_head, n_tok, ns]): n_tok tokens per stream, a draft
        to verify or a prefill chunk, each window copied once for all of them (attn_decode says
        which cells each token reads).
    kv_len : Tensor
        i32 [ns]: each stream's length, shared by every layer. From KVWindows every window carries
        it as its used cells (Tensor.set_used_cells, limit n_kv), which the ragged policy copies
        alone; under ragged it must be in host memory (the scheduler copies it to the devices).
    v_trans : bool, optional
        V is transposed. The cache's windows say themselves whether V is, and a v_trans that
        disagrees is refused; default: the cache's (False for pairs no cache made).

    Returns
    -------
    StepOutputs
        A list of Tensor, attn0, attn1, ...: one output per layer; its graph is the step's Graph
        (from KVWindows, the one C built with the step).

    Raises
    ------
    InvalidArgumentError
        For as many queries (or backends) as layers not given, a backend not the scheduler's (naming
        the layer), a v_trans other than the cache's, or what attn_decode refuses.
    LayoutError
        For shapes attention cannot read.
    OutOfBoundsError
        For windows the cache does not have (KVWindows: checked here, for every layer).
    FreedBufferError
        For a closed scheduler, backend or KV cache.

    Examples
    --------
    One layer over the caller's arrays (2 streams of 8 cells, one KV head of 4 f16 values, V all
    ones), two query heads, the sequences 3 and 1 cells long; under ragged the step copies those
    cells of K and V (8 bytes each) and the lengths, and every head's output is V's ones:

    >>> import numpy as np, ferry
    >>> k, v = np.zeros((2, 8, 4), np.float16), np.ones((2, 8, 4), np.float16)
    >>> kv = ferry.KVCache.from_arrays([k], [v], n_stream=2, n_head_kv=1)
    >>> gpu, cpu = ferry.StandinBackend(link_gbps=8), ferry.CPUBackend()
    >>> sched = ferry.Scheduler([gpu, cpu], policy="ragged")
    >>> q = [ferry.Tensor.from_numpy(gpu, np.ones((2, 1, 2, 4), np.float32))]
    >>> kv_len = ferry.Tensor.from_numpy(cpu, np.array([3, 1], np.int32), name="kv_len")
    >>> outs = ferry.attention_step(sched, gpu, kv.windows(3), q, kv_len)
    >>> sched.compute(outs.graph)
    >>> [(i.src.name, i.stats.bytes_copied) for i in sched.inputs]
    [('window_k_l0', 32), ('window_v_l0', 32), ('kv_len', 8)]
    >>> outs[0].to_numpy().tolist() == np.ones((2, 1, 2, 4)).tolist()
    True
    """
    if any(isinstance(x, (str, bytes)) or not hasattr(x, "__len__") for x in (windows, q)):
        raise InvalidArgumentError("attention_step: windows and q are sequences with an item per layer")
    if len(windows) != len(q):
        raise InvalidArgumentError(f"attention_step: {len(windows)} layers of windows but {len(q)} queries")
    backends = _per_layer(backend, len(q))
    if v_trans is not None and not isinstance(v_trans, bool):
        raise InvalidArgumentError(f"attention_step: v_trans must be a bool or None, got {v_trans!r}")
    if isinstance(windows, (KVWindows, PagedWindows)):  # C checks every layer's backend before it assigns any
        # held while C builds the step: closed by another thread meanwhile, they are freed after it
        owners = [getattr(x, "_handle", None) for x in [sched, windows.cache] + backends]
        with Hold(owners):
            return _attention_step_c(sched, backends, windows, q, kv_len, v_trans)
    # the same here: a refused backend assigns nothing
    own = {b._p for b in _checks.instance(sched, Scheduler, "assign").backends}
    for layer, b in enumerate(backends):
        if b._p not in own:
            raise InvalidArgumentError(f"attention_step: layer {layer}'s backend {b.name} is not one of the "
                                       "scheduler's")
    pairs = []
    for layer, pair in enumerate(windows):
        if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2 or \
                not all(isinstance(t, Tensor) for t in pair):
            raise InvalidArgumentError(f"attention_step: layer {layer}'s windows are not a (K, V) pair of Tensors")
        k, v = pair
        known = window_v_trans(v)
        if v_trans is not None and known is not None and known != v_trans:
            raise InvalidArgumentError(f"attention_step: v_trans={v_trans}, but layer {layer}'s V window is of a "
                                       f"cache whose V is {'' if known else 'not '}transposed (v_trans={known}): "
                                       "leave v_trans out, or pass the cache's")
        pairs.append((k, v))
    # every node made before the first assignment: a layer attention refuses assigns nothing
    outs = [attn_decode(q[layer], k, v, kv_len, v_trans=v_trans, name=f"attn{layer}").set_output()
            for layer, (k, v) in enumerate(pairs)]
    for layer, out in enumerate(outs):
        sched.assign(out, backends[layer])
    return StepOutputs(outs)


class _Step:
    """What a step made in C belongs to: its context (every window and node), released when the
    last output goes, and the Python objects of what its nodes read (Graph asks for them)."""

    __slots__ = ("handle", "cache", "q", "kv_len", "__weakref__")

    def __init__(self, handle: Handle, cache: Union[KVCache, PagedKVCache, "BlockPool"], q: List[Tensor],
                 kv_len: Tensor) -> None:
        self.handle, self.cache, self.q, self.kv_len = handle, cache, q, kv_len

    def _known_tensors(self) -> List[Tensor]:
        """The queries, kv_len, and the cache layers the windows are views of (a BlockPool's: its pools)."""
        cache = self.cache
        layers = [t for layer in range(len(self.q)) for t in (cache.k(layer), cache.v(layer))]
        return self.q + [self.kv_len] + layers

    def _srcs_of(self, out: Tensor) -> Tuple[Tensor, ...]:
        """What an output reads, as Tensor.srcs gives an op's operands: its q, K and V windows (wrapped
        now, views of the cache's layers) and kv_len."""
        known = {t._ptr: t for t in self._known_tensors()}
        srcs = []
        for src in out._p.src:
            if not src:
                break
            t = known.get(src)
            if t is None:  # a window: a view of a cache layer
                t = Tensor._borrow(src, out._handle, keep=out, source=known.get(src.view_src))
            srcs.append(t)
        return tuple(srcs)


class StepOutputs(List[Tensor]):
    """attention_step's outputs: a list of Tensor, one attention output per layer (f32 [head_dim,
    n_head, n_tok, ns], unallocated until the scheduler runs them), and their Graph (graph)."""

    _graph: Optional[Graph] = None  # the Graph C built with the step (from KVWindows)

    @property
    def graph(self) -> Graph:
        """The Graph of these outputs, as the scheduler computes it: the one attention_step built with
        the step while the list holds what it gave, else built now (Graph(*self))."""
        if self._graph is not None:
            built = self._graph._outputs
            if len(built) == len(self) and all(a is b for a, b in zip(built, self)):
                return self._graph
        return Graph(*self)


def _attention_step_c(sched: Scheduler, backends: List[Backend], windows: Union[KVWindows, PagedWindows],
                      q: Sequence[Tensor], kv_len: Tensor, v_trans: Optional[bool]) -> StepOutputs:
    """attention_step of KVWindows (ferry_kv_attention_step_on) or PagedWindows
    (ferry_paged_attention_step_on): one C call, an object per output."""
    sched_p = _checks.instance(sched, Scheduler, "assign")._p
    backends_p = ffi.new("ferry_backend *[]", [b._p for b in backends])
    cache_trans = windows.cache.params.v_trans
    if v_trans is not None and v_trans != cache_trans:
        raise InvalidArgumentError(f"attention_step: v_trans={v_trans}, but the windows' cache stores V "
                                   f"{'' if cache_trans else 'not '}transposed (v_trans={cache_trans}): leave "
                                   "v_trans out, or pass the cache's")
    qs = list(q)
    for i, t in enumerate(qs):
        _checks.instance(t, Tensor, f"attention_step: q[{i}]")._check_retainable()
    _checks.instance(kv_len, Tensor, "attn_decode: kv_len")._check_retainable()
    cache = windows.cache
    kv_p = cache._p  # FreedBufferError for a closed cache
    n = len(qs)
    q_p = ffi.new("ferry_tensor *[]", [t._p for t in qs])
    len_p = kv_len._p
    # One context holds every window and node; the step's owner releases it when the last output goes.
    ctx = _new_context([cache._handle, kv_len._handle] + [t._handle for t in qs])
    owner = _Step(ctx, cache, qs, kv_len)
    release_when_collected(owner, ctx)
    g = ffi.new("ferry_graph **")
    check(lib.ferry_graph_new(g))
    graph_handle = Handle(g[0], lib.ferry_graph_free)
    outs_p = ffi.new("ferry_tensor *[]", n)
    n_assigned = lib.ferry_sched_n_assigned(sched_p)
    step_on = lib.ferry_paged_attention_step_on if isinstance(windows, PagedWindows) else lib.ferry_kv_attention_step_on
    st = step_on(kv_p, ctx.ptr, n, windows.n_kv, windows.s0, windows.s1, q_p, len_p, cache_trans, sched_p, backends_p,
                 graph_handle.ptr, outs_p)
    if st != lib.FERRY_OK:
        graph_handle.release()
        # out of memory among the assignments: C keeps those made by address, so their tensors
        # live until clear_assignments
        if lib.ferry_sched_n_assigned(sched_p) != n_assigned:
            sched._assigned[ctx.ptr] = owner  # type: ignore[assignment]
        check(st)
    borrow = Tensor._borrow
    outs = StepOutputs(borrow(outs_p[i], ctx, keep=owner) for i in range(n))
    assignments = sched._assigned  # C compares assigned tensors by address: keep them alive until clear_assignments
    for t in outs:
        assignments[t._ptr] = t
    outs._graph = Graph._built(graph_handle, list(outs), [(cache._handle, cache)])
    return outs


class StepGraph:
    """The graph of a decode step, rebuilt only when its key changes.

    Parameters
    ----------
    sched : Scheduler
        Runs the graph; it is allocated there when built (assignments are cleared before each build).
    build : callable
        build(key) makes the step's graph for a key: it may assign nodes with sched.assign (attention_step
        with a backend per layer spreads the step over several devices), and returns the graph's outputs
        (a sequence of Tensors) or a Graph.

    Raises
    ------
    InvalidArgumentError
        For a sched that is not a Scheduler or a build that is not callable.
    """

    def __init__(self, sched: Scheduler, build: Build) -> None:
        self._sched = _checks.instance(sched, Scheduler, "StepGraph: sched")
        if not callable(build):
            raise InvalidArgumentError(f"StepGraph: build must be callable, got {type(build).__name__}")
        self._build = build
        self._key: Optional[Hashable] = None
        self._graph: Optional[Graph] = None
        self.builds = 0
        self.reuses = 0

    @property
    def graph(self) -> Optional[Graph]:
        """The last graph built (None before the first get or after clear)."""
        return self._graph

    @property
    def key(self) -> Optional[Hashable]:
        """The key the last graph was built for."""
        return self._key

    @property
    def rebuilds(self) -> int:
        """Builds after the first: how often the key changed."""
        return max(self.builds - 1, 0)

    def get(self, key: Hashable) -> Graph:
        """The step's graph for key, allocated on the scheduler: the last one when key is the last key.

        Parameters
        ----------
        key : hashable
            What the graph's shape depends on (the padded n_kv); compared with ==.

        Returns
        -------
        Graph
            The step's graph: built for a new key, else the last one, reused.

        Raises
        ------
        InvalidArgumentError
            When build returns neither a Graph nor a sequence of Tensors.
        FreedBufferError
            When the scheduler was closed, or an object the graph's tensors belong to (a KV cache)
            was closed: checked again before each reuse.
        FerryError
            As build, Graph and Scheduler.alloc raise.
        """
        graph = self._graph
        if graph is not None and key == self._key:
            graph._check_live()
            _ = self._sched._p  # a closed scheduler refuses a reuse (FreedBufferError) as it refuses a build
            self.reuses += 1
            return graph
        self._graph = self._key = None  # the old graph (and the memory it holds) may go before the new one
        sched = self._sched
        sched.clear_assignments()
        made = self._build(key)
        if not isinstance(made, Graph):
            if isinstance(made, (str, bytes)) or not hasattr(made, "__iter__"):
                raise InvalidArgumentError(f"StepGraph: build returned {type(made).__name__}, not a Graph or "
                                           "a sequence of Tensors")
            made = made.graph if isinstance(made, StepOutputs) else Graph(*made)
        sched.alloc(made)
        self._graph, self._key = made, key
        self.builds += 1
        return made

    def clear(self) -> None:
        """Drop the last graph (and what it holds alive): the next get builds."""
        self._graph = self._key = None

    def __repr__(self) -> str:
        return f"<StepGraph key={self._key!r} builds={self.builds} reuses={self.reuses}>"


__all__ = ["StepGraph", "StepOutputs", "Build", "Backends", "attention_step", "layer_split"]
