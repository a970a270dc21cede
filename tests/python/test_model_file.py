"""Model shapes from the model file: the KV geometry read from GGUF metadata (written here with the
gguf package's own writer, metadata only), and --model on table, plan, bench and validate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import pytest

import ferry
from ferry.cli import main
from ferry.workloads.model_file import ModelGeometry, read_model_geometry

gguf = pytest.importorskip("gguf")


def write_gguf(path: Path, arch: str, blocks: int, ctx: int, embd: int, heads: Union[int, Sequence[int]],
               heads_kv: Union[int, Sequence[int], None] = None, key_length: Optional[int] = None,
               value_length: Optional[int] = None, sliding_window: Optional[int] = None,
               swa_pattern: Union[int, Sequence[bool], None] = None) -> Path:
    """A metadata-only GGUF file: the architecture and its attention hyperparameters, no tensors."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(blocks)
    w.add_context_length(ctx)
    w.add_embedding_length(embd)
    w.add_head_count(heads)
    if heads_kv is not None:
        w.add_head_count_kv(heads_kv)
    if key_length is not None:
        w.add_key_length(key_length)
    if value_length is not None:
        w.add_value_length(value_length)
    if sliding_window is not None:
        w.add_sliding_window(sliding_window)
    if swa_pattern is not None:
        w.add_sliding_window_pattern(swa_pattern)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


@pytest.fixture
def llama(tmp_path: Path) -> Path:
    """Head dim from embedding_length / head_count (512 / 8 = 64), 2 KV heads."""
    return write_gguf(tmp_path / "tiny-llama.gguf", "llama", blocks=3, ctx=2048, embd=512, heads=8, heads_kv=2)


@pytest.fixture
def gemma(tmp_path: Path) -> Path:
    """A head dim that is not embedding_length / head_count: 96, where 576 / 4 = 144."""
    return write_gguf(tmp_path / "tiny-gemma2.gguf", "gemma2", blocks=2, ctx=1024, embd=576, heads=4, heads_kv=1,
                      key_length=96, value_length=96)


def test_llama_head_dim_from_the_embedding(llama: Path) -> None:
    g = read_model_geometry(llama)
    assert g == ModelGeometry(path=str(llama), architecture="llama", n_layer=3, n_head=8, n_head_kv=2, head_dim_k=64,
                              head_dim_v=64, n_ctx=2048, n_head_kv_per_layer=(2, 2, 2))


def test_gemma_head_dim_from_key_length(gemma: Path) -> None:
    g = read_model_geometry(gemma)
    assert (g.architecture, g.n_layer, g.n_head, g.n_head_kv, g.head_dim_k, g.head_dim_v, g.n_ctx) == (
        "gemma2", 2, 4, 1, 96, 96, 1024)


def test_kv_heads_default_to_the_query_heads(tmp_path: Path) -> None:
    g = read_model_geometry(write_gguf(tmp_path / "mha.gguf", "gpt2", blocks=2, ctx=256, embd=256, heads=4))
    assert (g.n_head, g.n_head_kv, g.head_dim_k) == (4, 4, 64)


def test_k_and_v_head_dims_may_differ(tmp_path: Path) -> None:
    g = read_model_geometry(write_gguf(tmp_path / "mla.gguf", "deepseek2", blocks=2, ctx=4096, embd=1024, heads=16,
                                       heads_kv=16, key_length=192, value_length=128))
    assert (g.head_dim_k, g.head_dim_v) == (192, 128)


def test_per_layer_kv_heads_take_the_widest_and_count_layers_with_a_cache(tmp_path: Path) -> None:
    g = read_model_geometry(write_gguf(tmp_path / "mixed.gguf", "openelm", blocks=4, ctx=512, embd=256,
                                       heads=[4, 4, 8, 8], heads_kv=[1, 0, 2, 2], key_length=32, value_length=32))
    assert (g.n_layer, g.n_head, g.n_head_kv, g.n_head_kv_per_layer) == (3, 8, 2, (1, 0, 2, 2))


def test_gemma2_slides_on_the_even_layers(tmp_path: Path) -> None:
    g = read_model_geometry(write_gguf(tmp_path / "g2.gguf", "gemma2", blocks=5, ctx=1024, embd=256, heads=4,
                                       heads_kv=2, sliding_window=64))
    assert g.sliding_window_per_layer == (64, None, 64, None, 64)
    assert g.layer_windows() == [64, None, 64, None, 64]
    assert g.as_dict()["sliding_window_per_layer"] == [64, None, 64, None, 64]


def test_gemma3_slides_five_layers_then_one_full(tmp_path: Path) -> None:
    g = read_model_geometry(write_gguf(tmp_path / "g3.gguf", "gemma3", blocks=8, ctx=1024, embd=256, heads=4,
                                       heads_kv=2, sliding_window=512))
    assert g.sliding_window_per_layer == (512,) * 5 + (None, 512, 512)


@pytest.mark.parametrize("arch,window,pattern,blocks,expected", [
    ("cohere2", 32, None, 5, (32, 32, 32, None, 32)),
    ("llama4", None, None, 4, (8192, 8192, 8192, None)),  # chunked, llama.cpp's 8192 chunk
    ("llama4", 0, None, 4, ()),  # 0 turns chunking off
    ("mistral", 32, None, 2, (32, 32)),  # a window and no rule: every layer
    ("gemma3", 32, 3, 4, (32, 32, None, 32)),  # the file's period wins over the architecture's
    ("gemma2", 32, [False, True, True], 3, (None, 32, 32)),  # a flag per layer
    ("gemma2", None, None, 2, ()),  # no window: no sliding layer
])
def test_each_architecture_slides_the_layers_its_rule_names(tmp_path: Path, arch: str, window: Optional[int], pattern: Any, blocks: int,
                              expected: tuple) -> None:
    g = read_model_geometry(write_gguf(tmp_path / "m.gguf", arch, blocks=blocks, ctx=1024, embd=256, heads=4,
                                       heads_kv=2, sliding_window=window, swa_pattern=pattern))
    assert g.sliding_window_per_layer == expected


def test_sliding_layers_without_kv_heads_are_left_out(tmp_path: Path) -> None:
    g = read_model_geometry(write_gguf(tmp_path / "m.gguf", "gemma2", blocks=4, ctx=1024, embd=256, heads=4,
                                       heads_kv=[2, 2, 0, 2], sliding_window=16))
    assert g.layer_windows() == [16, None, None]


def test_bad_sliding_pattern_raises(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", "gemma2", blocks=3, ctx=1024, embd=256, heads=4, sliding_window=16,
                      swa_pattern=[True, False])
    with pytest.raises(ferry.InvalidArgumentError, match="sliding_window_pattern gives 2 values for 3 blocks"):
        read_model_geometry(path)


def test_bad_files_raise_invalid_argument(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model at all")
    with pytest.raises(ferry.InvalidArgumentError, match="not a readable GGUF file"):
        read_model_geometry(bad)
    with pytest.raises(ferry.InvalidArgumentError, match="not a readable GGUF file"):
        read_model_geometry(tmp_path / "missing.gguf")
    w = gguf.GGUFWriter(str(tmp_path / "nohead.gguf"), "llama")
    w.add_block_count(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    with pytest.raises(ferry.InvalidArgumentError, match="has no llama.attention.head_count"):
        read_model_geometry(tmp_path / "nohead.gguf")


def test_without_gguf_reading_is_a_clear_error(llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf raises ImportError
    with pytest.raises(ferry.UnsupportedError, match="needs the gguf package"):
        read_model_geometry(llama)


def test_import_ferry_does_not_import_gguf() -> None:
    code = "import sys, ferry, ferry.cli, ferry.workloads.model_file; print('gguf' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


# ---------------------------------------------------------------- --model on the verbs


def run(capsys: pytest.CaptureFixture[str], args: List[str]) -> str:
    assert main(args) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("model,by_hand", [
    ("llama", ["-c", "2048", "--head-dim", "64", "--kv-heads", "2"]),
    ("gemma", ["-c", "1024", "--head-dim", "96", "--kv-heads", "1"]),
])
def test_table_from_the_model_is_the_table_by_hand(model: str, by_hand: List[str], request: pytest.FixtureRequest,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = str(request.getfixturevalue(model))
    shape = ["-npl", "2,4,8", "-npp", "100", "-ntg", "28"]
    from_file = run(capsys, ["table", "--model", path] + shape)
    assert from_file == run(capsys, ["table"] + shape + by_hand)
    assert from_file != run(capsys, ["table"] + shape)  # the defaults are another geometry


def test_an_option_given_beside_the_model_wins(llama: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = json.loads(run(capsys, ["table", "--model", str(llama), "-c", "4096", "--kv-heads", "4", "--json"]))
    by_hand = json.loads(run(capsys, ["table", "-c", "4096", "--head-dim", "64", "--kv-heads", "4", "--json"]))
    assert out == by_hand
    main(["table", "--model", str(llama), "-c", "4096"])
    assert capsys.readouterr().err == f"ferry: {llama} (llama): head-dim 64, kv-heads 2\n"


def test_plan_takes_the_v_head_dim_for_the_v_window(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(write_gguf(tmp_path / "mla.gguf", "deepseek2", blocks=2, ctx=4096, embd=1024, heads=16,
                          heads_kv=2, key_length=192, value_length=128))
    k: Dict[str, Any] = json.loads(run(capsys, ["plan", "--model", path, "-npl", "2", "--json"]))[0]
    v: Dict[str, Any] = json.loads(run(capsys, ["plan", "--model", path, "-npl", "2", "--which", "v", "--json"]))[0]
    assert (k["head_dim"], v["head_dim"], k["n_head_kv"], k["n_ctx"]) == (192, 128, 2, 4096)


def test_bench_and_validate_take_heads_and_layers(gemma: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = json.loads(run(capsys, ["bench", "--model", str(gemma), "--device", "cpu", "-npl", "2", "-ntg", "2",
                                   "--repeat", "1", "--json"]))
    row = 96 * 1 * 2  # bytes of a cell: head dim 96, 1 KV head, f16
    steps = (256 + 1) + (256 + 2)  # n_kv of the two steps after the default 256-cell prompt
    read = {r["bytes_read"] for r in rows if not r["unified"]}
    assert read == {steps * 2 * row * 2 * 2}  # 2 streams, K and V, 2 layers
    got = json.loads(run(capsys, ["validate", "--model", str(gemma), "--device", "cpu", "--json"]))
    assert [g["npl"] for g in got] == [2, 4] and all(g["identical"] and g["control_detected"] for g in got)


def test_a_run_refuses_different_k_and_v_head_dims(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(write_gguf(tmp_path / "mla.gguf", "deepseek2", blocks=1, ctx=4096, embd=1024, heads=4, heads_kv=2,
                          key_length=192, value_length=128))
    with pytest.raises(SystemExit) as e:
        main(["validate", "--model", path, "--device", "cpu"])
    assert e.value.code == 2 and "pass --head-dim" in capsys.readouterr().err
    assert main(["validate", "--model", path, "--device", "cpu", "--head-dim", "64"]) == 0


@pytest.mark.parametrize("verb", ["table", "plan", "bench", "validate"])
def test_a_file_that_is_no_model_exits_2(verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF but not really")
    with pytest.raises(SystemExit) as e:
        main([verb, "--model", str(bad)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "not a readable GGUF file" in err and "Traceback" not in err


# ---------------------------------------------------------------- layers of different sizes on the verbs


@pytest.fixture
def gemma3(tmp_path: Path) -> Path:
    """7 blocks: 0-4 and 6 slide over 100 cells, 5 is full; K rows of 64 * 2 f16 values (256 bytes)."""
    return write_gguf(tmp_path / "tiny-gemma3.gguf", "gemma3", blocks=7, ctx=4096, embd=512, heads=4, heads_kv=2,
                      key_length=64, value_length=64, sliding_window=100)


def expected_bytes(g: ModelGeometry, npl: int, n_kv: int) -> Dict[str, int]:
    """Per layer: cells * row bytes, summed. A layer reads n_kv cells per stream (a sliding one at most
    its window + the decode step's new cell); flat copies every stream's whole size but the last's tail."""
    row = g.head_dim_k * g.n_head_kv * 2
    kv_size = g.n_ctx // npl
    read = flat = 0
    for w in g.sliding_window_per_layer:
        held = kv_size if w is None else min(w + 1, kv_size)
        reads = min(held, n_kv)
        read += npl * reads * row
        flat += ((npl - 1) * held + reads) * row
    return {"bytes_read": read, "bytes_copied_flat": flat, "bytes_copied_ranges": read}


def test_table_counts_each_layer_at_its_own_size(gemma3: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = read_model_geometry(gemma3)
    shape = ["-npl", "2,4", "-npp", "300", "-ntg", "28", "--type", "f16", "--pad", "1"]
    rows = json.loads(run(capsys, ["table", "--model", str(gemma3), "--json"] + shape))
    for r, npl in zip(rows, (2, 4)):
        assert {k: r[k] for k in ("bytes_read", "bytes_copied_flat", "bytes_copied_ranges")} == \
            expected_bytes(g, npl, 328)
        assert [(k["kind"], k["window"], k["n_layer"], k["kv_size"], k["n_kv"]) for k in r["layers"]] == [
            ("full", None, 1, 4096 // npl, 328), ("sliding", 100, 6, 101, 101)]
        assert sum(k["bytes_read"] for k in r["layers"]) == r["bytes_read"] == r["cells_read"] * 256
    text = run(capsys, ["table", "--model", str(gemma3)] + shape)
    all_rows = [line.split() for line in text.splitlines() if " all " in line]
    assert [[int(x.replace(",", "")) for x in line[-4:-1]] for line in all_rows] == [
        list(expected_bytes(g, npl, 328).values()) for npl in (2, 4)]
    by_hand = run(capsys, ["table", "-c", "4096", "--head-dim", "64", "--kv-heads", "2", "--swa-window", "100",
                           "--swa-layers", "sssssfs"] + shape)
    assert by_hand == text


def test_plan_plans_each_layer_kind_at_its_own_size(gemma3: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plans = json.loads(run(capsys, ["plan", "--model", str(gemma3), "-npl", "2", "-npp", "300", "-ntg", "28",
                                    "--type", "f16", "--pad", "1", "--json"]))
    assert [(p["sliding_window"], p["n_layer"], p["kv_size"], p["n_kv"], p["bytes_read"]) for p in plans] == [
        (None, 1, 2048, 328, 2 * 328 * 256), (100, 6, 101, 101, 2 * 101 * 256)]
    g = read_model_geometry(gemma3)
    assert sum(p["n_layer"] * p["bytes_read"] for p in plans) == expected_bytes(g, 2, 328)["bytes_read"]
    text = run(capsys, ["plan", "--model", str(gemma3), "-npl", "2", "-npp", "300", "-ntg", "28", "--type", "f16",
                        "--pad", "1"])
    assert "6 sliding layers (window 100):" in text and "over its 6 layers: read 310,272 B" in text
    llama = json.loads(run(capsys, ["plan", "-c", "4096", "-npl", "2", "--json"]))
    assert "n_layer" not in llama[0] and "sliding_window" not in llama[0]


def test_a_model_without_sliding_layers_prints_what_it_did(llama: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = json.loads(run(capsys, ["table", "--model", str(llama), "--json"]))
    assert all(sorted(r) == ["cells_copied_flat", "cells_copied_ragged", "cells_copied_ranges", "cells_read",
                             "flat_over_ragged", "flat_over_ranges", "npl", "ratio"] for r in rows)
    text = run(capsys, ["table", "--model", str(llama)])
    assert text == run(capsys, ["table", "-c", "2048", "--head-dim", "64", "--kv-heads", "2"])
    assert "layers" not in text


def test_swa_options_go_together(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["table", "--swa-window", "64"])
    assert e.value.code == 2 and "--swa-window acts only with both --swa-window and --swa-layers" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["table", "--swa-window", "64", "--swa-layers", "sx"])
    assert e.value.code == 2 and "s (sliding) or f (full)" in capsys.readouterr().err
