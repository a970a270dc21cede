"""Options and argument types that several verbs share."""

from __future__ import annotations

import argparse
from typing import Any, List, Optional, Tuple, Union

from ..decode_bench import BenchConfig
from ..hash_gate import ValidateConfig
from ..workload import KV_TYPES, SPLIT_BACKENDS


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


def add_run_parser(sub: "argparse._SubParsersAction[Any]", verb: str, help: str, summary: Optional[str],
                   library_doc: Optional[str]) -> argparse.ArgumentParser:
    """Add a verb that runs a library workload (bench, validate) to the `ferry` command's
    subparsers sub, with the help line help and, as --help's text, the verb's summary and then
    the account library_doc gives of the run (see verb_description); returns its parser."""
    return sub.add_parser(verb, help=help, description=verb_description(summary, library_doc),
                          formatter_class=argparse.RawDescriptionHelpFormatter)


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


def add_window_args(p: argparse.ArgumentParser, type_default: str, type_help: str) -> None:
    """Add the options that say which KV-cache window a dry-run verb (table, plan) builds.

    Parameters
    ----------
    p : argparse.ArgumentParser
        The verb's parser; it gets -c, -npp, -ntg, --pad, --type, --head-dim, --kv-heads
        (-npl is each verb's own).
    type_default : str
        The verb's default --type.
    type_help : str
        What --type is, in the verb's words.
    """
    p.add_argument("-c", type=int, required=True, metavar="N_CTX", help="cells in all streams together")
    p.add_argument("-npp", type=int, required=True, help="prompt tokens per sequence")
    p.add_argument("-ntg", type=int, required=True, help="generated tokens per sequence")
    p.add_argument("--pad", type=int, default=1, help="round n_kv up to this (llama.cpp: 256; default 1)")
    p.add_argument("--type", default=type_default, help=f"{type_help} (default {type_default})")
    p.add_argument("--head-dim", type=int, default=128, help="default 128")
    p.add_argument("--kv-heads", type=int, default=8, help="default 8")


def add_attention_args(p: argparse.ArgumentParser, d: Union[BenchConfig, ValidateConfig], policy_help: str) -> None:
    """Add the options of a decode run's attention and copies: --type, --heads, --head-dim,
    --kv-heads, --policy.

    Parameters
    ----------
    p : argparse.ArgumentParser
        The verb's parser (bench, validate).
    d : BenchConfig or ValidateConfig
        The verb's defaults.
    policy_help : str
        What --policy does in the verb's words (its default is added).
    """
    p.add_argument("--type", default=d.type_kv, choices=KV_TYPES, help=f"K and V type (default {d.type_kv})")
    p.add_argument("--heads", type=int, default=d.n_head, help=f"query heads (default {d.n_head})")
    p.add_argument("--head-dim", type=int, default=d.head_dim, help=f"default {d.head_dim}")
    p.add_argument("--kv-heads", type=int, default=d.n_head_kv, help=f"default {d.n_head_kv}")
    p.add_argument("--policy", type=policy_list, default=list(d.policies), metavar="P,P,...",
                   help=f"{policy_help} (default {','.join(d.policies)})")


def add_backend_arg(p: argparse.ArgumentParser, default: str) -> None:
    """Add --backend (where a decode run's split runs, default default) to the verb's parser p."""
    p.add_argument("--backend", default=default, choices=SPLIT_BACKENDS,
                   help="the split's backend: cuda, cpu (the stand-in device), auto (cuda when a device is usable)")
