"""ferry.workloads.workers: a call in a new Python process, its progress, its result, its failures."""

from __future__ import annotations

import io
import os
import pickle
import textwrap
from pathlib import Path
from typing import Any, List, Tuple

import pytest

from ferry import FerryError, InvalidArgumentError
from ferry.workloads import bench, workers

TARGETS = textwrap.dedent('''
    import os

    def count(n, on_step):
        """n steps, each reported; returns what the worker's own process is."""
        for i in range(n):
            on_step("a" if i < n // 2 else "b")
        return n * 2, os.getpid()

    def fail(on_step):
        on_step("before")
        raise ValueError("refused here")

    class Odd(Exception):
        def __init__(self):
            super().__init__("no pickle")
            self.held = lambda: None

    def fail_oddly(on_step):
        raise Odd()

    def die(on_step):
        on_step("last words")
        os._exit(3)
''')


@pytest.fixture
def targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of targets, importable here and in a worker (PYTHONPATH, which the worker inherits)."""
    (tmp_path / "worker_targets.py").write_text(TARGETS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return "worker_targets"


def test_a_call_runs_in_another_process_and_reports_each_step(targets: str) -> None:
    seen: List[str] = []
    doubled, pid = workers.call(f"{targets}:count", (5,), seen.append)
    assert doubled == 10 and pid != os.getpid()
    assert seen == ["a", "a", "b", "b", "b"]
    assert workers.call(f"{targets}:count", (3,))[0] == 6  # no on_step: the steps are dropped


def test_the_functions_exception_is_raised_again_here(targets: str) -> None:
    seen: List[str] = []
    with pytest.raises(ValueError, match="refused here"):
        workers.call(f"{targets}:fail", (), seen.append)
    assert seen == ["before"]  # what it reported before it failed still arrives
    with pytest.raises(RuntimeError, match="Odd: no pickle"):  # an exception pickle refuses: its traceback
        workers.call(f"{targets}:fail_oddly", ())
    with pytest.raises(ModuleNotFoundError, match="no_such_module"):
        workers.call("no_such_module:f", ())


def test_a_worker_that_dies_before_it_reports_raises_ferry_error(targets: str) -> None:
    with pytest.raises(FerryError, match=r"worker_targets:die ended \(exit status 3\) before it reported"):
        workers.call(f"{targets}:die", ())


def serve(target: str, args: Tuple[Any, ...]) -> List[Tuple[str, Any]]:
    """workers.serve in this process: the messages it writes."""
    out = io.BytesIO()
    workers.serve(io.BytesIO(pickle.dumps((target, args))), out)
    out.seek(0)
    messages = []
    while out.tell() < len(out.getvalue()):
        messages.append(pickle.load(out))
    return messages


def test_serve_writes_progress_then_the_result_or_the_error(targets: str) -> None:
    assert serve(f"{targets}:count", (4,)) == [("steps", ("a", 2)), ("steps", ("b", 2)),
                                                ("result", (8, os.getpid()))]
    kinds = serve(f"{targets}:fail", ())
    assert kinds[0] == ("steps", ("before", 1)) and kinds[1][0] == "error" and isinstance(kinds[1][1], ValueError)


def test_progress_goes_in_batches_at_most_every_progress_s() -> None:
    out, now = io.BytesIO(), [0.0]
    steps = workers._Batches(out, clock=lambda: now[0])
    for _ in range(100):
        steps("x")
    assert out.getvalue() == b""  # the same label, no time passed: nothing sent yet
    now[0] = workers.PROGRESS_S
    steps("x")
    steps.flush()
    out.seek(0)
    assert pickle.load(out) == ("steps", ("x", 101))


def tiny(**kw: Any) -> bench.BenchConfig:
    base: dict = dict(n_ctx=256, npl=(2,), npp=16, ntg=3, n_layer=1, n_head=4, head_dim=32, n_head_kv=2,
                      policies=("flat", "ranges"), device="cpu", repeat=2, min_sample_ms=0.0)
    base.update(kw)
    return bench.BenchConfig(**base)  # type: ignore[arg-type]


def test_a_bench_wave_in_a_worker_gives_what_it_gives_here() -> None:
    cfg = tiny()
    seen: List[str] = []
    there = workers.call("ferry.workloads.bench:worker_wave", (cfg, [2], {}), seen.append)
    here = bench.run_bench(tiny(repeat=1))
    assert there.device_names == ["CPU (stand-in device)"] and not there.pinned
    assert len(there.rows[2]) == 1 and there.loops == {2: 1}
    rows = there.rows[2][0]
    assert [(r.policy, r.unified, r.bytes_copied, r.output_sha256) for r in rows] == [
        (r.policy, r.unified, r.bytes_copied, r.output_sha256) for r in here.rows]
    # every step of the warm-up and the samples, reported: 4 variant runs, 3 steps each
    assert len(seen) == 4 * cfg.ntg * (bench.WARMUP + cfg.replica_samples(1))
    with pytest.raises(InvalidArgumentError, match="-npp"):  # checked in the worker, raised here
        workers.call("ferry.workloads.bench:worker_wave", (tiny(npp=-1), [2], {}))


def test_replicas_run_in_workers_unless_one_or_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    called: List[str] = []
    real = workers.call

    def call(target: str, args: Any, on_step: Any = None) -> Any:
        called.append(target)
        return real(target, args, on_step)

    monkeypatch.setattr(workers, "call", call)
    res = bench.run_bench(tiny(repeat=3))
    assert called == ["ferry.workloads.bench:worker_wave"] * 3  # a worker per replica (of every npl)
    assert res.sampling[2].replicas == 3 and res.split_name == "CPU (stand-in device)"
    assert len({r.output_sha256 for r in res.rows}) == 1 and res.outputs_identical(2)
    called.clear()
    assert bench.run_bench(tiny(repeat=3, in_process=True)).sampling[2].replicas == 3
    assert bench.run_bench(tiny(repeat=1)).sampling[2].replicas == 1
    assert called == []

