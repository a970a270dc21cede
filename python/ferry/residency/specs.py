"""What the cost model is given: each layer's figures (LayerCost), each device's (DeviceSpec), and
those of a remote tier behind the host (RemoteSpec, remote_link_model); the tokens a draft's
verification yields (expected_accepted_tokens); and the checks that refuse a figure of the wrong
kind, naming it."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

from .._binding import lib
from ..copy_cost import CopyCostModel
from ..errors import InvalidArgumentError, check


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


def _pairs(value: object, what: str) -> List[Tuple[object, object]]:
    """value as a list of pairs: InvalidArgumentError naming the argument for anything else."""
    items = _sequence(value, what, "(offset, bytes) pairs")
    for k, item in enumerate(items):
        if isinstance(item, (str, bytes)) or not isinstance(item, Sequence) or len(item) != 2:
            raise InvalidArgumentError(f"{what}[{k}] is an (offset, bytes) pair, got {item!r}")
    return [(a, b) for a, b in items]


def expected_accepted_tokens(draft: int, accept: float) -> float:
    """Tokens a verification step yields per stream, on average, for a draft of `draft` tokens each
    accepted with probability `accept` (independently, until the first rejected one): the accepted
    prefix is geometric, and the target's own token after it always counts, so
    1 + P + P^2 + ... + P^N = (1 - P^(N + 1)) / (1 - P), and N + 1 at P = 1 (2.77 at N 4, P 0.7).
    One copy of each window serves them all: bytes per token are a step's bytes over this.

    Parameters
    ----------
    draft : int
        Draft tokens per step (N >= 0; 0: a decode step, one token).
    accept : float
        Per-token acceptance probability P, 0 <= P <= 1.

    Returns
    -------
    float
        Between 1 and N + 1.

    Raises
    ------
    InvalidArgumentError
        For a draft not an integer >= 0 or an accept outside [0, 1], naming it.
    """
    if isinstance(draft, bool) or not isinstance(draft, numbers.Integral) or draft < 0:
        raise InvalidArgumentError(f"expected_accepted_tokens: draft is a count of tokens (an integer >= 0), "
                                   f"got {draft!r}")
    p = _number(accept, "expected_accepted_tokens: accept", "a probability (a number from 0 to 1)",
                lambda x: 0 <= x <= 1)
    n = int(draft)
    if p == 1.0:
        return float(n + 1)
    return (1.0 - p ** (n + 1)) / (1.0 - p)


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
        compact staging, the windows' spans without; each copy as the scheduler's buffer places
        it, rounded up to the device's alignment); None: sum(transfers).
    output_bytes : int
        Device bytes its attention output takes in the scheduler's buffer, where it stays to the
        step's end (rounded up to the alignment).
    query_bytes : int
        Device bytes of its query, which lives on its device beside the scheduler's buffer.
    pieces : tuple of tuple of (int, int)
        Per transfer (K's window, V's), the pieces a remote tier pulls it in before merging:
        (offset in the layer's K or V, bytes), as C cuts its copies (ferry_copy_pieces; what
        layers_from_geometry gives). Empty: each transfer one piece of its bytes.

    Raises
    ------
    InvalidArgumentError
        For a field of another kind or out of its range (an empty or negative transfers, a
        negative or fractional count of bytes), naming it.
    """

    transfers: Tuple[int, ...]
    resident_bytes: int
    staging_bytes: Optional[int] = None
    output_bytes: int = 0
    query_bytes: int = 0
    pieces: Tuple[Tuple[Tuple[int, int], ...], ...] = ()

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
        _set(self, "output_bytes", _byte_count(self.output_bytes, "LayerCost: output_bytes"))
        _set(self, "query_bytes", _byte_count(self.query_bytes, "LayerCost: query_bytes"))
        pieces = _sequence(self.pieces, "LayerCost: pieces", "per transfer (offset, bytes) pairs")
        if pieces and len(pieces) != len(self.transfers):
            raise InvalidArgumentError(f"LayerCost: pieces has {len(pieces)} entries for {len(self.transfers)} "
                                       "transfers: give one per transfer, or none")
        checked = tuple(tuple((_byte_count(o, f"LayerCost: pieces[{t}][{k}]'s offset"),
                               _byte_count(n, f"LayerCost: pieces[{t}][{k}]'s bytes"))
                              for k, (o, n) in enumerate(_pairs(w, f"LayerCost: pieces[{t}]")))
                        for t, w in enumerate(pieces))
        for t, window in enumerate(checked):
            for k, (o, n) in enumerate(window):
                if o + n >= 1 << 64:  # C's sizes
                    raise InvalidArgumentError(f"LayerCost: pieces[{t}][{k}] ends past 2^64 bytes ({o} + {n})")
        _set(self, "pieces", checked)

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
    piece_curve : (float, float, float) or None
        The link's piece curve, (floor_gbps, knee_bytes, steepness) as StandinBackend.piece_curve
        gives a named link's: a transfer's bytes then cost what C's curve says
        (CopyCostModel.piece_seconds), a small one at near floor_gbps, rising to link_gbps past
        knee_bytes. None: every transfer's bytes at link_gbps.
    token_share : float
        The part of a layer's one-token attention (compute_s) that each further query token of a
        step adds: a step of T tokens takes compute_s * (1 + (T - 1) * token_share). 1: each token
        costs a one-token step's whole (a kernel that reads the window again for each token); less
        where the tokens share work (the CPU kernel converts each K and V row once for every query of
        the step), as measure_token_share finds it.

    Raises
    ------
    InvalidArgumentError
        For a field of another kind or out of its range (a link_gbps not positive and finite, a
        negative or non-finite time, a negative or fractional count of bytes, a name not a str,
        a piece curve C refuses), naming it. Numbers are kept as float and counts as int.
    """

    link_gbps: float
    latency_us: float = 0.0
    compute_s: Union[float, Tuple[float, ...]] = 0.0
    memory: Optional[int] = None
    reserve: int = 0
    name: str = ""
    piece_curve: Optional[Tuple[float, float, float]] = None
    token_share: float = 1.0

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
        _set(self, "token_share", _number(self.token_share, "DeviceSpec: token_share",
                                          "a finite number >= 0 (of a one-token step's attention)", lambda x: x >= 0))
        if self.piece_curve is not None:
            if isinstance(self.piece_curve, (str, bytes)) or not isinstance(self.piece_curve, Sequence) or \
                    len(self.piece_curve) != 3:
                raise InvalidArgumentError("DeviceSpec: piece_curve is None or (floor_gbps, knee_bytes, steepness), "
                                           f"got {self.piece_curve!r}")
            _set(self, "piece_curve", tuple(_number(x, f"DeviceSpec: piece_curve[{i}]", "a positive finite number",
                                                    lambda v: v > 0) for i, x in enumerate(self.piece_curve)))
            _link_model(self)  # C's bounds on the curve (ferry_copy_cost_model_check)


def _link_model(spec: DeviceSpec) -> CopyCostModel:
    """The cost model of spec's link that prices a transfer's bytes: its bandwidth and its piece curve, if
    any (a floor at or above the bandwidth is no curve)."""
    floor, knee, steep = spec.piece_curve if spec.piece_curve is not None else (0.0, 0.0, 0.0)
    if floor >= spec.link_gbps:
        floor = knee = steep = 0.0
    return CopyCostModel(call_us=0.0, row_ns=0.0, gbps=spec.link_gbps, line_bytes=0, small_row_bytes=0,
                         small_row_efficiency=1.0, wide_pitch_bytes=0, wide_pitch_row_ns=0.0,
                         piece_floor_gbps=floor, piece_knee_bytes=knee, piece_steepness=steep)


@dataclass(frozen=True)
class RemoteSpec:
    """A remote tier behind the host (remote -> host -> device) and the host memory beside it.

    A layer placed remote is pulled every step: its windows' pieces (LayerCost.pieces) merged by
    the link's model as the tier merges them (ferry_copy_pieces_merge), a batch a window that costs
    link.call_us, each piece link.piece_ns and its bytes at its size's rate
    (CopyCostModel.piece_seconds), what the tier predicts of the scheduler's pulls
    (RemoteTier.fetch_layers), plus host_us a window of the tier's own work on the calling thread
    (planning the pull, placing it out of staging); then the same windows are copied
    host -> device on the device's link, as a host layer's are. Host memory holds the K and V of
    the layers kept local (their resident_bytes) and the staging of the pulls in flight (one
    serial; with a prefetch of n, the n + 2 largest).

    Attributes
    ----------
    link : CopyCostModel
        The remote link's model: CopyCostModel.from_link(measure_remote_link(tier)), or one made
        from figures (remote_link_model).
    host_memory : int or None
        Bytes of host memory for the local layers and the staging; None: unlimited (no layer
        need go remote).
    name : str
        What messages call the tier.
    host_us : float
        Microseconds of the tier's own work a window pulled, on the calling thread (PullStats.host_seconds:
        a window's plan and its pieces placed); 0: left out. `ferry residency-bench --remote`
        measures it in each run's warm-up.

    Raises
    ------
    InvalidArgumentError
        For a link that is not a CopyCostModel, a host_memory not a count of bytes or a host_us not a
        finite number >= 0, naming it.
    """

    link: CopyCostModel
    host_memory: Optional[int] = None
    name: str = "remote"
    host_us: float = 0.0

    def __post_init__(self) -> None:
        """Check each field: InvalidArgumentError naming it."""
        if not isinstance(self.link, CopyCostModel):
            raise InvalidArgumentError(f"RemoteSpec: link is a CopyCostModel (CopyCostModel.from_link of "
                                       f"measure_remote_link), got {type(self.link).__name__}")
        if self.host_memory is not None:
            _set(self, "host_memory", _byte_count(self.host_memory, "RemoteSpec: host_memory", "None or "))
        if not isinstance(self.name, str):
            raise InvalidArgumentError(f"RemoteSpec: name is a str, got {type(self.name).__name__}")
        _set(self, "host_us", _number(self.host_us, "RemoteSpec: host_us", "a finite number of microseconds >= 0",
                                      lambda x: x >= 0))


def remote_link_model(batch_us: float, piece_us: float, gbps: float) -> CopyCostModel:
    """A remote link's CopyCostModel from its figures: a batch's microseconds, a piece's
    microseconds, and the rate in GB/s (every piece at it: no size curve).

    Parameters
    ----------
    batch_us, piece_us : float
        Finite, >= 0.
    gbps : float
        Finite, > 0.

    Returns
    -------
    CopyCostModel

    Raises
    ------
    InvalidArgumentError
        For a figure out of its range, naming it.
    """
    call = _number(batch_us, "remote_link_model: batch_us", "a finite number of microseconds >= 0", lambda x: x >= 0)
    piece = _number(piece_us, "remote_link_model: piece_us", "a finite number of microseconds >= 0",
                    lambda x: x >= 0)
    rate = _number(gbps, "remote_link_model: gbps", "a positive finite number of GB/s", lambda x: x > 0)
    model = CopyCostModel(call_us=call, row_ns=piece * 1e3, gbps=rate, line_bytes=0, small_row_bytes=0,
                          small_row_efficiency=1.0, wide_pitch_bytes=0, wide_pitch_row_ns=0.0, piece_ns=piece * 1e3)
    try:  # C's own bounds on a model
        check(lib.ferry_copy_cost_model_check(model._c(), b"remote_link_model"))
    except InvalidArgumentError as e:
        ours = {"call_us": "batch_us", "row_ns": "piece_us", "piece_ns": "piece_us", "gbps": "gbps"}
        named = next((v for k, v in ours.items() if f"model's {k} " in e.message), "a figure")
        raise InvalidArgumentError(f"remote_link_model: {named} is out of range: {e.message}") from None
    return model
