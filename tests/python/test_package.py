"""The package's face: build_info, cuda_available, the reprs of its objects, at most 50 public names,
each documented in docs/api.md, one spelling per name with the binding kept off it, and every
public result type saying what each field holds."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import os
import pydoc
import re
from collections import defaultdict
from pathlib import Path
from types import ModuleType
from typing import DefaultDict, Dict, List

import pytest

import ferry
from ferry._binding import lib


def test_build_info_says_whether_cuda_and_the_fake_runtime_are_built_in() -> None:
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


def test_each_repr_names_the_object_its_layout_and_its_memory(cpu: ferry.CPUBackend) -> None:
    t = cpu.alloc_tensor("f16", [8, 2], name="x")
    assert repr(t) == "<Tensor 'x' f16 ne=[8, 2, 1, 1] nb=[2, 16, 32, 32] in CPU buffer>"
    assert repr(t.transpose(name="xt")) == "<Tensor 'xt' f16 ne=[2, 8, 1, 1] nb=[16, 2, 32, 32] view of 'x' +0 in CPU buffer>"
    assert repr(t.view([4], offset=6)).endswith("view of 'x' +6 in CPU buffer>")
    assert repr(cpu) == "<CPUBackend 'CPU'>"
    assert repr(ferry.DummyBackend(has_2d=False)) == "<DummyBackend 'Dummy(synthetic)' no-2d>"
    assert repr(ferry.stats.Stats()) == "<Stats nothing moved>"
    t.set(bytes(6))
    assert repr(t.buffer.stats) == "<Stats set: 1 calls 6 B (1 impl)>"


# ------------------------------------------------------------ one spelling per name

API = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def test_the_face_is_at_most_50_names_each_documented() -> None:
    """docs/api.md has a line for each name of ferry.__all__, and for no other: a name added (or a
    second spelling) without a line there fails here."""
    documented = re.findall(r"^- `(\w+)`", API.read_text(encoding="utf-8"), re.M)
    assert len(documented) == len(set(documented))
    assert sorted(documented) == sorted(ferry.__all__)
    assert len(ferry.__all__) <= 50


def test_the_planner_and_the_copy_plans_live_in_their_modules() -> None:
    """The residency planner's names are ferry.residency's and the copy-plan analysis ferry.plan's, not
    the top level's; one word for one thing: residency's choose_*, copy plans' plan_*, the
    allocator's Slot, a layer's placement."""
    for name in ("choose_residency", "choose_auto", "DeviceSpec", "LayerCost", "predict_step", "ResidencyPlan"):
        assert hasattr(ferry.residency, name) and not hasattr(ferry, name), name
    for name in ("plan_copy", "explain", "CopyCostModel", "plan_cost", "plan_pays", "layout_view"):
        assert hasattr(ferry.plan, name) and not hasattr(ferry, name), name
    for gone in ("plan_residency", "plan_auto", "plan_of", "explain_tensor", "step_graph", "Placement",
                 "numpy_dtype", "type_from_dtype"):
        assert not hasattr(ferry, gone) and not hasattr(ferry.plan, gone) and not hasattr(ferry.residency, gone)
    assert ferry.alloc.Slot._fields == ("buffer_type", "chunk", "offset", "size")


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


#: The modules of the face whose names are public too (ferry.__all__'s modules, and ferry.link: what
#: measure_link returns, which CopyCostModel.from_link takes).
MODULES: List[ModuleType] = [ferry, ferry.plan, ferry.residency, ferry.stats, ferry.sched, ferry.kv, ferry.paged,
                             ferry.alloc, ferry.link]


def _result_types() -> List[type]:
    out: List[type] = []
    for module in MODULES:
        names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
        for name in names:
            obj = getattr(module, name)
            if isinstance(obj, type) and obj.__module__.startswith("ferry") and obj not in out and \
                    (dataclasses.is_dataclass(obj) or hasattr(obj, "_fields")):
                out.append(obj)
    return out


def _fields(cls: type) -> List[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return list(cls._fields)


def test_the_public_face_has_result_types() -> None:
    names = {c.__name__ for c in _result_types()}
    assert {"Stats", "CopyStats", "SchedStats", "Copy2D", "KVParams", "Split", "Input", "Explanation",
            "Slot", "ResidencyPlan", "DeviceSpec", "PagedParams", "PagedPlan", "GatherCopy"} <= names


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


# ------------------------------------------------------------ the workloads' records: small, and built by name


#: The most fields a record of the workloads holds: past it, a record is several concerns, to be grouped (issue 42).
MAX_RECORD_FIELDS = 12
WORKLOADS = Path(ferry.__file__).parent / "workloads"
#: Records still past MAX_RECORD_FIELDS, with their count: the list only shrinks (a record split leaves it; one
#: growing, or a new one past the bound, fails).
NOT_YET_SPLIT: Dict[str, int] = {}


def _workload_records() -> List[type]:
    out: List[type] = []
    for path in sorted(WORKLOADS.glob("*.py")):
        module = importlib.import_module(f"ferry.workloads.{path.stem}")
        out += [obj for obj in vars(module).values() if isinstance(obj, type) and obj.__module__ == module.__name__
                and (dataclasses.is_dataclass(obj) or hasattr(obj, "_fields"))]
    return out


def test_no_record_of_the_workloads_holds_more_than_12_fields() -> None:
    records = _workload_records()
    over = {c.__name__: len(_fields(c)) for c in records if len(_fields(c)) > MAX_RECORD_FIELDS}
    assert over == NOT_YET_SPLIT, f"records of more than {MAX_RECORD_FIELDS} fields: {over}"
    assert {"BenchRow", "BenchConfig", "DeviceFigures", "ValidateConfig"} <= {c.__name__ for c in records}


def test_no_record_of_the_workloads_is_built_by_position() -> None:
    """A record built by position reads its fields by their order: a field added or moved shifts them
    silently. Every call of a workloads record in the package (the workloads and the command line) names
    each argument."""
    names = {c.__name__ for c in _workload_records()}
    positional = []
    for path in sorted(Path(ferry.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and node.args:
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if name in names:
                    positional.append(f"{path.name}:{node.lineno} {name}")
    assert not positional, f"records built by position: {positional}"
