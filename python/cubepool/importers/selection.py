"""Choosing what to import from a file that holds several devices or streams."""

from __future__ import annotations

from typing import Final

from cubepool._errors import TraceFormatError, TraceSelectionError
from cubepool._format import human_bytes, listed
from cubepool.importers._values import StrPath, describe
from cubepool.importers.pairing import live_before_by_device
from cubepool.importers.records import Parsed, is_block
from cubepool.importers.types import DeviceInfo


# What a file without allocation events was missing, by format.
def _zero_sized(parsed: Parsed) -> str:
    """Why the file's block entries made no event, where all were of 0 bytes (a trace
    keeps no 0-byte blocks); empty where it has none."""
    zero = sum(1 for rec in parsed.records if rec.kind == "zero")
    if not zero:
        return ""
    if zero == 1:
        return "(its one block entry is of 0 bytes, which is skipped)"
    return f"(its {zero:,} block entries are all of 0 bytes, which are skipped)"


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
    # A snapshot's blocks live at its dump are imported too (the only blocks of one
    # dumped without history): their streams are the device's.
    for block in parsed.live_at_dump or ():
        if block.stream is not None and block.device in streams:
            streams[block.device].add(block.stream)
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
    parsed: Parsed, device: str | int | None, path: StrPath, *, live_before: bool = True
) -> tuple[str | None, str]:
    """The device to import and, where the file left the choice to cubepool, a sentence
    saying which it took and why (else ``""``).

    ``device`` is checked against the file. ``None`` takes the only device with blocks
    (``None`` for an RMM log, which records no device) or, of several, a GPU before the
    CPU and then the one whose blocks' peak live bytes are the largest
    (:func:`peak_live_by_device`, with the blocks live before the recording where
    ``live_before``, as the import would hold them): a GPU run's profiler trace records
    the CPU's blocks (host allocations, another allocator's) beside the GPU's, and a
    process that touched a second GPU holds a few bytes there, while the workload is
    where the memory is. A snapshot's blocks live when it was dumped count as blocks
    where ``live_before`` (a snapshot of a process that never recorded its history holds
    nothing else).

    Raises:
        TraceFormatError: ``device`` is ``None`` and the file holds no block at all (an
            RMM log of only its header or of failed operations, too).
        TraceSelectionError: ``device`` is not in the file, or not ``None`` for an RMM log.
    """
    names = tuple(d for d in parsed.devices if d is not None)
    if parsed.fmt == "rmm-csv" and device is not None:
        raise TraceSelectionError("RMM logs record no device: leave device=None", path)
    if device is None:
        peaks = peak_live_by_device(parsed, live_before=live_before)
        present = [d for d in parsed.devices if d in peaks]
        if not present:
            raise TraceFormatError(
                f"the file holds no allocation events {_zero_sized(parsed) or _HINTS[parsed.fmt]}",
                path,
            )
        if len(present) == 1:
            return present[0], ""
        # A GPU before the CPU, then the largest peak; of equal ones the first in the
        # file's order of devices (sorted is stable).
        ranked = sorted(present, key=lambda d: (d == "cpu", -peaks[d]))
        chosen = ranked[0]
        devices = listed([str(d) for d in present])
        held = f"{chosen}'s blocks peak at {human_bytes(peaks[chosen])}"
        gpus = [d for d in ranked if d != "cpu"]
        if chosen == "cpu" or "cpu" not in present:
            why = f"whose blocks' peak live bytes are the largest ({held}; next {ranked[1]}, "
            why += f"{human_bytes(peaks[ranked[1]])})"
        elif len(gpus) == 1:
            why = f"the only GPU, a GPU going before the CPU ({held}, the CPU's at "
            why += f"{human_bytes(peaks['cpu'])})"
        else:
            why = f"of the GPUs the one whose blocks' peak live bytes are the largest ({held}; "
            why += f"next {gpus[1]}, {human_bytes(peaks[gpus[1]])}), a GPU going before the CPU"
        return chosen, (
            f"the file holds blocks on {len(present):,} devices ({devices}); imported "
            f"{chosen}, {why}: choose another with device=..."
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
    return name, ""


def peak_live_by_device(parsed: Parsed, *, live_before: bool = True) -> dict[str | None, int]:
    """The peak live bytes of each device with blocks, as its import would hold them, in
    two passes over the records (not two a device: a profiler trace names any number).

    An allocation adds its bytes and a free of a live block takes them off. Where
    ``live_before``, the blocks the import allocates at the trace's start (see
    :func:`~cubepool.importers.pairing.live_before`: a block the recording frees at an
    address none of its allocations named before, and a snapshot's block live at its
    dump at an address none names) are live from the start until their free, if any.
    A device with blocks is in the result even where its peak is 0 bytes."""
    start = live_before_by_device(parsed) if live_before else {}
    held = {d: {addr: size for addr, (size, _, _) in blocks.items()} for d, blocks in start.items()}
    now = {d: sum(blocks.values()) for d, blocks in held.items()}
    peaks = dict(now)
    for r in parsed.records:
        if r.kind == "alloc":
            blocks = held.setdefault(r.device, {})
            current = now.get(r.device, 0) - blocks.get(r.addr, 0) + r.size
            blocks[r.addr] = r.size
            now[r.device] = current
            peaks[r.device] = max(peaks.get(r.device, 0), current)
        elif r.kind == "free":
            now[r.device] = now.get(r.device, 0) - held.setdefault(r.device, {}).pop(r.addr, 0)
            peaks.setdefault(r.device, 0)
    return peaks


def check_stream(
    parsed: Parsed, device: str | None, stream: int, path: StrPath, *, live_before: bool = True
) -> None:
    """Refuse a ``stream`` the file does not hold on ``device``: among its blocks, with a
    snapshot's blocks live at its dump where ``live_before`` (they are imported then)."""
    if parsed.fmt == "torch-profiler":
        raise TraceSelectionError("profiler traces record no streams: leave stream=None", path)
    if isinstance(stream, bool) or not isinstance(stream, int):
        raise TraceSelectionError(f"stream must be an int, got {describe(stream)}", path)
    streams = sorted(
        {r.stream for r in parsed.records if is_block(r, device) and r.stream is not None}
        | {
            b.stream
            for b in ((parsed.live_at_dump or ()) if live_before else ())
            if b.device == device and b.stream is not None
        }
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
