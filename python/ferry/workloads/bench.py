"""The decode benchmark `ferry bench` runs: llama.cpp's batched-bench generation phase, real copies and timings.

A KV cache lives in host memory (pinned when the split backend is a GPU); each decode step
runs one graph: per layer, the split's K and V windows are copied in by the scheduler's copy
policy and decode attention runs on the split backend (CUDA, or the CPU stand-in device, whose
copies are held to an 8 GB/s link unless --link-gbps says otherwise: ferry.workloads.devices).

Layouts, per number of sequences npl, with L = npp + ntg cells per sequence:

- split into streams (non-unified): npl streams of kv_size = n_ctx / npl cells; stream i
  holds sequence i in its first L cells. At step t (0..ntg-1) sequence i has p_i + t + 1 cells,
  p_i its prompt (-npp each, or drawn as --lengths says), and the window is the first n_kv
  cells of every stream (n_kv = the longest length rounded up to --pad, 256 as llama.cpp pads,
  at most kv_size): flat, ranges and plan copy n_kv cells a stream, ragged each stream's own
  length.
- unified: one stream of n_ctx cells; sequence i holds cells [i*L, (i+1)*L), a slot of L
  cells whatever its own length. The split's input is the first npl*L cells, one dense range,
  read through a view with npl streams of L cells (attention reads each stream's kv_len of
  them): every slot is copied whole, alike under every policy. With equal lengths that is the
  split cache's cells; with unequal ones (--lengths) more than the sequences hold, since a view
  of equal streams cannot pack sequences of different lengths: the report says so beside it
  (BenchConfig.unified_note). It runs only on one device with every layer's KV on the host.

Both layouts hold the same bytes per sequence and run the same queries, so their attention
outputs are compared (sha256 over every output of every step and layer).

Timing: a step's decode time is the wall time of Scheduler.compute on an allocated graph (the
input copies, attention and synchronization); building or reusing the step's graph and writing
the lengths is its host time, beside it. A repetition of a variant (a policy, with or without
compact staging, serial or prefetching, on one layout) is its ntg steps. A run is `repeat`
replicas of each npl (6), each with its own caches and schedulers, so that where buffers land
in memory changes between replicas as it does between runs. The replicas of an npl are made
together; after one untimed round, `rounds` timed ones follow (12), in which every replica runs
each of its variants once, the variants taking turns in balanced orders (estimate.balanced_orders) and the
collector off.

Figures are floors (estimate.StepFloor): a replica's decode, copy, compute and host time are
each step's fastest time over its repetitions, summed; a row's are the median over replicas, and
its tokens/s is npl * ntg over that decode time. A shared host only adds time to a step, in
bursts: the fastest of each step stays where a quiet machine puts it. A gain is the median over
replicas of one variant's floor tokens/s over the reference's in the same replica, minus 1, with
an interval: the replicas' range (for 6, 96.9% for the median) widened by what varies between
runs (estimate.gain_interval). Claimed gains: each split-cache variant over flat, and over the
unified cache under the same policy; the unified cache's gain over flat is noise (it copies the
same bytes under every policy) and only kept in the JSON.

Overlap (--overlap): every variant also runs with its scheduler prefetching --prefetch layers
ahead on the split's copy queue, taking turns with the serial runs; its copy time is the copy
queue's, its bound max(copy, compute) of the serial run, and ahead the bytes prefetching held on
the split beyond the layer computing.

Paged (--paged): beside the cells cache's ragged run, the same sequences in a paged cache
(ferry.paged.PagedKVCache) of --block-size cells a block, each sequence's table drawn with
--adjacency of its blocks right after their predecessor (paged_tables.adjacent_tables), the pool
twice the blocks used (the free ones among the runs, as in a cache in use). Its windows are
gathered per block (one copy a block: vLLM's swap_blocks, the baseline) and by the gather ferry
chooses (auto); every row counts its copy calls and the copies' predicted seconds.

Devices (cfg.devices): with --devices N the layers run on N devices, each layer's query on its
device and the lengths in host memory; a layer's KV lives in host memory or a device's memory. Each
row carries per device the layers it runs and holds, the bytes its splits received over a
repetition (of them KV windows'), their copy time and the memory it held.
"""

from __future__ import annotations

import gc
import hashlib
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from ..backend import Backend, CPUBackend, StandinBackend
from ..block_pool import BlockPool
from ..errors import InvalidArgumentError, OutOfMemoryError
from ..kv import KVCache
from ..residency import measure_token_share
from ..sched import Scheduler
from ..step import StepGraph, attention_step
from ..tensor import Tensor
from ..types import Type, row_size, to_type
from .bench_config import (
    DRAFT_LAYERS,
    WARMUP,
    BenchConfig,
    paged_gathers,
    variants,
)
from .bench_report import BenchResult
from .bench_rows import BenchRow, DeviceFigures, RunCounts, RunKey, RunTimes
from .common import (
    accepted_drafts,
    n_kv_for,
    new_cache,
    random_rows,
    write_cells,
)
from .devices import naming_device_memory
from .estimate import StepFloor, balanced_orders
from .paged_tables import (
    DEVICE_TABLE,
    DEVICE_TABLE_PREFETCH,
    adjacent_tables,
    blocks_for,
    new_paged_cache,
    prefix_tables,
    write_paged_cells,
)
from .several import SeveralGeometry
from .trace import TracedStep

#: Called after each decode step with the run's label ("npl 2 ranges unified").
OnStep = Callable[[str], None]

#: Replicas of an npl made together hold at most this much cache memory; past it, one at a time.
TOGETHER_BYTES = 1 << 30


class _Cache:
    """One layout's cache and queries for npl sequences, shared by every variant's scheduler.

    The devices run the layers (runs_on[layer] indexes them); places[layer] is the device holding a
    layer's KV, or None for host memory. Each layer's query lives on the device that runs it, the
    lengths in host memory (cpu's).
    """

    def __init__(self, cfg: BenchConfig, devices: List[Backend], cpu: Backend, npl: int, unified: bool,
                 pinned: bool) -> None:
        self.cfg, self.devices, self.npl, self.unified = cfg, devices, npl, unified
        self.split = devices[0]
        self.runs_on = cfg.devices.runs_on(cfg.kv.n_layer)
        self.places = cfg.devices.places(cfg.kv.n_layer)
        self.layer_backends = [devices[d] for d in self.runs_on]
        ty = to_type(cfg.kv.type_kv)
        self._fill(ty, pinned)
        rng = np.random.default_rng([cfg.sampling.seed, 1 << 20])
        self.q = [Tensor.from_numpy(self.layer_backends[layer],
                                    rng.uniform(-1, 1, (npl, 1, cfg.kv.n_head, cfg.kv.head_dim)).astype(np.float32),
                                    name=f"q{layer}") for layer in range(cfg.kv.n_layer)]
        # the lengths in host memory, written every step and copied where attention runs (llama.cpp's
        # mask): the ragged policy reads them when it copies the windows
        self.kv_len = Tensor.from_numpy(cpu, np.zeros(npl, np.int32), name="kv_len")
        self.prompts = np.array(cfg.prompts(npl), np.int32)  # each sequence's length before the first step
        self.n_kv = [cfg.n_kv(npl, t) for t in range(cfg.sequences.ntg)]  # the window of each step
        # each cache layer's tensor, by address: an input viewing one is that layer's window
        pools = self.pools()
        self.layer_of = {t._p: layer for layer, pair in enumerate(pools) for t in pair}
        self.resident_bytes = [sum(k.nbytes + v.nbytes for layer, (k, v) in enumerate(pools) if self.places[layer] == d)
                               for d in range(len(devices))]

    def rows(self, ty: Type, layer: int, i: int, which: str) -> bytes:
        """Sequence i's cells of a layer's K ("k") or V: random rows seeded by the sequence, its first
        --shared-prefix cells sequence 0's (the same values in every sequence)."""
        cfg = self.cfg
        data = random_rows(ty, cfg.cells, cfg.n_embd, (cfg.sampling.seed, layer, i, which == "v"))
        shared = cfg.paged_cache.shared_prefix * row_size(ty, cfg.n_embd)
        if shared and i:
            data = random_rows(ty, cfg.cells, cfg.n_embd, (cfg.sampling.seed, layer, 0, which == "v"))[:shared] + \
                data[shared:]
        return data

    def _fill(self, ty: Type, pinned: bool) -> None:
        """Make the cache (kv) and write each sequence's cells: sequence i in stream i (unified: cells
        i*L..)."""
        cfg, npl, unified, g = self.cfg, self.npl, self.unified, self.cfg.kv
        self.kv = kv = new_cache(ty, g.head_dim, g.n_head_kv, cfg.sequences.n_ctx, 1 if unified else npl, g.n_layer,
                                 g.v_trans, pinned, [None if d is None else self.devices[d] for d in self.places])
        L = cfg.cells
        for layer in range(cfg.kv.n_layer):
            for which in ("k", "v"):
                for i in range(npl):  # sequence i: the same values in either layout
                    data = self.rows(ty, layer, i, which)
                    stream, cell0 = (0, i * L) if unified else (i, 0)
                    write_cells(kv, which, layer, stream, cell0, data)

    def pools(self) -> List[Tuple[Tensor, Tensor]]:
        """Each layer's K and V tensors."""
        return [(self.kv.k(layer), self.kv.v(layer)) for layer in range(self.cfg.kv.n_layer)]

    def is_window(self, src: Tensor) -> bool:
        """Whether the input source src views a layer's K or V (not a query or the lengths)."""
        p = src._p
        while p.view_src:
            p = p.view_src
        return p in self.layer_of

    def windows(self, n_kv: int) -> Sequence[Tuple[Tensor, Tensor]]:
        """Every layer's K and V window of n_kv cells (KVWindows: attention_step makes the step in one C
        call, and the windows carry the lengths the ragged policy copies); unified: the first npl * L
        cells of its one stream seen as npl streams of L cells (no lengths carried: every slot whole),
        one dense range under every policy."""
        if not self.unified:
            return self.kv.windows(n_kv)
        out = []
        for layer in range(self.cfg.kv.n_layer):
            pair = []
            for which in ("k", "v"):
                ne, nb, _ = self.kv.window_layout(which, self.cfg.cells, 0, 0)
                ne[3], nb[3] = self.npl, self.kv.cell_offset(which, 0, self.cfg.cells)
                t = self.kv.k(layer) if which == "k" else self.kv.v(layer)
                pair.append(t.view(ne, nb, name=f"{which}{layer}_u").permute(0, 2, 1, 3))
            out.append((pair[0], pair[1]))
        return out

    def close(self) -> None:
        """Free the cache's (maybe pinned) memory now."""
        self.kv.close()


class _PagedCache(_Cache):
    """The same sequences in a paged cache (--paged): sequence i's table drawn by adjacency, its cells
    the cells cache's stream i's."""

    def __init__(self, cfg: BenchConfig, devices: List[Backend], cpu: Backend, npl: int, pinned: bool) -> None:
        super().__init__(cfg, devices, cpu, npl, False, pinned)

    def _fill(self, ty: Type, pinned: bool) -> None:
        cfg, npl, g, paged = self.cfg, self.npl, self.cfg.kv, self.cfg.paged_cache
        n_blocks = cfg.paged_blocks(npl)
        shared = paged.shared_prefix // paged.block_size
        self.paged = new_paged_cache(ty, g.head_dim, g.n_head_kv, paged.block_size, n_blocks, npl, g.n_layer,
                                     g.v_trans, pinned, share_blocks=shared > 0)
        L = cfg.cells
        per_seq = blocks_for(L, paged.block_size)
        tables = (prefix_tables([per_seq - shared] * npl, shared, n_blocks, paged.adjacency, cfg.sampling.seed)
                  if shared else adjacent_tables([per_seq] * npl, n_blocks, paged.adjacency, cfg.sampling.seed))
        for i, table in enumerate(tables):
            self.paged.set_table(i, table, L)
        for layer in range(cfg.kv.n_layer):
            for which in ("k", "v"):
                for i in range(npl):
                    write_paged_cells(self.paged, which, layer, i, 0, self.rows(ty, layer, i, which))

    def pools(self) -> List[Tuple[Tensor, Tensor]]:
        return [(self.paged.k(layer), self.paged.v(layer)) for layer in range(self.cfg.kv.n_layer)]

    def is_window(self, src: Tensor) -> bool:
        """Whether the input source src is a paged window (by the name the library gives one)."""
        return src.name.startswith("paged_window")

    def windows(self, n_kv: int) -> Sequence[Tuple[Tensor, Tensor]]:
        """Every layer's paged K and V windows of n_kv cells (PagedWindows: one C call)."""
        return self.paged.windows(n_kv)

    def close(self) -> None:
        self.paged.close()


def draft_device(split: Backend) -> Optional[Backend]:
    """Where the draft's layers' KV lives: the split device that runs its steps (None would be host memory,
    the placement a draft's KV has where the target's lives there)."""
    return split


class _Draft:
    """Several tokens a step over a split cache's sequences. A draft (--draft N): the draft model's cache of
    DRAFT_LAYERS layers placed on the split device (a placement of the same KV cache, not another
    mechanism), its query there, and the verification's: N + 1 tokens per sequence and layer over the
    target's windows, each step's accepted drafts (accepted_drafts) and so each step's lengths and windows.
    A prefill chunk (--chunk N, chunk=True): no draft, N tokens a step, every one kept."""

    def __init__(self, cache: _Cache, cpu: Backend, pinned: bool, chunk: bool = False) -> None:
        cfg, g, npl, split = cache.cfg, cache.cfg.kv, cache.npl, cache.split
        q = cfg.sequences
        kv_size = q.n_ctx // npl
        ty = to_type(g.type_kv)
        self.chunk = q.chunk if chunk else 0
        self.n = 0 if chunk else q.draft  # draft steps before each verification
        n_tok = self.n_tok = q.chunk if chunk else q.draft + 1  # tokens each step brings per sequence
        self.kv: Optional[KVCache] = None
        self.layer_of: Set[Any] = set()
        self._token_share: Optional[float] = None
        rng = np.random.default_rng([cfg.sampling.seed, 1 << 21])
        self.q = [Tensor.from_numpy(split, rng.uniform(-1, 1, (npl, 1, g.n_head, g.head_dim)).astype(np.float32),
                                    name=f"draft_q{layer}") for layer in range(DRAFT_LAYERS)]
        self.verify_q = [Tensor.from_numpy(cache.layer_backends[layer],
                                           rng.uniform(-1, 1, (npl, n_tok, g.n_head, g.head_dim)).astype(np.float32),
                                           name=f"verify_q{layer}") for layer in range(g.n_layer)]
        self.kv_len = Tensor.from_numpy(cpu, np.zeros(npl, np.int32), name="draft_kv_len")
        self.accepted = (np.full((q.ntg, npl), n_tok - 1) if chunk
                         else accepted_drafts(cfg.sampling.seed, npl, q.ntg, self.n, q.accept))
        kept = cache.prompts + np.concatenate([np.zeros((1, npl), np.int64), np.cumsum(self.accepted + 1, axis=0)])
        self.lengths = kept.astype(np.int32)  # [ntg + 1, npl]: each step's lengths before it, then the last kept
        self.n_kv = [n_kv_for(int(self.lengths[t].max()), n_tok, q.pad, kv_size) for t in range(q.ntg)]
        self.draft_n_kv = [[n_kv_for(int(self.lengths[t].max()), i + 1, q.pad, kv_size) for i in range(self.n)]
                           for t in range(q.ntg)]
        self.tokens = int((self.accepted + 1).sum())
        if chunk:
            return
        self.kv = new_cache(ty, g.head_dim, g.n_head_kv, q.n_ctx, npl, DRAFT_LAYERS, g.v_trans, pinned,
                            [draft_device(split)] * DRAFT_LAYERS)
        self.layer_of = {t._p for layer in range(DRAFT_LAYERS) for t in (self.kv.k(layer), self.kv.v(layer))}
        for layer in range(DRAFT_LAYERS):
            for which in ("k", "v"):
                for i in range(npl):  # the draft's layers seeded as layers past the target's
                    seed = (cfg.sampling.seed, g.n_layer + layer, i, which == "v")
                    data = random_rows(ty, cfg.cells, cfg.n_embd, seed)
                    write_cells(self.kv, which, layer, i, 0, data)

    def token_share(self, cache: _Cache) -> float:
        """The split device's token_share at this geometry (measure_token_share over the first step's
        window, resident there), measured once; 1.0 for steps of one token."""
        if self._token_share is None:
            g, n_kv = cache.cfg.kv, int(self.lengths[0].max()) + self.n_tok
            self._token_share = 1.0 if self.n_tok < 2 else measure_token_share(
                cache.split, self.n_tok, g.type_kv, g.type_kv, g.head_dim, g.n_head_kv, g.n_head,
                n_ctx=cache.npl * n_kv, n_stream=cache.npl, n_kv=n_kv)
        return self._token_share

    def is_window(self, src: Tensor) -> bool:
        """Whether the input source src views a draft layer's K or V."""
        p = src._p
        while p.view_src:
            p = p.view_src
        return p in self.layer_of

    def close(self) -> None:
        if self.kv is not None:
            self.kv.close()


@dataclass(frozen=True)
class DeviceBytes:
    """Per device (in index order), the bytes its splits received over a repetition, and of those the K and
    V windows' (added to step by step)."""

    copied: List[int]
    kv: List[int]


class _Variant:
    """One copy policy (with or without compact staging, serial or prefetching) over a cache: its
    scheduler, and each step's fastest times over its timed repetitions."""

    def __init__(self, cache: _Cache, cpu: Backend, policy: str, compact: bool, prefetch: int,
                 gather: str = "", prefetch_next: bool = False, draft: Optional[_Draft] = None) -> None:
        self.cache, self.policy, self.compact, self.prefetch, self.gather = cache, policy, compact, prefetch, gather
        self.prefetch_next, self.draft = prefetch_next, draft
        self.sched = Scheduler([*cache.devices, cpu], policy=policy, compact=compact, prefetch=prefetch,
                               prefetch_next=prefetch_next)
        self.graphs = StepGraph(self.sched, self._build)
        # a draft row's draft steps: their own scheduler over the draft's cache on the split device
        self.draft_sched = None if draft is None or not draft.n else Scheduler([*cache.devices, cpu], policy=policy)
        self.draft_graphs = None if self.draft_sched is None else StepGraph(self.draft_sched, self._build_draft)
        ntg, n_dev = cache.cfg.sequences.ntg, len(cache.devices)
        self.floors = {w: StepFloor(ntg) for w in ("decode", "copy", "compute", "host")}
        self.device_copy = [StepFloor(ntg) for _ in range(n_dev)]
        self.split_memory = 0
        self.device_memory = [0] * n_dev  # per device: the scheduler's buffer there at its most
        self.digests: List[str] = []
        self.traced: List[TracedStep] = []  # with cfg.sampling.trace: the last timed repetition's steps
        self.counts = RunCounts(bytes_copied=0, bytes_read=0)  # the last timed repetition's
        self.device_bytes = DeviceBytes(copied=[0] * n_dev, kv=[0] * n_dev)  # the last timed repetition's, per device
        self.predicted = 0.0  # a repetition's copy time by the cost models
        self.sync_host_s = 0.0  # the device table's: its syncs' own host time over a repetition, the least
        self.key = RunKey(npl=cache.npl, policy=policy, unified=cache.unified, compact=compact, prefetch=prefetch,
                          prefetch_next=prefetch_next, gather=gather, draft=0 if draft is None else draft.n,
                          chunk=0 if draft is None else draft.chunk)
        self.label = f"npl {cache.npl} {self.key.label}{' unified' if cache.unified else ''}"

    def _build(self, n_kv: object) -> List[Tensor]:
        c = self.cache
        assert isinstance(n_kv, int)
        on = c.split if len(c.devices) == 1 else c.layer_backends
        q = c.q if self.draft is None else self.draft.verify_q
        return attention_step(self.sched, on, c.windows(n_kv), q, c.kv_len, c.cfg.kv.v_trans)

    def _build_draft(self, n_kv: object) -> List[Tensor]:
        assert isinstance(n_kv, int) and self.draft is not None and self.draft_sched is not None
        d = self.draft
        assert d.kv is not None
        return attention_step(self.draft_sched, self.cache.split, d.kv.windows(n_kv), d.q, d.kv_len,
                              self.cache.cfg.kv.v_trans)

    def _draft_steps(self, t: int, digest: Any) -> Tuple[float, float, float, int, float]:
        """A draft row's draft steps before verification t, on the split device: one token each, over the
        draft's cache there. Returns their wall time, copy and compute time, the bytes the draft's K and V
        windows copied (0 while its cache is on the device), and their copies' predicted time."""
        d, sched, graphs = self.draft, self.draft_sched, self.draft_graphs
        assert d is not None
        wall = copy = compute = predicted = 0.0
        copied = 0
        if sched is None or graphs is None:  # a prefill chunk: no draft
            return wall, copy, compute, copied, predicted
        for i in range(d.n):
            graph = graphs.get(d.draft_n_kv[t][i])
            d.kv_len.set(d.lengths[t] + (i + 1))
            t0 = time.perf_counter()
            sched.compute(graph)
            wall += time.perf_counter() - t0
            st = sched.stats
            copy, compute = copy + st.copy_seconds, compute + st.compute_seconds
            predicted += st.predicted_seconds
            copied += sum(inp.stats.bytes_copied for inp in sched.inputs if d.is_window(inp.src))
            for out in graph.outputs:
                digest.update(out.get())
        return wall, copy, compute, copied, predicted

    def repetition(self, timed: bool, on_step: Optional[OnStep]) -> None:
        """Run the ntg steps once; when timed, count each step toward the floors and keep the repetition's
        bytes and its outputs' digest."""
        c = self.cache
        cfg = c.cfg
        n_dev = len(c.devices)
        copied = read = ahead = calls = steps_ahead = draft_copied = 0
        predicted = 0.0
        d = self.draft
        dev = DeviceBytes(copied=[0] * n_dev, kv=[0] * n_dev)
        used: Set[str] = set()
        if self.gather:  # the paged cache's setting, read when its windows are copied
            assert isinstance(c, _PagedCache)
            c.paged.gather = self.gather
        builds = self.graphs.builds
        digest = hashlib.sha256()
        traced: List[TracedStep] = []
        for t in range(cfg.sequences.ntg):
            t0 = time.perf_counter()
            if not cfg.variants.reuse:
                self.graphs.clear()
            drafting = (0.0, 0.0, 0.0, 0, 0.0) if d is None else self._draft_steps(t, digest)
            graph = self.graphs.get(c.n_kv[t] if d is None else d.n_kv[t])
            if t == 0:
                builds = self.graphs.builds
            # a verification writes its N + 1 tokens' cells first; a single-token step its one
            c.kv_len.set(c.prompts + (t + 1) if d is None else d.lengths[t] + d.n_tok)
            t1 = time.perf_counter()
            self.sched.compute(graph)
            decode = time.perf_counter() - t1 + drafting[0]
            st = self.sched.stats
            draft_copied += drafting[3]
            if d is not None and self.prefetch_next:
                for i, kept in enumerate(d.lengths[t + 1]):  # the rejected drafts' cells: a rollback, no recopy
                    self.sched.truncate(i, int(kept))
            device_copy, window_copied, window_read, window_calls = self._step_inputs(dev, used)
            copied, read, ahead = copied + window_copied, read + window_read, max(ahead, st.ahead_bytes)
            calls += window_calls
            steps_ahead += st.kept_ahead > 0
            predicted += st.predicted_seconds + drafting[4]
            self.split_memory = max(self.split_memory, self.sched.buffer_size(c.split))
            self.device_memory = [max(m, self.sched.buffer_size(d)) for m, d in zip(self.device_memory, c.devices)]
            if timed:
                for w, s in (("decode", decode), ("copy", st.copy_seconds + drafting[1]),
                             ("compute", st.compute_seconds + drafting[2]),
                             ("host", t1 - t0 - drafting[0])):  # the draft steps' computes are decode time
                    self.floors[w].add(t, s)
                if cfg.sampling.trace:
                    traced.append(TracedStep(spans=tuple(self.sched.trace()), seconds=decode,
                                             inputs=tuple(i.src.name for i in self.sched.inputs)))
                for f, s in zip(self.device_copy, device_copy):
                    f.add(t, s)
            for out in graph.outputs:
                digest.update(out.get())
            if on_step is not None:
                on_step(self.label)
        if timed:
            self.counts = RunCounts(bytes_copied=copied, bytes_read=read, copy_calls=calls, ahead_bytes=ahead,
                                    rebuilds=self.graphs.builds - builds, steps_ahead=steps_ahead,
                                    gather_used="+".join(sorted(used)),
                                    tokens=c.npl * cfg.sequences.ntg if d is None else d.tokens,
                                    draft_bytes_copied=draft_copied)
            self.device_bytes = dev
            self.predicted = predicted
            self.digests.append(digest.hexdigest())
            self.traced = traced

    def _step_inputs(self, dev: DeviceBytes, gathers: Set[str]) -> Tuple[List[float], int, int, int]:
        """Add the last step's inputs to each device's bytes and KV windows' bytes (an input counts for the
        device of the split reading it), and the methods paged windows were gathered by to gathers. Returns
        each device's copy time in the step, and the bytes the K and V windows copied and read and their
        copy calls (a row's figures: the lengths' copy is not the claim's)."""
        c = self.cache
        copy = [0.0] * len(c.devices)
        window_copied = window_read = window_calls = 0
        index = {d._p: i for i, d in enumerate(c.devices)}
        for split in self.sched.splits:
            d = index.get(split.backend._p)
            if d is None:
                continue
            for inp in split.inputs:
                copy[d] += inp.stats.copy_seconds
                dev.copied[d] += inp.stats.bytes_copied
                if c.is_window(inp.src):
                    dev.kv[d] += inp.stats.bytes_copied
                    window_copied += inp.stats.bytes_copied
                    window_read += inp.stats.bytes_read
                    window_calls += inp.stats.copy_calls
                    if inp.stats.gather is not None:
                        gathers.add(str(inp.stats.gather))
        return copy, window_copied, window_read, window_calls

    def row(self) -> BenchRow:
        """The variant's row in this replica.

        Raises
        ------
        AssertionError
            When its repetitions gave different attention outputs.
        """
        c = self.cache
        if len(set(self.digests)) != 1:
            raise AssertionError(f"{self.label}: repeated runs gave different attention outputs")
        devices = tuple(DeviceFigures(index=d, name=dev.name, layers=[i for i, r in enumerate(c.runs_on) if r == d],
                                      resident_layers=[i for i, p in enumerate(c.places) if p == d],
                                      bytes_copied=self.device_bytes.copied[d], kv_bytes_copied=self.device_bytes.kv[d],
                                      copy_s=self.device_copy[d].total,
                                      memory_bytes=self.device_memory[d] + c.resident_bytes[d],
                                      link_gbps=dev.link_gbps if isinstance(dev, StandinBackend) else None)
                        for d, dev in enumerate(c.devices))
        key = self.key
        times = RunTimes(decode_s=self.floors["decode"].total, copy_s=self.floors["copy"].total,
                         compute_s=self.floors["compute"].total, host_s=self.floors["host"].total,
                         predicted_copy_s=self.predicted, sync_host_s=self.sync_host_s)
        d = self.draft
        several = None if d is None else SeveralGeometry(
            tokens_per_step=d.n_tok, draft=d.n, windows=tuple(d.n_kv),
            draft_windows=tuple(tuple(w) for w in d.draft_n_kv),
            token_share=d.token_share(c) if len(c.devices) == 1 else 1.0)
        row = BenchRow(key=key, ntg=c.cfg.sequences.ntg, times=times,
                       counts=replace(self.counts, split_memory=self.split_memory), output_sha256=self.digests[0],
                       devices=devices, several=several)
        return replace(row, replicas_tokens_per_s=(row.tokens_per_s,))


class _PoolVariant(_Variant):
    """The paged cache's blocks in a device pool (BlockPool) of --device-blocks of the working set's blocks,
    attention through its device table (ferry.ops.attn_paged): each step syncs what must cross, a group
    of sequences at a time when the pool holds fewer blocks than they read (BlockPool.plan), then computes
    that group's step. A repetition is a fresh decode loop: the pool is dropped at its start, so its first
    step sends the prompts' blocks and each after it the new cells. ahead (--pool-prefetch): the pool
    prefetches, each group's sync made before the group before it computes (the next step's first group's
    under this step's last), the copy time the waits for them (the syncs' own planning and queuing on the
    host is host time, not copy)."""

    def __init__(self, cache: _Cache, cpu: Backend, ahead: bool = False) -> None:
        super().__init__(cache, cpu, "ragged", False, 0, DEVICE_TABLE_PREFETCH if ahead else DEVICE_TABLE)
        assert isinstance(cache, _PagedCache)
        c, npl = cache, cache.npl
        self.ahead = ahead
        final = c.prompts + c.cfg.sequences.ntg  # each sequence's length at the last step
        working = len({b for s in range(npl) for b in c.paged.table(s)[0][:blocks_for(int(final[s]),
                                                                                   c.cfg.paged_cache.block_size)]})
        share = c.cfg.paged_cache.device_blocks
        self.pool = BlockPool(c.paged, c.split, self.pool_slots(working, share))
        try:
            self.pool.set_prefetch(ahead)
            self.groups = self.pool.plan(lengths=final.tolist())
        except OutOfMemoryError as e:
            self.pool.close()
            raise InvalidArgumentError(f"--device-blocks {share:g}: {self.pool_slots(working, share)} slots of a "
                                       f"working set of {working} blocks cannot stream one sequence's blocks "
                                       f"({e.message}): give a larger --device-blocks"
                                       f"{' or leave out --pool-prefetch' if ahead else ''}") from None
        except BaseException:
            self.pool.close()
            raise
        self.kv_lens = [Tensor.from_numpy(cpu, np.zeros(g1 - g0, np.int32), name="kv_len") for g0, g1 in self.groups]
        self.step_graphs = []
        for (g0, g1), kv_len in zip(self.groups, self.kv_lens):
            qs = [q.view(list(q.ne[:3]) + [g1 - g0], list(q.nb), offset=g0 * q.nb[3]) for q in c.q]
            self.step_graphs.append(self.pool.attention_step(self.sched, qs, kv_len, g0, g1).graph)
        self.first_step_bytes = 0

    @staticmethod
    def pool_slots(working: int, share: float) -> int:
        """The slots of a pool holding share of a working set of working blocks: at least 1."""
        return max(1, min(working, round(share * working)))

    def _build(self, n_kv: object) -> List[Tensor]:
        raise AssertionError("the device table's steps are built once, per group")

    def _modelled(self) -> float:
        """The seconds the stand-in's link model has charged so far (0 on another device)."""
        split = self.cache.split
        return split.link_stats.modelled_seconds if isinstance(split, StandinBackend) else 0.0

    def repetition(self, timed: bool, on_step: Optional[OnStep]) -> None:
        if self.ahead:
            self._repetition_ahead(timed, on_step)
            return
        c, cfg, pool = self.cache, self.cache.cfg, self.pool
        split = c.split
        copied = calls = 0
        predicted = 0.0
        digest = hashlib.sha256()
        pool.drop_ahead()
        sync_host = 0.0
        for t in range(cfg.sequences.ntg):
            t0 = time.perf_counter()
            lengths = c.prompts + (t + 1)
            for (g0, g1), kv_len in zip(self.groups, self.kv_lens):
                kv_len.set(lengths[g0:g1].astype(np.int32).tobytes())
            before = pool.stats
            per_group = [lengths[g0:g1].tolist() for g0, g1 in self.groups]
            t1 = time.perf_counter()
            copy = compute = aside = 0.0
            outs: List[List[bytes]] = []
            for (g0, g1), graph, group_lengths in zip(self.groups, self.step_graphs, per_group):
                link0 = self._modelled()
                a = time.perf_counter()
                pool.sync(g0, g1, group_lengths)
                split.synchronize()  # the link has carried them: the copy's time
                b = time.perf_counter()
                predicted += self._modelled() - link0  # the pool's sends alone, not the lengths' copy
                copy += b - a
                if timed:  # the same sync again sends nothing: its time is the host's own (not the step's)
                    sent = pool.stats.transfers
                    h = time.perf_counter()
                    pool.sync(g0, g1, group_lengths)
                    split.synchronize()  # as the copy's time is taken: the sync and the wait, here for nothing
                    again = time.perf_counter() - h
                    if pool.stats.transfers != sent:
                        raise AssertionError(f"{self.label}: a sync made again sent {pool.stats.transfers - sent} "
                                             "transfers")
                    sync_host, aside, b = sync_host + again, aside + time.perf_counter() - b, time.perf_counter()
                self.sched.compute(graph)
                compute += time.perf_counter() - b
                outs.append([o.get() for o in graph.outputs])
            decode = time.perf_counter() - t1 - aside
            after = pool.stats
            step_bytes = after.bytes - before.bytes
            if t == 0:
                self.first_step_bytes = step_bytes
            copied += step_bytes
            calls += after.transfers - before.transfers
            if timed:
                for w, sec in (("decode", decode), ("copy", copy), ("compute", compute), ("host", t1 - t0)):
                    self.floors[w].add(t, sec)
                self.device_copy[0].add(t, copy)
            for layer in range(cfg.kv.n_layer):  # each layer's rows in sequence order: the dense step's bytes
                digest.update(b"".join(o[layer] for o in outs))
            if on_step is not None:
                on_step(self.label)
        if timed:
            self.counts = RunCounts(bytes_copied=copied, bytes_read=copied, copy_calls=calls,
                                    first_step_bytes=self.first_step_bytes,
                                    gather_used=f"{len(self.groups)} group{'s' if len(self.groups) > 1 else ''}")
            self.device_bytes = DeviceBytes(copied=[copied], kv=[copied])
            self.predicted = predicted
            self.sync_host_s = min(self.sync_host_s, sync_host) if self.sync_host_s else sync_host
            self.digests.append(digest.hexdigest())

    def _repetition_ahead(self, timed: bool, on_step: Optional[OnStep]) -> None:
        """repetition() with the pool prefetching: the first group's sync before the loop, then before each
        group computes, the wait for its sends (its copy time) and the sync of the group after it (the next
        step's first after the last), whose bytes count in the step they are for."""
        c, cfg, pool = self.cache, self.cache.cfg, self.pool
        ntg = cfg.sequences.ntg
        order = [(t, g) for t in range(ntg) for g in self.groups]
        sent, calls = [0] * ntg, [0] * ntg
        digest = hashlib.sha256()
        pool.drop_ahead()
        link0 = self._modelled()

        def sync(k: int) -> None:
            t, (g0, g1) = order[k]
            before = pool.stats
            pool.sync(g0, g1, (c.prompts[g0:g1] + (t + 1)).tolist())
            after = pool.stats
            sent[t] += after.bytes - before.bytes
            calls[t] += after.transfers - before.transfers

        sync(0)
        k, others = 0, 0.0
        for t in range(ntg):
            t0 = time.perf_counter()
            lengths = c.prompts + (t + 1)
            for (g0, g1), kv_len in zip(self.groups, self.kv_lens):
                kv_len.set(lengths[g0:g1].astype(np.int32).tobytes())
            t1 = time.perf_counter()
            copy = compute = issue = 0.0
            outs: List[List[bytes]] = []
            for graph in self.step_graphs:
                a = time.perf_counter()
                pool.wait()  # this group's sends have landed
                waited = time.perf_counter()
                if k + 1 < len(order):
                    sync(k + 1)  # the next group's, on the copy queue under this group's compute
                last = k + 1 == len(order)
                m0 = self._modelled()
                b = time.perf_counter()
                self.sched.compute(graph)
                compute += time.perf_counter() - b
                copy += waited - a  # the wait alone: the next sync's planning and queuing is the host's
                issue += b - waited
                outs.append([o.get() for o in graph.outputs])
                if last:  # nothing else in flight: the link's time for a group's lengths in, outputs out
                    others = self._modelled() - m0
                k += 1
            decode = time.perf_counter() - t1
            if timed:
                for w, sec in (("decode", decode), ("copy", copy), ("compute", compute), ("host", t1 - t0 + issue)):
                    self.floors[w].add(t, sec)
                self.device_copy[0].add(t, copy)
            for layer in range(cfg.kv.n_layer):  # each layer's rows in sequence order: the dense step's bytes
                digest.update(b"".join(o[layer] for o in outs))
            if on_step is not None:
                on_step(self.label)
        self.first_step_bytes = sent[0]
        if timed:
            copied = sum(sent)
            self.counts = RunCounts(bytes_copied=copied, bytes_read=copied, copy_calls=sum(calls),
                                    first_step_bytes=sent[0],
                                    gather_used=f"{len(self.groups)} group{'s' if len(self.groups) > 1 else ''}")
            self.device_bytes = DeviceBytes(copied=[copied], kv=[copied])
            # every sync's sends by the link's model: the loop's, less each group's lengths and outputs (the
            # last group's, a latency each: their bytes, a few KiB, differ by group)
            self.predicted = self._modelled() - link0 - len(order) * others
            self.digests.append(digest.hexdigest())


class _Replica:
    """One replica of every variant of one number of sequences, on every layout: its caches, its
    variants' schedulers, and the balanced orders in which they take turns."""

    def __init__(self, cfg: BenchConfig, devices: List[Backend], cpu: Backend, npl: int, pinned: bool) -> None:
        self.caches: List[_Cache] = []
        self.variants: List[_Variant] = []
        self.drafts: List[_Draft] = []
        self.rounds = 0
        try:
            for unified in cfg.layouts:
                self.caches.append(_Cache(cfg, devices, cpu, npl, unified, pinned))
                self.variants += [_Variant(self.caches[-1], cpu, policy, compact, depth, prefetch_next=nxt)
                                  for policy, compact in variants(cfg) for depth, nxt in cfg.prefetch_runs]
            if cfg.sequences.draft or cfg.sequences.chunk:  # beside the split cache's rows, their draft or chunk
                # rows over the same cache
                self.drafts.append(_Draft(self.caches[0], cpu, pinned, chunk=bool(cfg.sequences.chunk)))
                self.variants += [_Variant(self.caches[0], cpu, policy, compact, depth, prefetch_next=nxt,
                                           draft=self.drafts[0])
                                  for policy, compact in variants(cfg) for depth, nxt in cfg.prefetch_runs]
            if cfg.paged_cache.paged:
                self.caches.append(_PagedCache(cfg, devices, cpu, npl, pinned))
                self.variants += [_Variant(self.caches[-1], cpu, "ragged", False, 0, gather)
                                  for gather in paged_gathers(devices[0])]
                self.variants.append(_PoolVariant(self.caches[-1], cpu))
                if cfg.paged_cache.pool_prefetch:
                    self.variants.append(_PoolVariant(self.caches[-1], cpu, ahead=True))
        except BaseException:
            self.close()
            raise
        self.orders = balanced_orders(len(self.variants))

    def round(self, timed: bool, on_step: Optional[OnStep]) -> None:
        """A repetition of every variant, in this round's order."""
        for i in self.orders[self.rounds % len(self.orders)]:
            self.variants[i].repetition(timed, on_step)
        self.rounds += 1

    def close(self) -> None:
        for v in self.variants:
            v.sched.close()
            if v.draft_sched is not None:
                v.draft_sched.close()
        for draft in self.drafts:
            draft.close()
            if isinstance(v, _PoolVariant):
                v.pool.close()
        for cache in self.caches:
            cache.close()


def merge_replicas(rows: Sequence[BenchRow]) -> BenchRow:
    """One variant's row over its replicas (a row each, in the order they were made): each time the
    median of theirs, tokens/s from the decode time, each replica's tokens/s, the most memory any held,
    a draft or chunk row's measured token_share the median of theirs.

    Raises
    ------
    AssertionError
        When the replicas moved different bytes or gave different attention outputs.
    """
    first = rows[0]
    label = f"npl {first.key.npl} {first.key.label}{' unified' if first.key.unified else ''}"
    if len({(r.counts.bytes_copied, r.counts.bytes_read, r.counts.copy_calls, r.counts.draft_bytes_copied)
            for r in rows}) != 1:
        raise AssertionError(f"{label}: replicas moved different bytes")
    if len({r.output_sha256 for r in rows}) != 1:
        raise AssertionError(f"{label}: replicas gave different attention outputs")
    devices = tuple(replace(d, copy_s=statistics.median(r.devices[i].copy_s for r in rows),
                            memory_bytes=max(r.devices[i].memory_bytes for r in rows))
                    for i, d in enumerate(first.devices))
    times = replace(first.times, **{w: statistics.median(getattr(r.times, w) for r in rows)
                                    for w in ("decode_s", "copy_s", "compute_s", "host_s", "sync_host_s")})
    counts = replace(first.counts, **{n: max(getattr(r.counts, n) for r in rows)
                                      for n in ("split_memory", "ahead_bytes")})
    several = first.several if first.several is None else replace(  # each replica measured its split's share
        first.several, token_share=statistics.median(r.several.token_share for r in rows if r.several is not None))
    return replace(first, times=times, counts=counts, devices=devices,
                   replicas_tokens_per_s=tuple(r.tokens_per_s for r in rows), several=several)


def replica_bytes(cfg: BenchConfig) -> int:
    """The cache memory of one replica of one npl: every layout's K and V of every layer."""
    paged = cfg.paged_blocks(max(cfg.sequences.npl)) * cfg.paged_cache.block_size if cfg.paged_cache.paged else 0
    return (len(cfg.layouts) * cfg.sequences.n_ctx + paged) * cfg.kv.n_layer * 2 * row_size(cfg.kv.type_kv, cfg.n_embd)


def _link_totals(devices: Sequence[Backend]) -> List[Tuple[float, float]]:
    """Per stand-in device, (late, modelled) seconds its link has counted so far."""
    return [(s.late_seconds, s.modelled_seconds) for s in
            (d.link_stats for d in devices if isinstance(d, StandinBackend))]


def _measure(cfg: BenchConfig, devices: List[Backend], cpu: Backend, npl: int, pinned: bool, count: int,
             on_step: Optional[OnStep]) -> Tuple[List[List[BenchRow]], List[Tuple[float, float]],
                                                 Dict[str, List[TracedStep]]]:
    """count replicas of npl made together: a warm-up round each, then cfg.sampling.rounds timed rounds, the replicas
    taking turns round by round. Returns each replica's rows, the links' (late, modelled) seconds over
    the timed rounds, and (cfg.sampling.trace) the first replica's variants' traced steps by label."""
    made: List[_Replica] = []
    collecting = gc.isenabled()
    try:
        for _ in range(count):
            made.append(_Replica(cfg, devices, cpu, npl, pinned))
            for _ in range(WARMUP):
                made[-1].round(False, on_step)
        gc.collect()
        gc.disable()  # as timeit does: no collection lands in one variant's steps
        before = _link_totals(devices)
        for _ in range(cfg.sampling.rounds):
            for replica in made:
                replica.round(True, on_step)
        link = [(l1 - l0, m1 - m0) for (l0, m0), (l1, m1) in zip(before, _link_totals(devices))]
        traces = {v.label: v.traced for v in made[0].variants if v.traced}
        return [[v.row() for v in replica.variants] for replica in made], link, traces
    finally:
        if collecting:
            gc.enable()
        for replica in made:
            replica.close()


def run_bench(cfg: BenchConfig, on_step: Optional[OnStep] = None) -> BenchResult:
    """Run every (npl, layout, variant) of a configuration in cfg.sampling.repeat replicas (see the module).

    Parameters
    ----------
    cfg : BenchConfig
        What to run.
    on_step : callable, optional
        Called with the run's label after each decode step (`BenchConfig.n_steps` calls).

    Returns
    -------
    BenchResult
        A row per (npl, layout, variant), in that order, each over its replicas.

    Raises
    ------
    InvalidArgumentError
        For options that cannot run, or a stand-in out of the memory --device-memory gave it.
    FerryError
        When a device cannot be made, or a run fails.
    AssertionError
        When repetitions or replicas of one variant give different attention outputs.
    """
    cfg.check()
    start = time.perf_counter()
    with naming_device_memory(cfg.devices):
        devices = cfg.devices.make(cfg.device)
        cpu = CPUBackend()
        split = devices[0]
        pinned = not isinstance(split, StandinBackend)
        together = max(1, min(cfg.sampling.repeat, TOGETHER_BYTES // max(1, replica_bytes(cfg))))
        rows: List[BenchRow] = []
        overrun = 0.0
        traces: Dict[str, List[TracedStep]] = {}
        for npl in cfg.sequences.npl:
            replicas: List[List[BenchRow]] = []
            while len(replicas) < cfg.sampling.repeat:
                made, link, traced = _measure(cfg, devices, cpu, npl, pinned,
                                              min(together, cfg.sampling.repeat - len(replicas)), on_step)
                traces = {**traced, **traces}
                replicas += made
                overrun = max([overrun, *(late / modelled for late, modelled in link if modelled > 0)])
            rows += [merge_replicas(per_variant) for per_variant in zip(*replicas)]
    return BenchResult(config=cfg, split_name=split.name,
                       cache_memory="pageable host memory" if not pinned else "pinned host memory", rows=rows,
                       device_names=[d.name for d in devices],
                       standin_link_gbps=split.link_gbps if isinstance(split, StandinBackend) else None,
                       standin_latency_us=split.latency_us if isinstance(split, StandinBackend) else 0.0,
                       link_overrun=overrun, seconds=time.perf_counter() - start, traces=traces)
