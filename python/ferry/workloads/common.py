"""What the decode benchmark, the hash gate and the dry runs share.

The copy policies and K/V types a decode run accepts, the checks of its options, the backend
a split runs on, each sequence's K or V content, and the rounding of a window's n_kv.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Dict, List, Optional, Protocol, Sequence, Tuple, Union

import numpy as np

from ..backend import Backend, StandinBackend
from ..cuda import CUDABackend, cuda_available
from ..errors import InvalidArgumentError
from ..kv import KVCache
from ..policy import CopyPolicy
from ..quant import pack_blocks
from ..types import Type, array_dtype
from .devices import is_decimal, read_option_file

#: The copy policies a decode run compares: every CopyPolicy, by its name.
POLICIES: Tuple[str, ...] = tuple(str(p) for p in CopyPolicy)
#: The K/V types decode attention reads.
KV_TYPES: Tuple[str, ...] = tuple(map(str, Type.attention_types()))
#: The devices a split may run on: auto picks cuda when a device is usable, else cpu (the stand-in).
DEVICES: Tuple[str, ...] = ("auto", "cpu", "cuda")


def check_positive(values: Sequence[Tuple[str, Any]], integer: bool = True) -> None:
    """Raise InvalidArgumentError for the first (name, value) pair whose value is not positive.

    Parameters
    ----------
    values : sequence of (str, object)
        Each option's name as the command line spells it (``"-c"``) and its value.
    integer : bool, optional
        True: the value must also be an int (not a bool), and the message says
        "a positive integer". False: the value is only compared with 0.

    Raises
    ------
    InvalidArgumentError
        Naming the first option that fails, and its value.
    """
    for name, value in values:
        if integer:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")
        elif value <= 0:
            raise InvalidArgumentError(f"{name} must be positive, got {value}")


def check_run_options(type_kv: str, head_dim: int, n_head: int, n_head_kv: int, policies: Sequence[str],
                      device: str) -> None:
    """Check the options the decode benchmark and the hash gate share.

    Parameters
    ----------
    type_kv : str
        The K and V type, one of `KV_TYPES`.
    head_dim, n_head, n_head_kv : int
        Values per head, query heads, KV heads.
    policies : sequence of str
        Copy policies to run, each of `POLICIES`, none twice.
    device : str
        Where the split runs, one of `DEVICES`.

    Raises
    ------
    InvalidArgumentError
        For the first option that cannot run, in the command line's words.
    """
    if type_kv not in KV_TYPES:
        raise InvalidArgumentError(f"--type {type_kv!r}: attention reads {', '.join(KV_TYPES)}")
    if type_kv == "q8_0" and head_dim % Type.Q8_0.blck_size:
        raise InvalidArgumentError(f"--type q8_0 needs --head-dim a multiple of 32, got {head_dim}")
    if n_head % n_head_kv:
        raise InvalidArgumentError(f"--heads {n_head} is not a multiple of --kv-heads {n_head_kv}")
    if not policies:
        raise InvalidArgumentError("--policy: give at least one policy")
    for p in policies:
        if p not in POLICIES:
            raise InvalidArgumentError(f"--policy {p!r}: known policies are {', '.join(POLICIES)}")
    if len(set(policies)) != len(policies):
        raise InvalidArgumentError(f"--policy lists a policy twice: {','.join(policies)}")
    if device not in DEVICES:
        raise InvalidArgumentError(f"--device {device!r}: auto, cpu or cuda")


def check_streams(n_ctx: int, npl: int) -> None:
    """Raise InvalidArgumentError unless n_ctx cells split into npl equal streams.

    Parameters
    ----------
    n_ctx : int
        Cells in all streams together.
    npl : int
        Number of streams (one per sequence).

    Raises
    ------
    InvalidArgumentError
        When npl is not positive or does not divide n_ctx.
    """
    if npl <= 0 or n_ctx % npl != 0:
        raise InvalidArgumentError(f"-npl {npl}: the context of {n_ctx} cells does not split into {npl} "
                                   "equal streams")


def variants(policies: Sequence[str], compact: bool) -> List[Tuple[str, bool]]:
    """The (policy, compact) runs of a set of policies, in report order.

    Parameters
    ----------
    policies : sequence of str
        The copy policies to run.
    compact : bool
        Whether each non-flat policy also runs with compact staging (compact staging gathers
        whatever the policy, so flat has no compact run).

    Returns
    -------
    list of (str, bool)
        Every policy plain, then the non-flat ones compact.
    """
    out = [(p, False) for p in policies]
    if compact:
        out += [(p, True) for p in policies if p != "flat"]
    return out


def prefetch_depths(overlap: bool, prefetch: Sequence[int]) -> Tuple[int, ...]:
    """The Scheduler.prefetch of each run (the residency bench's: one scope).

    Parameters
    ----------
    overlap : bool
        Whether each variant also runs overlapped.
    prefetch : sequence of int
        Parts (layers) an overlapped run queues ahead: one overlapped run per depth.

    Returns
    -------
    tuple of int
        (0,) for the serial run alone; (0, *prefetch) with overlap.
    """
    return (0, *prefetch) if overlap else (0,)


#: --prefetch-next's values: the scopes an overlapped run prefetches over (Scheduler.prefetch_next).
PREFETCH_NEXT = {"on": (True,), "off": (False,), "both": (True, False)}


def prefetch_runs(overlap: bool, prefetch: Sequence[int],
                  prefetch_next: Sequence[bool]) -> Tuple[Tuple[int, bool], ...]:
    """The (Scheduler.prefetch, Scheduler.prefetch_next) of each variant's runs.

    Parameters
    ----------
    overlap : bool
        Whether each variant also runs overlapped.
    prefetch : sequence of int
        Parts (layers) an overlapped run queues ahead: overlapped runs per depth.
    prefetch_next : sequence of bool
        Per depth, a run prefetching across steps (True) and one within each step (False), as given.

    Returns
    -------
    tuple of (int, bool)
        ((0, False),) for the serial run alone; with overlap, each depth with each scope after it.
    """
    runs = [(d, n) for d in prefetch for n in prefetch_next] if overlap else []
    return ((0, False), *runs)


def check_prefetch_next(prefetch_next: Sequence[bool]) -> None:
    """Raise InvalidArgumentError unless prefetch_next is one or two different bools (--prefetch-next).

    Parameters
    ----------
    prefetch_next : sequence of bool
        The scopes overlapped runs take: True across steps, False within each.
    """
    if (not prefetch_next or len(set(prefetch_next)) != len(prefetch_next)
            or not all(isinstance(n, bool) for n in prefetch_next)):
        raise InvalidArgumentError(f"--prefetch-next: expected on, off or both, got {prefetch_next!r}")


def run_name(policy: str, compact: bool, prefetch: int = 0, prefetch_next: bool = True) -> str:
    """A run's name in reports and hashes: the policy, "+compact" for compact staging, "+overlap" when its
    inputs were prefetched one part ahead, "+overlapN" N parts ahead, with "-within" when each step's
    first layer was copied in that step, not under the step before (e.g. "ranges+compact+overlap2-within").

    Parameters
    ----------
    policy : str
    compact : bool
    prefetch : int, optional
        The scheduler's prefetch depth (0: serial).
    prefetch_next : bool, optional
        Whether it prefetched across steps (Scheduler.prefetch_next); only an overlapped run's name says.

    Returns
    -------
    str
    """
    overlap = "" if prefetch <= 0 else ("+overlap" + (str(prefetch) if prefetch > 1 else "")
                                        + ("" if prefetch_next else "-within"))
    return policy + ("+compact" if compact else "") + overlap


#: How each sequence's prompt length is drawn (--lengths): -npp cells each, or seeded uniform draws;
#: a file gives them one by one (read_lengths).
LENGTHS: Tuple[str, ...] = ("equal", "uniform")
#: A run's prompt lengths: one of LENGTHS, or the lengths themselves.
Lengths = Union[str, Tuple[int, ...]]


def read_lengths(path: str, option: str = "--lengths") -> Tuple[int, ...]:
    """The prompt lengths a file holds: integers of plain ASCII digits separated by commas, spaces or
    newlines, read up to devices.MAX_OPTION_FILE bytes.

    Raises
    ------
    InvalidArgumentError
        For a file that cannot be read or is larger, holds no integer, or holds a word that is not
        one ("1_0", "+5", "٣"), naming option, the file, and the word's line.
    """
    values = []
    for number, line in enumerate(read_option_file(path, option).splitlines(), 1):
        for word in line.replace(",", " ").split():
            if not is_decimal(word):
                raise InvalidArgumentError(f"{option} {path}: line {number}: {word!r} is not a length (a prompt "
                                           "length in cells, digits 0-9)")
            values.append(int(word))
    if not values:
        raise InvalidArgumentError(f"{option} {path}: holds no length")
    return tuple(values)


def prompt_lengths(lengths: Lengths, n: int, npp: int, seed: int, low: int = 1) -> List[int]:
    """Each of n sequences' prompt length in cells.

    Parameters
    ----------
    lengths : str or tuple of int
        "equal": npp each; "uniform": drawn uniformly from low..npp, the same for the same seed;
        a tuple: its first n values.
    n : int
        Sequences.
    npp : int
        The longest prompt.
    seed : int
    low : int, optional
        The shortest prompt.

    Returns
    -------
    list of int

    Raises
    ------
    InvalidArgumentError
        For another name, a tuple of fewer than n values or one outside low..npp (naming --lengths).
    """
    if lengths == "equal":
        return [npp] * n
    if lengths == "uniform":
        rng = np.random.default_rng([seed, 35])
        return [int(x) for x in rng.integers(low, npp + 1, size=n)]
    if isinstance(lengths, str):
        raise InvalidArgumentError(f"--lengths {lengths!r}: {', '.join(LENGTHS)} or a file of lengths")
    if len(lengths) < n:
        raise InvalidArgumentError(f"--lengths: {len(lengths)} lengths for {n} sequences: give at least {n}")
    for i, x in enumerate(lengths[:n]):
        if isinstance(x, bool) or not isinstance(x, int) or not low <= x <= npp:
            raise InvalidArgumentError(f"--lengths: sequence {i}'s length {x!r} is outside {low}..{npp} (-npp)")
    return list(lengths[:n])


def n_kv_for(npp: int, ntg: int, pad: int, kv_size: int) -> int:
    """Cells a sequence's window reads.

    Parameters
    ----------
    npp, ntg : int
        Prompt and generated tokens of the sequence.
    pad : int
        The window's length is rounded up to a multiple of this (llama.cpp: 256).
    kv_size : int
        Cells in the sequence's stream: the window never reaches past them.

    Returns
    -------
    int
        npp + ntg rounded up to pad, at most kv_size.
    """
    need = npp + ntg
    return min((need + pad - 1) // pad * pad, kv_size)


@dataclass(frozen=True)
class KVGeometry:
    """The KV cache's geometry: the "the KV geometry" options, shared by the verbs that run steps.

    Attributes
    ----------
    n_layer : int
        Layers.
    type_kv : str
        K and V's type (f32, f16, q8_0).
    n_head, head_dim, n_head_kv : int
        Query heads, values per head, and K/V heads.
    v_trans : bool
        V stored transposed (flash attention off): a gap after every channel row.
    """

    n_layer: int = 2
    type_kv: str = "f16"
    n_head: int = 8
    head_dim: int = 64
    n_head_kv: int = 2
    v_trans: bool = False


@dataclass(frozen=True)
class VariantOptions:
    """Which variants of the copy run (each verb its own defaults).

    Attributes
    ----------
    policies : tuple of str
        Copy policies (plan: as ranges for these windows).
    compact : bool
        Also each non-flat policy with compact staging.
    reuse : bool
        A step whose padded n_kv is the last step's runs the last graph (StepGraph).
    overlap : bool
        Also each variant prefetching its inputs on the copy queue.
    prefetch : tuple of int
        Parts (layers) ahead an overlapped run queues: a run per depth.
    prefetch_next : tuple of bool
        Per depth, a run across steps (True) and/or within each (False).
    """

    policies: Tuple[str, ...] = ("flat", "ranges", "ragged")
    compact: bool = False
    reuse: bool = True
    overlap: bool = False
    prefetch: Tuple[int, ...] = (1,)
    prefetch_next: Tuple[bool, ...] = (True,)


def grouped(cls: Any, groups: Sequence[str], options: Dict[str, Any], base: Any = None) -> Any:
    """A configuration of class cls from options given by flat name: each of its group fields (groups, each a
    dataclass) takes the names of its own fields, over its value in base (default: cls()); the other names go
    to cls itself.

    Raises
    ------
    TypeError
        For a name neither a group nor cls has.
    """
    defaults = cls() if base is None else base
    options = dict(options)
    made = {}
    for name in groups:
        default = getattr(defaults, name)
        made[name] = replace(default, **{f.name: options.pop(f.name) for f in fields(default) if f.name in options})
    return replace(defaults, **made, **options)


class JsonRecord:
    """A dataclass whose as_dict() gives its fields by name, as a verb's --json writes them."""

    def as_dict(self) -> Dict[str, Any]:
        """The fields by name."""
        return asdict(self)  # type: ignore[call-overload]


class RunConfig(Protocol):
    """What start_run needs of a verb's configuration."""

    @property
    def device(self) -> str: ...

    def check(self) -> None: ...


def start_run(cfg: RunConfig) -> Backend:
    """Check a run's options, then make the backend its split runs on.

    Parameters
    ----------
    cfg : BenchConfig or ValidateConfig

    Returns
    -------
    Backend
        split_backend(cfg.device).

    Raises
    ------
    InvalidArgumentError
        For options that cannot run.
    FerryError
        When the split backend cannot be made.
    """
    cfg.check()
    return split_backend(cfg.device)


def split_backend(name: str) -> Backend:
    """The backend attention runs on.

    Parameters
    ----------
    name : str
        ``"cuda"``, ``"cpu"`` (the CPU stand-in device) or ``"auto"`` (cuda when a device is
        usable, else cpu).

    Returns
    -------
    Backend
        A new CUDABackend or StandinBackend.

    Raises
    ------
    InvalidArgumentError
        For another name.
    UnsupportedError, BackendError
        When cuda is asked for and cannot be had.
    """
    if name == "cuda" or (name == "auto" and cuda_available()):
        return CUDABackend()
    if name in ("auto", "cpu"):
        return StandinBackend()
    raise InvalidArgumentError(f"--device {name!r}: auto, cpu or cuda")


def random_rows(type_: Type, cells: int, n_embd: int, seed: Sequence[int]) -> bytes:
    """One sequence's K or V content: random rows determined by a seed.

    Parameters
    ----------
    type_ : Type
        F32, F16 or Q8_0.
    cells : int
        Rows (cells) to make.
    n_embd : int
        Values per row (whole blocks for Q8_0).
    seed : sequence of int
        numpy's seed sequence; the same seed gives the same bytes.

    Returns
    -------
    bytes
        cells rows, each row_size(type_, n_embd) bytes: values drawn uniformly from [-1, 1), or
        for Q8_0 blocks of small positive scales and integers drawn from -127..127.
    """
    rng = np.random.default_rng(list(seed))
    dtype = array_dtype(type_)
    if dtype is None:
        scales = rng.uniform(2.0 ** -9, 2.0 ** -7, size=(cells, n_embd // type_.blck_size)).astype(np.float16)
        return pack_blocks(scales, rng.integers(-127, 128, size=(cells, n_embd)), type_).tobytes()
    return rng.uniform(-1.0, 1.0, size=(cells, n_embd)).astype(dtype).tobytes()


def new_cache(type_: Type, head_dim: int, n_head_kv: int, n_ctx: int, n_stream: int, n_layer: int, v_trans: bool,
              pinned: bool, placement: Optional[Sequence[Optional[Backend]]] = None) -> KVCache:
    """A KV cache, every byte 0: host-resident layers in host memory (pinned for CUDA), each other
    layer in the memory of its placement's device.

    Parameters
    ----------
    type_ : Type
        K and V type.
    head_dim, n_head_kv, n_ctx, n_stream, n_layer : int
    v_trans : bool
    pinned : bool
        Host memory pinned by CUDA.
    placement : sequence of Backend or None, optional
        Per layer, the device holding it (None: host); None: every layer on the host.

    Returns
    -------
    KVCache

    Raises
    ------
    FerryError
        As KVCache raises (OutOfMemoryError for a device without room).
    """
    if placement is not None and all(p is None for p in placement):
        placement = None
    kv = KVCache(type_, type_, head_dim, n_head_kv, n_ctx, n_stream, n_layer, v_trans=v_trans, pinned=pinned,
                 placement=placement)
    cleared = set()
    for layer in range(n_layer):
        buf = kv.layer_buffer(layer)
        if id(buf) not in cleared:
            cleared.add(id(buf))
            buf.clear(0)
    return kv


def write_cells(kv: KVCache, which: str, layer: int, stream: int, cell0: int, data: bytes) -> None:
    """Write rows of cells [cell0, cell0 + n) of a stream of a layer's K ("k") or V ("v"): data holds
    n rows of n_embd_gqa values; a transposed V receives them as one run of cells per channel, the
    channel rows as far apart as the window's channel stride.
    """
    t = kv.k(layer) if which == "k" else kv.v(layer)
    p = kv.params
    if which == "k" or not p.v_trans:
        t.set(data, kv.cell_offset(which, stream, cell0))
        return
    elem = p.type_v.size
    n_embd = p.n_embd_gqa
    cells = len(data) // (n_embd * elem)
    channel = kv.window_layout("v", 1, stream, stream)[1][2]
    runs = np.ascontiguousarray(np.frombuffer(data, np.uint8).reshape(cells, n_embd, elem).transpose(1, 0, 2))
    t.set_2d(runs.tobytes(), kv.cell_offset("v", stream, cell0), cells * elem, n_embd, channel, cells * elem)


def accepted_drafts(seed: int, npl: int, steps: int, draft: int, accept: float) -> np.ndarray:
    """Per step and sequence, the draft tokens verification accepts: the first rejected of draft tokens,
    each accepted with chance accept (a geometric prefix, at most draft), seeded by (seed, npl).

    Parameters
    ----------
    seed, npl : int
        Seed the draws (a run's seed and its number of sequences).
    steps : int
        Verifications.
    draft : int
        Draft tokens each checks.
    accept : float
        Each token's chance, its predecessors accepted.

    Returns
    -------
    numpy.ndarray
        int64 [steps, npl], each 0..draft.
    """
    rng = np.random.default_rng([seed, npl, 43])
    accepted = rng.random((steps, npl, draft)) < accept
    return np.cumprod(accepted, axis=2).sum(axis=2)
