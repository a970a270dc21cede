"""Properties of the copy planner over random views (hypothesis, derandomized).

1. plan_copy's rows cover exactly the bytes the view reads (every element's or block's
   byte range, computed in numpy), each byte once, nothing else; so the plan never moves
   more than flat (nbytes). All six types; random shapes, strides in any order, gaps,
   overlaps, broadcast (stride 0) and unaligned strides, random offsets.
2. The scheduler's plan policy gives the same graph output as flat, moves no more bytes,
   moves exactly the bytes read when it takes the plan path, and leaves the gaps of the
   input copy untouched. Restricted to what the CPU dup kernel computes: every plain type
   in any layout, block types with dimension 0 innermost, which strategy 1 keeps for
   them anyway (a ferry view of a block type has nb[0] = the block size).

Views too tangled to plan (UNSUPPORTED) need more than 2^20 rows, far past these shapes:
test_plan.py covers that case (plan_copy raises, the plan policy copies flat).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

import ferry
from conftest import SENTINEL

SETTINGS = dict(deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@dataclass(frozen=True)
class View:
    """A random view: type, values per dimension (ne), byte strides (nb), offset into a source of
    source_bytes (at least offset + span)."""

    type: ferry.Type
    ne: List[int]
    nb: List[int]
    offset: int
    source_bytes: int

    @property
    def counts(self) -> List[int]:
        """Elements (blocks for block types) per dimension."""
        return [self.ne[0] // self.type.blck_size] + self.ne[1:]

    @property
    def span(self) -> int:
        """ggml's nbytes: first byte to last."""
        if 0 in self.counts:
            return 0
        return self.type.size + sum((n - 1) * s for n, s in zip(self.counts, self.nb))


@st.composite
def views(draw: st.DrawFn, allow_empty: bool = True, wide: bool = False) -> View:
    """A random view. wide: half the time, the dimension that steps by the element size holds
    256 B to 16 KiB and the others at most 3 values, so rows reach the widths where the CPU cost
    model lets the plan pay (the scheduler property needs the plan path taken, not only flat)."""
    ty = draw(st.sampled_from(list(ferry.Type)))
    unit, blck = ty.size, ty.blck_size
    wide = wide and draw(st.booleans())
    nd = draw(st.integers(2, 3) if wide else st.integers(1, 4))
    small = st.integers(1, 3 if wide else 6)
    counts = [draw(st.integers(0, 6) if allow_empty and draw(st.integers(0, 19)) == 0 else small) for _ in range(nd)]
    # One dimension steps by the element (block) size: it is what the ferry view puts first.
    # Block types keep it at dimension 0; plain types anywhere (the view is then permuted).
    anchor = 0 if blck > 1 else draw(st.integers(0, nd - 1))
    if wide:  # rows of 256 B to 16 KiB, a few of them
        counts[anchor] = draw(st.integers(256, 16384)) // unit
    order = draw(st.permutations([d for d in range(nd) if d != anchor]))
    nb = [0] * nd
    nb[anchor] = unit
    row = extent = unit * max(counts[anchor], 1)  # bytes of the anchor's run; of everything inner so far
    for d in order:
        kinds = ["nested", "nested", "nested", "fold", "fold", "overlap", "interleave", "interleave", "zero", "any"]
        kind = draw(st.sampled_from(kinds + ["gap"] * 20 if wide else kinds))
        if kind == "gap":  # past everything inside, a wide gap after it (a KV-cache window's streams)
            s = extent * draw(st.integers(2, 5)) + draw(st.integers(0, 64))
        elif kind == "nested":  # past everything inside: touching, or with a gap (unaligned too)
            gap = draw(st.sampled_from([0, draw(st.integers(1, 3 * unit)), draw(st.integers(1, 64)),
                                        extent * draw(st.integers(1, 3)) // draw(st.integers(1, 8)),
                                        extent * draw(st.integers(1, 4))]))
            s = extent + gap
        elif kind == "fold":  # a multiple of an earlier stride: evenly spaced with it
            earlier = [nb[e] for e in range(nd) if nb[e] > 0]
            s = draw(st.sampled_from(earlier)) * draw(st.integers(1, 8))
        elif kind == "overlap":  # smaller than what is inside: rows touch or overlap
            s = draw(st.integers(1, max(extent - 1, 1)))
        elif kind == "interleave":  # past the row, inside the extent: rows interleave
            s = draw(st.integers(row + 1, max(extent - 1, row + 1)))
        elif kind == "zero":  # broadcast: the same bytes again
            s = 0
        else:
            s = draw(st.integers(0, 200))
        nb[d] = s
        extent = max(extent, s * (max(counts[d], 1) - 1) + extent)
    ne = [counts[0] * blck] + counts[1:]
    v = View(ty, ne, nb, 0, 0)
    offset = draw(st.integers(0, 40))
    tail = draw(st.integers(0, 40))
    # a source of whole blocks
    source_bytes = -(-(offset + max(v.span, unit) + tail) // unit) * unit
    return View(ty, ne, nb, offset, source_bytes)


def read_counts(v: View) -> np.ndarray:
    """How often each byte of the source is read through the view (numpy, per element or block)."""
    starts = np.full(1, v.offset, dtype=np.int64)
    for n, s in zip(v.counts, v.nb):
        starts = (starts[:, None] + np.arange(n, dtype=np.int64) * s).ravel()
    if starts.size == 0:
        return np.zeros(v.source_bytes, np.int64)
    idx = (starts[:, None] + np.arange(v.type.size)).ravel()
    return np.bincount(idx, minlength=v.source_bytes)


def element_starts(v: View) -> np.ndarray:
    """Source offset of each element (block), in the order of a contiguous copy (dim 0 fastest)."""
    starts = np.full(1, v.offset, dtype=np.int64)
    for n, s in zip(reversed(v.counts), reversed(v.nb)):
        starts = (starts[:, None] + np.arange(n, dtype=np.int64) * s).ravel()
    return starts


def plan_counts(copies: Sequence[ferry.Copy2D], size: int) -> np.ndarray:
    """How often the plan moves each byte of the source."""
    parts = [np.zeros(0, np.int64)]
    for c in copies:
        rows = c.offset + np.arange(c.count, dtype=np.int64) * c.stride
        parts.append((rows[:, None] + np.arange(c.size)).ravel())
    idx = np.concatenate(parts)
    assert idx.size == 0 or idx.max() < size, "a copy reaches past the view's source"
    return np.bincount(idx, minlength=size)


Planner = Callable[[ferry.Type, List[int], List[int], int], List[ferry.Copy2D]]


def check_plan(v: View, planner: Optional[Planner] = None) -> None:
    """Property 1 for one view: the plan (ferry.plan.plan_copy's, or planner's) moves exactly the bytes
    read, each once."""
    note(f"{v}")
    reads = read_counts(v)
    want = reads > 0
    try:
        copies = (planner or ferry.plan.plan_copy)(v.type, v.ne, v.nb, v.offset)
    except ferry.UnsupportedError:
        ex = ferry.plan.explain(v.type, v.ne, v.nb)
        assert not ex.nested, "UNSUPPORTED for a layout whose rows nest"
        return
    note(f"plan {copies}")
    moved = plan_counts(copies, v.source_bytes)
    assert moved.max(initial=0) <= 1, "a byte moved twice"
    assert np.array_equal(moved > 0, want), (
        f"missed {np.flatnonzero(want & (moved == 0))[:8]}, extra {np.flatnonzero(~want & (moved > 0))[:8]}")
    total = sum(c.nbytes for c in copies)
    assert total == int(want.sum()) <= v.span
    assert all(c.size > 0 and c.count > 0 for c in copies)
    view = ferry.plan.layout_view(v.type, v.ne, v.nb, v.offset)
    assert ferry.copy_path.bytes_read(view) == total
    assert view.nbytes == v.span
    # the explanation (what the planner's simplification did, step by step) agrees with its plan
    ex = ferry.plan.explain(v.type, v.ne, v.nb)
    if ex.nested and copies:
        assert len(copies) == ex.n_copies
        assert {c.size for c in copies} == {ex.row}


@settings(max_examples=2000, **SETTINGS)
@given(views())
def test_plan_moves_exactly_the_bytes_read(v: View) -> None:
    check_plan(v)


# ---------------------------------------------------------------- property 1 can fail


def _drop_last_row(ty: ferry.Type, ne: List[int], nb: List[int], offset: int) -> List[ferry.Copy2D]:
    copies = ferry.plan.plan_copy(ty, ne, nb, offset)
    last = copies[-1]
    return copies[:-1] + ([last._replace(count=last.count - 1)] if last.count > 1 else [])


def _duplicate_a_row(ty: ferry.Type, ne: List[int], nb: List[int], offset: int) -> List[ferry.Copy2D]:
    copies = ferry.plan.plan_copy(ty, ne, nb, offset)
    return copies + [copies[0]._replace(count=1)]


def _ignore_offset(ty: ferry.Type, ne: List[int], nb: List[int], offset: int) -> List[ferry.Copy2D]:
    return ferry.plan.plan_copy(ty, ne, nb, 0)


def _whole_span(ty: ferry.Type, ne: List[int], nb: List[int], offset: int) -> List[ferry.Copy2D]:
    span = ferry.plan.layout_view(ty, ne, nb, offset).nbytes
    return [ferry.Copy2D(offset, span, 1, span)]


@pytest.mark.parametrize("broken", [_drop_last_row, _duplicate_a_row, _ignore_offset, _whole_span])
def test_plan_property_fails_on_a_broken_planner(broken: Planner) -> None:
    """Each way of getting the plan wrong is caught on some view hypothesis draws."""
    found: List[View] = []

    @settings(max_examples=300, **SETTINGS)
    @given(views(allow_empty=False))
    def prop(v: View) -> None:
        try:
            check_plan(v, broken)
        except AssertionError:
            found.append(v)
            raise

    with pytest.raises(AssertionError):
        prop()
    assert found


# ---------------------------------------------------------------- property 2: the scheduler


def _run(policy: str, v: View, data: bytes) -> tuple:
    """dup of the view (source in a CPU buffer holding data) assigned to a real-memory dummy backend,
    the input copy filled with SENTINEL first. Returns (output bytes, input copy bytes, stats, path)."""
    cpu = ferry.CPUBackend()
    split = ferry.DummyBackend(real_memory=True)
    src = cpu.alloc_tensor(v.type, [v.source_bytes // v.type.size * v.type.blck_size], name="src")
    src.set(data)
    view = ferry.plan.layout_view(v.type, v.ne, v.nb, v.offset, name="view", source=src)
    out = ferry.ops.dup(view, name="out").set_output()
    graph = ferry.Graph(out)
    sched = ferry.Scheduler([split, cpu], policy=policy)
    sched.assign(out, split)
    sched.alloc(graph)
    (inp,) = sched.inputs
    assert inp.src is view and inp.copy.same_layout(view)
    inp.copy.memset(SENTINEL)
    sched.compute(graph)
    result = (out.get(), inp.copy.get(), sched.stats, sched.inputs[0].stats.path)
    sched.close()
    return result


@settings(max_examples=300, **SETTINGS)
@given(views(allow_empty=False, wide=True), st.integers(0, 2**32 - 1))
def test_plan_policy_same_output_as_flat(v: View, seed: int) -> None:
    note(f"{v}")
    data = np.random.default_rng(seed).integers(0, 256, v.source_bytes, dtype=np.uint8).tobytes()
    out_flat, copy_flat, st_flat, path_flat = _run("flat", v, data)
    out_plan, copy_plan, st_plan, path_plan = _run("plan", v, data)
    event(f"{v.type} path {path_plan}")
    src = np.frombuffer(data, np.uint8)
    want = src[(element_starts(v)[:, None] + np.arange(v.type.size)).ravel()].tobytes()
    assert out_flat == want and out_plan == want
    assert path_flat == ferry.CopyPolicy.FLAT
    assert st_plan.bytes_copied <= st_flat.bytes_copied == v.span
    reads = read_counts(v)[v.offset:v.offset + v.span] > 0
    assert st_plan.bytes_read == st_flat.bytes_read == int(reads.sum())
    assert copy_flat == data[v.offset:v.offset + v.span]
    got = np.frombuffer(copy_plan, np.uint8)
    span_src = src[v.offset:v.offset + v.span]
    if path_plan == ferry.CopyPolicy.PLAN:
        assert st_plan.bytes_copied == st_plan.bytes_read
        assert np.array_equal(got[reads], span_src[reads])
        assert (got[~reads] == SENTINEL).all(), "the plan wrote a gap byte"
    else:
        view = ferry.plan.layout_view(v.type, v.ne, v.nb, v.offset)
        assert path_plan == ferry.CopyPolicy.FLAT and not ferry.plan.plan_pays(view, ferry.DummyBackend())
        assert copy_plan == copy_flat
