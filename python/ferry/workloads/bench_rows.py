"""A `ferry bench` row: which run it is (RunKey), a repetition's times and bytes, each device's figures, and
the keys --json writes them by."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

from .bench_config import PAGED_NAMES, in_order
from .common import run_name
from .several import SeveralGeometry


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
