"""A KV cache laid out as llama.cpp lays it out, and the windows attention reads from it.

Per layer K is [n_embd_gqa, kv_size, n_stream] (ggml order) and V the same, or
[kv_size, n_embd_gqa, n_stream] when v_trans (flash attention off). A unified cache is
one stream of n_ctx cells; otherwise each of n_stream streams holds n_ctx / n_stream.
The cache's tensors and windows keep the cache (and its memory) alive; it is freed as soon
as nothing points into it, or at once by close().
"""

from __future__ import annotations

import builtins
import weakref
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union, overload

from . import _checks, _pybuffer
from ._binding import ffi, lib
from ._handle import Closeable, Handle, holding
from .backend import Backend
from .buffer import BorrowedBuffer, BufferType, buffer_type_of, cpu_buffer_type
from .errors import FerryError, InvalidArgumentError, LayoutError, OutOfBoundsError, check
from .ops import mark_v_window
from .tensor import Tensor
from .types import Type, TypeLike, row_size, to_type

#: The K and V types attention reads (ferry.ops.attn_decode): what a cache over arrays may hold. A KVCache
#: of its own memory may hold any type, for layouts and copies without attention (a dry run's plan).
ATTENTION_TYPES: Tuple[Type, ...] = (Type.F32, Type.F16, Type.Q8_0)


@dataclass(frozen=True)
class KVParams:
    """The layout of a KV cache (ferry_kv_params), as C keeps it: KVCache.params.

    Attributes
    ----------
    type_k, type_v : Type
        The element types of K and V.
    head_dim : int
        Values per head.
    n_head_kv : int
        KV heads per cell.
    n_ctx : int
        Cells in all streams together.
    n_stream : int
        Streams; each holds n_ctx / n_stream cells (KVCache.kv_size).
    n_layer : int
        Layers, each with its K and V.
    v_trans : bool
        Whether V is stored transposed, [kv_size, n_embd_gqa, n_stream].
    """

    type_k: Type
    type_v: Type
    head_dim: int
    n_head_kv: int
    n_ctx: int
    n_stream: int
    n_layer: int
    v_trans: bool

    @property
    def n_embd_gqa(self) -> int:
        """Values per cell: head_dim * n_head_kv."""
        return self.head_dim * self.n_head_kv


class KVCache(Closeable):
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

    #: Its memory stays where it is for the cache's life: views of it may be exported (ferry.export).
    _memory_stays = True

    def __init__(self, type_k: TypeLike, type_v: TypeLike, head_dim: int, n_head_kv: int, n_ctx: int,
                 n_stream: int, n_layer: int = 1, v_trans: bool = False, backend: Optional[Backend] = None,
                 buffer_type: Optional[BufferType] = None, pinned: bool = False,
                 placement: Optional[Sequence[Optional[Backend]]] = None,
                 layer_cells: Optional[Sequence[Optional[int]]] = None) -> None:
        pinned = _checks.as_bool(pinned, "KVCache: pinned")
        if sum(x is not None and x is not False for x in (backend, buffer_type, pinned)) > 1:
            raise InvalidArgumentError("KVCache: give at most one of backend, buffer_type and pinned")
        if backend is not None:
            if not isinstance(backend, Backend):
                raise InvalidArgumentError(f"KVCache: backend is not a Backend but {type(backend).__name__}")
            buft = backend.buffer_type
        elif buffer_type is not None:
            if not isinstance(buffer_type, BufferType):
                raise InvalidArgumentError(f"KVCache: buffer_type is not a BufferType but {type(buffer_type).__name__}")
            buft = buffer_type
        elif pinned:
            from .cuda import cuda_host_buffer_type

            buft = cuda_host_buffer_type()
        else:
            buft = cpu_buffer_type()
        self._buffer_type = buft
        p = _params_of(type_k, type_v, head_dim, n_head_kv, n_ctx, n_stream, n_layer, v_trans)
        layer_bufts = _placement_bufts(placement, int(p.n_layer))
        cells = _layer_cells(layer_cells, int(p.n_layer))
        out = ffi.new("ferry_kv_cache **")
        if layer_bufts is None and cells is None:
            check(lib.ferry_kv_cache_new(p, buft._ptr, out))
        else:
            c_bufts = ffi.NULL if layer_bufts is None else ffi.new(
                "ferry_buffer_type *[]", [ffi.NULL if b is None else b._ptr for b in layer_bufts])
            c_cells = ffi.NULL if cells is None else ffi.new("int64_t[]", cells)
            check(lib.ferry_kv_cache_new_layers(p, buft._ptr, c_bufts, c_cells, out))
        owners = [buft] + [b for b in (layer_bufts or []) if b is not None]
        parents = [b._backend._handle for b in owners if b._backend is not None]
        self._setup(Handle(out[0], lib.ferry_kv_cache_free, parents),
                    [buft if b is None else b for b in (layer_bufts or [None] * int(p.n_layer))],
                    tuple(None if b is None else b._backend for b in (layer_bufts or [None] * int(p.n_layer))), {})

    def _setup(self, handle: Handle, layer_bufts: List[BufferType],
               placement: Tuple[Union[Backend, BufferType, None], ...],
               foreign: "dict[Tuple[str, int], Any]") -> None:
        self._handle = handle
        self._finalizer = weakref.finalize(self, self._handle.release)
        self._layer_bufts = layer_bufts
        self._placement = placement
        self._foreign = foreign  # (which, layer) -> the ForeignBuffer its tensor lies in (from_arrays)
        c = ffi.new("ferry_kv_params *")
        check(lib.ferry_kv_cache_params(self._handle.ptr, c))  # the cache's own params, as C keeps them
        self._params = KVParams(Type(c.type_k), Type(c.type_v), int(c.head_dim), int(c.n_head_kv), int(c.n_ctx),
                                int(c.n_stream), int(c.n_layer), bool(c.v_trans))
        # The wrappers keep the cache alive, so the cache holds them weakly: no reference cycle,
        # and a cache nobody uses frees its (maybe pinned) memory at once.
        self._wrappers: "weakref.WeakValueDictionary[Tuple[str, int], Any]" = weakref.WeakValueDictionary()

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
        from .interop import ForeignBuffer, from_array

        what = "KVCache.from_arrays"
        _check_layer_lists(what, k_layers, v_layers, "give one K and one V per layer")
        ns = _checks.as_int64(n_stream, f"{what}: n_stream")
        if ns <= 0:
            raise InvalidArgumentError(f"{what}: n_stream must be positive, got {ns}")
        vt = _checks.as_bool(v_trans, f"{what}: v_trans")
        heads = _checks.as_int64(n_head_kv, f"{what}: n_head_kv")
        if heads <= 0:
            raise InvalidArgumentError(f"{what}: n_head_kv must be positive, got {heads}")
        ks = [_layer_array(a, "k", i, type_k, ns, False, from_array) for i, a in enumerate(k_layers)]
        vs = [_layer_array(a, "v", i, type_v, ns, vt, from_array) for i, a in enumerate(v_layers)]
        _check_one_type(what, [t.type for t in ks], [t.type for t in vs])
        n_embd = ks[0].ne[0]
        cells = [t.ne[1] for t in ks]
        for i, (k, v) in enumerate(zip(ks, vs)):
            if k.ne[0] != n_embd:
                raise InvalidArgumentError(f"{what}: k_layers[{i}] has rows of {k.ne[0]} values (axis 2), k_layers[0] "
                                           f"of {n_embd}: every layer has one n_embd_gqa")
            want_v = [cells[i], n_embd, ns] if vt else [n_embd, cells[i], ns]
            if list(v.ne[:3]) != want_v:
                shape = f"[{ns}, {n_embd}, {cells[i]}]" if vt else f"[{ns}, {cells[i]}, {n_embd}]"
                raise InvalidArgumentError(f"{what}: v_layers[{i}] is [{v.ne[2]}, {v.ne[1]}, {v.ne[0]}] values, not "
                                           f"{shape} as k_layers[{i}]'s cells{' transposed (v_trans)' if vt else ''}")
        full = max(cells)
        if n_embd % heads:
            raise InvalidArgumentError(f"{what}: n_embd_gqa {n_embd} is not n_head_kv {heads} heads of whole values")
        ctx = ns * full if n_ctx is None else _checks.as_int64(n_ctx, f"{what}: n_ctx")
        if n_ctx is not None and (ctx <= 0 or ctx % ns or ctx // ns < full):
            raise InvalidArgumentError(f"{what}: n_ctx {ctx} is not n_stream {ns} streams of at least {full} cells, "
                                       "the most a layer's arrays hold")
        p = _params_of(ks[0].type, vs[0].type, n_embd // heads, heads, ctx, ns, len(ks), vt)
        kbufs = [_buffer_of(t, f"{what}: k_layers[{i}]") for i, t in enumerate(ks)]
        vbufs = [_buffer_of(t, f"{what}: v_layers[{i}]") for i, t in enumerate(vs)]
        out = ffi.new("ferry_kv_cache **")
        n = len(ks)
        check(lib.ferry_kv_cache_new_over(
            p, ffi.new("int64_t[]", [0 if c == p.n_ctx // ns else c for c in cells]),
            ffi.new("ferry_buffer *[]", [b._p for b in kbufs]), ffi.new("size_t[]", [0] * n),
            ffi.new("ferry_buffer *[]", [b._p for b in vbufs]), ffi.new("size_t[]", [0] * n), out))
        return _over_buffers(cls, out[0], lib.ferry_kv_cache_free, kbufs, vbufs, ForeignBuffer)

    def _layer_tensor(self, which: str, layer: int) -> Tensor:
        return _layer_tensor(self, which, layer, lib.ferry_kv_cache_k if which == "k" else lib.ferry_kv_cache_v)

    def _after_close(self) -> None:
        self._wrappers.clear()

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
        return int(lib.ferry_kv_cache_layer_kv_size(self._p, self._layer(layer)))

    @property
    def placement(self) -> Tuple[Union[Backend, BufferType, None], ...]:
        """Per layer, the backend whose memory holds its K and V, or None for host memory; for a
        cache over device arrays (from_arrays), the memory's BufferType where no Backend object
        stands for it (CUDA memory a library allocated)."""
        return self._placement

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
                raise InvalidArgumentError("KVCache.buffer: no layer is in the cache's own host memory; "
                                           "layer_buffer(layer) gives each layer's")
            buf = BorrowedBuffer(ptr, buffer_type_of(ptr, [self._buffer_type]), self, self._handle)
            self._wrappers["buffer", -1] = buf
        return buf

    @holding
    def layer_buffer(self, layer: int) -> Any:
        """The buffer holding a layer's K and V (the caller's K buffer for a cache over arrays).

        Raises
        ------
        OutOfBoundsError
            For a layer the cache does not have.
        """
        i = self._layer(layer)
        if ("k", i) in self._foreign:
            return self._foreign["k", i]
        if lib.ferry_kv_cache_layer_buffer(self._p, i) == lib.ferry_kv_cache_buffer(self._p):
            return self.buffer
        return _layer_buffer(self, i, lib.ferry_kv_cache_layer_buffer)

    @property
    def buffer_type(self) -> BufferType:
        """The buffer type the cache's memory is of."""
        return self._buffer_type

    def _layer(self, layer: int) -> int:
        i = _checks.as_c_int(layer, "KVCache: layer")
        if not 0 <= i < self._params.n_layer:
            raise OutOfBoundsError(f"kv_cache: layer {i} is not in 0..{self._params.n_layer - 1}")
        return i

    @holding
    def k(self, layer: int = 0) -> Tensor:
        """A layer's K tensor, [n_embd_gqa, kv_size, n_stream].

        Parameters
        ----------
        layer : int, optional

        Returns
        -------
        Tensor

        Raises
        ------
        OutOfBoundsError
            For a layer the cache does not have.
        """
        return self._layer_tensor("k", self._layer(layer))

    @holding
    def v(self, layer: int = 0) -> Tensor:
        """A layer's V tensor, [n_embd_gqa, kv_size, n_stream], or [kv_size, n_embd_gqa, n_stream] when
        v_trans; raises as k does.
        """
        return self._layer_tensor("v", self._layer(layer))

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
        b = self._params.n_stream - 1 if s1 is None else _checks.as_int64(s1, "kv_window: s1")
        kv = self._p
        k_layer, v_layer = self.k(li), self.v(li)
        v_out = ffi.new("ferry_tensor **")
        # One context holds both: V is borrowed from K's, and keeps K (and so the context) alive.
        k = Tensor(lambda ctx, out: lib.ferry_kv_cache_window(kv, ctx, li, nk, a, b, out, v_out), source=k_layer)
        v = Tensor._borrow(v_out[0], k._handle, keep=k, source=v_layer)
        mark_v_window(v, self._params.v_trans)  # attention reads V as the cache lays it out
        if lengths is not None:
            k.set_used_cells(lengths, 1, 3, limit)
            v.set_used_cells(lengths, 0 if self._params.v_trans else 1, 3, limit)
        return k, v

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
        v = _which(which, "kv window_layout")
        nk = _checks.as_int64(n_kv, "kv window_layout: n_kv")
        a = _checks.as_int64(s0, "kv window_layout: s0")
        b = self._params.n_stream - 1 if s1 is None else _checks.as_int64(s1, "kv window_layout: s1")
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
        v = _which(which, "kv cell_offset")
        s = _checks.as_int64(stream, "kv cell_offset: stream")
        c = _checks.as_int64(cell, "kv cell_offset: cell")
        out = ffi.new("size_t *")
        check(lib.ferry_kv_cache_cell_offset(self._p, v, s, c, out))
        return int(out[0])

    def __repr__(self) -> str:
        if self.closed:
            return "<KVCache closed>"
        p = self._params
        return (f"<KVCache K {p.type_k} V {p.type_v}{' (transposed)' if p.v_trans else ''} head_dim={p.head_dim} "
                f"n_head_kv={p.n_head_kv} {p.n_stream} x {self.kv_size} cells, {p.n_layer} layers "
                f"in {self._buffer_type.name}"
                f"{'' if all(b is None for b in self._placement) else ' (placed per layer)'}>")


def _which(which: str, what: str) -> bool:
    """Whether which names V ("v") rather than K ("k"); InvalidArgumentError for anything else."""
    if not isinstance(which, str) or which not in ("k", "v"):
        raise InvalidArgumentError(f"{what}: which is 'k' or 'v', not {which!r}")
    return which == "v"


def _layer_array(a: Any, which: str, layer: int, type: Optional[TypeLike], ns: int, trans: bool,
                 from_array: Callable[..., Tensor]) -> Tensor:
    """The tensor from_array makes of a layer's K (which "k") or V array, checked to be a dense
    [ns, rows, row values] of a type attention reads; each FerryError names the array ("k_layers[1]")."""
    what = f"KVCache.from_arrays: {which}_layers[{layer}]"
    shape = getattr(a, "shape", None)
    if shape is not None and len(shape) != 3:
        raise LayoutError(f"{what} has {len(shape)} dimensions (shape {tuple(shape)}); a layer is 3-D: "
                          f"[n_stream, {'n_embd_gqa, cells' if trans else 'cells, n_embd_gqa'}]")
    try:
        t = from_array(a, type=type, name=f"cache_{which}_l{layer}")
    except FerryError as e:
        given = "" if type is None else f" (type_{which}={type!r})"
        raise builtins.type(e)(f"{what}{given}: {e.message}") from None
    ne, nb = t.ne, t.nb
    if t.type not in ATTENTION_TYPES:
        raise InvalidArgumentError(f"{what} is {t.type}: attention reads {', '.join(map(str, ATTENTION_TYPES))} "
                                   f"(q8_0 as uint8 bytes with type_{which}='q8_0')")
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


def _check_layer_lists(what: str, k_layers: Any, v_layers: Any, one_each: str) -> None:
    """Raise InvalidArgumentError unless k_layers and v_layers are sequences of one array per layer,
    as many of each and at least one (one_each: what the count's message asks for)."""
    for arg, layers in (("k_layers", k_layers), ("v_layers", v_layers)):
        if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence):
            raise InvalidArgumentError(f"{what}: {arg} is a sequence of arrays, one per layer, not "
                                       f"{type(layers).__name__}")
    if len(k_layers) != len(v_layers) or not k_layers:
        raise InvalidArgumentError(f"{what}: {len(k_layers)} K layers and {len(v_layers)} V layers; {one_each}")


def _check_one_type(what: str, types_k: List[Type], types_v: List[Type]) -> None:
    """Raise InvalidArgumentError, naming the layer, where a layer's K (or V) type is not layer 0's."""
    for arg, types in (("k_layers", types_k), ("v_layers", types_v)):
        for i, t in enumerate(types):
            if t != types[0]:
                raise InvalidArgumentError(f"{what}: {arg}[{i}] is {t}, {arg}[0] {types[0]}: every "
                                           f"layer of a cache has one {arg[0].upper()} type")


def _over_buffers(cls: Any, ptr: Any, free: Any, kbufs: List[Any], vbufs: List[Any], foreign_type: Any) -> Any:
    """A cache object of class cls (KVCache, PagedKVCache) over the C cache ptr (freed by free) that
    from_arrays made over the caller's buffers: it keeps the foreign ones alive, and its placement
    and memory are theirs."""
    self = cls.__new__(cls)
    bufs = [b for b in kbufs + vbufs if isinstance(b, foreign_type)]
    self._buffer_type = kbufs[0].type
    foreign = {**{("k", i): b for i, b in enumerate(kbufs)}, **{("v", i): b for i, b in enumerate(vbufs)}}
    self._setup(Handle(ptr, free, [b._handle for b in bufs]), [b.type for b in kbufs],
                tuple(None if b.type.is_host else b.type._backend or b.type for b in kbufs), foreign)
    return self


def _layer_tensor(cache: Any, which: str, layer: int, get: Callable[..., Any]) -> Tensor:
    """A cache's (KVCache, PagedKVCache) tensor of a layer's K or V from the C getter get, made once
    and kept while anyone holds it, borrowing the buffer it lies in."""
    t = cache._wrappers.get((which, layer))
    if t is None:
        out = ffi.new("ferry_tensor **")
        check(get(cache._p, layer, out))
        buf = cache._foreign.get((which, layer)) or cache.layer_buffer(layer)
        t = Tensor._borrow(out[0], cache._handle, keep=cache, buffer=buf)
        cache._wrappers[which, layer] = t
    return t


def _layer_buffer(cache: Any, layer: int, layer_buffer: Callable[..., Any]) -> BorrowedBuffer:
    """The buffer of a cache's layer as the C getter layer_buffer gives it: one wrapper per C buffer,
    shared by the layers that lie in it."""
    ptr = layer_buffer(cache._p, layer)
    buf = cache._wrappers.get(("buffer", layer))
    if buf is None:
        buf = BorrowedBuffer(ptr, cache._layer_bufts[layer], cache, cache._handle)
        for j in range(cache._params.n_layer):
            if layer_buffer(cache._p, j) == ptr:
                cache._wrappers["buffer", j] = buf
    return buf


def _buffer_of(t: Tensor, what: str) -> Any:
    """The buffer from_array placed t in, the tensor of the array what names ("KVCache.from_arrays:
    k_layers[1]"); LayoutError, naming its strides, for an array that is not dense (a view in its
    memory), which the layer checks let through."""
    if t._buffer is None:
        raise LayoutError(f"{what}: its byte strides {list(t.nb)} over ne {list(t.ne)} (innermost first) are not "
                          "a dense layout: pass a contiguous array (np.ascontiguousarray)")
    return t._buffer


def _type_arg(t: TypeLike, what: str) -> Type:
    """to_type(t), its FerryError naming the argument (what)."""
    try:
        return to_type(t)
    except FerryError as e:
        raise builtins.type(e)(f"{what}: {e.message}") from None


def _params_of(type_k: TypeLike, type_v: TypeLike, head_dim: int, n_head_kv: int, n_ctx: int, n_stream: int,
               n_layer: int, v_trans: bool) -> Any:
    """A ferry_kv_params of the values, each checked to reach C."""
    p = ffi.new("ferry_kv_params *")
    p.type_k = _type_arg(type_k, "KVCache: type_k").value
    p.type_v = _type_arg(type_v, "KVCache: type_v").value
    p.head_dim = _checks.as_int64(head_dim, "KVCache: head_dim")
    p.n_head_kv = _checks.as_int64(n_head_kv, "KVCache: n_head_kv")
    p.n_ctx = _checks.as_int64(n_ctx, "KVCache: n_ctx")
    p.n_stream = _checks.as_int64(n_stream, "KVCache: n_stream")
    p.n_layer = _checks.as_c_int(n_layer, "KVCache: n_layer")
    p.v_trans = _checks.as_bool(v_trans, "KVCache: v_trans")
    return p


def _placement_bufts(placement: Optional[Sequence[Optional[Backend]]],
                     n_layer: int) -> Optional[List[Optional[BufferType]]]:
    """Per layer, the buffer type of its placement (None: the cache's own), or None for no placement."""
    if placement is None:
        return None
    if isinstance(placement, (str, bytes)) or not isinstance(placement, Sequence):
        raise InvalidArgumentError(f"KVCache: placement is a sequence of Backend or None, not "
                                   f"{type(placement).__name__}")
    if len(placement) != n_layer:
        raise InvalidArgumentError(f"KVCache: placement has {len(placement)} entries for {n_layer} layers; "
                                   "give one per layer (None: host memory)")
    out: List[Optional[BufferType]] = []
    for i, b in enumerate(placement):
        if b is None:
            out.append(None)
        elif not isinstance(b, Backend):
            raise InvalidArgumentError(f"KVCache: placement of layer {i} is neither None nor a Backend but "
                                       f"{type(b).__name__}")
        elif b.closed:
            raise InvalidArgumentError(f"KVCache: placement of layer {i} is a closed backend; its memory "
                                       "cannot hold the layer")
        elif getattr(b, "real_memory", True) is False:  # a DummyBackend's synthetic addresses
            raise InvalidArgumentError(f"KVCache: placement of layer {i} is {b._describe()}, whose buffers have "
                                       "no memory behind them to hold the layer")
        else:
            out.append(b.buffer_type)
    return out


def _layer_cells(cells: Optional[Sequence[Optional[int]]], n_layer: int) -> Optional[List[int]]:
    """Per layer, its cells per stream (0: full), or None for all full."""
    if cells is None:
        return None
    if isinstance(cells, (str, bytes)) or not isinstance(cells, Sequence) or len(cells) != n_layer:
        raise InvalidArgumentError(f"KVCache: layer_cells is a sequence of {n_layer} int or None, one per layer")
    return [0 if c is None else _checks.as_int64(c, f"KVCache: layer_cells[{i}]") for i, c in enumerate(cells)]


class LayerWindows(Sequence[Tuple[Tensor, Tensor]]):
    """Every layer's K and V windows of a cache, each pair made when it is indexed (KVWindows,
    ferry.paged.PagedWindows); a slice gives a list of pairs, an index out of range IndexError."""

    _what = "windows"  # the name messages give
    cache: Any  # the cache, whose params give n_layer

    def __len__(self) -> int:
        return int(self.cache.params.n_layer)

    @overload
    def __getitem__(self, i: int) -> Tuple[Tensor, Tensor]: ...

    @overload
    def __getitem__(self, i: slice) -> List[Tuple[Tensor, Tensor]]: ...

    def __getitem__(self, i: Union[int, slice]) -> Union[Tuple[Tensor, Tensor], List[Tuple[Tensor, Tensor]]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        layer = _checks.as_c_int(i, f"{self._what}: layer")
        n = len(self)
        if not -n <= layer < n:
            raise IndexError(f"{self._what}: layer {layer} is not in 0..{n - 1}")
        return self._window(layer % n)

    def _window(self, layer: int) -> Tuple[Tensor, Tensor]:
        """Layer layer's (0..n_layer - 1) K and V windows."""
        raise NotImplementedError


class KVWindows(LayerWindows):
    """Every layer's K and V windows of the first n_kv cells of streams s0..s1 (KVCache.windows).

    Indexing makes a layer's pair with KVCache.window, of min(n_kv, the layer's cells) cells: a
    sliding-window layer's window is its ring's whole content once the sequence outgrows it, and
    attention, which clamps each stream's kv_len to its window's cells, reads min(kv_len, cells).
    ferry.attention_step makes every layer's the same way in one C call (ferry_kv_attention_step)
    instead, and so never wraps them in Python objects. An n_kv beyond a full layer's cells
    (KVCache.kv_size) is refused, not clamped, by both.

    Parameters
    ----------
    cache : KVCache
    n_kv : int
    s0 : int, optional
    s1 : int, optional
        As KVCache.window takes them.

    Raises
    ------
    InvalidArgumentError
        For a cache that is not a KVCache, or values that cannot reach C.
    """

    _what = "kv windows"

    def __init__(self, cache: KVCache, n_kv: int, s0: int = 0, s1: Optional[int] = None) -> None:
        self.cache = _checks.instance(cache, KVCache, "kv windows: cache")
        self.n_kv = _checks.as_int64(n_kv, "kv_window: n_kv")
        self.s0 = _checks.as_int64(s0, "kv_window: s0")
        self.s1 = cache.params.n_stream - 1 if s1 is None else _checks.as_int64(s1, "kv_window: s1")

    def _window(self, layer: int) -> Tuple[Tensor, Tensor]:
        cache = self.cache
        # beyond a full layer's cells: unclamped, so that window refuses it as the one-call path does
        n_kv = self.n_kv if self.n_kv > cache.kv_size else min(self.n_kv, cache.layer_kv_size(layer))
        return cache.window(layer, n_kv, self.s0, self.s1)

    def __repr__(self) -> str:
        return f"<KVWindows n_kv={self.n_kv} streams {self.s0}..{self.s1} of {self.cache!r}>"
