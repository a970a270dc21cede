"""`ferry bench --draft N --accept P`: draft rows beside the single-token rows. A verification of N + 1
tokens copies each window once (its bytes are the windows' cells at its lengths, from the layout), the
accepted drafts are seeded and geometric, the draft's KV on the split device copies nothing and gives
the outputs of the same draft in host memory byte for byte, and the options are refused where they
would do nothing."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Dict, Hashable, List, Tuple

import numpy as np
import pytest

import ferry
from ferry.cli import bench, main
from ferry.cli.text_table import fmt_tps_digits
from ferry.workloads import bench as bench_workload
from ferry.workloads import bench_config, bench_rows
from ferry.workloads.common import accepted_drafts
from ferry.workloads.devices import DeviceConfig

TINY = ["-c", "256", "-npl", "2", "-npp", "16", "-ntg", "3", "--layers", "2", "--heads", "2",
        "--head-dim", "32", "--kv-heads", "1", "--device", "cpu", "--pad", "1", "--repeat", "1", "--rounds", "1"]


def tiny(**kw: object) -> bench.BenchConfig:
    base = dict(n_ctx=256, npl=(2, 4), npp=16, ntg=3, n_layer=2, n_head=2, head_dim=32, n_head_kv=1,
                policies=("flat", "ragged"), device="cpu", repeat=1, rounds=1, pad=1, draft=3, accept=0.6,
                unified=False)
    base.update(kw)
    return bench.BenchConfig.of(**base)


def test_accepted_drafts_are_a_seeded_geometric_prefix() -> None:
    """Each in 0..N, the same for the same seed, all N at accept 1 and none at 0, and near the geometric
    mean over many draws (sum of accept**k for k in 1..N)."""
    a = accepted_drafts(0, 4, 2000, 4, 0.7)
    assert a.shape == (2000, 4) and a.min() == 0 and a.max() == 4
    assert (a == accepted_drafts(0, 4, 2000, 4, 0.7)).all()
    assert (accepted_drafts(0, 2, 5, 3, 1.0) == 3).all()
    assert (accepted_drafts(0, 2, 5, 3, 0.0) == 0).all()
    assert abs(a.mean() - sum(0.7 ** k for k in range(1, 5))) < 0.05


def test_a_verification_copies_each_window_once_at_its_lengths() -> None:
    """A ragged draft row moves, per step, each stream's cells once at its verification's length (kept
    length + N + 1), for every layer's K and V: from the layout and the seeded draws, not from the library;
    its tokens are the accepted drafts plus one per step and sequence, and bytes per token their quotient."""
    cfg = tiny()
    res = bench.run_bench(cfg)
    row = ferry.row_size(cfg.kv.type_kv, cfg.n_embd)
    n = cfg.sequences.draft
    for npl in cfg.sequences.npl:
        acc = accepted_drafts(cfg.sampling.seed, npl, cfg.sequences.ntg, n, cfg.sequences.accept)
        lengths = np.array(cfg.prompts(npl)) + np.concatenate([np.zeros((1, npl), int), np.cumsum(acc + 1, 0)])[:-1]
        draft = next(r for r in res.rows if r.key == bench_rows.RunKey(npl=npl, policy="ragged", draft=n))
        single = next(r for r in res.rows if r.key == bench_rows.RunKey(npl=npl, policy="ragged"))
        assert draft.counts.bytes_copied == int((lengths + n + 1).sum()) * row * 2 * cfg.kv.n_layer
        assert draft.tokens == int((acc + 1).sum())
        assert draft.bytes_per_token == draft.counts.bytes_copied / draft.tokens
        assert single.tokens == npl * cfg.sequences.ntg
        assert draft.counts.draft_bytes_copied == 0
    assert all(r.counts.draft_bytes_copied == 0 for r in res.rows)


def test_the_draft_on_the_device_copies_nothing_and_matches_the_draft_in_host_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The draft is a placement: with its layers on the split device its windows copy no byte; placed in
    host memory (as where the target's KV lives), they cross the link every draft step, and every output
    of every step is the same bytes."""
    cfg = tiny(npl=(2,), policies=("ragged",))
    placed = bench.run_bench(cfg)
    monkeypatch.setattr(bench_workload, "draft_device", lambda split: None)
    host = bench.run_bench(cfg)
    key = bench_rows.RunKey(npl=2, policy="ragged", draft=cfg.sequences.draft)
    on_device, in_host = (next(r for r in res.rows if r.key == key) for res in (placed, host))
    assert on_device.counts.draft_bytes_copied == 0
    assert in_host.counts.draft_bytes_copied > 0
    assert on_device.output_sha256 == in_host.output_sha256
    assert on_device.counts.bytes_copied == in_host.counts.bytes_copied


def test_draft_rows_agree_across_policies_and_prefetching() -> None:
    cfg = tiny(npl=(2,), policies=("flat", "ranges", "ragged"), overlap=True, prefetch=(1,), pad=64)
    res = bench.run_bench(cfg)
    draft = {r.output_sha256 for r in res.rows if r.key.draft}
    assert len(draft) == 1 and len([r for r in res.rows if r.key.draft]) == 6
    assert res.outputs_identical(2)


def test_the_table_prints_the_draft_rows_beside_the_single_token_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", *TINY, "--draft", "2", "--accept", "0.5", "--policy", "flat,ragged"]) == 0
    out = capsys.readouterr().out
    assert "draft: each verification checks 2 draft tokens" in out
    assert [ln.split()[1] for ln in out.splitlines() if ln.startswith("  2  ") and ln.split()[1] in
            ("flat", "ragged")][-2:] == ["flat", "ragged"]


def test_a_run_without_a_draft_writes_no_draft_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", *TINY, "--policy", "ragged", "--json", "--no-unified"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert not {*bench_rows.DRAFT_ROW_KEYS, *bench_config.DRAFT_CONFIG_KEYS} & {
        *rows[0], *rows[0]["config"]}


@pytest.mark.parametrize("args,message", [
    (["--accept", "0.5"], "--accept acts only with --draft N above 0"),
    (["--draft", "-1"], "--draft"),
    (["--draft", "2", "--accept", "1.5"], "--accept"),
    (["--draft", "2", "-ntg", "50"], r"-npp \+ -ntg \* \(--draft \+ 1\)"),
])
def test_bad_draft_options_are_refused(args: List[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["bench", *TINY, *args])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and re.search(message, err), err


def test_config_refuses_a_draft_over_the_paged_cache() -> None:
    with pytest.raises(ferry.InvalidArgumentError, match="--draft .*leave out --paged"):
        tiny(paged=True, policies=("ragged",)).check()


def test_a_chunk_row_copies_each_window_once_per_chunk_and_keeps_every_token() -> None:
    """--chunk N: steps of N tokens, every one kept: each step's ragged bytes are each stream's cells at its
    length after the chunk, once; N tokens per step and sequence; no draft."""
    cfg = tiny(draft=0, chunk=4, npl=(2,), policies=("ragged",))
    res = bench.run_bench(cfg)
    row = ferry.row_size(cfg.kv.type_kv, cfg.n_embd)
    r = next(r for r in res.rows if r.key == bench_rows.RunKey(npl=2, policy="ragged", chunk=4))
    lengths = [p + 4 * (t + 1) for p in cfg.prompts(2) for t in range(cfg.sequences.ntg)]
    assert r.counts.bytes_copied == sum(lengths) * row * 2 * cfg.kv.n_layer
    assert r.tokens == 2 * cfg.sequences.ntg * 4 and r.counts.draft_bytes_copied == 0
    assert r.key.label == "ragged chunk 4"


def test_draft_and_chunk_together_are_refused_naming_both() -> None:
    with pytest.raises(ferry.InvalidArgumentError, match="--draft and --chunk .*give one"):
        tiny(chunk=2).check()


def test_a_draft_rows_draft_steps_count_in_its_decode_time_not_its_host_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each draft step's compute is decode time: on a clock that moves one second a Scheduler.compute and
    never else, a draft row's step takes N + 1 seconds of decode (N draft steps, one verification) and none of
    host time."""
    cfg = tiny(npl=(2,), policies=("ragged",), ntg=2, draft=2)
    clock = [0.0]
    real = ferry.Scheduler.compute

    def counted(self: ferry.Scheduler, graph: object) -> None:
        real(self, graph)
        clock[0] += 1.0

    monkeypatch.setattr(ferry.Scheduler, "compute", counted)
    monkeypatch.setattr(bench_workload.time, "perf_counter", lambda: clock[0])
    res = bench.run_bench(cfg)
    r = next(r for r in res.rows if r.key.draft)
    assert (r.times.decode_s, r.times.host_s) == (cfg.sequences.ntg * (cfg.sequences.draft + 1), 0.0)


def test_a_draft_rows_predicted_copy_time_is_its_schedulers_predictions_summed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Beside its measured copy time, a draft row's prediction is every compute's (the draft steps' and the
    verification's): each scheduler's predicted_seconds, summed, as its copy time sums theirs."""
    seen: List[float] = []
    real = ferry.Scheduler.compute

    def recorded(self: ferry.Scheduler, graph: object) -> None:
        real(self, graph)
        seen.append(self.stats.predicted_seconds)

    monkeypatch.setattr(ferry.Scheduler, "compute", recorded)
    monkeypatch.setattr(bench_workload, "balanced_orders", lambda n: [list(range(n))])  # the draft row last
    monkeypatch.setattr(bench_workload, "measure_token_share", lambda *a, **kw: 1.0)  # its computes after the row's
    cfg = tiny(npl=(2,), policies=("ragged",), ntg=2, draft=2, unified=False)
    res = bench.run_bench(cfg)
    steps = cfg.sequences.ntg * (cfg.sequences.draft + 1)  # computes a repetition of the draft row makes
    # every round runs the single row, then the draft row: the last timed repetition is the last `steps`
    r = next(r for r in res.rows if r.key.draft)
    draft_steps = [p for i, p in enumerate(seen[-steps:]) if i % (cfg.sequences.draft + 1) != cfg.sequences.draft]
    assert any(p > 0 for p in draft_steps)  # the draft steps copy their lengths
    assert r.times.predicted_copy_s == pytest.approx(sum(seen[-steps:]))


@pytest.mark.parametrize("several", [dict(draft=2, accept=0.5), dict(draft=0, chunk=3)])
def test_a_several_token_rows_printed_prediction_is_predict_steps_at_the_windows_it_ran(
        monkeypatch: pytest.MonkeyPatch, several: Dict[str, float]) -> None:
    """The prediction a draft (chunk) row prints, in its table and in --json, is predict_step's
    (tokens_per_step N + 1, or the chunk) at the windows its verifications ran, every target layer in host
    memory (serially: its computes, its copies the stand-in's model at the copies the row made, each stream's
    own cells under ragged), plus predict_step's for its draft steps' windows (the draft's layer resident),
    each run with the single row's fixed cost of a run (its decode a step beyond its copies and compute),
    each further token of a verification adding the split's measured token_share of a one-token attention,
    over the tokens the
    row's own draws kept (the measured rate's: a chunk, its tokens), and beside it over the expected accepted
    tokens; its compute figure the single row's compute a step and layer, its link the stand-in's. The
    windows are those the row's graphs were asked for (StepGraph.get)."""
    ran: List[Tuple[bool, int]] = []
    real_get = ferry.StepGraph.get

    def get(self: ferry.StepGraph, key: Hashable) -> object:
        variant = getattr(self._build, "__self__", None)
        if isinstance(variant, bench_workload._Variant) and variant.draft is not None:
            ran.append((self._build.__name__ == "_build_draft", int(key)))  # type: ignore[call-overload]
        return real_get(self, key)

    monkeypatch.setattr(ferry.StepGraph, "get", get)
    cfg = replace(tiny(npl=(2,), policies=("ragged",), **several),
                  devices=DeviceConfig(link_gbps=(8.0,)))
    res = bench.run_bench(cfg)
    [d] = [r for r in res.as_dicts() if r["draft"] or r["chunk"]]
    [single] = [r for r in res.as_dicts() if not (r["draft"] or r["chunk"])]
    q, g = cfg.sequences, cfg.kv
    n_tok = cfg.tokens_per_step
    steps = ran[-q.ntg * (q.draft + 1):]  # the last repetition's graphs: per step its draft steps, then the step
    assert [drafting for drafting, _ in steps] == ([True] * q.draft + [False]) * q.ntg
    assert d["predicted_compute_s"] == single["compute_s_per_step"] / g.n_layer and d["predicted_link_gbps"] == 8.0
    run_s = max(0.0, single["decode_s_per_step"] - single["copy_s_per_step"] - single["compute_s_per_step"])
    assert d["predicted_run_s"] == pytest.approx(run_s, rel=1e-9, abs=1e-15) and run_s > 0
    share = d["predicted_token_share"]  # measured on the split (measure_token_share): taken as given
    assert share >= 0 and (q.draft + 1 if q.draft else q.chunk) > 1
    device = [ferry.residency.DeviceSpec(8.0, 0.0, d["predicted_compute_s"], token_share=share)]

    def predicted(n_kv: int, n_layer: int, tokens: int, resident: bool) -> float:
        layers = ferry.residency.layers_from_geometry(g.type_kv, g.type_kv, g.head_dim, g.n_head_kv, q.n_ctx, 2, n_kv,
                                                      [None] * n_layer, n_new=tokens, n_head=g.n_head)
        return ferry.residency.predict_step(layers, device, [resident] * n_layer, tokens_per_step=tokens,
                                            run_seconds=run_s).step_seconds

    # serially: the computes by predict_step, the copies by the stand-in's model at the copies the row made
    step_s = sum(predicted(n_kv, bench_config.DRAFT_LAYERS, 1, True) if drafting else
                 predicted(n_kv, g.n_layer, n_tok, True) for drafting, n_kv in steps) / q.ntg
    step_s += d["predicted_copy_s_per_step"]
    assert d["predicted_copy_s_per_step"] > 0
    expected = ferry.residency.expected_accepted_tokens(q.draft, q.accept) if q.draft else q.chunk
    kept = d["tokens"] / q.ntg / 2  # the measured rate's: the draws' own
    assert d["accepted_per_step"] == kept and (q.chunk or kept != pytest.approx(expected))  # the draws are not E
    assert d["predicted_step_s"] == pytest.approx(step_s, rel=1e-9)
    assert d["expected_accepted_per_step"] == pytest.approx(expected, rel=1e-12)
    assert d["predicted_tokens_per_s"] == pytest.approx(2 * kept / step_s, rel=1e-9)
    assert d["expected_tokens_per_s"] == pytest.approx(2 * expected / step_s, rel=1e-9)
    assert d["tokens_per_s_over_predicted"] == pytest.approx(d["tokens_per_s"] / d["predicted_tokens_per_s"])
    text = bench.format_result(res).splitlines()
    head = next(i for i, ln in enumerate(text) if ln.split()[:6] == ["npl", "policy", "tok/s", "single", "x",
                                                                       "predicted"])
    cells = text[head + 1].split()
    assert cells[5] == fmt_tps_digits(d["predicted_tokens_per_s"]) and text[head].split()[8] == "expected"
    assert cells[7] == f"{kept:.2f}" and cells[8] == fmt_tps_digits(d["expected_tokens_per_s"])
