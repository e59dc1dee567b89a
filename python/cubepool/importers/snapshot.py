"""PyTorch CUDA memory snapshots (``torch.cuda.memory._dump_snapshot``, and a pickled
``torch.cuda.memory_snapshot()``: its segments alone).

The ``alloc`` and ``free_completed`` entries of ``device_traces`` (one list per CUDA
device), read with a restricted unpickler (:mod:`cubepool._pickle`) that never builds
anything but plain containers and scalars. The ``segment_alloc`` / ``segment_free`` /
``segment_map`` / ``segment_unmap`` entries and the final ``segments`` list give what
PyTorch itself reserved (see :mod:`cubepool.importers.recorded`), and the final
segments' active blocks what was live when the snapshot was dumped (pairing puts those
no entry names at the trace's start: they were live before the recording began). Its
``allocator_settings`` (:func:`allocator_settings`) name the model of PyTorch's
allocator the recording is compared with.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Final, Literal

from cubepool._errors import TraceFormatError
from cubepool._pickle import restricted_loads
from cubepool.importers._values import (
    I64_MIN,
    U64,
    Issues,
    StrPath,
    describe,
    is_time,
    optional_int,
    show,
    show_int,
)
from cubepool.importers.limits import Limits
from cubepool.importers.records import AllocatorSettings, LiveBlock, Parsed, Rec, Segment

_SNAPSHOT_IGNORED: Final = frozenset({"free_requested", "oom", "snapshot"})
# A final segment's blocks that hold memory: allocated, or freed by the program but not
# yet by the allocator (waiting on another stream; its ``free_completed`` is still to
# come, so in the trace it is live). PyTorch writes ``active_pending_free``; its
# ``_snapshot`` docstring spells it ``active_awaiting_free``, which is taken too.
_ACTIVE: Final = frozenset({"active_allocated", "active_pending_free", "active_awaiting_free"})
# Segment events: what the allocator took from the device (+) or gave back (-), and
# whether the action belongs to expandable segments.
_SEGMENT_ACTIONS: Final[dict[str, tuple[Literal["reserve", "unreserve"], bool]]] = {
    "segment_alloc": ("reserve", False),
    "segment_free": ("unreserve", False),
    "segment_map": ("reserve", True),
    "segment_unmap": ("unreserve", True),
}


def _check_snapshot_shape(traces: list[list[object]], limits: Limits, path: StrPath) -> None:
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


def parse_snapshot(
    path: StrPath, read: Callable[[], bytes], issues: Issues, limits: Limits
) -> Parsed:
    """The ``alloc`` and ``free_completed`` entries of every device trace. ``read`` gives
    the file's bytes, let go as soon as they are unpickled: held through the parse
    beside the document, they were a seventh of a large snapshot's peak memory."""
    doc = restricted_loads(read(), path=os.fspath(path), limits=limits)
    if isinstance(doc, list) and all(isinstance(s, dict) and "total_size" in s for s in doc):
        # A pickled ``torch.cuda.memory_snapshot()``: the segments alone, no history.
        doc = {"segments": doc, "device_traces": []}
    if not isinstance(doc, dict) or ("device_traces" not in doc and "segments" not in doc):
        raise TraceFormatError(
            f"not a PyTorch CUDA memory snapshot: the pickle holds a {type(doc).__name__} "
            "without a 'device_traces' or 'segments' key",
            path,
        )
    # A snapshot dumped without history (``_record_memory_history`` never called) may
    # have no device traces; its segments' active blocks are still what was live.
    traces = doc.get("device_traces", [])
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise TraceFormatError("'device_traces' must be a list of lists (one per device)", path)
    _check_snapshot_shape(traces, limits, path)

    has_time = any(isinstance(e, dict) and "time_us" in e for t in traces for e in t)
    times = [
        e["time_us"] for t in traces for e in t if isinstance(e, dict) and is_time(e.get("time_us"))
    ]
    origin = min(times) if times else 0
    parsed = Parsed(
        "torch-snapshot",
        [],
        [f"cuda:{i}" for i in range(len(traces))],
        time_note=(
            "snapshot time_us converted to ns"
            if has_time
            else "the snapshot has no time_us: t is the entry's index in its device trace"
        ),
    )
    mapped_devices: set[str] = set()
    allocated_devices: set[str] = set()
    clamped = 0
    stacks = _Stacks()
    for index, entries in enumerate(traces):
        device = f"cuda:{index}"
        last_t = 0
        for i, entry in enumerate(entries):
            where = f"device_traces[{index}][{i}]"
            limits.take()
            if not isinstance(entry, dict):
                issues.bad(f"{where}: an entry must be a dict, got {describe(entry)}")
                continue
            action = entry.get("action")
            if not isinstance(action, str):
                issues.bad(f"{where}: 'action' must be a string, got {describe(action)}")
                continue
            stream = entry.get("stream")
            if action in _SEGMENT_ACTIONS:
                segment_kind, mapped = _SEGMENT_ACTIONS[action]
                nbytes = issues.get_int(entry, "size", where)
                if nbytes is None:
                    continue
                if nbytes < 0:
                    issues.bad(f"{where}: negative size {nbytes}")
                    continue
                (mapped_devices if mapped else allocated_devices).add(device)
                # The time the file gives the change, where it gives a usable one (not
                # before the entries already read); the last block event's otherwise.
                when = entry.get("time_us")
                if has_time and is_time(when):
                    last_t = max(last_t, round((when - origin) * 1000))
                parsed.add(Rec(last_t, segment_kind, 0, nbytes, device, optional_int(stream)), i)
                continue
            if action not in ("alloc", "free_completed"):
                # Not a block allocation or free: only counted, so nothing else is checked.
                if action not in _SNAPSHOT_IGNORED:
                    issues.note(f"{where}: unknown action {action[:40]!r} ignored")
                parsed.add(Rec(last_t, "ignored", 0, 0, device, optional_int(stream)), i)
                continue
            if "stream" in entry:
                stream = issues.get_int(entry, "stream", where)
                if stream is None:
                    continue
            if has_time:
                time_us = issues.get_time(entry, "time_us", where)
                if time_us is None:
                    continue
                t = round((time_us - origin) * 1000)
            else:
                t = i
            if t < last_t:
                t = last_t
                clamped += 1
            last_t = t
            # One malformed entry counted once: the second field is read only where the
            # first is good (both read, an entry missing both counted two).
            addr = issues.get_int(entry, "addr", where)
            if addr is None:
                continue
            size = issues.get_int(entry, "size", where)
            if size is None:
                continue
            if size < 0:
                issues.bad(f"{where}: negative size {size}")
                continue
            kind: Literal["alloc", "free", "zero"] = (
                "zero" if size == 0 else "alloc" if action == "alloc" else "free"
            )
            frames = stacks.read(entry.get("frames")) if kind == "alloc" else None
            parsed.add(Rec(t, kind, addr, size, device, stream, frames), i)
    parsed.clamped = clamped
    parsed.segments, parsed.live_at_dump = _final_segments(doc, issues, limits, stacks)
    # Devices whose segments the snapshot lists beyond its device traces (one without
    # history lists none), in the order of their indices.
    known = set(parsed.devices)
    extra: set[str] = {s.device for s in parsed.segments or () if s.device not in known}
    added = sorted(extra, key=lambda d: int(d.removeprefix("cuda:")))
    parsed.devices.extend(added)
    parsed.mapped_devices = mapped_devices
    parsed.allocated_devices = allocated_devices
    parsed.allocator_settings = allocator_settings(doc, issues)
    return parsed


_MIB: Final = 1 << 20
_SIZE_MAX: Final = U64 - 1
_INTERVALS: Final = tuple(str(1 << i) for i in range(16))
"""The keys of ``allocator_settings["roundup_power2_divisions"]``: the size intervals
in MiB (``kRoundUpPowerOfTwoIntervals``, 16 from 1 MiB), as PyTorch names them."""
_MODELLED: Final = ("expandable_segments", "max_split_size", "roundup_power2_divisions")


class _Malformed(Exception):
    """A value of ``allocator_settings`` that PyTorch could not have written."""


def allocator_settings(doc: dict[object, object], issues: Issues) -> AllocatorSettings | None:
    """The snapshot's ``allocator_settings``, as ``torch/csrc/cuda/memory_snapshot.cpp``
    writes them: ``expandable_segments`` (a bool), ``max_split_size`` (bytes, a whole
    number of MiB of at least 20; PyTorch's default ``SIZE_MAX`` written as the int64
    -1: no limit), ``roundup_power2_divisions`` (a dict from each interval's MiB,
    ``"1"`` to ``"32768"``, to its divisions, each 0 or a power of two) and
    ``garbage_collection_threshold`` (a float in [0, 1)). The other keys
    (``PYTORCH_CUDA_ALLOC_CONF``, ``pinned_*``, ``release_lock_on_cudamalloc``, ...) do
    not change what the model reserves and are passed over.

    ``None`` where the snapshot has no such dict, or a dict without the first three
    (older snapshots); a key left out stands for PyTorch's default. Malformed settings
    (a wrong type, a value PyTorch could not have set) are ignored whole and the notes
    say which value, in strict imports too: the settings only name the model the
    recording is compared with, and the trace is sound without them."""
    if "allocator_settings" not in doc:
        return None
    settings = doc["allocator_settings"]
    try:
        if not isinstance(settings, dict):
            raise _Malformed(f"it must be a dict, got {describe(settings)}")
        if all(settings.get(key) is None for key in _MODELLED):
            return None
        return AllocatorSettings(
            _expandable(settings.get("expandable_segments")),
            _max_split_size_mb(settings.get("max_split_size")),
            _divisions(settings.get("roundup_power2_divisions")),
            _gc_threshold(settings.get("garbage_collection_threshold")),
        )
    except _Malformed as exc:
        issues.note(f"allocator_settings ignored: {exc}")
        return None


def _expandable(value: object) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise _Malformed(f"'expandable_segments' must be a bool, got {describe(value)}")


def _size_t(value: int) -> int | None:
    """The ``size_t`` PyTorch held where it wrote ``value`` as an ``int64_t`` (a negative
    value is one past 2^63); ``None`` outside the 64-bit range."""
    return value % U64 if I64_MIN <= value < U64 else None


def _max_split_size_mb(value: object) -> int | None:
    """``max_split_size`` in MiB; ``None`` for ``SIZE_MAX`` (no limit). PyTorch writes
    its ``size_t`` as an int64, so a negative value is read back as the ``size_t``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Malformed(f"'max_split_size' must be an int, got {describe(value)}")
    size = _size_t(value)
    if size is None:
        raise _Malformed(f"'max_split_size' = {show_int(value)} is outside the 64-bit range")
    if size == _SIZE_MAX:
        return None
    if size % _MIB or size < 20 * _MIB:
        raise _Malformed(
            f"'max_split_size' = {size} B is not a whole number of MiB of at least 20, which "
            "PyTorch's max_split_size_mb sets"
        )
    return size // _MIB


def _divisions(value: object) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _Malformed(f"'roundup_power2_divisions' must be a dict, got {describe(value)}")
    table = [0] * len(_INTERVALS)
    for key, divisions in value.items():
        # PyTorch writes the keys as strings (the unpickler takes no int keys).
        if key not in _INTERVALS:
            raise _Malformed(
                f"'roundup_power2_divisions' has an interval {show(key)}, not one of PyTorch's "
                "1, 2, 4, ... 32768 (MiB)"
            )
        # PyTorch writes its size_t as int64_t: 2^63 divisions (which its stoull takes)
        # come as -2^63, read back as the size_t it held, as max_split_size is.
        held = _size_t(divisions) if type(divisions) is int else None
        if held is None or held & (held - 1) != 0:
            raise _Malformed(
                f"'roundup_power2_divisions'[{show(key)}] = {show(divisions)}: the divisions "
                "must be 0 or a power of two"
            )
        table[_INTERVALS.index(key)] = held
    return tuple(table)


def _gc_threshold(value: object) -> float:
    if value is None:
        return 0.0
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (isinstance(value, int) or math.isfinite(value))
        or not 0 <= value < 1
    ):
        raise _Malformed(
            f"'garbage_collection_threshold' must be a number in [0, 1), got {describe(value)}"
        )
    return float(value)


MAX_FRAMES: Final = 64
"""The most frames kept per allocation (the innermost the filter keeps; the trace keeps no
more)."""
MAX_FRAMES_READ: Final = 512
"""The most frames read per allocation, the innermost: enough for the C++ frames under a
deep Python stack that ``stacks="all"`` records, and a bound on the work a pickle can ask
for each entry."""
OMIT_FUNCTIONS: Final = (
    "unwind::unwind",
    "CapturedTraceback::gather",
    "gather_with_cpp",
    "__libc_start_main",
    "PyEval_",
    "PyObject_",
    "PyFunction_",
)
"""Frames whose function names hold one of these are passed over: the unwinder, the
interpreter's own calls (PyTorch's ``torch.cuda._memory_viz._frame_filter`` omits the
same, so its viewer and cubepool's show the same frames; it omits names holding
``_start`` too, which hides a user's ``on_train_start``: here only the program's entry,
named ``_start`` exactly, is)."""
OMIT_FILENAMES: Final = (
    "core/boxing",
    "/Register",
    "/Redispatch",
    "pythonrun.c",
    "Modules/main.c",
    "Objects/call.c",
    "Objects/methodobject.c",
    "pycore_ceval.h",
    "ceval.c",
    "cpython/abstract.h",
)
"""Frames whose file names hold one of these are passed over: the dispatcher's and the
interpreter's (as ``_frame_filter`` does)."""


def shown_frame(name: str, filename: str) -> bool:
    """Whether a frame is shown: not the unwinder's, the dispatcher's or the interpreter's
    (:data:`OMIT_FUNCTIONS`, :data:`OMIT_FILENAMES`). With ``stacks="all"`` (the default of
    ``_record_memory_history``) every stack starts with a dozen such C++ frames, which
    hid the user's code from the view at the peak."""
    return (
        name != "_start"
        and not any(part in name for part in OMIT_FUNCTIONS)
        and not any(part in filename for part in OMIT_FILENAMES)
    )


MAX_FRAME_CHARS: Final = 240
"""The most characters of a frame the trace keeps (``src/trace/stacks.rs``, which cuts a
longer one there and adds ``...``)."""


_FrameKey = tuple[str, str, int | None]


class _Stacks:
    """Reads trace entries' ``frames`` (PyTorch writes a list of ``{"filename", "line",
    "name"}`` dicts, the most recent call first) as ``"name (filename:line)"`` strings.

    A training step allocates from the same few stacks again and again, and its stacks
    share most of their frames: each distinct frame is formatted once, and each distinct
    stack is one tuple of those shared strings, so an import holds a string per frame and
    a tuple per stack, not strings per entry. (A pickle can make every entry's stack
    different with a few bytes an entry, each naming one of two long frames through its
    memo: formatting every stack's frames afresh took 5.3 GB for a 22 MB snapshot.)
    Frames are optional: a malformed frame is passed over, not counted as a malformed
    entry, and so is a frame of the unwinder, the dispatcher or the interpreter
    (:func:`shown_frame`).

    PyTorch shares each frame's dict among the stacks that hold it, so a dict is read
    once: its text (or that it is not shown) is kept by the dict's identity, with the
    dict itself, so that the identity stays its own while kept (reading every frame's
    fields again was a third of a large snapshot's import).
    """

    def __init__(self) -> None:
        self._frames: dict[_FrameKey, str] = {}
        self._seen: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._by_identity: dict[int, tuple[object, str | None]] = {}

    def read(self, value: object) -> tuple[str, ...] | None:
        """The stack of ``value`` (an entry's ``frames``); ``None`` where there is none."""
        if not isinstance(value, list):
            return None
        stack: list[str] = []
        for frame in value[:MAX_FRAMES_READ]:
            known = self._by_identity.get(id(frame))
            text = known[1] if known is not None else self._read_frame(frame)
            if text is not None:
                stack.append(text)
                if len(stack) == MAX_FRAMES:
                    break
        if not stack:
            return None
        key = tuple(stack)
        return self._seen.setdefault(key, key)

    def _read_frame(self, frame: object) -> str | None:
        """The text of ``frame``, kept by its identity; ``None`` where it is malformed or
        not shown."""
        text = None
        if isinstance(frame, dict):
            name, filename, line = frame.get("name"), frame.get("filename"), frame.get("line")
            if isinstance(name, str) and isinstance(filename, str) and shown_frame(name, filename):
                # Cut to one character more than the trace keeps, so that it still cuts
                # the frame where it would (and marks it cut): a pickle can name one
                # long string in every frame for a few bytes, and each frame built of it
                # whole would copy it.
                cut = MAX_FRAME_CHARS + 1
                text = self._frame((name[:cut], filename[:cut], optional_int(line)))
        self._by_identity[id(frame)] = (frame, text)
        return text

    def _frame(self, key: _FrameKey) -> str:
        """The text of the frame ``key``, the same string object every time."""
        text = self._frames.get(key)
        if text is None:
            name, filename, line = key
            text = f"{name} ({filename}:{line})" if line is not None else f"{name} ({filename})"
            if not text.isascii():
                # A lone surrogate (the unpickler keeps one, as Python's does) is no
                # UTF-8 text, which a trace's frames are: it becomes U+FFFD, as the
                # header's file names do (it raised a bare TypeError naming no file).
                text = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
            self._frames[key] = text
        return text


class _Unshared:
    """Refuses a snapshot whose final ``segments`` name one segment, ``blocks`` list or
    block twice, as :func:`_check_snapshot_shape` does for device traces and entries: a
    pickle can reference one object many times for a few bytes each (a 33 KB pickle of
    1,000 segments sharing one list of 1,990 blocks stood for two million live blocks),
    and PyTorch never writes such sharing."""

    def __init__(self, path: StrPath) -> None:
        self._path = path
        self._seen: set[int] = set()

    def check(self, value: object, where: str, what: str) -> None:
        if id(value) in self._seen:
            raise TraceFormatError(
                f"{where} is the same {what} as an earlier one (a shared pickle reference "
                "PyTorch never writes); refusing the snapshot",
                self._path,
            )
        self._seen.add(id(value))


def _final_segments(
    doc: dict[object, object], issues: Issues, limits: Limits, stacks: _Stacks
) -> tuple[list[Segment] | None, list[LiveBlock] | None]:
    """The snapshot's final ``segments`` list: what was reserved when it was dumped, and
    the blocks then live (see :func:`_active_blocks`). ``None`` for both where the
    snapshot has no such list or it is malformed; ``None`` for the blocks where a
    segment's ``blocks`` is malformed."""
    if "segments" not in doc:
        return None, None
    entries = doc["segments"]
    if not isinstance(entries, list):
        issues.bad(f"'segments' must be a list, got {describe(entries)}")
        return None, None
    segments: list[Segment] = []
    live: list[LiveBlock] | None = []
    reserved: dict[str, int] = {}  # total_size by device, checked to fit 64 bits
    unshared = _Unshared(issues.path)
    for i, entry in enumerate(entries):
        where = f"segments[{i}]"
        limits.take()
        if not isinstance(entry, dict):
            issues.bad(f"{where}: a segment must be a dict, got {describe(entry)}")
            return None, None
        unshared.check(entry, where, "segment")
        index = issues.get_int(entry, "device", where)
        size = issues.get_int(entry, "total_size", where)
        if index is None or size is None:
            return None, None
        if index < 0 or size < 0:
            issues.bad(f"{where}: negative device or total_size")
            return None, None
        device = f"cuda:{index}"
        reserved[device] = reserved.get(device, 0) + size
        if reserved[device] >= U64:
            issues.bad(f"{where}: the segments of {device} hold 2^64 bytes or more in all")
            return None, None
        stream = entry.get("stream")
        expandable = entry.get("is_expandable")
        segment = Segment(
            device,
            optional_int(stream),
            size,
            expandable if isinstance(expandable, bool) else None,
        )
        segments.append(segment)
        if live is not None:
            blocks = _active_blocks(entry, segment, where, issues, limits, stacks, unshared)
            if blocks is None:
                live = None
            else:
                live.extend(blocks)
    return segments, live


def _latest_use(block: dict[object, object]) -> dict[object, object]:
    """What torch 2.0 recorded of a final segment's block's latest allocation: the first
    entry of its ``history``, newest first (``frames``, ``real_size``; PyTorch's own
    ``_memory_viz._block_extra_legacy`` reads ``history[0]``), or ``{}`` where it has
    none (torch 2.1 on writes ``frames`` and ``requested_size`` on the block itself)."""
    history = block.get("history")
    if isinstance(history, list) and history and isinstance(history[0], dict):
        return history[0]
    return {}


def _active_blocks(
    entry: dict[object, object],
    segment: Segment,
    where: str,
    issues: Issues,
    limits: Limits,
    stacks: _Stacks,
    unshared: _Unshared,
) -> list[LiveBlock] | None:
    """The active blocks of one final segment, each at its ``address`` (or, where a
    block has none, where the blocks before it in its segment end, as
    ``torch/cuda/_memory_viz.py`` places them). ``None`` where its ``blocks`` is
    malformed; a segment without ``blocks`` lists none."""
    listed = entry.get("blocks")
    if listed is None:
        return []
    if not isinstance(listed, list):
        issues.bad(f"{where}.blocks must be a list, got {describe(listed)}")
        return None
    unshared.check(listed, f"{where}.blocks", "list of blocks")
    at = optional_int(entry.get("address")) or 0
    blocks: list[LiveBlock] = []
    for j, block in enumerate(listed):
        where_block = f"{where}.blocks[{j}]"
        limits.take()
        if not isinstance(block, dict):
            issues.bad(f"{where_block}: a block must be a dict, got {describe(block)}")
            return None
        unshared.check(block, where_block, "block")
        size = issues.get_int(block, "size", where_block)
        if size is None:
            return None
        if size < 0:
            issues.bad(f"{where_block}: negative size {size}")
            return None
        address = optional_int(block.get("address"))
        addr = at if address is None else address
        at = addr + size
        state = block.get("state")
        if size == 0 or not (isinstance(state, str) and state in _ACTIVE):
            continue
        latest = _latest_use(block)
        requested = optional_int(block.get("requested_size", latest.get("real_size")))
        asked = requested if requested is not None and 0 < requested <= size else size
        blocks.append(
            LiveBlock(
                segment.device,
                segment.stream,
                addr,
                asked,
                stacks.read(block["frames"] if "frames" in block else latest.get("frames")),
                where_block,
            )
        )
    return blocks
