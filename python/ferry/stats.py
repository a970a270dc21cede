"""Counters, one Python type per C stats struct: what a buffer or backend moved per kind of
transfer (Stats: ferry_stats), what one input copy did (CopyStats: ferry_copy_stats), the
totals of a scheduler's run (SchedStats: ferry_sched_stats), and what a stand-in device's
link carried (LinkStats: ferry_link_stats). Each has from_c, the one way a C struct becomes
one. MemoryInfo is what a backend says of its memory (Backend.memory)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, NamedTuple, Optional, Tuple

from ._binding import ffi, lib
from .policy import CopyPolicy

#: The transfer kinds, in ferry_xfer order: set, get, set_2d, get_2d, copy, memset.
KINDS: Tuple[str, ...] = tuple(ffi.string(lib.ferry_xfer_name(k)).decode() for k in range(lib.FERRY_XFER_COUNT))


@dataclass(frozen=True)
class Stats:
    """A snapshot of a ferry_stats. Each dict is keyed by KINDS.

    calls and bytes count requests as made through the API (a 2-D set of n rows of s
    bytes is one call of n*s bytes); impl_calls counts the operations that carried
    them out (n for a backend with no 2-D implementation). Subtracting two snapshots
    gives what moved in between.
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


@dataclass(frozen=True)
class CopyStats:
    """What one input copy did: the path taken (FLAT when the policy's rule did not apply), the
    bytes the graph reads, the span a flat copy moves, the bytes that arrived, transfer requests
    and the operations that carried them out, and the wall time (synchronize included)."""

    path: CopyPolicy
    bytes_read: int
    bytes_span: int
    bytes_copied: int
    copy_calls: int
    impl_calls: int
    copy_seconds: float

    @classmethod
    def from_c(cls, s: Any) -> "CopyStats":
        """A CopyStats holding the values of the ferry_copy_stats cdata s."""
        return cls(CopyPolicy(s.path), int(s.bytes_read), int(s.bytes_span), int(s.bytes_copied),
                   int(s.copy_calls), int(s.impl_calls), float(s.copy_seconds))


@dataclass(frozen=True)
class SchedStats:
    """Totals of the last run over all inputs and splits."""

    n_inputs: int
    bytes_read: int
    bytes_span: int
    bytes_copied: int
    copy_calls: int
    impl_calls: int
    copy_seconds: float
    compute_seconds: float
    #: Prefetching (Scheduler.prefetch): inputs copied ahead on a copy queue.
    prefetched: int = 0
    #: The most prefetched inputs, and their bytes, queued or held ahead of the part computing:
    #: the device memory prefetching holds beyond what the part at hand reads.
    ahead_inputs: int = 0
    ahead_bytes: int = 0
    #: The host's time in waits for prefetched copies (on CUDA the device waits instead).
    wait_seconds: float = 0.0

    @classmethod
    def from_c(cls, s: Any) -> "SchedStats":
        """A SchedStats holding the values of the ferry_sched_stats cdata s."""
        return cls(int(s.n_inputs), int(s.bytes_read), int(s.bytes_span), int(s.bytes_copied), int(s.copy_calls),
                   int(s.impl_calls), float(s.copy_seconds), float(s.compute_seconds), int(s.prefetched),
                   int(s.ahead_inputs), int(s.ahead_bytes), float(s.wait_seconds))


#: What a backend without a memory limit says (C's SIZE_MAX).
SIZE_MAX = 2**64 - 1


@dataclass(frozen=True)
class LinkStats:
    """What a stand-in device's link carried (StandinBackend.link_stats), both directions, the
    copy queue's transfers included; only a modelled link (a bandwidth or a latency) counts.

    A transfer is late when the host's copy alone ended after the link's modelled end: the
    host could not copy that fast, and the link is not reached. A busy or preempted host
    shows late transfers too.
    """

    transfers: int
    bytes: int
    #: latency + bytes / bandwidth, summed over the transfers
    modelled_seconds: float
    #: the time the host's copies themselves took
    copy_seconds: float
    late: int
    late_seconds: float

    @classmethod
    def from_c(cls, s: Any) -> "LinkStats":
        """A LinkStats holding the values of the ferry_link_stats cdata s."""
        return cls(int(s.transfers), int(s.bytes), float(s.modelled_seconds), float(s.copy_seconds), int(s.late),
                   float(s.late_seconds))

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
