"""The thread a remote tier (ferry.remote.tier) runs its engine's calls on, one at a time, each
under the tier's timeout."""

from __future__ import annotations

import queue
import threading
from typing import Any, List, Optional, Tuple


class _EngineWorker:
    """A thread that runs the engine calls handed to it, one at a time, while the caller waits with
    its timeout: a call costs a hand-off, not a thread started and joined. stop() lets it end once
    the call it runs (if any) returned; a finalizer does so for a tier dropped unclosed."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._jobs: "queue.SimpleQueue[Optional[Tuple[Any, List[int], threading.Lock]]]" = queue.SimpleQueue()
        self.busy = threading.Lock()  # held by the caller whose call it runs (RemoteTier._call_engine)
        self.thread = threading.Thread(target=self._serve, name="ferry-remote-engine", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self._run_one(*job)
            del job  # the call's closure may hold the tier: not kept while idle

    def _run_one(self, call: Any, result: List[int], done: threading.Lock) -> None:
        try:
            result.append(call(self._engine))
        except BaseException as e:  # reported as a thread's own would be; the caller sees no result
            threading.excepthook(threading.ExceptHookArgs((type(e), e, e.__traceback__, self.thread)))
        finally:
            done.release()

    def run(self, call: Any, timeout: float) -> Tuple[bool, List[int]]:
        """call(engine) on the thread: whether it ended within timeout seconds, and its result ([]
        when it raised)."""
        result: List[int] = []
        done = threading.Lock()
        done.acquire()
        self._jobs.put((call, result, done))
        return done.acquire(timeout=timeout), result

    def stop(self, wait_s: float = 0.0) -> None:
        """End the thread once it is idle (at once when it is; after its call when one runs),
        waiting up to wait_s seconds for it."""
        self._jobs.put(None)
        if wait_s > 0 and threading.current_thread() is not self.thread:
            self.thread.join(wait_s)
