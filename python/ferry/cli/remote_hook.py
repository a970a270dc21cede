"""--remote of `ferry bench` and `ferry validate`: the engine checked before the run, and the remote
tier's rows (ferry.workloads.remote) run and written after the verb's own."""

from __future__ import annotations

import argparse
from typing import Any, Dict, Optional, Sequence

from ..errors import InvalidArgumentError
from ..workloads.common import KVGeometry
from ..workloads.paged_tables import PagedOptions
from ..workloads.remote import RemoteResult, format_remote, run_remote


def check(args: argparse.Namespace) -> Optional[str]:
    """--remote as given: None when not, "" alone (a server on the loopback), else the peer's HOST:PORT.
    Refused (InvalidArgumentError naming --remote) for a peer that is not HOST:PORT, and where the
    transfer engine cannot be imported (naming what to install)."""
    remote = getattr(args, "remote", None)
    if remote is None:
        return None
    host, _, port = remote.rpartition(":")
    if remote and (not host or not port.isdigit() or not 0 < int(port) < 65536):
        raise InvalidArgumentError(f"--remote takes HOST:PORT, the segment name `ferry remote-serve` prints, or "
                                   f"nothing (a server on the loopback); got {remote!r}")
    from ..remote import engine_missing

    why = engine_missing()
    if why is not None:
        raise InvalidArgumentError(f"--remote: {why}")
    return remote


def run(n_ctx: int, npls: Sequence[int], npp: int, ntg: int, pad: int, lengths: Any, kv: KVGeometry,
        policies: Sequence[str], seed: int, peer: str = "", paged: Optional[PagedOptions] = None) -> RemoteResult:
    """The remote rows of a run: its window options, geometry, policies and seed, the peer (HOST:PORT;
    "" for a server on the loopback), and its paged cache's options (--paged: the tier holds a paged
    cache; otherwise the cells cache) (run_remote)."""
    return run_remote(kv, n_ctx, npls, npp, ntg, pad, lengths, policies, seed, peer or None,
                      paged if paged is not None and paged.paged else None)


def as_json(res: RemoteResult) -> Dict[str, Any]:
    """The object --json adds to the verb's list."""
    return {"remote": res.as_dict()}


def text(res: RemoteResult) -> str:
    """The rows as the text output's last block."""
    return "\n".join(format_remote(res))
