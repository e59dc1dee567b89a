"""Measure what hostile trace files cost to import: seconds and peak memory (max RSS).

    python tests/python/fuzz/measure_hostile_imports.py [--quick]

Builds the inputs of issue 22 in a temporary folder (gzip bombs of profiler JSON, a
pickle that references one list thousands of times, a compressed RMM log of millions
of lines) and imports each in a fresh process with ``cubepool.load_trace``, at the
default bounds and at ``max_events=1_000_000``; prints one line per import. The
README's "Reliability" section quotes its output. ``--quick`` makes inputs a tenth the
size.
"""

from __future__ import annotations

import argparse
import gzip
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import resource, sys, time
import cubepool
kwargs = {} if sys.argv[2] == "default" else {"max_events": int(sys.argv[2])}
start = time.perf_counter()
try:
    outcome = f"loaded {len(cubepool.load_trace(sys.argv[1], **kwargs)):,} events"
except cubepool.CubepoolError as exc:
    outcome = f"refused ({type(exc).__name__}: {exc.message[:70]}...)"
seconds = time.perf_counter() - start
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"{outcome}; {seconds:.1f} s; max RSS {rss:.0f} MiB")
"""


def build(folder: Path, scale: int) -> list[Path]:
    """The hostile inputs, ``scale`` 10 for the issue's sizes."""
    memory = (
        b'{"name":"[memory]","ph":"i","ts":1,"pid":1,"tid":1,"args":{"Addr":1,"Bytes":8,'
        b'"Total Allocated":8,"Total Reserved":8,"Device Type":1,"Device Id":0}},'
    )
    operator = (
        b'{"name":"aten::mm","ph":"X","ts":1,"dur":2,"pid":1,"tid":1,'
        b'"args":{"External id":1,"Record function id":0,"Ev Idx":3}},'
    )
    files = []
    for name, unit in (("profiler-ops.json.gz", operator), ("profiler-memory.json.gz", memory)):
        path = folder / name
        with gzip.open(path, "wb", compresslevel=9) as out:
            out.write(b'{"traceEvents":[')
            for _ in range(21_000_000 * scale // len(unit) // 1000):
                out.write(unit * 1000)
            out.write(memory[:-1] + b"]}")
        files.append(path)
    entry = {"action": "alloc", "addr": 1, "size": 8, "stream": 0, "time_us": 1}
    shared = [entry] * (200 * scale)
    square = folder / "snapshot-shared-lists.pickle"
    square.write_bytes(pickle.dumps({"device_traces": [shared] * (200 * scale)}, protocol=4))
    files.append(square)
    log = folder / "rmm.csv.gz"
    with gzip.open(log, "wb", compresslevel=9) as out:
        out.write(b"Thread,Time,Action,Pointer,Size,Stream\n")
        rows = b"1,10:00:00.000001,allocate,0x1,8,0x0\n1,10:00:00.000002,free,0x1,8,0x0\n"
        out.write(rows * (100_000 * scale))
    files.append(log)
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="inputs a tenth the size")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for path in build(Path(tmp), 1 if args.quick else 10):
            inflated = _inflated_size(path)
            for bound in ("default", "1000000"):
                done = subprocess.run(
                    [sys.executable, "-c", CHILD, str(path), bound],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                result = done.stdout.strip() or done.stderr.strip().splitlines()[-1]
                print(
                    f"{path.name} ({path.stat().st_size / 1024:,.0f} KiB, "
                    f"{inflated / 2**20:,.0f} MiB inflated), max_events={bound}: {result}"
                )
    return 0


def _inflated_size(path: Path) -> int:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        return sum(len(chunk) for chunk in iter(lambda: f.read(1 << 24), b""))


if __name__ == "__main__":
    sys.exit(main())
