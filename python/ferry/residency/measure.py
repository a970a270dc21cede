"""The figures the model needs, asked of C and measured on a device: each layer's bytes from a dry-run
cache (sliding layers at their own size), what a step allocates on each device under a placement (a
dry run of the step, StepMemory), attention's time on a backend, a device's link and memory."""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..backend import Backend, CPUBackend, DummyBackend, StandinBackend
from ..buffer import BufferType
from ..copy_path import bytes_read, copy_ranges_of
from ..errors import InvalidArgumentError
from ..kv import KVCache
from ..link import measure_link
from ..pieces import copy_pieces
from ..quant import quantize
from ..sched import Scheduler
from ..step import StepGraph, attention_step
from ..tensor import Tensor
from .specs import DeviceSpec, LayerCost


def _rounded(size: int, alignment: int) -> int:
    """size rounded up to a multiple of alignment (what a cache's layer takes in its buffer)."""
    return -(-size // alignment) * alignment


def _placed(size: int, alignment: int) -> int:
    """The bytes the graph allocator gives a tensor of size bytes: rounded up to the alignment, and at
    least one alignment (alloc-blocks.c's ferry_blocks_round)."""
    return max(_rounded(size, alignment), alignment)


def _pieces(window: Tensor) -> Tuple[Tuple[int, int], ...]:
    """The pieces a remote tier pulls a window in under ``ranges`` (RemoteTier.pull's): C's pieces
    (ferry_copy_pieces) of its one range per stream, (offset in its K or V, bytes); the span where
    the ranges rule does not apply."""
    r = copy_ranges_of(window)
    if r is None:
        return ((window.offset, window.nbytes),)
    return tuple((p.src_offset, p.size) for p in copy_pieces([r._replace(offset=r.offset + window.offset)]))


def layers_from_geometry(type_k: str, type_v: str, head_dim: int, n_head_kv: int, n_ctx: int, n_stream: int,
                         n_kv: int, layer_windows: Sequence[Optional[int]], v_trans: bool = False,
                         compact: bool = True, n_new: int = 1, n_head: int = 0,
                         buffer_type: Optional[BufferType] = None) -> List[LayerCost]:
    """Each layer's figures for a model's geometry, from C: a dry-run cache (synthetic memory)
    with each layer at its own size, its windows' bytes read (what ``ranges`` copies, 2-D per
    window), the pieces a remote tier pulls them in (C's, of those copies) and its K and V
    tensors' bytes; with a device's buffer type, each as that buffer type
    places it (its alloc size, rounded up to its alignment), and with n_head its query's and
    attention output's bytes (f32 [head_dim, n_head, n_new, n_stream] each: a step's n_new tokens
    per stream, a draft's verification or a prefill chunk, are its query's).

    Parameters
    ----------
    type_k, type_v : str
        The cache's types.
    head_dim, n_head_kv, n_ctx, n_stream : int
        As KVCache takes them.
    n_kv : int
        Cells a full layer's window reads per stream.
    layer_windows : sequence of (int or None)
        Per layer, its sliding window (None: full attention); the layer holds min(W + n_new,
        n_ctx / n_stream) cells per stream.
    v_trans : bool, optional
    compact : bool, optional
        Window copies hold the bytes read (Scheduler(compact=True)); else the windows' spans.
    n_new : int, optional
        Cells a step adds per stream: its query tokens per stream (1: a decode step).
    n_head : int, optional
        Query heads; 0: no query or output figures.
    buffer_type : BufferType, optional
        The devices' buffer type; None: bytes as they are, unrounded.

    Returns
    -------
    list of LayerCost
    """
    kv_size = n_ctx // n_stream if n_stream > 0 else 0
    cells = [None if w is None else min(w + n_new, kv_size) for w in layer_windows]
    host = DummyBackend(is_host=True)
    kv = KVCache(type_k, type_v, head_dim, n_head_kv, n_ctx, n_stream, n_layer=len(cells), v_trans=v_trans,
                 backend=host, layer_cells=cells)
    align = 1 if buffer_type is None else buffer_type.alignment
    size: Callable[[Tensor], int] = (lambda t: t.nbytes) if buffer_type is None else buffer_type.alloc_size
    step = Tensor.new("f32", [head_dim, n_head, n_new, n_stream]) if n_head > 0 else None
    query = 0 if step is None else size(step)
    output = 0 if step is None else _placed(query, align)
    try:
        out = []
        windows = kv.windows(n_kv)
        for i in range(len(cells)):
            k, v = windows[i]
            read = (bytes_read(k), bytes_read(v))
            copies = read if compact else (k.nbytes, v.nbytes)
            staging = sum(c if buffer_type is None else _placed(c, align) for c in copies)
            resident = sum(_rounded(size(t), align) for t in (kv.k(i), kv.v(i)))
            out.append(LayerCost(read, resident, staging, output, query, (_pieces(k), _pieces(v))))
        return out
    finally:
        kv.close()
        host.close()


#: A dry run's stand-in counts what its buffers ask against this much memory, which it never reaches.
_COUNTED = 1 << 60


class StepMemory:
    """What a decode step allocates on each device under a placement, measured by a dry run of the step.

    The step is the one ferry.workloads.residency_bench runs: per layer, attention (attention_step)
    over its K and V windows on the device that runs it, its query there, each stream's length on
    the first device; a scheduler over the devices and the host (copy policy `policy`, compact
    staging or not, prefetching `prefetch` parts ahead) copies into each split what it reads from
    elsewhere. The dry run makes that step on stand-in devices (each with a copy queue, as the
    runs' have) and lets the scheduler allocate its graph for each window a run takes, in turn (its
    buffers grow to the largest any of them needs, and a smaller window may need more: the graph
    allocator's layout changes with the sizes). Layers in host memory live in a cache with nothing
    behind it; a resident layer is made n_tok cells long (the cells a step's tokens read of their
    own), since what it holds does not change what the scheduler allocates (its windows are read
    where they are), and its K and V are counted from
    their sizes (LayerCost.resident_bytes).

    Called with per layer whether it is resident, it returns per device (bytes of the scheduler's
    buffer, bytes of the step's queries and lengths on it): ferry.residency's MeasureMemory; least()
    measures the largest window alone, no more than that and a fraction of the work (the planner
    asks it first). Placements are measured once each. Close it (or use it in a `with` block) to
    free its devices.

    Parameters
    ----------
    type_k, type_v : str
        The cache's types.
    head_dim, n_head_kv, n_head, n_ctx, n_stream : int
        The geometry: n_head query heads; n_ctx cells in all streams, n_stream streams.
    layer_cells : sequence of (int or None)
        Per layer, its cells per stream (None: a full layer's n_ctx / n_stream).
    windows : sequence of int
        The full layers' window (n_kv) at each step of a run, in order.
    n_devices : int, optional
    layer_device : sequence of int, optional
        Per layer, the device that runs it; default: layer_split's contiguous ranges.
    v_trans, compact : bool, optional
        V transposed; window copies holding only the bytes read (Scheduler(compact=True)).
    prefetch : int, optional
        Parts the scheduler queues ahead (0: serial).
    policy : str, optional
        The scheduler's copy policy.
    n_tok : int, optional
        Query tokens per stream each step brings (a draft's verification, a prefill chunk); 1: decode.

    Raises
    ------
    InvalidArgumentError
        For inconsistent lengths or figures the cache refuses.
    """

    def __init__(self, type_k: str, type_v: str, head_dim: int, n_head_kv: int, n_head: int, n_ctx: int,
                 n_stream: int, layer_cells: Sequence[Optional[int]], windows: Sequence[int], n_devices: int = 1,
                 layer_device: Optional[Sequence[int]] = None, v_trans: bool = False, compact: bool = False,
                 prefetch: int = 0, policy: str = "ranges", n_tok: int = 1) -> None:
        n_layer = len(layer_cells)
        if n_layer < 1 or n_devices < 1 or not windows or n_tok < 1:
            raise InvalidArgumentError(f"StepMemory: {n_layer} layers, {n_devices} devices, {len(windows)} "
                                       f"windows and {n_tok} query tokens per stream: each must be 1 or more")
        dev = [i * n_devices // n_layer for i in range(n_layer)] if layer_device is None else list(layer_device)
        if len(dev) != n_layer or any(not 0 <= d < n_devices for d in dev):
            raise InvalidArgumentError(f"StepMemory: layer_device {dev} is not one of 0..{n_devices - 1} per layer")
        self._geometry = (type_k, type_v, head_dim, n_head_kv, n_ctx, n_stream)
        self._cells = list(layer_cells)
        self._windows = list(windows)
        self._v_trans, self._compact, self._prefetch, self._policy = v_trans, compact, prefetch, policy
        self._n_tok = n_tok
        self._cache: Dict[Tuple[Tuple[bool, ...], bool], Tuple[Tuple[int, int], ...]] = {}  # by (resident, least)
        self._devices: List[StandinBackend] = []
        self._cpu: Optional[CPUBackend] = None
        self._host: Optional[DummyBackend] = None
        self._q: List[Tensor] = []
        self._kv_len: Optional[Tensor] = None
        try:
            self._devices = [StandinBackend(memory=_COUNTED) for _ in range(n_devices)]
            self._cpu = CPUBackend()
            self._host = DummyBackend(is_host=True)
            self._on = [self._devices[d] for d in dev]
            # the step's own tensors, as the run makes them: a query per layer on its device, the
            # lengths on the first; what they take is what each device has used before any cache
            self._q = [Tensor.from_numpy(b, np.zeros((n_stream, n_tok, n_head, head_dim), np.float32),
                                         name=f"q{i}") for i, b in enumerate(self._on)]
            self._kv_len = Tensor.from_numpy(self._devices[0], np.zeros(n_stream, np.int32), name="kv_len")
            self._inputs = [_COUNTED - d.memory().free for d in self._devices]
        except BaseException:
            self.close()
            raise

    def __call__(self, resident: Sequence[bool]) -> Tuple[Tuple[int, int], ...]:
        """Per device (bytes of the scheduler's buffer, bytes of the step's queries and lengths) under
        a placement: per layer whether it is resident on its device."""
        return self._cached(resident, False)

    def least(self, resident: Sequence[bool]) -> Tuple[Tuple[int, int], ...]:
        """As calling it, with the scheduler's buffer for the largest window alone: no more than a
        run's, whose buffer is the largest any of its windows needs."""
        return self._cached(resident, True)

    def _cached(self, resident: Sequence[bool], least: bool) -> Tuple[Tuple[int, int], ...]:
        key = tuple(bool(r) for r in resident)
        if len(key) != len(self._cells):
            raise InvalidArgumentError(f"StepMemory: {len(key)} entries in resident for {len(self._cells)} layers")
        if len(self._windows) == 1:
            least = False  # the same measurement
        got = self._cache.get((key, least))
        if got is None:
            got = self._cache[(key, least)] = self._measure(key, [max(self._windows)] if least else self._windows)
        return got

    def _measure(self, resident: Tuple[bool, ...], windows: Sequence[int]) -> Tuple[Tuple[int, int], ...]:
        kv_len = self._kv_len
        if self._host is None or self._cpu is None or kv_len is None:
            raise InvalidArgumentError("StepMemory: used after close()")
        type_k, type_v, head_dim, n_head_kv, n_ctx, n_stream = self._geometry
        places = [self._on[i] if r else None for i, r in enumerate(resident)]
        cells = [self._n_tok if r else c for r, c in zip(resident, self._cells)]  # each token reads its own cell
        kv = KVCache(type_k, type_v, head_dim, n_head_kv, n_ctx, n_stream, n_layer=len(cells), v_trans=self._v_trans,
                     backend=self._host, placement=places, layer_cells=cells)
        sched = Scheduler([*self._devices, self._cpu], policy=self._policy, compact=self._compact,
                          prefetch=self._prefetch)
        try:
            on = self._on if len(self._devices) > 1 else self._devices[0]

            def build(n_kv: object) -> List[Tensor]:
                assert isinstance(n_kv, int)
                return attention_step(sched, on, kv.windows(n_kv), self._q, kv_len, self._v_trans)

            steps = StepGraph(sched, build)
            for n_kv in windows:
                steps.get(n_kv)
            return tuple((sched.buffer_size(d), i) for d, i in zip(self._devices, self._inputs))
        finally:
            sched.close()
            kv.close()

    def close(self) -> None:
        """Free the dry run's devices."""
        self._q, self._kv_len = [], None
        for d in self._devices:
            d.close()
        self._devices = []
        for b in (self._cpu, self._host):
            if b is not None:
                b.close()
        self._cpu = self._host = None

    def __enter__(self) -> "StepMemory":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def measure_compute(backend: Backend, type_k: str = "f16", type_v: str = "f16", head_dim: int = 128,
                    n_head_kv: int = 8, n_head: int = 32, n_ctx: int = 8192, n_stream: int = 1,
                    n_kv: Optional[int] = None, n_layer: int = 4, runs: int = 3, n_tok: int = 1) -> float:
    """Seconds one layer's decode attention takes on a backend, measured once: a step of n_layer
    device-resident layers holding random values, the fastest of runs, divided by n_layer.

    Parameters
    ----------
    backend : Backend
        The device (its KV resident there, so nothing is copied).
    type_k, type_v, head_dim, n_head_kv, n_head, n_ctx, n_stream : optional
        The geometry; n_kv defaults to n_ctx // n_stream.
    n_layer, runs : int, optional
    n_tok : int, optional
        Query tokens per stream (1: a decode step; a draft's verification N + 1), the last n_tok of
        each stream's n_kv cells theirs.

    Returns
    -------
    float

    Raises
    ------
    InvalidArgumentError
        For a backend not a Backend, or an n_tok not an integer from 1 to n_kv.
    """
    if not isinstance(backend, Backend):
        raise InvalidArgumentError(f"measure_compute: backend is not a Backend but {type(backend).__name__}")
    n_kv = n_ctx // n_stream if n_kv is None else n_kv
    if isinstance(n_tok, bool) or not isinstance(n_tok, int) or not 1 <= n_tok <= n_kv:
        raise InvalidArgumentError(f"measure_compute: n_tok is the query tokens per stream, an integer from 1 to "
                                   f"n_kv ({n_kv}), got {n_tok!r}")
    kv = KVCache(type_k, type_v, head_dim, n_head_kv, n_ctx, n_stream, n_layer=n_layer, backend=backend)
    # values written, not fresh memory: untouched pages all read as one zero page, from cache,
    # and attention over them runs about twice as fast as over a cache that holds data
    rng = np.random.default_rng(0)
    for layer in range(n_layer):
        for t, type_ in ((kv.k(layer), type_k), (kv.v(layer), type_v)):
            t.set(quantize(rng.uniform(-1, 1, int(np.prod(t.ne))).astype(np.float32), type_).tobytes())
    q = [Tensor.from_numpy(backend, np.zeros((n_stream, n_tok, n_head, head_dim), np.float32), name=f"q{i}")
         for i in range(n_layer)]
    kv_len = Tensor.from_numpy(backend, np.full(n_stream, n_kv, np.int32), name="kv_len")
    sched = Scheduler([backend])
    try:
        graph = StepGraph(sched, lambda _: attention_step(sched, backend, kv.windows(n_kv), q, kv_len)).get(n_kv)
        best = math.inf
        for _ in range(runs):
            sched.compute(graph)
            best = min(best, sched.stats.compute_seconds)
        return best / n_layer
    finally:
        sched.close()
        kv.close()


def measure_token_share(backend: Backend, n_tok: int, type_k: str = "f16", type_v: str = "f16",
                        head_dim: int = 128, n_head_kv: int = 8, n_head: int = 32, n_ctx: int = 8192,
                        n_stream: int = 1, n_kv: Optional[int] = None, n_layer: int = 2, runs: int = 5) -> float:
    """The part of a layer's one-token attention that each further query token of a step adds on a
    backend (DeviceSpec.token_share): measure_compute at n_tok tokens and at 1, taking turns (each the
    fastest of its runs, so a busy host's slow runs fall out of both), (T_n / T_1 - 1) / (n_tok - 1).

    Parameters
    ----------
    backend : Backend
    n_tok : int
        Query tokens per stream of the steps to predict (>= 2: one gives no share to measure).
    type_k, type_v, head_dim, n_head_kv, n_head, n_ctx, n_stream, n_kv, n_layer, runs : optional
        As measure_compute's.

    Returns
    -------
    float
        At least 0.

    Raises
    ------
    InvalidArgumentError
        As measure_compute, or for an n_tok below 2.
    """
    if isinstance(n_tok, bool) or not isinstance(n_tok, int) or n_tok < 2:
        raise InvalidArgumentError(f"measure_token_share: n_tok is the query tokens per stream of a step, an "
                                   f"integer >= 2, got {n_tok!r}")
    def timed(tokens: int) -> float:
        return measure_compute(backend, type_k, type_v, head_dim, n_head_kv, n_head, n_ctx, n_stream, n_kv,
                               n_layer, runs, n_tok=tokens)

    one, several = math.inf, math.inf
    for _ in range(2):
        one, several = min(one, timed(1)), min(several, timed(n_tok))
    return max(0.0, (several / one - 1.0) / (n_tok - 1)) if one > 0 else 1.0


def device_from_backend(backend: Backend, compute_s: Union[float, Tuple[float, ...]] = 0.0, reserve: int = 0,
                        latency_us: Optional[float] = None, memory: Optional[int] = None,
                        name: Optional[str] = None) -> DeviceSpec:
    """A DeviceSpec from a backend: its link measured once (measure_link), its free memory asked
    (Backend.memory), its latency a stand-in's own.

    Parameters
    ----------
    backend : Backend
    compute_s : float or tuple of float, optional
        Seconds per layer (measure_compute gives one).
    reserve : int, optional
    latency_us : float, optional
        Default: a stand-in's modelled latency, else 0.
    memory : int, optional
        Default: the backend's free memory.
    name : str, optional
        Default: the backend's name.

    Returns
    -------
    DeviceSpec
    """
    if not isinstance(backend, Backend):
        raise InvalidArgumentError(f"device_from_backend: backend is not a Backend but {type(backend).__name__}")
    gbps = measure_link(backend).gbps
    if latency_us is None:
        latency_us = backend.latency_us if isinstance(backend, StandinBackend) else 0.0
    free = backend.memory().free if memory is None else memory
    return DeviceSpec(gbps, latency_us, compute_s, free, reserve, backend.name if name is None else name)
