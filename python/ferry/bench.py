"""`ferry bench`: the analogue of llama.cpp's batched-bench generation phase, with real copies and timings.

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

import argparse
import gc
import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, TextIO, Tuple

import numpy as np

from .backend import Backend, CPUBackend, StandinBackend
from .errors import InvalidArgumentError, UnsupportedError
from .graph import Graph
from .kv import KVCache
from .ops import attn_decode
from .sched import Scheduler
from .tensor import Tensor
from .types import Type, row_size, to_type

POLICIES = ("flat", "ranges", "plan")
KV_TYPES = ("f32", "f16", "q8_0")


def check_run_options(type_kv: str, head_dim: int, n_head: int, n_head_kv: int, policies: Sequence[str],
                      backend: str) -> None:
    """The options bench and validate share: raise InvalidArgumentError for any that cannot run."""
    if type_kv not in KV_TYPES:
        raise InvalidArgumentError(f"--type {type_kv!r}: attention reads {', '.join(KV_TYPES)}")
    if type_kv == "q8_0" and head_dim % 32:
        raise InvalidArgumentError(f"--type q8_0 needs --head-dim a multiple of 32, got {head_dim}")
    if n_head % n_head_kv:
        raise InvalidArgumentError(f"--heads {n_head} is not a multiple of --kv-heads {n_head_kv}")
    if not policies:
        raise InvalidArgumentError("--policy: give at least one policy")
    for p in policies:
        if p not in POLICIES:
            raise InvalidArgumentError(f"--policy {p!r}: known policies are {', '.join(POLICIES)}")
    if len(set(policies)) != len(policies):
        raise InvalidArgumentError(f"--policy lists a policy twice: {','.join(policies)}")
    if backend not in ("auto", "cpu", "cuda"):
        raise InvalidArgumentError(f"--backend {backend!r}: auto, cpu or cuda")


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
    policies: Tuple[str, ...] = ("flat", "ranges")
    unified: bool = True
    backend: str = "auto"
    pad: int = 1
    repeat: int = 1
    seed: int = 0
    v_trans: bool = False  # V stored transposed (flash attention off): a gap after every channel row
    compact: bool = False  # also run each non-flat policy with compact staging

    def check(self) -> None:
        """Raise InvalidArgumentError for any option that cannot run."""
        for name, value in (("-c", self.n_ctx), ("-npp", self.npp), ("-ntg", self.ntg), ("--layers", self.n_layer),
                            ("--heads", self.n_head), ("--head-dim", self.head_dim), ("--kv-heads", self.n_head_kv),
                            ("--pad", self.pad), ("--repeat", self.repeat)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")
        check_run_options(self.type_kv, self.head_dim, self.n_head, self.n_head_kv, self.policies, self.backend)
        if self.v_trans and self.type_kv == "q8_0":
            raise InvalidArgumentError("--v-trans needs --type f32 or f16: a transposed V cannot hold q8_0 blocks")
        if not self.npl:
            raise InvalidArgumentError("-npl: give at least one number of sequences")
        for npl in self.npl:
            if isinstance(npl, bool) or not isinstance(npl, int) or npl <= 0:
                raise InvalidArgumentError(f"-npl {npl!r} is not a positive integer")
            if self.n_ctx % npl:
                raise InvalidArgumentError(f"-npl {npl}: the context of {self.n_ctx} cells does not split into "
                                           f"{npl} equal streams")
            if self.npp + self.ntg > self.n_ctx // npl:
                raise InvalidArgumentError(f"-npl {npl}: a stream holds {self.n_ctx // npl} cells, fewer than "
                                           f"-npp + -ntg = {self.npp + self.ntg}")

    @property
    def n_embd(self) -> int:
        return self.head_dim * self.n_head_kv

    @property
    def cells(self) -> int:
        """L: cells each sequence reaches (npp + ntg)."""
        return self.npp + self.ntg

    def n_kv(self, npl: int, step: int) -> int:
        """The split cache's window at a step: the sequences' length rounded up to pad, at most kv_size."""
        need = self.npp + step + 1
        return min((need + self.pad - 1) // self.pad * self.pad, self.n_ctx // npl)


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
        return f"{self.policy}+compact" if self.compact else self.policy

    @property
    def copy_bandwidth(self) -> float:
        """Bytes copied per second of copy time (0 when nothing was copied)."""
        return self.bytes_copied / self.copy_s if self.copy_s > 0 else 0.0

    def as_dict(self) -> Dict[str, object]:
        """The --json object: the keys the issue names, then compact staging and the split's memory."""
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
        return next(r for r in self.rows if (r.npl, r.policy, r.unified, r.compact) == (npl, policy, unified, compact))

    def variants(self) -> List[Tuple[str, bool]]:
        """(policy, compact) in table order: every policy, then the non-flat ones with compact staging."""
        return variants(self.config)

    def gain(self, r: BenchRow) -> Optional[float]:
        """tokens/s over that of flat (same npl and layout) minus 1; None without a flat run."""
        if "flat" not in self.config.policies:
            return None
        return r.tokens_per_s / self.row(r.npl, "flat", r.unified).tokens_per_s - 1.0

    def outputs_identical(self, npl: int) -> bool:
        """Did every run of npl (each policy, both layouts) produce the same attention outputs?"""
        return len({r.output_sha256 for r in self.rows if r.npl == npl}) == 1


def variants(cfg: BenchConfig) -> List[Tuple[str, bool]]:
    """(policy, compact) runs of a configuration: compact staging gathers whatever the policy, so
    flat has no compact variant."""
    out = [(p, False) for p in cfg.policies]
    if cfg.compact:
        out += [(p, True) for p in cfg.policies if p != "flat"]
    return out


class Progress:
    """A progress bar written to a stream with carriage returns (stderr, never stdout), or nothing."""

    def __init__(self, total: int, stream: Optional[TextIO], width: int = 30) -> None:
        self.total, self.done, self.stream, self.width = max(total, 1), 0, stream, width
        self.label = ""

    def step(self, n: int = 1, label: Optional[str] = None) -> None:
        self.done = min(self.done + n, self.total)
        if label is not None:
            self.label = label
        if self.stream is None:
            return
        filled = self.width * self.done // self.total
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(f"\r[{bar}] {self.done}/{self.total} {self.label}\x1b[K")
        self.stream.flush()

    def close(self) -> None:
        if self.stream is not None:
            self.stream.write("\n")
            self.stream.flush()


def split_backend(name: str) -> Backend:
    """The backend attention runs on: CUDA, the CPU stand-in device, or (auto) CUDA when a device is usable."""
    from . import cuda_available
    from .cuda import CUDABackend

    if name == "cuda" or (name == "auto" and cuda_available()):
        return CUDABackend()
    if name in ("auto", "cpu"):
        return StandinBackend()
    raise InvalidArgumentError(f"--backend {name!r}: auto, cpu or cuda")


def random_rows(type_: Type, cells: int, n_embd: int, seed: Sequence[int]) -> bytes:
    """cells rows of n_embd values of a type (f32, f16 or q8_0), random and determined by seed: each
    sequence's own K or V content in `ferry bench` and `ferry validate`."""
    rng = np.random.default_rng(list(seed))
    if type_ == Type.Q8_0:
        blocks = np.zeros((cells, n_embd // 32), np.dtype([("d", "<f2"), ("qs", "i1", 32)]))
        blocks["d"] = rng.uniform(2.0 ** -9, 2.0 ** -7, size=blocks.shape).astype(np.float16)
        blocks["qs"] = rng.integers(-127, 128, size=(cells, n_embd // 32, 32))
        return blocks.tobytes()
    dtype = np.float32 if type_ == Type.F32 else np.float16
    return rng.uniform(-1.0, 1.0, size=(cells, n_embd)).astype(dtype).tobytes()


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
            pinned: bool, progress: Progress, compact: bool = False) -> BenchRow:
    """ntg timed decode steps of one configuration (after one untimed warm-up step)."""
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
        progress.step(label=label)
    run.sched.close()
    split_memory = run.split_memory
    del run, graph
    gc.collect()  # the cache and its tensors form a cycle: free its (pinned) memory before the next run
    tps = npl * cfg.ntg / decode if decode > 0 else math.inf
    return BenchRow(npl, policy, unified, tps, decode, copy, compute, copied, read, digest.hexdigest(), compact,
                    split_memory)


def run_bench(cfg: BenchConfig, progress: Optional[TextIO] = None) -> BenchResult:
    """Every (npl, policy, layout) of cfg; progress is the stream for the bar (None: no bar).
    With repeat > 1 each runs that many times, interleaved, and the row is its fastest run."""
    cfg.check()
    split = split_backend(cfg.backend)
    cpu = CPUBackend()
    pinned = not isinstance(split, StandinBackend)
    layouts = (False, True) if cfg.unified else (False,)
    runs_of = variants(cfg)
    bar = Progress(len(cfg.npl) * len(runs_of) * len(layouts) * cfg.ntg * cfg.repeat, progress)
    rows = []
    try:
        for npl in cfg.npl:
            runs: Dict[Tuple[bool, str, bool], List[BenchRow]] = {}
            for _ in range(cfg.repeat):
                for unified in layouts:
                    for policy, compact in runs_of:
                        runs.setdefault((unified, policy, compact), []).append(
                            run_one(cfg, split, cpu, npl, policy, unified, pinned, bar, compact))
            for key in [(u, p, c) for u in layouts for p, c in runs_of]:
                got = runs[key]
                if len({r.output_sha256 for r in got}) != 1:
                    raise AssertionError(f"npl {npl} {key}: repeated runs gave different attention outputs")
                rows.append(min(got, key=lambda r: r.decode_s))
    finally:
        bar.close()
    memory = "pinned host memory" if pinned else "pageable host memory"
    return BenchResult(cfg, split.name, memory, rows)


# ------------------------------------------------------------ output


def fmt_seconds(s: float) -> str:
    """A duration with a unit that keeps 3-4 significant digits: µs, ms or s."""
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1.0:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.3f} s"


def fmt_mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def fmt_gbps(bps: float) -> str:
    return f"{bps / 1e9:.2f} GB/s"


def fmt_gain(g: Optional[float]) -> str:
    if g is None:
        return "-"
    return f"{g * 100:+.1f}%"


def format_result(res: BenchResult) -> str:
    """The header, one table row per (npl, policy) with the unified cache's figures beside it,
    and whether the outputs agreed."""
    cfg = res.config
    lines = [
        f"split backend: {res.split_name}; KV cache in {res.cache_memory} (CPU backend)",
        f"-c {cfg.n_ctx}, -npp {cfg.npp}, -ntg {cfg.ntg}, {cfg.n_layer} layers, K/V {cfg.type_kv}, "
        f"{cfg.n_head} heads x {cfg.head_dim}, {cfg.n_head_kv} KV heads, pad {cfg.pad}"
        + (", V transposed" if cfg.v_trans else "")
        + (f", fastest of {cfg.repeat} runs" if cfg.repeat > 1 else ""),
        "copy and bytes: every layer's K and V windows, summed over the ntg steps",
        "",
    ]
    head = ["npl", "policy", "tok/s", "gain", "decode", "copy", "compute", "copied", "read", "copy bw", "split mem"]
    if cfg.unified:
        head += ["unified tok/s", "gain", "copy", "copied"]
    body = []
    for npl in cfg.npl:
        for policy, compact in res.variants():
            r = res.row(npl, policy, False, compact)
            cells = [str(npl), r.label, f"{r.tokens_per_s:,.1f}", fmt_gain(res.gain(r)), fmt_seconds(r.decode_s),
                     fmt_seconds(r.copy_s), fmt_seconds(r.compute_s), fmt_mib(r.bytes_copied), fmt_mib(r.bytes_read),
                     fmt_gbps(r.copy_bandwidth), fmt_mib(r.split_memory)]
            if cfg.unified:
                u = res.row(npl, policy, True, compact)
                cells += [f"{u.tokens_per_s:,.1f}", fmt_gain(res.gain(u)), fmt_seconds(u.copy_s),
                          fmt_mib(u.bytes_copied)]
            body.append(cells)
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    for i, line in enumerate([head, *body]):
        lines.append("  ".join(x.ljust(w) if j == 1 else x.rjust(w) for j, (x, w) in enumerate(zip(line, widths))))
    lines.append("")
    for npl in cfg.npl:
        runs = "policies and both caches" if cfg.unified else "policies"
        same = "identical" if res.outputs_identical(npl) else "DIFFERENT"
        lines.append(f"npl {npl}: attention outputs {same} across {runs}")
    return "\n".join(lines)


def check_plot_available() -> None:
    """Raise UnsupportedError, saying how to install it, when matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UnsupportedError("--plot needs matplotlib: pip install 'ferry[plot]' (or matplotlib)") from None


def plot_result(res: BenchResult, path: str) -> None:
    """A PNG bar chart of tokens/s by npl, one bar per policy (and per policy on the unified cache)."""
    check_plot_available()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = res.config
    series = [(p, c, False) for p, c in res.variants()] + (
        [(p, c, True) for p, c in res.variants()] if cfg.unified else [])
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for i, (policy, compact, unified) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(cfg.npl))]
        ys = [res.row(npl, policy, unified, compact).tokens_per_s for npl in cfg.npl]
        name = f"{policy}{'+compact' if compact else ''}{' (unified)' if unified else ''}"
        ax.bar(xs, ys, width, label=name, hatch="//" if unified else None)
    ax.set_xticks(range(len(cfg.npl)))
    ax.set_xticklabels([str(n) for n in cfg.npl])
    ax.set_xlabel("sequences (npl)")
    ax.set_ylabel("generated tokens / s")
    ax.set_title(f"ferry bench on {res.split_name}: -c {cfg.n_ctx} -npp {cfg.npp} -ntg {cfg.ntg}, "
                 f"{cfg.n_layer} layers, {cfg.type_kv}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def progress_stream() -> Optional[TextIO]:
    """stderr when it is a terminal (a bar there), else None (no bar in logs and pipes)."""
    return sys.stderr if sys.stderr.isatty() else None


# ------------------------------------------------------------ the command


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]",
               int_list: Callable[[str], List[int]]) -> argparse.ArgumentParser:
    """The `bench` verb's options, on the `ferry` command's subparsers."""
    d = BenchConfig()
    bp = sub.add_parser("bench", help="decode steps over a host KV cache: tokens/s, copy time and bytes per "
                                      "copy policy (llama-batched-bench's generation phase)",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bp.add_argument("-c", type=int, default=d.n_ctx, metavar="N_CTX", help=f"cells in all streams (default {d.n_ctx})")
    bp.add_argument("-npl", type=int_list, default=list(d.npl), metavar="N,N,...",
                    help=f"numbers of sequences, one stream each (default {','.join(map(str, d.npl))})")
    bp.add_argument("-npp", type=int, default=d.npp, help=f"prompt cells per sequence (default {d.npp})")
    bp.add_argument("-ntg", type=int, default=d.ntg, help=f"decode steps (tokens generated per sequence; "
                                                         f"default {d.ntg})")
    bp.add_argument("--layers", type=int, default=d.n_layer, help=f"default {d.n_layer}")
    bp.add_argument("--type", default=d.type_kv, choices=KV_TYPES, help=f"K and V type (default {d.type_kv})")
    bp.add_argument("--heads", type=int, default=d.n_head, help=f"query heads (default {d.n_head})")
    bp.add_argument("--head-dim", type=int, default=d.head_dim, help=f"default {d.head_dim}")
    bp.add_argument("--kv-heads", type=int, default=d.n_head_kv, help=f"default {d.n_head_kv}")
    bp.add_argument("--policy", type=_policy_list, default=list(d.policies), metavar="P,P,...",
                    help=f"copy policies: flat, ranges, plan (default {','.join(d.policies)})")
    bp.add_argument("--unified", action=argparse.BooleanOptionalAction, default=d.unified,
                    help="also run a unified cache of the same sequences, for comparison (default on)")
    bp.add_argument("--backend", default=d.backend, choices=("auto", "cpu", "cuda"),
                    help="the split's backend: cuda, cpu (the stand-in device), auto (cuda when a device is usable)")
    bp.add_argument("--pad", type=int, default=d.pad,
                    help=f"round the split cache's n_kv up to this (llama.cpp: 256; default {d.pad}: exact)")
    bp.add_argument("--repeat", type=int, default=d.repeat,
                    help="run each configuration this many times (interleaved) and keep the fastest (default 1)")
    bp.add_argument("--v-trans", action="store_true",
                    help="V stored transposed (flash attention off): a gap after every channel row, even unified")
    bp.add_argument("--compact", action="store_true",
                    help="also run each non-flat policy with compact staging (the split holds only the bytes read)")
    bp.add_argument("--json", action="store_true", help="a JSON list of objects instead of the table")
    bp.add_argument("--plot", metavar="FILE.png", help="also write a PNG chart of tokens/s (needs matplotlib)")
    return bp


def _policy_list(text: str) -> List[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError("expected at least one policy")
    return values


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    return BenchConfig(n_ctx=args.c, npl=tuple(args.npl), npp=args.npp, ntg=args.ntg, n_layer=args.layers,
                       type_kv=args.type, n_head=args.heads, head_dim=args.head_dim, n_head_kv=args.kv_heads,
                       policies=tuple(args.policy), unified=args.unified, backend=args.backend, pad=args.pad,
                       repeat=args.repeat, v_trans=args.v_trans, compact=args.compact)


def main(args: argparse.Namespace) -> int:
    """Run `ferry bench`: the table (or JSON) on stdout, the progress bar on stderr, the chart to --plot."""
    cfg = config_from_args(args)
    cfg.check()
    if args.plot:
        check_plot_available()
    res = run_bench(cfg, progress_stream())
    if args.json:
        print(f"ferry bench: split backend {res.split_name}, KV cache in {res.cache_memory}", file=sys.stderr)
        print(json.dumps([r.as_dict() for r in res.rows], indent=2))
    else:
        print(format_result(res))
    if args.plot:
        plot_result(res, args.plot)
        print(f"ferry bench: wrote {args.plot}", file=sys.stderr)
    return 0
