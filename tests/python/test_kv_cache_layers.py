"""A KV cache whose layers differ: placed on a device or the host (placement=), of their own sizes
(layer_cells=), or over the caller's arrays (KVCache.from_arrays). Every placement gives the
all-host run's attention outputs byte for byte; device-resident layers copy nothing."""

from __future__ import annotations

import ctypes
import gc
import platform
import random
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pytest

import ferry
from ferry.paged import PagedKVCache

N_LAYER, N_STREAM, KV_SIZE, HEAD_DIM, N_HEAD_KV, N_HEAD, N_KV = 4, 2, 40, 32, 2, 4, 33
LENS = [N_KV, 9]

_rng = random.Random(22)
MAPS = {
    "all host": [False] * N_LAYER,
    "all device": [True] * N_LAYER,
    "first 2": [True, True, False, False],
    "every other": [i % 2 == 0 for i in range(N_LAYER)],
    "random": [_rng.random() < 0.5 for _ in range(N_LAYER)],
}


def layer_values(type_k: str, type_v: str, v_trans: bool) -> List[Tuple[np.ndarray, np.ndarray]]:
    """Per layer, its K and V streams' bytes as [n_stream, cells, row bytes] uint8 (V transposed:
    [n_stream, n_embd_gqa, cells * 2]), the same for every cache of a test."""
    rng = np.random.default_rng(22)
    n_embd = HEAD_DIM * N_HEAD_KV
    out = []
    for _ in range(N_LAYER):
        pair = []
        for ty, trans in ((type_k, False), (type_v, v_trans)):
            vals = rng.uniform(-1, 1, (N_STREAM, KV_SIZE, n_embd)).astype(np.float32)
            if trans:
                vals = np.ascontiguousarray(vals.transpose(0, 2, 1))
            raw = ferry.quantize(vals.reshape(-1), ty).view(np.uint8)
            pair.append(raw.reshape(N_STREAM, vals.shape[1], -1))
        out.append((pair[0], pair[1]))
    return out


def fill(kv: ferry.KVCache, values: Sequence[Tuple[np.ndarray, np.ndarray]]) -> None:
    for layer, (k, v) in enumerate(values):
        for s in range(N_STREAM):
            kv.set_stream("k", layer, s, k[s].tobytes())
            kv.set_stream("v", layer, s, v[s].tobytes())


def run(kv: ferry.KVCache, split: ferry.Backend, v_trans: bool, policy: str, prefetch: int,
        one_call: bool = False) -> Tuple[bytes, ferry.stats.SchedStats]:
    rng = np.random.default_rng(7)
    q = [ferry.Tensor.from_numpy(split, rng.uniform(-1, 1, (N_STREAM, 1, N_HEAD, HEAD_DIM)).astype(np.float32))
         for _ in range(N_LAYER)]
    kv_len = ferry.Tensor.from_numpy(split, np.array(LENS, np.int32))
    with ferry.Scheduler([split, ferry.CPUBackend()], policy=policy, prefetch=prefetch) as sched:
        windows: Any = kv.windows(N_KV) if one_call else [kv.window(layer, N_KV) for layer in range(N_LAYER)]
        outs = ferry.attention_step(sched, split, windows, q, kv_len, v_trans)
        sched.compute(ferry.Graph(*outs))
        return b"".join(o.get() for o in outs), sched.stats


def window_bytes(kv: ferry.KVCache, layer: int, n_kv: int) -> int:
    """What a layer's K and V windows of n_kv cells of every stream read."""
    k, v = kv.window(layer, n_kv)
    return sum(int(np.prod(t.ne)) // t.type.blck_size * t.type.size for t in (k, v))


CASES = [("f16", "f16", False), ("f16", "f16", True), ("q8_0", "q8_0", False), ("q8_0", "f16", True)]


@pytest.mark.parametrize("type_k,type_v,v_trans", CASES)
def test_every_placement_gives_the_all_host_outputs_and_host_layers_copy_only_theirs(type_k: str, type_v: str, v_trans: bool) -> None:
    dev = ferry.StandinBackend()
    values = layer_values(type_k, type_v, v_trans)
    host = ferry.KVCache(type_k, type_v, HEAD_DIM, N_HEAD_KV, N_STREAM * KV_SIZE, N_STREAM, N_LAYER, v_trans=v_trans)
    fill(host, values)
    want, st_host = run(host, dev, v_trans, "ranges", 0)
    assert st_host.bytes_read == sum(window_bytes(host, layer, N_KV) for layer in range(N_LAYER))
    if not v_trans:  # a transposed V's ranges may merge its rows' small gaps
        assert st_host.bytes_copied == st_host.bytes_read
    per_layer = st_host.bytes_copied // N_LAYER  # every layer is laid out alike
    for name, on_dev in MAPS.items():
        placement = [dev if d else None for d in on_dev]
        kv = ferry.KVCache(type_k, type_v, HEAD_DIM, N_HEAD_KV, N_STREAM * KV_SIZE, N_STREAM, N_LAYER,
                           v_trans=v_trans, placement=placement)
        assert kv.placement == tuple(placement)
        fill(kv, values)
        for layer in range(N_LAYER):  # get_stream reads a device layer back through its transfers
            assert kv.get_stream("k", layer, 1) == values[layer][0][1].tobytes()
        n_host = sum(not d for d in on_dev)
        for policy in ("flat", "ranges", "plan"):
            for prefetch in (0, 1):
                got, st = run(kv, dev, v_trans, policy, prefetch)
                assert got == want, (name, policy, prefetch)
                if n_host == 0:
                    assert st.bytes_copied == 0, (name, policy)
                if policy == "ranges":  # host layers copy what the all-host run copies for them, no more
                    assert st.bytes_copied == n_host * per_layer, (name, prefetch)
        got, _ = run(kv, dev, v_trans, "ranges", 1, one_call=True)
        assert got == want, name


def test_one_buffer_per_buffer_type() -> None:
    dev = ferry.StandinBackend()
    kv = ferry.KVCache("f16", "f16", HEAD_DIM, N_HEAD_KV, N_STREAM * KV_SIZE, N_STREAM, N_LAYER,
                       placement=[dev, None, dev, None])
    assert kv.layer_buffer(0) is kv.layer_buffer(2)
    assert kv.layer_buffer(1) is kv.buffer is kv.layer_buffer(3)
    assert kv.layer_buffer(0).type == dev.buffer_type
    assert kv.k(2).buffer is kv.layer_buffer(0)
    layer = HEAD_DIM * N_HEAD_KV * KV_SIZE * N_STREAM * 2
    assert kv.layer_buffer(0).size >= 4 * layer and kv.buffer.size >= 4 * layer
    everywhere = ferry.KVCache("f16", "f16", HEAD_DIM, N_HEAD_KV, N_STREAM * KV_SIZE, N_STREAM, 2,
                               placement=[dev, dev])
    with pytest.raises(ferry.InvalidArgumentError, match="layer_buffer"):
        _ = everywhere.buffer


def test_a_bad_placement_or_layer_cells_is_refused_naming_the_layer() -> None:
    dev = ferry.StandinBackend()
    args = ("f16", "f16", HEAD_DIM, N_HEAD_KV, N_STREAM * KV_SIZE, N_STREAM, N_LAYER)
    with pytest.raises(ferry.InvalidArgumentError, match="3 entries for 4 layers"):
        ferry.KVCache(*args, placement=[None, dev, None])
    with pytest.raises(ferry.InvalidArgumentError, match="layer 1 is neither None nor a Backend"):
        ferry.KVCache(*args, placement=[None, "cuda0", None, None])
    closed = ferry.StandinBackend()
    closed.close()
    with pytest.raises(ferry.InvalidArgumentError, match="layer 2 is a closed backend"):
        ferry.KVCache(*args, placement=[None, None, closed, None])
    with pytest.raises(ferry.InvalidArgumentError, match="layer 3 is .*no memory behind them"):
        ferry.KVCache(*args, placement=[None, None, None, ferry.DummyBackend()])
    assert ferry.KVCache(*args, placement=[None, None, None, ferry.DummyBackend(real_memory=True)])
    with pytest.raises(ferry.InvalidArgumentError, match="layer_cells"):
        ferry.KVCache(*args, layer_cells=[8, 8])
    with pytest.raises(ferry.InvalidArgumentError, match="layer 1's 41 cells"):
        ferry.KVCache(*args, layer_cells=[None, KV_SIZE + 1, None, None])


@pytest.mark.parametrize("v_trans", [False, True])
def test_sliding_layer_reads_its_window(v_trans: bool) -> None:
    """A layer of 8 cells holds 8; windows(n_kv) gives it 8 and attention over them with kv_len
    clamped to 8 is what a full layer holding the same 8 cells gives."""
    dev, win = ferry.StandinBackend(), 8
    args = ("f16", "f16", HEAD_DIM, N_HEAD_KV, N_STREAM * KV_SIZE, N_STREAM, 2)
    kv = ferry.KVCache(*args, v_trans=v_trans, layer_cells=[None, win])
    full = ferry.KVCache(*args, v_trans=v_trans)
    assert (kv.layer_kv_size(0), kv.layer_kv_size(1), kv.kv_size) == (KV_SIZE, win, KV_SIZE)
    assert tuple(kv.k(1).ne[:3]) == (HEAD_DIM * N_HEAD_KV, win, N_STREAM)
    rng = np.random.default_rng(3)
    n_embd = HEAD_DIM * N_HEAD_KV
    for s in range(N_STREAM):
        for which in ("k", "v"):
            ring = rng.uniform(-1, 1, (win, n_embd)).astype(np.float16)
            wide = np.zeros((KV_SIZE, n_embd), np.float16)
            wide[:win] = ring
            if which == "v" and v_trans:
                ring, wide = np.ascontiguousarray(ring.T), np.ascontiguousarray(wide.T)
            kv.set_stream(which, 1, s, ring)
            full.set_stream(which, 1, s, wide)
    ws = kv.windows(N_KV)
    k, v = ws[1]
    assert k.ne[1] == win and ws[0][0].ne[1] == N_KV
    with pytest.raises(ferry.OutOfBoundsError, match="layer 1 holds 8 cells"):
        kv.window(1, win + 1)
    q = ferry.Tensor.from_numpy(dev, rng.uniform(-1, 1, (N_STREAM, 1, N_HEAD, HEAD_DIM)).astype(np.float32))
    lens = [min(n, win) for n in LENS]
    kv_len = ferry.Tensor.from_numpy(dev, np.array(lens, np.int32))
    outs = []
    for cache, n in ((kv, N_KV), (full, win)):
        with ferry.Scheduler([dev, ferry.CPUBackend()], policy="ranges") as sched:
            kw, vw = cache.windows(n)[1]
            out = ferry.attention_step(sched, dev, [(kw, vw)], [q], kv_len, v_trans)
            sched.compute(ferry.Graph(*out))
            outs.append(out[0].get())
            assert sched.stats.bytes_read == window_bytes(kv, 1, win)  # no more than its window
            if cache is kv:  # its ring is all it copies, transposed V included
                assert sched.stats.bytes_copied == sched.stats.bytes_read
    assert outs[0] == outs[1]


def own_arrays(values: Sequence[Tuple[np.ndarray, np.ndarray]], as_type: Optional[np.dtype]) -> Tuple[list, list]:
    ks, vs = [], []
    for k, v in values:
        for src, dst in ((k, ks), (v, vs)):
            a = src.copy()
            dst.append(a.view(as_type) if as_type is not None else a)
    return ks, vs


@pytest.mark.parametrize("type_k,type_v,v_trans", CASES)
def test_a_cache_over_arrays_gives_its_own_caches_outputs_without_a_copy(type_k: str, type_v: str, v_trans: bool) -> None:
    dev = ferry.StandinBackend()
    values = layer_values(type_k, type_v, v_trans)
    own = ferry.KVCache(type_k, type_v, HEAD_DIM, N_HEAD_KV, N_STREAM * KV_SIZE, N_STREAM, N_LAYER, v_trans=v_trans)
    fill(own, values)
    want, _ = run(own, dev, v_trans, "ranges", 0)
    f16 = type_k == "f16" and type_v == "f16"
    ks, vs = own_arrays(values, np.dtype(np.float16) if f16 else None)
    kv = ferry.KVCache.from_arrays(ks, vs, n_stream=N_STREAM, v_trans=v_trans, n_head_kv=N_HEAD_KV,
                                   type_k=None if f16 else type_k, type_v=None if f16 else type_v)
    assert kv.params == own.params and kv.placement == (None,) * N_LAYER
    assert kv.k(1).address == ks[1].ctypes.data  # no copy
    for policy, prefetch, one_call in (("ranges", 0, False), ("plan", 1, False), ("flat", 1, True)):
        got, _ = run(kv, dev, v_trans, policy, prefetch, one_call)
        assert got == want, (policy, prefetch, one_call)
    vs[0][...] = 0  # the caller's writes are the cache's
    assert kv.get_stream("v", 0, 0) == bytes(vs[0][0].nbytes)


def test_from_arrays_refuses_arrays_that_disagree_naming_the_array_and_axis() -> None:
    k = np.zeros((N_STREAM, 8, HEAD_DIM), np.float16)
    with pytest.raises(ferry.InvalidArgumentError, match="1 K layers and 2 V layers"):
        ferry.KVCache.from_arrays([k], [k, k], n_stream=N_STREAM)
    with pytest.raises(ferry.InvalidArgumentError, match=r"k_layers\[0\] holds 2 streams \(axis 0\), not n_stream=3"):
        ferry.KVCache.from_arrays([k], [k], n_stream=3)
    with pytest.raises(ferry.InvalidArgumentError, match=r"v_layers\[0\] is \[2, 9, 32\] values, not \[2, 8, 32\]"):
        ferry.KVCache.from_arrays([k], [np.zeros((N_STREAM, 9, HEAD_DIM), np.float16)], n_stream=N_STREAM)
    with pytest.raises(ferry.InvalidArgumentError, match=r"k_layers\[1\] has rows of 16 values \(axis 2\), "
                                                         r"k_layers\[0\] of 32"):
        ferry.KVCache.from_arrays([k, k[..., :16].copy()], [k, k[..., :16].copy()], n_stream=N_STREAM)
    with pytest.raises(ferry.InvalidArgumentError, match="k_layers is a sequence of arrays"):
        ferry.KVCache.from_arrays(k, k, n_stream=N_STREAM)  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgumentError, match="n_head_kv must be positive, got 0"):
        ferry.KVCache.from_arrays([k], [k], n_stream=N_STREAM, n_head_kv=0)
    with pytest.raises(ferry.InvalidArgumentError, match="n_ctx 8 is not n_stream 2 streams of at least 8 cells"):
        ferry.KVCache.from_arrays([k], [k], n_stream=N_STREAM, n_ctx=8)


@pytest.mark.parametrize("first,second", [(np.float16, np.float32), (np.float32, np.float16)])
@pytest.mark.parametrize("which", ["k", "v"])
def test_from_arrays_refuses_layers_of_two_types(first: Any, second: Any, which: str) -> None:
    """One K type and one V type per cache, as C keeps them: a later layer of another type is
    refused, naming both layers, in either order, before anything is written."""
    ones = [np.ones((1, 4, 32), first), np.ones((1, 4, 32), second)]
    same = [np.ones((1, 4, 32), first), np.ones((1, 4, 32), first)]
    ks, vs = (ones, same) if which == "k" else (same, ones)
    names = {np.float16: "f16", np.float32: "f32"}
    with pytest.raises(ferry.InvalidArgumentError,
                       match=rf"{which}_layers\[1\] is {names[second]}, {which}_layers\[0\] {names[first]}: "
                             rf"every layer of a cache has one {which.upper()} type"):
        ferry.KVCache.from_arrays(ks, vs)
    assert all((a == 1).all() for a in ks + vs)  # nothing written


@pytest.mark.parametrize("make,message", [
    pytest.param(lambda a: a[:, ::2], r"k_layers\[0\]: its cells \(axis 1\) are 512 bytes apart, a dense row is 256: "
                 r"pass a contiguous array \(np.ascontiguousarray\)", id="every other cell"),
    pytest.param(lambda a: a[:, :, :32], r"k_layers\[0\]: its cells \(axis 1\) are 256 bytes apart, a dense row is "
                 r"128: pass a contiguous array", id="padded rows"),
    pytest.param(lambda a: a[:, :8, :], r"k_layers\[0\]: its streams \(axis 0\) are 4096 bytes apart, 8 dense rows "
                 r"are 2048: pass a contiguous array", id="padded streams"),
    pytest.param(lambda a: a[None], r"k_layers\[0\] has 4 dimensions \(shape \(1, 2, 16, 64\)\); a layer is 3-D: "
                 r"\[n_stream, cells, n_embd_gqa\]", id="4-D"),
    pytest.param(lambda a: a[0], r"k_layers\[0\] has 2 dimensions \(shape \(16, 64\)\); a layer is 3-D", id="2-D"),
])
def test_from_arrays_names_the_layout_it_refuses(make: Any, message: str) -> None:
    """An array that is not a dense [n_stream, cells, n_embd_gqa] is a LayoutError naming the
    array and the stride or dimension that is wrong."""
    a = np.ones((2, 16, 64), np.float32)
    view = make(a)
    with pytest.raises(ferry.LayoutError, match=message):
        ferry.KVCache.from_arrays([view], [np.ascontiguousarray(view)], n_stream=view.shape[0] if view.ndim == 3 else 2)
    assert (a == 1).all()


def dense_with_a_unit_axis(x: np.ndarray) -> List[np.ndarray]:
    """Arrays of x's values with a leading axis of extent 1 whose stride is not the dense one: a
    view of x ([None], stride 0) and every other of two copies ([::2], a stride of two)."""
    return [x[None], np.stack([x, x])[::2]]


def test_from_arrays_takes_a_dense_array_whose_unit_axis_has_any_stride() -> None:
    """A dimension of extent 1 is never stepped, so its stride says nothing of the layout: such an
    array is dense, and the cache lies over it without a copy (it was refused with "an array gave a
    tensor in no buffer"). A truly strided one is refused naming the array, axis and stride."""
    x = np.arange(8 * 16, dtype=np.float16).reshape(8, 16)
    for k in dense_with_a_unit_axis(x):
        v = k.copy()
        kv = ferry.KVCache.from_arrays([k], [v])
        assert kv.get_stream("k", 0, 0) == k.tobytes()
        k[0, 3] = -1.0  # the cache reads the caller's memory
        assert np.frombuffer(kv.get_stream("k", 0, 0), np.float16)[3 * 16:4 * 16].tolist() == [-1.0] * 16
        kv.set_stream("v", 0, 0, np.ones((8, 16), np.float16))
        assert (v == 1).all()
    wide = np.zeros((1, 8, 32), np.float16)[:, :, :16]
    with pytest.raises(ferry.LayoutError, match=r"v_layers\[0\]: its cells \(axis 1\) are 64 bytes apart, a dense "
                                                r"row is 32"):
        ferry.KVCache.from_arrays([x[None].copy()], [wide])


@pytest.mark.parametrize("paged", [False, True], ids=["kv", "paged"])
def test_an_array_a_cache_lies_over_cannot_be_resized_under_it(paged: bool) -> None:
    """numpy refuses resize(refcheck=False) of an array something holds a weak reference to: the
    cache holds one to each array it lies over, and to the arrays whose memory a view is, so that
    none of them is reallocated under it (it was: a use after free). Once the cache is gone, the
    arrays are the caller's alone again."""
    x = np.arange(4 * 64, dtype=np.float16).reshape(4, 64)
    k, base = (x.reshape(1, 4, 2, 32), x) if paged else (x[None], x)  # views of x: x must stay too
    v = np.ones_like(k)
    cache: Any = (PagedKVCache.from_arrays([k], [v], n_seq=1) if paged else
                  ferry.KVCache.from_arrays([k], [v]))
    for a in (base, v):
        with pytest.raises(ValueError, match="cannot resize"):
            a.resize((64, 64) if a.ndim == 2 else (64,) + a.shape[1:], refcheck=False)
    assert cache.k(0).get() == x.tobytes() and cache.v(0).get() == v.tobytes()
    cache.close()
    del cache
    gc.collect()
    v.resize((8,) + v.shape[1:], refcheck=False)  # the caller's again
    assert v.shape[0] == 8


def test_from_arrays_names_a_transposed_v_layout() -> None:
    v = np.zeros((2, 64, 32), np.float32)  # [n_stream, n_embd_gqa, 16 cells] in rows of 32
    with pytest.raises(ferry.LayoutError, match=r"v_layers\[0\]: its channels \(axis 1\) are 128 bytes apart, a "
                                                r"dense row of cells is 64"):
        ferry.KVCache.from_arrays([np.zeros((2, 16, 64), np.float32)], [v[:, :, :16]], n_stream=2, v_trans=True)


@pytest.mark.parametrize("array,type_k,name", [
    (np.zeros((1, 4, 32), np.int32), None, "i32"),
    (np.zeros((1, 4, 18), np.uint8), "q4_0", "q4_0"),
])
def test_from_arrays_refuses_types_attention_cannot_read(array: np.ndarray, type_k: Optional[str], name: str) -> None:
    """Attention reads K and V of f32, f16 and q8_0: a cache over arrays of another type is refused
    where it is made, naming the layer and the types accepted, not where attention first reads it."""
    f32 = np.zeros((1, 4, 32), np.float32)
    with pytest.raises(ferry.InvalidArgumentError, match=rf"k_layers\[0\] is {name}: attention reads f32, f16, q8_0"):
        ferry.KVCache.from_arrays([array], [f32], type_k=type_k)
    with pytest.raises(ferry.InvalidArgumentError, match=rf"v_layers\[0\] is {name}: attention reads f32, f16, q8_0"):
        ferry.KVCache.from_arrays([f32], [array], type_v=type_k)
    # a cache of its own memory holds any type: a dry run lays out caches attention never reads
    assert ferry.KVCache(name, name, 32, 1, 4, 1).params.type_k == ferry.to_type(name)


def test_from_arrays_names_the_array_from_array_refuses() -> None:
    k = np.zeros((1, 4, 32), np.float32)
    with pytest.raises(ferry.InvalidArgumentError, match=r"v_layers\[1\]: from_array: the array is read-only"):
        ro = k.copy()
        ro.flags.writeable = False
        ferry.KVCache.from_arrays([k, k], [k, ro])


@pytest.fixture
def dirty_allocations() -> Iterator[None]:
    """Every allocation glibc makes holds 0xA5 while the test runs (M_PERTURB), as memory a process
    used before would; elsewhere the test relies on caches getting freed caches' memory back."""
    libc = ctypes.CDLL(None)
    perturb = getattr(libc, "mallopt", None) if platform.libc_ver()[0] == "glibc" else None
    if perturb is not None:
        perturb(-6, 0x5A)  # M_PERTURB
    try:
        yield
    finally:
        if perturb is not None:
            perturb(-6, 0)


@pytest.mark.parametrize("where", ["host", "stand-in placement"])
def test_new_cache_reads_zeros(where: str, dirty_allocations: None) -> None:
    """A new cache's K and V read zeros, its device-placed layers too, whatever its memory held
    before; each cache here is filled before it is freed, for the next one to be given."""
    dev = ferry.StandinBackend()
    placement = None if where == "host" else [dev if layer % 2 else None for layer in range(N_LAYER)]
    for _ in range(3):
        kv = ferry.KVCache("f16", "f16", HEAD_DIM, N_HEAD_KV, N_STREAM * KV_SIZE, N_STREAM, N_LAYER, placement=placement)
        for layer in range(N_LAYER):
            for which in ("k", "v"):
                for s in range(N_STREAM):
                    got = np.frombuffer(kv.get_stream(which, layer, s), np.uint16)
                    assert np.count_nonzero(got) == 0, (which, layer, s, np.count_nonzero(got))
                    kv.set_stream(which, layer, s, np.full(got.size, 0x3C00, np.uint16).tobytes())  # 1.0
        kv.close()


def test_cache_over_arrays_keeps_their_content() -> None:
    k = np.full((N_STREAM, 8, HEAD_DIM), 1.5, np.float16)
    v = np.full((N_STREAM, 8, HEAD_DIM), -2.0, np.float16)
    kv = ferry.KVCache.from_arrays([k], [v], n_stream=N_STREAM)
    assert (k == 1.5).all() and (v == -2.0).all()
    assert np.frombuffer(kv.get_stream("v", 0, 1), np.float16).tolist() == [-2.0] * (8 * HEAD_DIM)


def test_a_cache_over_torch_tensors_gives_its_own_caches_outputs_without_a_copy() -> None:
    torch = pytest.importorskip("torch")
    values = layer_values("f16", "f16", False)
    own = ferry.KVCache("f16", "f16", HEAD_DIM, N_HEAD_KV, N_STREAM * KV_SIZE, N_STREAM, N_LAYER)
    fill(own, values)
    dev = ferry.StandinBackend()
    want, _ = run(own, dev, False, "ranges", 0)
    ks, vs = own_arrays(values, np.dtype(np.float16))
    # memory torch allocated itself (clone), not numpy's seen through torch
    tk = [torch.from_numpy(a).clone() for a in ks]
    tv = [torch.from_numpy(a).clone() for a in vs]
    kv = ferry.KVCache.from_arrays(tk, tv, n_stream=N_STREAM, n_head_kv=N_HEAD_KV)
    assert kv.params == own.params
    assert kv.k(1).address == tk[1].data_ptr() and kv.v(0).address == tv[0].data_ptr()  # no copy
    for policy, prefetch, one_call in (("ranges", 0, False), ("plan", 1, False), ("flat", 1, True)):
        got, _ = run(kv, dev, False, policy, prefetch, one_call)
        assert got == want, (policy, prefetch, one_call)
    tv[0].zero_()  # torch's writes are the cache's
    assert kv.get_stream("v", 0, 0) == bytes(vs[0][0].nbytes)


def layer_copied(sched: ferry.Scheduler, kv: ferry.KVCache) -> List[int]:
    """Per layer, the bytes its windows (K and V) copied in the scheduler's last compute."""
    layers = {t._ptr: layer for layer in range(kv.params.n_layer) for t in (kv.k(layer), kv.v(layer))}
    copied = [0] * kv.params.n_layer
    for split in sched.splits:
        for inp in split.inputs:
            src = inp.src._p
            layer = layers.get(src.view_src if src.view_src else src)
            if layer is not None:
                copied[layer] += inp.stats.bytes_copied
    return copied


SLIDING = [None, 8, None, 16]  # layers 1 and 3 hold the last 8 and 16 cells of each sequence


def stream_bytes(values: np.ndarray, ty: str, trans: bool) -> bytes:
    """A stream's [cells, n_embd_gqa] values in the cache's type, transposed when V is."""
    vals = np.ascontiguousarray(values.T) if trans else values
    return ferry.quantize(vals.reshape(-1), ty).tobytes()


def row_bytes(ty: str) -> int:
    """Bytes of one cell's n_embd_gqa values of type ty."""
    return {"f16": 2 * HEAD_DIM * N_HEAD_KV, "q8_0": HEAD_DIM * N_HEAD_KV // 32 * 34}[ty]


@pytest.mark.parametrize("type_k,type_v,v_trans", CASES)
def test_a_sliding_layer_in_a_one_call_step_attends_over_its_ring_and_copies_only_it(type_k: str, type_v: str, v_trans: bool) -> None:
    """A cache of full and sliding layers in one attention_step call: each sliding layer's output is,
    byte for byte, attention over the ring it holds (the sequence's last W cells) laid in a full cache
    and read with kv_len min(len, W); each full layer's is the all-full cache's; a sliding layer's
    windows copy no more than its W cells per stream."""
    dev = ferry.StandinBackend()
    n_embd = HEAD_DIM * N_HEAD_KV
    rng = np.random.default_rng(11)
    # positions[l][which][s]: the values of the sequence's cells 0..len-1, in order
    positions = [[[rng.uniform(-1, 1, (n, n_embd)).astype(np.float32) for n in LENS] for _ in "kv"]
                 for _ in range(N_LAYER)]
    args = (type_k, type_v, HEAD_DIM, N_HEAD_KV, N_STREAM * KV_SIZE, N_STREAM, N_LAYER)
    kv = ferry.KVCache(*args, v_trans=v_trans, layer_cells=SLIDING)
    ref = ferry.KVCache(*args, v_trans=v_trans)  # every layer full; a sliding layer's ring in its first W cells
    for layer, win in enumerate(SLIDING):
        for w, (which, ty) in enumerate((("k", type_k), ("v", type_v))):
            trans = which == "v" and v_trans
            for s, n in enumerate(LENS):
                seq = positions[layer][w][s]
                cells = rng.uniform(-1, 1, (win or KV_SIZE, n_embd)).astype(np.float32)  # unwritten cells: noise
                for pos in range(max(0, n - (win or KV_SIZE)), n):
                    cells[pos % (win or KV_SIZE)] = seq[pos]  # a ring: position p in cell p mod W
                wide = np.zeros((KV_SIZE, n_embd), np.float32)
                wide[:len(cells)] = cells
                kv.set_stream(which, layer, s, stream_bytes(cells, ty, trans))
                ref.set_stream(which, layer, s, stream_bytes(wide, ty, trans))
    q = [ferry.Tensor.from_numpy(dev, rng.uniform(-1, 1, (N_STREAM, 1, N_HEAD, HEAD_DIM)).astype(np.float32))
         for _ in range(N_LAYER)]
    kv_len = ferry.Tensor.from_numpy(dev, np.array(LENS, np.int32))

    want = []  # layer by layer from the all-full cache, each with its own clamped lengths
    for layer, win in enumerate(SLIDING):
        n_kv = win or N_KV
        lens = ferry.Tensor.from_numpy(dev, np.array([min(n, n_kv) for n in LENS], np.int32))
        with ferry.Scheduler([dev, ferry.CPUBackend()], policy="ranges") as sched:
            out = ferry.attention_step(sched, dev, [ref.window(layer, n_kv)], [q[layer]], lens, v_trans)
            sched.compute(ferry.Graph(*out))
            want.append(out[0].get())
    # and in float64 from the values: attention over the last min(len, W) positions, in their order
    scale = 1 / np.sqrt(HEAD_DIM)
    for layer, win in enumerate(SLIDING):
        got = np.frombuffer(want[layer], np.float32).reshape(N_STREAM, N_HEAD, HEAD_DIM)
        qs = q[layer].to_numpy().reshape(N_STREAM, N_HEAD, HEAD_DIM).astype(np.float64)
        for s, n in enumerate(LENS):
            first = max(0, n - (win or n))
            kk, vv = (ferry.dequantize(ferry.quantize(positions[layer][w][s][first:].reshape(-1), ty), ty)
                      .reshape(n - first, N_HEAD_KV, HEAD_DIM).astype(np.float64)
                      for w, ty in enumerate((type_k, type_v)))
            for h in range(N_HEAD):
                hk = h // (N_HEAD // N_HEAD_KV)
                p = np.exp(scale * kk[:, hk] @ qs[s, h] - np.max(scale * kk[:, hk] @ qs[s, h]))
                np.testing.assert_allclose(got[s, h], (p / p.sum()) @ vv[:, hk], rtol=1e-5, atol=1e-5)

    for policy in ("flat", "ranges", "plan"):
        for prefetch in (0, 1):
            with ferry.Scheduler([dev, ferry.CPUBackend()], policy=policy, prefetch=prefetch) as sched:
                outs = ferry.attention_step(sched, dev, kv.windows(N_KV), q, kv_len, v_trans)
                sched.compute(outs.graph)
                assert [o.get() for o in outs] == want, (policy, prefetch)
                copied = layer_copied(sched, kv)
            for layer, win in enumerate(SLIDING):
                if win:  # its ring and no more: W cells per stream of K and of V
                    ring = win * N_STREAM * (row_bytes(type_k) + row_bytes(type_v))
                    assert copied[layer] <= ring, (policy, prefetch, layer)
                    if policy == "ranges":
                        assert copied[layer] == ring, (prefetch, layer)
    with ferry.Scheduler([dev, ferry.CPUBackend()]) as sched:  # n_kv beyond a full layer: refused, not clamped
        with pytest.raises(ferry.OutOfBoundsError, match="n_kv 41"):
            ferry.attention_step(sched, dev, kv.windows(KV_SIZE + 1), q, kv_len, v_trans)
        with pytest.raises(ferry.OutOfBoundsError, match="n_kv 41"):
            _ = kv.windows(KV_SIZE + 1)[1]
