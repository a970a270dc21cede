"""A KV cache laid out as llama.cpp lays it out, and the windows attention reads from it.

Per layer K is [n_embd_gqa, kv_size, n_stream] (ggml order) and V the same, or
[kv_size, n_embd_gqa, n_stream] when v_trans (flash attention off). A unified cache is
one stream of n_ctx cells; otherwise each of n_stream streams holds n_ctx / n_stream.
The cache's tensors and windows keep the cache (and its memory) alive; it is freed as soon
as nothing points into it, or at once by close().
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

from . import _checks, _pybuffer
from ._binding import ffi, lib
from ._handle import holding
from .backend import Backend
from .buffer import BorrowedBuffer, BufferType, buffer_type_of
from .errors import InvalidArgumentError, LayoutError, OutOfBoundsError, check
from .kv_layers import ATTENTION_TYPES as ATTENTION_TYPES  # its home was here: ferry.kv.ATTENTION_TYPES stays
from .kv_layers import CacheLayout, LayerCache, LayerParams
from .kv_layers import LayerWindows as LayerWindows  # likewise ferry.kv.LayerWindows
from .tensor import Tensor
from .types import TypeLike, row_size


@dataclass(frozen=True)
class KVParams(LayerParams):
    """The layout of a KV cache (ferry_kv_params), as C keeps it: KVCache.params.

    Attributes
    ----------
    type_k, type_v, head_dim, n_head_kv : Type, Type, int, int
        A cell's K and V types, values per head and KV heads (ferry.kv_layers.LayerParams).
    n_ctx : int
        Cells in all streams together.
    n_stream : int
        Streams; each holds n_ctx / n_stream cells (KVCache.kv_size).
    n_layer : int
        Layers, each with its K and V.
    v_trans : bool
        Whether V is stored transposed, [kv_size, n_embd_gqa, n_stream].
    """

    n_ctx: int
    n_stream: int
    n_layer: int
    v_trans: bool


class KVCache(LayerCache):
    """One buffer holding every layer's K and V, laid out as llama.cpp lays them out.

    The memory is the backend's default buffer type, or buffer_type, or with pinned=True
    CUDA's pinned host memory; the CPU's host memory when none is given.

    close() (or the end of a `with` block) frees the memory now, pinned memory included;
    the cache, its buffer and its layer tensors raise FreedBufferError after. Window views
    taken before hold the memory until they go, and keep working.

    Parameters
    ----------
    type_k, type_v : Type, str or int
        The K and V types.
    head_dim : int
        Values per head.
    n_head_kv : int
        KV heads; a cell holds head_dim * n_head_kv values (n_embd_gqa) of K and of V.
    n_ctx : int
        Cells in all streams together.
    n_stream : int
        Streams (1: a unified cache); each holds n_ctx / n_stream cells.
    n_layer : int, optional
        Layers.
    v_trans : bool, optional
        V stored transposed, [kv_size, n_embd_gqa, n_stream] (flash attention off).
    backend : Backend, optional
        Whose default buffer type holds the cache.
    buffer_type : BufferType, optional
        The buffer type that holds the cache.
    pinned : bool, optional
        CUDA's pinned host memory holds the cache.
    placement : sequence of Backend or None, optional
        Per layer, where its K and V live: None, the cache's memory above (the host's, as a rule);
        a Backend, that backend's default buffer type (a device's memory). One buffer is allocated
        per distinct buffer type. A device-resident layer's windows are views of that device's
        memory, so a scheduler running attention there copies nothing for them. Fixed for the
        cache's life; ``placement`` tells it back.
    layer_cells : sequence of int or None, optional
        Per layer, its cells per stream (None or 0: n_ctx / n_stream): a sliding-window layer holds
        its window (plus what a batch adds) and no more. windows(n_kv) gives such a layer
        min(n_kv, its cells): its ring's whole content.

    Raises
    ------
    InvalidArgumentError
        For more than one of backend, buffer_type and pinned, values that cannot reach C, a
        placement or layer_cells list of another length than n_layer, a placement entry that is
        neither None nor an open Backend with memory in its buffers (a DummyBackend without
        real_memory has none), or a layer's cells beyond n_ctx / n_stream.
    LayoutError
        For a layout C refuses (n_ctx not split evenly, rows not whole blocks, ...).
    OutOfMemoryError
        When the buffer cannot be allocated.

    Examples
    --------
    Two streams of 8 cells, one KV head of 4 f16 values (8 bytes a cell), and layer 0's K window
    of 3 cells a stream: [head_dim, n_kv, n_head_kv, stream], stream 1 eight cells (64 bytes)
    after stream 0. Its span, what a flat copy moves, is stream 0's 8 cells and stream 1's 3:

    >>> import ferry
    >>> kv = ferry.KVCache("f16", "f16", head_dim=4, n_head_kv=1, n_ctx=16, n_stream=2)
    >>> k, v = kv.window(0, 3)
    >>> k.ne, k.nb, k.nbytes
    ((4, 3, 1, 2), (2, 8, 8, 64), 88)
    """

    _layout = CacheLayout(name="KVCache", c_type="ferry_kv_cache", params_type="ferry_kv_params", params_class=KVParams,
                          free=lib.ferry_kv_cache_free, params=lib.ferry_kv_cache_params, k=lib.ferry_kv_cache_k,
                          v=lib.ferry_kv_cache_v, layer_buffer=lib.ferry_kv_cache_layer_buffer)

    def __init__(self, type_k: TypeLike, type_v: TypeLike, head_dim: int, n_head_kv: int, n_ctx: int,
                 n_stream: int, n_layer: int = 1, v_trans: bool = False, backend: Optional[Backend] = None,
                 buffer_type: Optional[BufferType] = None, pinned: bool = False,
                 placement: Optional[Sequence[Optional[Backend]]] = None,
                 layer_cells: Optional[Sequence[Optional[int]]] = None) -> None:
        buft = self._memory(backend, buffer_type, pinned)
        p = self._c_params(type_k=type_k, type_v=type_v, head_dim=head_dim, n_head_kv=n_head_kv, n_ctx=n_ctx,
                           n_stream=n_stream, n_layer=n_layer, v_trans=v_trans)
        layer_bufts = self._placement_bufts(placement, int(p.n_layer))
        cells = _layer_cells(layer_cells, int(p.n_layer))
        out = ffi.new("ferry_kv_cache **")
        if layer_bufts is None and cells is None:
            check(lib.ferry_kv_cache_new(p, buft._ptr, out))
        else:
            c_cells = ffi.NULL if cells is None else ffi.new("int64_t[]", cells)
            check(lib.ferry_kv_cache_new_layers(p, buft._ptr, self._c_layer_bufts(layer_bufts), c_cells, out))
        self._own(out[0], buft, layer_bufts, int(p.n_layer))

    @classmethod
    def from_arrays(cls, k_layers: Sequence[Any], v_layers: Sequence[Any], n_stream: int = 1,
                    v_trans: bool = False, type_k: Optional[TypeLike] = None, type_v: Optional[TypeLike] = None,
                    n_head_kv: int = 1, n_ctx: Optional[int] = None) -> "KVCache":
        """A cache over arrays the caller owns, one K and one V per layer, without a copy.

        Each array is what ferry.from_array takes (numpy, PyTorch or CuPy; host or CUDA device),
        dense, shaped [n_stream, kv_size, n_embd_gqa], or V transposed [n_stream, n_embd_gqa,
        kv_size]; for q8_0 its bytes, uint8 [..., row bytes], with type_k / type_v saying so. Every
        layer's K is of one type and every layer's V of one type, one attention reads
        (ATTENTION_TYPES: f32, f16, q8_0). A layer's kv_size may be smaller than the others' (a
        sliding-window layer). Each layer lives where its arrays are: its placement is None on the
        host, or the device memory's backend (its BufferType where none stands for it).
        Writes through either side are seen by the other; the cache holds the arrays. A cache over
        arrays keeps their content (a new KVCache starts zeroed).

        Parameters
        ----------
        k_layers, v_layers : sequence of array
            Per layer, its K and V.
        n_stream : int, optional
            Streams (the arrays' first axis).
        v_trans : bool, optional
            V is transposed.
        type_k, type_v : Type, str or int, optional
            The types the arrays hold (default: their own dtype's).
        n_head_kv : int, optional
            KV heads: n_embd_gqa = head_dim * n_head_kv.
        n_ctx : int, optional
            Cells in all streams of a full layer (default: n_stream * the largest kv_size).

        Returns
        -------
        KVCache

        Raises
        ------
        InvalidArgumentError
            For lists of different lengths or empty, arrays of another shape or memory than their
            layer's K, of another type than the first layer's, of a type attention cannot read, of
            another stream count than n_stream, or arrays from_array refuses; each naming the array
            (k_layers[i], v_layers[i]).
        LayoutError
            For arrays that are not dense (naming the stride that is not) or not 3-D.
        """
        what = f"{cls._layout.name}.from_arrays"

        def parse() -> Tuple[int, bool, int]:  # n_stream, v_trans, n_head_kv
            ns = _checks.as_int64(n_stream, f"{what}: n_stream")
            if ns <= 0:
                raise InvalidArgumentError(f"{what}: n_stream must be positive, got {ns}")
            vt = _checks.as_bool(v_trans, f"{what}: v_trans")
            heads = _checks.as_int64(n_head_kv, f"{what}: n_head_kv")
            if heads <= 0:
                raise InvalidArgumentError(f"{what}: n_head_kv must be positive, got {heads}")
            return ns, vt, heads

        def array(a: Any, which: str, layer: int, args: Tuple[int, bool, int]) -> Tensor:
            ns, vt, _ = args
            return cls._stream_array(a, which, layer, type_k if which == "k" else type_v, ns, vt and which == "v")

        def over(ks: List[Tensor], vs: List[Tensor], args: Tuple[int, bool, int]) -> Callable[..., int]:
            ns, vt, heads = args
            n_embd = ks[0].ne[0]
            cells = [t.ne[1] for t in ks]
            for i, (k, v) in enumerate(zip(ks, vs)):
                if k.ne[0] != n_embd:
                    raise InvalidArgumentError(f"{what}: k_layers[{i}] has rows of {k.ne[0]} values (axis 2), "
                                               f"k_layers[0] of {n_embd}: every layer has one n_embd_gqa")
                want_v = [cells[i], n_embd, ns] if vt else [n_embd, cells[i], ns]
                if list(v.ne[:3]) != want_v:
                    shape = f"[{ns}, {n_embd}, {cells[i]}]" if vt else f"[{ns}, {cells[i]}, {n_embd}]"
                    raise InvalidArgumentError(f"{what}: v_layers[{i}] is [{v.ne[2]}, {v.ne[1]}, {v.ne[0]}] values, "
                                               f"not {shape} as k_layers[{i}]'s cells"
                                               f"{' transposed (v_trans)' if vt else ''}")
            full = max(cells)
            if n_embd % heads:
                raise InvalidArgumentError(f"{what}: n_embd_gqa {n_embd} is not n_head_kv {heads} heads of whole "
                                           "values")
            ctx = ns * full if n_ctx is None else _checks.as_int64(n_ctx, f"{what}: n_ctx")
            if n_ctx is not None and (ctx <= 0 or ctx % ns or ctx // ns < full):
                raise InvalidArgumentError(f"{what}: n_ctx {ctx} is not n_stream {ns} streams of at least {full} "
                                           "cells, the most a layer's arrays hold")
            p = cls._c_params(type_k=ks[0].type, type_v=vs[0].type, head_dim=n_embd // heads, n_head_kv=heads,
                              n_ctx=ctx, n_stream=ns, n_layer=len(ks), v_trans=vt)
            c_cells = ffi.new("int64_t[]", [0 if c == p.n_ctx // ns else c for c in cells])
            return lambda *bufs: lib.ferry_kv_cache_new_over(p, c_cells, *bufs)

        return cls._from_arrays(k_layers, v_layers, "give one K and one V per layer", parse, array, over)

    @classmethod
    def _stream_array(cls, a: Any, which: str, layer: int, type: Optional[TypeLike], ns: int, trans: bool) -> Tensor:
        """The tensor of a layer's K (which "k") or V array (LayerCache._layer_array), checked to be a dense
        [ns, rows, row values]; each FerryError names the array ("k_layers[1]")."""
        what = cls._array_what(which, layer)
        shape = getattr(a, "shape", None)
        if shape is not None and len(shape) != 3:
            raise LayoutError(f"{what} has {len(shape)} dimensions (shape {tuple(shape)}); a layer is 3-D: "
                              f"[n_stream, {'n_embd_gqa, cells' if trans else 'cells, n_embd_gqa'}]")
        t = cls._layer_array(a, which, layer, type, f"cache_{which}_l{layer}")
        ne, nb = t.ne, t.nb
        if ne[3] != 1:
            raise LayoutError(f"{what} has 4 dimensions; a layer is 3-D")
        if ne[2] != ns:
            raise InvalidArgumentError(f"{what} holds {ne[2]} streams (axis 0), not n_stream={ns}")
        row = row_size(t.type, ne[0])
        rows, units = ("channels", "a dense row of cells") if trans else ("cells", "a dense row")
        if ne[1] > 1 and nb[1] != row:
            raise LayoutError(f"{what}: its {rows} (axis 1) are {nb[1]} bytes apart, {units} is {row}: pass a "
                              "contiguous array (np.ascontiguousarray)")
        if ne[2] > 1 and nb[2] != row * ne[1]:
            raise LayoutError(f"{what}: its streams (axis 0) are {nb[2]} bytes apart, {ne[1]} dense rows are "
                              f"{row * ne[1]}: pass a contiguous array (np.ascontiguousarray)")
        return t

    @property
    def params(self) -> KVParams:
        """The cache's layout."""
        return self._params

    @property
    @holding
    def kv_size(self) -> int:
        """Cells per stream of a full-size layer."""
        return int(lib.ferry_kv_cache_kv_size(self._p))

    @holding
    def layer_kv_size(self, layer: int) -> int:
        """A layer's cells per stream: kv_size, or fewer for a sliding-window layer.

        Raises
        ------
        OutOfBoundsError
            For a layer the cache does not have.
        """
        return int(lib.ferry_kv_cache_layer_kv_size(self._p, self._layer(layer, f"{self._layout.name}.layer_kv_size")))

    @property
    @holding
    def buffer(self) -> BorrowedBuffer:
        """The buffer holding every layer in the cache's own host memory (with placement, the layers
        placed None).

        Raises
        ------
        InvalidArgumentError
            When the cache has no such buffer: every layer placed on a device, or a cache over
            the caller's arrays (layer_buffer says where each layer is).
        """
        buf = self._wrappers.get(("buffer", -1))
        if buf is None:
            ptr = lib.ferry_kv_cache_buffer(self._p)
            if ptr == ffi.NULL:
                raise InvalidArgumentError(f"{self._layout.name}.buffer: no layer is in the cache's own host memory; "
                                           "layer_buffer(layer) gives each layer's")
            buf = BorrowedBuffer(ptr, buffer_type_of(ptr, [self._buffer_type]), self, self._handle)
            self._wrappers["buffer", -1] = buf
        return buf

    def _last_stream(self) -> int:
        return self._params.n_stream - 1

    def _own_buffer(self, layer: int) -> Optional[BorrowedBuffer]:
        if lib.ferry_kv_cache_layer_buffer(self._p, layer) == lib.ferry_kv_cache_buffer(self._p):
            return self.buffer
        return None

    @holding
    def window(self, layer: int, n_kv: int, s0: int = 0, s1: Optional[int] = None,
               lengths: Optional[Tensor] = None, limit: Optional[int] = None) -> Tuple[Tensor, Tensor]:
        """The K and V windows attention reads, permuted (0, 2, 1, 3) as attention hands them on.

        Parameters
        ----------
        layer : int
        n_kv : int
            Cells read from the start of each stream.
        s0 : int, optional
            The first stream read.
        s1 : int, optional
            The last stream read (default: the cache's last).
        lengths : Tensor, optional
            The kv_len attention reads (i32 [ns]): both windows carry it as their used cells
            (Tensor.set_used_cells), and keep it and its memory alive; the ragged policy copies
            stream s's first min(lengths[s], n_kv) cells alone. It must then be in host memory.
        limit : int, optional
            Lengths above it are refused when copied (default n_kv); a sliding layer's window of
            its own cells takes the step's n_kv here.

        Returns
        -------
        (Tensor, Tensor)
            K, [head_dim, n_kv, n_head_kv, ns]; V likewise, or [n_kv, head_dim, n_head_kv, ns] when
            transposed. attn_decode reads V as the cache lays it out, and refuses a v_trans that
            disagrees.

        Raises
        ------
        InvalidArgumentError, OutOfBoundsError
            For a layer, n_kv or stream range the cache does not have, or lengths that are not a
            Tensor or a limit below n_kv.
        LayoutError
            For lengths that are not i32 [ns].
        """
        if lengths is not None:
            _checks.instance(lengths, Tensor, "kv_window: lengths")
        li = _checks.as_c_int(layer, "kv_window: layer")
        nk = _checks.as_int64(n_kv, "kv_window: n_kv")
        a = _checks.as_int64(s0, "kv_window: s0")
        b = self._last_stream() if s1 is None else _checks.as_int64(s1, "kv_window: s1")
        kv = self._p
        return self._window_pair(self._layer(li, "kv_window"),
                                 lambda ctx, k, v: lib.ferry_kv_cache_window(kv, ctx, li, nk, a, b, k, v), lengths,
                                 limit)

    def windows(self, n_kv: int, s0: int = 0, s1: Optional[int] = None) -> "KVWindows":
        """Every layer's K and V windows of a step, as ferry.attention_step reads them in one C call.

        Parameters
        ----------
        n_kv, s0, s1 : int
            As window() takes them (s0 and s1 optional).

        Returns
        -------
        KVWindows
            A sequence of (K, V) pairs, one per layer, each made by window() only when indexed:
            attention_step makes them in C instead.

        Raises
        ------
        InvalidArgumentError
            For values that cannot reach C (a layer, n_kv or stream range the cache does not have
            is refused where the windows are made, by window() or attention_step).
        """
        return KVWindows(self, n_kv, s0, s1)

    def _stream_of(self, which: str, layer: int, stream: int) -> Tuple[Tensor, int, int]:
        if not isinstance(which, str) or which not in ("k", "v"):
            raise InvalidArgumentError(f"kv stream: which is 'k' or 'v', not {which!r}")
        t = self.k(layer) if which == "k" else self.v(layer)
        s = _checks.as_int64(stream, "kv stream: stream")
        if not 0 <= s < self._params.n_stream:
            raise OutOfBoundsError(f"kv stream: stream {s} is not in 0..{self._params.n_stream - 1}")
        size = t.nb[2]
        return t, s * size, size

    def set_stream(self, which: str, layer: int, stream: int, data: _pybuffer.BytesLike) -> None:
        """Fill one stream of a layer's K or V with exactly its bytes.

        Parameters
        ----------
        which : str
            "k" or "v".
        layer : int
        stream : int
        data : bytes-like, numpy.ndarray or TensorBytes
            The stream's values: an array of the cache's dtype shaped [kv_size, n_embd_gqa]
            ([n_embd_gqa, kv_size] for a transposed V) or flat, or its raw bytes (the only way for
            quantized types); checked as every write is (Tensor.set).

        Raises
        ------
        InvalidArgumentError
            For which not "k" or "v", or data of another dtype.
        LayoutError
            For data of another shape.
        OutOfBoundsError
            For a layer or stream the cache does not have, or data of another size.
        """
        t, offset, _ = self._stream_of(which, layer, stream)
        t._write(data, offset, "kv set_stream", region=(t.ne[1], t.ne[0]))

    def get_stream(self, which: str, layer: int, stream: int) -> bytes:
        """The bytes of one stream of a layer's K (which "k") or V ("v"); raises as set_stream does."""
        t, offset, size = self._stream_of(which, layer, stream)
        return t.get(offset, size)

    @holding
    def window_layout(self, which: str, n_kv: int, s0: int = 0,
                      s1: Optional[int] = None) -> Tuple[List[int], List[int], int]:
        """The view window() takes of each layer's K (which "k") or V ("v"), before its permute
        (ferry_kv_cache_window_layout).

        Parameters
        ----------
        which : str
            "k" or "v".
        n_kv, s0, s1 : int
            As window() takes them.

        Returns
        -------
        (list of int, list of int, int)
            ne and nb of 4 dimensions (cells on dimension 2, or 0 for a transposed V; streams on
            3), and the byte offset of stream s0 from the layer tensor's first byte.

        Raises
        ------
        InvalidArgumentError, OutOfBoundsError
            As window() does.
        """
        v = self._which_is_v(which, "kv window_layout")
        nk = _checks.as_int64(n_kv, "kv window_layout: n_kv")
        a = _checks.as_int64(s0, "kv window_layout: s0")
        b = self._last_stream() if s1 is None else _checks.as_int64(s1, "kv window_layout: s1")
        ne, nb, offset = ffi.new("int64_t[4]"), ffi.new("size_t[4]"), ffi.new("size_t *")
        check(lib.ferry_kv_cache_window_layout(self._p, v, nk, a, b, ne, nb, offset))
        return [int(n) for n in ne], [int(n) for n in nb], int(offset[0])

    @holding
    def cell_offset(self, which: str, stream: int, cell: int) -> int:
        """Where a cell of a stream lies in each layer's K (which "k") or V ("v")
        (ferry_kv_cache_cell_offset).

        Parameters
        ----------
        which : str
            "k" or "v".
        stream : int
        cell : int
            0..kv_size (kv_size: the stream's end).

        Returns
        -------
        int
            Bytes from the layer tensor's first byte to the cell's first value, or for a
            transposed V to its value of channel 0 (channel c lies c * kv_size values on).

        Raises
        ------
        InvalidArgumentError, OutOfBoundsError
            For which not "k" or "v", or a stream or cell the cache does not have.
        """
        v = self._which_is_v(which, "kv cell_offset")
        s = _checks.as_int64(stream, "kv cell_offset: stream")
        c = _checks.as_int64(cell, "kv cell_offset: cell")
        out = ffi.new("size_t *")
        check(lib.ferry_kv_cache_cell_offset(self._p, v, s, c, out))
        return int(out[0])

    def _repr_layout(self) -> str:
        p = self._params
        return (f"{p.n_stream} x {self.kv_size} cells, {p.n_layer} layers in {self._buffer_type.name}"
                f"{'' if all(b is None for b in self._placement) else ' (placed per layer)'}")


def _layer_cells(cells: Optional[Sequence[Optional[int]]], n_layer: int) -> Optional[List[int]]:
    """Per layer, its cells per stream (0: full), or None for all full."""
    if cells is None:
        return None
    if isinstance(cells, (str, bytes)) or not isinstance(cells, Sequence) or len(cells) != n_layer:
        raise InvalidArgumentError(f"KVCache: layer_cells is a sequence of {n_layer} int or None, one per layer")
    return [0 if c is None else _checks.as_int64(c, f"KVCache: layer_cells[{i}]") for i, c in enumerate(cells)]


class KVWindows(LayerWindows):
    """Every layer's K and V windows of the first n_kv cells of streams s0..s1 (KVCache.windows).

    Indexing makes a layer's pair with KVCache.window, of min(n_kv, the layer's cells) cells: a
    sliding-window layer's window is its ring's whole content once the sequence outgrows it, and
    attention, which clamps each stream's kv_len to its window's cells, reads min(kv_len, cells).
    ferry.attention_step makes every layer's the same way in one C call (ferry_kv_attention_step)
    instead, and so never wraps them in Python objects. An n_kv beyond a full layer's cells
    (KVCache.kv_size) is refused, not clamped, by both.

    Made of a KVCache, n_kv, s0 and s1 as LayerWindows says; InvalidArgumentError for another cache.
    """

    _what = "kv windows"
    _cache_class = KVCache
    _window_what = "kv_window"
    cache: KVCache

    def _window(self, layer: int) -> Tuple[Tensor, Tensor]:
        cache = self.cache
        # beyond a full layer's cells: unclamped, so that window refuses it as the one-call path does
        n_kv = self.n_kv if self.n_kv > cache.kv_size else min(self.n_kv, cache.layer_kv_size(layer))
        return cache.window(layer, n_kv, self.s0, self.s1)

    def __repr__(self) -> str:
        return f"<KVWindows n_kv={self.n_kv} streams {self.s0}..{self.s1} of {self.cache!r}>"
