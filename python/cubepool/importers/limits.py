"""The bounds of an import: bytes read after decompression, and entries built."""

from __future__ import annotations

import os
from typing import Final

from cubepool._errors import InvalidArgument, TraceFormatError
from cubepool.importers._values import StrPath, describe

LARGEST_BOUND: Final = 999_999_999_999_999_999
"""The largest bound a variable may set (18 digits): below 2**63, so that a read of one
byte more than the bound is still a size the file objects take."""

ENVIRONMENT_ERRORS: list[str] = []
"""What is wrong with the bound variables, one message per variable, found when
cubepool was imported (see :func:`check_environment`)."""


def _limit_from_env(name: str, default: int) -> int:
    """The bound the environment variable ``name`` sets (a positive integer), else
    ``default``; read once, when cubepool is imported.

    A value that is no positive integer, or one past :data:`LARGEST_BOUND`, does not
    stop ``import cubepool``: the bound keeps ``default``, the problem goes in
    :data:`ENVIRONMENT_ERRORS`, and every import of a trace file refuses to run until it
    is fixed (:func:`check_environment`)."""
    raw = os.environ.get(name, "")
    text = raw.strip().replace("_", "")
    if not text:
        return default
    shown = raw if len(raw) <= 40 else raw[:40] + "..."
    unset = f"unset it for the default, {default:,}"
    # ASCII digits only (str.isdigit also takes "²", which int() refuses); a number too
    # long for the bound is told by its length (int() refuses more than 4,300 digits).
    digits = text.lstrip("0")
    if not (text.isascii() and text.isdigit()) or not digits:
        ENVIRONMENT_ERRORS.append(f"{name}={shown!r} is not a positive integer ({unset})")
        return default
    if len(digits) > len(str(LARGEST_BOUND)) or int(digits) > LARGEST_BOUND:
        ENVIRONMENT_ERRORS.append(
            f"{name}={shown!r} is too large: the bound is at most {LARGEST_BOUND:,} ({unset})"
        )
        return default
    return int(digits)


def check_environment() -> None:
    """Raise :class:`InvalidArgument` (one line, naming the variable) when a bound
    variable (``CUBEPOOL_MAX_IMPORT_BYTES``, ``CUBEPOOL_MAX_IMPORT_EVENTS``) holds no
    positive integer; called by every import of a trace file and by the command line."""
    if ENVIRONMENT_ERRORS:
        raise InvalidArgument("; ".join(ENVIRONMENT_ERRORS))


MAX_DOCUMENT_BYTES_ENV: Final = "CUBEPOOL_MAX_IMPORT_BYTES"
"""The environment variable that sets :data:`MAX_DOCUMENT_BYTES` (read at import)."""
MAX_EVENTS_ENV: Final = "CUBEPOOL_MAX_IMPORT_EVENTS"
"""The environment variable that sets :data:`MAX_EVENTS` (read at import)."""

MAX_DOCUMENT_BYTES: Final = _limit_from_env(MAX_DOCUMENT_BYTES_ENV, 1 << 30)
"""Default bound on what an import reads, after decompression: 1 GiB unless the
``CUBEPOOL_MAX_IMPORT_BYTES`` environment variable says otherwise.

Profiler JSON and snapshot pickles are materialised whole, and gzip can expand a small
file a thousandfold; RMM logs are counted as they stream. Past the bound the import
stops with a :class:`TraceFormatError` naming the file, the bound and how to raise it.
``max_bytes=None`` lifts it.
"""

MAX_EVENTS: Final = _limit_from_env(MAX_EVENTS_ENV, 4_000_000)
"""Default bound on the entries an import builds: 4,000,000 unless the
``CUBEPOOL_MAX_IMPORT_EVENTS`` environment variable says otherwise.

It counts what the file makes cubepool build, not what the file weighs: the allocation,
free and other entries read (measured at peak while importing, the document held whole:
about 300 bytes each from an RMM log, 0.8-1.1 KB from a snapshot pickle with frames,
so 4,000,000 of them take 3-4.5 GB; measured on generated files of 1-3 million), the JSON
objects kept from a profiler trace (two per memory event: the event and its ``args``),
and a snapshot's entries with every shared reference counted; a snapshot's pickle may
also build no more than 16 objects for each entry it allows (and never fewer than
65,536), counted as it is unpickled (:data:`cubepool._pickle.OBJECTS_PER_ENTRY`). A
snapshot whose pickle names one entry or one device trace twice is refused outright
(PyTorch never writes one; it is how a few kilobytes would otherwise make millions of
entries). Past the bound the import stops with a :class:`TraceFormatError` naming the
file, the bound and how to raise it. ``max_events=None`` lifts it.
"""


class Limits:
    """The bounds of one import: bytes read after decompression, and entries built."""

    def __init__(self, path: StrPath, max_bytes: int | None, max_events: int | None) -> None:
        check_environment()
        for name, value in (("max_bytes", max_bytes), ("max_events", max_events)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{name} must be an int or None, got {describe(value)}")
            if value is not None and value <= 0:
                raise InvalidArgument(
                    f"{name} must be positive (None lifts the bound), got {value}"
                )
        self.path = path
        self.max_bytes = max_bytes
        self.max_events = max_events
        self.events = 0

    def too_large(self) -> TraceFormatError:
        """The error for a document past ``max_bytes``."""
        return TraceFormatError(
            f"the document is larger than max_bytes={self.max_bytes:,} bytes after "
            f"decompression; raise the bound with max_bytes=N (None lifts it) or the "
            f"{MAX_DOCUMENT_BYTES_ENV} environment variable",
            self.path,
        )

    def too_many(self, what: str = "entries") -> TraceFormatError:
        """The error for an import past ``max_events``."""
        return TraceFormatError(
            f"the file holds more than max_events={self.max_events:,} {what}; raise the "
            f"bound with max_events=N (None lifts it) or the {MAX_EVENTS_ENV} environment "
            "variable",
            self.path,
        )

    def take(self, count: int = 1) -> None:
        """Count ``count`` more entries built; raise past ``max_events``."""
        self.events += count
        if self.max_events is not None and self.events > self.max_events:
            raise self.too_many()

    def out_of_memory(self) -> TraceFormatError:
        """The error for an import that exhausted memory within its bounds."""
        return TraceFormatError(
            f"ran out of memory importing the file (within max_bytes={self.max_bytes} and "
            f"max_events={self.max_events}); lower the bounds with max_bytes=/max_events= or "
            f"{MAX_DOCUMENT_BYTES_ENV}/{MAX_EVENTS_ENV} to have such files refused early",
            self.path,
        )
