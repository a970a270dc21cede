"""Calls run in a worker process: a new Python interpreter per call, as pyperf runs its benchmarks.

A process's memory layout (where ASLR puts the library and the heap, what the allocator's
arenas hold) moves a measurement by more than the measurements made inside one process vary:
replicas made in one process agree with each other more than with another process's. `call`
runs a function in a new interpreter (`python -m ferry.workloads.workers`), so that replicas
made in several calls vary as runs do.

The function is named as "module:function" (the worker imports it), its arguments and result
travel pickled: this is ferry talking to itself, one version on both ends. Its last argument is
an on_step callable, which the worker passes on to the parent's in batches (a message at most
every PROGRESS_S seconds: the parent wakes that seldom while the worker measures). An exception
the function raises is raised again in the parent; a worker that dies before it reports raises
FerryError with its exit status.
"""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
import time
import traceback
from typing import Any, BinaryIO, Callable, Optional, Sequence

from ..errors import FerryError

#: Seconds between the worker's progress messages, at most one message each.
PROGRESS_S = 0.25


def call(target: str, args: Sequence[Any], on_step: Optional[Callable[[str], None]] = None) -> Any:
    """target(*args, on_step) in a new Python process.

    Parameters
    ----------
    target : str
        "module:function", importable in the worker (the same interpreter, sys.executable, and
        environment).
    args : sequence
        The function's arguments but the last, picklable.
    on_step : callable, optional
        Called in this process with each label the function passed its own on_step, in batches.

    Returns
    -------
    object
        What the function returned.

    Raises
    ------
    Exception
        What the function raised, raised again here (a RuntimeError with its traceback's text when it
        cannot be pickled).
    FerryError
        When the worker ends without reporting (it crashed or was killed).
    """
    proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        pickle.dump((target, tuple(args)), proc.stdin)
        proc.stdin.close()
        while True:
            try:
                kind, value = pickle.load(proc.stdout)
            except EOFError:
                status = proc.wait()
                raise FerryError(f"a worker process running {target} ended (exit status {status}) before it "
                                 f"reported") from None
            if kind == "steps":
                label, n = value
                if on_step is not None:
                    for _ in range(n):
                        on_step(label)
            elif kind == "result":
                proc.wait()  # it exits once it has reported
                return value
            else:
                raise value
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


class _Batches:
    """The on_step a worker's function is given: labels counted, sent at most every PROGRESS_S."""

    def __init__(self, out: BinaryIO, clock: Callable[[], float] = time.perf_counter) -> None:
        self.out, self.clock = out, clock
        self.label, self.n, self.sent = "", 0, clock()

    def __call__(self, label: str) -> None:
        if label != self.label and self.n:
            self.flush()
        self.label = label
        self.n += 1
        if self.clock() - self.sent >= PROGRESS_S:
            self.flush()

    def flush(self) -> None:
        if self.n:
            _send(self.out, "steps", (self.label, self.n))
        self.n, self.sent = 0, self.clock()


def _send(out: BinaryIO, kind: str, value: Any) -> None:
    pickle.dump((kind, value), out)
    out.flush()


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    """The worker's side: read (target, args) from inp, call it, write its progress and then its result
    (or the exception it raised) to out, each message a pickled (kind, value)."""
    target, args = pickle.load(inp)
    steps = _Batches(out)
    try:
        module, _, name = target.partition(":")
        result = getattr(importlib.import_module(module), name)(*args, steps)
    except Exception as e:
        steps.flush()
        try:
            payload = pickle.dumps(("error", e))
        except Exception:  # what pickle refuses goes back as its traceback's text
            payload = pickle.dumps(("error", RuntimeError("".join(traceback.format_exception(e)))))
        out.write(payload)
        out.flush()
        return
    steps.flush()
    _send(out, "result", result)


def main() -> None:
    """`python -m ferry.workloads.workers`: serve one call over the pipes the parent gave it as file
    descriptors 0 and 1; descriptor 1 then points at 2, so that what the function prints goes to
    the parent's stderr and cannot land among the messages."""
    with os.fdopen(0, "rb", closefd=False) as inp, os.fdopen(os.dup(1), "wb") as out:
        os.dup2(2, 1)
        serve(inp, out)


if __name__ == "__main__":
    main()
