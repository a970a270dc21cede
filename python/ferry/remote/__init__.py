"""The remote tier: a KV cache's layers in another process's memory, pulled through a transfer
engine (Mooncake's) by ferry's own plans. `pip install ferry[remote]` installs the engine; ferry
imports it only when a tier is made, and says what to install where it is missing.

RemoteTier (ferry.remote.tier) holds the cache remotely (a server it starts on the loopback, or a
peer started alone on any host: `ferry remote-serve`, ferry.remote.server) and pulls a step's windows;
PullStats says what a pull moved, PendingPull is a pull issued ahead (ferry.remote.pulls);
measure_remote_link (ferry.remote.link) fits the link's per-piece cost and rate for the copy cost
model (time_remote_link times the reads, fit_remote_link fits their medians; time_remote_pulls
times pulls in the same rounds, remote_pull_seconds is what a fit predicts of one);
engine_missing says why the engine cannot be imported (None when it can).
The errors are FerryError subclasses naming the peer and the layer (ferry.remote.errors).
"""

from __future__ import annotations

from .engine import engine_missing
from .errors import (
    EngineUnavailableError,
    PeerGoneError,
    PeerLayoutError,
    RegistrationError,
    RemoteError,
    RemoteTimeoutError,
)
from .link import (
    BatchTiming,
    RemoteLinkFit,
    RemoteRounds,
    fit_remote_link,
    measure_remote_link,
    remote_pull_seconds,
    time_remote_link,
    time_remote_pulls,
)
from .pulls import PendingPull, PullStats
from .tier import RemoteTier

__all__ = ["RemoteTier", "PullStats", "PendingPull", "measure_remote_link", "time_remote_link", "fit_remote_link",
           "time_remote_pulls", "remote_pull_seconds", "RemoteRounds", "BatchTiming", "RemoteLinkFit",
           "engine_missing", "RemoteError", "EngineUnavailableError", "PeerGoneError", "PeerLayoutError",
           "RegistrationError", "RemoteTimeoutError"]
