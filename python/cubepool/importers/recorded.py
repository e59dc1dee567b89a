"""The recording: what PyTorch's own allocator reserved while the trace was recorded.

Where a file holds it, an import keeps PyTorch's reserved bytes over time in the trace's
header (``Trace.recording``; the v1 field ``recorded``), for the device (and stream)
imported:

* **Snapshots.** The final ``segments`` list says what was reserved when the snapshot
  was dumped; the ``segment_alloc`` / ``segment_map`` entries of ``device_traces`` add
  their ``size``, ``segment_free`` / ``segment_unmap`` take it away. Walking back from
  the end gives the curve over the recorded window, even when recording started late or
  the ring buffer dropped the oldest entries: the bytes reserved when the window began
  are the final segments' minus what the window's events added. The recording covers
  the run from its ``"start"`` when that is 0, else a ``"window"``. Expandable segments
  are read from the file: ``segment_map``/``segment_unmap`` entries or segments marked
  ``is_expandable`` say yes, ``segment_alloc``/``segment_free`` entries or segments
  marked not expandable say no; where they say neither, the snapshot's
  ``allocator_settings`` do. A snapshot without a ``segments`` list, or one whose
  events take more than its final segments hold, has no recording (said in the notes).
  The run's allocator settings (a snapshot's ``allocator_settings``:
  ``expandable_segments``, ``max_split_size``, ``roundup_power2_divisions``) become the
  recording's ``settings``: the name of the model of PyTorch's allocator with them
  (``torch_expandable(max_split_size_mb=512, roundup_power2_divisions=[256:1,>:8])``),
  which :func:`cubepool.recorded.matching_model` compares the recording with. Where
  the segments and the settings disagree on expandable segments, the segments' word is
  kept and the notes say so; a ``garbage_collection_threshold`` is noted as not
  modelled (it acts only under a per-process memory fraction, which a snapshot does not
  record).
* **Profiler traces.** Each ``[memory]`` event's ``"Total Reserved"`` is the reserved
  bytes after it. The profiler starts when it is told to, so the recording is a
  ``"window"``: its first value counts what was reserved before. Profiler traces do
  not say whether segments were expandable. CPU events carry no such figure (PyTorch
  writes 0 for its CPU allocator, which keeps no reserve).
* **RMM logs** record no reserved bytes (``logging_resource_adaptor`` logs what its
  upstream is asked for, which *is* the trace).

Figures that contradict the trace are left out, in strict and lenient imports alike (the
trace itself is sound; only PyTorch's own account of it is not): a reserved figure below
the bytes the trace holds live while it stands (a snapshot's ``"segments": []`` under
live blocks, a 2 MiB segment under an 8 MiB block, a "Total Reserved" of 10 bytes), or
segment events that take the reserved bytes below 0 or to 2^64. The import report
(``ImportReport.recording_left_out``, in its summary) and the trace's notes say why.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from cubepool._cubepool import TorchAllocatorModel
from cubepool._errors import InvalidArgument
from cubepool._format import human_bytes
from cubepool.importers._values import U64
from cubepool.importers.records import AllocatorSettings, Parsed

Step = tuple[int, int, str, int]
"""One reserved-bytes entry of the imported device, as pairing meets it: the number of
trace events before it, its time in ns, its kind (``reserve``, ``unreserve`` or
``reserved``) and its bytes."""

_SOURCES: Final = {
    "torch-snapshot": "torch-snapshot segments",
    "torch-profiler": "torch-profiler Total Reserved",
}


class Recorded(NamedTuple):
    """A recording, as the import makes it for the header."""

    source: str
    """Where the figures come from."""
    device: str
    """The device they are of."""
    covers: str
    """``"start"`` or ``"window"``."""
    expandable_segments: bool | None
    """Whether the run used expandable segments (``None``: not said)."""
    points: list[tuple[int, int, int]]
    """``(event, t_ns, reserved)`` triples."""
    settings: str | None = None
    """The run's allocator settings, as the name of the model of PyTorch's allocator
    with them (``None``: the file does not say)."""

    def header(self) -> dict[str, object]:
        """The header's ``recorded`` entry."""
        return self._asdict()

    def sentence(self) -> str:
        """One sentence for the import's notes: what the recording covers."""
        peak = max((p[2] for p in self.points), default=0)
        expandable = {True: "yes", False: "no", None: "not said"}[self.expandable_segments]
        settings = "" if self.settings is None else f"; allocator settings: {self.settings}"
        return (
            f"Recorded reserved bytes ({self.source}, {self.device}): {len(self.points)} "
            f"points, covering the {self.covers}, peak {peak} B; expandable segments: "
            f"{expandable}{settings}."
        )


class LivePeaks:
    """The bytes the trace holds live as pairing meets its events, read where the
    reserved-bytes figures must cover them."""

    def __init__(self) -> None:
        self.live = 0
        self.peaks = [0]
        """The most live in each span between :class:`Step` entries: before the first,
        between each two, after the last (what a snapshot's figure, standing until the
        next, must cover: PyTorch reserves a segment before the block it is for)."""
        self.standing: list[int] = []
        """For each :class:`Step` entry, the most live from it up to the event before
        the next entry's: what a profiler figure, recorded right after its event and
        standing over the events after it that carry none, must cover (as the trace's
        reader checks a curve, ``Recording::below_live``). The live bytes after an
        event count once the next event comes, or at :meth:`finish`."""

    def alloc(self, size: int) -> None:
        """A block of ``size`` bytes allocated."""
        self._stand()
        self.live += size
        self.peaks[-1] = max(self.peaks[-1], self.live)

    def free(self, size: int) -> None:
        """A block of ``size`` bytes freed."""
        self._stand()
        self.live -= size

    def step(self) -> None:
        """A reserved-bytes entry: a new span begins."""
        self.peaks.append(self.live)
        self.standing.append(self.live)

    def finish(self) -> None:
        """The end of the events: the live bytes after the last stand under the last
        figure."""
        self._stand()

    def _stand(self) -> None:
        if self.standing:
            self.standing[-1] = max(self.standing[-1], self.live)


class Outcome(NamedTuple):
    """What an import makes of the reserved-bytes figures of the device imported."""

    recorded: Recorded | None = None
    """The recording, where the file has usable figures."""
    missing: str | None = None
    """Why there is none though the format can hold one (a snapshot without ``segments``)."""
    left_out: str | None = None
    """Why the file's figures were left out: they contradict the trace."""
    notes: tuple[str, ...] = ()
    """What the import notes of the run's allocator settings (disagreements, what the
    model leaves out)."""

    def note(self) -> str | None:
        """The sentence for the trace's notes where there is no recording."""
        return self.missing or self.left_out


def recording(
    parsed: Parsed, device: str | None, stream: int | None, steps: list[Step], live: LivePeaks
) -> Outcome:
    """The recording of ``device`` (and ``stream``) from ``steps``, checked against the
    bytes ``live`` while each figure stands."""
    if device is None or parsed.fmt not in _SOURCES:
        return Outcome()
    source = _SOURCES[parsed.fmt]
    if parsed.fmt == "torch-profiler":
        points = [(event, t, size) for event, t, kind, size in steps if kind == "reserved"]
        if not points:
            return Outcome()
        # A figure stands from its event until the next figure's (an event without a
        # figure of its own leaves the last in force).
        return _checked(Recorded(source, device, "window", None, points), live.standing)
    if parsed.segments is None:
        return Outcome(
            missing="the snapshot has no final 'segments' list, so no recording of reserved bytes"
        )
    segments = [
        s for s in parsed.segments if s.device == device and (stream is None or s.stream == stream)
    ]
    final = sum(s.total_size for s in segments)
    net = sum(size if kind == "reserve" else -size for _, _, kind, size in steps)
    initial = final - net
    value = initial
    points = [(0, 0, initial)]
    for event, t, kind, size in steps:
        value += size if kind == "reserve" else -size
        points.append((event, t, value))
    if min(p[2] for p in points) < 0:
        return Outcome(
            left_out=f"the snapshot's segment events of {device} take more than its final "
            "segments hold and the window returns, so no recording of reserved bytes"
        )
    if max(p[2] for p in points) >= U64:
        return Outcome(
            left_out=f"the snapshot's segment events of {device} reserve 2^64 bytes or more "
            "at once, so no recording of reserved bytes"
        )
    flags = {s.expandable for s in segments if s.expandable is not None}
    expandable: bool | None = None
    if device in parsed.mapped_devices or True in flags:
        expandable = True
    elif device in parsed.allocated_devices or False in flags:
        expandable = False
    expandable, settings, notes = run_settings(parsed.allocator_settings, expandable)
    covers = "start" if initial == 0 else "window"
    outcome = _checked(Recorded(source, device, covers, expandable, points, settings), live.peaks)
    return outcome._replace(notes=notes) if outcome.recorded is not None else outcome


def run_settings(
    settings: AllocatorSettings | None, segments_say: bool | None
) -> tuple[bool | None, str | None, tuple[str, ...]]:
    """Whether the run used expandable segments, the name of the model of PyTorch's
    allocator with the run's settings, and the notes to add: from what the segments say
    of expandable segments (``segments_say``) and the snapshot's ``settings``. The
    segments' word is kept where the two disagree; the settings' where the segments
    say nothing. No name where neither says, or without settings."""
    if settings is None:
        return segments_say, None, ()
    notes: list[str] = []
    expandable = segments_say
    if segments_say is None:
        expandable = settings.expandable_segments
    elif settings.expandable_segments not in (None, segments_say):
        said = settings.expandable_segments
        notes.append(
            f"the snapshot's allocator_settings say expandable_segments {said} but its "
            f"segments say {segments_say}: the segments' word is kept"
        )
    if settings.garbage_collection_threshold > 0:
        notes.append(
            f"the run's garbage_collection_threshold {settings.garbage_collection_threshold} "
            "is not modelled: it acts only under a per-process memory fraction, which the "
            "snapshot does not record"
        )
    if expandable is None:
        notes.append(
            "neither the snapshot's allocator_settings nor its segments say whether the run "
            "used expandable segments: the recording carries no allocator settings"
        )
        return None, None, tuple(notes)
    try:
        model = TorchAllocatorModel(
            expandable,
            max_split_size_mb=settings.max_split_size_mb,
            roundup_power2_divisions=(
                None
                if settings.roundup_power2_divisions is None
                else list(settings.roundup_power2_divisions)
            ),
        )
    except InvalidArgument as exc:
        # The snapshot's reader checks every value first: kept for safety.
        notes.append(f"allocator_settings ignored: {exc}")
        return expandable, None, tuple(notes)
    return expandable, model.name, tuple(notes)


def _checked(recorded: Recorded, peaks: list[int]) -> Outcome:
    """``recorded``, or why it is left out where a figure is below the bytes it must
    cover (``peaks``, one per point)."""
    for (event, _, reserved), peak in zip(recorded.points, peaks, strict=True):
        if reserved < peak:
            return Outcome(
                left_out=f"{recorded.source} of {recorded.device} say {human_bytes(reserved)} "
                f"reserved from event {event}, below the {human_bytes(peak)} the trace holds "
                "live while that figure stands, so no recording of reserved bytes"
            )
    return Outcome(recorded)
