"""The dry run `ferry residency-plan` runs: each strategy's placement of the KV over the devices.

A model's geometry (each layer at its own size, sliding-window layers holding their window)
gives each layer's window bytes and resident bytes (ferry.residency.layers_from_geometry, a
dry-run cache in synthetic memory), and what the step allocates on each device under a placement
is measured by a dry run of the run's own step (ferry.residency.StepMemory, every window the run
takes): a plan fits when that fits, and its memory is what the run holds. The devices give each a
link (GB/s: given, else the
stand-ins' default; for 0, unmodelled, the host's copy speed measured once with ferry.measure_link),
a latency per transfer, a memory budget and a reserve. Each layer's attention time is given
(--compute-us, every layer alike) or measured once on the stand-in
(ferry.residency.measure_compute, per size of layer); a device with a compute slowdown F
computes F times as long. Each strategy (ferry.residency's planner "auto" and the named rules
"first", "round-robin", "slowest-link") then chooses its placement, and the model predicts its
step time, tokens/s and memory per device. What the model leaves out is in docs/design.md
("Which layers to keep").

With a draft of N tokens verified per step (planner.draft, planner.accept), a step brings N + 1
query tokens per stream: their queries, outputs and new cells are the layers' figures, each
window is copied once for all of them and attention takes N + 1 times its one-token figure
(ferry.residency.predict_step's tokens_per_step), and tokens/s count the tokens a step keeps,
expected_accepted_tokens(N, P) of them (docs/design.md, "Several tokens per copy").
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..backend import StandinBackend
from ..copy_cost import CopyCostModel
from ..errors import InvalidArgumentError
from ..kv import KVCache
from ..link import measure_link
from ..residency import (
    STRATEGIES,
    DeviceSpec,
    LayerCost,
    RemoteSpec,
    ResidencyPlan,
    StepMemory,
    choose_residency,
    expected_accepted_tokens,
    layers_from_geometry,
    measure_compute,
    measure_token_share,
    predict_step,
    remote_link_model,
)
from ..types import row_size, to_type
from .common import KV_TYPES, KVGeometry, grouped, n_kv_for
from .devices import DeviceConfig, split_items, standin_link

__all__ = ["MEASURE", "PlannerOptions", "ResidencyModel", "Windows", "check_strategies", "measure_loopback_link",
           "parse_remote_link", "per_device", "run_windows"]


def run_windows(npp: int, ntg: int, pad: int, kv_size: int, n_tok: int = 1) -> Tuple[int, ...]:
    """The full layers' window (n_kv) of each step of a run of -ntg steps after an -npp prompt, in order,
    each once (a run's steps reuse a graph while their padded window holds). A step of n_tok query
    tokens per stream (a draft's verification) reads its n_tok new cells: step t's stream holds
    npp + t + n_tok cells (the kept prefix grows a cell a step, as a decode run's does)."""
    out: List[int] = []
    for t in range(ntg):
        n_kv = n_kv_for(npp, t + n_tok, pad, kv_size)
        if not out or out[-1] != n_kv:
            out.append(n_kv)
    return tuple(out)


def per_device(values: Sequence[object], n: int, option: str) -> None:
    """Raise InvalidArgumentError unless values holds none, one (for every device) or n values."""
    if len(values) not in (0, 1, n):
        raise InvalidArgumentError(f"{option}: {len(values)} values for {n} devices: give one for all or one per "
                                   "device")


def check_strategies(strategies: Sequence[str]) -> Tuple[str, ...]:
    """The strategies, checked against ferry.residency.STRATEGIES (InvalidArgumentError naming the
    unknown one); empty: all of them."""
    for s in strategies:
        if s not in STRATEGIES:
            raise InvalidArgumentError(f"--strategy: unknown strategy {s!r}; one of {', '.join(STRATEGIES)}")
    return tuple(strategies) or STRATEGIES


def _pick(values: Sequence[float], d: int, default: float) -> float:
    if not values:
        return default
    return values[0] if len(values) == 1 else values[d]


@dataclass(frozen=True)
class Windows:
    """The cache's cells and the windows its steps read, as the residency planner sees them.

    Attributes
    ----------
    n_ctx, n_stream : int
        Cells in all streams, and streams (one per sequence).
    n_kv : int
        Cells a full layer's window reads per stream.
    layer_windows : tuple of (int or None)
        Per layer, its sliding window (None: full attention); one per layer of the model's KVGeometry.
    step_windows : tuple of int
        The full layers' window at each step of a run (run_windows), which the dry run measuring
        the plans' memory allocates in turn; empty: n_kv alone.
    """

    n_ctx: int = 4096
    n_stream: int = 1
    n_kv: int = 264
    layer_windows: Tuple[Optional[int], ...] = (None, None)
    step_windows: Tuple[int, ...] = ()


@dataclass(frozen=True)
class PlannerOptions:
    """How the placements run, and what the planner takes beside the model and the devices (the option
    table's "residency planner" options, and the run's copies).

    Attributes
    ----------
    reserve : tuple of int
        Per device (one for all, or one each): the bytes set aside for what else it holds.
    compact : bool
        Window copies holding only the bytes read.
    prefetch : int
        Parts the scheduler copies ahead (0: serial).
    compute_us : float or None
        Microseconds one layer's attention takes on the host; None: measured on the stand-in.
    max_layers : int or None
        At most this many layers resident, all devices together (--kv-device-layers).
    draft : int
        Draft tokens each step verifies (--draft): a step brings draft + 1 query tokens per stream,
        one copy of each window for all of them; 0: decode, one token.
    accept : float
        Each draft token's acceptance probability (--accept): the tokens a step keeps are
        expected_accepted_tokens(draft, accept).
    remote_link : str or tuple of float or None
        A remote tier behind the host (--remote-link): its figures (microseconds a batch,
        microseconds a piece, GB/s), or "measure" (measured on the loopback, a server process
        holding a layer of this geometry); None: no remote tier.
    host_memory : int or None
        Bytes of host memory for the layers kept local and a pull's staging (--host-memory);
        what does not fit goes remote. None: this machine's memory (with a remote_link).
    """

    reserve: Tuple[int, ...] = ()
    compact: bool = False
    prefetch: int = 0
    compute_us: Optional[float] = None
    max_layers: Optional[int] = None
    draft: int = 0
    accept: float = 1.0
    remote_link: Optional[Union[str, Tuple[float, float, float]]] = None
    host_memory: Optional[int] = None


#: What --remote-link takes beside its figures: the link measured on the loopback.
MEASURE = "measure"


def parse_remote_link(text: str, option: str = "--remote-link") -> Union[str, Tuple[float, float, float]]:
    """A remote link from its text: "measure", or "BATCH_US,PIECE_US,GBPS" (microseconds a batch,
    microseconds a piece, GB/s).

    Raises
    ------
    InvalidArgumentError
        For anything else, naming the option and what it takes.
    """
    if text.strip() == MEASURE:
        return MEASURE
    takes = f"{option}: {MEASURE!r}, or BATCH_US,PIECE_US,GBPS (microseconds a batch, microseconds a piece, GB/s)"
    figures = split_items(text, option)
    if len(figures) != 3:
        raise InvalidArgumentError(f"{takes}; got {text!r}")
    try:
        batch, piece, gbps = (float(x) for x in figures)
    except ValueError:
        raise InvalidArgumentError(f"{takes}; got {text!r}") from None
    try:
        remote_link_model(batch, piece, gbps)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"{option}: {e.message}") from None
    return batch, piece, gbps


def measure_loopback_link(kv: KVGeometry, n_ctx: int, n_stream: int, piece_bytes: int) -> CopyCostModel:
    """The remote link measured on the loopback: a server process holding one layer of this geometry
    (ferry.remote.RemoteTier), its batch, piece and rate fitted (measure_remote_link), as
    CopyCostModel.from_link makes its model.

    Raises
    ------
    InvalidArgumentError
        Where the transfer engine is missing (naming what to install), or the layer is too small
        to measure (naming -c).
    """
    from ..remote import engine_missing  # the engine is an extra: imported where it is asked for
    why = engine_missing()
    if why is not None:
        raise InvalidArgumentError(f"--remote-link {MEASURE}: no transfer engine ({why}); give the link's figures "
                                   "BATCH_US,PIECE_US,GBPS instead")
    from ..remote import RemoteTier, measure_remote_link
    from ..remote.link import PIECES
    cache = KVCache(kv.type_kv, kv.type_kv, kv.head_dim, kv.n_head_kv, n_ctx, n_stream, n_layer=1)
    try:
        least = 32 * max(PIECES)  # measure_remote_link's least read
        if cache.k(0).nbytes < least:
            raise InvalidArgumentError(f"--remote-link {MEASURE}: a layer's K holds {cache.k(0).nbytes} bytes, fewer "
                                       f"than the {least} the measurement reads: raise -c, or give the link's figures")
        with RemoteTier(cache) as tier:
            return CopyCostModel.from_link(measure_remote_link(tier, piece_bytes=max(1, piece_bytes)))
    finally:
        cache.close()


#: ResidencyModel's groups of options, by field name.
_GROUPS = ("kv", "windows", "devices", "planner")


@dataclass(frozen=True)
class ResidencyModel:
    """A model's KV geometry and the devices it runs on, as the residency planner sees them, by concern.

    Attributes
    ----------
    kv : KVGeometry
        K and V's type and the heads (n_head only for measuring compute); its n_layer is the number of
        layer_windows.
    windows : Windows
        The cells, the streams and the windows the steps read.
    devices : DeviceConfig
        The devices (n_devices), and per device (one value for all, or one each) its link (none: the
        stand-ins' default, ferry.workloads.devices.STANDIN_LINK_GBPS; 0: unmodelled, the host's speed),
        latency, memory (none: unlimited) and compute slowdown (default 1); layer_devices: the device
        that runs each layer (None: contiguous ranges, ferry.layer_split); link_profile: every
        device's link a named one (its latency; link_gbps then its peak), which the planner sees as
        its peak and its latency, and residency-bench's stand-ins charge with its piece curve too.
        The planner places the KV: its placement, kv_device_layers and row_ns stay unset.
    planner : PlannerOptions
        Each device's reserve, the run's compact copies and prefetch depth, the compute time, and
        at most how many layers are resident.
    """

    kv: KVGeometry = field(default_factory=KVGeometry)
    windows: Windows = field(default_factory=Windows)
    devices: DeviceConfig = field(default_factory=DeviceConfig)
    planner: PlannerOptions = field(default_factory=PlannerOptions)

    @classmethod
    def of(cls, **options: Any) -> "ResidencyModel":
        """A model from options by their flat names (type_kv, n_ctx, n_devices, reserve, ...), each put in its
        group, the others default (as at() changes them).

        Raises
        ------
        TypeError
            For a name no group has.
        """
        return cls().at(**options)

    def at(self, **changes: Any) -> "ResidencyModel":
        """This model with options changed by their flat names (n_kv=..., prefetch=...), each in its group.
        layer_windows given without n_layer sets the layers to its length; n_layer without layer_windows,
        that many full layers.

        Raises
        ------
        TypeError
            For a name no group has.
        """
        if "layer_windows" in changes and "n_layer" not in changes:
            changes["n_layer"] = len(changes["layer_windows"])
        elif "n_layer" in changes and "layer_windows" not in changes:
            changes["layer_windows"] = (None,) * changes["n_layer"]
        made: ResidencyModel = grouped(type(self), _GROUPS, changes, base=self)
        return made

    @property
    def n_layer(self) -> int:
        """Layers (kv.n_layer)."""
        return self.kv.n_layer

    def check(self) -> None:
        """Raise InvalidArgumentError for figures the planner cannot take."""
        d, p = self.devices, self.planner
        if self.n_layer < 1:
            raise InvalidArgumentError("residency: the model has no layer")
        if len(self.windows.layer_windows) != self.n_layer:
            raise InvalidArgumentError(f"residency: {len(self.windows.layer_windows)} layer windows for "
                                       f"{self.n_layer} layers: give one per layer")
        if d.n_devices < 1:
            raise InvalidArgumentError(f"--devices must be a positive integer, got {d.n_devices!r}")
        if self.kv.n_head_kv < 1 or self.kv.n_head % self.kv.n_head_kv:  # refused here, not by the dry run's step
            raise InvalidArgumentError(f"--heads {self.kv.n_head} is not a multiple of --kv-heads {self.kv.n_head_kv}")
        if d.placement is not None or d.kv_device_layers is not None or d.row_ns:
            raise InvalidArgumentError("residency: the planner places the KV on stand-ins without a row cost: leave "
                                       "devices.placement, devices.kv_device_layers and devices.row_ns unset "
                                       "(planner.max_layers caps the layers it keeps)")
        if d.link_profile is not None and d.latency_us:
            raise InvalidArgumentError(f"--link-profile {d.link_profile} gives each device's latency: leave out "
                                       "--latency-us (--link-gbps gives its peak)")
        for option, values in (("--link-gbps", d.link_gbps), ("--latency-us", d.latency_us),
                               ("--device-memory", d.memory), ("--reserve", p.reserve),
                               ("--compute-slowdown", d.compute_slowdown)):
            per_device(values, d.n_devices, option)
        if p.max_layers is not None and not 0 <= p.max_layers <= self.n_layer:
            raise InvalidArgumentError(f"--kv-device-layers {p.max_layers}: the model has {self.n_layer} layers")
        if p.compute_us is not None and not p.compute_us >= 0:
            raise InvalidArgumentError(f"--compute-us must be >= 0, got {p.compute_us}")
        if isinstance(p.draft, bool) or not isinstance(p.draft, int) or p.draft < 0:
            raise InvalidArgumentError(f"--draft must be an integer >= 0, got {p.draft!r}")
        if not 0 <= p.accept <= 1:
            raise InvalidArgumentError(f"--accept must be from 0 to 1, got {p.accept!r}")
        if p.host_memory is not None and p.remote_link is None:
            raise InvalidArgumentError("--host-memory acts only with --remote-link: a layer goes remote where the host "
                                       "memory cannot hold it; give --remote-link, or leave out --host-memory")
        if p.remote_link is not None and p.remote_link != MEASURE:
            if not isinstance(p.remote_link, tuple) or len(p.remote_link) != 3:
                raise InvalidArgumentError(f"--remote-link: {MEASURE!r} or three figures, got {p.remote_link!r}")
            remote_link_model(*p.remote_link)
        if d.layer_devices is not None and len(d.layer_devices) != self.n_layer:
            raise InvalidArgumentError(f"--layer-devices: {len(d.layer_devices)} items for {self.n_layer} layers: "
                                       "give one per layer")

    @property
    def n_tok(self) -> int:
        """Query tokens per stream each step brings: the draft and the target's own token."""
        return self.planner.draft + 1

    @property
    def accepted_per_step(self) -> float:
        """Tokens each stream keeps per step, expected (ferry.residency.expected_accepted_tokens)."""
        return expected_accepted_tokens(self.planner.draft, self.planner.accept)

    @property
    def kv_size(self) -> int:
        """Cells per stream of a full layer."""
        return self.windows.n_ctx // self.windows.n_stream

    def layer_cells(self, layer: int) -> Optional[int]:
        """Cells per stream a layer holds: min(W + n_tok, kv_size) for a sliding layer (its window and the
        step's new cells), None for a full one."""
        w = self.windows.layer_windows[layer]
        return None if w is None else min(w + self.n_tok, self.kv_size)

    def layer_n_kv(self, layer: int) -> int:
        """Cells per stream the layer's window reads: n_kv, at most what it holds."""
        cells = self.layer_cells(layer)
        return self.windows.n_kv if cells is None else min(self.windows.n_kv, cells)

    def layers(self) -> List[LayerCost]:
        """Each layer's byte figures, from C (ferry.residency.layers_from_geometry), as a stand-in
        device's buffer type places them, with each layer's query and output (n_tok tokens per stream)."""
        kv, w = self.kv, self.windows
        dev = StandinBackend()
        try:
            return layers_from_geometry(kv.type_kv, kv.type_kv, kv.head_dim, kv.n_head_kv, w.n_ctx, w.n_stream, w.n_kv,
                                        list(w.layer_windows), kv.v_trans, self.planner.compact, n_new=self.n_tok,
                                        n_head=kv.n_head, buffer_type=dev.buffer_type)
        finally:
            dev.close()

    def step_memory(self) -> StepMemory:
        """The dry run that measures what a run's step allocates on each device under a placement
        (ferry.residency.StepMemory): this geometry, devices and prefetch depth, the windows of
        step_windows (or n_kv), the `ranges` copy policy, n_tok query tokens per stream. Close it after use."""
        kv, w = self.kv, self.windows
        return StepMemory(kv.type_kv, kv.type_kv, kv.head_dim, kv.n_head_kv, kv.n_head, w.n_ctx, w.n_stream,
                          [self.layer_cells(i) for i in range(self.n_layer)], w.step_windows or (w.n_kv,),
                          self.devices.n_devices, self.devices.layer_devices, kv.v_trans, self.planner.compact,
                          self.planner.prefetch, n_tok=self.n_tok)

    def compute_seconds(self) -> Tuple[float, ...]:
        """Per layer, its attention's seconds on the host: compute_us, or measured once on an
        unmodelled stand-in for each size of layer (the fastest of 3 runs)."""
        if self.planner.compute_us is not None:
            return (self.planner.compute_us * 1e-6,) * self.n_layer
        kv, n_stream = self.kv, self.windows.n_stream
        if kv.type_kv not in KV_TYPES:  # timed by attention, which reads these alone
            raise InvalidArgumentError(f"--type {kv.type_kv}: attention is timed for the plan and reads "
                                       f"{', '.join(KV_TYPES)}; give one, or --compute-us for a plan of any type")
        measured: Dict[int, float] = {}
        out = []
        for layer in range(self.n_layer):
            n_kv = self.layer_n_kv(layer)
            if n_kv not in measured:
                dev = StandinBackend()
                try:
                    # a cache of just the window's cells: attention's time depends on what it reads
                    measured[n_kv] = measure_compute(dev, kv.type_kv, kv.type_kv, kv.head_dim, kv.n_head_kv, kv.n_head,
                                                     n_kv * n_stream, n_stream, n_kv, n_layer=2, runs=3)
                finally:
                    dev.close()
            out.append(measured[n_kv])
        return tuple(out)

    def token_share(self) -> float:
        """The part of a one-token attention each further query token of a step adds on the host
        (DeviceSpec.token_share): 1 for steps of one token or with compute_us given (the linear model),
        else measured once on an unmodelled stand-in over the first layer's window (measure_token_share)."""
        if self.n_tok < 2 or self.planner.compute_us is not None:
            return 1.0
        kv, n_stream, n_kv = self.kv, self.windows.n_stream, self.layer_n_kv(0)
        dev = StandinBackend()
        try:
            return measure_token_share(dev, self.n_tok, kv.type_kv, kv.type_kv, kv.head_dim, kv.n_head_kv, kv.n_head,
                                       n_kv * n_stream, n_stream, n_kv)
        finally:
            dev.close()

    def standin_link(self, d: int) -> float:
        """Device d's stand-in link in GB/s as the runs model it (ferry.workloads.devices.standin_link), or
        with a link_profile its peak (link_gbps's, else the named link's own)."""
        if self.devices.link_profile is not None:
            return self.named_link(d)[0]
        return standin_link(self.devices.link_gbps, d)

    def named_link(self, d: int) -> Tuple[float, float, Optional[Tuple[float, float, float]]]:
        """Device d's named link (devices.link_profile) as (peak GB/s, latency µs, piece curve), as the
        stand-in makes it (StandinBackend's link_profile, at link_gbps's peak where given; its piece_curve).

        Raises
        ------
        InvalidArgumentError
            Without a link_profile, or for a name the stand-in does not know (naming it).
        """
        cfg = self.devices
        if cfg.link_profile is None:
            raise InvalidArgumentError("ResidencyModel.named_link: the devices have no link_profile")
        dev = StandinBackend(link_gbps=_pick(cfg.link_gbps, d, 0.0) or None, link_profile=cfg.link_profile)
        try:
            return dev.link_gbps or 0.0, dev.latency_us, dev.piece_curve
        finally:
            dev.close()

    def latency_us(self, d: int) -> float:
        """Device d's latency in µs: its named link's, else latency_us's (default 0)."""
        if self.devices.link_profile is not None:
            return self.named_link(d)[1]
        return _pick(self.devices.latency_us, d, 0.0)

    def links(self) -> Tuple[float, ...]:
        """Each device's link in GB/s as the planner sees it: its stand-in link, or for 0 (unmodelled)
        the host's copy speed, measured once on an unmodelled stand-in."""
        links = [self.standin_link(d) for d in range(self.devices.n_devices)]
        if 0.0 in links:
            dev = StandinBackend()
            try:
                gbps = measure_link(dev).gbps
            finally:
                dev.close()
            links = [x or gbps for x in links]
        return tuple(links)

    def device_specs(self, compute: Sequence[float], links: Optional[Sequence[float]] = None,
                     token_share: Optional[float] = None) -> List[DeviceSpec]:
        """The devices as the model sees them: compute (per layer, the host's seconds) times each
        device's slowdown, its link (links, else self.links()), latency, memory and reserve, and a named
        link's piece curve, and the host's token_share (given, else self.token_share())."""
        links = self.links() if links is None else links
        share = self.token_share() if token_share is None else token_share
        cfg = self.devices
        out = []
        for d in range(cfg.n_devices):
            slow = max(1.0, _pick(cfg.compute_slowdown, d, 1.0))
            memory = int(_pick(cfg.memory, d, 0)) or None
            curve = self.named_link(d)[2] if cfg.link_profile is not None else None  # small pieces slower
            out.append(DeviceSpec(links[d], self.latency_us(d), tuple(c * slow for c in compute), memory,
                                  int(_pick(self.planner.reserve, d, 0)), f"device {d}", curve, token_share=share))
        return out

    def remote_link(self) -> Optional[CopyCostModel]:
        """The remote link's model (planner.remote_link): from its figures, or measured on the loopback
        (measure_loopback_link, pieces the size of a full layer's window of K per stream); None without
        one."""
        link = self.planner.remote_link
        if link is None:
            return None
        if link == MEASURE:  # pieces of a full layer's window of K in one stream, as its pulls read them
            kv = self.kv
            piece = row_size(to_type(kv.type_kv), kv.head_dim * kv.n_head_kv) * min(self.windows.n_kv, self.kv_size)
            return measure_loopback_link(kv, self.windows.n_ctx, self.windows.n_stream, piece)
        assert isinstance(link, tuple)
        return remote_link_model(*link)

    def remote_spec(self, link: Optional[CopyCostModel]) -> Optional[RemoteSpec]:
        """The remote tier the plans take: link (remote_link()'s) and planner.host_memory, by default
        this machine's memory (host_memory()); None without a link."""
        return None if link is None else RemoteSpec(link, self.host_memory())

    def host_memory(self) -> int:
        """Bytes of host memory the plans may hold: planner.host_memory, or this machine's physical
        memory (os.sysconf)."""
        if self.planner.host_memory is not None:
            return self.planner.host_memory
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))

    def plans(self, strategies: Sequence[str], devices: Sequence[DeviceSpec],
              layers: Optional[Sequence[LayerCost]] = None,
              remote_tier: Optional[RemoteSpec] = None) -> List[ResidencyPlan]:
        """Each strategy's plan on the devices.

        Parameters
        ----------
        strategies : sequence of str
            Of ferry.residency.STRATEGIES.
        devices : sequence of DeviceSpec
            As device_specs() gives them.
        layers : sequence of LayerCost, optional
            Default: layers().
        remote_tier : RemoteSpec, optional
            A remote tier and the host memory (remote_spec()): the layers not on the devices are
            split between host memory and the tier.

        Returns
        -------
        list of ResidencyPlan

        Raises
        ------
        PlanDoesNotFitError
            When a device cannot hold its split's window copies, or no layer fits (the message
            names the device, what it needs and by how much it is short), or the host memory cannot
            hold a pull's staging.

        Each plan fits as the run's step allocates it (step_memory, a dry run), and its memory
        is what the run holds on each device beside the reserve.
        """
        layers = self.layers() if layers is None else layers
        strategies = check_strategies(strategies)
        with self.step_memory() as measure:
            return [choose_residency(s, layers, devices, self.devices.layer_devices, self.planner.prefetch,
                                     self.planner.max_layers, measure, tokens_per_step=self.n_tok,
                                     remote_tier=remote_tier)
                    for s in strategies]

    def predict(self, resident: Sequence[bool], devices: Sequence[DeviceSpec],
                remote: Optional[Sequence[bool]] = None, remote_tier: Optional[RemoteSpec] = None) -> float:
        """The model's step time for a placement (per layer, resident or not; remote or not, with a
        remote tier) on the devices, n_tok query tokens per stream."""
        return predict_step(self.layers(), devices, resident, self.devices.layer_devices,
                            self.planner.prefetch, tokens_per_step=self.n_tok, remote=remote,
                            remote_tier=remote_tier).step_seconds
