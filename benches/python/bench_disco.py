"""Disco collectives through a ProcessSession against plain mpi4py, with the same MPI.

For each size from 4 KiB to 64 MiB (float32; for allgather the size of the gathered
result), times ``allreduce`` (sum) and ``allgather`` among 4 workers two ways:

* plain: ``mpiexec -n 4`` ranks calling ``comm.Allreduce`` / ``comm.Allgather`` on numpy
  arrays in a loop, closed by a barrier (this script re-run with ``--plain``);
* disco: a ``cubepool.disco.ProcessSession(4)`` whose tensors come from each worker's
  pools, the controller sending ``sess.allreduce`` / ``sess.allgather`` in a loop,
  closed by ``sess.sync_workers()``.

Each figure is the median over ``--repeat`` rounds of the time per operation of a round
(a round runs enough operations to last about ``--round-seconds``). The overhead is
disco / plain; the goal is within 10 % (ratio <= 1.10) at 1 MiB and above.

    python benches/python/bench_disco.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

WORKERS = 4
KIB = 1024
SIZES = [4 * KIB * 4**i for i in range(8)]  # 4 KiB .. 64 MiB
QUICK_SIZES = [4 * KIB, 1024 * KIB]
OPS = ("allreduce", "allgather")


def rounds(run: Callable[[int], float], size: int, repeat: int, seconds: float) -> float:
    """Median seconds per operation over ``repeat`` rounds; ``run(n)`` times n operations."""
    run(2)  # warm-up
    once = max(run(1), 1e-6)
    count = max(1, min(10_000, int(seconds / once)))
    return statistics.median(run(count) / count for _ in range(repeat))


def plain(args: argparse.Namespace) -> None:
    """One MPI rank of the plain mpi4py run; rank 0 prints the figures as JSON."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    results: dict[str, dict[int, float]] = {op: {} for op in OPS}
    for size in args.sizes:
        count = size // 4
        for op in OPS:
            if op == "allreduce":
                send, recv = np.ones(count, np.float32), np.empty(count, np.float32)

                def step(send: Any = send, recv: Any = recv) -> None:
                    comm.Allreduce(send, recv, op=MPI.SUM)
            else:
                send = np.ones(count // WORKERS, np.float32)
                recv = np.empty(count, np.float32)

                def step(send: Any = send, recv: Any = recv) -> None:
                    comm.Allgather(send, recv)

            def run(n: int, step: Callable[[], None] = step) -> float:
                # Every rank runs the same number of operations: rank 0 decides.
                n = comm.bcast(n, root=0)
                comm.Barrier()
                start = time.perf_counter()
                for _ in range(n):
                    step()
                comm.Barrier()
                return comm.bcast(time.perf_counter() - start, root=0)

            results[op][size] = rounds(run, size, args.repeat, args.round_seconds)
    if comm.Get_rank() == 0:
        print(json.dumps(results))


def disco_run(args: argparse.Namespace) -> dict[str, dict[int, float]]:
    """The same operations through a ProcessSession."""
    from cubepool import disco

    results: dict[str, dict[int, float]] = {op: {} for op in OPS}
    with disco.ProcessSession(WORKERS, timeout=600) as sess:
        for size in args.sizes:
            count = size // 4
            for op in OPS:
                if op == "allreduce":
                    src = sess.broadcast(np.ones(count, np.float32))
                    dst = sess.empty((count,), "float32")

                    def step(src: Any = src, dst: Any = dst) -> None:
                        sess.allreduce(src, dst, "sum")
                else:
                    src = sess.broadcast(np.ones(count // WORKERS, np.float32))
                    dst = sess.empty((count,), "float32")

                    def step(src: Any = src, dst: Any = dst) -> None:
                        sess.allgather(src, dst)

                def run(n: int, step: Callable[[], None] = step) -> float:
                    sess.sync_workers()
                    start = time.perf_counter()
                    for _ in range(n):
                        step()
                    sess.sync_workers()
                    return time.perf_counter() - start

                results[op][size] = rounds(run, size, args.repeat, args.round_seconds)
                del src, dst
    return results


def plain_run(args: argparse.Namespace) -> dict[str, dict[int, float]]:
    """Run this script under ``mpiexec -n 4 --plain`` and read rank 0's figures."""
    from cubepool.disco.process import find_mpiexec

    command = [find_mpiexec(), "-n", str(WORKERS), sys.executable, __file__, "--plain"]
    command += ["--repeat", str(args.repeat), "--round-seconds", str(args.round_seconds)]
    command += ["--sizes", *map(str, args.sizes)]
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=1800)
    raw = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        op: {int(size): value for size, value in by_size.items()} for op, by_size in raw.items()
    }


def human(size: int) -> str:
    """4 KiB, 1 MiB, ..."""
    return f"{size // (1024 * KIB)} MiB" if size >= 1024 * KIB else f"{size // KIB} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plain", action="store_true", help="run as one MPI rank (internal)")
    parser.add_argument("--quick", action="store_true", help="smoke run: two sizes, short")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--round-seconds", type=float, default=0.3)
    parser.add_argument("--sizes", type=int, nargs="*", default=None)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    if args.sizes is None:
        args.sizes = QUICK_SIZES if args.quick else SIZES
    if args.quick:
        args.repeat, args.round_seconds = 1, 0.02
    if args.plain:
        plain(args)
        return
    base = plain_run(args)
    ours = disco_run(args)
    print(f"# Disco collectives, {WORKERS} workers, float32 ({platform.processor() or 'cpu'})")
    print("| op | size | plain mpi4py (µs) | ProcessSession (µs) | ratio |")
    print("|---|---:|---:|---:|---:|")
    rows = []
    for op in OPS:
        for size in args.sizes:
            ratio = ours[op][size] / base[op][size]
            rows.append(
                {
                    "op": op,
                    "bytes": size,
                    "plain_s": base[op][size],
                    "disco_s": ours[op][size],
                    "ratio": ratio,
                }
            )
            print(
                f"| {op} | {human(size)} | {base[op][size] * 1e6:.1f} | "
                f"{ours[op][size] * 1e6:.1f} | {ratio:.3f} |"
            )
    if args.json:
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=1)


if __name__ == "__main__":
    main()
