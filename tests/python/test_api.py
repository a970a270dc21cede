"""The package's entry points: build_info, cuda_available, buffer types, reprs, the demo command."""

from __future__ import annotations

import os

import pytest

import ferry
from ferry import cli
from ferry._binding import lib


def test_build_info() -> None:
    info = ferry.build_info()
    assert info["cuda"] is bool(lib.ferry_built_with_cuda())
    assert info["version"] == ferry.__version__ == "0.1.0"
    assert os.path.isfile(info["library"])
    assert isinstance(ferry.cuda_available(), bool)
    if not info["cuda"]:
        assert ferry.cuda_available() is False
    # tools/test sets FERRY_FAKE_CUDART=1 exactly when it runs against the fake runtime's build
    assert info["fake_cudart"] is (os.environ.get("FERRY_FAKE_CUDART") == "1")
    assert info["cuda"] or not info["fake_cudart"]


def test_buffer_types_and_support() -> None:
    cpu, dummy = ferry.CPUBackend(), ferry.DummyBackend(real_memory=True)
    assert cpu.buffer_type == ferry.cpu_buffer_type() and cpu.buffer_type.is_host
    assert dummy.buffer_type.name == "Dummy" and not dummy.buffer_type.is_host
    assert ferry.DummyBackend().buffer_type.name == "Dummy(synthetic)"
    assert cpu.supports_buffer_type(ferry.cpu_buffer_type())
    assert not cpu.supports_buffer_type(dummy.buffer_type)
    assert dummy.supports_buffer_type(dummy.buffer_type)
    assert not dummy.supports_buffer_type(ferry.DummyBackend(real_memory=True).buffer_type)
    assert cpu.has_2d and not ferry.DummyBackend(has_2d=False).has_2d


def test_buffer_usage_and_size(cpu: ferry.CPUBackend) -> None:
    buf = cpu.alloc_buffer(100)
    assert buf.size == 100 and buf.is_host and buf.usage == "any"
    buf.usage = "weights"
    assert buf.usage == "weights"
    with pytest.raises(ferry.InvalidArgumentError, match="'scratch' is not one of any, weights, compute"):
        buf.usage = "scratch"
    assert buf.usage == "weights"


def test_reprs(cpu: ferry.CPUBackend) -> None:
    t = cpu.alloc_tensor("f16", [8, 2], name="x")
    assert repr(t) == "<Tensor 'x' f16 ne=[8, 2, 1, 1] nb=[2, 16, 32, 32] in CPU buffer>"
    assert repr(t.transpose(name="xt")) == "<Tensor 'xt' f16 ne=[2, 8, 1, 1] nb=[16, 2, 32, 32] view of 'x' +0 in CPU buffer>"
    assert repr(t.view([4], offset=6)).endswith("view of 'x' +6 in CPU buffer>")
    assert repr(cpu) == "<CPUBackend 'CPU'>"
    assert repr(ferry.DummyBackend(has_2d=False)) == "<DummyBackend 'Dummy(synthetic)' no-2d>"
    assert repr(ferry.Stats()) == "<Stats nothing moved>"
    t.set(bytes(6))
    assert repr(t.buffer.stats) == "<Stats set: 1 calls 6 B (1 impl)>"


def test_demo(capsys) -> None:
    assert cli.main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "bytes read 4,734,976  span (nbytes) 20,193,280  ratio 4.26x" in out
