"""The pulls a Scheduler makes through a remote tier (RemoteTier.fetch_layers, ferry.remote.tier): the
tier as ferry.fetch's Fetcher, and what the tier keeps of those pulls (the layers marked, the pulls
issued and not yet waited for, what each landed pull did). The tier plans and issues each pull."""

from __future__ import annotations

import collections
import weakref
from typing import TYPE_CHECKING, Deque, Dict, List, Sequence

from ..fetch import set_fetch
from ..kv_layers import LayerCache
from ..policy import CopyPolicy
from ..tensor import Tensor
from .errors import PeerGoneError
from .pulls import PendingPull, PullStats

if TYPE_CHECKING:
    from .tier import RemoteTier

#: The scheduler's pulls whose PullStats a tier keeps for take_fetch_stats (the last ones).
FETCH_STATS_KEPT = 1 << 16


class _SchedulerPulls:
    """The tier as ferry.fetch's Fetcher: its begin and wait, without keeping the tier alive."""

    def __init__(self, tier: "RemoteTier") -> None:
        self._tier = weakref.ref(tier)

    def _live(self) -> "RemoteTier":
        tier = self._tier()
        if tier is None:
            raise PeerGoneError("remote tier: the tier whose layers this window reads was closed")
        return tier

    def begin(self, window: Tensor, policy: CopyPolicy) -> int:
        return self._live()._fetch_begin(window, policy)

    def wait(self, ticket: int) -> None:
        self._live()._fetch.land(ticket)


class _SchedulerFetch:
    """What a tier keeps of a Scheduler's pulls: the layers whose K and V are marked for ferry.fetch
    (fetch_layers), whether their pulls merge, the pulls issued and not yet waited for (by ticket)
    and what each landed pull did (the last FETCH_STATS_KEPT). The marks hold the fetcher alone,
    which reaches the tier through a weak reference: a tier dropped unclosed is not kept alive by
    its cache's marks, nor by the pulls they left in flight."""

    def __init__(self, cache: LayerCache, fetcher: _SchedulerPulls) -> None:
        self._cache = cache
        self._fetcher = fetcher
        self.layers: List[int] = []  # the layers a Scheduler pulls (fetch_layers)
        self.merge = True
        self._tickets: Dict[int, PendingPull] = {}
        self._next_ticket = 0
        self._stats: Deque[PullStats] = collections.deque(maxlen=FETCH_STATS_KEPT)

    def start(self, layers: Sequence[int], merge: bool) -> None:
        """Mark these layers (checked: the cache's indices) in place of those before; merge: whether
        their pulls merge pieces."""
        self.stop()
        self.merge = merge
        for layer in sorted(set(layers)):
            for t in (self._cache.k(layer), self._cache.v(layer)):
                set_fetch(t, self._fetcher)
            self.layers.append(layer)

    def stop(self) -> None:
        """Unmark the layers (a cache closed first has nothing left to mark); the pulls in flight are
        forgotten."""
        if not self._cache.closed:
            for layer in self.layers:
                for t in (self._cache.k(layer), self._cache.v(layer)):
                    set_fetch(t, None)
        self.layers = []
        self._tickets.clear()

    def take_stats(self) -> List[PullStats]:
        """What each landed pull did since the last call, in order; they are forgotten."""
        out = list(self._stats)
        self._stats.clear()
        return out

    def hold(self, pending: PendingPull) -> int:
        """Keep a pull just issued until its wait: its ticket."""
        self._next_ticket += 1
        self._tickets[self._next_ticket] = pending
        return self._next_ticket

    def land(self, ticket: int) -> None:
        """ferry.fetch's wait: the batch waited for and placed; what it did kept."""
        pending = self._tickets.pop(ticket)
        self._stats.append(pending._land())
