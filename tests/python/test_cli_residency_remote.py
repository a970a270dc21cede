"""`ferry residency-plan --remote-link ... --host-memory ...` and `ferry residency-bench` with them: the
layers the host memory cannot hold go to a remote tier; the plan printed is the library's (with a
RemoteSpec), and the bench runs that plan with its remote layers pulled through a RemoteTier every
step (the transfer engine of ferry[remote]; skipped without it), the outputs byte-identical to the
same placement held locally. Without --host-memory the host holds this machine's memory. Refusals:
--host-memory alone, a link that is not one, the engine
missing where it is needed, a host memory that cannot hold one pull."""

from __future__ import annotations

import json
from typing import Any, List

import pytest

import ferry.remote
from conftest import refused
from ferry.cli import main
from ferry.residency import DeviceSpec, RemoteSpec, choose_residency, remote_link_model
from ferry.workloads.residency_plan import ResidencyModel

needs_engine = pytest.mark.skipif(ferry.remote.engine_missing() is not None,
                                  reason=f"no transfer engine: {ferry.remote.engine_missing()}")

# 4 layers of f16, 2 KV heads of 32, n_kv 128 (-npp 120 -ntg 8): a layer's K and V 64 KiB, its windows 32 KiB
GEOMETRY = ["-c", "256", "-npl", "1", "-npp", "120", "-ntg", "8", "--pad", "1", "--layers", "4", "--heads", "2",
            "--head-dim", "32", "--kv-heads", "2", "--type", "f16", "--compute-us", "20", "--kv-device-layers", "1"]
# host memory for one local layer (64 KiB) and one pull's staging (32 KiB): two layers go remote
TIER = ["--remote-link", "150,12,2", "--host-memory", "100KiB"]


def run_json(args: List[str], capsys: pytest.CaptureFixture[str]) -> Any:
    assert main(args + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_plan_sends_what_the_host_cannot_hold_remote_and_is_the_librarys(capsys: pytest.CaptureFixture[str]
                                                                               ) -> None:
    assert main(["residency-plan", *GEOMETRY, *TIER]) == 0
    out = capsys.readouterr().out
    assert "remote tier (given): 150.0 µs a batch, 12.0 µs a piece, 2 GB/s; host memory 0.1 MiB" in out
    assert "remote" in out.splitlines()[out.splitlines().index("serial (prefetch 0):") + 1]
    plans = run_json(["residency-plan", *GEOMETRY, *TIER], capsys)
    model = ResidencyModel.of(head_dim=32, n_head_kv=2, n_head=2, n_ctx=256, n_stream=1, n_kv=128,
                              layer_windows=(None,) * 4, step_windows=tuple(range(121, 129)))
    tier = RemoteSpec(remote_link_model(150, 12, 2), host_memory=100 << 10)
    devices = [DeviceSpec(8.0, 0.0, (20e-6,) * 4, None, 0, "device 0")]
    for p in plans:
        assert p["host_memory"] == 100 << 10 and p["host_bytes"] <= 100 << 10
        assert len(p["remote_layers"]) == 2 and len(p["host_layers"]) == 1
        assert p["remote_pieces"] == 2 * 2  # one range per window (one stream), K and V, two layers
        with model.step_memory() as measure:
            lib = choose_residency(p["strategy"], model.layers(), devices, max_layers=1, measure=measure,
                                   remote_tier=tier).as_dict(1)
        assert {k: v for k, v in p.items() if k not in ("n_kv", "n_ctx")} == lib
    # without --host-memory, this machine's memory holds every layer: none goes remote
    alone = run_json(["residency-plan", *GEOMETRY, "--remote-link", "150,12,2"], capsys)
    assert all(p["remote_layers"] == [] and p["host_memory"] > 100 << 10 for p in alone)


def test_a_host_memory_alone_a_bad_link_and_a_host_that_cannot_hold_a_pull_are_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    for verb in ("residency-plan", "residency-bench"):
        err = refused([verb, *GEOMETRY, "--host-memory", "1MiB"], capsys)
        assert "--host-memory acts only with --remote-link" in err
    assert "BATCH_US,PIECE_US,GBPS" in refused(["residency-plan", *GEOMETRY, "--remote-link", "1,2",
                                                "--host-memory", "1MiB"], capsys)
    assert "gbps" in refused(["residency-plan", *GEOMETRY, "--remote-link", "1,2,0", "--host-memory", "1MiB"], capsys)
    err = refused(["residency-plan", *GEOMETRY, "--remote-link", "150,12,2", "--host-memory", "1KiB"], capsys)
    assert "host memory: 1024 bytes cannot hold the staging of the pulls" in err


def test_without_the_engine_measure_and_the_bench_are_refused_naming_it(monkeypatch: pytest.MonkeyPatch,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(ferry.remote, "engine_missing", lambda: "no module named 'mooncake'")
    err = refused(["residency-plan", *GEOMETRY, "--remote-link", "measure", "--host-memory", "100KiB"], capsys)
    assert "--remote-link measure: no transfer engine (no module named 'mooncake')" in err and "BATCH_US" in err
    err = refused(["residency-bench", *GEOMETRY, *TIER, "--repeat", "1"], capsys)
    assert "--remote-link: residency-bench pulls the remote layers through the transfer engine" in err
    assert main(["residency-plan", *GEOMETRY, *TIER]) == 0  # given figures need no engine


@needs_engine
def test_the_bench_pulls_the_remote_layers_and_gives_the_local_outputs(capsys: pytest.CaptureFixture[str]) -> None:
    """The plan printed is the plan run; its remote layers' local copies overwritten, each step's
    pulls bring their windows back: the outputs are those of the same placement held locally (no
    remote tier), and the prediction adds the pulls (no timed assertion)."""
    plans = run_json(["residency-plan", *GEOMETRY, *TIER, "--strategy", "auto"], capsys)
    rows = run_json(["residency-bench", *GEOMETRY, *TIER, "--strategy", "auto", "--repeat", "1"], capsys)
    local = run_json(["residency-bench", *GEOMETRY, "--strategy", "auto", "--repeat", "1"], capsys)
    assert [r["plan"]["remote_layers"] for r in rows] == [p["remote_layers"] for p in plans] == [[2, 3]]
    assert rows[0]["plan"]["devices"][0]["resident_layers"] == local[0]["plan"]["devices"][0]["resident_layers"]
    assert rows[0]["output_sha256"] == local[0]["output_sha256"]
    assert rows[0]["predicted_step_s"] > local[0]["predicted_step_s"] + 2 * 150e-6
    # the tier's own time a window, measured over the run's pulls, is in its prediction: serially each of
    # the two remote layers' K and V windows pays a batch (150 us) and that time on top of the local run's
    host_us = rows[0]["remote_host_us"]
    assert "remote_host_us" not in local[0] and host_us > 0 and rows[0]["prefetch"] == 0
    assert rows[0]["predicted_step_s"] >= local[0]["predicted_step_s"] + 4 * (150e-6 + host_us * 1e-6)


@needs_engine
def test_measure_fits_the_loopbacks_link(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["residency-plan", *GEOMETRY, "--remote-link", "measure", "--host-memory", "100KiB"]) == 0
    assert "remote tier (measured on the loopback):" in capsys.readouterr().out
    err = refused(["residency-plan", *GEOMETRY, "-c", "128", "--remote-link", "measure"], capsys)
    assert "a layer's K holds 16384 bytes, fewer than the 32768 the measurement reads: raise -c" in err
