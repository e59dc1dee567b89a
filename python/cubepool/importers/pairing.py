"""Pairing: the records of one device and stream become a trace.

A free pairs with the allocation live at the same address; an allocation at a live
address frees the old one first; what stays live is kept never freed. Blocks live when
the recording began (:func:`live_before`) are allocated at the trace's start, in address
order, so that a replay holds what the run held. The entries of the
allocator's own reserved bytes become the recording
(:mod:`~cubepool.importers.recorded`). The events go
straight into a ``TraceBuilder`` (typed calls, checked in Rust as they come), so an
import never builds a list of event tuples.
"""

from __future__ import annotations

from collections import deque

from cubepool._cubepool import TraceBuilder
from cubepool._errors import InvalidArgument, TraceFormatError
from cubepool._files import printable_name
from cubepool.importers._values import StrPath
from cubepool.importers.recorded import LivePeaks, Step, recording
from cubepool.importers.records import Parsed, Rec, Where
from cubepool.importers.types import ImportedTrace, ImportReport

_WHAT = {
    "torch-profiler": "torch.profiler chrome trace, [memory] events",
    "torch-snapshot": "PyTorch CUDA memory snapshot, device_traces alloc/free_completed",
    "rmm-csv": "RMM logging_resource_adaptor CSV log, allocate/free",
}


Before = list[tuple[int, int, tuple[str, ...] | None, Where]]
"""Blocks live before a recording: ``(address, size, frames, where)``, ``where`` the entry
that shows the block (its free, or its place in a snapshot's final segments)."""


def _selected(
    rec_device: str | None, rec_stream: int | None, device: str | None, stream: int | None
) -> bool:
    """Whether a record or block of ``rec_device`` and ``rec_stream`` is imported."""
    return rec_device == device and (stream is None or rec_stream == stream)


def live_before(parsed: Parsed, device: str | None, stream: int | None) -> Before:
    """The blocks of ``device`` (and ``stream``) live when the recording began, by address.

    A recording starts late (``torch.profiler`` when told to, a snapshot's history when
    ``_record_memory_history`` was called, after the model was loaded) or loses its
    oldest entries (a snapshot's ring buffer, ``max_entries``). Two kinds of block were
    live before it for sure:

    * one the recording frees at an address none of its allocations named before: the
      free's size is the block's;
    * one a snapshot lists as live when it was dumped (its final ``segments``' active
      blocks) at an address no allocation of the recording names: it was live all along.
      The history runs up to the snapshot, so no allocation is missing from its end
      (PyTorch's allocator clears the history when recording stops, so a snapshot
      that has one was taken while recording).

    Only the first free at such an address counts (a second one frees nothing).
    """
    before = live_before_by_device(parsed, stream, device=device).get(device, {})
    return [(addr, *block) for addr, block in sorted(before.items())]


_EVERY = object()
"""The devices of :func:`live_before_by_device` when none is named: all of them."""


def live_before_by_device(
    parsed: Parsed, stream: int | None = None, *, device: object = _EVERY
) -> dict[str | None, dict[int, tuple[int, tuple[str, ...] | None, Where]]]:
    """The blocks live when the recording began (see :func:`live_before`), of ``device``
    or of every device, each device's by address, in one pass over the records (not one
    a device: a profiler trace names any number)."""
    named: dict[str | None, set[int]] = {}
    live: dict[str | None, set[int]] = {}
    before: dict[str | None, dict[int, tuple[int, tuple[str, ...] | None, Where]]] = {}
    for index, rec in enumerate(parsed.records):
        if (device is not _EVERY and rec.device != device) or (
            stream is not None and rec.stream != stream
        ):
            continue
        if rec.kind == "alloc":
            live.setdefault(rec.device, set()).add(rec.addr)
            named.setdefault(rec.device, set()).add(rec.addr)
        elif rec.kind == "free":
            if rec.addr in live.get(rec.device, ()):
                live[rec.device].discard(rec.addr)
            elif rec.addr not in named.get(rec.device, ()):
                blocks = before.setdefault(rec.device, {})
                if rec.addr not in blocks:
                    blocks[rec.addr] = (rec.size, None, parsed.where(index))
    for block in parsed.live_at_dump or ():
        if (device is not _EVERY and block.device != device) or (
            stream is not None and block.stream != stream
        ):
            continue
        blocks = before.setdefault(block.device, {})
        if block.addr not in named.get(block.device, ()) and block.addr not in blocks:
            blocks[block.addr] = (block.size, block.frames, (block.where, None))
    return before


def pair(
    parsed: Parsed,
    device: str | None,
    stream: int | None,
    path: StrPath,
    *,
    before: Before | None = None,
    device_choice: str = "",
) -> ImportedTrace:
    """The trace of ``device`` (and ``stream``, when given) of ``parsed``, and the report
    of what was dropped. ``before`` are the blocks live before the recording
    (:func:`live_before`), allocated at the trace's start; ``None`` starts it empty,
    dropping the frees of such blocks as unmatched. ``device_choice`` says why
    ``device`` was taken where the file left the choice to cubepool.

    Raises:
        TraceFormatError: the events break a rule of the trace (their live bytes or a
            time in ns overflow 64 bits), named with the file, the entry (or line) at
            fault and the event.
    """
    builder = TraceBuilder()
    live: dict[int, tuple[int, int]] = {}  # addr -> (id, size)
    next_id = 0
    # Each phase starts at the first event at or after its time (a deque: a profiler
    # trace may have millions of steps, and a list's pop(0) moves all the others).
    pending = deque(parsed.phases)
    phases: list[dict[str, object]] = []
    unmatched = unmatched_bytes = duplicates = duplicate_bytes = mismatches = 0
    zero = failed = ignored = filtered = 0
    steps: list[Step] = []
    live_bytes = LivePeaks()
    before_bytes = 0
    where: Where = ("", None)
    try:
        for addr, size, frames, where in before or ():  # noqa: B007 - named when at fault
            live[addr] = (next_id, size)
            builder.alloc(0, next_id, size, frames or None)
            live_bytes.alloc(size)
            next_id += 1
            before_bytes += size
    except TraceFormatError as exc:
        raise _at_fault(exc.message, parsed, where, path) from exc
    index = 0
    rec: Rec | None = None
    try:
        for index, rec in enumerate(parsed.records):  # noqa: B007 - named when at fault
            if not _selected(rec.device, rec.stream, device, stream):
                if rec.kind in ("alloc", "free"):
                    filtered += 1
                continue
            kind = rec.kind
            if kind in ("reserve", "unreserve", "reserved"):
                # The allocator's own bytes, after the events so far: the recording.
                steps.append((len(builder), rec.t, kind, rec.size))
                live_bytes.step()
                if kind != "reserved":
                    ignored += 1  # a segment entry, no block event
                continue
            if kind in ("alloc", "free"):
                while pending and pending[0][1] <= rec.t:
                    name, t = pending.popleft()
                    phases.append({"name": name, "first_event": len(builder), "t": max(t, 0)})
            if kind == "alloc":
                old = live.pop(rec.addr, None)
                if old is not None:
                    duplicates += 1
                    duplicate_bytes += old[1]
                    builder.free(rec.t, old[0])
                    live_bytes.free(old[1])
                live[rec.addr] = (next_id, rec.size)
                builder.alloc(rec.t, next_id, rec.size, rec.frames or None)
                live_bytes.alloc(rec.size)
                next_id += 1
            elif kind == "free":
                found = live.pop(rec.addr, None)
                if found is None:
                    unmatched += 1
                    unmatched_bytes += rec.size
                    continue
                if rec.size != found[1]:
                    mismatches += 1
                builder.free(rec.t, found[0])
                live_bytes.free(found[1])
            elif kind == "zero":
                zero += 1
            elif kind == "failed":
                failed += 1
            else:
                ignored += 1
    except TraceFormatError as exc:
        raise _at_fault(exc.message, parsed, parsed.where(index), path) from exc
    except InvalidArgument as exc:
        # The parsers bound times, ids and sizes to 64 bits, which the builder takes (and
        # names the one that does not fit): kept for safety.
        problem = f"event {len(builder)}: {exc}"
        raise _at_fault(problem, parsed, parsed.where(index), path) from exc
    phases.extend(
        {"name": name, "first_event": len(builder), "t": max(t, 0)} for name, t in pending
    )
    if phases and phases[0]["first_event"] != 0:
        phases.insert(0, {"name": "setup", "first_event": 0, "t": 0})

    live_bytes.finish()
    outcome = recording(parsed, device, stream, steps, live_bytes)
    report = ImportReport(
        live_before=len(before or ()),
        live_before_bytes=before_bytes,
        unmatched_frees=unmatched,
        unmatched_free_bytes=unmatched_bytes,
        live_at_end=len(live),
        live_at_end_bytes=sum(size for _, size in live.values()),
        duplicate_allocs=duplicates,
        duplicate_alloc_bytes=duplicate_bytes,
        size_mismatches=mismatches,
        zero_size=zero,
        failed=failed,
        ignored=ignored,
        filtered=filtered,
        malformed=parsed.malformed,
        clamped_times=parsed.clamped,
        notes=(*parsed.notes, *outcome.notes),
        recording_left_out=outcome.left_out or "",
        device_choice=device_choice,
    )
    header = _header(parsed, device, stream, path, report)
    if phases:
        header["phases"] = phases
    if outcome.recorded is not None:
        header["recorded"] = outcome.recorded.header()
        header["notes"] = f"{header['notes']} {outcome.recorded.sentence()}"
        for said in outcome.notes:
            header["notes"] = f"{header['notes']} Note: {said}."
    elif (note := outcome.note()) is not None:
        header["notes"] = f"{header['notes']} Note: {note}."
    return ImportedTrace(trace=builder.finish(header), dropped=report)


def _at_fault(problem: str, parsed: Parsed, where: Where, path: StrPath) -> TraceFormatError:
    """The error for an event the trace refused, naming the file and the entry (or line)
    it was made from."""
    entry, line = where
    return TraceFormatError(
        f"imported as {parsed.fmt}: {f'{entry}: ' if entry else ''}{problem}", path, line
    )


def _header(
    parsed: Parsed, device: str | None, stream: int | None, path: StrPath, report: ImportReport
) -> dict[str, object]:
    """The v1 header of an import: the file's name, where it came from, the report.

    A file name that is not UTF-8 (``\xff.pickle``) is read by Python with lone
    surrogates standing for its bytes, which no header holds: the bytes that are not
    UTF-8 become U+FFFD, as ``decode(errors="replace")`` makes them."""
    name = printable_name(path)
    stem = name.removesuffix(".gz")
    stem = stem.rsplit(".", 1)[0] if "." in stem else stem
    selection = []
    if device is not None:
        selection.append(f"device {device}")
    if stream is not None:
        selection.append(f"stream {stream}")
    return {
        "workload": stem,
        "source": f"{_WHAT[parsed.fmt]} ({name}{', ' if selection else ''}{', '.join(selection)})",
        "model": "unknown (not recorded in the source file)",
        "notes": (
            f"Imported by cubepool.importers from {parsed.fmt}. t = ns since the first "
            f"timestamped entry of the file ({parsed.time_note}). Import report: "
            f"{report.summary()}."
        ),
    }
