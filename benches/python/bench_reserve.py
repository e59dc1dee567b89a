"""Python-side benchmarks of cubepool, in one process.

1. Reserve + drop of ``n`` bytes: ``mm.reserve(n)`` with the default layout and with
   the ``SubSlices`` preset against ``numpy.empty(n, uint8)`` and ``bytearray(n)``, for
   n = 64 B, 4 KiB and 1 MiB (``timeit``, best of several rounds run in turn, so the
   four share the machine's load alike; nanoseconds per operation). Each statement
   discards its result, so the object is freed before the next call. ``bytearray(n)``
   zero-fills its bytes; the others do not.
2. ``cubepool.replay`` of each bundled trace timed from Python, against the Rust loop
   time the replay reports itself (``ReplayResult.seconds``): the difference is what a
   replay costs beyond its event loop (building the pools, crossing into Rust, the
   result object).

Prints a markdown table; ``--json PATH`` also writes the figures, ``--quick`` runs a
smoke-sized version in a few seconds.

``--loop WHICH STEPS`` runs only a bare loop of ``STEPS`` reserve + drops of 4 KiB
(``WHICH``: ``default``, ``sub_slices`` or ``numpy``) and prints nothing: what to count
instructions on, on a loaded machine. Run it under ``valgrind --tool=callgrind`` with
two step counts (and ``OPENBLAS_NUM_THREADS=1``, so numpy's idle threads add nothing);
the difference of the totals over the difference of the steps is one step's count.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy

import cubepool

SIZES = (64, 4096, 1024 * 1024)
TRACES = ("gpt2-train", "gpt2-generate", "transformer-train")


def interleaved_best_ns(
    statements: dict[str, str], namespace: dict[str, Any], *, repeat: int, quick: bool
) -> dict[str, float]:
    """The best of ``repeat`` timeit rounds of each statement, in nanoseconds per run.

    The rounds are interleaved (one round of each statement in turn, ``repeat`` times),
    so a load that comes and goes on a shared machine weighs on every statement alike.
    A round runs a statement enough times to last at least 0.2 s (``autorange``), or a
    fixed 2,000 times in quick mode.
    """
    timers = {
        key: timeit.Timer(statement, globals=namespace) for key, statement in statements.items()
    }
    numbers = {key: 2_000 if quick else timer.autorange()[0] for key, timer in timers.items()}
    best = dict.fromkeys(timers, float("inf"))
    for _ in range(repeat):
        for key, timer in timers.items():
            best[key] = min(best[key], timer.timeit(numbers[key]) / numbers[key] * 1e9)
    return best


def bench_reserve(*, repeat: int, quick: bool) -> list[dict[str, Any]]:
    """Reserve + drop (the default layout and the ``SubSlices`` preset) against
    numpy.empty + drop and bytearray, per size, interleaved."""
    properties = cubepool.MemoryDeviceProperties(max_page_size=2048 * 1024 * 1024, alignment=32)
    sliced = cubepool.MemoryManagement(cubepool.MemoryConfiguration.sub_slices(), properties)
    default = cubepool.MemoryManagement(cubepool.MemoryConfiguration.virtual_pages(), properties)
    rows = []
    for n in SIZES:
        namespace = {
            "reserve": sliced.reserve,
            "reserve_default": default.reserve,
            "empty": numpy.empty,
            "uint8": numpy.uint8,
            "bytearray": bytearray,
            "n": n,
        }
        # The first reserve of a size allocates its page; keep that out of the rounds.
        sliced.reserve(n).release()
        default.reserve(n).release()
        row: dict[str, Any] = {"n": n}
        row.update(
            interleaved_best_ns(
                {
                    "default_ns": "reserve_default(n)",
                    "cubepool_ns": "reserve(n)",
                    "numpy_ns": "empty(n, uint8)",
                    "bytearray_ns": "bytearray(n)",
                },
                namespace,
                repeat=repeat,
                quick=quick,
            )
        )
        rows.append(row)
    sliced.check_invariants()
    default.check_invariants()
    return rows


def best_of(repeat: int, run: Callable[[], cubepool.ReplayResult]) -> tuple[float, float]:
    """The best Python wall time and the best Rust loop time of ``repeat`` replays."""
    walls, loops = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        result = run()
        walls.append(time.perf_counter() - start)
        loops.append(result.seconds)
    return min(walls), min(loops)


def bench_replay(*, repeat: int) -> list[dict[str, Any]]:
    """``cubepool.replay`` of each bundled trace: Python wall time against the Rust loop."""
    rows = []
    for name in TRACES:
        trace = cubepool.load_trace(cubepool.examples.path(name))

        def run(trace: cubepool.Trace = trace) -> cubepool.ReplayResult:
            return cubepool.replay(trace)

        run()  # warm-up
        wall, loop = best_of(repeat, run)
        rows.append(
            {
                "trace": name,
                "events": len(trace),
                "python_s": wall,
                "rust_loop_s": loop,
                "overhead_us": (wall - loop) * 1e6,
                "python_ns_per_event": wall / len(trace) * 1e9,
                "rust_ns_per_event": loop / len(trace) * 1e9,
            }
        )
    return rows


def size_label(n: int) -> str:
    """64 B, 4 KiB, 1 MiB."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def markdown(reserve: list[dict[str, Any]], replay: list[dict[str, Any]]) -> str:
    """The two tables, ratios first."""
    lines = [
        "| n | numpy.empty / default | numpy.empty / cubepool | bytearray / cubepool "
        "| default reserve+drop (ns) | cubepool reserve+drop (ns) | numpy.empty+drop (ns) "
        "| bytearray(n) (ns) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in reserve:
        lines.append(
            f"| {size_label(row['n'])} | {row['numpy_ns'] / row['default_ns']:.2f}x "
            f"| {row['numpy_ns'] / row['cubepool_ns']:.2f}x "
            f"| {row['bytearray_ns'] / row['cubepool_ns']:.2f}x "
            f"| {row['default_ns']:.0f} | {row['cubepool_ns']:.0f} | {row['numpy_ns']:.0f} "
            f"| {row['bytearray_ns']:.0f} |"
        )
    lines += [
        "",
        "| trace | events | Python / Rust loop | Python call (ms) | Rust loop (ms) "
        "| overhead (us) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in replay:
        lines.append(
            f"| {row['trace']} | {row['events']:,} | {row['python_s'] / row['rust_loop_s']:.2f}x "
            f"| {row['python_s'] * 1e3:.3f} | {row['rust_loop_s'] * 1e3:.3f} "
            f"| {row['overhead_us']:.0f} |"
        )
    return "\n".join(lines)


LOOP_SIZE = 4096


def run_loop(which: str, steps: int) -> None:
    """``steps`` reserve + drops of ``LOOP_SIZE`` bytes, after one untimed warm-up."""
    size = LOOP_SIZE  # a local: the loop reads no global
    if which == "numpy":
        empty, uint8 = numpy.empty, numpy.uint8
        empty(size, uint8)
        for _ in range(steps):
            empty(size, uint8)
        return
    configuration = (
        cubepool.MemoryConfiguration.virtual_pages()
        if which == "default"
        else cubepool.MemoryConfiguration.sub_slices()
    )
    properties = cubepool.MemoryDeviceProperties(max_page_size=2048 * 1024 * 1024, alignment=32)
    reserve = cubepool.MemoryManagement(configuration, properties).reserve
    reserve(size).release()
    for _ in range(steps):
        reserve(size)


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmarks, prints the tables, writes JSON when asked."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--quick", action="store_true", help="smoke-sized run (seconds)")
    parser.add_argument(
        "--loop",
        nargs=2,
        metavar=("WHICH", "STEPS"),
        help="only a bare loop to count instructions on (default, sub_slices or numpy)",
    )
    args = parser.parse_args(argv)
    if args.loop is not None:
        which, steps = args.loop
        if which not in ("default", "sub_slices", "numpy"):
            parser.error(f"--loop takes default, sub_slices or numpy, got {which!r}")
        run_loop(which, int(steps))
        return 0
    repeat = 3 if args.quick else 7
    reserve = bench_reserve(repeat=repeat, quick=args.quick)
    replay = bench_replay(repeat=repeat if args.quick else 20)
    print(markdown(reserve, replay))
    if args.json is not None:
        figures = {
            "quick": args.quick,
            "python": sys.version.split()[0],
            "implementation": platform.python_implementation(),
            "numpy": numpy.__version__,
            "cubepool": cubepool.__version__,
            "reserve": reserve,
            "replay": replay,
        }
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
