"""The CUDA backend and its buffer types.

Declared in every build: without CUDA compiled in, constructors raise UnsupportedError
("built without CUDA"); with CUDA but no usable device they raise BackendError with
CUDA's message. cuda_device_count() is 0 then, never an error.
"""

from __future__ import annotations

from . import _checks
from ._binding import ffi, lib
from .backend import Backend
from .buffer import BufferType
from .errors import InvalidArgumentError, check


def cuda_available() -> bool:
    """True if CUDA was compiled in and a device is usable now."""
    return bool(lib.ferry_cuda_available())


def cuda_device_count() -> int:
    """CUDA devices ferry can use (0 when there is none, no driver, or no CUDA in this build)."""
    out = ffi.new("int *")
    check(lib.ferry_cuda_device_count(out))
    return int(out[0])


def cuda_buffer_type(device: int = 0) -> BufferType:
    """Device memory (cudaMalloc) of a device; one per device, never freed.

    Parameters
    ----------
    device : int, optional

    Returns
    -------
    BufferType

    Raises
    ------
    UnsupportedError, BackendError
        Without CUDA in this build, or without that device.
    """
    out = ffi.new("ferry_buffer_type **")
    check(lib.ferry_cuda_buffer_type(_checks.as_c_int(device, "cuda_buffer_type: device"), out))
    return BufferType(out[0])


def cuda_host_buffer_type() -> BufferType:
    """Pinned host memory (cudaMallocHost): host memory, so the CPU backend uses it too."""
    out = ffi.new("ferry_buffer_type **")
    check(lib.ferry_cuda_host_buffer_type(out))
    return BufferType(out[0])


class CUDABackend(Backend):
    """A backend with its own stream on a CUDA device; the parameters are __init__'s."""

    def __init__(self, device: int = 0) -> None:
        """A new backend on a CUDA device, with a stream of its own.

        Parameters
        ----------
        device : int, optional
            The CUDA device number (cuda_device_count() devices: 0, 1, ...).

        Raises
        ------
        InvalidArgumentError
            For a device that is not an integer, or not one of the devices found.
        UnsupportedError
            Without CUDA in this build.
        BackendError
            With CUDA's message when the device is not usable.
        """
        out = ffi.new("ferry_backend **")
        check(lib.ferry_cuda_backend_new(_checks.as_c_int(device, "CUDABackend: device"), out))
        super().__init__(out[0])

    @property
    def name(self) -> str:
        """CUDA<device>; a build against the test-only fake runtime says so, so that no figure
        from it passes for a GPU's."""
        base = super().name
        return base + " (fake CUDA runtime: host memory, timings mean nothing)" if lib.ferry_built_with_fake_cudart() \
            else base

    @property
    def device(self) -> int:
        """The CUDA device number."""
        out = ffi.new("int *")
        check(lib.ferry_cuda_backend_device(self._p, out))
        return int(out[0])

    def hold(self, microseconds: float) -> None:
        """Queue a wait on the device, at the end of the stream.

        A timing aid: work queued while the stream is held starts back to back, so events
        recorded around it time the device alone, not the host's submission of the work.

        Parameters
        ----------
        microseconds : float
            0 to 1e6.

        Raises
        ------
        InvalidArgumentError
            For anything but a number in that range.
        """
        if isinstance(microseconds, bool) or not isinstance(microseconds, (int, float)):
            raise InvalidArgumentError(f"hold: microseconds must be a number, got {type(microseconds).__name__}")
        check(lib.ferry_cuda_backend_hold(self._p, float(microseconds)))
