"""The entry points added with placement and since, under random arguments (hypothesis, the repeatable
profile): KVCache(placement=, layer_cells=), KVCache.from_arrays and set_stream, attention_step,
ferry.residency's plan and predict functions with their DeviceSpec and LayerCost, StandinBackend,
measure_link and fit_link, Tensor.set_used_cells and plan_ragged, Scheduler.trace, Scheduler's
prefetch_next, drop_ahead and truncate, ops.attn_paged and PagedKVCache.table_tensor; BlockPool's
constructor, set_prefetch, sync, truncate, set_resident, choose_resident and plan; ferry.plan's copy_pieces,
gather_pieces and merge_pieces; ferry.remote.server's cache_layout and layout_differences; RemoteTier's
pull, pull_async and fetch_layers; ferry.fetch.set_fetch; ferry.remote.link's time_remote_pulls and
remote_pull_seconds.

Each test starts from a call that succeeds and gives one of its arguments a drawn value, valid or
not: another type, negative, zero, huge, NaN, a string, None, a list of another length. The call
succeeds, or raises a FerryError whose message names that argument (an OutOfMemoryError may name
the bytes it could not have instead); never another exception. A refused call writes nothing: the
caller's arrays, the cache's bytes, the scheduler's assignments and the device's memory and link are
as they were. test_fuzz_api.py gives the older entry points values of the wrong kind and checks
results; this file asks of the newer ones that a refusal says what to change and leaves no trace.
"""

from __future__ import annotations

import copy
import math
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import ferry
from ferry.block_pool import BlockPool
from ferry.kv import KVWindows
from ferry.paged import PagedKVCache
from ferry.remote.link import BatchTiming, fit_remote_link, remote_link_shapes, remote_pull_seconds
from ferry.residency import (
    DeviceSpec,
    LayerCost,
    RemoteSpec,
    choose_auto,
    choose_first,
    choose_residency,
    choose_round_robin,
    choose_slowest_link,
    expected_accepted_tokens,
    measure_token_share,
    predict_step,
    remote_link_model,
)

SETTINGS = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))
# FERRY_FUZZ_SCALE=10 (tools/fuzz) runs ten times the examples.
SCALE = max(int(os.environ.get("FERRY_FUZZ_SCALE", "1")), 1)


class Other:
    """An object of no kind any entry point takes."""

    def __repr__(self) -> str:
        return "Other()"


#: Values of the wrong kind, or at the edges of the right one.
JUNK: List[Any] = [None, "x", "", b"ab", -1, 0, 1, 3, 2**31, 2**64, -(2**63) - 1, 0.5, -0.0, float("nan"),
                   float("inf"), -float("inf"), True, [], [None], (1, 2), {}, Other()]


def junk() -> st.SearchStrategy[Any]:
    return st.sampled_from(JUNK)


def ints(lo: int = -2, hi: int = 40) -> st.SearchStrategy[int]:
    """Mostly small integers, sometimes one at the edge of what C holds."""
    return st.one_of(st.integers(lo, hi), st.sampled_from([-(2**63), 2**31, 2**32 + 1, 2**63 - 1, 2**63, 2**64]))


def numbers() -> st.SearchStrategy[Any]:
    """Floats anywhere, NaN and infinities included, and numbers of other kinds."""
    return st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5),
                     st.sampled_from([1e-4, 1e-3, 1e6, 1e7, np.float32(2.5), np.int64(3), np.float64("nan")]))


def outcome(call: Callable[[], Any], names: Sequence[str]) -> Tuple[Any, Optional[ferry.FerryError]]:
    """(call's result, None), or (None, its FerryError) when the message names one of names (an
    OutOfMemoryError may name the bytes it lacks instead); any other exception fails the test."""
    try:
        result = call()
    except ferry.OutOfMemoryError as e:
        assert "bytes" in e.message or any(n in e.message for n in names), e.message
        event(f"{names[0]}: OutOfMemoryError")
        return None, e
    except ferry.FerryError as e:
        assert any(n in e.message for n in names), f"the message names none of {list(names)}: {e.message}"
        event(f"{names[0]}: {type(e).__name__}")
        return None, e
    event(f"{names[0]}: accepted")
    return result, None


def changed(base: Dict[str, Any], arg: str, value: Any) -> Dict[str, Any]:
    out = dict(base)
    out[arg] = value
    return out


# ---------------------------------------------------------------- KVCache(placement=, layer_cells=)

TYPE_NAMES = ["f32", "f16", "bf16", "i32", "q8_0", "q4_0", "F16", "f64", 17, -1]
CACHE_ARGS = ["type_k", "type_v", "head_dim", "n_head_kv", "n_ctx", "n_stream", "n_layer", "v_trans", "placement",
              "layer_cells"]
#: What else a message may call an argument.
CACHE_NAMES = {"n_layer": ("layers",), "n_stream": ("streams",), "placement": ("placement",),
               "layer_cells": ("cells",)}


def placement_entry(i: int, dev: ferry.Backend) -> Any:
    return [None, dev, ferry.CPUBackend(), ferry.DummyBackend(), ferry.DummyBackend(real_memory=True), "dev",
            dev.buffer_type][i]


@st.composite
def cache_change(draw: st.DrawFn) -> Tuple[str, Any]:
    arg = draw(st.sampled_from(CACHE_ARGS))
    if arg in ("type_k", "type_v"):
        value = draw(st.one_of(st.sampled_from(TYPE_NAMES), junk()))
    elif arg == "v_trans":
        value = draw(st.one_of(st.booleans(), junk()))
    elif arg == "placement":
        value = draw(st.one_of(st.lists(st.integers(0, 6), max_size=4), junk()))
        if isinstance(value, list) and all(isinstance(x, int) for x in value):
            value = ("entries", value)
    elif arg == "layer_cells":
        value = draw(st.one_of(st.lists(st.one_of(st.none(), ints(-2, 20), junk()), max_size=4), junk()))
    else:
        value = draw(st.one_of(ints(), junk()))
    return arg, value


@settings(max_examples=400 * SCALE, **SETTINGS)
@given(cache_change())
@example(("type_k", None))  # refused naming type_k, not "type: expected an integer"
@example(("type_v", "q8_0"))  # head_dim 16 is no whole q8_0 block: the message names type_v
def test_a_placed_cache_of_any_argument_reads_zeros_or_is_refused_keeping_no_device_memory(change: Tuple[str, Any]) -> None:
    """A cache of any arguments, layers on a stand-in device among them: made, reading zeros where it
    was placed, or refused naming the argument, with none of the device's memory kept."""
    arg, value = change
    dev = ferry.StandinBackend(memory=1 << 20)
    host = ferry.StandinBackend(memory=1 << 22)  # the cache's own memory, of a budget: no huge one is touched
    if isinstance(value, tuple) and value[:1] == ("entries",):
        value = [placement_entry(i, dev) for i in value[1]]
    base = dict(type_k="f16", type_v="f16", head_dim=16, n_head_kv=2, n_ctx=32, n_stream=2, n_layer=3,
                v_trans=False, placement=[None, dev, None], layer_cells=[None, 8, 0], backend=host)
    free = dev.memory().free
    kv, err = outcome(lambda: ferry.KVCache(**changed(base, arg, value)), (arg,) + CACHE_NAMES.get(arg, ()))
    if kv is None:
        assert dev.memory().free == free, "a refused cache kept device memory"
        return
    p = kv.params
    for layer in range(p.n_layer):
        for which in ("k", "v"):
            assert not any(kv.get_stream(which, layer, p.n_stream - 1)), (which, layer)  # a new cache reads zeros
    where = base["placement"] if arg != "placement" else value
    if where is not None:
        assert all(got is (None if w is None else w) for got, w in zip(kv.placement, where))
    kv.close()
    assert dev.memory().free == free


# ---------------------------------------------------------------- KVCache.from_arrays

ARRAY_ARGS = ["k_layers", "v_layers", "n_stream", "v_trans", "type_k", "type_v", "n_head_kv", "n_ctx"]
ARRAY_NAMES = {"k_layers": ("K layers",), "v_layers": ("V layers",)}


def bad_array(kind: int) -> Any:
    """An array from_arrays may refuse (or, for a few, take): each of another kind than the base's."""
    a = np.full((2, 8, 32), 3.0, np.float16)
    ro = a.copy()
    ro.flags.writeable = False
    return [a.astype(np.float32), a.astype(np.int32), a.view(np.uint8), a.astype(np.float64),
            np.full((2, 16, 32), 1, np.float16)[:, ::2], np.full((2, 8, 64), 1, np.float16)[:, :, :32],
            np.full((2, 9, 32), 1, np.float16), np.full((3, 8, 32), 1, np.float16), a[0].copy(), a[None].copy(),
            ro, np.full((2, 4, 32), 2, np.float16), np.full((2, 8, 16), 2, np.float16), None, "x", [1.0, 2.0],
            a.copy()][kind]


@st.composite
def arrays_change(draw: st.DrawFn) -> Tuple[str, Any]:
    arg = draw(st.sampled_from(ARRAY_ARGS))
    if arg in ("k_layers", "v_layers"):
        value = draw(st.one_of(
            st.tuples(st.just("replace"), st.integers(0, 1), st.integers(0, 16)),
            st.tuples(st.just("length"), st.integers(0, 3)),
            junk()))
    elif arg == "v_trans":
        value = draw(st.one_of(st.booleans(), junk()))
    elif arg in ("type_k", "type_v"):
        value = draw(st.one_of(st.none(), st.sampled_from(TYPE_NAMES), junk()))
    elif arg == "n_ctx":
        value = draw(st.one_of(st.none(), ints(-2, 40), junk()))
    else:
        value = draw(st.one_of(ints(-2, 5), junk()))
    return arg, value


@settings(max_examples=500 * SCALE, **SETTINGS)
@given(arrays_change())
@example(("k_layers", ("replace", 1, 0)))  # a later layer of another type: refused, not read as the first's
@example(("v_layers", ("replace", 0, 9)))  # a 4-D array
def test_from_arrays_reads_the_arrays_or_refuses_naming_the_argument_and_never_writes_them(change: Tuple[str, Any]) -> None:
    """A cache over the caller's arrays: made, reading the arrays' bytes, or refused naming the
    argument (the array: k_layers[i]); the arrays hold what they held either way."""
    arg, value = change
    ks = [np.full((2, 8, 32), 1.0 + i, np.float16) for i in range(2)]
    vs = [np.full((2, 8, 32), -1.0 - i, np.float16) for i in range(2)]
    base: Dict[str, Any] = dict(k_layers=ks, v_layers=vs, n_stream=2, v_trans=False, type_k=None, type_v=None,
                                n_head_kv=2, n_ctx=None)
    if isinstance(value, tuple) and value[:1] == ("replace",):
        layers = list(base[arg])
        layers[value[1]] = bad_array(value[2])
        value = layers
    elif isinstance(value, tuple) and value[:1] == ("length",):
        value = [np.full((2, 8, 32), 5.0, np.float16) for _ in range(value[1])]
    args = changed(base, arg, value)
    arrays = [a for key in ("k_layers", "v_layers") if isinstance(args[key], list)
              for a in args[key] if isinstance(a, np.ndarray)]
    before = [a.copy() for a in arrays]
    kv, _ = outcome(lambda: ferry.KVCache.from_arrays(**args), (arg,) + ARRAY_NAMES.get(arg, ()))
    assert all(np.array_equal(a, b) for a, b in zip(arrays, before)), "the caller's arrays were written"
    if kv is not None:
        for layer, (k, v) in enumerate(zip(args["k_layers"], args["v_layers"])):
            assert kv.get_stream("k", layer, 1) == np.ascontiguousarray(k[1]).tobytes()
            assert kv.get_stream("v", layer, 0) == np.ascontiguousarray(v[0]).tobytes()


# ---------------------------------------------------------------- KVCache.set_stream

STREAM_ARGS = ["which", "layer", "stream", "data"]


@st.composite
def stream_change(draw: st.DrawFn) -> Tuple[str, Any]:
    arg = draw(st.sampled_from(STREAM_ARGS))
    if arg == "which":
        value = draw(st.one_of(st.sampled_from(["k", "v", "K", "kv", ""]), junk()))
    elif arg == "data":
        value = draw(st.one_of(st.tuples(st.just("data"), st.integers(0, 8)), junk()))
    else:
        value = draw(st.one_of(ints(-2, 3), junk()))
    return arg, value


def stream_data(kind: int) -> Any:
    """Data for one stream of a [8 cells, 32] f32 layer, of the right size or not."""
    good = np.arange(8 * 32, dtype=np.float32).reshape(8, 32)
    return [good, good.reshape(-1), good.tobytes(), good.astype(np.float16), good[:4], good.tobytes()[:-4],
            good.tobytes() + b"xxxx", good.T, bytearray(good.tobytes())][kind]


@settings(max_examples=150 * SCALE, **SETTINGS)
@given(stream_change())
@example(("data", ("data", 7)))  # a transposed view of the right shape's values
def test_set_stream_writes_one_stream_exactly_or_refuses_naming_the_argument_writing_nothing(change: Tuple[str, Any]) -> None:
    """One stream written, exactly, or the write refused naming the argument and the cache left as it was."""
    arg, value = change
    if isinstance(value, tuple) and value[:1] == ("data",):
        value = stream_data(value[1])
    kv = ferry.KVCache("f32", "f32", 32, 1, 16, 2, n_layer=2)
    for layer in range(2):
        for which in ("k", "v"):
            for s in range(2):
                kv.set_stream(which, layer, s, np.full((8, 32), 10 * layer + s + (which == "v") * 0.5, np.float32))
    before = {(w, layer, s): kv.get_stream(w, layer, s) for w in "kv" for layer in range(2) for s in range(2)}
    args = changed(dict(which="v", layer=1, stream=0, data=stream_data(0)), arg, value)
    names = {"which": ("which",), "layer": ("layer",), "stream": ("stream",), "data": ("data", "bytes", "dtype")}[arg]
    _, err = outcome(lambda: kv.set_stream(**args), names)
    after = {key: kv.get_stream(*key) for key in before}
    if err is not None:
        assert after == before, "a refused set_stream wrote"
        return
    key = (args["which"], args["layer"] % 2, args["stream"] % 2)
    assert after[key] == stream_data(0).tobytes()
    assert all(after[k] == before[k] for k in before if k != key)


# ---------------------------------------------------------------- attention_step

STEP_ARGS = ["sched", "backend", "windows", "q", "kv_len", "v_trans"]
STEP_NAMES = {"sched": ("sched", "Scheduler", "assign"), "backend": ("backend", "Backend"),
              "windows": ("windows", "n_kv", "stream", "window"), "q": ("q", "queries"), "kv_len": ("kv_len",),
              "v_trans": ("v_trans",)}


@st.composite
def step_change(draw: st.DrawFn) -> Tuple[bool, bool, str, Any]:
    v_trans = draw(st.booleans())
    fast = draw(st.booleans())
    arg = draw(st.sampled_from(STEP_ARGS))
    if arg == "windows":
        value = draw(st.one_of(st.tuples(st.just("windows"), ints(-1, 20), ints(-1, 2), st.none() | ints(-1, 2)),
                               st.tuples(st.just("pairs"), st.integers(0, 4)), junk()))
    elif arg in ("backend", "sched", "q", "kv_len"):
        value = draw(st.one_of(st.tuples(st.just(arg), st.integers(0, 6 if arg == "q" else 4)), junk()))
    else:
        value = draw(st.one_of(st.none(), st.booleans(), junk()))
    return v_trans, fast, arg, value


@settings(max_examples=300 * SCALE, **SETTINGS)
@given(step_change())
@example((True, False, "v_trans", False))  # a transposed cache's windows read as not transposed
@example((True, True, "v_trans", False))
@example((False, False, "windows", ("pairs", 3)))  # a str of two letters for a (K, V) pair
@example((False, True, "q", ("q", 5)))  # three tokens per stream
@example((False, False, "q", ("q", 6)))  # more tokens than cells
def test_attention_step_of_any_argument_runs_or_is_refused_naming_it_assigning_nothing(case: Tuple[bool, bool, str, Any]) -> None:
    """A step of two layers: built (and run, to the base step's bytes when only v_trans changed), or
    refused naming the argument with nothing assigned on the scheduler."""
    v_trans, fast, arg, value = case
    cpu = ferry.CPUBackend()
    kv = ferry.KVCache("f32", "f32", 16, 2, 32, 2, n_layer=2, v_trans=v_trans)
    rng = np.random.default_rng(3)
    for layer in range(2):
        for which in ("k", "v"):
            for s in range(2):
                kv.set_stream(which, layer, s, rng.uniform(-1, 1, 16 * 32).astype(np.float32))
    q = [ferry.Tensor.from_numpy(cpu, rng.uniform(-1, 1, (2, 1, 4, 16)).astype(np.float32)) for _ in range(2)]
    kv_len = ferry.Tensor.from_numpy(cpu, np.array([16, 5], np.int32))
    sched = ferry.Scheduler([cpu])
    windows: Any = kv.windows(16) if fast else [kv.window(layer, 16) for layer in range(2)]
    base: Dict[str, Any] = dict(sched=sched, backend=cpu, windows=windows, q=q, kv_len=kv_len, v_trans=None)
    want = run_step(sched, ferry.attention_step(**base))
    sched.clear_assignments()
    several_tokens = arg == "q" and value == ("q", 5)  # three tokens per stream: it must run
    if isinstance(value, tuple) and value[:1] == ("windows",):
        value, _ = outcome(lambda: kv.windows(*value[1:]), ("n_kv", "s0", "s1"))
        if value is None:
            return
    elif isinstance(value, tuple) and value[:1] == ("pairs",):
        value = [[kv.window(0, 16), kv.window(1, 16)], [kv.window(0, 16)], [kv.window(0, 16), (q[0], q[1])],
                 [kv.window(0, 16), "kv"], [kv.window(0, 8), kv.window(1, 8)]][value[1]]
    elif isinstance(value, tuple) and value[:1] == (arg,):
        value = {"backend": lambda i: [cpu, ferry.CPUBackend(), [cpu, cpu], [cpu], [cpu, "cpu"]][i],
                 "sched": lambda i: [sched, ferry.Scheduler([ferry.CPUBackend()]), "sched", cpu, None][i],
                 "q": lambda i: ([q, q[:1], q + q, [q[0], kv_len], [q[0], ferry.Tensor.from_numpy(
                     cpu, np.zeros((2, 1, 4, 16), np.float16))]] + [
                     # several tokens per stream: 3 run, 17 are more than the 16 cells
                     [ferry.Tensor.from_numpy(cpu, rng.uniform(-1, 1, (2, n, 4, 16)).astype(np.float32))
                      for _ in range(2)] for n in (3, 17)])[i],
                 "kv_len": lambda i: [kv_len, q[0], ferry.Tensor.from_numpy(cpu, np.array([1], np.int32)),
                                      ferry.Tensor.from_numpy(cpu, np.array([1.0, 2.0], np.float32)),
                                      ferry.Tensor.from_numpy(cpu, np.array([99, -3], np.int32))][i]}[arg](value[1])
    args = changed(base, arg, value)
    outs, err = outcome(lambda: ferry.attention_step(**args), STEP_NAMES[arg])
    assert err is None or not several_tokens, err
    on = args["sched"] if isinstance(args["sched"], ferry.Scheduler) else sched
    if err is not None:
        assert on.n_assigned == 0 and sched.n_assigned == 0, "a refused step assigned outputs"
        return
    if isinstance(args["windows"], KVWindows):  # its windows carry kv_len, limit n_kv: one outside is refused
        lens = np.frombuffer(args["kv_len"].get(), np.int32)
        bad = [s for s, n in enumerate(lens) if not 0 <= n <= args["windows"].n_kv]
        if bad:
            with pytest.raises(ferry.OutOfBoundsError, match=f"stream {bad[0]}'s length {lens[bad[0]]} .* is not "
                                                             f"in 0..{args['windows'].n_kv}"):
                run_step(on, outs)
            return
    got = run_step(on, outs)
    if arg == "v_trans":
        assert got == want  # the layout is the cache's whatever v_trans says, or the step is refused


def run_step(sched: ferry.Scheduler, outs: List[ferry.Tensor]) -> List[bytes]:
    graph = outs.graph
    sched.alloc(graph)
    sched.compute(graph)
    return [t.get() for t in outs]


# ---------------------------------------------------------------- ferry.residency

PLANS: Dict[str, Callable[..., Any]] = {
    "predict_step": predict_step, "choose_residency": choose_residency, "choose_auto": choose_auto,
    "choose_first": choose_first, "choose_round_robin": choose_round_robin, "choose_slowest_link": choose_slowest_link}
PLAN_NAMES = {"layers": ("layer",), "devices": ("device",), "layer_device": ("on device",), "strategy": (),
              "resident": (), "prefetch": (), "max_layers": (), "tokens_per_step": (), "remote": (), "run_seconds": (),
              "remote_tier": ("host memory",)}


def plan_base(fn: str) -> Dict[str, Any]:
    layers = [LayerCost((4096, 4096), 16384), LayerCost((1024, 1024), 4096), LayerCost((4096, 4096), 16384)]
    devices = [DeviceSpec(2.0, 5.0, 1e-3, memory=1 << 20, name="fast"), DeviceSpec(0.5, 0.0, (1e-3,) * 3)]
    # host memory for one host layer and one remote pull's staging
    tier = RemoteSpec(remote_link_model(150.0, 12.0, 2.0), host_memory=16384 + 8192)
    base: Dict[str, Any] = dict(layers=layers, devices=devices, layer_device=[0, 0, 1], prefetch=1,
                                tokens_per_step=2.77, remote_tier=tier)
    if fn == "predict_step":
        base["resident"] = [True, False, True]
        base["remote"] = [False, True, False]
        base["run_seconds"] = 2e-5
    else:
        base["max_layers"] = None
    if fn == "choose_residency":
        base["strategy"] = "auto"
    return base


@st.composite
def plan_change(draw: st.DrawFn) -> Tuple[str, str, Any]:
    fn = draw(st.sampled_from(sorted(PLANS)))
    arg = draw(st.sampled_from(sorted(plan_base(fn))))
    items = {"layers": st.sampled_from([LayerCost((1,), 0), "layer", None, DeviceSpec(1.0)]),
             "devices": st.sampled_from([DeviceSpec(1e-3, memory=0), DeviceSpec(1.0, compute_s=(1.0,)), "dev", None,
                                         LayerCost((1,), 1)]),
             "layer_device": st.one_of(ints(-1, 3), junk()), "resident": st.one_of(st.booleans(), junk()),
             "remote": st.one_of(st.booleans(), junk())}
    if arg in items:
        value = draw(st.one_of(st.lists(items[arg], max_size=4), junk()))
    elif arg == "strategy":
        value = draw(st.one_of(st.sampled_from(["auto", "first", "round-robin", "slowest-link", "AUTO"]), junk()))
    elif arg in ("tokens_per_step", "run_seconds"):
        value = draw(st.one_of(numbers(), junk()))
    elif arg == "remote_tier":
        value = draw(st.one_of(st.builds(lambda m: RemoteSpec(remote_link_model(150.0, 12.0, 2.0), host_memory=m),
                                         st.one_of(st.none(), st.integers(0, 1 << 16))), junk()))
    else:
        value = draw(st.one_of(st.none(), ints(-2, 4), junk()))
    return fn, arg, value


@settings(max_examples=600 * SCALE, **SETTINGS)
@given(plan_change())
@example(("predict_step", "resident", None))
@example(("choose_auto", "layers", None))
@example(("predict_step", "layer_device", 3))
@example(("choose_residency", "strategy", []))
@example(("predict_step", "tokens_per_step", 0.5))
@example(("choose_auto", "tokens_per_step", float("inf")))
@example(("predict_step", "remote", [True, False, False]))  # both resident and remote
@example(("choose_first", "remote_tier", None))
@example(("predict_step", "run_seconds", -1e-6))
def test_each_plan_and_prediction_of_any_argument_is_finite_or_refused_naming_it(case: Tuple[str, str, Any]) -> None:
    """Each plan and prediction of three layers on two devices, one argument changed: a plan or a
    prediction, or a refusal naming the argument (a plan that does not fit names the device)."""
    fn, arg, value = case
    args = changed(plan_base(fn), arg, value)
    result, err = outcome(lambda: PLANS[fn](**args), (arg,) + PLAN_NAMES[arg] + ("does not fit", "no layer fits"))
    if result is None:
        return
    pred = result if fn == "predict_step" else result.prediction
    assert math.isfinite(pred.step_seconds) and pred.step_seconds >= 0
    assert pred.tokens_per_step == float(args["tokens_per_step"])
    assert pred.run_seconds == float(args.get("run_seconds", 0.0))
    assert len(pred.memory) == len(args["devices"])


@settings(max_examples=300 * SCALE, **SETTINGS)
@given(st.one_of(ints(-2, 12), numbers(), junk()), st.one_of(numbers(), junk()))
@example(4, 0.7)
@example(True, 0.5)
@example(3, np.float64("nan"))
def test_expected_accepted_tokens_of_any_draft_and_acceptance_is_in_range_or_refused_naming_it(draft: Any,
                                                                                             accept: Any) -> None:
    """Expected tokens per verification of any draft and acceptance: between 1 and draft + 1, or a
    refusal naming draft or accept."""
    got, _ = outcome(lambda: expected_accepted_tokens(draft, accept), ("draft", "accept"))
    if got is not None:
        assert isinstance(got, float) and 1.0 - 1e-12 <= got <= int(draft) + 1 + 1e-12


REMOTE_FIELDS = ["link", "host_memory", "name", "host_us"]


@settings(max_examples=200 * SCALE, **SETTINGS)
@given(st.sampled_from(REMOTE_FIELDS + ["batch_us", "piece_us", "gbps"]), st.one_of(numbers(), ints(-2, 2**20), junk()))
@example("gbps", 0.0)
@example("host_memory", -1)
def test_a_remote_spec_or_link_of_any_figure_prices_a_pull_or_is_refused_naming_it(field: str, value: Any) -> None:
    """A RemoteSpec, or remote_link_model's link, with one figure changed: one predict_step prices a
    remote layer's pull by (finite, >= 0), or refused where it is made, naming the figure."""
    link = dict(batch_us=150.0, piece_us=12.0, gbps=2.0)
    if field in link:
        made, _ = outcome(lambda: RemoteSpec(remote_link_model(**changed(link, field, value))), (field,))
    else:
        made, _ = outcome(lambda: RemoteSpec(**changed(dict(link=remote_link_model(**link)), field, value)), (field,))
    if made is None:
        return
    pred = predict_step([LayerCost((4096,), 8192)] * 2, [DeviceSpec(1.0)], [True, False], remote=[False, True],
                        remote_tier=made)
    assert math.isfinite(pred.pull_seconds) and pred.pull_seconds > 0 and pred.remote_pieces == 1


SPEC_FIELDS = ["link_gbps", "latency_us", "compute_s", "memory", "reserve", "name", "token_share"]
COST_FIELDS = ["transfers", "resident_bytes", "staging_bytes", "pieces"]


@st.composite
def spec_change(draw: st.DrawFn) -> Tuple[str, str, Any]:
    cls = draw(st.sampled_from(["DeviceSpec", "LayerCost"]))
    field = draw(st.sampled_from(SPEC_FIELDS if cls == "DeviceSpec" else COST_FIELDS))
    if field in ("compute_s", "transfers"):
        value = draw(st.one_of(numbers(), st.lists(st.one_of(numbers(), ints(), junk()), max_size=4), junk()))
    elif field == "pieces":
        pair = st.one_of(st.tuples(ints(-1, 8192), ints(-1, 8192)), junk())  # ints: 2^64 and 2^63 - 1 too
        value = draw(st.one_of(st.lists(st.one_of(st.lists(pair, max_size=3), junk()), max_size=2), junk()))
    elif field in ("memory", "reserve", "resident_bytes", "staging_bytes"):
        value = draw(st.one_of(ints(-2, 2**20), numbers(), junk()))
    elif field == "name":
        value = draw(st.one_of(st.text(max_size=4), junk()))
    else:
        value = draw(st.one_of(numbers(), junk()))
    return cls, field, value


@settings(max_examples=400 * SCALE, **SETTINGS)
@given(spec_change())
@example(("DeviceSpec", "link_gbps", "fast"))  # refused where it is given, not by a TypeError inside the model
@example(("DeviceSpec", "compute_s", ()))  # no compute time for any layer
@example(("DeviceSpec", "link_gbps", 5e-324))  # a step of forever: inf, not an error
@example(("LayerCost", "pieces", [[(2**64 - 1, 1)]]))  # past what C's sizes hold
def test_a_device_spec_or_layer_cost_is_one_predict_step_takes_or_refused_naming_the_field(case: Tuple[str, str, Any]) -> None:
    """A DeviceSpec or LayerCost of any field: one predict_step takes, or refused where it is made,
    naming the field."""
    cls, field, value = case
    if cls == "DeviceSpec":
        made, _ = outcome(lambda: DeviceSpec(**changed(dict(link_gbps=1.0), field, value)), (field,))
        spec, layers = made, [LayerCost((4096,), 8192)]
        if made is not None and not isinstance(made.compute_s, float):
            layers = layers * len(made.compute_s)
    else:
        made, _ = outcome(lambda: LayerCost(**changed(dict(transfers=(4096,), resident_bytes=8192), field, value)),
                          (field,))
        spec, layers = DeviceSpec(1.0), [made]
    if made is None:
        return
    pred = predict_step(layers, [spec], [False] * len(layers))  # what was made, the model takes
    assert pred.step_seconds >= 0  # not NaN; a link of 5e-324 GB/s takes forever (inf), honestly


@settings(max_examples=12 * SCALE, **SETTINGS)
@given(st.one_of(ints(-2, 40), numbers(), junk()))
@example(1)
@example(3)
@example(33)  # past the window's 32 cells
def test_measure_token_share_of_any_token_count_is_a_share_or_refused_naming_it(n_tok: Any) -> None:
    """A token share measured on the CPU at a small geometry for any n_tok: a finite number >= 0, or a
    refusal naming n_tok."""
    got, _ = outcome(lambda: measure_token_share(ferry.CPUBackend(), n_tok, head_dim=8, n_head_kv=1, n_head=2,
                                                 n_ctx=32, n_layer=1, runs=1), ("n_tok",))
    if got is not None:
        assert isinstance(got, float) and math.isfinite(got) and got >= 0


# ---------------------------------------------------------------- StandinBackend and measure_link

STANDIN_ARGS = ["link_gbps", "latency_us", "memory", "compute_slowdown", "row_ns"]


@settings(max_examples=300 * SCALE, **SETTINGS)
@given(st.sampled_from(STANDIN_ARGS), st.one_of(numbers(), ints(), junk()))
def test_a_standin_tells_back_each_figure_it_was_given_or_refuses_naming_it(arg: str, value: Any) -> None:
    """A stand-in device of any figure: made, telling back what it was given, or refused naming it."""
    dev, _ = outcome(lambda: ferry.StandinBackend(**{arg: value}), (arg,))
    if dev is None:
        return
    told = {"link_gbps": dev.link_gbps, "latency_us": dev.latency_us, "memory": dev.memory_size,
            "compute_slowdown": dev.compute_slowdown, "row_ns": dev.row_ns}[arg]
    if value is None or value == 0:
        assert told in (None, 0.0, 1.0)
    else:
        assert told == value


LINK_ARGS = ["device", "pinned", "nbytes", "repeats", "fit"]


@st.composite
def link_change(draw: st.DrawFn) -> Tuple[str, Any]:
    arg = draw(st.sampled_from(LINK_ARGS))
    if arg == "device":
        value = draw(st.one_of(st.sampled_from(["cpu", "dummy", "closed"]), junk()))
    elif arg in ("pinned", "fit"):
        value = draw(st.one_of(st.booleans(), junk()))
    elif arg == "nbytes":
        value = draw(st.one_of(ints(-2, 1 << 16), st.sampled_from([1 << 20, (1 << 20) + 4, 2**62]), junk()))
    else:  # a valid count takes that many copies: no huge ones
        value = draw(st.one_of(st.integers(-3, 3), st.sampled_from([None, "2", 1.0, float("nan"), -(2**64)])))
    return arg, value


@settings(max_examples=200 * SCALE, **SETTINGS)
@given(link_change())
@example(("nbytes", 2**63))  # a size no buffer can have: refused naming nbytes
def test_measure_link_measures_or_refuses_naming_the_argument_copying_nothing(change: Tuple[str, Any]) -> None:
    """A link measured, or the measurement refused naming the argument, with nothing of the device's
    memory kept and nothing carried over its link."""
    arg, value = change
    dev = ferry.StandinBackend(memory=1 << 20)
    if arg == "device" and value in ("cpu", "dummy", "closed"):
        value = {"cpu": ferry.CPUBackend, "dummy": ferry.DummyBackend, "closed": ferry.StandinBackend}[value]()
        if isinstance(value, ferry.StandinBackend):
            value.close()
    args = changed(dict(device=dev, pinned=False, nbytes=8192, repeats=1, fit=False), arg, value)
    free = dev.memory().free
    got, err = outcome(lambda: ferry.measure_link(**args), (arg,) + (("backend", "Backend") if arg == "device" else ()))
    assert dev.memory().free == free
    if err is not None:
        assert dev.link_stats.bytes == 0, "a refused measurement copied"
        return
    assert got.nbytes == args["nbytes"] // 4 * 4 and len(got.times) == args["repeats"] and got.gbps > 0
    assert (got.fit is not None) is args["fit"]


# ---------------------------------------------------------------- ragged windows: set_used_cells, plan_ragged

RAGGED_NS, RAGGED_CELLS, RAGGED_NKV = 3, 16, 12
CELL_BYTES = 2 * 16 * 2  # n_head_kv x head_dim f16 values: one cell of K


def ragged_window() -> Tuple[ferry.KVCache, ferry.Tensor, ferry.Tensor]:
    """A cache of three streams, layer 0's K window of RAGGED_NKV cells, and lengths in host memory."""
    kv = ferry.KVCache("f16", "f16", 16, 2, RAGGED_NS * RAGGED_CELLS, RAGGED_NS, 1)
    lengths = ferry.Tensor.from_numpy(ferry.CPUBackend(), np.array([5, 0, 12], np.int32), name="kv_len")
    return kv, kv.window(0, RAGGED_NKV)[0], lengths


def lengths_of(i: int, cpu: ferry.Tensor) -> Any:
    """A lengths argument: the right one, one of f32, of another length, on a device, or no tensor."""
    if i == 0:
        return cpu
    if i == 1:
        return ferry.Tensor.from_numpy(ferry.CPUBackend(), np.zeros(RAGGED_NS, np.float32))
    if i == 2:
        return ferry.Tensor.from_numpy(ferry.CPUBackend(), np.zeros(RAGGED_NS + 1, np.int32))
    if i == 3:
        return ferry.Tensor.from_numpy(ferry.StandinBackend(), np.array([1, 2, 3], np.int32))
    return JUNK[i - 4]


USED_ARGS = ["lengths", "cell_dim", "stream_dim", "limit"]


@st.composite
def used_change(draw: st.DrawFn) -> Tuple[str, Any]:
    arg = draw(st.sampled_from(USED_ARGS))
    if arg == "lengths":
        return arg, ("lengths", draw(st.integers(0, 3 + len(JUNK))))
    if arg == "limit":
        return arg, draw(st.one_of(st.none(), ints(-2, 20), junk()))
    return arg, draw(st.one_of(ints(-2, 5), junk()))


@settings(max_examples=400 * SCALE, **SETTINGS)
@given(used_change())
@example(("cell_dim", 3))  # cells and streams on one dimension: refused naming both
@example(("limit", 11))  # below the window's cells
@example(("lengths", ("lengths", 3)))  # lengths on a device: taken, refused when the ragged plan reads them
def test_set_used_cells_of_any_argument_plans_each_streams_used_cells_or_is_refused_naming_it(
        change: Tuple[str, Any]) -> None:
    """A window's used cells of one argument changed: taken, and plan_ragged then copies each stream's
    first min(length, n_kv) cells and no other byte (or refuses naming where the lengths are), or
    refused naming the argument, the window as it was."""
    arg, value = change
    kv, k, lengths = ragged_window()
    if isinstance(value, tuple) and value[0] == "lengths":
        value = lengths_of(value[1], lengths)
    args = changed(dict(lengths=lengths, cell_dim=1, stream_dim=3, limit=None), arg, value)
    names = (arg,) + {"lengths": ("lengths", "i32"), "cell_dim": ("stream_dim", "dimension"),
                      "stream_dim": ("cell_dim", "dimension"), "limit": ("cells",)}[arg]
    got, err = outcome(lambda: k.set_used_cells(**args), names)
    if err is not None:
        assert k.used_cells is None, "a refused set_used_cells left used cells"
        return
    assert got is k
    if args["lengths"] is None:
        assert k.used_cells is None
        return
    assert k.used_cells is not None
    plan, perr = outcome(lambda: ferry.plan.plan_ragged(k), ("host", "cell", "length", "dimension"))
    if perr is not None:
        return
    want = sum(min(n, RAGGED_NKV) for n in lengths.to_numpy().tolist()) * CELL_BYTES
    if k.used_cells[:2] == (1, 3):
        assert sum(c.size * c.count for c in plan) == want
        for c in plan:  # every byte copied is a used cell of its stream
            for r in range(c.count):
                start = c.offset + r * c.stride
                stream, within = divmod(start, kv.k(0).nb[2])  # a stream's cells, one after another
                assert within + c.size <= min(int(lengths.to_numpy()[stream]), RAGGED_NKV) * CELL_BYTES


@st.composite
def plan_ragged_change(draw: st.DrawFn) -> Tuple[str, Any]:
    arg = draw(st.sampled_from(["tensor", "model"]))
    if arg == "tensor":
        return arg, draw(st.one_of(st.sampled_from(["window", "no used cells"]), junk()))
    return arg, draw(st.one_of(st.sampled_from(["cpu", "cuda", "CPU", "standin", "closed", "cost model"]), numbers(),
                               junk()))


@settings(max_examples=200 * SCALE, **SETTINGS)
@given(plan_ragged_change())
@example(("model", "closed"))
def test_plan_ragged_of_any_argument_is_the_used_cells_or_refused_naming_it(change: Tuple[str, Any]) -> None:
    """plan_ragged with one argument changed: the used cells' copies, or a refusal naming the argument
    (a window without used cells is refused saying so)."""
    arg, value = change
    kv, k, lengths = ragged_window()
    k.set_used_cells(lengths)
    value = {"window": k, "no used cells": kv.window(0, RAGGED_NKV)[1],
             "standin": ferry.StandinBackend(latency_us=2.0, row_ns=50.0),
             "closed": ferry.StandinBackend(), "cost model": ferry.plan.CopyCostModel.cpu()}.get(
        value, value) if isinstance(value, str) else value
    if isinstance(value, ferry.StandinBackend) and value.row_ns == 0:
        value.close()
    args = changed(dict(tensor=k, model="cpu"), arg, value)
    names = {"tensor": ("plan_ragged", "used lengths", "Tensor"), "model": ("model", "cost", "Backend", "closed")}[arg]
    got, err = outcome(lambda: ferry.plan.plan_ragged(**args), names)
    if err is None:
        assert sum(c.size * c.count for c in got) == (5 + 0 + 12) * CELL_BYTES


# ---------------------------------------------------------------- fit_link


@st.composite
def link_points(draw: st.DrawFn) -> Tuple[Tuple[float, float, float], List[Any]]:
    """A link's true (latency_us, row_ns, gbps) and the exact times of some copies over it, one of
    them perhaps changed to a drawn value."""
    latency, row, gbps = draw(st.floats(0, 50)), draw(st.floats(0, 500)), draw(st.floats(0.5, 500))
    sizes = sorted(draw(st.sets(st.integers(1 << 10, 1 << 26), min_size=2, max_size=4)))
    rows = sorted(draw(st.sets(st.integers(2, 4096), min_size=2, max_size=3)))
    pts: List[Any] = [(b, 1, latency * 1e-6 + b / (gbps * 1e9)) for b in sizes]
    pts += [(b, r, latency * 1e-6 + r * row * 1e-9 + b / (gbps * 1e9)) for b, r in zip(sizes, rows)]
    if draw(st.booleans()):
        i = draw(st.integers(0, len(pts) - 1))
        field = draw(st.integers(0, 3))
        bad = draw(st.one_of(junk(), numbers(), ints()))
        pts[i] = bad if field == 3 else tuple(bad if f == field else x for f, x in enumerate(pts[i]))
    return (latency, row, gbps), pts


@settings(max_examples=400 * SCALE, **SETTINGS)
@given(link_points())
@example(((1.0, 0.0, 8.0), [(4096, 1, 1e-6), (4096, 1, 2e-6)]))  # one size: latency and bandwidth not apart
@example(((1.0, 0.0, 8.0), [(4096, 1, 1e-6), (8192, 1, -1.0), (4096, 4, 1e-6), (4096, 8, 1e-6)]))
@example(((0.0, 0.0, 1.0), [(1024, 2**63 - 1, 1.024e-06), (1025, 1, 1.025e-06), (1026, 1, 1.026e-06),
                            (1024, 2, 1.024e-06), (1025, 3, 1.025e-06)]))  # a huge row count: columns scaled
def test_fit_link_gives_back_the_link_its_exact_times_came_from_or_refuses_naming_the_point(
        case: Tuple[Tuple[float, float, float], List[Any]]) -> None:
    """Exact times of a link's copies fit back to that link (within rounding); a point changed is
    refused naming it, or fits to figures that are finite and not below 0."""
    (latency, row, gbps), pts = case
    got, err = outcome(lambda: ferry.link.fit_link(pts), ("point", "rows", "sizes", "row counts"))
    if err is not None:
        return
    assert got.latency_us >= 0 and got.row_ns >= 0 and got.gbps > 0
    assert math.isfinite(got.latency_us) and math.isfinite(got.row_ns)
    exact = all(isinstance(p, tuple) and len(p) == 3 and
                p[2] == pytest.approx(latency * 1e-6 + (p[1] * row * 1e-9 if p[1] > 1 else 0) + p[0] / (gbps * 1e9),
                                      rel=1e-12) for p in pts)
    if exact:
        assert got.latency_us == pytest.approx(latency, rel=1e-4, abs=1e-3)
        assert got.row_ns == pytest.approx(row, rel=1e-4, abs=1e-2)
        assert got.gbps == pytest.approx(gbps, rel=1e-4)


# ---------------------------------------------------------------- named links and the piece curve


@settings(max_examples=150 * SCALE, **SETTINGS)
@given(st.one_of(st.sampled_from(ferry.backend.link_profiles() + ["h100", "", "pcie4\0"]), junk()),
       st.one_of(st.none(), numbers()))
@example("pcie4", 1e-4)  # a peak below the library's bound: refused naming it
def test_a_named_link_is_made_at_its_peak_or_refused_naming_it(name: Any, peak: Any) -> None:
    """StandinBackend(link_profile=, link_gbps=): made at the peak asked (the named link's own without
    one) with a piece curve rising to it, or refused naming the link, its peak or link_gbps."""
    dev, _ = outcome(lambda: ferry.StandinBackend(link_profile=name, link_gbps=peak),
                     ("link_profile", "link", "peak_gbps", "link_gbps"))
    if dev is None:
        return
    if name is None:  # no named link: a stand-in of link_gbps alone
        assert dev.piece_curve is None
        return
    assert name in ferry.backend.link_profiles()
    curve = dev.piece_curve
    assert dev.link_gbps is not None and curve is not None and 0 < curve[0] < dev.link_gbps
    if peak:
        assert dev.link_gbps == pytest.approx(peak, rel=1e-12)


@st.composite
def piece_points(draw: st.DrawFn) -> Tuple[bool, List[Any]]:
    """The exact times of plain copies over a curve on fit_piece_curve's grid, one perhaps changed to a
    drawn value (then the flag is False)."""
    latency, gbps = draw(st.floats(0, 50)), draw(st.floats(0.5, 500))
    floor = gbps * draw(st.floats(0.02, 0.9))
    knee, steep = 2.0 ** (draw(st.integers(40, 80)) / 4), 2.0 ** (draw(st.integers(0, 12)) / 4)
    model = ferry.plan.CopyCostModel(call_us=latency, row_ns=0.0, gbps=gbps, line_bytes=0, small_row_bytes=0,
                                     small_row_efficiency=1.0, wide_pitch_bytes=0, wide_pitch_row_ns=0.0,
                                     piece_floor_gbps=floor, piece_knee_bytes=knee, piece_steepness=steep)
    sizes = sorted(draw(st.sets(st.integers(1 << 8, 1 << 26), min_size=4, max_size=12)) |
                   {int(knee) // 8 + 1, int(knee) * 8})
    pts: List[Any] = [(b, latency * 1e-6 + model.piece_seconds(b)) for b in sizes]
    exact = not draw(st.booleans())
    if not exact:
        i = draw(st.integers(0, len(pts) - 1))
        field = draw(st.integers(0, 2))
        bad = draw(st.one_of(junk(), numbers(), ints()))
        pts[i] = bad if field == 2 else tuple(bad if f == field else x for f, x in enumerate(pts[i]))
    return exact, pts


@settings(max_examples=40 * SCALE, **SETTINGS)
@given(piece_points())
def test_fit_piece_curve_gives_back_the_times_it_came_from_or_refuses_naming_the_point(
        case: Tuple[bool, List[Any]]) -> None:
    """Exact times of a curve's copies fit back to times within 2% of them, the same curve on a second
    call; a point changed is refused naming it, or fits to figures not below 0."""
    exact, pts = case
    got, err = outcome(lambda: ferry.link.fit_piece_curve(pts), ("point", "sizes"))
    if err is not None:
        assert not exact
        return
    assert got.latency_us >= 0 and 0 < got.floor_gbps <= got.gbps and got.knee_bytes > 0 and got.steepness > 0
    assert ferry.link.fit_piece_curve(pts) == got
    if exact:
        assert [got.seconds(b) for b, _ in pts] == pytest.approx([s for _, s in pts], rel=0.02)


@st.composite
def batch_timings(draw: st.DrawFn) -> Tuple[bool, Any, Any, List[Any]]:
    """measure_remote_link's shapes for a drawn largest read and piece (perhaps junk: then the flag is
    False) and the exact times of a drawn link's batches of them, one timing perhaps changed."""
    nbytes = draw(st.one_of(st.integers(32768, 1 << 26), junk(), ints()))
    piece = draw(st.one_of(st.integers(1, 1 << 16), junk(), ints()))
    batch, per_piece, rate = draw(st.floats(0, 500e-6)), draw(st.floats(0.1e-6, 100e-6)), draw(st.floats(0.1e9, 100e9))
    shapes, err = outcome(lambda: remote_link_shapes(nbytes, piece), ("nbytes", "piece_bytes"))
    if err is not None:
        return False, nbytes, piece, []
    timings: List[Any] = [BatchTiming(b, k, (batch + k * per_piece + k * b / rate,) * 3) for b, k in shapes]
    exact = not draw(st.booleans())
    if not exact:
        i = draw(st.integers(0, len(timings) - 1))
        field = draw(st.integers(0, 3))
        bad = draw(st.one_of(junk(), numbers(), ints(), st.just(())))
        timings[i] = bad if field == 3 else timings[i]._replace(**{BatchTiming._fields[field]: bad})
    return exact, nbytes, piece, timings


@settings(max_examples=40 * SCALE, **SETTINGS)
@given(batch_timings())
@example((False, 32768, 1, [BatchTiming(1, 16, None), *[BatchTiming(b, k, (1e-3,) * 3) for b, k in
                                                         ((1, 256), (1, 1024), (16384, 2), (32768, 1))]]))
def test_fit_remote_link_gives_back_the_times_it_came_from_or_refuses_naming_the_timing(
        case: Tuple[bool, Any, Any, List[Any]]) -> None:
    """remote_link_shapes refuses a largest read or piece it cannot shape, naming it; exact times of
    a link's batches of its shapes fit back to the same times (residuals near 0, none left out); a
    timing changed is refused naming it, or fits to figures not below 0."""
    exact, _, _, timings = case
    if not timings:
        return
    got, err = outcome(lambda: fit_remote_link(timings), ("timing",))
    if err is not None:
        assert not exact
        return
    f = got.fit
    assert f.latency_us >= 0 and f.row_ns >= 0 and f.gbps > 0 and len(got.residuals) == len(timings)
    if exact:
        assert got.left_out == () and max(abs(r) for r in got.residuals) < 1e-6
        assert fit_remote_link(timings) == got


# ---------------------------------------------------------------- ferry.remote.link: time_remote_pulls, remote_pull_seconds


def pull_stats(pieces: Any = 2, nbytes: Any = 8 << 20) -> Any:
    from ferry.remote import PullStats

    return PullStats(layer=0, policy="paged", pieces=pieces, plan_pieces=2, bytes=nbytes, bytes_read=8 << 20,
                     gap_bytes=0, seconds=1e-3, predicted_seconds=0.0)


class TimedTier:
    """Stands in for a RemoteTier's timed reads (time_remote_pulls' instance check is patched to take it):
    a 4 MiB region, each read 100 us and 1 ns a byte."""

    peer = "timed:0"

    def region_bytes(self) -> int:
        return 4 << 20

    def timed_read(self, pieces: List[Tuple[int, int]]) -> float:
        return 100e-6 + sum(n for _, n in pieces) * 1e-9


#: A value of any kind for repeats, but none so large that the rounds would not end.
SMALL_JUNK = [v for v in JUNK if not (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 3)]


@settings(max_examples=40 * SCALE, **SETTINGS)
@given(arg=st.sampled_from(["tier", "pulls", "nbytes", "repeats", "piece_bytes"]), data=st.data())
@example(arg="pulls", data=None)  # a pull that returns no PullStats
def test_time_remote_pulls_of_any_argument_times_the_rounds_or_is_refused_naming_it(arg: str, data: Any) -> None:
    """time_remote_pulls from a call that succeeds, one argument drawn: every shape and pull is timed
    once a round, or the call is refused naming that argument (a pull by its index)."""
    from unittest import mock

    import ferry.remote.link as remote_link

    tier = TimedTier()
    if data is None:
        value: Any = [lambda: pull_stats(), lambda: "not stats"]
    elif arg == "repeats":
        value = data.draw(st.one_of(st.sampled_from(SMALL_JUNK), st.integers(-2, 3)))
    elif arg == "pulls":
        value = data.draw(st.one_of(junk(), st.lists(st.one_of(junk(), st.just(lambda: pull_stats()),
                                                               st.just(lambda: None)), max_size=3)))
    elif arg == "tier":
        value = data.draw(st.one_of(junk(), st.just(tier)))
    else:
        value = data.draw(st.one_of(junk(), ints(), st.integers(32768, 8 << 20), st.integers(1, 1 << 20)))
    base = dict(tier=tier, pulls=[lambda: pull_stats()], nbytes=0, repeats=1, piece_bytes=4096)
    with mock.patch.object(remote_link, "RemoteTier", TimedTier):
        got, err = outcome(lambda: remote_link.time_remote_pulls(**changed(base, arg, value)), (arg,))
    if err is None:
        reps = changed(base, arg, value)["repeats"]
        assert all(len(t.seconds) == reps for t in got.timings) and all(len(p) == reps for p in got.pulls)
        assert len(got.pulls) == len(changed(base, arg, value)["pulls"])


@settings(max_examples=40 * SCALE, **SETTINGS)
@given(arg=st.sampled_from(["fit", "stats"]), field=st.sampled_from([None, 0, 1, 2]),
       value=st.one_of(junk(), numbers(), ints()))
@example(arg="fit", field=2, value=0.0)  # a rate of 0
@example(arg="fit", field=0, value=np.float32(2.5))  # a numpy number: priced as the float it is
def test_remote_pull_seconds_of_any_fit_or_stats_prices_the_pull_or_is_refused_naming_it(
        arg: str, field: Optional[int], value: Any) -> None:
    """remote_pull_seconds of a fit and a pull's stats, one of them drawn whole (field None) or one of
    its figures drawn (the fit's latency_us, row_ns, gbps; the stats' pieces, bytes): a price not below
    the fit's batch cost, or a refusal naming fit or stats."""
    from ferry.link import LinkFit

    fit = LinkFit(latency_us=150.0, row_ns=20_000.0, gbps=1.2, points=())
    stats = pull_stats()
    if arg == "fit":
        fit = value if field is None else fit._replace(**{LinkFit._fields[field]: value})
    elif field is None:
        stats = value
    elif field < 2:
        stats = pull_stats(**{("pieces", "nbytes")[field]: value})
    got, err = outcome(lambda: remote_pull_seconds(fit, stats), (arg,))
    if err is None:  # a rate drawn near 0 may price the bytes at inf: still a price, not NaN
        assert not math.isnan(got) and got >= fit.latency_us * 1e-6


# ---------------------------------------------------------------- Scheduler.trace


@settings(max_examples=60 * SCALE, **SETTINGS)
@given(st.sampled_from(["flat", "ranges", "plan", "ragged"]), st.integers(0, 4), st.integers(1, 4),
       st.sampled_from([0.0, 1.0, 8.0]))
def test_the_trace_of_any_run_computes_each_layer_once_in_order_after_its_copies(
        policy: str, prefetch: int, n_layer: int, link_gbps: float) -> None:
    """Scheduler.trace after a step of any policy, depth, layer count and link: each layer's compute
    once, in order, after its own copies; every input copied once (on the queue when prefetched, but
    the first layer's K); each span inside the run; empty before a run and refused once closed."""
    split = ferry.StandinBackend(link_gbps=link_gbps)
    kv = ferry.KVCache("f16", "f16", 16, 2, 2 * 32, 2, n_layer)
    rng = np.random.default_rng(3)
    q = [ferry.Tensor.from_numpy(split, rng.uniform(-1, 1, (2, 1, 4, 16)).astype(np.float32)) for _ in range(n_layer)]
    kv_len = ferry.Tensor.from_numpy(ferry.CPUBackend(), np.array([20, 7], np.int32))
    with ferry.Scheduler([split, ferry.CPUBackend()], policy=policy, prefetch=prefetch) as sched:
        assert sched.trace() == []
        outs = ferry.attention_step(sched, split, kv.windows(24), q, kv_len)
        sched.compute(outs.graph)
        spans = sched.trace()
        inputs = sched.inputs
    computes = [sp for sp in spans if sp.kind == "compute"]
    assert [sp.part for sp in computes] == list(range(n_layer))
    assert all(a.end <= b.start for a, b in zip(computes, computes[1:]))
    copies = [sp for sp in spans if "copy" in sp.kind]
    assert sorted(sp.input for sp in copies) == list(range(len(inputs)))
    for sp in copies:
        assert sp.end <= computes[sp.part].start + 1e-6
    queued = [sp for sp in copies if sp.kind == "queued copy"]
    assert len(queued) == (2 * n_layer - 1 if prefetch and n_layer else 0)
    assert all(0 <= sp.start <= sp.end for sp in spans)
    with pytest.raises(ferry.FerryError, match="closed"):
        sched.trace()


# ---------------------------------------------------------------- Scheduler(prefetch_next=)


@settings(max_examples=40 * SCALE, **SETTINGS)
@given(st.one_of(st.integers(1, 4), st.integers(0, 4), junk()), st.one_of(st.just(True), st.booleans(), junk()),
       st.integers(1, 4),
       st.sampled_from(["flat", "ranges", "plan", "ragged"]), st.lists(st.integers(-3, 2), min_size=2, max_size=2))
def test_prefetch_next_of_any_argument_reads_what_each_step_appended_or_is_refused_naming_it(
        prefetch: Any, prefetch_next: Any, n_layer: int, policy: str, grow: List[int]) -> None:
    """Scheduler(prefetch=, prefetch_next=) of any value: refused naming the argument (prefetch_next
    with a prefetch of 0 too), or a decode loop of four steps, each appending to or cutting back each
    stream (new cells written before the step), whose outputs are a serial scheduler's at every step;
    drop_ahead() any time, and refused once closed. A refused setter leaves the value as it was."""
    split, cpu = ferry.StandinBackend(link_gbps=0.0), ferry.CPUBackend()
    kv = ferry.KVCache("f16", "f16", 16, 2, 2 * 32, 2, n_layer)
    rng = np.random.default_rng(7)
    cells = {(w, layer, s): rng.uniform(-1, 1, (32, 32)).astype(np.float16)
             for w in "kv" for layer in range(n_layer) for s in range(2)}
    for (w, layer, s), a in cells.items():
        kv.set_stream(w, layer, s, a)
    q = [ferry.Tensor.from_numpy(split, rng.uniform(-1, 1, (2, 1, 4, 16)).astype(np.float32)) for _ in range(n_layer)]
    lens = np.array([20, 7], np.int32)
    kv_len = ferry.Tensor.from_numpy(cpu, lens)
    sched, err = outcome(lambda: ferry.Scheduler([split, cpu], policy=policy, prefetch=prefetch,
                                                 prefetch_next=prefetch_next), ["prefetch", "prefetch_next"])
    valid = (isinstance(prefetch, int) and not isinstance(prefetch, bool) and 0 <= prefetch < 2**31
             and isinstance(prefetch_next, bool) and not (prefetch_next and prefetch == 0))
    assert (err is None) == valid, (prefetch, prefetch_next, err)
    event(f"runs: {valid}, across runs: {prefetch_next is True}")
    if err is not None:
        return
    with sched, ferry.Scheduler([split, cpu], policy=policy) as serial:
        assert sched.prefetch_next == prefetch_next
        _, e = outcome(lambda: setattr(sched, "prefetch_next", "yes"), ["prefetch_next"])
        assert e is not None and sched.prefetch_next == prefetch_next
        outs = ferry.attention_step(sched, split, kv.windows(24), q, kv_len)
        ref = ferry.attention_step(serial, split, kv.windows(24), q, kv_len)
        for step in range(4):
            if step:
                for s in range(2):
                    new = int(min(max(lens[s] + grow[s], 0), 24))
                    for w in "kv":
                        for layer in range(n_layer):
                            a = cells[(w, layer, s)]
                            a[lens[s]:new] = rng.uniform(-1, 1, (max(new - lens[s], 0), 32)).astype(np.float16)
                            kv.set_stream(w, layer, s, a)
                    lens[s] = new
                kv_len.set(lens)
            sched.compute(outs.graph)
            serial.compute(ref.graph)
            assert [o.get() for o in outs] == [o.get() for o in ref], (step, lens)
            if step == 2:
                sched.drop_ahead()
    with pytest.raises(ferry.FerryError, match="closed"):
        sched.drop_ahead()


@settings(max_examples=40 * SCALE, **SETTINGS)
@given(st.one_of(ints(-2, 3), junk()), st.one_of(ints(-2, 24), junk()), st.booleans())
@example(1, 8, True)
@example(0, 21, True)
@example(2, 0, True)
def test_truncate_of_any_argument_keeps_the_cells_below_it_or_is_refused_naming_it(
        stream: Any, length: Any, ahead: bool) -> None:
    """Scheduler.truncate(stream, length) of any value, after a run that copied ahead (ahead) or with
    nothing ahead: refused naming the stream or the length, the next step then copying what it would
    have; or accepted, the next step (a cell appended to every stream, the truncated one's written
    from length on) giving the serial outputs, and its first layer copying, beyond the copy ahead, the
    new cells since each stream's kept length. Refused once closed."""
    split, cpu = ferry.StandinBackend(link_gbps=0.0), ferry.CPUBackend()
    kv = ferry.KVCache("f16", "f16", 16, 2, 2 * 32, 2, 2)
    rng = np.random.default_rng(3)
    cells = {(w, layer, s): rng.uniform(-1, 1, (32, 32)).astype(np.float16)
             for w in "kv" for layer in range(2) for s in range(2)}
    for (w, layer, s), a in cells.items():
        kv.set_stream(w, layer, s, a)
    q = [ferry.Tensor.from_numpy(split, rng.uniform(-1, 1, (2, 1, 4, 16)).astype(np.float32)) for _ in range(2)]
    lens = np.array([20, 7], np.int32)
    kv_len = ferry.Tensor.from_numpy(cpu, lens)
    with ferry.Scheduler([split, cpu], policy="ragged", prefetch=1, prefetch_next=True) as sched, \
            ferry.Scheduler([split, cpu], policy="ragged") as serial:
        outs = ferry.attention_step(sched, split, kv.windows(24), q, kv_len)
        ref = ferry.attention_step(serial, split, kv.windows(24), q, kv_len)
        if ahead:
            sched.compute(outs.graph)
        _, err = outcome(lambda: sched.truncate(stream, length), ["stream", "length"])
        valid = (all(isinstance(x, int) and not isinstance(x, bool) for x in (stream, length))
                 and (not ahead or (0 <= stream < 2 and 0 <= length <= lens[stream]))
                 and length >= 0 and stream >= 0 and stream < 2**63 and length < 2**63)
        assert (err is None) == valid, (stream, length, ahead, err)
        kept = [int(n) for n in lens]
        if err is None and ahead:
            kept[stream] = length
        for s in range(2):  # a cell appended to each stream, from its kept length
            for w in "kv":
                for layer in range(2):
                    cells[(w, layer, s)][kept[s]:kept[s] + 1] = rng.uniform(-1, 1, (1, 32)).astype(np.float16)
                    kv.set_stream(w, layer, s, cells[(w, layer, s)])
            lens[s] = kept[s] + 1
        kv_len.set(lens)
        read_before = [i.stats.bytes_read for i in sched.inputs[:2]]
        sched.compute(outs.graph)
        serial.compute(ref.graph)
        assert [o.get() for o in outs] == [o.get() for o in ref]
        if ahead:  # beyond the copy ahead, the cells since each kept length (16 x 2 f16 values a cell)
            since = [i.stats.bytes_copied - b for i, b in zip(sched.inputs[:2], read_before)]
            assert since == [64 * sum(int(lens[s]) - kept[s] for s in range(2))] * 2, (stream, length, since)
    with pytest.raises(ferry.FerryError, match="closed"):
        sched.truncate(0, 0)


# ---------------------------------------------------------------- ops.attn_paged, PagedKVCache.table_tensor

PAGED_ARGS = ["q", "k_pool", "v_pool", "table", "kv_len", "block_size", "scale", "v_trans"]


def paged_operands(cpu: ferry.Backend) -> Tuple[Any, Dict[str, Any]]:
    """A paged cache (f16, 2 kv heads of 16, 6 slots of 4 cells) and attn_paged's arguments over it:
    2 streams of lengths 9 and 4, 4 query heads."""
    cache = PagedKVCache("f16", "f16", 16, 2, block_size=4, n_blocks=6, n_seq=2)
    rng = np.random.default_rng(5)
    for w in (cache.k(0), cache.v(0)):
        w.set(rng.uniform(-1, 1, (24, 32)).astype(np.float16))
    cache.set_table(0, [4, 0, 2], 9)
    cache.set_table(1, [5], 4)
    return cache, {"q": ferry.Tensor.from_numpy(cpu, rng.uniform(-1, 1, (2, 1, 4, 16)).astype(np.float32)),
                   "k_pool": cache.k(0), "v_pool": cache.v(0), "table": cache.table_tensor(cpu),
                   "kv_len": ferry.Tensor.from_numpy(cpu, np.array([9, 4], np.int32)), "block_size": 4,
                   "scale": 0.25, "v_trans": False}


@st.composite
def paged_change(draw: st.DrawFn) -> Tuple[str, Any]:
    arg = draw(st.sampled_from(PAGED_ARGS))
    if arg in ("block_size",):
        return arg, draw(st.one_of(ints(-2, 9), junk()))
    if arg == "scale":
        return arg, draw(st.one_of(numbers(), junk()))
    if arg == "v_trans":
        return arg, draw(st.one_of(st.booleans(), junk()))
    if arg == "table":  # entries in and out of the pools' slots, or of another shape or type
        shape = draw(st.sampled_from([(2, 3), (2, 1), (3, 3), (2, 4)]))
        dtype = draw(st.sampled_from([np.int32, np.int32, np.float32]))
        return arg, ("array", np.array(draw(st.lists(st.integers(-2, 7), min_size=shape[0] * shape[1],
                                                     max_size=shape[0] * shape[1])), dtype).reshape(shape))
    if arg == "kv_len":
        return arg, ("array", np.array(draw(st.lists(st.integers(-2, 14), min_size=1, max_size=3)), np.int32))
    return arg, draw(st.one_of(junk(), st.sampled_from([("array", np.zeros((2, 1, 4, 16), np.float32)),
                                                       ("array", np.zeros((24, 32), np.float32)),
                                                       ("array", np.zeros((24, 16), np.float16)),
                                                       ("array", np.zeros((32, 24), np.float16))])))


@settings(max_examples=60 * SCALE, **SETTINGS)
@given(paged_change())
@example(("table", ("array", np.array([[4, 0, 7], [5, -1, -1]], np.int32))))  # a read entry past the slots
@example(("table", ("array", np.array([[4, 0, 2], [5, 7, -2]], np.int32))))  # entries no length reaches
@example(("kv_len", ("array", np.array([14, -2], np.int32))))  # clamped to the table's 12 cells, and to 0
@example(("block_size", 3))  # 24 cells in 8 slots of 3: another reading of the same pools
@example(("scale", 1.6872138943520161e+38))  # scores past f32 (tools/fuzz): once inf - inf, NaN out
def test_attn_paged_of_any_argument_computes_or_is_refused_naming_it_writing_nothing(change: Tuple[str, Any]) -> None:
    """ops.attn_paged with one argument drawn: refused naming it (when built, or when computed, the
    output then as it was), or computed to finite values."""
    cpu = ferry.CPUBackend()
    _, args = paged_operands(cpu)
    arg, value = change
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "array":
        value = ferry.Tensor.from_numpy(cpu, value[1])
    args = changed(args, arg, value)
    names = [arg] + (["slot", "table"] if arg in ("table", "kv_len", "block_size") else []) + \
        (["length", "stream", "kv_len"] if arg in ("kv_len", "q") else [])
    out, err = outcome(lambda: ferry.ops.attn_paged(**args), names)
    if err is not None:
        return
    out.set_output()
    graph = ferry.Graph(out)
    ferry.GraphAllocator(cpu).alloc(graph)
    out.set(np.full(out.ne[::-1], 42.0, np.float32))
    _, err = outcome(lambda: graph.compute(cpu), names)
    values = out.to_numpy()
    assert (values == 42.0).all() if err is not None else np.isfinite(values).all()


@settings(max_examples=40 * SCALE, **SETTINGS)
@given(st.sampled_from(["s0", "s1", "max_blocks", "backend", "name"]),
       st.one_of(ints(-2, 5), junk(), st.just("table")))
def test_table_tensor_of_any_argument_is_the_tables_or_refused_naming_it(arg: str, value: Any) -> None:
    """PagedKVCache.table_tensor with one argument drawn: refused naming it, or each row the table of
    its sequence (table), -1 after."""
    cpu = ferry.CPUBackend()
    cache, _ = paged_operands(cpu)
    kwargs: Dict[str, Any] = {"backend": cpu}
    kwargs[arg] = value
    t, err = outcome(lambda: cache.table_tensor(**kwargs), [arg, "sequences"])
    if err is None:
        s0 = kwargs.get("s0", 0)
        rows = t.to_numpy().reshape(t.ne[1], t.ne[0]).tolist()
        assert [r[:len(cache.table(s0 + i)[0])] for i, r in enumerate(rows)] == \
            [cache.table(s0 + i)[0] for i in range(len(rows))]
        assert all(x == -1 for i, r in enumerate(rows) for x in r[len(cache.table(s0 + i)[0]):])


# ---------------------------------------------------------------- the backends' documentation


@pytest.mark.parametrize("cls", [ferry.CPUBackend, ferry.StandinBackend, ferry.DummyBackend, ferry.CUDABackend])
def test_a_backend_constructor_documents_its_parameters(cls: type) -> None:
    """help(StandinBackend.__init__) tells a user what to pass: each parameter, and what is raised; not
    the base class's internal constructor."""
    import inspect

    doc = inspect.getdoc(cls.__init__) or ""
    assert not doc.startswith("Internal"), doc
    params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    for p in params:
        assert f"{p} :" in doc, (cls.__name__, p)
    assert "Raises\n------" in doc


# ---------------------------------------------------------------- BlockPool

POOL_ARGS = ["n_slots", "s0", "s1", "lengths", "truncate_seq", "truncate_length", "resident", "n_resident", "ahead"]
POOL_NAMES = {"n_slots": ("n_slots",), "s0": ("s0", "sequences"), "s1": ("s1", "sequences"),
              "lengths": ("lengths", "length"), "truncate_seq": ("seq", "sequences"),
              "truncate_length": ("length",), "resident": ("block",), "n_resident": ("n_resident",),
              "ahead": ("ahead",)}


@st.composite
def pool_change(draw: st.DrawFn) -> Tuple[str, Any]:
    arg = draw(st.sampled_from(POOL_ARGS))
    if arg in ("lengths", "resident"):
        value = draw(st.one_of(st.lists(st.one_of(ints(-2, 12), junk()), max_size=4), junk()))
    elif arg == "ahead":
        value = draw(st.one_of(st.booleans(), ints(-2, 2), junk()))
    else:
        value = draw(st.one_of(ints(-2, 12), junk()))
    return arg, value


@settings(max_examples=300 * SCALE, **SETTINGS)
@given(pool_change())
@example(("lengths", [3, 12]))  # sequence 1 holds 11 cells
@example(("resident", [1, 1]))
@example(("ahead", True))
@example(("truncate_seq", 2**63 - 1))  # found under UBSan: seq + 1 overflowed in the range check
def test_a_block_pool_of_any_argument_reads_the_caches_cells_or_is_refused_naming_it_sending_nothing(
        change: Tuple[str, Any]) -> None:
    """BlockPool(n_slots), set_prefetch(ahead) (then wait), sync(s0, s1, lengths), truncate, set_resident,
    choose_resident and plan of any value: refused naming the argument with nothing sent (the pool's counters and table as they were),
    or every cell synced reads the cache's through the device table."""
    arg, value = change
    c = PagedKVCache("f16", "f16", 16, 1, block_size=4, n_blocks=8, n_seq=2, share_blocks=True)
    c.k(0).set(np.arange(c.k(0).nbytes // 2, dtype=np.uint16).tobytes())
    c.set_table(0, [0, 1], 6)
    c.set_table(1, [0, 1, 2], 11)
    args = changed(dict(n_slots=4, s0=0, s1=2, lengths=None, truncate_seq=1, truncate_length=5, resident=[0],
                        n_resident=2, ahead=False), arg, value)
    pool, err = outcome(lambda: BlockPool(c, ferry.StandinBackend(), args["n_slots"]), POOL_NAMES["n_slots"])
    if err is not None:
        return
    with pool:
        if arg == "n_slots":
            assert pool.n_slots == value
            return
        calls = [(("ahead",), lambda: pool.set_prefetch(args["ahead"])),
                 (("truncate_seq", "truncate_length"), lambda: pool.truncate(args["truncate_seq"],
                                                                          args["truncate_length"])),
                 (("resident",), lambda: pool.set_resident(args["resident"])),
                 (("n_resident", "s0", "s1", "lengths"),
                  lambda: pool.choose_resident(args["n_resident"], args["s0"], args["s1"], args["lengths"])),
                 (("s0", "s1", "lengths"), lambda: pool.plan(args["s0"], args["s1"], args["lengths"])),
                 (("s0", "s1", "lengths", "resident"), lambda: pool.sync(args["s0"], args["s1"], args["lengths"]))]
        for used, call in calls:
            before = pool.stats
            names = tuple(n for u in used for n in POOL_NAMES[u]) if arg in used else ("\0never",)
            _, err = outcome(call, names)
            if err is not None:
                assert pool.stats == before, "a refused call sent"
                assert (pool.table.to_numpy() == 0).all()
                return
        pool.wait()
        s0, s1 = args["s0"], 2 if args["s1"] is None else args["s1"]  # None: every sequence
        lengths = args["lengths"] if args["lengths"] is not None else [c.table(s)[1] for s in range(s0, s1)]
        table = pool.table.to_numpy()
        host = np.frombuffer(c.k(0).get(), np.uint16).reshape(-1, 16)
        dev = np.frombuffer(pool.k(0).get(), np.uint16).reshape(-1, 16)
        for s, n in zip(range(s0, s1), lengths):
            blocks = c.table(s)[0]
            for cell in range(int(n)):
                assert (dev[table[s, cell // 4] * 4 + cell % 4] == host[blocks[cell // 4] * 4 + cell % 4]).all()


POOL_STEP_NAMES = {"sched": ("sched", "Scheduler", "scheduler"), "q": ("q", "layers", "Tensor"),
                   "kv_len": ("kv_len",), "s0": ("s0", "sequences", "q"), "s1": ("s1", "sequences", "q")}


@settings(max_examples=120 * SCALE, **SETTINGS)
@given(st.sampled_from(sorted(POOL_STEP_NAMES)), st.one_of(ints(-2, 4), junk()))
@example("s0", 1)  # q of 2 sequences for 1
def test_a_block_pool_step_of_any_argument_is_the_dense_gathers_or_refused_naming_it_assigning_nothing(
        arg: str, value: Any) -> None:
    """BlockPool.attention_step of any value: refused naming the argument, the scheduler's assignments
    as they were; or, once synced, the dense gather's outputs byte for byte."""
    c = PagedKVCache("f16", "f16", 16, 1, block_size=4, n_blocks=8, n_seq=2, share_blocks=True)
    rng = np.random.default_rng(2)
    for t in (c.k(0), c.v(0)):
        t.set(rng.uniform(-1, 1, t.nbytes // 2).astype(np.float16).tobytes())
    c.set_table(0, [0, 1], 6)
    c.set_table(1, [0, 2], 7)
    dev, cpu = ferry.StandinBackend(), ferry.CPUBackend()
    q = [ferry.Tensor.from_numpy(dev, rng.uniform(-1, 1, (2, 1, 2, 16)).astype(np.float32))]
    kv_len = ferry.Tensor.from_numpy(cpu, np.array([6, 7], np.int32))
    with BlockPool(c, dev, 4) as pool, ferry.Scheduler([dev, cpu]) as sched, \
            ferry.Scheduler([dev, cpu], policy="ragged") as dense:
        args = changed(dict(sched=sched, q=q, kv_len=kv_len, s0=0, s1=2), arg, value)
        outs, err = outcome(lambda: pool.attention_step(**args), POOL_STEP_NAMES[arg])
        if err is not None:
            assert not sched._assigned, "a refused step assigned"
            return
        ref = ferry.attention_step(dense, dev, c.windows(8), q, kv_len)
        dense.compute(ref.graph)
        pool.sync(lengths=[6, 7])
        sched.compute(outs.graph)
        assert [o.get() for o in outs] == [r.get() for r in ref]


# ---------------------------------------------------------------- a plan's pieces: copy_pieces, gather_pieces, merge_pieces


@st.composite
def pieces_change(draw: st.DrawFn) -> Tuple[str, List[Any], Any]:
    """Which of the three, its rows (sorted, disjoint pieces; one row or one field perhaps a drawn value),
    and the model."""
    which = draw(st.sampled_from(["copy_pieces", "gather_pieces", "merge_pieces"]))
    width = {"copy_pieces": 4, "gather_pieces": 6, "merge_pieces": 3}[which]
    rows: List[Any] = []
    at = 0
    for _ in range(draw(st.integers(0, 5))):
        at += draw(st.integers(0, 5000))
        size, count = draw(st.integers(1, 64)), draw(st.integers(1, 4))
        rows.append({"copy_pieces": (at, size, count, size + 7), "gather_pieces": (at, at // 2, size, count, size + 9,
                                                                                   size),
                     "merge_pieces": (at, at, size)}[which])
        at += (size + 9) * count
    if rows and draw(st.booleans()):
        i, f = draw(st.integers(0, len(rows) - 1)), draw(st.integers(0, width))
        bad = draw(st.one_of(junk(), ints()))
        rows[i] = bad if f == width else tuple(bad if j == f else x for j, x in enumerate(rows[i]))
    model = draw(st.one_of(st.just("cpu"), st.sampled_from(["gpu", "tpu"]), junk()))
    return which, rows, model


@settings(max_examples=100 * SCALE, **SETTINGS)
@given(pieces_change())
@example(("copy_pieces", [(2**64 - 8, 4, 2, 4)], "cpu"))
@example(("copy_pieces", [(0, 46, 2**31, 53)], "cpu"))  # found: 2^31 pieces were listed, and memory ran out
def test_pieces_of_any_rows_are_their_bytes_or_refused_naming_the_row(change: Tuple[str, List[Any], Any]) -> None:
    """copy_pieces, gather_pieces and merge_pieces with a row, a field or the model drawn: the pieces
    (a piece per row, the same bytes; merged, every byte of the rows still covered and the gap bytes
    counted), or a refusal naming the row, the piece or the model."""
    which, rows, model = change
    call: Callable[[], Any] = {"copy_pieces": lambda: ferry.plan.copy_pieces(rows),
                               "gather_pieces": lambda: ferry.plan.gather_pieces(rows),
                               "merge_pieces": lambda: ferry.plan.merge_pieces(rows, model)}[which]
    got, err = outcome(call, (which, "copy", "piece", "model", "cost model"))
    if err is not None:
        return
    if which == "merge_pieces":
        pieces, gaps = got
        assert sum(p.size for p in pieces) == sum(r[2] for r in rows) + gaps
        for src, _, size in rows:
            assert any(p.src_offset <= src and src + size <= p.src_offset + p.size for p in pieces)
    else:
        counts = [r[2] if which == "copy_pieces" else r[3] for r in rows]  # (offset, size, count, stride)
        sizes = [r[1] if which == "copy_pieces" else r[2] for r in rows]
        assert len(got) == sum(counts) and sum(p.size for p in got) == sum(c * s for c, s in zip(counts, sizes))


# ---------------------------------------------------------------- ferry.remote.server: a peer's published layout


@settings(max_examples=200 * SCALE, **SETTINGS)
@given(where=st.sampled_from(["whole", "cache", "params", "regions", "region 0", "n_stream", "type_k", "v_trans"]),
       value=st.sampled_from(JUNK))
def test_a_peers_layout_agrees_only_when_equal_and_any_other_is_said(where: str, value: Any) -> None:
    """What a peer publishes is read from the network: any value where a layout's part should be is
    said as a difference ("X at the peer, Y here"), never raised; only an equal layout agrees. A
    cache_layout of anything but a cache is refused naming the cache."""
    from ferry.remote.server import cache_layout, layout_differences

    mine = cache_layout(ferry.KVCache("f16", "f16", 8, 1, 16, 2, 2))
    assert layout_differences(copy.deepcopy(mine), mine) == []
    peer: Any = copy.deepcopy(mine)
    if where == "whole":
        peer = value
    elif where in ("cache", "params", "regions"):
        peer[where] = value
    elif where == "region 0":
        peer["regions"][0] = value
    else:
        peer["params"][where] = value
    got = layout_differences(peer, mine)
    assert (got == []) == (peer == mine), got
    assert all(" at the peer" in line and line.endswith(" here") for line in got), got
    _, err = outcome(lambda: cache_layout(value), ("cache",))
    assert err is not None


# ---------------------------------------------------------------- ferry.remote: RemoteTier.pull and pull_async


@pytest.fixture(scope="module")
def pulled() -> Iterator[Tuple[Any, ferry.KVCache, ferry.Tensor]]:
    """A tier (its server on the loopback) over a small cache, the cache it pulls into, and lengths."""
    from ferry.remote import RemoteTier, engine_missing

    if engine_missing() is not None:
        pytest.skip(f"no transfer engine: {engine_missing()}")
    local = ferry.KVCache("f16", "f16", 8, 1, 64, 2, 2)
    for layer in range(2):
        for t in (local.k(layer), local.v(layer)):
            t.set(bytes(range(256)) * (t.nbytes // 256))
    lens = ferry.Tensor.from_numpy(ferry.CPUBackend(), np.array([5, 17], np.int32), name="lens")
    with RemoteTier(local) as tier:
        yield tier, local, lens


@settings(max_examples=60 * SCALE, **SETTINGS)
@given(arg=st.sampled_from(["layer", "n_kv", "policy", "lengths", "s0", "s1", "merge"]),
       value=st.one_of(junk(), ints(-2, 40), st.sampled_from(["flat", "ranges", "plan", "ragged", "x"])),
       issue=st.sampled_from(["pull", "pull_async"]))
@example(arg="layer", value=2, issue="pull_async")  # a layer past the cache's
def test_a_pull_or_an_async_pull_of_any_argument_runs_or_is_refused_naming_it_writing_nothing(
        pulled: Tuple[Any, ferry.KVCache, ferry.Tensor], arg: str, value: Any, issue: str) -> None:
    """RemoteTier.pull and pull_async from a call that succeeds, one argument drawn: the pull lands,
    or is refused before any read naming that argument, the local cache's bytes as they were."""
    tier, local, lens = pulled
    base = dict(layer=1, n_kv=24, policy="ragged", lengths=lens, s0=0, s1=None, merge=True)
    before = [bytes(t.get()) for layer in range(2) for t in (local.k(layer), local.v(layer))]

    def call() -> Any:
        if issue == "pull":
            return tier.pull(**changed(base, arg, value))
        return tier.pull_async(**changed(base, arg, value)).wait()

    # an n_kv below the lengths is refused naming the length it does not hold
    names = {"n_kv": ("n_kv", "length"), "lengths": ("lengths", "length"), "s0": ("s0", "sequences", "stream"),
             "s1": ("s1", "sequences", "stream")}.get(arg, (arg,))
    got, err = outcome(call, names)
    if err is not None:
        assert [bytes(t.get()) for layer in range(2) for t in (local.k(layer), local.v(layer))] == before
    else:
        k, v, st_ = got
        assert st_.bytes == st_.bytes_read + st_.gap_bytes


# ---------------------------------------------------------------- ferry.fetch.set_fetch and RemoteTier.fetch_layers


class _Landing:
    """A fetcher that lands nothing (the property is about the arguments)."""

    def begin(self, window: ferry.Tensor, policy: Any) -> int:
        return 1

    def wait(self, ticket: int) -> None:
        return None


@settings(max_examples=40 * SCALE, **SETTINGS)
@given(tensor=st.sampled_from(["layer", "window", "loose", "device", "junk"]),
       fetcher=st.one_of(junk(), st.sampled_from(["landing", None])))
@example(tensor="window", fetcher="landing")  # a view: set it on the tensor owning the memory
def test_set_fetch_of_any_argument_is_set_or_refused_naming_it_setting_nothing(tensor: str, fetcher: Any) -> None:
    """ferry.fetch.set_fetch from a call that succeeds (a layer's K, a fetcher), one argument drawn:
    it is set (a run of the layer's window then calls the fetcher), or refused naming the tensor or
    the fetcher with nothing set (C's struct keeps no fetch)."""
    from ferry.fetch import set_fetch

    kv = ferry.KVCache("f16", "f16", 8, 1, 64, 2, 1)
    dev = ferry.StandinBackend()
    on_device = ferry.Tensor.new("f32", [4])
    dev.alloc_buffer_for(on_device)
    t = {"layer": kv.k(0), "window": kv.window(0, 8)[0], "loose": ferry.Tensor.new("f32", [4]),
         "device": on_device, "junk": 3}[tensor]
    f = _Landing() if fetcher == "landing" else fetcher
    _, err = outcome(lambda: set_fetch(t, f), ("tensor", "fetcher", "set_fetch"))
    if isinstance(t, ferry.Tensor):
        assert (t._p.fetch != ferry._binding.ffi.NULL) == (err is None and f is not None)
        set_fetch(t, None) if err is None else None


@settings(max_examples=40 * SCALE, **SETTINGS)
@given(arg=st.sampled_from(["layers", "merge"]),
       value=st.one_of(junk(), ints(-2, 3), st.lists(ints(-2, 3), max_size=3)))
@example(arg="layers", value=[0, 2])  # a layer past the cache's two
@example(arg="layers", value=3)  # not a sequence (found: it raised TypeError)
def test_fetch_layers_of_any_argument_hands_the_layers_to_the_scheduler_or_is_refused_naming_it(
        pulled: Tuple[Any, ferry.KVCache, ferry.Tensor], arg: str, value: Any) -> None:
    """RemoteTier.fetch_layers from a call that succeeds (every layer, merged), one argument drawn:
    the layers given are the tier's fetching ones (each K and V with a fetch), or it is refused
    naming that argument with the layers fetched before unchanged."""
    tier, local, _ = pulled
    tier.fetch_layers([1])
    _, err = outcome(lambda: tier.fetch_layers(**changed(dict(layers=None, merge=True), arg, value)), (arg,))
    if err is not None:
        assert tier.fetching == (1,)
    else:
        layers = value if arg == "layers" and value is not None else [0, 1]
        assert tier.fetching == tuple(sorted({int(x) for x in layers}))
        assert all((local.k(i)._p.fetch != ferry._binding.ffi.NULL) == (i in tier.fetching) for i in range(2))
    tier.stop_fetching()
    assert tier.fetching == () and all(local.k(i)._p.fetch == ferry._binding.ffi.NULL for i in range(2))
