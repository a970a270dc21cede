"""The figures the model needs, asked of C and measured on a device: each layer's bytes from a dry-run
cache (sliding layers at their own size), attention's time on a backend, a device's link and memory."""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from ..backend import Backend, DummyBackend, StandinBackend
from ..copy_path import bytes_read
from ..errors import InvalidArgumentError
from ..kv import KVCache
from ..link import measure_link
from ..quant import quantize
from ..sched import Scheduler
from ..step import StepGraph, attention_step
from ..tensor import Tensor
from .model import DeviceSpec, LayerCost


def layers_from_geometry(type_k: str, type_v: str, head_dim: int, n_head_kv: int, n_ctx: int, n_stream: int,
                         n_kv: int, layer_windows: Sequence[Optional[int]], v_trans: bool = False,
                         compact: bool = True, n_new: int = 1) -> List[LayerCost]:
    """Each layer's figures for a model's geometry, from C: a dry-run cache (synthetic memory)
    with each layer at its own size, its windows' bytes read (what ``ranges`` copies, 2-D per
    window) and its K and V tensors' bytes.

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
        Cells a decode step adds per stream.

    Returns
    -------
    list of LayerCost
    """
    kv_size = n_ctx // n_stream if n_stream > 0 else 0
    cells = [None if w is None else min(w + n_new, kv_size) for w in layer_windows]
    host = DummyBackend(is_host=True)
    kv = KVCache(type_k, type_v, head_dim, n_head_kv, n_ctx, n_stream, n_layer=len(cells), v_trans=v_trans,
                 backend=host, layer_cells=cells)
    try:
        out = []
        windows = kv.windows(n_kv)
        for i in range(len(cells)):
            k, v = windows[i]
            read = (bytes_read(k), bytes_read(v))
            staging = sum(read) if compact else k.nbytes + v.nbytes
            out.append(LayerCost(read, kv.k(i).nbytes + kv.v(i).nbytes, staging))
        return out
    finally:
        kv.close()
        host.close()


def measure_compute(backend: Backend, type_k: str = "f16", type_v: str = "f16", head_dim: int = 128,
                    n_head_kv: int = 8, n_head: int = 32, n_ctx: int = 8192, n_stream: int = 1,
                    n_kv: Optional[int] = None, n_layer: int = 4, runs: int = 3) -> float:
    """Seconds one layer's decode attention takes on a backend, measured once: a step of n_layer
    device-resident layers holding random values, the fastest of runs, divided by n_layer.

    Parameters
    ----------
    backend : Backend
        The device (its KV resident there, so nothing is copied).
    type_k, type_v, head_dim, n_head_kv, n_head, n_ctx, n_stream : optional
        The geometry; n_kv defaults to n_ctx // n_stream.
    n_layer, runs : int, optional

    Returns
    -------
    float
    """
    if not isinstance(backend, Backend):
        raise InvalidArgumentError(f"measure_compute: backend is not a Backend but {type(backend).__name__}")
    n_kv = n_ctx // n_stream if n_kv is None else n_kv
    kv = KVCache(type_k, type_v, head_dim, n_head_kv, n_ctx, n_stream, n_layer=n_layer, backend=backend)
    # values written, not fresh memory: untouched pages all read as one zero page, from cache,
    # and attention over them runs about twice as fast as over a cache that holds data
    rng = np.random.default_rng(0)
    for layer in range(n_layer):
        for t, type_ in ((kv.k(layer), type_k), (kv.v(layer), type_v)):
            t.set(quantize(rng.uniform(-1, 1, int(np.prod(t.ne))).astype(np.float32), type_).tobytes())
    q = [Tensor.from_numpy(backend, np.zeros((n_stream, 1, n_head, head_dim), np.float32), name=f"q{i}")
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
