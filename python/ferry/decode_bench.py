"""The decode benchmark `ferry bench` runs: llama.cpp's batched-bench generation phase, real copies and timings.

A KV cache lives in host memory (pinned when the split backend is a GPU); each decode step
runs one graph: per layer, the split's K and V windows are copied in by the scheduler's copy
policy and decode attention runs on the split backend (CUDA, or the CPU stand-in device).

Layouts, per number of sequences npl, with L = npp + ntg cells per sequence:

- split into streams (non-unified): npl streams of kv_size = n_ctx / npl cells; stream i
  holds sequence i in its first L cells. At step t (0..ntg-1) each sequence has npp + t + 1
  cells, and the window is the first n_kv cells of every stream (n_kv = that length rounded
  up to --pad, at most kv_size).
- unified: one stream of n_ctx cells; sequence i holds cells [i*L, (i+1)*L). The split's
  input is the first npl*L cells, one dense range, read by attention through a view with
  npl streams of L cells (stream stride L cells) and the same per-sequence lengths. It reads
  the same cells as the split cache and, being one range, copies the same way under every
  policy; it copies the not-yet-generated cells of each block too (ntg - t - 1 per sequence
  at step t), as a unified cache whose n_kv covers them would.

Both layouts hold the same bytes per sequence and run the same queries, so their attention
outputs are compared (sha256 over every output of every step and layer).

Timing: a step's decode time is the wall time of Scheduler.compute on an allocated graph
(the input copies, attention, and synchronization); building the graph in Python and the
scheduler's allocation are outside it. One untimed warm-up step (the largest, the last)
runs first, so no timed step allocates. tokens/s = npl * ntg / the sum of the steps' times.
Copy time and bytes are the scheduler's statistics summed over steps (every layer's K and V).
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from .backend import Backend, CPUBackend, StandinBackend
from .errors import InvalidArgumentError
from .graph import Graph
from .kv import KVCache
from .ops import attn_decode
from .sched import Scheduler
from .tensor import Tensor
from .types import row_size, to_type
from .workload import (
    POLICIES,
    check_positive,
    check_run_options,
    check_streams,
    n_kv_for,
    random_rows,
    split_backend,
)
from .workload import variants as workload_variants

#: Called after each decode step with the run's label ("npl 2 ranges unified").
OnStep = Callable[[str], None]


@dataclass(frozen=True)
class BenchConfig:
    """What `ferry bench` runs: its options, with the defaults of a run that takes seconds on a CPU."""

    n_ctx: int = 4096
    npl: Tuple[int, ...] = (2, 4)
    npp: int = 256
    ntg: int = 8
    n_layer: int = 2
    type_kv: str = "f16"
    n_head: int = 8
    head_dim: int = 64
    n_head_kv: int = 2
    policies: Tuple[str, ...] = POLICIES
    unified: bool = True
    backend: str = "auto"
    pad: int = 1
    repeat: int = 1
    seed: int = 0
    v_trans: bool = False  # V stored transposed (flash attention off): a gap after every channel row
    compact: bool = False  # also run each non-flat policy with compact staging

    def check(self) -> None:
        """Raise InvalidArgumentError for any option that cannot run."""
        check_positive((("-c", self.n_ctx), ("-npp", self.npp), ("-ntg", self.ntg), ("--layers", self.n_layer),
                        ("--heads", self.n_head), ("--head-dim", self.head_dim), ("--kv-heads", self.n_head_kv),
                        ("--pad", self.pad), ("--repeat", self.repeat)))
        check_run_options(self.type_kv, self.head_dim, self.n_head, self.n_head_kv, self.policies, self.backend)
        if self.v_trans and self.type_kv == "q8_0":
            raise InvalidArgumentError("--v-trans needs --type f32 or f16: a transposed V cannot hold q8_0 blocks")
        if not self.npl:
            raise InvalidArgumentError("-npl: give at least one number of sequences")
        for npl in self.npl:
            if isinstance(npl, bool) or not isinstance(npl, int) or npl <= 0:
                raise InvalidArgumentError(f"-npl {npl!r} is not a positive integer")
            check_streams(self.n_ctx, npl)
            if self.npp + self.ntg > self.n_ctx // npl:
                raise InvalidArgumentError(f"-npl {npl}: a stream holds {self.n_ctx // npl} cells, fewer than "
                                           f"-npp + -ntg = {self.npp + self.ntg}")

    @property
    def n_embd(self) -> int:
        """Values per cell of K (or V): head_dim * n_head_kv."""
        return self.head_dim * self.n_head_kv

    @property
    def cells(self) -> int:
        """L: cells each sequence reaches (npp + ntg)."""
        return self.npp + self.ntg

    def n_kv(self, npl: int, step: int) -> int:
        """The split cache's window at a step.

        Parameters
        ----------
        npl : int
            Sequences (streams).
        step : int
            0..ntg-1.

        Returns
        -------
        int
            The sequences' length at the step rounded up to pad, at most kv_size.
        """
        return n_kv_for(self.npp, step + 1, self.pad, self.n_ctx // npl)

    @property
    def n_steps(self) -> int:
        """Decode steps of a whole run: every npl, variant, layout and repeat."""
        layouts = 2 if self.unified else 1
        return len(self.npl) * len(variants(self)) * layouts * self.ntg * self.repeat


@dataclass(frozen=True)
class BenchRow:
    """One run: a number of sequences, a copy policy, a cache layout, and what ntg steps measured."""

    npl: int
    policy: str
    unified: bool
    tokens_per_s: float
    decode_s: float
    copy_s: float
    compute_s: float
    bytes_copied: int
    bytes_read: int
    output_sha256: str = field(repr=False)
    compact: bool = False
    split_memory: int = 0  # bytes the scheduler held on the split backend (copies and outputs)

    @property
    def label(self) -> str:
        """The policy, with "+compact" for compact staging."""
        return f"{self.policy}+compact" if self.compact else self.policy

    @property
    def copy_bandwidth(self) -> float:
        """Bytes copied per second of copy time (0 when nothing was copied)."""
        return self.bytes_copied / self.copy_s if self.copy_s > 0 else 0.0

    def as_dict(self) -> Dict[str, object]:
        """The row as `ferry bench --json` writes it: the run, its speed and bytes, compact staging and
        the split's memory."""
        return {"npl": self.npl, "policy": self.policy, "unified": self.unified, "tokens_per_s": self.tokens_per_s,
                "copy_s": self.copy_s, "bytes_copied": self.bytes_copied, "bytes_read": self.bytes_read,
                "compact": self.compact, "split_memory_bytes": self.split_memory}


@dataclass
class BenchResult:
    """Every run of a configuration, and which backends ran it."""

    config: BenchConfig
    split_name: str
    cache_memory: str
    rows: List[BenchRow]

    def row(self, npl: int, policy: str, unified: bool = False, compact: bool = False) -> BenchRow:
        """The row of one run.

        Parameters
        ----------
        npl : int
        policy : str
        unified : bool, optional
        compact : bool, optional

        Returns
        -------
        BenchRow

        Raises
        ------
        StopIteration
            For a run the configuration did not make.
        """
        return next(r for r in self.rows if (r.npl, r.policy, r.unified, r.compact) == (npl, policy, unified, compact))

    def variants(self) -> List[Tuple[str, bool]]:
        """(policy, compact) in table order: every policy, then the non-flat ones with compact staging."""
        return variants(self.config)

    def gain(self, r: BenchRow) -> Optional[float]:
        """A row's tokens/s over that of flat (same npl and layout), minus 1.

        Parameters
        ----------
        r : BenchRow

        Returns
        -------
        float or None
            None without a flat run.
        """
        if "flat" not in self.config.policies:
            return None
        return r.tokens_per_s / self.row(r.npl, "flat", r.unified).tokens_per_s - 1.0

    def outputs_identical(self, npl: int) -> bool:
        """Whether every run of npl (each policy, both layouts) produced the same attention outputs.

        Parameters
        ----------
        npl : int

        Returns
        -------
        bool
        """
        return len({r.output_sha256 for r in self.rows if r.npl == npl}) == 1


def variants(cfg: BenchConfig) -> List[Tuple[str, bool]]:
    """The (policy, compact) runs of a configuration (see workload.variants).

    Parameters
    ----------
    cfg : BenchConfig

    Returns
    -------
    list of (str, bool)
    """
    return workload_variants(cfg.policies, cfg.compact)


class _Run:
    """One configuration's cache, queries and scheduler, stepped through ntg decode steps."""

    def __init__(self, cfg: BenchConfig, split: Backend, cpu: Backend, npl: int, policy: str, unified: bool,
                 pinned: bool, compact: bool = False) -> None:
        self.cfg, self.split, self.npl, self.unified = cfg, split, npl, unified
        ty = to_type(cfg.type_kv)
        self.type = ty
        n_stream = 1 if unified else npl
        self.kv = KVCache(ty, ty, cfg.head_dim, cfg.n_head_kv, cfg.n_ctx, n_stream, cfg.n_layer, v_trans=cfg.v_trans,
                          pinned=pinned)
        self.kv.buffer.clear(0)
        row = row_size(ty, cfg.n_embd)
        self.row = row
        L = cfg.cells
        for layer in range(cfg.n_layer):
            for which, t in (("k", self.kv.k(layer)), ("v", self.kv.v(layer))):
                for i in range(npl):  # sequence i: the same values in either layout
                    data = random_rows(ty, L, cfg.n_embd, (cfg.seed, layer, i, which == "v"))
                    cell0 = i * L if unified else i * self.kv.kv_size
                    if which == "v" and cfg.v_trans:
                        self._set_transposed(t, data, i * L if unified else 0, 0 if unified else i)
                    else:
                        t.set(data, cell0 * row)
        rng = np.random.default_rng([cfg.seed, 1 << 20])
        self.q = [Tensor.from_numpy(split, rng.uniform(-1, 1, (npl, 1, cfg.n_head, cfg.head_dim)).astype(np.float32),
                                    name=f"q{layer}") for layer in range(cfg.n_layer)]
        self.kv_len = Tensor.from_numpy(split, np.zeros(npl, np.int32), name="kv_len")
        self.sched = Scheduler([split, cpu], policy=policy, compact=compact)
        self.split_memory = 0

    def _set_transposed(self, t: Tensor, data: bytes, cell0: int, stream: int) -> None:
        """Write cells [cell0, cell0 + L) of a transposed V ([kv_size, n_embd, n_stream]): one run of
        cells per channel, the channel rows kv_size cells apart."""
        cfg, elem, kv_size = self.cfg, self.type.size, self.kv.kv_size
        cells = np.frombuffer(data, np.uint8).reshape(cfg.cells, cfg.n_embd, elem)
        runs = np.ascontiguousarray(cells.transpose(1, 0, 2)).tobytes()  # [channel][cell]
        base = (stream * cfg.n_embd * kv_size + cell0) * elem
        t.set_2d(runs, base, cfg.cells * elem, cfg.n_embd, kv_size * elem, cfg.cells * elem)

    def _windows(self, layer: int, n_kv: int) -> Tuple[Tensor, Tensor]:
        if not self.unified:
            return self.kv.window(layer, n_kv)
        # one stream; sequence i in cells [i*L, (i+1)*L): viewed as npl streams of L cells
        cfg, ty, L = self.cfg, self.type, self.cfg.cells
        ne = [cfg.head_dim, cfg.n_head_kv, L, self.npl]
        nb = [ty.size, row_size(ty, cfg.head_dim), self.row, self.row * L]
        k = self.kv.k(layer).view(ne, nb, name=f"k{layer}_u").permute(0, 2, 1, 3)
        if cfg.v_trans:
            elem, kv_size = ty.size, self.kv.kv_size
            ne_v = [L, cfg.n_head_kv, cfg.head_dim, self.npl]
            nb_v = [elem, elem * kv_size * cfg.head_dim, elem * kv_size, elem * L]
            v = self.kv.v(layer).view(ne_v, nb_v, name=f"v{layer}_u").permute(0, 2, 1, 3)
        else:
            v = self.kv.v(layer).view(ne, nb, name=f"v{layer}_u").permute(0, 2, 1, 3)
        return k, v

    def graph(self, step: int) -> Graph:
        """Step's graph, allocated: per layer attention over its K and V windows, on the split backend."""
        n_kv = self.cfg.n_kv(self.npl, step)
        self.sched.clear_pins()  # last step's nodes are gone
        outs = []
        for layer in range(self.cfg.n_layer):
            k, v = self._windows(layer, n_kv)
            out = attn_decode(self.q[layer], k, v, self.kv_len, v_trans=self.cfg.v_trans,
                              name=f"attn{layer}").set_output()
            self.sched.pin(out, self.split)
            outs.append(out)
        graph = Graph(*outs)
        self.sched.alloc(graph)
        self.split_memory = max(self.split_memory, self.sched.buffer_size(self.split))
        self.kv_len.set(np.full(self.npl, self.cfg.npp + step + 1, np.int32))
        return graph

    def step(self, graph: Graph) -> float:
        t0 = time.perf_counter()
        self.sched.compute(graph)
        return time.perf_counter() - t0


def run_one(cfg: BenchConfig, split: Backend, cpu: Backend, npl: int, policy: str, unified: bool,
            pinned: bool, on_step: Optional[OnStep] = None, compact: bool = False) -> BenchRow:
    """ntg timed decode steps of one configuration, after one untimed warm-up step.

    Parameters
    ----------
    cfg : BenchConfig
    split, cpu : Backend
        The split's backend and the CPU backend.
    npl : int
    policy : str
    unified : bool
        The unified cache (one stream) instead of one stream per sequence.
    pinned : bool
        The cache in CUDA's pinned host memory.
    on_step : callable, optional
        Called with the run's label after each step.
    compact : bool, optional
        Compact staging.

    Returns
    -------
    BenchRow
    """
    run = _Run(cfg, split, cpu, npl, policy, unified, pinned, compact)
    run.step(run.graph(cfg.ntg - 1))  # warm-up: the largest graph, so no timed step allocates
    decode = copy = compute = 0.0
    copied = read = 0
    digest = hashlib.sha256()
    label = f"npl {npl} {policy}{'+compact' if compact else ''}{' unified' if unified else ''}"
    for t in range(cfg.ntg):
        graph = run.graph(t)
        decode += run.step(graph)
        st = run.sched.stats
        copy += st.copy_seconds
        compute += st.compute_seconds
        copied += st.bytes_copied
        read += st.bytes_read
        for out in graph.outputs:
            digest.update(out.get())
        if on_step is not None:
            on_step(label)
    run.sched.close()
    run.kv.close()  # its (maybe pinned) memory is freed before the next run
    split_memory = run.split_memory
    tps = npl * cfg.ntg / decode if decode > 0 else math.inf
    return BenchRow(npl, policy, unified, tps, decode, copy, compute, copied, read, digest.hexdigest(), compact,
                    split_memory)


def run_bench(cfg: BenchConfig, on_step: Optional[OnStep] = None,
              run: Callable[..., BenchRow] = run_one) -> BenchResult:
    """Run every (npl, policy, layout) of a configuration.

    With repeat > 1 each runs that many times, interleaved, and its row is the fastest run.

    Parameters
    ----------
    cfg : BenchConfig
        What to run.
    on_step : callable, optional
        Called with the run's label after each decode step (`BenchConfig.n_steps` calls in all).
    run : callable, optional
        Runs one configuration, with `run_one`'s arguments (the default; a test counts its calls).

    Returns
    -------
    BenchResult
        A row per (npl, layout, variant), in that order.

    Raises
    ------
    InvalidArgumentError
        For options that cannot run.
    FerryError
        When the split backend cannot be made or a run fails.
    AssertionError
        When repeated runs of one configuration give different attention outputs.
    """
    cfg.check()
    split = split_backend(cfg.backend)
    cpu = CPUBackend()
    pinned = not isinstance(split, StandinBackend)
    layouts = (False, True) if cfg.unified else (False,)
    runs_of = variants(cfg)
    rows = []
    for npl in cfg.npl:
        runs: Dict[Tuple[bool, str, bool], List[BenchRow]] = {}
        for _ in range(cfg.repeat):
            for unified in layouts:
                for policy, compact in runs_of:
                    runs.setdefault((unified, policy, compact), []).append(
                        run(cfg, split, cpu, npl, policy, unified, pinned, on_step, compact))
        for key in [(u, p, c) for u in layouts for p, c in runs_of]:
            got = runs[key]
            if len({r.output_sha256 for r in got}) != 1:
                raise AssertionError(f"npl {npl} {key}: repeated runs gave different attention outputs")
            rows.append(min(got, key=lambda r: r.decode_s))
    memory = "pinned host memory" if pinned else "pageable host memory"
    return BenchResult(cfg, split.name, memory, rows)
