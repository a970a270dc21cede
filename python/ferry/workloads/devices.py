"""The devices a decode run spreads its layers over, and where each layer's KV lives.

A run has N devices of one kind (CPU stand-ins, or CUDA device indices 0..N-1). Layer l's
attention runs on device d(l): by default contiguous ranges of layers per device
(ferry.layer_split, llama.cpp's ``-sm layer``), or a map the user gives. Its K and V live in
host memory ("h") or in one device's memory (a device index): a device-resident layer read
by the device holding it copies nothing; a host-resident one is copied to its device every
step. ``kv_device_layers`` N keeps the first N layers resident on the device that runs them
(llama.cpp's ``--kv-gpu-layers``); ``placement`` gives any map.

A stand-in device may model a link (GB/s each way, a latency per transfer), a memory size and
a compute slowdown (its compute takes at least that many times the host's time: a slower GPU
beside a faster one), one value for every device or one per device; unset, it copies at
memcpy's speed with the host's memory and computes at the host's speed. CUDA devices have
their own links, memory and speed: these are refused there.

A placement as text is one item per layer, separated by commas (whitespace around items is
ignored): ``h`` for host memory or a device index, e.g. ``h,0,1,h``. A placement file holds
the same text (newlines may stand for commas), e.g. one item per line.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Tuple, TypeVar

import numpy as np

from ..backend import Backend, StandinBackend
from ..cuda import CUDABackend, cuda_available, cuda_device_count
from ..errors import InvalidArgumentError, OutOfMemoryError

T = TypeVar("T")

#: A layer's placement: None for host memory, else the index of the device that holds it.
Place = Optional[int]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE | re.ASCII)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


#: The most bytes a file an option names (--lengths, --placement) is read for: a list of lengths or
#: places is far smaller; more is refused, not read (a device such as /dev/zero never ends).
MAX_OPTION_FILE = 2**20


def read_option_file(path: str, option: str) -> str:
    """The text of the file that option names, read up to MAX_OPTION_FILE bytes.

    Raises
    ------
    InvalidArgumentError
        For a file that cannot be read, is not UTF-8, or holds more than MAX_OPTION_FILE bytes,
        naming option and the file.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_OPTION_FILE + 1)
    except OSError as e:
        raise InvalidArgumentError(f"{option} {path}: cannot be read ({e.strerror})") from None
    if len(data) > MAX_OPTION_FILE:
        raise InvalidArgumentError(f"{option} {path}: holds more than {MAX_OPTION_FILE // 2**20} MiB, more than "
                                   "any list it could mean; name a file of the list alone")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgumentError(f"{option} {path}: is not UTF-8 text") from None


def is_decimal(word: str) -> bool:
    """Whether word is plain ASCII decimal digits ("10"; not "1_0", "+5", "٣" or "²", which int() or
    str.isdigit() would take)."""
    return word.isascii() and word.isdigit()


def split_items(text: str, option: str) -> List[str]:
    """The comma-separated items of text, stripped.

    Raises
    ------
    InvalidArgumentError
        For no item, or an empty one (naming option and the item's place).
    """
    items = [x.strip() for x in text.split(",")]
    if items == [""]:
        raise InvalidArgumentError(f"{option}: expected a list, got nothing")
    for i, x in enumerate(items):
        if not x:
            raise InvalidArgumentError(f"{option} {text!r}: item {i + 1} is empty")
    return items


def parse_floats(text: str, option: str, low: float, high: float) -> Tuple[float, ...]:
    """"2.45,0.33" as (2.45, 0.33): each a number from low to high.

    Raises
    ------
    InvalidArgumentError
        For an empty item, a word that is not a number, or a number out of range.
    """
    out = []
    for x in split_items(text, option):
        try:
            v = float(x)
        except ValueError:
            raise InvalidArgumentError(f"{option}: {x!r} is not a number") from None
        if not low <= v <= high:  # also refuses nan
            raise InvalidArgumentError(f"{option}: {x} is out of range: {low:g}..{high:g}")
        out.append(v)
    return tuple(out)


def parse_links(text: str, option: str = "--link-gbps") -> Tuple[float, ...]:
    """"8,0.33,0" as (8.0, 0.33, 0.0): stand-in links in GB/s, each 0 (unmodelled: the host's
    memcpy speed) or from 0.001 to 1e6, as StandinBackend takes them.

    Raises
    ------
    InvalidArgumentError
        For an empty item, a word that is not a number, or a number out of range.
    """
    out = parse_floats(text, option, 0.0, STANDIN_MAX)
    for v in out:
        if 0 < v < 1e-3:
            raise InvalidArgumentError(f"{option}: {v:g} is out of range: 0 (unmodelled) or 0.001..{STANDIN_MAX:g}")
    return out


def parse_size(text: str, option: str) -> int:
    """A size in bytes: a number with an optional unit, B, K/KiB (1024), M/MiB, G/GiB, T/TiB, or
    KB, MB, GB, TB (powers of 1000); "64MiB" is 67108864.

    Raises
    ------
    InvalidArgumentError
        For anything else, or a size below 1 byte.
    """
    if text.strip().startswith("-"):
        raise InvalidArgumentError(f"{option}: {text!r} is negative: give a size of at least 1 byte")
    m = _SIZE.match(text)
    if not m or (m.group(3) and not m.group(2)):
        raise InvalidArgumentError(f"{option}: {text!r} is not a size (e.g. 64MiB, 1GiB, 500MB, 1048576)")
    number, prefix, binary, _ = m.groups()
    base = 1000 if prefix and not binary and m.group(4) else 1024
    size = int(float(number) * base ** _POWERS[prefix.lower()])
    if size < 1:
        raise InvalidArgumentError(f"{option}: {text!r} is less than a byte")
    return size


def parse_sizes(text: str, option: str) -> Tuple[int, ...]:
    """"64MiB,1GiB" as the sizes in bytes (see parse_size)."""
    return tuple(parse_size(x, option) for x in split_items(text, option))


def parse_indices(text: str, option: str) -> Tuple[int, ...]:
    """"0,0,1" as (0, 0, 1): device indices, each 0 or more.

    Raises
    ------
    InvalidArgumentError
        For an empty item or one that is not an index.
    """
    out = []
    for x in split_items(text, option):
        if not is_decimal(x):
            raise InvalidArgumentError(f"{option}: {x!r} is not a device index (0, 1, ...)")
        out.append(int(x))
    return tuple(out)


def parse_placement(text: str, option: str = "--placement") -> Tuple[Place, ...]:
    """A placement from its text: per layer ``h`` (host memory, None) or a device index.

    Raises
    ------
    InvalidArgumentError
        For an empty item, or one neither h nor an index.
    """
    out: List[Place] = []
    for x in split_items(text, option):
        if x.lower() == "h":
            out.append(None)
        elif is_decimal(x):
            out.append(int(x))
        else:
            raise InvalidArgumentError(f"{option}: {x!r} is neither h (host) nor a device index")
    return tuple(out)


def read_placement(path: str, option: str = "--placement") -> Tuple[Place, ...]:
    """A placement from a file holding its text (newlines may stand for commas; see parse_placement).

    Raises
    ------
    InvalidArgumentError
        For a file that cannot be read or is larger than MAX_OPTION_FILE, or what parse_placement
        refuses.
    """
    text = read_option_file(path, option)
    lines = [ln.strip().rstrip(",") for ln in text.splitlines() if ln.strip()]
    return parse_placement(",".join(lines), f"{option} {path}")


def placement_name(placement: Sequence[Place]) -> str:
    """A placement as its text: "h,0,1,h"."""
    return ",".join("h" if p is None else str(p) for p in placement)


#: A stand-in's link when none is asked for, GB/s: of the order of a pageable host-to-device
#: copy over PCIe, and below what the development VM's memcpy reaches on the bench's copies
#: (12 to 20 GB/s), so that a copy's time follows its bytes rather than the host's memory,
#: whose speed drifts from one minute to the next on a shared machine (docs/design.md).
STANDIN_LINK_GBPS = 8.0

#: The most a stand-in takes of its link (GB/s), latency (µs), row cost (ns) and compute slowdown, as
#: the C library bounds them (StandinBackend refuses more): every option that sets one reads it here.
STANDIN_MAX = 1e6


@dataclass(frozen=True)
class DeviceConfig:
    """How many devices a run has, their links and memory (stand-ins), which runs each layer and
    where each layer's KV lives.

    Attributes
    ----------
    n_devices : int
        Devices of the run's kind, 1 or more.
    link_gbps : tuple of float
        Per stand-in device, its link in GB/s, one value for all or one per device; 0: unmodelled
        (the host's memcpy speed); empty: STANDIN_LINK_GBPS.
    latency_us : tuple of float
        Per stand-in device, one value for all or one per device; empty: none.
    row_ns : tuple of float
        Per stand-in device, nanoseconds each row of a 2-D transfer adds, one value for all or one
        per device; empty: none.
    memory : tuple of int
        Per stand-in device, bytes it has (one for all, or one per device); empty: the host's.
    compute_slowdown : tuple of float
        Per stand-in device, how many times the host's time its compute takes at least (one for
        all, or one per device); empty: the host's speed.
    kv_device_layers : int or None
        The first this many layers resident on the device that runs them.
    placement : tuple of (int or None), or None
        Per layer, the device holding its KV (None: host); None: every layer on the host.
    layer_devices : tuple of int, or None
        Per layer, the device that runs it; None: contiguous ranges (ferry.layer_split).
    placement_source : str
        What the placement came from, for messages ("--placement h,0" or "--placement FILE").
    link_profile : str or None
        Every stand-in's link a named one from published measurements (StandinBackend's
        link_profile: its latency and piece curve), link_gbps then its peak (empty: the named
        link's own); None: link_gbps, latency_us and row_ns alone.
    """

    n_devices: int = 1
    link_gbps: Tuple[float, ...] = ()
    latency_us: Tuple[float, ...] = ()
    memory: Tuple[int, ...] = ()
    kv_device_layers: Optional[int] = None
    placement: Optional[Tuple[Place, ...]] = None
    layer_devices: Optional[Tuple[int, ...]] = None
    compute_slowdown: Tuple[float, ...] = ()
    row_ns: Tuple[float, ...] = ()
    link_profile: Optional[str] = None

    @property
    def modelled(self) -> bool:
        """Whether a link, a named link, a latency, a row cost, a memory size or a compute slowdown is
        asked for (stand-in options: the default link is not counted)."""
        return bool(self.link_gbps or self.latency_us or self.row_ns or self.memory or self.compute_slowdown or
                    self.link_profile)

    @property
    def placed(self) -> bool:
        """Whether a placement was asked for (--kv-device-layers or --placement)."""
        return self.kv_device_layers is not None or self.placement is not None

    @property
    def default(self) -> bool:
        """One device with no stand-in option, every layer's KV on the host: the run of a verb without
        these options."""
        return self.n_devices == 1 and not self.modelled and not self.placed and self.layer_devices is None

    def check(self, n_layer: int, kind: str) -> None:
        """Raise InvalidArgumentError for options that cannot run with n_layer layers on devices of
        the kind ("auto", "cpu" or "cuda").
        """
        n = self.n_devices
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidArgumentError(f"--devices must be a positive integer, got {n!r}")
        if kind == "cuda" and self.modelled:
            raise InvalidArgumentError("--link-gbps, --link-profile, --latency-us, --row-ns, --device-memory and "
                                       "--compute-slowdown model a stand-in device (--device cpu); a CUDA device has "
                                       "its own link, memory and speed")
        if self.link_profile is not None and (self.latency_us or self.row_ns):
            raise InvalidArgumentError(f"--link-profile {self.link_profile} gives the stand-in's latency and row cost: "
                                       "leave out --latency-us and --row-ns (--link-gbps gives its peak)")
        for option, values in (("--link-gbps", self.link_gbps), ("--latency-us", self.latency_us),
                               ("--row-ns", self.row_ns),
                               ("--device-memory", self.memory), ("--compute-slowdown", self.compute_slowdown)):
            if len(values) not in (0, 1, n):
                raise InvalidArgumentError(f"{option}: {len(values)} values for {n} devices: give one for all "
                                           f"or one per device")
        if self.kv_device_layers is not None and self.placement is not None:
            raise InvalidArgumentError("--kv-device-layers and --placement both say where the KV lives: give one")
        if self.kv_device_layers is not None and not 0 <= self.kv_device_layers <= n_layer:
            raise InvalidArgumentError(f"--kv-device-layers {self.kv_device_layers}: the model has {n_layer} layers")
        for option, items in (("--placement", self.placement), ("--layer-devices", self.layer_devices)):
            if items is None:
                continue
            if len(items) != n_layer:
                raise InvalidArgumentError(f"{option}: {len(items)} items for {n_layer} layers: give one per layer")
            for layer, d in enumerate(items):
                if d is not None and not 0 <= d < n:
                    raise InvalidArgumentError(f"{option}: layer {layer} names device {d}, but --devices {n} "
                                               f"has 0..{n - 1}")
        used = set(self.runs_on(n_layer)) | {d for d in self.places(n_layer) if d is not None}
        idle = [d for d in range(n) if d not in used]
        if idle and self.layer_devices is None:
            raise InvalidArgumentError(f"--devices {n} with {n_layer} layer{'s' if n_layer != 1 else ''}: device "
                                       f"{idle[0]} would run no layer and hold no KV (layers go to the devices in "
                                       f"contiguous ranges): give --layers {n} or more, or fewer devices")
        if idle:
            raise InvalidArgumentError(f"--devices {n}: device {idle[0]} would run no layer and hold no KV: name it "
                                       "in --layer-devices (or --placement), or give fewer devices")

    def runs_on(self, n_layer: int) -> List[int]:
        """Per layer, the index of the device that runs it."""
        if self.layer_devices is not None:
            return list(self.layer_devices)
        return [layer * self.n_devices // n_layer for layer in range(n_layer)]  # ferry.layer_split's map

    def places(self, n_layer: int) -> List[Place]:
        """Per layer, the index of the device holding its KV, or None for host memory."""
        if self.placement is not None:
            return list(self.placement)
        keep = self.kv_device_layers or 0
        runs = self.runs_on(n_layer)
        return [runs[layer] if layer < keep else None for layer in range(n_layer)]

    def describe(self, n_layer: int) -> str:
        """The placement's name: "host" (every layer), "first4" (--kv-device-layers 4), else its text."""
        if self.kv_device_layers is not None:
            return "host" if self.kv_device_layers == 0 else f"first{self.kv_device_layers}"
        places = self.places(n_layer)
        return "host" if all(p is None for p in places) else placement_name(places)

    @staticmethod
    def per_device(values: Tuple[T, ...], d: int) -> Optional[T]:
        """The value of a per-device list for device d (one value stands for all; empty: None)."""
        if not values:
            return None
        return values[0] if len(values) == 1 else values[d]

    def standin_link(self, d: int) -> float:
        """Stand-in d's link in GB/s (standin_link)."""
        return standin_link(self.link_gbps, d)

    def kind(self, kind: str) -> str:
        """The kind of device the run makes, "cpu" or "cuda": auto picks cuda when n_devices CUDA devices
        are usable and no stand-in model is asked for, else cpu."""
        if kind == "auto":
            usable = not self.modelled and cuda_available() and cuda_device_count() >= self.n_devices
            return "cuda" if usable else "cpu"
        return kind

    def make(self, kind: str) -> List[Backend]:
        """The devices, in index order.

        Parameters
        ----------
        kind : str
            "auto", "cpu" (stand-ins, with the link and memory asked for) or "cuda" (indices 0..N-1).

        Returns
        -------
        list of Backend

        Raises
        ------
        InvalidArgumentError
            For fewer CUDA devices than asked for (with CUDA usable), or another kind.
        FerryError
            When a device cannot be made (no CUDA: as CUDABackend raises).
        """
        kind = self.kind(kind)
        if kind == "cuda":
            if self.n_devices > 1 and cuda_available() and cuda_device_count() < self.n_devices:
                raise InvalidArgumentError(f"--devices {self.n_devices}: {cuda_device_count()} CUDA device(s) "
                                           "usable")
            return [CUDABackend(d) for d in range(self.n_devices)]
        if kind != "cpu":
            raise InvalidArgumentError(f"--device {kind!r}: auto, cpu or cuda")
        out: List[Backend] = []
        for d in range(self.n_devices):
            if self.link_profile is not None:  # the named link, at its own peak unless --link-gbps gives one
                out.append(StandinBackend(link_gbps=self.per_device(self.link_gbps, d), link_profile=self.link_profile,
                                          memory=self.per_device(self.memory, d),
                                          compute_slowdown=self.per_device(self.compute_slowdown, d)))
                continue
            out.append(StandinBackend(link_gbps=self.standin_link(d),
                                      latency_us=self.per_device(self.latency_us, d) or 0.0,
                                      row_ns=self.per_device(self.row_ns, d) or 0.0,
                                      memory=self.per_device(self.memory, d),
                                      compute_slowdown=self.per_device(self.compute_slowdown, d)))
        return out


_OUT_OF_MEMORY = re.compile(r"(\d+) bytes asked, (\d+) of its (\d+) bytes free")


@contextmanager
def naming_device_memory(cfg: DeviceConfig) -> Iterator[None]:
    """Within it, a stand-in running out of the memory --device-memory gave it raises
    InvalidArgumentError naming the option and the device (found by its memory size; all of
    them when they share one size), not the C library's message alone.

    Parameters
    ----------
    cfg : DeviceConfig
        The run's devices.

    Raises
    ------
    InvalidArgumentError
        For an OutOfMemoryError of a stand-in whose memory cfg sets.
    """
    try:
        yield
    except OutOfMemoryError as e:
        m = _OUT_OF_MEMORY.search(str(e))
        if not cfg.memory or m is None:
            raise
        asked, free, total = (int(x) for x in m.groups())
        which = [d for d in range(cfg.n_devices) if cfg.per_device(cfg.memory, d) == total]
        if not which:
            raise
        name = f"device {which[0]}" if len(which) == 1 else \
            ("each device" if len(which) == cfg.n_devices else "device " + " or ".join(map(str, which)))
        raise InvalidArgumentError(f"--device-memory: {name} ({total:,} bytes) cannot hold what the run needs "
                                   f"there: {asked:,} bytes asked with {free:,} free; give it more memory") from None


def standin_link(link_gbps: Sequence[float], d: int) -> float:
    """Stand-in d's link in GB/s from a per-device list (one value for all, or one per device): given,
    else STANDIN_LINK_GBPS; 0 for the host's memcpy speed, unmodelled."""
    if not link_gbps:
        return STANDIN_LINK_GBPS
    return link_gbps[0] if len(link_gbps) == 1 else link_gbps[d]


def standard_placements(n_layer: int, n_devices: int, runs_on: Sequence[int],
                        seed: int) -> List[Tuple[str, List[Place]]]:
    """The placements the hash gate compares, by name: every layer on the host ("host"), every layer
    resident on the device that runs it ("device"), the first half of the layers ("firstN", N =
    n_layer // 2, at least 1), every other layer (the odd ones: "alternate"), and a random map
    ("random": each layer on the host or any device, drawn from seed).

    Parameters
    ----------
    n_layer, n_devices : int
    runs_on : sequence of int
        Per layer, the device that runs it.
    seed : int

    Returns
    -------
    list of (str, list of int or None)
    """
    half = max(n_layer // 2, 1)
    rng = np.random.default_rng([seed, 22])
    draw = [int(x) for x in rng.integers(-1, n_devices, size=n_layer)]
    return [
        ("host", [None] * n_layer),
        ("device", list(runs_on)),
        (f"first{half}", [runs_on[layer] if layer < half else None for layer in range(n_layer)]),
        ("alternate", [runs_on[layer] if layer % 2 else None for layer in range(n_layer)]),
        ("random", [None if x < 0 else x for x in draw]),
    ]


__all__ = [
    "MAX_OPTION_FILE",
    "STANDIN_LINK_GBPS",
    "STANDIN_MAX",
    "DeviceConfig",
    "is_decimal",
    "Place",
    "parse_floats",
    "parse_indices",
    "parse_links",
    "parse_placement",
    "parse_size",
    "parse_sizes",
    "placement_name",
    "read_option_file",
    "read_placement",
    "split_items",
    "naming_device_memory",
    "standard_placements",
    "standin_link",
]
