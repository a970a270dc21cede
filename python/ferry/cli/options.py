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
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, TypeVar

from ..errors import InvalidArgumentError
from ..residency import STRATEGIES
from ..types import Type
from ..workloads.bench import BenchConfig
from ..workloads.common import DEVICES, KV_TYPES, POLICIES
from ..workloads.devices import (
    STANDIN_LINK_GBPS,
    DeviceConfig,
    Place,
    parse_floats,
    parse_indices,
    parse_links,
    parse_placement,
    parse_sizes,
    read_placement,
)
from ..workloads.model_file import ModelGeometry, read_model_geometry

#: The largest count any option takes (a C int): larger numbers are refused with a message.
MAX_COUNT = 2**31 - 1

#: The types a dry run lays a cache out in: every ferry type.
ANY_TYPE = tuple(t.name.lower() for t in Type)

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


def accepts(action: argparse.Action) -> str:
    """What the option action accepts, in words: "flag" for one that takes no value, its choices, what
    its type is marked to accept (accepting), else its metavar."""
    if action.nargs == 0:
        return "flag"
    if action.choices is not None:
        return ", ".join(map(str, action.choices))
    return getattr(action.type, "accepts", None) or str(action.metavar or action.dest.upper())


def default_text(action: argparse.Action) -> Optional[str]:
    """The option action's default as its help and the README write it ("2,4", "on", "off"), or None
    when it has no value to write (its help says in words what happens without it)."""
    value = action.default
    if action.nargs == 0 and not isinstance(action, argparse.BooleanOptionalAction):
        return "off"  # a flag: not given unless given
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    if isinstance(value, float):
        return f"{value:g}"  # 20.0 as the help writes it: 20
    return None if value is None else str(value)


def option_help(action: argparse.Action) -> str:
    """The option action's help as `ferry VERB --help` prints it: its own text, then what it accepts,
    then its default where the text does not say it already."""
    text = action.help or ""
    what = accepts(action)
    if what != "flag" and what not in text:
        text += f"; accepts {what}"
    if "default" not in text:
        default = default_text(action)
        text += " (default: none)" if default is None else f" (default {default})"
    return text


class OptionsHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """A verb's --help: the description and epilog as written, each option's help by option_help."""

    def _get_help_string(self, action: argparse.Action) -> Optional[str]:
        if not action.option_strings or action.help in (None, argparse.SUPPRESS) or action.dest == "help":
            return action.help
        return option_help(action).replace("%", "%%")


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
                          epilog=f"example:\n  {example}", formatter_class=OptionsHelpFormatter)


class Given(argparse.Action):
    """Store an option's value and note that it was given, so that --model does not replace it."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: Optional[str] = None) -> None:
        setattr(namespace, self.dest, values)
        given = set(getattr(namespace, "given", set()))
        given.add(self.dest)
        namespace.given = given


ParseFn = TypeVar("ParseFn", bound=Callable[[str], Any])


def accepting(accepts: str) -> Callable[[ParseFn], ParseFn]:
    """A decorator marking an argparse type with what it accepts, in words: each option's help says it
    (OptionsHelpFormatter) and the README's tables of options repeat it."""

    def mark(parse: ParseFn) -> ParseFn:
        setattr(parse, "accepts", accepts)  # noqa: B010 (an attribute a Callable's type does not declare)
        return parse

    return mark


def count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer from minimum to MAX_COUNT; ArgumentTypeError for anything else
    (argparse names the option in the message)."""

    @accepting(f"integer >= {minimum}")
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


def list_items(text: str, what: str) -> List[str]:
    """The comma-separated items of text, stripped; ArgumentTypeError for none or an empty item
    ("2,,4", "2,"): an empty item is a typo, not a choice."""
    items = [x.strip() for x in text.split(",")]
    if items == [""]:
        raise argparse.ArgumentTypeError(f"expected at least one {what}")
    for i, x in enumerate(items):
        if not x:
            raise argparse.ArgumentTypeError(f"{text!r}: item {i + 1} is empty")
    return items


@accepting("integers >= 1, comma-separated")
def int_list(text: str) -> List[int]:
    """An argparse type: the text "2,4,8" as [2, 4, 8]; ArgumentTypeError for a word that is not an
    integer, a number out of range, an empty item, a number given twice, or no number.
    """
    items = list_items(text, "number")
    try:
        values = [int(x) for x in items]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{text!r} lists a number twice")
    for v in values:
        POSITIVE(str(v))
    return values


@accepting(f"{', '.join(POLICIES)}, comma-separated")
def policy_list(text: str) -> List[str]:
    """An argparse type: the text "flat,ranges" as ["flat", "ranges"] (names are checked when the run
    is, with the other options); ArgumentTypeError for an empty item, a policy given twice, or none.
    """
    return list_items(text, "policy")


@accepting("S0-S1 or S (stream numbers)")
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


def add_shape_args(p: argparse.ArgumentParser, ntg_minimum: int = 0, gate: bool = False) -> None:
    """Add the options that say which windows a verb builds: -c, -npl, -npp, -ntg, --pad.

    Parameters
    ----------
    p : argparse.ArgumentParser
        The verb's parser (table, plan, bench, validate).
    ntg_minimum : int, optional
        The fewest generated tokens the verb takes (a dry run takes 0, a decode run 1).
    gate : bool, optional
        The verb is the hash gate (validate): each -npl is a run of the gate over waves of sequences,
        with prompts of different lengths up to -npp; the help says so.
    """
    d = DEFAULTS
    p.add_argument("-c", type=POSITIVE, default=d.n_ctx, action=Given, metavar="N_CTX",
                   help=f"cells in all streams together, n_ctx / npl each (default {d.n_ctx})"
                        + ("; the gate's cache holds one stream more, the control's" if gate else ""))
    p.add_argument("-npl", type=int_list, default=list(d.npl), metavar="N,N,...",
                   help=("numbers of sequences served at once, one stream each: the gate runs once per number "
                         if gate else "numbers of sequences, one stream each ") +
                        f"(default {','.join(map(str, d.npl))})")
    p.add_argument("-npp", type=POSITIVE, default=d.npp,
                   help=("the longest prompt, in cells: each sequence's prompt is -ntg + 1 to -npp cells, so that "
                         "every stream's range differs " if gate else "prompt cells per sequence ") +
                        f"(default {d.npp})")
    p.add_argument("-ntg", type=count(ntg_minimum), default=d.ntg,
                   help=("tokens generated per sequence, one decode step each, in every wave " if gate else
                         "tokens generated per sequence, one decode step each ") + f"(default {d.ntg})")
    p.add_argument("--pad", type=POSITIVE, default=d.pad,
                   help="round n_kv up to this" + ("; steps of one padded n_kv reuse one graph" if ntg_minimum else "")
                        + f" (llama.cpp: 256; default {d.pad}: exact)")


def type_name(names: Tuple[str, ...]) -> Callable[[str], str]:
    """An argparse type: a type's name, marked as accepting names (the run checks it, with the other
    options, so that its message names the options that clash)."""

    @accepting(", ".join(names))
    def parse(text: str) -> str:
        return text

    return parse


def add_kv_args(p: argparse.ArgumentParser, run: bool, heads_and_layers: Optional[bool] = None) -> None:
    """Add the KV geometry: --type, --head-dim, --kv-heads, and for a run --heads and --layers; then
    --model, which can give them all.

    Parameters
    ----------
    p : argparse.ArgumentParser
        The verb's parser.
    run : bool
        The verb runs attention (bench, validate): --type takes what attention reads, and the verb
        takes query heads and layers.
    heads_and_layers : bool, optional
        Take --heads and --layers (default: run); plan takes them to model a step of any type.
    """
    d = DEFAULTS
    p.add_argument("--type", type=type_name(KV_TYPES if run else ANY_TYPE),
                   default=d.type_kv, metavar="TYPE",
                   help=("K and V type: attention reads these " if run else "K and V type: any ferry type ") +
                        f"(default {d.type_kv})")
    p.add_argument("--head-dim", type=POSITIVE, default=d.head_dim, action=Given,
                   help=f"values per head (default {d.head_dim})")
    p.add_argument("--kv-heads", type=POSITIVE, default=d.n_head_kv, action=Given,
                   help=f"KV heads (default {d.n_head_kv})")
    if run if heads_and_layers is None else heads_and_layers:
        p.add_argument("--heads", type=POSITIVE, default=d.n_head, action=Given,
                       help=f"query heads (default {d.n_head})")
        p.add_argument("--layers", type=POSITIVE, default=d.n_layer, action=Given,
                       help=f"layers (default {d.n_layer})")
    p.add_argument("--model", metavar="FILE.gguf",
                   help="read the KV geometry from a model's GGUF metadata; options given beside it win "
                        "(needs the gguf package)")


@accepting("s or f per layer")
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
                   help="sliding window in cells of the layers --swa-layers marks s (overrides --model's; default: "
                        "--model's, else none)")
    p.add_argument("--swa-layers", type=swa_pattern, metavar="PATTERN",
                   help="one letter per layer: s sliding, f full (e.g. sssssf); with --swa-window (default: --model's, "
                        "else none)")


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


def _argument_type(parse: Callable[[str], Any], accepts: Optional[str] = None) -> Callable[[str], Any]:
    """An argparse type calling parse, its InvalidArgumentError made ArgumentTypeError (argparse then
    names the option); it accepts what accepts says (default: what parse is marked to accept)."""

    @accepting(accepts or str(getattr(parse, "accepts", "")))
    def run(text: str) -> Any:
        try:
            return parse(text)
        except InvalidArgumentError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return run


@accepting("h or a device index per layer, comma-separated; or a file of them")
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
    g.add_argument("--link-gbps", type=_argument_type(parse_links, "0 or numbers from 0.001 to 1e6, comma-separated"),
                   metavar="G,G,...", help="stand-in only: each device's link in GB/s each way, one value for all or "
                                           "one per device; 0: unmodelled, the host's memcpy speed (default "
                                           f"{STANDIN_LINK_GBPS:g}); given, auto means the stand-in")
    g.add_argument("--latency-us", type=_argument_type(lambda t: parse_floats(t, "--latency-us", 0.0, 1e6),
                                                          "numbers from 0 to 1e6, comma-separated"),
                   metavar="U,U,...", help="stand-in only: microseconds each transfer adds, one for all or one per "
                                           "device (default 0)")
    g.add_argument("--device-memory", type=_argument_type(lambda t: parse_sizes(t, "--device-memory"),
                                                             "sizes (64MiB, 1GiB, 500MB, bytes), comma-separated"),
                   metavar="SIZE,...", help="stand-in only: each device's memory, e.g. 64MiB, one for all or one per "
                                            "device (default: the host's)")
    g.add_argument("--compute-slowdown", type=_argument_type(lambda t: parse_floats(t, "--compute-slowdown", 1.0,
                                                                                      1e6),
                                                                "numbers from 1 to 1e6, comma-separated"),
                   metavar="F,F,...", help="stand-in only: each device's compute takes at least F times the host's "
                                           "time (a slower GPU), one for all or one per device (default 1)")
    g.add_argument("--kv-device-layers", type=count(0), metavar="N",
                   help="the first N layers' KV resident on the device that runs them, the others in host memory "
                        "(llama.cpp's --kv-gpu-layers; default: every layer on the host); with --residency, at "
                        "most N layers resident, wherever each strategy puts them")
    if placement:
        g.add_argument("--placement", type=_argument_type(placement_arg), metavar="LIST|FILE",
                       help="where each layer's KV lives, one item per layer: h (host memory) or a device index, "
                            "e.g. h,0,1,h; or a file holding that list (commas or one item per line; default: as "
                            "--kv-device-layers says)")
    g.add_argument("--layer-devices", type=_argument_type(lambda t: parse_indices(t, "--layer-devices"),
                                                             "device indices, comma-separated"),
                   metavar="D,D,...", help="which device runs each layer, one index per layer (default: contiguous "
                                           "ranges)")


def given_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> Set[str]:
    """The dests of the options the verb arguments argv give, read as the verb's parser reads them
    (abbreviations and --option=value included), whatever their values.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The verb's parser.
    argv : sequence of str
        The arguments after the verb.

    Returns
    -------
    set of str
    """
    saved = [(a, a.default) for a in parser._actions]
    try:
        for a, _ in saved:
            a.default = argparse.SUPPRESS
        return set(vars(parser.parse_args(list(argv)))) - {"given"}
    finally:
        for a, default in saved:
            a.default = default


def check_combinations(verb: str, args: argparse.Namespace, given: Set[str]) -> None:
    """Refuse an option that would do nothing beside the others the verb was given.

    Parameters
    ----------
    verb : str
        The verb's name.
    args : argparse.Namespace
        Its parsed options.
    given : set of str
        The dests of the options the command line gave (given_options).

    Raises
    ------
    InvalidArgumentError
        Saying which option does nothing, and what it needs.
    """
    if verb in ("bench", "validate"):
        if "prefetch" in given and not args.overlap:
            needs = "give --overlap too" if verb == "bench" else "leave out --no-overlap"
            raise InvalidArgumentError(f"--prefetch sets how far an overlapped run queues ahead, and no run "
                                       f"overlaps: {needs}")
        if args.compact and set(args.policy) <= {"flat"}:
            raise InvalidArgumentError("--compact adds compact-staging runs of the non-flat policies, and --policy "
                                       f"{','.join(args.policy)} has none")
    if verb == "bench" and args.in_process and (args.repeat == 1 or args.residency is not None):
        why = "with --repeat 1 there is one, made here" if args.repeat == 1 else "--residency runs its placements here"
        raise InvalidArgumentError(f"--in-process keeps a run's replicas in this process, and {why} anyway: leave it "
                                   "out")
    if verb == "plan" and args.v_trans and args.which == "k":
        raise InvalidArgumentError("--v-trans lays V out transposed, and K's window is the same without it: "
                                   "give --which v")


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


@accepting(f"{', '.join(STRATEGIES)}, comma-separated")
def strategy_list(text: str) -> Tuple[str, ...]:
    """An argparse type: "auto,first" as ("auto", "first"), each one of ferry.residency.STRATEGIES;
    ArgumentTypeError for another name, an empty item or none."""
    values = tuple(list_items(text, "strategies"))
    for v in values:
        if v not in STRATEGIES:
            raise argparse.ArgumentTypeError(f"unknown strategy {v!r}; one of {', '.join(STRATEGIES)}")
    return values


def add_residency_args(p: argparse.ArgumentParser, what: str) -> None:
    """Add the residency planner's options (plan, bench) to the verb's parser p: --residency, --reserve,
    --compute-us; what says what --residency does in the verb."""
    g = p.add_argument_group("where each layer's KV should live (the residency planner)")
    g.add_argument("--residency", type=strategy_list, nargs="?", const=STRATEGIES, metavar="S,S,...",
                   help=f"{what}, for each strategy named (auto: the planner; no list: all four); the devices as "
                        "--devices, --link-gbps (measured on the stand-in where not given), --latency-us, "
                        "--device-memory (unlimited where not given), --compute-slowdown and --kv-device-layers say "
                        "(default: not run)")
    g.add_argument("--reserve", type=_argument_type(lambda t: parse_sizes(t, "--reserve"),
                                                       "sizes (64MiB, 1GiB, 500MB, bytes), comma-separated"),
                   metavar="SIZE,...",
                   help="with --residency: device memory set aside for what else it holds, e.g. 1MiB, one for all or "
                        "one per device (default 0)")
    g.add_argument("--compute-us", type=_argument_type(one_float("--compute-us", 0.0, 1e9), "number from 0 to 1e9"),
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
    minutes and gigabytes): -c."""
    return {"heads": lambda g: g.n_head, "kv_heads": lambda g: g.n_head_kv, "head_dim": lambda g: g.head_dim_k,
            "layers": lambda g: g.n_layer}


def check_one_head_dim(g: Optional[ModelGeometry], args: argparse.Namespace) -> None:
    """Raise InvalidArgumentError when the model g's K and V head dims differ and the parsed options
    args do not give --head-dim: a decode run's cache has one head dim for K and V."""
    if g is not None and g.head_dim_k != g.head_dim_v and "head_dim" not in getattr(args, "given", set()):
        raise InvalidArgumentError(f"--model {g.path}: K heads of {g.head_dim_k} and V heads of {g.head_dim_v} "
                                   "values; ferry's decode runs give K and V one head dim: pass --head-dim")

