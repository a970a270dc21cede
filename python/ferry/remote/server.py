"""The remote tier's peer: a process holding memory regions registered with a TransferEngine.

`python -m ferry.remote.server --sizes N,N,... --reply-fd FD` allocates one zeroed region of each
size, registers each with its engine (TCP on --host, default the loopback), writes one JSON line
to FD: {"peer": "host:port", "addresses": [...]} (or {"error": "..."}), and holds the regions until
its standard input closes: the process that started it owns its life. It knows nothing of KV
layouts; the client (RemoteTier) writes the cache's bytes into the regions and reads windows back.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

from ..errors import FerryError
from .engine import transfer_engine_class


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
