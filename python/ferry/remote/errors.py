"""The remote tier's errors: each a FerryError that names the peer, and the layer where one was read."""

from __future__ import annotations

from ..errors import FerryError


class RemoteError(FerryError):
    """A remote tier's transfer, registration or peer failed; the message names the peer (host:port)
    and, for a pull, the layer. Nothing was written to the destination."""


class EngineUnavailableError(RemoteError):
    """The transfer engine (mooncake-transfer-engine, `pip install ferry[remote]`) cannot be imported;
    the message names the missing package or system library and how to install it."""


class PeerGoneError(RemoteError):
    """The peer stopped answering: its process ended, or its connection broke mid-transfer.
    RemoteTier.reconnect() starts it again (or, for a peer started alone, connects to it again)."""


class PeerLayoutError(RemoteError):
    """A peer started alone (`ferry remote-serve`) holds a cache of another layout than the tier's, or
    publishes none; the message names the peer and each field that differs."""


class RegistrationError(RemoteError):
    """The engine refused to register memory (a region already registered, say), here or at the peer."""


class RemoteTimeoutError(RemoteError):
    """A pull did not finish within the tier's timeout; the tier is refused until reconnect()."""
