"""Backends: the CPU backend, the dummy backend, and the transfers that go through them."""

from __future__ import annotations

import weakref
from typing import Any, Callable, List, Optional, Sequence, Tuple

from . import _checks, _pybuffer
from ._binding import ffi, lib, query
from ._handle import Closeable, Handle, holding
from .buffer import Buffer, BufferType
from .errors import InvalidArgumentError, check
from .event import Event
from .stats import Counted, LinkStats, MemoryInfo
from .tensor import Tensor, hold_memory, writable_data
from .types import TypeLike


class Backend(Closeable, Counted):
    """A place tensors live and are transferred to: its default buffer type, counters, async transfers.

    The *_async transfers keep the data objects they were given alive until synchronize(),
    so a backend that really runs them later never reads freed Python memory.

    close() (or the end of a `with` block) waits for queued transfers and frees the backend
    now, or, while buffers, events, caches or schedulers made on it are alive, when the last
    of them goes; they keep working, and so does a call another thread is making with it (a
    transfer, a compute, a synchronize), after which it is freed. The closed backend, and its
    buffer_type, raise FreedBufferError on every use. A backend nobody holds is freed at once: nothing of it
    forms a reference cycle (its BufferType holds the backend, not the other way round).
    """

    def __init__(self, ptr: Any) -> None:
        """Internal: take ownership of a ferry_backend*; construct CPUBackend, StandinBackend,
        DummyBackend or CUDABackend instead.

        Parameters
        ----------
        ptr : cdata ferry_backend *
            The backend, freed with this object (once its buffers are gone too).
        """
        self._handle = Handle(ptr, lib.ferry_backend_free)
        self._pending: List[Any] = []
        self._name = ffi.string(lib.ferry_backend_name(ptr)).decode()
        # The finalizer holds the pending data, so that a backend in a reference cycle never
        # hands it to the collector: it is released here, after a last synchronize.
        self._finalizer = weakref.finalize(self, _release_backend, self._handle, self._pending)
        # Held weakly: the BufferType holds this backend, and a strong reference back would be
        # a cycle that keeps a backend nobody holds alive until a collection.
        self._buffer_type_ref: Optional["weakref.ref[BufferType]"] = None

    def _describe(self) -> str:
        return f"{type(self).__name__} {self._name!r}"

    @property
    def name(self) -> str:
        """The backend's name ("CPU", "CUDA0", ...)."""
        return ffi.string(lib.ferry_backend_name(self._p)).decode()

    has_2d = query(lib.ferry_backend_has_2d, bool,
                   "Does the backend implement 2-D transfers itself (else each is a loop of plain ones)?")

    @property
    def buffer_type(self) -> BufferType:
        """The buffer type alloc_buffer allocates from (FreedBufferError once the backend is closed)."""
        bt = self._buffer_type_ref() if self._buffer_type_ref is not None else None
        if bt is None:
            bt = BufferType(lib.ferry_backend_default_buffer_type(self._p), self)
            self._buffer_type_ref = weakref.ref(bt)
        return bt

    def supports_buffer_type(self, buffer_type: BufferType) -> bool:
        """Whether this backend can read and write buffers of the BufferType buffer_type
        (InvalidArgumentError for anything else).
        """
        _checks.instance(buffer_type, BufferType, "supports_buffer_type")
        return bool(lib.ferry_backend_supports_buft(self._p, buffer_type._ptr))

    # ------------------------------------------------------------ allocation

    def alloc_buffer(self, size: int) -> Buffer:
        """BufferType.alloc_buffer of the backend's default buffer type: a new Buffer of size bytes
        (OutOfMemoryError past its max size).
        """
        return self.buffer_type.alloc_buffer(size)

    def alloc_buffer_for(self, tensor: Tensor) -> Buffer:
        """A buffer exactly large enough for a tensor, with the tensor placed at its start.

        Parameters
        ----------
        tensor : Tensor
            Not a view, not yet placed.

        Returns
        -------
        Buffer
        """
        t = _checks.instance(tensor, Tensor, "alloc_buffer_for")
        buf = self.alloc_buffer(self.buffer_type.alloc_size(t))
        buf.place(t, 0)
        return buf

    def alloc_tensor(self, type: TypeLike, ne: Sequence[int], name: Optional[str] = None) -> Tensor:
        """A new contiguous tensor in a buffer of its own.

        Parameters
        ----------
        type : Type, str or int
            The element type.
        ne : sequence of int
            1 to 4 values per dimension.
        name : str, optional
            The tensor's name.

        Returns
        -------
        Tensor
        """
        t = Tensor.new(type, ne, name=name)
        self.alloc_buffer_for(t)
        return t

    # ------------------------------------------------------------ transfers

    def set_async(self, tensor: Tensor, data: _pybuffer.BytesLike, offset: int = 0) -> None:
        """Start writing all of data into a tensor; data is kept alive until synchronize().

        Parameters
        ----------
        tensor : Tensor
        data : bytes-like, numpy.ndarray or TensorBytes
            Checked as Tensor.set's data is.
        offset : int, optional
            Bytes from the tensor's first byte.

        Raises
        ------
        InvalidArgumentError
            For a tensor that is not one, values that cannot be sizes, or data of another dtype.
        LayoutError
            For data of another shape.
        OutOfBoundsError
            When the bytes reach past the tensor's span.
        NotAllocatedError, FreedBufferError
            For a tensor without live memory.
        """
        t = _checks.instance(tensor, Tensor, "set_async")
        off = _checks.as_size(offset, "set_async: offset")
        d = writable_data(t, data, "set_async", off)
        self._queue(d, t, lambda: lib.ferry_backend_tensor_set_async(self._p, t._p, d.ptr, off, d.nbytes))

    def get_async(self, tensor: Tensor, out: Any, offset: int = 0) -> None:
        """Start filling the writable, contiguous buffer out from tensor at a byte offset; out holds the
        bytes after synchronize(). Raises as set_async does.
        """
        t = _checks.instance(tensor, Tensor, "get_async")
        d = _pybuffer.writable(out, "get_async")
        self._queue(d, t, lambda: lib.ferry_backend_tensor_get_async(
            self._p, t._p, d.ptr, _checks.as_size(offset, "get_async: offset"), d.nbytes))

    def set_2d_async(self, tensor: Tensor, data: _pybuffer.BytesLike, offset: int, size: int, n_copies: int,
                     stride_tensor: int, stride_data: Optional[int] = None) -> None:
        """Start writing n_copies rows of size bytes into tensor, as Tensor.set_2d writes them (data
        checked as there); data is kept alive until synchronize().

        Raises
        ------
        InvalidArgumentError
            For a tensor that is not one, values that cannot be sizes, or data of another dtype.
        OutOfBoundsError
            When data is shorter or longer than the rows, or the rows reach past the tensor's span.
        LayoutError
            For strides smaller than a row, or data of another shape.
        """
        t = _checks.instance(tensor, Tensor, "set_2d_async")
        args = _checks.transfer_2d("set_2d_async", offset, size, n_copies, stride_tensor, stride_data)
        self._queue_2d("set_2d_async", lib.ferry_backend_tensor_set_2d_async, t,
                       writable_data(t, data, "set_2d_async", rows=args), args)

    def get_2d_async(self, tensor: Tensor, out: Any, offset: int, size: int, n_copies: int,
                     stride_tensor: int, stride_data: Optional[int] = None) -> None:
        """Start reading rows from tensor into out, as Tensor.get_2d reads them into out; out holds them
        after synchronize(). Raises as set_2d_async does.
        """
        t = _checks.instance(tensor, Tensor, "get_2d_async")
        args = _checks.transfer_2d("get_2d_async", offset, size, n_copies, stride_tensor, stride_data)
        self._queue_2d("get_2d_async", lib.ferry_backend_tensor_get_2d_async, t,
                       _pybuffer.writable(out, "get_2d_async"), args)

    def set_2d(self, tensor: Tensor, data: _pybuffer.BytesLike, offset: int, size: int, n_copies: int,
               stride_tensor: int, stride_data: Optional[int] = None) -> None:
        """set_2d_async, then synchronize().

        Parameters
        ----------
        tensor, data, offset, size, n_copies, stride_tensor, stride_data
            As for set_2d_async.
        """
        self.set_2d_async(tensor, data, offset, size, n_copies, stride_tensor, stride_data)
        self.synchronize()

    def get_2d(self, tensor: Tensor, offset: int, size: int, n_copies: int, stride_tensor: int,
               stride_data: Optional[int] = None) -> bytes:
        """get_2d_async into new memory, then synchronize().

        Parameters
        ----------
        tensor, offset, size, n_copies, stride_tensor, stride_data
            As for get_2d_async.

        Returns
        -------
        bytes
            (n_copies-1)*stride_data + size bytes.
        """
        t = _checks.instance(tensor, Tensor, "get_2d")
        args = _checks.transfer_2d("get_2d", offset, size, n_copies, stride_tensor, stride_data)
        t._check_transfer("tensor_get_2d_async", *args)
        out = _pybuffer.new_bytes(_pybuffer.extent_2d(args[1], args[2], args[4]),
                                  f"get_2d: {args[2]} rows of {args[1]} bytes at a stride_data of {args[4]}", copies=2,
                                  remedy="give a smaller stride_data, or read into memory of yours with get_2d_async")
        self.get_2d_async(tensor, out, *args)
        self.synchronize()
        return bytes(out)

    def copy_async(self, src: Tensor, dst: Tensor, src_backend: Optional["Backend"] = None) -> None:
        """Start copying src into dst on this backend, dst's.

        Parameters
        ----------
        src, dst : Tensor
            Same type, ne and nb.
        src_backend : Backend, optional
            The backend src's memory belongs to (default: this one).

        Raises
        ------
        InvalidArgumentError
            For arguments of the wrong kind.
        LayoutError
            When the layouts differ.
        """
        s = _checks.instance(src, Tensor, "copy_async")
        d = _checks.instance(dst, Tensor, "copy_async")
        if src_backend is not None and not isinstance(src_backend, Backend):
            raise InvalidArgumentError(f"copy_async: src_backend is not a Backend but {type(src_backend).__name__}")
        sb = src_backend if src_backend is not None else self
        with hold_memory(s, d, also=(sb._handle, self._handle)):
            check(lib.ferry_backend_tensor_copy_async(sb._p, self._p, s._p, d._p))
        self._pending.append((s, d, sb))

    def _queue_2d(self, what: str, transfer: Callable[..., int], t: Tensor, d: _pybuffer.CData,
                  args: Tuple[int, int, int, int, int]) -> None:
        """Start a 2-D transfer of d's memory, once d is known to hold the rows args describe."""

        def start() -> int:  # the length check runs inside _queue, which gives d back if it fails
            d.need(_pybuffer.extent_2d(args[1], args[2], args[4]), what)
            return int(transfer(self._p, t._p, d.ptr, *args))

        self._queue(d, t, start)

    def _queue(self, d: _pybuffer.CData, t: Tensor, start: Callable[[], int]) -> None:
        """Start an async transfer of d's memory to or from t's; d is kept until synchronize(), or given
        back at once if the transfer does not start. The start holds t's memory and this backend
        (hold_memory): a stand-in's returns once the bytes have moved."""
        try:
            with hold_memory(t, also=(self._handle,)):
                check(start())
                if not self._handle.alive:  # closed by another thread meanwhile: none will synchronize
                    _synchronize(self._handle.ptr)  # still held, so not freed yet
                    d.release()
                    return
        except BaseException:
            d.release()
            raise
        self._pending.append(d)

    @holding
    def synchronize(self) -> None:
        """Wait for every transfer started here; then their data objects are let go."""
        check(lib.ferry_backend_synchronize(self._p))
        _release_pending(self._pending)

    # ------------------------------------------------------------ events

    def event(self, timing: bool = False) -> Event:
        """A new event of this backend.

        Parameters
        ----------
        timing : bool, optional
            Whether Event.elapsed_ms can time it.

        Returns
        -------
        Event

        Raises
        ------
        UnsupportedError
            For a backend that cannot make events.
        """
        return Event(self, timing)

    def wait(self, event: Event) -> None:
        """Make this backend's later work wait for an event.

        Parameters
        ----------
        event : Event
            Recorded on any backend; this one waits on the device where it can.

        Raises
        ------
        InvalidArgumentError
            For anything but an Event.
        """
        _checks.instance(event, Event, "wait", article="an").wait(self)

    _get_stats = lib.ferry_backend_get_stats
    _reset_stats = lib.ferry_backend_reset_stats

    def memory(self) -> MemoryInfo:
        """The memory the backend allocates from: free and total bytes.

        Returns
        -------
        MemoryInfo
            (free, total): CUDA's from cudaMemGetInfo, the CPU's from the host, a stand-in
            device's from its memory size (the host's without one).

        Raises
        ------
        UnsupportedError
            For a backend that cannot say.
        """
        free = ffi.new("size_t *")
        total = ffi.new("size_t *")
        check(lib.ferry_backend_get_memory(self._p, free, total))
        return MemoryInfo(int(free[0]), int(total[0]))

    def __repr__(self) -> str:
        if self.closed:
            return f"<{self._describe()} closed>"
        return f"<{type(self).__name__} {self.name!r}{'' if self.has_2d else ' no-2d'}>"


# Looked up now: the first lookup of a lib function takes cffi's lock, and a finalizer may run
# (from the collector) while this thread holds it.
_synchronize = lib.ferry_backend_synchronize


def _release_pending(pending: List[Any]) -> None:
    for x in pending:
        if isinstance(x, _pybuffer.CData):
            x.release()
    pending.clear()


def _release_backend(handle: Handle, pending: List[Any]) -> None:
    """A Backend's finalizer: transfers still queued read or write their data, so wait for them,
    give the data back, then let the C backend go (once its buffers are gone too)."""
    if pending:
        if handle.ptr is not None:
            _synchronize(handle.ptr)  # a failure has nowhere to go from a finalizer
        _release_pending(pending)
    handle.release()


class CPUBackend(Backend):
    """The CPU backend: host memory, 2-D transfers done as row loops in place."""

    def __init__(self) -> None:
        """A new CPU backend; it takes no parameters.

        Raises
        ------
        OutOfMemoryError
            When the backend cannot be allocated.
        """
        out = ffi.new("ferry_backend **")
        check(lib.ferry_cpu_backend_new(out))
        super().__init__(out[0])


def link_profiles() -> List[str]:
    """The names of the stand-in's named links (StandinBackend's link_profile), from published
    measurements: "h100-pcie5", "pcie4", "gh200-c2c" (docs/design.md, "Named links").

    Returns
    -------
    list of str
    """
    names: List[str] = []
    while (name := lib.ferry_standin_link_profile_name(len(names))) != ffi.NULL:
        names.append(ffi.string(name).decode())
    return names


class StandinBackend(Backend):
    """The stand-in device, for machines without a GPU: a CPU backend ("CPU (stand-in device)")
    whose buffers no other backend may use, and which uses no memory but its own. A split on it
    receives its inputs through the scheduler's copy path, as a GPU split would, and runs the
    CPU kernels; its 2-D sets are one call each, as cudaMemcpy2DAsync is.

    It can stand in for a device on a given link with a given memory. Every transfer between
    host memory and it (blocking or on its copy queue, 1-D or 2-D, set or get) then completes
    no sooner than latency + rows * row_ns + bytes / bandwidth after the link was free for it
    (rows: those of a 2-D transfer of more than one row), each direction one link. Its own
    set_async calls are a stream's: each returns once its bytes have moved and its place on the
    link is taken, and synchronize() waits for the link. The copy path weighs its routes by those
    figures (CopyCostModel.of_backend); and an allocation past
    its memory raises OutOfMemoryError naming the device, the
    bytes asked and the bytes free. A link faster than the host can copy is not reached:
    link_stats counts such transfers late. A compute slowdown F stands in for a device that
    computes more slowly than this host: each of its computes completes no sooner than F times
    the host's own time for it. Without arguments it copies at memcpy's speed with the host's
    memory and computes at the host's speed.

    StandinBackend(link_gbps=16, latency_us=5, memory=8 << 30) stands in for a GPU on a 16 GB/s
    link with 8 GiB of memory; the parameters are __init__'s.
    """

    def __init__(self, link_gbps: Optional[float] = None, latency_us: float = 0.0,
                 memory: Optional[int] = None, compute_slowdown: Optional[float] = None,
                 row_ns: float = 0.0, link_profile: Optional[str] = None) -> None:
        """A new stand-in device, on a link and with a memory of the given figures (default: none).

        Parameters
        ----------
        link_gbps : float, optional
            The link's bandwidth each way in GB/s (1e9 bytes a second), 1e-3 to 1e6; None or 0:
            unlimited (memcpy's speed).
        latency_us : float, optional
            Microseconds added to every transfer, 0 to 1e6.
        memory : int, optional
            Bytes the device has, counted as each buffer asks; None or 0: unlimited (the host's).
        compute_slowdown : float, optional
            Its compute takes at least this times the host's time, 1 to 1e6; None or 1: the host's.
        row_ns : float, optional
            Nanoseconds added for each row of a 2-D transfer of more than one row, 0 to 1e6 (a
            plain transfer, or a 2-D one of one row, pays none), as a real link charges per row.
        link_profile : str, optional
            A named link from published measurements (link_profiles(): "h100-pcie5", "pcie4",
            "gh200-c2c"; docs/design.md, "Named links"): its bandwidth, latency and piece curve (a
            piece's rate rising with its size, as DMA engines move pieces). link_gbps then gives its
            peak, every rate scaled with it and every fixed cost against it, so that each transfer
            takes the same multiple of its time on the named link (None: the named link's own);
            latency_us and row_ns are the profile's and must be left 0.

        Raises
        ------
        InvalidArgumentError
            For a value that is not a number (link_gbps, latency_us, compute_slowdown, row_ns) or a
            size (memory), or out of its range, naming it; an unknown link_profile (naming the
            known ones), or latency_us or row_ns beside one.
        OutOfMemoryError
            When the backend cannot be allocated.
        """
        params = ffi.new("ferry_standin_params *")
        params[0] = lib.ferry_standin_default_params()
        params.link_gbps = 0.0 if link_gbps is None else _checks.as_double(link_gbps, "StandinBackend: link_gbps")
        params.latency_us = _checks.as_double(latency_us, "StandinBackend: latency_us")
        if link_profile is not None:
            if not isinstance(link_profile, str) or "\0" in link_profile:
                raise InvalidArgumentError("StandinBackend: link_profile must be a name "
                                           f"({', '.join(link_profiles())}), got {link_profile!r}")
            if params.latency_us != 0 or _checks.as_double(row_ns, "StandinBackend: row_ns") != 0:
                raise InvalidArgumentError("StandinBackend: latency_us and row_ns are the link_profile's: leave them "
                                           "0 beside it")
            check(lib.ferry_standin_link_profile(link_profile.encode(), params.link_gbps, params))
        params.memory = 0 if memory is None else _checks.as_size(memory, "StandinBackend: memory")
        params.compute_slowdown = 0.0 if compute_slowdown is None else _checks.as_double(
            compute_slowdown, "StandinBackend: compute_slowdown")
        if link_profile is None:  # else the profile's
            params.row_ns = _checks.as_double(row_ns, "StandinBackend: row_ns")
        out = ffi.new("ferry_backend **")
        check(lib.ferry_standin_backend_new_params(params, out))
        super().__init__(out[0])

    def _params(self) -> Any:
        params = ffi.new("ferry_standin_params *")
        check(lib.ferry_standin_get_link(self._p, params, ffi.NULL))
        return params

    @property
    def link_gbps(self) -> Optional[float]:
        """The link's bandwidth in GB/s, or None for unlimited."""
        gbps = float(self._params().link_gbps)
        return gbps if gbps > 0 else None

    @property
    def latency_us(self) -> float:
        """Microseconds the link adds to every transfer."""
        return float(self._params().latency_us)

    @property
    def row_ns(self) -> float:
        """Nanoseconds the link adds for each row of a 2-D transfer of more than one row."""
        return float(self._params().row_ns)

    @property
    def piece_curve(self) -> Optional[Tuple[float, float, float]]:
        """The link's piece curve, (floor_gbps, knee_bytes, steepness): a piece's rate rising from
        floor_gbps to link_gbps past knee_bytes; None when every piece runs at link_gbps."""
        p = self._params()
        floor = float(p.piece_floor_gbps)
        return (floor, float(p.piece_knee_bytes), float(p.piece_steepness)) if floor > 0 else None

    @property
    def compute_slowdown(self) -> float:
        """How many times the host's time its compute takes at least (1: the host's speed)."""
        return max(1.0, float(self._params().compute_slowdown))

    @property
    def memory_size(self) -> Optional[int]:
        """The bytes the device has, or None for unlimited (the host's memory)."""
        memory = int(self._params().memory)
        return memory if memory > 0 else None

    @property
    def link_stats(self) -> LinkStats:
        """What the link carried since the backend was made or reset_link_stats."""
        stats = ffi.new("ferry_link_stats *")
        check(lib.ferry_standin_get_link(self._p, ffi.NULL, stats))
        return LinkStats.from_c(stats)

    def reset_link_stats(self) -> None:
        """Set the link's counters to 0."""
        check(lib.ferry_standin_reset_link_stats(self._p))


class DummyBackend(Backend):
    """A device-like backend for allocator tests and dry runs.

    By default its buffers hand out synthetic addresses with no memory behind them
    (transfers are checked and counted, not performed; reads give zeros). Buffers that
    claim to be host memory (is_host) hold a KV cache at full model scale in a dry run;
    with synthetic addresses no CPU op may read them. The parameters are __init__'s.
    """

    def __init__(self, real_memory: bool = False, alignment: int = 64, max_buffer_size: Optional[int] = None,
                 has_2d: bool = True, is_host: bool = False) -> None:
        """A new dummy backend.

        Parameters
        ----------
        real_memory : bool, optional
            Buffers with memory a test can read (default: synthetic addresses, nothing behind them).
        alignment : int, optional
            A power of two (0: 64).
        max_buffer_size : int, optional
            The largest buffer; None or 0: unbounded.
        has_2d : bool, optional
            False makes every 2-D transfer the generic loop of plain ones.
        is_host : bool, optional
            Buffers claim to be host memory.

        Raises
        ------
        InvalidArgumentError
            For a value that is not a bool (real_memory, has_2d, is_host) or a size (alignment,
            max_buffer_size), or an alignment that is not a power of two, naming it.
        OutOfMemoryError
            When the backend cannot be allocated.
        """
        params = ffi.new("ferry_dummy_params *")
        params[0] = lib.ferry_dummy_default_params()
        params.alignment = _checks.as_size(alignment, "DummyBackend: alignment")
        params.max_buffer_size = 0 if max_buffer_size is None else _checks.as_size(
            max_buffer_size, "DummyBackend: max_buffer_size")
        params.real_memory = _checks.as_bool(real_memory, "DummyBackend: real_memory")
        params.has_2d = _checks.as_bool(has_2d, "DummyBackend: has_2d")
        params.is_host = _checks.as_bool(is_host, "DummyBackend: is_host")
        out = ffi.new("ferry_backend **")
        check(lib.ferry_dummy_backend_new(params, out))
        super().__init__(out[0])
        self.real_memory = bool(real_memory)
        self.is_host = bool(is_host)

    @property
    def alignment(self) -> int:
        """The alignment of offsets in its buffers."""
        return self.buffer_type.alignment

    @property
    def max_buffer_size(self) -> Optional[int]:
        """The largest buffer it allocates, or None if unbounded."""
        return self.buffer_type.max_size
