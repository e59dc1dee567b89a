"""Reading a PyTorch memory snapshot: cubepool's restricted unpickler against Python's.

    python benches/python/bench_unpickle.py [--entries N] [--frames F] [--repeat R]

Writes a synthetic snapshot of ``N`` trace entries (allocations and frees of a few
sizes), each with ``F`` stack frames as PyTorch records them (``{"filename", "line",
"name"}`` dicts, fresh strings in every frame, as a snapshot of a long run has), then
times, in one process and in turn (best of ``R`` by this process's CPU time):

- ``pickle.loads``: Python's C unpickler, which runs whatever a pickle names: the peer,
  and the floor for building the same objects;
- ``pickle._loads`` with every global refused: the restricted unpickler cubepool used
  until stop 72 (the pure-Python unpickler, ``find_class`` refusing everything);
- ``cubepool._pickle.restricted_loads``: cubepool's compiled one;
- ``cubepool.load_trace``: the whole import (unpickling, the entries read, the trace
  built).

The defaults (100,000 entries of 20 frames) make a pickle of about 180 MB. ``--quick``
runs 2,000 entries once.
"""

from __future__ import annotations

import argparse
import pickle
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import cubepool
from cubepool._pickle import restricted_loads


class _RefusingUnpickler(pickle._Unpickler):  # type: ignore[name-defined,misc]
    """The pure-Python unpickler with every global refused (cubepool's before)."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise pickle.UnpicklingError(f"global {module}.{name}")


def _python_restricted(data: bytes) -> object:
    import io

    return _RefusingUnpickler(io.BytesIO(data)).load()


def snapshot(entries: int, frames: int, seed: int = 1) -> dict[str, Any]:
    """A snapshot document of ``entries`` trace entries with ``frames`` frames each."""
    rng = random.Random(seed)
    live: list[tuple[int, int]] = []
    trace = []
    for i in range(entries):
        if live and (rng.random() < 0.5 or len(live) > 500):
            addr, size = live.pop(rng.randrange(len(live)))
            action = "free_completed"
        else:
            addr = 0x7F0000000000 + i * 4096
            size = rng.choice([512, 4096, 1 << 20, 3 << 20, 64 << 20])
            live.append((addr, size))
            action = "alloc"
        stack = [
            {
                "filename": f"/usr/lib/python3.11/site-packages/torch/nn/modules/module{k % 7}.py",
                "line": 100 + k + i % 13,
                "name": f"forward_{k % 5}",
            }
            for k in range(frames)
        ]
        trace.append(
            {
                "action": action,
                "addr": addr,
                "size": size,
                "stream": 0,
                "time_us": 10 * i,
                "frames": stack,
                "compile_context": "N/A",
                "user_metadata": "",
            }
        )
    return {"segments": [], "device_traces": [trace], "allocator_settings": {}}


def best(repeat: int, work: Callable[[], object]) -> float:
    """The least CPU seconds of ``repeat`` runs of ``work``."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        work()
        times.append(time.process_time() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--frames", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2,000 entries, once")
    args = parser.parse_args()
    if args.quick:
        args.entries, args.repeat = 2_000, 1
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "snapshot.pickle"
        path.write_bytes(pickle.dumps(snapshot(args.entries, args.frames), protocol=4))
        data = path.read_bytes()
        assert restricted_loads(data) == _python_restricted(data) == pickle.loads(data)
        rows = [
            ("pickle.loads (C, runs what it names)", lambda: pickle.loads(data)),
            ("pure-Python, globals refused (before)", lambda: _python_restricted(data)),
            ("cubepool restricted_loads", lambda: restricted_loads(data)),
            ("cubepool.load_trace (the whole import)", lambda: cubepool.load_trace(path)),
        ]
        # One pass of the slow one is enough to see it; the others take the best.
        times = [best(1 if "before" in name else args.repeat, work) for name, work in rows]
    floor = times[0]
    print(f"{len(data):,} bytes of pickle: {args.entries:,} entries of {args.frames} frames")
    print()
    print("| reader | CPU seconds | / pickle.loads |")
    print("|---|---:|---:|")
    for (name, _), seconds in zip(rows, times, strict=True):
        print(f"| {name} | {seconds:.2f} | {seconds / floor:.2f}x |")


if __name__ == "__main__":
    main()
