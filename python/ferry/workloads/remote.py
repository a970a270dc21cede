"""What `ferry bench --remote` and `ferry validate --remote` add: the copy policies' windows pulled
from a remote tier (ferry.remote, imported only here and only when asked), checked byte for byte
against the same cache held locally.

For each npl: a cache of the run's geometry, npl streams of -c / npl cells, filled with seeded
random bytes, is held by a server process on the loopback (RemoteTier); the link is measured
(measure_remote_link) and its fitted model merges and predicts the pulls. Each decode step pulls
every layer's K and V windows under each policy, the ragged policy reading the step's lengths, and
each pulled window is compared with what the copy path delivers from the local cache.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..backend import CPUBackend
from ..copy_path import copy_input
from ..kv import KVCache
from ..plan import CopyCostModel
from ..tensor import Tensor
from ..types import to_type
from .common import KVGeometry, Lengths, n_kv_for, prompt_lengths

#: The byte a destination is filled with before a copy: bytes the copy leaves are seen.
SENTINEL = 0xA5


@dataclass(frozen=True)
class RemoteRow:
    """One policy's pulls at one npl.

    Attributes
    ----------
    npl : int
    policy : str
    steps : int
        Decode steps pulled (every layer's K and V windows each).
    pieces_per_step : float
        Pieces of the batch transfers of a step, all layers.
    bytes_per_step : float
        Bytes moved a step, all layers.
    ms_per_step : float
        The median step's pull time, milliseconds.
    predicted_ms_per_step : float
        The fitted link model's prediction of a step, milliseconds.
    identical : bool
        Every pulled window delivered the local cache's bytes.
    """

    npl: int
    policy: str
    steps: int
    pieces_per_step: float
    bytes_per_step: float
    ms_per_step: float
    predicted_ms_per_step: float
    identical: bool


@dataclass(frozen=True)
class RemoteResult:
    """`--remote`'s rows, and the link each npl's tier measured.

    Attributes
    ----------
    rows : tuple of RemoteRow
    links : tuple of (int, float, float, float)
        Per npl: (npl, a batch's microseconds, a piece's nanoseconds, GB/s) as fitted.
    peer : str
        The peer read (HOST:PORT), or "" for a server on the loopback.
    """

    rows: Tuple[RemoteRow, ...]
    links: Tuple[Tuple[int, float, float, float], ...]
    peer: str = ""

    @property
    def identical(self) -> bool:
        """Whether every pull delivered the local bytes."""
        return all(r.identical for r in self.rows)

    def as_dict(self) -> Dict[str, Any]:
        """The rows and links as JSON-ready values."""
        return {"peer": self.peer, "rows": [asdict(r) for r in self.rows],
                "links": [dict(zip(("npl", "batch_us", "piece_ns", "gbps"), link)) for link in self.links]}


def _delivered(cpu: CPUBackend, window: Tensor, policy: str) -> bytes:
    dst = window.dup_layout()
    cpu.alloc_buffer_for(dst)
    dst.set(bytes([SENTINEL]) * dst.nbytes)
    copy_input(cpu, policy, window, dst)
    return bytes(dst.get())


def random_cache(geometry: KVGeometry, n_ctx: int, npl: int, seed: int) -> KVCache:
    """A cache of the geometry, n_ctx cells over npl streams, filled from seed alone: a peer started alone
    (`ferry remote-serve --seed N`) and a run's local cache hold the same bytes.

    Parameters
    ----------
    geometry : KVGeometry
    n_ctx, npl : int
        Cells in all streams together, and streams.
    seed : int

    Returns
    -------
    KVCache
    """
    kv = KVCache(geometry.type_kv, geometry.type_kv, geometry.head_dim, geometry.n_head_kv, n_ctx, npl,
                 geometry.n_layer, v_trans=geometry.v_trans)
    rng = np.random.default_rng([seed, 45])
    for layer in range(geometry.n_layer):
        for t in (kv.k(layer), kv.v(layer)):
            # f16 and f32 values of [-1, 1); quantized blocks as random bytes would hold NaN scales
            if to_type(geometry.type_kv).is_quantized:
                t.set(bytes(t.nbytes))
            else:
                dtype = np.float16 if str(to_type(geometry.type_kv)) != "f32" else np.float32
                t.set(rng.uniform(-1, 1, t.nbytes // np.dtype(dtype).itemsize).astype(dtype).tobytes())
    return kv


def run_remote(geometry: KVGeometry, n_ctx: int, npls: Sequence[int], npp: int, ntg: int, pad: int,
               lengths: Lengths, policies: Sequence[str], seed: int = 0, peer: Optional[str] = None) -> RemoteResult:
    """Pull each policy's windows of every step from a remote tier and check them against the local cache.

    Parameters
    ----------
    geometry : KVGeometry
    n_ctx : int
        Cells in all streams together.
    npls : sequence of int
        Streams, one run each.
    npp, ntg, pad : int
        Prompt cells (the longest), steps, and the window's rounding.
    lengths : str or tuple of int
        The prompts' lengths (common.prompt_lengths).
    policies : sequence of str
        Copy policies.
    seed : int, optional
        The content's and the lengths' seed.
    peer : str, optional
        HOST:PORT of a peer started alone (`ferry remote-serve`) holding random_cache of the same
        geometry, npl and seed: nothing is uploaded, the local cache is made from the seed alone.
        Default: a server on the loopback, the local cache uploaded.

    Returns
    -------
    RemoteResult

    Raises
    ------
    FerryError
        EngineUnavailableError where the engine is missing (naming what to install), the tier's errors
        when the peer fails; PeerLayoutError when the peer holds another layout or another seed's bytes.
    """
    from ..remote import RemoteTier, measure_remote_link

    cpu = CPUBackend()
    rows: List[RemoteRow] = []
    links = []
    for npl in npls:
        kv_size = n_ctx // npl
        local = random_cache(geometry, n_ctx, npl, seed)
        mirror = random_cache(geometry, n_ctx, npl, seed + 1)
        prompts = prompt_lengths(lengths, npl, npp, seed)
        with RemoteTier(mirror, timeout_s=60.0, peer=peer) as tier:
            if peer is None:
                tier.upload(local)
            elif (tier.peer_layout or {}).get("contents") != {"seed": seed}:
                from ..remote import PeerLayoutError

                raise PeerLayoutError(f"remote tier: peer {peer} holds {(tier.peer_layout or {}).get('contents')}, "
                                      f"this run's local cache seed {seed}: start it with --seed {seed}")
            region = tier.region_bytes()
            if region >= 32768:
                fit = measure_remote_link(tier, nbytes=min(region, 4 << 20), repeats=3).fit
                assert fit is not None
                tier.model = CopyCostModel.from_link(fit)
                links.append((npl, fit.latency_us, fit.row_ns, fit.gbps))
            for policy in policies:
                times, predicted, pieces, moved, same = [], [], 0, 0, True
                for step in range(ntg):
                    n_kv = n_kv_for(npp, step + 1, pad, kv_size)
                    lens = Tensor.from_numpy(cpu, np.array([min(p + step + 1, n_kv) for p in prompts], np.int32))
                    seconds = predicted_s = 0.0
                    for layer in range(geometry.n_layer):
                        k, v, st = tier.pull(layer, n_kv, policy, lengths=lens)
                        seconds += st.seconds
                        predicted_s += st.predicted_seconds
                        pieces += st.pieces
                        moved += st.bytes
                        rk, rv = local.window(layer, n_kv, lengths=lens)
                        same = same and _delivered(cpu, k, policy) == _delivered(cpu, rk, policy) \
                            and _delivered(cpu, v, policy) == _delivered(cpu, rv, policy)
                    times.append(seconds)
                    predicted.append(predicted_s)
                rows.append(RemoteRow(npl=npl, policy=policy, steps=ntg, pieces_per_step=pieces / ntg,
                                      bytes_per_step=moved / ntg, ms_per_step=statistics.median(times) * 1e3,
                                      predicted_ms_per_step=statistics.median(predicted) * 1e3, identical=same))
    return RemoteResult(rows=tuple(rows), links=tuple(links), peer=peer or "")


def format_remote(res: RemoteResult) -> List[str]:
    """The rows as text lines (a table, then the links' fits)."""
    lines = [f"remote tier ({res.peer or 'a server process on the loopback'}, Mooncake's transfer engine):",
             f"{'npl':>4} {'policy':>7} {'pieces/step':>11} {'bytes/step':>12} {'ms/step':>8} {'model ms':>9}  bytes",
             ]
    for r in res.rows:
        lines.append(f"{r.npl:>4} {r.policy:>7} {r.pieces_per_step:>11.0f} {r.bytes_per_step:>12,.0f} "
                     f"{r.ms_per_step:>8.2f} {r.predicted_ms_per_step:>9.2f}  "
                     f"{'identical' if r.identical else 'DIFFERENT'}")
    for npl, batch_us, piece_ns, gbps in res.links:
        lines.append(f"npl {npl}: link fitted: {batch_us:.0f} us a batch, {piece_ns / 1e3:.1f} us a piece, "
                     f"{gbps:.2f} GB/s")
    return lines
