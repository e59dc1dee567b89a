"""Time ``cubepool.load_trace`` on the shared traces and on foreign files made from one.

    python scripts/time_trace_loading.py [--repeat N] [--traces DIR] [--clock cpu|wall]

Prints, per file, the best of ``N`` times of ``cubepool.load_trace`` (and
of ``cubepool convert``'s write, ``Trace.write`` or the older ``write_trace_v1``, for
the shared traces). The foreign files (a PyTorch profiler chrome trace and a PyTorch
memory snapshot pickle) are written into a temporary directory from the events of
``gpt2-train``: every allocation at an address of its own, frees naming it, so the
import pairs them back into the same trace.

The clock is this process's CPU time by default (``time.process_time``: the work runs
on this thread, GIL released or not), which other programs on a shared machine disturb
far less than the wall clock (``--clock wall``).
"""

from __future__ import annotations

import argparse
import json
import pickle
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import cubepool

HERE = Path(__file__).resolve().parent
DEFAULT_TRACES = HERE.parent / "python" / "cubepool" / "examples" / "data"


CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}
clock = CLOCKS["cpu"]


def best(repeat: int, work: Callable[[], object]) -> float:
    """The best seconds of ``repeat`` runs of ``work`` by :data:`clock`."""
    times = []
    for _ in range(repeat):
        start = clock()
        work()
        times.append(clock() - start)
    return min(times)


def foreign_files(trace: cubepool.Trace, into: Path) -> dict[str, Path]:
    """A profiler trace and a snapshot pickle holding the events of ``trace``."""
    events = trace.events()
    sizes = {ident: size for _, op, ident, size in events if op == "alloc"}
    memory = []
    entries = []
    for t, op, ident, size in events:
        nbytes = size if op == "alloc" else -sizes[ident]
        memory.append(
            {
                "ph": "i",
                "name": "[memory]",
                "ts": t / 1000,
                "args": {
                    "Addr": 4096 * (ident + 1),
                    "Bytes": nbytes,
                    "Device Type": 0,
                    "Device Id": -1,
                },
            }
        )
        entries.append(
            {
                "action": "alloc" if op == "alloc" else "free_completed",
                "addr": 4096 * (ident + 1),
                "size": abs(nbytes),
                "stream": 0,
                "time_us": t // 1000,
                "frames": [],
            }
        )
    profiler = into / "profiler.json"
    profiler.write_text(json.dumps({"traceEvents": memory}))
    snapshot = into / "snapshot.pickle"
    snapshot.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}))
    return {"torch-profiler": profiler, "torch-snapshot": snapshot}


def main() -> None:
    """Time the loads and print one line per file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    shared = sorted(args.traces.glob("*.jsonl*"))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for path in shared:
            trace = cubepool.load_trace(path)
            load = best(args.repeat, lambda p=path: cubepool.load_trace(p))
            target = out / "copy.jsonl"
            if hasattr(trace, "write"):
                write = best(args.repeat, lambda t=trace, out=target: t.write(out))
            else:
                from cubepool.importers import ImportedTrace, write_trace_v1

                imported = ImportedTrace(header=trace.header, events=trace.events())
                write = best(args.repeat, lambda i=imported, out=target: write_trace_v1(i, out))
            print(
                f"{path.name:28} {len(trace):7} events  load {load * 1e3:8.2f} ms  "
                f"write {write * 1e3:8.2f} ms"
            )
        source = cubepool.load_trace(next(args.traces.glob("gpt2-train.jsonl*")))
        for fmt, path in foreign_files(source, out).items():
            trace = cubepool.load_trace(path)
            assert len(trace) == len(source), (fmt, len(trace), len(source))
            load = best(args.repeat, lambda p=path: cubepool.load_trace(p))
            print(f"{fmt + ' (gpt2-train)':28} {len(trace):7} events  load {load * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
