"""What `ferry bench --remote` and `ferry validate --remote` add: the copy policies' windows pulled
from a remote tier (ferry.remote, imported only here and only when asked), checked byte for byte
against the same cache held locally.

For each npl: a cache of the run's geometry, npl streams of -c / npl cells, filled with seeded
random bytes, is held by a server process on the loopback (RemoteTier); the link is measured
(measure_remote_link) and its fitted model merges and predicts the pulls. Each decode step pulls
every layer's K and V windows under each policy, the ragged policy reading the step's lengths, and
each pulled window is compared with what the copy path delivers from the local cache.

With a paged layout (--paged: a pool of -c cells in --block-size blocks, a table for each of npl
sequences drawn by --adjacency), the tier holds the pools, and each step's windows are gathered
from it per block, by runs and by runs merged across the gaps the link's model prices below a
piece (PAGED_PULLS): the policies do not change a paged window's pieces. Each cell a gathered
window reads is compared with the local cache's gather of it.

Then the decode steps themselves: a Scheduler pulls every layer from the tier (fetch_layers), under
each policy, serially and prefetching one layer ahead (a layer's pull issued under the compute of
the layer before), and each step's attention outputs (on a stand-in device) are compared byte for
byte with the same step over the local cache (RemoteResult.steps).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..backend import CPUBackend
from ..copy_cost import CopyCostModel
from ..copy_path import copy_input
from ..kv import KVCache
from ..kv_layers import LayerCache
from ..paged import PagedKVCache
from ..tensor import Tensor
from ..types import to_type
from .common import KVGeometry, Lengths, n_kv_for, prompt_lengths
from .paged_tables import PagedOptions, adjacent_tables, blocks_for, check_pool

#: The byte a destination is filled with before a copy: bytes the copy leaves are seen.
SENTINEL = 0xA5
#: A paged window's pulls, each a row: (its name, the cache's gather method, whether pieces merge
#: across gaps): one piece a block (the baseline), one a run, and runs merged by the link's model.
PAGED_PULLS = (("paged/per_block", "per_block", False), ("paged/runs", "runs", False),
               ("paged/merged", "runs", True))


@dataclass(frozen=True)
class RemoteRow:
    """One policy's pulls at one npl (paged: one of PAGED_PULLS).

    Attributes
    ----------
    npl : int
    policy : str
        The copy policy, or the paged pull's name (paged/per_block, paged/runs, paged/merged).
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
    steps: Tuple["RemoteSteps", ...] = ()

    @property
    def identical(self) -> bool:
        """Whether every pull delivered the local bytes, and every step through the scheduler gave the
        local outputs."""
        return all(r.identical for r in self.rows) and all(s.identical for s in self.steps)

    def as_dict(self) -> Dict[str, Any]:
        """The rows, steps and links as JSON-ready values."""
        return {"peer": self.peer, "rows": [asdict(r) for r in self.rows], "steps": [asdict(s) for s in self.steps],
                "links": [dict(zip(("npl", "batch_us", "piece_ns", "gbps"), link)) for link in self.links]}


@dataclass(frozen=True)
class RemoteSteps:
    """Decode steps whose layers a Scheduler pulled from the tier (RemoteTier.fetch_layers), at one npl,
    policy and prefetch depth.

    Attributes
    ----------
    npl : int
    policy : str
        The scheduler's copy policy.
    prefetch : int
        Its prefetch depth (1: a layer's pull issued under the compute of the layer before).
    steps : int
    pulls_per_step : float
        Pulls the scheduler made a step (one a window: every layer's K and V).
    bytes_per_step : float
        Bytes they moved a step.
    identical : bool
        Every step's attention outputs were the local cache's step's, byte for byte.
    """

    npl: int
    policy: str
    prefetch: int
    steps: int
    pulls_per_step: float
    bytes_per_step: float
    identical: bool


def _delivered(cpu: CPUBackend, window: Tensor, policy: str, fill: int = SENTINEL) -> bytes:
    dst = window.dup_layout()
    cpu.alloc_buffer_for(dst)
    dst.set(bytes([fill]) * dst.nbytes)
    copy_input(cpu, policy, window, dst)
    return bytes(dst.get())


def _gathers_same_cells(cpu: CPUBackend, pulled: Tensor, local: Tensor) -> bool:
    """Whether a pulled dense window holds the local window's gather in every byte the gather writes
    (the cells the window reads): the bytes a gather over SENTINEL and one over its complement
    agree on. The cells it does not read hold what earlier pulls left there."""
    one = np.frombuffer(_delivered(cpu, local, "flat"), np.uint8)
    written = one == np.frombuffer(_delivered(cpu, local, "flat", SENTINEL ^ 0xFF), np.uint8)
    return bool(np.array_equal(np.frombuffer(bytes(pulled.get()), np.uint8)[written], one[written]))


def _fill_random(cache: LayerCache, geometry: KVGeometry, seed: int) -> None:
    """Every layer's K and V (a paged cache's pools) filled from seed alone, layer by layer, K before V."""
    rng = np.random.default_rng([seed, 45])
    for layer in range(geometry.n_layer):
        for t in (cache.k(layer), cache.v(layer)):
            # f16 and f32 values of [-1, 1); quantized blocks as random bytes would hold NaN scales
            if to_type(geometry.type_kv).is_quantized:
                t.set(bytes(t.nbytes))
            else:
                dtype = np.float16 if str(to_type(geometry.type_kv)) != "f32" else np.float32
                t.set(rng.uniform(-1, 1, t.nbytes // np.dtype(dtype).itemsize).astype(dtype).tobytes())


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
    _fill_random(kv, geometry, seed)
    return kv


def random_paged_cache(geometry: KVGeometry, n_ctx: int, npl: int, block_size: int, seed: int) -> PagedKVCache:
    """A paged cache of the geometry, its pools of n_ctx cells in whole blocks of block_size, a table for
    each of npl sequences (empty: a run draws its own), the pools filled from seed alone: a paged peer
    started alone (`ferry remote-serve --paged --seed N`) and a run's local paged cache hold the same bytes.

    Parameters
    ----------
    geometry : KVGeometry
    n_ctx, npl, block_size : int
        Cells of a pool (rounded up to whole blocks), sequences, and cells per block.
    seed : int

    Returns
    -------
    PagedKVCache

    Raises
    ------
    FerryError
        As PagedKVCache raises for a layout it refuses.
    """
    kv = PagedKVCache(geometry.type_kv, geometry.type_kv, geometry.head_dim, geometry.n_head_kv, block_size,
                      blocks_for(n_ctx, block_size), npl, geometry.n_layer, v_trans=geometry.v_trans)
    _fill_random(kv, geometry, seed)
    return kv


def _caches(geometry: KVGeometry, n_ctx: int, npl: int, cells: int, seed: int,
            paged: Optional[PagedOptions]) -> Tuple[Union[KVCache, PagedKVCache], Union[KVCache, PagedKVCache]]:
    """The local cache made from seed, and the tier's own (its memory receives the windows) of the same
    layout from another seed; paged, both with the same tables of cells cells, drawn by adjacency."""
    if paged is None:
        return random_cache(geometry, n_ctx, npl, seed), random_cache(geometry, n_ctx, npl, seed + 1)
    n_blocks = check_pool(n_ctx, npl, cells, paged.block_size)
    local = random_paged_cache(geometry, n_ctx, npl, paged.block_size, seed)
    mirror = random_paged_cache(geometry, n_ctx, npl, paged.block_size, seed + 1)
    tables = adjacent_tables([blocks_for(cells, paged.block_size)] * npl, n_blocks, paged.adjacency, seed)
    for s, table in enumerate(tables):
        local.set_table(s, table, cells)
        mirror.set_table(s, table, cells)
    return local, mirror


def run_remote(geometry: KVGeometry, n_ctx: int, npls: Sequence[int], npp: int, ntg: int, pad: int,
               lengths: Lengths, policies: Sequence[str], seed: int = 0, peer: Optional[str] = None,
               paged: Optional[PagedOptions] = None) -> RemoteResult:
    """Pull each policy's windows of every step from a remote tier and check them against the local cache.

    Parameters
    ----------
    geometry : KVGeometry
    n_ctx : int
        Cells in all streams together (paged: in a pool, rounded up to whole blocks).
    npls : sequence of int
        Streams, one run each.
    npp, ntg, pad : int
        Prompt cells (the longest), steps, and the window's rounding.
    lengths : str or tuple of int
        The prompts' lengths (common.prompt_lengths).
    policies : sequence of str
        Copy policies (a row each; a paged cache's rows are PAGED_PULLS instead).
    seed : int, optional
        The content's, the lengths' and (paged) the tables' seed.
    peer : str, optional
        HOST:PORT of a peer started alone (`ferry remote-serve`, with --paged for a paged layout)
        holding random_cache (or random_paged_cache) of the same layout and seed: nothing is
        uploaded, the local cache is made from the seed alone. Default: a server on the loopback,
        the local cache uploaded.
    paged : PagedOptions, optional
        A paged layout (its block_size and adjacency): the tier holds a paged cache whose tables hold
        npp + ntg cells a sequence. Default: the cell-per-stream cache.

    Returns
    -------
    RemoteResult

    Raises
    ------
    InvalidArgumentError
        Paged, for a pool of n_ctx cells that does not hold the sequences (naming -c, -npl, --block-size).
    FerryError
        EngineUnavailableError where the engine is missing (naming what to install), the tier's errors
        when the peer fails; PeerLayoutError when the peer holds another layout or another seed's bytes.
    """
    from ..remote import RemoteTier, measure_remote_link

    cpu = CPUBackend()
    rows: List[RemoteRow] = []
    steps: List[RemoteSteps] = []
    links = []
    for npl in npls:
        kv_size = n_ctx // npl
        local, mirror = _caches(geometry, n_ctx, npl, npp + ntg, seed, paged)
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
            pulls = ([(p, p, "", True) for p in policies] if paged is None
                     else [(name, "ragged", gather, merge) for name, gather, merge in PAGED_PULLS])
            for name, policy, gather, merge in pulls:
                if isinstance(mirror, PagedKVCache):
                    mirror.gather = gather
                times, predicted, pieces, moved, same = [], [], 0, 0, True
                for step in range(ntg):
                    n_kv = n_kv_for(npp, step + 1, pad, kv_size)
                    lens = Tensor.from_numpy(cpu, np.array([min(p + step + 1, n_kv) for p in prompts], np.int32))
                    seconds = predicted_s = 0.0
                    for layer in range(geometry.n_layer):
                        k, v, st = tier.pull(layer, n_kv, policy, lengths=lens, merge=merge)
                        seconds += st.seconds
                        predicted_s += st.predicted_seconds
                        pieces += st.pieces
                        moved += st.bytes
                        rk, rv = local.window(layer, n_kv, lengths=lens)
                        if paged is None:
                            same = same and _delivered(cpu, k, policy) == _delivered(cpu, rk, policy) \
                                and _delivered(cpu, v, policy) == _delivered(cpu, rv, policy)
                        else:
                            same = same and _gathers_same_cells(cpu, k, rk) and _gathers_same_cells(cpu, v, rv)
                    times.append(seconds)
                    predicted.append(predicted_s)
                rows.append(RemoteRow(npl=npl, policy=name, steps=ntg, pieces_per_step=pieces / ntg,
                                      bytes_per_step=moved / ntg, ms_per_step=statistics.median(times) * 1e3,
                                      predicted_ms_per_step=statistics.median(predicted) * 1e3, identical=same))
            steps += _scheduled_steps(tier, local, mirror, geometry, npl, npp, ntg, pad, kv_size, prompts,
                                      policies, seed)
    return RemoteResult(rows=tuple(rows), links=tuple(links), peer=peer or "", steps=tuple(steps))


def _scheduled_steps(tier: Any, local: LayerCache, mirror: LayerCache, geometry: KVGeometry, npl: int, npp: int,
                     ntg: int, pad: int, kv_size: int, prompts: Sequence[int], policies: Sequence[str],
                     seed: int) -> List[RemoteSteps]:
    """The decode steps with every layer pulled by a Scheduler from the tier (its own cache, mirror),
    each policy serially and prefetching, each step's outputs against the local cache's step."""
    from ..backend import StandinBackend
    from ..sched import Scheduler
    from ..step import attention_step

    cpu, dev = CPUBackend(), StandinBackend()
    rng = np.random.default_rng([seed, 4545])
    q = [Tensor.from_numpy(cpu, rng.uniform(-1, 1, (npl, 1, geometry.n_head, geometry.head_dim)).astype(np.float32))
         for _ in range(geometry.n_layer)]

    def outputs(cache: LayerCache, policy: str, prefetch: int, n_kv: int, kv_len: Tensor) -> List[bytes]:
        sched = Scheduler([dev, cpu], policy=policy, prefetch=prefetch)
        try:
            step = attention_step(sched, dev, cache.windows(n_kv), q, kv_len, geometry.v_trans)  # type: ignore[attr-defined]
            sched.compute(step.graph)
            return [bytes(o.get()) for o in step]
        finally:
            sched.close()

    out: List[RemoteSteps] = []
    tier.fetch_layers()
    try:
        for policy in policies:
            for prefetch in (0, 1):
                same, pulls, moved = True, 0, 0
                for step in range(ntg):
                    n_kv = n_kv_for(npp, step + 1, pad, kv_size)
                    kv_len = Tensor.from_numpy(cpu, np.array([min(p + step + 1, n_kv) for p in prompts], np.int32))
                    for layer in range(geometry.n_layer):  # the tier's cache wrong until pulled
                        for t in (mirror.k(layer), mirror.v(layer)):
                            t.set(bytes([SENTINEL]) * t.nbytes)
                    got = outputs(mirror, policy, prefetch, n_kv, kv_len)
                    stats = tier.take_fetch_stats()
                    pulls += len(stats)
                    moved += sum(st.bytes for st in stats)
                    same = same and got == outputs(local, policy, prefetch, n_kv, kv_len)  # the local cache: no fetch
                out.append(RemoteSteps(npl=npl, policy=policy, prefetch=prefetch, steps=ntg, pulls_per_step=pulls / ntg,
                                       bytes_per_step=moved / ntg, identical=same))
    finally:
        tier.stop_fetching()
    return out


def format_remote(res: RemoteResult) -> List[str]:
    """The rows as text lines (a table, then the links' fits)."""
    width = max([7] + [len(r.policy) for r in res.rows])  # a paged row's name: paged/per_block
    lines = [f"remote tier ({res.peer or 'a server process on the loopback'}, Mooncake's transfer engine):",
             f"{'npl':>4} {'policy':>{width}} {'pieces/step':>11} {'bytes/step':>12} {'ms/step':>8} {'model ms':>9}  "
             "bytes",
             ]
    for r in res.rows:
        lines.append(f"{r.npl:>4} {r.policy:>{width}} {r.pieces_per_step:>11.0f} {r.bytes_per_step:>12,.0f} "
                     f"{r.ms_per_step:>8.2f} {r.predicted_ms_per_step:>9.2f}  "
                     f"{'identical' if r.identical else 'DIFFERENT'}")
    if res.steps:
        lines.append("decode steps, every layer pulled by the scheduler (fetch_layers), outputs against the local "
                     "cache's step:")
        lines.append(f"{'npl':>4} {'policy':>{width}} {'pulls/step':>11} {'bytes/step':>12}  outputs, prefetch 0 / 1")
        by: Dict[Tuple[int, str], List[RemoteSteps]] = {}
        for st in res.steps:
            by.setdefault((st.npl, st.policy), []).append(st)
        for (npl, policy), sts in by.items():
            said = " / ".join("identical" if st.identical else "DIFFERENT" for st in sts)
            lines.append(f"{npl:>4} {policy:>{width}} {sts[0].pulls_per_step:>11.0f} {sts[0].bytes_per_step:>12,.0f}  "
                         f"{said}")
    for npl, batch_us, piece_ns, gbps in res.links:
        lines.append(f"npl {npl}: link fitted: {batch_us:.0f} us a batch, {piece_ns / 1e3:.1f} us a piece, "
                     f"{gbps:.2f} GB/s")
    return lines
