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
import math
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from ..backend import Backend, CPUBackend, StandinBackend
from ..block_pool import BlockPool
from ..errors import InvalidArgumentError, OutOfMemoryError
from ..kv import KVCache
from ..residency import DeviceSpec, expected_accepted_tokens, layers_from_geometry, measure_token_share, predict_step
from ..sched import Scheduler
from ..step import StepGraph, attention_step
from ..tensor import Tensor
from ..types import Type, row_size, to_type
from .common import (
    KVGeometry,
    Lengths,
    VariantOptions,
    accepted_drafts,
    check_positive,
    check_prefetch_next,
    check_run_options,
    check_streams,
    grouped,
    n_kv_for,
    new_cache,
    prefetch_runs,
    prompt_lengths,
    random_rows,
    run_name,
    write_cells,
)
from .common import variants as workload_variants
from .devices import DeviceConfig, naming_device_memory
from .estimate import Interval, StepFloor, balanced_orders, gain_interval
from .paged_tables import (
    DEVICE_TABLE,
    DEVICE_TABLE_PREFETCH,
    PagedOptions,
    adjacent_tables,
    blocks_for,
    check_paged,
    check_shared,
    new_paged_cache,
    prefix_tables,
    write_paged_cells,
)
from .trace import TracedStep

#: Called after each decode step with the run's label ("npl 2 ranges unified").
OnStep = Callable[[str], None]

#: The paged cache's gathers (--paged), by the cache's gather setting: the baseline, every run in one
#: batched call (a piece a run; a piece a block at adjacency 0: the stand-in's alone, where it is always
#: offered), then ferry's choice.
PAGED_GATHERS: Tuple[str, ...] = ("per_block", "batched", "auto")
#: What --paged calls them in its rows.
PAGED_NAMES = {"per_block": "paged per-block", "batched": "paged batched", "auto": "paged merged",
               DEVICE_TABLE: "paged device table", DEVICE_TABLE_PREFETCH: "paged device table+prefetch"}


def paged_gathers(split: Backend) -> Tuple[str, ...]:
    """The PAGED_GATHERS a --paged run takes on split: batched on a stand-in alone (a CUDA device offers
    it only with CUDA 12.8, runtime and driver)."""
    return tuple(g for g in PAGED_GATHERS if g != "batched" or isinstance(split, StandinBackend))

#: Replicas of each npl (--repeat's default): their range is a 96.9% interval for a median.
REPLICAS = 6
#: Timed rounds (--rounds): repetitions of each variant in each replica, after WARMUP untimed ones.
ROUNDS = 10
WARMUP = 1
#: Replicas of an npl made together hold at most this much cache memory; past it, one at a time.
TOGETHER_BYTES = 1 << 30
#: A stand-in's timed copies running past their modelled ends by more than this share of the link's
#: time: the host copies slower than the link there, and copy times follow the host (a warning).
LINK_OVERRUN = 0.10


@dataclass(frozen=True)
class Sequences:
    """The sequences a run decodes and the window it reads: `ferry bench`'s "the window" options.

    Attributes
    ----------
    n_ctx : int
        Cells in all streams together (-c).
    npl : tuple of int
        Numbers of sequences, each a run.
    npp, ntg : int
        Prompt cells per sequence, and tokens generated (one decode step each).
    pad : int
        n_kv is rounded up to this (llama.cpp's 256): steps of one padded n_kv reuse one graph; ragged
        copies no padded cell.
    lengths : Lengths
        Each sequence's prompt: -npp cells, seeded uniform draws, or given.
    draft : int
        Draft tokens a verification checks (--draft N): beside each single-token row, its draft row: N
        draft steps on the device, then one step of N + 1 tokens over the host windows; 0: none.
    accept : float
        The chance that a draft token is accepted, its predecessors accepted (--accept): a draft's accepted
        prefix is geometric, drawn per step and sequence from the seed.
    chunk : int
        Tokens of a prefill chunk (--chunk N): beside each single-token row, its chunk row: steps of N tokens
        over the host windows, every one kept (no draft, no rollback); 0: none.
    """

    n_ctx: int = 4096
    npl: Tuple[int, ...] = (2, 4)
    npp: int = 256
    ntg: int = 8
    pad: int = 256
    lengths: Lengths = "equal"
    draft: int = 0
    accept: float = 0.7
    chunk: int = 0


@dataclass(frozen=True)
class Sampling:
    """How the variants are measured.

    Attributes
    ----------
    repeat : int
        Replicas of each npl.
    rounds : int
        Timed repetitions of each variant in each replica.
    seed : int
        Seeds the cells, the queries and drawn lengths.
    trace : bool
        Keep each variant's timeline of its last timed repetition (BenchResult.traces).
    """

    repeat: int = REPLICAS
    rounds: int = ROUNDS
    seed: int = 0
    trace: bool = False


#: `ferry bench --json`'s keys of "config", in the order it writes them (BenchConfig.as_dict).
CONFIG_JSON_KEYS: Tuple[str, ...] = (
    "n_ctx", "npl", "npp", "ntg", "n_layer", "type_kv", "n_head", "head_dim", "n_head_kv", "policies", "unified",
    "device", "pad", "lengths", "repeat", "rounds", "seed", "v_trans", "compact", "reuse", "overlap", "prefetch",
    "prefetch_next", "devices", "trace", "paged", "block_size", "adjacency", "shared_prefix", "device_blocks", "draft",
    "accept", "chunk", "pool_prefetch")
#: The keys of "config" only a draft run (--draft N) writes: a run without a draft writes what it always did.
DRAFT_CONFIG_KEYS: Tuple[str, ...] = ("draft", "accept", "chunk")
#: The keys of "config" only a paged run (--paged) writes.
PAGED_CONFIG_KEYS: Tuple[str, ...] = ("shared_prefix", "device_blocks", "pool_prefetch")
#: Layers of the draft model (an MTP head or an EAGLE layer), their KV on the split device.
DRAFT_LAYERS = 1

#: BenchConfig's groups of options, by field name.
_GROUPS = ("sequences", "kv", "variants", "sampling", "paged_cache")


@dataclass(frozen=True)
class BenchConfig:
    """What `ferry bench` runs, by concern: its options, with the defaults of a run that takes seconds on a CPU.

    Attributes
    ----------
    sequences : Sequences
        The sequences and the window.
    kv : KVGeometry
        The cache's geometry.
    variants : VariantOptions
        Which variants of the copy run.
    unified : bool
        Also the unified cache (where it can run: runs_unified).
    sampling : Sampling
        Replicas, rounds, the seed and the trace.
    paged_cache : PagedOptions
        The paged cache (--paged).
    device : str
        The split's device: auto, cpu or cuda.
    devices : DeviceConfig
        The devices, and where each layer's KV lives.
    """

    sequences: Sequences = field(default_factory=Sequences)
    kv: KVGeometry = field(default_factory=KVGeometry)
    variants: VariantOptions = field(default_factory=VariantOptions)
    unified: bool = True
    sampling: Sampling = field(default_factory=Sampling)
    paged_cache: PagedOptions = field(default_factory=PagedOptions)
    device: str = "auto"
    devices: DeviceConfig = field(default_factory=DeviceConfig)

    @classmethod
    def of(cls, **options: Any) -> "BenchConfig":
        """A configuration from options by the names --json's "config" gives them (CONFIG_JSON_KEYS), each
        put in its group; the others default.

        Raises
        ------
        TypeError
            For a name no group has.
        """
        made: BenchConfig = grouped(cls, _GROUPS, options)
        return made

    def options(self) -> Dict[str, object]:
        """Every option by name, the groups flattened (BenchConfig.of takes them back)."""
        flat: Dict[str, object] = {k: v for name in _GROUPS for k, v in asdict(getattr(self, name)).items()}
        return in_order({**flat, "unified": self.unified, "device": self.device, "devices": asdict(self.devices)},
                        CONFIG_JSON_KEYS)

    def as_dict(self) -> Dict[str, object]:
        """The options by name, as --json writes "config" (CONFIG_JSON_KEYS): a draft's only in a draft run,
        a paged cache's device pool's only in a paged run, so that a run without them writes what it did."""
        return {k: v for k, v in self.options().items()
                if (self.tokens_per_step > 1 or k not in DRAFT_CONFIG_KEYS)
                and (self.paged_cache.paged or k not in PAGED_CONFIG_KEYS)}

    def check(self) -> None:
        """Raise InvalidArgumentError for any option that cannot run."""
        q, kv = self.sequences, self.kv
        check_positive((("-c", q.n_ctx), ("-npp", q.npp), ("-ntg", q.ntg), ("--layers", kv.n_layer),
                        ("--heads", kv.n_head), ("--head-dim", kv.head_dim), ("--kv-heads", kv.n_head_kv),
                        ("--pad", q.pad), *(("--prefetch", d) for d in self.variants.prefetch),
                        ("--repeat", self.sampling.repeat), ("--rounds", self.sampling.rounds)))
        self._check_draft()
        check_run_options(kv.type_kv, kv.head_dim, kv.n_head, kv.n_head_kv, self.variants.policies, self.device)
        check_prefetch_next(self.variants.prefetch_next)
        self.devices.check(self.kv.n_layer, self.device)
        if self.kv.v_trans and self.kv.type_kv == "q8_0":
            raise InvalidArgumentError("--v-trans needs --type f32 or f16: a transposed V cannot hold q8_0 blocks")
        if self.paged_cache.paged:
            self._check_paged()
        if not q.npl:
            raise InvalidArgumentError("-npl: give at least one number of sequences")
        for npl in q.npl:
            if isinstance(npl, bool) or not isinstance(npl, int) or npl <= 0:
                raise InvalidArgumentError(f"-npl {npl!r} is not a positive integer")
            check_streams(q.n_ctx, npl)
            self.prompts(npl)
            if self.cells > q.n_ctx // npl:
                grows = " * (--draft + 1)" if q.draft else " * --chunk" if q.chunk else ""
                raise InvalidArgumentError(f"-npl {npl}: a stream holds {q.n_ctx // npl} cells, fewer than "
                                           f"-npp + -ntg{grows} = {self.cells}")

    def _check_draft(self) -> None:
        """Raise InvalidArgumentError for a --draft or --accept that cannot run."""
        q = self.sequences
        if isinstance(q.draft, bool) or not isinstance(q.draft, int) or q.draft < 0:
            raise InvalidArgumentError(f"--draft {q.draft!r} is not a count of draft tokens (0 or more)")
        if isinstance(q.accept, bool) or not isinstance(q.accept, (int, float)) or not 0.0 <= q.accept <= 1.0:
            raise InvalidArgumentError(f"--accept {q.accept!r} is not a chance from 0 to 1")
        if isinstance(q.chunk, bool) or not isinstance(q.chunk, int) or q.chunk < 0:
            raise InvalidArgumentError(f"--chunk {q.chunk!r} is not a count of tokens (0 or more)")
        if q.draft and q.chunk:
            raise InvalidArgumentError("--draft and --chunk each add rows of several tokens a step: give one")
        for option, n in (("--draft", q.draft), ("--chunk", q.chunk)):
            if n and self.paged_cache.paged:
                raise InvalidArgumentError(f"{option} steps over the cells cache's windows: leave out --paged")

    @property
    def tokens_per_step(self) -> int:
        """Tokens a step of the several-token rows brings per sequence: --draft + 1, or --chunk; 1 without
        them (the single-token rows alone)."""
        q = self.sequences
        return q.draft + 1 if q.draft else q.chunk or 1

    def _check_paged(self) -> None:
        """Raise InvalidArgumentError for options a --paged run cannot take."""
        p = self.paged_cache
        check_paged(p.block_size, p.adjacency)
        check_shared(p.block_size, p.shared_prefix, p.device_blocks,
                     min(min(self.prompts(npl)) for npl in self.sequences.npl) if self.sequences.npl else 0)
        if tuple(self.variants.policies) != ("ragged",):
            raise InvalidArgumentError(f"--paged compares the paged gathers with the cells cache's ragged copy (the "
                                       f"same bytes, contiguous), not --policy {','.join(self.variants.policies)}: "
                                       "give --policy ragged or leave out --policy")
        d = self.devices
        if d.n_devices != 1 or d.placed or d.layer_devices is not None:
            raise InvalidArgumentError("--paged runs on one device with every layer's KV in host memory: leave out "
                                       "--devices, --kv-device-layers, --placement and --layer-devices")
        if self.variants.compact or self.variants.overlap:
            raise InvalidArgumentError("--paged runs serial, without compact staging (its windows land dense "
                                       "anyway): leave out --compact and --overlap")

    def paged_blocks(self, npl: int) -> int:
        """The paged cache's pool at npl sequences, in blocks: twice the blocks the sequences use, at
        least the largest window's cells."""
        block = self.paged_cache.block_size
        used = npl * blocks_for(self.cells, block)
        return max(2 * used, blocks_for(max(self.n_kv(npl, t) for t in range(self.sequences.ntg)), block))

    @property
    def n_embd(self) -> int:
        """Values per cell of K (or V): head_dim * n_head_kv."""
        return self.kv.head_dim * self.kv.n_head_kv

    @property
    def runs_unified(self) -> bool:
        """Whether the unified layout runs: asked for, on one device with every layer's KV on the host,
        without --paged."""
        return self.unified and self.devices.default and not self.paged_cache.paged

    @property
    def unified_note(self) -> Optional[Tuple[str, str]]:
        """What the unified row copies, in two lines to print beside it, when the sequences' lengths
        differ at some npl (it then copies more cells than they hold); None otherwise."""
        if not self.runs_unified or all(len(set(self.prompts(npl))) == 1 for npl in self.sequences.npl):
            return None
        return (f"unified: the same sequences in one stream, each in a slot of {self.cells} cells (-npp + -ntg) "
                "copied whole;",
                "their lengths differ, so it copies more cells than they hold: over unified favours the streams")

    @property
    def layouts(self) -> Tuple[bool, ...]:
        """The layouts that run, as their `unified` flag: split, then unified when it runs."""
        return (False, True) if self.runs_unified else (False,)

    @property
    def cells(self) -> int:
        """L: cells each sequence may reach: npp + ntg, and with several tokens a step npp + ntg *
        tokens_per_step, every verification's draft accepted."""
        return self.sequences.npp + self.sequences.ntg * self.tokens_per_step

    def prompts(self, npl: int) -> List[int]:
        """Each of npl sequences' prompt length (common.prompt_lengths of lengths, seeded by seed)."""
        return prompt_lengths(self.sequences.lengths, npl, self.sequences.npp, self.sampling.seed)

    def n_kv(self, npl: int, step: int) -> int:
        """The split cache's window at step (0..ntg-1) with npl sequences: the longest one's length
        rounded up to pad, at most kv_size."""
        return n_kv_for(max(self.prompts(npl)), step + 1, self.sequences.pad, self.sequences.n_ctx // npl)

    @property
    def prefetch_runs(self) -> Tuple[Tuple[int, bool], ...]:
        """The (Scheduler.prefetch, Scheduler.prefetch_next) of each variant's runs: serial, and with
        overlap each depth in each scope."""
        return prefetch_runs(self.variants.overlap, self.variants.prefetch, self.variants.prefetch_next)

    @property
    def n_steps(self) -> int:
        """Decode steps of the whole run (the progress bar's length): a draft row's verification is one."""
        runs = len(variants(self)) * (len(self.layouts) + (self.tokens_per_step > 1)) * len(self.prefetch_runs) + (
            len(PAGED_GATHERS) + 1 + self.paged_cache.pool_prefetch if self.paged_cache.paged else 0)
        q, m = self.sequences, self.sampling
        return len(q.npl) * m.repeat * (WARMUP + m.rounds) * runs * q.ntg


@dataclass(frozen=True)
class DeviceFigures:
    """What one device did in a variant's repetition (ntg steps).

    Attributes
    ----------
    index : int
        The device's index (--devices N: 0..N-1).
    name : str
        The backend's name.
    layers, resident_layers : list of int
        The layers it runs, and those whose KV its memory holds.
    bytes_copied, kv_bytes_copied : int
        Bytes its splits received over the ntg steps, and of those, the bytes of KV windows.
    copy_s : float
        Its inputs' copy time over a repetition: its floor, the median over replicas.
    memory_bytes : int
        What it holds: the scheduler's buffer on it at its most, plus its resident layers' K and V.
    link_gbps : float or None
        The stand-in's modelled link (None: unmodelled, or a CUDA device).
    """

    index: int
    name: str
    layers: List[int]
    resident_layers: List[int]
    bytes_copied: int
    kv_bytes_copied: int
    copy_s: float
    memory_bytes: int
    link_gbps: Optional[float]

    def as_dict(self) -> Dict[str, object]:
        """The figures by name, as `ferry bench --json` writes them in a row's "devices"."""
        return asdict(self)


@dataclass(frozen=True)
class RunKey:
    """Which run a row is: its number of sequences and its variant.

    Attributes
    ----------
    npl : int
        Sequences.
    policy : str
        The scheduler's copy policy.
    unified : bool
        The unified cache (one stream), else the cache split into streams.
    compact : bool
        Compact staging.
    prefetch : int
        The scheduler's prefetch depth: 0 serial, else overlapped.
    prefetch_next : bool
        Overlapped across steps: each step's first layer copied under the step before.
    gather : str
        A paged cache's gather setting (PAGED_GATHERS); "" for the cells cache.
    draft : int
        Draft tokens each verification checks (a draft row); 0 for a single-token row.
    chunk : int
        Tokens of each prefill chunk (a chunk row); 0 for a single-token row.
    """

    npl: int
    policy: str
    unified: bool = False
    compact: bool = False
    prefetch: int = 0
    prefetch_next: bool = False
    gather: str = ""
    draft: int = 0
    chunk: int = 0

    @property
    def tokens_per_step(self) -> bool:
        """Whether the row's steps bring several tokens a sequence: a draft row or a chunk row."""
        return bool(self.draft or self.chunk)
    @property
    def overlap(self) -> bool:
        """Whether the run prefetched its inputs on the copy queue."""
        return self.prefetch > 0

    @property
    def label(self) -> str:
        """The policy, with "+compact" for compact staging and "+overlap" for an overlapped run; a paged
        cache's row: "paged per-block" or "paged merged"."""
        name = (PAGED_NAMES[self.gather] if self.gather
                else run_name(self.policy, self.compact, self.prefetch, self.prefetch_next))
        return f"{name} draft {self.draft}" if self.draft else f"{name} chunk {self.chunk}" if self.chunk else name


@dataclass(frozen=True)
class RunTimes:
    """A repetition's (ntg steps) times, each its floor (estimate.StepFloor), in a row the median over replicas.

    Attributes
    ----------
    decode_s, copy_s, compute_s : float
        Scheduler.compute's wall time, and its copies' and computes' time.
    host_s : float
        Building (when n_kv changed) or reusing each step's graph, and writing its lengths.
    predicted_copy_s : float
        The copies by the split backends' copy cost models (beside copy_s); not a floor, a repetition's sum.
    sync_host_s : float
        The device table's row: its pool's syncs' own host time over a repetition, each step's syncs
        timed again where they send nothing (the walk of the tables and slots that precedes a sync's
        sends, which the link's model does not price); 0 in the other rows, whose JSON leaves it out.
    """

    decode_s: float
    copy_s: float
    compute_s: float
    host_s: float = 0.0
    predicted_copy_s: float = 0.0
    sync_host_s: float = 0.0


@dataclass(frozen=True)
class RunCounts:
    """What a repetition (ntg steps) moved and built, alike in every timed repetition.

    Attributes
    ----------
    bytes_copied, bytes_read : int
        Bytes the K and V windows' copies moved, and the bytes attention reads of them.
    copy_calls : int
        The K and V windows' transfer calls.
    ahead_bytes : int
        The most bytes prefetching held on the split beyond the layer computing.
    split_memory : int
        Bytes the scheduler held on the split backend (copies and outputs); in a row the most of any replica.
    rebuilds : int
        Graphs built after the first step: where the padded n_kv changed.
    steps_ahead : int
        Steps that kept a first layer copied under the step before.
    gather_used : str
        The methods a paged cache's windows were gathered by, "+"-joined ("batched"); "" for cells; the
        device table's groups of sequences ("1 group").
    tokens : int
        Tokens the repetition served: npl * ntg, and in a draft row the tokens its verifications accepted
        (each step's accepted draft tokens and the token verification adds); 0 in a row made before
        they were counted, read as npl * ntg (BenchRow.tokens).
    draft_bytes_copied : int
        A draft row's bytes the draft's K and V windows copied over its draft steps (0: its KV stays on
        the device).
    first_step_bytes : int
        The device table's bytes in its first step (the prompts' blocks); 0 for the other rows, whose
        JSON leaves it out.
    """

    bytes_copied: int
    bytes_read: int
    copy_calls: int = 0
    ahead_bytes: int = 0
    split_memory: int = 0
    rebuilds: int = 0
    steps_ahead: int = 0
    gather_used: str = ""
    tokens: int = 0
    draft_bytes_copied: int = 0
    first_step_bytes: int = 0


#: `ferry bench --json`'s keys of a row, in the order it writes them (keys a row gains later follow them).
ROW_JSON_KEYS: Tuple[str, ...] = (
    "npl", "policy", "unified", "tokens_per_s", "decode_s", "copy_s", "compute_s", "bytes_copied", "bytes_read",
    "output_sha256", "compact", "split_memory", "host_s", "rebuilds", "prefetch", "ahead_bytes", "ntg",
    "predicted_copy_s", "copy_calls", "gather", "gather_used", "prefetch_next", "steps_ahead", "overlap",
    "tokens_per_s_end_to_end", "replicas", "tokens_per_s_replicas", "devices", "decode_s_per_step",
    "copy_s_per_step", "compute_s_per_step", "host_s_per_step", "predicted_copy_s_per_step", "copy_calls_per_step",
    "label", "bytes_copied_per_step", "bytes_read_per_step", "first_step_bytes", "sync_host_s", "draft",
    "tokens",
    "draft_bytes_copied", "bytes_copied_per_token", "chunk")
#: The keys of a row only a draft run (--draft N) writes, in every row of it.
DRAFT_ROW_KEYS: Tuple[str, ...] = ("draft", "chunk", "tokens", "draft_bytes_copied", "bytes_copied_per_token")


@dataclass(frozen=True)
class SeveralGeometry:
    """A draft or chunk row's steps as it ran them: what its prediction (predict_several) is made for.

    Attributes
    ----------
    tokens_per_step : int
        Query tokens each step brings per sequence: a verification's N + 1, or the chunk.
    draft : int
        Draft steps before each verification (0 for a chunk).
    windows : tuple of int
        Each step's window over the target's layers (cells per stream).
    draft_windows : tuple of tuple of int
        Each step's draft steps' windows over the draft's layers (() each for a chunk).
    token_share : float
        The split device's part of a one-token attention each further token adds (measure_token_share
        over the first step's window): the prediction's DeviceSpec.token_share.
    """

    tokens_per_step: int
    draft: int
    windows: Tuple[int, ...]
    draft_windows: Tuple[Tuple[int, ...], ...]
    token_share: float = 1.0


@dataclass(frozen=True)
class SeveralPrediction:
    """The cost model's figures for a draft or chunk row (predict_several), beside the measured ones.

    Attributes
    ----------
    step_s : float
        The mean over the row's steps of predict_step's step (tokens_per_step query tokens over the
        host windows, copied once) and its draft steps'.
    draft_s : float
        Of step_s, the draft steps' (each predict_step of the draft's layers, resident: one token, no copy).
    accepted_per_step : float
        Tokens the row's steps kept per sequence, as its seeded draws accepted them (the measured rate's
        own: the prediction is of the same run; the chunk for a chunk).
    tokens_per_s : float
        npl * accepted_per_step / step_s: the row's tok/s by the model, beside the measured.
    expected_accepted_per_step : float
        Tokens a step keeps per sequence in expectation: expected_accepted_tokens(N, P) for a draft (the
        chunk for a chunk).
    expected_tokens_per_s : float
        npl * expected_accepted_per_step / step_s: what the model expects of a draft of N at P, whatever
        the seed drew.
    token_share : float
        The part of compute_s each further token of a step adds, as the prediction took it (measured on the
        split device: SeveralGeometry.token_share).
    run_s : float
        The host's fixed cost of a scheduler run the prediction took (predict_step's run_seconds): the
        single-token row's decode time a step beyond its copies and compute; a step of a draft row pays it
        N + 1 times (its verification and each draft step are a run each).
    compute_s : float
        The one-token compute figure of a layer the prediction took: the single-token row's compute per
        step over its layers (predict_step scales it by the tokens a step brings).
    link_gbps : float
        The link the prediction took: the stand-in's modelled one, else the single-token row's measured
        copy bandwidth.
    """

    step_s: float
    draft_s: float
    accepted_per_step: float
    tokens_per_s: float
    compute_s: float
    link_gbps: float
    expected_accepted_per_step: float = 0.0
    expected_tokens_per_s: float = 0.0
    run_s: float = 0.0
    token_share: float = 1.0


def predict_several(cfg: BenchConfig, row: BenchRow, single: BenchRow, link_gbps: Optional[float] = None,
                    latency_us: float = 0.0) -> Optional[SeveralPrediction]:
    """The cost model's step time and tokens/s for a draft or chunk row, as it ran (row.several): each
    step's predict_step(layers_from_geometry at that step's window, every target layer in host memory,
    tokens_per_step=N + 1 or the chunk, each further token adding the split's measured token_share of a
    one-token attention), plus N draft steps' predict_step over the draft's layers
    (resident on the split device, one token each), each of those runs paying the host's fixed cost of a
    run (run_seconds: the single row's decode time a step beyond its copies and compute). Tokens/s are
    over the tokens the row's own draws kept (the measured rate's), and beside them over
    expected_accepted_tokens(N, P) (a chunk keeps all its tokens). A serial row's copies are the split's
    modelled link at the copies the row made (RunTimes.predicted_copy_s: under ragged each stream's own
    cells), its computes predict_step's; a prefetching row's copies, or a row without a modelled link,
    are layers_from_geometry's: each stream's whole window of n_kv cells, as ranges copies it (under
    ragged an upper bound, by the padding and by each stream's cells short of the longest's).

    Parameters
    ----------
    cfg : BenchConfig
        The run's configuration (the cache's geometry).
    row : BenchRow
        The draft or chunk row.
    single : BenchRow
        Its variant's single-token row: its compute per step over the layers is a layer's one-token figure,
        and its decode time a step beyond its copies and compute a run's fixed cost.
    link_gbps : float, optional
        The split's modelled link (the stand-in's); None: the single row's measured copy bandwidth.
    latency_us : float, optional
        The split's modelled latency per transfer.

    Returns
    -------
    SeveralPrediction or None
        None for a row without several tokens a step, or one split over several devices (the bench's
        rows give no per-device compute figure).
    """
    geo = row.several
    if geo is None or len(row.devices) > 1 or not geo.windows:
        return None
    g, q, npl = cfg.kv, cfg.sequences, row.key.npl
    per_layer = single.per_step(single.times.compute_s) / g.n_layer
    t = single.times  # one run a step: what its wall time holds beyond its copies and compute (none if overlapped)
    run_s = max(0.0, single.per_step(t.decode_s - t.copy_s - t.compute_s))
    link = link_gbps or single.copy_bandwidth / 1e9 or 1.0
    device = [DeviceSpec(link, latency_us, per_layer, token_share=geo.token_share)]
    figures: Dict[Tuple[int, int, int], List[Any]] = {}

    def layers(n_kv: int, n_layer: int, n_new: int) -> List[Any]:
        if (n_kv, n_layer, n_new) not in figures:
            figures[n_kv, n_layer, n_new] = layers_from_geometry(
                g.type_kv, g.type_kv, g.head_dim, g.n_head_kv, q.n_ctx, npl, n_kv, [None] * n_layer, g.v_trans,
                n_new=n_new, n_head=g.n_head)
        return figures[n_kv, n_layer, n_new]

    n_tok = geo.tokens_per_step
    # Serially a step is its copies and then its computes: the copies are the split's cost model at the
    # copies the row made (each stream's own cells under ragged, not the padded windows); prefetching, the
    # copies overlap the computes and predict_step simulates both, at the padded windows.
    serial = row.key.prefetch == 0 and link_gbps is not None
    copies = row.per_step(row.times.predicted_copy_s) if serial else 0.0
    verify = [predict_step(layers(n_kv, g.n_layer, n_tok), device, [serial] * g.n_layer, prefetch=row.key.prefetch,
                           tokens_per_step=n_tok, run_seconds=run_s).step_seconds for n_kv in geo.windows]
    drafts = [sum(predict_step(layers(n_kv, DRAFT_LAYERS, 1), device, [True] * DRAFT_LAYERS,
                               run_seconds=run_s).step_seconds
                  for n_kv in step) for step in geo.draft_windows]
    draft_s = sum(drafts) / len(geo.windows)
    step_s = sum(verify) / len(geo.windows) + draft_s + copies
    kept = row.tokens / row.ntg / npl  # the seeded draws' own: the measured rate's tokens
    expected = expected_accepted_tokens(geo.draft, q.accept) if geo.draft else float(n_tok)

    def rate(tokens: float) -> float:
        return npl * tokens / step_s if step_s > 0 else math.inf

    return SeveralPrediction(step_s=step_s, draft_s=draft_s, accepted_per_step=kept, tokens_per_s=rate(kept),
                             compute_s=per_layer, link_gbps=link, expected_accepted_per_step=expected,
                             expected_tokens_per_s=rate(expected), run_s=run_s, token_share=geo.token_share)


@dataclass(frozen=True)
class BenchRow:
    """One variant of a number of sequences and a cache layout, over its replicas (pyperf's Run: values
    and what they are of).

    Attributes
    ----------
    key : RunKey
        Which run.
    ntg : int
        Steps of a repetition.
    times : RunTimes
        A repetition's floors, the median over the replicas.
    counts : RunCounts
        A repetition's bytes, calls and rebuilds.
    output_sha256 : str
        The digest of every attention output of a repetition.
    devices : tuple of DeviceFigures
        Per device, in index order.
    replicas_tokens_per_s : tuple of float
        Each replica's own tokens/s, in the order they were made.
    several : SeveralGeometry or None
        A draft or chunk row's steps as it ran them (what its prediction is made for); None otherwise.
    """

    key: RunKey
    ntg: int
    times: RunTimes
    counts: RunCounts
    output_sha256: str = field(repr=False)
    devices: Tuple[DeviceFigures, ...] = field(default=(), repr=False)
    replicas_tokens_per_s: Tuple[float, ...] = field(default=(), repr=False)
    several: Optional["SeveralGeometry"] = field(default=None, repr=False)

    @property
    def tokens(self) -> int:
        """Tokens a repetition served: npl * ntg, or a draft row's accepted tokens (RunCounts.tokens)."""
        return self.counts.tokens or self.key.npl * self.ntg

    @property
    def tokens_per_s(self) -> float:
        """The tokens served (tokens: a draft row's accepted ones) over the decode time."""
        return self.tokens / self.times.decode_s if self.times.decode_s > 0 else math.inf

    @property
    def bytes_per_token(self) -> float:
        """The K and V windows' bytes copied (the scheduler's counters) per token served (a draft row:
        per accepted token)."""
        return self.counts.bytes_copied / self.tokens

    @property
    def tokens_per_s_end_to_end(self) -> float:
        """Tokens per second of decode and host time together: what a loop driving ferry pays."""
        t = self.times
        total = t.decode_s + t.host_s
        return self.tokens_per_s * t.decode_s / total if total > 0 and t.decode_s > 0 else math.inf

    @property
    def replicas(self) -> int:
        """Replicas: each its own caches and schedulers (at least 1)."""
        return max(1, len(self.replicas_tokens_per_s))

    @property
    def replica_rates(self) -> Tuple[float, ...]:
        """Each replica's tokens/s, or the row's own for a row without them."""
        return self.replicas_tokens_per_s or (self.tokens_per_s,)

    def per_step(self, total: float) -> float:
        """A repetition's figure (seconds or bytes over ntg steps) per step."""
        return total / self.ntg if self.ntg else total

    @property
    def copy_bandwidth(self) -> float:
        """Bytes copied per second of copy time (0 when nothing was copied)."""
        return self.counts.bytes_copied / self.times.copy_s if self.times.copy_s > 0 else 0.0

    def as_dict(self) -> Dict[str, object]:
        """The row as `ferry bench --json` writes it, its records flattened (ROW_JSON_KEYS): the run, its floors
        and bytes (a repetition's, and per step), its replicas' tokens/s ("tokens_per_s_replicas", so a gain
        can be found again) and each device's figures ("devices")."""
        t, n = self.times, self.counts
        d: Dict[str, object] = {**asdict(self.key), **asdict(t), **asdict(n)}
        d.update(tokens_per_s=self.tokens_per_s, output_sha256=self.output_sha256, ntg=self.ntg,
                 overlap=self.key.overlap, tokens_per_s_end_to_end=self.tokens_per_s_end_to_end,
                 replicas=self.replicas, tokens_per_s_replicas=list(self.replica_rates),
                 devices=[x.as_dict() for x in self.devices],
                 **{f"{w}_s_per_step": self.per_step(getattr(t, f"{w}_s"))
                    for w in ("decode", "copy", "compute", "host", "predicted_copy")},
                 copy_calls_per_step=self.per_step(n.copy_calls), label=self.key.label,
                 bytes_copied_per_step=self.per_step(n.bytes_copied),
                 bytes_read_per_step=self.per_step(n.bytes_read), tokens=self.tokens,
                 bytes_copied_per_token=self.bytes_per_token)
        if not n.first_step_bytes:  # a device table's row alone has a first step of its own
            del d["first_step_bytes"]
        if not t.sync_host_s:  # and syncs of its own
            del d["sync_host_s"]
        return in_order(d, ROW_JSON_KEYS)


def in_order(d: Dict[str, object], keys: Sequence[str]) -> Dict[str, object]:
    """d with the keys it shares with keys first, in that order, then the rest in d's order: a writer's
    order kept while the records it flattens change shape."""
    return {**{k: d[k] for k in keys if k in d}, **d}


@dataclass(frozen=True)
class OverlapFigures:
    """An overlapped row beside its variant's serial run (BenchResult's bound, floor and exposed).

    Attributes
    ----------
    serial : RunTimes
        The serial run's times.
    bound_s : float
        max(copy, compute) of the serial run: a repetition's decode time when one hides the other.
    floor_s, own_floor_s : float or None
        The least decode time prefetching can reach, from the serial run's copy and compute, and from the
        overlapped run's own (None where the layers are not alike).
    exposed_share : float
        Of what prefetching could hide, the share its decode still pays.
    """

    serial: RunTimes
    bound_s: float
    floor_s: Optional[float]
    own_floor_s: Optional[float]
    exposed_share: float


@dataclass(frozen=True)
class ReportRow:
    """A row with what the report says of it, finished for the command line to print: its gains and
    intervals, its variant's unified row, and an overlapped row's figures beside its serial run.

    Attributes
    ----------
    row : BenchRow
        The run.
    gain : Interval or None
        Its gain over flat (same npl and layout, serial or overlapped alike); None without a flat run.
    replica_gains : tuple of float
        Each replica's gain over flat's replica of the same rank; () for flat or without a flat run.
    over_unified : Interval or None
        A split-cache row's gain over the unified cache under the same variant; None for a unified row or
        when the unified cache did not run.
    unified : BenchRow or None
        The same variant's row on the unified cache, beside a split-cache row; None otherwise.
    overlap : OverlapFigures or None
        An overlapped row's figures; None for a serial row.
    single : BenchRow or None
        Beside a draft row, the single-token row of its variant (--draft 0's); None otherwise.
    predicted : SeveralPrediction or None
        A draft or chunk row's step and tokens/s by the cost model (predict_several); None otherwise.
    """

    row: BenchRow
    gain: Optional[Interval] = None
    replica_gains: Tuple[float, ...] = ()
    over_unified: Optional[Interval] = None
    unified: Optional[BenchRow] = None
    overlap: Optional[OverlapFigures] = None
    single: Optional[BenchRow] = None
    predicted: Optional[SeveralPrediction] = None

    @property
    def bytes_over_single(self) -> Optional[float]:
        """A draft row's bytes copied per accepted token over its single-token row's per token; None for
        other rows."""
        s = self.single
        return None if s is None else self.row.bytes_per_token / s.bytes_per_token if s.bytes_per_token else None

    @property
    def speedup_over_single(self) -> Optional[float]:
        """A draft row's tokens/s (accepted tokens) over its single-token row's; None for other rows."""
        s = self.single
        return None if s is None else self.row.tokens_per_s / s.tokens_per_s

    @property
    def is_serial_cells(self) -> bool:
        """Whether the row is a serial single-token run of the cells cache (the main table's rows)."""
        return not self.row.key.overlap and not self.row.key.gather and not self.row.key.tokens_per_step

    def as_dict(self) -> Dict[str, object]:
        """The row as `ferry bench --json` writes it (without "config"): BenchRow.as_dict, an overlapped row's
        figures, then its gains (see BenchResult.as_dicts)."""
        r, g, u, o = self.row, self.gain, self.over_unified, self.overlap
        d = r.as_dict()
        decode = r.times.decode_s
        if o is not None:
            s = o.serial
            d.update(serial_decode_s=s.decode_s, bound_s=o.bound_s, over_bound=decode / o.bound_s,
                     over_serial=decode / s.decode_s, exposed_share=o.exposed_share, floor_s=o.floor_s,
                     over_floor=None if o.floor_s is None else decode / o.floor_s, own_floor_s=o.own_floor_s,
                     over_own_floor=None if not o.own_floor_s else decode / o.own_floor_s,
                     compute_over_serial=r.times.compute_s / s.compute_s if s.compute_s > 0 else None)
        k = r.key
        d.update(gain=None if g is None else g.estimate, gain_low=None if g is None else g.low,
                 gain_high=None if g is None else g.high,
                 gain_within_noise=None if g is None or k.policy == "flat" else g.within_noise,
                 gain_claimed=not k.unified and k.policy != "flat" and g is not None,
                 over_unified=None if u is None else u.estimate, over_unified_low=None if u is None else u.low,
                 over_unified_high=None if u is None else u.high)
        if self.single is not None:
            d.update(bytes_per_token_over_single=self.bytes_over_single,
                     tokens_per_s_over_single=self.speedup_over_single)
        p = self.predicted
        if p is not None:  # predicted: at the seeded draws' accepted tokens, as measured; expected: at E(N, P)
            d.update(accepted_per_step=r.tokens / r.ntg / k.npl,
                     expected_accepted_per_step=p.expected_accepted_per_step,
                     predicted_step_s=p.step_s, predicted_draft_s=p.draft_s, predicted_tokens_per_s=p.tokens_per_s,
                     tokens_per_s_over_predicted=r.tokens_per_s / p.tokens_per_s if p.tokens_per_s > 0 else None,
                     expected_tokens_per_s=p.expected_tokens_per_s, predicted_compute_s=p.compute_s,
                     predicted_run_s=p.run_s, predicted_token_share=p.token_share, predicted_link_gbps=p.link_gbps)
        return d


@dataclass(frozen=True)
class NplSummary:
    """What the report says of one npl beneath its table.

    Attributes
    ----------
    npl : int
        Sequences.
    outputs_identical : bool
        Whether every run of npl (each policy, both layouts, serial and overlapped) gave the same outputs.
    rebuilds : int
        How many later steps rebuilt the step's graph, in the first variant's serial run of the cells cache.
    """

    npl: int
    outputs_identical: bool
    rebuilds: int


@dataclass(frozen=True)
class BenchReport:
    """A run's report, finished for the command line to print: it formats from this alone.

    Attributes
    ----------
    rows : tuple of ReportRow
        Every row, in the rows' order (BenchResult.report).
    per_npl : tuple of NplSummary
        Per npl, in the configuration's order.
    variants : tuple of (str, bool)
        The (policy, compact) runs in table order (BenchResult.variants); the main table shows the unified
        cache's row of the first.
    """

    rows: Tuple[ReportRow, ...]
    per_npl: Tuple[NplSummary, ...]
    variants: Tuple[Tuple[str, bool], ...]


@dataclass
class BenchResult:
    """Every run of a configuration, and which backends ran it."""

    config: BenchConfig
    split_name: str
    cache_memory: str
    rows: List[BenchRow]
    device_names: List[str] = field(default_factory=list)  # every device, in index order (split_name: device 0)
    standin_link_gbps: Optional[float] = None  # the stand-in split's modelled link (None: unmodelled, or CUDA)
    standin_latency_us: float = 0.0  # the stand-in split's modelled latency per transfer
    link_overrun: float = 0.0  # over the timed rounds, the most a stand-in's copies ran past its link, a share
    seconds: float = 0.0  # the run's wall time
    traces: Dict[str, List[TracedStep]] = field(default_factory=dict)  # with cfg.sampling.trace: per variant's label,
    # the steps of its last timed repetition in the first replica

    def row(self, npl: int, policy: str, unified: bool = False, compact: bool = False, prefetch: int = 0,
            gather: str = "", within: bool = False) -> BenchRow:
        """The row of one run, serial or prefetching that many parts ahead (across steps, or within each
        with within), of the cells cache or (gather one of PAGED_GATHERS) the paged cache (StopIteration
        for a run the configuration did not make)."""
        key = RunKey(npl=npl, policy=policy, unified=unified, compact=compact, prefetch=prefetch,
                     prefetch_next=prefetch > 0 and not within, gather=gather)
        return next(r for r in self.rows if r.key == key)

    def single_of(self, r: BenchRow) -> BenchRow:
        """The single-token row of a draft row's variant (the row itself for a single-token row)."""
        return next(x for x in self.rows if x.key == replace(r.key, draft=0, chunk=0))

    def serial_of(self, r: BenchRow) -> BenchRow:
        """The serial run of an overlapped row's variant (the row itself when it is serial)."""
        k = r.key
        return self.row(k.npl, k.policy, k.unified, k.compact)

    def bound(self, r: BenchRow) -> float:
        """max(copy, compute) of the row's serial run: a step's decode time when one hides the other."""
        serial = self.serial_of(r).times
        return max(serial.copy_s, serial.compute_s)

    def floor(self, r: BenchRow, own: bool = False) -> Optional[float]:
        """The least decode time prefetching can reach for the row's variant, from its serial run's copy
        and compute (with own, from the overlapped row's own, which the copies and computes running
        side by side may have slowed). Within a step: the first layer's copy (nothing computes before
        it), then each layer's compute under the next layer's copy, then the last layer's compute; with
        L equal layers, copy / L + (L - 1) / L * max(copy, compute) + compute / L, past the bound by the
        first layer's copy or the last layer's compute, a large share of a step of few layers. Across
        steps (prefetch_next), a step that kept its first layer's windows copied under the step before
        (BenchRow.steps_ahead of the ntg: all but a repetition's first, whose lengths fell, so that it
        copies them again; none on the unified cache, whose windows carry no lengths) can reach the
        bound, max(copy, compute): ((ntg - k) * that floor + k * bound) / ntg. None where the layers
        are not alike (some KV on a device, or several devices)."""
        cfg = self.config
        if cfg.devices.n_devices != 1 or cfg.devices.placed:
            return None
        s, n, k = (r if own else self.serial_of(r)).times, cfg.kv.n_layer, r.counts.steps_ahead
        bound = max(s.copy_s, s.compute_s)
        within = (s.copy_s + (n - 1) * bound + s.compute_s) / n
        return ((cfg.sequences.ntg - k) * within + k * bound) / cfg.sequences.ntg

    def exposed(self, r: BenchRow) -> float:
        """An overlapped row's exposed share: of what prefetching could hide (min(copy, compute) of the serial
        run), the share its decode still pays: (decode - max(copy, compute)) / min(copy, compute); 0 when it
        hides it all, 1 when it hides nothing."""
        serial = self.serial_of(r).times
        hideable = min(serial.copy_s, serial.compute_s)
        return (r.times.decode_s - self.bound(r)) / hideable if hideable > 0 else 0.0

    def variants(self) -> List[Tuple[str, bool]]:
        """(policy, compact) in table order: every policy, then the non-flat ones with compact staging."""
        return variants(self.config)

    def flat_of(self, r: BenchRow) -> Optional[BenchRow]:
        """flat's row of the same npl and layout (overlapped for an overlapped row); None without flat."""
        if "flat" not in self.config.variants.policies:
            return None
        k = r.key
        return self.row(k.npl, "flat", k.unified, prefetch=k.prefetch, within=not k.prefetch_next)

    def gain_interval(self, r: BenchRow) -> Optional[Interval]:
        """A row's gain over flat (same npl and layout, serial or overlapped alike) with its interval
        (estimate.gain_interval); None without a flat run."""
        flat = self.flat_of(r)
        return None if flat is None else gain_interval(r.replica_rates, flat.replica_rates)

    def gain(self, r: BenchRow) -> Optional[float]:
        """A row's gain over flat: the estimate of gain_interval (None without flat)."""
        g = self.gain_interval(r)
        return None if g is None else g.estimate

    def unified_gain(self, r: BenchRow) -> Optional[Interval]:
        """A split-cache row's gain over the unified cache under the same policy; None for a unified row
        or when the unified cache did not run."""
        k = r.key
        if k.unified or not self.config.runs_unified:
            return None
        u = self.row(k.npl, k.policy, True, k.compact, k.prefetch, within=not k.prefetch_next)
        return gain_interval(r.replica_rates, u.replica_rates)

    def warnings(self) -> List[str]:
        """What makes the figures less sure than they look: a stand-in's copies running past its link."""
        if self.link_overrun <= LINK_OVERRUN:
            return []
        return [f"the stand-in's copies ran {self.link_overrun:.0%} past the modelled link's time: the host did not "
                "keep to the link (copies slower than it, or a busy machine), so copy times partly follow the host; "
                "a lower --link-gbps leaves it room"]

    def report(self) -> List[ReportRow]:
        """Every row, in the rows' order, finished with what the report says of it (ReportRow)."""
        out = []
        for r in self.rows:
            k = r.key
            if k.tokens_per_step:
                single = self.single_of(r)
                out.append(ReportRow(row=r, single=single, predicted=predict_several(
                    self.config, r, single, self.standin_link_gbps, self.standin_latency_us)))
                continue
            flat = self.flat_of(r)
            gains = () if flat is None or k.policy == "flat" else tuple(
                a / b - 1 for a, b in zip(r.replica_rates, flat.replica_rates))
            unified = None
            if not k.unified and not k.gather and self.config.runs_unified:
                unified = self.row(k.npl, k.policy, True, k.compact, k.prefetch, within=not k.prefetch_next)
            overlap = None
            if k.overlap:
                overlap = OverlapFigures(serial=self.serial_of(r).times, bound_s=self.bound(r), floor_s=self.floor(r),
                                         own_floor_s=self.floor(r, own=True), exposed_share=self.exposed(r))
            out.append(ReportRow(row=r, gain=self.gain_interval(r), replica_gains=gains,
                                 over_unified=self.unified_gain(r), unified=unified, overlap=overlap))
        return out

    def finished(self) -> BenchReport:
        """The whole report, finished: every row (report), each npl's summary and the variants."""
        runs = tuple(self.variants())
        policy, compact = runs[0]
        per_npl = tuple(NplSummary(npl=npl, outputs_identical=self.outputs_identical(npl),
                                   rebuilds=self.row(npl, policy, False, compact).counts.rebuilds)
                        for npl in self.config.sequences.npl)
        return BenchReport(rows=tuple(self.report()), per_npl=per_npl, variants=runs)

    def as_dicts(self) -> List[Dict[str, object]]:
        """The rows as `ferry bench --json` writes them: each ReportRow's as_dict: the row's (BenchRow.as_dict);
        an overlapped row's serial decode time and bound ("serial_decode_s", "bound_s"), its decode time over
        each ("over_bound", "over_serial"), its exposed share ("exposed_share", see exposed), the pipeline's
        floor ("floor_s", "over_floor"; None where floor has none), the same from its own copy and compute
        ("own_floor_s", "over_own_floor"), and its compute over the serial run's ("compute_over_serial": what
        running beside the copies cost the compute); its gain over flat and its interval ("gain", "gain_low",
        "gain_high", "gain_within_noise"; "gain_claimed": False for flat and the unified cache); a split row's
        gain over the unified cache ("over_unified", "over_unified_low", "over_unified_high"); "config": the
        whole configuration (BenchConfig.as_dict)."""
        config = self.config.as_dict()
        drafted = self.config.tokens_per_step > 1
        return [{**{k: v for k, v in f.as_dict().items() if drafted or k not in DRAFT_ROW_KEYS}, "config": config}
                for f in self.report()]

    def outputs_identical(self, npl: int) -> bool:
        """Whether every run of npl (each policy, both layouts, serial and overlapped) gave the same
        attention outputs, and every draft row the same as the other draft rows."""
        return all(len({r.output_sha256 for r in self.rows if r.key.npl == npl and r.key.tokens_per_step == d}) <= 1
                   for d in (False, True))


def variants(cfg: BenchConfig) -> List[Tuple[str, bool]]:
    """The (policy, compact) runs of a configuration (see common.variants)."""
    return workload_variants(cfg.variants.policies, cfg.variants.compact)


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
