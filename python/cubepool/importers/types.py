"""What an import returns: the trace, what was dropped and why, and the devices a file
holds."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from cubepool._cubepool import Trace
from cubepool._format import human_bytes

Event = tuple[int, str, int, int]
"""One event as ``Trace.events()`` lists it: ``(t_ns, op, id, size)`` with op
``"alloc"`` or ``"free"`` (size 0 for frees)."""


@dataclass(frozen=True)
class ImportReport:
    """What an import dropped, kept specially, or skipped, and why.

    Counts of malformed entries and of clamped times cover the whole file; every other
    count covers the device and stream that were imported.
    """

    unmatched_frees: int = 0
    """Frees with no live allocation at their address (dropped): with ``live_before``
    (the default), only the frees such a block had already had."""
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
    ``segment_*``, ``oom``, ... and unknown actions); skipped by design (segment entries
    feed the recording, ``Trace.recording``)."""
    filtered: int = 0
    """Allocations and frees of the devices or streams that were not selected."""
    malformed: int = 0
    """Malformed entries skipped (only with ``strict=False``)."""
    clamped_times: int = 0
    """Timestamps earlier than the previous event's, raised to it to keep time order."""
    notes: tuple[str, ...] = ()
    """Human-readable details: reasons for skipped entries (the first few), caveats."""
    live_before: int = 0
    """Blocks live when the recording began (freed by it at an address none of its
    allocations named, or listed live by a snapshot at such an address), allocated at
    the trace's start (see :func:`cubepool.importers.pairing.live_before`)."""
    live_before_bytes: int = 0
    """Bytes of those blocks."""
    recording_left_out: str = ""
    """Why the file's own reserved-bytes figures were left out of the trace's recording
    (``Trace.recording``), where they contradict the trace (a figure below the bytes it
    holds live then; see :mod:`cubepool.importers.recorded`); empty otherwise."""

    device_choice: str = ""
    """Which device was imported and why, where the file holds blocks on several and
    none was named (the one whose blocks' peak live bytes are the largest); empty
    otherwise."""

    def to_dict(self) -> dict[str, object]:
        """Return the report as a JSON-ready dict (notes as a list)."""
        return {**dataclasses.asdict(self), "notes": list(self.notes)}

    def summary(self) -> str:
        """Return a one-line, human-readable account of the non-zero counts."""
        parts: list[str] = [self.device_choice] if self.device_choice else []
        if self.live_before:
            parts.append(
                f"allocated {self.live_before:,} blocks live before the recording began at "
                f"its start ({human_bytes(self.live_before_bytes)})"
            )
        if self.unmatched_frees:
            parts.append(
                f"dropped {self.unmatched_frees:,} frees without a live allocation "
                f"({human_bytes(self.unmatched_free_bytes)})"
            )
        if self.live_at_end:
            parts.append(
                f"kept {self.live_at_end:,} allocations live at the end as never freed "
                f"({human_bytes(self.live_at_end_bytes)})"
            )
        if self.duplicate_allocs:
            parts.append(
                f"{self.duplicate_allocs:,} allocations at an already live address, each "
                "taken as the implicit free of the old one "
                f"({human_bytes(self.duplicate_alloc_bytes)})"
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
        parts.extend(f"{count:,} {what}" for count, what in simple if count)
        if self.recording_left_out:
            parts.append(f"recorded reserved bytes left out: {self.recording_left_out}")
        return "; ".join(parts) if parts else "nothing dropped"


@dataclass(frozen=True)
class ImportedTrace:
    """An allocation trace imported from another tool's file.

    Attributes:
        trace: the trace, built event by event by ``TraceBuilder`` (checked as it was
            built: time order, frees of live allocations; ids dense from 0).
        dropped: what the import dropped or kept specially, and why.
    """

    trace: Trace
    dropped: ImportReport = field(default_factory=ImportReport)

    @property
    def header(self) -> dict[str, object]:
        """The v1 header fields: ``format``, ``version``, ``workload``, ``source``,
        ``model``, ``notes`` and, where known, ``phases`` (as the file would hold them)."""
        return {"format": "cubepool-trace", "version": 1, **self.trace.header}

    @property
    def events(self) -> list[Event]:
        """The events as ``(t_ns, op, id, size)`` tuples (``Trace.events()``)."""
        return self.trace.events()


@dataclass(frozen=True)
class DeviceInfo:
    """One device of a trace file, as :func:`cubepool.importers.list_devices` reports it.

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
