"""PyTorch profiler chrome traces (``torch.profiler`` with ``profile_memory=True``).

The ``"[memory]"`` instant events of ``traceEvents``: ``args.Bytes`` > 0 is an
allocation at ``args.Addr``, < 0 the free of the allocation live at that address.
Events are ordered by ``ts`` (microseconds; stable for ties). ``ProfilerStep#N`` spans,
when present, become the header's ``phases`` (a step span without a usable ``ts`` is a
malformed entry). ``args["Total Reserved"]``, where the
events carry it, is what PyTorch's allocator had reserved on the device after the event
(see :mod:`cubepool.importers.recorded`); CPU events' is passed over (PyTorch's CPU
allocator keeps no reserve of its own and always writes 0).
"""

from __future__ import annotations

import json
import re
import sys
from array import array
from collections.abc import Callable
from typing import Final, Literal

from cubepool._errors import TraceFormatError
from cubepool.importers._values import Issues, StrPath, describe
from cubepool.importers.limits import Limits
from cubepool.importers.records import Parsed, Rec

# c10::DeviceType values as the profiler writes them in "Device Type".
_DEVICE_TYPES: Final = {0: "cpu", 1: "cuda", 6: "hip", 9: "xla", 12: "xpu", 13: "mps"}
# The args of a profiler [memory] event the importer reads.
_PROFILER_ARGS: Final = ("Addr", "Bytes", "Device Type", "Device Id", "Total Reserved")
# A step span's name: its number in ASCII digits (no more than an int64 holds); any other
# "ProfilerStep#..." is not a step.
_STEP_RE: Final = re.compile(r"ProfilerStep#([0-9]{1,18})")
# What the profiler's JSON hook returns for an object it does not keep.
_DISCARDED: Final[dict[str, object]] = {}


def _device_name(device_type: int, device_id: int) -> str:
    if device_type == 0:
        return "cpu"
    base = _DEVICE_TYPES.get(device_type, f"device_type{device_type}")
    return f"{base}:{device_id}" if device_id >= 0 else base


def device_order(name: str | None) -> tuple[int, str, int]:
    """The sort key of a device name: CPU first, then by name and index."""
    if name is None:
        return (0, "", 0)
    base, _, index = name.partition(":")
    return (0 if base == "cpu" else 1, base, int(index) if index.isdigit() else -1)


def _profiler_hook(limits: Limits) -> Callable[[list[tuple[str, object]]], object]:
    """A ``json`` object hook that keeps only what the profiler importer reads.

    Events (objects with a string ``"name"`` and a ``"ph"`` or ``"ts"``, which every
    Chrome trace event has) other than ``[memory]`` and ``ProfilerStep#N`` become one
    shared empty dict as soon as they are parsed, so the operator, kernel and metadata
    events of a trace cost no memory. An object named but not an event, such as an
    event's ``args`` holding a ``"name"`` (parsed before its event), is kept: discarded,
    a ``[memory]`` event's ``args`` with a ``"name"`` read as missing every field. The
    objects kept count against ``max_events`` twice over (an event and its ``args``):
    the document can never build more than that, whatever it weighs.
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
            and ("ph" in obj or "ts" in obj)
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


def _long_integer_at(data: bytes) -> tuple[int, int] | None:
    """The line and column (1-based) of the first run of more digits than Python turns
    into an integer (``sys.get_int_max_str_digits()``, which ``json`` refuses without
    a position), or None where there is none (or no limit)."""
    limit = sys.get_int_max_str_digits()
    found = re.search(rb"[0-9]{%d,}" % (limit + 1), data) if limit else None
    if found is None:
        return None
    start = found.start()
    line_start = data.rfind(b"\n", 0, start) + 1
    return data.count(b"\n", 0, start) + 1, start - line_start + 1


def parse_profiler(path: StrPath, data: bytes, issues: Issues, limits: Limits) -> Parsed:
    """The ``[memory]`` events and ``ProfilerStep#N`` spans of a chrome trace."""
    try:
        doc = json.loads(data, object_pairs_hook=_profiler_hook(limits))
    except TraceFormatError:
        raise
    except json.JSONDecodeError as exc:
        raise TraceFormatError(
            f"invalid JSON: {exc.msg} (column {exc.colno})", path, exc.lineno
        ) from exc
    except (ValueError, RecursionError) as exc:
        long_at = _long_integer_at(data)
        if isinstance(exc, ValueError) and long_at is not None:
            line, column = long_at
            raise TraceFormatError(
                f"invalid JSON: an integer of over {sys.get_int_max_str_digits():,} digits "
                f"(column {column})",
                path,
                line,
            ) from exc
        raise TraceFormatError(f"invalid JSON: {exc}", path) from exc
    if isinstance(doc, dict):
        if "traceEvents" not in doc:
            raise TraceFormatError("not a chrome trace: no 'traceEvents' key", path)
        events = doc["traceEvents"]
    else:
        events = doc
    if not isinstance(events, list):
        raise TraceFormatError(f"'traceEvents' must be a list, got {describe(events)}", path)

    # (ts_us, kind, addr, size, device, index in traceEvents)
    raw: list[tuple[float, Literal["alloc", "free", "zero", "reserved"], int, int, str, int]] = []
    step_starts: dict[str, float] = {}
    for i, event in enumerate(events):
        where = f"traceEvents[{i}]"
        if not isinstance(event, dict):
            issues.bad(f"{where}: an event must be an object, got {describe(event)}")
            continue
        name = event.get("name")
        if isinstance(name, str) and name.startswith("ProfilerStep#"):
            step = _STEP_RE.fullmatch(name)
            if step:
                ts = issues.get_time(event, "ts", f"{where} ({name})")
                if ts is not None:
                    phase = f"step{int(step[1])}"
                    step_starts[phase] = min(ts, step_starts.get(phase, ts))
            continue
        if name != "[memory]":
            continue
        where = f"{where} ([memory])"
        args = event.get("args")
        if not isinstance(args, dict):
            issues.bad(f"{where}: 'args' must be an object, got {describe(args)}")
            continue
        ts = issues.get_time(event, "ts", where)
        if ts is None:
            continue
        # Read in turn, to the first that is bad: one malformed event counted once.
        fields: list[int] = []
        for key in ("Addr", "Bytes", "Device Type", "Device Id"):
            value = issues.get_int(args, key, where)
            if value is None:
                break
            fields.append(value)
        if len(fields) < 4:
            continue
        addr, nbytes, device_type, device_id = fields
        device = _device_name(device_type, device_id)
        limits.take()
        if nbytes > 0:
            raw.append((ts, "alloc", addr, nbytes, device, i))
        elif nbytes < 0:
            raw.append((ts, "free", addr, -nbytes, device, i))
        else:
            raw.append((ts, "zero", addr, 0, device, i))
        reserved = args.get("Total Reserved")
        if device != "cpu" and type(reserved) is int and 0 <= reserved < 1 << 64:
            # The allocator's reserved bytes after this event; right after it in order.
            raw.append((ts, "reserved", 0, reserved, device, i))

    raw.sort(key=lambda r: r[0])  # stable: ties keep file order
    starts = [r[0] for r in raw] + list(step_starts.values())
    origin = min(starts) if starts else 0.0
    records = [
        Rec(round((ts - origin) * 1000), kind, addr, size, device, None)
        for ts, kind, addr, size, device, _ in raw
    ]
    phases = sorted(
        ((name, round((ts - origin) * 1000)) for name, ts in step_starts.items()),
        key=lambda p: (p[1], int(p[0].removeprefix("step"))),
    )
    devices = sorted({r.device for r in records}, key=device_order)
    return Parsed(
        "torch-profiler",
        records,
        list(devices),
        phases=phases,
        time_note="profiler ts (microseconds) converted to ns",
        origins=array("Q", (index for *_, index in raw)),
    )
