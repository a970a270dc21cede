"""ferry: copy the ranges of a multi-stream KV-cache window to the device, not the span.

Every verb builds real windows with the library and reports exact byte counts, and runs with
no arguments on defaults that take seconds; `ferry VERB --help` says what it is for, with an
example."""

from __future__ import annotations

import argparse
import sys
from types import ModuleType
from typing import Dict, List, Optional, Tuple

from .. import __version__
from ..errors import FerryError
from . import bench, demo, plan, table, validate
from .options import check_combinations, given_options

#: The verbs in the order `ferry --help` lists them; each module has add_parser, main, and
#: ARGUMENT_ERRORS (the FerryErrors reported as usage errors, exit 2).
VERBS = (demo, table, plan, bench, validate)


def build_parser() -> Tuple[argparse.ArgumentParser, Dict[str, Tuple[ModuleType, argparse.ArgumentParser]]]:
    """The `ferry` command's parser, and per verb name its module and its parser."""
    parser = argparse.ArgumentParser(prog="ferry", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"ferry {__version__}")
    sub = parser.add_subparsers(dest="verb", required=True)
    return parser, {verb.__name__.rsplit(".", 1)[1]: (verb, verb.add_parser(sub)) for verb in VERBS}


def main(argv: Optional[List[str]] = None) -> int:
    """The `ferry` command.

    Parameters
    ----------
    argv : list of str, optional
        The arguments after the program's name (default: sys.argv[1:]).

    Returns
    -------
    int
        The verb's exit status.

    Raises
    ------
    SystemExit
        With status 2 and a usage message for bad arguments (argparse's, an option that would do
        nothing beside the others, or a FerryError the verb counts as an argument error); with
        "ferry: <message>" for any other FerryError.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    parser, parsers = build_parser()
    args = parser.parse_args(argv)
    verb, verb_parser = parsers[args.verb]
    try:
        check_combinations(args.verb, args, given_options(verb_parser, argv[argv.index(args.verb) + 1:]))
    except FerryError as e:
        verb_parser.error(str(e))
    try:
        try:
            return verb.main(args)
        except verb.ARGUMENT_ERRORS as e:
            verb_parser.error(str(e))
    except FerryError as e:
        raise SystemExit(f"ferry: {e}") from None
    return 2

