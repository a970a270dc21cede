"""The package's face: build_info, cuda_available, and the reprs of its objects."""

from __future__ import annotations

import os

import ferry


def test_build_info() -> None:
    info = ferry.build_info()
    assert info["cuda"] is bool(ferry.lib.ferry_built_with_cuda())
    assert info["version"] == ferry.__version__ == "0.1.0"
    assert os.path.isfile(info["library"])
    assert isinstance(ferry.cuda_available(), bool)
    if not info["cuda"]:
        assert ferry.cuda_available() is False
    # tools/test sets FERRY_FAKE_CUDART=1 exactly when it runs against the fake runtime's build
    assert info["fake_cudart"] is (os.environ.get("FERRY_FAKE_CUDART") == "1")
    assert info["cuda"] or not info["fake_cudart"]


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
