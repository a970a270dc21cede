"""`ferry validate`, the hash gate: identical hashes under every policy, a detected control, the
text and JSON outputs, an exit status that fails when the gate does, and what makes it a gate."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, List, Tuple

import pytest

import ferry
from ferry.cli import main
from ferry.workloads import validate

SMALL = ["--device", "cpu"]
#: The gate at 16 sequences through 8 streams of 64 cells, 4 steps a wave, prompts of 5 to 60 cells.
EIGHT = ["-c", "512", "-npl", "8", "--sequences", "16", "-npp", "60", "-ntg", "4"]


def test_text_output_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", *SMALL, *EIGHT]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert err == ""
    assert lines[0] == "split backend: CPU (stand-in device)"
    assert lines[1] == ("16 sequences through 8 streams of 64 cells (2 waves), 2 layers, 4 decode steps, K/V f16, "
                        "8 heads x 64, 2 KV heads")
    assert lines[2] == "sha256 of every attention output:"
    hashes = [re.fullmatch(r"  ((?:flat|ranges|plan|ragged)(?:\+overlap(?:-within)?)?|control) +([0-9a-f]{64})"
                           r"(  \(.*\))?", ln) for ln in lines[3:16]]
    assert all(hashes) and [m.group(1) for m in hashes] == [  # type: ignore[union-attr]
        *(f"{p}{o}" for p in ("flat", "ranges", "plan", "ragged") for o in ("", "+overlap", "+overlap-within")),
        "control"]
    policy_hashes = {m.group(2) for m in hashes[:12]}  # type: ignore[union-attr]
    assert len(policy_hashes) == 1 and hashes[12].group(2) not in policy_hashes  # type: ignore[union-attr]
    assert lines[16] == "policies: identical; control: detected; gate: pass"
    assert len(lines) == 17


def test_validate_json_has_one_identical_hash_per_policy_and_overlap(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", *SMALL, "--json", "--type", "q8_0", "--sequences", "5", "-npl", "2"]) == 0
    [got] = json.loads(capsys.readouterr().out)
    assert set(got) == {"npl", "hashes", "identical", "control_detected", "split_memory_bytes", "graph_builds"}
    assert got["npl"] == 2
    assert list(got["hashes"]) == [f"{p}{o}" for p in ("flat", "ranges", "plan", "ragged")
                                   for o in ("", "+overlap", "+overlap-within")] == list(got["split_memory_bytes"])
    assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in got["hashes"].values())
    assert len(set(got["hashes"].values())) == 1
    assert got["identical"] is True and got["control_detected"] is True


def test_hash_is_deterministic_and_follows_the_content() -> None:
    cfg = validate.ValidateConfig.of(device="cpu", policies=("ranges",), n_seq=4, n_stream=2)
    split = ferry.StandinBackend()
    a = validate.serve(cfg, split, "ranges")
    assert validate.serve(cfg, split, "ranges") == a
    assert validate.serve(validate.ValidateConfig.of(device="cpu", n_seq=4, n_stream=2, seed=1), split, "ranges") != a


def test_the_gate_fails_when_a_policy_reads_the_wrong_stream(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A policy whose run reads a neighbour's range (here: plan, made to by a shifted window) breaks
    identity, and the command exits 1."""
    real = validate.serve

    def broken(cfg: validate.ValidateConfig, split: ferry.Backend, policy: str, shift: int = 0,
               compact: bool = False, prefetch: int = 0, **kw: Any) -> Tuple[str, int, int]:
        return real(cfg, split, policy, shift=1 if policy == "plan" else shift, compact=compact, prefetch=prefetch,
                    **kw)

    monkeypatch.setattr(validate, "serve", broken)
    assert main(["validate", *SMALL, *EIGHT, "--json"]) == 1
    out, err = capsys.readouterr()
    [got] = json.loads(out)
    assert got["identical"] is False and got["control_detected"] is False  # plan's hash is the control's
    assert got["hashes"]["flat"] == got["hashes"]["ranges"] != got["hashes"]["plan"]
    assert err == "ferry validate: the gate failed\n"
    assert main(["validate", *SMALL, *EIGHT]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "policies: DIFFERENT; control: NOT DETECTED; gate: FAIL"


def test_same_content_in_every_stream_hides_a_cross_stream_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why each sequence needs its own content: with one prompt shared by every sequence the streams
    hold the same bytes, and the control's cross-stream read goes unseen."""
    real_content = validate.random_rows
    monkeypatch.setattr(validate, "random_rows", lambda ty, cells, n_embd, seed: real_content(
        ty, cells, n_embd, (seed[0], 0, seed[2], seed[3])))
    monkeypatch.setattr(validate.ValidateConfig, "prompts", lambda self: [20] * self.waves.n_seq)
    monkeypatch.setattr(validate, "_query", lambda cfg, seq, layer, t: validate.np.full(
        (cfg.kv.n_head, cfg.kv.head_dim), 0.25 * (layer + t + 1), validate.np.float32))
    res = validate.run_validate(validate.ValidateConfig.of(device="cpu"))
    assert res.identical and not res.control_detected and not res.passed


def test_the_default_prompts_are_16_mostly_different_lengths_of_5_to_60() -> None:
    p = validate.ValidateConfig.of().prompts()
    assert len(p) == 16 and len(set(p)) > 8 and min(p) >= 5 and max(p) <= 60


@pytest.mark.parametrize("args,message", [
    (["-npl", "1"], "-npl 1: a gate for cross-stream reads needs at least 2 streams"),
    (["-c", "16", "-npl", "2", "-npp", "10"], "-npl 2: a stream holds 8 cells (-c / -npl), fewer than -npp + -ntg = 18"),
    (["-npp", "9"], "-npp 9: --lengths uniform draws prompts of different lengths, from -ntg + 1 = 9 cells: give -npp "
                    "at least -ntg + 2 = 10, or --lengths equal"),
    (["-npp", "8", "--lengths", "equal"], "-npp 8: a prompt has at least -ntg + 1 = 9 cells; give -npp at least that"),
    (["-c", "4095"], "-npl 2: the context of 4095 cells does not split into 2 equal streams"),
    (["--sequences", "0"], "argument --sequences: 0 is out of range"),
    (["--policy", "ranges,nope"], "--policy 'nope': known policies are flat, ranges, plan, ragged"),
    (["--heads", "3"], "--heads 3 is not a multiple of --kv-heads 2"),
    (["--type", "q8_0", "--head-dim", "16"], "--type q8_0 needs --head-dim a multiple of 32, got 16"),
])
def test_bad_options_are_refused(args: List[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["validate", *SMALL, *args])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_compact_staging_keeps_the_hashes() -> None:
    """--compact hashes each non-flat policy again with compact staging: identical hashes, and less
    memory held on the split backend than with the source's layout."""
    cfg = validate.ValidateConfig.of(n_seq=6, n_stream=3, kv_size=48, n_step=2, compact=True, device="cpu")
    res = validate.run_validate(cfg)
    assert list(res.hashes) == [f"{p}{o}" for p in ("flat", "ranges", "plan", "ragged", "ranges+compact",
                                                    "plan+compact", "ragged+compact")
                                for o in ("", "+overlap", "+overlap-within")]
    assert res.identical and res.control_detected
    assert res.split_memory["ranges+compact"] < res.split_memory["ranges"]
    assert res.split_memory["plan+compact"] == res.split_memory["ranges+compact"]


@pytest.mark.skipif(not ferry.cuda_available(), reason="no CUDA device")
def test_cuda_split_passes_the_gate(capsys: pytest.CaptureFixture[str]) -> None:
    """The gate with the split on CUDA (the cache pinned): identical hashes, a detected control."""
    assert main(["validate", "--device", "cuda", "--json", "--sequences", "6", "-npl", "2"]) == 0
    [got] = json.loads(capsys.readouterr().out)
    assert got["identical"] is True and got["control_detected"] is True
    assert len(set(got["hashes"].values())) == 1


def test_padded_steps_reuse_one_graph_and_hash_as_graphs_built_every_step() -> None:
    base = validate.ValidateConfig.of(device="cpu", policies=("ranges",), n_seq=4, n_stream=2, n_step=6)
    split = ferry.StandinBackend()
    exact = validate.serve(base, split, "ranges")
    assert exact[2] == 2 * 6  # pad 1: every step's n_kv is new
    padded_waves = dataclasses.replace(base.waves, pad=base.waves.kv_size)
    padded = validate.serve(dataclasses.replace(base, waves=padded_waves), split, "ranges")
    rebuilt = validate.serve(dataclasses.replace(base, waves=padded_waves,
                                                 variants=dataclasses.replace(base.variants, reuse=False)),
                             split, "ranges")
    assert padded[2] == 1 and rebuilt[2] == 2 * 6  # one n_kv (the whole stream) for both waves
    assert padded[0] == rebuilt[0] == exact[0]


def _draft_config(**kw: Any) -> validate.ValidateConfig:
    base = dict(n_seq=4, n_stream=2, n_step=3, kv_size=64, npp=20, head_dim=32, n_head_kv=1, n_head=2, n_layer=2,
                draft=3, accept=0.6, device="cpu", paged=True, pad=64)  # one n_kv: windows kept across steps
    base.update(kw)
    return validate.ValidateConfig.of(**base)


def test_the_draft_loop_is_byte_identical_across_policies_prefetching_and_gathers() -> None:
    """validate --draft: verifications of N + 1 tokens with their rejected cells rolled back give one hash
    under every policy, serial and prefetching across steps and within them, and every paged gather; each
    verification's tokens are its one-token steps' within DRAFT_TOLERANCE."""
    res = validate.run_validate(_draft_config())
    assert {k.split("/", 1)[1] for k in res.draft_hashes} >= {"ragged", "ragged+overlap", "flat+overlap-within",
                                                                "paged/auto"}
    assert res.draft_identical and res.draft_error is not None and res.draft_error <= validate.DRAFT_TOLERANCE
    assert res.passed
    assert set(res.draft_hashes.values()).isdisjoint(res.hashes.values())  # a draft serves other queries


def test_the_draft_gate_fails_when_the_rejected_cells_are_not_rolled_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without Scheduler.truncate a run prefetching across steps keeps the rejected drafts' values it copied
    ahead: its hash differs and the gate fails, so the gate can see a rollback go wrong."""
    monkeypatch.setattr(ferry.Scheduler, "truncate", lambda self, stream, length: None)
    res = validate.run_validate(_draft_config(paged=False, policies=("ragged",)))
    assert not res.draft_identical and not res.passed
    assert res.draft_hashes["draft/ragged"] != res.draft_hashes["draft/ragged+overlap"]


def test_validate_draft_prints_and_writes_the_draft_hashes(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["validate", "-c", "128", "-npl", "2", "-npp", "12", "-ntg", "2", "--head-dim", "32", "--kv-heads", "1",
            "--heads", "2", "--layers", "1", "--device", "cpu", "--policy", "flat,ragged", "--draft", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "served by drafts of 2 tokens" in out and "drafts: identical; against one-token steps: 0 at most" in out
    assert main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)[0]
    assert got["draft_identical"] is True and got["draft_max_error"] == 0.0 and "draft/ragged+overlap" in \
        got["draft_hashes"]


def test_validate_refuses_a_draft_longer_than_a_stream_holds(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["validate", "-c", "64", "-npl", "2", "-npp", "20", "-ntg", "4", "--draft", "3", "--device", "cpu"])
    assert e.value.code == 2
    assert re.search(r"-npp \+ -ntg \* \(--draft \+ 1\) = 36", capsys.readouterr().err)
