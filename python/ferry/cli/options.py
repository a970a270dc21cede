"""Options and argument types that several verbs share.

An option that several verbs take is defined here once, so it has one name, one meaning, one
set of choices and one default everywhere (tests/python/test_cli.py checks it): the window's
shape (-c, -npl, -npp, -ntg, --pad) and the KV geometry (--type, --head-dim, --kv-heads,
--heads, --layers) default to `ferry bench`'s configuration, which runs in seconds.

--model FILE.gguf fills the KV geometry from a model's metadata (ferry.workloads.model_file). An option
given on the command line beside it wins over the file: `--model m.gguf -c 4096` reads
everything else from the file.

The decode runs (bench, validate) take the devices and where each layer's KV lives: --devices,
--link-gbps, --latency-us, --device-memory, --compute-slowdown, --kv-device-layers, --placement,
--layer-devices (ferry.workloads.devices). `plan --residency` and `bench --residency` take the
same devices (but --placement), and --residency, --reserve, --compute-us (the residency planner,
ferry.workloads.residency_plan).

The dry runs (table, plan) also take the model's sliding-window layers from --model, or by hand
with --swa-window W --swa-layers PATTERN (one letter per layer: s sliding, f full).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ..errors import InvalidArgumentError
from ..residency import STRATEGIES
from ..workloads.bench import BenchConfig
from ..workloads.common import DEVICES, POLICIES
from ..workloads.devices import (
    DeviceConfig,
    Place,
    parse_floats,
    parse_indices,
    parse_placement,
    parse_sizes,
    read_placement,
)
from ..workloads.model_file import ModelGeometry, read_model_geometry

#: The largest count any option takes (a C int): larger numbers are refused with a message.
MAX_COUNT = 2**31 - 1

#: The defaults every verb shares.
DEFAULTS = BenchConfig()


def verb_description(summary: Optional[str], library_doc: Optional[str]) -> str:
    """A verb's --help text: its own one-line summary, then the library module's account of what it
    runs (that module's docstring after its first paragraph).

    Parameters
    ----------
    summary : str or None
        The verb module's docstring (None under python -OO, as is library_doc).
    library_doc : str or None
        The library module's docstring.

    Returns
    -------
    str
    """
    details = (library_doc or "").partition("\n\n")[2]
    return f"{summary or ''}\n\n{details}"


def add_verb_parser(sub: "argparse._SubParsersAction[Any]", verb: str, help: str, summary: Optional[str],
                    example: str, library_doc: Optional[str] = None) -> argparse.ArgumentParser:
    """Add a verb to the `ferry` command's subparsers sub and return its parser.

    Parameters
    ----------
    sub : argparse._SubParsersAction
    verb : str
        The verb's name.
    help : str
        Its line in `ferry --help`.
    summary : str or None
        What it is for: the verb module's docstring, the start of its --help.
    example : str
        A command line that runs it, shown at the end of its --help.
    library_doc : str, optional
        The docstring of the library module it runs; its account of the run follows the summary.

    Returns
    -------
    argparse.ArgumentParser
    """
    return sub.add_parser(verb, help=help, description=verb_description(summary, library_doc),
                          epilog=f"example:\n  {example}", formatter_class=argparse.RawDescriptionHelpFormatter)


class Given(argparse.Action):
    """Store an option's value and note that it was given, so that --model does not replace it."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: Optional[str] = None) -> None:
        setattr(namespace, self.dest, values)
        given = set(getattr(namespace, "given", set()))
        given.add(self.dest)
        namespace.given = given


def count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer from minimum to MAX_COUNT; ArgumentTypeError for anything else
    (argparse names the option in the message)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not minimum <= value <= MAX_COUNT:
            raise argparse.ArgumentTypeError(f"{value} is out of range: {minimum}..{MAX_COUNT}")
        return value

    return parse


POSITIVE = count(1)


def int_list(text: str) -> List[int]:
    """An argparse type: the text "2,4,8" as [2, 4, 8]; ArgumentTypeError for a word that is not an
    integer, or no number.
    """
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    for v in values:
        POSITIVE(str(v))
    return values


def policy_list(text: str) -> List[str]:
    """An argparse type: the text "flat,ranges" as ["flat", "ranges"] (names are checked when the run
    is); ArgumentTypeError for none.
    """
    values = [x.strip() for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError("expected at least one policy")
    return values


def stream_range(text: str) -> Tuple[int, int]:
    """An argparse type: the text "S0-S1" or "S" as (s0, s1); ArgumentTypeError for anything else."""
    parts = text.split("-")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected S0-S1 or S (stream numbers), got {text!r}") from None
    if len(values) == 1:
        return values[0], values[0]
    if len(values) != 2:
        raise argparse.ArgumentTypeError(f"expected S0-S1 or S (stream numbers), got {text!r}")
    return values[0], values[1]


def add_shape_args(p: argparse.ArgumentParser, ntg_minimum: int = 0) -> None:
    """Add the options that say which windows a verb builds: -c, -npl, -npp, -ntg, --pad.

    Parameters
    ----------
    p : argparse.ArgumentParser
        The verb's parser (table, plan, bench).
    ntg_minimum : int, optional
        The fewest generated tokens the verb takes (a dry run takes 0, a benchmark 1).
    """
    d = DEFAULTS
    p.add_argument("-c", type=POSITIVE, default=d.n_ctx, action=Given, metavar="N_CTX",
                   help=f"cells in all streams together (default {d.n_ctx})")
    p.add_argument("-npl", type=int_list, default=list(d.npl), metavar="N,N,...",
                   help=f"numbers of sequences, one stream each (default {','.join(map(str, d.npl))})")
    p.add_argument("-npp", type=POSITIVE, default=d.npp, help=f"prompt cells per sequence (default {d.npp})")
    p.add_argument("-ntg", type=count(ntg_minimum), default=d.ntg,
                   help=f"tokens generated per sequence, one decode step each (default {d.ntg})")
    p.add_argument("--pad", type=POSITIVE, default=d.pad,
                   help=f"round n_kv up to this (llama.cpp: 256; default {d.pad}: exact)")


def add_kv_args(p: argparse.ArgumentParser, run: bool) -> None:
    """Add the KV geometry: --type, --head-dim, --kv-heads, and for a run --heads and --layers; then
    --model, which can give them all.

    Parameters
    ----------
    p : argparse.ArgumentParser
        The verb's parser.
    run : bool
        The verb runs attention (bench, validate): it also takes query heads and layers.
    """
    d = DEFAULTS
    p.add_argument("--type", default=d.type_kv, metavar="TYPE",
                   help=f"K and V type: f32, f16, q8_0 (the dry runs take any ferry type; default {d.type_kv})")
    p.add_argument("--head-dim", type=POSITIVE, default=d.head_dim, action=Given,
                   help=f"values per head (default {d.head_dim})")
    p.add_argument("--kv-heads", type=POSITIVE, default=d.n_head_kv, action=Given,
                   help=f"KV heads (default {d.n_head_kv})")
    if run:
        p.add_argument("--heads", type=POSITIVE, default=d.n_head, action=Given,
                       help=f"query heads (default {d.n_head})")
        p.add_argument("--layers", type=POSITIVE, default=d.n_layer, action=Given,
                       help=f"layers (default {d.n_layer})")
    p.add_argument("--model", metavar="FILE.gguf",
                   help="read the KV geometry from a model's GGUF metadata; options given beside it win "
                        "(needs the gguf package)")


def swa_pattern(text: str) -> List[bool]:
    """An argparse type: one letter per layer, s (sliding) or f (full), as a list of "slides" flags;
    ArgumentTypeError for another letter or none."""
    letters = text.strip().lower()
    if not letters or set(letters) - {"s", "f"}:
        raise argparse.ArgumentTypeError(f"expected one letter per layer, s (sliding) or f (full), got {text!r}")
    return [c == "s" for c in letters]


def add_swa_args(p: argparse.ArgumentParser) -> None:
    """Add --swa-window and --swa-layers (sliding-window layers by hand) to a dry run's parser p."""
    p.add_argument("--swa-window", type=POSITIVE, metavar="W",
                   help="sliding window in cells of the layers --swa-layers marks s (overrides --model's)")
    p.add_argument("--swa-layers", type=swa_pattern, metavar="PATTERN",
                   help="one letter per layer: s sliding, f full (e.g. sssssf); with --swa-window")


def layer_windows(args: argparse.Namespace, g: Optional[ModelGeometry]) -> Optional[List[Optional[int]]]:
    """Each layer's sliding window (None: full) from --swa-window/--swa-layers, else from the model g;
    None when neither gives a sliding layer.

    Raises
    ------
    InvalidArgumentError
        For one of --swa-window and --swa-layers without the other.
    """
    window, pattern = getattr(args, "swa_window", None), getattr(args, "swa_layers", None)
    if (window is None) != (pattern is None):
        raise InvalidArgumentError("--swa-window and --swa-layers go together: give both or neither")
    if window is not None and pattern is not None:
        return [window if slides else None for slides in pattern]
    if g is not None and g.sliding_window_per_layer:
        return g.layer_windows()
    return None


def add_policy_arg(p: argparse.ArgumentParser, what: str) -> None:
    """Add --policy (the copy policies a run compares; what says what for) to the verb's parser p."""
    p.add_argument("--policy", type=policy_list, default=list(DEFAULTS.policies), metavar="P,P,...",
                   help=f"copy policies {what}: {', '.join(POLICIES)} (default {','.join(DEFAULTS.policies)})")


def add_device_arg(p: argparse.ArgumentParser) -> None:
    """Add --device (where a decode run's split runs) to the verb's parser p."""
    p.add_argument("--device", default=DEFAULTS.device, choices=DEVICES,
                   help="where the split runs: cuda, cpu (the stand-in device), auto (cuda when --devices CUDA "
                        "devices are usable and no stand-in link or memory is asked for, else cpu; "
                        f"default {DEFAULTS.device})")


def add_v_trans_arg(p: argparse.ArgumentParser) -> None:
    """Add --v-trans (V stored transposed) to a decode run's parser p."""
    p.add_argument("--v-trans", action="store_true",
                   help="V stored transposed (flash attention off): a gap after every channel row, even unified; "
                        "f32 or f16")


def _argument_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type calling parse, its InvalidArgumentError made ArgumentTypeError (argparse then
    names the option)."""

    def run(text: str) -> Any:
        try:
            return parse(text)
        except InvalidArgumentError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return run


def placement_arg(text: str) -> Tuple[Place, ...]:
    """--placement's value: a file holding the list when text names one, else the list itself."""
    if os.path.exists(text):
        return read_placement(text)
    return parse_placement(text)


def add_devices_args(p: argparse.ArgumentParser, placement: bool = True) -> None:
    """Add the devices and the KV's placement (bench, validate; plan without --placement) to the verb's
    parser p: --devices, --link-gbps, --latency-us, --device-memory, --compute-slowdown,
    --kv-device-layers, --placement (when placement), --layer-devices."""
    d = DeviceConfig()
    g = p.add_argument_group("devices and where the KV lives")
    g.add_argument("--devices", type=POSITIVE, default=d.n_devices, metavar="N",
                   help="devices of the --device kind: N CPU stand-ins, or CUDA devices 0..N-1; layers go to them "
                        f"in contiguous ranges (ferry.layer_split; default {d.n_devices})")
    g.add_argument("--link-gbps", type=_argument_type(lambda t: parse_floats(t, "--link-gbps", 1e-3, 1e6)),
                   metavar="G,G,...", help="stand-in only: each device's link in GB/s each way, one value for all or "
                                           "one per device (default: unmodelled, memcpy's speed); with it auto "
                                           "means the stand-in")
    g.add_argument("--latency-us", type=_argument_type(lambda t: parse_floats(t, "--latency-us", 0.0, 1e6)),
                   metavar="U,U,...", help="stand-in only: microseconds each transfer adds, one for all or one per "
                                           "device (default 0)")
    g.add_argument("--device-memory", type=_argument_type(lambda t: parse_sizes(t, "--device-memory")),
                   metavar="SIZE,...", help="stand-in only: each device's memory, e.g. 64MiB, one for all or one per "
                                            "device (default: the host's)")
    g.add_argument("--compute-slowdown", type=_argument_type(lambda t: parse_floats(t, "--compute-slowdown", 1.0,
                                                                                      1e6)),
                   metavar="F,F,...", help="stand-in only: each device's compute takes at least F times the host's "
                                           "time (a slower GPU), one for all or one per device (default 1)")
    g.add_argument("--kv-device-layers", type=count(0), metavar="N",
                   help="the first N layers' KV resident on the device that runs them, the others in host memory "
                        "(llama.cpp's --kv-gpu-layers; default: every layer on the host); with --residency, at "
                        "most N layers resident, wherever each strategy puts them")
    if placement:
        g.add_argument("--placement", type=_argument_type(placement_arg), metavar="LIST|FILE",
                       help="where each layer's KV lives, one item per layer: h (host memory) or a device index, e.g. "
                            "h,0,1,h; or a file holding that list (commas or one item per line)")
    g.add_argument("--layer-devices", type=_argument_type(lambda t: parse_indices(t, "--layer-devices")),
                   metavar="D,D,...", help="which device runs each layer, one index per layer (default: contiguous "
                                           "ranges)")


def devices_from_args(args: argparse.Namespace) -> DeviceConfig:
    """The DeviceConfig the parsed options args describe (checked by the run's config)."""
    return DeviceConfig(n_devices=args.devices, link_gbps=args.link_gbps or (), latency_us=args.latency_us or (),
                        memory=args.device_memory or (), kv_device_layers=args.kv_device_layers,
                        placement=getattr(args, "placement", None), layer_devices=args.layer_devices,
                        compute_slowdown=args.compute_slowdown or ())


def one_float(option: str, low: float, high: float) -> Callable[[str], float]:
    """A parser of one number from low to high (InvalidArgumentError naming option otherwise)."""

    def parse(text: str) -> float:
        values = parse_floats(text, option, low, high)
        if len(values) != 1:
            raise InvalidArgumentError(f"{option}: one number, got {len(values)}")
        return values[0]

    return parse


def strategy_list(text: str) -> Tuple[str, ...]:
    """An argparse type: "auto,first" as ("auto", "first"), each one of ferry.residency.STRATEGIES;
    ArgumentTypeError for another name or none."""
    values = tuple(x.strip() for x in text.split(",") if x.strip())
    if not values:
        raise argparse.ArgumentTypeError(f"expected strategies separated by commas: {', '.join(STRATEGIES)}")
    for v in values:
        if v not in STRATEGIES:
            raise argparse.ArgumentTypeError(f"unknown strategy {v!r}; one of {', '.join(STRATEGIES)}")
    return values


def add_residency_args(p: argparse.ArgumentParser, what: str) -> None:
    """Add the residency planner's options (plan, bench) to the verb's parser p: --residency, --reserve,
    --compute-us; what says what --residency does in the verb."""
    g = p.add_argument_group("where each layer's KV should live (the residency planner)")
    g.add_argument("--residency", type=strategy_list, nargs="?", const=STRATEGIES, metavar="S,S,...",
                   help=f"{what}, for each strategy named: {', '.join(STRATEGIES)} (auto: the planner; no list: "
                        "all four); the devices as --devices, --link-gbps (default: measured on the stand-in), "
                        "--latency-us, --device-memory (default: unlimited), --compute-slowdown and --kv-device-layers "
                        "say")
    g.add_argument("--reserve", type=_argument_type(lambda t: parse_sizes(t, "--reserve")), metavar="SIZE,...",
                   help="with --residency: device memory set aside for what else it holds, e.g. 1MiB, one for all or "
                        "one per device (default 0)")
    g.add_argument("--compute-us", type=_argument_type(one_float("--compute-us", 0.0, 1e9)),
                   metavar="U", help="with --residency: microseconds one layer's attention takes on the host (default: "
                                     "measured once on the stand-in)")


def apply_model(args: argparse.Namespace, fields: Dict[str, Callable[[ModelGeometry], int]]) -> Optional[ModelGeometry]:
    """With --model, set each option of fields the command line did not give from the model's geometry,
    and say on stderr what was read.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options (changed in place).
    fields : dict
        Option dest -> the geometry's value for it.

    Returns
    -------
    ModelGeometry or None
        None without --model.

    Raises
    ------
    InvalidArgumentError
        For a file that is not a GGUF model.
    UnsupportedError
        Without the gguf package.
    """
    if not getattr(args, "model", None):
        return None
    g = read_model_geometry(args.model)
    given: Set[str] = getattr(args, "given", set())
    taken = []
    for dest, value_of in fields.items():
        if dest not in given:
            setattr(args, dest, value_of(g))
            taken.append(f"{dest.replace('_', '-')} {getattr(args, dest)}")
    print(f"ferry: {g.path} ({g.architecture}): {', '.join(taken) or 'nothing taken: every option was given'}",
          file=sys.stderr)
    return g


def run_fields() -> Dict[str, Callable[[ModelGeometry], int]]:
    """What --model gives a decode run (bench, validate): its heads, head dim, KV heads and layers. Not
    the context length: a run's cache size is the run's choice (a model's whole context would take
    minutes and gigabytes), -c for bench and --cells for validate."""
    return {"heads": lambda g: g.n_head, "kv_heads": lambda g: g.n_head_kv, "head_dim": lambda g: g.head_dim_k,
            "layers": lambda g: g.n_layer}


def check_one_head_dim(g: Optional[ModelGeometry], args: argparse.Namespace) -> None:
    """Raise InvalidArgumentError when the model g's K and V head dims differ and the parsed options
    args do not give --head-dim: a decode run's cache has one head dim for K and V."""
    if g is not None and g.head_dim_k != g.head_dim_v and "head_dim" not in getattr(args, "given", set()):
        raise InvalidArgumentError(f"--model {g.path}: K heads of {g.head_dim_k} and V heads of {g.head_dim_v} "
                                   "values; ferry's decode runs give K and V one head dim: pass --head-dim")

