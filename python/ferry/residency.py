"""Where each layer's KV should live: a cost model of one decode step, a planner, and named rules.

A layer's K and V are either resident on the device that runs its attention (no copy, its bytes
held there) or in host memory (its windows copied to that device every step, over its link).
predict_step models one decode step under such a placement the way the scheduler runs it
(lib/src/sched.c, lib/src/sched-prefetch.c); plan_residency chooses the placement, by the
planner ("auto") or by one of the rules in use ("first", "round-robin", "slowest-link"). What the
model leaves out, and the planner's argument, are in docs/design.md ("Which layers to keep").

Everything here is arithmetic on the figures given; layers_from_geometry asks C for a model's
byte figures (a dry-run cache, no memory behind it), and device_from_backend measures a device's
link and reads its memory.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .backend import Backend, DummyBackend, StandinBackend
from .copy_path import bytes_read
from .errors import InvalidArgumentError
from .kv import KVCache
from .link import measure_link
from .quant import quantize
from .sched import Scheduler
from .step import StepGraph, attention_step
from .tensor import Tensor

__all__ = [
    "LayerCost", "DeviceSpec", "StepPrediction", "ResidencyPlan", "PlanDoesNotFitError", "STRATEGIES",
    "predict_step", "plan_residency", "plan_auto", "plan_first", "plan_round_robin", "plan_slowest_link",
    "link_groups", "layers_from_geometry", "device_from_backend", "measure_compute",
]

#: The strategies plan_residency knows, the planner first.
STRATEGIES = ("auto", "first", "round-robin", "slowest-link")

#: Devices whose links are within this fraction of the group's slowest count as one (slowest-link).
LINK_GROUP_TOLERANCE = 0.15

#: The planner's exact search stops after this many evaluated placements and keeps its best.
DEFAULT_SEARCH_LIMIT = 20_000

#: The serial planner enumerates at most this many count vectors per device (prod(n_kind + 1)).
KIND_LIMIT = 1_000_000


class PlanDoesNotFitError(InvalidArgumentError):
    """A placement cannot fit a device's budget: the message names the device, what it must hold,
    what it has and by how much it is short."""


@dataclass(frozen=True)
class LayerCost:
    """One layer's KV, in the figures the model needs.

    Attributes
    ----------
    transfers : tuple of int
        Bytes of each transfer its windows take per step while it lives in host memory (K then V:
        under ``ranges`` one 2-D transfer each, the bytes the window reads).
    resident_bytes : int
        Bytes its K and V hold on a device where it is resident.
    staging_bytes : int or None
        Device bytes the copies of its windows occupy while they live (the bytes read with
        compact staging, the windows' spans without); None: sum(transfers).
    """

    transfers: Tuple[int, ...]
    resident_bytes: int
    staging_bytes: Optional[int] = None

    @property
    def window_bytes(self) -> int:
        """Bytes its windows copy per step from host memory."""
        return sum(self.transfers)

    @property
    def staging(self) -> int:
        """Device bytes its window copies hold (staging_bytes, or the bytes copied)."""
        return self.window_bytes if self.staging_bytes is None else self.staging_bytes


@dataclass(frozen=True)
class DeviceSpec:
    """A device as the model sees it.

    Attributes
    ----------
    link_gbps : float
        Host-to-device bandwidth, GB/s (1e9 bytes a second), as measure_link gives it.
    latency_us : float
        Microseconds each transfer costs beyond its bytes.
    compute_s : float or tuple of float
        Seconds one layer's attention takes on it: one figure for every layer, or one per layer of
        the model (indexed by layer, as measure_compute and a per-size figure give).
    memory : int or None
        Bytes free for the KV cache, its window copies and the reserve; None: unlimited.
    reserve : int
        Bytes set aside for what else the device must hold.
    name : str
        What messages call it (default "device <index>").
    """

    link_gbps: float
    latency_us: float = 0.0
    compute_s: Union[float, Tuple[float, ...]] = 0.0
    memory: Optional[int] = None
    reserve: int = 0
    name: str = ""


@dataclass(frozen=True)
class StepPrediction:
    """What the model predicts for one decode step under a placement.

    Attributes
    ----------
    step_seconds : float
        The step's time.
    memory : tuple of int
        Per device: resident_bytes + window_bytes + its reserve.
    resident_bytes : tuple of int
        Per device: the K and V of its resident layers.
    window_bytes : tuple of int
        Per device: the most its split's window copies hold at once, those prefetching holds
        ahead of the part computing included.
    copy_seconds : tuple of float
        Per device: the time its link carries the step's windows.
    compute_seconds : float
        The chain of every layer's attention.
    """

    step_seconds: float
    memory: Tuple[int, ...]
    resident_bytes: Tuple[int, ...]
    window_bytes: Tuple[int, ...]
    copy_seconds: Tuple[float, ...]
    compute_seconds: float


@dataclass(frozen=True)
class ResidencyPlan:
    """A placement of every layer's KV and what the model predicts for it.

    Attributes
    ----------
    strategy : str
        The strategy that chose it (one of STRATEGIES).
    resident : tuple of bool
        Per layer, whether its KV is resident on its device (else it lives in host memory).
    layer_device : tuple of int
        Per layer, the index of the device that runs its attention (and holds it when resident).
    prefetch : int
        Parts the scheduler copies ahead (0: serial), as the prediction assumes.
    prediction : StepPrediction
        The model's step time and memory per device.
    budgets : tuple of (int or None)
        Per device, the memory the plan had to fit (DeviceSpec.memory).
    exact : bool
        Whether the plan is the model's optimum (always False for the named rules).
    bound : float
        For "auto", a proven factor within which its step time lies of the optimum's it compares
        against (1.0 when exact; docs/design.md says which); math.inf for the named rules.
    """

    strategy: str
    resident: Tuple[bool, ...]
    layer_device: Tuple[int, ...]
    prefetch: int
    prediction: StepPrediction
    budgets: Tuple[Optional[int], ...]
    exact: bool = False
    bound: float = math.inf

    @property
    def step_seconds(self) -> float:
        """The predicted step time."""
        return self.prediction.step_seconds

    @property
    def memory(self) -> Tuple[int, ...]:
        """Predicted memory per device (resident KV, window copies, reserve)."""
        return self.prediction.memory

    def tokens_per_second(self, npl: int = 1) -> float:
        """Tokens a second the prediction gives: npl sequences, one token each per step.

        Parameters
        ----------
        npl : int, optional
            Sequences decoded together.

        Returns
        -------
        float
        """
        if not isinstance(npl, int) or isinstance(npl, bool) or npl < 1:
            raise InvalidArgumentError(f"tokens_per_second: npl must be a positive integer, got {npl!r}")
        return npl / self.step_seconds if self.step_seconds > 0 else math.inf

    def resident_layers(self, device: Optional[int] = None) -> List[int]:
        """The resident layers, of one device or of all.

        Parameters
        ----------
        device : int, optional
            A device index; None: every device.

        Returns
        -------
        list of int
        """
        return [i for i, r in enumerate(self.resident)
                if r and (device is None or self.layer_device[i] == device)]

    def as_dict(self, npl: int = 1) -> Dict[str, object]:
        """The plan as data (what a --json output prints): per device its resident layers and
        predicted memory, beside the step time and tokens/s for npl sequences.

        Parameters
        ----------
        npl : int, optional
            Sequences decoded together, for tokens_per_second.

        Returns
        -------
        dict
        """
        pred = self.prediction
        return {
            "strategy": self.strategy, "prefetch": self.prefetch, "step_seconds": pred.step_seconds,
            "tokens_per_second": self.tokens_per_second(npl), "npl": npl, "exact": self.exact,
            "bound": None if math.isinf(self.bound) else self.bound,
            "devices": [{"resident_layers": self.resident_layers(d), "memory": pred.memory[d],
                         "resident_bytes": pred.resident_bytes[d], "window_bytes": pred.window_bytes[d],
                         "copy_seconds": pred.copy_seconds[d], "budget": self.budgets[d]}
                        for d in range(len(self.budgets))],
        }

    def placement(self, backends: Sequence[object]) -> List[Optional[object]]:
        """The plan as KVCache(placement=...) takes it: per layer its device's backend, or None.

        Parameters
        ----------
        backends : sequence
            One backend per device, in the devices' order.

        Returns
        -------
        list
        """
        if len(backends) <= max(self.layer_device, default=-1):
            raise InvalidArgumentError(f"placement: {len(backends)} backends for "
                                       f"{max(self.layer_device) + 1} devices")
        return [backends[d] if r else None for r, d in zip(self.resident, self.layer_device)]


# ---------------------------------------------------------------- the model

@dataclass
class _Problem:
    """The checked inputs, in the arrays the simulation reads."""

    layers: List[LayerCost]
    devices: List[DeviceSpec]
    dev: List[int]
    prefetch: int
    max_layers: Optional[int] = None  # at most this many layers resident, all devices together
    carry: List[List[float]] = field(default_factory=list)  # per layer, each transfer's seconds on its link
    compute: List[float] = field(default_factory=list)      # per layer, on its device
    budget: List[Optional[int]] = field(default_factory=list)  # per device: memory - reserve

    def name(self, d: int) -> str:
        return self.devices[d].name or f"device {d}"


def _problem(layers: Sequence[LayerCost], devices: Sequence[DeviceSpec], layer_device: Optional[Sequence[int]],
             prefetch: int, max_layers: Optional[int] = None) -> _Problem:
    layers = list(layers)
    devices = list(devices)
    if not layers:
        raise InvalidArgumentError("residency: no layers")
    if not devices:
        raise InvalidArgumentError("residency: no devices")
    for i, layer in enumerate(layers):
        if not isinstance(layer, LayerCost):
            raise InvalidArgumentError(f"residency: layer {i} is not a LayerCost but {type(layer).__name__}")
        if not layer.transfers or any(not isinstance(b, int) or b < 0 for b in layer.transfers) or \
                layer.resident_bytes < 0 or layer.staging < 0:
            raise InvalidArgumentError(f"residency: layer {i} has a negative or missing byte figure: {layer}")
    n_dev = len(devices)
    if layer_device is None:
        dev = [i * n_dev // len(layers) for i in range(len(layers))]  # layer_split's map
    else:
        dev = list(layer_device)
        if len(dev) != len(layers):
            raise InvalidArgumentError(f"residency: {len(dev)} entries in layer_device for {len(layers)} layers")
        for i, d in enumerate(dev):
            if not isinstance(d, int) or isinstance(d, bool) or not 0 <= d < n_dev:
                raise InvalidArgumentError(f"residency: layer {i} is on device {d!r}, not one of 0..{n_dev - 1}")
    if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0:
        raise InvalidArgumentError(f"residency: prefetch must be an integer >= 0, got {prefetch!r}")
    if max_layers is not None and (not isinstance(max_layers, int) or isinstance(max_layers, bool) or max_layers < 0):
        raise InvalidArgumentError(f"residency: max_layers must be None or an integer >= 0, got {max_layers!r}")
    p = _Problem(layers, devices, dev, prefetch, max_layers)
    for d, spec in enumerate(devices):
        if not isinstance(spec, DeviceSpec):
            raise InvalidArgumentError(f"residency: device {d} is not a DeviceSpec but {type(spec).__name__}")
        if not (spec.link_gbps > 0 and math.isfinite(spec.link_gbps)):
            raise InvalidArgumentError(f"residency: {p.name(d)}'s link_gbps must be positive, got {spec.link_gbps}")
        if not (spec.latency_us >= 0 and math.isfinite(spec.latency_us)):
            raise InvalidArgumentError(f"residency: {p.name(d)}'s latency_us must be >= 0, got {spec.latency_us}")
        if spec.reserve < 0 or (spec.memory is not None and spec.memory < 0):
            raise InvalidArgumentError(f"residency: {p.name(d)}'s memory and reserve must not be negative")
        if not isinstance(spec.compute_s, (int, float)) and len(spec.compute_s) != len(layers):
            raise InvalidArgumentError(f"residency: {p.name(d)} has {len(spec.compute_s)} compute times for "
                                       f"{len(layers)} layers")
        p.budget.append(None if spec.memory is None else spec.memory - spec.reserve)
    for i, layer in enumerate(layers):
        spec = devices[dev[i]]
        bps = spec.link_gbps * 1e9
        p.carry.append([spec.latency_us * 1e-6 + b / bps for b in layer.transfers])
        c = spec.compute_s if isinstance(spec.compute_s, (int, float)) else spec.compute_s[i]
        if not (c >= 0 and math.isfinite(c)):
            raise InvalidArgumentError(f"residency: layer {i}'s compute time on {p.name(dev[i])} must be >= 0, "
                                       f"got {c}")
        p.compute.append(float(c))
    return p


def _step_time(p: _Problem, host: Sequence[bool]) -> float:
    """The step's time with host[l] telling which layers live in host memory (see predict_step)."""
    n = len(host)
    if p.prefetch == 0:
        t = 0.0
        for i in range(n):
            if host[i]:
                t += sum(p.carry[i])
            t += p.compute[i]
        return t
    free = [0.0] * len(p.devices)  # when each device's link is free
    ready = [0.0] * n              # when each part's queued copies have arrived
    t = 0.0                        # the calling thread: its copies, waits and the compute chain
    queued = 0
    for part in range(n):
        issue = t
        while queued <= min(part + p.prefetch, n - 1):
            q = queued
            queued += 1
            if not host[q]:
                continue
            d, end = p.dev[q], 0.0
            for k, c in enumerate(p.carry[q]):
                if q == 0 and k % 2 == 0:
                    continue  # the calling thread's share of the first part, below
                end = max(free[d], issue) + c
                free[d] = end
            if q == 0:
                for k in range(0, len(p.carry[0]), 2):
                    end = max(free[d], t) + p.carry[0][k]
                    free[d] = end
                    t = end
            ready[q] = end
        t = max(t, ready[part]) + p.compute[part]
    return t


def _memory(p: _Problem, host: Sequence[bool]) -> Tuple[List[int], List[int]]:
    """Per device: resident bytes, and the most its window copies hold at once."""
    n_dev, n = len(p.devices), len(host)
    resident = [0] * n_dev
    windows = [0] * n_dev
    for i in range(n):
        if not host[i]:
            resident[p.dev[i]] += p.layers[i].resident_bytes
    held = [0] * n_dev  # copies alive while part `part` computes: its own and those of the parts queued ahead
    for i in range(min(p.prefetch + 1, n)):
        if host[i]:
            held[p.dev[i]] += p.layers[i].staging
    for part in range(n):
        for d in range(n_dev):
            windows[d] = max(windows[d], held[d])
        if host[part]:
            held[p.dev[part]] -= p.layers[part].staging
        nxt = part + p.prefetch + 1
        if nxt < n and host[nxt]:
            held[p.dev[nxt]] += p.layers[nxt].staging
    return resident, windows


def _fits(p: _Problem, host: Sequence[bool]) -> bool:
    if p.max_layers is not None and len(host) - sum(host) > p.max_layers:
        return False
    resident, windows = _memory(p, host)
    return all(b is None or r + w <= b for b, r, w in zip(p.budget, resident, windows))


def _prediction(p: _Problem, host: Sequence[bool]) -> StepPrediction:
    resident, windows = _memory(p, host)
    copy = [0.0] * len(p.devices)
    for i, h in enumerate(host):
        if h:
            copy[p.dev[i]] += sum(p.carry[i])
    return StepPrediction(
        step_seconds=_step_time(p, host),
        memory=tuple(r + w + s.reserve for r, w, s in zip(resident, windows, p.devices)),
        resident_bytes=tuple(resident), window_bytes=tuple(windows), copy_seconds=tuple(copy),
        compute_seconds=sum(p.compute))


def predict_step(layers: Sequence[LayerCost], devices: Sequence[DeviceSpec], resident: Sequence[bool],
                 layer_device: Optional[Sequence[int]] = None, prefetch: int = 0) -> StepPrediction:
    """The model's decode step under a placement: its time and the memory each device holds.

    Serial (prefetch 0), a step is the sum over layers of the layer's copies (when it lives in host
    memory; each transfer latency + bytes / bandwidth on its device's link) and its compute. With
    prefetching, the scheduler's run is simulated: one part per layer, in layer order; as part p
    begins, the copies of parts up to p + prefetch not yet queued are queued on their own device's
    copy queue (so a second device's first windows are queued while the first device computes); a
    device's link carries its transfers one at a time in the order taken; the first part's copies
    are shared between the calling thread (the first, third, ...) and the queue; each part's
    compute starts when its copies have arrived and the part before has computed, one chain across
    all devices.

    Memory per device: its resident layers' K and V, the most its window copies hold at once (the
    part computing and the prefetch parts queued after it), and its reserve.

    Parameters
    ----------
    layers : sequence of LayerCost
        Per layer, in the step's order.
    devices : sequence of DeviceSpec
    resident : sequence of bool
        Per layer, whether it is resident on its device.
    layer_device : sequence of int, optional
        Per layer, its device's index; default: layer_split's contiguous ranges.
    prefetch : int, optional
        Parts copied ahead (Scheduler(prefetch=N)); 0: serial.

    Returns
    -------
    StepPrediction

    Raises
    ------
    InvalidArgumentError
        For inconsistent lengths, indices or figures.
    """
    p = _problem(layers, devices, layer_device, prefetch)
    if len(resident) != len(p.layers):
        raise InvalidArgumentError(f"predict_step: {len(resident)} entries in resident for {len(p.layers)} layers")
    return _prediction(p, [not bool(r) for r in resident])


# ---------------------------------------------------------------- refusals

def _short_message(p: _Problem, d: int, host: Sequence[bool], what: str) -> str:
    resident, windows = _memory(p, host)
    spec = p.devices[d]
    need = resident[d] + windows[d] + spec.reserve
    assert spec.memory is not None
    return (f"{p.name(d)}: {what} needs {need} bytes ({resident[d]} resident, {windows[d]} of window copies, "
            f"{spec.reserve} reserved) but has {spec.memory}: short by {need - spec.memory} bytes")


def _check_windows_fit(p: _Problem) -> None:
    """Refuse a device that cannot hold its split's window copies with every layer in host memory
    (the least any placement holds while a resident layer holds at least its window copies)."""
    all_host = [True] * len(p.layers)
    _, windows = _memory(p, all_host)
    for d, b in enumerate(p.budget):
        if b is not None and windows[d] > b:
            raise PlanDoesNotFitError(_short_message(p, d, all_host, "its split's window copies"))


def _refuse_empty(p: _Problem, host: Sequence[bool]) -> None:
    """Refuse a plan that keeps no layer resident while some device has a budget: no layer fits."""
    if any(not h for h in host) or p.max_layers == 0:
        return
    shorts = []
    for d, b in enumerate(p.budget):
        mine = [i for i in range(len(host)) if p.dev[i] == d]
        if not mine:
            continue
        if b is None:
            return
        best = None
        for i in mine:
            trial = list(host)
            trial[i] = False
            r, w = _memory(p, trial)
            over = r[d] + w[d] - b
            best = over if best is None or over < best else best
        shorts.append((best or 0, d))
    if not shorts or min(shorts)[0] <= 0:
        return  # a layer fits: keeping none is the strategy's choice
    over, d = min(shorts)
    smallest = min(p.layers[i].resident_bytes for i in range(len(host)) if p.dev[i] == d)
    raise PlanDoesNotFitError(
        f"no layer fits: {p.name(d)} comes closest, its smallest layer ({smallest} bytes resident) beside its "
        f"window copies and reserve is {over} bytes over its {p.devices[d].memory} bytes")


# ---------------------------------------------------------------- the named rules

def _plan(p: _Problem, strategy: str, host: List[bool], exact: bool = False, bound: float = math.inf
          ) -> ResidencyPlan:
    return ResidencyPlan(strategy, tuple(not h for h in host), tuple(p.dev), p.prefetch, _prediction(p, host),
                         tuple(s.memory for s in p.devices), exact, bound)


def _take_in_turn(p: _Problem, host: List[bool], groups: Sequence[Sequence[int]]) -> List[bool]:
    """Within each group in turn, its devices take their next layer (in layer order) one after
    another while it fits; a device whose next layer does not fit stops taking."""
    for group in groups:
        queues = {d: [i for i in range(len(host)) if p.dev[i] == d and host[i]] for d in group}
        active = [d for d in group if queues[d]]
        while active:
            for d in list(active):
                i = queues[d].pop(0)
                host[i] = False
                if not _fits(p, host):
                    host[i] = True
                    queues[d] = []
                if not queues[d]:
                    active.remove(d)
    return host


def plan_first(layers: Sequence[LayerCost], devices: Sequence[DeviceSpec],
               layer_device: Optional[Sequence[int]] = None, prefetch: int = 0,
               max_layers: Optional[int] = None) -> ResidencyPlan:
    """``first``: the first N layers resident (llama.cpp's --kv-gpu-layers N), N as large as every
    device's budget allows.

    Parameters
    ----------
    layers, devices, layer_device, prefetch
        As predict_step takes them.
    max_layers : int, optional
        At most this many layers resident, all devices together (a --kv-gpu-layers N); None:
        as many as the budgets hold.

    Returns
    -------
    ResidencyPlan

    Raises
    ------
    PlanDoesNotFitError
        When a device cannot hold its split's window copies, or no layer fits.
    """
    p = _problem(layers, devices, layer_device, prefetch, max_layers)
    _check_windows_fit(p)
    host = [True] * len(p.layers)
    for i in range(len(host)):
        host[i] = False
        if not _fits(p, host):
            host[i] = True
            break
    _refuse_empty(p, host)
    return _plan(p, "first", host)


def plan_round_robin(layers: Sequence[LayerCost], devices: Sequence[DeviceSpec],
                     layer_device: Optional[Sequence[int]] = None, prefetch: int = 0,
                     max_layers: Optional[int] = None) -> ResidencyPlan:
    """``round-robin``: one layer per device in turn (each device its own layers in order), a device
    stopping at its first layer that does not fit.

    Parameters
    ----------
    layers, devices, layer_device, prefetch
        As predict_step takes them.
    max_layers : int, optional
        At most this many layers resident, all devices together (a --kv-gpu-layers N); None:
        as many as the budgets hold.

    Returns
    -------
    ResidencyPlan

    Raises
    ------
    PlanDoesNotFitError
        When a device cannot hold its split's window copies, or no layer fits.
    """
    p = _problem(layers, devices, layer_device, prefetch, max_layers)
    _check_windows_fit(p)
    host = _take_in_turn(p, [True] * len(p.layers), [list(range(len(p.devices)))])
    _refuse_empty(p, host)
    return _plan(p, "round-robin", host)


def link_groups(gbps: Sequence[float], tolerance: float = LINK_GROUP_TOLERANCE) -> List[List[int]]:
    """Devices grouped by link, slowest group first: a group holds the devices within tolerance
    (a fraction) above its slowest.

    Parameters
    ----------
    gbps : sequence of float
        Each device's link.
    tolerance : float, optional

    Returns
    -------
    list of list of int
        Device indices per group.
    """
    order = sorted(range(len(gbps)), key=lambda d: (gbps[d], d))
    groups: List[List[int]] = []
    for d in order:
        if groups and gbps[d] <= gbps[groups[-1][0]] * (1 + tolerance):
            groups[-1].append(d)
        else:
            groups.append([d])
    return groups


def plan_slowest_link(layers: Sequence[LayerCost], devices: Sequence[DeviceSpec],
                      layer_device: Optional[Sequence[int]] = None, prefetch: int = 0,
                      max_layers: Optional[int] = None) -> ResidencyPlan:
    """``slowest-link``: the budget spent where the link is slowest. Devices whose links are within
    15% of each other form a group; the slowest group's devices take their layers (in order, one
    device after another in turn) while they fit, then the next group's.

    Parameters
    ----------
    layers, devices, layer_device, prefetch
        As predict_step takes them (each DeviceSpec's link_gbps: given, or measured by
        device_from_backend).
    max_layers : int, optional
        At most this many layers resident, all devices together; None: as many as fit.

    Returns
    -------
    ResidencyPlan

    Raises
    ------
    PlanDoesNotFitError
        When a device cannot hold its split's window copies, or no layer fits.
    """
    p = _problem(layers, devices, layer_device, prefetch, max_layers)
    _check_windows_fit(p)
    host = _take_in_turn(p, [True] * len(p.layers), link_groups([s.link_gbps for s in p.devices]))
    _refuse_empty(p, host)
    return _plan(p, "slowest-link", host)


# ---------------------------------------------------------------- the planner

def _serial_best(p: _Problem, windows_factor: int, limit: int,
                 max_layers: Optional[int] = None) -> Optional[List[bool]]:
    """The serial model's optimum, over counts of interchangeable layers per device.

    Serially a step is sum(compute) + the copies of the host layers, each device's independent of
    the others', and a device's memory depends only on how many of each kind of layer it keeps (a
    kind: the same transfers, resident bytes and staging), its window copies counting
    windows_factor times the largest host layer's staging. So each device's best for each number
    of layers kept is a count vector, one count per kind, that saves the most copy time within its
    budget: an enumeration of prod(n_kind + 1) vectors, few where layers come in few sizes. The
    devices' tables are then combined for the most saved with at most max_layers kept in all.
    None when an enumeration is over limit or a device fits nothing.
    """
    n = len(p.layers)
    tables: List[Dict[int, Tuple[float, int, List[int]]]] = []  # per device: layers kept -> (saved, used, layers)
    for d, budget in enumerate(p.budget):
        mine = [i for i in range(n) if p.dev[i] == d]
        kinds: Dict[Tuple[Tuple[int, ...], int, int], List[int]] = {}
        for i in mine:
            layer = p.layers[i]
            kinds.setdefault((layer.transfers, layer.resident_bytes, layer.staging), []).append(i)
        keys = list(kinds)
        if math.prod(len(kinds[k]) + 1 for k in keys) > limit:
            return None
        saved = [sum(p.carry[kinds[k][0]]) for k in keys]
        table: Dict[int, Tuple[float, int, List[int]]] = {}
        for counts in itertools.product(*(range(len(kinds[k]) + 1) for k in keys)):
            staged = max((k[2] for k, c in zip(keys, counts) if c < len(kinds[k])), default=0)
            used = sum(c * k[1] for k, c in zip(keys, counts)) + windows_factor * staged
            if budget is not None and used > budget:
                continue
            gain, kept = sum(c * g for c, g in zip(counts, saved)), sum(counts)
            if kept not in table or (gain, -used) > (table[kept][0], -table[kept][1]):
                table[kept] = (gain, used, [i for k, c in zip(keys, counts) for i in kinds[k][:c]])
        if not table:
            return None
        tables.append(table)
    cap = n if max_layers is None else max_layers
    combined: Dict[int, Tuple[float, List[int]]] = {0: (0.0, [])}  # layers kept so far -> best (saved, layers)
    for table in tables:
        nxt: Dict[int, Tuple[float, List[int]]] = {}
        for kept, (gain, chosen) in combined.items():
            for k, (g, _, layers) in table.items():
                if kept + k <= cap and (kept + k not in nxt or gain + g > nxt[kept + k][0]):
                    nxt[kept + k] = (gain + g, chosen + layers)
        combined = nxt
    if not combined:
        return None
    _, chosen = max(combined.values(), key=lambda v: v[0])
    host = [True] * n
    for i in chosen:
        host[i] = False
    return host


def _greedy(p: _Problem) -> List[bool]:
    """From every layer in host memory, keep adding the layer that lowers the step time most per
    byte it adds while one fits."""
    host = [True] * len(p.layers)
    t = _step_time(p, host)
    while True:
        best: Optional[Tuple[float, int]] = None
        for i in range(len(host)):
            if not host[i]:
                continue
            host[i] = False
            if _fits(p, host):
                gain = (t - _step_time(p, host)) / max(1, p.layers[i].resident_bytes)
                if best is None or gain > best[0]:
                    best = (gain, i)
            host[i] = True
        if best is None:
            return host
        host[best[1]] = False
        t = _step_time(p, host)


def _local_search(p: _Problem, host: List[bool], passes: int = 20) -> List[bool]:
    """Improve a fitting placement by single moves while one lowers the step time: a layer made
    resident, or a resident layer and a host layer of the same device exchanged."""
    host = list(host)
    t = _step_time(p, host)
    for _ in range(passes):
        improved = False
        moves: List[Tuple[int, Optional[int]]] = [(j, None) for j in range(len(host)) if host[j]]
        moves += [(j, i) for i in range(len(host)) if not host[i] for j in range(len(host))
                  if host[j] and p.dev[j] == p.dev[i]]
        for j, i in moves:
            if not host[j] or (i is not None and host[i]):
                continue  # an earlier move of this pass changed them
            host[j] = False
            if i is not None:
                host[i] = True
            t_new = _step_time(p, host) if _fits(p, host) else math.inf
            if t_new < t * (1 - 1e-12):
                t, improved = t_new, True
            else:
                host[j] = True
                if i is not None:
                    host[i] = False
        if not improved:
            break
    return host


def _branch_and_bound(p: _Problem, incumbent: List[bool], limit: int) -> Tuple[List[bool], bool]:
    """The model's optimum by a search over layers in order, each resident or not.

    A partial placement's lower bound is the step with its undecided layers resident (the model's
    step time never rises when a layer becomes resident: it only removes transfers from a link),
    and its memory lower bound is that of its decided layers alone (a layer decided later adds
    resident bytes or window copies, never removes them). Returns the best placement and whether
    the search ran to its end within limit evaluations."""
    n = len(p.layers)
    best = list(incumbent)
    best_t = _step_time(p, best)
    host = [False] * n
    evaluated = 0
    complete = True

    def partial_fits(k: int) -> bool:
        if p.max_layers is not None and k - sum(host[:k]) > p.max_layers:
            return False
        trial = host[:k] + [False] * (n - k)
        resident, windows = _memory(p, trial)
        extra = [0] * len(p.devices)
        for i in range(k, n):
            extra[p.dev[i]] += p.layers[i].resident_bytes  # not held yet: taken back out
        return all(b is None or r - e + w <= b for b, r, e, w in zip(p.budget, resident, extra, windows))

    def search(k: int) -> None:
        nonlocal best, best_t, evaluated, complete
        if not complete:
            return
        evaluated += 1
        if evaluated > limit:
            complete = False
            return
        if not partial_fits(k):
            return
        bound = _step_time(p, host)  # undecided layers (k onwards) resident
        if bound >= best_t:
            return
        if k == n:
            best, best_t = list(host), bound
            return
        host[k] = False
        search(k + 1)
        host[k] = True
        search(k + 1)
        host[k] = False

    search(0)
    return best, complete


def plan_auto(layers: Sequence[LayerCost], devices: Sequence[DeviceSpec],
              layer_device: Optional[Sequence[int]] = None, prefetch: int = 0,
              max_layers: Optional[int] = None, search_limit: int = DEFAULT_SEARCH_LIMIT) -> ResidencyPlan:
    """``auto``: the placement with the least predicted step time within every device's budget.

    Serial (prefetch 0) it is exact at any size: each device's best count of each kind of layer
    (layers of the same size are interchangeable serially), enumerated. With prefetching, where a
    layer sits in the order matters: a branch and bound over layers finds the optimum, stopping
    after search_limit evaluated placements; what it returns then is within the bound that
    docs/design.md proves (plan.exact and plan.bound say which held).

    Parameters
    ----------
    layers, devices, layer_device, prefetch
        As predict_step takes them.
    max_layers : int, optional
        At most this many layers resident, all devices together (a --kv-gpu-layers N); None:
        as many as the budgets hold.
    search_limit : int, optional
        Placements the exact search may evaluate.

    Returns
    -------
    ResidencyPlan

    Raises
    ------
    PlanDoesNotFitError
        When a device cannot hold its split's window copies, or no layer fits.
    """
    p = _problem(layers, devices, layer_device, prefetch, max_layers)
    _check_windows_fit(p)
    if p.prefetch == 0:
        host = _serial_best(p, 1, KIND_LIMIT, p.max_layers)
        if host is not None:
            _refuse_empty(p, host)
            return _plan(p, "auto", host, True, 1.0)
    seeds = [_greedy(p), [True] * len(p.layers)]
    conservative = _serial_best(p, p.prefetch + 1, KIND_LIMIT, p.max_layers)
    if conservative is not None:
        seeds.append(conservative)
    for rule in (plan_first, plan_round_robin, plan_slowest_link):
        try:
            seeds.append([not r for r in rule(layers, devices, layer_device, prefetch, max_layers).resident])
        except PlanDoesNotFitError:
            pass
    feasible = [s for s in seeds if _fits(p, s)]
    incumbent = _local_search(p, min(feasible, key=lambda s: _step_time(p, s)))
    host, exact = _branch_and_bound(p, incumbent, search_limit)
    _refuse_empty(p, host)
    bound = 1.0 if exact else (1.0 + len(p.devices) if conservative is not None else math.inf)
    return _plan(p, "auto", host, exact, bound)


_RULES: Dict[str, Callable[..., ResidencyPlan]] = {
    "auto": plan_auto, "first": plan_first, "round-robin": plan_round_robin, "slowest-link": plan_slowest_link,
}


def plan_residency(strategy: str, layers: Sequence[LayerCost], devices: Sequence[DeviceSpec],
                   layer_device: Optional[Sequence[int]] = None, prefetch: int = 0,
                   max_layers: Optional[int] = None) -> ResidencyPlan:
    """The placement a strategy chooses, with its prediction.

    Parameters
    ----------
    strategy : str
        One of STRATEGIES: "auto" (the planner), "first", "round-robin", "slowest-link".
    layers, devices, layer_device, prefetch
        As predict_step takes them.
    max_layers : int, optional
        At most this many layers resident, all devices together (a --kv-gpu-layers N); None:
        as many as the budgets hold.

    Returns
    -------
    ResidencyPlan

    Raises
    ------
    InvalidArgumentError
        For an unknown strategy or inconsistent inputs.
    PlanDoesNotFitError
        When a device cannot hold its split's window copies, or no layer fits.
    """
    if strategy not in _RULES:
        raise InvalidArgumentError(f"plan_residency: unknown strategy {strategy!r}; one of {', '.join(STRATEGIES)}")
    return _RULES[strategy](layers, devices, layer_device, prefetch, max_layers)


# ---------------------------------------------------------------- figures from C and from devices

def layers_from_geometry(type_k: str, type_v: str, head_dim: int, n_head_kv: int, n_ctx: int, n_stream: int,
                         n_kv: int, layer_windows: Sequence[Optional[int]], v_trans: bool = False,
                         compact: bool = True, n_new: int = 1) -> List[LayerCost]:
    """Each layer's figures for a model's geometry, from C: a dry-run cache (synthetic memory)
    with each layer at its own size, its windows' bytes read (what ``ranges`` copies, 2-D per
    window) and its K and V tensors' bytes.

    Parameters
    ----------
    type_k, type_v : str
        The cache's types.
    head_dim, n_head_kv, n_ctx, n_stream : int
        As KVCache takes them.
    n_kv : int
        Cells a full layer's window reads per stream.
    layer_windows : sequence of (int or None)
        Per layer, its sliding window (None: full attention); the layer holds min(W + n_new,
        n_ctx / n_stream) cells per stream.
    v_trans : bool, optional
    compact : bool, optional
        Window copies hold the bytes read (Scheduler(compact=True)); else the windows' spans.
    n_new : int, optional
        Cells a decode step adds per stream.

    Returns
    -------
    list of LayerCost
    """
    kv_size = n_ctx // n_stream if n_stream > 0 else 0
    cells = [None if w is None else min(w + n_new, kv_size) for w in layer_windows]
    host = DummyBackend(is_host=True)
    kv = KVCache(type_k, type_v, head_dim, n_head_kv, n_ctx, n_stream, n_layer=len(cells), v_trans=v_trans,
                 backend=host, layer_cells=cells)
    try:
        out = []
        windows = kv.windows(n_kv)
        for i in range(len(cells)):
            k, v = windows[i]
            read = (bytes_read(k), bytes_read(v))
            staging = sum(read) if compact else k.nbytes + v.nbytes
            out.append(LayerCost(read, kv.k(i).nbytes + kv.v(i).nbytes, staging))
        return out
    finally:
        kv.close()
        host.close()


def measure_compute(backend: Backend, type_k: str = "f16", type_v: str = "f16", head_dim: int = 128,
                    n_head_kv: int = 8, n_head: int = 32, n_ctx: int = 8192, n_stream: int = 1,
                    n_kv: Optional[int] = None, n_layer: int = 4, runs: int = 3) -> float:
    """Seconds one layer's decode attention takes on a backend, measured once: a step of n_layer
    device-resident layers holding random values, the fastest of runs, divided by n_layer.

    Parameters
    ----------
    backend : Backend
        The device (its KV resident there, so nothing is copied).
    type_k, type_v, head_dim, n_head_kv, n_head, n_ctx, n_stream : optional
        The geometry; n_kv defaults to n_ctx // n_stream.
    n_layer, runs : int, optional

    Returns
    -------
    float
    """
    if not isinstance(backend, Backend):
        raise InvalidArgumentError(f"measure_compute: backend is not a Backend but {type(backend).__name__}")
    n_kv = n_ctx // n_stream if n_kv is None else n_kv
    kv = KVCache(type_k, type_v, head_dim, n_head_kv, n_ctx, n_stream, n_layer=n_layer, backend=backend)
    # values written, not fresh memory: untouched pages all read as one zero page, from cache,
    # and attention over them runs about twice as fast as over a cache that holds data
    rng = np.random.default_rng(0)
    for layer in range(n_layer):
        for t, type_ in ((kv.k(layer), type_k), (kv.v(layer), type_v)):
            t.set(quantize(rng.uniform(-1, 1, int(np.prod(t.ne))).astype(np.float32), type_).tobytes())
    q = [Tensor.from_numpy(backend, np.zeros((n_stream, 1, n_head, head_dim), np.float32), name=f"q{i}")
         for i in range(n_layer)]
    kv_len = Tensor.from_numpy(backend, np.full(n_stream, n_kv, np.int32), name="kv_len")
    sched = Scheduler([backend])
    try:
        graph = StepGraph(sched, lambda _: attention_step(sched, backend, kv.windows(n_kv), q, kv_len)).get(n_kv)
        best = math.inf
        for _ in range(runs):
            sched.compute(graph)
            best = min(best, sched.stats.compute_seconds)
        return best / n_layer
    finally:
        sched.close()
        kv.close()


def device_from_backend(backend: Backend, compute_s: Union[float, Tuple[float, ...]] = 0.0, reserve: int = 0,
                        latency_us: Optional[float] = None, memory: Optional[int] = None,
                        name: Optional[str] = None) -> DeviceSpec:
    """A DeviceSpec from a backend: its link measured once (measure_link), its free memory asked
    (Backend.memory), its latency a stand-in's own.

    Parameters
    ----------
    backend : Backend
    compute_s : float or tuple of float, optional
        Seconds per layer (measure_compute gives one).
    reserve : int, optional
    latency_us : float, optional
        Default: a stand-in's modelled latency, else 0.
    memory : int, optional
        Default: the backend's free memory.
    name : str, optional
        Default: the backend's name.

    Returns
    -------
    DeviceSpec
    """
    if not isinstance(backend, Backend):
        raise InvalidArgumentError(f"device_from_backend: backend is not a Backend but {type(backend).__name__}")
    gbps = measure_link(backend).gbps
    if latency_us is None:
        latency_us = backend.latency_us if isinstance(backend, StandinBackend) else 0.0
    free = backend.memory().free if memory is None else memory
    return DeviceSpec(gbps, latency_us, compute_s, free, reserve, backend.name if name is None else name)
