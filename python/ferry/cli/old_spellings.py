"""The spellings that swapped a program in behind `ferry plan` and `ferry bench`, kept for one release.

`ferry plan --residency [S,S,...]` is `ferry residency-plan [--strategy S,S,...]` now, `ferry bench
--residency` is `ferry residency-bench`, and `--paged` under either is `ferry paged-plan` or `ferry
paged-bench`. translate() rewrites such a command line into the new verb's, with a note naming the
new spelling; an option the old verb took only without the old option is refused as it was."""

from __future__ import annotations

import argparse
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import InvalidArgumentError
from .option_table import options_of

#: (verb, option) as they were typed -> the verb that program is now.
MOVED: Dict[Tuple[str, str], str] = {("plan", "--residency"): "residency-plan",
                                     ("bench", "--residency"): "residency-bench",
                                     ("plan", "--paged"): "paged-plan", ("bench", "--paged"): "paged-bench"}
#: The shortest abbreviation of each old option the old verbs' parsers took (they had --reserve and
#: --pad beside them).
SHORTEST = {"--residency": "--resi", "--paged": "--pag"}
#: Options of the old verb that the new verb takes as its one behaviour: with that value, left out.
IMPLIED: Dict[str, Dict[str, str]] = {"paged-bench": {"--policy": "ragged"}}


class OldSpellingError(InvalidArgumentError):
    """An old spelling with an option the old verb refused beside it; verb: the old verb, whose usage
    error it is."""

    def __init__(self, verb: str, message: str) -> None:
        super().__init__(message)
        self.verb = verb


def _spellings(verb: str) -> List[str]:
    """Every spelling of the verb's options (--no-X of a boolean option too)."""
    out = []
    for o in options_of(verb):
        out += list(o.flags)
        if o.argparse.get("action") is argparse.BooleanOptionalAction:
            out.append(f"--no-{o.name[2:]}")
    return out


def _resolve(word: str, spellings: Sequence[str]) -> Optional[str]:
    """The spelling of spellings the option word names, in full (an abbreviation, --x=value), or None."""
    name = word.split("=", 1)[0]
    if name in spellings:
        return name
    close = [s for s in spellings if s.startswith(name) and name.startswith("--")]
    return close[0] if len(close) == 1 else None


def translate(argv: Sequence[str]) -> Tuple[List[str], Optional[str]]:
    """The command line argv in the new spelling, and a note naming it (None where argv is no old
    spelling: argv as it was).

    Parameters
    ----------
    argv : sequence of str
        The arguments after the program's name.

    Returns
    -------
    (list of str, str or None)

    Raises
    ------
    OldSpellingError
        For --residency beside --paged, or an option the old verb acted on only without the old option
        (naming both, as the old verb did).
    """
    argv = list(argv)
    at = next((i for i, w in enumerate(argv) if not w.startswith("-")), None)
    if at is None or argv[at] not in ("plan", "bench"):
        return argv, None
    verb, rest = argv[at], argv[at + 1:]
    found: Dict[str, Tuple[int, Optional[str]]] = {}  # old option -> its index in rest, its value
    for i, word in enumerate(rest):
        if word == "--":
            break
        name, eq, inline = word.partition("=")
        for option, shortest in SHORTEST.items():
            if name.startswith(shortest) and option.startswith(name):
                taken = inline or None
                if option == "--residency" and not eq and i + 1 < len(rest) and not rest[i + 1].startswith("-"):
                    taken = rest[i + 1]  # --residency's optional value, as argparse took it
                found[option] = (i, taken)
    if not found:
        return argv, None
    if len(found) == 2:
        raise OldSpellingError(verb, "--paged acts only without --residency: leave out --residency, or leave out "
                                     "--paged")
    ((option, (index, value)),) = found.items()
    new = MOVED[(verb, option)]
    skip = {index, index + 1} if value is not None and "=" not in rest[index] else {index}
    kept = [w for i, w in enumerate(rest) if i not in skip]
    old_spellings, new_spellings = _spellings(verb), set(_spellings(new))
    out: List[str] = []
    i = 0
    while i < len(kept):
        word = kept[i]
        spelled = _resolve(word, old_spellings) if word.startswith("--") else None
        if spelled is not None and spelled not in new_spellings:
            given = word.split("=", 1)[1] if "=" in word else (kept[i + 1] if i + 1 < len(kept) else None)
            if given is not None and IMPLIED.get(new, {}).get(spelled) == given:
                i += 1 if "=" in word else 2
                continue
            raise OldSpellingError(verb, f"{spelled} acts only without {option}: leave out {option}, or leave out "
                                         f"{spelled}")
        out.append(word)
        i += 1
    strategies = ["--strategy", value] if option == "--residency" and value is not None else []
    note = (f"ferry: `ferry {verb} {option}` is `ferry {new}` now"
            + (f" (and {option} {value} is --strategy {value})" if strategies else "")
            + f"; `ferry {verb} {option}` is removed in the next release")
    return [*argv[:at], new, *strategies, *out], note
