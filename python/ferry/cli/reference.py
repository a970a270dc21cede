"""What `ferry VERB --help` prints and docs/cli.md holds, both from the one table of options.

tools/cli-reference writes docs/cli.md; a test fails when the file differs from what markdown()
gives.
"""

from __future__ import annotations

import argparse
import difflib
import re
import textwrap
from dataclasses import dataclass
from typing import Any, List, Optional

from .option_table import OPTIONS, Option, add_options, groups_of, options_of

#: --help's width, and the column its option texts start at.
WIDTH, TEXT_COLUMN = 100, 28


@dataclass(frozen=True)
class Verb:
    """What a verb says of itself in --help and docs/cli.md.

    Attributes
    ----------
    name : str
        The verb ("bench").
    summary : str
        One line, for `ferry --help`.
    about : str
        A paragraph: what it runs and prints.
    example : str
        A command line that runs it.
    """

    name: str
    summary: str
    about: str
    example: str


def _wrap(text: str, width: int) -> List[str]:
    """text in lines of at most width, never breaking an option's name at its hyphens."""
    return textwrap.wrap(text, width, break_on_hyphens=False, break_long_words=False)


def _flags(o: Option) -> str:
    metavar = "" if o.is_flag else " " + str(o.argparse.get("metavar") or o.dest.upper())
    if isinstance(o.argparse.get("choices"), tuple) and "metavar" not in o.argparse:
        metavar = " {" + ",".join(o.argparse["choices"]) + "}"
    if o.argparse.get("nargs") == "?":
        metavar = f" [{metavar.strip()}]"
    flags = ", ".join(o.flags)
    if o.argparse.get("action") is argparse.BooleanOptionalAction:
        flags = f"--[no-]{o.name[2:]}"
    return flags + metavar


def _text(o: Option, verb: str) -> str:
    """An option's line of --help after its flags: what it does, the words it takes (where its metavar
    hides them), its default, when it acts."""
    notes = [o.takes] if o.lists_words else []
    if not o.is_flag and o.default != "none":
        notes.append(f"default {o.default}")
    text = o.help + (f" ({'; '.join(notes)})" if notes else "")
    acts = o.verbs[verb]
    return text + ("" if not acts.conds else f"; {acts.text}")


def verb_help(v: Verb, epilog: str = "every option's values, default and when it acts: docs/cli.md") -> str:
    """The verb's --help: usage, what it does, its options by heading (one line each where they fit),
    an example.

    Parameters
    ----------
    v : Verb
    epilog : str, optional
        The last line.

    Returns
    -------
    str
    """
    lines = [f"usage: ferry {v.name} [options]", "", *_wrap(v.about, WIDTH)]
    for heading, opts in groups_of(v.name):
        lines += ["", f"{heading}:"]
        for o in opts:
            flags = "  " + _flags(o)
            first = flags.ljust(TEXT_COLUMN) if len(flags) < TEXT_COLUMN - 1 else None
            wrapped = _wrap(_text(o, v.name), WIDTH - TEXT_COLUMN)
            if first is None:
                lines.append(flags)
                first = " " * TEXT_COLUMN
            lines.append(first + wrapped[0])
            lines += [" " * TEXT_COLUMN + w for w in wrapped[1:]]
    lines += ["", "example:", f"  {v.example}", "", epilog]
    return "\n".join(lines) + "\n"


class VerbParser(argparse.ArgumentParser):
    """A verb's parser whose --help is verb_help's (see add_verb_parser). It takes a value that starts
    with a minus then a digit or a point ("-1GiB", "-1,2", "-.5") as an option's value, so that the
    option's own check refuses it by name, and refuses an unknown option suggesting the closest one."""

    verb: Optional[Verb] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # argparse's own pattern takes "-1" and "-1.5" alone: "-1GiB" would be an unknown option.
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def format_help(self) -> str:
        return super().format_help() if self.verb is None else verb_help(self.verb)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(unrecognized(self, extras))
        return parsed, extras


def unrecognized(parser: argparse.ArgumentParser, extras: List[str]) -> str:
    """The message for arguments the verb's parser does not know: each unknown option (its name
    before any "=") with the verbs that take it, where it is another verb's option, else the closest
    of the parser's options, where one is close."""
    spellings = [s for a in parser._actions for s in a.option_strings]
    own = parser.verb.name if isinstance(parser, VerbParser) and parser.verb is not None else ""
    hints = []
    for word in extras:
        name = word.split("=", 1)[0]
        elsewhere = [verb for o in OPTIONS if name in o.flags for verb in o.verbs if verb != own]
        close = difflib.get_close_matches(name, spellings, n=1) if name.startswith("-") else []
        if elsewhere:
            hints.append(f"{name} is an option of " + ", ".join(f"ferry {v}" for v in dict.fromkeys(elsewhere)))
        elif close:
            hints.append(f"{name}: did you mean {close[0]}?")
    return f"unrecognized arguments: {' '.join(extras)}" + ("; " + "; ".join(hints) if hints else "")


def add_verb_parser(sub: "argparse._SubParsersAction[Any]", v: Verb) -> argparse.ArgumentParser:
    """Add the verb to the `ferry` command's subparsers sub (made with parser_class=VerbParser), with
    its options from the table.

    Returns
    -------
    argparse.ArgumentParser
        The verb's parser.
    """
    p = sub.add_parser(v.name, help=v.summary, usage=f"ferry {v.name} [options]")
    if isinstance(p, VerbParser):
        p.verb = v
    add_options(p, v.name)
    return p


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(verbs: List[Verb]) -> str:
    """docs/cli.md: per verb what it does, an example, and a table of its options: what each takes, its
    default, when it acts and what it does."""
    out = ["# The `ferry` command", "",
           "Generated from the one table of options (`python/ferry/cli/option_table.py`) by",
           "`tools/cli-reference`; a test fails when this file is stale.",
           "An option given where it would do nothing (outside its \"acts\" column) is refused with",
           "exit status 2 and a message naming it.", ""]
    for v in verbs:
        out += [f"## ferry {v.name}", "", v.about, "", "```", v.example, "```", ""]
        opts = options_of(v.name)
        if not opts:
            out += ["No options.", ""]
            continue
        out += ["| option | takes | default | acts | what it does |", "|---|---|---|---|---|"]
        for o in opts:
            flags = " ".join(f"`{f}`" for f in o.flags)
            if o.argparse.get("action") is argparse.BooleanOptionalAction:
                flags = f"`{o.name}` `--no-{o.name[2:]}`"
            out.append(f"| {flags} | {_cell(o.takes)} | {_cell(o.default)} | {_cell(o.verbs[v.name].text)} | "
                       f"{_cell(o.help)} |")
        out.append("")
    return "\n".join(out)
