"""--remote of `ferry bench` and `ferry validate`: the engine checked before the run, and the remote
tier's rows (ferry.workloads.remote) run and written after the verb's own."""

from __future__ import annotations

import argparse
from typing import Any, Dict, Sequence

from ..errors import InvalidArgumentError
from ..workloads.common import KVGeometry
from ..workloads.remote import RemoteResult, format_remote, run_remote


def check(args: argparse.Namespace) -> bool:
    """Whether --remote was given; refused (InvalidArgumentError naming --remote and what to install)
    where the transfer engine cannot be imported."""
    if not getattr(args, "remote", False):
        return False
    from ..remote import engine_missing

    why = engine_missing()
    if why is not None:
        raise InvalidArgumentError(f"--remote: {why}")
    return True


def run(n_ctx: int, npls: Sequence[int], npp: int, ntg: int, pad: int, lengths: Any, kv: KVGeometry,
        policies: Sequence[str], seed: int) -> RemoteResult:
    """The remote rows of a run: its window options, geometry, policies and seed (run_remote)."""
    return run_remote(kv, n_ctx, npls, npp, ntg, pad, lengths, policies, seed)


def as_json(res: RemoteResult) -> Dict[str, Any]:
    """The object --json adds to the verb's list."""
    return {"remote": res.as_dict()}


def text(res: RemoteResult) -> str:
    """The rows as the text output's last block."""
    return "\n".join(format_remote(res))
