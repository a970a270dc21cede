"""The decode benchmark `ferry bench` runs: llama.cpp's batched-bench generation phase, real copies and timings.

A KV cache lives in host memory (pinned when the split backend is a GPU); each decode step
runs one graph: per layer, the split's K and V windows are copied in by the scheduler's copy
policy and decode attention runs on the split backend (CUDA, or the CPU stand-in device, whose
copies are held to an 8 GB/s link unless --link-gbps says otherwise: ferry.workloads.devices).

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
scheduler's allocation are outside it. A repetition of a variant (a policy, with or without
compact staging, on one layout) is its ntg steps; a sample is as many repetitions of it as the
calibration found. A run is made of replicas: each builds its own caches (one per layout,
serving every variant) and schedulers (one per variant), so that where their buffers land in
memory changes from one replica to the next as it does from one run to the next. In a replica
the variants of both layouts take turns repetition by repetition, in rounds whose orders
balance what runs before each variant (ferry.workloads.estimate.balanced_orders): a variant
that runs right after its own repetition finds its data still in the host's caches, which one
fixed order gives to some variants and not others. A turn is one sample of each variant. The
replicas of a wave are made together, each warmed up with one untimed round (the first of an
npl then calibrates: ferry.workloads.estimate.calibrate, the repetitions per sample doubled
until the fastest variant's sample lasts --min-sample-ms), and then take turns, a turn each,
until each has about REPS_PER_REPLICA (24) timed repetitions of each variant (2 to 10 turns:
samples_per_replica, spread evenly over the wave's rounds; 2 with --min-sample-ms 0); so every
replica's repetitions spread over the whole wave, and a busy minute of the host falls on all of
them alike.
Replicas whose caches would pass WAVE_BYTES together are made fewer at a time (one of each
npl at the least).

Processes: by default a wave is one replica of each npl, made in a worker process of its own
(ferry.workloads.workers: a new interpreter, as pyperf runs its benchmarks), the waves one
after another, the first calibrating and the others taking its repetitions per sample.
Where a process's library and heap land moves its floors, and replicas made in one process
share it: in ten default runs with every replica in one process, a run's interval held as
few as 3 of the other 9 runs' estimates; with a process per replica, 5 (and 9 with what
varies between runs added: estimate.BETWEEN_RUNS). With in_process (--in-process), or
one replica, every replica is made here, in waves as above.

Without --repeat there are REPLICAS (8) of each npl, and then ADDED_REPLICAS more at a
time for an npl while any of its gains' intervals (below) is wider than ±2.5 points, if the
added replicas would end within the time cap (--max-time, judged by what the replicas so far
took): else a warning says that the cap came first. With
--repeat N, exactly N. The collector is off while samples are timed.

Host time: building the graph in Python and allocating it are timed beside each step (and
found as decode time is), with writing each sequence's length: the step's graph is built and
allocated when the padded n_kv changes, else the last step's runs again (ferry.StepGraph;
with reuse off, every step builds). End-to-end tokens/s = npl * ntg / (decode + host time).
A row's rebuilds are the graphs built after a repetition's first step: one wherever n_kv
crosses a multiple of --pad.

Overlap (--overlap): every variant also runs with its scheduler prefetching (--prefetch
layers ahead: each layer's windows copied on the split backend's copy queue while earlier
layers compute), taking turns with the serial runs in the same invocation. The overlapped
row's copy time is the time its copy queue spent on the copies, its compute time that of
attention, its decode time the step's wall time as always. Its bound is max(copy, compute)
of the serial row: what a step costs when compute hides the copy entirely (or the copy the
compute); a step still pays its first layer's copy before anything can compute. Its memory
is what the scheduler held on the split backend, and ahead is what prefetching held there
beyond the layer computing (the windows of the layers queued ahead).

Devices (cfg.devices, ferry.workloads.devices): with --devices N the layers run on N devices
(contiguous ranges, or the map given), each layer's query on its device and the lengths on
device 0; a layer's KV lives in host memory or in a device's memory (--kv-device-layers,
--placement). The scheduler has every device and the CPU; a device-resident layer's windows
are read where they are. Each row carries per device the layers it runs and holds, the bytes
its splits received over a repetition (of them KV windows'), their copy time (the median, as
below) and the memory it held (the scheduler's buffer at its most plus its
resident layers' K and V). The unified layout runs only on one device with every layer on the
host.

The figures are floors (ferry.workloads.estimate): a replica's decode, copy, compute and host
time are each step's fastest time over its samples, summed over the ntg steps (a repetition's
floor: what the step costs when the host adds nothing to it), and a row's are the median over
the replicas that reached it (below); tokens/s is npl * ntg over that median decode floor. A
gain is the median over replicas of a variant's floor tokens/s over the reference's in the
same replica, minus 1 (where no replica reached both floors, the ratio of the two rows'
tokens/s), with the 95% distribution-free interval of a median over every replica (for 6 to
8, their range), widened by what varies between runs (estimate.BETWEEN_RUNS): over flat
(same layout, serial or overlapped alike), and the split cache over the unified one under the
same policy. The unified cache copies the same bytes under every policy, so its gain over flat
measures only noise; it is kept in the JSON but not claimed. A gain whose interval contains 0
is within its own noise. Each sample's own tokens/s (its repetitions' mean rate, whatever the
host added) is kept beside the floors, as the load the run met. Bytes are those of one
repetition (every repetition moves the same), and per step their mean over the ntg steps.
A replica whose floor of a variant is more than 3% slower than that variant's fastest replica
did not reach it (the host left some step no quiet moment: ferry.workloads.estimate.reached;
fresh memory moves a floor by about 1%); it is left out of the variant's figures and gain
estimates, and kept in the intervals, which it widens.
Warnings: the time cap reached before every interval was narrow enough, replicas that missed
a floor, or a stand-in's timed copies running more than 10% past its link's time (the host
did not keep to the link: copy times partly follow the host).
"""

from __future__ import annotations

import functools
import gc
import hashlib
import math
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..backend import Backend, CPUBackend, StandinBackend
from ..errors import InvalidArgumentError
from ..graph import Graph
from ..sched import Scheduler
from ..step import StepGraph, attention_step
from ..tensor import Tensor
from ..types import row_size, to_type
from . import workers
from .common import (
    POLICIES,
    check_positive,
    check_run_options,
    check_streams,
    n_kv_for,
    new_cache,
    prefetch_depths,
    random_rows,
    run_name,
    write_cells,
)
from .common import variants as workload_variants
from .devices import DeviceConfig, naming_device_memory
from .estimate import (
    FLOOR_SPREAD,
    Interval,
    StepFloor,
    balanced_orders,
    calibrate,
    ratio_spread,
    reached,
    replica_gain,
)

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
    device: str = "auto"
    pad: int = 1
    repeat: Optional[int] = None  # replicas, exactly; None: REPLICAS, more until intervals narrow
    seed: int = 0
    v_trans: bool = False  # V stored transposed (flash attention off): a gap after every channel row
    compact: bool = False  # also run each non-flat policy with compact staging
    reuse: bool = True  # a step whose padded n_kv is the last step's runs the last graph (StepGraph)
    overlap: bool = False  # also run each variant prefetching its inputs on the copy queue
    prefetch: int = 1  # parts (layers) ahead an overlapped run queues
    devices: DeviceConfig = field(default_factory=DeviceConfig)  # the devices, and where each layer's KV lives
    min_sample_ms: float = 20.0  # what a sample lasts at least (decode time): the calibration's goal; 0: one repetition
    max_time: float = 30.0  # seconds the run may spend adding replicas (default repeat only), the npl taking turns
    in_process: bool = False  # every replica in this process (else each replica of the npls in a worker process)

    def check(self) -> None:
        """Raise InvalidArgumentError for any option that cannot run."""
        check_positive((("-c", self.n_ctx), ("-npp", self.npp), ("-ntg", self.ntg), ("--layers", self.n_layer),
                        ("--heads", self.n_head), ("--head-dim", self.head_dim), ("--kv-heads", self.n_head_kv),
                        ("--pad", self.pad), ("--prefetch", self.prefetch)))
        if self.repeat is not None:
            check_positive((("--repeat", self.repeat),))
        for name, value in (("--min-sample-ms", self.min_sample_ms), ("--max-time", self.max_time)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise InvalidArgumentError(f"{name} must be a number of at least 0, got {value!r}")
        check_run_options(self.type_kv, self.head_dim, self.n_head, self.n_head_kv, self.policies, self.device)
        self.devices.check(self.n_layer, self.device)
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
    def runs_unified(self) -> bool:
        """Whether the unified layout runs: asked for (unified), on one device with every layer's KV on the
        host; with several devices or a placement only the split layout runs."""
        return self.unified and self.devices.default

    @property
    def layouts(self) -> Tuple[bool, ...]:
        """The layouts that run, as their `unified` flag: split, then unified when it runs."""
        return (False, True) if self.runs_unified else (False,)

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
        """Decode steps of a run at the least: every npl, variant and layout, in each of its first
        replicas a warm-up and replica_samples(1) samples, each of one repetition (calibration and
        added replicas take more)."""
        layouts = len(self.layouts)
        return len(self.npl) * len(variants(self)) * layouts * len(self.prefetch_depths) * self.ntg * (
            WARMUP + self.replica_samples(1)) * self.min_replicas

    def replica_samples(self, loops: int) -> int:
        """Timed samples of each variant in a replica whose samples hold loops repetitions:
        samples_per_replica(loops), or MIN_SAMPLES_PER_REPLICA with --min-sample-ms 0 (no calibration:
        the quickest run)."""
        return samples_per_replica(loops) if self.min_sample_ms > 0 else MIN_SAMPLES_PER_REPLICA

    @property
    def min_replicas(self) -> int:
        """Replicas of each npl before any is added: --repeat, or REPLICAS."""
        return REPLICAS if self.repeat is None else self.repeat

    @property
    def adaptive(self) -> bool:
        """Whether replicas are added until the intervals narrow (no --repeat)."""
        return self.repeat is None

    @property
    def prefetch_depths(self) -> Tuple[int, ...]:
        """The Scheduler.prefetch of each variant's runs: 0 (serial), and with overlap the depth."""
        return prefetch_depths(self.overlap, self.prefetch)


#: Untimed repetitions of each variant in a replica before its timed ones.
WARMUP = 1
#: Replicas of each npl before the bench adds any (without --repeat): 6 is the fewest with a 95%
#: interval; for 6 to 8 it is their range (96.9 to 99.2%), which a busy replica widens.
REPLICAS = 8
#: Timed repetitions of each variant a replica aims at: its samples are this over the calibrated
#: repetitions per sample, within MIN_SAMPLES_PER_REPLICA..MAX_SAMPLES_PER_REPLICA. On the 2-vCPU VM in a
#: busy hour, replicas of 20 to 40 repetitions run one after another often left some step without a
#: quiet moment; run together (WAVE_BYTES) over the whole run, 24 mostly did not, 16 less often.
REPS_PER_REPLICA = 24
MIN_SAMPLES_PER_REPLICA = 2
MAX_SAMPLES_PER_REPLICA = 10


#: Replicas alive at once hold at most this much cache memory (every npl's and layout's K and V):
#: within it a run's replicas are made together and take turns, so that each one's repetitions
#: spread over the whole run and a busy minute of the host falls on all alike; beyond it they
#: run one after another.
WAVE_BYTES = 1 << 30
#: Replicas added at a time to an npl whose intervals are still wide (as memory allows).
ADDED_REPLICAS = 2


def samples_per_replica(loops: int) -> int:
    """Timed samples of each variant in a replica whose samples hold loops repetitions."""
    return min(MAX_SAMPLES_PER_REPLICA, max(MIN_SAMPLES_PER_REPLICA, -(-REPS_PER_REPLICA // loops)))
#: Replicas are added until every claimed gain's interval is within this of its estimate (2.5 points).
TARGET_HALF_WIDTH = 0.025
#: A stand-in's timed copies running past their modelled ends by more than this share of the link's
#: time: the host copies slower than the link there, and copy times follow the host (a warning).
LINK_OVERRUN = 0.10
#: How the figures are found, as the output says it.
STATISTIC = ("floor: each step's fastest time over a replica's samples, summed; the median over replicas (tokens/s: "
             "npl over the median floor per step); gain: median over replicas of the floors' ratio, with its 95% "
             "interval")
#: How their spread is found.
SPREAD = ("median (min..max): tokens/s of the samples (each its mean rate, the host's load included); gain: of the "
          "replicas' gains")


@dataclass(frozen=True)
class DeviceFigures:
    """What one device did in a variant's repetition (ntg steps): `ferry bench`'s per-device figures.

    Attributes
    ----------
    index : int
        The device's index (--devices N: 0..N-1).
    name : str
        The backend's name.
    layers : list of int
        The layers it runs.
    resident_layers : list of int
        The layers whose KV its memory holds.
    bytes_copied : int
        Bytes its splits received (windows of the layers not resident on it, and queries and lengths
        held elsewhere), over the ntg steps.
    kv_bytes_copied : int
        Of those, the bytes of KV windows.
    copy_s : float
        Its inputs' copy time over a repetition: its floor (each step's fastest), the median over replicas.
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
        return {"index": self.index, "name": self.name, "layers": list(self.layers),
                "resident_layers": list(self.resident_layers), "bytes_copied": self.bytes_copied,
                "kv_bytes_copied": self.kv_bytes_copied, "copy_s": self.copy_s, "memory_bytes": self.memory_bytes,
                "link_gbps": self.link_gbps}


@dataclass(frozen=True)
class BenchRow:
    """One variant of a number of sequences and a cache layout, over its replicas' timed samples.

    decode_s, copy_s, compute_s and host_s are a repetition's (ntg steps) floor: each step's
    fastest time over a replica's samples, summed; the median over the replicas.
    tokens_per_s is npl * ntg over that decode_s, and replicas_tokens_per_s each replica's own
    (npl * ntg over its decode floor), in the order they ran. runs_tokens_per_s holds each
    sample's tokens/s (its repetitions' mean rate, whatever the host added), in the order they
    ran (sample i of every variant of an npl ran in the same turn); bytes_copied and bytes_read
    are a repetition's.
    """

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
    runs_tokens_per_s: Tuple[float, ...] = field(default=(), repr=False)  # each sample's own, in run order
    host_s: float = 0.0  # building (when n_kv changed) or reusing each step's graph, and writing its lengths
    rebuilds: int = 0  # graphs built after a repetition's first step: where the padded n_kv changed
    prefetch: int = 0  # the scheduler's prefetch depth: 0 serial, else overlapped
    ahead_bytes: int = 0  # the most bytes prefetching held on the split beyond the layer computing
    devices: Tuple[DeviceFigures, ...] = field(default=(), repr=False)  # per device, in index order
    steps_per_sample: int = 0  # decode steps one timed sample holds: repetitions (calibrated) times ntg
    ntg: int = 0  # steps of a repetition
    replicas_tokens_per_s: Tuple[float, ...] = field(default=(), repr=False)  # each replica's floor, in run order

    @property
    def overlap(self) -> bool:
        """Whether the run prefetched its inputs on the copy queue."""
        return self.prefetch > 0

    @property
    def tokens_per_s_end_to_end(self) -> float:
        """Tokens per second of decode and host time together: what a loop driving ferry pays."""
        total = self.decode_s + self.host_s
        return self.tokens_per_s * self.decode_s / total if total > 0 and self.decode_s > 0 else math.inf

    @property
    def repeats(self) -> int:
        """Timed samples, over every replica."""
        return len(self.runs_tokens_per_s)

    @property
    def replicas(self) -> int:
        """Replicas: each its own caches and schedulers (at least 1)."""
        return max(1, len(self.replicas_tokens_per_s))

    @property
    def replica_rates(self) -> Tuple[float, ...]:
        """Each replica's tokens/s (its floor's), or the row's own for a row without them."""
        return self.replicas_tokens_per_s or (self.tokens_per_s,)

    @property
    def missed(self) -> int:
        """Replicas that did not reach the variant's floor (estimate.reached): out of its figures, in its intervals."""
        return reached(self.replica_rates).count(False)

    def per_step(self, total: float) -> float:
        """A repetition's figure (seconds or bytes over ntg steps) per step."""
        return total / self.ntg if self.ntg else total

    @property
    def tokens_per_s_spread(self) -> Tuple[float, float, float]:
        """The median, least and greatest of the samples' own tokens/s (their mean rates, the host's
        load included: the floor is at least as fast as the fastest)."""
        runs = self.runs_tokens_per_s or (self.tokens_per_s,)
        return statistics.median(runs), min(runs), max(runs)

    @property
    def label(self) -> str:
        """The policy, with "+compact" for compact staging and "+overlap" for an overlapped run."""
        return run_name(self.policy, self.compact, self.overlap)

    @property
    def copy_bandwidth(self) -> float:
        """Bytes copied per second of copy time (0 when nothing was copied)."""
        return self.bytes_copied / self.copy_s if self.copy_s > 0 else 0.0

    def as_dict(self) -> Dict[str, object]:
        """The row as `ferry bench --json` writes it: the run, its speed and bytes (a repetition's, and per
        step; times are floors, the median over replicas), compact staging, the split's memory, the
        replicas ("replicas", and "tokens_per_s_replicas": each one's floor, in the order they ran,
        so a gain can be found again from them), the samples ("repeats" and "samples", the steps
        each holds) and their own tokens/s (median, min, max, and "tokens_per_s_samples": each
        sample's mean rate, in the order they ran), and "devices": each device's figures
        (DeviceFigures.as_dict)."""
        return {"npl": self.npl, "policy": self.policy, "unified": self.unified, "tokens_per_s": self.tokens_per_s,
                "copy_s": self.copy_s, "bytes_copied": self.bytes_copied, "bytes_read": self.bytes_read,
                "compact": self.compact, "split_memory_bytes": self.split_memory, "repeats": self.repeats,
                "host_s": self.host_s, "tokens_per_s_end_to_end": self.tokens_per_s_end_to_end,
                "rebuilds": self.rebuilds, "overlap": self.overlap, "prefetch": self.prefetch,
                "decode_s": self.decode_s, "compute_s": self.compute_s, "ahead_bytes": self.ahead_bytes,
                "samples": self.repeats, "steps_per_sample": self.steps_per_sample,
                "decode_s_per_step": self.per_step(self.decode_s), "copy_s_per_step": self.per_step(self.copy_s),
                "compute_s_per_step": self.per_step(self.compute_s), "host_s_per_step": self.per_step(self.host_s),
                "bytes_copied_per_step": self.per_step(self.bytes_copied),
                "bytes_read_per_step": self.per_step(self.bytes_read),
                **dict(zip(("tokens_per_s_median", "tokens_per_s_min", "tokens_per_s_max"),
                           self.tokens_per_s_spread)),
                "tokens_per_s_samples": list(self.runs_tokens_per_s), "replicas": self.replicas,
                "tokens_per_s_replicas": list(self.replica_rates),
                "devices": [d.as_dict() for d in self.devices]}


#: A variant's identity within an npl: (policy, compact, prefetch, unified).
Key = Tuple[str, bool, int, bool]


def claim_pairs(keys: Sequence[Key]) -> List[Tuple[int, int, str]]:
    """The gains a run claims among the variants of one npl, as index pairs into keys.

    Every split-cache variant but flat over flat (serial over serial, overlapped over overlapped),
    and every split-cache variant over the unified cache under the same policy. Not the unified
    cache's gains over flat: it copies the same bytes under every policy, so they measure noise.

    Parameters
    ----------
    keys : sequence of Key

    Returns
    -------
    list of (int, int, str)
        (variant, reference, "flat" or "unified").
    """
    index = {k: i for i, k in enumerate(keys)}
    out = []
    for i, (policy, compact, prefetch, unified) in enumerate(keys):
        if unified:
            continue
        flat = index.get(("flat", False, prefetch, False))
        if policy != "flat" and flat is not None:
            out.append((i, flat, "flat"))
        same = index.get((policy, compact, prefetch, True))
        if same is not None:
            out.append((i, same, "unified"))
    return out


@dataclass(frozen=True)
class Sampling:
    """How one npl's variants were sampled.

    Attributes
    ----------
    npl : int
    loops : int
        Repetitions of the ntg steps one sample holds (the calibration's result).
    samples : int
        Timed samples of each variant, over every replica.
    seconds : float
        Wall time of the npl's turns: its warm-ups, calibration and samples.
    capped : bool
        Replicas stopped at the time cap (--max-time) before every claimed interval was within
        TARGET_HALF_WIDTH.
    replicas : int
        Replicas: each its own caches and schedulers, warmed up, then cfg.replica_samples(loops) samples.
    """

    npl: int
    loops: int
    samples: int
    seconds: float
    capped: bool = False
    replicas: int = 1


@dataclass
class BenchResult:
    """Every run of a configuration, and which backends ran it."""

    config: BenchConfig
    split_name: str
    cache_memory: str
    rows: List[BenchRow]
    device_names: List[str] = field(default_factory=list)  # every device, in index order (split_name: device 0)
    sampling: Dict[int, Sampling] = field(default_factory=dict)  # per npl
    standin_link_gbps: Optional[float] = None  # the stand-in split's modelled link (None: unmodelled, or CUDA)
    link_overrun: float = 0.0  # over the timed samples, the most a stand-in's copies ran past its link, a share

    def row(self, npl: int, policy: str, unified: bool = False, compact: bool = False,
            overlap: bool = False) -> BenchRow:
        """The row of one run.

        Parameters
        ----------
        npl : int
        policy : str
        unified : bool, optional
        compact : bool, optional
        overlap : bool, optional
            The overlapped run (--overlap) instead of the serial one.

        Returns
        -------
        BenchRow

        Raises
        ------
        StopIteration
            For a run the configuration did not make.
        """
        return next(r for r in self.rows
                    if (r.npl, r.policy, r.unified, r.compact, r.overlap) == (npl, policy, unified, compact, overlap))

    def serial_of(self, r: BenchRow) -> BenchRow:
        """The serial run of an overlapped row's variant (the row itself when it is serial)."""
        return self.row(r.npl, r.policy, r.unified, r.compact)

    def bound(self, r: BenchRow) -> float:
        """max(copy, compute) of the row's serial run: a step's decode time when one hides the other."""
        serial = self.serial_of(r)
        return max(serial.copy_s, serial.compute_s)

    def variants(self) -> List[Tuple[str, bool]]:
        """(policy, compact) in table order: every policy, then the non-flat ones with compact staging."""
        return variants(self.config)

    def flat_of(self, r: BenchRow) -> Optional[BenchRow]:
        """flat's row of the same npl and layout (overlapped for an overlapped row); None without flat."""
        if "flat" not in self.config.policies:
            return None
        return self.row(r.npl, "flat", r.unified, overlap=r.overlap)

    def gain_interval(self, r: BenchRow) -> Optional[Interval]:
        """A row's gain over flat (same npl and layout) with its 95% interval: the median over replicas of
        its floor's tokens/s over flat's in the same replica, minus 1 (estimate.replica_gain).

        Parameters
        ----------
        r : BenchRow
            A serial row, compared with serial flat, or an overlapped one, with overlapped flat.

        Returns
        -------
        Interval or None
            None without a flat run.
        """
        flat = self.flat_of(r)
        if flat is None:
            return None
        return replica_gain(r.replica_rates, flat.replica_rates)

    def gain(self, r: BenchRow) -> Optional[float]:
        """A row's gain over flat: the estimate of gain_interval (None without flat)."""
        g = self.gain_interval(r)
        return None if g is None else g.estimate

    def unified_gain(self, r: BenchRow) -> Optional[Interval]:
        """A split-cache row's gain over the unified cache under the same policy (found as gain_interval);
        None for a unified row or when the unified cache did not run."""
        if r.unified or not self.config.runs_unified:
            return None
        u = self.row(r.npl, r.policy, True, r.compact, r.overlap)
        return replica_gain(r.replica_rates, u.replica_rates)

    def gain_spread(self, r: BenchRow) -> Optional[Tuple[float, float, float]]:
        """The median, least and greatest over replicas of a row's floor tokens/s over flat's in the same
        replica, minus 1 (None without flat)."""
        flat = self.flat_of(r)
        if flat is None:
            return None
        return ratio_spread([v / f - 1.0 for f, v in zip(flat.replica_rates, r.replica_rates)])

    def claims(self, npl: int) -> List[Tuple[BenchRow, BenchRow, str]]:
        """The gains the run claims at npl (claim_pairs): (row, reference row, "flat" or "unified")."""
        rows = [r for r in self.rows if r.npl == npl]
        keys = [(r.policy, r.compact, r.prefetch, r.unified) for r in rows]
        return [(rows[i], rows[j], what) for i, j, what in claim_pairs(keys)]

    def warnings(self, npl: Optional[int] = None) -> List[str]:
        """What makes the figures less sure than they look, per npl (or at one npl): the time cap reached
        before every claimed interval was within TARGET_HALF_WIDTH, intervals too wide with --repeat
        given, replicas where a variant did not reach its floor (estimate.reached), and
        (first, for every npl) a stand-in's copies running past its link (link_overrun).

        Returns
        -------
        list of str
            One line each, naming the npl; empty when none.
        """
        out = []
        if self.link_overrun > LINK_OVERRUN:
            out.append(f"the stand-in's copies ran {self.link_overrun:.0%} past the modelled link's time: the host "
                       "did not keep to the link (copies slower than it, each copy's own cost on small windows, or a "
                       "busy machine), so copy times partly follow the host; a lower --link-gbps leaves it room")
        for n in self.config.npl if npl is None else (npl,):
            claims = self.claims(n)
            wide = [(replica_gain(r.replica_rates, ref.replica_rates), r, what) for r, ref, what in claims]
            wide = [w for w in wide if w[0].half_width >= TARGET_HALF_WIDTH]
            if wide:
                g, r, what = max(wide, key=lambda w: w[0].half_width)
                widest = ("no interval (fewer than 6 replicas)" if g.low is None
                          else f"±{g.half_width * 100:.1f} points")
                why = (f"the time cap (--max-time {self.config.max_time:g} s) came first"
                       if self.config.adaptive else f"--repeat {self.config.repeat} fixed the replicas")
                out.append(f"npl {n}: {why}: {len(wide)} of {len(claims)} gains wider than ±"
                           f"{TARGET_HALF_WIDTH * 100:g} points, the widest {r.label} over {what}: {widest}")
            rows = [r for r in self.rows if r.npl == n]
            worst = max(rows, key=lambda r: r.missed, default=None)
            if worst is not None and worst.missed:
                name = worst.label + (" unified" if worst.unified else "")
                out.append(f"npl {n}: replicas where the host left some step no quiet moment (a floor over "
                           f"{FLOOR_SPREAD:.0%} slower than the variant's fastest replica): up to {worst.missed} of "
                           f"{worst.replicas}, for {name}; they widen the intervals, a quieter machine has fewer")
        return out

    def as_dicts(self) -> List[Dict[str, object]]:
        """The rows as `ferry bench --json` writes them: each row's as_dict; its gain over flat with its
        interval and its replicas' spread ("gain", "gain_low", "gain_high", "gain_within_noise",
        "gain_median", "gain_min", "gain_max"; None without flat; "gain_claimed": False for the unified cache,
        whose gain over flat is noise); a split row's gain over the unified cache ("over_unified",
        "over_unified_low", "over_unified_high"; None otherwise); "statistic" and "spread": how they
        were found; "config": the whole configuration; "loops": repetitions per sample; "capped"
        and "warnings": its npl's (BenchResult.warnings). An overlapped row (--overlap) also has
        its serial run's decode time and the bound max(copy, compute) of it ("serial_decode_s",
        "bound_s"). Gains compare serial rows with serial flat, overlapped with overlapped."""
        config = asdict(self.config)
        warnings = {n: self.warnings(n) for n in self.config.npl}
        out = []
        for r in self.rows:
            d = r.as_dict()
            if r.overlap:
                d.update(serial_decode_s=self.serial_of(r).decode_s, bound_s=self.bound(r))
            g, u = self.gain_interval(r), self.unified_gain(r)
            d.update(gain=None if g is None else g.estimate, gain_low=None if g is None else g.low,
                     gain_high=None if g is None else g.high,
                     gain_within_noise=None if g is None or r.policy == "flat" else g.within_noise,
                     gain_claimed=not r.unified and r.policy != "flat" and g is not None)
            d.update(zip(("gain_median", "gain_min", "gain_max"), self.gain_spread(r) or (None, None, None)))
            d.update(over_unified=None if u is None else u.estimate, over_unified_low=None if u is None else u.low,
                     over_unified_high=None if u is None else u.high)
            sampling = self.sampling.get(r.npl)
            d.update(statistic=STATISTIC, spread=SPREAD, config=config,
                     loops=None if sampling is None else sampling.loops,
                     capped=None if sampling is None else sampling.capped, warnings=warnings[r.npl])
            out.append(d)
        return out

    def outputs_identical(self, npl: int) -> bool:
        """Whether every run of npl (each policy, both layouts, serial and overlapped) produced the same
        attention outputs.

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


class _Cache:
    """One layout's cache and queries for npl sequences, shared by every variant's scheduler.

    The devices run the layers (runs_on[layer] indexes them); places[layer] is the device holding a
    layer's KV, or None for host memory. Each layer's query lives on the device that runs it, the
    lengths on device 0.
    """

    def __init__(self, cfg: BenchConfig, devices: List[Backend], npl: int, unified: bool, pinned: bool) -> None:
        self.cfg, self.devices, self.npl, self.unified = cfg, devices, npl, unified
        self.split = devices[0]
        self.runs_on = cfg.devices.runs_on(cfg.n_layer)
        self.places = cfg.devices.places(cfg.n_layer)
        self.layer_backends = [devices[d] for d in self.runs_on]
        ty = to_type(cfg.type_kv)
        self.type = ty
        n_stream = 1 if unified else npl
        self.kv = new_cache(ty, cfg.head_dim, cfg.n_head_kv, cfg.n_ctx, n_stream, cfg.n_layer, cfg.v_trans, pinned,
                            [None if d is None else devices[d] for d in self.places])
        L = cfg.cells
        for layer in range(cfg.n_layer):
            for which in ("k", "v"):
                for i in range(npl):  # sequence i: the same values in either layout
                    data = random_rows(ty, L, cfg.n_embd, (cfg.seed, layer, i, which == "v"))
                    stream, cell0 = (0, i * L) if unified else (i, 0)
                    write_cells(self.kv, which, layer, stream, cell0, data)
        rng = np.random.default_rng([cfg.seed, 1 << 20])
        self.q = [Tensor.from_numpy(self.layer_backends[layer],
                                    rng.uniform(-1, 1, (npl, 1, cfg.n_head, cfg.head_dim)).astype(np.float32),
                                    name=f"q{layer}") for layer in range(cfg.n_layer)]
        self.kv_len = Tensor.from_numpy(self.split, np.zeros(npl, np.int32), name="kv_len")
        # unified: the split cache's window layout over one stream, npl sequences of L cells as its streams
        self.unified_layouts = [self._sequences_as_streams(which) for which in ("k", "v")] if unified else []
        # each cache layer's tensor, by address: an input viewing one is that layer's window
        self.layer_of = {t._p: layer for layer in range(cfg.n_layer) for t in (self.kv.k(layer), self.kv.v(layer))}
        self.resident_bytes = [sum(self.kv.k(layer).nbytes + self.kv.v(layer).nbytes
                                   for layer in range(cfg.n_layer) if self.places[layer] == d)
                               for d in range(len(devices))]

    def window_layer(self, src: Tensor) -> Optional[int]:
        """The layer whose K or V the input source src views, or None (a query, the lengths)."""
        p = src._p
        while p.view_src:
            p = p.view_src
        return self.layer_of.get(p)

    def _sequences_as_streams(self, which: str) -> Tuple[List[int], List[int]]:
        """ne and nb of the first npl * L cells of stream 0 seen as npl streams of L cells."""
        ne, nb, _ = self.kv.window_layout(which, self.cfg.cells, 0, 0)
        ne[3], nb[3] = self.npl, self.kv.cell_offset(which, 0, self.cfg.cells)
        return ne, nb

    def windows(self, layer: int, n_kv: int) -> Tuple[Tensor, Tensor]:
        if not self.unified:
            return self.kv.window(layer, n_kv)
        (ne_k, nb_k), (ne_v, nb_v) = self.unified_layouts
        k = self.kv.k(layer).view(ne_k, nb_k, name=f"k{layer}_u").permute(0, 2, 1, 3)
        v = self.kv.v(layer).view(ne_v, nb_v, name=f"v{layer}_u").permute(0, 2, 1, 3)
        return k, v

    def close(self) -> None:
        """Free the cache's (maybe pinned) memory now, before the next layout's."""
        self.kv.close()


@dataclass
class _Measured:
    """What a variant's timed samples measured: per sample, its steps and decode time; over them all,
    each step's fastest decode, copy, compute and host time (its floors)."""

    ntg: int
    steps: List[int] = field(default_factory=list)  # decode steps in each sample
    decode: List[float] = field(default_factory=list)
    floors: Dict[str, StepFloor] = field(default_factory=dict)  # "decode", "copy", "compute", "host"
    device_copy: List[StepFloor] = field(default_factory=list)  # per device
    rebuilds: int = 0
    bytes_copied: int = 0
    bytes_read: int = 0
    ahead_bytes: int = 0
    digests: List[str] = field(default_factory=list)  # per repetition
    device_bytes: List[int] = field(default_factory=list)  # per device: bytes its splits received in a repetition
    device_kv_bytes: List[int] = field(default_factory=list)  # per device: of those, KV windows'

    def floor(self, what: str) -> float:
        """A repetition's floor of a figure: each step's fastest time, summed (seconds)."""
        return self.floors[what].total

    def add_step(self, step: int, decode: float, copy: float, compute: float, host: float,
                 device_copy: Sequence[float]) -> None:
        """Count one timed step's times toward the floors."""
        if not self.floors:
            self.floors = {w: StepFloor(self.ntg) for w in ("decode", "copy", "compute", "host")}
            self.device_copy = [StepFloor(self.ntg) for _ in device_copy]
        for w, t in (("decode", decode), ("copy", copy), ("compute", compute), ("host", host)):
            self.floors[w].add(step, t)
        for f, t in zip(self.device_copy, device_copy):
            f.add(step, t)


@dataclass
class _Sums:
    """One sample in progress: its repetitions so far and their decode time (seconds)."""

    reps: int = 0
    decode: float = 0.0


class _Variant:
    """One copy policy (with or without compact staging) over a cache: its scheduler, its repetitions."""

    def __init__(self, cache: _Cache, cpu: Backend, policy: str, compact: bool, prefetch: int = 0) -> None:
        self.cache, self.policy, self.compact, self.prefetch = cache, policy, compact, prefetch
        self.sched = Scheduler([*cache.devices, cpu], policy=policy, compact=compact, prefetch=prefetch)
        self.graphs = StepGraph(self.sched, self._build)
        self.split_memory = 0
        self.device_memory = [0] * len(cache.devices)  # per device: the scheduler's buffer there at its most
        self.measured = _Measured(cache.cfg.ntg)
        self.sums = _Sums()
        unified = " unified" if cache.unified else ""
        self.label = f"npl {cache.npl} {run_name(policy, compact, prefetch > 0)}{unified}"

    def _build(self, n_kv: object) -> List[Tensor]:
        """A step's outputs for a window of n_kv cells: per layer attention over its K and V windows."""
        c = self.cache
        assert isinstance(n_kv, int)
        # the split cache's windows in one C call (KVCache.windows); the unified one's views in Python
        windows = c.kv.windows(n_kv) if not c.unified else [c.windows(layer, n_kv) for layer in range(c.cfg.n_layer)]
        on = c.split if len(c.devices) == 1 else c.layer_backends
        return attention_step(self.sched, on, windows, c.q, c.kv_len, c.cfg.v_trans)

    def graph(self, step: int) -> Graph:
        """Step's graph, allocated: the last step's while the padded n_kv holds (cfg.reuse), else built;
        then each sequence's length at the step written into kv_len."""
        c = self.cache
        if not c.cfg.reuse:
            self.graphs.clear()
        graph = self.graphs.get(c.cfg.n_kv(c.npl, step))
        self.split_memory = max(self.split_memory, self.sched.buffer_size(c.split))
        self.device_memory = [max(m, self.sched.buffer_size(d)) for m, d in zip(self.device_memory, c.devices)]
        c.kv_len.set(np.full(c.npl, c.cfg.npp + step + 1, np.int32))
        return graph

    def begin_sample(self) -> None:
        """Start a sample: its repetitions' times add up until end_sample."""
        self.sums = _Sums()

    def repetition(self, timed: bool, on_step: Optional[OnStep]) -> None:
        """Run the ntg steps once, adding their decode time to the current sample; when timed, count
        each step toward the floors and keep the repetition's bytes and its outputs' digest."""
        ntg = self.cache.cfg.ntg
        n_dev = len(self.cache.devices)
        sums = self.sums
        copied = read = builds = ahead = 0
        dev_bytes, dev_kv = [0] * n_dev, [0] * n_dev
        digest = hashlib.sha256()
        for t in range(ntg):
            t0 = time.perf_counter()
            graph = self.graph(t)
            t1 = time.perf_counter()
            self.sched.compute(graph)
            decode = time.perf_counter() - t1
            sums.decode += decode
            if t == 0:
                builds = self.graphs.builds
            st = self.sched.stats
            copied += st.bytes_copied
            read += st.bytes_read
            ahead = max(ahead, st.ahead_bytes)
            if timed:
                self.measured.add_step(t, decode, st.copy_seconds, st.compute_seconds, t1 - t0,
                                       self._per_device(dev_bytes, dev_kv))
            for out in graph.outputs:
                digest.update(out.get())
            if on_step is not None:
                on_step(self.label)
        sums.reps += 1
        if timed:
            m = self.measured
            m.rebuilds = self.graphs.builds - builds
            m.bytes_copied, m.bytes_read, m.ahead_bytes = copied, read, ahead
            m.device_bytes, m.device_kv_bytes = dev_bytes, dev_kv
            m.digests.append(digest.hexdigest())

    def end_sample(self, timed: bool) -> float:
        """End the sample; when timed, keep what it measured.

        Returns
        -------
        float
            The decode time of its repetitions (seconds).
        """
        sums = self.sums
        if timed:
            m = self.measured
            m.steps.append(sums.reps * self.cache.cfg.ntg)
            m.decode.append(sums.decode)
        return sums.decode

    def _per_device(self, copied: List[int], kv: List[int]) -> List[float]:
        """Add the last step's inputs to each device's bytes and bytes of KV windows (an input counts for
        the device of the split reading it); returns each device's copy time in the step."""
        c = self.cache
        copy = [0.0] * len(c.devices)
        index = {d._p: i for i, d in enumerate(c.devices)}
        for split in self.sched.splits:
            d = index.get(split.backend._p)
            if d is None:
                continue
            for inp in split.inputs:
                copy[d] += inp.stats.copy_seconds
                copied[d] += inp.stats.bytes_copied
                if c.window_layer(inp.src) is not None:
                    kv[d] += inp.stats.bytes_copied
        return copy

    def device_figures(self) -> Tuple[DeviceFigures, ...]:
        """Each device's figures over the timed samples (its copy time: the floor)."""
        c, m = self.cache, self.measured
        out = []
        for d, dev in enumerate(c.devices):
            link = dev.link_gbps if isinstance(dev, StandinBackend) else None
            out.append(DeviceFigures(d, dev.name, [i for i, r in enumerate(c.runs_on) if r == d],
                                     [i for i, p in enumerate(c.places) if p == d], m.device_bytes[d],
                                     m.device_kv_bytes[d], m.device_copy[d].total,
                                     self.device_memory[d] + c.resident_bytes[d], link))
        return tuple(out)

    @property
    def key(self) -> Key:
        """(policy, compact, prefetch, unified): the variant within its npl."""
        return self.policy, self.compact, self.prefetch, self.cache.unified

    def tokens_per_s(self) -> List[float]:
        """Each timed sample's tokens/s, in the order they ran."""
        m = self.measured
        return [_tps(self.cache.npl * n, t) for n, t in zip(m.steps, m.decode)]

    def row(self) -> BenchRow:
        """The variant's row in this replica: its floors, and each sample's tokens/s.

        Raises
        ------
        AssertionError
            When its repetitions gave different attention outputs.
        """
        c, m = self.cache, self.measured
        if len(set(m.digests)) != 1:
            raise AssertionError(f"{self.label}: repeated runs gave different attention outputs")
        ntg = c.cfg.ntg
        decode = m.floor("decode")
        tps = _tps(c.npl * ntg, decode)
        return BenchRow(c.npl, self.policy, c.unified, tps, decode, m.floor("copy"), m.floor("compute"),
                        m.bytes_copied, m.bytes_read, m.digests[0], self.compact, self.split_memory,
                        tuple(self.tokens_per_s()), m.floor("host"), m.rebuilds, self.prefetch, m.ahead_bytes,
                        self.device_figures(), m.steps[0], ntg, (tps,))


def _tps(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else math.inf


def widest_claim(rows: Sequence[BenchRow]) -> float:
    """The widest half-width among the gains the rows of one npl claim (claim_pairs); 0 for none."""
    keys = [(r.policy, r.compact, r.prefetch, r.unified) for r in rows]
    return max((replica_gain(rows[i].replica_rates, rows[j].replica_rates).half_width
                for i, j, _ in claim_pairs(keys)), default=0.0)


def merge_replicas(rows: Sequence[BenchRow]) -> BenchRow:
    """One variant's row over its replicas (each a row of one replica, in the order they ran): each
    time the median of the floors of the replicas that reached it (estimate.reached), tokens/s
    from the decode one, the samples of all in order, each replica's tokens/s, the most memory
    any held.

    Raises
    ------
    AssertionError
        When the replicas moved different bytes or gave different attention outputs.
    """
    first = rows[0]
    label = f"npl {first.npl} {first.label}{' unified' if first.unified else ''}"
    if len({(r.bytes_copied, r.bytes_read) for r in rows}) != 1:
        raise AssertionError(f"{label}: replicas moved different bytes")
    if len({r.output_sha256 for r in rows}) != 1:
        raise AssertionError(f"{label}: replicas gave different attention outputs")
    kept = [r for r, ok in zip(rows, reached([r.tokens_per_s for r in rows])) if ok]
    decode = statistics.median(r.decode_s for r in kept)
    devices = tuple(replace(d, copy_s=statistics.median(r.devices[i].copy_s for r in kept),
                            memory_bytes=max(r.devices[i].memory_bytes for r in rows))
                    for i, d in enumerate(first.devices))
    return replace(
        first, tokens_per_s=_tps(first.npl * first.ntg, decode), decode_s=decode,
        copy_s=statistics.median(r.copy_s for r in kept), compute_s=statistics.median(r.compute_s for r in kept),
        host_s=statistics.median(r.host_s for r in kept), split_memory=max(r.split_memory for r in rows),
        ahead_bytes=max(r.ahead_bytes for r in rows), devices=devices,
        runs_tokens_per_s=tuple(t for r in rows for t in r.runs_tokens_per_s),
        replicas_tokens_per_s=tuple(t for r in rows for t in r.replica_rates))


class _NplRuns:
    """One replica of every variant of one number of sequences, on every layout (see the module): its
    caches, its variants' schedulers, and the rounds in which they take turns."""

    def __init__(self, cfg: BenchConfig, devices: List[Backend], cpu: Backend, npl: int, pinned: bool) -> None:
        self.npl = npl
        self.caches: List[_Cache] = []
        self.runs: List[_Variant] = []
        self.loops = 1
        self.seconds = 0.0  # wall time of its turns
        self.rounds = 0
        try:
            for unified in cfg.layouts:
                self.caches.append(_Cache(cfg, devices, npl, unified, pinned))
                self.runs += [_Variant(self.caches[-1], cpu, policy, compact, depth)
                              for policy, compact in variants(cfg) for depth in cfg.prefetch_depths]
        except BaseException:
            self.close()
            raise
        self.orders = balanced_orders(len(self.runs))

    def turn(self, loops: int, timed: bool, on_step: Optional[OnStep]) -> float:
        """A sample of loops repetitions of every variant, the variants taking turns repetition by
        repetition in the rounds' balanced orders.

        Returns
        -------
        float
            The shortest variant's sample (decode seconds).
        """
        start = time.perf_counter()
        for run in self.runs:
            run.begin_sample()
        for _ in range(loops):
            for i in self.orders[self.rounds % len(self.orders)]:
                self.runs[i].repetition(timed, on_step)
            self.rounds += 1
        shortest = min(run.end_sample(timed) for run in self.runs)
        self.seconds += time.perf_counter() - start
        return shortest

    def rows(self) -> List[BenchRow]:
        """A row per variant, of this replica: the split cache's in `variants` order (with cfg.overlap
        each serial row followed by its overlapped one), then the unified cache's."""
        return [run.row() for run in self.runs]

    def close(self) -> None:
        for run in self.runs:
            run.sched.close()
        for cache in self.caches:
            cache.close()


def replica_bytes(cfg: BenchConfig) -> int:
    """The cache memory of one replica of one npl: every layout's K and V of every layer."""
    return len(cfg.layouts) * cfg.n_layer * 2 * cfg.n_ctx * row_size(cfg.type_kv, cfg.n_embd)


def _link_totals(devices: Sequence[Backend]) -> List[Tuple[float, float]]:
    """Per stand-in device, (late, modelled) seconds its link has counted so far."""
    return [(s.late_seconds, s.modelled_seconds) for s in
            (d.link_stats for d in devices if isinstance(d, StandinBackend))]


@dataclass
class _Made:
    """Replicas made and what they took: per npl each replica's rows (_NplRuns.rows), the repetitions per
    sample the calibration found, the seconds of their turns; per stand-in device the (late, modelled)
    seconds its link counted over the timed samples; and the devices they ran on."""

    rows: Dict[int, List[List[BenchRow]]]
    loops: Dict[int, int]
    seconds: Dict[int, float]
    link: List[Tuple[float, float]]
    device_names: List[str]
    pinned: bool
    link_gbps: Optional[float]

    def add(self, other: "_Made") -> None:
        for npl, rows in other.rows.items():
            self.rows.setdefault(npl, []).extend(rows)
            self.seconds[npl] = self.seconds.get(npl, 0.0) + other.seconds[npl]
        self.loops = {**other.loops, **self.loops}
        self.link = [(a + c, b + d) for (a, b), (c, d) in zip(self.link, other.link)]  # the same devices


class _Devices:
    """The devices and the CPU backend one process's replicas run on (cfg.devices.make)."""

    def __init__(self, cfg: BenchConfig) -> None:
        self.devices = cfg.devices.make(cfg.device)
        self.cpu = CPUBackend()
        split = self.devices[0]
        self.pinned = not isinstance(split, StandinBackend)
        self.link_gbps = split.link_gbps if isinstance(split, StandinBackend) else None


def _wave(cfg: BenchConfig, dev: _Devices, npls: Sequence[int], loops: Dict[int, int],
          on_step: Optional[OnStep]) -> _Made:
    """A replica of each npl in npls (one may come more than once), all made before any is timed, taking
    turns sample by sample; an npl not in loops is calibrated in its first replica."""
    made: List[_NplRuns] = []
    out = _Made({}, dict(loops), {}, [], [d.name for d in dev.devices], dev.pinned, dev.link_gbps)
    collecting = gc.isenabled()
    try:
        for npl in npls:
            made.append(_NplRuns(cfg, dev.devices, dev.cpu, npl, dev.pinned))
            for _ in range(WARMUP):
                made[-1].turn(1, False, on_step)
            if npl not in out.loops:
                out.loops[npl] = calibrate(functools.partial(made[-1].turn, timed=False, on_step=on_step),
                                           cfg.min_sample_ms / 1e3)
        gc.collect()
        gc.disable()  # as timeit does: no collection lands in one variant's samples
        before = _link_totals(dev.devices)  # the link's counters over the timed samples only
        need = [cfg.replica_samples(out.loops[each.npl]) for each in made]
        rounds = max(need)
        for k in range(rounds):
            for each, n in zip(made, need):
                if (k + 1) * n // rounds > k * n // rounds:  # n turns spread evenly over the rounds
                    each.turn(out.loops[each.npl], True, on_step)
        out.link = [(l1 - l0, m1 - m0) for (l0, m0), (l1, m1) in zip(before, _link_totals(dev.devices))]
        for each in made:
            out.rows.setdefault(each.npl, []).append(each.rows())
    finally:
        if collecting:
            gc.enable()
        for each in made:
            out.seconds[each.npl] = out.seconds.get(each.npl, 0.0) + each.seconds
            each.close()
    return out


def worker_wave(cfg: BenchConfig, npls: Sequence[int], loops: Dict[int, int], on_step: Optional[OnStep]) -> _Made:
    """_wave in a worker process (ferry.workloads.workers calls it there), on devices of its own."""
    cfg.check()
    return _wave(cfg, _Devices(cfg), npls, loops, on_step)


def measure(cfg: BenchConfig, wave: Callable[[Sequence[int], Dict[int, int]], _Made], together: int,
            clock: Callable[[], float] = time.perf_counter) -> Tuple[List[BenchRow], Dict[int, Sampling], _Made]:
    """Every variant of every number of sequences in replicas, made in waves (see the module).

    Parameters
    ----------
    cfg : BenchConfig
    wave : callable
        wave(npls, loops): a replica of each npl in npls, made together and taking turns, the npls in
        loops sampled with those repetitions per sample (the others calibrated); in this process or in
        a worker.
    together : int
        Replicas of each npl a wave makes at most.
    clock : callable, optional
        Seconds, for the time cap.

    Returns
    -------
    (list of BenchRow, dict of int to Sampling, _Made)
        The rows, per npl in cfg.npl's order (_NplRuns.rows), each over its replicas
        (merge_replicas); how each npl was sampled; and every replica made.

    Raises
    ------
    AssertionError
        When repetitions or replicas of a variant gave different attention outputs.
    """
    start = clock()
    k = min(together, cfg.min_replicas)
    made = wave([npl for _ in range(k) for npl in cfg.npl], {})
    count = k
    while count < cfg.min_replicas:
        k = min(together, cfg.min_replicas - count)
        made.add(wave([npl for _ in range(k) for npl in cfg.npl], made.loops))
        count += k

    def merged(npl: int) -> List[BenchRow]:
        return [merge_replicas(rows) for rows in zip(*made.rows[npl])]

    capped = False
    while cfg.adaptive:
        wide = [npl for npl in cfg.npl if widest_claim(merged(npl)) >= TARGET_HALF_WIDTH]
        if not wide:
            break
        more = [npl for _ in range(min(together, ADDED_REPLICAS)) for npl in wide]
        spent = clock() - start
        # a wave takes what its replicas took so far; one that would end past the cap does not start
        if spent + spent * len(more) / sum(len(r) for r in made.rows.values()) > cfg.max_time:
            capped = True
            break
        made.add(wave(more, made.loops))
    rows: List[BenchRow] = []
    sampling = {}
    for npl in cfg.npl:
        rows += merged(npl)
        sampling[npl] = Sampling(npl, made.loops[npl], rows[-1].repeats, made.seconds[npl],
                                 capped and widest_claim(merged(npl)) >= TARGET_HALF_WIDTH, len(made.rows[npl]))
    return rows, sampling, made


def run_bench(cfg: BenchConfig, on_step: Optional[OnStep] = None) -> BenchResult:
    """Run every (npl, layout, variant) of a configuration: per npl, the variants of both layouts take
    turns over a warm-up, the calibration and the timed samples (see the module's account of timing).

    Parameters
    ----------
    cfg : BenchConfig
        What to run.
    on_step : callable, optional
        Called with the run's label after each decode step (at least `BenchConfig.n_steps` calls:
        the calibration and added samples make more).

    Returns
    -------
    BenchResult
        A row per (npl, layout, variant), in that order.

    Raises
    ------
    InvalidArgumentError
        For options that cannot run.
        InvalidArgumentError too for a stand-in out of the memory --device-memory gave it
        (devices.naming_device_memory).
    FerryError
        When a device cannot be made, or a run fails.
    AssertionError
        When repetitions of one variant give different attention outputs.
    """
    cfg.check()
    with naming_device_memory(cfg.devices):
        return _run_bench(cfg, on_step)


def _run_bench(cfg: BenchConfig, on_step: Optional[OnStep]) -> BenchResult:
    if cfg.in_process or (cfg.min_replicas == 1 and not cfg.adaptive):
        dev = _Devices(cfg)
        together = max(1, WAVE_BYTES // max(1, replica_bytes(cfg) * len(cfg.npl)))
        rows, sampling, made = measure(cfg, lambda npls, loops: _wave(cfg, dev, npls, loops, on_step), together)
    else:  # a replica of each npl per worker process
        rows, sampling, made = measure(cfg, lambda npls, loops: workers.call(
            "ferry.workloads.bench:worker_wave", (cfg, list(npls), loops), on_step), 1)
    overrun = max((late / modelled for late, modelled in made.link if modelled > 0), default=0.0)
    memory = "pinned host memory" if made.pinned else "pageable host memory"
    return BenchResult(cfg, made.device_names[0], memory, rows, made.device_names, sampling, made.link_gbps, overrun)
