"""The run `ferry residency-bench` makes: each strategy's placement measured beside its prediction.

For one number of sequences (one stream each), each strategy (ferry.residency's planner "auto"
and the named rules) plans a placement with the model (ferry.workloads.residency_plan: links
and latency from the options, each layer's attention time measured once on an unmodelled
stand-in at the last step's window, or given), for the last step's window (the largest). A
measured attention time is first scaled to the run's own conditions (calibrate_compute): a
placement with every layer resident runs, and the figure is scaled so that the model's step
for it is the measured one; what it then covers beside attention (each layer's query and
lengths, the scheduler's work, a busy host) is what the model leaves to the compute figure. The
same every-layer-resident run also takes turns with the placements, and the predictions use the
figure scaled by it again, so that they share the measurements' conditions. Each
placement then runs on stand-in devices of its own that model the links, latency, memory and
compute slowdown asked for: a cache with that placement (sliding-window layers at their own
size), every layer's values the same in every placement, the `ranges` copy policy (the one the
model's transfers describe: one 2-D transfer per K and V window), serially or prefetching.
Strategies that choose the same placement share one run.

With a remote tier (ResidencyModel's planner.remote_link and host_memory), the plans' remote
layers live in a server process on the loopback (ferry.remote.RemoteTier, the transfer engine of
ferry[remote]): their local copies are overwritten, and the scheduler pulls their windows in each
step (RemoteTier.fetch_layers: ranges, the pieces merged by the link's model), a layer's pull
before its copies, prefetched as the copies are, inside the step's time, as the model has them
(ferry.residency.predict_step's remote layers).

Timing: a step's time is the wall time of Scheduler.compute on its allocated graph, as
`ferry bench` times it. The runs take turns: one untimed warm-up repetition of each, then the
timed ones, the order reversed every other repetition, with the collector off, so that a busy
spell of the host falls on every run alike. A repetition is -ntg steps; its step time is their
mean. Reported per strategy: the median over repetitions of the step time and its least and
greatest, the mean over the steps of each step's fastest repetition, and the prediction: the
mean over the steps of the model's step time for that step's window. Outputs of every
placement are hashed (sha256 over every output of every step of the warm-up): a placement
changes where bytes live, never what attention computes.

A draft (ResidencyModel's planner.draft N): each step verifies N + 1 query tokens per stream
over windows copied once, its stream holding npp + step + N + 1 cells (the kept prefix grows a
cell a step, as a decode run's does: a step's time depends on its tokens and its window, not on
which of them are accepted), and both are predicted with predict_step(tokens_per_step=N + 1).
Tokens/s count the tokens a step keeps, expected (ferry.residency.expected_accepted_tokens).
"""

from __future__ import annotations

import gc
import hashlib
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..backend import Backend, CPUBackend, StandinBackend
from ..copy_cost import CopyCostModel
from ..errors import InvalidArgumentError
from ..kv import KVCache
from ..residency import DeviceSpec, RemoteSpec, ResidencyPlan, predict_step
from ..sched import Scheduler
from ..step import StepGraph, attention_step
from ..tensor import Tensor
from ..types import row_size, to_type
from .common import n_kv_for, random_rows
from .residency_plan import ResidencyModel, _pick, check_strategies, run_windows

if TYPE_CHECKING:
    from ..remote import RemoteTier

__all__ = ["Placement", "PlacementRun", "ResidencyResult", "ResidencyRow", "calibrate_compute", "measure_placements",
           "run_residency"]

#: Called after each decode step with the run's label.
OnStep = Callable[[str], None]

#: Untimed repetitions of each run before the timed ones.
WARMUP = 1

#: The byte a remote layer's local copy is filled with before its run: only its pulls bring its values.
SENTINEL = 0xA5


@dataclass(frozen=True)
class Placement:
    """A placement to run: its name, per layer whether its KV is resident on the device that runs it,
    the scheduler's prefetch depth, and per layer whether its KV is in the remote tier (empty: none)."""

    name: str
    resident: Tuple[bool, ...]
    prefetch: int = 0
    remote: Tuple[bool, ...] = ()

    @property
    def key(self) -> Tuple[Tuple[bool, ...], int, Tuple[bool, ...]]:
        """What makes two placements the same run."""
        return self.resident, self.prefetch, tuple(self.remote) if any(self.remote) else ()


@dataclass(frozen=True)
class PlacementRun:
    """What one placement measured and what the model predicts for it.

    Attributes
    ----------
    placement : Placement
    step_s : tuple of float
        Per timed repetition, its mean step time, in run order.
    fastest_step_s : float
        The mean over the steps of each step's fastest repetition.
    predicted_step_s : float
        The mean over the steps of the model's step time for that step's window.
    output_sha256 : str
        Over every output of every step of the warm-up.
    held_bytes : tuple of (int or None)
        Per device, the bytes its buffers held at the run's end, the most they held (the cache's
        resident layers, the step's queries and lengths, the scheduler's buffers, which only
        grow); None for a device without a memory size, whose use is the host's.
    remote_host_us : float or None
        The tier's own time a window pulled that the prediction took (RemoteSpec.host_us: the median of
        the run's timed pulls' PullStats.host_seconds); None for a placement that pulls nothing.
    """

    placement: Placement
    step_s: Tuple[float, ...]
    fastest_step_s: float
    predicted_step_s: float
    output_sha256: str = field(repr=False)
    held_bytes: Tuple[Optional[int], ...] = ()
    remote_host_us: Optional[float] = None

    @property
    def measured_step_s(self) -> float:
        """The median over the repetitions of their step time."""
        return statistics.median(self.step_s)

    @property
    def spread(self) -> Tuple[float, float, float]:
        """The median, least and greatest step time over the repetitions."""
        return self.measured_step_s, min(self.step_s), max(self.step_s)

    @property
    def ratio(self) -> float:
        """Measured (median) over predicted step time."""
        return self.measured_step_s / self.predicted_step_s if self.predicted_step_s > 0 else float("inf")


def _values(t: Tensor, type_name: str, n_embd: int, seed: Sequence[int]) -> bytes:
    """A tensor's bytes: random rows of n_embd values (its bytes as rows, whatever its layout)."""
    ty = to_type(type_name)
    rows = t.nbytes // row_size(ty, n_embd)
    return random_rows(ty, rows, n_embd, seed)


class _Run:
    """One placement: its own stand-in devices, cache, queries and scheduler; with remote layers, a
    remote tier (ferry.remote.RemoteTier: a server process on the loopback) holding the cache's
    values, the local copies of the remote layers overwritten (SENTINEL), so that only the pulls
    bring them back."""

    def __init__(self, model: ResidencyModel, placement: Placement, cpu: Backend, npp: int, ntg: int, pad: int,
                 seed: int, remote_tier: Optional[RemoteSpec] = None) -> None:
        self.model, self.placement, self.npp, self.ntg, self.pad = model, placement, npp, ntg, pad
        m, g, cfg, n_stream = model, model.kv, model.devices, model.windows.n_stream
        self.devices: List[StandinBackend] = []
        self.kv: Optional[KVCache] = None
        self.sched: Optional[Scheduler] = None
        self.tier: Optional["RemoteTier"] = None
        self.remote = [i for i, r in enumerate(placement.remote) if r]
        if self.remote and remote_tier is None:
            raise InvalidArgumentError(f"residency run: placement {placement.name} has remote layers and no remote "
                                       "tier")
        try:
            for d in range(cfg.n_devices):
                named = {"link_profile": cfg.link_profile} if cfg.link_profile is not None else \
                    {"latency_us": m.latency_us(d)}  # a named link's latency and piece curve are its own
                self.devices.append(StandinBackend(
                    link_gbps=m.standin_link(d), memory=int(_pick(cfg.memory, d, 0)) or None,
                    compute_slowdown=_pick(cfg.compute_slowdown, d, 1.0), **named))
            on = [self.devices[d] for d in cfg.runs_on(m.n_layer)]
            places = [on[i] if r else None for i, r in enumerate(placement.resident)]
            cells = [m.layer_cells(i) for i in range(m.n_layer)]
            self.kv = KVCache(g.type_kv, g.type_kv, g.head_dim, g.n_head_kv, m.windows.n_ctx, n_stream,
                              n_layer=m.n_layer, v_trans=g.v_trans, backend=cpu, placement=places,
                              layer_cells=cells if any(c is not None for c in cells) else None)
            n_embd = g.head_dim * g.n_head_kv
            for layer in range(m.n_layer):
                for which, t in (("k", self.kv.k(layer)), ("v", self.kv.v(layer))):
                    t.set(_values(t, g.type_kv, n_embd, (seed, layer, which == "v")))
            if self.remote:
                from ..remote import RemoteTier  # the engine is an extra: imported where a run pulls
                assert remote_tier is not None
                self.tier = RemoteTier(self.kv, model=remote_tier.link)
                self.tier.upload()
                for layer in self.remote:
                    for t in (self.kv.k(layer), self.kv.v(layer)):
                        t.set(bytes([SENTINEL]) * t.nbytes)
                self.tier.fetch_layers(self.remote)  # the scheduler pulls them, a layer's before its copies
            rng = np.random.default_rng([seed, 1 << 20])
            self.q = [Tensor.from_numpy(on[i], rng.uniform(-1, 1, (n_stream, m.n_tok, g.n_head, g.head_dim))
                                        .astype(np.float32), name=f"q{i}") for i in range(m.n_layer)]
            self.kv_len = Tensor.from_numpy(self.devices[0], np.zeros(n_stream, np.int32), name="kv_len")
            self.on = on if cfg.n_devices > 1 else self.devices[0]
            self.sched = Scheduler([*self.devices, cpu], policy="ranges", compact=m.planner.compact,
                                   prefetch=placement.prefetch)
            self.graphs = StepGraph(self.sched, self._build)
        except BaseException:
            self.close()
            raise
        self.step_s: List[float] = []
        self.steps: List[List[float]] = []  # per timed repetition, per step
        self.digest = ""
        self.host_s: List[float] = []  # the timed repetitions' pulls: each its tier's own time (PullStats.host_seconds)

    def _build(self, n_kv: object) -> List[Tensor]:
        assert isinstance(n_kv, int) and self.kv is not None and self.sched is not None
        return attention_step(self.sched, self.on, self.kv.windows(n_kv), self.q, self.kv_len, self.model.kv.v_trans)

    def n_kv(self, step: int) -> int:
        """The full layers' window at a step (0..ntg-1): its stream's npp + step + n_tok cells."""
        return n_kv_for(self.npp, step + self.model.n_tok, self.pad, self.model.kv_size)

    def repetition(self, timed: bool, on_step: Optional[OnStep]) -> None:
        assert self.sched is not None
        times = []
        digest = hashlib.sha256()
        for t in range(self.ntg):
            graph = self.graphs.get(self.n_kv(t))
            self.kv_len.set(np.full(self.model.windows.n_stream, self.npp + t + self.model.n_tok, np.int32))
            t0 = time.perf_counter()
            self.sched.compute(graph)  # remote layers: their pulls inside it (fetch_layers)
            times.append(time.perf_counter() - t0)
            if not timed:
                for out in graph.outputs:
                    digest.update(out.get())
            if on_step is not None:
                on_step(self.placement.name)
        pulls = [] if self.tier is None else self.tier.take_fetch_stats()
        if timed:
            self.steps.append(times)
            self.host_s += [s.host_seconds for s in pulls]
        else:
            self.digest = digest.hexdigest()

    def remote_tier(self, tier: Optional[RemoteSpec]) -> Optional[RemoteSpec]:
        """tier with its host_us the median of this run's timed pulls' own time (PullStats.host_seconds); tier
        itself for a run that pulled nothing."""
        if tier is None or not self.host_s:
            return tier
        return replace(tier, host_us=statistics.median(self.host_s) * 1e6)

    def held_bytes(self) -> Tuple[Optional[int], ...]:
        """Per device, the bytes its buffers hold now (None without a memory size)."""
        out: List[Optional[int]] = []
        for d in self.devices:
            size = d.memory_size
            out.append(None if size is None else size - d.memory().free)
        return tuple(out)

    def close(self) -> None:
        if self.tier is not None:
            self.tier.close()
        if self.sched is not None:
            self.sched.close()
        if self.kv is not None:
            self.kv.close()
        for d in self.devices:
            d.close()


def _predicted(model: ResidencyModel, devices: Sequence[DeviceSpec], placement: Placement, npp: int, ntg: int,
               pad: int, layers_at: Dict[int, object], remote_tier: Optional[RemoteSpec] = None) -> float:
    """The mean over the steps of the model's step time for each step's window (n_tok query tokens per
    stream)."""
    total = 0.0
    for t in range(ntg):
        n_kv = n_kv_for(npp, t + model.n_tok, pad, model.kv_size)
        if n_kv not in layers_at:
            layers_at[n_kv] = model.at(n_kv=n_kv).layers()
        total += predict_step(layers_at[n_kv], devices, placement.resident,  # type: ignore[arg-type]
                              model.devices.layer_devices, placement.prefetch, tokens_per_step=model.n_tok,
                              remote=placement.remote or None,
                              remote_tier=remote_tier if any(placement.remote) else None).step_seconds
    return total / ntg


def calibrate_compute(model: ResidencyModel, compute: Sequence[float], npp: int, ntg: int, pad: int = 1,
                      repeat: int = 3, seed: int = 0) -> Tuple[float, ...]:
    """Each layer's compute figure scaled to what a step costs in this run's own conditions.

    measure_compute times attention alone, at its fastest; a run's step also pays, per layer, its
    query's and lengths' copies and the scheduler's work, and on a busy host its compute runs
    slower than its fastest. So every layer resident (nothing of the KV copied), on unmodelled-
    memory stand-ins with the run's links and compute slowdowns, is run (a warm-up and repeat
    repetitions of ntg steps, the median step), and the figures are scaled by the measured step
    over the model's for that placement.

    Parameters
    ----------
    model : ResidencyModel
    compute : sequence of float
        Per layer, the host's seconds (ResidencyModel.compute_seconds).
    npp, ntg, pad, repeat, seed
        As measure_placements takes them.

    Returns
    -------
    tuple of float
        Per layer, the scaled figure.
    """
    free = model.at(memory=(), prefetch=0)
    devices = free.device_specs(compute, [model.standin_link(d) or 1.0 for d in range(model.devices.n_devices)])
    every = Placement(name="every layer resident", resident=(True,) * model.n_layer)
    run = measure_placements(free, [every], devices, npp, ntg, pad, repeat, seed)[0]
    scale = run.measured_step_s / run.predicted_step_s if run.predicted_step_s > 0 else 1.0
    return tuple(c * scale for c in compute)


def measure_placements(model: ResidencyModel, placements: Sequence[Placement], devices: Sequence[DeviceSpec],
                       npp: int, ntg: int, pad: int = 1, repeat: int = 5, seed: int = 0,
                       on_step: Optional[OnStep] = None, calibrate: bool = False,
                       remote_tier: Optional[RemoteSpec] = None) -> List[PlacementRun]:
    """Run each placement on stand-ins of its own, taking turns, and predict each.

    Parameters
    ----------
    model : ResidencyModel
        The geometry and devices (its n_kv is not used: each step's window is npp + step + 1
        cells, rounded up to pad).
    placements : sequence of Placement
        Those to run; identical ones (same residency and prefetch) run once.
    devices : sequence of DeviceSpec
        The model's devices (ResidencyModel.devices), for the predictions.
    npp, ntg, pad : int
        Prompt cells per sequence, steps per repetition, the window's rounding.
    repeat : int, optional
        Timed repetitions of each, after one warm-up.
    seed : int, optional
        The cache's values and queries.
    on_step : callable, optional
        Called with the placement's name after each step.
    calibrate : bool, optional
        Also run every layer resident (on stand-ins of unmodelled memory), taking turns with the
        placements, and scale the devices' compute figures by its measured step over its
        predicted one before predicting the placements: the figures then hold what a step costs
        beside attention in this run's own conditions (see calibrate_compute).
    remote_tier : RemoteSpec, optional
        The remote tier of the placements' remote layers: each such run starts a RemoteTier (its
        link's model merging the pieces), and the scheduler pulls the remote layers' windows
        (ranges) in each step, inside the step's time (RemoteTier.fetch_layers). Each such run is
        predicted with the tier's own time a window (RemoteSpec.host_us) measured over its timed
        pulls (their PullStats.host_seconds, the median).

    Returns
    -------
    list of PlacementRun
        One per placement, in the order given.

    Raises
    ------
    InvalidArgumentError
        For a placement of another length than the model's layers, or windows past the cache.
    FerryError
        When a device cannot hold what the placement puts on it (OutOfMemoryError), or a run fails.
    """
    if repeat < 1 or ntg < 1 or npp < 1:
        raise InvalidArgumentError(f"residency run: repeat, -ntg and -npp must be positive, got {repeat}, {ntg}, "
                                   f"{npp}")
    if npp + ntg + model.planner.draft > model.kv_size:
        raise InvalidArgumentError(f"residency run: a stream holds {model.kv_size} cells, fewer than -npp + -ntg"
                                   f"{' + --draft' if model.planner.draft else ''} = {npp + ntg + model.planner.draft}")
    for p in placements:
        if len(p.resident) != model.n_layer or len(p.remote) not in (0, model.n_layer):
            raise InvalidArgumentError(f"residency run: placement {p.name} has {len(p.resident)} entries (remote: "
                                       f"{len(p.remote)}) for {model.n_layer} layers")
    keys: Dict[Tuple[Tuple[bool, ...], int, Tuple[bool, ...]], int] = {}
    unique: List[Placement] = []
    for p in placements:
        if p.key not in keys:
            keys[p.key] = len(unique)
            unique.append(p)
    cpu = CPUBackend()
    runs: List[_Run] = []
    reference = Placement(name="every layer resident (calibration)", resident=(True,) * model.n_layer)
    collecting = gc.isenabled()
    held: List[Tuple[Optional[int], ...]] = []
    try:
        for p in unique:
            runs.append(_Run(model, p, cpu, npp, ntg, pad, seed, remote_tier))
        if calibrate:
            runs.append(_Run(model.at(memory=()), reference, cpu, npp, ntg, pad, seed))
        for rep in range(WARMUP + repeat):
            if rep == WARMUP:
                gc.collect()
                gc.disable()
            for run in (runs if rep % 2 == 0 else runs[::-1]):
                run.repetition(rep >= WARMUP, on_step)
        held = [run.held_bytes() for run in runs]
    finally:
        if collecting:
            gc.enable()
        for run in runs:
            run.close()
        cpu.close()
    layers_at: Dict[int, object] = {}
    if calibrate:
        ref = runs.pop()
        held.pop()
        predicted = _predicted(model, devices, reference, npp, ntg, pad, layers_at)
        scale = statistics.median(sum(s) / len(s) for s in ref.steps) / predicted if predicted > 0 else 1.0
        devices = [replace(d, compute_s=tuple(c * scale for c in d.compute_s) if isinstance(d.compute_s, tuple)
                           else d.compute_s * scale) for d in devices]
    measured = []
    for run, bytes_held in zip(runs, held):
        per_rep = tuple(sum(s) / len(s) for s in run.steps)
        fastest = sum(min(step) for step in zip(*run.steps)) / ntg
        tier = run.remote_tier(remote_tier)
        measured.append((per_rep, fastest, _predicted(model, devices, run.placement, npp, ntg, pad, layers_at, tier),
                         run.digest, bytes_held, tier.host_us if tier is not None and run.host_s else None))
    out = []
    for p in placements:
        per_rep, fastest, predicted, digest, bytes_held, host_us = measured[keys[p.key]]
        out.append(PlacementRun(placement=p, step_s=per_rep, fastest_step_s=fastest, predicted_step_s=predicted,
                                output_sha256=digest, held_bytes=bytes_held, remote_host_us=host_us))
    return out


@dataclass(frozen=True)
class ResidencyRow:
    """One strategy's placement, measured beside its prediction (a row of `ferry residency-bench`)."""

    npl: int
    plan: ResidencyPlan
    run: PlacementRun
    accepted: float = 1.0  # tokens each sequence keeps per step (ResidencyModel.accepted_per_step)

    @property
    def strategy(self) -> str:
        """The strategy that chose the placement."""
        return self.plan.strategy

    def as_dict(self) -> Dict[str, object]:
        """The row as `ferry residency-bench --json` writes it: the plan (ResidencyPlan.as_dict, its
        step time the model's for the last step's window), the prediction and measurement per step
        (the mean over the steps), their ratio and the spread over repetitions; tokens/s count the
        tokens kept (`accepted` a step per sequence); a placement that pulls from a remote tier, the
        tier's own time a window its prediction took ("remote_host_us"; a run without one writes what it
        always did)."""
        median, least, most = self.run.spread
        return {"npl": self.npl, "strategy": self.strategy, "prefetch": self.plan.prefetch,
                "predicted_step_s": self.run.predicted_step_s, "measured_step_s": median,
                "measured_step_s_min": least, "measured_step_s_max": most,
                "fastest_step_s": self.run.fastest_step_s, "ratio": self.run.ratio,
                "measured_tokens_per_s": self.npl * self.accepted / median if median > 0 else None,
                "predicted_tokens_per_s": self.npl * self.accepted / self.run.predicted_step_s
                if self.run.predicted_step_s > 0 else None,
                "repeats": len(self.run.step_s), "output_sha256": self.run.output_sha256,
                "held_bytes": list(self.run.held_bytes),
                **({} if self.run.remote_host_us is None else {"remote_host_us": self.run.remote_host_us}),
                "plan": self.plan.as_dict(self.npl, self.accepted)}


@dataclass
class ResidencyResult:
    """Every strategy's row, per number of sequences and prefetch depth, and the figures the
    plans were made with."""

    rows: List[ResidencyRow]
    compute_s: Dict[int, Tuple[float, ...]]  # per npl, each layer's attention on the host
    links: Tuple[float, ...]
    remote_link: Optional[CopyCostModel] = None  # the remote tier's link the plans took, if any

    def outputs_identical(self, npl: int) -> bool:
        """Whether every placement of npl gave the same attention outputs."""
        return len({r.run.output_sha256 for r in self.rows if r.npl == npl}) == 1

    def as_dicts(self) -> List[Dict[str, object]]:
        """The rows as data."""
        return [r.as_dict() for r in self.rows]


def run_residency(model: ResidencyModel, strategies: Sequence[str], npl: Sequence[int], npp: int, ntg: int,
                  pad: int = 1, repeat: int = 5, prefetch_depths: Sequence[int] = (0,), seed: int = 0,
                  on_step: Optional[OnStep] = None, calibrate: bool = True) -> ResidencyResult:
    """Plan each strategy's placement and run it, per number of sequences and prefetch depth.

    Parameters
    ----------
    model : ResidencyModel
        The geometry and devices; its n_stream, n_kv and prefetch are set here per run.
    strategies : sequence of str
        Of ferry.residency.STRATEGIES (empty: all).
    npl : sequence of int
        Numbers of sequences, one stream each.
    npp, ntg, pad : int
    repeat : int, optional
    prefetch_depths : sequence of int, optional
        Each a planned and measured run (0: serial).
    seed : int, optional
    on_step : callable, optional
    calibrate : bool, optional
        Scale the measured compute figure to the run's conditions (calibrate_compute) before
        planning, and again by the every-layer-resident run taking turns with the placements
        before predicting them (measure_placements(calibrate=True)); not when the model gives
        compute_us.

    With a remote link in the model (planner.remote_link, host_memory), the plans split the layers
    left off the devices between host memory and the remote tier, and their remote layers are
    pulled through a RemoteTier each step (measure_placements' remote_tier).

    Returns
    -------
    ResidencyResult

    Raises
    ------
    PlanDoesNotFitError
        When a plan cannot fit (the message names the device and by how much).
    InvalidArgumentError, FerryError
        As measure_placements raises.
    """
    strategies = check_strategies(strategies)
    links = model.links()
    tier = model.remote_spec(model.remote_link())
    rows: List[ResidencyRow] = []
    compute: Dict[int, Tuple[float, ...]] = {}
    for n in npl:
        n_ctx = model.windows.n_ctx
        if n_ctx % n:
            raise InvalidArgumentError(f"-npl {n}: -c {n_ctx} is not a multiple of it")
        m = model.at(n_stream=n, n_kv=n_kv_for(npp, ntg + model.planner.draft, pad, n_ctx // n),
                     step_windows=run_windows(npp, ntg, pad, n_ctx // n, model.n_tok))
        m.check()
        compute[n] = m.compute_seconds()
        if calibrate and m.planner.compute_us is None:
            compute[n] = calibrate_compute(m, compute[n], npp, ntg, pad, max(3, repeat // 2), seed)
        devices = m.device_specs(compute[n], links)
        layers = m.layers()
        plans = [plan for depth in prefetch_depths
                 for plan in m.at(prefetch=depth).plans(strategies, devices, layers, tier)]
        placements = [Placement(name=f"{p.strategy}{'+prefetch' + str(p.prefetch) if p.prefetch else ''}",
                                resident=p.resident, prefetch=p.prefetch, remote=p.remote) for p in plans]
        runs = measure_placements(m, placements, devices, npp, ntg, pad, repeat, seed, on_step,
                                  calibrate=calibrate and m.planner.compute_us is None, remote_tier=tier)
        rows += [ResidencyRow(npl=n, plan=p, run=r, accepted=m.accepted_per_step) for p, r in zip(plans, runs)]
    return ResidencyResult(rows=rows, compute_s=compute, links=links, remote_link=None if tier is None else tier.link)
