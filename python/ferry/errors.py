"""Exceptions: FerryError and one subclass per C status, raised with the C message."""

from __future__ import annotations

from typing import Any, Dict, NoReturn, Optional, Type

from ._binding import ffi, lib

#: The FerryError subclass of each C status, filled as the subclasses are defined.
_BY_STATUS: Dict[int, Type["FerryError"]] = {}


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

    def __init_subclass__(cls, status: Optional[int] = None, **kwargs: Any) -> None:
        """A subclass given a C status is the one error_class raises for it."""
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
            _BY_STATUS[status] = cls

    def __init__(self, message: str, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class InvalidArgumentError(FerryError, status=lib.FERRY_ERR_INVALID_ARG):
    """A NULL, negative, non-integer or overflowing argument."""


class OutOfBoundsError(FerryError, status=lib.FERRY_ERR_OUT_OF_BOUNDS):
    """An offset or extent past the end of a tensor or buffer."""


class NotAllocatedError(FerryError, status=lib.FERRY_ERR_NOT_ALLOCATED):
    """A tensor with no memory behind it."""


class LayoutError(FerryError, status=lib.FERRY_ERR_LAYOUT):
    """Shapes or strides that do not match what is asked."""


class UnknownTypeError(FerryError, status=lib.FERRY_ERR_UNKNOWN_TYPE):
    """A type name or number ferry does not know."""


class FreedBufferError(FerryError, status=lib.FERRY_ERR_FREED):
    """Use of a buffer that was freed, or of a tensor placed in one."""


class OutOfMemoryError(FerryError, status=lib.FERRY_ERR_OUT_OF_MEMORY):
    """An allocation failed or exceeds the buffer type's max size."""


class UnsupportedError(FerryError, status=lib.FERRY_ERR_UNSUPPORTED):
    """The backend or buffer cannot do this."""


class BackendError(FerryError, status=lib.FERRY_ERR_BACKEND):
    """The backend's own failure, e.g. a CUDA error."""


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
