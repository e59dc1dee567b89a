"""Import allocation traces recorded by other tools.

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
  at an address no allocation named before it frees a block live before the recording
  began (a profiler started late, a snapshot's ring buffer dropped the oldest entries),
  and so does a block a snapshot lists as live at its end at an address no allocation
  names: such blocks are allocated at the trace's start, in address order, and counted
  (``live_before``, with their bytes), so that a replay holds what the run held
  (``live_before=False`` starts the trace empty instead). Any other free with no live
  allocation at its address is dropped and counted (``unmatched_frees``, with its bytes).
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

Where the file shows them, PyTorch's own reserved bytes over time are kept as the
trace's recording (``Trace.recording``): a snapshot's segment events and final
``segments`` list, a profiler trace's "Total Reserved"; see
:mod:`~cubepool.importers.recorded`.

The package has one module per job: :mod:`~cubepool.importers.sniff` tells the format,
:mod:`~cubepool.importers.profiler`, :mod:`~cubepool.importers.snapshot` and
:mod:`~cubepool.importers.rmm` parse one format each into records,
:mod:`~cubepool.importers.selection` chooses a device and stream,
:mod:`~cubepool.importers.pairing` pairs the records into a ``TraceBuilder`` (Rust),
:mod:`~cubepool.importers.recorded` makes the recording of reserved bytes,
:mod:`~cubepool.importers.limits` holds the bounds and :mod:`~cubepool.importers.types`
the values returned. Writing a trace is ``Trace.write`` (Rust).
"""

from __future__ import annotations

import os

from cubepool._cubepool import Trace
from cubepool._errors import TraceFormatError
from cubepool.importers._values import Issues, StrPath
from cubepool.importers.limits import (
    MAX_DOCUMENT_BYTES,
    MAX_DOCUMENT_BYTES_ENV,
    MAX_EVENTS,
    MAX_EVENTS_ENV,
    Limits,
    check_environment,
)
from cubepool.importers.pairing import live_before as blocks_live_before
from cubepool.importers.pairing import pair
from cubepool.importers.profiler import parse_profiler
from cubepool.importers.records import FORMATS, Format, Parsed
from cubepool.importers.rmm import parse_rmm
from cubepool.importers.selection import check_stream, choose_device, device_infos
from cubepool.importers.snapshot import parse_snapshot
from cubepool.importers.sniff import detect_format, read_document
from cubepool.importers.types import DeviceInfo, Event, ImportedTrace, ImportReport

__all__ = [
    "FORMATS",
    "MAX_DOCUMENT_BYTES",
    "MAX_DOCUMENT_BYTES_ENV",
    "MAX_EVENTS",
    "MAX_EVENTS_ENV",
    "DeviceInfo",
    "Event",
    "Format",
    "ImportReport",
    "ImportedTrace",
    "StrPath",
    "check_environment",
    "detect_format",
    "import_trace",
    "list_devices",
    "write_trace_v1",
]


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
    parsed = _parse(path, strict=False, limits=Limits(path, max_bytes, max_events))
    return device_infos(parsed)


def import_trace(
    path: StrPath,
    *,
    device: str | int | None = None,
    stream: int | None = None,
    strict: bool = True,
    max_bytes: int | None = MAX_DOCUMENT_BYTES,
    max_events: int | None = MAX_EVENTS,
    live_before: bool = True,
) -> ImportedTrace:
    """Import a PyTorch profiler trace, PyTorch memory snapshot or RMM log.

    Args:
        path: the file; its format is found by :func:`detect_format`.
        device: which device to import: ``"cpu"``, ``"cuda:0"``, ... (an int ``n`` means
            ``"cuda:n"``). ``None`` picks the only device with blocks or, of several, a GPU
            before the CPU and then the one whose blocks' peak live bytes are the
            largest, and says so in ``dropped.device_choice`` (a GPU run's profiler trace
            holds the CPU's blocks too). RMM logs record no device: leave it ``None``.
        stream: import only this stream (snapshots, RMM logs); ``None`` takes them all.
        strict: raise on the first malformed entry (``True``) or skip and count such
            entries in ``dropped.malformed`` (``False``).
        max_bytes: see :data:`MAX_DOCUMENT_BYTES`.
        max_events: see :data:`MAX_EVENTS`.
        live_before: allocate the blocks live before the recording began at the trace's
            start (``True``), or start the trace empty and drop their frees as unmatched
            (``False``); see the rules above.

    Returns:
        The trace (``.trace``, a :class:`cubepool.Trace`), with ``dropped`` saying what
        was left out or kept specially.

    Raises:
        TraceFormatError: the file or an entry is malformed, the pickle is refused, the
            file holds no allocation or free of a block at all (with ``device=None``; an
            RMM log of only failed operations too), it is past ``max_bytes`` or
            ``max_events``, or it is already a cubepool trace v1 (read that with
            cubepool's own loader).
        TraceSelectionError: the device or stream choice does not fit the file.
        OSError: the file cannot be read.
    """
    limits = Limits(path, max_bytes, max_events)
    parsed = _parse(path, strict=strict, limits=limits)
    chosen, why = choose_device(parsed, device, path, live_before=live_before)
    if stream is not None:
        check_stream(parsed, chosen, stream, path, live_before=live_before)
    try:
        before = blocks_live_before(parsed, chosen, stream) if live_before else None
        limits.take(len(before or ()))
        return pair(parsed, chosen, stream, path, before=before, device_choice=why)
    except MemoryError as exc:
        raise limits.out_of_memory() from exc


def write_trace_v1(trace: ImportedTrace | Trace, path: StrPath) -> None:
    """Write ``trace`` as cubepool trace v1 JSON Lines (gzip when ``path`` ends in
    ``.gz``): ``Trace.write``, kept under this name for callers of earlier versions.

    The trace was checked when it was built, so the file is valid trace v1; it is
    written to a temporary file that replaces ``path`` only once complete, so no
    partial file is ever left.

    Raises:
        OSError: the file cannot be written.
    """
    (trace.trace if isinstance(trace, ImportedTrace) else trace).write(os.fspath(path))


def _parse(path: StrPath, *, strict: bool, limits: Limits) -> Parsed:
    """The records of a foreign file, by the parser of its format."""
    fmt = detect_format(path)
    issues = Issues(path, strict)
    if fmt == "cubepool":
        raise TraceFormatError(
            "this is already a cubepool trace v1: load it with cubepool's trace loader", path
        )
    try:
        if fmt == "torch-profiler":
            parsed = parse_profiler(path, read_document(path, limits), issues, limits)
        elif fmt == "torch-snapshot":
            parsed = parse_snapshot(path, lambda: read_document(path, limits), issues, limits)
        else:
            parsed = parse_rmm(path, issues, limits)
    except MemoryError as exc:
        raise limits.out_of_memory() from exc
    parsed.malformed = issues.malformed
    parsed.notes = issues.all_notes()
    return parsed
