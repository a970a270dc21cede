"""The cost model of one decode step under a placement: each layer resident on the device that runs
it, copied from host memory every step, or pulled from a remote tier and then copied (predict_step).
What it is given is in specs.py, what it gives (the plan every strategy returns) in prediction.py."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..copy_cost import CopyCostModel
from ..errors import InvalidArgumentError
from ..pieces import _merge_piece_array
from .prediction import PlanDoesNotFitError, ResidencyPlan, StepPrediction
from .specs import DeviceSpec, LayerCost, RemoteSpec, _link_model, _number, _sequence

# ---------------------------------------------------------------- the model

#: What a step allocates under a placement, measured: called with per layer whether it is resident,
#: it returns per device (bytes of the scheduler's buffer, bytes of the step's own tensors beside it).
#: ferry.residency.StepMemory measures it by a dry run of the step. It may also have a method
#: least(resident) of the same form giving no more than it does, more cheaply (StepMemory's: the
#: largest window alone), which a fit asks first.
MeasureMemory = Callable[[Tuple[bool, ...]], Sequence[Tuple[int, int]]]


class _Cached:
    """A measure asked once per placement, and its least (the measure's own where it has one; the
    measurement itself where that was made or there is none)."""

    def __init__(self, measure: MeasureMemory) -> None:
        self.measure = measure
        self.full: Dict[Tuple[bool, ...], List[Tuple[int, int]]] = {}
        self.quick: Dict[Tuple[bool, ...], List[Tuple[int, int]]] = {}

    @staticmethod
    def _ask(measure: Callable[[Tuple[bool, ...]], Sequence[Tuple[int, int]]], resident: Tuple[bool, ...]
             ) -> List[Tuple[int, int]]:
        return [(int(b), int(i)) for b, i in measure(resident)]

    def __call__(self, resident: Tuple[bool, ...]) -> List[Tuple[int, int]]:
        got = self.full.get(resident)
        if got is None:
            got = self.full[resident] = self._ask(self.measure, resident)
        return got

    def least(self, resident: Tuple[bool, ...]) -> List[Tuple[int, int]]:
        least = getattr(self.measure, "least", None)
        if resident in self.full or not callable(least):
            return self(resident)
        got = self.quick.get(resident)
        if got is None:
            got = self.quick[resident] = self._ask(least, resident)
        return got


#: A kind of host layer for the host/remote split: (its K and V's bytes, its pull's seconds, its pull's bytes).
_HostKind = Tuple[int, float, int]
#: A split's least: (the pulls' seconds, how many layers of each kind stay local), or None where none fits.
_Split = Optional[Tuple[float, Dict[_HostKind, int]]]


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
    measure: Optional[_Cached] = None
    tokens_per_step: float = 1.0  # query tokens per stream per step: each layer's compute is this many times its figure
    remote_tier: Optional[RemoteSpec] = None
    pull: List[float] = field(default_factory=list)    # per layer, its pull's seconds (remote -> host)
    pull_host: List[float] = field(default_factory=list)  # per layer, the tier's own seconds on the calling thread
    pull_pieces: List[int] = field(default_factory=list)  # per layer, its pull's pieces, merged
    pulled: List[int] = field(default_factory=list)    # per layer, its pull's bytes, gaps included
    remote: List[bool] = field(default_factory=list)   # per layer, remote under the placement asked of it
    # the least split of each multiset of host kinds asked (_split_counts): (pull seconds, kept per kind) or None
    splits: Dict[Tuple[Tuple[_HostKind, int], ...], _Split] = field(default_factory=dict)
    split_inexact: bool = False  # a split was made greedily (past SPLIT_LIMIT)

    def name(self, d: int) -> str:
        return self.devices[d].name or f"device {d}"


def _problem(layers: Sequence[LayerCost], devices: Sequence[DeviceSpec], layer_device: Optional[Sequence[int]],
             prefetch: int, max_layers: Optional[int] = None, measure: Optional[MeasureMemory] = None,
             tokens_per_step: float = 1.0, remote_tier: Optional[RemoteSpec] = None) -> _Problem:
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
                min(layer.resident_bytes, layer.staging, layer.output_bytes, layer.query_bytes) < 0:
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
    if measure is not None and not callable(measure):
        raise InvalidArgumentError(f"residency: measure must be callable, got {type(measure).__name__}")
    tokens = _number(tokens_per_step, "residency: tokens_per_step",
                     "a finite number >= 1 (query tokens per stream per step)", lambda x: x >= 1)
    cached = measure if measure is None or isinstance(measure, _Cached) else _Cached(measure)
    p = _Problem(layers, devices, dev, prefetch, max_layers, measure=cached, tokens_per_step=tokens)
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
        link = _link_model(spec)  # each transfer's bytes as C prices them, by its piece curve where it has one
        p.carry.append([spec.latency_us * 1e-6 + link.piece_seconds(b) for b in layer.transfers])
        c = spec.compute_s if isinstance(spec.compute_s, (int, float)) else spec.compute_s[i]
        if not (c >= 0 and math.isfinite(c)):
            raise InvalidArgumentError(f"residency: layer {i}'s compute time on {p.name(dev[i])} must be >= 0, "
                                       f"got {c}")
        # attention's figure is a one-token step's; each further query token reads its whole window
        # again (token t of n reads len - n + t + 1 cells, within n of the window) and adds the part
        # of the figure the step's tokens do not share (token_share: 1, n tokens take n times as long)
        p.compute.append(float(c) * (1.0 + (tokens - 1.0) * spec.token_share))
    if remote_tier is not None:
        if not isinstance(remote_tier, RemoteSpec):
            raise InvalidArgumentError(f"residency: remote_tier is a RemoteSpec, got {type(remote_tier).__name__}")
        p.remote_tier = remote_tier
        for layer in layers:
            seconds, pieces, nbytes = _pull_cost(layer, remote_tier.link)
            p.pull.append(seconds)
            p.pull_host.append(len(layer.pieces or layer.transfers) * remote_tier.host_us * 1e-6)  # a window each
            p.pull_pieces.append(pieces)
            p.pulled.append(nbytes)
    p.remote = [False] * len(layers)
    return p


def _pull_cost(layer: LayerCost, link: CopyCostModel) -> Tuple[float, int, int]:
    """A step's pulls of the layer's windows from a remote tier: (seconds, pieces, bytes), each
    window's pieces merged by the link's model as the tier merges them (in source order, by
    ferry_copy_pieces_merge) and priced as it predicts: a batch a window (the scheduler fetches
    each window as its own batch: RemoteTier.fetch_layers), then each piece piece_ns and its bytes
    at its size's rate."""
    windows = layer.pieces or tuple(((0, b),) for b in layer.transfers)
    sizes: List[int] = []
    batches = 0
    for window in windows:
        rows = sorted((o, o, n) for o, n in window if n > 0)
        if rows:
            merged, _ = _merge_piece_array(np.array(rows, dtype=np.uintp), link)
            sizes += [int(n) for n in merged[:, 2]]
        batches += 1
    counts = Counter(sizes)
    seconds = batches * link.call_us * 1e-6 + sum(c * (link.piece_ns * 1e-9 + link.piece_seconds(n))
                                                  for n, c in counts.items())
    return seconds, len(sizes), sum(sizes)


def _pull_seconds(p: _Problem, i: int) -> float:
    """Layer i's pulls a step if it is remote: the link's time and the tier's own on the calling thread."""
    return p.pull[i] + p.pull_host[i]


def _step_time(p: _Problem, host: Sequence[bool]) -> float:
    """The scheduler's step with host[l] telling which layers live in host memory, the remote ones'
    pulls included (see predict_step)."""
    n = len(host)
    pulled = [bool(p.remote and p.remote[i] and host[i]) for i in range(n)]
    pull = [p.pull[i] if pulled[i] else 0.0 for i in range(n)]
    pull_host = [p.pull_host[i] if pulled[i] else 0.0 for i in range(n)]
    if p.prefetch == 0:
        t = 0.0
        for i in range(n):
            if host[i]:
                t += pull_host[i] + pull[i] + sum(p.carry[i])
            t += p.compute[i]
        return t
    free = [0.0] * len(p.devices)  # when each device's link is free
    ready = [0.0] * n              # when each part's queued copies have arrived
    landed = [0.0] * n             # when each remote layer's pull has landed in host memory
    pulled_to = 0.0                # when the remote link is free
    t = 0.0                        # the calling thread: its copies, waits and the compute chain
    queued = begun = 0
    for part in range(n):
        while begun <= min(part + p.prefetch + 1, n - 1):  # the pulls, a part ahead of the copies they feed
            if pulled[begun]:
                t += pull_host[begun]  # the tier plans (and later places) on the calling thread
                pulled_to = max(pulled_to, t) + pull[begun]
                landed[begun] = pulled_to
            begun += 1
        issue = t
        while queued <= min(part + p.prefetch, n - 1):
            q = queued
            queued += 1
            if not host[q]:
                continue
            t = max(t, landed[q])  # the calling thread waits for the pull before it queues the copies
            issue = max(issue, landed[q])
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


def _parts(p: _Problem, host: Sequence[bool]) -> List[int]:
    """Per layer, the scheduler's part it computes in. A part begins where a split begins (the device
    changes) and at every layer in host memory (its window copies are new inputs); a resident
    layer computes in the part before it (sched.c's build_splits)."""
    out, part = [], -1
    for i in range(len(host)):
        if i == 0 or p.dev[i] != p.dev[i - 1] or host[i]:
            part += 1
        out.append(part)
    return out


def _buffers(p: _Problem, host: Sequence[bool]) -> List[int]:
    """Per device, the most the scheduler's buffer holds at once by the model: the window copies and
    attention outputs alive together, walked as the graph allocator walks the step. A layer's copies
    are placed as their part begins, or with prefetching as the part `prefetch` parts before it
    begins, and are freed once the layer has computed; outputs stay to the end. The allocator's
    buffer is at least this (the tensors alive at once do not overlap) and more where its layout
    leaves gaps."""
    n_dev = len(p.devices)
    parts = _parts(p, host)
    placed_at: Dict[int, List[int]] = {}  # part -> the host layers whose copies are placed as it begins
    for i, h in enumerate(host):
        if h:
            placed_at.setdefault(max(parts[i] - p.prefetch, 0), []).append(i)
    live, most = [0] * n_dev, [0] * n_dev
    for i in range(len(host)):
        if i == 0 or parts[i] != parts[i - 1]:
            for j in placed_at.get(parts[i], ()):
                live[p.dev[j]] += p.layers[j].staging
                most[p.dev[j]] = max(most[p.dev[j]], live[p.dev[j]])
        d = p.dev[i]
        live[d] += p.layers[i].output_bytes
        most[d] = max(most[d], live[d])  # the layer computing: its copies, those ahead, the outputs so far
        if host[i]:
            live[d] -= p.layers[i].staging
    return most


def _memory(p: _Problem, host: Sequence[bool], measured: bool = True) -> Tuple[List[int], List[int], List[int]]:
    """Per device: its resident bytes, the scheduler's buffer and the step's inputs beside it; measured
    where the problem has a measure (and measured is True), else the model's least (_buffers and the
    queries)."""
    n_dev = len(p.devices)
    resident, inputs = [0] * n_dev, [0] * n_dev
    for i, layer in enumerate(p.layers):
        inputs[p.dev[i]] += layer.query_bytes
        if not host[i]:
            resident[p.dev[i]] += layer.resident_bytes
    if not measured or p.measure is None:
        return resident, _buffers(p, host), inputs
    got = _measured(p, host, p.measure)
    return resident, [b for b, _ in got], [i for _, i in got]


def _measured(p: _Problem, host: Sequence[bool], measure: Callable[[Tuple[bool, ...]], List[Tuple[int, int]]]
              ) -> List[Tuple[int, int]]:
    got = measure(tuple(not h for h in host))
    if len(got) != len(p.devices):
        raise InvalidArgumentError(f"residency: measure gave {len(got)} devices' memory for {len(p.devices)} devices")
    return got


def _fits(p: _Problem, host: Sequence[bool]) -> bool:
    """Whether the placement keeps within max_layers and every budget. The model's least is asked
    first, then the measure's own least where it has one: where a least does not fit, what the step
    allocates does not either, and the full measurement is not made."""
    if p.max_layers is not None and len(host) - sum(host) > p.max_layers:
        return False
    resident, buffers, inputs = _memory(p, host, measured=False)
    if not all(b is None or r + w + i <= b for b, r, w, i in zip(p.budget, resident, buffers, inputs)):
        return False
    if p.measure is None:
        return True
    least = _measured(p, host, p.measure.least)
    if not all(b is None or r + w + i <= b for b, r, (w, i) in zip(p.budget, resident, least)):
        return False
    resident, buffers, inputs = _memory(p, host)
    return all(b is None or r + w + i <= b for b, r, w, i in zip(p.budget, resident, buffers, inputs))


def _prediction(p: _Problem, host: Sequence[bool], run_seconds: float = 0.0) -> StepPrediction:
    resident, buffers, inputs = _memory(p, host)
    copy = [0.0] * len(p.devices)
    for i, h in enumerate(host):
        if h:
            copy[p.dev[i]] += sum(p.carry[i])
    remote = [i for i, r in enumerate(p.remote) if r]
    return StepPrediction(
        step_seconds=_step_time(p, host) + run_seconds,
        memory=tuple(r + w + i + s.reserve for r, w, i, s in zip(resident, buffers, inputs, p.devices)),
        resident_bytes=tuple(resident), window_bytes=tuple(buffers), copy_seconds=tuple(copy),
        compute_seconds=sum(p.compute), input_bytes=tuple(inputs), measured=p.measure is not None,
        tokens_per_step=p.tokens_per_step, run_seconds=run_seconds,
        pull_seconds=sum(_pull_seconds(p, i) for i in remote), remote_pieces=sum(p.pull_pieces[i] for i in remote),
        pulled_bytes=sum(p.pulled[i] for i in remote), host_bytes=_host_bytes(p, host, p.remote))


def _host_bytes(p: _Problem, host: Sequence[bool], remote: Sequence[bool]) -> int:
    """Host memory a placement holds: the local host layers' K and V, and the staging of the remote
    pulls in flight at once: one serial, and with a prefetch of n up to n + 2 (the first part begins
    those of parts 0..n + 1), the largest of them."""
    local = sum(p.layers[i].resident_bytes for i in range(len(host)) if host[i] and not remote[i])
    return local + _staging(p, [p.pulled[i] for i in range(len(host)) if remote[i]])


def _staging(p: _Problem, pulled: Sequence[int]) -> int:
    """Host bytes the staging of pulls of these bytes holds at most: the largest pull serial, the
    prefetch + 2 largest prefetching (as _host_bytes says)."""
    return sum(sorted(pulled, reverse=True)[:p.prefetch + 2 if p.prefetch else 1])


#: The host/remote split enumerates at most this many count vectors (prod(n_kind + 1)); past it, greedy.
SPLIT_LIMIT = 1_000_000


def _split_counts(p: _Problem, kinds: Sequence[Tuple[_HostKind, int]]) -> _Split:
    """The least pull time within the host memory for so many host layers of each kind: (the pulls'
    seconds, how many of each kind stay local), or None where no split fits.

    Layers of a kind are interchangeable, so every count of each kind kept local is enumerated
    (prod(n_kind + 1) vectors): the host holds the kept layers' K and V and the staging of the
    remote pulls in flight (_staging); the least total pull that fits wins, the fewest remote layers on a tie. Past
    SPLIT_LIMIT vectors, layers are kept local greedily, the most pull time saved per host byte
    first, and p.split_inexact says so. Asked once per multiset of kinds (p.splits)."""
    key = tuple(sorted(kinds))
    if key in p.splits:
        return p.splits[key]
    tier = p.remote_tier
    assert tier is not None and tier.host_memory is not None
    budget = tier.host_memory
    best: Optional[Tuple[float, int, List[int]]] = None  # (pull seconds, remote layers, counts kept)
    if math.prod(m + 1 for _, m in key) <= SPLIT_LIMIT:
        for counts in itertools.product(*(range(m + 1) for _, m in key)):
            staged = _staging(p, [k[2] for (k, m), c in zip(key, counts) for _ in range(m - c)])
            if sum(c * k[0] for (k, _), c in zip(key, counts)) + staged > budget:
                continue
            pulls = sum((m - c) * k[1] for (k, m), c in zip(key, counts))
            gone = sum(m - c for (_, m), c in zip(key, counts))
            if best is None or (pulls, gone) < (best[0], best[1]):
                best = (pulls, gone, list(counts))
    else:
        p.split_inexact = True
        kept = [0] * len(key)

        def held(kept: List[int]) -> int:
            staged = _staging(p, [k[2] for (k, m), c in zip(key, kept) for _ in range(m - c)])
            return sum(c * k[0] for (k, _), c in zip(key, kept)) + staged

        for j in sorted(range(len(key)), key=lambda j: -key[j][0][1] / max(1, key[j][0][0])):
            for _ in range(key[j][1]):  # as the layers one at a time: kept where it fits
                kept[j] += 1
                if held(kept) > budget:
                    kept[j] -= 1
        if held(kept) <= budget:
            best = (sum((m - c) * k[1] for (k, m), c in zip(key, kept)), 0, kept)
    got = None if best is None else (best[0], dict(zip((k for k, _ in key), best[2])))
    p.splits[key] = got
    return got


def _host_kinds(p: _Problem, host: Sequence[bool]) -> Dict[_HostKind, List[int]]:
    """The host layers of a placement by kind (_HostKind), each kind's in layer order."""
    kinds: Dict[_HostKind, List[int]] = {}
    for i in range(len(host)):
        if host[i]:
            kinds.setdefault((p.layers[i].resident_bytes, _pull_seconds(p, i), p.pulled[i]), []).append(i)
    return kinds


def _least_pull(p: _Problem, host: Sequence[bool]) -> float:
    """The least pull time of any split of a placement's host layers that fits the host memory
    (math.inf where none fits; 0 without a host memory to fit). It never falls when a layer is
    added to the host layers: a split of more layers, those taken out, still fits and pulls no
    more."""
    tier = p.remote_tier
    if tier is None or tier.host_memory is None:
        return 0.0
    got = _split_counts(p, [(k, len(v)) for k, v in _host_kinds(p, host).items()])
    return math.inf if got is None else got[0]


def _split_remote(p: _Problem, host: Sequence[bool]) -> List[bool]:
    """Which of the host layers go remote, for the least pull time within the host memory
    (_split_counts); refused naming the host memory where no split fits. Exact for the placement
    (its step is the pulls' sum plus what the split does not change, at any prefetch depth)."""
    n = len(host)
    tier = p.remote_tier
    if tier is None or tier.host_memory is None:
        return [False] * n
    kinds = _host_kinds(p, host)
    got = _split_counts(p, [(k, len(v)) for k, v in kinds.items()])
    if got is None:
        _refuse_host(p, host)
    assert got is not None
    remote = [False] * n
    for k, layers in kinds.items():
        for i in layers[got[1][k]:]:
            remote[i] = True
    return remote


def _refuse_host(p: _Problem, host: Sequence[bool]) -> None:
    """Refuse a placement whose host memory cannot hold even one remote pull's staging."""
    tier = p.remote_tier
    assert tier is not None and tier.host_memory is not None
    need = _staging(p, [p.pulled[i] for i in range(len(host)) if host[i]])
    raise PlanDoesNotFitError(
        f"host memory: {tier.host_memory} bytes cannot hold the staging of the pulls from the {tier.name} tier "
        f"in flight at once ({need} bytes, the largest layers' windows): raise the host memory")


def predict_step(layers: Sequence[LayerCost], devices: Sequence[DeviceSpec], resident: Sequence[bool],
                 layer_device: Optional[Sequence[int]] = None, prefetch: int = 0,
                 measure: Optional[MeasureMemory] = None, tokens_per_step: float = 1.0,
                 remote: Optional[Sequence[bool]] = None, remote_tier: Optional[RemoteSpec] = None,
                 run_seconds: float = 0.0
                 ) -> StepPrediction:
    """The model's decode step under a placement: its time and the memory each device holds.

    Serial (prefetch 0), a step is the sum over layers of the layer's copies (when it lives in host
    memory; each transfer latency + bytes / bandwidth on its device's link, or by its piece curve) and its
    compute. With
    prefetching, the scheduler's run is simulated: one part per layer, in layer order; as part p
    begins, the copies of parts up to p + prefetch not yet queued are queued on their own device's
    copy queue (so a second device's first windows are queued while the first device computes); a
    device's link carries its transfers one at a time in the order taken; the first part's copies
    are shared between the calling thread (the first, third, ...) and the queue; each part's
    compute starts when its copies have arrived and the part before has computed, one chain across
    all devices.

    Several query tokens per stream (tokens_per_step: a verification of a draft of N tokens brings
    N + 1, a prefill chunk its length): the step copies each window once for all of them, so the
    copies are as for one token, and each layer's attention takes its compute figure (a one-token
    step's, measure_compute's) and, for each further token, the device's token_share of it (each
    token reads its whole window but for the few cells the causal rule keeps from it, so the time
    is linear in the tokens; 1, the default, tokens_per_step times the figure). The memory
    figures are the layers' own: their query and output bytes as layers_from_geometry gives them
    for that many tokens.

    Each step is one scheduler run, and the host pays a fixed cost for it beyond its copies and
    compute (run_seconds: walking its splits, launching their computes, copying the lengths): small
    beside a step of milliseconds, but a draft's verification and its N draft steps are N + 1 runs,
    each paying it, at steps of a fraction of a millisecond.

    A layer in a remote tier (remote, with remote_tier's link) pays two links a step: its pull
    (remote -> host, RemoteSpec's arithmetic: a batch a window, its merged pieces, their bytes), and
    then the host -> device copies a host layer's windows take. The scheduler pulls
    (RemoteTier.fetch_layers): serial, a layer's pull just before its copies, on the calling
    thread's chain; prefetching, the pulls of parts up to p + prefetch + 1 are issued as part p
    begins, carried one at a time by the remote link, and the calling thread waits for a layer's
    pull before it queues the layer's copies, so that a pull travels under the compute of the
    parts before. The tier's own work a window (RemoteSpec.host_us) is the calling thread's, serial
    or prefetching: it runs as the pull is issued, before its batch goes on the link.

    Memory per device: its resident layers' K and V (each rounded up to the device's alignment, as the
    cache places them), the scheduler's buffer, the step's own tensors on it (queries, lengths) and
    its reserve. The scheduler's buffer, measured (measure, e.g. StepMemory: a dry run of the step),
    is what the graph allocator reserves; without a measure, the model's least: the most the window
    copies and attention outputs hold at once, with the scheduler's parts (one begins at each layer
    in host memory and at each device's first layer; a layer's copies are placed as its part
    begins, or with prefetching as the part `prefetch` parts before begins, and live until the
    layer has computed).

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
    measure : callable, optional
        What the step allocates under a placement (MeasureMemory); None: the model's least.
    tokens_per_step : float, optional
        Query tokens each stream brings to the step (>= 1; a mean over steps of several sizes is
        fine, the time being linear in it); 1: a decode step.
    remote : sequence of bool, optional
        Per layer, whether its KV is in the remote tier (never a resident layer); None: none is.
    remote_tier : RemoteSpec, optional
        The remote tier's link and the host memory; needed where a layer is remote.
    run_seconds : float, optional
        The host's fixed cost of the step's scheduler run, added once to the step (>= 0; e.g. a
        one-token step's measured time beyond its copies and compute); 0: left out.

    Returns
    -------
    StepPrediction

    Raises
    ------
    InvalidArgumentError
        For inconsistent lengths, indices or figures, tokens_per_step below 1, a layer both
        resident and remote, a remote layer without a remote_tier, or run_seconds not a finite
        number >= 0.
    """
    p = _problem(layers, devices, layer_device, prefetch, measure=measure, tokens_per_step=tokens_per_step,
                 remote_tier=remote_tier)
    run = _number(run_seconds, "predict_step: run_seconds", "a finite number of seconds >= 0", lambda x: x >= 0)
    resident = _sequence(resident, "resident", "bool")
    if len(resident) != len(p.layers):
        raise InvalidArgumentError(f"predict_step: {len(resident)} entries in resident for {len(p.layers)} layers")
    if remote is not None:
        remote = _sequence(remote, "remote", "bool")
        if len(remote) != len(p.layers):
            raise InvalidArgumentError(f"predict_step: {len(remote)} entries in remote for {len(p.layers)} layers")
        both = [i for i in range(len(remote)) if remote[i] and resident[i]]
        if both:
            raise InvalidArgumentError(f"predict_step: layer {both[0]} is both resident and remote: give one")
        if any(remote) and remote_tier is None:
            raise InvalidArgumentError("predict_step: remote layers need a remote_tier (RemoteSpec): its link "
                                       "prices their pulls")
        p.remote = [bool(r) for r in remote]
    return _prediction(p, [not bool(r) for r in resident], run)


# ---------------------------------------------------------------- refusals

def _short_message(p: _Problem, d: int, host: Sequence[bool], what: str) -> str:
    resident, buffers, inputs = _memory(p, host)
    spec = p.devices[d]
    need = resident[d] + buffers[d] + inputs[d] + spec.reserve
    assert spec.memory is not None
    return (f"{p.name(d)} needs {need} bytes for {what} ({resident[d]} resident, {buffers[d]} of window copies and "
            f"outputs in the scheduler's buffer, {inputs[d]} of the step's inputs, {spec.reserve} reserved) but has "
            f"{spec.memory}: short by {need - spec.memory} bytes")


def _check_windows_fit(p: _Problem) -> None:
    """Refuse a device that cannot hold its split's window copies with every layer in host memory
    (the least any placement holds while a resident layer holds at least its window copies)."""
    all_host = [True] * len(p.layers)
    if _fits(p, all_host):
        return
    _, buffers, inputs = _memory(p, all_host)
    for d, b in enumerate(p.budget):
        if b is not None and buffers[d] + inputs[d] > b:
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
            r, w, inputs = _memory(p, trial)
            over = r[d] + w[d] + inputs[d] - b
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
    """The plan of a placement: its host layers split between host memory and the remote tier
    (_split_remote, where the problem has one), and its prediction; exact and bound as the strategy
    claims them (the planner's, for the devices' placement and the split together)."""
    p.remote = _split_remote(p, host)
    try:
        return ResidencyPlan(strategy, tuple(not h for h in host), tuple(p.dev), p.prefetch, _prediction(p, host),
                             tuple(s.memory for s in p.devices), exact, bound,
                             () if p.remote_tier is None else tuple(p.remote),
                             None if p.remote_tier is None else p.remote_tier.host_memory)
    finally:
        p.remote = [False] * len(host)
