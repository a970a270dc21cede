"""The per-layer spine every KV cache stands on: where each layer's K and V live, their buffers and
lifetimes, the checks on the caller's arrays, placement, and messages naming the cache.

A cache (ferry.KVCache, ferry.paged.PagedKVCache) is a LayerCache that supplies its layout alone: a
CacheLayout (its name, its C parameters and the C functions that read its layers), the shape its
arrays take and the windows attention reads. What memory a cache has, its layers' tensors and
buffers, what keeps them alive and how the caller's arrays are refused are the spine's, once: a
new layout is a subclass, never a copy. Every message starts with the cache's own name
(CacheLayout.name), formatted here; nothing rewrites another cache's messages.
"""

from __future__ import annotations

import builtins
import weakref
from dataclasses import dataclass, fields
from typing import Any, Callable, ClassVar, Dict, List, Optional, Sequence, Tuple, Union, overload

from . import _checks
from ._binding import ffi
from ._handle import Closeable, Handle, holding
from .backend import Backend
from .buffer import BorrowedBuffer, BufferType, cpu_buffer_type
from .errors import FerryError, InvalidArgumentError, LayoutError, OutOfBoundsError, check
from .ops import mark_v_window
from .tensor import Tensor
from .types import Type, TypeLike, to_type

#: The K and V types attention reads (ferry.ops.attn_decode): what a cache over arrays may hold. A KVCache
#: of its own memory may hold any type, for layouts and copies without attention (a dry run's plan).
ATTENTION_TYPES: Tuple[Type, ...] = Type.attention_types()  # asked of C (ferry_attn_reads_type)


@dataclass(frozen=True)
class LayerParams:
    """What every cache's layout has (KVParams, ferry.paged.PagedParams begin with it): a cell's K and V.

    Attributes
    ----------
    type_k, type_v : Type
        The element types of K and V.
    head_dim : int
        Values per head.
    n_head_kv : int
        KV heads per cell.
    """

    type_k: Type
    type_v: Type
    head_dim: int
    n_head_kv: int

    @property
    def n_embd_gqa(self) -> int:
        """Values per cell: head_dim * n_head_kv."""
        return self.head_dim * self.n_head_kv


@dataclass(frozen=True)
class CacheLayout:
    """What a layout tells the spine of itself: its name and its C functions.

    Attributes
    ----------
    name : str
        How its messages name the cache ("KVCache").
    c_type : str
        The C cache's type ("ferry_kv_cache").
    params_type : str
        Its C parameters' struct ("ferry_kv_params"); the params class has a field of each name.
    params_class : type
        The LayerParams its params property gives (KVParams), a field per C field.
    free : callable
        Frees the C cache.
    params : callable
        (cache, params *) -> status: the cache's parameters as C keeps them.
    k, v : callable
        (cache, layer, ferry_tensor **) -> status: a layer's K or V tensor.
    layer_buffer : callable
        (cache, layer) -> the ferry_buffer * holding the layer.
    """

    name: str
    c_type: str
    params_type: str
    params_class: type
    free: Callable[[Any], None]
    params: Callable[[Any, Any], int]
    k: Callable[[Any, int, Any], int]
    v: Callable[[Any, int, Any], int]
    layer_buffer: Callable[[Any, int], Any]


#: How each kind of C params field is checked on its way to C, by its C type's name.
_TO_C: Dict[str, Callable[[Any, str], Any]] = {
    "ferry_type": lambda v, what: _type_arg(v, what).value,
    "int64_t": _checks.as_int64,
    "int32_t": _checks.as_c_int,
    "_Bool": _checks.as_bool,
}

#: How each kind of C params field is read back into the params class, by its C type's name.
_FROM_C: Dict[str, Callable[[Any], Any]] = {"ferry_type": Type, "int64_t": int, "int32_t": int, "_Bool": bool}


def _type_arg(t: TypeLike, what: str) -> Type:
    """to_type(t), its FerryError naming the argument (what)."""
    try:
        return to_type(t)
    except FerryError as e:
        raise builtins.type(e)(f"{what}: {e.message}") from None


class LayerCache(Closeable):
    """Per layer a K and a V in one memory (the cache's, a device's or the caller's arrays): the
    spine of every KV cache. A subclass sets _layout and supplies its constructors and windows.

    The cache's tensors and buffers keep it (and its memory) alive; it holds them weakly, so that a
    cache nobody uses frees its (maybe pinned) memory at once. close() frees it now.
    """

    #: The layout's name and C functions; every subclass sets its own.
    _layout: ClassVar[CacheLayout]
    #: Its memory stays where it is for the cache's life: views of it may be exported (ferry.export).
    _memory_stays = True

    _params: Any
    _buffer_type: BufferType

    # ------------------------------------------------------------ making one

    @classmethod
    def _memory(cls, backend: Optional[Backend], buffer_type: Optional[BufferType], pinned: bool) -> BufferType:
        """The buffer type of the cache's own memory: backend's default, buffer_type, CUDA's pinned host
        memory, or the CPU's; InvalidArgumentError for more than one, or one of another class."""
        name = cls._layout.name
        pinned = _checks.as_bool(pinned, f"{name}: pinned")
        if sum(x is not None and x is not False for x in (backend, buffer_type, pinned)) > 1:
            raise InvalidArgumentError(f"{name}: give at most one of backend, buffer_type and pinned")
        if backend is not None:
            return _checks.instance(backend, Backend, f"{name}: backend").buffer_type
        if buffer_type is not None:
            return _checks.instance(buffer_type, BufferType, f"{name}: buffer_type")
        if pinned:
            from .cuda import cuda_host_buffer_type

            return cuda_host_buffer_type()
        return cpu_buffer_type()

    @classmethod
    def _c_params(cls, **values: Any) -> Any:
        """The layout's C params struct of the values (one per field), each checked, in the struct's
        order, to reach C; a refusal names it ("KVCache: n_ctx")."""
        p = ffi.new(f"{cls._layout.params_type} *")
        for field, ctype in ffi.typeof(cls._layout.params_type).fields:
            setattr(p, field, _TO_C[ctype.type.cname](values[field], f"{cls._layout.name}: {field}"))
        return p

    @classmethod
    def _placement_bufts(cls, placement: Optional[Sequence[Optional[Backend]]],
                         n_layer: int) -> Optional[List[Optional[BufferType]]]:
        """Per layer, the buffer type of its placement (None: the cache's own), or None for no placement."""
        name = cls._layout.name
        if placement is None:
            return None
        if isinstance(placement, (str, bytes)) or not isinstance(placement, Sequence):
            raise InvalidArgumentError(f"{name}: placement is a sequence of Backend or None, not "
                                       f"{type(placement).__name__}")
        if len(placement) != n_layer:
            raise InvalidArgumentError(f"{name}: placement has {len(placement)} entries for {n_layer} layers; "
                                       "give one per layer (None: host memory)")
        out: List[Optional[BufferType]] = []
        for i, b in enumerate(placement):
            if b is None:
                out.append(None)
            elif not isinstance(b, Backend):
                raise InvalidArgumentError(f"{name}: placement of layer {i} is neither None nor a Backend but "
                                           f"{type(b).__name__}")
            elif b.closed:
                raise InvalidArgumentError(f"{name}: placement of layer {i} is a closed backend; its memory "
                                           "cannot hold the layer")
            elif getattr(b, "real_memory", True) is False:  # a DummyBackend's synthetic addresses
                raise InvalidArgumentError(f"{name}: placement of layer {i} is {b._describe()}, whose buffers "
                                           "have no memory behind them to hold the layer")
            else:
                out.append(b.buffer_type)
        return out

    @staticmethod
    def _c_layer_bufts(layer_bufts: Optional[List[Optional[BufferType]]]) -> Any:
        """The per-layer buffer types as C takes them (NULL: no placement; a NULL entry: the cache's own)."""
        if layer_bufts is None:
            return ffi.NULL
        return ffi.new("ferry_buffer_type *[]", [ffi.NULL if b is None else b._ptr for b in layer_bufts])

    def _own(self, ptr: Any, buft: BufferType, layer_bufts: Optional[List[Optional[BufferType]]],
             n_layer: int) -> None:
        """Set up a cache C made in its own memory (buft, and per layer its placement's): it keeps the
        backends of that memory alive."""
        self._buffer_type = buft
        placed = layer_bufts or [None] * n_layer
        owners = [buft] + [b for b in placed if b is not None]
        parents = [b._backend._handle for b in owners if b._backend is not None]
        self._setup(Handle(ptr, self._layout.free, parents), [buft if b is None else b for b in placed],
                    tuple(None if b is None else b._backend for b in placed), {})

    @classmethod
    def _over(cls, ptr: Any, kbufs: List[Any], vbufs: List[Any]) -> Any:
        """A cache of this class over the C cache ptr that from_arrays made over the caller's buffers:
        it keeps the foreign ones alive, and its placement and memory are theirs."""
        from .interop import ForeignBuffer

        self = cls.__new__(cls)
        bufs = [b for b in kbufs + vbufs if isinstance(b, ForeignBuffer)]
        self._buffer_type = kbufs[0].type
        foreign = {**{("k", i): b for i, b in enumerate(kbufs)}, **{("v", i): b for i, b in enumerate(vbufs)}}
        self._setup(Handle(ptr, cls._layout.free, [b._handle for b in bufs]), [b.type for b in kbufs],
                    tuple(None if b.type.is_host else b.type._backend or b.type for b in kbufs), foreign)
        return self

    def _setup(self, handle: Handle, layer_bufts: List[BufferType],
               placement: Tuple[Union[Backend, BufferType, None], ...],
               foreign: "dict[Tuple[str, int], Any]") -> None:
        self._handle = handle
        self._finalizer = weakref.finalize(self, self._handle.release)
        self._layer_bufts = layer_bufts
        self._placement = placement
        self._foreign = foreign  # (which, layer) -> the ForeignBuffer its tensor lies in (from_arrays)
        layout = self._layout
        c = ffi.new(f"{layout.params_type} *")
        check(layout.params(self._handle.ptr, c))  # the cache's own params, as C keeps them
        ctypes = dict(ffi.typeof(layout.params_type).fields)
        self._params = layout.params_class(**{f.name: _FROM_C[ctypes[f.name].type.cname](getattr(c, f.name))
                                              for f in fields(layout.params_class)})
        # The wrappers keep the cache alive, so the cache holds them weakly: no reference cycle.
        self._wrappers: "weakref.WeakValueDictionary[Tuple[str, int], Any]" = weakref.WeakValueDictionary()

    # ------------------------------------------------------------ the caller's arrays

    @classmethod
    def _from_arrays(cls, k_layers: Any, v_layers: Any, one_each: str, parse: Callable[[], Any],
                     array: Callable[[Any, str, int, Any], Tensor],
                     over: Callable[[List[Tensor], List[Tensor], Any], Callable[..., int]]) -> Any:
        """The one routine every layout's from_arrays calls: a cache over the caller's K and V arrays.

        In order: the lists checked (one_each: what their count's message asks for); the layout's
        arguments parsed (parse() returns them); each array made a tensor by the layout's
        array(a, which, layer, args), which checks its shape (calling _layer_array); one K and one V
        type per cache; then over(ks, vs, args), the layout's checks across layers, returns its C
        constructor over the arrays (new_over(K buffers, K offsets, V buffers, V offsets, out)).
        Each refusal names the cache and the array."""
        cls._check_layer_lists(k_layers, v_layers, one_each)
        args = parse()
        ks = [array(a, "k", i, args) for i, a in enumerate(k_layers)]
        vs = [array(a, "v", i, args) for i, a in enumerate(v_layers)]
        cls._check_one_type([t.type for t in ks], [t.type for t in vs])
        return cls._over_arrays(ks, vs, over(ks, vs, args))

    @classmethod
    def _check_layer_lists(cls, k_layers: Any, v_layers: Any, one_each: str) -> None:
        """Raise InvalidArgumentError unless k_layers and v_layers are sequences of one array per layer,
        as many of each and at least one (one_each: what the count's message asks for)."""
        what = f"{cls._layout.name}.from_arrays"
        for arg, layers in (("k_layers", k_layers), ("v_layers", v_layers)):
            if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence):
                raise InvalidArgumentError(f"{what}: {arg} is a sequence of arrays, one per layer, not "
                                           f"{type(layers).__name__}")
        if len(k_layers) != len(v_layers) or not k_layers:
            raise InvalidArgumentError(f"{what}: {len(k_layers)} K layers and {len(v_layers)} V layers; {one_each}")

    @classmethod
    def _array_what(cls, which: str, layer: int) -> str:
        """How messages name a layer's K (which "k") or V array: "KVCache.from_arrays: k_layers[1]"."""
        return f"{cls._layout.name}.from_arrays: {which}_layers[{layer}]"

    @classmethod
    def _layer_array(cls, a: Any, which: str, layer: int, type: Optional[TypeLike], name: str) -> Tensor:
        """The tensor ferry.from_array makes of a layer's K (which "k") or V array, named name, of a type
        attention reads; each FerryError names the array. Its shape and strides are the layout's to check."""
        from .interop import from_array

        what = cls._array_what(which, layer)
        try:
            t = from_array(a, type=type, name=name)
        except FerryError as e:
            given = "" if type is None else f" (type_{which}={type!r})"
            raise builtins.type(e)(f"{what}{given}: {e.message}") from None
        if t.type not in ATTENTION_TYPES:
            raise InvalidArgumentError(f"{what} is {t.type}: attention reads {', '.join(map(str, ATTENTION_TYPES))} "
                                       f"(q8_0 as uint8 bytes with type_{which}='q8_0')")
        return t

    @classmethod
    def _check_one_type(cls, types_k: List[Type], types_v: List[Type]) -> None:
        """Raise InvalidArgumentError, naming the layer, where a layer's K (or V) type is not layer 0's."""
        for arg, types in (("k_layers", types_k), ("v_layers", types_v)):
            for i, t in enumerate(types):
                if t != types[0]:
                    raise InvalidArgumentError(f"{cls._layout.name}.from_arrays: {arg}[{i}] is {t}, {arg}[0] "
                                               f"{types[0]}: every layer of a cache has one {arg[0].upper()} type")

    @classmethod
    def _over_arrays(cls, ks: List[Tensor], vs: List[Tensor],
                     new_over: Callable[[Any, Any, Any, Any, Any], int]) -> Any:
        """A cache over the caller's K and V tensors of each layer (_layer_array's, the layout's checks
        passed), which C makes by the layout's new_over(K buffers, K offsets, V buffers, V offsets, out):
        each array dense, each layer's K and V in one memory; the cache keeps the caller's buffers
        alive. A refusal names the array."""
        kbufs, vbufs = cls._buffers_of("k", ks), cls._buffers_of("v", vs)
        for i, (kb, vb) in enumerate(zip(kbufs, vbufs)):
            if kb.type != vb.type:
                raise InvalidArgumentError(f"{cls._layout.name}.from_arrays: k_layers[{i}] and v_layers[{i}] are "
                                           f"in memories of two kinds ({kb.type.name}, {vb.type.name}); a layer "
                                           "lives in one memory")
        out = ffi.new(f"{cls._layout.c_type} **")
        check(new_over(ffi.new("ferry_buffer *[]", [b._p for b in kbufs]), ffi.new("size_t[]", [t.offset for t in ks]),
                       ffi.new("ferry_buffer *[]", [b._p for b in vbufs]), ffi.new("size_t[]", [t.offset for t in vs]),
                       out))
        return cls._over(out[0], kbufs, vbufs)

    @classmethod
    def _buffers_of(cls, which: str, tensors: List[Tensor]) -> List[Any]:
        """The buffers from_array placed each layer's K (which "k") or V tensor in; LayoutError, naming the
        array and its strides, for one that is not dense (a view in its memory), which the layout's
        checks let through."""
        out = []
        for i, t in enumerate(tensors):
            if t._buffer is None:
                raise LayoutError(f"{cls._array_what(which, i)}: its byte strides {list(t.nb)} over ne "
                                  f"{list(t.ne)} (innermost first) are not a dense layout: pass a contiguous "
                                  "array (np.ascontiguousarray)")
            out.append(t._buffer)
        return out

    # ------------------------------------------------------------ layers and memory

    @property
    def params(self) -> Any:
        """The cache's layout: its params class (KVParams, PagedParams), as C keeps it."""
        return self._params

    @property
    def placement(self) -> Tuple[Union[Backend, BufferType, None], ...]:
        """Per layer, the backend whose memory holds its K and V, or None for host memory; for a
        cache over device arrays (from_arrays), the memory's BufferType where no Backend object
        stands for it (CUDA memory a library allocated)."""
        return self._placement

    @property
    def buffer_type(self) -> BufferType:
        """The buffer type the cache's memory is of."""
        return self._buffer_type

    def _layer(self, layer: int, what: str) -> int:
        """layer checked to be one of the cache's; what names the call in messages ("KVCache.k")."""
        i = _checks.as_c_int(layer, f"{what}: layer")
        if not 0 <= i < self._params.n_layer:
            raise OutOfBoundsError(f"{what}: layer {i} is not in 0..{self._params.n_layer - 1}")
        return i

    def _last_stream(self) -> int:
        """The last stream a window reads by default (s1): the layout's streams (or sequences) less one."""
        raise NotImplementedError

    def _own_buffer(self, layer: int) -> Optional[BorrowedBuffer]:
        """The buffer of the layout's own that holds layer, where it has one (KVCache.buffer)."""
        return None

    @holding
    def layer_buffer(self, layer: int) -> Any:
        """The buffer holding a layer's K and V (the caller's K buffer for a cache over arrays).

        Parameters
        ----------
        layer : int

        Returns
        -------
        Buffer
            One object per C buffer, shared by the layers that lie in it.

        Raises
        ------
        OutOfBoundsError
            For a layer the cache does not have.
        """
        i = self._layer(layer, f"{self._layout.name}.layer_buffer")
        if ("k", i) in self._foreign:
            return self._foreign["k", i]
        own = self._own_buffer(i)
        if own is not None:
            return own
        get = self._layout.layer_buffer
        ptr = get(self._p, i)
        buf = self._wrappers.get(("buffer", i))
        if buf is None:
            buf = BorrowedBuffer(ptr, self._layer_bufts[i], self, self._handle)
            for j in range(self._params.n_layer):
                if get(self._p, j) == ptr:
                    self._wrappers["buffer", j] = buf
        return buf

    def _layer_tensor(self, which: str, layer: int) -> Tensor:
        """A layer's K (which "k") or V tensor, made once and kept while anyone holds it, borrowing the
        buffer it lies in."""
        t = self._wrappers.get((which, layer))
        if t is None:
            out = ffi.new("ferry_tensor **")
            check((self._layout.k if which == "k" else self._layout.v)(self._p, layer, out))
            buf = self._foreign.get((which, layer)) or self.layer_buffer(layer)
            t = Tensor._borrow(out[0], self._handle, keep=self, buffer=buf)
            self._wrappers[which, layer] = t
        return t

    @holding
    def k(self, layer: int = 0) -> Tensor:
        """A layer's K tensor as the cache lays it out (KVCache: [n_embd_gqa, kv_size, n_stream];
        PagedKVCache: its pool, [n_embd_gqa, n_blocks * block_size]).

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
        return self._layer_tensor("k", self._layer(layer, f"{self._layout.name}.k"))

    @holding
    def v(self, layer: int = 0) -> Tensor:
        """A layer's V tensor as the cache lays it out: as k, or transposed with v_trans (KVCache:
        [kv_size, n_embd_gqa, n_stream]; PagedKVCache: [n_blocks * block_size, n_embd_gqa]); raises as
        k does."""
        return self._layer_tensor("v", self._layer(layer, f"{self._layout.name}.v"))

    def _after_close(self) -> None:
        self._wrappers.clear()

    # ------------------------------------------------------------ windows

    @staticmethod
    def _which_is_v(which: str, what: str) -> bool:
        """Whether which names V ("v") rather than K ("k"); InvalidArgumentError for anything else."""
        if not isinstance(which, str) or which not in ("k", "v"):
            raise InvalidArgumentError(f"{what}: which is 'k' or 'v', not {which!r}")
        return which == "v"

    def _window_pair(self, layer: int, make: Callable[[Any, Any, Any], int], lengths: Optional[Tensor],
                     limit: Optional[int],
                     check_lengths: Optional[Callable[[Tensor], None]] = None) -> Tuple[Tensor, Tensor]:
        """A layer's K and V windows from the layout's C call make(ctx, k out, v out), in one context:
        V is borrowed from K's, and keeps K (and so the context) alive. Both carry lengths as their
        used cells (Tensor.set_used_cells), below limit, once check_lengths (the layout's) passed K."""
        k_layer, v_layer = self._layer_tensor("k", layer), self._layer_tensor("v", layer)
        v_out = ffi.new("ferry_tensor **")
        k = Tensor(lambda ctx, out: make(ctx, out, v_out), source=k_layer)
        v = Tensor._borrow(v_out[0], k._handle, keep=k, source=v_layer)
        v_trans = self._params.v_trans
        mark_v_window(v, v_trans)  # attention reads V as the cache lays it out
        if check_lengths is not None:
            check_lengths(k)
        if lengths is not None:
            k.set_used_cells(lengths, 1, 3, limit)
            v.set_used_cells(lengths, 0 if v_trans else 1, 3, limit)
        return k, v

    def _repr_layout(self) -> str:
        """What repr says of the layout after the cell's types and heads: its cells, layers and memory."""
        raise NotImplementedError

    def __repr__(self) -> str:
        name = self._layout.name
        if self.closed:
            return f"<{name} closed>"
        p = self._params
        return (f"<{name} K {p.type_k} V {p.type_v}{' (transposed)' if p.v_trans else ''} head_dim={p.head_dim} "
                f"n_head_kv={p.n_head_kv} {self._repr_layout()}>")


class LayerWindows(Sequence[Tuple[Tensor, Tensor]]):
    """Every layer's K and V windows of a cache over streams s0..s1, each pair made when it is indexed
    (KVWindows, ferry.paged.PagedWindows); a slice gives a list of pairs, an index out of range
    IndexError. A subclass names its cache's class and how messages name it and its window's values.

    Parameters
    ----------
    cache : LayerCache
        The cache, of the subclass's cache class (KVCache, PagedKVCache).
    n_kv : int
    s0 : int, optional
    s1 : int, optional
        As the cache's window() takes them (s1: its last stream by default).

    Raises
    ------
    InvalidArgumentError
        For a cache of another class, or values that cannot reach C.
    """

    _what = "windows"  # the name messages give
    _cache_class: ClassVar[type] = LayerCache  # the layout's cache class
    _window_what = "window"  # how messages name the window's values ("kv_window: n_kv")
    cache: Any  # the cache, whose params give n_layer

    def __init__(self, cache: LayerCache, n_kv: int, s0: int = 0, s1: Optional[int] = None) -> None:
        self.cache = _checks.instance(cache, self._cache_class, f"{self._what}: cache")
        self.n_kv = _checks.as_int64(n_kv, f"{self._window_what}: n_kv")
        self.s0 = _checks.as_int64(s0, f"{self._window_what}: s0")
        self.s1 = cache._last_stream() if s1 is None else _checks.as_int64(s1, f"{self._window_what}: s1")

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

