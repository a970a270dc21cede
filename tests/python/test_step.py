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

    def __init__(self, fast: bool = False, type: str = "f32", v_trans: bool = False) -> None:
        self.fast, self.v_trans = fast, v_trans  # fast: the windows as KVCache.windows, made in one C call
        self.split, self.cpu = ferry.StandinBackend(), ferry.CPUBackend()
        self.kv = ferry.KVCache(type, type, HEAD_DIM, N_HEAD_KV, N_STREAM * KV_SIZE, N_STREAM, N_LAYER, v_trans)
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
        if self.fast:
            return ferry.attention_step(self.sched, self.split, self.kv.windows(n_kv), self.q, self.kv_len,
                                        v_trans=self.v_trans)
        windows = [self.kv.window(layer, n_kv) for layer in range(N_LAYER)]
        return ferry.attention_step(self.sched, self.split, windows, self.q, self.kv_len, v_trans=self.v_trans)

    def write_cell(self, cell: int) -> None:
        """Each layer's K and V get new values at a cell of every stream (the step's token)."""
        rng = np.random.default_rng(cell)
        for layer in range(N_LAYER):
            for t in (self.kv.k(layer), self.kv.v(layer)):
                values = rng.uniform(-1, 1, HEAD_DIM * N_HEAD_KV).astype(np.float32).astype(t.to_numpy().dtype)
                for s in range(N_STREAM):
                    if self.v_trans and t is self.kv.v(layer):  # a cell is a column: one value per row
                        for i, x in enumerate(values):
                            t.set(x.tobytes(), s * t.nb[2] + i * t.nb[1] + cell * t.nb[0])
                    else:
                        t.set(values, (s * KV_SIZE + cell) * t.nb[1])


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
        out = ferry.ops.attn_decode(q, w, w, kv_len).set_output()
        sched.assign(out, split)
        return [out]

    graphs = ferry.StepGraph(sched, build)
    sched.compute(graphs.get(8))
    buf.close()
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


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("v_trans", [False, True])
def test_a_v_trans_other_than_the_caches_is_refused(v_trans: bool, fast: bool) -> None:
    """With n_kv == head_dim a V window's shape fits both layouts, so attention_step takes V's layout
    from the cache: a v_trans that disagrees is refused naming v_trans, assigning nothing (it used to
    read a transposed cache's V as not transposed, and give other outputs), and none gives the
    outputs of the same values in a cache of the other layout (to the rounding of each layout's kernel)."""
    loops = {vt: Loop(fast=fast, v_trans=vt) for vt in (False, True)}
    for loop in loops.values():
        for cell in range(HEAD_DIM):
            loop.write_cell(cell)  # the same values, laid out each cache's way
        loop.kv_len.set(np.array([HEAD_DIM, 5], np.int32))
    loop = loops[v_trans]
    windows = loop.kv.windows(HEAD_DIM) if fast else [loop.kv.window(layer, HEAD_DIM) for layer in range(N_LAYER)]
    assert loop.kv.window(0, HEAD_DIM)[1].ne[:2] == (HEAD_DIM, HEAD_DIM)
    with pytest.raises(ferry.InvalidArgumentError, match=rf"attention_step: v_trans={not v_trans}, but .*"
                                                         rf"{'' if v_trans else 'not '}transposed \(v_trans={v_trans}\)"):
        ferry.attention_step(loop.sched, loop.split, windows, loop.q, loop.kv_len, v_trans=not v_trans)
    assert loop.sched.n_assigned == 0
    got = []
    for each in (loop, loops[not v_trans]):
        w = each.kv.windows(HEAD_DIM) if fast else [each.kv.window(layer, HEAD_DIM) for layer in range(N_LAYER)]
        outs = ferry.attention_step(each.sched, each.split, w, each.q, each.kv_len)  # v_trans: the cache's
        graph = outs.graph
        each.sched.compute(graph)
        got.append(np.concatenate([o.to_numpy().reshape(-1) for o in outs]))
    np.testing.assert_allclose(got[0], got[1], rtol=1e-5, atol=1e-6)  # the kernels of each layout round apart


def test_graph_takes_a_steps_outputs() -> None:
    """Graph(attention_step(...)): the list stands for its tensors, as Graph(*outputs) takes them."""
    for fast in (True, False):
        loop = Loop(fast=fast)
        outs = loop.build(16)
        graph = ferry.Graph(outs)
        assert graph.outputs == list(outs)
        assert [t.name for t in graph.nodes] == [t.name for t in outs.graph.nodes]
        loop.kv_len.set(np.array([16, 3], np.int32))
        loop.sched.compute(graph)
        assert ferry.Graph(outs[0], (outs[1],)).outputs == list(outs)
    with pytest.raises(ferry.InvalidArgumentError, match=r"graph build: output 1: expected a Tensor or a list of "
                                                         r"Tensors, got str"):
        ferry.Graph(outs[0], "attn1")  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgumentError, match=r"graph build: output 0\[1\]: expected a Tensor, got str"):
        ferry.Graph([outs[0], "attn1"])  # type: ignore[list-item]


# ---------------------------------------------------------------- the step made in one C call (KVCache.windows)


@pytest.mark.parametrize("type,v_trans", [("f32", False), ("f16", False), ("f16", True)])
def test_the_c_built_step_gives_the_bytes_of_the_python_built_one(type: str, v_trans: bool) -> None:
    """ferry_kv_attention_step against attention_step layer by layer: byte for byte, every step."""
    fast, _ = run(Loop(fast=True, type=type, v_trans=v_trans), steps=12, pad=8, reuse=False)
    slow, _ = run(Loop(fast=False, type=type, v_trans=v_trans), steps=12, pad=8, reuse=False)
    assert fast == slow
    reused, graphs = run(Loop(fast=True, type=type, v_trans=v_trans), steps=12, pad=8, reuse=True)
    assert reused == slow and graphs.builds == 2


def test_the_c_built_step_is_the_python_built_one() -> None:
    """The same outputs (names, flags, shapes, assignments), the same graph, the same split inputs."""
    loop = Loop(fast=True)
    outs = loop.build(16)
    assert isinstance(outs, ferry.step.StepOutputs) and [o.name for o in outs] == [f"attn{i}" for i in range(N_LAYER)]
    assert all(o.is_output for o in outs) and loop.sched.n_assigned == N_LAYER
    graph = outs.graph
    assert graph is outs._graph and graph.outputs == list(outs)
    loop.sched.compute(graph)
    assert all(loop.sched.backend_of(o) is loop.split for o in outs)
    slow_loop = Loop()
    slow = ferry.Graph(*slow_loop.build(16))
    slow_loop.sched.compute(slow)
    assert (graph.n_nodes, graph.n_leafs) == (slow.n_nodes, slow.n_leafs)
    assert [t.name for t in graph.nodes] == [t.name for t in slow.nodes]
    assert [t.ne for t in graph.tensors] == [t.ne for t in slow.tensors]
    assert [(i.src.name, i.copy.ne) for i in loop.sched.inputs] == [(i.src.name, i.copy.ne)
                                                                     for i in slow_loop.sched.inputs]
    # the queries, kv_len and the cache's layers are the Python objects the caller has, not new ones
    assert graph._tensor(loop.q[0]._p) is loop.q[0] and loop.kv_len in graph
    assert graph._tensor(loop.kv.k(1)._p) is loop.kv.k(1)
    # Graph(*outputs) of the same outputs: the same tensors, found the general way
    again = ferry.Graph(*outs)
    assert [t.name for t in again.nodes] == [t.name for t in graph.nodes] and loop.q[1] in again
    assert ferry.Graph(list(outs)) is not graph  # not a StepOutputs: built anew
    changed = ferry.step.StepOutputs(outs[:1])
    changed._graph = graph
    assert changed.graph is not graph  # not the outputs it was built of


def test_the_outputs_keep_the_step_alive() -> None:
    """The context of the step's windows and nodes lives while an output does, and the cache's
    memory while the context does."""
    loop = Loop(fast=True)
    graphs = ferry.StepGraph(loop.sched, loop.build)
    loop.kv_len.set(np.array([5, 6], np.int32))
    graph = graphs.get(8)
    loop.sched.compute(graph)
    out = graph.outputs[1]
    want = out.get()
    del graph
    graphs.clear()
    loop.sched.clear_assignments()
    import gc
    gc.collect()
    assert out.get() == want and out.name == "attn1"
    q, k, v, kv_len = out.srcs  # as an op made in Python gives its operands
    assert q is loop.q[1] and kv_len is loop.kv_len and (k.name, v.name) == ("window_k_l1", "window_v_l1")
    assert k.source is loop.kv.k(1) and k.ne == (HEAD_DIM, 8, N_HEAD_KV, N_STREAM)


def test_a_dropped_step_frees_its_context() -> None:
    """Assignments keep the step's nodes (C compares them by address) until cleared; then it is freed."""
    import gc
    import weakref

    loop = Loop(fast=True)
    outs = loop.build(8)
    step = weakref.ref(outs[0]._deps[0])
    ctx = outs[0]._handle
    del outs
    gc.collect()
    assert step() is not None and ctx.alive
    loop.sched.clear_assignments()
    gc.collect()
    assert step() is None and ctx.ptr is None  # freed, not only released


@pytest.mark.parametrize("fast", [False, True])
def test_closed_objects_refuse_the_c_built_step(fast: bool) -> None:
    """The windows keep the cache's memory (their views work after close), but a graph that reads
    them is refused: the cache's layers are its own, and it was closed; likewise a closed scheduler."""
    loop = Loop(fast=fast)
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
        graphs.get(16)
    loop = Loop(fast=fast)
    graphs = ferry.StepGraph(loop.sched, loop.build)
    graph = graphs.get(8)
    loop.sched.compute(graph)
    loop.sched.close()
    with pytest.raises(ferry.FreedBufferError):
        graphs.get(8)
    with pytest.raises(ferry.FreedBufferError):
        graph.outputs[0].get()
    with pytest.raises(ferry.FreedBufferError):
        ferry.attention_step(loop.sched, loop.split, loop.kv.windows(8), loop.q, loop.kv_len)


def test_the_c_built_step_refuses_bad_input_with_a_ferry_error() -> None:
    """Each refusal a FerryError of the path layer by layer's class; none assigns anything."""
    loop = Loop(fast=True)
    w = loop.kv.windows(16)  # not HEAD_DIM: a V read as transposed would fit
    sched, split, q, kv_len = loop.sched, loop.split, loop.q, loop.kv_len
    other = ferry.CPUBackend()
    f16_q = ferry.Tensor.from_numpy(split, np.ones((N_STREAM, 1, N_HEAD, HEAD_DIM), np.float16))
    one_stream = ferry.Tensor.from_numpy(split, np.ones((1, 1, N_HEAD, HEAD_DIM), np.float32))
    cases = [
        (lambda: ferry.attention_step(sched, split, w, q[:1], kv_len), ferry.InvalidArgumentError, "2 layers"),
        (lambda: ferry.attention_step(sched, split, w, iter(q), kv_len), ferry.InvalidArgumentError, "sequences"),
        (lambda: ferry.attention_step(sched, split, w, [q[0], "q"], kv_len), ferry.InvalidArgumentError, "q\\[1\\]"),
        (lambda: ferry.attention_step(sched, split, w, q, "kv_len"), ferry.InvalidArgumentError, "kv_len"),
        (lambda: ferry.attention_step("sched", split, w, q, kv_len), ferry.InvalidArgumentError, "Scheduler"),
        (lambda: ferry.attention_step(sched, "split", w, q, kv_len), ferry.InvalidArgumentError, "Backend"),
        (lambda: ferry.attention_step(sched, other, w, q, kv_len), ferry.InvalidArgumentError, "not one of"),
        (lambda: ferry.attention_step(sched, split, w, q, kv_len, v_trans=1), ferry.InvalidArgumentError, "bool"),
        (lambda: ferry.attention_step(sched, split, w, q, kv_len, v_trans=True), ferry.InvalidArgumentError,
         "v_trans=True, but the windows' cache stores V not transposed"),
        (lambda: ferry.attention_step(sched, split, w, [q[0], f16_q], kv_len), ferry.LayoutError, "q"),
        (lambda: ferry.attention_step(sched, split, w, [q[0], one_stream], kv_len), ferry.LayoutError, "k"),
        (lambda: ferry.attention_step(sched, split, w, q, q[0]), ferry.LayoutError, "kv_len"),
        (lambda: ferry.attention_step(sched, split, loop.kv.windows(0), q, kv_len), ferry.OutOfBoundsError, "n_kv"),
        (lambda: ferry.attention_step(sched, split, loop.kv.windows(KV_SIZE + 1), q, kv_len),
         ferry.OutOfBoundsError, "n_kv"),
        (lambda: ferry.attention_step(sched, split, loop.kv.windows(8, 1, 0), q, kv_len),
         ferry.OutOfBoundsError, "streams"),
        (lambda: ferry.attention_step(sched, split, loop.kv.windows(8, 0, N_STREAM), q, kv_len),
         ferry.OutOfBoundsError, "streams"),
    ]
    for call, error, match in cases:
        with pytest.raises(error, match=match):
            call()
        assert sched.n_assigned == 0
    with pytest.raises(ferry.InvalidArgumentError):
        loop.kv.windows("8")  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgumentError):
        loop.kv.windows(2**70)
    # a scheduler's input copy lives only until its next alloc: nothing may be built on it
    graph = ferry.attention_step(sched, split, w, q, kv_len).graph
    sched.compute(graph)
    copy = sched.inputs[0].copy
    sched.clear_assignments()
    with pytest.raises(ferry.UnsupportedError):
        ferry.attention_step(sched, split, w, q, copy)
    assert sched.n_assigned == 0


def test_kv_windows_index_as_window_does() -> None:
    loop = Loop()
    w = loop.kv.windows(8, 1)
    assert len(w) == N_LAYER and (w.n_kv, w.s0, w.s1) == (8, 1, N_STREAM - 1)
    k, v = w[1]
    k2, v2 = loop.kv.window(1, 8, 1)
    assert (k.ne, k.nb, k.offset, v.ne, v.name) == (k2.ne, k2.nb, k2.offset, v2.ne, v2.name)
    assert w[-1][0].name == "window_k_l1" and [p[0].name for p in w[:]] == ["window_k_l0", "window_k_l1"]
    with pytest.raises(IndexError):
        w[N_LAYER]
    # a sequence of pairs: attention_step layer by layer takes it too (as a list); its graph is built
    # when asked for, and again each time
    outs = ferry.attention_step(loop.sched, loop.split, list(loop.kv.windows(8)), loop.q, loop.kv_len)
    assert len(outs) == N_LAYER and outs._graph is None and outs.graph is not outs.graph
    assert [t.name for t in outs.graph.outputs] == [t.name for t in outs]
