"""Transfer counters: what a buffer or backend moved, per kind of transfer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Tuple

from ._binding import ffi, lib

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
    def from_c(cls, s: object) -> "Stats":
        """Copy a ferry_stats (cdata) into Python values."""
        return cls(
            calls={k: int(s.calls[i]) for i, k in enumerate(KINDS)},  # type: ignore[attr-defined]
            bytes={k: int(s.bytes[i]) for i, k in enumerate(KINDS)},  # type: ignore[attr-defined]
            impl_calls={k: int(s.impl_calls[i]) for i, k in enumerate(KINDS)},  # type: ignore[attr-defined]
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
