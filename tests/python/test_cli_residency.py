"""`ferry residency-plan` and `ferry residency-bench` (once `ferry plan --residency` and `ferry bench
--residency`, which still run, saying so): each strategy's placement as text and JSON
(the library's plans, the planner never slower than a rule), sliding-window layers from --swa
options and from --model, refusals (a plan that cannot fit names what and by how much; options
that conflict), and bench running every strategy with its prediction beside what it measured (no
timed assertion)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

import ferry
import ferry.errors as ferry_errors
import ferry.workloads.residency_plan as residency_plan_workload
from conftest import refused
from ferry.cli import main
from ferry.residency import DeviceSpec, choose_residency, expected_accepted_tokens, layers_from_geometry, predict_step
from ferry.workloads.common import n_kv_for
from ferry.workloads.residency_plan import ResidencyModel

# 4 layers of f16, 2 KV heads of 32, n_kv 128 (-npp 120 -ntg 8): each layer's K and V 16 KiB per window
GEOMETRY = ["-c", "256", "-npl", "1", "-npp", "120", "-ntg", "8", "--pad", "1", "--layers", "4", "--heads", "2", "--head-dim", "32",
            "--kv-heads", "2", "--type", "f16"]
TWO = ["--devices", "2", "--link-gbps", "2.45,0.33", "--compute-us", "20"]
STRATEGIES = ["auto", "first", "round-robin", "slowest-link"]


def run(args: List[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(args) == 0
    return capsys.readouterr().out


def run_json(args: List[str], capsys: pytest.CaptureFixture[str]) -> Any:
    return json.loads(run(args + ["--json"], capsys))


def table_row(out: str, strategy: str) -> str:
    return next(line for line in out.splitlines() if line.split() and line.split()[0] == strategy)


# ------------------------------------------------------------ residency-plan


def test_plan_residency_text_names_each_strategy_placement_and_memory(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(["residency-plan", *GEOMETRY, *TWO, "--kv-device-layers", "2"], capsys)
    assert "serial (prefetch 0)" in out and "device 1: link 0.33 GB/s" in out
    assert "at most 2 layers resident" in out and "given (--compute-us)" in out
    for s in STRATEGIES:
        assert table_row(out, s)
    # two layers kept: the planner and slowest-link on the slow link's device (layers 2-3), first on device 0's
    assert re.search(r"^auto .* 1\.00x\s+none\s+\S.*\slayers 2-3\s", out, re.M), out
    assert re.search(r"^first .*\slayers 0-1\s+\S+ MiB\s+none\s", out, re.M), out
    assert re.search(r"^slowest-link .*\snone\s+\S+ MiB\s+layers 2-3\s", out, re.M), out
    assert "auto: the model's optimum" in out


def test_plan_residency_json_is_the_library_plan(capsys: pytest.CaptureFixture[str]) -> None:
    plans = run_json(["residency-plan", *GEOMETRY, *TWO, "--kv-device-layers", "2", "--overlap",
                      "--prefetch", "2"], capsys)
    assert [(p["strategy"], p["prefetch"]) for p in plans] == [(s, d) for d in (0, 2) for s in STRATEGIES]
    # the library's plan of the same model: its memory measured by a dry run of the step over the
    # run's windows (-npp 120 -ntg 8: 121 to 128)
    model = ResidencyModel.of(head_dim=32, n_head_kv=2, n_head=2, n_ctx=256, n_stream=1, n_kv=128,
                              layer_windows=(None,) * 4, n_devices=2, step_windows=tuple(range(121, 129)))
    layers = model.layers()
    devices = [DeviceSpec(2.45, 0.0, (20e-6,) * 4, None, 0, "device 0"), DeviceSpec(0.33, 0.0, (20e-6,) * 4, None, 0,
                                                                                     "device 1")]
    for p in plans:
        with model.at(prefetch=p["prefetch"]).step_memory() as measure:
            lib = choose_residency(p["strategy"], layers, devices, prefetch=p["prefetch"], max_layers=2,
                                 measure=measure).as_dict(1)
        assert {k: v for k, v in p.items() if k not in ("n_kv", "n_ctx")} == lib
        assert p["memory_measured"] and all(d["memory"] > d["resident_bytes"] for d in p["devices"])
        assert p["n_kv"] == 128 and len(p["devices"]) == 2
        same_depth = [q["step_seconds"] for q in plans if q["prefetch"] == p["prefetch"]]
        if p["strategy"] == "auto":
            assert p["step_seconds"] <= min(same_depth)
        assert p["tokens_per_second"] == pytest.approx(1 / p["step_seconds"])


def test_plan_residency_plans_each_strategy_listed_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    plans = run_json(["residency-plan", "--strategy", "first,auto", *GEOMETRY, *TWO], capsys)
    assert [p["strategy"] for p in plans] == ["first", "auto"]


def test_plan_residency_sizes_swa_sliding_layers_smaller_and_keeps_the_full_one_first(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["residency-plan", "--strategy", "auto", *GEOMETRY, "--compute-us", "20", "--link-gbps", "1",
            "--swa-window", "16", "--swa-layers", "ssfs"]
    out = run(args, capsys)
    assert "4 layers (3 sliding, window 16; 1 full)" in out
    (plan,) = run_json(args, capsys)
    full = layers_from_geometry("f16", "f16", 32, 2, 256, 1, 128, [None])[0].resident_bytes
    sliding = layers_from_geometry("f16", "f16", 32, 2, 256, 1, 128, [16])[0].resident_bytes
    assert sliding < full
    assert plan["devices"][0]["resident_bytes"] == full + 3 * sliding  # unlimited memory: every layer kept
    # one layer kept: the full one, which saves most; then a budget of exactly the memory that plan
    # states, where the three sliding layers would fit too: the planner keeps the full layer
    (one,) = run_json(args + ["--kv-device-layers", "1"], capsys)
    assert one["devices"][0]["resident_layers"] == [2] and one["memory_measured"]
    (plan,) = run_json(args + ["--device-memory", str(one["devices"][0]["memory"])], capsys)
    assert plan["devices"][0]["resident_layers"] == [2]


def test_plan_residency_sizes_a_models_sliding_layers_at_their_window(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("gguf")
    from test_model_file import write_gguf

    path = write_gguf(tmp_path / "g2.gguf", "gemma2", blocks=4, ctx=1024, embd=256, heads=4, heads_kv=2,
                      sliding_window=32)
    (plan,) = run_json(["residency-plan", "--strategy", "auto", "--model", str(path), "-npl", "1", "-npp", "120", "-ntg", "8",
                        "--compute-us", "20", "--link-gbps", "1"], capsys)
    sizes = {layers_from_geometry("f16", "f16", 64, 2, 1024, 1, 128, [w])[0].resident_bytes for w in (None, 32)}
    assert len(sizes) == 2
    assert plan["devices"][0]["resident_bytes"] == 2 * sum(sizes)  # gemma2: every other layer slides


def test_plan_residency_refuses_what_cannot_fit(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["residency-plan", *GEOMETRY, *TWO, "--device-memory", "1KiB"], capsys)
    assert "device 0 needs" in err and "short by" in err and "bytes" in err
    # the windows fit, no layer beside them: names the device and by how much it is over
    err = refused(["residency-plan", *GEOMETRY, *TWO, "--device-memory", "40KiB"], capsys)
    assert "no layer fits" in err and "bytes over its 40960 bytes" in err
    err = refused(["residency-plan", *GEOMETRY, *TWO, "--device-memory", "1MiB", "--reserve", "1MiB"], capsys)
    assert "1048576 reserved" in err
    assert "--kv-device-layers 9" in refused(["residency-plan", *GEOMETRY, *TWO, "--kv-device-layers", "9"],
                                             capsys)
    assert "unknown strategy 'best'" in refused(["residency-plan", "--strategy", "best", *GEOMETRY], capsys)
    assert "3 values for 2 devices" in refused(["residency-plan", *GEOMETRY, *TWO, "--reserve", "1,2,3"], capsys)
    assert "--compute-us" in refused(["residency-plan", *GEOMETRY, "--compute-us", "1,2"], capsys)


def test_the_links_default_to_the_standins_and_0_is_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """No --link-gbps: every device at STANDIN_LINK_GBPS, the link bench's stand-ins copy over, and
    the runs' stand-ins model it; 0: the host's speed, measured once (faked here) for each 0."""
    from ferry.workloads import residency_plan
    from ferry.workloads.devices import STANDIN_LINK_GBPS

    calls = []

    def fake_measure(dev: Any) -> Any:
        calls.append(dev.link_gbps)
        return type("M", (), {"gbps": 5.5})()

    monkeypatch.setattr(residency_plan, "measure_link", fake_measure)
    model = residency_plan.ResidencyModel.of(n_devices=2)
    assert model.links() == (STANDIN_LINK_GBPS,) * 2 and calls == []
    assert [model.standin_link(d) for d in range(2)] == [STANDIN_LINK_GBPS] * 2
    mixed = residency_plan.ResidencyModel.of(n_devices=2, link_gbps=(0.0, 2.45))
    assert mixed.links() == (5.5, 2.45) and calls == [None]  # measured on an unmodelled stand-in
    assert [mixed.standin_link(d) for d in range(2)] == [0.0, 2.45]


def test_a_named_link_is_the_plans_link_and_the_bench_standins_link(capsys: pytest.CaptureFixture[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """--link-profile on the residency verbs: the planner sees each device at the named link's peak
    (--link-gbps's where given), its latency and its piece curve, the plan names it, and residency-bench's stand-ins are
    that named link, its piece curve too; --latency-us beside it is refused naming both."""
    from ferry.workloads import residency_bench

    named = ferry.StandinBackend(link_gbps=2.0, link_profile="pcie4")
    want = (named.link_gbps, named.latency_us, named.piece_curve)
    named.close()
    assert want[2] is not None
    model = ResidencyModel.of(n_devices=2, link_gbps=(2.0,), link_profile="pcie4")
    assert model.links() == (want[0], want[0])
    specs = model.device_specs([0.0] * model.n_layer)
    assert [s.latency_us for s in specs] == [want[1]] * 2
    assert [s.piece_curve for s in specs] == [want[2]] * 2  # the plan prices small pieces as the link does
    args = [*GEOMETRY, "--devices", "2", "--link-profile", "pcie4", "--link-gbps", "2", "--compute-us", "20"]
    out = run(["residency-plan", *args], capsys)
    assert out.count(f"link pcie4 at 2 GB/s, latency {want[1]:g} µs") == 2
    made = []
    real = residency_bench.StandinBackend

    def standin(**kw: Any) -> ferry.StandinBackend:
        dev = real(**kw)
        made.append((dev.link_gbps, dev.latency_us, dev.piece_curve))
        return dev

    monkeypatch.setattr(residency_bench, "StandinBackend", standin)
    run(["residency-bench", *args, "--strategy", "auto", "--repeat", "1"], capsys)
    assert made and set(made) == {want}
    err = refused(["residency-plan", *args, "--latency-us", "3"], capsys)
    assert "--link-profile" in err and "--latency-us" in err


def test_a_model_is_its_groups_built_by_its_flat_names() -> None:
    """ResidencyModel.of puts each old flat name in its group; layer_windows sets the layers; at() changes
    one figure and keeps the rest; a name no group has is a TypeError; check() refuses windows for another
    number of layers, and the placement options the planner does not take."""
    m = ResidencyModel.of(type_kv="q8_0", n_ctx=512, layer_windows=(None, 100, None), n_devices=2, reserve=(64,),
                          prefetch=1, max_layers=2)
    assert (m.kv.type_kv, m.kv.n_layer, m.n_layer, m.windows.n_ctx, m.windows.layer_windows, m.devices.n_devices,
            m.planner.reserve, m.planner.prefetch, m.planner.max_layers) == (
        "q8_0", 3, 3, 512, (None, 100, None), 2, (64,), 1, 2)
    at = m.at(n_kv=128, memory=(1 << 20,))
    assert (at.windows.n_kv, at.devices.memory) == (128, (1 << 20,))
    assert (at.kv, at.planner, at.windows.layer_windows) == (m.kv, m.planner, m.windows.layer_windows)
    assert ResidencyModel.of(n_layer=3).windows.layer_windows == (None,) * 3
    assert ResidencyModel() == ResidencyModel.of()
    m.check()
    with pytest.raises(TypeError):
        ResidencyModel.of(n_ctxx=4)
    with pytest.raises(ferry_errors.InvalidArgumentError, match="3 layer windows for 2 layers"):
        replace(m, kv=replace(m.kv, n_layer=2)).check()
    with pytest.raises(ferry_errors.InvalidArgumentError, match="devices.placement"):
        m.at(placement=(None, 0, None)).check()


def test_plan_without_residency_is_the_window_plan(capsys: pytest.CaptureFixture[str]) -> None:
    geometry = [a for i, a in enumerate(GEOMETRY) if a not in ("--layers", "--heads")
                and GEOMETRY[i - 1] not in ("--layers", "--heads")]
    out = run(["plan", *geometry], capsys)
    assert "window" in out and "strategy" not in out


# ------------------------------------------------------------ residency-bench


BENCH = ["residency-bench", *GEOMETRY, "--repeat", "2", "--devices", "2", "--link-gbps", "2.45,0.33", "--kv-device-layers", "2"]


def test_bench_residency_runs_every_strategy_beside_its_prediction(capsys: pytest.CaptureFixture[str]) -> None:
    rows: List[Dict[str, Any]] = run_json(BENCH + ["--overlap"], capsys)
    assert [(r["strategy"], r["prefetch"]) for r in rows] == [(s, d) for d in (0, 1) for s in STRATEGIES]
    for r in rows:
        assert r["predicted_step_s"] > 0 and r["measured_step_s"] > 0 and r["repeats"] == 2
        assert r["ratio"] == pytest.approx(r["measured_step_s"] / r["predicted_step_s"])
        assert r["measured_step_s_min"] <= r["measured_step_s"] <= r["measured_step_s_max"]
        assert r["plan"]["strategy"] == r["strategy"] and r["plan"]["prefetch"] == r["prefetch"]
        assert sum(len(d["resident_layers"]) for d in r["plan"]["devices"]) == 2
    assert len({r["output_sha256"] for r in rows}) == 1  # a placement never changes the outputs
    by = {(r["strategy"], r["prefetch"]): r for r in rows}
    assert by[("auto", 0)]["plan"]["devices"][1]["resident_layers"] == [2, 3]
    assert by[("first", 0)]["plan"]["devices"][0]["resident_layers"] == [0, 1]


# The issue's example at an eighth of its size: `plan` printed auto keeping layers 0,2 and 4,6 of 8 within
# each device's memory, prefetching 1 layer ahead, and `bench` with the same options ran out of memory.
ISSUE = ["--devices", "2", "--link-gbps", "2.45,0.33", "--device-memory", "6MiB,6MiB", "--layers", "8", "-c", "4096",
         "-npl", "2", "-npp", "256", "-ntg", "4", "--overlap", "--compute-us", "3000"]


def test_bench_runs_the_plan_in_the_memory_it_printed(capsys: pytest.CaptureFixture[str]) -> None:
    """Each strategy's plan as `plan` prints it is the plan `bench` runs with the same options, and
    its run holds on each device exactly the memory the plan printed (the reserve is 0)."""
    plans = run_json(["residency-plan", *ISSUE], capsys)
    rows = run_json(["residency-bench", *ISSUE, "--repeat", "1"], capsys)
    assert [(r["strategy"], r["prefetch"]) for r in rows] == [(p["strategy"], p["prefetch"]) for p in plans]
    assert any(p["prefetch"] == 1 and any(d["resident_layers"] for d in p["devices"]) for p in plans)
    for plan, row in zip(plans, rows):
        assert [d["resident_layers"] for d in row["plan"]["devices"]] == [d["resident_layers"] for d in plan["devices"]]
        assert row["held_bytes"] == [d["memory"] for d in plan["devices"]], (plan, row)
        assert all(d["memory"] <= 6 << 20 for d in plan["devices"])


# ------------------------------------------------------------ issue 43: a draft verified a step

DRAFT = ["--draft", "4", "--accept", "0.7"]


def test_plan_residency_with_a_draft_prints_its_plan_beside_one_tokens_and_what_changed(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The draft's plan (5 query tokens a step, 2.77 kept) beside one token's, and per strategy what
    changed: prefetching, attention five times as long hides more of the copies, and the planner
    moves a kept layer to device 0, whose first copy nothing hides."""
    out = run(["residency-plan", *GEOMETRY, *TWO, "--kv-device-layers", "2", "--overlap", *DRAFT], capsys)
    assert "a draft of 4 verified a step: 5 query tokens per stream, one copy of each window; 2.77 tokens kept" in out
    for how in ("serial (prefetch 0)", "prefetching 1 layer(s) ahead"):
        assert f"{how}, one token a step:" in out and f"{how}, a draft of 4 verified a step (tok/s: tokens kept):" in out
        assert f"{how}, the draft's plan over one token's:" in out
    changes = out.split("prefetching 1 layer(s) ahead, the draft's plan over one token's:")[1]
    assert re.search(r"^auto\s+0: none -> layer 0; 1: layers 2-3 -> layer 2\s", changes, re.M), changes
    # one copy serves 2.77 tokens kept: 0.37x the bytes per token (the window 4 cells longer, 132 / 128 / 2.77)
    assert re.search(r"^first\s+the same\s.*\s0\.37x \(64\.0 -> 23\.8 KiB\)$", changes, re.M), changes
    # every layer kept (memory unlimited, no --kv-device-layers): no bytes per token to compare
    out = run(["residency-plan", *GEOMETRY, *TWO, "--strategy", "auto", *DRAFT], capsys)
    assert re.search(r"^auto\s+the same\s.*\snothing copied$", out, re.M), out


def test_plan_residency_json_with_a_draft_is_one_tokens_plan_and_the_librarys_draft_plan(
        capsys: pytest.CaptureFixture[str]) -> None:
    """--draft's JSON: the plans without it (draft 0), then the library's plans for 5 query tokens per
    stream (their queries, outputs and memory for 5 tokens, attention 5 times a token's), tokens/s
    counting expected_accepted_tokens(4, 0.7) a step."""
    base = ["residency-plan", *GEOMETRY, *TWO, "--kv-device-layers", "2"]
    single = run_json(base, capsys)
    both = run_json(base + DRAFT, capsys)
    assert [p["draft"] for p in both] == [0] * 4 + [4] * 4
    assert [{k: v for k, v in p.items() if k != "draft"} for p in both[:4]] == single
    kept = expected_accepted_tokens(4, 0.7)
    model = ResidencyModel.of(head_dim=32, n_head_kv=2, n_head=2, n_ctx=256, n_stream=1, n_kv=132,
                              layer_windows=(None,) * 4, n_devices=2, step_windows=tuple(range(125, 133)), draft=4)
    layers = model.layers()
    assert layers == layers_from_geometry("f16", "f16", 32, 2, 256, 1, 132, [None] * 4, n_new=5, n_head=2,
                                          buffer_type=ferry.StandinBackend().buffer_type)
    us = 20 * 1e-6  # --compute-us 20 as the model takes it
    devices = [DeviceSpec(2.45, 0.0, (us,) * 4, None, 0, "device 0"), DeviceSpec(0.33, 0.0, (us,) * 4, None, 0,
                                                                                 "device 1")]
    with model.step_memory() as measure:
        for p in both[4:]:
            lib = choose_residency(p["strategy"], layers, devices, max_layers=2, measure=measure,
                                   tokens_per_step=5).as_dict(1, kept)
            assert {k: v for k, v in p.items() if k not in ("n_kv", "n_ctx", "draft")} == lib
            assert p["tokens_per_step"] == 5.0 and p["accepted_per_step"] == pytest.approx(2.7731, abs=1e-4)
            assert p["tokens_per_second"] == pytest.approx(kept / p["step_seconds"]) and p["n_kv"] == 132
    # the queries and outputs of five tokens take more of each device than one token's
    assert all(d5["memory"] > d1["memory"] for p1, p5 in zip(both[:4], both[4:])
               for d1, d5 in zip(p1["devices"], p5["devices"]) if d1["resident_layers"] == d5["resident_layers"])


def test_a_drafts_plan_takes_the_hosts_measured_token_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """residency-plan --draft N's devices (ResidencyModel.device_specs) take the host's token_share,
    measured (measure_token_share, N + 1 tokens, over the first layer's window on a stand-in) where the
    compute is measured; 1 (the linear model, nothing measured) without a draft or with --compute-us."""
    calls: List[Tuple[Any, ...]] = []

    def share(backend: Any, n_tok: int, *geometry: Any) -> float:
        calls.append((type(backend).__name__, n_tok, *geometry))
        return 0.5

    monkeypatch.setattr(residency_plan_workload, "measure_token_share", share)
    geometry = dict(head_dim=32, n_head_kv=2, n_head=2, n_ctx=256, n_stream=2, n_kv=64, layer_windows=(None,) * 2)
    model = ResidencyModel.of(**geometry, draft=4)
    assert [d.token_share for d in model.device_specs([1e-4] * 2, [1.0])] == [0.5]
    assert calls == [("StandinBackend", 5, "f16", "f16", 32, 2, 2, 128, 2, 64)]
    for other in (ResidencyModel.of(**geometry), ResidencyModel.of(**geometry, draft=4, compute_us=20.0)):
        assert [d.token_share for d in other.device_specs([1e-4] * 2, [1.0])] == [1.0]
    assert len(calls) == 1


def test_bench_residency_runs_the_drafts_plan_beside_its_prediction(capsys: pytest.CaptureFixture[str]) -> None:
    """The plans `residency-plan --draft` prints are those `residency-bench --draft` runs: each placement
    run with 5 query tokens per stream holds the memory its plan printed, and its prediction (given
    --compute-us: not calibrated) is the mean over the steps of predict_step for 5 tokens at each
    step's window; tokens/s count the tokens kept."""
    argv = [*ISSUE, "--strategy", "auto", "--draft", "3", "--accept", "0.5"]
    plans = [p for p in run_json(["residency-plan", *argv], capsys) if p["draft"] == 3]
    rows = run_json(["residency-bench", *argv, "--repeat", "1"], capsys)
    assert [(r["strategy"], r["prefetch"]) for r in rows] == [(p["strategy"], p["prefetch"]) for p in plans]
    kept = expected_accepted_tokens(3, 0.5)
    from ferry.cli import prepare

    job = prepare(["residency-bench", *argv])[2]
    model = job.model.at(n_stream=2)  # the geometry the options give
    assert model.n_tok == 4
    devices = model.device_specs(model.compute_seconds(), model.links())  # --compute-us 3000: not measured
    for plan, row in zip(plans, rows):
        assert [d["resident_layers"] for d in row["plan"]["devices"]] == [d["resident_layers"] for d in plan["devices"]]
        assert row["held_bytes"] == [d["memory"] for d in plan["devices"]], (plan, row)
        resident = [any(i in d["resident_layers"] for d in plan["devices"]) for i in range(8)]
        # step t's stream holds -npp + t + 4 cells, its window rounded up to --pad
        steps = [predict_step(model.at(n_kv=n_kv_for(256, t + 4, job.pad, 2048)).layers(), devices, resident, None,
                              plan["prefetch"], tokens_per_step=4).step_seconds for t in range(4)]
        assert row["predicted_step_s"] == pytest.approx(sum(steps) / 4, rel=1e-12)
        assert row["measured_tokens_per_s"] == pytest.approx(2 * kept / row["measured_step_s"])
        assert row["plan"]["accepted_per_step"] == pytest.approx(kept) and row["plan"]["tokens_per_step"] == 4.0
    assert len({r["output_sha256"] for r in rows}) == 1


def test_accept_acts_only_with_a_draft_and_a_draft_must_fit_the_stream(capsys: pytest.CaptureFixture[str]) -> None:
    for verb in ("residency-plan", "residency-bench"):
        err = refused([verb, *GEOMETRY, "--compute-us", "20", "--accept", "0.5"], capsys)
        assert "--accept acts only with --draft N above 0: give --draft N, or leave out --accept" in err
        err = refused([verb, *GEOMETRY, "--compute-us", "20", "--draft", "129"], capsys)
        assert "-npl 1: a stream holds 256 cells, fewer than -npp + -ntg + --draft = 257" in err
        assert "--accept" in refused([verb, *GEOMETRY, "--draft", "2", "--accept", "1.5"], capsys)


@pytest.mark.parametrize("verb", ["residency-plan", "residency-bench"])
def test_query_heads_that_do_not_group_over_the_kv_heads_are_refused_naming_both(
        verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by the CLI property test at 7f9574e: the dry run's attention refused them, naming no option."""
    assert "--heads 3 is not a multiple of --kv-heads 2" in refused([verb, *GEOMETRY, "--heads", "3"], capsys)


def test_bench_residency_prints_a_row_per_strategy_asked_and_the_outputs_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(BENCH + ["--strategy", "auto,first"], capsys)
    assert "measured / predicted" in out and "attention outputs identical across the placements" in out
    assert table_row(out, "auto") and table_row(out, "first")
    assert not any(line.startswith("round-robin") for line in out.splitlines())


def test_bench_residency_measures_and_predicts_a_sliding_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("gguf")
    from test_model_file import write_gguf

    path = write_gguf(tmp_path / "g2.gguf", "gemma2", blocks=4, ctx=1024, embd=256, heads=4, heads_kv=2,
                      sliding_window=32)
    rows = run_json(["residency-bench", "--model", str(path), "-c", "256", "-npl", "1", "-npp", "120", "-ntg", "2",
                     "--repeat", "1", "--strategy", "auto", "--link-gbps", "1"], capsys)
    assert rows[0]["predicted_step_s"] > 0 and rows[0]["measured_step_s"] > 0


def test_bench_residency_refuses_a_placement_beside_it(capsys: pytest.CaptureFixture[str]) -> None:
    """The old spelling refuses bench's options beside --residency as it did; the verb has none of them."""
    old = ["bench", *BENCH[1:]]
    err = refused(old[:-2] + ["--residency", "--placement", "h,h,0,1"], capsys)
    assert "--residency" in err and "--placement" in err
    assert "--device acts only without --residency" in refused(old + ["--residency", "--device", "cuda"], capsys)
    assert "--plot" in refused(old + ["--residency", "--plot", "x.png"], capsys)
    err = refused(old + ["--residency", "--device-memory", "1KiB"], capsys)
    assert "short by" in err
    for option in (["--placement", "h,h,0,1"], ["--plot", "x.png"]):
        assert f"{option[0]} is an option of ferry bench" in refused(BENCH + option, capsys)
    assert "--device could match --devices, --device-memory" in refused(BENCH + ["--device", "cuda"], capsys)
    assert "short by" in refused(BENCH + ["--device-memory", "1KiB"], capsys)


def test_compute_slowdown_reaches_the_stand_ins(capsys: pytest.CaptureFixture[str]) -> None:
    from ferry.cli import build_parser
    from ferry.cli.options import devices_from_args
    from ferry.workloads.devices import DeviceConfig

    args = build_parser()[0].parse_args(["bench", "--devices", "2", "--compute-slowdown", "1,3.5"])
    cfg = devices_from_args(args)
    assert cfg.compute_slowdown == (1.0, 3.5) and cfg.modelled
    devices = cfg.make("cpu")
    try:
        assert [d.compute_slowdown for d in devices] == [1.0, 3.5]
    finally:
        for d in devices:
            d.close()
    assert "stand-in" in refused(["bench", "--device", "cuda", "--compute-slowdown", "2"], capsys)
    assert "--compute-slowdown" in refused(["bench", "--compute-slowdown", "0.5"], capsys)
    with pytest.raises(ferry_errors.InvalidArgumentError, match="--compute-slowdown: 3 values"):
        DeviceConfig(n_devices=2, compute_slowdown=(1.0, 2.0, 3.0)).check(2, "cpu")


# ------------------------------------------------------------ issue 32: what used to end in a traceback


def test_bench_residency_without_repeat_takes_its_default_and_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """Item 5: --repeat is none unless given; --residency then measures its default repetitions."""
    from ferry.cli import prepare
    from ferry.cli.residency import REPEAT

    argv = ["residency-bench", "--strategy", "auto", "--layers", "2", "-c", "64", "-npl", "2", "-npp", "8", "-ntg", "2",
            "--head-dim", "32", "--kv-heads", "1", "--heads", "2", "--compute-us", "100"]
    assert prepare(argv)[2].repeat == REPEAT
    rows = run_json(argv + ["--json"], capsys)
    assert {r["strategy"] for r in rows} == {"auto"} and all(r["measured_step_s"] > 0 for r in rows)


@pytest.mark.parametrize("verb", ["residency-plan", "residency-bench"])
def test_residency_refuses_a_list_of_links_for_other_devices(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 6: two links for three devices is a usage error naming the option, in both verbs."""
    err = refused([verb, "--devices", "3", "--layers", "3", "--link-gbps", "1,2", "--compute-us",
                   "100"], capsys)
    assert "--link-gbps: 2 values for 3 devices" in err
    err = refused([verb, "--devices", "2", "--layer-devices", "0,2", "--compute-us", "100"], capsys)
    assert "--layer-devices: layer 1 names device 2" in err


# ------------------------------------------------------------ issue 42: the old spellings, for one release


@pytest.mark.parametrize("old,new", [
    (["plan", "--residency"], ["residency-plan"]),
    (["plan", "--residency", "auto,first"], ["residency-plan", "--strategy", "auto,first"]),
    (["plan", "--residency=first"], ["residency-plan", "--strategy", "first"]),
    (["bench", "--residency"], ["residency-bench"]),
    (["bench", "--residency", "auto"], ["residency-bench", "--strategy", "auto"]),
])
def test_the_old_spelling_makes_the_verbs_job_and_names_the_verb(old: List[str], new: List[str],
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`ferry plan --residency` and `ferry bench --residency` make the job the verb makes, and say on
    stderr which verb that is now; the verb says nothing of the kind."""
    from ferry.cli import prepare

    old_job = prepare([*old, *GEOMETRY, *TWO])[2]
    err = capsys.readouterr().err
    assert f"`ferry {old[0]} --residency` is `ferry {new[0]}` now" in err and "next release" in err
    assert old_job == prepare([*new, *GEOMETRY, *TWO])[2]
    assert capsys.readouterr().err == ""


def test_the_old_spelling_prints_what_the_verb_prints(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(["plan", "--residency", "auto", *GEOMETRY, *TWO], capsys)
    assert out == run(["residency-plan", "--strategy", "auto", *GEOMETRY, *TWO], capsys) and "auto" in out
