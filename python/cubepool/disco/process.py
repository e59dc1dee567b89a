"""``ProcessSession``: workers as MPI processes, started by ``mpiexec``.

The controller listens on a socket and starts ``mpiexec -n N python -m cubepool.disco
--connect ADDRESS``: a Unix socket (``unix:PATH``) when every worker runs on this host,
else TCP (``HOST:PORT``). Each rank connects back, proves it knows the session's random
key (``multiprocessing``'s HMAC handshake), and says hello with its rank and pid.
Collectives run through MPI among the ranks; the socket carries only commands and small
answers.

Across machines, give ``mpiexec`` a host file (``hostfile=``) and an ``address`` of the
controller that every host can reach; the same code runs unchanged.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import secrets
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge, wait
from pathlib import Path

from cubepool.disco.errors import DiscoError, DiscoTimeout, MPIUnavailable, WorkerDied
from cubepool.disco.protocol import Command, DiscoAction, Hello, Message, encode_command
from cubepool.disco.session import (
    DEFAULT_FAILURE_GRACE,
    DEFAULT_TIMEOUT,
    Session,
    _check_shape,
)
from cubepool.disco.worker import AUTHKEY_ENV

#: The send buffer asked for on a Unix socket to a worker, in bytes (the kernel may give
#: less).
UNIX_SEND_BUFFER = 8 << 20

#: Seconds a normal shutdown waits for ``mpiexec`` to end before killing its group.
SHUTDOWN_GRACE = 10.0


def find_mpiexec(explicit: str | None = None) -> str:
    """The ``mpiexec`` to start workers with.

    In order: ``explicit``, the ``CUBEPOOL_MPIEXEC`` variable, the one beside this
    Python (installed by the ``mpich`` wheel of ``cubepool[disco]``), then ``PATH``.
    """
    candidates = [explicit, os.environ.get("CUBEPOOL_MPIEXEC")]
    beside = Path(sys.executable).parent / "mpiexec"
    candidates += [str(beside) if beside.exists() else None, shutil.which("mpiexec")]
    for candidate in candidates:
        if candidate:
            return candidate
    raise MPIUnavailable(
        'no mpiexec found: pip install "cubepool[disco]" (or set CUBEPOOL_MPIEXEC)'
    )


def _set_timeout(sock: socket.socket, option: int, seconds: float) -> None:
    """Set a kernel send/receive timeout, which keeps the socket blocking for ``os.read``."""
    whole = int(seconds)
    sock.setsockopt(
        socket.SOL_SOCKET, option, struct.pack("ll", whole, int((seconds - whole) * 1e6))
    )


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to the socket ``fd`` (``BlockingIOError`` when its send
    timeout passes first)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


class _MPITransport:
    """Worker processes under ``mpiexec``, one socket channel to each."""

    def __init__(
        self,
        num_workers: int,
        num_groups: int,
        timeout: float,
        startup_timeout: float,
        address: str,
        hostfile: str | None,
        mpiexec: str | None,
        mpiexec_args: Sequence[str],
        python: str,
    ) -> None:
        if importlib.util.find_spec("mpi4py") is None:
            raise MPIUnavailable('mpi4py is not installed: pip install "cubepool[disco]"')
        self._timeout = timeout
        self._closed = False
        self._connections: dict[int, Connection] = {}
        self.worker_pids: dict[int, int] = {}
        self.worker_hosts: dict[int, str] = {}
        self._local = hostfile is None and _is_loopback(address)
        key = secrets.token_bytes(32)
        # A session on this host talks over a Unix socket: a write to it costs about a
        # fifth of one to loopback TCP, and each command is a write to every worker.
        self._socket_dir: str | None = None
        if self._local and hasattr(socket, "AF_UNIX"):
            self._socket_dir = tempfile.mkdtemp(prefix="cubepool-disco-")
            path = os.path.join(self._socket_dir, "control")
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listener.bind(path)
            self._listener.listen()
            connect = f"unix:{path}"
        else:
            self._listener = socket.create_server((address, 0))
            connect = f"{address}:{self._listener.getsockname()[1]}"
        command = [find_mpiexec(mpiexec)]
        if hostfile is not None:
            command += ["-f", hostfile]
        command += [*mpiexec_args, "-n", str(num_workers), python, "-m", "cubepool.disco"]
        command += ["--connect", connect, "--num-groups", str(num_groups)]
        if self._local:
            command += ["--controller-pid", str(os.getpid())]
        self.command = command
        env = dict(os.environ)
        env[AUTHKEY_ENV] = key.hex()
        # A session of its own, so that closing can kill mpiexec, its proxies and the
        # ranks as one process group.
        try:
            self.process = subprocess.Popen(
                command, env=env, stdin=subprocess.DEVNULL, start_new_session=True
            )
        except OSError as exc:
            self._close_listener()
            raise MPIUnavailable(f"cannot start {command[0]}: {exc}") from exc
        try:
            self._accept(num_workers, key, startup_timeout)
        except BaseException:
            self.close(force=True)
            raise
        self._remove_socket_dir()  # every worker is connected: nothing is left to find it

    def _remove_socket_dir(self) -> None:
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None

    def _accept(self, num_workers: int, key: bytes, startup_timeout: float) -> None:
        deadline = time.monotonic() + startup_timeout
        while len(self._connections) < num_workers:
            status = self.process.poll()
            if status is not None:
                raise DiscoError(
                    f"mpiexec exited with status {status} before all workers connected "
                    f"({sorted(self._connections)} of {num_workers}); command: {self.command}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(num_workers)) - set(self._connections))
                raise DiscoTimeout("the workers' hello", startup_timeout, missing)
            ready, _, _ = select.select([self._listener], [], [], min(0.1, remaining))
            if not ready:
                continue
            sock, _ = self._listener.accept()
            sock.setblocking(True)
            if sock.family == getattr(socket, "AF_UNIX", None):
                # Each command takes a buffer of the sender's until the worker reads it:
                # a larger send buffer (the kernel caps it at net.core.wmem_max) lets
                # the controller queue more commands to a busy worker before it waits.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UNIX_SEND_BUFFER)
            else:
                # Commands are small writes in a row: without TCP_NODELAY, Nagle's
                # algorithm holds each one back until the previous is acknowledged.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _set_timeout(sock, socket.SO_RCVTIMEO, max(1.0, min(10.0, remaining)))
            _set_timeout(sock, socket.SO_SNDTIMEO, self._timeout)
            connection = Connection(sock.detach())
            try:
                deliver_challenge(connection, key)
                answer_challenge(connection, key)
                hello = connection.recv()
            except Exception:  # a wrong key, a closed or too slow peer: not one of ours
                connection.close()
                continue
            if not isinstance(hello, Hello) or hello.worker_id in self._connections:
                connection.close()
                continue
            with socket.socket(fileno=os.dup(connection.fileno())) as shared:
                _set_timeout(shared, socket.SO_RCVTIMEO, 0.0)
            self._connections[hello.worker_id] = connection
            self.worker_pids[hello.worker_id] = hello.pid
            self.worker_hosts[hello.worker_id] = hello.host

    def _died(self, worker_id: int, what: str) -> WorkerDied:
        try:
            status = self.process.wait(1.0)
            detail = f"{what}; mpiexec exited with status {status}"
        except subprocess.TimeoutExpired:
            detail = what
        return WorkerDied(worker_id, detail)

    def send(self, worker_ids: Sequence[int], command: Command) -> None:
        frame = encode_command(command)  # once for all: the same bytes to each
        for worker_id in worker_ids:
            try:
                _write_all(self._connections[worker_id].fileno(), frame)
            except BlockingIOError:
                waiting_for = f"sending {command.action.name}"
                raise DiscoTimeout(waiting_for, self._timeout, [worker_id]) from None
            except OSError as exc:
                raise self._died(worker_id, f"its channel is closed ({exc})") from None

    def receive(self, timeout: float) -> tuple[int, Message] | None:
        by_connection = {id(conn): worker_id for worker_id, conn in self._connections.items()}
        ready = wait(list(self._connections.values()), timeout)
        if not ready:
            return None
        connection = ready[0]
        assert isinstance(connection, Connection)
        worker_id = by_connection[id(connection)]
        try:
            message: Message = connection.recv()
        except (EOFError, OSError):
            raise self._died(worker_id, "its channel closed") from None
        return worker_id, message

    def close(self, force: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        if not force:
            shutdown = encode_command(Command(DiscoAction.kShutDown, 0, (), 0))
            for connection in self._connections.values():
                try:
                    _write_all(connection.fileno(), shutdown)
                except OSError:
                    pass
        try:
            self.process.wait(0.0 if force else SHUTDOWN_GRACE)
        except subprocess.TimeoutExpired:
            pass
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()
        if self._local:
            for pid in self.worker_pids.values():
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for connection in self._connections.values():
            connection.close()
        self._close_listener()

    def _close_listener(self) -> None:
        self._listener.close()
        self._remove_socket_dir()


class ProcessSession(Session):
    """A session whose workers are MPI processes started by ``mpiexec``.

    ``num_workers`` ranks in ``num_groups`` groups; ``timeout`` bounds every wait,
    ``startup_timeout`` the start, ``failure_grace`` the wait for the others after a
    worker failed. ``address`` is where the controller listens and the workers connect
    over TCP (loopback by default; a loopback address and no host file make it a Unix
    socket instead); ``hostfile`` is passed to ``mpiexec -f`` to place ranks on
    several machines; ``mpiexec`` and ``mpiexec_args`` choose and tune the launcher;
    ``python`` is the interpreter the ranks run (the same path on every host).
    """

    def __init__(
        self,
        num_workers: int,
        num_groups: int = 1,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        startup_timeout: float = 60.0,
        failure_grace: float = DEFAULT_FAILURE_GRACE,
        address: str = "127.0.0.1",
        hostfile: str | os.PathLike[str] | None = None,
        mpiexec: str | None = None,
        mpiexec_args: Sequence[str] = (),
        python: str = sys.executable,
    ) -> None:
        _check_shape(num_workers, num_groups)
        self._mpi = _MPITransport(
            num_workers,
            num_groups,
            timeout,
            startup_timeout,
            address,
            None if hostfile is None else os.fspath(hostfile),
            mpiexec,
            mpiexec_args,
            python,
        )
        super().__init__(self._mpi, num_workers, num_groups, timeout, failure_grace)

    @property
    def worker_pids(self) -> list[int]:
        """The process id of each worker, in worker order (on its own host)."""
        return [self._mpi.worker_pids[worker_id] for worker_id in range(self.num_workers)]

    @property
    def worker_hosts(self) -> list[str]:
        """The host name of each worker, in worker order."""
        return [self._mpi.worker_hosts[worker_id] for worker_id in range(self.num_workers)]

    @property
    def launcher_pid(self) -> int:
        """The process id of ``mpiexec``."""
        return self._mpi.process.pid
