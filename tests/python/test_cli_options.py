"""Every option of every verb against its help and the README: the README's table of each verb's
options (README.md, "## Options") lists every option and no other, with what it accepts and its
default as the help says them; the help says both for every option, and what it says an option
accepts is what the parser accepts. Then each refusal of an option that would do nothing beside
the others, of an empty list item, and of a type a verb does not take."""

from __future__ import annotations

import argparse
import os
import re
from typing import Dict, List, Tuple

import pytest

from conftest import refused
from ferry.cli import VERBS, build_parser, main
from ferry.cli.options import accepts, default_text, option_help

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")
VERB_NAMES = [v.__name__.rsplit(".", 1)[1] for v in VERBS]


def verb_parsers() -> Dict[str, argparse.ArgumentParser]:
    return {name: p for name, (_, p) in build_parser()[1].items()}


def option_actions(p: argparse.ArgumentParser) -> List[argparse.Action]:
    """The parser's options but --help."""
    return [a for a in p._actions if a.option_strings and a.dest != "help"]


def readme_tables() -> Dict[str, List[Tuple[Tuple[str, ...], str, str]]]:
    """Per verb, the rows of its table under "## Options": (option strings, accepts, default)."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    section = text.split("\n## Options\n", 1)[1].split("\n## ", 1)[0]
    tables: Dict[str, List[Tuple[Tuple[str, ...], str, str]]] = {}
    for part in re.split(r"^### ferry ", section, flags=re.M)[1:]:
        verb, _, body = part.partition("\n")
        rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in body.splitlines()
                if line.startswith("|")]
        assert rows[0] == ["option", "accepts", "default"], verb
        tables[verb.strip()] = [(tuple(re.findall(r"`([^`]+)`", r[0])), r[1], r[2]) for r in rows[2:]]
    return tables


def flat(text: str) -> str:
    """text on one line: whitespace runs as one space, a word argparse broke at its hyphen whole."""
    return " ".join(re.sub(r"-\n\s*", "-", text).split())


VERB_OPTIONS = [(verb, a) for verb, p in verb_parsers().items() for a in option_actions(p)]


def test_the_readme_has_a_table_for_each_verb_with_options() -> None:
    tables = readme_tables()
    assert set(tables) == {verb for verb, p in verb_parsers().items() if option_actions(p)}
    for verb, rows in tables.items():
        known = {tuple(a.option_strings) for a in option_actions(verb_parsers()[verb])}
        assert [r[0] for r in rows if r[0] not in known] == [], f"README lists options `ferry {verb}` lacks"
        assert len({r[0] for r in rows}) == len(rows), f"README lists an option of `ferry {verb}` twice"


@pytest.mark.parametrize("verb,action", VERB_OPTIONS, ids=[f"{v} {a.option_strings[0]}" for v, a in VERB_OPTIONS])
def test_each_option_agrees_with_its_help_and_the_readme(verb: str, action: argparse.Action) -> None:
    rows = {r[0]: r for r in readme_tables()[verb]}
    row = rows.get(tuple(action.option_strings))
    assert row is not None, f"README.md's table of `ferry {verb}` has no row for {'/'.join(action.option_strings)}"
    _, readme_accepts, readme_default = row
    help_text = option_help(action)
    # what it accepts: the README's words are the help's
    assert readme_accepts == accepts(action)
    if readme_accepts != "flag":
        assert readme_accepts in help_text
    # its default: the help says it, in the README's words, and it is the parser's where it has a value
    assert f"default {readme_default}" in help_text or f"default: {readme_default}" in help_text, help_text
    if default_text(action) is not None:
        assert readme_default == default_text(action)
    # and --help prints that help
    assert flat(help_text) in flat(verb_parsers()[verb].format_help())


def refuses(argv: List[str]) -> bool:
    """Whether parsing argv (no run) exits 2."""
    try:
        build_parser()[0].parse_args(argv)
    except SystemExit as e:
        assert e.code == 2
        return True
    return False


INTEGER = [(verb, a) for verb, a in VERB_OPTIONS if re.fullmatch(r"integers? >= \d+.*", accepts(a))]


@pytest.mark.parametrize("verb,action", INTEGER, ids=[f"{v} {a.option_strings[0]}" for v, a in INTEGER])
def test_an_integer_option_takes_what_it_says(verb: str, action: argparse.Action,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """"integer >= m": m is taken and m - 1 refused; a list of them refuses an empty item too."""
    m = int(re.findall(r"\d+", accepts(action))[0])
    opt = action.option_strings[0]
    assert not refuses([verb, opt, str(m)])
    assert refuses([verb, opt, str(m - 1)])
    if accepts(action).startswith("integers"):
        assert not refuses([verb, opt, f"{m},{m + 1}"])
        assert refuses([verb, opt, f"{m},,{m + 1}"]) and refuses([verb, opt, f"{m},"])
    capsys.readouterr()


CHOICES = [(verb, a) for verb, a in VERB_OPTIONS if a.choices is not None]


@pytest.mark.parametrize("verb,action", CHOICES, ids=[f"{v} {a.option_strings[0]}" for v, a in CHOICES])
def test_a_choice_option_takes_its_choices_only(verb: str, action: argparse.Action,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    opt = action.option_strings[0]
    assert all(not refuses([verb, opt, str(c)]) for c in action.choices or ())
    assert refuses([verb, opt, "nonesuch"])
    capsys.readouterr()


def test_type_says_per_verb_what_it_takes(capsys: pytest.CaptureFixture[str]) -> None:
    """The decode runs take the types attention reads and say so; the dry runs take any ferry type."""
    for verb in ("bench", "validate"):
        (action,) = [a for a in option_actions(verb_parsers()[verb]) if a.dest == "type"]
        assert accepts(action) == "f32, f16, q8_0" and "q4_0" not in option_help(action)
        assert "the types attention reads" in flat(open(README, encoding="utf-8").read())
        with pytest.raises(SystemExit) as e:
            main([verb, "--device", "cpu", "--type", "q4_0"])
        assert e.value.code == 2 and "--type 'q4_0': attention reads f32, f16, q8_0" in capsys.readouterr().err
    for verb in ("table", "plan"):
        (action,) = [a for a in option_actions(verb_parsers()[verb]) if a.dest == "type"]
        assert {"q4_0", "bf16", "q8_0"} <= set(accepts(action).split(", "))
        assert main([verb, "--type", "q4_0", "-npl", "2"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("argv,message", [
    (["bench", "--prefetch", "2"], "--prefetch sets how far an overlapped run queues ahead, and no run overlaps: "
                                   "give --overlap too"),
    (["bench", "--pref=2"], "give --overlap too"),  # an abbreviation is the option too
    (["validate", "--no-overlap", "--prefetch", "2"], "no run overlaps: leave out --no-overlap"),
    (["bench", "--compact", "--policy", "flat"], "--compact adds compact-staging runs of the non-flat policies, "
                                                 "and --policy flat has none"),
    (["validate", "--compact", "--policy", "flat"], "and --policy flat has none"),
    (["bench", "--in-process", "--repeat", "1"], "--in-process keeps a run's replicas in this process, and with "
                                                 "--repeat 1 there is one, made here anyway: leave it out"),
    (["bench", "--in-process", "--residency", "auto"], "and --residency runs its placements here anyway"),
    (["plan", "--v-trans"], "--v-trans lays V out transposed, and K's window is the same without it: "
                            "give --which v"),
    (["plan", "--v-trans", "--which", "k"], "give --which v"),
])
def test_an_option_that_would_do_nothing_is_refused(argv: List[str], message: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert message in refused(argv, capsys)


@pytest.mark.parametrize("verb", ["table", "plan", "bench", "validate"])
@pytest.mark.parametrize("option,value,message", [
    ("-npl", "2,,4", "argument -npl: '2,,4': item 2 is empty"),
    ("-npl", "2,4,", "argument -npl: '2,4,': item 3 is empty"),
    ("-npl", "2,2", "argument -npl: '2,2' lists a number twice"),
    ("-npl", ",", "argument -npl: ',': item 1 is empty"),
    ("--policy", "flat,,ranges", "argument --policy: 'flat,,ranges': item 2 is empty"),
    ("--policy", "", "argument --policy: expected at least one policy"),
])
def test_empty_list_items_are_refused_everywhere(verb: str, option: str, value: str, message: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    if option not in {s for a in option_actions(verb_parsers()[verb]) for s in a.option_strings}:
        pytest.skip(f"`ferry {verb}` has no {option}")
    assert message in refused([verb, option, value], capsys)


def test_what_the_refusals_leave_alone(capsys: pytest.CaptureFixture[str]) -> None:
    """The same options where they do something: parsed and checked without a refusal."""
    from ferry.cli.options import check_combinations, given_options

    for argv in (["bench", "--overlap", "--prefetch", "2"], ["validate", "--prefetch", "2"],
                 ["bench", "--compact", "--policy", "flat,ranges"], ["plan", "--v-trans", "--which", "v"],
                 ["bench", "--overlap"], ["bench", "--prefetch", "1", "--overlap"], ["bench", "--in-process"],
                 ["bench", "--in-process", "--repeat", "2"]):
        parser, parsers = build_parser()
        args = parser.parse_args(argv)
        check_combinations(argv[0], args, given_options(parsers[argv[0]][1], argv[1:]))
    assert main(["plan", "--v-trans", "--which", "v", "-npl", "2"]) == 0
    capsys.readouterr()


def test_validate_takes_the_window_options_with_their_meaning(capsys: pytest.CaptureFixture[str]) -> None:
    """-npl streams, -c / -npl cells each, -ntg steps a wave, --sequences in waves (default two)."""
    from ferry.cli.validate import configs_from_args

    args = build_parser()[0].parse_args(["validate", "-c", "512", "-npl", "2,8", "-ntg", "4", "-npp", "60"])
    cfgs = configs_from_args(args)
    assert [(c.n_stream, c.kv_size, c.n_step, c.n_seq, c.npp) for c in cfgs] == [(2, 256, 4, 4, 60),
                                                                                 (8, 64, 4, 16, 60)]
    args = build_parser()[0].parse_args(["validate", "-npl", "4", "--sequences", "5"])
    (cfg,) = configs_from_args(args)
    assert (cfg.n_seq, cfg.n_stream, cfg.kv_size, cfg.n_step, cfg.npp) == (5, 4, 1024, 8, 256)
    assert max(cfg.prompts()) <= 256 and min(cfg.prompts()) >= 9
