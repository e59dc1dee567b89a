"""Choosing what to import from a file that holds several devices or streams."""

from __future__ import annotations

from typing import Final

from cubepool._errors import TraceFormatError, TraceSelectionError
from cubepool._format import human_bytes, listed
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


def choose_device(
    parsed: Parsed, device: str | int | None, path: StrPath, *, live_at_dump: bool = True
) -> tuple[str | None, str]:
    """The device to import and, where the file left the choice to cubepool, a sentence
    saying which it took and why (else ``""``).

    ``device`` is checked against the file. ``None`` takes the only device with blocks
    (``None`` for an RMM log, which records no device) or, of several, the one whose
    blocks' peak live bytes are the largest (:func:`peak_live_by_device`): a GPU run's
    profiler trace records the CPU's blocks beside the GPU's, and a process that touched
    a second GPU holds a few bytes there, while the workload is where the memory is. A
    snapshot's blocks live when it was dumped count as blocks when ``live_at_dump`` (a
    snapshot of a process that never recorded its history holds nothing else).

    Raises:
        TraceFormatError: ``device`` is ``None`` and the file holds no block at all (an
            RMM log of only its header or of failed operations, too).
        TraceSelectionError: ``device`` is not in the file, or not ``None`` for an RMM log.
    """
    names = tuple(d for d in parsed.devices if d is not None)
    if parsed.fmt == "rmm-csv" and device is not None:
        raise TraceSelectionError("RMM logs record no device: leave device=None", path)
    if device is None:
        peaks = peak_live_by_device(parsed, live_at_dump=live_at_dump)
        present = [d for d in parsed.devices if d in peaks]
        if not present:
            raise TraceFormatError(
                f"the file holds no allocation events {_HINTS[parsed.fmt]}", path
            )
        if len(present) == 1:
            return present[0], ""
        # The largest peak; of equal ones the first in the file's order of devices.
        ranked = sorted(present, key=lambda d: -peaks[d])
        chosen, runner_up = ranked[0], ranked[1]
        devices = listed([str(d) for d in present])
        why = (
            f"the file holds blocks on {len(present):,} devices ({devices}); imported "
            f"{chosen}, whose peak live bytes are the largest ({human_bytes(peaks[chosen])}; "
            f"next {runner_up}, {human_bytes(peaks[runner_up])}): choose another with device=..."
        )
        return chosen, why
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
    return name, ""


def peak_live_by_device(parsed: Parsed, *, live_at_dump: bool = True) -> dict[str | None, int]:
    """The peak live bytes of each device with blocks, in one pass over the records.

    An allocation adds its bytes and a free of a live block takes them off (a free of a
    block allocated before the recording began takes nothing off: its bytes were never
    counted). A snapshot's blocks live when it was dumped, where ``live_at_dump``, bound
    the peak from below (all of them were live at once). A device with blocks is in the
    result even where its peak is 0 bytes."""
    live: dict[str | None, dict[int, int]] = {}
    now: dict[str | None, int] = {}
    peaks: dict[str | None, int] = {}
    for r in parsed.records:
        if r.kind == "alloc":
            blocks = live.setdefault(r.device, {})
            current = now.get(r.device, 0) - blocks.get(r.addr, 0) + r.size
            blocks[r.addr] = r.size
            now[r.device] = current
            peaks[r.device] = max(peaks.get(r.device, 0), current)
        elif r.kind == "free":
            size = live.setdefault(r.device, {}).pop(r.addr, 0)
            now[r.device] = now.get(r.device, 0) - size
            peaks.setdefault(r.device, 0)
    if live_at_dump:
        at_dump: dict[str | None, int] = {}
        for block in parsed.live_at_dump or ():
            at_dump[block.device] = at_dump.get(block.device, 0) + block.size
        for d, held in at_dump.items():
            peaks[d] = max(peaks.get(d, 0), held)
    return peaks


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
