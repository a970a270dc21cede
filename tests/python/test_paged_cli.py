"""The paged workloads (issue 36): block tables drawn by adjacency; `ferry paged-bench`'s rows
(per-block, ferry's merged gather, the cells' ragged copy) with their copy calls, bytes and
predictions; `ferry validate --paged` hashing every gather method against the cells cache, and
failing when one differs; `ferry paged-plan`'s prediction equal to what the stand-in's link
charges when the plan it prints is run; the old spellings (`ferry bench --paged`, `ferry plan
--paged`) making the verbs' jobs, saying so."""

from __future__ import annotations

import json
import math
import re
from typing import Any, List

import numpy as np
import pytest

import ferry
from ferry.cli import main
from ferry.workloads import validate as validate_workload
from ferry.workloads.bench import run_bench
from ferry.workloads.bench_config import BenchConfig
from ferry.workloads.devices import DeviceConfig
from ferry.workloads.paged_plan import paged_cache, standin
from ferry.workloads.paged_tables import adjacent_tables, blocks_for, runs_of
from ferry.workloads.validate import ValidateConfig, run_validate


@pytest.mark.parametrize("blocks, n_blocks", [([7, 3, 1, 0, 5], 16), ([4], 4), ([6, 6], 12), ([9, 2, 4], 40)])
@pytest.mark.parametrize("adjacency", [0.0, 0.3, 0.5, 0.9, 1.0])
def test_tables_have_the_adjacency_asked_for(blocks: List[int], n_blocks: int, adjacency: float) -> None:
    """Each table exactly round(F * (m - 1)) blocks right after their predecessor, no block in two
    tables, every id in the pool; the same seed the same tables."""
    for seed in range(3):
        tables = adjacent_tables(blocks, n_blocks, adjacency, seed)
        assert [len(t) for t in tables] == blocks
        ids = [b for t in tables for b in t]
        assert len(set(ids)) == len(ids) and all(0 <= b < n_blocks for b in ids)
        for t in tables:  # round half up: 0.5 * (4 - 1) = 1.5 -> 2
            assert len(t) - runs_of(t) == math.floor(adjacency * max(len(t) - 1, 0) + 0.5), (t, adjacency)
        assert tables == adjacent_tables(blocks, n_blocks, adjacency, seed)
    with pytest.raises(ferry.InvalidArgumentError, match="--adjacency must be a number from 0 to 1"):
        adjacent_tables(blocks, n_blocks, 1.5, 0)
    with pytest.raises(ferry.InvalidArgumentError, match="blocks asked of a pool of"):
        adjacent_tables(blocks, sum(blocks) - 1, adjacency, 0)


# ------------------------------------------------------------ paged-bench

LATENCY_US = 2.0


def test_bench_paged_rows_count_calls_bytes_and_predictions() -> None:
    """Per step: per-block a call per block of each K and V window, merged (batched on the stand-in)
    one per window, the cells' ragged copy alike; the same bytes in each, all read; the same outputs;
    with no row cost, predictions apart by the calls' latency alone."""
    cfg = BenchConfig.of(n_ctx=1536, npl=(3,), npp=90, ntg=3, n_layer=2, head_dim=32, n_head_kv=2, n_head=4,
                      policies=("ragged",), device="cpu", repeat=1, rounds=1, paged=True, block_size=8,
                      adjacency=0.5, devices=DeviceConfig(latency_us=(LATENCY_US,)))
    res = run_bench(cfg)
    per_block, merged, cells = (res.row(3, "ragged", gather="per_block"), res.row(3, "ragged", gather="auto"),
                                res.row(3, "ragged"))
    assert (per_block.key.label, merged.key.label, cells.key.label) == ("paged per-block", "paged merged", "ragged")
    windows = cfg.kv.n_layer * 2
    assert per_block.counts.copy_calls == windows * sum(3 * blocks_for(cfg.sequences.npp + t + 1, 8) for t in range(cfg.sequences.ntg))
    assert merged.counts.copy_calls == cells.counts.copy_calls == windows * cfg.sequences.ntg
    assert merged.counts.gather_used == "batched" and per_block.counts.gather_used == "per_block" and cells.counts.gather_used == ""
    row = 32 * 2 * 2
    want = windows * row * sum(3 * (cfg.sequences.npp + t + 1) for t in range(cfg.sequences.ntg))
    for r in (per_block, merged, cells):
        assert r.counts.bytes_copied == r.counts.bytes_read == want
    assert res.outputs_identical(3)
    gap = (per_block.counts.copy_calls - cells.counts.copy_calls) * LATENCY_US * 1e-6
    assert per_block.times.predicted_copy_s - cells.times.predicted_copy_s == pytest.approx(gap, rel=1e-6)
    assert merged.times.predicted_copy_s == pytest.approx(cells.times.predicted_copy_s, rel=1e-6)


def test_bench_paged_prints_and_writes_its_rows(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["paged-bench", "-c", "512", "-npl", "2", "-npp", "40", "-ntg", "2", "--head-dim", "32",
            "--kv-heads", "1", "--heads", "2", "--layers", "1", "--repeat", "1", "--rounds", "1", "--device", "cpu"]
    assert main(argv + ["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["label"], r["gather"]) for r in rows] == [("ragged", ""), ("paged per-block", "per_block"),
                                                         ("paged batched", "batched"), ("paged merged", "auto"),
                                                         ("paged device table", "device_table")]
    # where a window is one run a call each, auto keeps the runs (a tie); elsewhere batched copies
    assert rows[1]["gather_used"] == "per_block" and rows[2]["gather_used"] == "batched"
    assert set(rows[3]["gather_used"].split("+")) <= {"batched", "runs"}
    # the device table: the prompts' 41 cells each, then a cell each; its entries, sent in the warm-up
    # repetition, are the same in the timed one (a repetition drops the cells, not the table)
    cell = 32 * 2 * 2
    assert (rows[4]["first_step_bytes"], rows[4]["bytes_copied"]) == (82 * cell, 84 * cell)
    for r in rows[:4]:
        assert r["copy_calls_per_step"] == r["copy_calls"] / 2 > 0
        assert r["predicted_copy_s_per_step"] > 0 and r["bytes_copied_per_step"] == rows[0]["bytes_copied_per_step"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    for name in ("paged per-block", "paged batched", f"paged merged ({rows[3]['gather_used']})",
                 "paged device table (1 group)", "cells ragged", "calls/step", "predicted",
                 "npl 2 device table: first step 10.2 KiB, then 0.2 KiB a step"):
        assert name in text
    assert "outputs identical across the paged gathers and the cells cache" in text
    # the syncs' own host time, timed in the run and printed beside the link's prediction, is that row's
    table = rows[4]
    assert table["sync_host_s"] > 0 and all("sync_host_s" not in r for r in rows[:4])
    line = next(ln for ln in text.splitlines() if ln.startswith("npl 2 device table:"))
    assert re.search(r"copy \d+\.\d\dx its link's prediction, \d+\.\d\dx with its syncs' own host time "
                     r"\([0-9.]+ .s a step, timed as a sync sending nothing\)", line), line


@pytest.mark.parametrize("device_blocks", [1.0, 0.5])
def test_the_device_table_sends_a_shared_prefix_once_and_then_the_new_cells(device_blocks: float) -> None:
    """--shared-prefix: one set of blocks every table holds, the same values in the cells cache; the device
    table's first step sends it once (the dense gather once per sequence), each step after the new cells
    alone, or with --device-blocks 0.5 the streamed blocks again; every row's outputs the same."""
    cfg = BenchConfig.of(n_ctx=1024, npl=(4,), npp=60, ntg=4, n_layer=1, head_dim=32, n_head_kv=1, n_head=2,
                         policies=("ragged",), device="cpu", repeat=1, rounds=1, paged=True, block_size=4,
                         adjacency=0.5, shared_prefix=32, device_blocks=device_blocks)
    res = run_bench(cfg)
    table, dense = res.row(4, "ragged", gather="device_table"), res.row(4, "ragged", gather="per_block")
    assert res.outputs_identical(4)
    cell = 32 * 2 * 2
    assert dense.counts.bytes_copied == cell * sum(4 * (60 + t + 1) for t in range(4))
    first, later = table.counts.first_step_bytes, table.counts.bytes_copied - table.counts.first_step_bytes
    if device_blocks == 1.0:
        assert table.counts.gather_used == "1 group"
        assert first - (32 + 4 * 29) * cell < 4 * 16 * 4  # the prompts' cells once, and table entries
        assert later == 3 * 4 * cell  # a new cell a sequence a step: no block filled, no entry changed
    else:
        assert table.counts.gather_used != "1 group"
        # 20 slots: 8 stream a sequence's own blocks, 12 keep the prefix's 8 and 4 own; least recently
        # read, a sequence at a time, would send every own block each step (0.52x)
        assert later / 3 <= 0.45 * cell * 4 * 62
    assert table.counts.bytes_copied <= 0.6 * dense.counts.bytes_copied


@pytest.mark.parametrize("device_blocks", [1.0, 0.75])
def test_the_device_table_prefetching_gives_the_same_outputs_and_counts_its_sends_in_their_steps(
        device_blocks: float, capsys: pytest.CaptureFixture[str]) -> None:
    """--pool-prefetch: the device table's row again with its pool prefetching, each group's sends made
    under the group before's compute; the outputs are every row's, and with one group (the pool holding
    the working set) the bytes a step are the serial row's; with fewer slots the plan keeps two groups'
    streamed blocks (fewer resident), still under 0.6x the dense gather's."""
    cfg = BenchConfig.of(n_ctx=1024, npl=(4,), npp=60, ntg=4, n_layer=1, head_dim=32, n_head_kv=1, n_head=2,
                         policies=("ragged",), device="cpu", repeat=1, rounds=1, paged=True, block_size=4,
                         adjacency=0.5, shared_prefix=32, device_blocks=device_blocks, pool_prefetch=True)
    res = run_bench(cfg)
    table, ahead = res.row(4, "ragged", gather="device_table"), res.row(4, "ragged", gather="device_table_prefetch")
    dense = res.row(4, "ragged", gather="per_block")
    assert res.outputs_identical(4) and ahead.output_sha256 == table.output_sha256
    assert ahead.key.label == "paged device table+prefetch"
    if device_blocks == 1.0:
        assert ahead.counts == table.counts
    else:
        assert ahead.counts.gather_used != "1 group"
        # the prompts' blocks once: the same cells, table entries apart (more groups, other slots)
        assert abs(ahead.counts.first_step_bytes - table.counts.first_step_bytes) < 4 * 16 * 4
        assert ahead.counts.bytes_copied <= 0.6 * dense.counts.bytes_copied
    argv = ["paged-bench", "-c", "512", "-npl", "2", "-npp", "40", "-ntg", "2", "--head-dim", "32", "--kv-heads",
            "1", "--heads", "2", "--layers", "1", "--repeat", "1", "--rounds", "1", "--device", "cpu",
            "--block-size", "4", "--shared-prefix", "8", "--pool-prefetch"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "paged device table+prefetch (1 group)" in text
    assert "npl 2 device table+prefetch: 1.000x the device table's bytes; waited " in text


def test_the_prefetching_rows_copy_time_is_its_waits_not_the_next_syncs_planning(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With the pool prefetching, a step's copy time is its wait for the sends it reads; the sync it makes for
    the next group (planning what to send, queuing it) is the host's: on a clock that moves one second a
    BlockPool.sync and never else, the prefetch row's copy time is 0 and its host time a second for each sync
    made inside the timed steps (every one but the loop's first), where the serial row's syncs are copy (and
    its syncs made again, sending nothing, its sync_host_s, apart from the step's time)."""
    from ferry.block_pool import BlockPool
    from ferry.workloads import bench as bench_workload

    cfg = BenchConfig.of(n_ctx=1024, npl=(4,), npp=60, ntg=4, n_layer=1, head_dim=32, n_head_kv=1, n_head=2,
                         policies=("ragged",), device="cpu", repeat=1, rounds=1, paged=True, block_size=4,
                         adjacency=0.5, shared_prefix=32, device_blocks=1.0, pool_prefetch=True)
    clock = [0.0]
    real = BlockPool.sync

    def counted(self: BlockPool, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        clock[0] += 1.0

    monkeypatch.setattr(BlockPool, "sync", counted)
    monkeypatch.setattr(bench_workload.time, "perf_counter", lambda: clock[0])
    res = run_bench(cfg)
    table, ahead = res.row(4, "ragged", gather="device_table"), res.row(4, "ragged", gather="device_table_prefetch")
    assert ahead.counts.gather_used == "1 group"
    assert (ahead.times.copy_s, ahead.times.host_s) == (0.0, cfg.sequences.ntg - 1)
    assert (table.times.copy_s, table.times.host_s) == (cfg.sequences.ntg, 0.0)
    # the serial row times each sync again (sending nothing) for its own host time, outside the step's time
    assert (table.times.sync_host_s, table.times.decode_s) == (cfg.sequences.ntg, cfg.sequences.ntg)


def test_bench_paged_on_a_named_link_says_it_and_its_peak(capsys: pytest.CaptureFixture[str]) -> None:
    """--link-profile names the stand-in's link in the head line, at its own peak or --link-gbps's; the
    plan's stand-in takes it too, and --latency-us beside it is refused naming both."""
    argv = ["paged-bench", "-c", "512", "-npl", "2", "-npp", "40", "-ntg", "2", "--head-dim", "32",
            "--kv-heads", "1", "--heads", "2", "--layers", "1", "--repeat", "1", "--rounds", "1", "--device", "cpu",
            "--link-profile", "pcie4"]
    assert main(argv) == 0
    assert "split on CPU (stand-in device), link pcie4 at 24.5 GB/s;" in capsys.readouterr().out
    assert main(argv + ["--link-gbps", "2"]) == 0
    assert "link pcie4 at 2 GB/s;" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(argv + ["--latency-us", "3"])
    assert e.value.code == 2
    assert "--link-profile pcie4 gives the stand-in's latency and row cost: leave out --latency-us" in \
        capsys.readouterr().err
    assert main(["paged-plan", "--link-profile", "h100-pcie5", "--link-gbps", "5"]) == 0
    assert "stand-in link h100-pcie5 at 5 GB/s, pieces from 0.6 GB/s small, 40 µs a call" in capsys.readouterr().out


def test_paged_plan_says_why_a_cheaper_merged_is_not_taken(capsys: pytest.CaptureFixture[str]) -> None:
    """On the H100 profile at adjacency 0.9 with 8 KiB blocks (tools/results/2026-12-07-merged-spans.md)
    merged is predicted cheaper than batched by less than auto asks of it: the plan takes batched and
    says so on merged's line; at adjacency 0 merged is taken and no line says it."""
    argv = ["paged-plan", "-c", "4112", "-npl", "4", "-npp", "512", "-ntg", "8", "--kv-heads", "2", "--head-dim", "128",
            "--link-profile", "h100-pcie5", "--link-gbps", "0.25"]
    assert main(argv + ["--adjacency", "0.9"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("    ")}
    assert rows["batched"].endswith("<- chosen")
    assert rows["merged"].endswith("cheaper, but by less than auto asks of merged (docs/design.md)")
    assert main(argv + ["--adjacency", "0"]) == 0
    out = capsys.readouterr().out
    assert "auto asks" not in out and any(line.split()[0] == "merged" and line.endswith("<- chosen")
                                          for line in out.splitlines() if line.startswith("    "))


# ------------------------------------------------------------ validate --paged


def tiny_validate(**kw: Any) -> ValidateConfig:
    return ValidateConfig.of(n_seq=4, n_stream=2, n_layer=1, n_step=2, kv_size=48, head_dim=32, n_head_kv=1, n_head=2,
                          policies=("ragged",), overlap=False, device="cpu", paged=True, block_size=4, **kw)


def test_validate_paged_hashes_every_gather_method_as_the_cells_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hash per method the stand-in offers and for auto, each served by that method, all the cells'."""
    used: List[str] = []

    class Recording(ferry.Scheduler):
        def compute(self, graph: Any) -> None:
            super().compute(graph)
            used.extend(str(i.stats.gather) for i in self.inputs if i.stats.gather is not None)

    monkeypatch.setattr(validate_workload, "Scheduler", Recording)
    res = run_validate(tiny_validate(adjacency=0.5, v_trans=True))
    assert list(res.hashes) == ["ragged", "paged/per_block", "paged/runs", "paged/batched", "paged/merged",
                                "paged/auto", "paged/device_table"]
    assert res.passed
    assert {"per_block", "runs", "batched", "merged"} <= set(used)


def test_validate_paged_fails_when_a_paged_cache_reads_other_cells(monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The gate can fail on a paged cache: its cells written one cell late, every paged hash differs from
    the cells cache's, and the command exits 1."""
    write = validate_workload.write_paged_cells

    def one_late(cache: Any, which: str, layer: int, seq: int, cell0: int, data: bytes) -> None:
        write(cache, which, layer, seq, cell0 + 1, data)

    monkeypatch.setattr(validate_workload, "write_paged_cells", one_late)
    res = run_validate(tiny_validate())
    assert not res.identical and res.hashes["paged/auto"] != res.hashes["ragged"]
    assert len({h for k, h in res.hashes.items() if k.startswith("paged/")}) == 1
    assert main(["validate", "--paged", "-c", "96", "-npl", "2", "-npp", "20", "-ntg", "2", "--head-dim", "32",
                 "--kv-heads", "1", "--heads", "2", "--layers", "1", "--policy", "ragged", "--no-overlap",
                 "--device", "cpu"]) == 1
    out = capsys.readouterr()
    assert "policies and paged gathers: DIFFERENT" in out.out and "the gate failed" in out.err


def test_validate_paged_fails_when_the_device_pool_keeps_a_waves_old_cells(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device table's hash is checked too: a pool not told that a new wave wrote over the streams
    (drop_ahead left out) reads the last wave's cells, and only its hash differs."""
    from ferry.block_pool import BlockPool

    monkeypatch.setattr(BlockPool, "drop_ahead", lambda self: None)
    res = run_validate(tiny_validate())
    assert not res.passed
    assert [k for k, h in res.hashes.items() if h != res.hashes["ragged"]] == ["paged/device_table"]


# ------------------------------------------------------------ paged-plan

PLAN = ["-c", "2048", "-npl", "3", "-npp", "100", "-ntg", "4", "--head-dim", "32", "--kv-heads", "2",
        "--block-size", "8", "--latency-us", "2", "--row-ns", "50", "--link-gbps", "4"]


@pytest.mark.parametrize("which, adjacency, v_trans", [("k", 0.5, False), ("v", 0.0, True), ("v", 1.0, False)])
def test_plan_paged_predicts_what_its_plan_costs_when_run(which: str, adjacency: float, v_trans: bool,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """What `ferry plan --paged` prints, run: the same cache and window copied into the same stand-in by
    each method, the link charging each method's printed prediction, the chosen one's calls and bytes."""
    argv = ["paged-plan", *PLAN, "--which", which, "--adjacency", str(adjacency)] + ["--v-trans"] * v_trans
    assert main(argv + ["--json"]) == 0
    (p,) = json.loads(capsys.readouterr().out)
    cache = paged_cache(2048, 3, 104, "f16", 32, 2, v_trans, 8, adjacency)
    split = standin((4.0,), (2.0,), (50.0,))
    k, v = cache.window(0, 104)
    window = k if which == "k" else v
    assert p["bytes"] == 3 * 104 * 32 * 2 * 2 and p["blocks"] == 3 * 13
    assert p["method"] == min((s, m) for m, s in p["method_seconds"].items() if s is not None and m != "auto")[1]
    for method, predicted in p["method_seconds"].items():
        if predicted is None:
            continue
        cache.gather = method
        dst = window.dup_layout()
        split.alloc_buffer_for(dst)
        split.reset_link_stats()
        st = ferry.copy_path.copy_input(split, "flat", window, dst)
        assert split.link_stats.modelled_seconds == pytest.approx(predicted, rel=1e-9), method
        assert st.bytes_copied == p["bytes"]
        if method in ("auto", p["method"]):
            assert split.link_stats.modelled_seconds == pytest.approx(p["seconds"], rel=1e-9)
            assert st.copy_calls == p["calls"]
        if method == "per_block":
            assert st.copy_calls == p["blocks"]
    assert p["runs"] == sum(runs_of(cache.table(s)[0]) for s in range(3))
    cache.close()
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"{p['blocks']} blocks in {p['runs']} runs; {p['method']}: {p['calls']} call" in text
    chosen = [ln for ln in text.splitlines() if "<- chosen" in ln]
    assert len(chosen) == 1 and chosen[0].split()[0] == p["method"]
    assert np.isclose(p["seconds"], p["method_seconds"][p["method"]])


def test_a_paged_bench_config_takes_the_ragged_policy_on_one_device_only() -> None:
    """What `ferry bench --paged --policy flat,ragged` and `--devices 2` were refused by (before the verb
    took neither option): the run's config, for a caller of ferry.workloads.bench."""
    with pytest.raises(ferry.InvalidArgumentError, match=re.escape(
            "--paged compares the paged gathers with the cells cache's ragged copy (the same bytes, contiguous), "
            "not --policy flat,ragged: give --policy ragged or leave out --policy")):
        BenchConfig.of(paged=True, policies=("flat", "ragged")).check()
    with pytest.raises(ferry.InvalidArgumentError, match="--paged runs on one device with every layer's KV in host "
                                                         "memory"):
        BenchConfig.of(paged=True, policies=("ragged",), devices=DeviceConfig(n_devices=2)).check()


# ------------------------------------------------------------ issue 42: the old spellings, for one release

OLD_ARGS = ["-c", "512", "-npl", "2", "-npp", "40", "-ntg", "2", "--head-dim", "32", "--kv-heads", "1"]


@pytest.mark.parametrize("old,new", [
    (["plan", "--paged", "--which", "v"], ["paged-plan", "--which", "v"]),
    (["bench", "--paged", "--layers", "1"], ["paged-bench", "--layers", "1"]),
    (["bench", "--paged", "--policy", "ragged"], ["paged-bench"]),  # the paged run's one policy, as it was
    (["bench", "--pag", "--rounds=2"], ["paged-bench", "--rounds=2"]),  # an abbreviation, as argparse took it
])
def test_the_old_spelling_makes_the_verbs_job_and_names_the_verb(old: List[str], new: List[str],
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`ferry plan --paged` and `ferry bench --paged` make the job the verb makes, and say on stderr which
    verb that is now; the verb says nothing of the kind."""
    from ferry.cli import prepare

    old_job = prepare([*old, *OLD_ARGS])[2]
    err = capsys.readouterr().err
    assert f"`ferry {old[0]} --paged` is `ferry {new[0]}` now" in err and "next release" in err
    assert old_job == prepare([*new, *OLD_ARGS])[2]
    assert capsys.readouterr().err == ""


def test_the_old_plan_spelling_prints_what_the_verb_prints(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--paged", *PLAN]) == 0
    old = capsys.readouterr().out
    assert main(["paged-plan", *PLAN]) == 0
    assert capsys.readouterr().out == old and "<- chosen" in old
