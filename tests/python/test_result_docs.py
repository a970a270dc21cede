"""Every public result type (a dataclass or named tuple on ferry's public face) says what each of
its fields holds, in an Attributes section that help() shows."""

from __future__ import annotations

import dataclasses
import pydoc
import re
from typing import List

import pytest

import ferry


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
