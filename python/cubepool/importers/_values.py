"""The checks every importer applies to the values it reads, written once."""

from __future__ import annotations

import os
import reprlib
from typing import Final, TypeGuard

from cubepool._errors import TraceFormatError

StrPath = str | os.PathLike[str]
"""A file's path."""

U64: Final = 1 << 64
"""One past the largest 64-bit unsigned value (sizes, addresses)."""
I64_MIN: Final = -(1 << 63)
"""The smallest 64-bit signed value (ids a format may write negative)."""
TIME_BOUND: Final = 2.0**53
"""Times in microseconds (profiler ``ts``, snapshot ``time_us``) of this magnitude or more
are refused: any two usable times are then under 2^54 us apart, which in ns still fits a
64-bit clock (and up to here a float holds every whole microsecond)."""
MAX_NOTES: Final = 20
"""The most notes an import keeps about skipped entries."""


_SHOWN_BITS: Final = 128
"""Integers of more bits than this are shown by their size, not their digits."""


def show_int(value: int) -> str:
    """An int for a message: its digits, or for a huge one its size in bits (writing
    out an untrusted int of any size is quadratic, and refused past 4,300 digits)."""
    if value.bit_length() <= _SHOWN_BITS:
        return str(value)
    return f"<{'-' if value < 0 else ''}int of {value.bit_length():,} bits>"


class _ShortRepr(reprlib.Repr):
    """``reprlib``'s bounded repr (nesting, items and text cut short), with ints and
    bytes bounded too: a value read from a file may be nested thousands deep, hold a
    huge int or weigh megabytes, and its repr must cost little whatever it is."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = self.maxdict = 4
        self.maxstring = self.maxother = 40

    def repr_int(self, x: int, level: int) -> str:
        return show_int(x)

    def repr_bytes(self, x: bytes, level: int) -> str:
        text = repr(x[: self.maxstring])
        return text if len(x) <= self.maxstring else f"{text}..."

    repr_bytearray = repr_bytes


_SHORT_REPR: Final = _ShortRepr()


def show(value: object) -> str:
    """A short repr of ``value`` for messages, bounded whatever the value: nesting,
    items, text and the digits of ints are cut short."""
    return _SHORT_REPR.repr(value)


def describe(value: object) -> str:
    """A value's type and a short repr (:func:`show`), for messages."""
    text = show(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def is_time(value: object) -> TypeGuard[int | float]:
    """Whether ``value`` is a usable time: an int or float (not a bool) of magnitude
    below :data:`TIME_BOUND` (so not NaN or infinite; an int of any size compares
    exactly, never converted to a float)."""
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and abs(value) < TIME_BOUND
    )


def optional_int(value: object) -> int | None:
    """``value`` where it is an int (not a bool) in the 64-bit range, else ``None``: how
    the optional fields an importer passes over when odd (a stream, a frame's line) are
    read, so that no int of unbounded size is kept or written out."""
    return value if type(value) is int and I64_MIN <= value < U64 else None


class Issues:
    """Collects malformed entries: raises in strict mode, counts and notes otherwise."""

    def __init__(self, path: StrPath, strict: bool) -> None:
        self.path = path
        self.strict = strict
        self.malformed = 0
        self.notes: list[str] = []
        self.notes_left_out = 0

    def note(self, text: str) -> None:
        """Keep ``text`` among the first :data:`MAX_NOTES` notes (count the rest)."""
        if len(self.notes) < MAX_NOTES:
            self.notes.append(text)
        else:
            self.notes_left_out += 1

    def bad(self, message: str, line: int | None = None) -> None:
        """A malformed entry: raise when strict, else count and note it."""
        if self.strict:
            raise TraceFormatError(
                f"{message} (pass strict=False to skip and count malformed entries)",
                self.path,
                line,
            )
        self.malformed += 1
        self.note(f"skipped: {message}" if line is None else f"skipped line {line}: {message}")

    def all_notes(self) -> list[str]:
        """The notes kept, and how many were left out."""
        if self.notes_left_out:
            return [*self.notes, f"({self.notes_left_out} further notes left out)"]
        return list(self.notes)

    def get_int(self, obj: dict[object, object], key: str, where: str) -> int | None:
        """``obj[key]`` as a 64-bit int, or ``None`` after reporting why not."""
        value = obj.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            if key not in obj:
                self.bad(f"{where}: missing {key!r}")
            else:
                self.bad(f"{where}: {key!r} must be an integer, got {describe(value)}")
            return None
        if not I64_MIN <= value < U64:
            self.bad(f"{where}: {key!r} = {show_int(value)} is outside the 64-bit range")
            return None
        return value

    def get_time(self, obj: dict[object, object], key: str, where: str) -> float | None:
        """``obj[key]`` as a usable time (:func:`is_time`), or ``None`` after reporting
        why not."""
        value = obj.get(key)
        if is_time(value):
            return value
        if key not in obj:
            self.bad(f"{where}: missing {key!r}")
        elif isinstance(value, bool) or not isinstance(value, int | float):
            self.bad(f"{where}: {key!r} must be a number, got {describe(value)}")
        else:
            self.bad(f"{where}: {key!r} = {show(value)} is not a usable time")
        return None
