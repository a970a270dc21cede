"""Exceptions: FerryError and one subclass per C status, raised with the C message."""

from __future__ import annotations

from typing import Dict, NoReturn, Optional, Type

from ._binding import ffi, lib


class FerryError(Exception):
    """A ferry call failed.

    Parameters
    ----------
    message : str
        The C message (or Python's, for a check made before C).
    status : int, optional
        The C ferry_status; default: the class's.

    Attributes
    ----------
    status : int
        The C ferry_status.
    message : str
    """

    status: int = -1

    def __init__(self, message: str, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class InvalidArgumentError(FerryError):
    """A NULL, negative, non-integer or overflowing argument (FERRY_ERR_INVALID_ARG)."""

    status = lib.FERRY_ERR_INVALID_ARG


class OutOfBoundsError(FerryError):
    """An offset or extent past the end of a tensor or buffer (FERRY_ERR_OUT_OF_BOUNDS)."""

    status = lib.FERRY_ERR_OUT_OF_BOUNDS


class NotAllocatedError(FerryError):
    """A tensor with no memory behind it (FERRY_ERR_NOT_ALLOCATED)."""

    status = lib.FERRY_ERR_NOT_ALLOCATED


class LayoutError(FerryError):
    """Shapes or strides that do not match what is asked (FERRY_ERR_LAYOUT)."""

    status = lib.FERRY_ERR_LAYOUT


class UnknownTypeError(FerryError):
    """A type name or number ferry does not know (FERRY_ERR_UNKNOWN_TYPE)."""

    status = lib.FERRY_ERR_UNKNOWN_TYPE


class FreedBufferError(FerryError):
    """Use of a buffer that was freed, or of a tensor placed in one (FERRY_ERR_FREED)."""

    status = lib.FERRY_ERR_FREED


class OutOfMemoryError(FerryError):
    """An allocation failed or exceeds the buffer type's max size (FERRY_ERR_OUT_OF_MEMORY)."""

    status = lib.FERRY_ERR_OUT_OF_MEMORY


class UnsupportedError(FerryError):
    """The backend or buffer cannot do this (FERRY_ERR_UNSUPPORTED)."""

    status = lib.FERRY_ERR_UNSUPPORTED


class BackendError(FerryError):
    """The backend's own failure, e.g. a CUDA error (FERRY_ERR_BACKEND)."""

    status = lib.FERRY_ERR_BACKEND


_BY_STATUS: Dict[int, Type[FerryError]] = {
    cls.status: cls
    for cls in (InvalidArgumentError, OutOfBoundsError, NotAllocatedError, LayoutError, UnknownTypeError,
                FreedBufferError, OutOfMemoryError, UnsupportedError, BackendError)
}


def error_class(status: int) -> Type[FerryError]:
    """The FerryError subclass for a C status (FerryError itself for one this binding does not know)."""
    return _BY_STATUS.get(int(status), FerryError)


def last_error() -> str:
    """The C message of the last failure on this thread ("" if none)."""
    return ffi.string(lib.ferry_last_error()).decode("utf-8", "replace")


def raise_status(status: int) -> NoReturn:
    """Raise the FerryError subclass for the failed C status, with the message C left for it."""
    message = last_error() or ffi.string(lib.ferry_status_name(status)).decode()
    raise error_class(status)(message, int(status))


def check(status: int) -> None:
    """Raise the FerryError subclass for status if a C call returned one that is not FERRY_OK."""
    if status != lib.FERRY_OK:
        raise_status(status)


def raise_last() -> NoReturn:
    """Raise for a C call that signals failure by its return value (NULL, 0) rather than a status."""
    raise_status(lib.ferry_last_status())
