"""Import allocation traces recorded by other tools, and write them as cubepool trace v1.

Three foreign formats are read, each possibly gzip-compressed (detected by content):

``torch-profiler``
    Chrome traces written by ``torch.profiler`` with ``profile_memory=True``
    (``export_chrome_trace``): the ``"[memory]"`` instant events of ``traceEvents``.
    ``args.Bytes`` > 0 is an allocation at ``args.Addr``, < 0 the free of the allocation
    live at that address. Events are ordered by ``ts`` (microseconds; stable for ties).
    ``ProfilerStep#N`` spans, when present, become the header's ``phases``.
``torch-snapshot``
    Pickles written by ``torch.cuda.memory._dump_snapshot``: the ``alloc`` and
    ``free_completed`` entries of ``device_traces`` (one list per CUDA device), read with a
    restricted unpickler that never builds anything but plain containers and scalars.
``rmm-csv``
    Logs of RMM's ``logging_resource_adaptor``: CSV ``Thread,Time,Action,Pointer,Size,Stream``
    with actions ``allocate`` and ``free``; ``allocate failure`` / ``free failure`` lines are
    skipped and counted. Lines keep their order.

The rules shared by all importers, so that nothing is guessed silently:

* A free pairs with the allocation live at the same address (on the same device). A free
  with no live allocation there is dropped and counted (``unmatched_frees``, with its bytes).
* An allocation at an address that is already live is counted (``duplicate_allocs``) and
  treated as the implicit free of the old allocation: a free event for the old id is
  emitted just before the new allocation, at the same time.
* Allocations still live at the end are kept with no free event (never freed, as in the
  v1 format) and counted (``live_at_end``).
* Entries of size 0 are neither allocations nor frees of any memory: skipped, counted.
* Malformed entries raise :class:`TraceFormatError` (``strict=True``, the default) or are
  skipped and counted (``strict=False``), with the first few reasons kept in ``notes``.
  A malformed file as a whole (bad gzip, bad JSON, a refused pickle, wrong top-level types)
  always raises :class:`TraceFormatError`.
* Time ``t`` is in integer nanoseconds since the first timestamped entry of the file; every
  device and stream of one file shares that origin. Where a format keeps file order (RMM,
  snapshots) a timestamp earlier than its predecessor's is raised to it and counted
  (``clamped_times``), so events stay in time order.
"""

from __future__ import annotations

import bisect
import contextlib
import csv
import datetime
import decimal
import gzip
import io
import json
import math
import os
import re
import tempfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, NamedTuple

from cubepool._errors import TraceFormatError, TraceSelectionError
from cubepool._pickle import restricted_loads

__all__ = [
    "FORMATS",
    "MAX_DOCUMENT_BYTES",
    "MAX_EVENTS",
    "DeviceInfo",
    "Event",
    "ImportReport",
    "ImportedTrace",
    "detect_format",
    "import_trace",
    "list_devices",
    "write_trace_v1",
]

StrPath = str | os.PathLike[str]
Format = Literal["cubepool", "torch-profiler", "torch-snapshot", "rmm-csv"]
Event = tuple[int, str, int, int]
"""One event: ``(t_ns, op, id, size)`` with op ``"alloc"`` or ``"free"`` (size 0 for frees)."""

FORMATS: Final[tuple[Format, ...]] = ("cubepool", "torch-profiler", "torch-snapshot", "rmm-csv")


def _limit_from_env(name: str, default: int) -> int:
    """The bound the environment variable ``name`` sets (a positive integer), else
    ``default``; read once, when cubepool is imported."""
    text = os.environ.get(name, "").strip().replace("_", "")
    if not text:
        return default
    if not text.isdigit() or int(text) <= 0:
        raise ValueError(
            f"{name}={os.environ[name][:40]!r} is not a positive integer (unset it for the "
            f"default, {default:,})"
        )
    return int(text)


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
free and other entries read (about 250 bytes of memory each while importing), the JSON
objects kept from a profiler trace (two per memory event: the event and its ``args``),
and a snapshot's entries with every shared reference counted. A snapshot whose pickle
names one entry or one device trace twice is refused outright (PyTorch never writes
one; it is how a few kilobytes would otherwise make millions of entries). Past the bound
the import stops with a :class:`TraceFormatError` naming the file, the bound and how to
raise it. ``max_events=None`` lifts it.
"""

_GZIP_MAGIC: Final = b"\x1f\x8b"
_SNIFF_BYTES: Final = 1 << 20
_MAX_NOTES: Final = 20
_U64: Final = 1 << 64
_I64_MIN: Final = -(1 << 63)
_NS_PER_DAY: Final = 86_400 * 10**9
_RMM_HEADER: Final = ["thread", "time", "action", "pointer", "size", "stream"]
_SNAPSHOT_IGNORED: Final = frozenset(
    {
        "free_requested",
        "segment_alloc",
        "segment_free",
        "segment_map",
        "segment_unmap",
        "oom",
        "snapshot",
    }
)
# c10::DeviceType values as the profiler writes them in "Device Type".
_DEVICE_TYPES: Final = {0: "cpu", 1: "cuda", 6: "hip", 9: "xla", 12: "xpu", 13: "mps"}
_DECOMPRESS_ERRORS: Final = (gzip.BadGzipFile, EOFError, zlib.error)
# The args of a profiler [memory] event the importer reads.
_PROFILER_ARGS: Final = ("Addr", "Bytes", "Device Type", "Device Id")
# What the profiler's JSON hook returns for an object it does not keep.
_DISCARDED: Final[dict[str, object]] = {}


# --------------------------------------------------------------------------- public types


@dataclass(frozen=True)
class ImportReport:
    """What an import dropped, kept specially, or skipped, and why.

    Counts of malformed entries and of clamped times cover the whole file; every other
    count covers the device and stream that were imported.
    """

    unmatched_frees: int = 0
    """Frees with no live allocation at their address (dropped)."""
    unmatched_free_bytes: int = 0
    """Bytes those frees named (every supported format records a free's size)."""
    live_at_end: int = 0
    """Allocations never freed; kept as never-freed allocations, as in the v1 format."""
    live_at_end_bytes: int = 0
    """Bytes of those allocations."""
    duplicate_allocs: int = 0
    """Allocations at an address already live; the old allocation was freed implicitly."""
    duplicate_alloc_bytes: int = 0
    """Bytes of the old allocations so freed."""
    size_mismatches: int = 0
    """Frees whose size differs from their allocation's (paired by address anyway)."""
    zero_size: int = 0
    """Entries of 0 bytes (skipped: they allocate and free nothing)."""
    failed: int = 0
    """Failed operations the source logged (RMM ``allocate failure``/``free failure``)."""
    ignored: int = 0
    """Entries that are not allocations or frees of blocks (snapshot ``free_requested``,
    ``segment_*``, ``oom``, ... and unknown actions); skipped by design."""
    filtered: int = 0
    """Allocations and frees of the devices or streams that were not selected."""
    malformed: int = 0
    """Malformed entries skipped (only with ``strict=False``)."""
    clamped_times: int = 0
    """Timestamps earlier than the previous event's, raised to it to keep time order."""
    notes: tuple[str, ...] = ()
    """Human-readable details: reasons for skipped entries (the first few), caveats."""

    def to_dict(self) -> dict[str, object]:
        """Return the report as a JSON-ready dict (notes as a list)."""
        out: dict[str, object] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = list(value) if isinstance(value, tuple) else value
        return out

    def summary(self) -> str:
        """Return a one-line, human-readable account of the non-zero counts."""
        parts: list[str] = []
        if self.unmatched_frees:
            parts.append(
                f"dropped {self.unmatched_frees} frees without a live allocation "
                f"({self.unmatched_free_bytes} B)"
            )
        if self.live_at_end:
            parts.append(
                f"kept {self.live_at_end} allocations live at the end as never freed "
                f"({self.live_at_end_bytes} B)"
            )
        if self.duplicate_allocs:
            parts.append(
                f"{self.duplicate_allocs} allocations at an already live address, each "
                f"taken as the implicit free of the old one ({self.duplicate_alloc_bytes} B)"
            )
        simple = (
            (self.size_mismatches, "frees whose size differs from their allocation's"),
            (self.zero_size, "zero-byte entries skipped"),
            (self.failed, "failed operations skipped"),
            (self.ignored, "non-block entries ignored"),
            (self.filtered, "entries of other devices or streams left out"),
            (self.malformed, "malformed entries skipped"),
            (self.clamped_times, "out-of-order timestamps raised to their predecessor's"),
        )
        parts.extend(f"{count} {what}" for count, what in simple if count)
        return "; ".join(parts) if parts else "nothing dropped"


@dataclass(frozen=True)
class ImportedTrace:
    """An allocation trace converted to the cubepool trace v1 model.

    Attributes:
        header: the v1 header fields (``format``, ``version``, ``workload``, ``source``,
            ``model``, ``notes`` and, where known, ``phases``).
        events: ``(t_ns, op, id, size)`` in time order; op is ``"alloc"`` or ``"free"``,
            size is 0 for frees, ids are dense from 0 in allocation order.
        dropped: what the import dropped or kept specially, and why.
    """

    header: dict[str, object]
    events: list[Event]
    dropped: ImportReport = field(default_factory=ImportReport)


@dataclass(frozen=True)
class DeviceInfo:
    """One device of a trace file, as :func:`list_devices` reports it.

    Attributes:
        device: ``"cpu"``, ``"cuda:0"``, ...; ``None`` where the format records no device
            (RMM logs).
        streams: the streams seen on it, sorted; empty where the format records none
            (profiler traces).
        allocs: allocation entries on it.
        frees: free entries on it.
    """

    device: str | None
    streams: tuple[int, ...]
    allocs: int
    frees: int


# --------------------------------------------------------------------------- public API


def detect_format(path: StrPath) -> Format:
    """Tell the format of a trace file from its content, not its name.

    Gzip is seen through by its magic bytes. A pickle (protocol 2-5) is a PyTorch memory
    snapshot; JSON whose first line is a header with ``"format": "cubepool-trace"`` is
    cubepool trace v1; JSON with a ``"traceEvents"`` key (or a top-level array, the other
    chrome trace form) is a profiler trace; CSV with the header
    ``Thread,Time,Action,Pointer,Size,Stream`` is an RMM log.

    Args:
        path: the file.

    Returns:
        One of ``"cubepool"``, ``"torch-profiler"``, ``"torch-snapshot"``, ``"rmm-csv"``.

    Raises:
        TraceFormatError: the file is empty, corrupt gzip, or of no known format.
        OSError: the file cannot be read.
    """
    try:
        with _decompressed(path) as f:
            prefix = f.read(_SNIFF_BYTES)
            complete = len(prefix) < _SNIFF_BYTES or not f.read(1)
    except _DECOMPRESS_ERRORS as exc:
        raise TraceFormatError(f"corrupt or truncated gzip data: {exc}", path) from exc
    return _sniff(prefix, complete, path)


def list_devices(
    path: StrPath,
    *,
    max_bytes: int | None = MAX_DOCUMENT_BYTES,
    max_events: int | None = MAX_EVENTS,
) -> list[DeviceInfo]:
    """List the devices and streams a foreign trace file holds allocations for.

    Malformed entries are passed over here (they neither name a device nor stop the
    listing); :func:`import_trace` reports them.

    Args:
        path: a profiler trace, memory snapshot or RMM log.
        max_bytes: see :data:`MAX_DOCUMENT_BYTES`.
        max_events: see :data:`MAX_EVENTS`.

    Returns:
        One :class:`DeviceInfo` per device (CPU first, then by name and index); for a
        snapshot every device slot is listed, even one without entries.

    Raises:
        TraceFormatError: the file is malformed, or is already a cubepool trace v1.
    """
    parsed = _parse(path, strict=False, limits=_Limits(path, max_bytes, max_events))
    return [_device_info(parsed, name) for name in parsed.devices]


def import_trace(
    path: StrPath,
    *,
    device: str | int | None = None,
    stream: int | None = None,
    strict: bool = True,
    max_bytes: int | None = MAX_DOCUMENT_BYTES,
    max_events: int | None = MAX_EVENTS,
) -> ImportedTrace:
    """Import a PyTorch profiler trace, PyTorch memory snapshot or RMM log.

    Args:
        path: the file; its format is found by :func:`detect_format`.
        device: which device to import: ``"cpu"``, ``"cuda:0"``, ... (an int ``n`` means
            ``"cuda:n"``). ``None`` picks the only device with allocations and raises
            :class:`TraceSelectionError` listing them when there are several. RMM logs
            record no device: leave it ``None``.
        stream: import only this stream (snapshots, RMM logs); ``None`` takes them all.
        strict: raise on the first malformed entry (``True``) or skip and count such
            entries in ``dropped.malformed`` (``False``).
        max_bytes: see :data:`MAX_DOCUMENT_BYTES`.
        max_events: see :data:`MAX_EVENTS`.

    Returns:
        The trace, with ``dropped`` saying what was left out or kept specially.

    Raises:
        TraceFormatError: the file or an entry is malformed, the pickle is refused, the
            file holds no memory events at all, it is past ``max_bytes`` or
            ``max_events``, or it is already a cubepool trace v1 (read that with
            cubepool's own loader).
        TraceSelectionError: the device or stream choice does not fit the file.
        OSError: the file cannot be read.
    """
    limits = _Limits(path, max_bytes, max_events)
    parsed = _parse(path, strict=strict, limits=limits)
    chosen = _choose_device(parsed, device, path)
    if stream is not None:
        _check_stream(parsed, chosen, stream, path)
    try:
        return _build(parsed, chosen, stream, path)
    except MemoryError as exc:
        raise limits.out_of_memory() from exc


def write_trace_v1(trace: ImportedTrace, path: StrPath) -> None:
    """Write ``trace`` as cubepool trace v1 JSON Lines (gzip when ``path`` ends in ``.gz``).

    The header line comes first with ``format`` ``"cubepool-trace"`` and ``version`` 1
    (whatever the trace's header says), then the other header fields in their order, then
    one line per event. Each event is checked (time order, dense ids, frees of live ids) as
    it is written into a temporary file, which replaces ``path`` only when all is well, so
    no invalid or partial file is ever left.

    Args:
        trace: the trace to write.
        path: the destination.

    Raises:
        TraceFormatError: the trace's events or header are not valid trace v1.
        OSError: the file cannot be written.
    """
    header_line = _header_line(trace.header, path)
    dest = Path(path)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    try:
        # Lines are checked as they are written; a bad event removes the temporary file.
        with os.fdopen(fd, "wb") as raw:
            if dest.name.endswith(".gz"):
                with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                    gz.write(header_line)
                    gz.writelines(_event_lines(trace.events, path))
            else:
                raw.write(header_line)
                raw.writelines(_event_lines(trace.events, path))
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# --------------------------------------------------------------------------- reading


@contextlib.contextmanager
def _decompressed(path: StrPath) -> Iterator[io.BufferedIOBase]:
    with open(path, "rb") as raw:
        magic = raw.read(2)
        raw.seek(0)
        if magic == _GZIP_MAGIC:
            with gzip.GzipFile(fileobj=raw, mode="rb") as gz:
                yield gz
        else:
            yield raw


class _Limits:
    """The bounds of one import: bytes read after decompression, and entries built."""

    def __init__(self, path: StrPath, max_bytes: int | None, max_events: int | None) -> None:
        for name, value in (("max_bytes", max_bytes), ("max_events", max_events)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{name} must be an int or None, got {_describe(value)}")
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive (None lifts the bound), got {value}")
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


def _read_document(path: StrPath, limits: _Limits) -> bytes:
    max_bytes = limits.max_bytes
    try:
        with _decompressed(path) as f:
            data = f.read() if max_bytes is None else f.read(max_bytes + 1)
    except _DECOMPRESS_ERRORS as exc:
        raise TraceFormatError(f"corrupt or truncated gzip data: {exc}", path) from exc
    if max_bytes is not None and len(data) > max_bytes:
        raise limits.too_large()
    return data


def _sniff(prefix: bytes, complete: bool, path: StrPath) -> Format:
    if not prefix:
        raise TraceFormatError("empty file", path)
    if prefix[0] == 0x80 and len(prefix) >= 2 and 2 <= prefix[1] <= 5:
        return "torch-snapshot"
    text = prefix.removeprefix(b"\xef\xbb\xbf").lstrip()
    if text[:1] in (b"{", b"["):
        first_line, newline, _ = text.partition(b"\n")
        if newline or complete:
            try:
                head = json.loads(first_line)
            except (ValueError, RecursionError):
                head = None
            if isinstance(head, dict):
                if head.get("format") == "cubepool-trace":
                    return "cubepool"
                if "traceEvents" in head:
                    return "torch-profiler"
        if text[:1] == b"[" or re.search(rb'"traceEvents"\s*:', text):
            return "torch-profiler"
        raise TraceFormatError(
            "JSON that is neither cubepool trace v1 (a first-line header with "
            '"format": "cubepool-trace") nor a chrome trace (no "traceEvents" key '
            "in the first MiB)",
            path,
        )
    first = text.partition(b"\n")[0].decode("utf-8", "replace")
    if [c.strip().lower() for c in first.split(",")][:6] == _RMM_HEADER:
        return "rmm-csv"
    raise TraceFormatError(
        "unknown trace format: expected cubepool trace v1 (JSON Lines), a PyTorch profiler "
        "chrome trace (JSON), a PyTorch CUDA memory snapshot (pickle) or an RMM log (CSV "
        "with the header Thread,Time,Action,Pointer,Size,Stream), optionally gzip-compressed",
        path,
    )


class _Rec(NamedTuple):
    t: int
    kind: Literal["alloc", "free", "zero", "failed", "ignored"]
    addr: int
    size: int
    device: str | None
    stream: int | None


def _is_block(rec: _Rec, device: str | None) -> bool:
    return rec.device == device and rec.kind in ("alloc", "free")


def _device_info(parsed: _Parsed, device: str | None) -> DeviceInfo:
    streams = {r.stream for r in parsed.records if _is_block(r, device) and r.stream is not None}
    return DeviceInfo(
        device=device,
        streams=tuple(sorted(streams)),
        allocs=sum(1 for r in parsed.records if r.device == device and r.kind == "alloc"),
        frees=sum(1 for r in parsed.records if r.device == device and r.kind == "free"),
    )


@dataclass
class _Parsed:
    fmt: Format
    records: list[_Rec]
    devices: list[str | None]
    phases: list[tuple[str, int]] = field(default_factory=list)
    time_note: str = ""
    malformed: int = 0
    clamped: int = 0
    notes: list[str] = field(default_factory=list)


class _Issues:
    """Collects malformed entries: raises in strict mode, counts and notes otherwise."""

    def __init__(self, path: StrPath, strict: bool) -> None:
        self.path = path
        self.strict = strict
        self.malformed = 0
        self.notes: list[str] = []
        self.notes_left_out = 0

    def note(self, text: str) -> None:
        if len(self.notes) < _MAX_NOTES:
            self.notes.append(text)
        else:
            self.notes_left_out += 1

    def bad(self, message: str, line: int | None = None) -> None:
        if self.strict:
            raise TraceFormatError(
                f"{message} (pass strict=False to skip and count malformed entries)",
                self.path,
                line,
            )
        self.malformed += 1
        self.note(f"skipped: {message}" if line is None else f"skipped line {line}: {message}")


def _parse(path: StrPath, *, strict: bool, limits: _Limits) -> _Parsed:
    fmt = detect_format(path)
    issues = _Issues(path, strict)
    if fmt == "cubepool":
        raise TraceFormatError(
            "this is already a cubepool trace v1: load it with cubepool's trace loader", path
        )
    try:
        if fmt == "torch-profiler":
            parsed = _parse_profiler(path, _read_document(path, limits), issues, limits)
        elif fmt == "torch-snapshot":
            parsed = _parse_snapshot(path, _read_document(path, limits), issues, limits)
        else:
            parsed = _parse_rmm(path, issues, limits)
    except MemoryError as exc:
        raise limits.out_of_memory() from exc
    parsed.malformed = issues.malformed
    parsed.notes = issues.notes
    if issues.notes_left_out:
        parsed.notes.append(f"({issues.notes_left_out} further notes left out)")
    return parsed


def _describe(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def _get_int(obj: dict[object, object], key: str, where: str, issues: _Issues) -> int | None:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        if key not in obj:
            issues.bad(f"{where}: missing {key!r}")
        else:
            issues.bad(f"{where}: {key!r} must be an integer, got {_describe(value)}")
        return None
    if not _I64_MIN <= value < _U64:
        issues.bad(f"{where}: {key!r} = {value} is outside the 64-bit range")
        return None
    return value


def _get_time(obj: dict[object, object], key: str, where: str, issues: _Issues) -> float | None:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        if key not in obj:
            issues.bad(f"{where}: missing {key!r}")
        else:
            issues.bad(f"{where}: {key!r} must be a number, got {_describe(value)}")
        return None
    if not math.isfinite(value) or abs(value) >= 2.0**62:
        issues.bad(f"{where}: {key!r} = {value} is not a usable time")
        return None
    return value


def _device_name(device_type: int, device_id: int) -> str:
    if device_type == 0:
        return "cpu"
    base = _DEVICE_TYPES.get(device_type, f"device_type{device_type}")
    return f"{base}:{device_id}" if device_id >= 0 else base


def _device_order(name: str | None) -> tuple[int, str, int]:
    if name is None:
        return (0, "", 0)
    base, _, index = name.partition(":")
    return (0 if base == "cpu" else 1, base, int(index) if index.isdigit() else -1)


def _profiler_hook(limits: _Limits) -> Callable[[list[tuple[str, object]]], object]:
    """A ``json`` object hook that keeps only what the profiler importer reads.

    Objects named like events (a string ``"name"``) other than ``[memory]`` and
    ``ProfilerStep#N`` become one shared empty dict as soon as they are parsed, so the
    operator, kernel and metadata events of a trace cost no memory. The objects kept
    count against ``max_events`` twice over (an event and its ``args``): the document
    can never build more than that, whatever it weighs.
    """
    budget = None if limits.max_events is None else 2 * limits.max_events + 16
    kept = 0

    def hook(pairs: list[tuple[str, object]]) -> object:
        nonlocal kept
        obj = dict(pairs)
        name = obj.get("name")
        if (
            isinstance(name, str)
            and name != "[memory]"
            and not name.startswith("ProfilerStep#")
            and "traceEvents" not in obj
        ):
            if isinstance(obj.get("args"), dict) and obj["args"] is not _DISCARDED:
                kept -= 1  # its args go with it
            return _DISCARDED
        kept += 1
        if budget is not None and kept > budget:
            raise limits.too_many("memory events (counted as JSON objects kept, two per event)")
        if name == "[memory]":
            # Only these fields are read: the rest would be kept for nothing.
            args = obj.get("args")
            if isinstance(args, dict):
                args = {k: args[k] for k in _PROFILER_ARGS if k in args}
            kept_event = {"name": name, "args": args}
            if "ts" in obj:
                kept_event["ts"] = obj["ts"]
            return kept_event
        return obj

    return hook


def _parse_profiler(path: StrPath, data: bytes, issues: _Issues, limits: _Limits) -> _Parsed:
    try:
        doc = json.loads(data, object_pairs_hook=_profiler_hook(limits))
    except TraceFormatError:
        raise
    except json.JSONDecodeError as exc:
        raise TraceFormatError(
            f"invalid JSON: {exc.msg} (column {exc.colno})", path, exc.lineno
        ) from exc
    except (ValueError, RecursionError) as exc:
        raise TraceFormatError(f"invalid JSON: {exc}", path) from exc
    if isinstance(doc, dict):
        if "traceEvents" not in doc:
            raise TraceFormatError("not a chrome trace: no 'traceEvents' key", path)
        events = doc["traceEvents"]
    else:
        events = doc
    if not isinstance(events, list):
        raise TraceFormatError(f"'traceEvents' must be a list, got {_describe(events)}", path)

    # (ts_us, kind, addr, size, device)
    raw: list[tuple[float, Literal["alloc", "free", "zero"], int, int, str]] = []
    step_starts: dict[str, float] = {}
    for i, event in enumerate(events):
        where = f"traceEvents[{i}]"
        if not isinstance(event, dict):
            issues.bad(f"{where}: an event must be an object, got {_describe(event)}")
            continue
        name = event.get("name")
        if isinstance(name, str) and name.startswith("ProfilerStep#"):
            number = name.removeprefix("ProfilerStep#")
            ts = event.get("ts")
            if (
                number.isdigit()
                and isinstance(ts, int | float)
                and not isinstance(ts, bool)
                and math.isfinite(ts)
                and abs(ts) < 2.0**62
            ):
                phase = f"step{int(number)}"
                step_starts[phase] = min(ts, step_starts.get(phase, ts))
            continue
        if name != "[memory]":
            continue
        where = f"{where} ([memory])"
        args = event.get("args")
        if not isinstance(args, dict):
            issues.bad(f"{where}: 'args' must be an object, got {_describe(args)}")
            continue
        ts = _get_time(event, "ts", where, issues)
        if ts is None:
            continue
        fields = [_get_int(args, k, where, issues) for k in ("Addr", "Bytes")]
        if None in fields:
            continue
        dev = [_get_int(args, k, where, issues) for k in ("Device Type", "Device Id")]
        if None in dev:
            continue
        addr, nbytes = fields
        device_type, device_id = dev
        assert addr is not None and nbytes is not None
        assert device_type is not None and device_id is not None
        device = _device_name(device_type, device_id)
        limits.take()
        if nbytes > 0:
            raw.append((ts, "alloc", addr, nbytes, device))
        elif nbytes < 0:
            raw.append((ts, "free", addr, -nbytes, device))
        else:
            raw.append((ts, "zero", addr, 0, device))

    raw.sort(key=lambda r: r[0])  # stable: ties keep file order
    starts = [r[0] for r in raw] + list(step_starts.values())
    origin = min(starts) if starts else 0.0
    records = [
        _Rec(round((ts - origin) * 1000), kind, addr, size, device, None)
        for ts, kind, addr, size, device in raw
    ]
    phases = sorted(
        ((name, round((ts - origin) * 1000)) for name, ts in step_starts.items()),
        key=lambda p: (p[1], int(p[0].removeprefix("step"))),
    )
    devices = sorted({r.device for r in records}, key=_device_order)
    return _Parsed(
        "torch-profiler",
        records,
        list(devices),
        phases=phases,
        time_note="profiler ts (microseconds) converted to ns",
    )


def _check_snapshot_shape(traces: list[list[object]], limits: _Limits, path: StrPath) -> None:
    """Refuse a snapshot that names one device trace or entry twice, or holds more
    entries than ``max_events``, before anything walks it.

    A pickle can reference one object many times for two bytes each, so a few kilobytes
    can stand for millions of entries; PyTorch never writes such sharing, and refusing
    it keeps the import's work proportional to the pickle's real content. Checked in
    O(device traces) and then O(entries), with the entries bounded first.
    """
    seen: set[int] = set()
    total = 0
    for index, entries in enumerate(traces):
        if id(entries) in seen:
            raise TraceFormatError(
                f"device_traces[{index}] is the same list as an earlier device trace (a "
                "shared pickle reference PyTorch never writes); refusing the snapshot",
                path,
            )
        seen.add(id(entries))
        total += len(entries)
    if limits.max_events is not None and total > limits.max_events:
        raise limits.too_many(f"entries (it holds {total:,})")
    seen.clear()
    for index, entries in enumerate(traces):
        for i, entry in enumerate(entries):
            if isinstance(entry, dict):
                if id(entry) in seen:
                    raise TraceFormatError(
                        f"device_traces[{index}][{i}] is the same dict as an earlier entry "
                        "(a shared pickle reference PyTorch never writes); refusing the "
                        "snapshot",
                        path,
                    )
                seen.add(id(entry))


def _parse_snapshot(path: StrPath, data: bytes, issues: _Issues, limits: _Limits) -> _Parsed:
    doc = restricted_loads(data, path=os.fspath(path))
    if not isinstance(doc, dict) or "device_traces" not in doc:
        raise TraceFormatError(
            f"not a PyTorch CUDA memory snapshot: the pickle holds a {type(doc).__name__} "
            "without a 'device_traces' key",
            path,
        )
    traces = doc["device_traces"]
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise TraceFormatError("'device_traces' must be a list of lists (one per device)", path)
    _check_snapshot_shape(traces, limits, path)

    has_time = any(isinstance(e, dict) and "time_us" in e for t in traces for e in t)
    times = [
        e["time_us"]
        for t in traces
        for e in t
        if isinstance(e, dict)
        and isinstance(e.get("time_us"), int | float)
        and not isinstance(e.get("time_us"), bool)
        and math.isfinite(e["time_us"])
        and abs(e["time_us"]) < 2.0**62
    ]
    origin = min(times) if times else 0
    records: list[_Rec] = []
    clamped = 0
    for index, entries in enumerate(traces):
        device = f"cuda:{index}"
        last_t = 0
        for i, entry in enumerate(entries):
            where = f"device_traces[{index}][{i}]"
            limits.take()
            if not isinstance(entry, dict):
                issues.bad(f"{where}: an entry must be a dict, got {_describe(entry)}")
                continue
            action = entry.get("action")
            if not isinstance(action, str):
                issues.bad(f"{where}: 'action' must be a string, got {_describe(action)}")
                continue
            stream = entry.get("stream")
            if action not in ("alloc", "free_completed"):
                # Not a block allocation or free: only counted, so nothing else is checked.
                if action not in _SNAPSHOT_IGNORED:
                    issues.note(f"{where}: unknown action {action[:40]!r} ignored")
                plain_stream = stream if type(stream) is int else None
                records.append(_Rec(last_t, "ignored", 0, 0, device, plain_stream))
                continue
            if "stream" in entry:
                stream = _get_int(entry, "stream", where, issues)
                if stream is None:
                    continue
            if has_time:
                time_us = _get_time(entry, "time_us", where, issues)
                if time_us is None:
                    continue
                t = round((time_us - origin) * 1000)
            else:
                t = i
            if t < last_t:
                t = last_t
                clamped += 1
            last_t = t
            addr = _get_int(entry, "addr", where, issues)
            size = _get_int(entry, "size", where, issues)
            if addr is None or size is None:
                continue
            if size < 0:
                issues.bad(f"{where}: negative size {size}")
                continue
            kind: Literal["alloc", "free", "zero"] = (
                "zero" if size == 0 else "alloc" if action == "alloc" else "free"
            )
            records.append(_Rec(t, kind, addr, size, device, stream))
    parsed = _Parsed(
        "torch-snapshot",
        records,
        [f"cuda:{i}" for i in range(len(traces))],
        time_note=(
            "snapshot time_us converted to ns"
            if has_time
            else "the snapshot has no time_us: t is the entry's index in its device trace"
        ),
    )
    parsed.clamped = clamped
    return parsed


_CLOCK_RE: Final = re.compile(
    r"(?:(\d{4})-(\d{2})-(\d{2})[ T])?(\d{1,2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?"
)
_NUMBER_RE: Final = re.compile(r"\d+(?:\.\d*)?|\.\d+")


def _parse_rmm_time(text: str) -> tuple[int, bool] | None:
    """Return ``(ns, absolute)`` for a Time cell, or ``None`` when it is not a time.

    Accepted: a clock time ``HH:MM:SS[.fraction]`` (spdlog's ``%H:%M:%S.%f``, as RMM
    writes it; not absolute, so a midnight wrap can be detected), a date and time
    ``YYYY-MM-DD HH:MM:SS[.fraction]``, or a plain number, taken as seconds.
    """
    text = text.strip()
    m = _CLOCK_RE.fullmatch(text)
    if m:
        year, month, day, hh, mm, ss, frac = m.groups()
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
        return days * _NS_PER_DAY + ns, True
    if _NUMBER_RE.fullmatch(text) and len(text) <= 40:
        return int(decimal.Decimal(text).scaleb(9)), True
    return None


def _parse_pointer(text: str) -> int | None:
    text = text.strip().lower()
    try:
        if text.startswith("0x"):
            value = int(text[2:], 16)
        elif text.isdigit():
            value = int(text)
        elif text and all(c in "0123456789abcdef" for c in text):
            value = int(text, 16)
        else:
            return None
    except ValueError:
        return None
    return value if value < _U64 else None


def _utf8_lines(f: io.BufferedIOBase, count: list[int], limits: _Limits) -> Iterator[str]:
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


def _parse_rmm(path: StrPath, issues: _Issues, limits: _Limits) -> _Parsed:
    records: list[_Rec] = []
    origin: int | None = None
    day_offset = 0
    last_clock: int | None = None
    last_t = 0
    clamped = 0
    lines_read = [0]  # lines handed to the csv reader so far
    try:
        with _decompressed(path) as f:
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
                    if (
                        last_clock is not None
                        and stamp + day_offset < last_clock - _NS_PER_DAY // 2
                    ):
                        day_offset += _NS_PER_DAY
                        issues.note(f"line {line}: clock passed midnight; one day added")
                    stamp += day_offset
                    last_clock = stamp
                if origin is None:
                    origin = stamp
                t = stamp - origin
                if t < last_t:
                    t = last_t
                    clamped += 1
                last_t = t
                if action in ("allocate failure", "free failure"):
                    records.append(_Rec(t, "failed", 0, 0, None, stream))
                    continue
                if action not in ("allocate", "free"):
                    issues.bad(f"unknown Action {row[2][:40]!r}", line)
                    continue
                addr = _parse_pointer(row[3])
                if addr is None:
                    issues.bad(f"Pointer {row[3][:40]!r} is not an address", line)
                    continue
                size_text = row[4].strip()
                if not size_text.isdigit() or len(size_text) > 20 or int(size_text) >= _U64:
                    issues.bad(f"Size {row[4][:40]!r} is not a byte count", line)
                    continue
                size = int(size_text)
                kind: Literal["alloc", "free", "zero"] = (
                    "zero" if size == 0 else "alloc" if action == "allocate" else "free"
                )
                records.append(_Rec(t, kind, addr, size, None, stream))
    except _DECOMPRESS_ERRORS as exc:
        raise TraceFormatError(f"corrupt or truncated gzip data: {exc}", path) from exc
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"not UTF-8 text: {exc.reason}", path, lines_read[0] + 1) from exc
    except csv.Error as exc:
        raise TraceFormatError(f"malformed CSV: {exc}", path, lines_read[0]) from exc
    parsed = _Parsed("rmm-csv", records, [None], time_note="RMM Time column converted to ns")
    parsed.clamped = clamped
    return parsed


# --------------------------------------------------------------------------- selecting


def _choose_device(parsed: _Parsed, device: str | int | None, path: StrPath) -> str | None:
    names = tuple(d for d in parsed.devices if d is not None)
    if parsed.fmt == "rmm-csv":
        if device is not None:
            raise TraceSelectionError("RMM logs record no device: leave device=None", path)
        return None
    present = [d for d in parsed.devices if any(_is_block(r, d) for r in parsed.records)]
    if device is None:
        if len(present) == 1:
            return present[0]
        if len(present) > 1:
            raise TraceSelectionError(
                f"the file holds allocations on several devices: {', '.join(map(str, present))};"
                " choose one with device=...",
                path,
                tuple(map(str, present)),
            )
        hint = (
            "record with torch.profiler.profile(profile_memory=True)"
            if parsed.fmt == "torch-profiler"
            else "call torch.cuda.memory._record_memory_history() before the workload"
        )
        raise TraceFormatError(f"the file holds no allocation events on any device ({hint})", path)
    if isinstance(device, bool) or not isinstance(device, str | int):
        raise TraceSelectionError(f"device must be a str or int, got {_describe(device)}", path)
    name = f"cuda:{device}" if isinstance(device, int) else device.strip().lower()
    if name not in names:
        raise TraceSelectionError(
            f"no device {name!r} in the file; it holds: {', '.join(names) or 'none'}",
            path,
            names,
        )
    return name


def _check_stream(parsed: _Parsed, device: str | None, stream: int, path: StrPath) -> None:
    if parsed.fmt == "torch-profiler":
        raise TraceSelectionError("profiler traces record no streams: leave stream=None", path)
    if isinstance(stream, bool) or not isinstance(stream, int):
        raise TraceSelectionError(f"stream must be an int, got {_describe(stream)}", path)
    streams = sorted(
        {r.stream for r in parsed.records if _is_block(r, device) and r.stream is not None}
    )
    if stream not in streams:
        available = tuple(str(s) for s in streams)
        raise TraceSelectionError(
            f"no allocations on stream {stream}"
            + (f" of {device}" if device else "")
            + f"; streams present: {', '.join(available) or 'none'}",
            path,
            available,
        )


# --------------------------------------------------------------------------- pairing


def _build(parsed: _Parsed, device: str | None, stream: int | None, path: StrPath) -> ImportedTrace:
    events: list[Event] = []
    live: dict[int, tuple[int, int]] = {}  # addr -> (id, size)
    next_id = 0
    counts = dict.fromkeys(
        (
            "unmatched_frees",
            "unmatched_free_bytes",
            "duplicate_allocs",
            "duplicate_alloc_bytes",
            "size_mismatches",
            "zero_size",
            "failed",
            "ignored",
            "filtered",
        ),
        0,
    )
    for rec in parsed.records:
        if rec.device != device or (stream is not None and rec.stream != stream):
            if rec.kind in ("alloc", "free"):
                counts["filtered"] += 1
            continue
        if rec.kind == "alloc":
            old = live.pop(rec.addr, None)
            if old is not None:
                counts["duplicate_allocs"] += 1
                counts["duplicate_alloc_bytes"] += old[1]
                events.append((rec.t, "free", old[0], 0))
            live[rec.addr] = (next_id, rec.size)
            events.append((rec.t, "alloc", next_id, rec.size))
            next_id += 1
        elif rec.kind == "free":
            found = live.pop(rec.addr, None)
            if found is None:
                counts["unmatched_frees"] += 1
                counts["unmatched_free_bytes"] += rec.size
                continue
            if rec.size != found[1]:
                counts["size_mismatches"] += 1
            events.append((rec.t, "free", found[0], 0))
        elif rec.kind == "zero":
            counts["zero_size"] += 1
        elif rec.kind == "failed":
            counts["failed"] += 1
        else:
            counts["ignored"] += 1

    report = ImportReport(
        live_at_end=len(live),
        live_at_end_bytes=sum(size for _, size in live.values()),
        malformed=parsed.malformed,
        clamped_times=parsed.clamped,
        notes=tuple(parsed.notes),
        **counts,
    )

    name = Path(path).name
    stem = name.removesuffix(".gz")
    stem = stem.rsplit(".", 1)[0] if "." in stem else stem
    selection = []
    if device is not None:
        selection.append(f"device {device}")
    if stream is not None:
        selection.append(f"stream {stream}")
    what = {
        "torch-profiler": "torch.profiler chrome trace, [memory] events",
        "torch-snapshot": "PyTorch CUDA memory snapshot, device_traces alloc/free_completed",
        "rmm-csv": "RMM logging_resource_adaptor CSV log, allocate/free",
    }[parsed.fmt]
    header: dict[str, object] = {
        "format": "cubepool-trace",
        "version": 1,
        "workload": stem,
        "source": f"{what} ({name}{', ' if selection else ''}{', '.join(selection)})",
        "model": "unknown (not recorded in the source file)",
        "notes": (
            f"Imported by cubepool.importers from {parsed.fmt}. t = ns since the first "
            f"timestamped entry of the file ({parsed.time_note}). Import report: "
            f"{report.summary()}."
        ),
    }
    if parsed.phases:
        header["phases"] = _phases(parsed.phases, events)
    return ImportedTrace(header=header, events=events, dropped=report)


def _phases(starts: list[tuple[str, int]], events: list[Event]) -> list[dict[str, object]]:
    times = [e[0] for e in events]
    phases: list[dict[str, object]] = []
    for name, t in starts:
        phases.append({"name": name, "first_event": bisect.bisect_left(times, t), "t": max(t, 0)})
    if phases[0]["first_event"] != 0:
        phases.insert(0, {"name": "setup", "first_event": 0, "t": 0})
    return phases


# --------------------------------------------------------------------------- writing


def _header_line(header: dict[str, object], path: StrPath) -> bytes:
    if not isinstance(header, dict):
        raise TraceFormatError(f"the header must be a dict, got {_describe(header)}", path)
    out: dict[str, object] = {"format": "cubepool-trace", "version": 1}
    out.update((k, v) for k, v in header.items() if k not in ("format", "version"))
    try:
        text = json.dumps(out, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TraceFormatError(f"the header is not JSON-serialisable: {exc}", path, 1) from exc
    return text.encode("utf-8") + b"\n"


def _event_lines(events: list[Event], path: StrPath) -> Iterator[bytes]:
    live: set[int] = set()
    next_id = 0
    last_t = 0
    for i, event in enumerate(events):
        problem = _event_problem(event, next_id, last_t, live)
        if problem is not None:
            raise TraceFormatError(f"event {i}: {problem}", path, i + 2)
        t, op, ident, size = event
        last_t = t
        if op == "alloc":
            next_id += 1
            live.add(ident)
            yield f'{{"t":{t},"op":"alloc","id":{ident},"size":{size}}}\n'.encode()
        else:
            live.remove(ident)
            yield f'{{"t":{t},"op":"free","id":{ident}}}\n'.encode()


def _event_problem(event: object, next_id: int, last_t: int, live: set[int]) -> str | None:
    """Say what makes ``event`` invalid after the events before it, or return ``None``."""
    if not isinstance(event, tuple) or len(event) != 4:
        return f"expected (t, op, id, size), got {_describe(event)}"
    t, op, ident, size = event
    for value in (t, ident, size):
        if isinstance(value, bool) or not isinstance(value, int):
            return f"t, id and size must be ints, got {_describe(value)}"
    if t < last_t:
        return f"t={t} is earlier than the previous event's {last_t}"
    if op == "alloc":
        if ident != next_id:
            return f"allocation ids must be dense from 0: expected {next_id}, got {ident}"
        if not 0 <= size < _U64:
            return f"size {size} is not a byte count"
    elif op == "free":
        if ident not in live:
            return f"free of id {ident}, which is not live"
    else:
        return f"op must be 'alloc' or 'free', got {_describe(op)}"
    return None
