"""A remote KV tier: a cache's layers held in another process's memory, registered with a transfer
engine, and the window a step reads pulled into local memory by ferry's own plan.

RemoteTier(cache) starts a server process (ferry.remote.server) on the loopback holding one region
per layer's K and per layer's V, each the size of the local cache's, and registers the local
cache's memory with this process's engine. RemoteTier(cache, peer="host:port") starts nothing: it
reads the layout a peer started alone publishes (`ferry remote-serve`, server.serve_cache) through
the engine, refuses one that differs from the cache's (PeerLayoutError), and reads its regions.
upload() writes a cache's bytes (the local one, or another of the same layout) into the regions.
pull() reads one step's window of a layer: the
copy policy's copies of the K and V windows (flat: the span; ranges: one range per stream;
plan; ragged: each stream's used cells; a paged window: its gather's runs), as C makes them,
cut into pieces (ferry.plan.copy_pieces, gather_pieces), merged where the link's model says a
gap costs less than a piece (merge_pieces), and read in ONE batch transfer. The pieces land in a
registered staging buffer first and reach the destination only when the whole batch succeeded
(placed by C in one call per window): a refused or broken pull writes nothing there. pull_async
issues the same batch as the engine's async read (the next layer's window travelling while this
one computes); its PendingPull.wait() places it.

A cell-per-stream window lands at its own offsets in the local cache (the windows pull returns
are the cache's own); a paged window is gathered into a dense tensor of the window's layout.

A pull's plan, its handle in flight and what it did are in ferry.remote.pulls; what the tier keeps
of a Scheduler's pulls (fetch_layers) in ferry.remote.fetching; the thread the engine's calls run
on in ferry.remote.engine_worker.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import weakref
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from .. import _checks
from ..backend import CPUBackend
from ..copy2d import Copy2D
from ..copy_cost import CopyCostModel
from ..copy_path import copy_ranges_of
from ..errors import InvalidArgumentError, OutOfBoundsError
from ..kv import KVCache
from ..kv_layers import LayerCache
from ..paged import PagedKVCache
from ..pieces import _copy_piece_array, _merge_piece_array, _paged_piece_array, _place_pieces
from ..plan import plan_copy, plan_ragged
from ..policy import CopyPolicy, PolicyLike, to_policy
from ..tensor import Tensor
from .engine import local_engine
from .engine_worker import _EngineWorker
from .errors import PeerGoneError, PeerLayoutError, RegistrationError, RemoteError, RemoteTimeoutError
from .fetching import _SchedulerFetch, _SchedulerPulls
from .pulls import PendingPull, PullStats, _PullPlan
from .server import LAYOUT_HEADER, LAYOUT_MAGIC, PROTOCOLS, cache_layout, layout_differences

#: The peers (host:port) this process has read from: a new server must take another port.
_PEERS_USED: Set[str] = set()

#: Seconds a server has to start and say where it is.
START_TIMEOUT_S = 60.0


def _starts(sizes: np.ndarray, at: int = 0) -> np.ndarray:
    """Where each of sizes' pieces starts when they are laid one after another from at (uintp)."""
    out = np.zeros(len(sizes), dtype=np.uintp)
    np.cumsum(sizes[:-1], out=out[1:])
    return out + np.uintp(at)


def _peer_arg(peer: object, what: str) -> str:
    """A peer's segment name, HOST:PORT, checked."""
    host, _, port = str(peer).rpartition(":") if isinstance(peer, str) else ("", "", "")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgumentError(f"{what} must be HOST:PORT, the segment name `ferry remote-serve` prints, "
                                   f"got {peer!r}")
    return str(peer)


def _cache_arg(cache: object, what: str) -> LayerCache:
    if not isinstance(cache, (KVCache, PagedKVCache)):
        raise InvalidArgumentError(f"{what}: expected a KVCache or PagedKVCache, got {type(cache).__name__}")
    return cache


class RemoteTier:
    """A cache's layers held by a server process and read through a transfer engine.

    Parameters
    ----------
    cache : KVCache or PagedKVCache
        The local cache: its layout is the remote copy's, and its memory (host or pinned host)
        receives the windows of a cell-per-stream cache.
    model : CopyCostModel, optional
        The link's model, by which pieces merge and pulls are predicted (measure_remote_link's
        fit through CopyCostModel.from_link, say); default: no merge across gaps (a model whose
        piece costs nothing), pieces that touch still join.
    timeout_s : float, optional
        Seconds a pull may take before it is refused (RemoteTimeoutError).
    host : str, optional
        The address the server and this process's engine listen on.
    peer : str, optional
        HOST:PORT of a peer started alone (`ferry remote-serve`, on this host or another): the tier
        reads its layers instead of starting a server. Default: start one on host.
    protocol : str, optional
        The engine's transport, the peer's: "tcp", or "rdma" where the machine has it (one a process).

    Raises
    ------
    InvalidArgumentError
        For a cache that is not a KVCache or PagedKVCache, a timeout that is not positive, a peer
        that is not HOST:PORT, or a protocol that is not tcp or rdma.
    PeerLayoutError
        When the peer holds a cache of another layout (naming the peer and each field that differs)
        or publishes none.
    EngineUnavailableError
        When the engine cannot be imported (naming the package or system library to install), or
        this process's engine runs over another protocol.
    RegistrationError
        When the engine refuses the cache's memory (already registered by another tier, say).
    PeerGoneError
        When the server does not start, or no peer answers at peer.
    """

    def __init__(self, cache: LayerCache, model: Optional[CopyCostModel] = None, timeout_s: float = 10.0,
                 host: str = "127.0.0.1", peer: Optional[str] = None, protocol: str = "tcp") -> None:
        self._cache: LayerCache = _cache_arg(cache, "RemoteTier: cache")
        if model is not None:
            _checks.instance(model, CopyCostModel, "RemoteTier: model")
        self._model = model if model is not None else CopyCostModel(
            call_us=0.0, row_ns=0.0, gbps=1e12, line_bytes=0, small_row_bytes=0, small_row_efficiency=1.0,
            wide_pitch_bytes=0, wide_pitch_row_ns=0.0)
        self._timeout = _checks.as_double(timeout_s, "RemoteTier: timeout_s")
        if not self._timeout > 0:
            raise InvalidArgumentError(f"RemoteTier: timeout_s must be positive, got {timeout_s!r}")
        self._host = host
        #: a peer started alone: the tier reads it and never starts or stops it
        self._external = None if peer is None else _peer_arg(peer, "RemoteTier: peer")
        self._published: Optional[Dict[str, Any]] = None
        if protocol not in PROTOCOLS:
            raise InvalidArgumentError(f"RemoteTier: protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        self._engine = local_engine(host, protocol)
        n_layer = cache.params.n_layer
        #: (layer, which, address, nbytes) of each region, K and V of each layer
        self._regions: List[Tuple[int, str, int, int]] = []
        for layer in range(n_layer):
            for which, t in (("k", cache.k(layer)), ("v", cache.v(layer))):
                addr = t.address
                if addr is None:
                    raise InvalidArgumentError(f"RemoteTier: layer {layer}'s {which.upper()} has no memory")
                self._regions.append((layer, which, addr, t.nbytes))
        self._registered: List[int] = []
        self._dense: Dict[Tuple[str, Tuple[int, ...], Tuple[int, ...], str], Tensor] = {}
        self._staging: Optional[np.ndarray] = None
        self._async_free: List[np.ndarray] = []  # registered staging areas no async batch uses
        self._abandoned: List[np.ndarray] = []
        self._cpu = CPUBackend()
        self._server: Optional[subprocess.Popen[bytes]] = None
        self._peer = self._external or "(not started)"
        self._remote: List[int] = []
        self._broken: Optional[str] = None
        self._source: Optional[LayerCache] = None
        self._fetch = _SchedulerFetch(self._cache, _SchedulerPulls(self))  # the pulls a Scheduler makes (fetch_layers)
        self._worker: Optional[_EngineWorker] = None  # runs the engine's calls (_batch); started by the first
        try:
            for layer, which, addr, n in self._regions:
                self._register(addr, n, f"layer {layer}'s {which.upper()}")
            if self._external is not None:
                self._connect(self._external)
            else:
                self._start()
        except BaseException:  # refused: the memory goes back unregistered, or a later cache there is refused
            self.close()
            raise

    # ------------------------------------------------------------ the peer

    @property
    def peer(self) -> str:
        """The server's address, host:port."""
        return self._peer

    @property
    def peer_layout(self) -> Optional[Dict[str, Any]]:
        """What a peer started alone published: its cache's layout, each region's address and its
        contents ({"seed": N} from `ferry remote-serve`); None for a server the tier started."""
        return self._published

    @property
    def model(self) -> CopyCostModel:
        """The link's model pulls merge and predict by."""
        return self._model

    @model.setter
    def model(self, model: CopyCostModel) -> None:
        self._model = _checks.instance(model, CopyCostModel, "RemoteTier.model")

    @property
    def server_pid(self) -> Optional[int]:
        """The server process's id (None when none runs)."""
        return self._server.pid if self._server is not None else None

    def _register(self, addr: int, n: int, what: str) -> None:
        rc = self._engine.register_memory(addr, n)
        if rc != 0:
            raise RegistrationError(f"remote tier: peer {self._peer}: the engine refused to register {what} "
                                    f"({n} bytes at {addr:#x}, status {rc}); is it registered by another tier?")
        self._registered.append(addr)

    def _connect(self, peer: str) -> None:
        """Read a peer's published layout (its segment's first buffer: server.publish_layout) through
        the engine, refuse one that differs from the cache's, and take its regions' addresses."""
        self._peer, self._broken = peer, None
        # asked first: the engine answers for a peer it has read before from what it kept of it
        first = int(self._engine.get_first_buffer_address(peer)) if self._peer_answers() else 0
        if first == 0:
            raise PeerGoneError(f"remote tier: peer {peer}: no peer answers there; start one (`ferry remote-serve`) "
                                "and give the HOST:PORT it prints")
        head = self._read_small(first, LAYOUT_HEADER)
        if head[:len(LAYOUT_MAGIC)] != LAYOUT_MAGIC:
            raise PeerLayoutError(f"remote tier: peer {peer} publishes no ferry layout in its first region: is it "
                                  "`ferry remote-serve`?")
        try:
            published = json.loads(self._read_small(first + LAYOUT_HEADER, int.from_bytes(head[8:], "little")))
            addresses = [int(a) for a in published["addresses"]]
        except (ValueError, KeyError, TypeError) as e:
            raise PeerLayoutError(f"remote tier: peer {peer}: its published layout cannot be read ({e})") from None
        differ = layout_differences(published, cache_layout(self._cache))
        if not differ and len(addresses) != len(self._regions):
            differ = [f"the addresses: {len(addresses)} at the peer for {len(self._regions)} regions"]
        if differ:
            one_paged = {published.get("cache"), type(self._cache).__name__} == {"KVCache", "PagedKVCache"}
            raise PeerLayoutError(f"remote tier: peer {peer} holds another layout than the tier's cache: "
                                  + "; ".join(differ) + (" (a paged cache at one end only: `ferry remote-serve "
                                                         "--paged` serves one, a run reads one with --paged)"
                                                         if one_paged else ""))
        self._remote, self._published = addresses, published
        _PEERS_USED.add(peer)  # a server this process starts must not take its port

    def _read_small(self, address: int, nbytes: int) -> bytes:
        """nbytes at the peer's address, read into a buffer registered for it alone."""
        buf = np.zeros(max(nbytes, 1), dtype=np.uint8)
        self._register(buf.ctypes.data, buf.nbytes, "a buffer for the peer's layout")
        try:
            self._batch("reading its layout", lambda e: e.transfer_sync_read(self._peer, buf.ctypes.data, address,
                                                                             nbytes))
        finally:
            self._engine.unregister_memory(buf.ctypes.data)
            self._registered.remove(buf.ctypes.data)
        return bytes(buf[:nbytes])

    def _peer_answers(self) -> bool:
        """Whether something listens at the peer's address (a peer started alone: no process to ask)."""
        host, _, port = self._peer.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return True
        except OSError:
            return False

    def _start(self) -> None:
        """Start a server holding a zeroed region per layer's K and V, at an address this process has
        not used before: the engine keeps what it learnt of a peer by its host:port, and a new
        server on a dead one's port would be read through the dead one's descriptor."""
        for _ in range(8):
            self._start_once()
            if self._peer not in _PEERS_USED:
                break
            self._stop()
        else:
            raise PeerGoneError(f"remote tier: peer on {self._host}: 8 servers in a row took ports used before")
        _PEERS_USED.add(self._peer)

    def _start_once(self) -> None:
        read_fd, write_fd = os.pipe()
        sizes = ",".join(str(n) for _, _, _, n in self._regions)
        cmd = [sys.executable, "-m", "ferry.remote.server", "--sizes", sizes, "--reply-fd", str(write_fd),
               "--host", self._host]
        env = dict(os.environ)
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in [env.get("PYTHONPATH")] if p])
        try:
            self._server = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, pass_fds=(write_fd,), env=env)
        finally:
            os.close(write_fd)
        with os.fdopen(read_fd, "rb") as reply:
            line = reply.readline()
        try:
            answer = json.loads(line) if line else {"error": "the server exited before it answered"}
        except ValueError:
            answer = {"error": f"the server answered {line!r}"}
        if "error" in answer:
            self._stop()
            cls = RegistrationError if "registration" in str(answer["error"]) else PeerGoneError
            raise cls(f"remote tier: peer on {self._host}: {answer['error']}")
        self._peer = str(answer["peer"])
        self._remote = [int(a) for a in answer["addresses"]]
        self._broken = None

    def _stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        if server.stdin is not None:
            try:
                server.stdin.close()
            except OSError:
                pass
        try:
            server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()

    def reconnect(self, peer: Optional[str] = None) -> None:
        """Start the peer again (its process ended, or a pull broke or timed out), or for a peer started
        alone connect to it again, its layout checked anew; then write into it what upload() last
        wrote, so the next pull gives the same bytes as before the fault.

        Parameters
        ----------
        peer : str, optional
            For a tier made with a peer: HOST:PORT of the peer now (a restarted `ferry remote-serve`
            prints a new port: the engine picks it); default the same.

        Raises
        ------
        InvalidArgumentError
            For a peer given to a tier that starts its own server, or one that is not HOST:PORT.
        PeerGoneError, RegistrationError
            When the new server does not start, or no peer answers.
        PeerLayoutError
            When the peer now holds another layout.
        """
        if self._external is not None:
            self._external = self._external if peer is None else _peer_arg(peer, "RemoteTier.reconnect: peer")
            self._connect(self._external)
        elif peer is not None:
            raise InvalidArgumentError("RemoteTier.reconnect: peer is for a tier made with one; this tier starts its "
                                       "own server")
        else:
            self._stop()
            self._start()
        if self._source is not None:
            self.upload(self._source)

    def close(self) -> None:
        """Stop the server, end the scheduler's pulls (fetch_layers) and the thread that runs the
        engine's calls, and unregister the local memory."""
        if self._fetch.layers:
            self.stop_fetching()
        self._stop()
        self._stop_worker(wait_s=self._timeout)  # idle between calls: it ends at once
        for addr in self._registered:
            self._engine.unregister_memory(addr)
        self._registered = []
        self._dense = {}
        self._staging = None
        self._async_free = []
        self._abandoned = []

    def __enter__(self) -> "RemoteTier":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ writing the remote copy

    def upload(self, source: Optional[LayerCache] = None) -> None:
        """Write a cache's bytes, every layer's K and V, into the remote copy (reconnect() writes
        them again after a fault).

        Parameters
        ----------
        source : KVCache or PagedKVCache, optional
            A cache of the tier's layout (the same layers and bytes per layer); default the
            tier's own.

        Raises
        ------
        InvalidArgumentError
            For a source of another layout.
        PeerGoneError, RemoteTimeoutError, RegistrationError
        """
        src = self._cache if source is None else _cache_arg(source, "RemoteTier.upload: source")
        mine = [(layer, which, n) for layer, which, _, n in self._regions]
        theirs: List[Tuple[int, str, int]] = []
        addrs: List[int] = []
        for layer in range(src.params.n_layer):
            for which, t in (("k", src.k(layer)), ("v", src.v(layer))):
                theirs.append((layer, which, t.nbytes))
                addrs.append(int(t.address or 0))
        if theirs != mine or type(src) is not type(self._cache):
            raise InvalidArgumentError("RemoteTier.upload: source's layers differ from the tier's cache: "
                                       f"{theirs} against {mine}")
        if src is not self._cache:
            for a, (layer, which, n) in zip(addrs, theirs):
                self._register(a, n, f"upload source's layer {layer} {which.upper()}")
        try:
            lengths = [n for _, _, n in mine]
            self._batch("upload", lambda e: e.batch_transfer_sync_write(self._peer, addrs, self._remote, lengths))
        finally:
            if src is not self._cache:
                for a in addrs:
                    self._engine.unregister_memory(a)
                    self._registered.remove(a)
        self._source = src

    # ------------------------------------------------------------ pulling a window

    def _region(self, layer: int, which: str) -> int:
        return next(i for i, r in enumerate(self._regions) if r[0] == layer and r[1] == which)

    def _copies(self, t: Tensor, policy: CopyPolicy) -> List[Copy2D]:
        """The policy's copies of a cell-per-stream window, offsets from its root's first byte."""
        if policy == CopyPolicy.RANGES:
            r = copy_ranges_of(t)
            if r is not None:
                return [r._replace(offset=r.offset + t.offset)]
        if policy == CopyPolicy.PLAN:
            return plan_copy(t)
        if policy == CopyPolicy.RAGGED:
            return plan_ragged(t, self._model)
        return [Copy2D(t.offset, t.nbytes, 1, t.nbytes)]  # flat, and ranges where the rule does not apply

    def _dense_of(self, window: Tensor, which: str) -> Tensor:
        """A registered tensor of window's layout, kept for the next pull of the same layout."""
        key = (which, window.ne, window.nb, str(window.type))
        if key not in self._dense:
            dst = window.dup_layout(name=f"remote_{which}_window")
            self._cpu.alloc_buffer_for(dst)
            self._register(int(dst.address or 0), dst.nbytes, f"the dense {which.upper()} window")
            self._dense[key] = dst
        return self._dense[key]

    def pull(self, layer: int, n_kv: int, policy: PolicyLike = "ragged", lengths: Optional[Tensor] = None,
             s0: int = 0, s1: Optional[int] = None, merge: bool = True) -> Tuple[Tensor, Tensor, PullStats]:
        """Read a step's K and V windows of a layer from the peer in one batch transfer.

        Parameters
        ----------
        layer : int
        n_kv : int
            Cells of each stream the step reads.
        policy : CopyPolicy or str, optional
            Whose copies become pieces (flat, ranges, plan, ragged); a paged cache gathers its
            window's runs under every policy (its gather method: the cache's, runs when AUTO).
        lengths : Tensor, optional
            The step's kv_len (i32 [ns], host memory): the ragged policy and a paged window read
            each stream's first lengths[s] cells.
        s0, s1 : int, optional
            The streams read (default all).
        merge : bool, optional
            Merge pieces that touch, and across gaps the model prices below a piece; False: a piece
            per row of the plan (the per-block baseline of a paged window, say).

        Returns
        -------
        (Tensor, Tensor, PullStats)
            The K and V windows, now holding the remote bytes of every cell they read (a
            cell-per-stream cache's own windows; a paged cache's as dense tensors), and what the
            pull did.

        Raises
        ------
        InvalidArgumentError, OutOfBoundsError, LayoutError
            For a window the cache refuses (naming the argument).
        PeerGoneError
            The peer ended or broke mid-step (naming it and the layer); nothing was written.
        RemoteTimeoutError
            The pull took longer than timeout_s; nothing was written; reconnect() before the next.
        """
        start = time.perf_counter()
        plan = self._prepare("RemoteTier.pull", layer, n_kv, policy, lengths, s0, s1, merge)
        seconds = self._read(plan.layer, plan.batch, plan.places, plan.total)
        assert plan.kout is not None and plan.vout is not None  # a pull's plan has its windows
        total = time.perf_counter() - start
        return plan.kout, plan.vout, plan.stats(seconds, total, total - seconds)

    def pull_async(self, layer: int, n_kv: int, policy: PolicyLike = "ragged", lengths: Optional[Tensor] = None,
                   s0: int = 0, s1: Optional[int] = None, merge: bool = True) -> "PendingPull":
        """Issue the pull of a layer's windows as the engine's async batch read and return at once:
        the next layer's (or step's) windows travel while the current one computes; wait() on the
        result before using them. The batch lands in a staging area of its own, and the windows
        (the same, byte for byte, as pull's) change only in wait(), once the whole batch arrived.

        Parameters
        ----------
        layer, n_kv, policy, lengths, s0, s1, merge
            As pull's. The window is planned now: lengths are read now.

        Returns
        -------
        PendingPull

        Raises
        ------
        InvalidArgumentError, OutOfBoundsError, LayoutError
            For a window the cache refuses (naming the argument).
        PeerGoneError, RemoteTimeoutError
            When the peer is gone, or the batch cannot be issued (naming the peer and the layer);
            nothing was written.
        """
        start = time.perf_counter()
        return self._issue(self._prepare("RemoteTier.pull_async", layer, n_kv, policy, lengths, s0, s1, merge), start)

    def _issue(self, plan: "_PullPlan", start: float) -> "PendingPull":
        """A planned pull's batch issued as the engine's async read into a staging area of its own."""
        staging = self._async_staging_of(plan.total)
        planned = time.perf_counter()  # the tier's own work so far; the submission is the link's (its call_us)
        batch_id = 0
        if len(plan.batch):
            lengths_ = plan.batch[:, 1].tolist()
            local = _starts(plan.batch[:, 1], staging.ctypes.data).tolist()
            remote = plan.batch[:, 0].tolist()
            try:
                batch_id = self._batch(f"layer {plan.layer} (async)", lambda e: e.batch_transfer_async_read(
                    self._peer, local, remote, lengths_), ok=lambda got: got > 0)
            except BaseException:
                self._abandoned.append(staging)  # a late submission may still write there: kept until close
                raise
        return PendingPull(self, plan, staging, batch_id, start, planned)

    def _finish(self, pending: "PendingPull") -> PullStats:
        """PendingPull.wait's work: the batch waited for under the timeout, then placed."""
        plan, staging = pending._plan, pending._staging
        t0 = time.perf_counter()
        try:
            if pending._batch_id:
                self._batch(f"layer {plan.layer} (async)",
                            lambda e: e.get_batch_transfer_status([pending._batch_id]))
        except BaseException:
            self._abandoned.append(staging)  # a late batch may still write there: kept, registered, until close
            raise
        arrived = time.perf_counter()
        for local_base, local_bytes, placed in plan.places:  # all arrived: only now does the destination change
            _place_pieces(local_base, local_bytes, staging.ctypes.data, staging.nbytes, placed)
        self._async_free.append(staging)
        end = time.perf_counter()
        return plan.stats(end - t0, end - pending._start, pending._planned - pending._start + end - arrived)

    def _async_staging_of(self, nbytes: int) -> np.ndarray:
        """A registered staging area of at least nbytes that no batch in flight uses (taken from the
        free ones, or made and registered)."""
        for i, buf in enumerate(self._async_free):
            if buf.nbytes >= nbytes:
                return self._async_free.pop(i)
        buf = np.zeros(max(nbytes, 1 << 16), dtype=np.uint8)
        self._register(buf.ctypes.data, buf.nbytes, "an async staging area")
        return buf

    def _prepare(self, what: str, layer: int, n_kv: int, policy: PolicyLike, lengths: Optional[Tensor], s0: int,
                 s1: Optional[int], merge: bool) -> "_PullPlan":
        """A pull's plan: its windows, the batch's reads, where each piece goes and what is counted."""
        pol = to_policy(policy)
        joined = _checks.as_bool(merge, f"{what}: merge")
        li = _checks.as_c_int(layer, f"{what}: layer")
        cache = self._cache
        assert isinstance(cache, (KVCache, PagedKVCache))  # as the constructor checked
        k, v = cache.window(li, n_kv, s0, s1, lengths=lengths)
        jobs: List[Tuple[np.ndarray, int, int, int]] = []  # (pieces as rows, remote base, local base, local bytes)
        if isinstance(cache, PagedKVCache):
            outs = []
            for which, w in (("k", k), ("v", v)):
                raw = self._gather_pieces(w)
                dst = self._dense_of(w, which)
                r = self._region(li, which)
                jobs.append((raw, self._remote[r], int(dst.address or 0), dst.nbytes))
                outs.append(dst)
            kout, vout = outs[0], outs[1]
            name = "paged"
        else:
            for which, w in (("k", k), ("v", v)):
                r = self._region(li, which)
                root = int(w.root.address or 0)
                base = self._remote[r] + (root - self._regions[r][2])
                jobs.append((_copy_piece_array(self._copies(w, pol)), base, root, w.root.nbytes))
            kout, vout = k, v
            name = str(pol)
        return self._plan_of(li, name, kout, vout, jobs, joined)

    def _plan_of(self, layer: int, name: str, kout: Optional[Tensor], vout: Optional[Tensor],
                 jobs: Sequence[Tuple[np.ndarray, int, int, int]], joined: bool) -> "_PullPlan":
        """One batch of the jobs (per window: its pieces as rows, remote base, local base, local bytes),
        merged or not: its reads, where each piece goes from staging, and what it counts."""
        reads: List[np.ndarray] = []  # per job, rows (remote address, bytes): the batch's pieces
        places: List[Tuple[int, int, np.ndarray]] = []  # per job, (local base, bytes, pieces staging -> local)
        total = plan_pieces = bytes_read = 0
        for raw, remote_base, local_base, local_bytes in jobs:
            plan_pieces += len(raw)
            bytes_read += int(raw[:, 2].sum())
            got, placed = self._plan_reads(raw, remote_base, joined, total)
            reads.append(got)
            places.append((local_base, local_bytes, placed))
            total += int(got[:, 1].sum())
        batch = np.concatenate(reads) if reads else np.zeros((0, 2), dtype=np.uintp)
        return _PullPlan(layer, name, kout, vout, batch, places, total, plan_pieces, bytes_read, self._predict(batch))

    def _predict(self, batch: np.ndarray) -> float:
        """The model's seconds for a batch's reads (rows remote address, bytes): a call, and each
        piece's cost and its bytes at its size's rate."""
        m = self._model
        sizes, counts = np.unique(batch[:, 1], return_counts=True)
        return m.call_us * 1e-6 + sum(int(c) * (m.piece_ns * 1e-9 + m.piece_seconds(int(b)))
                                      for b, c in zip(sizes, counts))

    def _gather_pieces(self, window: Tensor) -> np.ndarray:
        """A paged window's gather's pieces (src_offset in the pool, dst_offset in the dense window,
        size), from C to an array."""
        # planned for the host, which has no one-call gather: C takes AUTO as runs; the cache is left as set
        return _paged_piece_array(window, self._cpu)

    # ------------------------------------------------------------ pulls the scheduler makes

    def fetch_layers(self, layers: Optional[Sequence[int]] = None, merge: bool = True) -> None:
        """Have a Scheduler pull these layers' windows itself, as the tier below host memory
        (ferry.fetch.set_fetch on each layer's K and V): each run that reads a window of one of them
        issues the tier's async batch for the bytes its copy reads (under the scheduler's policy; a
        paged window's blocks), landing at their own offsets in the local cache once the whole batch
        arrived, and waits for it before the host -> device copy. With Scheduler.prefetch n the
        batch is issued n + 1 parts ahead: it travels under the compute of the layers before. What
        each pull did is kept for take_fetch_stats. A pull that fails fails the run with the
        tier's error (PeerGoneError, RemoteTimeoutError: naming the peer and the layer); reconnect()
        before the next. Calling it again replaces the layers; stop_fetching() ends it.

        Parameters
        ----------
        layers : sequence of int, optional
            The layers in the remote tier; default every layer.
        merge : bool, optional
            Merge pieces as pull does (False: a read per piece of the plan).

        Raises
        ------
        InvalidArgumentError, OutOfBoundsError
            For layers that are not the cache's layer indices, or merge not a bool.
        """
        n_layer = self._cache.params.n_layer
        if layers is not None and not _checks._is_sequence(layers):
            raise InvalidArgumentError(f"RemoteTier.fetch_layers: layers must be a sequence of layer indices, "
                                       f"got {type(layers).__name__}")
        chosen = list(range(n_layer)) if layers is None else [
            _checks.as_c_int(x, f"RemoteTier.fetch_layers: layers[{i}]") for i, x in enumerate(layers)]
        for i, layer in enumerate(chosen):
            if not 0 <= layer < n_layer:
                raise OutOfBoundsError(f"RemoteTier.fetch_layers: layers[{i}] is {layer}: the cache's layers are "
                                       f"0..{n_layer - 1}")
        self._fetch.start(chosen, _checks.as_bool(merge, "RemoteTier.fetch_layers: merge"))

    @property
    def fetching(self) -> Tuple[int, ...]:
        """The layers a Scheduler pulls through the tier (fetch_layers), in order."""
        return tuple(self._fetch.layers)

    def stop_fetching(self) -> None:
        """The layers fetch_layers gave are read where they are again, as local ones (a cache closed
        first has nothing left to mark)."""
        self._fetch.stop()

    def take_fetch_stats(self) -> List[PullStats]:
        """What each pull a Scheduler made through the tier did since the last call (fetch_layers),
        in the order they landed (the last FETCH_STATS_KEPT of them); they are forgotten."""
        return self._fetch.take_stats()

    def _fetch_begin(self, window: Tensor, policy: CopyPolicy) -> int:
        """ferry.fetch's begin: plan the bytes a copy of window under policy reads, landing in place
        in the local cache, and issue their batch."""
        start = time.perf_counter()
        root = int(window.root.address or 0)
        r = next((i for i, reg in enumerate(self._regions) if reg[2] == root), -1)
        if r < 0:
            raise InvalidArgumentError(f"RemoteTier: a window of a tensor at {root:#x}, not one of the tier's regions")
        layer, _, local_base, local_bytes = self._regions[r]
        if isinstance(self._cache, PagedKVCache):
            raw = self._gather_pieces(window).copy()
            raw[:, 1] = raw[:, 0]  # in place: the scheduler's gather reads the pool
            name = "paged"
        else:
            raw = _copy_piece_array(self._copies(window, policy))
            name = str(policy)
        plan = self._plan_of(layer, name, None, None, [(raw, self._remote[r], local_base, local_bytes)],
                             self._fetch.merge)
        return self._fetch.hold(self._issue(plan, start))

    def region_bytes(self) -> int:
        """Bytes of the smallest region (a layer's K or V): the most a timed read may span."""
        return min(n for _, _, _, n in self._regions)

    def timed_read(self, pieces: Sequence[Tuple[int, int]]) -> float:
        """Seconds of one batch read of pieces of layer 0's K region into the staging buffer (the
        destination is not touched): what measure_remote_link times.

        Parameters
        ----------
        pieces : sequence of (int, int)
            (offset in the region, bytes) of each piece.

        Returns
        -------
        float

        Raises
        ------
        OutOfBoundsError
            For a piece past the region.
        PeerGoneError, RemoteTimeoutError
        """
        limit = self.region_bytes()
        rows = []
        for i, p in enumerate(pieces):
            off, n = _checks.as_size(p[0], f"timed_read: piece {i}"), _checks.as_size(p[1], f"timed_read: piece {i}")
            if off + n > limit:
                raise OutOfBoundsError(f"timed_read: piece {i} ({n} bytes at {off}) ends past the region's {limit}")
            rows.append((off, n))
        total = sum(n for _, n in rows)
        staging = self._staging_of(total)
        local, at = [], staging.ctypes.data
        for _, n in rows:
            local.append(at)
            at += n
        remote = [self._remote[0] + off for off, _ in rows]
        lengths = [n for _, n in rows]
        t0 = time.perf_counter()
        self._batch("a timed read", lambda e: e.batch_transfer_sync_read(self._peer, local, remote, lengths))
        return time.perf_counter() - t0

    def _staging_of(self, nbytes: int) -> np.ndarray:
        """The registered staging buffer, grown to hold nbytes."""
        if self._staging is None or self._staging.nbytes < nbytes:
            if self._staging is not None and self._staging.ctypes.data in self._registered:
                self._engine.unregister_memory(self._staging.ctypes.data)
                self._registered.remove(self._staging.ctypes.data)
            staging = np.zeros(max(nbytes, 1 << 16, 2 * (self._staging.nbytes if self._staging is not None else 0)),
                               dtype=np.uint8)
            self._register(staging.ctypes.data, staging.nbytes, "the staging buffer")
            self._staging = staging
        return self._staging

    def _plan_reads(self, raw: np.ndarray, remote_base: int, joined: bool, at: int) -> Tuple[np.ndarray, np.ndarray]:
        """The reads of one window's pieces (rows src_offset, dst_offset, size), landing in the
        staging buffer from offset at, and where each piece goes from there: rows (remote address,
        bytes) and pieces (offset in staging, offset in the destination, bytes), in bulk. The pieces
        land in staging, so only their source gaps matter: merged, the pieces in source order join
        by the one merge rule (merge_pieces of the source ranges alone); unmerged, a read per piece."""
        if len(raw) == 0:
            return np.zeros((0, 2), dtype=np.uintp), np.zeros((0, 3), dtype=np.uintp)
        src, dst, size = raw[:, 0], raw[:, 1], raw[:, 2]
        if not joined:
            staged = _starts(size, at)
            return np.stack([src + np.uintp(remote_base), size], axis=1), np.stack([staged, dst, size], axis=1)
        order = np.argsort(src, kind="stable")
        ranges, _ = _merge_piece_array(np.stack([src[order], src[order], size[order]], axis=1), self._model)
        starts, lengths = ranges[:, 0], ranges[:, 2]
        range_at = _starts(lengths, at)
        within = np.searchsorted(starts, src, side="right") - 1  # the range holding each piece
        staged = range_at[within] + (src - starts[within])
        return np.stack([starts + np.uintp(remote_base), lengths], axis=1), np.stack([staged, dst, size], axis=1)

    def _read(self, layer: int, reads: np.ndarray, places: List[Tuple[int, int, np.ndarray]], total: int) -> float:
        """One batch transfer of the reads (rows remote address, bytes) into staging, then each
        destination's pieces (local base, its bytes, pieces from staging to it) placed by C in one
        call each; seconds of the transfer."""
        if len(reads) == 0:
            return 0.0
        staging = self._staging_of(total)
        lengths = reads[:, 1].tolist()
        local = _starts(reads[:, 1], staging.ctypes.data).tolist()
        remote = reads[:, 0].tolist()
        t0 = time.perf_counter()
        self._batch(f"layer {layer}", lambda e: e.batch_transfer_sync_read(self._peer, local, remote, lengths))
        seconds = time.perf_counter() - t0
        for local_base, local_bytes, placed in places:  # the whole batch arrived: only now does the destination change
            _place_pieces(local_base, local_bytes, staging.ctypes.data, staging.nbytes, placed)
        return seconds

    def _batch(self, what: str, call: Any, ok: Any = lambda got: got == 0) -> int:
        """Run one call of the engine (a batch transfer, its submission or its wait) under the
        timeout; refuse it on a broken tier or a dead peer; ok(result) says it succeeded. Returns
        the result."""
        if self._broken is not None:
            raise PeerGoneError(f"remote tier: peer {self._peer}: {what} refused: {self._broken}; "
                                "reconnect() first")
        if self._external is None and (self._server is None or self._server.poll() is not None):
            self._broken = "its process ended"
            raise PeerGoneError(f"remote tier: peer {self._peer}: {what}: the peer's process ended; nothing was "
                                "written; reconnect() starts it again")
        ended, result = self._call_engine(call)
        if not ended:
            self._broken = f"a transfer took more than {self._timeout:g} s"
            if self._staging is not None:  # the late transfer may still write there: kept, registered, until close
                self._abandoned.append(self._staging)
                self._staging = None
            raise RemoteTimeoutError(f"remote tier: peer {self._peer}: {what}: no answer within {self._timeout:g} s; "
                                     "nothing was written; reconnect() before the next pull")
        if not result or not ok(result[0]):
            gone = self._server is None if self._external is None else not self._peer_answers()
            if self._server is not None:
                try:  # a peer killed mid-transfer: its end may lag the broken connection a little
                    self._server.wait(timeout=0.5)
                    gone = True
                except subprocess.TimeoutExpired:
                    pass
            self._broken = "its process ended" if gone else f"a transfer failed (status {result[:1]})"
            cls = PeerGoneError if gone else RemoteError
            raise cls(f"remote tier: peer {self._peer}: {what}: the transfer failed "
                      f"({'the peer is gone' if gone else f'status {result[:1]}'}); nothing was written; "
                      "reconnect() starts it again")
        return result[0]

    def _call_engine(self, call: Any) -> Tuple[bool, List[int]]:
        """call(engine) run on the tier's worker under the timeout: whether it ended in time, and its
        result ([] when it raised). A call still running at the timeout keeps its worker: that one
        is let go (it ends once the call returns) and the next call starts another. A call made
        while another thread's runs gets a worker of its own, its timeout its own."""
        if self._worker is None or not self._worker.thread.is_alive():  # not started, or gone (in a forked child)
            self._worker = _EngineWorker(self._engine)
            weakref.finalize(self, self._worker.stop)  # a tier dropped unclosed: its thread ends too
        worker = self._worker
        if not worker.busy.acquire(blocking=False):  # another thread's call runs there: this one's own, as before
            spare = _EngineWorker(self._engine)
            try:
                return spare.run(call, self._timeout)
            finally:
                spare.stop()
        ended = False
        try:
            ended, result = worker.run(call, self._timeout)
        finally:
            if not ended and self._worker is worker:  # timed out, or the wait interrupted: the call may still run
                self._stop_worker()
            worker.busy.release()
        return ended, result

    def _stop_worker(self, wait_s: float = 0.0) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop(wait_s)

    def __repr__(self) -> str:
        return f"RemoteTier(peer={self._peer}, regions={len(self._regions)}, broken={self._broken is not None})"
