"""A run's timeline as a Chrome trace (the JSON Perfetto and chrome://tracing open).

Each traced run is a process of the trace, named by its label ("npl 2 ranges+overlap"), with two
threads: the calling thread (its blocking copies, its waits for prefetched copies and each
layer's compute) and the copy queue (the copies prefetched on it). Its decode steps follow one
another, each at its own length (Scheduler.trace gives a step's spans from its start), so that a
copy made ahead for a step (Scheduler.prefetch_next) shows before the step's start, under the end
of the step before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Sequence

from ..sched import Span

__all__ = ["TracedStep", "chrome_trace"]

#: The trace's thread of each kind of span.
THREADS = {"copy": "host thread", "wait": "host thread", "compute": "host thread", "fetch wait": "host thread",
           "queued copy": "copy queue"}


@dataclass(frozen=True)
class TracedStep:
    """One decode step of a traced run.

    Attributes
    ----------
    spans : tuple of Span
        Its timeline (Scheduler.trace).
    seconds : float
        Its decode time (Scheduler.compute's wall time).
    inputs : tuple of str
        The name of each of its split inputs (Scheduler.inputs), which a copy span indexes.
    """

    spans: Sequence[Span]
    seconds: float
    inputs: Sequence[str]


def chrome_trace(runs: Mapping[str, Sequence[TracedStep]]) -> Dict[str, object]:
    """The runs' steps as a Chrome trace: complete events ("ph": "X"), times in microseconds.

    Parameters
    ----------
    runs : mapping of str to sequence of TracedStep
        Per run's label, its steps in order.

    Returns
    -------
    dict
        {"traceEvents": [...], "displayTimeUnit": "ns"}: json.dump it to a file.
    """
    events: List[Dict[str, object]] = []
    for pid, (label, steps) in enumerate(runs.items(), start=1):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": label}})
        for tid, thread in enumerate(("host thread", "copy queue"), start=1):
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": thread}})
        t0 = max([0.0, *(-sp.start for sp in steps[0].spans)]) if steps else 0.0  # the first step's copy ahead
        for n, step in enumerate(steps):
            for sp in step.spans:
                what = sp.kind if sp.input < 0 else f"{sp.kind} {step.inputs[sp.input]}"
                events.append({"name": f"{what} (part {sp.part})", "cat": sp.kind, "ph": "X", "pid": pid,
                               "tid": 1 if THREADS[sp.kind] == "host thread" else 2,
                               "ts": (t0 + sp.start) * 1e6, "dur": (sp.end - sp.start) * 1e6,
                               "args": {"step": n, "part": sp.part, "input": sp.input}})
            t0 += step.seconds
    return {"traceEvents": events, "displayTimeUnit": "ns"}
