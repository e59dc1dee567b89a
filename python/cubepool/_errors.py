"""The exception tree of cubepool, rooted at :class:`CubepoolError`.

Every error that cubepool raises on purpose is a :class:`CubepoolError`; where Python
users expect a builtin family (a bad argument is a ``ValueError``) the class subclasses
that builtin too, so ``except ValueError`` keeps working.

The compiled module binds these classes as Rust types by name (``import_exception!`` in
``src/python/errors.rs``) and resolves every one when it is imported, so a class renamed
here without the binding fails the import loudly instead of a later raise.
"""

from __future__ import annotations

import os


class CubepoolError(Exception):
    """Root of every error cubepool raises on purpose."""


class PoolCapacityExceeded(CubepoolError):
    """Every pool that accepts the size is capped and full.

    Attributes: ``size`` (bytes asked for), ``capacity`` (bytes the accepting pools may
    hold together), ``in_use`` (bytes in use in them).
    """

    size: int
    capacity: int
    in_use: int


class BufferTooBig(CubepoolError):
    """No pool of the configuration accepts the size (attribute ``size``)."""

    size: int


class PoolConfigError(CubepoolError, ValueError):
    """A pool layout is invalid, or configuration text cannot be read.

    Attributes: ``kind`` (the CubeCL variant name, e.g. ``"SliceLargerThanPage"``, or a
    text problem: ``"Syntax"``, ``"UnknownField"``, ``"InvalidValue"``, ...), ``field``
    (the field at fault, or None), ``position`` (the character offset of the problem in
    configuration text, or None) and ``source`` (where configured text came from: the
    ``CUBEPOOL_MEMORY_POOLS`` variable or a ``cubepool.toml``, else None).
    """

    kind: str
    field: str | None
    position: int | None
    source: str | None


class InstallMemoryPoolsError(CubepoolError):
    """``install_pools`` refused to replace the dynamic pools.

    Attributes: ``kind`` (``"PoolsInUse"``) and ``bytes_in_use`` (the bytes of live
    reservations in the dynamic pools, after an explicit cleanup).
    """

    kind: str
    bytes_in_use: int


class NotFound(CubepoolError, LookupError):
    """A handle or binding names no live memory of this MemoryManagement."""


class OutOfMemory(CubepoolError, MemoryError):
    """The storage could not provide the bytes (attribute ``size``)."""

    size: int


class StorageError(CubepoolError, RuntimeError):
    """The storage cannot serve the pool: no virtual memory for a virtual pool, a
    granularity that does not divide the pool's granule, or a refused call."""


class DeviceUnavailable(StorageError):
    """A CUDA device was asked for but cannot be used: no NVIDIA driver (``libcuda.so.1``),
    a driver without CUDA 12's entry points, or no device of that ordinal. Raised only
    when a CUDA storage is asked for; nothing else needs a driver."""


class HandleReleased(CubepoolError, ValueError):
    """The handle was released with ``release()`` and can no longer be used."""


class InvalidArgument(CubepoolError, ValueError):
    """An argument is out of range (a negative size, an unknown mode, ...)."""


class TensorError(CubepoolError, ValueError):
    """A tensor rule was broken: shape, dtype, device, size, view bounds or alignment."""


class TensorFormatError(CubepoolError, ValueError):
    """A tensor or parameter-dict file is truncated, corrupted or hostile."""


class _LocatedFormatError(CubepoolError, ValueError):
    """A malformed input file, located by its path and line: the shared shape of
    :class:`TraceFormatError` and :class:`PlacementFormatError` (raised from Rust as
    ``Class(message, path, line)``).

    Attributes:
        message: what is wrong, naming the offending entry or field.
        path: the file, as a string, or ``None`` when the input was not a file.
        line: the 1-based line of the problem where the format has lines, else ``None``.
    """

    #: What ``str()`` names the input by when it was not a file.
    _unnamed = "<input>"

    message: str
    path: str | None
    line: int | None

    def __init__(
        self,
        message: str,
        path: str | os.PathLike[str] | None = None,
        line: int | None = None,
    ) -> None:
        path_str = None if path is None else os.fspath(path)
        # Keep every field in args so the exception survives pickling (process pools).
        super().__init__(message, path_str, line)
        self.message = message
        self.path = path_str
        self.line = line

    def __str__(self) -> str:
        where = self.path if self.path is not None else self._unnamed
        if self.line is not None:
            where = f"{where}:{self.line}"
        return f"{where}: {self.message}"


class TraceFormatError(_LocatedFormatError):
    """A trace file is malformed, truncated, hostile or of an unknown format.

    Attributes:
        message: what is wrong, naming the offending entry or field.
        path: the file, as a string, or ``None`` when the input was not a file.
        line: the 1-based line of the problem where the format has lines, else ``None``.
    """

    _unnamed = "<trace>"


class TraceSelectionError(CubepoolError, ValueError):
    """A device or stream choice does not fit the trace file (absent, or a choice is needed).

    Attributes:
        message: what is wrong.
        path: the file, as a string.
        available: the choices the file holds (device names such as ``"cuda:0"``, or streams).
    """

    message: str
    path: str | None
    available: tuple[str, ...]

    def __init__(
        self,
        message: str,
        path: str | os.PathLike[str] | None = None,
        available: tuple[str, ...] = (),
    ) -> None:
        path_str = None if path is None else os.fspath(path)
        super().__init__(message, path_str, available)
        self.message = message
        self.path = path_str
        self.available = available

    def __str__(self) -> str:
        where = self.path if self.path is not None else "<trace>"
        return f"{where}: {self.message}"


class PlacementFormatError(_LocatedFormatError):
    """A placement CSV file (MiniMalloc's, such as ``id,lower,upper,size``) is malformed.

    Attributes:
        message: what is wrong.
        path: the file, as a string, or ``None``.
        line: the 1-based line of the problem.
    """

    _unnamed = "<csv>"


class PlacementInfeasible(CubepoolError):
    """No placement of the buffers fits the capacity asked for.

    Attributes:
        capacity: the capacity asked for.
        best_height: the lowest height of a placement found.
        lower_bound: peak live bytes, which no placement beats.
        reason: ``"peak_live"`` (the peak live bytes exceed the capacity),
            ``"exhausted"`` (the exact search proved it) or ``"time_limit"`` (none was
            found in the time limit; one may exist).
    """

    capacity: int
    best_height: int
    lower_bound: int
    reason: str

    def __init__(
        self, message: str, capacity: int, best_height: int, lower_bound: int, reason: str
    ) -> None:
        super().__init__(message, capacity, best_height, lower_bound, reason)
        self.capacity = capacity
        self.best_height = best_height
        self.lower_bound = lower_bound
        self.reason = reason

    def __str__(self) -> str:
        return str(self.args[0])


__all__ = [
    "BufferTooBig",
    "CubepoolError",
    "HandleReleased",
    "InstallMemoryPoolsError",
    "InvalidArgument",
    "NotFound",
    "OutOfMemory",
    "PlacementFormatError",
    "PlacementInfeasible",
    "PoolCapacityExceeded",
    "PoolConfigError",
    "StorageError",
    "TensorError",
    "TensorFormatError",
    "TraceFormatError",
    "TraceSelectionError",
]
