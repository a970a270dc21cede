"""The one table of `ferry`'s options.

Each row is an option of one or more verbs: its flags, what it takes and its default, what it
does, and per verb when it acts (always; with --overlap; on stand-in devices; ...): each verb runs
one program, so a condition says when an option qualifies another, never which program runs.
Everything else reads it: the verbs' parsers are built from it (add_options), an option given
where it would do nothing is refused from it (refuse_idle), and `ferry VERB --help` and
docs/cli.md print it (ferry.cli.reference).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from ..backend import link_profiles
from ..errors import InvalidArgumentError
from ..remote.server import PROTOCOLS
from ..residency import STRATEGIES
from ..workloads.bench_config import Sequences
from ..workloads.common import DEVICES, KV_TYPES, LENGTHS, POLICIES, PREFETCH_NEXT
from ..workloads.devices import (
    MAX_OPTION_FILE,
    STANDIN_LINK_GBPS,
    STANDIN_MAX,
    parse_floats,
    parse_indices,
    parse_links,
    parse_size,
    parse_sizes,
)
from ..workloads.paged_tables import check_pool
from ..workloads.residency_plan import parse_remote_link
from .options import (
    ANY_TYPE,
    DEFAULTS,
    POSITIVE,
    Given,
    argument_type,
    count,
    int_list,
    lengths_arg,
    one_float,
    placement_arg,
    policy_list,
    strategy_list,
    stream_range,
    swa_pattern,
    type_name,
)

Args = argparse.Namespace


@dataclass(frozen=True)
class Cond:
    """One condition under which an option acts.

    Attributes
    ----------
    text : str
        The condition in words, after "acts only": "with --overlap".
    holds : callable
        Whether it holds for the parsed options.
    fix : str
        What to change when it does not: "give --overlap".
    """

    text: str
    holds: Callable[[Args], bool]
    fix: str


@dataclass(frozen=True)
class When:
    """When an option acts: every one of its conditions holds (none: always)."""

    conds: Tuple[Cond, ...] = ()

    def __and__(self, other: "When") -> "When":
        return When(self.conds + other.conds)

    @property
    def text(self) -> str:
        """The conditions in words ("always" for none)."""
        return " and ".join(c.text for c in self.conds) or "always"

    def unmet(self, args: Args) -> Optional[Cond]:
        """The first condition that does not hold for the parsed options args, or None."""
        return next((c for c in self.conds if not c.holds(args)), None)


def when(text: str, holds: Callable[[Args], bool], fix: str) -> When:
    """A When of one condition (see Cond)."""
    return When((Cond(text, holds, fix),))


ALWAYS = When()
OVERLAP = when("with --overlap", lambda a: a.overlap, "give --overlap")
GATE_OVERLAP = when("without --no-overlap", lambda a: a.overlap, "leave out --no-overlap")
STANDIN = when("on stand-ins", lambda a: a.device != "cuda",
               "use --device cpu (or auto)")
NON_FLAT = when("with a non-flat --policy", lambda a: bool(set(a.policy) - {"flat"}),
                "add ranges or plan to --policy")
WHICH_V = when("with --which v", lambda a: a.which == "v", "give --which v")
TABLE_OUT = when("without --json", lambda a: not a.json, "leave out --json")
SWA_PAIR = when("with both --swa-window and --swa-layers",
                lambda a: a.swa_window is not None and a.swa_layers is not None, "give both")
PAGED = when("with --paged", lambda a: a.paged, "give --paged")
DRAFT = when("with --draft N above 0", lambda a: a.draft > 0, "give --draft N")
REMOTE_LINK = when("with --remote-link", lambda a: a.remote_link is not None, "give --remote-link")
UNIFIED_RUNS = when("on one device with all KV on the host",
                    lambda a: a.devices == 1 and a.kv_device_layers is None and a.placement is None,
                    "leave out --devices, --kv-device-layers and --placement")

#: The verbs by what they do: dry runs that plan, runs that measure; the residency planner's and the
#: paged cache's (each a plan and a bench of its own), the verbs that plan a window, and those that
#: run decode steps on a split cache.
RESIDENCY_VERBS = ("residency-plan", "residency-bench")
PAGED_VERBS = ("paged-plan", "paged-bench")
DRY = ("table", "plan", "residency-plan", "paged-plan")
RUNS = ("bench", "validate", "residency-bench", "paged-bench")
ALL = DRY + RUNS
WINDOWS = ("table", "plan", "bench", *RESIDENCY_VERBS, *PAGED_VERBS)  # -npl, -npp: sequences of -npp prompts
LAYERED = ("residency-plan", *RUNS)  # the query heads and layers: a decode step, or a plan of every layer
PLACED = ("residency-plan", "bench", "validate", "residency-bench")  # layers over --devices, KV placed on them
SERVE = ("remote-serve",)  # holds a cache for remote tiers: the KV geometry, no window


@dataclass(frozen=True)
class Option:
    """A row of the table.

    Attributes
    ----------
    flags : tuple of str
        Its spellings, the long one last ("-c"; "--no-reuse").
    help : str
        What it does, one short line.
    verbs : mapping of str to When
        The verbs that take it, and when it acts in each.
    group : str
        The heading it is listed under.
    argparse : mapping
        What argparse.add_argument takes besides the flags and help (type, default, metavar, ...).
    accepts : str
        What it takes, in words (derived from argparse's type, choices or action unless given).
    rule : callable, optional
        A check of the parsed options (after --model) wherever the option acts, raising
        InvalidArgumentError: one rule that every verb taking the option applies (check_rules).
    """

    flags: Tuple[str, ...]
    help: str
    verbs: Mapping[str, When]
    group: str
    argparse: Mapping[str, Any] = field(default_factory=dict)
    accepts: str = ""
    rule: Optional[Callable[[Args], None]] = None

    @property
    def name(self) -> str:
        """Its long spelling."""
        return self.flags[-1]

    @property
    def dest(self) -> str:
        """Where argparse stores it."""
        return str(self.argparse.get("dest") or self.name.lstrip("-").replace("-", "_"))

    @property
    def is_flag(self) -> bool:
        """Whether it takes no value."""
        action = self.argparse.get("action")
        return action in ("store_true", "store_false") or action is argparse.BooleanOptionalAction

    @property
    def takes(self) -> str:
        """What it takes, in words: "flag", its choices, or what its type accepts."""
        if self.accepts:
            return self.accepts
        if self.is_flag:
            return "flag"
        if "choices" in self.argparse:
            return ", ".join(self.argparse["choices"])
        return str(getattr(self.argparse.get("type"), "accepts", "") or self.argparse.get("metavar", "value"))

    @property
    def lists_words(self) -> bool:
        """Whether it takes words its metavar does not show (choices behind a metavar, or a type marked
        so: --type, --lengths, --policy): `--help` then lists them."""
        if "choices" in self.argparse:
            return "metavar" in self.argparse
        return bool(getattr(self.argparse.get("type"), "words", False))

    @property
    def default(self) -> str:
        """Its default as `--help` and docs/cli.md write it."""
        if "default_text" in self.argparse:
            return str(self.argparse["default_text"])
        value = self.argparse.get("default")
        if self.is_flag:
            return "on" if value is True and self.argparse.get("action") is argparse.BooleanOptionalAction else "off"
        value = self.argparse.get("default")
        if isinstance(value, (list, tuple)):
            return ",".join(map(str, value))
        if isinstance(value, float):
            return f"{value:g}"
        return "none" if value is None else str(value)


def _opt(flags: Sequence[str], help: str, verbs: Mapping[str, When], group: str, accepts: str = "",
         rule: Optional[Callable[[Args], None]] = None, **kwargs: Any) -> Option:
    return Option(tuple(flags), help, dict(verbs), group, kwargs, accepts, rule)


def _number(x: float) -> str:
    """x as the options' texts write a bound: 0.001, 1e6."""
    return f"{x:g}".replace("e+0", "e").replace("e+", "e")


def standin_figures(option: str, low: float) -> Callable[[str], Any]:
    """The argparse type of a stand-in figure per device (--latency-us, --row-ns, ...): low to
    STANDIN_MAX, the bound the library takes."""
    return argument_type(lambda t: parse_floats(t, option, low, STANDIN_MAX),
                         f"{_number(low)} to {_number(STANDIN_MAX)} per device, comma-separated")


def pool_holds_sequences(args: Args) -> None:
    """--block-size's rule, under every verb with a paged cache: at each -npl, -c cells in whole blocks
    hold every sequence's -npp + -ntg cells in whole blocks (paged_tables.check_pool)."""
    for npl in args.npl:
        check_pool(args.c, npl, args.npp + args.ntg, args.block_size)


def _all(verbs: Sequence[str], w: When = ALWAYS) -> Dict[str, When]:
    return dict.fromkeys(verbs, w)


d = DEFAULTS
#: --remote alone starts a server on the loopback (const ""); with HOST:PORT it reads that peer.
REMOTE_ARG: Dict[str, Any] = {"nargs": "?", "const": "", "default": None, "metavar": "HOST:PORT"}
REMOTE_ACCEPTS = "HOST:PORT, or nothing"
LENGTHS_HELP = (f"each prompt: {' or '.join(LENGTHS)} (-npp cells; seeded draws up to -npp), or a file of at most "
                f"{MAX_OPTION_FILE // 2**20} MiB")
SIZES = "sizes (64MiB, 1GiB, 500MB, bytes), comma-separated"
SHAPE, KV, RUN, DEVICES_GROUP, RESIDENCY_GROUP, OUTPUT = (
    "the window", "the KV geometry", "the run", "devices and where the KV lives",
    "where each layer's KV should live (the residency planner)", "output")

#: Every option of every verb, grouped as `--help` lists them; the verbs' shared groups by the helpers
#: above (_all of DRY, RUNS, WINDOWS, ...), a verb's own options named with it.
OPTIONS: Tuple[Option, ...] = (
    # the window
    _opt(["-c"], "cells in all streams together, -c / -npl each", _all(ALL + SERVE), SHAPE,
         type=POSITIVE, default=d.n_ctx, action=Given, metavar="N_CTX"),
    _opt(["-npl"], "numbers of sequences, one stream each", _all(WINDOWS), SHAPE,
         type=int_list, default=list(d.npl), metavar="N,N,..."),
    _opt(["-npl"], "streams a wave serves, one sequence each: one gate per number", {"validate": ALWAYS}, SHAPE,
         type=int_list, default=list(d.npl), metavar="N,N,..."),
    _opt(["-npl"], "streams (--paged: sequences) of the cache served: one number, a client's -npl",
         {"remote-serve": ALWAYS}, SHAPE,
         type=int_list, default=list(d.npl[:1]), metavar="N,N,..."),
    _opt(["-npp"], "prompt cells per sequence", _all(WINDOWS), SHAPE, type=POSITIVE,
         default=d.npp),
    _opt(["-npp"], "the longest prompt, in cells: prompts are -ntg + 1 to -npp cells", {"validate": ALWAYS}, SHAPE,
         type=POSITIVE, default=d.npp),
    _opt(["-ntg"], "tokens generated per sequence, one decode step each", _all(DRY), SHAPE,
         type=count(0), default=d.ntg),
    _opt(["-ntg"], "tokens generated per sequence, one decode step each", _all(RUNS), SHAPE,
         type=POSITIVE, default=d.ntg),
    _opt(["--pad"], "round n_kv up to this (llama.cpp: 256); one graph per n_kv",
         _all(("table", "plan", "residency-plan", *RUNS)), SHAPE, type=POSITIVE, default=d.pad),
    _opt(["--lengths"], LENGTHS_HELP, _all(("table", "bench", "paged-bench")), SHAPE, type=argument_type(lengths_arg),
         default="equal", metavar="HOW"),
    _opt(["--lengths"], LENGTHS_HELP, {"validate": ALWAYS}, SHAPE, type=argument_type(lengths_arg), default="uniform",
         metavar="HOW"),
    _opt(["--sequences"], "sequences served, in waves of -npl, each its own content",
         {"validate": ALWAYS}, SHAPE, type=POSITIVE, metavar="N", default_text="2 x npl"),
    # the KV geometry
    _opt(["--type"], "K and V type (any ferry type: a dry run)", _all(DRY), KV, type=type_name(ANY_TYPE),
         default=d.type_kv, metavar="TYPE"),
    _opt(["--type"], "K and V type, as attention reads them", _all(RUNS + SERVE), KV, type=type_name(KV_TYPES),
         default=d.type_kv, metavar="TYPE"),
    _opt(["--head-dim"], "values per head", _all(ALL + SERVE), KV, type=POSITIVE, default=d.head_dim, action=Given),
    _opt(["--kv-heads"], "KV heads", _all(ALL + SERVE), KV, type=POSITIVE, default=d.n_head_kv, action=Given),
    _opt(["--heads"], "query heads", _all(LAYERED), KV, type=POSITIVE, default=d.n_head, action=Given),
    _opt(["--layers"], "layers", _all(LAYERED + SERVE), KV, type=POSITIVE, default=d.n_layer, action=Given),
    _opt(["--model"], "the KV geometry from a GGUF model (options given beside it win)", _all(ALL), KV,
         metavar="FILE.gguf"),
    _opt(["--swa-window"], "sliding window, in cells, of the layers --swa-layers marks s",
         _all(("table", "plan", "residency-plan"), SWA_PAIR), KV,
         type=POSITIVE, metavar="W", default_text="--model's, else none"),
    _opt(["--swa-layers"], "one letter per layer: s sliding, f full (e.g. sssssf)",
         _all(("table", "plan", "residency-plan"), SWA_PAIR), KV,
         type=swa_pattern, metavar="PATTERN", default_text="--model's, else none"),
    _opt(["--v-trans"], "V stored transposed (flash attention off)",
         {"plan": WHICH_V, "paged-plan": WHICH_V, "residency-plan": ALWAYS, **_all(RUNS + SERVE)}, KV,
         action="store_true"),
    # what runs
    _opt(["--which"], "the K or the V window", _all(("plan", "paged-plan")), RUN, choices=("k", "v"), default="k"),
    _opt(["--stream"], "streams read", _all(("plan", "paged-plan")), RUN, type=stream_range, metavar="S0-S1",
         default_text="all"),
    _opt(["--cost-model"], "whose cost model decides plan or flat", {"plan": ALWAYS},
         RUN, choices=("cpu", "gpu"), default="gpu"),
    _opt(["--policy"], "copy policies to compare", {"bench": ALWAYS}, RUN, type=policy_list,
         default=list(d.policies), action=Given, metavar="P,P,..."),
    _opt(["--policy"], "copy policies to compare", {"validate": ALWAYS}, RUN, type=policy_list,
         default=list(POLICIES), metavar="P,P,..."),
    _opt(["--compact"], "also run each non-flat policy with compact staging",
         {"bench": NON_FLAT, "validate": NON_FLAT}, RUN, action="store_true"),
    _opt(["--compact"], "the placements' windows staged compact", {"residency-bench": ALWAYS}, RUN,
         action="store_true"),
    _opt(["--unified"], "also run a unified cache of the same sequences",
         {"bench": UNIFIED_RUNS}, RUN, action=argparse.BooleanOptionalAction, default=d.unified),
    _opt(["--no-reuse"], "build and allocate every step's graph",
         _all(("bench", "validate", "paged-bench")), RUN, action="store_false", dest="reuse"),
    _opt(["--overlap"], "also run each variant prefetching its windows", {"bench": ALWAYS}, RUN, action="store_true"),
    _opt(["--overlap"], "also place each strategy prefetching its windows", _all(RESIDENCY_VERBS), RUN,
         action="store_true"),
    _opt(["--no-overlap"], "leave out the overlapped runs (each policy prefetching)",
         {"validate": ALWAYS}, RUN, action="store_false", dest="overlap"),
    _opt(["--prefetch"], "layers queued ahead; a run per depth",
         {**_all(("bench", *RESIDENCY_VERBS), OVERLAP), "validate": GATE_OVERLAP}, RUN, type=int_list,
         default=list(d.prefetch), metavar="N,N,..."),
    _opt(["--prefetch-next"], "copy each step's first layer under the step before", {"bench": OVERLAP},
         RUN, choices=list(PREFETCH_NEXT), metavar="HOW", default="on"),
    _opt(["--prefetch-next"], "copy each step's first layer under the step before", {"validate": GATE_OVERLAP}, RUN,
         choices=list(PREFETCH_NEXT), metavar="HOW", default="both"),
    _opt(["--seed"], "the sequences' content", {"validate": ALWAYS}, RUN, type=count(0), default=0),
    _opt(["--seed"], "the cache's content, as `ferry bench --remote` (0) and `ferry validate --remote --seed` fill "
         "theirs", {"remote-serve": ALWAYS}, RUN, type=count(0), default=0),
    _opt(["--draft"], "also verify drafts of N tokens: a draft row beside each row", {"bench": ALWAYS}, RUN,
         type=count(0), default=Sequences.draft, metavar="N"),
    _opt(["--draft"], "also serve by drafts of N tokens, the rejected cells rolled back", {"validate": ALWAYS}, RUN,
         type=count(0), default=Sequences.draft, metavar="N"),
    _opt(["--accept"], "the chance a draft token is accepted, those before it accepted",
         _all(("bench", "validate"), DRAFT), RUN,
         type=argument_type(one_float("--accept", 0.0, 1.0), "number from 0 to 1"), metavar="P",
         default=Sequences.accept),
    _opt(["--chunk"], "also prefill in chunks of N tokens: a chunk row beside each row", {"bench": ALWAYS}, RUN,
         type=count(0), default=Sequences.chunk, metavar="N"),
    _opt(["--repeat"], "replicas of each npl", _all(("bench", "paged-bench")), RUN, type=POSITIVE, metavar="N",
         default_text="6"),
    _opt(["--repeat"], "repetitions of each placement", {"residency-bench": ALWAYS}, RUN, type=POSITIVE, metavar="N",
         default_text="5"),
    _opt(["--rounds"], "timed repetitions of each variant",
         _all(("bench", "paged-bench")), RUN, type=POSITIVE, default=d.rounds, metavar="N"),
    _opt(["--paged"], "also serve through a paged cache, per gather method", {"validate": ALWAYS}, RUN,
         action="store_true"),
    _opt(["--paged"], "serve a paged cache: pools of -c cells in blocks, a table for each -npl sequence (a client's "
         "--paged, or paged-bench)", {"remote-serve": ALWAYS}, RUN, action="store_true"),
    _opt(["--remote"], "also pull each policy's windows from a remote tier (`pip install ferry[remote]`): the peer "
         "HOST:PORT (`ferry remote-serve`), or alone a server on the loopback; pieces, bytes and time a step; and "
         "decode steps whose layers the scheduler pulls, their outputs against the local cache's",
         {"bench": ALWAYS}, RUN, accepts=REMOTE_ACCEPTS, **REMOTE_ARG),
    _opt(["--remote"], "also pull the paged windows per block, by runs and merged from a remote tier (`pip install "
         "ferry[remote]`): the peer HOST:PORT (`ferry remote-serve --paged`), or alone a server on the loopback; "
         "pieces, bytes and time a step; and decode steps whose layers the scheduler pulls, their outputs against "
         "the local cache's", {"paged-bench": ALWAYS}, RUN, accepts=REMOTE_ACCEPTS, **REMOTE_ARG),
    _opt(["--remote"], "also pull each policy's windows (--paged: the paged windows per block, by runs and merged) "
         "from a remote tier (`pip install ferry[remote]`): the peer HOST:PORT (`ferry remote-serve`, with --paged "
         "for --paged), or alone a server on the loopback; byte for byte against the local cache, as are the "
         "outputs of steps whose layers the scheduler pulls",
         {"validate": ALWAYS}, RUN, accepts=REMOTE_ACCEPTS, **REMOTE_ARG),
    # the remote tier's server
    _opt(["--host"], "the address clients reach this host at (its segment name's host)", {"remote-serve": ALWAYS},
         RUN, default="127.0.0.1", metavar="ADDRESS"),
    _opt(["--protocol"], "the transfer engine's protocol: rdma where the machine has it", {"remote-serve": ALWAYS},
         RUN, choices=PROTOCOLS, default="tcp"),
    _opt(["--block-size"], "cells per block of the paged cache",
         {**_all(PAGED_VERBS), "validate": PAGED}, RUN, type=POSITIVE, default=d.block_size, metavar="N",
         rule=pool_holds_sequences),
    # remote-serve's own: no sequences to check against the pool (its clients draw the tables)
    _opt(["--block-size"], "cells per block of the paged cache", {"remote-serve": PAGED}, RUN, type=POSITIVE,
         default=d.block_size, metavar="N"),
    _opt(["--adjacency"], "share of blocks after their predecessor", {**_all(PAGED_VERBS), "validate": PAGED}, RUN,
         type=argument_type(one_float("--adjacency", 0.0, 1.0), "number from 0 to 1"), metavar="F",
         default=d.adjacency),
    _opt(["--shared-prefix"], "cells every sequence starts with: one set of blocks every table holds",
         _all(("paged-bench",)), RUN, type=count(0), default=d.shared_prefix, metavar="N"),
    _opt(["--device-blocks"], "share of the working set's blocks the device table's pool holds",
         _all(("paged-bench",)), RUN,
         type=argument_type(one_float("--device-blocks", 0.0, 1.0), "number above 0, at most 1"),
         default=d.device_blocks, metavar="F"),
    _opt(["--pool-prefetch"], "also run the device table prefetching each group's blocks under the one before",
         _all(("paged-bench",)), RUN, action="store_true"),
    # devices
    _opt(["--device"], "where the split runs: cpu is the stand-in, auto cuda if usable",
         _all(("bench", "validate", "paged-bench")), DEVICES_GROUP, choices=DEVICES, default=d.device,
         metavar="DEVICE"),
    _opt(["--devices"], "devices; layers go to them in contiguous ranges",
         _all(PLACED), DEVICES_GROUP, type=POSITIVE, default=1, metavar="N"),
    _opt(["--link-gbps"], "each stand-in's link in GB/s each way (0: the host's memcpy)",
         {**_all((*RESIDENCY_VERBS, "paged-plan")), **_all(("bench", "validate", "paged-bench"), STANDIN)},
         DEVICES_GROUP, type=argument_type(parse_links, f"0 or 0.001 to {_number(STANDIN_MAX)} per device, "
                                           "comma-separated"),
         metavar="G,G,...", default_text=f"{STANDIN_LINK_GBPS:g}"),
    _opt(["--link-profile"], "each stand-in's link a named one from published measurements, its small pieces "
         "slower (docs/design.md); --link-gbps then gives its peak, its ratios kept",
         {**_all((*RESIDENCY_VERBS, "paged-plan")), **_all(("bench", "validate", "paged-bench"), STANDIN)},
         DEVICES_GROUP, choices=link_profiles(), metavar="NAME", default_text="none"),
    _opt(["--latency-us"], "microseconds each stand-in transfer adds",
         {**_all((*RESIDENCY_VERBS, "paged-plan")), **_all(("bench", "validate", "paged-bench"), STANDIN)},
         DEVICES_GROUP, type=standin_figures("--latency-us", 0.0), metavar="U,U,...", default_text="0"),
    _opt(["--row-ns"], "nanoseconds each row of a stand-in's 2-D transfer adds",
         {"paged-plan": ALWAYS, **_all(("bench", "validate", "paged-bench"), STANDIN)}, DEVICES_GROUP,
         type=standin_figures("--row-ns", 0.0), metavar="N,N,...", default_text="0"),
    _opt(["--device-memory"], "each stand-in's memory",
         {**_all(RESIDENCY_VERBS), **_all(("bench", "validate", "paged-bench"), STANDIN)}, DEVICES_GROUP,
         type=argument_type(lambda t: parse_sizes(t, "--device-memory"), SIZES), metavar="SIZE,...",
         default_text="unlimited"),
    _opt(["--compute-slowdown"], "each stand-in computes at least F times as long as the host",
         {**_all(RESIDENCY_VERBS), **_all(("bench", "validate", "paged-bench"), STANDIN)}, DEVICES_GROUP,
         type=standin_figures("--compute-slowdown", 1.0), metavar="F,...", default_text="1"),
    _opt(["--kv-device-layers"], "first N layers' KV on their device", _all(("bench", "validate")),
         DEVICES_GROUP, type=count(0), metavar="N", default_text="0"),
    _opt(["--kv-device-layers"], "at most N layers' KV on the devices", _all(RESIDENCY_VERBS),
         DEVICES_GROUP, type=count(0), metavar="N", default_text="no limit"),
    _opt(["--placement"], "per layer h (host) or the device holding its KV, e.g. h,0,1,h",
         _all(("bench", "validate")), DEVICES_GROUP,
         type=argument_type(placement_arg), metavar="LIST|FILE", default_text="from --kv-device-layers"),
    _opt(["--layer-devices"], "the device that runs each layer", _all(PLACED), DEVICES_GROUP,
         type=argument_type(lambda t: parse_indices(t, "--layer-devices"), "device indices, comma-separated"),
         metavar="D,D,...", default_text="ranges"),
    # the residency planner
    _opt(["--strategy"], "the strategies that place each layer's KV", _all(RESIDENCY_VERBS),
         RESIDENCY_GROUP, type=strategy_list, default=STRATEGIES, metavar="S,S,..."),
    _opt(["--reserve"], "device memory set aside for what else it holds",
         _all(RESIDENCY_VERBS), RESIDENCY_GROUP,
         type=argument_type(lambda t: parse_sizes(t, "--reserve"), SIZES), metavar="SIZE,...", default_text="0"),
    _opt(["--compute-us"], "microseconds one layer's attention takes on the host",
         _all(RESIDENCY_VERBS), RESIDENCY_GROUP,
         type=argument_type(one_float("--compute-us", 0.0, 1e9), "number from 0 to 1e9"), metavar="U",
         default_text="measured"),
    _opt(["--draft"], "each step verifies a draft of N tokens: N + 1 per stream, one copy",
         _all(RESIDENCY_VERBS), RESIDENCY_GROUP, type=count(0), default=0, metavar="N"),
    _opt(["--accept"], "each draft token's acceptance; tokens/s count those kept",
         _all(RESIDENCY_VERBS, DRAFT), RESIDENCY_GROUP,
         type=argument_type(one_float("--accept", 0.0, 1.0), "number from 0 to 1"), metavar="P", default=0.7),
    _opt(["--remote-link"], "a remote tier behind the host: its link measured on the loopback (`measure`, needs "
         "ferry[remote]) or its figures; layers the host cannot hold go there",
         _all(RESIDENCY_VERBS), RESIDENCY_GROUP,
         type=argument_type(parse_remote_link, "measure, or BATCH_US,PIECE_US,GBPS"),
         metavar="measure|B,P,G", default_text="none"),
    _opt(["--host-memory"], "host memory for the KV kept local and the remote pulls' staging; the rest goes remote",
         _all(RESIDENCY_VERBS, REMOTE_LINK), RESIDENCY_GROUP,
         type=argument_type(lambda t: parse_size(t, "--host-memory"), "a size (64MiB, 1GiB, 500MB, bytes)"),
         metavar="SIZE", default_text="this host's memory"),
    # output
    _opt(["--json"], "a JSON list of objects instead of text", _all(ALL), OUTPUT, action="store_true"),
    _opt(["--json"], "the segment name and layout as one JSON object instead of text", {"remote-serve": ALWAYS},
         OUTPUT, action="store_true"),
    _opt(["--wide"], "every figure (times, bandwidth, memory), wider than 100 columns",
         {"bench": TABLE_OUT}, OUTPUT, action="store_true"),
    _opt(["--plot"], "also write a PNG chart of tokens/s (needs matplotlib)", {"bench": ALWAYS}, OUTPUT,
         metavar="FILE.png"),
    _opt(["--trace"], "also write each variant's timeline (Chrome trace, for Perfetto)",
         _all(("bench", "paged-bench")), OUTPUT, metavar="FILE.json"),
)


def options_of(verb: str) -> List[Option]:
    """The rows of the table the verb takes, in the table's order."""
    return [o for o in OPTIONS if verb in o.verbs]


def groups_of(verb: str) -> Iterator[Tuple[str, List[Option]]]:
    """The verb's options by heading, headings in the table's order."""
    seen: Dict[str, List[Option]] = {}
    for o in options_of(verb):
        seen.setdefault(o.group, []).append(o)
    yield from seen.items()


def add_options(parser: argparse.ArgumentParser, verb: str) -> None:
    """Add the verb's options to its parser, from the table."""
    for heading, opts in groups_of(verb):
        g = parser.add_argument_group(heading)
        for o in opts:
            kwargs = {k: v for k, v in o.argparse.items() if k != "default_text"}
            g.add_argument(*o.flags, help=o.help, **kwargs)


def check_rules(verb: str, args: Args) -> None:
    """Apply the rule of each of the verb's options that has one, where it acts.

    Raises
    ------
    InvalidArgumentError
        From the first rule the parsed options args break.
    """
    for o in options_of(verb):
        if o.rule is not None and o.verbs[verb].unmet(args) is None:
            o.rule(args)


def refuse_idle(verb: str, args: Args, given: Mapping[str, str]) -> None:
    """Refuse an option given where it would do nothing.

    Parameters
    ----------
    verb : str
        The verb's name.
    args : argparse.Namespace
        Its parsed options.
    given : mapping of str to str
        The dests of the options the command line gave, each to the spelling it gave
        (options.given_options): "--no-unified" for --unified's.

    Raises
    ------
    InvalidArgumentError
        Naming the first such option as the command line spelled it, where it acts and what to change.
    """
    for o in options_of(verb):
        if o.dest not in given:
            continue
        unmet = o.verbs[verb].unmet(args)
        if unmet is not None:
            name = given[o.dest]
            raise InvalidArgumentError(f"{name} acts only {unmet.text}: {unmet.fix}, or leave out {name}")
