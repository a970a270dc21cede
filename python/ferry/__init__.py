"""ferry: copy the ranges of a multi-stream KV-cache window, not the span.

Python objects over the C library, in layers that import downward only:

- the basics over the binding (ferry._binding, the cffi ffi and lib, which this face does not
  export): errors (FerryError, a subclass per C status, with the C message), element types,
  the counters (Stats, CopyStats, SchedStats), copy policies, Copy2D;
- Tensor (ggml order: ne[0] fastest, byte strides nb);
- buffers and backends: Buffer, BufferType, CPUBackend, StandinBackend (a GPU's stand-in,
  on a link and with a memory size you give it), DummyBackend, CUDABackend, Event; what a
  backend's memory holds (Backend.memory: MemoryInfo) and how fast its link is
  (measure_link: LinkMeasurement, with fit=True its LinkFit; a stand-in's LinkStats);
- ops, functions as ggml's are (add, mul, scale, dup, concat, pad, mean, attn_decode; a + b and
  a * b for add and mul), Graph, GraphAllocator;
- copy plans and their cost (plan_copy, plan_of, CopyCostModel), the copy path;
- the Scheduler, KVCache with its windows, and StepGraph (a decode step's graph, reused
  while its shape holds);
- numpy, PyTorch and CuPy without copies: tensors export themselves (ferry.export: array
  interface, DLPack, CUDA array interface; Tensor.raw), from_array imports (ferry.interop),
  and quantize / dequantize give values of every type (ferry.quant);
- the workloads the command line runs, in ferry.workloads, one module per verb
  (workloads.bench.run_bench, workloads.validate.run_validate, workloads.table.build_table,
  workloads.plan.window_plan), each returning data and printing nothing: a sweep in Python
  builds one ferry.workloads.bench.BenchConfig per point (its fields are `ferry bench`'s
  options) and calls run_bench(cfg), whose BenchResult's rows carry each (npl, policy, cache)
  figure; README.md shows one.

The `ferry` command (ferry.cli) sits on top and is the only part that parses arguments or
prints.
"""

from __future__ import annotations

from typing import Any, Dict

from . import _binding, ops
from .alloc import GraphAllocator, Placement
from .backend import Backend, CPUBackend, DummyBackend, StandinBackend
from .buffer import BorrowedBuffer, Buffer, BufferType, cpu_buffer_type
from .copy2d import Copy2D
from .copy_path import bytes_read, copy_input, copy_ranges_of
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
from .export import TensorBytes
from .graph import Graph
from .interop import ForeignBuffer, from_array
from .kv import KVCache, KVParams, KVWindows
from .link import LinkFit, LinkMeasurement, fit_link, measure_link
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
    ragged_plan_of,
)
from .policy import CopyPolicy
from .quant import dequantize, pack_blocks, quantize
from .residency import (
    STRATEGIES,
    DeviceSpec,
    LayerCost,
    PlanDoesNotFitError,
    ResidencyPlan,
    StepPrediction,
    device_from_backend,
    layers_from_geometry,
    link_groups,
    measure_compute,
    plan_auto,
    plan_first,
    plan_residency,
    plan_round_robin,
    plan_slowest_link,
    predict_step,
)
from .sched import Input, Scheduler, Split
from .stats import KINDS, CopyStats, LinkStats, MemoryInfo, SchedStats, Stats
from .step import StepGraph, StepOutputs, attention_step, layer_split, step_graph
from .tensor import Tensor
from .types import Type, numpy_dtype, row_size, to_type, type_from_dtype

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
    "PlanDoesNotFitError",
    # element types and values
    "Type", "to_type", "row_size", "numpy_dtype", "type_from_dtype", "quantize", "dequantize", "pack_blocks",
    # counters
    "Stats", "KINDS", "CopyStats", "SchedStats", "LinkStats", "MemoryInfo",
    # tensors and their memory
    "Tensor", "Buffer", "BorrowedBuffer", "BufferType", "cpu_buffer_type", "cuda_buffer_type",
    "cuda_host_buffer_type",
    # backends and events; a device's memory and link
    "Backend", "CPUBackend", "DummyBackend", "StandinBackend", "CUDABackend", "Event", "LinkMeasurement",
    "LinkFit", "measure_link", "fit_link",
    # ops and graphs
    "ops", "add", "mul", "scale", "dup", "concat", "pad", "mean", "attn_decode", "Graph", "GraphAllocator",
    "Placement",
    # copies of split inputs: policies, plans and their cost
    "CopyPolicy", "Copy2D", "bytes_read", "copy_input", "copy_ranges_of", "CopyCostModel", "Explanation",
    "plan_copy", "plan_of", "layout_view", "plan_cost", "flat_cost", "plan_pays", "cost_model", "explain",
    "explain_tensor", "ragged_plan_of",
    # the scheduler, the KV cache and a decode step
    "Scheduler", "Split", "Input", "KVCache", "KVParams", "KVWindows", "StepGraph", "StepOutputs",
    "attention_step", "layer_split", "step_graph",
    # where each layer's KV lives: the step's cost model, the planner and the named rules
    "LayerCost", "DeviceSpec", "StepPrediction", "ResidencyPlan", "STRATEGIES", "predict_step", "plan_residency",
    "plan_auto", "plan_first", "plan_round_robin", "plan_slowest_link", "link_groups", "layers_from_geometry",
    "device_from_backend", "measure_compute",
    # numpy, PyTorch and CuPy without copies
    "from_array", "ForeignBuffer", "TensorBytes",
]
