"""The remote tier's peers: processes holding memory registered with a TransferEngine.

A peer a user starts alone, on any host (`ferry remote-serve`, serve_cache): a cache's layers, each
layer's K and V registered with the engine after one small region that publishes the cache's
layout (publish_layout): LAYOUT_MAGIC, the JSON's length (8 bytes, little-endian), then a JSON
object of the cache's class, its params, each region's (layer, k or v, bytes) and address, and
what the contents are. It is the segment's first buffer, so a client that knows only the segment
name (host:port) reads it through the engine (RemoteTier(cache, peer=...)): no second channel.
It stays up until SIGTERM or SIGINT, then unregisters and exits 0.

The peer a RemoteTier starts for itself on the loopback: `python -m ferry.remote.server --sizes
N,N,... --reply-fd FD` allocates one zeroed region of each size, registers each with its engine
(TCP on --host, default the loopback), writes one JSON line to FD: {"peer": "host:port",
"addresses": [...]} (or {"error": "..."}), and holds the regions until its standard input closes:
the process that started it owns its life. It knows nothing of KV layouts; the client
(RemoteTier) writes the cache's bytes into the regions and reads windows back.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import FerryError
from .engine import transfer_engine_class

#: The first bytes of a published layout's region; the JSON's length follows in 8 bytes, little-endian.
LAYOUT_MAGIC = b"FERRYKV1"
#: Bytes before the JSON: the magic and its length.
LAYOUT_HEADER = len(LAYOUT_MAGIC) + 8
#: The protocols a peer may serve over (Mooncake's names): rdma where the machine has it.
PROTOCOLS = ("tcp", "rdma")


def _param(value: Any) -> Any:
    return value if isinstance(value, (bool, int, float)) else str(value)


def cache_layout(cache: Any) -> Dict[str, Any]:
    """What a client must agree with to read a cache's layers: its class, its params as C keeps them,
    and each region (layer, "k" or "v", bytes), K before V, layer by layer.

    Parameters
    ----------
    cache : KVCache or PagedKVCache

    Returns
    -------
    dict
        JSON-ready: {"cache": name, "params": {field: value}, "regions": [[layer, which, bytes], ...]}.

    Raises
    ------
    InvalidArgumentError
        For a cache that is not a KVCache or PagedKVCache.
    """
    from ..errors import InvalidArgumentError
    from ..kv import KVCache
    from ..paged import PagedKVCache

    if not isinstance(cache, (KVCache, PagedKVCache)):
        raise InvalidArgumentError(f"cache_layout: cache must be a KVCache or PagedKVCache, got {type(cache).__name__}")
    p = cache.params
    regions = [[layer, which, int(t.nbytes)] for layer in range(p.n_layer)
               for which, t in (("k", cache.k(layer)), ("v", cache.v(layer)))]
    params = {f.name: _param(getattr(p, f.name)) for f in dataclasses.fields(p)}
    return {"cache": type(cache).__name__, "params": params, "regions": regions}


def layout_differences(peer: Dict[str, Any], mine: Dict[str, Any]) -> List[str]:
    """What differs between a peer's layout and a cache's (cache_layout), each as "what: X at the
    peer, Y here"; empty when they agree. The peer's is what it published, read from the network:
    any value, a part of it not a layout said as a difference.

    Parameters
    ----------
    peer : object
        The peer's published layout (a dict, when it is one).
    mine : dict
        The local cache's (cache_layout).

    Returns
    -------
    list of str
    """
    peer = peer if isinstance(peer, dict) else {}
    if peer.get("cache") != mine["cache"]:
        return [f"the cache: {peer.get('cache')!r} at the peer, {mine['cache']} here"]
    theirs = peer.get("params")
    theirs = theirs if isinstance(theirs, dict) else {}
    out = [f"{k}: {theirs.get(k)!r} at the peer, {v!r} here" for k, v in mine["params"].items()
           if theirs.get(k) != v]
    regions = peer.get("regions")
    if out or regions == mine["regions"]:
        return out
    if not isinstance(regions, list) or len(regions) != len(mine["regions"]):
        n = len(regions) if isinstance(regions, list) else regions
        return [f"the regions: {n!r} at the peer, {len(mine['regions'])} here"]
    return [f"layer {b[0]}'s {str(b[1]).upper()}: {a!r} at the peer, {b} here"
            for a, b in zip(regions, mine["regions"]) if a != b]


def publish_layout(engine: Any, layout: Dict[str, Any], addresses: Sequence[int],
                   contents: Dict[str, Any]) -> np.ndarray:
    """The region a peer registers first: LAYOUT_MAGIC, the JSON's length, then the layout with each
    region's address and what the contents are. Returns it, registered (the caller keeps it alive).

    Raises
    ------
    RegistrationError
        When the engine refuses it.
    """
    from .errors import RegistrationError

    body = json.dumps({**layout, "addresses": [int(a) for a in addresses], "contents": contents}).encode()
    region = np.frombuffer(LAYOUT_MAGIC + len(body).to_bytes(8, "little") + body, dtype=np.uint8).copy()
    rc = engine.register_memory(region.ctypes.data, region.nbytes)
    if rc != 0:
        raise RegistrationError(f"remote-serve: the engine refused the layout's region (status {rc})")
    return region


def hold_cache(cache: Any, host: str = "127.0.0.1", protocol: str = "tcp",
               contents: Optional[Dict[str, Any]] = None) -> Tuple[Any, str, Dict[str, Any], Callable[[], None]]:
    """Start an engine on host over protocol, publish the cache's layout and register its layers.

    Parameters
    ----------
    cache : KVCache or PagedKVCache
        The cache whose layers are served (host memory).
    host : str, optional
        The address clients reach this host at.
    protocol : str, optional
        "tcp", or "rdma" where the machine has it.
    contents : dict, optional
        What the layers hold, published beside the layout ({"seed": 0}, say).

    Returns
    -------
    (TransferEngine, str, dict, callable)
        The engine, the segment name (host:port) clients give, the published layout, and a function
        that unregisters everything.

    Raises
    ------
    InvalidArgumentError
        For a protocol other than PROTOCOLS.
    EngineUnavailableError
        When the engine cannot be imported or does not start.
    RegistrationError
        When the engine refuses a region.
    """
    from ..errors import InvalidArgumentError
    from .errors import EngineUnavailableError, RegistrationError

    if protocol not in PROTOCOLS:
        raise InvalidArgumentError(f"remote-serve: protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    engine = transfer_engine_class()()
    if engine.initialize(host, "P2PHANDSHAKE", protocol, "") != 0:
        raise EngineUnavailableError(f"remote-serve: the transfer engine did not start on {host} over {protocol}")
    layout = cache_layout(cache)
    tensors = [cache.k(r[0]) if r[1] == "k" else cache.v(r[0]) for r in layout["regions"]]
    addresses = [int(t.address or 0) for t in tensors]
    published = publish_layout(engine, layout, addresses, contents or {})  # the first buffer: clients find it
    registered = [published.ctypes.data]
    for (layer, which, n), addr in zip(layout["regions"], addresses):
        rc = engine.register_memory(addr, n)
        if rc != 0:
            raise RegistrationError(f"remote-serve: the engine refused layer {layer}'s {which.upper()} "
                                    f"({n} bytes, status {rc})")
        registered.append(addr)

    def release(keep: np.ndarray = published) -> None:  # keep: the layout's region lives until released
        for a in registered:
            engine.unregister_memory(a)

    return engine, f"{host}:{engine.get_rpc_port()}", {**layout, "contents": contents or {}}, release


def serve_cache(cache: Any, host: str = "127.0.0.1", protocol: str = "tcp", contents: Optional[Dict[str, Any]] = None,
                announce: Callable[[str, Dict[str, Any]], None] = lambda peer, layout: None) -> int:
    """Serve a cache's layers (hold_cache) until SIGTERM or SIGINT, then unregister them.

    Parameters
    ----------
    cache, host, protocol, contents
        As hold_cache takes them.
    announce : callable, optional
        Called once with the segment name and the published layout when clients may connect.

    Returns
    -------
    int
        The exit status, 0.

    Raises
    ------
    FerryError
        As hold_cache raises.
    """
    # Python's own handlers, not a mask and sigwait: a process-directed signal goes to any thread that
    # does not block it (numpy's BLAS threads start at import, before a mask could be set), and a
    # Python handler runs in the main thread whichever thread took it.
    stopped = threading.Event()
    previous = {sig: signal.signal(sig, lambda signum, frame: stopped.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        _, peer, layout, release = hold_cache(cache, host, protocol, contents)
        announce(peer, layout)
        while not stopped.wait(0.2):  # a timed wait: the main thread runs the handler between waits
            pass
        release()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _reply(fd: int, message: Dict[str, object]) -> None:
    os.write(fd, (json.dumps(message) + "\n").encode())
    os.close(fd)


def serve(sizes: Sequence[int], reply_fd: int, host: str = "127.0.0.1") -> int:
    """Hold the regions until standard input closes.

    Parameters
    ----------
    sizes : sequence of int
        Bytes of each region, each at least 1.
    reply_fd : int
        Where the one JSON line goes.
    host : str, optional
        The engine's address.

    Returns
    -------
    int
        The exit status: 0, or 1 when the engine or a registration was refused (said on reply_fd).
    """
    try:
        engine = transfer_engine_class()()
    except FerryError as e:  # the engine is missing: the reply says which library
        _reply(reply_fd, {"error": e.message})
        return 1
    if engine.initialize(host, "P2PHANDSHAKE", "tcp", "") != 0:
        _reply(reply_fd, {"error": f"the transfer engine did not start on {host}"})
        return 1
    regions: List[np.ndarray] = []
    for i, n in enumerate(sizes):
        region = np.zeros(max(int(n), 1), dtype=np.uint8)
        rc = engine.register_memory(region.ctypes.data, region.nbytes)
        if rc != 0:
            _reply(reply_fd, {"error": f"region {i} of {n} bytes: registration refused (status {rc})"})
            return 1
        regions.append(region)
    _reply(reply_fd, {"peer": f"{host}:{engine.get_rpc_port()}", "addresses": [int(r.ctypes.data) for r in regions]})
    while sys.stdin.buffer.read(4096):  # the client closes it, or dies
        pass
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The server's entry point (see the module's docstring).

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments; default sys.argv[1:].

    Returns
    -------
    int
        The exit status.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    values = dict(zip(args[::2], args[1::2]))  # the client's own call: --sizes, --reply-fd, --host
    return serve([int(s) for s in values["--sizes"].split(",") if s], int(values["--reply-fd"]),
                 values.get("--host", "127.0.0.1"))


if __name__ == "__main__":
    sys.exit(main())
