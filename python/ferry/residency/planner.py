"""The planner (auto): the placement with the least predicted step time within every device's budget
(and a remote tier's host memory, the devices' placement and the host/remote split searched
together); exact serially at any size (with a remote tier, up to JOINT_LIMIT steps), and with
prefetching exact until its search limit, then within a stated bound (docs/design.md, "Which layers
to keep", "Three tiers")."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Dict, List, Optional, Sequence, Tuple

from .model import (
    MeasureMemory,
    _check_windows_fit,
    _fits,
    _least_pull,
    _memory,
    _plan,
    _Problem,
    _problem,
    _pull_seconds,
    _refuse_empty,
    _split_counts,
    _step_time,
)
from .prediction import PlanDoesNotFitError, ResidencyPlan
from .rules import choose_first, choose_round_robin, choose_slowest_link
from .specs import DeviceSpec, LayerCost, RemoteSpec

#: The planner's exact search stops after this many evaluated placements and keeps its best.
DEFAULT_SEARCH_LIMIT = 20_000

#: The serial planner enumerates at most this many count vectors per device (prod(n_kind + 1)).
KIND_LIMIT = 1_000_000

#: With a host memory behind a remote tier, the serial planner's steps at most: each device's count
#: vectors, their combinations with the devices before, and the host/remote splits of what is left.
JOINT_LIMIT = 500_000


def _joint_time(p: _Problem, host: Sequence[bool]) -> float:
    """The step time of a placement on the devices, its other layers split between the host memory
    and a remote tier for the least pull that fits the host (math.inf where none fits): the pulls
    add to the step, so the least pull is the split's best at any prefetch depth."""
    pull = _least_pull(p, host)
    return math.inf if math.isinf(pull) else _step_time(p, host) + pull


def _saving(before: float, after: float) -> float:
    """What a move saves, from the step time before it to after it (either math.inf: no placement
    fits the host memory): all where it makes a placement fit, nothing where neither fits."""
    if math.isinf(after):
        return 0.0 if math.isinf(before) else -math.inf
    return before - after


def _serial_best(p: _Problem, windows_factor: int, limit: int,
                 max_layers: Optional[int] = None) -> Optional[List[bool]]:
    """The serial model's optimum, over counts of interchangeable layers per device.

    Serially a step is sum(compute) + the copies of the host layers, each device's independent of
    the others', and a device's memory depends only on how many of each kind of layer it keeps (a
    kind: the same transfers, resident bytes and staging), its window copies counting
    windows_factor times the largest host layer's staging (or all its layers' outputs, when they
    are more), beside its queries. So each device's best for each number of layers kept is a
    count vector, one count per kind, that saves the most copy time within its budget: an
    enumeration of prod(n_kind + 1) vectors, few where layers come in few sizes. The devices'
    tables are then combined for the most saved with at most max_layers kept in all. None when an
    enumeration is over limit or a device fits nothing.

    With windows_factor 1 that memory is the least a placement needs (serially the largest host
    layer's copies are alive as it computes, and every output at the end): the result is the
    optimum of a relaxation, and where it fits (_fits: measured, with a measure) it is the optimum.
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
        outputs = sum(p.layers[i].output_bytes for i in mine)
        queries = sum(p.layers[i].query_bytes for i in mine)
        table: Dict[int, Tuple[float, int, List[int]]] = {}
        for counts in itertools.product(*(range(len(kinds[k]) + 1) for k in keys)):
            staged = max((k[2] for k, c in zip(keys, counts) if c < len(kinds[k])), default=0)
            used = sum(c * k[1] for k, c in zip(keys, counts)) + max(windows_factor * staged, outputs) + queries
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


def _serial_joint(p: _Problem, limit: int, max_layers: Optional[int] = None) -> Optional[List[bool]]:
    """The serial model's optimum over the devices, the host memory and a remote tier together.

    Serially a step is sum(compute) + the copies of every layer not resident + the remote layers'
    pulls. A layer kept on a device saves its copies and, where the host memory then holds a layer
    that would otherwise go remote, that layer's pull: so the devices' placement and the split are
    chosen together. Layers of a kind (the same transfers, bytes, staging and pull, on one device)
    are interchangeable, so each device's count vectors of its kinds kept within its budget (its
    memory counted as _serial_best counts it, the least a placement needs) are enumerated; the
    devices are combined one after another, keeping for each count of every host kind left (which
    also says how many are kept, for max_layers) the most copies saved; each multiset left is split for
    the least pull that fits the host (_split_counts). As _serial_best's, the result is the
    optimum of a relaxation, the optimum where it fits. None past limit steps (combinations and
    split vectors together), where a device fits nothing, or where no split fits the host."""
    n = len(p.layers)
    Kind = Tuple[Tuple[int, ...], int, int, float, int]  # transfers, resident, staging, pull, pulled
    host_kinds = sorted({(p.layers[i].resident_bytes, _pull_seconds(p, i), p.pulled[i]) for i in range(n)})
    column = {k: j for j, k in enumerate(host_kinds)}
    cap = n if max_layers is None else max_layers
    # layers left per host kind (of the devices so far) -> (most copies saved, each device's counts kept)
    combined: Dict[Tuple[int, ...], Tuple[float, Tuple[Tuple[int, ...], ...]]] = {(0,) * len(host_kinds): (0.0, ())}
    placed = 0  # layers of the devices so far
    kinds_of: List[Tuple[List[Kind], Dict[Kind, List[int]]]] = []
    steps = 0
    for d, budget in enumerate(p.budget):
        mine = [i for i in range(n) if p.dev[i] == d]
        kinds: Dict[Kind, List[int]] = {}
        for i in mine:
            layer = p.layers[i]
            kinds.setdefault((layer.transfers, layer.resident_bytes, layer.staging, _pull_seconds(p, i), p.pulled[i]),
                             []).append(i)
        keys = list(kinds)
        kinds_of.append((keys, kinds))
        placed += len(mine)
        saved = [sum(p.carry[kinds[k][0]]) for k in keys]
        outputs = sum(p.layers[i].output_bytes for i in mine)
        queries = sum(p.layers[i].query_bytes for i in mine)
        table: List[Tuple[float, int, Tuple[int, ...], Tuple[int, ...]]] = []  # saved, kept, left per host kind, counts
        steps += math.prod(len(kinds[k]) + 1 for k in keys)
        if steps > limit:
            return None
        for counts in itertools.product(*(range(len(kinds[k]) + 1) for k in keys)):
            staged = max((k[2] for k, c in zip(keys, counts) if c < len(kinds[k])), default=0)
            used = sum(c * k[1] for k, c in zip(keys, counts)) + max(staged, outputs) + queries
            if budget is None or used <= budget:
                rest = [0] * len(host_kinds)
                for k, c in zip(keys, counts):
                    rest[column[(k[1], k[3], k[4])]] += len(kinds[k]) - c
                table.append((sum(c * g for c, g in zip(counts, saved)), sum(counts), tuple(rest), counts))
        if not table:
            return None
        steps += len(combined) * len(table)
        if steps > limit:
            return None
        nxt: Dict[Tuple[int, ...], Tuple[float, Tuple[Tuple[int, ...], ...]]] = {}
        for left_so_far, (gain, chosen) in combined.items():
            for g, _, left, counts in table:
                state = tuple(a + b for a, b in zip(left_so_far, left))
                if placed - sum(state) > cap:
                    continue
                if state not in nxt or gain + g > nxt[state][0]:
                    nxt[state] = (gain + g, chosen + (counts,))
        combined = nxt
    steps += sum(math.prod(m + 1 for m in left) for left in combined)
    if steps > limit:
        return None
    copies = sum(sum(c) for c in p.carry)
    best: Optional[Tuple[float, int, Tuple[Tuple[int, ...], ...]]] = None  # (time, layers kept, counts)
    for left, (gain, chosen) in combined.items():
        split = _split_counts(p, [(k, m) for k, m in zip(host_kinds, left) if m])
        if split is None:
            continue
        t, kept = copies - gain + split[0], n - sum(left)
        if best is None or (t, kept) < (best[0], best[1]):
            best = (t, kept, chosen)
    if best is None:
        return None
    host = [True] * n
    for (keys, kinds), counts in zip(kinds_of, best[2]):
        for k, c in zip(keys, counts):
            for i in kinds[k][:c]:
                host[i] = False
    return host


def _greedy(p: _Problem) -> List[bool]:
    """From every layer in host memory, keep adding the layer that lowers the step time most per
    byte it adds while one fits (the candidates asked in that order, so that the first that fits
    is taken and the others' memory is not measured)."""
    host = [True] * len(p.layers)
    t = _joint_time(p, host)
    while True:
        ranked: List[Tuple[float, int]] = []
        for i in range(len(host)):
            if host[i]:
                host[i] = False
                ranked.append((-_saving(t, _joint_time(p, host)) / max(1, p.layers[i].resident_bytes), i))
                host[i] = True
        for _, i in sorted(ranked):
            host[i] = False
            if _fits(p, host):
                break
            host[i] = True
        else:
            return host
        t = _joint_time(p, host)


def _local_search(p: _Problem, host: List[bool], passes: int = 20) -> List[bool]:
    """Improve a fitting placement by single moves while one lowers the step time: a layer made
    resident, or a resident layer and a host layer of the same device exchanged."""
    host = list(host)
    t = _joint_time(p, host)
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
            t_new = _joint_time(p, host)
            if t_new < t * (1 - 1e-12) and _fits(p, host):
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
    and its memory lower bound is the model's least for its decided layers alone (a layer decided
    later adds resident bytes or window copies; the decided layers' parts, and so when their
    copies live, do not depend on it); a complete placement must fit (_fits: measured where the
    problem has a measure). With a host memory behind a remote tier, a placement's time is
    _joint_time's, and a partial one's bound adds the least pull of its decided host layers alone
    (the least pull never falls as layers join the host's; math.inf: no completion fits the host).
    Returns the best placement and whether the search ran to its end within limit evaluations."""
    n = len(p.layers)
    best = list(incumbent)
    best_t = _joint_time(p, best)
    host = [False] * n
    evaluated = 0
    complete = True

    def partial_fits(k: int) -> bool:
        if p.max_layers is not None and k - sum(host[:k]) > p.max_layers:
            return False
        trial = host[:k] + [False] * (n - k)
        resident, buffers, inputs = _memory(p, trial, measured=False)
        extra = [0] * len(p.devices)
        for i in range(k, n):
            extra[p.dev[i]] += p.layers[i].resident_bytes  # not held yet: taken back out
        return all(b is None or r - e + w + q <= b for b, r, e, w, q in zip(p.budget, resident, extra, buffers, inputs))

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
        bound = _joint_time(p, host)  # undecided layers (k onwards) resident
        if bound >= best_t:
            return
        if k == n:
            if p.measure is None or _fits(p, host):
                best, best_t = list(host), bound
            return
        host[k] = False
        search(k + 1)
        host[k] = True
        search(k + 1)
        host[k] = False

    search(0)
    return best, complete


def choose_auto(layers: Sequence[LayerCost], devices: Sequence[DeviceSpec],
              layer_device: Optional[Sequence[int]] = None, prefetch: int = 0,
              max_layers: Optional[int] = None, search_limit: int = DEFAULT_SEARCH_LIMIT,
              measure: Optional[MeasureMemory] = None, tokens_per_step: float = 1.0,
                 remote_tier: Optional[RemoteSpec] = None) -> ResidencyPlan:
    """``auto``: the placement with the least predicted step time within every device's budget (and,
    given a remote tier, the host memory).

    Serial (prefetch 0) it is exact at any size where the enumeration's optimum fits: each device's
    best count of each kind of layer (layers of the same size are interchangeable serially),
    enumerated under the least memory a placement needs; where what the step allocates is more
    (the allocator's gaps), the search below is made. With prefetching, where a layer sits in the
    order matters: a branch and bound over layers finds the optimum, stopping
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
    measure : callable, optional
        What the step allocates under a placement (MeasureMemory, e.g. StepMemory); a plan fits
        when that fits. None: the model's least.
    tokens_per_step : float, optional
        Query tokens per stream per step, as predict_step takes it: the copies stay, attention
        grows with them, so prefetching hides more of the copies behind it.
    remote_tier : RemoteSpec, optional
        A remote tier and the host memory: the layers not resident are split between host memory
        and the tier for the least pull time that fits the host (the pulls add to the step, so the
        least sum is the optimum split), and the devices' placement is chosen with it, a layer on a
        device saving its copies and the pull of any layer it leaves the host room for
        (docs/design.md, "Three tiers"): serially over counts of each kind of layer on each device,
        in host memory and remote (exact up to JOINT_LIMIT steps); with prefetching, by the search
        above, its bound then adding the least pull of the layers already in host memory. The
        prefetched search prices the pulls whole where the scheduler hides part of them under
        compute: a prefetched plan with remote layers is the optimum of that upper bound of its
        prediction, and claims neither exact nor a bound.

    Returns
    -------
    ResidencyPlan

    Raises
    ------
    PlanDoesNotFitError
        When a device cannot hold its split's window copies, or no layer fits.
    """
    p = _problem(layers, devices, layer_device, prefetch, max_layers, measure, tokens_per_step, remote_tier)
    _check_windows_fit(p)
    joint = p.remote_tier is not None and p.remote_tier.host_memory is not None  # the split is a choice
    if p.prefetch == 0:
        host = (_serial_joint(p, JOINT_LIMIT, p.max_layers) if joint else
                _serial_best(p, 1, KIND_LIMIT, p.max_layers))
        if host is not None and _fits(p, host):  # the relaxation's optimum fits: it is the optimum
            _refuse_empty(p, host)
            exact = not p.split_inexact
            return _plan(p, "auto", host, exact, 1.0 if exact else math.inf)
    seeds = [_greedy(p), [True] * len(p.layers)]
    conservative = _serial_best(p, p.prefetch + 1, KIND_LIMIT, p.max_layers)
    if conservative is not None:
        seeds.append(conservative)
    for rule in (choose_first, choose_round_robin, choose_slowest_link):
        try:
            seeds.append([not r for r in rule(layers, devices, layer_device, prefetch, max_layers,
                                               measure=p.measure, tokens_per_step=tokens_per_step).resident])
        except PlanDoesNotFitError:
            pass
    feasible = [s for s in seeds if _fits(p, s)]
    incumbent = _local_search(p, min(feasible, key=lambda s: _joint_time(p, s)))
    host, exact = _branch_and_bound(p, incumbent, search_limit)
    _refuse_empty(p, host)
    exact = exact and not p.split_inexact
    # the bound compares with the conservative plan, which must fit as the step allocates it; its
    # proof leaves the pulls out, so with the host/remote split a choice none is claimed
    bound = 1.0 if exact else (1.0 + len(p.devices) if not joint and conservative is not None and
                               _fits(p, conservative) else math.inf)
    plan = _plan(p, "auto", host, exact, bound)
    if p.prefetch and plan.remote_layers():
        # the search prices the pulls whole, and the scheduler hides part of them under compute: the
        # plan is the optimum of that upper bound of the prediction, which claims nothing of it
        return dataclasses.replace(plan, exact=False, bound=math.inf)
    return plan
