"""`ferry remote-serve`: a KV cache's layers served to remote tiers, on this host or any other.

A cache of the KV geometry (-c cells over one -npl of streams, --type, --head-dim, --kv-heads,
--layers, --v-trans), or with --paged a paged cache (pools of -c cells in --block-size blocks, a
table for each of -npl sequences, drawn by the client), filled from --seed as `ferry bench
--remote`, `ferry paged-bench --remote` and `ferry validate --remote` fill their local cache,
registered with Mooncake's transfer engine (`pip install ferry[remote]`) on --host over --protocol
(tcp; rdma where the machine has it). It prints the segment name a client gives (`--remote
HOST:PORT`, RemoteTier(cache, peer=...)) and the layout, and serves until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any, Dict, Optional

from ..errors import InvalidArgumentError
from ..workloads.common import KVGeometry
from .reference import Verb, add_verb_parser

#: Bad options are refused before the engine starts; a refused engine is the run's error.
ARGUMENT_ERRORS = InvalidArgumentError

VERB = Verb("remote-serve", "hold a KV cache's layers for remote tiers on other hosts, until killed",
            " ".join((__doc__ or "").split("\n\n", 1)[-1].split()),
            "ferry remote-serve -c 4096 -npl 4 --layers 2 --host 10.0.0.5")


@dataclass(frozen=True)
class ServeJob:
    """What `ferry remote-serve` serves.

    Attributes
    ----------
    kv : KVGeometry
    n_ctx, n_stream : int
        Cells in all streams together (paged: in a pool), and streams (paged: sequences).
    seed : int
        The contents' seed (ferry.workloads.remote.random_cache, random_paged_cache).
    host, protocol : str
        Where the engine listens, and over what.
    json : bool
        Announce as one JSON line.
    block_size : int or None
        Cells per block of a paged cache (--paged --block-size); None for the cell-per-stream cache.
    """

    kv: KVGeometry
    n_ctx: int
    n_stream: int
    seed: int
    host: str
    protocol: str
    json: bool
    block_size: Optional[int] = None  # --paged: cells per block; None: the cell-per-stream cache


def add_parser(sub: "argparse._SubParsersAction[Any]") -> argparse.ArgumentParser:
    """Add the `remote-serve` verb to the `ferry` command's subparsers sub; returns the verb's parser."""
    return add_verb_parser(sub, VERB)


def job(args: argparse.Namespace) -> ServeJob:
    """The ServeJob the parsed options args describe.

    Raises
    ------
    InvalidArgumentError
        For more than one -npl, -c that the streams do not divide (a paged cache's sequences share its
        pools: any -c), or an empty --host.
    """
    if not args.host:
        raise InvalidArgumentError("--host: give the address clients reach this host at")
    if len(args.npl) != 1:
        raise InvalidArgumentError(f"-npl: remote-serve holds one cache: give one number of streams, got "
                                   f"{','.join(map(str, args.npl))}")
    npl = args.npl[0]
    if args.c % npl and not args.paged:
        raise InvalidArgumentError(f"-c {args.c} is not a whole number of cells per stream over -npl {npl}")
    return ServeJob(kv=KVGeometry(n_layer=args.layers, type_kv=args.type, head_dim=args.head_dim,
                                  n_head_kv=args.kv_heads, v_trans=args.v_trans),
                    n_ctx=args.c, n_stream=npl, seed=args.seed, host=args.host, protocol=args.protocol, json=args.json,
                    block_size=args.block_size if args.paged else None)


def announcement(peer: str, layout: Dict[str, Any], j: ServeJob) -> str:
    """What the server prints once clients may connect: the segment name, then the layout."""
    if j.json:
        return json.dumps({"peer": peer, "protocol": j.protocol, **layout})
    params = ", ".join(f"{k} {v}" for k, v in layout["params"].items())
    return (f"peer {peer} ({j.protocol}): give it to a client, --remote {peer}\n"
            f"layout: {layout['cache']}: {params}; {len(layout['regions'])} regions, contents seed {j.seed}\n"
            "serving until SIGTERM or Ctrl-C")


def run(j: ServeJob) -> int:
    """Build the seeded cache and serve it (ferry.remote.server.serve_cache) until killed. Returns 0.

    Raises
    ------
    FerryError
        EngineUnavailableError naming what to install, RegistrationError when the engine refuses a region.
    """
    from ..remote.server import serve_cache
    from ..workloads.remote import random_cache, random_paged_cache

    cache = (random_cache(j.kv, j.n_ctx, j.n_stream, j.seed) if j.block_size is None
             else random_paged_cache(j.kv, j.n_ctx, j.n_stream, j.block_size, j.seed))
    return serve_cache(cache, j.host, j.protocol, {"seed": j.seed},
                       lambda peer, layout: print(announcement(peer, layout, j), flush=True))


def main(args: argparse.Namespace) -> int:
    """`ferry remote-serve` with the parsed options args: run(job(args))."""
    return run(job(args))
