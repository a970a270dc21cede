"""The argument types the options take, and what several verbs do with their parsed options.

What each option is, what it takes and when it acts is in the one table of options
(ferry.cli.option_table); this module holds the parsers of their values (each marked with what it
accepts, in words) and the steps the verbs share: --model's geometry, the devices, the sliding
layers. --model FILE.gguf fills the KV geometry from a model's metadata
(ferry.workloads.model_file); an option given on the command line beside it wins.
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple, TypeVar, Union

from ..errors import InvalidArgumentError, OutOfBoundsError
from ..residency import STRATEGIES
from ..types import Type
from ..workloads.bench_config import BenchConfig
from ..workloads.common import LENGTHS, POLICIES, read_lengths
from ..workloads.devices import MAX_OPTION_FILE, DeviceConfig, Place, parse_floats, parse_placement, read_placement
from ..workloads.model_file import ModelGeometry, read_model_geometry

#: The largest count any option takes (a C int): larger numbers are refused with a message.
MAX_COUNT = 2**31 - 1

#: The types a dry run lays a cache out in: every ferry type.
ANY_TYPE = tuple(t.name.lower() for t in Type)

#: The defaults every verb shares, by the option names --json's "config" gives them (BenchConfig.as_dict).
DEFAULTS = SimpleNamespace(**BenchConfig().options())


class Given(argparse.Action):
    """Store an option's value and note that it was given, so that --model does not replace it."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: Optional[str] = None) -> None:
        setattr(namespace, self.dest, values)
        given = set(getattr(namespace, "given", set()))
        given.add(self.dest)
        namespace.given = given


ParseFn = TypeVar("ParseFn", bound=Callable[[str], Any])


def accepting(accepts: str, words: bool = False) -> Callable[[ParseFn], ParseFn]:
    """A decorator marking an argparse type with what it accepts, in words: docs/cli.md says it, and
    `--help` too where words is true (it takes names its metavar does not show: --type's, --lengths')."""

    def mark(parse: ParseFn) -> ParseFn:
        setattr(parse, "accepts", accepts)  # noqa: B010 (an attribute a Callable's type does not declare)
        setattr(parse, "words", words)  # noqa: B010
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


@accepting(f"{', '.join(POLICIES)}, comma-separated", words=True)
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


def type_name(names: Tuple[str, ...]) -> Callable[[str], str]:
    """An argparse type: a type's name, marked as accepting names (the run checks it, with the other
    options, so that its message names the options that clash)."""

    @accepting(", ".join(names), words=True)
    def parse(text: str) -> str:
        return text

    return parse


@accepting("s or f per layer")
def swa_pattern(text: str) -> List[bool]:
    """An argparse type: one letter per layer, s (sliding) or f (full), as a list of "slides" flags;
    ArgumentTypeError for another letter or none."""
    letters = text.strip().lower()
    if not letters or set(letters) - {"s", "f"}:
        raise argparse.ArgumentTypeError(f"expected one letter per layer, s (sliding) or f (full), got {text!r}")
    return [c == "s" for c in letters]


def layer_windows(args: argparse.Namespace, g: Optional[ModelGeometry]) -> Optional[List[Optional[int]]]:
    """Each layer's sliding window (None: full) from --swa-window/--swa-layers (the option table
    takes them only together), else from the model g; None when neither gives a sliding layer."""
    window, pattern = getattr(args, "swa_window", None), getattr(args, "swa_layers", None)
    if window is not None and pattern is not None:
        return [window if slides else None for slides in pattern]
    if g is not None and g.sliding_window_per_layer:
        return g.layer_windows()
    return None


def argument_type(parse: Callable[[str], Any], accepts: Optional[str] = None) -> Callable[[str], Any]:
    """An argparse type calling parse, its InvalidArgumentError made ArgumentTypeError (argparse then
    names the option); it accepts what accepts says (default: what parse is marked to accept)."""

    @accepting(accepts or str(getattr(parse, "accepts", "")), bool(getattr(parse, "words", False)))
    def run(text: str) -> Any:
        try:
            return parse(text)
        except InvalidArgumentError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return run


@accepting(f"h or a device index per layer, comma-separated; or a file of them (at most {MAX_OPTION_FILE // 2**20} "
           "MiB)")
def placement_arg(text: str) -> Tuple[Place, ...]:
    """--placement's value: a file holding the list when text names one, else the list itself.

    Raises
    ------
    InvalidArgumentError
        For a list that does not parse, saying so; for one word that is neither a file nor a
        placement, saying that no such file exists.
    """
    if os.path.exists(text):
        return read_placement(text)
    try:
        return parse_placement(text)
    except InvalidArgumentError:
        if "," in text or not text.strip():
            raise
        raise InvalidArgumentError(f"no file {text!r}, and it is not a list of h (host) or device indices "
                                   "either") from None


@accepting(f"{', '.join(LENGTHS)}, or a file of lengths (at most {MAX_OPTION_FILE // 2**20} MiB)")  # --help names them
def lengths_arg(text: str) -> Union[str, Tuple[int, ...]]:
    """--lengths' value: equal or uniform, else a file holding the lengths (common.read_lengths)."""
    if text in LENGTHS:
        return text
    if not os.path.exists(text):
        raise InvalidArgumentError(f"{text!r} is neither {' nor '.join(LENGTHS)} nor a file of lengths")
    return read_lengths(text)


def given_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> Dict[str, str]:
    """The dests of the options the verb arguments argv give, read as the verb's parser reads them
    (abbreviations and --option=value included), whatever their values, each with the spelling given
    (in full where abbreviated): a message names an option as the command line wrote it.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The verb's parser.
    argv : sequence of str
        The arguments after the verb.

    Returns
    -------
    dict of str to str
        dest -> spelling ("unified" -> "--no-unified").
    """
    saved = [(a, a.default) for a in parser._actions]
    try:
        for a, _ in saved:
            a.default = argparse.SUPPRESS
        dests = set(vars(parser.parse_args(list(argv)))) - {"given"}
    finally:
        for a, default in saved:
            a.default = default
    spelled: Dict[str, str] = {}
    for word in argv:  # read as the parser did: a value is not taken for an option (its _parse_optional)
        found = parser._parse_optional(word)
        if isinstance(found, list):  # newer Pythons give every reading, (action, spelling, ...) each
            found = found[0] if found else None
        if found is not None and found[0] is not None:
            spelled[found[0].dest] = found[1]
    return {dest: spelled.get(dest, dest) for dest in dests}


def devices_from_args(args: argparse.Namespace) -> DeviceConfig:
    """The DeviceConfig the parsed options args describe (checked by the run's config)."""
    return DeviceConfig(n_devices=args.devices, link_gbps=args.link_gbps or (), latency_us=args.latency_us or (),
                        row_ns=getattr(args, "row_ns", None) or (),
                        memory=args.device_memory or (), kv_device_layers=args.kv_device_layers,
                        placement=getattr(args, "placement", None), layer_devices=args.layer_devices,
                        compute_slowdown=args.compute_slowdown or (),
                        link_profile=getattr(args, "link_profile", None))


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
    try:
        g = read_model_geometry(args.model)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"--model {e}") from None
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



#: The options that size a cache, as a message about a size too large names them.
SIZE_OPTIONS = (("-c", "c"), ("--layers", "layers"), ("--head-dim", "head_dim"), ("--kv-heads", "kv_heads"),
                ("--type", "type"))


@contextmanager
def naming_sizes(args: argparse.Namespace) -> Iterator[None]:
    """Within it, a size the library finds overflowing (an OutOfBoundsError saying so: the cache's bytes
    or a tensor's) raises InvalidArgumentError naming the options that size the cache, with their
    values, rather than the C function's message alone.

    Parameters
    ----------
    args : argparse.Namespace
        The verb's parsed options.

    Raises
    ------
    InvalidArgumentError
        For such an OutOfBoundsError.
    """
    try:
        yield
    except OutOfBoundsError as e:
        if "overflow" not in str(e):
            raise
        sizes = [(flag, getattr(args, dest)) for flag, dest in SIZE_OPTIONS if getattr(args, dest, None) is not None]
        smaller = " or ".join(flag for flag, _ in sizes if flag != "--type")
        raise InvalidArgumentError(f"{', '.join(f'{flag} {value}' for flag, value in sizes)}: the cache these sizes "
                                   f"give is too large to lay out ({e}); give a smaller {smaller}") from None


def _output_target(path: str) -> str:
    """The file a write to path lands in: path with its links followed."""
    return os.path.realpath(path)


def _scratch(target: str) -> str:
    """A name beside target for writing it whole before it replaces target."""
    folder, name = os.path.split(target)
    return os.path.join(folder, f".{name}.{os.getpid()}.ferry-part")


def _create(path: str) -> None:
    """Create the file path new, closed and empty, with the permissions a new file gets (umask)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))


def check_output_path(option: str, path: Optional[str]) -> None:
    """Refuse, before anything runs, a file option names that the run could not write when it ends:
    the run writes it whole beside it, then puts it in its place (write_output). Nothing is left
    behind: a trial file is created beside it and removed.

    Parameters
    ----------
    option : str
        The option ("--trace").
    path : str or None
        Its value (None: not given, nothing to check).

    Raises
    ------
    InvalidArgumentError
        Naming option and path: for an empty path, a folder, something that is not a regular file
        (/dev/full, a pipe), a file in a folder that does not exist or where no file can be created
        (/proc, a read-only file system), or an existing file that cannot be written.
    """
    if path is None:
        return
    if not path:
        raise InvalidArgumentError(f"{option} '': give a file name")
    target = _output_target(path)
    if os.path.isdir(target):
        raise InvalidArgumentError(f"{option} {path}: is a folder; name a file in it")
    if os.path.exists(target) and not os.path.isfile(target):
        raise InvalidArgumentError(f"{option} {path}: is not a regular file (a device, a pipe, ...); name a file")
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise InvalidArgumentError(f"{option} {path}: its folder does not exist; name a file in an existing folder")
    if os.path.exists(target) and not os.access(target, os.W_OK):
        raise InvalidArgumentError(f"{option} {path}: cannot be written (permission denied)")
    trial = _scratch(target)
    try:
        _create(trial)
    except OSError as e:
        raise InvalidArgumentError(f"{option} {path}: no file can be written in its folder ({e.strerror}); name a "
                                   "file in a folder you can write") from None
    os.remove(trial)


def write_output(option: str, path: str, write: Callable[[str], None]) -> None:
    """Write the file path by write(name), which writes a new file: into a file beside it, which then
    replaces it, so that a failed write leaves path as it was and no partial file.

    Parameters
    ----------
    option : str
        The option that named path, for the message.
    path : str
        The file.
    write : callable
        Writes the whole content into the file name it is given.

    Raises
    ------
    InvalidArgumentError
        Naming option and path, when it cannot be written.
    """
    target = _output_target(path)
    part = _scratch(target)
    try:
        _create(part)
        write(part)
        os.replace(part, target)
    except OSError as e:
        raise InvalidArgumentError(f"{option} {path}: cannot be written ({e.strerror})") from None
    finally:
        if os.path.lexists(part):
            os.remove(part)
