"""ferry: copy the ranges of a multi-stream KV-cache window, not the span.

The face (ferry.__all__, listed with a line each in docs/api.md): errors (FerryError, a subclass
per C status, with C's message); element types (Type, to_type, row_size) and their values
(quantize, dequantize); Tensor (ggml's order: ne[0] fastest, byte strides nb) and the memory
it lives in (Buffer, BufferType); backends (CPUBackend, StandinBackend: a GPU's stand-in on a
link and with a memory you give it, DummyBackend, CUDABackend), events and measure_link; Graph
and GraphAllocator; copy policies and 2-D copies; the Scheduler, the KVCache and a decode step
(attention_step, StepGraph, layer_split); the paged KV cache (ferry.paged.PagedKVCache) for a
serving system's block tables, and its blocks kept on a device (ferry.block_pool); from_array for
numpy, PyTorch and CuPy arrays without copies.

Deeper, by module: the ops (ferry.ops), the copy path (ferry.copy_path), copy plans and their
cost model (ferry.plan), where each layer's KV should live (ferry.residency), the counters
(ferry.stats) and the workloads the command line runs (ferry.workloads: each returns data and
prints nothing). The `ferry` command (ferry.cli) sits on top and is the only part that parses
arguments or prints. Modules import downward only.
"""

from __future__ import annotations

from typing import Any, Dict

from . import _binding, block_pool, copy_path, ops, paged, plan, residency
from .alloc import GraphAllocator
from .backend import Backend, CPUBackend, DummyBackend, StandinBackend
from .buffer import Buffer, BufferType, cpu_buffer_type
from .copy2d import Copy2D
from .cuda import CUDABackend, cuda_available, cuda_buffer_type, cuda_device_count, cuda_host_buffer_type
from .errors import (
    BackendError,
    FerryError,
    FreedBufferError,
    InvalidArgumentError,
    LayoutError,
    NotAllocatedError,
    OutOfBoundsError,
    OutOfMemoryError,
    UnknownTypeError,
    UnsupportedError,
)
from .event import Event
from .graph import Graph
from .interop import from_array
from .kv import KVCache
from .link import measure_link
from .policy import CopyPolicy
from .quant import dequantize, quantize
from .sched import Scheduler
from .step import StepGraph, attention_step, layer_split
from .tensor import Tensor
from .types import Type, row_size, to_type

__version__ = _binding.ffi.string(_binding.lib.ferry_version()).decode()


def build_info() -> Dict[str, Any]:
    """What this build contains.

    Returns
    -------
    dict
        "version"; "cuda": whether CUDA was compiled in; "fake_cudart": whether against the
        test-only fake runtime, whose timings mean nothing; "library": the library's path.
    """
    return {
        "version": __version__,
        "cuda": bool(_binding.lib.ferry_built_with_cuda()),
        "fake_cudart": bool(_binding.lib.ferry_built_with_fake_cudart()),
        "library": _binding.LIB_PATH,
    }


__all__ = [
    # the build
    "build_info", "cuda_available", "cuda_device_count",
    # errors
    "FerryError", "InvalidArgumentError", "OutOfBoundsError", "NotAllocatedError", "LayoutError",
    "UnknownTypeError", "FreedBufferError", "OutOfMemoryError", "UnsupportedError", "BackendError",
    # element types and values
    "Type", "to_type", "row_size", "quantize", "dequantize",
    # tensors and their memory
    "Tensor", "Buffer", "BufferType", "cpu_buffer_type", "cuda_buffer_type", "cuda_host_buffer_type",
    # backends and events; a device's link
    "Backend", "CPUBackend", "DummyBackend", "StandinBackend", "CUDABackend", "Event", "measure_link",
    # ops and graphs (the ops themselves: ferry.ops)
    "ops", "Graph", "GraphAllocator",
    # copies of split inputs: policies and 2-D copies (the copy path: ferry.copy_path; plans and their cost:
    # ferry.plan)
    "CopyPolicy", "Copy2D", "copy_path", "plan",
    # the scheduler, the KV caches (the paged one: ferry.paged) and a decode step
    "Scheduler", "KVCache", "paged", "block_pool", "attention_step", "layer_split", "StepGraph",
    # where each layer's KV should live: the step's cost model, the planner and the rules (ferry.residency)
    "residency",
    # numpy, PyTorch and CuPy without copies
    "from_array",
]
