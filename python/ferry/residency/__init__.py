"""Where each layer's KV should live: a cost model of one decode step, a planner, and named rules.

A layer's K and V are either resident on the device that runs its attention (no copy, its bytes
held there), in host memory (its windows copied to that device every step, over its link), or,
given a remote tier (RemoteSpec), in another machine's memory (its windows pulled to the host,
then copied to the device: two links).
predict_step models one decode step under such a placement the way the scheduler runs it
(lib/src/sched.c, lib/src/sched-prefetch.c); choose_residency picks the placement, by the
planner ("auto") or by one of the rules in use ("first", "round-robin", "slowest-link"). What the
model leaves out, and the planner's argument, are in docs/design.md ("Which layers to keep").

Everything here is arithmetic on the figures given; layers_from_geometry asks C for a model's
byte figures (a dry-run cache, no memory behind it), StepMemory measures what a step allocates on
each device under a placement (a dry run of it: the scheduler's buffers, as the graph allocator
lays them out), and device_from_backend measures a device's link and reads its memory.
"""


from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence

from ..errors import InvalidArgumentError
from .measure import StepMemory, device_from_backend, layers_from_geometry, measure_compute, measure_token_share
from .model import MeasureMemory, predict_step
from .planner import choose_auto
from .prediction import PlanDoesNotFitError, ResidencyPlan, StepPrediction
from .rules import choose_first, choose_round_robin, choose_slowest_link, link_groups
from .specs import DeviceSpec, LayerCost, RemoteSpec, expected_accepted_tokens, remote_link_model

__all__ = [
    "LayerCost", "DeviceSpec", "StepPrediction", "ResidencyPlan", "PlanDoesNotFitError", "STRATEGIES",
    "predict_step", "choose_residency", "choose_auto", "choose_first", "choose_round_robin", "choose_slowest_link",
    "link_groups", "layers_from_geometry", "device_from_backend", "measure_compute", "measure_token_share",
    "MeasureMemory", "StepMemory",
    "expected_accepted_tokens", "RemoteSpec", "remote_link_model",
]

#: The strategies choose_residency knows, the planner first.
STRATEGIES = ("auto", "first", "round-robin", "slowest-link")

_RULES: Dict[str, Callable[..., ResidencyPlan]] = {
    "auto": choose_auto, "first": choose_first, "round-robin": choose_round_robin, "slowest-link": choose_slowest_link,
}


def choose_residency(strategy: str, layers: Sequence[LayerCost], devices: Sequence[DeviceSpec],
                   layer_device: Optional[Sequence[int]] = None, prefetch: int = 0,
                   max_layers: Optional[int] = None, measure: Optional[MeasureMemory] = None,
                   tokens_per_step: float = 1.0,
                 remote_tier: Optional[RemoteSpec] = None) -> ResidencyPlan:
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
    measure : callable, optional
        What the step allocates on each device under a placement (MeasureMemory; StepMemory
        measures it): a placement fits when that fits, and the plan's memory is it. None: the
        model's least (predict_step), which the allocator may exceed.
    tokens_per_step : float, optional
        Query tokens per stream per step (a draft's verification: draft + 1), as predict_step
        takes it.
    remote_tier : RemoteSpec, optional
        A remote tier behind the host and the host memory: the layers the strategy leaves off the
        devices are split between host memory and the tier (the least pull time that fits the
        host; auto chooses the devices' placement with that split, the named rules without it);
        ResidencyPlan.remote says which are remote.

    Returns
    -------
    ResidencyPlan

    Raises
    ------
    InvalidArgumentError
        For an unknown strategy or inconsistent inputs.
    PlanDoesNotFitError
        When a device cannot hold its split's window copies, no layer fits, or the host memory
        cannot hold a remote pull's staging.
    """
    if not isinstance(strategy, str) or strategy not in _RULES:
        raise InvalidArgumentError(f"choose_residency: unknown strategy {strategy!r}; one of {', '.join(STRATEGIES)}")
    return _RULES[strategy](layers, devices, layer_device, prefetch, max_layers, measure=measure,
                            tokens_per_step=tokens_per_step, remote_tier=remote_tier)
