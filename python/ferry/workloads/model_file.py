"""The KV-cache geometry of a model, read from its GGUF file's metadata.

A GGUF file names its architecture in `general.architecture`, and keeps that architecture's
hyperparameters under `{arch}.`: `block_count` (layers), `attention.head_count` (query
heads), `attention.head_count_kv` (KV heads; the query heads when absent),
`attention.key_length` and `attention.value_length` (head dims of K and V; when absent,
`embedding_length / head_count`, as llama.cpp computes them), `context_length`.

Some architectures give head counts per layer (an array). ferry's cache gives every layer
the same width, so it takes the widest layer's count, and counts as layers only those with
KV heads: a layer with none (a recurrent or attention-free block) holds no cache. The
per-layer counts stay in ModelGeometry.n_head_kv_per_layer.

The file is read with `gguf`, the format's own Python package, imported only when a file is
read: `import ferry` does not need it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from ..errors import InvalidArgumentError, UnsupportedError


@dataclass(frozen=True)
class ModelGeometry:
    """What a KV cache needs to know of a model.

    Attributes
    ----------
    path : str
        The file read.
    architecture : str
        `general.architecture` ("llama", "qwen2", ...).
    n_layer : int
        Layers that hold K and V.
    n_head : int
        Query heads (the widest layer's).
    n_head_kv : int
        KV heads (the widest layer's).
    head_dim_k, head_dim_v : int
        Values per head of K and of V.
    n_ctx : int
        The context length the model was trained for.
    n_head_kv_per_layer : tuple of int
        KV heads of each block, as the file gives them (one value repeated when it gives one).
    """

    path: str
    architecture: str
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ctx: int
    n_head_kv_per_layer: Tuple[int, ...]

    def as_dict(self) -> Dict[str, object]:
        """The geometry as a JSON object."""
        return {"path": self.path, "architecture": self.architecture, "n_layer": self.n_layer,
                "n_head": self.n_head, "n_head_kv": self.n_head_kv, "head_dim_k": self.head_dim_k,
                "head_dim_v": self.head_dim_v, "n_ctx": self.n_ctx,
                "n_head_kv_per_layer": list(self.n_head_kv_per_layer)}


def _import_gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise UnsupportedError("reading a model file needs the gguf package: pip install 'ferry[model]' "
                               "(or gguf)") from None
    return gguf


def _per_layer(value: Any, n_block: int, key: str, path: str) -> Tuple[int, ...]:
    """An int or a list of ints (one per block) as a tuple of n_block ints."""
    if isinstance(value, (list, tuple)):
        values = tuple(int(v) for v in value)
        if len(values) != n_block:
            raise InvalidArgumentError(f"{path}: {key} gives {len(values)} values for {n_block} blocks")
        return values
    return (int(value),) * n_block


def read_model_geometry(path: "str | os.PathLike[str]") -> ModelGeometry:
    """Read a model's KV geometry from its GGUF file (the metadata alone: no tensor is read).

    Parameters
    ----------
    path : str or os.PathLike
        A GGUF file.

    Returns
    -------
    ModelGeometry

    Raises
    ------
    InvalidArgumentError
        For a file that cannot be read, is not GGUF, or lacks a key the geometry needs (the
        message names it), or whose values are not positive.
    UnsupportedError
        Without the gguf package.
    """
    name = os.fspath(path)
    gguf = _import_gguf()
    try:
        reader = gguf.GGUFReader(name, "r")
    except (OSError, ValueError) as e:
        raise InvalidArgumentError(f"{name}: not a readable GGUF file ({e})") from None

    def get(key: str) -> Optional[Any]:
        field = reader.get_field(key)
        return None if field is None else field.contents()

    def need(key: str) -> Any:
        value = get(key)
        if value is None:
            raise InvalidArgumentError(f"{name}: the GGUF metadata has no {key}")
        return value

    arch = need("general.architecture")
    if not isinstance(arch, str):
        raise InvalidArgumentError(f"{name}: general.architecture is not a string")
    n_block = int(need(f"{arch}.block_count"))
    if n_block <= 0:
        raise InvalidArgumentError(f"{name}: {arch}.block_count is {n_block}")
    heads = _per_layer(need(f"{arch}.attention.head_count"), n_block, f"{arch}.attention.head_count", name)
    kv_value = get(f"{arch}.attention.head_count_kv")
    heads_kv = heads if kv_value is None else _per_layer(kv_value, n_block, f"{arch}.attention.head_count_kv", name)
    n_head, n_head_kv = max(heads), max(heads_kv)
    if n_head <= 0 or n_head_kv <= 0:
        raise InvalidArgumentError(f"{name}: no layer has attention heads")

    def head_dim(key: str) -> int:
        value = get(f"{arch}.attention.{key}")
        if value is not None:
            return int(value)
        embd = int(need(f"{arch}.embedding_length"))
        if embd % n_head:
            raise InvalidArgumentError(f"{name}: no {arch}.attention.{key}, and {arch}.embedding_length {embd} "
                                       f"is not a multiple of {n_head} heads")
        return embd // n_head

    geometry = ModelGeometry(path=name, architecture=arch, n_layer=sum(1 for h in heads_kv if h > 0),
                             n_head=n_head, n_head_kv=n_head_kv, head_dim_k=head_dim("key_length"),
                             head_dim_v=head_dim("value_length"), n_ctx=int(need(f"{arch}.context_length")),
                             n_head_kv_per_layer=heads_kv)
    for field in ("head_dim_k", "head_dim_v", "n_ctx"):
        if getattr(geometry, field) <= 0:
            raise InvalidArgumentError(f"{name}: {field} is {getattr(geometry, field)}")
    return geometry
