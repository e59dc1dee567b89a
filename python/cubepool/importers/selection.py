"""Choosing what to import from a file that holds several devices or streams."""

from __future__ import annotations

from typing import Final

from cubepool._errors import TraceFormatError, TraceSelectionError
from cubepool._format import listed
from cubepool.importers._values import StrPath, describe
from cubepool.importers.records import Parsed, is_block
from cubepool.importers.types import DeviceInfo

# What a file without allocation events was missing, by format.
_HINTS: Final = {
    "torch-profiler": "on any device (record with torch.profiler.profile(profile_memory=True))",
    "torch-snapshot": (
        "on any device (call torch.cuda.memory._record_memory_history() before the workload)"
    ),
    "rmm-csv": "(no allocate or free line; failed operations allocate nothing)",
}


def device_infos(parsed: Parsed) -> list[DeviceInfo]:
    """What ``parsed`` holds on each of its devices, in their order: streams and
    allocation and free counts, in one pass over the records (a pass a device made
    listing a file of many devices quadratic: a profiler trace names any device id)."""
    streams: dict[str | None, set[int]] = {d: set() for d in parsed.devices}
    counts: dict[tuple[str | None, str], int] = {}
    for r in parsed.records:
        if r.kind in ("alloc", "free"):
            key = (r.device, r.kind)
            counts[key] = counts.get(key, 0) + 1
            if r.stream is not None and r.device in streams:
                streams[r.device].add(r.stream)
    return [
        DeviceInfo(
            device=device,
            streams=tuple(sorted(streams[device])),
            allocs=counts.get((device, "alloc"), 0),
            frees=counts.get((device, "free"), 0),
        )
        for device in parsed.devices
    ]


def choose_device(parsed: Parsed, device: str | int | None, path: StrPath) -> str | None:
    """The device to import: ``device`` checked against the file, or the only one with
    allocations (``None`` for an RMM log, which records no device).

    Raises:
        TraceFormatError: ``device`` is ``None`` and the file holds no allocation or free
            of a block (an RMM log of only its header or of failed operations, too).
        TraceSelectionError: ``device`` is not in the file, or is needed and not given.
    """
    names = tuple(d for d in parsed.devices if d is not None)
    if parsed.fmt == "rmm-csv" and device is not None:
        raise TraceSelectionError("RMM logs record no device: leave device=None", path)
    if device is None:
        with_blocks = {r.device for r in parsed.records if r.kind in ("alloc", "free")}
        present = [d for d in parsed.devices if d in with_blocks]
        if not present:
            raise TraceFormatError(
                f"the file holds no allocation events {_HINTS[parsed.fmt]}", path
            )
        if len(present) == 1:
            return present[0]
        raise TraceSelectionError(
            f"the file holds allocations on several devices ({len(present):,}): "
            f"{listed([str(d) for d in present])}; choose one with device=...",
            path,
            tuple(map(str, present)),
        )
    if isinstance(device, bool) or not isinstance(device, str | int):
        raise TraceSelectionError(f"device must be a str or int, got {describe(device)}", path)
    # A bare number names a CUDA device, from Python (device=1) as from the command line
    # (--device 1).
    text = str(device) if isinstance(device, int) else device.strip().lower()
    name = f"cuda:{text}" if text.isdigit() else text
    if name not in names:
        raise TraceSelectionError(
            f"no device {name!r} in the file; it holds: {listed(names)}",
            path,
            names,
        )
    return name


def check_stream(parsed: Parsed, device: str | None, stream: int, path: StrPath) -> None:
    """Refuse a ``stream`` the file does not hold on ``device``."""
    if parsed.fmt == "torch-profiler":
        raise TraceSelectionError("profiler traces record no streams: leave stream=None", path)
    if isinstance(stream, bool) or not isinstance(stream, int):
        raise TraceSelectionError(f"stream must be an int, got {describe(stream)}", path)
    streams = sorted(
        {r.stream for r in parsed.records if is_block(r, device) and r.stream is not None}
    )
    if stream not in streams:
        available = tuple(str(s) for s in streams)
        raise TraceSelectionError(
            f"no allocations on stream {stream}"
            + (f" of {device}" if device else "")
            + f"; streams present: {listed(available)}",
            path,
            available,
        )
