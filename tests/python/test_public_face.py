"""ferry's public face: one spelling per thing, the binding kept off it."""

from __future__ import annotations

from collections import defaultdict
from typing import DefaultDict, List

import ferry


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
