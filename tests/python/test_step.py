"""StepGraph: a decode step's graph built once per shape, reused while the shape holds, and
refused once what it reads or runs on was closed."""

from __future__ import annotations

import hashlib
from typing import List, Tuple

import numpy as np
import pytest

import ferry

N_LAYER, N_STREAM, KV_SIZE, HEAD_DIM, N_HEAD_KV, N_HEAD = 2, 2, 64, 8, 1, 2


class Loop:
    """A small decode loop: a split cache on the host, attention on the stand-in device."""

    def __init__(self) -> None:
        self.split, self.cpu = ferry.StandinBackend(), ferry.CPUBackend()
        self.kv = ferry.KVCache("f32", "f32", HEAD_DIM, N_HEAD_KV, N_STREAM * KV_SIZE, N_STREAM, N_LAYER)
        self.kv.buffer.clear(0)
        rng = np.random.default_rng(1)
        self.q = [ferry.Tensor.from_numpy(self.split, rng.uniform(-1, 1, (N_STREAM, 1, N_HEAD, HEAD_DIM))
                                          .astype(np.float32), name=f"q{i}") for i in range(N_LAYER)]
        self.kv_len = ferry.Tensor.from_numpy(self.split, np.zeros(N_STREAM, np.int32), name="kv_len")
        self.sched = ferry.Scheduler([self.split, self.cpu], policy="ranges")
        self.built: List[int] = []

    def build(self, n_kv: object) -> List[ferry.Tensor]:
        assert isinstance(n_kv, int)
        self.built.append(n_kv)
        windows = [self.kv.window(layer, n_kv) for layer in range(N_LAYER)]
        return ferry.attention_step(self.sched, self.split, windows, self.q, self.kv_len)

    def write_cell(self, cell: int) -> None:
        """Each layer's K and V get new values at a cell of every stream (the step's token)."""
        rng = np.random.default_rng(cell)
        for layer in range(N_LAYER):
            for t in (self.kv.k(layer), self.kv.v(layer)):
                for s in range(N_STREAM):
                    t.set(rng.uniform(-1, 1, HEAD_DIM * N_HEAD_KV).astype(np.float32), (s * KV_SIZE + cell) * t.nb[1])


def run(loop: Loop, steps: int, pad: int, reuse: bool) -> Tuple[str, ferry.StepGraph]:
    """steps decode steps from 3 cells: the sha256 of every output, and the StepGraph used."""
    graphs = ferry.StepGraph(loop.sched, loop.build)
    digest = hashlib.sha256()
    for t in range(steps):
        n = 3 + t + 1
        loop.write_cell(n - 1)
        loop.kv_len.set(np.array([n, n - 1], np.int32))
        if not reuse:
            graphs.clear()
        graph = graphs.get(min(-(-n // pad) * pad, KV_SIZE))
        loop.sched.compute(graph)
        for out in graph.outputs:
            digest.update(out.get())
    return digest.hexdigest(), graphs


def test_a_step_of_the_same_key_reuses_the_graph_and_its_allocation() -> None:
    loop = Loop()
    graphs = ferry.StepGraph(loop.sched, loop.build)
    first = graphs.get(16)
    loop.sched.compute(first)
    copy = loop.sched.inputs[0].copy  # lives until the scheduler's next alloc
    assert graphs.get(16) is first
    loop.sched.compute(first)
    copy.get()  # not reallocated: the copy is still the scheduler's
    assert (graphs.builds, graphs.rebuilds, graphs.reuses, loop.built) == (1, 0, 1, [16])
    second = graphs.get(32)
    assert second is not first and loop.built == [16, 32] and graphs.rebuilds == 1
    with pytest.raises(ferry.FreedBufferError):
        copy.get()  # the new graph was allocated


def test_rebuilds_only_when_the_padded_n_kv_changes() -> None:
    _, graphs = run(Loop(), steps=20, pad=8, reuse=True)
    # lengths 4..23 padded to 8: 8, 16, 24, so two changes
    assert (graphs.builds, graphs.rebuilds, graphs.reuses) == (3, 2, 17)


def test_reused_graphs_give_the_outputs_of_graphs_built_every_step() -> None:
    reused, graphs = run(Loop(), steps=12, pad=8, reuse=True)
    rebuilt, every = run(Loop(), steps=12, pad=8, reuse=False)
    assert graphs.builds == 2 and every.builds == 12
    assert reused == rebuilt
    exact, _ = run(Loop(), steps=12, pad=1, reuse=True)
    assert exact == reused  # padding copies more cells, never changes what attention reads


def test_a_closed_scheduler_refuses_a_reused_graph() -> None:
    loop = Loop()
    graphs = ferry.StepGraph(loop.sched, loop.build)
    graph = graphs.get(8)
    loop.sched.compute(graph)
    loop.sched.close()
    with pytest.raises(ferry.FreedBufferError):
        graphs.get(8)
    with pytest.raises(ferry.FreedBufferError):
        loop.sched.compute(graph)


def test_a_closed_cache_refuses_a_reused_graph() -> None:
    """The windows keep the cache's memory (their views work after close), but a graph that reads
    them is refused: the cache's layers are its own, and it was closed."""
    loop = Loop()
    graphs = ferry.StepGraph(loop.sched, loop.build)
    graph = graphs.get(8)
    loop.sched.compute(graph)
    loop.kv.close()
    with pytest.raises(ferry.FreedBufferError, match="KVCache"):
        graphs.get(8)
    with pytest.raises(ferry.FreedBufferError, match="KVCache"):
        loop.sched.compute(graph)
    with pytest.raises(ferry.FreedBufferError, match="KVCache"):
        graph.compute(loop.split)
    with pytest.raises(ferry.FreedBufferError):
        graphs.get(16)  # nor can a new one be built


def test_a_freed_buffer_under_a_window_refuses_the_reused_graph(cpu: ferry.CPUBackend) -> None:
    split = ferry.StandinBackend()
    buf = cpu.alloc_buffer(4 * HEAD_DIM * KV_SIZE * N_STREAM)
    cache = ferry.Tensor.new("f32", [HEAD_DIM, KV_SIZE, N_STREAM], name="cache")
    buf.place(cache)
    cache.memset(0)
    q = ferry.Tensor.from_numpy(split, np.ones((N_STREAM, 1, 1, HEAD_DIM), np.float32))
    kv_len = ferry.Tensor.from_numpy(split, np.full(N_STREAM, 4, np.int32))
    sched = ferry.Scheduler([split, cpu], policy="ranges")

    def build(n_kv: object) -> List[ferry.Tensor]:
        assert isinstance(n_kv, int)
        w = cache.view([HEAD_DIM, 1, n_kv, N_STREAM], [4, 4 * HEAD_DIM, 4 * HEAD_DIM, 4 * HEAD_DIM * KV_SIZE])
        w = w.permute(0, 2, 1, 3)
        out = ferry.attn_decode(q, w, w, kv_len).set_output()
        sched.pin(out, split)
        return [out]

    graphs = ferry.StepGraph(sched, build)
    sched.compute(graphs.get(8))
    buf.free()
    with pytest.raises(ferry.FreedBufferError):
        sched.compute(graphs.get(8))


def test_build_must_return_outputs() -> None:
    loop = Loop()
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.StepGraph(loop.sched, "build")  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.StepGraph(loop.sched, lambda key: 3).get(1)  # type: ignore[arg-type,return-value]
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.StepGraph(loop.sched, lambda key: [3]).get(1)  # type: ignore[list-item]
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.StepGraph("sched", loop.build)  # type: ignore[arg-type]


def test_attention_step_refuses_what_is_not_a_layer_each() -> None:
    loop = Loop()
    windows = [loop.kv.window(layer, 8) for layer in range(N_LAYER)]
    with pytest.raises(ferry.InvalidArgumentError, match="2 layers of windows but 1 queries"):
        ferry.attention_step(loop.sched, loop.split, windows, loop.q[:1], loop.kv_len)
    with pytest.raises(ferry.InvalidArgumentError, match="not a"):
        ferry.attention_step(loop.sched, loop.split, [windows[0][0], windows[1][0]], loop.q, loop.kv_len)
    with pytest.raises(ferry.InvalidArgumentError, match="sequences"):
        ferry.attention_step(loop.sched, loop.split, iter(windows), loop.q, loop.kv_len)  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.attention_step(loop.sched, loop.split, [(windows[0][0], "v"), windows[1]], loop.q, loop.kv_len)
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.attention_step(loop.sched, "split", windows, loop.q, loop.kv_len)  # type: ignore[arg-type]
