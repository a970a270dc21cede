"""What the cost model gives: its prediction of a step under a placement (StepPrediction), the plan
every strategy returns (ResidencyPlan), and the refusal of a placement that cannot fit
(PlanDoesNotFitError)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import InvalidArgumentError
from .specs import _number


class PlanDoesNotFitError(InvalidArgumentError):
    """A placement cannot fit a device's budget: the message names the device, what it must hold,
    what it has and by how much it is short."""


@dataclass(frozen=True)
class StepPrediction:
    """What the model predicts for one decode step under a placement.

    Attributes
    ----------
    step_seconds : float
        The step's time.
    memory : tuple of int
        Per device: resident_bytes + window_bytes + input_bytes + its reserve.
    resident_bytes : tuple of int
        Per device: the K and V of its resident layers, as the cache allocates them.
    window_bytes : tuple of int
        Per device: the scheduler's buffer on it at its largest. Measured (see `measured`): what
        the allocator reserves for the step's window copies (those prefetching holds ahead of
        the part computing included), attention outputs and other input copies, with any gaps
        its layout leaves. Else the model's least: the most the window copies and outputs hold
        at once.
    copy_seconds : tuple of float
        Per device: the time its link carries the step's windows.
    compute_seconds : float
        The chain of every layer's attention.
    input_bytes : tuple of int
        Per device: the step's own tensors on it beside the scheduler's buffer (its layers'
        queries; measured, the lengths too).
    measured : bool
        Whether the memory is a measurement of what the step allocates (a dry run of it) rather
        than the model's least.
    tokens_per_step : float
        Query tokens each stream brings to the step (predict_step's): one copy of each window
        serves them all, and compute_seconds is for all of them.
    pull_seconds : float
        The remote layers' pulls (remote -> host), all together, the tier's own time on the calling
        thread included (RemoteSpec.host_us); 0 without a remote tier.
    remote_pieces : int
        Pieces the step's pulls read, merged as the tier merges them.
    pulled_bytes : int
        Bytes the step's pulls read, the merged gaps included.
    host_bytes : int
        Host memory the placement holds: the local layers' K and V and the largest pull's staging.
    run_seconds : float
        The host's fixed cost of the step's scheduler run (predict_step's run_seconds), in
        step_seconds.
    """

    step_seconds: float
    memory: Tuple[int, ...]
    resident_bytes: Tuple[int, ...]
    window_bytes: Tuple[int, ...]
    copy_seconds: Tuple[float, ...]
    compute_seconds: float
    input_bytes: Tuple[int, ...] = ()
    measured: bool = False
    tokens_per_step: float = 1.0
    pull_seconds: float = 0.0
    remote_pieces: int = 0
    pulled_bytes: int = 0
    host_bytes: int = 0
    run_seconds: float = 0.0


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
    remote : tuple of bool
        Per layer, whether its KV lives in the remote tier (pulled to host memory, then copied to
        its device each step); empty without a remote tier.
    host_memory : int or None
        The host memory the plan had to fit (RemoteSpec.host_memory).
    """

    strategy: str
    resident: Tuple[bool, ...]
    layer_device: Tuple[int, ...]
    prefetch: int
    prediction: StepPrediction
    budgets: Tuple[Optional[int], ...]
    exact: bool = False
    bound: float = math.inf
    remote: Tuple[bool, ...] = ()
    host_memory: Optional[int] = None

    @property
    def step_seconds(self) -> float:
        """The predicted step time."""
        return self.prediction.step_seconds

    @property
    def memory(self) -> Tuple[int, ...]:
        """Predicted memory per device (resident KV, the scheduler's buffer, the step's inputs, reserve):
        with a measurement (prediction.measured), what a run of the plan holds beside its reserve."""
        return self.prediction.memory

    def tokens_per_second(self, npl: int = 1, accepted: float = 1.0) -> float:
        """Tokens a second the prediction gives: npl sequences, each keeping `accepted` tokens a step.

        Parameters
        ----------
        npl : int, optional
            Sequences decoded together.
        accepted : float, optional
            Tokens each sequence keeps per step: 1 for decode; for a draft's verification the
            expected accepted prefix and the target's token (expected_accepted_tokens), fewer than
            the step's query tokens (prediction.tokens_per_step).

        Returns
        -------
        float

        Raises
        ------
        InvalidArgumentError
            For an npl not a positive integer, or accepted not a finite number > 0.
        """
        if not isinstance(npl, int) or isinstance(npl, bool) or npl < 1:
            raise InvalidArgumentError(f"tokens_per_second: npl must be a positive integer, got {npl!r}")
        kept = _number(accepted, "tokens_per_second: accepted", "a finite number of tokens > 0", lambda x: x > 0)
        return npl * kept / self.step_seconds if self.step_seconds > 0 else math.inf

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

    def remote_layers(self) -> List[int]:
        """The layers whose KV lives in the remote tier."""
        return [i for i, r in enumerate(self.remote) if r]

    def host_layers(self) -> List[int]:
        """The layers whose KV lives in local host memory."""
        return [i for i, r in enumerate(self.resident) if not r and not (self.remote and self.remote[i])]

    def as_dict(self, npl: int = 1, accepted: float = 1.0) -> Dict[str, object]:
        """The plan as data (what a --json output prints): per device its resident layers and
        predicted memory, beside the step time, the step's query tokens per stream, the tokens kept
        per step and tokens/s for npl sequences; with a remote tier, the host's and the remote
        layers, the host memory held and given, and the pulls' time, pieces and bytes.

        Parameters
        ----------
        npl : int, optional
            Sequences decoded together, for tokens_per_second.
        accepted : float, optional
            Tokens each sequence keeps per step, for tokens_per_second.

        Returns
        -------
        dict
        """
        pred = self.prediction
        return {
            "strategy": self.strategy, "prefetch": self.prefetch, "step_seconds": pred.step_seconds,
            "tokens_per_step": pred.tokens_per_step, "accepted_per_step": accepted,
            "tokens_per_second": self.tokens_per_second(npl, accepted), "npl": npl, "exact": self.exact,
            "bound": None if math.isinf(self.bound) else self.bound, "memory_measured": pred.measured,
            "devices": [{"resident_layers": self.resident_layers(d), "memory": pred.memory[d],
                         "resident_bytes": pred.resident_bytes[d], "window_bytes": pred.window_bytes[d],
                         "input_bytes": pred.input_bytes[d] if pred.input_bytes else 0,
                         "copy_seconds": pred.copy_seconds[d], "budget": self.budgets[d]}
                        for d in range(len(self.budgets))],
            **({} if not self.remote else {
                "host_layers": self.host_layers(), "remote_layers": self.remote_layers(),
                "host_bytes": pred.host_bytes, "host_memory": self.host_memory, "pull_seconds": pred.pull_seconds,
                "remote_pieces": pred.remote_pieces, "pulled_bytes": pred.pulled_bytes}),
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
