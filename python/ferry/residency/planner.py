"""The planner (auto): the placement with the least predicted step time within every device's budget;
exact serially at any size, and with prefetching exact until its search limit, then within a stated
bound (docs/design.md, "Which layers to keep")."""

from __future__ import annotations

import itertools
import math
from typing import Dict, List, Optional, Sequence, Tuple

from .model import (
    DeviceSpec,
    LayerCost,
    MeasureMemory,
    PlanDoesNotFitError,
    RemoteSpec,
    ResidencyPlan,
    _check_windows_fit,
    _fits,
    _memory,
    _plan,
    _Problem,
    _problem,
    _refuse_empty,
    _step_time,
)
from .rules import choose_first, choose_round_robin, choose_slowest_link

#: The planner's exact search stops after this many evaluated placements and keeps its best.
DEFAULT_SEARCH_LIMIT = 20_000

#: The serial planner enumerates at most this many count vectors per device (prod(n_kind + 1)).
KIND_LIMIT = 1_000_000

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


def _greedy(p: _Problem) -> List[bool]:
    """From every layer in host memory, keep adding the layer that lowers the step time most per
    byte it adds while one fits (the candidates asked in that order, so that the first that fits
    is taken and the others' memory is not measured)."""
    host = [True] * len(p.layers)
    t = _step_time(p, host)
    while True:
        ranked: List[Tuple[float, int]] = []
        for i in range(len(host)):
            if host[i]:
                host[i] = False
                ranked.append((-(t - _step_time(p, host)) / max(1, p.layers[i].resident_bytes), i))
                host[i] = True
        for _, i in sorted(ranked):
            host[i] = False
            if _fits(p, host):
                break
            host[i] = True
        else:
            return host
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
            t_new = _step_time(p, host)
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
    problem has a measure). Returns the best placement and whether the search ran to its end
    within limit evaluations."""
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
        bound = _step_time(p, host)  # undecided layers (k onwards) resident
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
    """``auto``: the placement with the least predicted step time within every device's budget.

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
        least sum is the optimum split; docs/design.md, "Three tiers"); the placement on the
        devices is chosen as without it.

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
    if p.prefetch == 0:
        host = _serial_best(p, 1, KIND_LIMIT, p.max_layers)
        if host is not None and _fits(p, host):  # the relaxation's optimum fits: it is the optimum
            _refuse_empty(p, host)
            return _plan(p, "auto", host, True, 1.0)
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
    incumbent = _local_search(p, min(feasible, key=lambda s: _step_time(p, s)))
    host, exact = _branch_and_bound(p, incumbent, search_limit)
    _refuse_empty(p, host)
    # the bound compares with the conservative plan, which must fit as the step allocates it
    bound = 1.0 if exact else (1.0 + len(p.devices) if conservative is not None and _fits(p, conservative)
                               else math.inf)
    return _plan(p, "auto", host, exact, bound)
