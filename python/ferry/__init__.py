"""ferry: copy the ranges of a multi-stream KV-cache window, not the span.

Python objects over the C library: Tensor (ggml order: ne[0] fastest, byte strides nb),
Buffer and BufferType, CPUBackend, DummyBackend and StandinBackend (a GPU's stand-in),
per-kind transfer counters (Stats); ops (add, mul, scale, dup, concat, pad, mean,
attn_decode), Graph and GraphAllocator; KVCache and its windows, the Scheduler and its
copy policies; copy plans and their cost (plan_copy, plan_of, CopyCostModel); CUDABackend
and Events.
Every failure raises FerryError (a subclass per C status) with the C message.
"""

from __future__ import annotations

from typing import Any, Dict

from . import ops
from ._binding import LIB_PATH, ffi, lib
from .alloc import GraphAllocator, Placement
from .backend import Backend, CPUBackend, DummyBackend, StandinBackend
from .buffer import BorrowedBuffer, Buffer, BufferType, cpu_buffer_type
from .copy2d import Copy2D
from .copy_path import CopyRanges, bytes_read, copy_input, copy_ranges_of
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
from .kv import KVCache, KVParams
from .ops import add, attn_decode, concat, dup, mean, mul, pad, scale
from .plan import (
    CopyCostModel,
    Explanation,
    cost_model,
    explain,
    explain_tensor,
    flat_cost,
    layout_view,
    plan_copy,
    plan_cost,
    plan_of,
    plan_pays,
)
from .policy import CopyPolicy
from .sched import Input, Scheduler, Split
from .stats import KINDS, CopyStats, SchedStats, Stats
from .tensor import Tensor, tensor_copy
from .types import Type, blck_size, numpy_dtype, row_size, to_type, type_from_dtype, type_name, type_size

__version__ = ffi.string(lib.ferry_version()).decode()


def build_info() -> Dict[str, Any]:
    """What this build contains: version, whether CUDA was compiled in (and whether against the
    test-only fake runtime, whose timings mean nothing), the library's path."""
    return {
        "version": __version__,
        "cuda": bool(lib.ferry_built_with_cuda()),
        "fake_cudart": bool(lib.ferry_built_with_fake_cudart()),
        "library": LIB_PATH,
    }


__all__ = [
    "ffi", "lib", "build_info", "cuda_available",
    "Backend", "CPUBackend", "DummyBackend", "StandinBackend", "Buffer", "BufferType", "cpu_buffer_type",
    "Tensor", "tensor_copy", "Stats", "KINDS", "BorrowedBuffer",
    "CopyPolicy", "CopyRanges", "CopyStats", "bytes_read", "copy_input", "copy_ranges_of",
    "Copy2D", "CopyCostModel", "Explanation", "plan_copy", "plan_of", "layout_view", "plan_cost", "flat_cost",
    "plan_pays", "cost_model", "explain", "explain_tensor",
    "KVCache", "KVParams", "Scheduler", "Split", "Input", "SchedStats",
    "CUDABackend", "Event", "cuda_device_count", "cuda_buffer_type", "cuda_host_buffer_type",
    "ops", "add", "mul", "scale", "dup", "concat", "pad", "mean", "attn_decode", "Graph", "GraphAllocator", "Placement",
    "Type", "to_type", "type_name", "type_size", "blck_size", "row_size", "numpy_dtype", "type_from_dtype",
    "FerryError", "InvalidArgumentError", "OutOfBoundsError", "NotAllocatedError", "LayoutError",
    "UnknownTypeError", "FreedBufferError", "OutOfMemoryError", "UnsupportedError", "BackendError",
]
