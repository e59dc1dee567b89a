"""Disco beside plain mpi4py: ProcessSession and a two-node SocketSession, one run.

For each session (a ``ProcessSession`` of ``--workers`` ranks, then a ``SocketSession`` of
two nodes of ``--workers / 2`` ranks each, the second node a ``python -m
cubepool.disco.remote`` process on this machine):

* per-command overhead: a no-op round trip (``sess.sync_workers()``: one answered command
  to every worker) and a pipelined no-op call (sent ``count`` times, then one sync), in
  µs per command;
* ``allreduce`` (sum) and ``allgather`` of float32 from 4 KiB to 64 MiB (for allgather,
  the size of the gathered result), timed three ways in the same ranks, alternating
  round by round so that all see the same machine load:

  - disco: the controller sends ``sess.allreduce(src, dst)`` / ``sess.allgather(src,
    dst)`` (``in_group=True``, TVM's default), one command per operation;
  - plain, pool: one command runs a loop of mpi4py's ``comm.Allreduce`` /
    ``comm.Allgather`` on each rank, with no Disco command per operation, on the very
    tensors the disco round uses (its ``src`` and ``dst`` registers, from the worker's
    pools) and on the communicator a Disco collective with ``in_group=True`` runs on
    (the group's; across nodes, within the joined world);
  - plain, numpy: the same loop on numpy copies of those tensors (made before the round).

  Every round is timed the same way, on the controller, from a ``sess.sync_workers()``
  before its first command to one after its last: the same synchronisation and the same
  number of collectives (``count``) in all three, so that the only difference is one
  Disco command per collective against one for the whole loop.

A round runs enough operations to last about ``--round-seconds``; the times are medians
per operation over ``--repeat`` rounds of each, and a ratio is the median of disco /
plain over the pairs of rounds of one repeat. Each repeat runs one round of each kind,
the kind that goes first turning from repeat to repeat, so that no kind always runs
after the same other one. The goal: within 10 % of plain
MPI on the same pool tensors (ratio to pool <= 1.10) from 1 MiB up.

What per-frame authentication costs: every command travels in a frame tagged with a MAC
(``cubepool.disco.wire``: keyed BLAKE2s up to 64 KiB, HMAC-SHA256 above); the run ends
with the measured cost of sealing and opening one frame of a collective's command, and
of a 1 MiB payload, in this process.

    python benches/python/bench_disco.py [--workers 4] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from cubepool import disco
from cubepool.disco import register_func
from cubepool.disco.protocol import Command, DiscoAction, RegRef, encode_command
from cubepool.disco.wire import Opener, Sealer, new_key

KIB = 1024
MIB = 1024 * KIB
SIZES = [4 * KIB * 4**i for i in range(8)]  # 4 KiB .. 64 MiB
QUICK_SIZES = [4 * KIB, MIB]
OPS = ("allreduce", "allgather")


@register_func("bench.disco.plain_loop", override=True)
def plain_loop(op: str, send: Any, recv: Any, count: int) -> None:
    """``count`` plain mpi4py collectives on ``send`` and ``recv`` (this worker's buffers),
    on the communicator of this worker's group (where ``in_group=True`` runs)."""
    from mpi4py import MPI

    comm = disco.current_worker().communicator.group  # type: ignore[attr-defined]
    if op == "allreduce":
        for _ in range(count):
            comm.Allreduce(send, recv, op=MPI.SUM)
    else:
        for _ in range(count):
            comm.Allgather(send, recv)


@register_func("bench.disco.numpy_copy", override=True)
def numpy_copy(tensor: Any) -> Any:
    """A numpy array with ``tensor``'s shape, dtype and values (numpy's memory)."""
    return np.array(tensor, copy=True)


def timed_round(sess: disco.Session, step: Callable[[], object], count: int) -> float:
    """Seconds per operation of a round: from a sync, through ``step()`` (which sends the
    round's commands), to a sync; every round of every kind is timed this way."""
    sess.sync_workers()
    start = time.perf_counter()
    step()
    sess.sync_workers()
    return (time.perf_counter() - start) / count


def measure(
    sess: disco.Session, op: str, nbytes: int, args: argparse.Namespace
) -> dict[str, float]:
    """Median seconds per operation (plain on numpy, plain on the pool tensors, disco)
    and the median ratios of disco to each plain round run just before it."""
    if op == "allreduce":
        src = sess.broadcast(np.ones(nbytes // 4, np.float32))

        def command() -> None:
            sess.allreduce(src, dst, "sum")
    else:
        src = sess.broadcast(np.ones(nbytes // 4 // sess.group_size, np.float32))

        def command() -> None:
            sess.allgather(src, dst)

    dst = sess.empty((nbytes // 4,), "float32")
    copy = sess.get_global_func("bench.disco.numpy_copy")
    src_np, dst_np = copy(src), copy(dst)
    loop = sess.get_global_func("bench.disco.plain_loop")

    def rounds(count: int, first: int) -> tuple[float, float, float]:
        """One round of each kind (numpy, pool, disco), starting with kind ``first``."""

        def commands() -> None:
            for _ in range(count):
                command()

        steps = [
            lambda: loop(op, src_np, dst_np, count),
            lambda: loop(op, src, dst, count),
            commands,
        ]
        seconds = [0.0, 0.0, 0.0]
        for kind in [(first + i) % 3 for i in range(3)]:
            seconds[kind] = timed_round(sess, steps[kind], count)
        return seconds[0], seconds[1], seconds[2]

    once = max(max(rounds(2, 0)), 1e-6)
    count = max(2, min(5_000, int(args.round_seconds / once)))
    plain, on_pool, ours = [], [], []
    for repeat in range(args.repeat):
        numpy_s, pool_s, disco_s = rounds(count, repeat % 3)
        plain.append(numpy_s)
        on_pool.append(pool_s)
        ours.append(disco_s)
    return {
        "count": float(count),
        "plain_s": statistics.median(plain),
        "plain_pool_s": statistics.median(on_pool),
        "disco_s": statistics.median(ours),
        "ratio": statistics.median(d / p for p, d in zip(plain, ours, strict=True)),
        "ratio_pool": statistics.median(d / p for p, d in zip(on_pool, ours, strict=True)),
    }


def human(size: int) -> str:
    """4 KiB, 1 MiB, ..."""
    return f"{size // MIB} MiB" if size >= MIB else f"{size // KIB} KiB"


def command_overhead(sess: disco.Session, count: int, repeat: int) -> dict[str, float]:
    """Median µs of a no-op round trip (``sync_workers``) and of a pipelined no-op call."""
    trips, piped = [], []

    def no_ops() -> None:
        for _ in range(count):
            sess._run_builtin("runtime.disco.sync_worker")

    for _ in range(repeat):
        sess.sync_workers()
        start = time.perf_counter()
        for _ in range(count):
            sess.sync_workers()
        trips.append((time.perf_counter() - start) / count)
        piped.append(timed_round(sess, no_ops, count))
    return {
        "round_trip_us": statistics.median(trips) * 1e6,
        "pipelined_us": statistics.median(piped) * 1e6,
    }


def authentication_cost(repeat: int = 20_000) -> dict[str, float]:
    """µs to seal and open one frame of an allreduce's command, and of 1 MiB, here."""
    command = Command(DiscoAction.kCallPacked, 0, (7, RegRef(3), 0, True, RegRef(4)), 0, 99)
    small = encode_command(command)
    big = bytes(MIB)
    key = new_key()
    figures = {"command_bytes": float(len(small))}
    for name, payload, count in (("command", small, repeat), ("mib", big, 50)):
        sealer, opener = Sealer(key), Opener(key)
        start = time.perf_counter()
        for _ in range(count):
            opener.feed(sealer.seal(payload))
            opener.next_payload()
        figures[f"{name}_us"] = (time.perf_counter() - start) / count * 1e6
    return figures


def free_port() -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def process_session(workers: int) -> Iterator[disco.Session]:
    """A ProcessSession of ``workers`` ranks."""
    with disco.ProcessSession(workers, timeout=600) as sess:
        yield sess


@contextmanager
def socket_session(workers: int) -> Iterator[disco.Session]:
    """A SocketSession of two nodes of ``workers // 2`` ranks (the second node a remote
    process on this machine)."""
    key, port = secrets.token_hex(32), free_port()
    env = dict(os.environ, CUBEPOOL_DISCO_AUTHKEY=key)
    made: dict[str, Any] = {}

    def serve() -> None:
        try:
            made["sess"] = disco.SocketSession(
                2, workers // 2, 1, "127.0.0.1", port, key=key, timeout=600
            )
        except BaseException as exc:
            made["error"] = exc

    thread = threading.Thread(target=serve)
    thread.start()
    command = [sys.executable, "-m", "cubepool.disco.remote", "127.0.0.1", str(port)]
    remote = subprocess.Popen([*command, str(workers // 2)], env=env)
    thread.join()
    try:
        if "error" in made:
            raise made["error"]
        with made["sess"] as sess:
            yield sess
    finally:
        try:
            remote.wait(30)
        except subprocess.TimeoutExpired:
            remote.kill()
            remote.wait()


SESSIONS: dict[str, Callable[[int], Any]] = {
    "ProcessSession": process_session,
    "SocketSession (2 nodes)": socket_session,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="smoke run: two sizes, short")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--round-seconds", type=float, default=0.3)
    parser.add_argument("--commands", type=int, default=2000, help="no-ops per overhead round")
    parser.add_argument("--sizes", type=int, nargs="*", default=None)
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument(
        "--sessions",
        nargs="*",
        choices=["process", "socket"],
        default=["process", "socket"],
        help="which sessions to run (both by default)",
    )
    args = parser.parse_args()
    if args.workers < 2 or args.workers % 2:
        parser.error("--workers must be even (two nodes of --workers / 2)")
    if args.sizes is None:
        args.sizes = QUICK_SIZES if args.quick else SIZES
    if args.quick:
        args.repeat, args.round_seconds, args.commands = 1, 0.02, 100
    # The ranks import this file to find plain_loop.
    here = str(Path(__file__).parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [here, os.environ.get("PYTHONPATH")] if p)
    rows: list[dict[str, Any]] = []
    overheads: dict[str, dict[str, float]] = {}
    for kind, start in SESSIONS.items():
        if kind.split("Session")[0].lower() not in args.sessions:
            continue
        with start(args.workers) as sess:
            sess.import_python_module(Path(__file__).stem)
            overheads[kind] = command_overhead(sess, args.commands, args.repeat)
            for op in OPS:
                for size in args.sizes:
                    figures = measure(sess, op, size, args)
                    rows.append({"session": kind, "op": op, "bytes": size, **figures})
    auth = authentication_cost()
    print(
        f"# Disco beside plain mpi4py: {args.workers} MPI ranks, float32, {os.cpu_count()} "
        f"CPUs ({platform.machine()}), medians of {args.repeat} alternating rounds"
    )
    print("\n| session | no-op round trip (µs) | pipelined no-op (µs per command) |")
    print("|---|---:|---:|")
    for kind, figures in overheads.items():
        print(f"| {kind} | {figures['round_trip_us']:.1f} | {figures['pipelined_us']:.1f} |")
    print(
        "\n| session | op | size | plain, numpy (µs) | plain, pool (µs) | Disco (µs) | "
        "ratio to numpy | ratio to pool |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['session']} | {row['op']} | {human(int(row['bytes']))} | "
            f"{row['plain_s'] * 1e6:.1f} | {row['plain_pool_s'] * 1e6:.1f} | "
            f"{row['disco_s'] * 1e6:.1f} | {row['ratio']:.3f} | {row['ratio_pool']:.3f} |"
        )
    print(
        f"\nPer-frame authentication (this process; keyed BLAKE2s up to 64 KiB, "
        "HMAC-SHA256 above): "
        f"{auth['command_us']:.2f} µs to seal and open a collective's command "
        f"({auth['command_bytes']:.0f}-byte payload), {auth['mib_us']:.0f} µs per MiB of payload"
    )
    if args.json:
        document = {"rows": rows, "overhead": overheads, "authentication": auth}
        Path(args.json).write_text(json.dumps(document, indent=1))


if __name__ == "__main__":
    main()
