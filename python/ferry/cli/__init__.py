"""ferry: copy the ranges of a multi-stream KV-cache window to the device, not the span.

Every verb builds real windows with the library and reports exact byte counts, and runs with
no arguments on defaults that take seconds; `ferry VERB --help` says what it is for, with an
example."""

from __future__ import annotations

import argparse
import functools
import sys
from types import ModuleType
from typing import Any, Dict, Optional, Sequence, Tuple

from .. import __version__
from ..errors import FerryError
from . import (
    bench,
    demo,
    paged_bench,
    paged_plan,
    plan,
    remote_serve,
    residency_bench,
    residency_plan,
    table,
    validate,
)
from .old_spellings import OldSpellingError, translate
from .option_table import check_rules, refuse_idle
from .options import given_options, naming_sizes
from .reference import VerbParser

#: The verbs in the order `ferry --help` lists them; each module has VERB (what --help and
#: docs/cli.md say of it), add_parser, job (the parsed options as what will run, every check that
#: needs no run made), run (runs a job, returns the exit status), main (run(job(args))) and
#: ARGUMENT_ERRORS (the FerryErrors reported as usage errors, exit 2). One program a verb: the
#: residency planner's and the paged cache's plan and bench are verbs of their own, and so is the
#: remote tier's server.
VERBS = (demo, table, plan, bench, validate, residency_plan, residency_bench, paged_plan, paged_bench, remote_serve)


@functools.lru_cache(maxsize=1)
def build_parser() -> Tuple[argparse.ArgumentParser, Dict[str, Tuple[ModuleType, argparse.ArgumentParser]]]:
    """The `ferry` command's parser, and per verb name its module and its parser (made once: parsing
    leaves a parser as it was, and making them is most of a command line's checks)."""
    parser = argparse.ArgumentParser(prog="ferry", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"ferry {__version__}")
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=VerbParser)
    return parser, {verb.VERB.name: (verb, verb.add_parser(sub)) for verb in VERBS}


def prepare(argv: Sequence[str]) -> Tuple[ModuleType, argparse.ArgumentParser, Any]:
    """Parse a command line into what will run, making every check that needs no run.

    Parameters
    ----------
    argv : sequence of str
        The arguments after the program's name.

    Returns
    -------
    (module, argparse.ArgumentParser, object)
        The verb's module, its parser, and its job (verb.job of the parsed options).

    Raises
    ------
    SystemExit
        With status 2 and a usage message for bad arguments: argparse's, an option that would do
        nothing beside the others or breaks an option's rule (ferry.cli.option_table), or a
        FerryError of the verb's ARGUMENT_ERRORS from making the job.
    """
    verb, verb_parser, _, job = _prepare(argv)
    return verb, verb_parser, job


def _prepare(argv: Sequence[str]) -> Tuple[ModuleType, argparse.ArgumentParser, argparse.Namespace, Any]:
    """prepare's verb, parser and job, with the parsed options between (main names sizes from them)."""
    parser, parsers = build_parser()
    try:
        argv, note = translate(argv)  # an old spelling (`ferry plan --residency`): the new verb's
    except OldSpellingError as e:
        parsers[e.verb][1].error(str(e))
    if note is not None:
        print(note, file=sys.stderr)
    args = parser.parse_args(argv)
    verb, verb_parser = parsers[args.verb]
    try:
        refuse_idle(args.verb, args, given_options(verb_parser, argv[argv.index(args.verb) + 1:]))
        with naming_sizes(args):
            job = verb.job(args)
        check_rules(args.verb, args)  # after the job: --model has filled what the command line left out
        return verb, verb_parser, args, job
    except verb.ARGUMENT_ERRORS as e:
        verb_parser.error(str(e))
    except FerryError as e:  # not an argument error of this verb: the run could not start
        raise SystemExit(f"ferry: {e}") from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The `ferry` command.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments after the program's name (default: sys.argv[1:]).

    Returns
    -------
    int
        The verb's exit status.

    Raises
    ------
    SystemExit
        With status 2 and a usage message for bad arguments (see prepare, and a FerryError of the
        verb's ARGUMENT_ERRORS during the run, sizes too large to lay out among them: naming_sizes);
        with "ferry: <message>" for any other FerryError.
    """
    verb, verb_parser, args, job = _prepare(sys.argv[1:] if argv is None else argv)
    try:
        try:
            with naming_sizes(args):
                return int(verb.run(job))
        except verb.ARGUMENT_ERRORS as e:
            verb_parser.error(str(e))
    except FerryError as e:
        raise SystemExit(f"ferry: {e}") from None
    return 2
