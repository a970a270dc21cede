"""The one table of options (ferry.cli.option_table) against what the command does: every option of
every verb is one row; the parsers, `--help` and docs/cli.md come from it; each option changes what
runs where the table says it acts, and is refused with exit 2, naming it, where it would do
nothing. Then what each option accepts, and the refusals of empty list items and of types a verb
does not take."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from conftest import refused
from ferry.cli import VERBS, build_parser, main, prepare
from ferry.cli import option_table as ot
from ferry.cli.reference import markdown
from ferry.remote import engine_missing
from test_model_file import write_gguf

ROOT = Path(__file__).resolve().parents[2]
VERB_NAMES = [v.VERB.name for v in VERBS]
WITH_OPTIONS = [v for v in VERB_NAMES if ot.options_of(v)]


def verb_parsers() -> Dict[str, argparse.ArgumentParser]:
    return {name: p for name, (_, p) in build_parser()[1].items()}


def option_actions(p: argparse.ArgumentParser) -> List[argparse.Action]:
    """The parser's options but --help."""
    return [a for a in p._actions if a.option_strings and a.dest != "help"]


def test_each_option_of_each_verb_is_one_row_and_the_parsers_are_the_table() -> None:
    for verb, p in verb_parsers().items():
        rows = ot.options_of(verb)
        flags = [f for o in rows for f in o.flags]
        assert len(flags) == len(set(flags)), f"`ferry {verb}`: an option in two rows"
        parsed = [tuple(a.option_strings) for a in option_actions(p)]
        table = [o.flags + ((f"--no-{o.name[2:]}",) if o.argparse.get("action") is argparse.BooleanOptionalAction
                            else ()) for o in rows]
        assert parsed == table, verb


def test_the_option_reference_is_generated_and_current() -> None:
    with open(ROOT / "docs" / "cli.md", encoding="utf-8") as f:
        on_disk = f.read()
    assert on_disk == markdown([v.VERB for v in VERBS]), \
        "docs/cli.md is stale: run tools/cli-reference"


@pytest.mark.parametrize("verb", VERB_NAMES)
def test_help_is_at_most_80_lines_and_lists_every_option_with_its_default_and_when_it_acts(verb: str) -> None:
    text = verb_parsers()[verb].format_help()
    assert len(text.splitlines()) <= 80, f"`ferry {verb} --help` is {len(text.splitlines())} lines"
    flat = " ".join(text.split())
    for o in ot.options_of(verb):
        assert o.name in text or f"--[no-]{o.name[2:]}" in text
        assert " ".join(o.help.split()) in flat
        if not o.is_flag and o.default != "none":
            assert f"default {o.default}" in flat, o.name
        if o.verbs[verb].conds:
            assert o.verbs[verb].text in flat, o.name


# ------------------------------------------------------------ every (verb, option): acts or is refused

#: A command line of tiny sizes per verb, which runs in a moment and on which each probe below acts.
BASE = {
    "table": ["-c", "128", "-npl", "2", "-npp", "8", "-ntg", "2", "--head-dim", "32", "--kv-heads", "1"],
    "plan": ["-c", "128", "-npl", "2", "-npp", "8", "-ntg", "2", "--head-dim", "32", "--kv-heads", "1"],
    "bench": ["-c", "128", "-npl", "2", "-npp", "8", "-ntg", "2", "--head-dim", "32", "--kv-heads", "1",
              "--heads", "2", "--layers", "2"],
    "validate": ["-c", "128", "-npl", "2", "-npp", "8", "-ntg", "2", "--head-dim", "32", "--kv-heads", "1",
                 "--heads", "2", "--layers", "2"],
    "residency-plan": ["-c", "128", "-npl", "2", "-npp", "8", "-ntg", "2", "--head-dim", "32", "--kv-heads", "1",
                       "--heads", "2", "--layers", "2", "--compute-us", "10"],
    "residency-bench": ["-c", "128", "-npl", "2", "-npp", "8", "-ntg", "2", "--head-dim", "32", "--kv-heads", "1",
                        "--heads", "2", "--layers", "2", "--compute-us", "10"],
    "paged-plan": ["-c", "128", "-npl", "2", "-npp", "8", "-ntg", "2", "--head-dim", "32", "--kv-heads", "1"],
    "paged-bench": ["-c", "128", "-npl", "2", "-npp", "8", "-ntg", "2", "--head-dim", "32", "--kv-heads", "1",
                    "--heads", "2", "--layers", "2", "--block-size", "4"],  # room for a shared prefix
    "remote-serve": ["-c", "128", "-npl", "2", "--head-dim", "32", "--kv-heads", "1", "--layers", "2"],
}

#: Per option, a value that is not its default and that acts on BASE (None: a flag). --model's is a
#: file written by the test.
PROBES: Dict[str, Any] = {
    "-c": "256", "-npl": {"remote-serve": "4", "*": "2,4"}, "-npp": "16", "-ntg": "3", "--pad": "4",
    "--lengths": {"validate": "equal", "*": "uniform"},
    "--row-ns": "100", "--sequences": "6", "--type": "f32",
    "--head-dim": "64", "--kv-heads": "2", "--heads": "4", "--layers": "3", "--model": "MODEL",
    "--swa-window": "4", "--swa-layers": "ss", "--v-trans": None, "--which": "v", "--stream": "1-1",
    "--cost-model": "cpu", "--policy": "flat,ranges", "--compact": None, "--unified": "--no-unified",
    "--no-reuse": None, "--overlap": None, "--no-overlap": None, "--prefetch": "2", "--prefetch-next": "off", "--seed": "7",
    "--repeat": "3", "--rounds": "2", "--device": "cpu",
    "--devices": "2", "--link-gbps": "2.45", "--link-profile": "pcie4", "--latency-us": "2", "--device-memory": "64MiB",
    "--compute-slowdown": "2", "--kv-device-layers": "1", "--placement": "0,h", "--layer-devices": "0,0",
    "--strategy": "auto,first", "--reserve": "1MiB", "--compute-us": "100", "--json": None, "--wide": None,
    "--plot": "chart.png", "--trace": "trace.json", "--paged": None, "--remote": None, "--block-size": "8",
    "--adjacency": "0.9", "--draft": "2", "--accept": "0.5", "--chunk": "3", "--shared-prefix": "4",
    "--device-blocks": "0.5", "--pool-prefetch": None, "--remote-link": "150,12,2", "--host-memory": "16KiB",
    "--host": "10.0.0.5", "--protocol": "rdma",
}

#: Per condition of the table, the arguments that make it hold, and those that make it fail.
CONTEXT: Dict[ot.Cond, Tuple[List[str], List[str]]] = {
    ot.OVERLAP.conds[0]: (["--overlap"], []),
    ot.GATE_OVERLAP.conds[0]: ([], ["--no-overlap"]),
    ot.STANDIN.conds[0]: ([], ["--device", "cuda"]),
    ot.NON_FLAT.conds[0]: ([], ["--policy", "flat"]),
    ot.WHICH_V.conds[0]: (["--which", "v"], []),
    ot.TABLE_OUT.conds[0]: ([], ["--json"]),
    ot.SWA_PAIR.conds[0]: (["--swa-window", "8", "--swa-layers", "fs"], []),
    ot.UNIFIED_RUNS.conds[0]: ([], ["--devices", "2"]),
    ot.PAGED.conds[0]: (["--paged"], []),
    ot.DRAFT.conds[0]: (["--draft", "2"], []),
    ot.REMOTE_LINK.conds[0]: (["--remote-link", "150,12,2"], []),
}

WALK = [(verb, o) for verb in WITH_OPTIONS for o in ot.options_of(verb)]


def probe(o: ot.Option, model: str, verb: str = "") -> List[str]:
    value = PROBES[o.name]
    if isinstance(value, dict):  # a value per verb, where the verbs' defaults differ
        value = value.get(verb, value["*"])
    if value is None:
        return [o.name]
    if value.startswith("--"):
        return [value]
    return [o.name, model if value == "MODEL" else value]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("model") / "tiny.gguf"
    write_gguf(path, "llama", blocks=2, ctx=256, embd=128, heads=4, heads_kv=2)
    return str(path)


def job(argv: List[str], capsys: pytest.CaptureFixture[str]) -> Any:
    _, _, j = prepare(argv)
    capsys.readouterr()
    return j


def accepted(argv: List[str], capsys: pytest.CaptureFixture[str]) -> Any:
    """The job of argv, or None where the command line refuses it (exit 2)."""
    try:
        return job(argv, capsys)
    except SystemExit as e:
        assert e.code == 2
        capsys.readouterr()
        return None


#: The command lines' other modes, in which each option either acts or is refused.
MODES = sorted({tuple(argv) for pair in CONTEXT.values() for argv in pair if argv})


@pytest.mark.parametrize("verb,o", WALK, ids=[f"{v} {o.name}" for v, o in WALK])
def test_each_option_changes_what_runs_where_it_acts_and_is_refused_elsewhere(
        verb: str, o: ot.Option, model: str, capsys: pytest.CaptureFixture[str]) -> None:
    if o.name == "--remote" and engine_missing() is not None:
        pytest.skip(f"--remote is refused without the transfer engine: {engine_missing()}")
    if o.name in ("--remote-link", "--host-memory") and verb == "residency-bench" and engine_missing() is not None:
        pytest.skip(f"residency-bench refuses --remote-link without the transfer engine: {engine_missing()}")
    conds = o.verbs[verb].conds
    context = [a for c in conds for a in CONTEXT[c][0]]
    # --model gives what the command line does not: the geometry is left to it
    shape = ["-npl", "2", "-npp", "8", "-ntg", "2"] if o.name == "--model" else BASE[verb]
    base = [verb, *shape, *context]
    assert job(base, capsys) != job(base + probe(o, model, verb), capsys), f"{o.name} changes nothing where it acts"
    for c in conds:
        others = [a for c2 in conds if c2 is not c for a in CONTEXT[c2][0]]
        argv = [verb, *shape, *others, *CONTEXT[c][1], *probe(o, model, verb)]
        err = refused(argv, capsys)
        # the option is refused, or first an option of its context that needs the same condition
        named = [a for a in [o.name, *probe(o, model, verb)[:1], *others]  # as given: --no-unified
                 if a.startswith("--") and f"{a} acts only {c.text}" in err]
        assert named, (argv, err)
    # and in every other mode of the command line it is taken in, it changes what runs
    for mode in MODES:
        if set(mode) & {*o.flags, *probe(o, model, verb)[:1]}:
            continue  # the mode sets this option itself
        without, with_it = accepted(base + list(mode), capsys), accepted(base + list(mode) + probe(o, model, verb), capsys)
        if without is not None and with_it is not None:
            assert without != with_it, f"{o.name} changes nothing with {' '.join(mode)}"


def test_a_verb_runs_one_program_and_few_rows_hang_on_a_mode() -> None:
    """Issue 42: no option swaps another program in behind a verb, so no condition names one (--residency,
    --paged of plan or bench), and at most 5 rows act only in a mode: validate's --paged, which adds the
    paged gathers to the gate's rows, with its block size and adjacency."""
    assert not [c.text for o in ot.OPTIONS for w in o.verbs.values() for c in w.conds if "--residency" in c.text]
    moded = [o.name for o in ot.OPTIONS if any("--paged" in c.text for w in o.verbs.values() for c in w.conds)]
    assert len(moded) <= 5, moded
    assert not [(v, o.name) for o in ot.OPTIONS for v in ("plan", "bench") if o.name in ("--residency", "--paged")
                and v in o.verbs]


def test_every_condition_and_option_has_its_context_and_probe() -> None:
    assert {c for o in ot.OPTIONS for w in o.verbs.values() for c in w.conds} <= set(CONTEXT)
    assert {o.name for o in ot.OPTIONS} <= set(PROBES)


@pytest.mark.parametrize("argv,message", [
    (["bench", "--residency", "--policy", "flat"], "--policy acts only without --residency"),  # issue 32, item 8
    # item 9 and the like: an option of the residency planner, given to a verb that has none of it (it was
    # a mode of plan and bench: "acts only with --residency"), names the verbs that take it (issue 42)
    (["plan", "--overlap"], "--overlap is an option of ferry bench, ferry residency-plan, ferry residency-bench"),
    (["plan", "--reserve", "1MiB"], "--reserve is an option of ferry residency-plan, ferry residency-bench"),
    (["plan", "--compute-us", "100"], "--compute-us is an option of ferry residency-plan, ferry residency-bench"),
    (["plan", "--kv-device-layers", "1"], "--kv-device-layers is an option of ferry bench, ferry validate, "
                                          "ferry residency-plan, ferry residency-bench"),
    (["plan", "--devices", "2", "--link-gbps", "1,2"], "--devices is an option of ferry residency-plan, ferry bench"),
    (["plan", "--residency", "--prefetch", "2"], "--prefetch acts only with --overlap"),
    (["residency-plan", "--prefetch", "2"], "--prefetch acts only with --overlap"),
    (["bench", "--reserve", "1MiB"], "--reserve is an option of ferry residency-plan, ferry residency-bench"),
    (["bench", "--compute-us", "100"], "--compute-us is an option of ferry residency-plan, ferry residency-bench"),
    (["bench", "--residency", "--wide"], "--wide acts only without --residency"),
    (["bench", "--prefetch-n=on"], "--prefetch-next acts only with --overlap"),  # an abbreviation is the option too
    (["validate", "--no-overlap", "--prefetch", "2"], "--prefetch acts only without --no-overlap"),
    (["bench", "--compact", "--policy", "flat"], "--compact acts only with a non-flat --policy"),
    (["plan", "--v-trans"], "--v-trans acts only with --which v: give --which v, or leave out --v-trans"),
    (["paged-plan", "--v-trans"], "--v-trans acts only with --which v"),
    (["bench", "--json", "--wide"], "--wide acts only without --json"),
    (["bench", "--block-size", "8"], "--block-size is an option of ferry paged-plan, ferry paged-bench, "
                                     "ferry validate, ferry remote-serve"),  # issue 36
    (["remote-serve", "--block-size", "8"], "--block-size acts only with --paged: give --paged"),
    (["validate", "--adjacency", "0.9"], "--adjacency acts only with --paged"),
    (["plan", "--row-ns", "100"], "--row-ns is an option of ferry paged-plan, ferry bench"),
    (["plan", "--paged", "--pad", "4"], "--pad acts only without --paged"),
    (["plan", "--paged", "--cost-model", "cpu"], "--cost-model acts only without --paged: leave out --paged"),
    (["plan", "--paged", "--residency"], "--paged acts only without --residency"),
    (["bench", "--paged", "--overlap"], "--overlap acts only without --paged"),
    (["bench", "--paged", "--compact"], "--compact acts only without --paged"),
    (["bench", "--paged", "--no-unified"], "--no-unified acts only without --paged: leave out --paged, or leave "
                                           "out --no-unified"),  # issue 41, item 10: as the command line spells it
    (["bench", "--paged", "--no-uni"], "--no-unified acts only without --paged"),
    (["bench", "--paged", "--wide"], "--wide acts only without --paged"),
    (["bench", "--paged", "--block-size", "0"], "argument --block-size: 0 is out of range"),
    (["paged-bench", "--block-size", "0"], "argument --block-size: 0 is out of range"),
    (["bench", "--paged", "--adjacency", "1.5"], "argument --adjacency: --adjacency: 1.5 is out of range: 0..1"),
    (["validate", "--paged", "--adjacency", "x"], "argument --adjacency"),
    (["bench", "--shared-prefix", "16"], "--shared-prefix is an option of ferry paged-bench"),
    (["validate", "--paged", "--device-blocks", "0.5"], "--device-blocks is an option of ferry paged-bench"),
    (["paged-bench", "--shared-prefix", "8"], "--shared-prefix must be whole --block-size 16 blocks of cells"),
    (["paged-bench", "--shared-prefix", "512"], "--shared-prefix 512 is longer than the shortest prompt"),
    (["paged-bench", "--device-blocks", "0"], "--device-blocks must be a share above 0 and at most 1"),
    (["paged-bench", "--device-blocks", "1.5"], "argument --device-blocks"),
    # the paged run's one policy and one device: --policy and --devices were refused by the run's config
    # (BenchConfig._check_paged, still tested in test_paged_cli.py); paged-bench has neither option
    (["bench", "--paged", "--policy", "flat,ragged"], "--policy acts only without --paged"),
    (["bench", "--paged", "--devices", "2"], "--devices acts only without --paged"),
    (["paged-bench", "--devices", "2"], "--devices is an option of"),
    (["plan", "--paged", "-c", "256", "-npl", "4", "-npp", "100", "-ntg", "1"],
     "-npl 4 sequences of 101 cells take 28 blocks of 16 cells; -c 256 holds 16: give a larger -c"),
    # issue 41, item 14: one rule of --block-size, every verb that takes it
    *[([*verb, "--block-size", "5000", "-c", "4096"], "-npl 2 sequences of 264 cells take 2 blocks of "
       "5000 cells; -c 4096 holds 1: give a larger -c or a smaller --block-size")
      for verb in (["plan", "--paged"], ["bench", "--paged"], ["validate", "--paged"], ["paged-plan"],
                   ["paged-bench"])],
])
def test_an_option_that_would_do_nothing_is_refused(argv: List[str], message: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert message in refused(argv, capsys)


# ------------------------------------------------------------ what each option accepts


def refuses(argv: List[str]) -> bool:
    """Whether parsing argv (no run) exits 2."""
    try:
        build_parser()[0].parse_args(argv)
    except SystemExit as e:
        assert e.code == 2
        return True
    return False


VERB_ROWS = [(verb, o) for verb in WITH_OPTIONS for o in ot.options_of(verb)]
INTEGER = [(verb, o) for verb, o in VERB_ROWS if re.fullmatch(r"integers? >= \d+.*", o.takes)]
CHOICES = [(verb, o) for verb, o in VERB_ROWS if "choices" in o.argparse]


@pytest.mark.parametrize("verb,o", INTEGER, ids=[f"{v} {o.name}" for v, o in INTEGER])
def test_an_integer_option_takes_what_it_says(verb: str, o: ot.Option, capsys: pytest.CaptureFixture[str]) -> None:
    """"integer >= m": m is taken and m - 1 refused; a list of them refuses an empty item too."""
    m = int(re.findall(r"\d+", o.takes)[0])
    assert not refuses([verb, o.name, str(m)])
    assert refuses([verb, o.name, str(m - 1)])
    if o.takes.startswith("integers"):
        assert not refuses([verb, o.name, f"{m},{m + 1}"])
        assert refuses([verb, o.name, f"{m},,{m + 1}"]) and refuses([verb, o.name, f"{m},"])
    capsys.readouterr()


@pytest.mark.parametrize("verb,o", CHOICES, ids=[f"{v} {o.name}" for v, o in CHOICES])
def test_a_choice_option_takes_its_choices_only(verb: str, o: ot.Option, capsys: pytest.CaptureFixture[str]) -> None:
    assert all(not refuses([verb, o.name, str(c)]) for c in o.argparse["choices"])
    assert refuses([verb, o.name, "nonesuch"])
    capsys.readouterr()


def test_type_says_per_verb_what_it_takes(capsys: pytest.CaptureFixture[str]) -> None:
    """The decode runs take the types attention reads and say so; the dry runs take any ferry type."""
    for verb in ("bench", "validate"):
        (o,) = [o for o in ot.options_of(verb) if o.name == "--type"]
        assert o.takes == "f32, f16, q8_0"
        with pytest.raises(SystemExit) as e:
            main([verb, "--device", "cpu", "--type", "q4_0"])
        assert e.value.code == 2 and "--type 'q4_0': attention reads f32, f16, q8_0" in capsys.readouterr().err
    for verb in ("table", "plan"):
        (o,) = [o for o in ot.options_of(verb) if o.name == "--type"]
        assert {"q4_0", "bf16", "q8_0"} <= set(o.takes.split(", "))
        assert main([verb, "--type", "q4_0", "-npl", "2"]) == 0
    capsys.readouterr()


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
    if option not in {f for o in ot.options_of(verb) for f in o.flags}:
        pytest.skip(f"`ferry {verb}` has no {option}")
    assert message in refused([verb, option, value], capsys)


def test_validate_takes_the_window_options_with_their_meaning(capsys: pytest.CaptureFixture[str]) -> None:
    """-npl streams, -c / -npl cells each, -ntg steps a wave, --sequences in waves (default two)."""
    cfgs = job(["validate", "-c", "512", "-npl", "2,8", "-ntg", "4", "-npp", "60"], capsys).configs
    assert [(c.waves.n_stream, c.waves.kv_size, c.waves.n_step, c.waves.n_seq, c.waves.npp) for c in cfgs] == [(2, 256, 4, 4, 60),
                                                                                 (8, 64, 4, 16, 60)]
    (cfg,) = job(["validate", "-npl", "4", "--sequences", "5"], capsys).configs
    assert (cfg.waves.n_seq, cfg.waves.n_stream, cfg.waves.kv_size, cfg.waves.n_step, cfg.waves.npp) == (5, 4, 1024, 8, 256)
    assert max(cfg.prompts()) <= 256 and min(cfg.prompts()) >= 9


def test_a_placement_that_is_no_file_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 32, item 12: a path that names no file is not "neither h nor a device index"."""
    missing = str(tmp_path / "nonexistent")
    err = refused(["bench", "--devices", "2", "--placement", missing], capsys)
    assert f"no file '{missing}'" in err
    assert "no file 'placement'" in refused(["validate", "--placement", "placement"], capsys)
    assert "is neither h" in refused(["validate", "--placement", "h,x"], capsys)
    path = tmp_path / "placement.txt"
    path.write_text("0\nh\n")
    assert job(["validate", "--placement", str(path)], capsys).configs[0].devices.placement == (0, None)
    assert os.path.exists(path)


# ------------------------------------------------------------ issue 41: messages and --help


@pytest.mark.parametrize("argv,message", [
    (["bench", "--device-memory", "-1GiB"], "argument --device-memory: --device-memory: '-1GiB' is negative"),
    (["residency-bench", "--devices", "2", "--reserve", "-1MiB"], "argument --reserve: --reserve: '-1MiB' is "
                                                                   "negative"),
    (["bench", "--devices", "2", "--reserve", "-1MiB", "--residency"], "argument --reserve: --reserve: '-1MiB' is "
                                                                       "negative"),
    (["bench", "--row-ns", "-1,2"], "argument --row-ns: --row-ns: -1 is out of range: 0..1e+06"),
    (["bench", "--latency-us", "-.5"], "argument --latency-us: --latency-us: -.5 is out of range"),
    (["residency-plan", "--compute-us", "-1e3"], "argument --compute-us: --compute-us: -1e3 is out of range"),
    (["plan", "--compute-us", "-1e3", "--residency"], "argument --compute-us: --compute-us: -1e3 is out of range"),
    (["bench", "-c", "-5"], "argument -c: -5 is out of range"),
    (["bench", "--polcy", "flat"], "unrecognized arguments: --polcy flat; --polcy: did you mean --policy?"),
    (["validate", "--sequnces=4"], "--sequnces: did you mean --sequences?"),
    # plan names no --layers (issue 42: it took --layers only for --residency, whose verb is its own now)
    (["plan", "--head-dim", "1000000000", "-c", "2000000000", "--kv-heads", "1000000"],
     "-c 2000000000, --head-dim 1000000000, --kv-heads 1000000, --type f16: the cache these sizes give is "
     "too large to lay out (tensor_new: the shape's byte size overflows); give a smaller -c or "
     "--head-dim or --kv-heads"),
    (["residency-plan", "--head-dim", "1000000000", "-c", "2000000000", "--kv-heads", "1000000", "--heads", "1000000",
      "--compute-us", "1"],
     "-c 2000000000, --layers 2, --head-dim 1000000000, --kv-heads 1000000, --type f16: the cache these sizes give is "
     "too large to lay out"),
    (["table", "--head-dim", "2000000000", "-c", "2000000000", "--kv-heads", "2000000000", "-npl", "1"],
     "-c 2000000000, --head-dim 2000000000, --kv-heads 2000000000, --type f16: the cache these sizes give"),
    (["bench", "--heads", "1", "--head-dim", "2000000000", "-c", "2000000000", "--kv-heads", "1", "-npl", "1"],
     "-c 2000000000, --layers 2, --head-dim 2000000000, --kv-heads 1, --type f16: the cache these sizes give is "
     "too large to lay out (kv_cache: 2 layers of K and V overflow a buffer's size)"),
    (["validate", "--heads", "1", "--head-dim", "2000000000", "-c", "2000000000", "--kv-heads", "1"],
     "-c 2000000000, --layers 2, --head-dim 2000000000"),
    (["bench", "--residency", "--heads", "2000000000", "--head-dim", "2000000000", "-c", "2000000000",
      "--kv-heads", "2000000000", "-npl", "1"], "the cache these sizes give is too large to lay out"),
])
def test_each_refusal_names_the_option_as_given(argv: List[str], message: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 41, item 10: a negative-looking value is the option's value, refused by its own check; an
    unknown option gets the closest one; a size that overflows names the options that size the cache."""
    assert message in refused(argv, capsys)


def test_a_missing_model_file_is_missing_with_or_without_gguf(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 41, item 10: not "needs the gguf package" for a file that is not there."""
    import sys

    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf fails
    err = refused(["plan", "--model", "/nonexistent.gguf"], capsys)
    assert "--model /nonexistent.gguf: not a readable GGUF file (No such file or directory)" in err
    assert "gguf package" not in err


def test_validate_lengths_equal_takes_prompts_of_one_length(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 41, item 10: --lengths equal draws no prompts of different lengths, so -npp -ntg + 1 runs;
    uniform still needs room for two lengths, and says so."""
    argv = ["validate", *BASE["validate"], "-npp", "3", "--no-overlap", "--policy", "flat,ragged"]
    assert main([*argv, "--lengths", "equal"]) == 0
    assert "gate: pass" in capsys.readouterr().out
    assert "-npp 3: --lengths uniform draws prompts of different lengths" in refused(argv, capsys)
    assert "-npp 2: a prompt has at least -ntg + 1 = 3 cells" in refused([*argv[:-5], "-npp", "2", "--lengths",
                                                                         "equal"], capsys)


@pytest.mark.parametrize("text,line,word", [("3\n1_0\n", 2, "1_0"), ("+5", 1, "+5"), ("2, 4\n\n\u0663", 3, "\u0663"),
                                            ("2 \u00b2", 1, "\u00b2"), ("4 -1", 1, "-1"), ("4 1.5", 1, "1.5")])
def test_a_lengths_file_takes_plain_digits_only(text: str, line: int, word: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 41, item 10: int() takes "1_0", "+5" and other scripts' digits; a lengths file does not."""
    path = tmp_path / "lengths.txt"
    path.write_text(text, encoding="utf-8")
    err = refused(["table", "-npl", "2", "--lengths", str(path)], capsys)
    assert f"--lengths {path}: line {line}: {word!r} is not a length" in err


@pytest.mark.parametrize("option,extra", [("--lengths", ["table"]), ("--lengths", ["bench"]),
                                          ("--placement", ["validate"]), ("--placement", ["bench", "--devices", "2"])])
def test_an_option_file_is_read_up_to_a_bound(option: str, extra: List[str], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 41, item 12: /dev/zero never ends, a file of a MiB and a byte is larger than any list."""
    from ferry.workloads.devices import MAX_OPTION_FILE

    big = tmp_path / "big.txt"
    big.write_text("1\n" * (MAX_OPTION_FILE // 2) + "1")
    for path in ("/dev/zero", str(big)):
        err = refused([*extra, option, path], capsys)
        assert f"{option} {path}: holds more than 1 MiB" in err
    (tmp_path / "ok.txt").write_text("1\n" * (MAX_OPTION_FILE // 2 - 8))  # under the bound: read
    assert "holds more than" not in " ".join(refused_or_none([*extra, option, str(tmp_path / "ok.txt")], capsys))


def refused_or_none(argv: List[str], capsys: pytest.CaptureFixture[str]) -> List[str]:
    """What parsing argv into its job wrote on stderr when refused (exit 2), else nothing."""
    try:
        prepare(argv)
    except SystemExit as e:
        assert e.code == 2
        return [capsys.readouterr().err]
    return []


@pytest.mark.parametrize("verb", ["table", "plan", "bench", "validate"])
def test_help_lists_the_words_an_option_takes(verb: str) -> None:
    """Issue 41, item 23: --type's values and --lengths' and --policy's words, from where the code keeps them."""
    from ferry.workloads.common import KV_TYPES, LENGTHS, POLICIES

    flat = " ".join(verb_parsers()[verb].format_help().split())
    assert "--type TYPE" in flat
    types = KV_TYPES if verb in ("bench", "validate") else ot.ANY_TYPE
    assert ", ".join(types) in flat
    if verb != "plan":
        assert f"{' or '.join(LENGTHS)} (-npp cells; seeded draws up to -npp), or a file of at most 1 MiB" in flat
    if verb in ("bench", "validate"):
        assert f"{', '.join(POLICIES)}, comma-separated" in flat
        assert "(auto, cpu, cuda; default auto)" in flat


def test_prefetch_next_shows_each_verbs_own_default(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 41, item 23: not "(default on, validate both)" under both verbs."""
    for verb, default in (("bench", "on"), ("validate", "both")):
        flat = " ".join(verb_parsers()[verb].format_help().split())
        assert f"(on, off, both; default {default})" in flat and "validate both" not in flat
    assert job(["bench", "--overlap"], capsys).config.variants.prefetch_next == (True,)
    assert job(["validate"], capsys).configs[0].variants.prefetch_next == (True, False)


def test_the_standin_options_take_the_range_the_library_takes() -> None:
    """Issue 41, item 23: one bound, STANDIN_MAX, in the options' texts and parsers and in StandinBackend."""
    import math

    import ferry
    from ferry.workloads.devices import STANDIN_MAX

    for field in ("latency_us", "row_ns", "compute_slowdown", "link_gbps"):
        ferry.StandinBackend(**{field: STANDIN_MAX}).close()
        with pytest.raises(ferry.InvalidArgumentError, match=field):
            ferry.StandinBackend(**{field: math.nextafter(STANDIN_MAX, math.inf)})
        o = next(o for o in ot.options_of("bench") if o.dest == field)
        assert o.takes.split(" per device")[0].endswith("to 1e6")
        assert not refuses(["bench", o.name, str(STANDIN_MAX)])
        assert refuses(["bench", o.name, str(math.nextafter(STANDIN_MAX, math.inf))])
