"""The transfer engine, imported only when a remote tier is made: ferry works without it.

Mooncake's TransferEngine (`pip install ferry[remote]` installs mooncake-transfer-engine-non-cuda)
links against libibverbs even when it runs over TCP; where the system lacks it the import fails,
and ferry says which library and how to install it.
"""

from __future__ import annotations

import importlib
import re
from typing import Any, Optional

from .errors import EngineUnavailableError

#: The package the `remote` extra installs.
ENGINE_PACKAGE = "mooncake-transfer-engine-non-cuda"
#: System libraries the engine's import needs, by the name the loader reports: the Debian package.
SYSTEM_PACKAGES = {"libibverbs": "libibverbs1", "librdmacm": "librdmacm1", "libnuma": "libnuma1"}


def _why_missing(err: ImportError) -> str:
    """What to install for an ImportError of the engine."""
    text = str(err)
    lib = re.search(r"(lib[A-Za-z0-9_+-]+)\.so[.0-9]*", text)
    if lib is not None:
        name = lib.group(1)
        pkg = SYSTEM_PACKAGES.get(name, name)
        return (f"the transfer engine needs the system library {lib.group(0)} ({text}); install it: "
                f"apt-get install -y {pkg}")
    return (f"the transfer engine is not installed ({text}); install it: pip install 'ferry[remote]' "
            f"(or {ENGINE_PACKAGE})")


def engine_missing() -> Optional[str]:
    """Why the engine cannot be imported, with what to install; None when it can.

    Returns
    -------
    str or None
    """
    try:
        importlib.import_module("mooncake.engine")
    except ImportError as e:
        return _why_missing(e)
    return None


def transfer_engine_class() -> Any:
    """Mooncake's TransferEngine class.

    Returns
    -------
    type

    Raises
    ------
    EngineUnavailableError
        When the engine or a system library it needs is missing, naming which and the command that
        installs it.
    """
    try:
        module = importlib.import_module("mooncake.engine")
    except ImportError as e:
        raise EngineUnavailableError(f"remote tier: {_why_missing(e)}") from None
    return module.TransferEngine


_engine: Any = None
_engine_protocol = ""


def local_engine(host: str = "127.0.0.1", protocol: str = "tcp") -> Any:
    """This process's one TransferEngine, started on first use (peers found by handshake, no metadata
    server): every remote tier of the process registers its memory with it.

    Parameters
    ----------
    host : str, optional
        The address this engine is reached at.
    protocol : str, optional
        "tcp", or "rdma" where the machine has it: the peers' (`ferry remote-serve --protocol`).

    Returns
    -------
    TransferEngine

    Raises
    ------
    EngineUnavailableError
        When the engine cannot be imported or started, or was started over another protocol.
    """
    global _engine, _engine_protocol
    if _engine is None:
        engine = transfer_engine_class()()
        rc = engine.initialize(host, "P2PHANDSHAKE", protocol, "")
        if rc != 0:
            raise EngineUnavailableError(f"remote tier: the transfer engine did not start on {host} over {protocol} "
                                         f"(status {rc})")
        _engine, _engine_protocol = engine, protocol
    elif protocol != _engine_protocol:  # one engine a process: its transport is chosen when it starts
        raise EngineUnavailableError(f"remote tier: this process's transfer engine runs over {_engine_protocol}; "
                                     f"a tier over {protocol} needs a process of its own")
    return _engine
