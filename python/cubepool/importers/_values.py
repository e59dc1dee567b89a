"""The checks every importer applies to the values it reads, written once."""

from __future__ import annotations

import math
import os
from typing import Final, TypeGuard

from cubepool._errors import TraceFormatError

StrPath = str | os.PathLike[str]
"""A file's path."""

U64: Final = 1 << 64
"""One past the largest 64-bit unsigned value (sizes, addresses)."""
I64_MIN: Final = -(1 << 63)
"""The smallest 64-bit signed value (ids a format may write negative)."""
TIME_BOUND: Final = 2.0**62
"""Times (in the source's unit) at or past this are refused: converted to ns and made
relative, they would no longer fit a 64-bit clock."""
MAX_NOTES: Final = 20
"""The most notes an import keeps about skipped entries."""


def describe(value: object) -> str:
    """A value's type and a short repr, for messages."""
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def is_time(value: object) -> TypeGuard[int | float]:
    """Whether ``value`` is a usable time: an int or float (not a bool), finite, of
    magnitude below :data:`TIME_BOUND`."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and abs(value) < TIME_BOUND
    )


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
            self.bad(f"{where}: {key!r} = {value} is outside the 64-bit range")
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
            self.bad(f"{where}: {key!r} = {value} is not a usable time")
        return None
