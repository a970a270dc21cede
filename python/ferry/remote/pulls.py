"""A remote tier's pull (ferry.remote.tier): the plan of one batch read (its windows, its reads, where
each piece goes from staging), the handle of one issued ahead (PendingPull, its wait() places it),
and what a pull did (PullStats)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Tuple

import numpy as np

from ..tensor import Tensor
from .errors import RemoteError

if TYPE_CHECKING:
    from .tier import RemoteTier


@dataclass(frozen=True)
class PullStats:
    """What one pull did.

    Attributes
    ----------
    layer : int
    policy : str
        The copy policy whose copies were pulled ("paged" for a paged window: its gather's).
    pieces : int
        Pieces of the one batch transfer, after merging.
    plan_pieces : int
        Pieces of the plan before merging: a piece per row of its copies.
    bytes : int
        Bytes the transfer moved, merged gaps included.
    bytes_read : int
        Bytes of the plan's pieces: the cells the window reads under ragged and paged.
    gap_bytes : int
        Bytes of gaps the merged pieces carried (bytes - bytes_read).
    seconds : float
        Wall time of the batch transfer.
    predicted_seconds : float
        The tier's model: a call, piece_ns a piece and each piece's bytes at its size's rate (the
        piece curve: CopyCostModel.piece_seconds; gbps without one).
    pull_seconds : float
        Wall time of the whole pull: the plan, its pieces, the transfer and the copy out of staging
        (what ferry adds to the transfer is pull_seconds - seconds).
    host_seconds : float
        The tier's own time on the calling thread: planning the pull (its pieces, merged, and their
        staging) and placing its pieces out of staging; what a RemoteSpec's host_us stands for. Not
        the batch's submission and wait (the link's, priced by its call_us), nor, for a pull issued
        ahead, the time it travelled under other work.
    """

    layer: int
    policy: str
    pieces: int
    plan_pieces: int
    bytes: int
    bytes_read: int
    gap_bytes: int
    seconds: float
    predicted_seconds: float
    pull_seconds: float = 0.0
    host_seconds: float = 0.0


@dataclass(frozen=True)
class _PullPlan:
    """A pull planned: its windows, the batch's reads (rows remote address, bytes), where each piece
    goes from staging (per destination: local base, its bytes, pieces), and what it counts."""

    layer: int
    policy: str
    kout: Optional[Tensor]
    vout: Optional[Tensor]
    batch: np.ndarray
    places: List[Tuple[int, int, np.ndarray]]
    total: int
    plan_pieces: int
    bytes_read: int
    predicted: float

    def stats(self, seconds: float, pull_seconds: float, host_seconds: float) -> PullStats:
        return PullStats(layer=self.layer, policy=self.policy, pieces=len(self.batch), plan_pieces=self.plan_pieces,
                         bytes=self.total, bytes_read=self.bytes_read, gap_bytes=self.total - self.bytes_read,
                         seconds=seconds, predicted_seconds=self.predicted, pull_seconds=pull_seconds,
                         host_seconds=host_seconds)


class PendingPull:
    """A pull in flight (RemoteTier.pull_async): its batch travelling into a staging area of its own.

    wait() waits for it and places its pieces, then returns what pull returns; until then the
    windows are untouched. Waiting twice returns the same result again (or raises the same error).
    """

    def __init__(self, tier: "RemoteTier", plan: _PullPlan, staging: np.ndarray, batch_id: int, start: float,
                 planned: float) -> None:
        self._tier = tier
        self._plan = plan
        self._staging = staging
        self._batch_id = batch_id
        self._start = start
        self._planned = planned  # when the plan was made, before the batch's submission
        self._result: Optional[PullStats] = None
        self._error: Optional[BaseException] = None

    @property
    def layer(self) -> int:
        """The layer being pulled."""
        return self._plan.layer

    def wait(self) -> Tuple[Tensor, Tensor, PullStats]:
        """Wait for the batch, then place its pieces in the windows.

        Returns
        -------
        (Tensor, Tensor, PullStats)
            As RemoteTier.pull: the K and V windows and what the pull did (seconds: the wait;
            pull_seconds: from issue to placement).

        Raises
        ------
        PeerGoneError
            The peer ended or broke while the batch was in flight (naming it and the layer);
            nothing was written.
        RemoteTimeoutError
            The batch took longer than the tier's timeout; nothing was written.
        """
        stats = self._land()
        assert self._plan.kout is not None and self._plan.vout is not None  # a pull's: it has windows
        return self._plan.kout, self._plan.vout, stats

    def _land(self) -> PullStats:
        """wait()'s work: the batch waited for and placed, once; what it did."""
        if self._result is None and self._error is None:
            try:
                self._result = self._tier._finish(self)
            except RemoteError as e:
                self._error = e
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result
