"""The exception tree of cubepool, rooted at :class:`CubepoolError`.

The compiled core raises these classes by name; where Python users expect a builtin,
the class subclasses it too (bad arguments are also ``ValueError``, lookups
``LookupError``, exhausted memory ``MemoryError``).
"""

from __future__ import annotations


class CubepoolError(Exception):
    """The root of every error cubepool raises."""


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
    """A pool layout is invalid.

    Attributes: ``kind`` (the CubeCL variant name, e.g. ``"SliceLargerThanPage"``),
    ``field`` (the field at fault, or None) and ``position`` (the character offset in
    configuration text, or None).
    """

    kind: str
    field: str | None
    position: int | None


class NotFound(CubepoolError, LookupError):
    """A handle or binding names no live memory of this MemoryManagement."""


class OutOfMemory(CubepoolError, MemoryError):
    """The storage could not provide the bytes (attribute ``size``)."""

    size: int


class HandleReleased(CubepoolError, ValueError):
    """The handle was released with ``release()`` and can no longer be used."""


class InvalidArgument(CubepoolError, ValueError):
    """An argument is out of range (a negative size, an unknown mode, ...)."""


class TraceFormatError(CubepoolError, ValueError):
    """A trace file is malformed.

    Attributes: ``path`` (the file, or None) and ``line`` (the 1-based line number, or
    None when the problem is not tied to a line).
    """

    path: str | None
    line: int | None


__all__ = [
    "BufferTooBig",
    "CubepoolError",
    "HandleReleased",
    "InvalidArgument",
    "NotFound",
    "OutOfMemory",
    "PoolCapacityExceeded",
    "PoolConfigError",
    "TraceFormatError",
]
