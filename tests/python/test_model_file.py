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
               value_length: Optional[int] = None) -> Path:
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
    assert got["identical"] and got["control_detected"]


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
