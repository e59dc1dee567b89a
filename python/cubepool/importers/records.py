"""What a format's parser hands on: one record per entry of the file, before pairing."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Final, Literal, NamedTuple

Format = Literal["cubepool", "torch-profiler", "torch-snapshot", "rmm-csv"]
"""A trace file's format, as :func:`cubepool.importers.detect_format` names it."""

FORMATS: Final[tuple[Format, ...]] = ("cubepool", "torch-profiler", "torch-snapshot", "rmm-csv")
"""Every format cubepool reads."""

Kind = Literal["alloc", "free", "zero", "failed", "ignored", "reserve", "unreserve", "reserved"]
"""What an entry is: an allocation or a free of a block, an entry of 0 bytes, a failed
operation the source logged, an entry that is none of these, or a figure of the
allocator's own reserved bytes: ``reserve`` / ``unreserve`` take or return ``size``
bytes from the device (a snapshot's ``segment_alloc``/``segment_map`` and
``segment_free``/``segment_unmap``), ``reserved`` says ``size`` bytes are reserved in all
(a profiler event's "Total Reserved")."""


Where = tuple[str, int | None]
"""Where an entry is in its file, for messages: its name (``"traceEvents[4]"``,
``"device_traces[0][5]"``, ``"segments[1].blocks[0]"``; empty where the line says it
all) and its 1-based line, where the format has lines (RMM logs)."""


class Rec(NamedTuple):
    """One entry of a file: when, what, at which address, how many bytes, where."""

    t: int
    """Time in ns since the file's first timestamped entry."""
    kind: Kind
    """What the entry is."""
    addr: int
    """The block's address (0 where there is none)."""
    size: int
    """The block's bytes (0 where there are none)."""
    device: str | None
    """``"cpu"``, ``"cuda:0"``, ...; ``None`` where the format records no device."""
    stream: int | None
    """The stream; ``None`` where the format records none."""
    frames: tuple[str, ...] | None = None
    """An allocation's stack, innermost frame first, each ``"name (file:line)"``, where
    the file has one (a snapshot's ``frames``); ``None`` otherwise."""


def is_block(rec: Rec, device: str | None) -> bool:
    """Whether ``rec`` allocates or frees a block on ``device``."""
    return rec.device == device and rec.kind in ("alloc", "free")


@dataclass
class Parsed:
    """A whole file, parsed: its records in time order and what the parse noted."""

    fmt: Format
    """The file's format."""
    records: list[Rec]
    """The entries, in time order."""
    devices: list[str | None]
    """Every device of the file, CPU first, then by name and index."""
    phases: list[tuple[str, int]] = field(default_factory=list)
    """Named phases and their start times in ns (profiler steps)."""
    time_note: str = ""
    """How the file's times became ns, for the header's notes."""
    malformed: int = 0
    """Malformed entries skipped."""
    clamped: int = 0
    """Times raised to their predecessor's."""
    notes: list[str] = field(default_factory=list)
    """Notes about skipped entries."""
    segments: list[Segment] | None = None
    """A snapshot's final ``segments`` list (what was reserved when it was dumped);
    ``None`` where the file has none."""
    mapped_devices: set[str] = field(default_factory=set)
    """Devices with ``segment_map``/``segment_unmap`` events (expandable segments)."""
    allocated_devices: set[str] = field(default_factory=set)
    """Devices with ``segment_alloc``/``segment_free`` events (whole segments)."""
    live_at_dump: list[LiveBlock] | None = None
    """A snapshot's blocks live when it was dumped (its final ``segments``' active
    blocks); ``None`` where the file does not list them."""
    allocator_settings: AllocatorSettings | None = None
    """A snapshot's ``allocator_settings``, where it has them and they are sound;
    ``None`` otherwise."""
    origins: array[int] = field(default_factory=lambda: array("Q"))
    """Where each record comes from, by its index in :attr:`records`: its line (RMM
    logs), its index in ``traceEvents`` (profiler traces) or in its device's trace
    (snapshots). Eight bytes a record: an entry's place is named only when it is at
    fault."""

    def add(self, rec: Rec, origin: int) -> None:
        """Append ``rec``, read from the entry at ``origin`` (see :attr:`origins`)."""
        self.records.append(rec)
        self.origins.append(origin)

    def where(self, index: int) -> Where:
        """Where the record at ``index`` comes from in the file."""
        origin = self.origins[index]
        if self.fmt == "rmm-csv":
            return "", origin
        if self.fmt == "torch-profiler":
            return f"traceEvents[{origin}]", None
        device = self.records[index].device or ""
        return f"device_traces[{device.removeprefix('cuda:')}][{origin}]", None


class Segment(NamedTuple):
    """One entry of a snapshot's final ``segments`` list, as far as the recording needs."""

    device: str
    """``"cuda:0"``, ..."""
    stream: int | None
    """Its stream; ``None`` where the entry names none."""
    total_size: int
    """Its bytes reserved from the device (mapped bytes, for an expandable segment)."""
    expandable: bool | None
    """Its ``is_expandable`` flag; ``None`` where the entry has none."""


class LiveBlock(NamedTuple):
    """A block a snapshot lists as live when it was dumped."""

    device: str
    """``"cuda:0"``, ..."""
    stream: int | None
    """Its segment's stream; ``None`` where the segment names none."""
    addr: int
    """Its address."""
    size: int
    """The bytes asked for (``requested_size``, which the trace's entries carry too)."""
    frames: tuple[str, ...] | None
    """Its allocation's stack, as :attr:`Rec.frames`."""
    where: str
    """Where the file lists it: ``"segments[1].blocks[0]"``."""


class AllocatorSettings(NamedTuple):
    """What a snapshot's ``allocator_settings`` say of the settings the model has (see
    :func:`cubepool.importers.snapshot.allocator_settings`): each ``None`` where the
    dict leaves it out, which is PyTorch's default for the last two."""

    expandable_segments: bool | None
    """``expandable_segments``."""
    max_split_size_mb: int | None
    """``max_split_size`` in MiB; ``None`` for no limit (PyTorch's default)."""
    roundup_power2_divisions: tuple[int, ...] | None
    """``roundup_power2_divisions``, one per size interval (16: 1, 2, 4, ... 32768
    MiB); ``None`` where the dict has none (0 throughout, PyTorch's default)."""
    garbage_collection_threshold: float
    """``garbage_collection_threshold`` (0: off, PyTorch's default)."""
