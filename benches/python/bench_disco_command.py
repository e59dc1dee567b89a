"""The fixed cost of one Disco command through a ProcessSession.

Sends ``--count`` commands in a row (pipelined, no answers), then waits with
``sess.sync_workers()``, and prints the microseconds per command: sending only, and to
the end of the sync. Two commands: a call of a function that does nothing (the
protocol's cost: pickling, the channel writes, the workers' reads and dispatch) and a
4 KiB allreduce (the same plus a small MPI collective among ranks that must all have
read their command). Three rounds each.

    python benches/python/bench_disco_command.py [--workers 4] [--count 3000]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from cubepool import disco


def per_command(sess: disco.Session, step: Callable[[], None], count: int) -> tuple[float, float]:
    """Seconds per command to send ``count`` commands, and to have them all run."""
    sess.sync_workers()
    start = time.perf_counter()
    for _ in range(count):
        step()
    sent = time.perf_counter()
    sess.sync_workers()
    done = time.perf_counter()
    return (sent - start) / count, (done - start) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with disco.ProcessSession(args.workers) as sess:
        src = sess.broadcast(np.ones(1024, np.float32))
        dst = sess.empty((1024,), "float32")
        steps: dict[str, Callable[[], None]] = {
            # As the collectives are called: no result register (so no kKillReg later).
            "no-op call": lambda: sess._run_builtin("runtime.disco.sync_worker"),
            "4 KiB allreduce": lambda: sess.allreduce(src, dst, "sum"),
        }
        print(f"# {args.workers} workers, {args.count} commands a round")
        print("| command | send (µs) | to the end of the sync (µs) |")
        print("|---|---:|---:|")
        for name, step in steps.items():
            for _ in range(args.rounds):
                send, total = per_command(sess, step, args.count)
                print(f"| {name} | {send * 1e6:.1f} | {total * 1e6:.1f} |")


if __name__ == "__main__":
    main()
