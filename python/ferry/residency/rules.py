"""The rules in use today, as named strategies: first (llama.cpp's --kv-gpu-layers), round-robin, and
slowest-link (devices within 15% of each other grouped)."""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

from .model import (
    MeasureMemory,
    _check_windows_fit,
    _fits,
    _plan,
    _Problem,
    _problem,
    _refuse_empty,
)
from .prediction import ResidencyPlan
from .specs import DeviceSpec, LayerCost, RemoteSpec

#: Devices whose links are within this fraction of the group's slowest count as one (slowest-link).
LINK_GROUP_TOLERANCE = 0.15

def _rule(name: str, choose: Callable[[_Problem], List[bool]], layers: Sequence[LayerCost],
          devices: Sequence[DeviceSpec], layer_device: Optional[Sequence[int]], prefetch: int,
          max_layers: Optional[int], measure: Optional[MeasureMemory], tokens_per_step: float,
          remote_tier: Optional[RemoteSpec] = None) -> ResidencyPlan:
    """A named rule's plan: the problem made and its window copies checked, choose(problem) gives
    each layer's host flag, and a placement with no layer resident is refused."""
    p = _problem(layers, devices, layer_device, prefetch, max_layers, measure, tokens_per_step, remote_tier)
    _check_windows_fit(p)
    host = choose(p)
    _refuse_empty(p, host)
    return _plan(p, name, host)


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


def choose_first(layers: Sequence[LayerCost], devices: Sequence[DeviceSpec],
               layer_device: Optional[Sequence[int]] = None, prefetch: int = 0,
               max_layers: Optional[int] = None, measure: Optional[MeasureMemory] = None,
               tokens_per_step: float = 1.0,
                 remote_tier: Optional[RemoteSpec] = None) -> ResidencyPlan:
    """``first``: the first N layers resident (llama.cpp's --kv-gpu-layers N), N as large as every
    device's budget allows.

    Parameters, return value and errors as `choose_residency`'s.
    """
    def choose(p: _Problem) -> List[bool]:
        host = [True] * len(p.layers)
        for i in range(len(host)):
            host[i] = False
            if not _fits(p, host):
                host[i] = True
                break
        return host

    return _rule("first", choose, layers, devices, layer_device, prefetch, max_layers, measure, tokens_per_step,
                 remote_tier)


def choose_round_robin(layers: Sequence[LayerCost], devices: Sequence[DeviceSpec],
                     layer_device: Optional[Sequence[int]] = None, prefetch: int = 0,
                     max_layers: Optional[int] = None, measure: Optional[MeasureMemory] = None,
                     tokens_per_step: float = 1.0,
                 remote_tier: Optional[RemoteSpec] = None) -> ResidencyPlan:
    """``round-robin``: one layer per device in turn (each device its own layers in order), a device
    stopping at its first layer that does not fit.

    Parameters, return value and errors as `choose_residency`'s.
    """
    return _rule("round-robin", lambda p: _take_in_turn(p, [True] * len(p.layers), [list(range(len(p.devices)))]),
                 layers, devices, layer_device, prefetch, max_layers, measure, tokens_per_step, remote_tier)


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


def choose_slowest_link(layers: Sequence[LayerCost], devices: Sequence[DeviceSpec],
                      layer_device: Optional[Sequence[int]] = None, prefetch: int = 0,
                      max_layers: Optional[int] = None, measure: Optional[MeasureMemory] = None,
                     tokens_per_step: float = 1.0,
                 remote_tier: Optional[RemoteSpec] = None) -> ResidencyPlan:
    """``slowest-link``: the budget spent where the link is slowest. Devices whose links are within
    15% of each other form a group; the slowest group's devices take their layers (in order, one
    device after another in turn) while they fit, then the next group's.

    Parameters, return value and errors as `choose_residency`'s; each DeviceSpec's link_gbps is
    given, or measured by device_from_backend.
    """
    return _rule("slowest-link",
                 lambda p: _take_in_turn(p, [True] * len(p.layers), link_groups([s.link_gbps for s in p.devices])),
                 layers, devices, layer_device, prefetch, max_layers, measure, tokens_per_step, remote_tier)
