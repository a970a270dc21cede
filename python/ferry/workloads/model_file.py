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

Sliding-window layers. `{arch}.attention.sliding_window` (gguf's Keys.Attention.SLIDING_WINDOW)
gives the window W in cells; absent or 0, no layer slides (llama4 excepted, below). Which layers
slide comes from `{arch}.attention.sliding_window_pattern` (Keys.Attention.SLIDING_WINDOW_PATTERN)
when the file has it: an array of one bool per block (true: sliding), or a period P, under which
block i slides when i % P < P - 1 (P - 1 sliding blocks then one full; P = 0: every block slides),
as llama.cpp reads it. Without that key the architecture's own rule, as llama.cpp hard-codes it:

- gemma2, gpt-oss: period 2, the even blocks slide (0, 2, 4, ...), the odd ones are full;
- gemma3: period 6, blocks 0-4 slide, block 5 is full, and so on;
- gemma3n: period 5; cohere2: period 4 (three sliding blocks, then one full);
- llama4: chunked attention in period 4 (three chunked blocks, then one full). A chunked block
  reads from the start of its chunk, at most W cells, so it counts as a sliding block of W. W is
  8192 when the file has no sliding_window (llama.cpp's value); 0 turns chunking off;
- any other architecture with a window: every block slides.

A sliding block holds its window plus the cells a batch adds (llama.cpp sizes its SWA cache
W + n_ubatch); ferry's dry runs count a decode step, which adds one cell per sequence.
ModelGeometry.sliding_window_per_layer gives each block's window, None for a full block.

The file is read with `gguf`, the format's own Python package, imported only when a file is
read: `import ferry` does not need it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

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
    sliding_window_per_layer : tuple of (int or None)
        Each block's sliding window in cells, None for a full-attention block; empty when no
        block slides.
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
    sliding_window_per_layer: Tuple[Optional[int], ...] = ()

    def layer_windows(self) -> List[Optional[int]]:
        """The sliding window of each layer that holds K and V (blocks without KV heads left out),
        None for a full-attention layer."""
        windows = self.sliding_window_per_layer or (None,) * len(self.n_head_kv_per_layer)
        return [w for w, h in zip(windows, self.n_head_kv_per_layer) if h > 0]

    def as_dict(self) -> Dict[str, object]:
        """The geometry as a JSON object."""
        return {"path": self.path, "architecture": self.architecture, "n_layer": self.n_layer,
                "n_head": self.n_head, "n_head_kv": self.n_head_kv, "head_dim_k": self.head_dim_k,
                "head_dim_v": self.head_dim_v, "n_ctx": self.n_ctx,
                "n_head_kv_per_layer": list(self.n_head_kv_per_layer),
                "sliding_window_per_layer": list(self.sliding_window_per_layer)}


#: Sliding-window period per architecture when the file gives no sliding_window_pattern: block i
#: slides when i % period < period - 1 (llama.cpp's rule).
SWA_PERIOD: Dict[str, int] = {"gemma2": 2, "gpt-oss": 2, "gemma3": 6, "gemma3n": 5, "cohere2": 4, "llama4": 4}
#: llama4's chunk when the file names none.
LLAMA4_CHUNK = 8192


def sliding_blocks(pattern: Any, n_block: int, key: str, path: str) -> List[bool]:
    """Which blocks slide under a sliding_window_pattern value.

    Parameters
    ----------
    pattern : int or sequence of bool
        A period P (block i slides when i % P < P - 1; P = 0: every block) or one flag per block.
    n_block : int
    key, path : str
        For messages.

    Returns
    -------
    list of bool

    Raises
    ------
    InvalidArgumentError
        For an array whose length is not n_block, or a negative period.
    """
    if isinstance(pattern, (list, tuple)):
        if len(pattern) != n_block:
            raise InvalidArgumentError(f"{path}: {key} gives {len(pattern)} values for {n_block} blocks")
        return [bool(v) for v in pattern]
    period = int(pattern)
    if period < 0:
        raise InvalidArgumentError(f"{path}: {key} is {period}")
    return [period == 0 or i % period < period - 1 for i in range(n_block)]


def _sliding_windows(arch: str, window: Optional[Any], pattern: Optional[Any], n_block: int,
                     path: str) -> Tuple[Optional[int], ...]:
    """Each block's window (None: full), or () when no block slides; the module docstring gives the rule."""
    if window is None and arch == "llama4":
        window = LLAMA4_CHUNK
    w = 0 if window is None else int(window)
    if w < 0:
        raise InvalidArgumentError(f"{path}: {arch}.attention.sliding_window is {w}")
    if w == 0:
        return ()
    if pattern is not None:
        slides = sliding_blocks(pattern, n_block, f"{arch}.attention.sliding_window_pattern", path)
    else:
        slides = sliding_blocks(SWA_PERIOD.get(arch, 0), n_block, "", path)
    windows: Tuple[Optional[int], ...] = tuple(w if s else None for s in slides)
    return windows if any(s is not None for s in windows) else ()


def layer_sizes(windows: Sequence[Optional[int]], n_kv: int, kv_size: int, n_new: int = 1) -> List[int]:
    """Cells per stream each layer reads in a step: a full layer n_kv, a sliding layer of window W
    min(W + n_new, n_kv).

    Parameters
    ----------
    windows : sequence of (int or None)
        Each layer's window, None for full attention.
    n_kv : int
        Cells a full layer's window reads per stream.
    kv_size : int
        Cells in a stream: a sliding layer never holds more.
    n_new : int, optional
        Cells the step adds per stream (decode: 1 per sequence).

    Returns
    -------
    list of int
    """
    return [n_kv if w is None else min(w + n_new, n_kv, kv_size) for w in windows]


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
    try:  # a file that is not there is that, with or without the gguf package
        with open(name, "rb"):
            pass
    except OSError as e:
        raise InvalidArgumentError(f"{name}: not a readable GGUF file ({e.strerror})") from None
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
                             n_head_kv_per_layer=heads_kv,
                             sliding_window_per_layer=_sliding_windows(
                                 arch, get(f"{arch}.attention.sliding_window"),
                                 get(f"{arch}.attention.sliding_window_pattern"), n_block, name))
    for field in ("head_dim_k", "head_dim_v", "n_ctx"):
        if getattr(geometry, field) <= 0:
            raise InvalidArgumentError(f"{name}: {field} is {getattr(geometry, field)}")
    return geometry
