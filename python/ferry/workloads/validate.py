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
never what attention reads, so each hash must be the cells cache's. So must "paged/device_table":
the blocks kept in a device pool (ferry.block_pool.BlockPool), synced each step, attention
reading them through its device table (ferry.ops.attn_paged), no window gathered.

The negative control shows the gate can fail: the cache has one stream more than a wave
uses, kept as a copy of stream 0 (so stream S is stream 0's neighbour after S-1), and the
control runs the `ranges` policy with each wave's window shifted one stream up, so that every
sequence reads its neighbour's range with its own query and length. Its hash must differ.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple, Union, cast

import numpy as np

from ..backend import Backend, CPUBackend, StandinBackend
from ..block_pool import BlockPool
from ..errors import InvalidArgumentError
from ..kv import KVCache
from ..paged import PagedKVCache
from ..sched import Scheduler
from ..step import StepGraph, attention_step
from ..tensor import Tensor
from ..types import row_size, to_type
from .common import (
    POLICIES,
    KVGeometry,
    Lengths,
    VariantOptions,
    accepted_drafts,
    check_positive,
    check_prefetch_next,
    check_run_options,
    grouped,
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
    DEVICE_TABLE,
    PagedOptions,
    adjacent_tables,
    blocks_for,
    check_paged,
    new_paged_cache,
    offered_gathers,
    write_paged_cells,
)


@dataclass(frozen=True)
class Waves:
    """The sequences `ferry validate` serves at one npl, in waves: n_seq sequences (--sequences) through
    n_stream streams (-npl) of kv_size cells (-c / -npl), n_step decode steps a wave (-ntg), prompts of
    n_step + 1 to npp cells (-npp; None: kv_size - n_step) as lengths says: drawn uniformly (by default,
    so that every stream's range differs), all npp, or given.

    Attributes
    ----------
    n_seq, n_stream, n_step, kv_size : int
        Sequences, streams, decode steps a wave, and cells a stream.
    npp : int or None
        The longest prompt; None: kv_size - n_step.
    lengths : Lengths
        The prompts' lengths: common.prompt_lengths.
    pad : int
        A wave's n_kv is its longest sequence rounded up to this (at most kv_size).
    seed : int
        Seeds the cells, the queries and drawn lengths.
    draft : int
        Also serve the sequences by drafts of this many tokens (--draft N; 0: not): each step a
        verification of N + 1 tokens, the rejected ones' cells written with other values and rolled back.
    accept : float
        A draft token's chance to be accepted, its predecessors accepted (--accept).
    """

    n_seq: int = 16
    n_stream: int = 8
    n_step: int = 4
    kv_size: int = 64
    npp: Optional[int] = None
    lengths: Lengths = "uniform"
    pad: int = 1
    seed: int = 0
    draft: int = 0
    accept: float = 0.7


def _validate_variants() -> VariantOptions:
    """validate's variants by default: every policy, serial and overlapped across steps and within each."""
    return VariantOptions(policies=POLICIES, overlap=True, prefetch_next=(True, False))


#: ValidateConfig's groups of options, by field name.
_GROUPS = ("waves", "kv", "variants", "paged_cache")


@dataclass(frozen=True)
class ValidateConfig:
    """What `ferry validate` runs at one npl, by concern. The KV geometry, the variants and the paged
    cache are `ferry bench`'s records, so the two verbs share them and their defaults (but validate's
    variants: every policy, overlapped too, across steps and within each).

    Attributes
    ----------
    waves : Waves
        The sequences, streams and steps.
    kv : KVGeometry
        The cache's geometry.
    variants : VariantOptions
        Which variants of the copy are hashed (with overlap, each also prefetching: keys "+overlap").
    paged_cache : PagedOptions
        Also serve through a paged cache, once per gather method (hashes "paged/<method>").
    device : str
        The split's device: auto, cpu or cuda.
    devices : DeviceConfig
        The devices, and where each layer's KV lives.
    """

    waves: Waves = field(default_factory=Waves)
    kv: KVGeometry = field(default_factory=KVGeometry)
    variants: VariantOptions = field(default_factory=_validate_variants)
    paged_cache: PagedOptions = field(default_factory=PagedOptions)
    device: str = "auto"
    devices: DeviceConfig = field(default_factory=DeviceConfig)

    @classmethod
    def of(cls, **options: Any) -> "ValidateConfig":
        """A configuration from options by their fields' names, each put in its group; the others default.

        Raises
        ------
        TypeError
            For a name no group has.
        """
        made: ValidateConfig = grouped(cls, _GROUPS, options)
        return made

    def check(self) -> None:
        """Raise InvalidArgumentError for any option that cannot run."""
        w, kv = self.waves, self.kv
        check_positive((("--sequences", w.n_seq), ("-npl", w.n_stream), ("--layers", kv.n_layer),
                        ("-ntg", w.n_step), ("-c / -npl", w.kv_size), ("--heads", kv.n_head),
                        ("--head-dim", kv.head_dim), ("--kv-heads", kv.n_head_kv), ("--pad", w.pad),
                        *(("--prefetch", d) for d in self.variants.prefetch)))
        check_prefetch_next(self.variants.prefetch_next)
        if isinstance(w.draft, bool) or not isinstance(w.draft, int) or w.draft < 0:
            raise InvalidArgumentError(f"--draft {w.draft!r} is not a count of draft tokens (0 or more)")
        if isinstance(w.accept, bool) or not isinstance(w.accept, (int, float)) or not 0.0 <= w.accept <= 1.0:
            raise InvalidArgumentError(f"--accept {w.accept!r} is not a chance from 0 to 1")
        if w.npp is not None:
            check_positive((("-npp", w.npp),))
        if w.n_stream < 2:
            raise InvalidArgumentError(f"-npl {w.n_stream}: a gate for cross-stream reads needs at least 2 streams")
        if self.longest_prompt < w.n_step + 1:
            raise InvalidArgumentError(f"-npp {self.longest_prompt}: a prompt has at least -ntg + 1 = "
                                       f"{w.n_step + 1} cells; give -npp at least that")
        if w.lengths == "uniform" and self.longest_prompt < w.n_step + 2:
            raise InvalidArgumentError(f"-npp {self.longest_prompt}: --lengths uniform draws prompts of different "
                                       f"lengths, from -ntg + 1 = {w.n_step + 1} cells: give -npp at least -ntg + 2 "
                                       f"= {w.n_step + 2}, or --lengths equal")
        self.prompts()
        if self.longest_prompt + w.n_step * (w.draft + 1) > w.kv_size:
            grows = " * (--draft + 1)" if w.draft else ""
            raise InvalidArgumentError(f"-npl {w.n_stream}: a stream holds {w.kv_size} cells (-c / -npl), fewer "
                                       f"than -npp + -ntg{grows} = {self.longest_prompt + w.n_step * (w.draft + 1)}")
        check_run_options(kv.type_kv, kv.head_dim, kv.n_head, kv.n_head_kv, self.variants.policies, self.device)
        if self.paged_cache.paged:
            check_paged(self.paged_cache.block_size, self.paged_cache.adjacency)
        if kv.v_trans and kv.type_kv == "q8_0":
            raise InvalidArgumentError("--v-trans needs --type f32 or f16: a transposed V cannot hold q8_0 blocks")
        self.devices.check(kv.n_layer, self.device)

    @property
    def placements_run(self) -> bool:
        """Whether the gate compares placements: several devices, a placement or a map of layers to
        devices asked for; else it compares policies on one device with every layer on the host."""
        d = self.devices
        return d.n_devices > 1 or d.placed or d.layer_devices is not None

    @property
    def n_embd(self) -> int:
        """Values per cell of K (or V): head_dim * n_head_kv."""
        return self.kv.head_dim * self.kv.n_head_kv

    @property
    def longest_prompt(self) -> int:
        """The longest prompt a sequence may have: npp, or kv_size - n_step (with a draft, kv_size - n_step *
        (draft + 1)) without it."""
        w = self.waves
        return w.kv_size - w.n_step * (w.draft + 1) if w.npp is None else w.npp

    def prompts(self) -> List[int]:
        """Each sequence's prompt length, n_step + 1 to longest_prompt cells (common.prompt_lengths of
        lengths, seeded by seed)."""
        w = self.waves
        return prompt_lengths(w.lengths, w.n_seq, self.longest_prompt, w.seed, low=w.n_step + 1)


@dataclass
class ValidateResult:
    """The hash per policy, the control's hash, and the verdicts."""

    split_name: str
    hashes: Dict[str, str]
    control: str
    split_memory: Dict[str, int] = field(default_factory=dict)  # per run: most bytes held on the split
    builds: Dict[str, int] = field(default_factory=dict)  # per run: graphs built (the other steps reused one)
    placements: Dict[str, str] = field(default_factory=dict)  # per placement name, its map ("h,0,1,h"); {} for one
    draft_hashes: Dict[str, str] = field(default_factory=dict)  # with --draft: per run, its draft loop's hash
    draft_error: Optional[float] = None  # with --draft: the most a verification's output is off its one-token steps'

    @property
    def draft_identical(self) -> bool:
        """Whether every run of the draft loop gave the same hash (True without --draft)."""
        return len(set(self.draft_hashes.values())) <= 1

    @property
    def draft_within(self) -> bool:
        """Whether every verification's outputs are within DRAFT_TOLERANCE of one-token steps' (True without
        --draft)."""
        return self.draft_error is None or self.draft_error <= DRAFT_TOLERANCE

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
        """The gate: identical hashes and a detected control; with --draft, the draft loop's hashes identical
        too, and within DRAFT_TOLERANCE of one-token steps."""
        return self.identical and self.control_detected and self.draft_identical and self.draft_within

    def as_dict(self) -> Dict[str, object]:
        """The result as `ferry validate --json` writes it; "placements" (each placement's map by name)
        only when placements were compared."""
        out: Dict[str, object] = {"hashes": dict(self.hashes), "identical": self.identical,
                                  "control_detected": self.control_detected,
                                  "split_memory_bytes": dict(self.split_memory), "graph_builds": dict(self.builds)}
        if self.placements:
            out["placements"] = dict(self.placements)
        if self.draft_hashes:
            out.update(draft_hashes=dict(self.draft_hashes), draft_identical=self.draft_identical,
                       draft_max_error=self.draft_error)
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
        ty = to_type(cfg.kv.type_kv)
        S, g, block = cfg.waves.n_stream, cfg.kv, cfg.paged_cache.block_size
        self.kv: Union[KVCache, PagedKVCache]
        if paged is None:
            self.kv = new_cache(ty, g.head_dim, g.n_head_kv, (S + 1) * cfg.waves.kv_size, S + 1, g.n_layer, g.v_trans,
                                False, placement)
        else:  # a stream's table holds kv_size cells; the pool twice the blocks, the free among the runs
            gather, pinned = paged
            per_stream = blocks_for(cfg.waves.kv_size, block)
            n_blocks = 2 * (S + 1) * per_stream
            self.kv = new_paged_cache(ty, g.head_dim, g.n_head_kv, block, n_blocks, S + 1, g.n_layer, g.v_trans, pinned)
            tables = adjacent_tables([per_stream] * (S + 1), n_blocks, cfg.paged_cache.adjacency, cfg.waves.seed)
            for s, table in enumerate(tables):
                self.kv.set_table(s, table, cfg.waves.kv_size)
            self.kv.gather = gather
        self.row = row_size(ty, cfg.n_embd)
        self.type = ty
        self.prompt = cfg.prompts()
        cells = cfg.waves.n_step * (cfg.waves.draft + 1)  # generated: with a draft, every draft token accepted
        self.content = {(i, layer, which): random_rows(ty, self.prompt[i] + cells, cfg.n_embd,
                                                     (cfg.waves.seed, i, layer, which == "v"))
                        for i in range(cfg.waves.n_seq) for layer in range(cfg.kv.n_layer) for which in ("k", "v")}

    def _write(self, stream: int, seq: int, cell0: int, n: int) -> None:
        for layer in range(self.cfg.kv.n_layer):
            for which in ("k", "v"):
                data = self.content[seq, layer, which][cell0 * self.row:(cell0 + n) * self.row]
                for s in (stream, self.cfg.waves.n_stream) if stream == 0 else (stream,):
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

    def verification(self, seqs: List[int], t: int, kept: np.ndarray, accepted: np.ndarray) -> None:
        """Write verification t's cells: sequence i's N + 1 cells from its kept length, the accepted drafts'
        and the target's token's its content, the rejected drafts' other values (a draft's guesses, which
        the next verification writes again: rolled back)."""
        n_tok = self.cfg.waves.draft + 1
        for s, i in enumerate(seqs):
            good = int(accepted[s]) + 1
            self._write(s, i, int(kept[s]), good)
            for layer in range(self.cfg.kv.n_layer):
                for which in ("k", "v"):
                    if good == n_tok:
                        continue
                    data = random_rows(self.type, n_tok - good, self.cfg.n_embd,
                                       (self.cfg.waves.seed, i, layer, which == "v", (1 << 16) + t))
                    for st in (s, self.cfg.waves.n_stream) if s == 0 else (s,):
                        if isinstance(self.kv, PagedKVCache):
                            write_paged_cells(self.kv, which, layer, st, int(kept[s]) + good, data)
                        else:
                            write_cells(self.kv, which, layer, st, int(kept[s]) + good, data)


def _query(cfg: ValidateConfig, seq: int, layer: int, t: int) -> np.ndarray:
    rng = np.random.default_rng([cfg.waves.seed, seq, layer, t, 1 << 20])
    return rng.uniform(-1.0, 1.0, (cfg.kv.n_head, cfg.kv.head_dim)).astype(np.float32)


def _draft_queries(cfg: ValidateConfig, seq: int, layer: int, t: int) -> np.ndarray:
    """Verification t's queries of one sequence and layer: [draft + 1, n_head, head_dim]."""
    rng = np.random.default_rng([cfg.waves.seed, seq, layer, t, 1 << 21])
    return rng.uniform(-1.0, 1.0, (cfg.waves.draft + 1, cfg.kv.n_head, cfg.kv.head_dim)).astype(np.float32)


#: How far a verification's output may be from the one-token step's at its length (relative to 1 + |value|).
DRAFT_TOLERANCE = 1e-6


def serve(cfg: ValidateConfig, split: Backend, policy: str, shift: int = 0,
          compact: bool = False, prefetch: int = 0, layout: Optional[Layout] = None,
          gather: Optional[str] = None, prefetch_next: bool = False, draft: bool = False, one_token: bool = False,
          outputs: Optional[List[np.ndarray]] = None) -> Tuple[str, int, int]:
    """Serve every sequence under a policy and hash every attention output.

    Each step writes its queries and lengths into tensors kept per wave size, and runs the graph of
    its padded n_kv: built when that changes (or every step without cfg.variants.reuse), else the last one.

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
        GatherMethod's name), or through a device pool of its blocks and its table (DEVICE_TABLE);
        None: the cells cache.
    prefetch_next : bool, optional
        Prefetch across steps (Scheduler.prefetch_next, with a prefetch of 1 or more): each wave's start
        drops what was copied ahead (Scheduler.drop_ahead), since it rewrites the streams' cells.
    draft : bool, optional
        Serve by drafts of cfg.waves.draft tokens: each step one verification of N + 1 tokens per sequence
        (Waves.draft), its accepted count drawn (common.accepted_drafts), its rejected cells rolled back
        (Scheduler.truncate) and written again by the next.
    one_token : bool, optional
        With draft, run each verification as N + 1 one-token steps at its tokens' lengths instead (the
        reference the verification is held to).
    outputs : list, optional
        Appended every attention output (float32 arrays) in order.

    Returns
    -------
    (str, int, int)
        The sha256 (hex) of every attention output in order, the most bytes the scheduler held on
        the devices, and the graphs built.
    """
    cpu = CPUBackend()
    lay = layout or Layout.one(split, cfg.kv.n_layer)
    pinned = not isinstance(split, StandinBackend)
    table = gather == DEVICE_TABLE
    served = _Served(cfg, [None if d is None else lay.devices[d] for d in lay.places],
                     None if gather is None else ("auto" if table else gather, pinned))
    pool = BlockPool(cast(PagedKVCache, served.kv), split, cast(PagedKVCache, served.kv).params.n_blocks) \
        if table else None
    sched = Scheduler([*lay.devices, cpu], policy=policy, compact=compact, prefetch=prefetch,
                      prefetch_next=prefetch_next)
    on: Union[Backend, List[Backend]] = split if layout is None else [lay.devices[d] for d in lay.runs_on]
    inputs: Dict[int, Tuple[List[Tensor], Tensor]] = {}  # per wave size: each layer's query, the lengths

    verify_inputs: Dict[Tuple[int, int], Tuple[List[Tensor], Tensor]] = {}  # per wave size and tokens a step

    def verify_tensors(n: int, n_tok: int) -> Tuple[List[Tensor], Tensor]:
        """A verification's queries (each layer's, n_tok tokens) and lengths for a wave of n, made once."""
        if (n, n_tok) not in verify_inputs:
            verify_inputs[n, n_tok] = (
                [Tensor.from_numpy(cpu, np.zeros((n, n_tok, cfg.kv.n_head, cfg.kv.head_dim), np.float32),
                                   name=f"q{layer}") for layer in range(cfg.kv.n_layer)],
                Tensor.from_numpy(cpu, np.zeros(n, np.int32), name="kv_len"))
        return verify_inputs[n, n_tok]

    def build(key: Hashable) -> List[Tensor]:
        n, n_kv, n_tok = cast(Tuple[int, int, int], key)
        q, kv_len = inputs[n] if n_tok == 0 else verify_tensors(n, n_tok)
        if pool is not None:  # the pool's step reads no window: the same graph for every n_kv
            return pool.attention_step(sched, q, kv_len, shift, shift + n)
        windows = served.kv.windows(n_kv, shift, shift + n - 1)
        return attention_step(sched, on, windows, q, kv_len, cfg.kv.v_trans)

    graphs = StepGraph(sched, build)
    memory = 0
    digest = hashlib.sha256()
    S = cfg.waves.n_stream
    for w in range(0, cfg.waves.n_seq, S):
        seqs = list(range(w, min(w + S, cfg.waves.n_seq)))
        sched.drop_ahead()  # new sequences over the last wave's cells
        if pool is not None:
            pool.drop_ahead()
        served.start_wave(seqs)
        n = len(seqs)
        if n not in inputs:
            inputs[n] = ([Tensor.from_numpy(cpu, np.zeros((n, 1, cfg.kv.n_head, cfg.kv.head_dim), np.float32),
                                            name=f"q{layer}") for layer in range(cfg.kv.n_layer)],
                         Tensor.from_numpy(cpu, np.zeros(n, np.int32), name="kv_len"))
        q, kv_len = inputs[n]
        if draft:
            _verify_wave(cfg, served, sched, graphs, verify_tensors, seqs, one_token, digest, outputs)
            memory = max(memory, sum(sched.buffer_size(d) for d in lay.devices))
            continue
        for t in range(cfg.waves.n_step):
            served.step(seqs, t)
            lens = np.array([served.prompt[i] + t + 1 for i in seqs], np.int32)
            kv_len.set(lens)
            for layer in range(cfg.kv.n_layer):
                q[layer].set(np.stack([_query(cfg, i, layer, t) for i in seqs]))
            if not cfg.variants.reuse:
                graphs.clear()
            graph = graphs.get((n, n_kv_for(int(lens.max()), 0, cfg.waves.pad, cfg.waves.kv_size), 0))
            if pool is not None:
                pool.sync(shift, shift + n, lens.tolist())
            sched.compute(graph)
            memory = max(memory, sum(sched.buffer_size(d) for d in lay.devices))
            for out in graph.outputs:
                digest.update(out.get())
    graphs.clear()
    sched.close()
    if pool is not None:
        pool.close()
    served.kv.close()
    return digest.hexdigest(), memory, graphs.builds


def _verify_wave(cfg: ValidateConfig, served: _Served, sched: Scheduler, graphs: StepGraph,
                 tensors: Callable[[int, int], Tuple[List[Tensor], Tensor]], seqs: List[int], one_token: bool,
                 digest: Any, outputs: Optional[List[np.ndarray]]) -> None:
    """A wave served by drafts (serve's draft): per step, the verification's cells written (served.verification),
    its N + 1 tokens attended in one step (or, one_token, in N + 1 one-token steps at their lengths), every
    output hashed into digest (and appended to outputs), then each sequence kept at its accepted length:
    Scheduler.truncate, the rejected cells written again by the next step. tensors(n, tokens) gives the
    queries and lengths the step's graph reads."""
    n, n_tok = len(seqs), cfg.waves.draft + 1
    # drawn per wave: its first sequence beside the seed
    accepted = accepted_drafts(cfg.waves.seed + seqs[0], n, cfg.waves.n_step, cfg.waves.draft, cfg.waves.accept)
    kept = np.array([served.prompt[i] for i in seqs], np.int32)
    for t in range(cfg.waves.n_step):
        served.verification(seqs, t, kept, accepted[t])
        queries = [np.stack([_draft_queries(cfg, i, layer, t) for i in seqs]) for layer in range(cfg.kv.n_layer)]
        runs = [(j, 1) for j in range(n_tok)] if one_token else [(0, n_tok)]
        for first, tokens in runs:
            lens = kept + first + tokens
            graph = graphs.get((n, n_kv_for(int(lens.max()), 0, cfg.waves.pad, cfg.waves.kv_size), tokens))
            q, kv_len = tensors(n, tokens)
            kv_len.set(lens.astype(np.int32))
            for layer in range(cfg.kv.n_layer):
                q[layer].set(np.ascontiguousarray(queries[layer][:, first:first + tokens]))
            sched.compute(graph)
            for out in graph.outputs:
                digest.update(out.get())
                if outputs is not None:
                    outputs.append(out.to_numpy().copy())
        kept = kept + accepted[t].astype(np.int32) + 1
        for s, length in enumerate(kept):  # the rejected cells: the next step writes them again
            sched.truncate(s, int(length))


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
    runs_on = d.runs_on(cfg.kv.n_layer)
    out = standard_placements(cfg.kv.n_layer, n_devices, runs_on, cfg.waves.seed)
    if d.placed:
        mine = d.places(cfg.kv.n_layer)
        if all(mine != m and d.describe(cfg.kv.n_layer) != name for name, m in out):
            out.append((d.describe(cfg.kv.n_layer), mine))
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
        runs_on = cfg.devices.runs_on(cfg.kv.n_layer)
        for name, places in placements(cfg, len(devices)):
            runs.append((name + "/", Layout(devices=devices, runs_on=runs_on, places=places)))
            names[name] = placement_name(places)
        if len(devices) > 1:
            names = {"one-device": placement_name([None] * cfg.kv.n_layer), **names}
    hashes, memory, builds = {}, {}, {}
    for prefix, layout in runs:
        for policy, compact in variants(cfg.variants.policies, cfg.variants.compact):
            for prefetch, nxt in prefetch_runs(cfg.variants.overlap, cfg.variants.prefetch, cfg.variants.prefetch_next):
                name = prefix + run_name(policy, compact, prefetch, nxt)
                got = serve(cfg, split, policy, compact=compact, prefetch=prefetch, layout=layout, prefetch_next=nxt)
                hashes[name], memory[name], builds[name] = got
    if cfg.paged_cache.paged:
        pinned = not isinstance(split, StandinBackend)
        for method in (*offered_gathers(to_type(cfg.kv.type_kv), cfg.kv.v_trans, pinned, split), "auto",
                       DEVICE_TABLE):
            name = f"paged/{method}"
            hashes[name], memory[name], builds[name] = serve(cfg, split, "ragged", gather=method)
    control, _, _ = serve(cfg, split, "ranges", shift=1)
    result = ValidateResult(split_name=split.name, hashes=hashes, control=control, split_memory=memory, builds=builds,
                            placements=names)
    if cfg.waves.draft:
        _check_drafts(cfg, split, result)
    return result


def _check_drafts(cfg: ValidateConfig, split: Backend, result: ValidateResult) -> None:
    """With --draft: the draft loop's hash per policy, serial and prefetching (keys "draft/<run>"), with
    --paged per gather ("draft/paged/<method>"), and how
    far its first policy's serial outputs are from one-token steps' (ValidateResult.draft_error)."""
    first: List[np.ndarray] = []
    for policy, compact in variants(cfg.variants.policies, cfg.variants.compact):
        for prefetch, nxt in prefetch_runs(cfg.variants.overlap, cfg.variants.prefetch, cfg.variants.prefetch_next):
            got = serve(cfg, split, policy, compact=compact, prefetch=prefetch, prefetch_next=nxt, draft=True,
                        outputs=None if first else first)
            result.draft_hashes[f"draft/{run_name(policy, compact, prefetch, nxt)}"] = got[0]
    if cfg.paged_cache.paged:
        pinned = not isinstance(split, StandinBackend)
        for method in (*offered_gathers(to_type(cfg.kv.type_kv), cfg.kv.v_trans, pinned, split), "auto"):
            result.draft_hashes[f"draft/paged/{method}"] = serve(cfg, split, "ragged", gather=method, draft=True)[0]
    one: List[np.ndarray] = []
    serve(cfg, split, cfg.variants.policies[0], draft=True, one_token=True, outputs=one)
    n_layer, n_tok = cfg.kv.n_layer, cfg.waves.draft + 1
    error = 0.0
    # each verification gave n_layer outputs of n_tok tokens; its one-token steps n_tok x n_layer of one
    for v in range(len(first) // n_layer):
        for layer in range(n_layer):
            verified = first[v * n_layer + layer]
            for j in range(n_tok):
                want = one[(v * n_tok + j) * n_layer + layer].astype(np.float64)[:, 0]  # [ns, n_tok, n_head, dim]
                err = np.abs(verified[:, j].astype(np.float64) - want) / (1.0 + np.abs(want))
                error = max(error, float(err.max()))
    result.draft_error = error
