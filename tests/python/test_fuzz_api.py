"""Fuzzing the Python API with hypothesis: bad and edge-case input must end in success or a
FerryError (a subclass per C status), never a crash, a hang, another exception, or a wrong result.

Two kinds of test. Metadata-only fuzzing (shapes, views of unallocated tensors, copy plans,
KV caches in synthetic memory, type confusion) runs in this process. Anything that reads or
writes real memory runs as batches of scenarios in a child interpreter (run_isolated): each
scenario is printed before it runs, so a segfault, abort or sanitizer report fails the test
with the input that caused it instead of killing pytest. Scenario functions (sc_*) take
plain JSON data so that the child can rebuild them.

Where a result can be checked it is: transfers against a byte mirror of the tensor, views and
windows against numpy's strided reads of the same bytes, ops against numpy, copies against the
bytes the source reads.
"""

from __future__ import annotations

import gc
import json
import math
import os
import subprocess
import sys
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

import ferry

HERE = os.path.dirname(os.path.abspath(__file__))
SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck), database=None)
# FERRY_FUZZ_SCALE=10 runs ten times the examples (a longer hunt than the suite's ~20 s).
SCALE = max(int(os.environ.get("FERRY_FUZZ_SCALE", "1")), 1)
# Batches in a child interpreter: no shrinking (each step would be a child); the child names the input.
ISOLATED = dict(SETTINGS, phases=[Phase.explicit, Phase.generate])
ALLOWED = (ferry.FerryError,)

TYPES = ["f32", "f16", "bf16", "i32", "q8_0", "q4_0"]
NUMPY_TYPES = {"f32": np.float32, "f16": np.float16, "i32": np.int32}
# sizes and offsets at the edges of what C and Python can hold
EDGE = [0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 33, 63, 64, 100, 255, 256, 2**31 - 1, 2**31, 2**32, 2**32 + 1,
        2**62, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**100, -1, -(2**31), -(2**63), -(2**63) - 1]
SIZE_MAX = 2**64 - 1
INT64_MAX = 2**63 - 1


def ints(lo: int = -2, hi: int = 80) -> st.SearchStrategy[int]:
    """Mostly small integers, sometimes an edge value."""
    return st.one_of(st.integers(lo, hi), st.integers(lo, hi), st.sampled_from(EDGE))


def attempt(fn: Callable[[], Any]) -> Any:
    """fn's result, or None if it raised a FerryError; anything else propagates (a bug)."""
    try:
        return fn()
    except ALLOWED:
        return None

def apply_op(name: str, a: Any, b: Any, params: Any) -> Any:
    """One op of the fuzzed graphs, by name, on tensors a and b (b for the binary ones)."""
    fns = {
        "add": lambda: ferry.ops.add(a, b), "mul": lambda: ferry.ops.mul(a, b), "scale": lambda: ferry.ops.scale(a, params[0]),
        "dup": lambda: ferry.ops.dup(a), "dup_as": lambda: ferry.ops.dup(a, params[0]), "concat": lambda: ferry.ops.concat(a, b, params[0]),
        "pad": lambda: ferry.ops.pad(a, *params), "mean": lambda: ferry.ops.mean(a), "permute": lambda: a.permute(*params),
        "transpose": lambda: a.transpose(), "reshape": lambda: a.reshape(params),
        "view": lambda: a.view(params[0], params[1], params[2]),
    }
    return fns[name]()



def pattern(n: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + i // 251 + seed * 13) % 251 for i in range(n))


# ---------------------------------------------------------------- backends and layouts

KINDS = ["cpu", "dummy_real", "dummy_real_no2d", "dummy_synth", "dummy_synth_host", "standin"]
REAL = {"cpu", "dummy_real", "dummy_real_no2d", "standin"}


def make_backend(kind: str) -> ferry.Backend:
    if kind == "cpu":
        return ferry.CPUBackend()
    if kind == "standin":
        return ferry.StandinBackend()
    return ferry.DummyBackend(real_memory=kind.startswith("dummy_real"), has_2d=kind != "dummy_real_no2d",
                              is_host=kind == "dummy_synth_host")


def can_use(backend_kind: str, buffer_kind: str) -> bool:
    """Can a backend of this kind read a buffer of that kind (its own buffers: same kind)?"""
    if backend_kind == "cpu":
        return buffer_kind in ("cpu", "dummy_synth_host")
    return backend_kind == buffer_kind


def gather(raw: bytes, ty: ferry.Type, ne: Sequence[int], nb: Sequence[int], offset: int) -> bytes:
    """The element (block) bytes a tensor of this layout reads from raw at offset, in ggml order:
    what a contiguous dup of it holds."""
    unit, blck = ty.size, ty.blck_size
    counts = [ne[0] // blck, ne[1], ne[2], ne[3]]
    if any(c == 0 for c in counts):
        return b""
    arr = np.ndarray(tuple(reversed(counts)), dtype=np.dtype(("V", unit)), buffer=raw, offset=offset,
                     strides=tuple(reversed(nb)))
    return arr.tobytes()


def strided_values(raw: bytes, t: ferry.Tensor, offset: int) -> np.ndarray:
    """t's values read from raw (its root's bytes) as a 4-D array (numpy order). The stride of a
    dimension of one index or none is never stepped, so it reads as 0: C accepts any stride there,
    numpy refuses one past its index type."""
    dtype = NUMPY_TYPES[str(t.type)]
    shape = tuple(reversed(t.ne))
    if 0 in shape:
        return np.empty(shape, dtype=dtype)
    strides = tuple(s if n > 1 else 0 for n, s in zip(shape, reversed(t.nb)))
    return np.ndarray(shape, dtype=dtype, buffer=raw, offset=offset, strides=strides).copy()


# ---------------------------------------------------------------- the child interpreter


def run_isolated(calls: List[List[Any]], timeout: float = 120.0) -> None:
    """Run each [scenario name, *args] in order in a fresh interpreter (sanitizers and all, as this
    one is run). A crash, a non-FerryError exception or a failed check fails with its input."""
    code = f"import sys; sys.path.insert(0, {HERE!r}); import test_fuzz_api as m; m._child()"
    try:
        r = subprocess.run([sys.executable, "-c", code], input=json.dumps(calls), capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        ran = [line for line in out.splitlines() if line.startswith("RUN ")]
        raise AssertionError(f"hung (over {timeout} s) in {ran[-1] if ran else '?'}") from None
    if r.returncode != 0:
        ran = [line for line in r.stdout.splitlines() if line.startswith("RUN ")]
        raise AssertionError(f"exit status {r.returncode} in {ran[-1] if ran else '(before the first scenario)'}\n"
                             f"--- stderr\n{r.stderr[-6000:]}")


# What a child interpreter may take beyond what it holds at its start: an output no scenario
# needs is refused there (ferry's check, or the allocation's failure), never zero-filled into the
# machine's memory until the kernel kills the child (a 21.5 GB get_2d once did, under tools/fuzz).
CHILD_MEMORY_BYTES = 4 << 30


def _limit_memory() -> None:
    try:
        import resource

        with open("/proc/self/statm", encoding="ascii") as f:
            used = int(f.read().split()[0]) * resource.getpagesize()
    except (ImportError, OSError):
        return  # no limit where it cannot be set from what is held
    resource.setrlimit(resource.RLIMIT_AS, (used + CHILD_MEMORY_BYTES, resource.getrlimit(resource.RLIMIT_AS)[1]))


def _child() -> None:
    _limit_memory()
    calls = json.loads(sys.stdin.read())
    for name, *args in calls:
        print("RUN", name, json.dumps(args), flush=True)
        try:
            globals()[name](*args)
        except ALLOWED:
            pass
        except BaseException:
            traceback.print_exc()
            sys.stdout.flush()
            os._exit(3)
        gc.collect()
    sys.stdout.flush()
    os._exit(0)


# ---------------------------------------------------------------- transfers against a byte mirror


def _extent_2d(size: int, n: int, stride: int) -> int:
    return 0 if size == 0 or n == 0 else (n - 1) * stride + size


def _c_sizes_ok(*vals: int) -> bool:
    return all(0 <= v <= SIZE_MAX for v in vals)


def sc_transfers(kind: str, ty: str, ne: List[int], view: Optional[List[Any]], ops: List[List[Any]]) -> None:
    """Transfers on a tensor (or a view of it) of a backend; each op must succeed exactly when
    its extent lies inside the tensor, and the root's bytes must match the mirror after each."""
    backend = make_backend(kind)
    root = attempt(lambda: backend.alloc_tensor(ty, ne, name="root"))
    if root is None or root.nbytes > 1 << 16:
        return
    real = kind in REAL
    mirror = bytearray(pattern(root.nbytes, 1))
    root.set(bytes(mirror))
    t = root
    if view is not None:
        nb = None if view[1] is None else [root.type.size] + view[1][1:]
        v = attempt(lambda: root.view(view[0], nb, view[2]))
        if v is not None:
            assert v.offset + v.nbytes <= root.nbytes, (v, root)
            t = v
    base, nbytes = t.offset, t.nbytes
    other = make_backend("cpu")

    def expect(ok: bool, fn: Callable[[], Any], what: Any) -> Any:
        try:
            out = fn()
        except ALLOWED as e:
            assert not ok, f"{what} failed but is in bounds: {e}"
            return None
        assert ok, f"{what} succeeded but should fail (tensor of {nbytes} bytes)"
        return out

    for op in ops:
        name = op[0]
        if name == "set":
            _, off, n = op
            ok = _c_sizes_ok(off) and off + n <= nbytes
            expect(ok, lambda: t.set(pattern(n, 2), off), op)
            if ok:
                mirror[base + off:base + off + n] = pattern(n, 2)
        elif name == "get":
            _, off, size = op
            n = (max(nbytes - off, 0) if size is None else size)
            ok = _c_sizes_ok(off, n) and off + n <= nbytes
            got = expect(ok, lambda: t.get(off, size), op)
            if ok and got is not None:
                want = bytes(mirror[base + off:base + off + n]) if real else bytes(n)
                assert got == want, op
        elif name == "memset":
            _, value, off, size = op
            n = (max(nbytes - off, 0) if size is None else size)
            ok = 0 <= value <= 255 and _c_sizes_ok(off, n) and off + n <= nbytes
            expect(ok, lambda: t.memset(value, off, size), op)
            if ok:
                mirror[base + off:base + off + n] = bytes([value]) * n
        elif name in ("set_2d", "bset_2d", "get_2d", "bget_2d"):
            _, off, size, n, s_t, s_d, short = op
            sd = size if s_d is None else s_d
            valid = _c_sizes_ok(off, size, n, s_t, sd)
            need = _extent_2d(size, n, sd) if valid else 0  # bytes on the data side
            ok = (valid and size <= INT64_MAX and off <= INT64_MAX
                  and off + (max(n, 1) - 1) * s_t + size <= nbytes and not (n > 1 and (s_t < size or sd < size)))
            if name.endswith("set_2d"):
                if need > 1 << 20:
                    data, ok = b"", False  # the data cannot hold the rows: the binding refuses
                else:
                    data = pattern(max(need - short, 0), 3)
                    ok = ok and (short == 0 or need == 0)
                fn = (lambda: t.set_2d(data, off, size, n, s_t, s_d)) if name == "set_2d" else \
                    (lambda: backend.set_2d(t, data, off, size, n, s_t, s_d))
                expect(ok, fn, op)
                if ok:
                    for i in range(n if size else 0):
                        mirror[base + off + i * s_t:base + off + i * s_t + size] = data[i * sd:i * sd + size]
            else:
                fn = (lambda: t.get_2d(off, size, n, s_t, s_d)) if name == "get_2d" else \
                    (lambda: backend.get_2d(t, off, size, n, s_t, s_d))
                if need > 1 << 20:
                    attempt(fn)  # the rows fit the tensor but the output would be huge: either answer
                    continue
                got = expect(ok, fn, op)
                if ok:
                    assert len(got) == need
                    if real:
                        for i in range(n if size else 0):
                            assert got[i * sd:i * sd + size] == mirror[base + off + i * s_t:base + off + i * s_t + size]
        elif name == "async":
            _, off, n = op
            ok = _c_sizes_ok(off) and off + n <= nbytes
            expect(ok, lambda: backend.set_async(t, pattern(n, 4), off), op)
            if ok:
                mirror[base + off:base + off + n] = pattern(n, 4)
            backend.synchronize()
            out = bytearray(n)
            expect(ok, lambda: backend.get_async(t, out, off), op)
            backend.synchronize()
            if ok and real:
                assert out == mirror[base + off:base + off + n]
        elif name == "foreign":
            _, off, n = op
            ok = can_use("cpu", kind) and _c_sizes_ok(off) and off + n <= nbytes
            expect(ok, lambda: other.set_async(t, pattern(n, 5), off), op)
            if ok:
                mirror[base + off:base + off + n] = pattern(n, 5)
        elif name == "to_numpy":
            if str(t.type) in NUMPY_TYPES:
                got = attempt(t.to_numpy)  # OutOfMemoryError for shapes numpy cannot hold
                if got is not None and real:
                    want = strided_values(bytes(mirror), t, base)
                    assert got.size == want.size
                    assert np.array_equal(got.reshape(-1).view(np.uint8), want.reshape(-1).view(np.uint8))
            else:  # the block types: their values dequantized to float32
                got = attempt(t.to_numpy)
                if got is not None:
                    assert got.dtype == np.float32 and got.size == t.nelements
                    if real and t.is_contiguous:
                        raw = bytes(mirror[base:base + t.nbytes])
                        assert np.array_equal(got.reshape(-1), ferry.dequantize(raw, t.type, t.nelements))
        elif name == "copy_self":
            # a copy between two views of one tensor that overlap in memory: memmove semantics
            a = attempt(lambda: root.view([op[1]], None, op[2]))
            b = attempt(lambda: root.view([op[1]], None, op[3]))
            if a is not None and b is not None:
                src = bytes(mirror[a.offset:a.offset + a.nbytes])
                a.copy_to(b)
                mirror[b.offset:b.offset + b.nbytes] = src
        if real:
            assert root.get() == bytes(mirror), f"the tensor's bytes differ from the mirror after {op}"


def transfer_ops() -> st.SearchStrategy[List[Any]]:
    off, size = ints(-1, 70), ints(-1, 70)
    return st.one_of(
        st.tuples(st.just("set"), off, st.integers(0, 80)),
        st.tuples(st.just("get"), off, st.one_of(st.none(), size)),
        st.tuples(st.just("memset"), st.sampled_from([0, 7, 255, 256, -1]), off, st.one_of(st.none(), size)),
        st.tuples(st.sampled_from(["set_2d", "bset_2d", "get_2d", "bget_2d"]), off, ints(-1, 20), ints(-1, 6),
                  ints(-1, 40), st.one_of(st.none(), ints(-1, 40)), st.sampled_from([0, 0, 0, 1, 7])),
        st.tuples(st.just("async"), off, st.integers(0, 80)),
        st.tuples(st.just("foreign"), off, st.integers(0, 40)),
        st.tuples(st.just("to_numpy")),
        st.tuples(st.just("copy_self"), st.integers(1, 8), st.sampled_from([0, 4, 8, 12]),
                  st.sampled_from([0, 4, 8, 12])),
    ).map(list)


def shapes(max_dims: int = 4, hi: int = 9) -> st.SearchStrategy[List[int]]:
    return st.lists(st.integers(0, hi), min_size=1, max_size=max_dims)


def view_args() -> st.SearchStrategy[Optional[List[Any]]]:
    return st.one_of(st.none(), st.integers(1, 4).flatmap(lambda n: st.tuples(
        st.lists(ints(-1, 9), min_size=n, max_size=n),
        st.one_of(st.none(), st.lists(ints(0, 70), min_size=n, max_size=n).map(lambda nb: [4] + nb[1:])),
        ints(-1, 70)).map(list)))


@settings(max_examples=3 * SCALE, **ISOLATED)
@example([  # the bugs this found, kept as seeds
    ["sc_transfers", "cpu", "f32", [64], None, [["copy_self", 8, 0, 4], ["copy_self", 8, 4, 0]]],  # memcpy overlap
    ["sc_transfers", "cpu", "f32", [4], None, [["get", 0, 2**40], ["get", 0, 2**63], ["get_2d", 0, 4, 2**32, 0, 16, 0],
                                               ["bget_2d", 2**32, 8, 2**32, 39, None, 0]]],  # MemoryError
    ["sc_transfers", "dummy_real_no2d", "f16", [192], [[2**62, 0, 32, 8], None, 62], [["to_numpy"]]],  # ValueError
    ["sc_transfers", "dummy_synth_host", "f32", [64], None, [["copy_self", 8, 0, 4], ["foreign", 4, 9]]],
    # the test's own mirror: numpy refused an empty view's stride of 2^64 - 1, which C accepts
    ["sc_transfers", "dummy_real_no2d", "i32", [160, 4], [[2, 0], [4, 2**64 - 1], 23], [["to_numpy"]]],
    ["sc_transfers", "dummy_real", "i32", [160, 4], [[2, 1], [4, 2**64 - 1], 0], [["to_numpy"]]],
    # rows within 384 bytes, an output of 21.5 GB: the kernel killed the child (tools/fuzz)
    ["sc_transfers", "cpu", "f32", [96], None, [["get_2d", 0, 4, 6, 64, 2**32, 0], ["bget_2d", 0, 4, 6, 64, 2**32, 0]]],
])
@given(st.lists(st.tuples(st.just("sc_transfers"), st.sampled_from(KINDS), st.sampled_from(["f32", "f16", "i32",
                                                                                               "q8_0"]),
                          shapes(3, 6).map(lambda s: [32 * s[0]] + s[1:] if s else s), view_args(),
                          st.lists(transfer_ops(), max_size=8)).map(list), min_size=20, max_size=30))
def test_random_transfers_land_as_a_byte_mirror_says_or_are_refused(calls: List[List[Any]]) -> None:
    run_isolated(calls)


# ---------------------------------------------------------------- numpy arrays in and out


@settings(max_examples=60 * SCALE, **SETTINGS)
@given(st.sampled_from(["<f4", "<f2", "<i4", ">f4", ">i4", "f8", "i8", "u1", "bool", "c8", "U2", "V4", "O"]),
       st.lists(st.integers(0, 4), max_size=6), st.sampled_from(["c", "f", "step", "T"]),
       st.sampled_from(["cpu", "dummy_real", "standin", "dummy_synth"]))
def test_random_numpy_arrays_round_trip_or_are_refused_when_ferry_has_no_type(dtype: str, shape: List[int], order: str, kind: str) -> None:
    size = int(np.prod(shape)) if shape else 1
    try:
        arr = (np.arange(size) % 97).astype(dtype if dtype != "O" else object).reshape(shape)
    except (TypeError, ValueError):
        return
    if order == "f":
        arr = np.asfortranarray(arr)
    elif order == "step" and arr.ndim:
        arr = np.concatenate([arr, arr], axis=0)[::2]
    elif order == "T":
        arr = arr.T
    backend = make_backend(kind)
    native = arr.dtype in (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int32))
    t = attempt(lambda: ferry.Tensor.from_numpy(backend, arr))
    if not native or arr.ndim > 4:
        assert t is None, f"{arr.dtype} {arr.shape} was accepted"
        return
    assert t is not None
    out = t.to_numpy()
    assert out.dtype == arr.dtype and out.size == arr.size
    if kind in REAL:
        assert np.array_equal(out.reshape(-1), np.ascontiguousarray(arr).reshape(-1))


# ---------------------------------------------------------------- metadata: shapes, views, permutes


@settings(max_examples=150 * SCALE, **SETTINGS)
@given(st.one_of(st.sampled_from(TYPES), st.integers(-2, 8)), st.lists(ints(-2, 40), min_size=0, max_size=6))
@example("q4_0", [2**32, 2**31])  # 2^63 values in 18 * 2^58 bytes: nelements overflowed
@example("q8_0", [2**62])  # nbytes multiplied ne[0] by 34 first and wrapped
@example("f32", [0, 2**31, 2**32])  # empty, but nrows overflowed
@example(-1, [4])  # cffi's OverflowError for a negative enum
def test_random_shapes_give_tensors_of_exact_sizes_or_ferry_errors(ty: Any, ne: List[int]) -> None:
    t = attempt(lambda: ferry.Tensor.new(ty, ne))
    if t is None:
        return
    assert 1 <= len(ne) <= 4 and all(n >= 0 for n in ne)
    full = list(ne) + [1] * (4 - len(ne))
    assert list(t.ne) == full
    assert t.nelements == math.prod(full), "nelements differs from the product of ne"
    assert t.nrows == math.prod(full[1:])
    blocks = full[0] // t.type.blck_size
    assert t.nbytes == (0 if 0 in full else blocks * t.type.size * math.prod(full[1:]))
    assert t.is_contiguous and not t.allocated and t.address is None
    with pytest.raises(ferry.NotAllocatedError):
        t.get(0, 0)


def base_tensor(ty: str, ne: List[int], kind: str) -> Optional[ferry.Tensor]:
    if kind == "none":
        return attempt(lambda: ferry.Tensor.new(ty, ne))
    return attempt(lambda: make_backend(kind).alloc_tensor(ty, ne))


@settings(max_examples=200 * SCALE, **SETTINGS)
@given(st.sampled_from(TYPES), st.lists(st.integers(0, 64), min_size=1, max_size=4),
       st.lists(ints(-1, 40), min_size=0, max_size=5), st.one_of(st.none(), st.lists(ints(0, 600), max_size=5)),
       ints(-1, 600), st.sampled_from(["none", "dummy_synth"]))
def test_random_views_are_made_only_inside_their_source(ty: str, base_ne: List[int], ne: List[int], nb: Optional[List[int]], offset: int,
                       kind: str) -> None:
    """Views of any shape, strides and offset: made only when they stay inside their source."""
    src = base_tensor(ty, base_ne, kind)
    if src is None:
        return
    if nb is not None and nb:
        nb = [src.type.size] + nb[1:]
    v = attempt(lambda: src.view(ne, nb, offset))
    if v is None:
        return
    assert v.is_view and v.source is src and v.root is src
    assert v.offset == offset and v.offset + v.nbytes <= src.nbytes
    assert v.nelements == math.prod(v.ne) and v.nelements >= 0
    # and a view of the view stays inside it
    w = attempt(lambda: v.view(list(v.ne), list(v.nb), 0))
    assert w is not None and w.offset == v.offset and w.same_layout(v)


@settings(max_examples=150 * SCALE, **SETTINGS)
@given(st.sampled_from(TYPES), st.lists(st.integers(0, 8), min_size=1, max_size=4),
       st.lists(ints(-1, 5), min_size=0, max_size=5), st.lists(ints(-1, 64), min_size=0, max_size=5))
def test_random_permutes_transposes_and_reshapes_keep_the_elements(ty: str, ne: List[int], axes: List[int], shape: List[int]) -> None:
    t = attempt(lambda: ferry.Tensor.new(ty, [ne[0] * 32] + ne[1:]))
    if t is None:
        return
    p = attempt(lambda: t.permute(*axes))
    if p is not None:
        assert sorted(axes) == [0, 1, 2, 3]
        for i, a in enumerate(axes):
            assert p.ne[a] == t.ne[i] and p.nb[a] == t.nb[i]
        assert p.nbytes == t.nbytes
    tr = t.transpose()
    assert tr.ne[0] == t.ne[1] and tr.transpose().same_layout(t)
    r = attempt(lambda: t.reshape(shape))
    if r is not None:
        assert math.prod(r.ne) == t.nelements and r.is_contiguous
    for x in (p, tr):
        if x is not None and not x.is_contiguous:
            with pytest.raises(ferry.LayoutError):
                x.reshape([t.nelements])


# ---------------------------------------------------------------- op constructors (no compute)


OPS = ["add", "mul", "scale", "dup", "dup_as", "concat", "pad", "mean", "attn"]


@settings(max_examples=200 * SCALE, **SETTINGS)
@given(st.sampled_from(OPS), st.lists(st.tuples(st.sampled_from(TYPES), st.lists(ints(0, 6), min_size=1,
                                                                                   max_size=4)),
                                      min_size=4, max_size=4),
       st.lists(ints(-3, 40), min_size=4, max_size=4), st.sampled_from([0.5, -2.0, float("nan"), float("inf"), 1e39,
                                                                          3, True, "x"]))
def test_random_ops_give_the_shapes_of_their_operands_or_ferry_errors(op: str, specs: List[Any], params: List[int], s: Any) -> None:
    ts = [attempt(lambda spec=spec: ferry.Tensor.new(spec[0], spec[1])) for spec in specs]
    ts = [t if t is not None else ferry.Tensor.new("f32", [4]) for t in ts]
    a, b = ts[0], ts[1]
    fns = {
        "add": lambda: ferry.ops.add(a, b), "mul": lambda: a * b, "scale": lambda: ferry.ops.scale(a, s),
        "dup": lambda: ferry.ops.dup(a), "dup_as": lambda: ferry.ops.dup(a, specs[1][0]),
        "concat": lambda: ferry.ops.concat(a, b, params[0]), "pad": lambda: ferry.ops.pad(a, *params), "mean": lambda: ferry.ops.mean(a),
        "attn": lambda: ferry.ops.attn_decode(*ts, scale=s if params[0] % 2 else None),
    }
    out = attempt(fns[op])
    if out is None:
        return
    assert out.is_contiguous and not out.allocated
    assert out.nelements == math.prod(out.ne)
    if op in ("add", "mul"):
        assert out.ne == a.ne and all(y and x % y == 0 or x == y == 0 for x, y in zip(a.ne, b.ne))
    if op == "concat":
        d = params[0]
        assert out.ne[d] == a.ne[d] + b.ne[d]
    if op == "pad":
        assert all(out.ne[i] == a.ne[i] + params[i] for i in range(4))
    g = ferry.Graph(out)
    assert g.n_nodes >= 1 and out in g


# ---------------------------------------------------------------- ops computed, against numpy


def _ref_op(name: str, srcs: List[np.ndarray], params: List[Any], out_dtype: Any) -> np.ndarray:
    f = [x.astype(np.float32) for x in srcs]
    if name in ("add", "mul"):
        if f[0].size == 0:
            return srcs[0].astype(out_dtype)
        reps = [x // y for x, y in zip(f[0].shape, f[1].shape)]
        b = np.tile(f[1], reps)
        r = f[0] + b if name == "add" else f[0] * b
    elif name == "scale":
        r = f[0] * np.float32(params[0])
    elif name in ("dup", "dup_as"):
        return srcs[0].astype(out_dtype)
    elif name == "concat":
        return np.concatenate([srcs[0], srcs[1]], axis=3 - params[0]).astype(out_dtype)
    elif name == "pad":
        return np.pad(srcs[0], [(0, params[3]), (0, params[2]), (0, params[1]), (0, params[0])]).astype(out_dtype)
    elif name == "mean":
        r = f[0].sum(axis=3, keepdims=True, dtype=np.float32) / np.float32(f[0].shape[3])
    else:
        raise AssertionError(name)
    return r.astype(out_dtype)


def sc_compute(kind: str, alloc_kinds: List[str], leafs: List[List[Any]], steps: List[List[Any]],
               seed: int) -> None:
    """A small random graph over leafs (and views of them), placed by a GraphAllocator over
    alloc_kinds, computed on a backend of kind, and checked against numpy."""
    backend = make_backend(kind)
    tensors: List[ferry.Tensor] = []
    for ty, ne in leafs:
        t = attempt(lambda ty=ty, ne=ne: ferry.Tensor.new(ty, ne))
        if t is not None:
            tensors.append(t.set_input())
    if not tensors:
        return
    ref: Dict[int, Any] = {}
    rng = np.random.default_rng(seed)
    for step in steps:
        name, i, j, params = step[0], step[1] % len(tensors), step[2] % len(tensors), step[3]
        a, b = tensors[i], tensors[j]
        out = attempt(lambda: apply_op(name, a, b, params))
        if out is not None:
            ref[id(out)] = (name, [a, b], params)
            tensors.append(out)
    outs = [t for t in tensors if id(t) in ref and t.op not in (1, 2, 3, 4)]
    if not outs:
        return
    for t in outs:
        t.set_output()
    graph = ferry.Graph(*outs)
    allocator = ferry.GraphAllocator([make_backend(k) if k != kind else backend for k in alloc_kinds])
    if attempt(lambda: allocator.alloc(graph)) is None:
        return
    values: Dict[int, np.ndarray] = {}
    for leaf in graph.leafs:
        if str(leaf.type) not in NUMPY_TYPES:
            continue
        arr = (rng.standard_normal(tuple(reversed(leaf.ne))) * 4).astype(NUMPY_TYPES[str(leaf.type)])
        leaf.set(arr.tobytes())
        values[id(leaf)] = arr
    if attempt(lambda: graph.compute(backend)) is None:
        return
    if kind not in REAL:
        return

    def value_of(t: ferry.Tensor) -> Optional[np.ndarray]:
        if id(t) in values:
            return values[id(t)]
        if str(t.type) not in NUMPY_TYPES or id(t) not in ref:
            return None
        name, srcs, params = ref[id(t)]
        if t.is_view:
            root = value_of(t.root)
            if root is None:
                return None
            raw = np.ascontiguousarray(root).tobytes()
            v = strided_values(raw, t, t.offset)
        else:
            ins = [value_of(s) for s in (srcs[:2] if name in ("add", "mul", "concat") else srcs[:1])]
            if any(x is None for x in ins):
                return None
            v = _ref_op(name, ins, params, NUMPY_TYPES[str(t.type)])
        values[id(t)] = v
        return v

    for t in outs:
        want = value_of(t)
        if want is None:
            continue
        got = t.to_numpy().reshape(want.shape)
        tol = 2e-2 if t.type == ferry.Type.F16 or any(s.type == ferry.Type.F16 for s in ref[id(t)][1]) else 1e-5
        assert np.allclose(got, want, rtol=tol, atol=tol, equal_nan=True), (ref[id(t)][0], got, want)


def compute_steps() -> st.SearchStrategy[List[Any]]:
    i = st.integers(0, 8)
    small = st.lists(st.integers(0, 3), min_size=4, max_size=4)
    return st.one_of(
        st.tuples(st.sampled_from(["add", "mul", "dup", "mean", "transpose"]), i, i, st.just([])),
        st.tuples(st.just("scale"), i, i, st.sampled_from([[0.5], [-3], [0]])),
        st.tuples(st.just("dup_as"), i, i, st.sampled_from([["f32"], ["f16"], ["i32"], ["q8_0"]])),
        st.tuples(st.just("concat"), i, i, st.lists(st.integers(-1, 4), min_size=1, max_size=1)),
        st.tuples(st.just("pad"), i, i, small),
        st.tuples(st.just("permute"), i, i, st.permutations([0, 1, 2, 3])),
        st.tuples(st.just("reshape"), i, i, st.lists(st.integers(0, 12), min_size=1, max_size=3)),
        st.tuples(st.just("view"), i, i, st.tuples(st.lists(st.integers(0, 4), min_size=2, max_size=2),
                                                    st.lists(st.sampled_from([0, 4, 8, 12, 16, 32]), min_size=2,
                                                             max_size=2).map(lambda nb: [4, nb[1]]),
                                                    st.sampled_from([0, 4, 8])).map(list)),
    ).map(list)


@settings(max_examples=4 * SCALE, **ISOLATED)
@given(st.lists(st.tuples(
    st.just("sc_compute"), st.sampled_from(["cpu", "dummy_real", "standin", "dummy_synth", "dummy_synth_host"]),
    st.lists(st.sampled_from(["cpu", "dummy_real", "standin", "dummy_synth", "dummy_synth_host"]), min_size=1,
             max_size=2),
    st.lists(st.tuples(st.sampled_from(["f32", "f32", "f16", "i32"]), st.lists(st.integers(1, 4), min_size=1,
                                                                               max_size=4)).map(list),
             min_size=1, max_size=3),
    st.lists(compute_steps(), max_size=6), st.integers(0, 1000)).map(list), min_size=15, max_size=25))
def test_random_graphs_compute_the_values_numpy_computes(calls: List[List[Any]]) -> None:
    run_isolated(calls)


# ---------------------------------------------------------------- KV caches and windows (metadata)


@settings(max_examples=120 * SCALE, **SETTINGS)
@given(st.sampled_from(TYPES), st.sampled_from(TYPES), ints(-1, 64), ints(-1, 4), ints(-1, 64), ints(-1, 8),
       st.integers(-1, 3), st.booleans(), ints(-1, 70), ints(-2, 9), st.one_of(st.none(), ints(-2, 9)),
       st.integers(-1, 3))
@example("f32", "f32", 2**40, 2**40, 1, 1, 1, False, 1, 0, None, 0)  # head_dim * n_head_kv wrapped to 0
@example("f32", "f32", 2**20, 2**19, 2**20, 1, 4, False, 1, 0, None, 0)  # 4 layers of 2 * 2^61 bytes wrapped
def test_random_caches_and_windows_have_the_shapes_and_bytes_of_their_parameters(tk: str, tv: str, head_dim: int, n_head_kv: int, n_ctx: int, n_stream: int,
                              n_layer: int, v_trans: bool, n_kv: int, s0: int, s1: Optional[int], layer: int) -> None:
    """KV caches of any parameters (in synthetic memory), and windows of any range."""
    host = ferry.DummyBackend(is_host=True)
    kv = attempt(lambda: ferry.KVCache(tk, tv, head_dim, n_head_kv, n_ctx, n_stream, n_layer, v_trans,
                                       backend=host))
    if kv is None:
        return
    p = kv.params
    assert p.head_dim > 0 and p.n_head_kv > 0 and p.n_ctx > 0 and p.n_stream > 0 and p.n_layer > 0
    assert p.n_ctx % p.n_stream == 0 and kv.kv_size == p.n_ctx // p.n_stream
    n_embd = head_dim * n_head_kv
    for which, ty in (("k", p.type_k), ("v", p.type_v)):
        t = kv.k(0) if which == "k" else kv.v(0)
        want = [kv.kv_size, n_embd] if which == "v" and v_trans else [n_embd, kv.kv_size]
        assert list(t.ne[:2]) == want and t.ne[2] == n_stream, (which, t.ne)
        assert t.nbytes == ferry.row_size(ty, n_embd) * kv.kv_size * n_stream
    assert kv.buffer.size >= 2 * n_layer * min(kv.k(0).nbytes, kv.v(0).nbytes)
    w = attempt(lambda: kv.window(layer, n_kv, s0, s1))
    if w is None:
        return
    last = n_stream - 1 if s1 is None else s1
    assert 0 <= layer < n_layer and 1 <= n_kv <= kv.kv_size and 0 <= s0 <= last < n_stream
    k, v = w
    ns = last - s0 + 1
    assert k.ne == (head_dim, n_kv, n_head_kv, ns)
    assert v.ne == ((n_kv, head_dim, n_head_kv, ns) if v_trans else (head_dim, n_kv, n_head_kv, ns))
    for x in (k, v):
        assert x.offset + x.nbytes <= x.root.nbytes
        assert ferry.copy_path.bytes_read(x) == ferry.row_size(x.type, head_dim) * n_kv * n_head_kv * ns


# ---------------------------------------------------------------- copy plans


@settings(max_examples=250 * SCALE, **SETTINGS)
@given(st.sampled_from(TYPES + ["nope", 17]), st.lists(ints(-1, 12), min_size=1, max_size=4),
       st.lists(ints(0, 200), min_size=1, max_size=5), ints(-1, 100))
def test_random_layouts_plan_copies_that_move_each_byte_read_once(ty: Any, ne: List[int], nb: List[int], offset: int) -> None:
    """plan_copy of any layout: copies that move each byte the view reads exactly once."""
    if len(nb) >= len(ne) and ty in TYPES:
        nb = [ferry.to_type(ty).size] + nb[1:len(ne)] if nb[0] % 2 else nb[:len(ne)]
    counts = [max(n, 0) for n in ne]
    if counts and isinstance(ty, str) and ty in TYPES:
        counts[0] //= ferry.to_type(ty).blck_size
    if counts and math.prod(counts) // max(max(counts), 1) > 1 << 14:
        return  # the plan lists about that many copies: fine, but slow to build here
    copies = attempt(lambda: ferry.plan.plan_copy(ty, ne, nb, offset))
    if copies is None:
        return
    t = ferry.plan.layout_view(ty, ne, nb, offset)
    unit, blck = t.type.size, t.type.blck_size
    full = list(t.ne)
    small = math.prod([full[0] // blck] + full[1:]) <= 1 << 14
    covered = set()
    for c in copies:
        assert c.size > 0 and c.count > 0
        assert c.offset >= t.offset and c.end <= t.offset + t.nbytes, f"{c} leaves the view's span"
        if small:
            for i in range(c.count):
                row = range(c.offset + i * c.stride, c.offset + i * c.stride + c.size)
                assert covered.isdisjoint(row), f"byte read twice in {copies}"
                covered.update(row)
    if not small:
        return
    want = set()
    for i3 in range(full[3] if 0 not in full else 0):
        for i2 in range(full[2]):
            for i1 in range(full[1]):
                for i0 in range(full[0] // blck):
                    start = t.offset + i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3]
                    want.update(range(start, start + unit))
    assert covered == want
    assert ferry.copy_path.bytes_read(t) == len(want)
    assert ferry.plan.plan_copy(t) == copies
    ex = ferry.plan.explain(t)  # the explanation describes the plan it stands for
    if ex.nested:
        assert ex.n_copies == len(copies) and all(c.size == ex.row for c in copies), (ex, copies)
        assert ex.row * math.prod(count for count, _, _ in ex.dims) == len(want), (ex, copies)
    else:
        assert ex.n_copies is None
    assert (ferry.plan.plan_cost(copies) > 0) is bool(copies) and (ferry.plan.flat_cost(t.nbytes) > 0) is (t.nbytes > 0)
    assert ferry.plan.plan_pays(t) is (bool(copies) and ferry.plan.plan_cost(copies) < ferry.plan.flat_cost(t.nbytes))


@settings(max_examples=60 * SCALE, **SETTINGS)
@given(st.lists(st.tuples(ints(0, 2**20), ints(0, 2**20), ints(0, 2**20), ints(0, 2**20)), max_size=4),
       st.sampled_from(["cpu", "gpu", "tpu"]), ints(-1, 2**40))
def test_a_plans_cost_is_the_finite_sum_of_its_copies_or_refused(copies: List[Any], model: str, span: int) -> None:
    p = attempt(lambda: ferry.plan.plan_cost(copies, model))
    assert (p is None) is (model == "tpu" or not all(0 <= x <= SIZE_MAX for c in copies for x in c))
    if p is not None:  # every copy costs a call at least; the cost of a plan is the sum of its copies'
        assert math.isfinite(p) and (p > 0) is bool(copies)
        assert p == pytest.approx(sum(ferry.plan.plan_cost([c], model) for c in copies))
    c = attempt(lambda: ferry.plan.flat_cost(span, model))
    assert (c is None) is (model == "tpu" or not 0 <= span <= SIZE_MAX)
    assert c is None or (math.isfinite(c) and (c > 0) is (span > 0))


# ---------------------------------------------------------------- copy_input between backends


def sc_copy_input(src_kind: str, dst_kind: str, split_kind: str, src: List[Any], mismatch: bool, policy: Any) -> None:
    """The scheduler's copy of one input, src a KV window or a strided view, into a copy of its
    layout (or of another one); it must move every byte src reads and write nothing outside dst."""
    sb, db = make_backend(src_kind), make_backend(dst_kind)
    split = {"src": sb, "dst": db}.get(split_kind) or make_backend(split_kind)
    if src[0] == "kv":
        _, ty, head_dim, n_stream, v_trans, n_kv, s0, s1, which = src
        kv = attempt(lambda: ferry.KVCache(ty, ty, head_dim, 2, 8 * n_stream, n_stream, v_trans=v_trans, backend=sb))
        if kv is None:
            return
        root = kv.k(0) if which == "k" else kv.v(0)
        if root.nbytes > 1 << 18:
            return
        root.set(pattern(root.nbytes, 6))
        w = attempt(lambda: kv.window(0, n_kv, s0, s1))
        if w is None:
            return
        s = w[0] if which == "k" else w[1]
    else:
        _, ty, ne, vne, vnb, off = src
        root = attempt(lambda: sb.alloc_tensor(ty, ne))
        if root is None or root.nbytes > 1 << 16:
            return
        root.set(pattern(root.nbytes, 6))
        s = attempt(lambda: root.view(vne, [root.type.size] + vnb[1:len(vne)], off))
        if s is None:
            return
    d = s.dup_layout() if not mismatch else ferry.Tensor.new(s.type, [max(s.ne[0], 1) * 2])
    buf = attempt(lambda: db.alloc_buffer(db.buffer_type.alloc_size(d) + 128))
    if buf is None or attempt(lambda: buf.place(d, 0)) is None:
        return
    buf.clear(0xA5)
    stats = attempt(lambda: ferry.copy_path.copy_input(split, policy, s, d))
    if stats is None or src_kind not in REAL or dst_kind not in REAL:
        return
    assert not mismatch
    raw = root.get()
    got = d.get()
    for c in ferry.plan.plan_copy(s):
        rel = c.offset - s.offset
        for i in range(c.count):
            a = rel + i * c.stride
            assert got[a:a + c.size] == raw[s.offset + a:s.offset + a + c.size], (c, stats)
    view = ferry.Tensor.new("i32", [buf.size // 4])
    buf.place(view, 0)
    whole = view.get()
    assert whole[d.nbytes:] == bytes([0xA5]) * (len(whole) - d.nbytes), "copy_input wrote past its destination"
    assert stats.bytes_read == ferry.copy_path.bytes_read(s) and stats.bytes_span == s.nbytes
    # what arrived: the span when flat, else exactly the bytes read
    assert stats.bytes_copied == (s.nbytes if stats.path == ferry.CopyPolicy.FLAT else stats.bytes_read), stats


@settings(max_examples=3 * SCALE, **ISOLATED)
@example([["sc_copy_input", "dummy_synth_host", "standin", "dummy_synth", ["view", "i32", [2], [1, 5], [4, 0, 16, 12], 0],
           False, "ranges"],  # read synthetic addresses: segfault
          ["sc_copy_input", "dummy_synth_host", "cpu", "cpu", ["kv", "f32", 8, 2, False, 4, 0, 1, "k"], False, "plan"],
          ["sc_copy_input", "dummy_synth_host", "standin", "src", ["kv", "f16", 8, 2, True, 4, 0, 1, "v"], False,
           "ranges"]])
@given(st.lists(st.tuples(
    st.just("sc_copy_input"), st.sampled_from(KINDS), st.sampled_from(KINDS),
    st.sampled_from(["src", "dst", "cpu", "dummy_synth"]),
    st.one_of(
        st.tuples(st.just("kv"), st.sampled_from(["f32", "f16", "q8_0"]), st.sampled_from([4, 8, 32]),
                  st.integers(1, 3), st.booleans(), st.integers(-1, 9), st.integers(-1, 3), st.integers(-1, 3),
                  st.sampled_from(["k", "v"])),
        st.tuples(st.just("view"), st.sampled_from(["f32", "f16", "i32"]), shapes(3, 8),
                  st.lists(st.integers(0, 5), min_size=1, max_size=4),
                  st.lists(st.sampled_from([0, 2, 4, 6, 8, 12, 16, 24, 40, 64]), min_size=4, max_size=4),
                  st.sampled_from([0, 2, 4, 8, 16]))).map(list),
    st.sampled_from([False, False, False, True]),
    st.sampled_from(["flat", "ranges", "plan", "nope", 3, None])).map(list), min_size=20, max_size=30))
def test_random_input_copies_move_every_byte_read_and_write_nothing_past_their_destination(calls: List[List[Any]]) -> None:
    run_isolated(calls)


# ---------------------------------------------------------------- the scheduler


def sc_sched(kv_kind: str, ty: str, v_trans: bool, win: List[int], which: str, out_type: Optional[str],
             backend_kinds: List[Any], policy: Any, compact: Any, assignments: List[List[Any]], actions: List[str]) -> None:
    """A KV window through a dup on a Scheduler of odd backend lists (empty, duplicated, foreign
    assignments), computed, computed again, closed and used; results checked when the memory is real."""
    pool = {k: make_backend(k) for k in KINDS}
    kv = attempt(lambda: ferry.KVCache(ty, ty, 32, 2, 16, 2, v_trans=v_trans, backend=pool[kv_kind]))
    if kv is None:
        return
    for layer_t in (kv.k(0), kv.v(0)):
        layer_t.set(pattern(layer_t.nbytes, 8) if ty != "f16" else
                    (np.arange(layer_t.nbytes // 2) % 251).astype(np.float16).tobytes())
    w = attempt(lambda: kv.window(0, *win))
    if w is None:
        return
    src = w[0] if which == "k" else w[1]
    out = attempt(lambda: ferry.ops.dup(src, out_type))
    if out is None:
        return
    out.set_output()
    graph = ferry.Graph(out)
    backends = [pool.get(k, k) if isinstance(k, str) else k for k in backend_kinds]
    sched = attempt(lambda: ferry.Scheduler(backends, policy=policy, compact=compact))
    if sched is None:
        return
    for target, kind in assignments:
        t = {"out": out, "src": src, "root": src.root}.get(target, target)
        attempt(lambda: sched.assign(t, pool.get(kind, kind)))
    for action in actions:
        if action == "compute":
            if attempt(lambda: sched.compute(graph)) is None:
                continue
            st_ = sched.stats
            assert st_.bytes_read <= st_.bytes_span or st_.n_inputs == 0
            for s in sched.splits:
                for i in s.inputs:
                    assert i.copy.same_layout(i.src) or sched.compact
            ob = sched.backend_of(out)
            real = kv_kind in REAL and ob is not None and (
                isinstance(ob, (ferry.CPUBackend, ferry.StandinBackend)) or getattr(ob, "real_memory", False))
            if real and out.allocated:
                raw = src.root.get()
                want = gather(raw, src.type, src.ne, src.nb, src.offset)
                if out_type is None or ferry.to_type(out_type) == src.type:
                    assert out.get() == want, "the scheduler's dup differs from the window"
        elif action == "close":
            sched.close()
        elif action == "clear_assignments":
            attempt(sched.clear_assignments)
        elif action == "inputs":
            for i in attempt(lambda: sched.inputs) or []:
                attempt(i.copy.get)
                attempt(lambda: i.copy.view([1]))
        elif action == "repr":
            repr(sched), repr(out), repr(src), [repr(b) for b in backends]
        elif action == "del_kv":
            del kv
            kv = None
            gc.collect()
        elif action == "alloc_other":
            attempt(lambda: sched.alloc(ferry.Graph(ferry.ops.dup(out))))
        elif action.startswith("prefetch"):  # copies queued ahead from now on (or refused)
            depth = {"prefetch": 2, "prefetch_off": 0, "prefetch_bad": -1}[action]
            attempt(lambda: setattr(sched, "prefetch", depth))


@settings(max_examples=3 * SCALE, **ISOLATED)
@example([["sc_sched", "dummy_synth_host", "f32", False, [4, 0, 1], "k", None, ["standin", "cpu"], "ranges", False, [],
           ["compute", "compute", "inputs", "close", "compute"]],  # the CPU kernels read synthetic addresses
          ["sc_sched", "cpu", "f16", True, [16, 0, 1], "v", None, ["standin", "standin", "cpu"], "plan", True,
           [["out", "standin"]], ["compute", "del_kv", "compute", "repr"]]])
@given(st.lists(st.tuples(
    st.just("sc_sched"), st.sampled_from(KINDS), st.sampled_from(["f32", "f16", "q8_0"]), st.booleans(),
    st.lists(ints(-1, 9), min_size=1, max_size=3), st.sampled_from(["k", "v"]),
    st.sampled_from([None, None, "f32", "f16", "q8_0"]),
    st.one_of(st.lists(st.sampled_from(KINDS), max_size=4), st.sampled_from([[], ["x"], [None], [3], "cpu"])),
    st.sampled_from(["flat", "ranges", "plan", "nope", 1]), st.sampled_from([False, True, 1]),
    st.lists(st.tuples(st.sampled_from(["out", "src", "root", None, 5]), st.sampled_from(KINDS + [None, "x"])).map(
        list), max_size=2),
    st.lists(st.sampled_from(["compute", "compute", "close", "clear_assignments", "inputs", "repr", "del_kv",
                              "alloc_other", "prefetch", "prefetch_off", "prefetch_bad"]), max_size=6)).map(list),
    min_size=20, max_size=30))
def test_random_schedulers_dup_the_windows_bytes_or_raise_ferry_errors(calls: List[List[Any]]) -> None:
    run_isolated(calls)


# ---------------------------------------------------------------- lifetimes: use after free from Python


def sc_lifetimes(dev_kind: str, actions: List[str]) -> None:
    """Objects freed, closed and dropped in any order, then used: FreedBufferError and the like,
    never a read of freed memory."""
    w: Dict[str, Any] = {}
    w["cpu"] = ferry.CPUBackend()
    w["dev"] = make_backend(dev_kind)
    w["buf"] = w["cpu"].alloc_buffer(256)
    w["t"] = w["buf"].new_tensor("f32", [16], name="t")
    w["v"] = w["t"].view([4, 2], [4, 16], 8)
    w["op"] = (ferry.ops.dup(w["v"]) + ferry.ops.dup(w["v"])).set_output()
    w["g"] = ferry.Graph(w["op"])
    w["ga"] = ferry.GraphAllocator(w["cpu"])
    w["kv"] = ferry.KVCache("f32", "f32", 4, 1, 8, 2, backend=w["cpu"])
    w["kw"] = w["kv"].window(0, 2, 0, 1)
    w["kd"] = ferry.ops.dup(w["kw"][0]).set_output()
    w["sched"] = ferry.Scheduler([w["dev"], w["cpu"]], policy="ranges")

    def use(names: str, fn: Callable[[], Any]) -> None:
        if all(n in w for n in names.split()):
            attempt(fn)

    for a in actions:
        if a.startswith("del_"):
            w.pop(a[4:], None)
            gc.collect()
        elif a == "free_buf":
            use("buf", lambda: w["buf"].close())
        elif a == "close_ga":
            use("ga", lambda: w["ga"].close())
        elif a == "close_sched":
            use("sched", lambda: w["sched"].close())
        elif a == "get_v":
            use("v", lambda: w["v"].get())
        elif a == "set_t":
            use("t", lambda: w["t"].set(pattern(64)))
        elif a == "numpy_v":
            use("v", lambda: w["v"].to_numpy())
        elif a == "alloc_g":
            use("ga g", lambda: w["ga"].alloc(w["g"]))
        elif a == "compute_g":
            use("g cpu", lambda: w["g"].compute(w["cpu"]))
        elif a == "get_op":
            use("op", lambda: w["op"].get())
        elif a == "sched_compute":
            use("sched", lambda: w["sched"].compute(ferry.Graph(w["kd"])))
        elif a == "sched_inputs":
            use("sched", lambda: [i.copy.get() for i in w["sched"].inputs])
        elif a == "window":
            use("kv", lambda: w["kv"].window(0, 1, 1))
        elif a == "get_kw":
            use("kw", lambda: w["kw"][1].get())
        elif a == "placement":
            use("ga op", lambda: w["ga"].slot(w["op"]))
        elif a == "chunks":
            use("ga", lambda: [repr(c) for c in w["ga"].chunks()])
        elif a == "copy":
            use("t", lambda: w["t"].copy_to(w["t"]))
        elif a == "failed_kept":
            def keep() -> None:
                try:
                    w["t"].set(np.zeros(3, np.float32), -1)
                except ferry.FerryError as e:
                    err = e  # noqa: F841 - the frame keeps its own exception: a reference cycle
            use("t", keep)
        elif a == "pending":
            use("dev", lambda: w["dev"].set_async(w["dev"].alloc_tensor("f32", [4]), np.zeros(4, np.float32)))
        elif a == "repr":
            [repr(x) for x in w.values()]


@settings(max_examples=2 * SCALE, **ISOLATED)
@example([["sc_lifetimes", "dummy_real", ["failed_kept", "pending", "del_dev", "failed_kept", "del_t", "repr"]]] * 3)
@given(st.lists(st.tuples(st.just("sc_lifetimes"), st.sampled_from(KINDS), st.lists(st.sampled_from([
    "del_cpu", "del_dev", "del_buf", "del_t", "del_kv", "del_g", "del_ga", "del_sched", "del_op", "del_kw",
    "free_buf", "close_ga", "close_sched", "get_v", "set_t", "numpy_v", "alloc_g", "compute_g", "get_op",
    "sched_compute", "sched_inputs", "window", "get_kw", "placement", "chunks", "copy", "repr", "failed_kept",
    "pending"]),
    max_size=14)).map(list), min_size=25, max_size=40))
def test_objects_used_after_any_free_order_raise_ferry_errors_never_read_freed_memory(calls: List[List[Any]]) -> None:
    run_isolated(calls)


# ---------------------------------------------------------------- backends and buffers of odd parameters


@settings(max_examples=120 * SCALE, **SETTINGS)
@given(ints(-1, 300), st.one_of(st.none(), ints(-1, 5000)), st.booleans(), st.booleans(),
       st.lists(st.tuples(st.sampled_from(["alloc", "place", "usage", "clear"]), ints(-1, 6000), ints(-1, 600)),
                max_size=6))
@example(0, None, True, False, [("alloc", 2**62, 0)] * 4 + [("place", 2**62 - 64, 16)])  # addresses wrapped
def test_random_dummy_backends_align_and_bound_their_buffers_and_placements(alignment: int, max_size: Optional[int], has_2d: bool, is_host: bool,
                              ops: List[Any]) -> None:
    """Synthetic dummy backends of any alignment and max size, their buffers and placements."""
    d = attempt(lambda: ferry.DummyBackend(alignment=alignment, max_buffer_size=max_size, has_2d=has_2d,
                                           is_host=is_host))
    if d is None:
        return
    a = d.alignment
    assert a > 0 and a & (a - 1) == 0 and (alignment == 0 or a == alignment)
    bufs: List[ferry.Buffer] = []
    for op, x, y in ops:
        if op == "alloc":
            b = attempt(lambda: d.alloc_buffer(x))
            if b is not None:
                assert b.size == x and (max_size in (None, 0) or x <= max_size)
                bufs.append(b)
        elif op == "place" and bufs:
            t = attempt(lambda: ferry.Tensor.new("i32", [y])) or ferry.Tensor.new("f32", [1])
            if attempt(lambda: bufs[-1].place(t, x)) is not None:
                assert x % a == 0 and x + t.nbytes <= bufs[-1].size
                assert t.allocated and t.address == bufs[-1].base + x
        elif op == "usage" and bufs:
            attempt(lambda: setattr(bufs[-1], "usage", ["any", "weights", "compute", "x"][x % 4]))
        elif op == "clear" and bufs:
            attempt(lambda: bufs[-1].clear(x))


# ---------------------------------------------------------------- type confusion


JUNK = [None, "x", "", b"xx", 1.5, float("nan"), -1, 2**64, 2**200, [], [1, 2, 3, 4, 5], {}, object(), True,
        np.int64(3), np.float32(2), 1j, np.zeros(3), ferry.CPUBackend]


def confusion_calls(J: Any) -> List[Callable[[], Any]]:
    """Every public entry point, with J where one argument belongs."""
    cpu = ferry.CPUBackend()
    dummy = ferry.DummyBackend()
    t = cpu.alloc_tensor("f32", [8, 2], name="t")
    buf = cpu.alloc_buffer(64)
    kv = ferry.KVCache("f32", "f32", 4, 1, 8, 2, backend=dummy)
    g = ferry.Graph(ferry.ops.dup(t))
    ga = ferry.GraphAllocator(cpu)
    sched = ferry.Scheduler([cpu])
    arr = np.zeros(4, np.float32)
    calls: List[Callable[[], Any]] = [
        lambda: ferry.Tensor.new(J, [4]), lambda: ferry.Tensor.new("f32", J), lambda: ferry.Tensor.new("f32", [J]),
        lambda: t.view(J), lambda: t.view([4], J), lambda: t.view([4], None, J), lambda: t.view([4], [J]),
        lambda: t.permute(J), lambda: t.permute(J, 0, 1, 2), lambda: t.reshape(J), lambda: t.reshape([J]),
        lambda: t.set(J), lambda: t.set(b"", J), lambda: t.get(J), lambda: t.get(0, J), lambda: t.readinto(J),
        lambda: t.memset(J), lambda: t.memset(0, J, 4), lambda: t.memset(0, 0, J),
        lambda: t.set_2d(J, 0, 4, 1, 4), lambda: t.set_2d(b"xxxx", J, 4, 1, 4), lambda: t.set_2d(b"xx", 0, J, 1, 4),
        lambda: t.set_2d(b"xxxx", 0, 4, J, 4), lambda: t.set_2d(b"xxxx", 0, 4, 1, J),
        lambda: t.set_2d(b"xxxx", 0, 4, 1, 4, J), lambda: t.get_2d(J, 4, 1, 4), lambda: t.get_2d(0, 4, 1, 4, out=J),
        lambda: t.copy_to(J), lambda: t.same_layout(J),
        lambda: setattr(t, "name", J), lambda: ferry.ops.dup(t, J), lambda: ferry.ops.concat(t, J, 0), lambda: ferry.ops.concat(t, t, J),
        lambda: ferry.ops.pad(t, J), lambda: ferry.ops.pad(t, 0, J), lambda: ferry.ops.scale(t, J), lambda: ferry.ops.add(J, t), lambda: ferry.ops.add(t, J),
        lambda: ferry.ops.mul(J, J), lambda: ferry.ops.mean(J), lambda: ferry.ops.dup(J), lambda: ferry.ops.scale(J, 1.0),
        lambda: ferry.ops.attn_decode(J, t, t, t), lambda: ferry.ops.attn_decode(t, t, t, t, scale=J),
        lambda: ferry.ops.attn_decode(t, t, t, t, v_trans=J), lambda: ferry.Graph(J), lambda: g.build(J),
        lambda: g.compute(J), lambda: J in g, lambda: ferry.GraphAllocator(J), lambda: ferry.GraphAllocator([J]),
        lambda: ga.alloc(J), lambda: ga.reserve(J), lambda: ga.reserve(g, J), lambda: ga.reserve(g, None, J),
        lambda: ga.slot(J), lambda: ga.buffer_size(J), lambda: ga.chunks(J), lambda: ga.n_chunks(J),
        lambda: ferry.KVCache(J, "f32", 4, 1, 8, 2), lambda: ferry.KVCache("f32", J, 4, 1, 8, 2),
        lambda: ferry.KVCache("f32", "f32", J, 1, 8, 2, backend=dummy),
        lambda: ferry.KVCache("f32", "f32", 4, J, 8, 2, backend=dummy),
        lambda: ferry.KVCache("f32", "f32", 4, 1, J, 2, backend=dummy),
        lambda: ferry.KVCache("f32", "f32", 4, 1, 8, J, backend=dummy),
        lambda: ferry.KVCache("f32", "f32", 4, 1, 8, 2, J, backend=dummy),
        lambda: ferry.KVCache("f32", "f32", 4, 1, 8, 2, v_trans=J, backend=dummy),
        lambda: ferry.KVCache("f32", "f32", 4, 1, 8, 2, backend=J),
        lambda: ferry.KVCache("f32", "f32", 4, 1, 8, 2, buffer_type=J),
        lambda: kv.window(J, 1), lambda: kv.window(0, J), lambda: kv.window(0, 1, J), lambda: kv.window(0, 1, 0, J),
        lambda: kv.k(J), lambda: kv.v(J), lambda: kv.set_stream(J, 0, 0, b""), lambda: kv.set_stream("k", J, 0, b""),
        lambda: kv.set_stream("k", 0, J, b""), lambda: kv.set_stream("k", 0, 0, J), lambda: kv.get_stream("v", 0, J),
        lambda: ferry.Scheduler(J), lambda: ferry.Scheduler([J]), lambda: ferry.Scheduler([cpu], policy=J),
        lambda: ferry.Scheduler([cpu], compact=J), lambda: sched.assign(J, cpu), lambda: sched.assign(t, J),
        lambda: sched.compute(J), lambda: sched.alloc(J), lambda: sched.backend_of(J), lambda: sched.buffer_size(J),
        lambda: setattr(sched, "policy", J), lambda: setattr(sched, "compact", J),
        lambda: ferry.copy_path.copy_input(J, "flat", t, t), lambda: ferry.copy_path.copy_input(cpu, J, t, t),
        lambda: ferry.copy_path.copy_input(cpu, "flat", J, t), lambda: ferry.copy_path.copy_input(cpu, "flat", t, J),
        lambda: ferry.plan.plan_copy(J, [4], [4]), lambda: ferry.plan.plan_copy("f32", J, [4]),
        lambda: ferry.plan.plan_copy("f32", [4], J), lambda: ferry.plan.plan_copy("f32", [4], [4], J),
        lambda: ferry.plan.plan_copy("f32", [4, 2], [4, J]), lambda: ferry.plan.layout_view("f32", [4], [4], 0, source=J),
        lambda: ferry.plan.plan_copy(J), lambda: ferry.copy_path.bytes_read(J), lambda: ferry.copy_path.copy_ranges_of(J),
        lambda: ferry.plan.plan_cost(J), lambda: ferry.plan.plan_cost([J]), lambda: ferry.plan.plan_cost([], J),
        lambda: ferry.plan.flat_cost(J), lambda: ferry.plan.flat_cost(4, J), lambda: ferry.plan.plan_pays(J),
        lambda: ferry.plan.plan_pays(t, J), lambda: ferry.plan.explain(J, [4], [4]), lambda: ferry.plan.explain("f32", J, [4]),
        lambda: ferry.plan.explain("f32", [4], J), lambda: ferry.plan.explain(J), lambda: ferry.plan.cost_model(J),
        lambda: ferry.plan.CopyCostModel(J, 1, 1, 1, 1, 1, 1, 1), lambda: ferry.plan.CopyCostModel(1, 1, 1, J, 1, 1, 1, 1),
        lambda: ferry.plan.CopyCostModel.of_backend(J),
        lambda: ferry.DummyBackend(alignment=J), lambda: ferry.DummyBackend(max_buffer_size=J),
        lambda: cpu.alloc_buffer(J), lambda: cpu.alloc_tensor(J, [4]), lambda: cpu.alloc_tensor("f32", J),
        lambda: cpu.alloc_buffer_for(J), lambda: buf.place(J), lambda: buf.place(t.dup_layout(), J),
        lambda: buf.clear(J), lambda: setattr(buf, "usage", J), lambda: buf.new_tensor(J, [4]),
        lambda: buf.new_tensor("f32", J), lambda: cpu.set_async(J, b""), lambda: cpu.set_async(t, J),
        lambda: cpu.set_async(t, b"", J), lambda: cpu.get_async(J, bytearray(4)), lambda: cpu.get_async(t, J),
        lambda: cpu.set_2d_async(t, J, 0, 4, 1, 4), lambda: cpu.set_2d(J, b"", 0, 4, 1, 4),
        lambda: cpu.get_2d(J, 0, 4, 1, 4), lambda: cpu.get_2d(t, J, 4, 1, 4), lambda: cpu.get_2d_async(t, J, 0, 4, 1, 4),
        lambda: cpu.copy_async(J, t), lambda: cpu.copy_async(t, J), lambda: cpu.copy_async(t, t, J),
        lambda: cpu.supports_buffer_type(J), lambda: cpu.wait(J), lambda: cpu.event(J), lambda: dummy.event(),
        lambda: ferry.to_type(J),
        lambda: ferry.row_size(J, 4), lambda: ferry.row_size("f32", J), lambda: ferry.to_type(J).numpy_dtype,
        lambda: ferry.Tensor.from_numpy(J, arr),
        lambda: ferry.Tensor.from_numpy(cpu, J), lambda: ferry.ops.op_name(J),
        lambda: ferry.CUDABackend(J), lambda: ferry.cuda_buffer_type(J), lambda: ferry.Event(J),
        lambda: ferry.Event(cpu, J), lambda: ferry.Event.elapsed_ms(J, J),
    ]
    return calls


@pytest.mark.parametrize("j", range(len(JUNK)), ids=[type(x).__name__ + str(i) for i, x in enumerate(JUNK)])
def test_every_entry_point_given_a_wrong_kind_of_value_raises_only_ferry_errors(j: int) -> None:
    """Each entry point given a value of the wrong kind (or an edge value) succeeds or raises a
    FerryError: never a TypeError or OverflowError from cffi, an AttributeError, or a crash."""
    J = JUNK[j]
    bad = []
    for i, fn in enumerate(confusion_calls(J)):
        try:
            fn()
        except ALLOWED:
            pass
        except Exception as e:  # noqa: BLE001 - any other exception is what this test looks for
            bad.append(f"call {i}: {type(e).__name__}: {e}")
    assert not bad, f"with {J!r}:\n" + "\n".join(bad)


# ---------------------------------------------------------------- graphs and the graph allocator (synthetic memory)


@settings(max_examples=100 * SCALE, **SETTINGS)
@given(st.lists(st.tuples(st.sampled_from([1, 8, 64, 256, 0, 3]), st.sampled_from([None, 64, 200, 1000, 4096])),
                min_size=1, max_size=3),
       st.lists(st.tuples(st.sampled_from(["f32", "f16", "i32"]), st.lists(st.integers(0, 6), min_size=1,
                                                                           max_size=3)), min_size=1, max_size=3),
       st.lists(compute_steps(), max_size=8), st.lists(st.integers(-1, 3), max_size=20),
       st.lists(st.integers(-1, 3), max_size=8), st.booleans(), st.sampled_from(["cpu", "dummy_synth", None]))
def test_random_graphs_are_placed_aligned_inside_their_chunks_without_overlap(types: List[Any], leafs: List[Any], steps: List[Any], node_ids: List[int],
                         leaf_ids: List[int], reserve: bool, placed_kind: Optional[str]) -> None:
    """Random graphs placed by allocators over synthetic buffer types of odd alignments and max
    sizes: each placement lies inside its chunk, aligned, and tensors alive for the whole graph
    (leafs, inputs, outputs) never share bytes."""
    backends = [attempt(lambda a=a, m=m: ferry.DummyBackend(alignment=a, max_buffer_size=m)) for a, m in types]
    backends = [b for b in backends if b is not None]
    if not backends:
        return
    tensors = [ferry.Tensor.new(ty, ne) for ty, ne in leafs]
    if placed_kind is not None:  # a leaf with memory of its own: the allocator leaves it alone
        tensors.append(make_backend(placed_kind).alloc_tensor("f32", [4]))
    for name, i, j, params in steps:
        a, b = tensors[i % len(tensors)], tensors[j % len(tensors)]
        out = attempt(lambda: apply_op(name, a, b, params))
        if out is not None:
            tensors.append(out)
    graph = ferry.Graph(*tensors)
    ga = ferry.GraphAllocator(backends)
    if reserve:
        attempt(lambda: ga.reserve(graph, node_ids[:graph.n_nodes] or None, leaf_ids[:graph.n_leafs] or None))
    if attempt(lambda: ga.alloc(graph)) is None:
        return
    ga.alloc(graph)  # again: the same walk, the same places
    whole: List[Any] = []
    for t in graph.tensors:
        p = ga.slot(t)
        if t.is_view:
            assert p is None
            assert t.allocated == t.root.allocated
            continue
        if p is None:
            assert t.allocated and getattr(t.buffer, "owner", None) is not ga, t  # memory of its own
            continue
        align = ga.buffer_types[p.buffer_type].alignment
        chunk = ga.chunks(p.buffer_type)[p.chunk]
        assert p.offset % align == 0 and p.offset + p.size <= chunk.size
        assert p.size >= ga.buffer_types[p.buffer_type].alloc_size(t)
        assert t.allocated and t.address == chunk.base + p.offset
        if t.op == 0 or t.is_input or t.is_output:
            whole.append((p.buffer_type, p.chunk, p.offset, p.offset + p.size))
    whole.sort()
    for x, y in zip(whole, whole[1:]):
        assert x[:2] != y[:2] or x[3] <= y[2], f"tensors alive for the whole graph share bytes: {x} {y}"
