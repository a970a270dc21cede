"""Counters, one Python type per C stats struct: what a buffer or backend moved per kind of
transfer (Stats: ferry_stats), what one input copy did (CopyStats: ferry_copy_stats), the
totals of a scheduler's run (SchedStats: ferry_sched_stats), and what a stand-in device's
link carried (LinkStats: ferry_link_stats). Each has from_c, the one way a C struct becomes
one. MemoryInfo is what a backend says of its memory (Backend.memory)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, NamedTuple, Optional, Tuple

from ._binding import ffi, lib
from .errors import check
from .policy import CopyPolicy, GatherMethod

#: The transfer kinds, in ferry_xfer order: set, get, set_2d, get_2d, copy, memset.
KINDS: Tuple[str, ...] = tuple(ffi.string(lib.ferry_xfer_name(k)).decode() for k in range(lib.FERRY_XFER_COUNT))


@dataclass(frozen=True)
class Stats:
    """A snapshot of a buffer's or backend's transfer counters (ferry_stats).

    The counts are cumulative: since the buffer or backend was made, or since its
    reset_stats(). Subtracting two snapshots gives what moved in between. Each dict is keyed by
    the transfer kinds, KINDS: "set", "get", "set_2d", "get_2d", "copy", "memset".

    Attributes
    ----------
    calls : dict of str to int
        Transfer requests as made through the API: a 2-D set of n rows is one call.
    bytes : dict of str to int
        Bytes those requests moved (a 2-D set of n rows of s bytes: n*s).
    impl_calls : dict of str to int
        Operations that carried the requests out: the same 2-D set is n plain sets on a
        backend without a 2-D implementation, one call on a backend with one.
    """

    calls: Dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    bytes: Dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    impl_calls: Dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))

    @classmethod
    def from_c(cls, s: Any) -> "Stats":
        """A Stats holding the values of the ferry_stats cdata s."""
        return cls(
            calls={k: int(s.calls[i]) for i, k in enumerate(KINDS)},
            bytes={k: int(s.bytes[i]) for i, k in enumerate(KINDS)},
            impl_calls={k: int(s.impl_calls[i]) for i, k in enumerate(KINDS)},
        )

    @property
    def total_bytes(self) -> int:
        """Bytes moved by every kind together."""
        return sum(self.bytes.values())

    def __sub__(self, other: "Stats") -> "Stats":
        return Stats(
            calls={k: self.calls[k] - other.calls[k] for k in KINDS},
            bytes={k: self.bytes[k] - other.bytes[k] for k in KINDS},
            impl_calls={k: self.impl_calls[k] - other.impl_calls[k] for k in KINDS},
        )

    def __repr__(self) -> str:
        moved = [f"{k}: {self.calls[k]} calls {self.bytes[k]} B ({self.impl_calls[k]} impl)"
                 for k in KINDS if self.calls[k] or self.impl_calls[k]]
        return f"<Stats {', '.join(moved) if moved else 'nothing moved'}>"


class Counted:
    """stats and reset_stats of an object whose C struct counts its transfers (a Buffer's, a
    Backend's ferry_stats). A subclass names its C getter and resetter and has _p."""

    _get_stats: ClassVar[Any]  # ferry_status (*)(const T *, ferry_stats *)
    _reset_stats: ClassVar[Any]  # void (*)(T *)
    _p: Any

    @property
    def stats(self) -> Stats:
        """What was moved through the object: counts since it was made or reset_stats()."""
        out = ffi.new("ferry_stats *")
        check(type(self)._get_stats(self._p, out))
        return Stats.from_c(out)

    def reset_stats(self) -> None:
        """Set every transfer counter to 0."""
        type(self)._reset_stats(self._p)


@dataclass(frozen=True)
class _CopyFigures:
    """The figures of copies of inputs, one copy's (CopyStats) or a run's totals (SchedStats):
    the same fields of ferry_copy_stats and ferry_sched_stats, each class saying what they mean."""

    bytes_read: int
    bytes_span: int
    bytes_copied: int
    copy_calls: int
    impl_calls: int
    copy_seconds: float
    predicted_seconds: float

    @staticmethod
    def _figures(s: Any) -> Dict[str, Any]:
        """The shared fields of the C struct s, by name."""
        return {"bytes_read": int(s.bytes_read), "bytes_span": int(s.bytes_span), "bytes_copied": int(s.bytes_copied),
                "copy_calls": int(s.copy_calls), "impl_calls": int(s.impl_calls),
                "copy_seconds": float(s.copy_seconds), "predicted_seconds": float(s.predicted_seconds)}


@dataclass(frozen=True)
class CopyStats(_CopyFigures):
    """What one copy of one input did (ferry_copy_stats): copy_input's result, and each
    Scheduler.inputs entry's figures for the last run.

    Attributes
    ----------
    path : CopyPolicy
        The path taken: the policy asked for, or FLAT when its rule did not apply.
    bytes_read : int
        Bytes the graph reads through the input, the same under every policy (flat, ranges, plan
        and ragged alike): for a window carrying its streams' lengths in host memory, the cells
        those lengths cover, one stream after another; for any other input, the distinct bytes of
        its elements (copy_path.bytes_read).
    bytes_span : int
        The input's nbytes: what a flat copy moves, gaps included.
    bytes_copied : int
        Bytes that arrived in the destination buffer.
    copy_calls : int
        Transfer requests made (a 2-D copy is one).
    impl_calls : int
        Operations that carried them out (a 2-D copy on a backend without 2-D transfers is one
        per row).
    copy_seconds : float
        Wall time of the copy in seconds, synchronize included; for an input the scheduler
        prefetched, the time its copy queue spent on it (measured by events); 0 for a copy
        queued and not waited for.
    predicted_seconds : float
        What the copies made take by the copy cost model of the backend that made them
        (CopyCostModel.of_backend): the model's prediction beside copy_seconds.
    gather : GatherMethod or None
        How a paged window was gathered (its path is then the policy asked for: every policy
        gathers it); None for any other input.
    """

    path: CopyPolicy
    gather: Optional[GatherMethod] = None

    @classmethod
    def from_c(cls, s: Any) -> "CopyStats":
        """A CopyStats holding the values of the ferry_copy_stats cdata s."""
        gather = GatherMethod(s.gather) if s.gather != lib.FERRY_GATHER_AUTO else None
        return cls(path=CopyPolicy(s.path), gather=gather, **cls._figures(s))


@dataclass(frozen=True)
class SchedStats(_CopyFigures):
    """What a Scheduler's last compute did (ferry_sched_stats): totals over all its inputs and
    splits for that one run, not cumulative; each compute starts them again from 0.

    Attributes
    ----------
    n_inputs : int
        Split inputs of the graph: sources a split's backend cannot read where they are, each
        copied to it.
    bytes_read : int
        Bytes the graph reads through them (CopyStats.bytes_read, summed): the same under every
        policy, a window with lengths counting the cells they cover, not its whole layout.
    bytes_span : int
        Their spans (nbytes, gaps included): what flat copies of all of them would move.
    bytes_copied : int
        Bytes that arrived on the splits' backends.
    copy_calls : int
        Transfer requests the copies made.
    impl_calls : int
        Operations that carried those requests out (a 2-D copy is one per row on a backend
        without 2-D transfers).
    copy_seconds : float
        Seconds spent copying inputs, synchronize included; a prefetched input counts its
        time on its copy queue.
    predicted_seconds : float
        What those copies take by each backend's copy cost model (CopyStats.predicted_seconds,
        summed).
    compute_seconds : float
        Seconds the splits' backends spent computing, each part synchronized.
    prefetched : int
        Inputs copied ahead on a copy queue (Scheduler.prefetch); 0 without prefetching.
    ahead_inputs : int
        The most prefetched inputs queued or held ahead of the part computing, over the run's
        parts: what the prefetch depth asks of the graph as allocated.
    ahead_bytes : int
        Their bytes (the copies' nbytes) at that most: device memory prefetching holds beyond
        what the part at hand reads.
    wait_seconds : float
        Seconds the host waited for prefetched copies; on CUDA the device waits instead and
        this stays near 0.
    kept_ahead : int
        Across runs (Scheduler.prefetch_next): inputs the last run copied ahead for this one and
        this one kept, copying only the cells each stream gained since (one with a stream whose
        length fell is copied again, and not counted).
    fetched : int
        Inputs whose window a remote tier fetched into host memory before its copy
        (ferry.fetch.set_fetch, RemoteTier.fetch_layers).
    fetch_wait_seconds : float
        Seconds the host waited for those fetches (a fetch begun ahead and landed under compute
        waits little).
    """

    n_inputs: int
    compute_seconds: float
    prefetched: int = 0
    ahead_inputs: int = 0
    ahead_bytes: int = 0
    wait_seconds: float = 0.0
    kept_ahead: int = 0
    fetched: int = 0
    fetch_wait_seconds: float = 0.0

    @classmethod
    def from_c(cls, s: Any) -> "SchedStats":
        """A SchedStats holding the values of the ferry_sched_stats cdata s."""
        return cls(n_inputs=int(s.n_inputs), compute_seconds=float(s.compute_seconds), prefetched=int(s.prefetched),
                   ahead_inputs=int(s.ahead_inputs), ahead_bytes=int(s.ahead_bytes),
                   wait_seconds=float(s.wait_seconds), kept_ahead=int(s.kept_ahead), fetched=int(s.fetched),
                   fetch_wait_seconds=float(s.fetch_wait_seconds), **cls._figures(s))


#: What a backend without a memory limit says (C's SIZE_MAX).
SIZE_MAX = 2**64 - 1


@dataclass(frozen=True)
class LinkStats:
    """What a stand-in device's link carried (StandinBackend.link_stats), both directions, the
    copy queue's transfers included; only a modelled link (a bandwidth, a latency or a row cost)
    counts.
    Cumulative since the backend was made or reset_link_stats.

    A transfer is late when the host's copy alone ended after the link's modelled end: the
    host could not copy that fast, and the link is not reached. A busy or preempted host
    shows late transfers too.

    Attributes
    ----------
    transfers : int
        Transfers over the link.
    bytes : int
        Their bytes.
    modelled_seconds : float
        latency + rows * row cost + bytes / bandwidth, summed over the transfers.
    copy_seconds : float
        The time the host's copies themselves took.
    late : int
        Transfers whose copy alone ended after the link's modelled end.
    late_seconds : float
        How far past their modelled ends those copies ended, summed.
    computes : int
        Graph computes on the device (counted with or without a modelled link).
    compute_host_seconds : float
        The host's own time for them; with a compute slowdown F each is held to F times its own.
    rows : int
        Rows the link charged its row cost for: those of 2-D transfers of more than one row.
    """

    transfers: int
    bytes: int
    modelled_seconds: float
    copy_seconds: float
    late: int
    late_seconds: float
    computes: int = 0
    compute_host_seconds: float = 0.0
    rows: int = 0

    @classmethod
    def from_c(cls, s: Any) -> "LinkStats":
        """A LinkStats holding the values of the ferry_link_stats cdata s."""
        return cls(int(s.transfers), int(s.bytes), float(s.modelled_seconds), float(s.copy_seconds), int(s.late),
                   float(s.late_seconds), int(s.computes), float(s.compute_host_seconds), int(s.rows))

    @property
    def host_gbps(self) -> Optional[float]:
        """The rate the host's copies reached, in GB/s (1e9 bytes a second); None before any."""
        return self.bytes / self.copy_seconds / 1e9 if self.copy_seconds > 0 else None

    @property
    def reached(self) -> bool:
        """Whether every transfer kept to the link's model (no late one)."""
        return self.late == 0


class MemoryInfo(NamedTuple):
    """A backend's memory (Backend.memory), in bytes: what is free now, and the total.

    CUDA's is cudaMemGetInfo's; the CPU's, and a dummy's with real memory, the host's; a
    stand-in device's its memory size, or the host's without one. A dummy backend without
    real memory has nothing behind its addresses: both are SIZE_MAX (unlimited is True).

    Attributes
    ----------
    free : int
        Bytes free now.
    total : int
        Bytes in all.
    """

    free: int
    total: int

    @property
    def used(self) -> int:
        """total - free."""
        return self.total - self.free

    @property
    def unlimited(self) -> bool:
        """No limit at all (a synthetic dummy backend)."""
        return self.total == SIZE_MAX
