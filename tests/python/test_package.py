"""The package's face: build_info, cuda_available, the reprs of its objects, one spelling per public
name with the binding kept off it, and every public result type saying what each field holds."""

from __future__ import annotations

import dataclasses
import os
import pydoc
import re
from collections import defaultdict
from typing import DefaultDict, List

import pytest

import ferry
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


# ------------------------------------------------------------ one spelling per name


def test_every_public_name_exists_once() -> None:
    assert len(ferry.__all__) == len(set(ferry.__all__))
    for name in ferry.__all__:
        assert hasattr(ferry, name), name


def test_no_two_public_names_are_one_object() -> None:
    by_id: DefaultDict[int, List[str]] = defaultdict(list)
    for name in ferry.__all__:
        by_id[id(getattr(ferry, name))].append(name)
    assert [names for names in by_id.values() if len(names) > 1] == []


def test_the_binding_is_not_public() -> None:
    assert not hasattr(ferry, "ffi") and not hasattr(ferry, "lib")
    assert not {"ffi", "lib"} & set(ferry.__all__)


def test_no_second_spellings() -> None:
    """close/closed, Tensor.copy_to, Type's properties and ferry.ops' functions are the one spelling."""
    for name in ("tensor_copy", "CopyRanges", "type_name", "type_size", "blck_size"):
        assert not hasattr(ferry, name), name
    for cls, names in ((ferry.Buffer, ("free", "freed")), (ferry.Event, ("free",)),
                       (ferry.Tensor, ("scale", "dup", "concat", "pad", "mean"))):
        for name in names:
            assert not hasattr(cls, name), f"{cls.__name__}.{name}"


# ------------------------------------------------------------ result types say what their fields hold


def _result_types() -> List[type]:
    out = []
    for name in ferry.__all__:
        obj = getattr(ferry, name)
        if isinstance(obj, type) and (dataclasses.is_dataclass(obj) or hasattr(obj, "_fields")):
            out.append(obj)
    return out


def _fields(cls: type) -> List[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return list(cls._fields)


def test_the_public_face_has_result_types() -> None:
    names = {c.__name__ for c in _result_types()}
    assert {"Stats", "CopyStats", "SchedStats", "Copy2D", "KVParams", "Split", "Input", "Explanation",
            "Placement"} <= names


@pytest.mark.parametrize("cls", _result_types(), ids=lambda c: c.__name__)
def test_each_field_is_documented(cls: type) -> None:
    doc = cls.__doc__ or ""
    assert "Attributes\n    ----------" in doc, f"{cls.__name__} has no Attributes section"
    section = doc.split("Attributes\n    ----------", 1)[1]
    named = set()
    for line in section.splitlines():
        m = re.match(r"^    ([a-z_][a-z_0-9, ]*) : ", line)  # "name : type" or "a, b : type"
        if m:
            named.update(n.strip() for n in m.group(1).split(","))
    missing = [f for f in _fields(cls) if f not in named]
    assert not missing, f"{cls.__name__} does not say what {missing} hold"
    assert "Attributes" in pydoc.render_doc(cls)  # help() shows it
