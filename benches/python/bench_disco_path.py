"""The per-command path of Disco, in one process, for instruction counts.

Runs ``--count`` commands through one side's code with no sockets and no MPI, so that
``valgrind --tool=callgrind`` counts the same instructions on every run:

* ``--side worker``: what a worker does with each frame once it is read (all of them
  read at once, as pipelined commands are): check its tag (``Opener``), decode the
  command, run it (from the second of each kind on: replayed, in the extension's
  ``dispatch``) (an allgather and an allreduce in turn,
  through the registered collectives, on tensors from the worker's pools; the
  communicator checks the operands as MPI's does, then stops short of MPI; with
  ``--mpi``, the real ``MPICommunicator`` on a world of one rank, so mpi4py's own
  per-call work counts too);
* ``--side controller``: ``Session.allreduce`` to 4 workers: the controller's checks
  and the command's encoding (the first call; later ones send the kept command again),
  and one sealed frame per worker, written to ``/dev/null`` (one system call each, as
  to a worker's socket).

Per-command instructions: the difference of two runs, ``--count N`` and ``--count N
--setup-only`` (everything but the loop: the frames are sealed in the setup), divided by
N::

    B=benches/python/bench_disco_path.py
    valgrind --tool=callgrind python $B --side worker --count 2000
    valgrind --tool=callgrind python $B --side worker --count 2000 --setup-only

With ``--mpi --elements 64`` the worker side runs the real ``MPICommunicator`` on a
world of one rank (small tensors: the collective's own copy stays a few instructions).
Use a large ``--count`` (20000): MPI's start-up varies by a few million instructions
between runs, and ``PYTHONHASHSEED=0`` for the same dictionaries on every run.

Without valgrind it prints µs per command (a timing: noisy on a shared machine).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np

from cubepool import disco
from cubepool.disco.checks import RemoteLayout
from cubepool.disco.communicator import as_array, check_parts, check_same_layout, in_place
from cubepool.disco.dref import DPackedFunc, DRef
from cubepool.disco.protocol import (
    NUMBER_SIZE,
    Command,
    DiscoAction,
    RegRef,
    command_body,
    encode_command,
)
from cubepool.disco.session import Session
from cubepool.disco.wire import Opener, Sealer, new_key
from cubepool.disco.worker import DiscoWorker, _current

WORKERS = 4
ELEMENTS = 1 << 18


class _ChecksOnly:
    """A communicator that checks operands as ``MPICommunicator`` does, without MPI."""

    name = "mpi"
    rank = 0
    size = WORKERS
    group_size = WORKERS

    def allgather(self, send: Any, in_group: bool, recv: Any) -> None:
        check_parts(as_array(recv, "recv"), as_array(send, "send"), WORKERS, "allgather")

    def allreduce(self, send: Any, kind: Any, in_group: bool, recv: Any) -> None:
        send_view, recv_view = as_array(send, "send"), as_array(recv, "recv")
        check_same_layout(send_view, recv_view, "allreduce")
        in_place(send, recv, send_view, recv_view)

    def forget(self) -> None:
        """Nothing cached."""

    def close(self) -> None:
        """Nothing to release."""


class _Nowhere:
    """A channel or transport that drops what it is given (a transport writes each
    worker's frame to ``/dev/null``, as the real one writes it to the worker's socket)."""

    def __init__(self) -> None:
        self.sealers = [Sealer(new_key()) for _ in range(WORKERS)]
        self.null = os.open(os.devnull, os.O_WRONLY)

    def send(self, message: Any) -> None:
        """A worker's answer (as a channel): dropped."""

    def prepare(self, command: Command) -> bytes:
        return command_body(encode_command(command))

    def send_prepared(self, worker_ids: Any, prepared: bytes, number: int) -> None:
        for worker_id in worker_ids:
            self.sealers[worker_id].send_numbered(self.null, prepared, number)

    def receive(self, timeout: float) -> None:
        return None

    def close(self, force: bool = False) -> None:
        """Nothing to close."""


def worker_side(count: int, run: bool, mpi: bool = False, elements: int = ELEMENTS) -> None:
    """Open, decode and run ``count`` collective commands on one in-process worker."""
    communicator: Any = _ChecksOnly()
    if mpi:
        from cubepool.disco.communicator import MPICommunicator

        communicator = MPICommunicator(1)
    parts = communicator.size
    worker = DiscoWorker(0, parts, 1, _Nowhere(), communicator)  # type: ignore[arg-type]
    worker.registers[1] = disco.get_global_func("runtime.disco.allgather")
    worker.registers[2] = disco.get_global_func("runtime.disco.allreduce")
    worker.registers[3] = worker.empty((elements // parts,), "float32")
    worker.registers[4] = worker.empty((elements,), "float32")
    worker.registers[5] = worker.empty((elements,), "float32")
    commands = [
        Command(DiscoAction.kCallPacked, 0, (1, RegRef(3), True, RegRef(4)), 0, 1),
        Command(DiscoAction.kCallPacked, 0, (2, RegRef(4), 0, True, RegRef(5)), 0, 2),
    ]
    key = new_key()
    sealer, opener = Sealer(key), Opener(key)
    stream = b"".join(sealer.seal(encode_command(commands[i % 2])) for i in range(count))
    _current.worker = worker
    start = time.perf_counter()
    try:
        # As a worker reads pipelined commands: a chunk of frames, its replays run by the
        # extension's dispatch, the first command of each kind run from Python.
        opener.feed(stream if run else b"")
        while True:
            payload, error = opener.dispatch(worker.replays, NUMBER_SIZE)
            if payload is None:
                break
            assert error is None, error
            worker._run_payload(payload)
    finally:
        _current.worker = None  # this thread is a worker only for the loop
    report("worker", count if run else 0, time.perf_counter() - start)


def controller_side(count: int, run: bool) -> None:
    """``count`` calls of ``Session.allreduce`` to 4 workers, framed and written to
    ``/dev/null``."""
    sess = Session(_Nowhere(), WORKERS, 1, 10.0, 5.0)
    sess._methods["runtime.disco.allreduce"] = DPackedFunc(sess, 100, None)
    layout = RemoteLayout((ELEMENTS,), np.dtype("float32"), None)
    src, dst = DRef(sess, 101, layout), DRef(sess, 102, layout)
    start = time.perf_counter()
    for _ in range(count if run else 0):
        sess.allreduce(src, dst)
    report("controller", count if run else 0, time.perf_counter() - start)


def report(side: str, count: int, seconds: float) -> None:
    """Print µs per command."""
    if count:
        print(f"{side}: {seconds / count * 1e6:.2f} µs per command over {count}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--side", choices=["worker", "controller"], required=True)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--setup-only", action="store_true", help="skip the loop")
    parser.add_argument(
        "--mpi", action="store_true", help="worker side: MPI on one rank, not checks only"
    )
    parser.add_argument(
        "--elements",
        type=int,
        default=ELEMENTS,
        help="worker side: float32 elements of a tensor (small with --mpi: one rank copies)",
    )
    args = parser.parse_args()
    if args.side == "worker":
        worker_side(args.count, not args.setup_only, args.mpi, args.elements)
    else:
        controller_side(args.count, not args.setup_only)


if __name__ == "__main__":
    main()
