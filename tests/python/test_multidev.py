"""Several devices in one step: attention_step with a backend per layer gives the bytes of the same
step on one device, under every copy policy, serial and prefetched; each device's splits copy only
its own layers' windows; layer_split is llama.cpp's map of contiguous ranges.

On two stand-ins here; on two CUDA devices of the fake runtime (FERRY_FAKE_CUDART=1, its
FERRY_FAKE_CUDA_DEVICES set to 2 for these tests) or of a machine that has them.
"""

from __future__ import annotations

import bisect
import os
import random
from fractions import Fraction
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
import pytest

import ferry

N_LAYER, N_STREAM, KV_SIZE, HEAD_DIM, N_HEAD_KV, N_HEAD, N_KV = 5, 2, 32, 64, 2, 4, 27
POLICIES = ["flat", "ranges", "plan"]
FAKE = os.environ.get("FERRY_FAKE_CUDART") == "1"


class Step:
    """A cache on the host, q and kv_len on device 0, and a scheduler over both devices and the CPU."""

    def __init__(self, devices: Sequence[ferry.Backend], type: str = "f16", v_trans: bool = False,
                 pinned: bool = False) -> None:
        self.devices = list(devices)
        self.v_trans = v_trans
        self.kv = ferry.KVCache(type, type, HEAD_DIM, N_HEAD_KV, N_STREAM * KV_SIZE, N_STREAM, N_LAYER, v_trans,
                                pinned=pinned)
        rng = np.random.default_rng(5)
        for layer in range(N_LAYER):
            for t in (self.kv.k(layer), self.kv.v(layer)):
                n = int(np.prod(t.ne))
                t.set(ferry.quantize(rng.uniform(-1, 1, n).astype(np.float32), type).tobytes())
        dev0 = self.devices[0]
        self.q = [ferry.Tensor.from_numpy(dev0, rng.uniform(-1, 1, (N_STREAM, 1, N_HEAD, HEAD_DIM))
                                          .astype(np.float32), name=f"q{i}") for i in range(N_LAYER)]
        self.kv_len = ferry.Tensor.from_numpy(dev0, np.array([N_KV - 5, N_KV], np.int32), name="kv_len")
        self.sched = ferry.Scheduler(self.devices + [ferry.CPUBackend()])

    def run(self, on: Sequence[ferry.Backend], policy: str, prefetch: int) -> Tuple[List[bytes], Dict[int, int]]:
        """The step with layer l on on[l]: each output's bytes, and each layer's window bytes copied.
        Checks that a layer's windows (K and V) go to its own device's splits only."""
        sched = self.sched
        sched.policy, sched.prefetch = policy, prefetch
        graphs = ferry.StepGraph(sched, lambda n: ferry.attention_step(sched, list(on), self.kv.windows(n), self.q,
                                                                       self.kv_len, v_trans=self.v_trans))
        graph = graphs.get(N_KV)
        sched.compute(graph)
        outs = [t.get() for t in graph.outputs]
        layers = {(t._ptr): layer for layer in range(N_LAYER) for t in (self.kv.k(layer), self.kv.v(layer))}
        windows: Dict[int, int] = dict.fromkeys(range(N_LAYER), 0)
        copied: Dict[int, int] = dict.fromkeys(range(N_LAYER), 0)
        splits = sched.splits
        for split in splits:
            for inp in split.inputs:
                src = inp.src._p
                root = src.view_src if src.view_src else src
                layer = layers.get(root)
                if layer is not None:
                    assert split.backend._p == on[layer]._p
                    windows[layer] += 1
                    copied[layer] += inp.stats.bytes_copied
        assert windows == dict.fromkeys(range(N_LAYER), 2)
        # one split per run of layers on one device
        runs = 1 + sum(on[i]._p != on[i + 1]._p for i in range(N_LAYER - 1))
        assert len(splits) == runs
        assert (sched.stats.prefetched > 0) == (prefetch > 0)
        return outs, copied


def check_two_devices(make: Callable[[int], ferry.Backend], type: str, v_trans: bool, pinned: bool) -> List[bytes]:
    """Every policy, serial and prefetched: layer_split's map and every other layer on two devices give one
    device's bytes and copy what it copies. Returns the two-device outputs."""
    step = Step([make(0), make(1)], type, v_trans, pinned)
    d0, d1 = step.devices
    two: List[bytes] = []
    for policy in POLICIES:
        for prefetch in (0, 2):
            one, one_copied = step.run([d0] * N_LAYER, policy, prefetch)
            for on in (ferry.layer_split(N_LAYER, [d0, d1]), [d1, d0, d1, d0, d1]):
                two, two_copied = step.run(on, policy, prefetch)
                assert two == one, (policy, prefetch)
                assert two_copied == one_copied
    return two


def test_layer_split_is_llama_cpp_s_even_split() -> None:
    a, b, c = ferry.CPUBackend(), ferry.CPUBackend(), ferry.CPUBackend()
    assert ferry.layer_split(5, [a, b]) == [a, a, a, b, b]
    assert ferry.layer_split(4, [a, b]) == [a, a, b, b]
    assert ferry.layer_split(7, [a, b, c]) == [a, a, a, b, b, c, c]
    assert ferry.layer_split(8, [a, b, c]) == [a, a, a, b, b, b, c, c]
    d = ferry.CPUBackend()
    assert ferry.layer_split(10, [a, b, c, d]) == [a, a, a, b, b, c, c, c, d, d]
    assert ferry.layer_split(2, [a, b, c]) == [a, b]
    assert ferry.layer_split(3, [a]) == [a, a, a]
    for n_layer in range(1, 40):
        for n_dev in range(1, 6):
            devs = [ferry.CPUBackend() for _ in range(n_dev)]
            got = [devs.index(d) for d in ferry.layer_split(n_layer, devs)]
            assert got == sorted(got)  # contiguous ranges, in device order
            # llama.cpp: the first device whose cumulative share (d + 1) / n_dev exceeds l / n_layer
            shares = [Fraction(d + 1, n_dev) for d in range(n_dev)]
            assert got == [bisect.bisect_right(shares, Fraction(layer, n_layer)) for layer in range(n_layer)]
            sizes = [got.count(d) for d in range(n_dev)]
            assert all(size in (n_layer // n_dev, n_layer // n_dev + 1) for size in sizes)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ferry.InvalidArgumentError, match="n_layer"):
            ferry.layer_split(bad, [a])  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgumentError, match="devices"):
        ferry.layer_split(3, [])
    with pytest.raises(ferry.InvalidArgumentError, match=r"devices\[1\]"):
        ferry.layer_split(3, [a, "b"])  # type: ignore[list-item]


@pytest.mark.parametrize("type,v_trans", [("f16", False), ("f16", True), ("q8_0", False)])
def test_two_standins_match_one(type: str, v_trans: bool) -> None:
    check_two_devices(lambda d: ferry.StandinBackend(), type, v_trans, pinned=False)


def test_per_layer_path_matches_the_c_path() -> None:
    """attention_step from windows per layer assigns each layer to its backend as the one C call does."""
    step = Step([ferry.StandinBackend(), ferry.StandinBackend()])
    d0, d1 = step.devices
    on = ferry.layer_split(N_LAYER, [d0, d1])
    fast, _ = step.run(on, "ranges", 0)
    sched = step.sched
    sched.clear_assignments()
    windows = [step.kv.window(layer, N_KV) for layer in range(N_LAYER)]
    outs = ferry.attention_step(sched, on, windows, step.q, step.kv_len)
    graph = outs.graph
    sched.compute(graph)
    assert [t.get() for t in outs] == fast
    assert [sched.backend_of(t) for t in outs] == on


def test_refusals_name_the_layer() -> None:
    step = Step([ferry.StandinBackend(), ferry.StandinBackend()])
    d0, d1 = step.devices
    sched, w, q, kv_len = step.sched, step.kv.windows(N_KV), step.q, step.kv_len
    stranger = ferry.StandinBackend()
    per_layer = [step.kv.window(layer, N_KV) for layer in range(N_LAYER)]
    cases = [
        ([d0, d1, d0, stranger, d1], "layer 3", w),
        ([d0, d1, d0, stranger, d1], "layer 3", per_layer),
        ([d0, d1, d0, "d1", d1], "layer 3", w),
        ([d0, d1], "2 backends for 5 layers", w),
        ("d0", "Backend", w),
        (iter([d0] * N_LAYER), "Backend", w),
    ]
    for backends, match, windows in cases:
        with pytest.raises(ferry.InvalidArgumentError, match=match):
            ferry.attention_step(sched, backends, windows, q, kv_len)  # type: ignore[arg-type]
        if windows is w:
            assert sched.n_assigned == 0


def cuda_devices() -> int:
    return ferry.cuda_device_count() if ferry.cuda_available() else 0


@pytest.fixture
def two_cuda_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two CUDA devices: the fake runtime presents them when asked; a GPU machine needs two."""
    if FAKE:
        monkeypatch.setenv("FERRY_FAKE_CUDA_DEVICES", "2")
    if cuda_devices() < 2:
        pytest.skip("fewer than two CUDA devices")


@pytest.mark.parametrize("type,v_trans", [("f16", False), ("f16", True), ("q8_0", False)])
def test_two_cuda_devices_match_one_and_the_standins(two_cuda_devices: None, type: str, v_trans: bool) -> None:
    cuda = check_two_devices(ferry.CUDABackend, type, v_trans, pinned=True)
    standin = check_two_devices(lambda d: ferry.StandinBackend(), type, v_trans, pinned=False)
    for a, b in zip(cuda, standin):
        x, y = np.frombuffer(a, np.float32), np.frombuffer(b, np.float32)
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


def test_a_cuda_backend_on_device_1_holds_its_data_and_a_missing_device_is_refused(two_cuda_devices: None) -> None:
    b = ferry.CUDABackend(device=1)
    assert b.device == 1 and "1" in b.name
    t = ferry.Tensor.from_numpy(b, np.arange(16, dtype=np.float32))
    assert np.array_equal(np.frombuffer(t.get(), np.float32), np.arange(16, dtype=np.float32))
    with pytest.raises(ferry.FerryError):
        ferry.CUDABackend(device=2)


# ---------------------------------------------------------------- the placement matrix
#
# Every placement of the layers' KV (host, or the memory of the device that runs the layer) on
# one, two and three devices, under every policy, serial and prefetched, f16 and q8_0, V plain
# and transposed (f16): the outputs of the all-host one-device run, byte for byte; a resident
# layer copies nothing, a host layer exactly what the all-host one-device run copies for it.

M_LAYER, M_STREAM, M_KV_SIZE, M_HEAD_DIM, M_HEAD_KV, M_HEAD, M_N_KV = 6, 2, 16, 32, 1, 2, 13
_placement_rng = random.Random(22)
PLACEMENTS = {
    "all host": [False] * M_LAYER,
    "all device": [True] * M_LAYER,
    "first 2": [layer < 2 for layer in range(M_LAYER)],
    "every other": [layer % 2 == 0 for layer in range(M_LAYER)],
    "random": [_placement_rng.random() < 0.5 for _ in range(M_LAYER)],
}
MATRIX_CASES = [("f16", False), ("f16", True), ("q8_0", False)]

#: One run: the outputs' bytes, and per layer the bytes its windows copied.
Run = Tuple[List[bytes], List[int]]


class Matrix:
    """The cache's values, the queries and kv_len of one case, run over any devices and placement."""

    def __init__(self, type: str, v_trans: bool, pinned: bool) -> None:
        self.type, self.v_trans, self.pinned = type, v_trans, pinned
        rng = np.random.default_rng(23)
        n_embd = M_HEAD_DIM * M_HEAD_KV
        self.values = [[ferry.quantize(rng.uniform(-1, 1, M_STREAM * M_KV_SIZE * n_embd).astype(np.float32), type)
                        .tobytes() for _ in "kv"] for _ in range(M_LAYER)]
        self.q = rng.uniform(-1, 1, (M_LAYER, M_STREAM, 1, M_HEAD, M_HEAD_DIM)).astype(np.float32)

    def run_all(self, devices: Sequence[ferry.Backend], resident: Sequence[bool],
                runs: Sequence[Tuple[str, int]]) -> Dict[Tuple[str, int], Run]:
        """The step with layer_split's map over devices, each resident layer in its own device's
        memory, for each (policy, prefetch) of runs. Checks that every layer runs on its device and
        that a window goes to its own layer's device only, a resident layer's to none."""
        on = ferry.layer_split(M_LAYER, list(devices))
        kv = ferry.KVCache(self.type, self.type, M_HEAD_DIM, M_HEAD_KV, M_STREAM * M_KV_SIZE, M_STREAM, M_LAYER,
                           self.v_trans, pinned=self.pinned,
                           placement=[on[layer] if r else None for layer, r in enumerate(resident)])
        for layer, (k, v) in enumerate(self.values):
            kv.k(layer).set(k)
            kv.v(layer).set(v)
        dev0 = devices[0]
        q = [ferry.Tensor.from_numpy(dev0, self.q[layer]) for layer in range(M_LAYER)]
        kv_len = ferry.Tensor.from_numpy(dev0, np.array([M_N_KV, 6], np.int32))
        layers = {t._ptr: layer for layer in range(M_LAYER) for t in (kv.k(layer), kv.v(layer))}
        out: Dict[Tuple[str, int], Run] = {}
        with ferry.Scheduler(list(devices) + [ferry.CPUBackend()]) as sched:
            for policy, prefetch in runs:
                sched.policy, sched.prefetch = policy, prefetch
                steps = ferry.StepGraph(sched, lambda n: ferry.attention_step(sched, on, kv.windows(n), q, kv_len,
                                                                              v_trans=self.v_trans))
                graph = steps.get(M_N_KV)
                sched.compute(graph)
                assert [sched.backend_of(t) for t in graph.outputs] == on
                copied, windows = [0] * M_LAYER, [0] * M_LAYER
                for split in sched.splits:
                    for inp in split.inputs:
                        src = inp.src._p
                        layer = layers.get(src.view_src if src.view_src else src)
                        if layer is not None:
                            assert split.backend._p == on[layer]._p, (policy, prefetch, layer)
                            windows[layer] += 1
                            copied[layer] += inp.stats.bytes_copied
                assert windows == [0 if r else 2 for r in resident], (policy, prefetch)
                out[policy, prefetch] = [t.get() for t in graph.outputs], copied
        kv.close()
        return out


def check_matrix(make: Callable[[int], ferry.Backend], type: str, v_trans: bool, pinned: bool) -> List[bytes]:
    """Every placement on one, two and three devices of make, every policy, serial and prefetched,
    against the all-host run on one; returns that run's outputs."""
    devices = [make(d) for d in range(3)]
    m = Matrix(type, v_trans, pinned)
    runs = [(policy, prefetch) for policy in POLICIES for prefetch in (0, 1)]
    ref = m.run_all(devices[:1], [False] * M_LAYER, runs)
    want = ref["ranges", 0][0]
    for n_dev in (1, 2, 3):
        for name, resident in PLACEMENTS.items():
            got = m.run_all(devices[:n_dev], resident, runs)
            for run in runs:
                outs, copied = got[run]
                assert outs == want, (name, n_dev, run)
                # a resident layer copies nothing; a host layer what it copies in the all-host one-device run
                assert copied == [0 if r else c for r, c in zip(resident, ref[run][1])], (name, n_dev, run)
    assert all(c > 0 for c in ref["ranges", 0][1])
    return want


def test_the_matrixs_random_placement_mixes_host_and_device_layers() -> None:
    resident = PLACEMENTS["random"]
    assert any(resident) and not all(resident)
    assert resident not in [p for name, p in PLACEMENTS.items() if name != "random"]


@pytest.mark.parametrize("type,v_trans", MATRIX_CASES)
def test_every_placement_on_1_2_3_standins_gives_the_all_host_outputs_and_copies(type: str, v_trans: bool) -> None:
    check_matrix(lambda d: ferry.StandinBackend(), type, v_trans, pinned=False)


@pytest.fixture
def three_cuda_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three CUDA devices: the fake runtime presents them when asked; a GPU machine needs three."""
    if FAKE:
        monkeypatch.setenv("FERRY_FAKE_CUDA_DEVICES", "3")
    if cuda_devices() < 3:
        pytest.skip("fewer than three CUDA devices")


@pytest.mark.parametrize("type,v_trans", MATRIX_CASES)
def test_every_placement_on_1_2_3_cuda_devices_gives_the_all_host_outputs_and_copies(three_cuda_devices: None, type: str, v_trans: bool) -> None:
    """Byte for byte the all-host one-device CUDA run; to rounding, the stand-ins'."""
    cuda = check_matrix(ferry.CUDABackend, type, v_trans, pinned=True)
    standin = check_matrix(lambda d: ferry.StandinBackend(), type, v_trans, pinned=False)
    for a, b in zip(cuda, standin):
        np.testing.assert_allclose(np.frombuffer(a, np.float32), np.frombuffer(b, np.float32), rtol=1e-5, atol=1e-5)
