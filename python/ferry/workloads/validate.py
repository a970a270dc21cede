"""The hash gate `ferry validate` runs: llama.cpp's llama-parallel gate.

Many sequences (--sequences; default two waves), each with its own content and prompt length
(from ntg + 1 to npp cells), are served through a non-unified KV cache of npl streams of
kv_size = n_ctx / npl cells (the window options of `ferry bench`: -c, -npl, -npp, -ntg, --pad;
the gate runs once per -npl): in waves, wave w putting sequences w*S .. w*S+S-1 in
streams 0..S-1 (S = npl). At the start of a wave each sequence's prompt cells are written into its
stream (over whatever the previous wave left there); each of the ntg decode steps writes the sequence's
next cell and then runs, per layer, attention over the window of the wave's streams on the
split backend (CUDA, or the CPU stand-in), each sequence with its own query and length. The
queries and lengths are written in place into input tensors kept per wave size, and a step
runs the last step's graph while its n_kv (the wave's longest sequence rounded up to --pad)
is the same, as a decode loop does (ferry.StepGraph); --no-reuse builds every step's. The
sha256 of every attention output, in order, is one hash per copy policy: they must be
identical, since a copy policy changes what is moved, never what the graph reads. Each
policy also runs overlapped (its scheduler prefetching each layer's windows on the split's
copy queue while earlier layers compute; hashes keyed "<policy>+overlap"), which changes
when bytes move, never which: its hash must be the same too. By default it runs both ways of
prefetching: across steps (each step's first layer copied under the last layer of the step
before, then the cell that step wrote; "+overlap") and within each step ("+overlap-within"); a
wave's start, which writes new sequences over the streams, drops what was copied ahead.

With --paged the same sequences are also served through a paged cache (ferry.paged.PagedKVCache:
each stream a table of --block-size cell blocks drawn with --adjacency of them right after their
predecessor) under the ragged policy, once per gather method the split offers and once as the
library chooses (hashes keyed "paged/<method>"): a gather changes how the blocks are copied,
never what attention reads, so each hash must be the cells cache's.

The negative control shows the gate can fail: the cache has one stream more than a wave
uses, kept as a copy of stream 0 (so stream S is stream 0's neighbour after S-1), and the
control runs the `ranges` policy with each wave's window shifted one stream up, so that every
sequence reads its neighbour's range with its own query and length. Its hash must differ.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Dict, Hashable, List, Optional, Sequence, Tuple, Union, cast

import numpy as np

from ..backend import Backend, CPUBackend, StandinBackend
from ..errors import InvalidArgumentError
from ..kv import KVCache
from ..paged import PagedKVCache
from ..sched import Scheduler
from ..step import StepGraph, attention_step
from ..tensor import Tensor
from ..types import row_size, to_type
from .common import (
    POLICIES,
    Lengths,
    check_positive,
    check_prefetch_next,
    check_run_options,
    n_kv_for,
    new_cache,
    prefetch_runs,
    prompt_lengths,
    random_rows,
    run_name,
    variants,
    write_cells,
)
from .devices import DeviceConfig, Place, naming_device_memory, placement_name, standard_placements
from .paged_tables import (
    ADJACENCY,
    BLOCK_SIZE,
    adjacent_tables,
    blocks_for,
    check_paged,
    new_paged_cache,
    offered_gathers,
    write_paged_cells,
)


@dataclass(frozen=True)
class ValidateConfig:
    """What `ferry validate` runs at one npl: n_seq sequences (--sequences) through n_stream streams
    (-npl) of kv_size cells (-c / -npl), n_step decode steps a wave (-ntg), prompts of n_step + 1
    to npp cells (-npp; None: kv_size - n_step) as lengths says: drawn uniformly (by default, so that
    every stream's range differs), all npp, or given."""

    n_seq: int = 16
    n_stream: int = 8
    n_layer: int = 2
    n_step: int = 4
    kv_size: int = 64
    type_kv: str = "f16"
    n_head: int = 8  # the geometry is `ferry bench`'s (BenchConfig), so the two verbs share defaults
    head_dim: int = 64
    n_head_kv: int = 2
    policies: Tuple[str, ...] = POLICIES
    device: str = "auto"
    seed: int = 0
    compact: bool = False  # also hash each non-flat policy with compact staging
    pad: int = 1  # a wave's n_kv is its longest sequence rounded up to this (at most kv_size)
    reuse: bool = True  # a step whose padded n_kv is the last one's runs the last graph (StepGraph)
    overlap: bool = True  # also hash each run prefetching on the copy queue (keys "+overlap")
    prefetch: Tuple[int, ...] = (1,)  # parts (layers) ahead an overlapped run queues: one run per depth
    prefetch_next: Tuple[bool, ...] = (True, False)  # per depth, runs across steps and within each ("-within")
    v_trans: bool = False  # V stored transposed (flash attention off)
    devices: DeviceConfig = field(default_factory=DeviceConfig)  # the devices, and where each layer's KV lives
    npp: Optional[int] = None  # the longest prompt; None: kv_size - n_step
    lengths: Lengths = "uniform"  # the prompts' lengths: common.prompt_lengths
    paged: bool = False  # also serve through a paged cache, once per gather method (hashes "paged/<method>")
    block_size: int = BLOCK_SIZE  # cells per block of the paged cache
    adjacency: float = ADJACENCY  # share of a stream's blocks right after their predecessor in the pool

    def check(self) -> None:
        """Raise InvalidArgumentError for any option that cannot run."""
        check_positive((("--sequences", self.n_seq), ("-npl", self.n_stream), ("--layers", self.n_layer),
                        ("-ntg", self.n_step), ("-c / -npl", self.kv_size), ("--heads", self.n_head),
                        ("--head-dim", self.head_dim), ("--kv-heads", self.n_head_kv), ("--pad", self.pad),
                        *(("--prefetch", d) for d in self.prefetch)))
        check_prefetch_next(self.prefetch_next)
        if self.npp is not None:
            check_positive((("-npp", self.npp),))
        if self.n_stream < 2:
            raise InvalidArgumentError(f"-npl {self.n_stream}: a gate for cross-stream reads needs at least 2 streams")
        if self.longest_prompt < self.n_step + 1:
            raise InvalidArgumentError(f"-npp {self.longest_prompt}: a prompt has at least -ntg + 1 = "
                                       f"{self.n_step + 1} cells; give -npp at least that")
        if self.lengths == "uniform" and self.longest_prompt < self.n_step + 2:
            raise InvalidArgumentError(f"-npp {self.longest_prompt}: --lengths uniform draws prompts of different "
                                       f"lengths, from -ntg + 1 = {self.n_step + 1} cells: give -npp at least -ntg + 2 "
                                       f"= {self.n_step + 2}, or --lengths equal")
        self.prompts()
        if self.longest_prompt + self.n_step > self.kv_size:
            raise InvalidArgumentError(f"-npl {self.n_stream}: a stream holds {self.kv_size} cells (-c / -npl), fewer "
                                       f"than -npp + -ntg = {self.longest_prompt + self.n_step}")
        check_run_options(self.type_kv, self.head_dim, self.n_head, self.n_head_kv, self.policies, self.device)
        if self.paged:
            check_paged(self.block_size, self.adjacency)
        if self.v_trans and self.type_kv == "q8_0":
            raise InvalidArgumentError("--v-trans needs --type f32 or f16: a transposed V cannot hold q8_0 blocks")
        self.devices.check(self.n_layer, self.device)

    @property
    def placements_run(self) -> bool:
        """Whether the gate compares placements: several devices, a placement or a map of layers to
        devices asked for; else it compares policies on one device with every layer on the host."""
        d = self.devices
        return d.n_devices > 1 or d.placed or d.layer_devices is not None

    @property
    def n_embd(self) -> int:
        """Values per cell of K (or V): head_dim * n_head_kv."""
        return self.head_dim * self.n_head_kv

    @property
    def longest_prompt(self) -> int:
        """The longest prompt a sequence may have: npp, or kv_size - n_step without it."""
        return self.kv_size - self.n_step if self.npp is None else self.npp

    def prompts(self) -> List[int]:
        """Each sequence's prompt length, n_step + 1 to longest_prompt cells (common.prompt_lengths of
        lengths, seeded by seed)."""
        return prompt_lengths(self.lengths, self.n_seq, self.longest_prompt, self.seed, low=self.n_step + 1)


@dataclass
class ValidateResult:
    """The hash per policy, the control's hash, and the verdicts."""

    split_name: str
    hashes: Dict[str, str]
    control: str
    split_memory: Dict[str, int] = field(default_factory=dict)  # per run: most bytes held on the split
    builds: Dict[str, int] = field(default_factory=dict)  # per run: graphs built (the other steps reused one)
    placements: Dict[str, str] = field(default_factory=dict)  # per placement name, its map ("h,0,1,h"); {} for one

    @property
    def identical(self) -> bool:
        """Whether every policy gave the same hash."""
        return len(set(self.hashes.values())) == 1

    @property
    def control_detected(self) -> bool:
        """Whether the control's hash differs from every policy's."""
        return self.control not in self.hashes.values()

    @property
    def passed(self) -> bool:
        """The gate: identical hashes and a detected control."""
        return self.identical and self.control_detected

    def as_dict(self) -> Dict[str, object]:
        """The result as `ferry validate --json` writes it; "placements" (each placement's map by name)
        only when placements were compared."""
        out: Dict[str, object] = {"hashes": dict(self.hashes), "identical": self.identical,
                                  "control_detected": self.control_detected,
                                  "split_memory_bytes": dict(self.split_memory), "graph_builds": dict(self.builds)}
        if self.placements:
            out["placements"] = dict(self.placements)
        return out


@dataclass(frozen=True)
class Layout:
    """Where a served run's layers run and where their KV lives.

    Attributes
    ----------
    devices : list of Backend
        The devices; a scheduler's backends are these and the CPU.
    runs_on : list of int
        Per layer, the index of the device that runs it.
    places : list of int or None
        Per layer, the index of the device holding its KV, or None for host memory.
    """

    devices: List[Backend]
    runs_on: List[int]
    places: List[Place]

    @classmethod
    def one(cls, split: Backend, n_layer: int) -> "Layout":
        """Every layer on split, its KV on the host."""
        return cls([split], [0] * n_layer, [None] * n_layer)


class _Served:
    """The cache and each sequence's content: prompt cells written at the start of a wave, one more
    cell per decode step, stream S kept a copy of stream 0."""

    def __init__(self, cfg: ValidateConfig, placement: Optional[Sequence[Optional[Backend]]] = None,
                 paged: Optional[Tuple[str, bool]] = None) -> None:
        self.cfg = cfg
        ty = to_type(cfg.type_kv)
        S = cfg.n_stream
        self.kv: Union[KVCache, PagedKVCache]
        if paged is None:
            self.kv = new_cache(ty, cfg.head_dim, cfg.n_head_kv, (S + 1) * cfg.kv_size, S + 1, cfg.n_layer,
                                cfg.v_trans, False, placement)
        else:  # a stream's table holds kv_size cells; the pool twice the blocks, the free among the runs
            gather, pinned = paged
            per_stream = blocks_for(cfg.kv_size, cfg.block_size)
            n_blocks = 2 * (S + 1) * per_stream
            self.kv = new_paged_cache(ty, cfg.head_dim, cfg.n_head_kv, cfg.block_size, n_blocks, S + 1, cfg.n_layer,
                                      cfg.v_trans, pinned)
            for s, table in enumerate(adjacent_tables([per_stream] * (S + 1), n_blocks, cfg.adjacency, cfg.seed)):
                self.kv.set_table(s, table, cfg.kv_size)
            self.kv.gather = gather
        self.row = row_size(ty, cfg.n_embd)
        self.prompt = cfg.prompts()
        self.content = {(i, layer, which): random_rows(ty, self.prompt[i] + cfg.n_step, cfg.n_embd,
                                                     (cfg.seed, i, layer, which == "v"))
                        for i in range(cfg.n_seq) for layer in range(cfg.n_layer) for which in ("k", "v")}

    def _write(self, stream: int, seq: int, cell0: int, n: int) -> None:
        for layer in range(self.cfg.n_layer):
            for which in ("k", "v"):
                data = self.content[seq, layer, which][cell0 * self.row:(cell0 + n) * self.row]
                for s in (stream, self.cfg.n_stream) if stream == 0 else (stream,):
                    if isinstance(self.kv, PagedKVCache):
                        write_paged_cells(self.kv, which, layer, s, cell0, data)
                    else:
                        write_cells(self.kv, which, layer, s, cell0, data)

    def start_wave(self, seqs: List[int]) -> None:
        for s, i in enumerate(seqs):
            self._write(s, i, 0, self.prompt[i])

    def step(self, seqs: List[int], t: int) -> None:
        for s, i in enumerate(seqs):
            self._write(s, i, self.prompt[i] + t, 1)


def _query(cfg: ValidateConfig, seq: int, layer: int, t: int) -> np.ndarray:
    rng = np.random.default_rng([cfg.seed, seq, layer, t, 1 << 20])
    return rng.uniform(-1.0, 1.0, (cfg.n_head, cfg.head_dim)).astype(np.float32)


def serve(cfg: ValidateConfig, split: Backend, policy: str, shift: int = 0,
          compact: bool = False, prefetch: int = 0, layout: Optional[Layout] = None,
          gather: Optional[str] = None, prefetch_next: bool = False) -> Tuple[str, int, int]:
    """Serve every sequence under a policy and hash every attention output.

    Each step writes its queries and lengths into tensors kept per wave size, and runs the graph of
    its padded n_kv: built when that changes (or every step without cfg.reuse), else the last one.

    Parameters
    ----------
    cfg : ValidateConfig
    split : Backend
        Where attention runs.
    policy : str
    shift : int, optional
        Moves each wave's window that many streams up (the negative control: 1).
    compact : bool, optional
        Compact staging.
    prefetch : int, optional
        The scheduler's prefetch depth (0: serial; see Scheduler).
    layout : Layout, optional
        The devices, which runs each layer and where each layer's KV lives; None: every layer on
        split, its KV on the host.
    gather : str, optional
        Serve through a paged cache (in host memory, pinned for CUDA) gathered by this method (a
        GatherMethod's name); None: the cells cache.
    prefetch_next : bool, optional
        Prefetch across steps (Scheduler.prefetch_next, with a prefetch of 1 or more): each wave's start
        drops what was copied ahead (Scheduler.drop_ahead), since it rewrites the streams' cells.

    Returns
    -------
    (str, int, int)
        The sha256 (hex) of every attention output in order, the most bytes the scheduler held on
        the devices, and the graphs built.
    """
    cpu = CPUBackend()
    lay = layout or Layout.one(split, cfg.n_layer)
    pinned = not isinstance(split, StandinBackend)
    served = _Served(cfg, [None if d is None else lay.devices[d] for d in lay.places],
                     None if gather is None else (gather, pinned))
    sched = Scheduler([*lay.devices, cpu], policy=policy, compact=compact, prefetch=prefetch,
                      prefetch_next=prefetch_next)
    on: Union[Backend, List[Backend]] = split if layout is None else [lay.devices[d] for d in lay.runs_on]
    inputs: Dict[int, Tuple[List[Tensor], Tensor]] = {}  # per wave size: each layer's query, the lengths

    def build(key: Hashable) -> List[Tensor]:
        n, n_kv = cast(Tuple[int, int], key)
        q, kv_len = inputs[n]
        windows = served.kv.windows(n_kv, shift, shift + n - 1)
        return attention_step(sched, on, windows, q, kv_len, cfg.v_trans)

    graphs = StepGraph(sched, build)
    memory = 0
    digest = hashlib.sha256()
    S = cfg.n_stream
    for w in range(0, cfg.n_seq, S):
        seqs = list(range(w, min(w + S, cfg.n_seq)))
        sched.drop_ahead()  # new sequences over the last wave's cells
        served.start_wave(seqs)
        n = len(seqs)
        if n not in inputs:
            inputs[n] = ([Tensor.from_numpy(cpu, np.zeros((n, 1, cfg.n_head, cfg.head_dim), np.float32),
                                            name=f"q{layer}") for layer in range(cfg.n_layer)],
                         Tensor.from_numpy(cpu, np.zeros(n, np.int32), name="kv_len"))
        q, kv_len = inputs[n]
        for t in range(cfg.n_step):
            served.step(seqs, t)
            lens = np.array([served.prompt[i] + t + 1 for i in seqs], np.int32)
            kv_len.set(lens)
            for layer in range(cfg.n_layer):
                q[layer].set(np.stack([_query(cfg, i, layer, t) for i in seqs]))
            if not cfg.reuse:
                graphs.clear()
            graph = graphs.get((n, n_kv_for(int(lens.max()), 0, cfg.pad, cfg.kv_size)))
            sched.compute(graph)
            memory = max(memory, sum(sched.buffer_size(d) for d in lay.devices))
            for out in graph.outputs:
                digest.update(out.get())
    graphs.clear()
    sched.close()
    served.kv.close()
    return digest.hexdigest(), memory, graphs.builds


def placements(cfg: ValidateConfig, n_devices: int) -> List[Tuple[str, List[Place]]]:
    """The placements the gate compares, by name: standard_placements', then the user's (named by
    DeviceConfig.describe) unless one of them has its name or map already.

    Parameters
    ----------
    cfg : ValidateConfig
    n_devices : int

    Returns
    -------
    list of (str, list of int or None)
    """
    d = cfg.devices
    runs_on = d.runs_on(cfg.n_layer)
    out = standard_placements(cfg.n_layer, n_devices, runs_on, cfg.seed)
    if d.placed:
        mine = d.places(cfg.n_layer)
        if all(mine != m and d.describe(cfg.n_layer) != name for name, m in out):
            out.append((d.describe(cfg.n_layer), mine))
    return out


def run_validate(cfg: ValidateConfig) -> ValidateResult:
    """Each policy's hash and the control's; with placements (cfg.placements_run), each placement's
    under each policy, keyed "<placement>/<policy>", beside the all-host one-device run's
    ("one-device/<policy>"): every hash must be that one.

    Parameters
    ----------
    cfg : ValidateConfig

    Returns
    -------
    ValidateResult

    Raises
    ------
    InvalidArgumentError
        For options that cannot run, or a stand-in out of the memory --device-memory gave it.
    FerryError
        When a device cannot be made or serving fails.
    """
    cfg.check()
    with naming_device_memory(cfg.devices):
        return _run_validate(cfg)


def _run_validate(cfg: ValidateConfig) -> ValidateResult:
    devices = cfg.devices.make(cfg.device)
    split = devices[0]
    runs: List[Tuple[str, Optional[Layout]]] = [("", None)]
    names: Dict[str, str] = {}
    if cfg.placements_run:
        runs = [("one-device/", None)] if len(devices) > 1 else []
        runs_on = cfg.devices.runs_on(cfg.n_layer)
        for name, places in placements(cfg, len(devices)):
            runs.append((name + "/", Layout(devices=devices, runs_on=runs_on, places=places)))
            names[name] = placement_name(places)
        if len(devices) > 1:
            names = {"one-device": placement_name([None] * cfg.n_layer), **names}
    hashes, memory, builds = {}, {}, {}
    for prefix, layout in runs:
        for policy, compact in variants(cfg.policies, cfg.compact):
            for prefetch, nxt in prefetch_runs(cfg.overlap, cfg.prefetch, cfg.prefetch_next):
                name = prefix + run_name(policy, compact, prefetch, nxt)
                got = serve(cfg, split, policy, compact=compact, prefetch=prefetch, layout=layout, prefetch_next=nxt)
                hashes[name], memory[name], builds[name] = got
    if cfg.paged:
        pinned = not isinstance(split, StandinBackend)
        for method in (*offered_gathers(to_type(cfg.type_kv), cfg.v_trans, pinned, split), "auto"):
            name = f"paged/{method}"
            hashes[name], memory[name], builds[name] = serve(cfg, split, "ragged", gather=method)
    control, _, _ = serve(cfg, split, "ranges", shift=1)
    return ValidateResult(split_name=split.name, hashes=hashes, control=control, split_memory=memory, builds=builds,
                          placements=names)
