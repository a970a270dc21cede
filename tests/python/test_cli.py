"""One command line: every verb runs with no arguments, an option shared by name has the same choices
and default in every verb, each verb's help says what it is for with an example, --version, and
numbers out of range refused with a message naming the option, and the demo."""

from __future__ import annotations

import argparse
import importlib.metadata
from typing import Dict, List, Tuple

import pytest

import ferry
from ferry import cli
from ferry.cli import VERBS, build_parser, main

VERB_NAMES = [v.VERB.name for v in VERBS]


def verb_parsers() -> Dict[str, argparse.ArgumentParser]:
    return {name: p for name, (_, p) in build_parser()[1].items()}


def options(p: argparse.ArgumentParser) -> Dict[str, argparse.Action]:
    """Each option string of a parser (but --help) and its action."""
    return {s: a for a in p._actions for s in a.option_strings if s not in ("-h", "--help")}


@pytest.mark.parametrize("verb", [v for v in VERB_NAMES if v != "remote-serve"])  # it serves until killed:
def test_every_verb_runs_with_no_arguments(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([verb]) == 0
    assert capsys.readouterr().out.strip()


def shared_options() -> List[Tuple[str, Dict[str, argparse.Action]]]:
    by_option: Dict[str, Dict[str, argparse.Action]] = {}
    for verb, p in verb_parsers().items():
        for opt, action in options(p).items():
            by_option.setdefault(opt, {})[verb] = action
    return sorted((o, verbs) for o, verbs in by_option.items() if len(verbs) > 1)


def test_the_device_type_and_geometry_options_are_shared_across_verbs() -> None:
    """The options the check below compares: these, shared by name across verbs, are among them."""
    names = {o for o, _ in shared_options()}
    assert {"--device", "--type", "-c", "-npl", "--head-dim", "--kv-heads", "--model", "--json"} <= names


#: Options whose default differs by verb, and why: the hash gate checks every policy, over streams of
#: different lengths, prefetching in both scopes; the bench compares the policies that copy
#: differently, over equal lengths, prefetching across steps as a serving loop would. remote-serve holds
#: one cache: one number of streams.
VERB_DEFAULTS = {"--policy": {"validate"}, "--lengths": {"validate"}, "--prefetch-next": {"validate"},
                 "-npl": {"remote-serve"}}


@pytest.mark.parametrize("option,actions", shared_options(), ids=[o for o, _ in shared_options()])
def test_a_shared_option_has_one_meaning(option: str, actions: Dict[str, argparse.Action]) -> None:
    seen = {verb: (a.dest, a.choices, a.default, a.nargs, a.metavar) for verb, a in actions.items()
            if verb not in VERB_DEFAULTS.get(option, set())}
    assert len(set(map(repr, seen.values()))) == 1, seen
    kept = {verb: (a.dest, a.choices, a.nargs, a.metavar) for verb, a in actions.items()}
    assert len(set(map(repr, kept.values()))) == 1, kept


def test_backend_is_auto_cpu_cuda_wherever_it_is() -> None:
    for verb, p in verb_parsers().items():
        a = options(p).get("--device")
        if a is not None:
            assert (list(a.choices or ()), a.default) == (["auto", "cpu", "cuda"], "auto"), verb


@pytest.mark.parametrize("verb", VERB_NAMES)
def test_help_says_what_for_and_gives_an_example(verb: str) -> None:
    text = verb_parsers()[verb].format_help()
    about = " ".join(dict(zip(VERB_NAMES, VERBS))[verb].VERB.about.split())
    assert about and about in " ".join(text.split())
    example = text.split("example:\n", 1)[1].strip().splitlines()[0]
    assert example.startswith(f"ferry {verb}")


def test_every_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """Each verb's example runs (the benches' take 20 s on 2 cores: their options are only parsed)."""
    parser = build_parser()[0]
    for verb in VERB_NAMES:
        text = verb_parsers()[verb].format_help()
        example = text.split("example:\n", 1)[1].strip().splitlines()[0].split()
        assert parser.parse_args(example[1:]).verb == verb
    for verb in ("demo", "table", "plan", "validate", "residency-plan", "paged-plan"):
        text = verb_parsers()[verb].format_help()
        example = text.split("example:\n", 1)[1].strip().splitlines()[0].split()
        assert main(example[1:]) == 0, example
    capsys.readouterr()


def test_help_lists_every_verb_with_what_it_is_for(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 42: `ferry --help` lists every program, the residency planner's and the paged cache's too."""
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    flat = " ".join(capsys.readouterr().out.split())
    assert {"residency-plan", "residency-bench", "paged-plan", "paged-bench"} <= set(VERB_NAMES)
    for verb in VERBS:
        assert f"{verb.VERB.name} {' '.join(verb.VERB.summary.split())}" in flat, verb.VERB.name


def test_version_prints_the_installed_packages_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"ferry {ferry.__version__}\n"
    assert ferry.__version__ == importlib.metadata.version("ferry")


OUT_OF_RANGE = [
    (verb, option, value)
    for verb in VERB_NAMES  # issue 42: the residency and paged verbs too (plan took --heads, --layers for them)
    for option, values in {
        "-c": ("0", "-1", str(2**31)), "-npl": ("0", "2,-4"), "-npp": ("0",), "-ntg": ("-1", "99999999999"),
        "--pad": ("0",), "--head-dim": ("0", "-128"), "--kv-heads": ("0",), "--heads": ("0",), "--layers": ("-2",),
        "--repeat": ("0",), "--sequences": ("0",),
        "--seed": ("-1",),
    }.items()
    for value in values
    if option in options(verb_parsers()[verb])
]


@pytest.mark.parametrize("verb,option,value", OUT_OF_RANGE)
def test_numbers_out_of_range_exit_2_naming_the_option(verb: str, option: str, value: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main([verb, option, value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}:" in err and "out of range" in err and "Traceback" not in err


def test_bench_refuses_no_generated_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    """-ntg 0 is a dry run's (table, plan) but not a benchmark's."""
    with pytest.raises(SystemExit) as e:
        main(["bench", "-ntg", "0"])
    assert e.value.code == 2 and "argument -ntg: 0 is out of range: 1.." in capsys.readouterr().err
    assert main(["table", "-ntg", "0"]) == 0


def test_demo_prints_the_bytes_read_against_the_span(capsys) -> None:
    assert cli.main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "bytes read 4,734,976  span (nbytes) 20,193,280  ratio 4.26x" in out


def test_demo_exits_0_and_prints_its_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    assert "ratio 4.26x" in capsys.readouterr().out


def test_the_overlap_report_fits_100_columns_without_wide(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 41, item 23: the --overlap table was 202 columns wide; its longest rows (compact, two depths,
    both scopes) fit 100 without --wide, and --wide still gives every figure."""
    from ferry.cli import bench as bench_cli

    cfg = bench_cli.config_from_args(build_parser()[0].parse_args(
        ["bench", "-c", "64", "-npl", "2", "-npp", "4", "-ntg", "2", "--head-dim", "32", "--kv-heads", "1",
         "--heads", "1", "--layers", "2", "--repeat", "1", "--rounds", "1", "--device", "cpu", "--overlap",
         "--compact", "--prefetch", "1,16", "--prefetch-next", "both"]))
    res = bench_cli.run_bench(cfg)
    text = bench_cli.format_result(res)
    assert max(len(line) for line in text.splitlines()) <= 100, text
    assert "ranges+compact  16 within" in text and "compute x" in text and "/ floor" in text
    wide = bench_cli.format_result(res, wide=True)
    assert "ranges+compact+overlap16-within" in wide and "/ serial" in wide and "ahead" in wide
