"""What a late start of recording costs a replay, with and without the blocks then live.

A PyTorch memory snapshot holds the entries of its ring buffer only (``max_entries``),
or only those since ``_record_memory_history`` was called; the blocks live before then
have no allocation in it. This script makes such a snapshot from a whole trace: each
allocation at an address of its own, the final ``segments`` listing the blocks live at
the end, and the first ``--cut`` share of the entries dropped. It then imports the
window twice, with the blocks live at the cut allocated at its start (the default) and
started empty (``live_before=False``), and prints each one's peak of live bytes and the
peak reserved by the default layout and the two models of PyTorch's allocator, beside
the whole trace's::

    python benches/python/late_start.py gpt2-train transformer-train --cut 0.3

The peak of live bytes of the window with the blocks then live is the whole run's
wherever the run's peak comes after the cut (a step of a training loop repeats it); a
window started empty misses the blocks that lived across the cut (weights, optimizer
state). The peaks reserved differ from the whole run's by placement alone: the blocks
live at the cut are placed first, in address order (here the order they were made in).
"""

from __future__ import annotations

import argparse
import pickle
import tempfile
from pathlib import Path
from typing import Any

import cubepool
from cubepool.importers import import_trace

MIB = 1 << 20
LAYOUTS = ("default", "torch_expandable", "torch")


def snapshot_window(trace: cubepool.Trace, cut: int) -> dict[str, Any]:
    """A snapshot of ``trace`` whose history starts at event ``cut``: each allocation
    at an address of its own, the final segments holding the blocks live at the end."""
    base = 0x7F00_0000_0000
    entries: list[dict[str, Any]] = []
    live: dict[int, int] = {}
    for t, op, ident, size in trace.events():
        addr = base + ident * (1 << 32)
        if op == "alloc":
            live[addr] = size
        else:
            size = live.pop(addr)
        action = "alloc" if op == "alloc" else "free_completed"
        entries.append(
            {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t // 1000}
        )
    segments = [
        {
            "device": 0,
            "address": addr,
            "total_size": size,
            "stream": 0,
            "blocks": [
                {"address": addr, "size": size, "requested_size": size, "state": "active_allocated"}
            ],
        }
        for addr, size in live.items()
    ]
    return {"device_traces": [entries[cut:]], "segments": segments}


def row(label: str, trace: cubepool.Trace) -> str:
    """One line: the trace's peak of live bytes and each layout's peak reserved."""
    peaks = "  ".join(
        f"{layout} {cubepool.replay(trace, layout).peak_reserved / MIB:8.1f}" for layout in LAYOUTS
    )
    return f"  {label:24s} peak live {trace.peak_live / MIB:8.1f} MiB  {peaks}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", help="trace files or bundled example names")
    parser.add_argument(
        "--cut", type=float, default=0.3, help="the share of entries the window drops"
    )
    args = parser.parse_args()
    if not 0 <= args.cut < 1:
        parser.error(f"--cut must be in [0, 1), got {args.cut}")
    for name in args.traces:
        trace = cubepool.load_trace(name)
        cut = int(len(trace) * args.cut)
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "window.pickle"
            path.write_bytes(pickle.dumps(snapshot_window(trace, cut), protocol=4))
            held = import_trace(path)
            empty = import_trace(path, live_before=False)
        print(f"{name}: the window drops the first {cut:,} of {len(trace):,} events")
        print(row("whole run", trace))
        print(row("window, live before", held.trace))
        print(row("window, started empty", empty.trace))
        print(f"    import: {held.dropped.summary()}")


if __name__ == "__main__":
    main()
