"""`ferry bench`'s options by concern (BenchConfig), checked before anything is allocated, and the constants
of a run: replicas, rounds, the paged cache's gathers."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..backend import Backend, StandinBackend
from ..errors import InvalidArgumentError
from .common import (
    KVGeometry,
    Lengths,
    VariantOptions,
    check_positive,
    check_prefetch_next,
    check_run_options,
    check_streams,
    grouped,
    n_kv_for,
    prefetch_runs,
    prompt_lengths,
)
from .common import variants as workload_variants
from .devices import DeviceConfig
from .paged_tables import DEVICE_TABLE, DEVICE_TABLE_PREFETCH, PagedOptions, blocks_for, check_paged, check_shared

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


def variants(cfg: BenchConfig) -> List[Tuple[str, bool]]:
    """The (policy, compact) runs of a configuration (see common.variants)."""
    return workload_variants(cfg.variants.policies, cfg.variants.compact)


def in_order(d: Dict[str, object], keys: Sequence[str]) -> Dict[str, object]:
    """d with the keys it shares with keys first, in that order, then the rest in d's order: a writer's
    order kept while the records it flattens change shape."""
    return {**{k: d[k] for k in keys if k in d}, **d}
