"""The cost model of one decode step under a placement: each layer resident on the device that runs
it or copied from host memory every step (predict_step), and the plan object every strategy returns."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from ..errors import InvalidArgumentError


class PlanDoesNotFitError(InvalidArgumentError):
    """A placement cannot fit a device's budget: the message names the device, what it must hold,
    what it has and by how much it is short."""


def _set(obj: object, field_name: str, value: object) -> None:
    """Set a field of a frozen dataclass to its checked form (in __post_init__)."""
    object.__setattr__(obj, field_name, value)


def _byte_count(value: object, what: str, also: str = "") -> int:
    """value as a count of bytes: an integer >= 0 (numpy's too; numpy's bool is no Integral, Python's is)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise InvalidArgumentError(f"{what} is {also}a count of bytes (an integer >= 0), got {value!r}")
    return int(value)


def _number(value: object, what: str, takes: str, ok: Callable[[float], bool]) -> float:
    """value as a float: a finite real number (numpy's too, not a bool) that ok accepts."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
            not math.isfinite(float(value)) or not ok(float(value)):
        raise InvalidArgumentError(f"{what} is {takes}, got {value!r}")
    return float(value)


def _sequence(value: object, what: str, item: str) -> List[Any]:
    """value as a list: InvalidArgumentError naming the argument for anything but a sequence."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InvalidArgumentError(f"residency: {what} is a sequence of {item}, one per layer or device, not "
                                   f"{type(value).__name__}")
    return list(value)


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

    Raises
    ------
    InvalidArgumentError
        For a field of another kind or out of its range (an empty or negative transfers, a
        negative or fractional count of bytes), naming it.
    """

    transfers: Tuple[int, ...]
    resident_bytes: int
    staging_bytes: Optional[int] = None

    def __post_init__(self) -> None:
        """Check each figure where it is given: InvalidArgumentError naming the field and what it takes."""
        if isinstance(self.transfers, (str, bytes)) or not isinstance(self.transfers, Sequence) or not self.transfers:
            raise InvalidArgumentError(f"LayerCost: transfers is a non-empty sequence of byte counts (int >= 0), "
                                       f"got {self.transfers!r}")
        _set(self, "transfers", tuple(_byte_count(b, f"LayerCost: transfers[{i}]")
                                      for i, b in enumerate(self.transfers)))
        _set(self, "resident_bytes", _byte_count(self.resident_bytes, "LayerCost: resident_bytes"))
        if self.staging_bytes is not None:
            _set(self, "staging_bytes", _byte_count(self.staging_bytes, "LayerCost: staging_bytes", "None or "))

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

    Raises
    ------
    InvalidArgumentError
        For a field of another kind or out of its range (a link_gbps not positive and finite, a
        negative or non-finite time, a negative or fractional count of bytes, a name not a str),
        naming it. Numbers are kept as float and counts as int.
    """

    link_gbps: float
    latency_us: float = 0.0
    compute_s: Union[float, Tuple[float, ...]] = 0.0
    memory: Optional[int] = None
    reserve: int = 0
    name: str = ""

    def __post_init__(self) -> None:
        """Check each figure where it is given: InvalidArgumentError naming the field and what it takes."""
        _set(self, "link_gbps", _number(self.link_gbps, "DeviceSpec: link_gbps", "a positive finite number of GB/s",
                                        lambda x: x > 0))
        _set(self, "latency_us", _number(self.latency_us, "DeviceSpec: latency_us",
                                         "a finite number of microseconds >= 0", lambda x: x >= 0))
        seconds = "a finite number of seconds >= 0"
        if isinstance(self.compute_s, Sequence) and not isinstance(self.compute_s, (str, bytes)):
            if not self.compute_s:
                raise InvalidArgumentError("DeviceSpec: compute_s is a number of seconds, or one per layer, not an "
                                           "empty sequence")
            _set(self, "compute_s", tuple(_number(c, f"DeviceSpec: compute_s[{i}]", seconds, lambda x: x >= 0)
                                          for i, c in enumerate(self.compute_s)))
        else:
            _set(self, "compute_s", _number(self.compute_s, "DeviceSpec: compute_s",
                                            f"{seconds}, or a sequence of them (one per layer)", lambda x: x >= 0))
        if self.memory is not None:
            _set(self, "memory", _byte_count(self.memory, "DeviceSpec: memory", "None or "))
        _set(self, "reserve", _byte_count(self.reserve, "DeviceSpec: reserve"))
        if not isinstance(self.name, str):
            raise InvalidArgumentError(f"DeviceSpec: name is a str, got {type(self.name).__name__} {self.name!r}")


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
    layers = _sequence(layers, "layers", "LayerCost")
    devices = _sequence(devices, "devices", "DeviceSpec")
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
        dev = _sequence(layer_device, "layer_device", "device index")
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
    resident = _sequence(resident, "resident", "bool")
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


def _plan(p: _Problem, strategy: str, host: List[bool], exact: bool = False, bound: float = math.inf
          ) -> ResidencyPlan:
    return ResidencyPlan(strategy, tuple(not h for h in host), tuple(p.dev), p.prefetch, _prediction(p, host),
                         tuple(s.memory for s in p.devices), exact, bound)
