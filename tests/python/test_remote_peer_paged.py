"""A paged peer started alone (`ferry remote-serve --paged`, a separate process on the loopback, one
for the module): RemoteTier(PagedKVCache, peer=...) gathers windows byte-identical to the same
cache held locally, in the pieces of the gather's runs (or blocks); a tier whose paged cache has
another block size, or a cell-per-stream cache, is refused naming the field; `ferry paged-bench
--remote HOST:PORT` prints its paged rows and `ferry validate --paged --remote HOST:PORT` finds
the local bytes. Without the engine: the paged rows' check of a pulled window sees a wrong byte
in a cell it reads, and only there (remote-serve's --block-size without --paged: test_cli_options).
"""

from __future__ import annotations

import json
import signal
import subprocess
from typing import Iterator, List, Tuple

import numpy as np
import pytest

import ferry
from conftest import SENTINEL
from ferry.paged import PagedKVCache
from ferry.plan import plan_paged
from ferry.workloads.common import KVGeometry
from ferry.workloads.paged_tables import adjacent_tables
from ferry.workloads.remote import _gathers_same_cells, random_paged_cache
from test_remote import delivered, needs_engine, serve  # the peer as test_remote.py starts it

#: The peer's layout: SERVE's geometry (test_remote), a pool of 128 cells in blocks of 4, 2 sequences.
GEOMETRY = KVGeometry(n_layer=2, head_dim=32, n_head_kv=1)
BLOCK, POOL_CELLS, N_SEQ = 4, 128, 2
#: Each sequence's cells: their tables are the client's, drawn here.
SEQ_CELLS = (20, 9)
TINY = ["-c", "128", "-npl", "2", "-npp", "16", "-ntg", "2", "--head-dim", "32", "--kv-heads", "1", "--heads", "2",
        "--layers", "2"]


def served_paged(seed: int = 0, block: int = BLOCK) -> PagedKVCache:
    """The cache `ferry remote-serve --paged --block-size block` of SERVE holds at seed, made here from the
    seed alone, with this test's tables."""
    c = random_paged_cache(GEOMETRY, POOL_CELLS, N_SEQ, block, seed)
    tables = adjacent_tables([-(-n // block) for n in SEQ_CELLS], c.params.n_blocks, 0.5, 7)
    for s, (table, n) in enumerate(zip(tables, SEQ_CELLS)):
        c.set_table(s, table, n)
    return c


@pytest.fixture(scope="module")
def paged_peer() -> Iterator[Tuple["subprocess.Popen[str]", str]]:
    """The module's paged peer; SIGTERM ends it cleanly (status 0) after the last test."""
    proc, name = serve("--paged", "--block-size", str(BLOCK))
    try:
        yield proc, name
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@needs_engine
def test_a_paged_peer_started_alone_gathers_the_local_bytes_in_the_runs_pieces(
        paged_peer: Tuple["subprocess.Popen[str]", str]) -> None:
    """The tier reads the paged peer's published layout and gathers each layer's windows: byte for byte
    the local gather's (nothing written past the cells read), a piece per run (per block under
    per_block), K and V, and the bytes the cells read; merged, no more pieces than runs."""
    from ferry.remote import RemoteTier

    _, name = paged_peer
    ref, mirror = served_paged(), served_paged(1)
    with RemoteTier(mirror, peer=name) as tier:
        published = tier.peer_layout
        assert published is not None and published["cache"] == "PagedKVCache"
        assert (published["params"]["block_size"], published["params"]["n_blocks"]) == (BLOCK, POOL_CELLS // BLOCK)
        assert [r[2] for r in published["regions"]] == [ref.k(0).nbytes] * 4  # each pool's bytes
        for layer in range(GEOMETRY.n_layer):
            rk, rv = ref.window(layer, 24)
            plan = plan_paged(rk, ferry.CPUBackend())
            for method, merge in (("per_block", False), ("runs", False), ("runs", True)):
                mirror.gather = method
                k, v, _ = tier.pull(layer, 24, merge=merge)
                for t in (k, v):  # the tier keeps its dense windows: the next pull writes only the cells read
                    t.set(bytes([SENTINEL]) * t.nbytes)
                k, v, st = tier.pull(layer, 24, merge=merge)
                assert bytes(k.get()) == delivered(rk, "flat"), (layer, method)
                assert bytes(v.get()) == delivered(rv, "flat"), (layer, method)
                assert st.plan_pieces == 2 * (plan.blocks if method == "per_block" else plan.runs), method
                assert (st.pieces <= 2 * plan.runs) if merge else (st.pieces == st.plan_pieces)
                assert st.bytes == st.bytes_read == 2 * plan.bytes == 2 * sum(SEQ_CELLS) * 32 * 2


@needs_engine
def test_a_paged_peer_is_refused_to_a_cache_of_another_block_size_or_layout(
        paged_peer: Tuple["subprocess.Popen[str]", str]) -> None:
    """Another block size (the pool's cells the same): refused naming block_size and the blocks; a
    cell-per-stream cache: refused naming the cache's class, and how each end is made paged."""
    from ferry.remote import PeerLayoutError, RemoteTier

    _, name = paged_peer
    with pytest.raises(PeerLayoutError, match=rf"peer {name} holds another layout .*block_size: 4 at the peer, 8 here; "
                                              r"n_blocks: 32 at the peer, 16 here"):
        RemoteTier(served_paged(1, block=8), peer=name)
    cells = ferry.KVCache("f16", "f16", 32, 1, 128, 2, 2)
    with pytest.raises(PeerLayoutError, match=rf"peer {name} .*the cache: 'PagedKVCache' at the peer, KVCache here "
                                              r"\(a paged cache at one end only: `ferry remote-serve --paged` serves "
                                              r"one, a run reads one with --paged\)"):
        RemoteTier(cells, peer=name)


@needs_engine
def test_paged_bench_and_validate_remote_read_a_paged_peer(paged_peer: Tuple["subprocess.Popen[str]", str],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`ferry paged-bench --remote HOST:PORT` prints a row per paged pull, each identical to the local
    cache's gathers, the runs in fewer pieces than the blocks and no more bytes; `ferry validate --paged
    --remote HOST:PORT` passes with them; another --block-size than the peer's is refused naming it."""
    from ferry.cli import main

    _, name = paged_peer
    assert main(["paged-bench", *TINY, "--block-size", "4", "--rounds", "1", "--repeat", "1", "--remote", name,
                 "--json"]) == 0
    remote = json.loads(capsys.readouterr().out)[-1]["remote"]
    rows = {r["policy"]: r for r in remote["rows"]}
    assert remote["peer"] == name and list(rows) == ["paged/per_block", "paged/runs", "paged/merged"]
    assert all(r["identical"] and r["npl"] == 2 for r in rows.values())
    assert rows["paged/runs"]["pieces_per_step"] < rows["paged/per_block"]["pieces_per_step"]
    assert rows["paged/runs"]["bytes_per_step"] == rows["paged/per_block"]["bytes_per_step"]
    assert main(["validate", *TINY, "--paged", "--block-size", "4", "--no-overlap", "--policy", "flat,ragged",
                 "--remote", name]) == 0
    out = capsys.readouterr().out
    assert f"remote tier ({name}" in out and "paged/merged" in out and "DIFFERENT" not in out
    with pytest.raises(SystemExit, match=rf"peer {name} holds another layout .*block_size: 4 at the peer, 8 here"):
        main(["validate", *TINY, "--paged", "--block-size", "8", "--no-overlap", "--remote", name])


def test_a_paged_rows_check_sees_a_wrong_byte_in_a_cell_read_and_only_there() -> None:
    """The paged rows compare a pulled dense window with the local gather in the cells it reads: a
    byte changed in one of them is a difference; one changed in a cell past a sequence's length is not
    (it holds what earlier pulls left)."""
    cpu = ferry.CPUBackend()
    ref = served_paged()
    lens = ferry.Tensor.from_numpy(cpu, np.array([5, 9], np.int32))
    rk, _ = ref.window(0, 12, lengths=lens)
    pulled = rk.dup_layout()
    cpu.alloc_buffer_for(pulled)
    gathered = bytearray(delivered(rk, "flat"))
    pulled.set(bytes(gathered))
    assert _gathers_same_cells(cpu, pulled, rk)
    row = 32 * 2  # a cell's K: head_dim values of f16, one head
    marks: List[Tuple[int, bool]] = [(row * 4 + 3, False), (row * 6, True)]  # cell 4 of stream 0 is read; 6 is not
    for at, ignored in marks:
        changed = bytearray(gathered)
        changed[at] ^= 0xFF
        pulled.set(bytes(changed))
        assert _gathers_same_cells(cpu, pulled, rk) is ignored, at
