"""Logs of RMM's ``logging_resource_adaptor``.

CSV ``Thread,Time,Action,Pointer,Size,Stream`` with actions ``allocate`` and ``free``;
``allocate failure`` / ``free failure`` lines are skipped and counted. Lines keep their
order. A log without an ``allocate`` or ``free`` line (only its header, or only failed
operations) is refused, as an empty profiler trace or snapshot is.
"""

from __future__ import annotations

import csv
import datetime
import decimal
import io
import re
from collections.abc import Iterator
from typing import Final, Literal

from cubepool._errors import TraceFormatError
from cubepool.importers._values import U64, Issues, StrPath
from cubepool.importers.limits import Limits
from cubepool.importers.records import Parsed, Rec
from cubepool.importers.sniff import DECOMPRESS_ERRORS, decompressed

NS_PER_DAY: Final = 86_400 * 10**9
"""Nanoseconds in a day (a clock time of day wraps at midnight)."""
_CLOCK_RE: Final = re.compile(
    r"(?:(\d{4})-(\d{2})-(\d{2})[ T])?(\d{1,2}):(\d{2}):(\d{2})(?:[.,](\d{1,9})|:(\d{6}))?"
)
_NUMBER_RE: Final = re.compile(r"\d+(?:\.\d*)?|\.\d+")
# A Size cell: ASCII digits, no more than a 64-bit count has (str.isdigit also takes
# digits such as "²" that int() refuses).
_SIZE_RE: Final = re.compile(r"[0-9]{1,20}")


def _parse_rmm_time(text: str) -> tuple[int, bool] | None:
    """Return ``(ns, absolute)`` for a Time cell, or ``None`` when it is not a time.

    Accepted: a clock time ``HH:MM:SS[.fraction]`` (spdlog's ``%H:%M:%S.%f``, as RMM
    writes it since 21.06; ``HH:MM:SS:ffffff``, a colon and six digits of microseconds,
    as RMM 0.14 to 21.04 wrote it; not absolute, so a midnight wrap can be detected), a
    date and time ``YYYY-MM-DD HH:MM:SS[.fraction]``, or a plain number, taken as
    seconds.
    """
    text = text.strip()
    m = _CLOCK_RE.fullmatch(text)
    if m:
        year, month, day, hh, mm, ss, fraction, micros = m.groups()
        frac = fraction or micros
        h, mi, s = int(hh), int(mm), int(ss)
        if h > 23 or mi > 59 or s > 60:
            return None
        ns = ((h * 60 + mi) * 60 + s) * 10**9 + int((frac or "0").ljust(9, "0"))
        if year is None:
            return ns, False
        try:
            days = datetime.date(int(year), int(month), int(day)).toordinal()
        except ValueError:
            return None
        return days * NS_PER_DAY + ns, True
    if _NUMBER_RE.fullmatch(text) and len(text) <= 40:
        return int(decimal.Decimal(text).scaleb(9)), True
    return None


_NULL_POINTERS: Final = frozenset({"(nil)", "nil", "(null)", "null"})
"""How C libraries print a null ``%p``: glibc ``(nil)``, others ``(null)``. RMM logs
with printf's ``%p`` since 24.12, so ``allocate(0)``'s null result reads ``(nil)``."""


_HEX_RE: Final = re.compile(r"(?:0x)?([0-9a-f]{1,40})")
"""A Pointer or Stream cell in hex: ASCII hex digits only (``int(text, 16)`` also takes
a sign, ``_`` and spaces: ``0x-5`` read as the address -5, and a ``0x-`` of thousands of
digits as a number past Python's digit limit), at most 40 (leading zeros)."""

_DECIMAL_RE: Final = re.compile(r"[0-9]{1,40}")
"""A Pointer or Stream cell in decimal: ASCII digits only (``str.isdigit`` also takes
other scripts' digits, which ``int`` reads)."""


def _parse_pointer(text: str) -> int | None:
    """The address a Pointer cell names (hex with or without ``0x``, or decimal; a null
    pointer as C prints it is 0), or ``None`` when it names none: anything but ASCII
    digits, or a value past 64 bits.

    Negative values were taken (``0x-5``): all multiples of 2**61 - 1 hash alike in
    Python, so a log of such addresses made the pairing's dicts quadratic (20,000 lines
    in 12.6 s)."""
    text = text.strip().lower()
    if text in _NULL_POINTERS:
        return 0
    if _DECIMAL_RE.fullmatch(text):
        value = int(text)
    elif (digits := _HEX_RE.fullmatch(text)) is not None:
        value = int(digits[1], 16)
    else:
        return None
    return value if value < U64 else None


def _utf8_lines(f: io.BufferedIOBase, count: list[int], limits: Limits) -> Iterator[str]:
    """Decode ``f`` line by line, keeping in ``count[0]`` how many lines were decoded;
    past ``max_bytes`` of text, raise."""
    left = limits.max_bytes
    while True:
        # A line is read at most one byte past the bound, so no line costs more than it.
        raw = f.readline(-1 if left is None else left + 1)
        if not raw:
            return
        if left is not None:
            left -= len(raw)
            if left < 0:
                raise limits.too_large()
        text = raw.decode("utf-8-sig" if count[0] == 0 else "utf-8")
        count[0] += 1
        yield text


def parse_rmm(path: StrPath, issues: Issues, limits: Limits) -> Parsed:
    """The ``allocate`` and ``free`` lines of the log, streamed within ``limits``."""
    parsed = Parsed("rmm-csv", [], [None], time_note="RMM Time column converted to ns")
    origin: int | None = None
    day_offset = 0
    last_clock: int | None = None
    last_t = 0
    clamped = 0
    lines_read = [0]  # lines handed to the csv reader so far
    try:
        with decompressed(path) as f:
            reader = csv.reader(_utf8_lines(f, lines_read, limits))
            next(reader, None)  # the header, checked by detect_format
            for row in reader:
                line = reader.line_num
                if not row or all(not c.strip() for c in row):
                    continue
                limits.take()
                if len(row) < 6:
                    issues.bad(f"expected 6 columns, got {len(row)}", line)
                    continue
                action = row[2].strip().lower()
                stream = _parse_pointer(row[5])
                if stream is None:
                    issues.bad(f"Stream {row[5][:40]!r} is not a number", line)
                    continue
                parsed_time = _parse_rmm_time(row[1])
                if parsed_time is None:
                    issues.bad(f"Time {row[1][:40]!r} is not a time", line)
                    continue
                stamp, absolute = parsed_time
                if not absolute:
                    # A clock time of day: a jump back by over 12 h is taken as midnight.
                    if last_clock is not None and stamp + day_offset < last_clock - NS_PER_DAY // 2:
                        day_offset += NS_PER_DAY
                        issues.note(f"line {line}: clock passed midnight; one day added")
                    stamp += day_offset
                    last_clock = stamp
                if origin is None:
                    origin = stamp
                t = stamp - origin
                if t >= U64:
                    issues.bad(
                        f"Time {row[1][:40]!r} is 2^64 ns or more after the first line's", line
                    )
                    continue
                if t < last_t:
                    t = last_t
                    clamped += 1
                last_t = t
                if action in ("allocate failure", "free failure"):
                    parsed.add(Rec(t, "failed", 0, 0, None, stream), line)
                    continue
                if action not in ("allocate", "free"):
                    issues.bad(f"unknown Action {row[2][:40]!r}", line)
                    continue
                addr = _parse_pointer(row[3])
                if addr is None:
                    issues.bad(f"Pointer {row[3][:40]!r} is not an address", line)
                    continue
                size_text = row[4].strip()
                if not _SIZE_RE.fullmatch(size_text) or int(size_text) >= U64:
                    issues.bad(f"Size {row[4][:40]!r} is not a byte count", line)
                    continue
                size = int(size_text)
                if addr == 0 and size > 0:
                    # Only a zero-byte request gets (and gives back) a null pointer; a
                    # failed one is logged as a failure.
                    issues.bad(f"Pointer {row[3][:40]!r} is null for {size:,} bytes", line)
                    continue
                kind: Literal["alloc", "free", "zero"] = (
                    "zero" if size == 0 else "alloc" if action == "allocate" else "free"
                )
                parsed.add(Rec(t, kind, addr, size, None, stream), line)
    except DECOMPRESS_ERRORS as exc:
        raise TraceFormatError(f"corrupt or truncated gzip data: {exc}", path) from exc
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"not UTF-8 text: {exc.reason}", path, lines_read[0] + 1) from exc
    except csv.Error as exc:
        raise TraceFormatError(f"malformed CSV: {exc}", path, lines_read[0]) from exc
    parsed.clamped = clamped
    return parsed
