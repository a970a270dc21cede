"""A remote tier's stage of the copy path, for a transport written in Python (ferry.fetch): a layer
whose local bytes are wrong until fetched gives the local cache's outputs under every policy and
prefetch depth, for a cell-per-stream and a paged cache; a fetcher's exception is what the run
raises, after every fetch begun was waited for, and the next run is right; bad arguments are
refused naming them. The fetcher here is a fake (each layer's true bytes kept aside, landed when a
window's fetch is waited for); ferry.remote's tier over Mooncake is tested in test_remote.py.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np
import pytest

import ferry
from ferry.fetch import set_fetch
from ferry.paged import PagedKVCache
from ferry.step import attention_step

HEAD_DIM, N_HEAD_KV, N_STREAM, CELLS, N_LAYER = 16, 2, 3, 32, 3
SENTINEL = 0xA5
LENS = [20, 9, 16]


class LayerGone(Exception):
    """What a fake transport raises."""


class Fake:
    """Each fetched tensor's true bytes, landed whole when a fetch of one of its windows is waited for
    (a paged window's cells lie in blocks anywhere in its pool)."""

    def __init__(self, tensors: List[ferry.Tensor]) -> None:
        self.true = {t.address: bytes(t.get()) for t in tensors}
        self.tickets: Dict[int, Tuple[int, int, int]] = {}
        self.log: List[Tuple[str, int]] = []
        self.policies: List[str] = []
        self.fail_at: Optional[Tuple[str, int]] = None  # ("begin" or "wait", call number)
        self.calls = {"begin": 0, "wait": 0}

    def _maybe_fail(self, what: str) -> None:
        self.calls[what] += 1
        if self.fail_at == (what, self.calls[what]):
            raise LayerGone(f"peer 10.0.0.9:7001 gone at {what} {self.calls[what]}")

    def begin(self, window: ferry.Tensor, policy: ferry.CopyPolicy) -> int:
        root = window.root.address
        assert root in self.true and window.address is not None
        self.log.append(("begin", root))
        self.policies.append(str(policy))
        self._maybe_fail("begin")
        ticket = len(self.tickets) + 1
        self.tickets[ticket] = (root, 0, len(self.true[root]))
        return ticket

    def wait(self, ticket: int) -> None:
        root, off, n = self.tickets[ticket]
        self.log.append(("wait", root))
        self._maybe_fail("wait")
        ctypes_array(root + off, n)[:] = np.frombuffer(self.true[root], np.uint8)[off:off + n]


def ctypes_array(address: int, n: int) -> np.ndarray:
    import ctypes

    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(address))


def cell_cache(seed: int) -> ferry.KVCache:
    kv = ferry.KVCache("f16", "f16", HEAD_DIM, N_HEAD_KV, CELLS * N_STREAM, N_STREAM, N_LAYER)
    rng = np.random.default_rng(seed)
    for layer in range(N_LAYER):
        for t in (kv.k(layer), kv.v(layer)):
            t.set(rng.standard_normal(t.nbytes // 2).astype(np.float16).tobytes())
    return kv


def paged_cache(seed: int) -> PagedKVCache:
    rng = np.random.default_rng(seed)
    ks = [rng.standard_normal((32, 4, N_HEAD_KV, HEAD_DIM)).astype(np.float16) for _ in range(N_LAYER)]
    vs = [rng.standard_normal((32, 4, N_HEAD_KV, HEAD_DIM)).astype(np.float16) for _ in range(N_LAYER)]
    c = PagedKVCache.from_arrays(ks, vs, n_seq=N_STREAM)
    blocks = rng.permutation(32).tolist()
    for s, n in enumerate(LENS):
        c.set_table(s, [blocks.pop() for _ in range(-(-n // 4))], n)
    return c


def step(kv: object, policy: str, prefetch: int) -> Tuple[List[bytes], ferry.SchedStats, ferry.Scheduler]:
    dev, cpu = ferry.StandinBackend(), ferry.CPUBackend()
    sched = ferry.Scheduler([dev, cpu], policy=policy, prefetch=prefetch)
    rng = np.random.default_rng(1)
    q = [ferry.Tensor.from_numpy(cpu, rng.standard_normal((N_STREAM, 1, 4, HEAD_DIM)).astype(np.float32))
         for _ in range(N_LAYER)]
    kv_len = ferry.Tensor.from_numpy(cpu, np.array(LENS, np.int32))
    outs = attention_step(sched, dev, kv.windows(24), q, kv_len)  # type: ignore[attr-defined]
    sched.compute(outs.graph)
    return [bytes(o.get()) for o in outs], sched.stats, sched


def spoil(tensors: List[ferry.Tensor]) -> None:
    for t in tensors:
        t.set(bytes([SENTINEL]) * t.nbytes)


@pytest.mark.parametrize("layout", ["cells", "paged"])
def test_fetched_layers_give_the_local_outputs_under_every_policy_and_prefetch(layout: str) -> None:
    """Layers 0 and 2 fetched, their local bytes spoilt before each run: the outputs of the cache
    held locally, byte for byte; a fetch a window, each waited for before its copy; the policy the
    scheduler copies by handed to the fetcher; without the fetch, the spoilt bytes show."""
    kv = cell_cache(5) if layout == "cells" else paged_cache(5)
    fetched = [t for layer in (0, 2) for t in (kv.k(layer), kv.v(layer))]
    for policy in ("flat", "ranges", "plan", "ragged"):
        want, local, _ = step(kv, policy, 0)
        fake = Fake(fetched)
        for t in fetched:
            set_fetch(t, fake)
        for prefetch in (0, 1, 3):
            spoil(fetched)
            fake.log.clear()
            fake.policies.clear()
            got, st, sched = step(kv, policy, prefetch)
            assert got == want, (layout, policy, prefetch)
            assert st.fetched == 4 and st.bytes_copied == local.bytes_copied
            assert [k for k, _ in fake.log].count("wait") == 4 == [k for k, _ in fake.log].count("begin")
            assert set(fake.policies) == {policy}
            assert sum(sp.kind == "fetch wait" for sp in sched.trace()) == 4
        for t in fetched:
            set_fetch(t, None)
        spoil(fetched)
        assert step(kv, policy, 1)[0] != want  # nothing fetched now: the spoilt bytes are read
        for t in fetched:
            t.set(fake.true[t.address])


@pytest.mark.parametrize("what", ["begin", "wait"])
def test_a_fetchers_exception_is_what_the_run_raises_and_the_next_run_is_right(what: str) -> None:
    """The fetcher's own exception reaches the caller of compute (not a generic FerryError), every
    fetch begun was waited for first, and the next run after the fault gives the right outputs."""
    kv = cell_cache(6)
    fetched = [t for layer in range(N_LAYER) for t in (kv.k(layer), kv.v(layer))]
    want = step(kv, "ragged", 1)[0]
    fake = Fake(fetched)
    for t in fetched:
        set_fetch(t, fake)
    for call in (1, 3, 6):
        spoil(fetched)
        fake.fail_at, fake.calls = (what, call), {"begin": 0, "wait": 0}
        fake.tickets.clear()
        with pytest.raises(LayerGone, match=f"gone at {what} {call}"):
            step(kv, "ragged", 1)
        assert fake.calls["wait"] == len(fake.tickets)  # each begun, waited for
        fake.fail_at = None
        assert step(kv, "ragged", 1)[0] == want
    for t in fetched:
        set_fetch(t, None)


def test_set_fetch_refuses_what_it_cannot_fetch_naming_it() -> None:
    kv = cell_cache(7)
    fake = Fake([kv.k(0)])
    with pytest.raises(ferry.InvalidArgumentError, match="tensor"):
        set_fetch("k", fake)  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgumentError, match="owns the memory"):
        set_fetch(kv.window(0, 8)[0], fake)
    with pytest.raises(ferry.InvalidArgumentError, match="begin"):
        set_fetch(kv.k(0), object())  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgumentError, match="not in host memory"):
        set_fetch(ferry.Tensor.new("f32", [4]), fake)
    dev = ferry.StandinBackend()
    on_device = ferry.Tensor.new("f32", [4])
    dev.alloc_buffer_for(on_device)
    with pytest.raises(ferry.InvalidArgumentError, match="not in host memory"):
        set_fetch(on_device, fake)
    set_fetch(kv.k(0), None)  # nothing set: clearing is a no-op
