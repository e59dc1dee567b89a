"""Disco collectives through a ProcessSession against plain mpi4py, with the same MPI.

For each size from 4 KiB to 64 MiB (float32; for allgather, the size of the gathered
result), times ``allreduce`` (sum) and ``allgather`` among ``--workers`` MPI ranks two
ways, in the same ranks and alternating round by round, so that both see the same
machine load:

* plain: each rank runs ``comm.Allreduce`` / ``comm.Allgather`` of mpi4py on numpy arrays
  in a loop between two barriers (the loop is a function the ranks run locally, timed
  on rank 0: no Disco command per operation); also the same loop on tensors from the
  worker's pools ("plain on pool"), which separates the cost of Disco's commands from
  that of the memory the tensors live in;
* disco: the controller sends ``sess.allreduce`` / ``sess.allgather`` on tensors from
  each worker's pools, one command per operation, then waits with ``sess.sync_workers()``.

A round runs enough operations to last about ``--round-seconds``; the times are the
medians per operation over ``--repeat`` rounds of each, and the overhead ratio is the
median of disco / plain over the pairs of rounds run one after the other (a pair sees
nearly the same machine load, which matters on a shared machine). The goal is within
10 % (ratio <= 1.10) at 1 MiB and above.

    python benches/python/bench_disco.py [--workers 4] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from cubepool import disco
from cubepool.disco import register_func

KIB = 1024
MIB = 1024 * KIB
SIZES = [4 * KIB * 4**i for i in range(8)]  # 4 KiB .. 64 MiB
QUICK_SIZES = [4 * KIB, MIB]
OPS = ("allreduce", "allgather")


@register_func("bench.disco.plain_loop", override=True)
def plain_loop(op: str, nbytes: int, count: int, memory: str) -> float:
    """Seconds per operation of ``count`` plain mpi4py collectives on numpy arrays
    (``memory="numpy"``) or on tensors from this worker's pools (``"pool"``)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    worker = disco.current_worker()

    def buffer(elements: int, fill: float) -> Any:
        if memory == "numpy":
            return np.full(elements, fill, np.float32)
        tensor = worker.empty((elements,), "float32")
        np.asarray(tensor)[:] = fill
        return tensor

    recv = buffer(nbytes // 4, 0.0)
    if op == "allreduce":
        send = buffer(nbytes // 4, 1.0)
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(count):
            comm.Allreduce(send, recv, op=MPI.SUM)
    else:
        send = buffer(nbytes // 4 // comm.Get_size(), 1.0)
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(count):
            comm.Allgather(send, recv)
    comm.Barrier()
    return (time.perf_counter() - start) / count


def plain_round(sess: disco.Session, op: str, nbytes: int, count: int, memory: str) -> float:
    """One plain round, run by the ranks; rank 0's figure."""
    seconds = sess.get_global_func("bench.disco.plain_loop")(op, nbytes, count, memory)
    value: float = seconds.debug_get_from_remote(0)
    return value


def disco_round(sess: disco.Session, step: Any, count: int) -> float:
    """One disco round: ``count`` commands, then a sync."""
    sess.sync_workers()
    start = time.perf_counter()
    for _ in range(count):
        step()
    sess.sync_workers()
    return (time.perf_counter() - start) / count


def measure(
    sess: disco.Session, op: str, nbytes: int, args: argparse.Namespace
) -> dict[str, float]:
    """Median seconds per operation (plain, plain on pool, disco) and the median ratios
    of disco to each plain round run just before it."""
    workers = sess.num_workers
    if op == "allreduce":
        src = sess.broadcast(np.ones(nbytes // 4, np.float32))

        def step() -> None:
            sess.allreduce(src, dst, "sum")
    else:
        src = sess.broadcast(np.ones(nbytes // 4 // workers, np.float32))

        def step() -> None:
            sess.allgather(src, dst)

    dst = sess.empty((nbytes // 4,), "float32")
    once = max(disco_round(sess, step, 2), plain_round(sess, op, nbytes, 2, "numpy"), 1e-6)
    count = max(2, min(5_000, int(args.round_seconds / once)))
    plain, on_pool, ours = [], [], []
    for _ in range(args.repeat):
        plain.append(plain_round(sess, op, nbytes, count, "numpy"))
        on_pool.append(plain_round(sess, op, nbytes, count, "pool"))
        ours.append(disco_round(sess, step, count))
    return {
        "plain_s": statistics.median(plain),
        "plain_pool_s": statistics.median(on_pool),
        "disco_s": statistics.median(ours),
        "ratio": statistics.median(d / p for p, d in zip(plain, ours, strict=True)),
        "ratio_pool": statistics.median(d / p for p, d in zip(on_pool, ours, strict=True)),
    }


def human(size: int) -> str:
    """4 KiB, 1 MiB, ..."""
    return f"{size // MIB} MiB" if size >= MIB else f"{size // KIB} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="smoke run: two sizes, short")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--round-seconds", type=float, default=0.3)
    parser.add_argument("--sizes", type=int, nargs="*", default=None)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    if args.sizes is None:
        args.sizes = QUICK_SIZES if args.quick else SIZES
    if args.quick:
        args.repeat, args.round_seconds = 1, 0.02
    # The ranks import this file to find plain_loop.
    here = str(Path(__file__).parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [here, os.environ.get("PYTHONPATH")] if p)
    rows = []
    with disco.ProcessSession(args.workers, timeout=600) as sess:
        sess.import_python_module(Path(__file__).stem)
        for op in OPS:
            for size in args.sizes:
                rows.append({"op": op, "bytes": size, **measure(sess, op, size, args)})
    print(
        f"# Disco collectives: {args.workers} MPI ranks, float32, {os.cpu_count()} CPUs "
        f"({platform.machine()}), medians of {args.repeat} alternating rounds"
    )
    print(
        "| op | size | plain mpi4py, numpy (µs) | plain mpi4py, pool (µs) | "
        "ProcessSession (µs) | ratio to numpy | ratio to pool |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['op']} | {human(int(row['bytes']))} | {row['plain_s'] * 1e6:.1f} | "
            f"{row['plain_pool_s'] * 1e6:.1f} | {row['disco_s'] * 1e6:.1f} | "
            f"{row['ratio']:.3f} | {row['ratio_pool']:.3f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
