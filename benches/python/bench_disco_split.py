"""Where a Disco command's time goes on a worker: read, run, and the collective itself.

Starts a ``ProcessSession`` of ``--workers`` ranks (``--session socket``: a
``SocketSession`` of two nodes, as ``bench_disco.py`` makes it) and, on each worker,
wraps three things with timers: the channel's ``recv`` (wait for bytes when no whole
frame is buffered, and open the frame that comes), the commands' run (the extension's
``dispatch``, which opens the buffered frames and runs the replays among them in one
call, and the commands run from Python) and MPI's collective on the group communicator:
"run outside MPI" counts opening the buffered frames too.
Then it alternates, ``--repeat`` times, rounds of ``--count`` allgathers (or allreduces,
``--op``) of ``--bytes`` bytes:

* loop: one command runs the in-worker function (``disco.allgather``, the same one the
  Disco command runs) ``count`` times in a Python loop on each worker;
* disco: ``count`` commands ``sess.allgather(src, dst)``, as a user sends them;
* presend: as disco, but the workers first sleep 0.15 s (one command), so that the
  controller has written every command before they start, and is idle while they run;
* with ``--gap US...``: the loop again, with US µs of busy Python after each collective
  (what the time a command takes between two collectives does to MPI's own).

It prints worker 0's medians per collective, in µs: the round's time on the controller,
the collective inside MPI, and (disco, presend) the channel's recv and the run outside
MPI, and the controller's CPU time (``time.process_time``) while it sent the round's
commands. A timing: noisy on a shared machine, so read the medians beside each other.

    python benches/python/bench_disco_split.py [--workers 2] [--bytes 1048576]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from cubepool import disco
from cubepool.disco import collectives, register_func

#: Seconds the workers sleep before a presend round (the controller sends meanwhile).
PRESEND_SLEEP = 0.15
#: What the timers have counted on this worker since the last ``bench.split.take``.
_SPENT: dict[str, float] = {"recv": 0.0, "run": 0.0, "mpi": 0.0}


def _timed(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            _SPENT[name] += time.perf_counter() - start

    return wrapper


class _TimedComm:
    """An MPI communicator whose collectives are timed (everything else passes through)."""

    def __init__(self, comm: Any) -> None:
        self._comm = comm
        self.Allgather = _timed("mpi", comm.Allgather)
        self.Allreduce = _timed("mpi", comm.Allreduce)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)


@register_func("bench.split.install", override=True)
def install() -> None:
    """Wrap this worker's channel recv, command run and group collectives with timers."""
    worker = disco.current_worker()
    channel: Any = worker.channel
    channel.recv = _timed("recv", channel.recv)
    worker._run_payload = _timed("run", worker._run_payload)  # type: ignore[method-assign]
    channel.dispatch = _timed("run", channel.dispatch)
    communicator: Any = worker.communicator
    timed = _TimedComm(communicator.group)
    plain = communicator._comm
    communicator._comm = lambda in_group: timed if in_group else plain(in_group)
    communicator.forget()  # no collective reuses the untimed communicator
    worker.replays.clear()


@register_func("bench.split.take", override=True)
def take() -> dict[str, float]:
    """Seconds counted since the last call, by timer; the counts start again at 0."""
    spent = dict(_SPENT)
    for name in _SPENT:
        _SPENT[name] = 0.0
    return spent


@register_func("bench.split.loop", override=True)
def loop(op: str, send: Any, recv: Any, count: int, gap: float = 0.0) -> None:
    """``count`` in-worker collectives in a Python loop (what one Disco command runs),
    with ``gap`` seconds of busy Python between one and the next."""
    for _ in range(count):
        if op == "allgather":
            collectives.allgather(send, True, recv)
        else:
            collectives.allreduce(send, 0, True, recv)
        if gap:
            start = time.perf_counter()
            while time.perf_counter() - start < gap:
                pass


@register_func("bench.split.sleep", override=True)
def sleep(seconds: float) -> None:
    """Sleep on every worker."""
    time.sleep(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--bytes", type=int, default=1 << 20)
    parser.add_argument("--op", choices=["allgather", "allreduce"], default="allgather")
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--session",
        choices=["process", "socket"],
        default="process",
        help="a ProcessSession, or a SocketSession of two nodes (bench_disco.py's)",
    )
    parser.add_argument(
        "--gap",
        type=float,
        nargs="*",
        default=[],
        help="also loops with this many µs of busy Python between collectives",
    )
    args = parser.parse_args()
    import os

    here = str(Path(__file__).parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [here, os.environ.get("PYTHONPATH")] if p)
    if args.session == "socket":
        from bench_disco import socket_session

        session: Any = socket_session(args.workers)
    else:
        session = disco.ProcessSession(args.workers, timeout=600)
    with session as sess:
        sess.import_python_module(Path(__file__).stem)
        sess.get_global_func("bench.split.install")()
        elements = args.bytes // 4
        if args.op == "allgather":
            src = sess.broadcast(np.ones(elements // args.workers, np.float32))
        else:
            src = sess.broadcast(np.ones(elements, np.float32))
        dst = sess.empty((elements,), "float32")
        take_spent = sess.get_global_func("bench.split.take")
        in_loop = sess.get_global_func("bench.split.loop")
        nap = sess.get_global_func("bench.split.sleep")

        def command() -> None:
            if args.op == "allgather":
                sess.allgather(src, dst)
            else:
                sess.allreduce(src, dst, "sum")

        def commands() -> None:
            for _ in range(args.count):
                command()

        def presend() -> None:
            nap(PRESEND_SLEEP)
            commands()

        kinds: dict[str, tuple[Callable[[], object], float]] = {
            "loop": (lambda: in_loop(args.op, src, dst, args.count), 0.0),
            "disco": (commands, 0.0),
            "presend": (presend, PRESEND_SLEEP),
        }

        def gapped(gap: float) -> Callable[[], object]:
            return lambda: in_loop(args.op, src, dst, args.count, gap * 1e-6)

        for gap in args.gap:
            kinds[f"loop, {gap:g} µs gaps"] = (gapped(gap), 0.0)
        figures: dict[str, dict[str, list[float]]] = {kind: {} for kind in kinds}
        for _ in range(args.repeat):
            for kind, (step, idle) in kinds.items():
                sess.sync_workers()
                take_spent()
                start = time.perf_counter()
                cpu = time.process_time()
                step()
                sending = time.process_time() - cpu
                sess.sync_workers()
                total = time.perf_counter() - start - idle
                spent: dict[str, float] = take_spent().debug_get_from_remote(0)
                row = figures[kind]
                row.setdefault("round", []).append(total)
                row.setdefault("mpi", []).append(spent["mpi"])
                if not kind.startswith("loop"):
                    # The last few recv/run belong to the syncs and the take itself.
                    row.setdefault("recv", []).append(spent["recv"])
                    run = spent["run"] - spent["mpi"] - (idle if kind == "presend" else 0.0)
                    row.setdefault("run outside MPI", []).append(run)
                    row.setdefault("controller CPU sending", []).append(sending)
    print(
        f"# {args.op} of {args.bytes} bytes, {args.workers} ranks, {args.count} per round, "
        f"medians of {args.repeat} rounds, µs per collective (worker 0)"
    )
    for kind, row in figures.items():
        cells = ", ".join(
            f"{name} {statistics.median(values) / args.count * 1e6:.1f}"
            for name, values in row.items()
        )
        print(f"{kind}: {cells}")


if __name__ == "__main__":
    main()
