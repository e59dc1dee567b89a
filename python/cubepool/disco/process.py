"""``ProcessSession``: workers as MPI processes, started by ``mpiexec``.

The controller listens on a socket and starts ``mpiexec -n N python -m cubepool.disco
--connect ADDRESS``: a Unix socket (``unix:PATH``) when every worker runs on this host,
else TCP (``HOST:PORT``). Each rank connects back, proves it knows the session's random
key (the handshake of :mod:`cubepool.disco.wire`; all connections at once, each with a
short deadline), and says hello with its rank and pid in the first authenticated frame;
every later frame in either direction is authenticated too. Collectives run through MPI
among the ranks; the socket carries only commands and small answers.

Across machines, give ``mpiexec`` a host file (``hostfile=``), an ``address`` of the
controller that every host can reach, and a key file at one path on every host
(``key_file=``): the key never travels in ``mpiexec``'s environment, which its proxies
receive in clear text (:mod:`cubepool.disco.keys`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import math
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from cubepool._errors import InvalidArgument
from cubepool.disco.collectives import TVM_MODULES
from cubepool.disco.errors import (
    DiscoError,
    DiscoTimeout,
    FrameRejected,
    MPIUnavailable,
    WorkerDied,
    WorkerError,
)
from cubepool.disco.keys import PrivateKeyFile, launch_environment, read_key_file
from cubepool.disco.listener import accept_peers
from cubepool.disco.protocol import (
    HOST_CCL,
    Command,
    DiscoAction,
    Hello,
    Message,
    NodeHello,
    NodeWelcome,
    command_body,
    decode_message,
    encode_command,
    encode_message,
)
from cubepool.disco.segments import MPISegments
from cubepool.disco.session import (
    DEFAULT_FAILURE_GRACE,
    DEFAULT_TIMEOUT,
    Session,
    _check_shape,
    _check_timeouts,
    check_build_ring,
)
from cubepool.disco.wire import (
    Channel,
    new_key,
    set_socket_timeout,
    write_all,
)

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


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def start_mpiexec(
    command: list[str], key_file: str, extra_env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``command`` (an ``mpiexec`` line) in a process group of its own, with the
    path of the session's key file in the environment and no key
    (:func:`~cubepool.disco.keys.launch_environment`); ``MPIUnavailable`` if it cannot
    start."""
    env = launch_environment(key_file)
    env.update(extra_env or {})
    try:
        # A session of its own, so that closing can kill mpiexec, its proxies and the
        # ranks as one process group.
        return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        raise MPIUnavailable(f"cannot start {command[0]}: {exc}") from exc


def stop_process_group(process: subprocess.Popen[bytes], grace: float) -> None:
    """Wait up to ``grace`` seconds for ``process`` to end, then kill its process group."""
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


def worker_command(
    mpiexec: str,
    hostfile: str | None,
    mpiexec_args: Sequence[str],
    num_workers: int,
    python: str,
    connect: str,
    num_groups: int,
    node: int = 0,
    num_nodes: int = 1,
    controller_pid: int = 0,
) -> list[str]:
    """The ``mpiexec`` line that starts one node's workers."""
    command = [mpiexec]
    if hostfile is not None:
        command += ["-f", hostfile]
    command += [*mpiexec_args, "-n", str(num_workers), python, "-m", "cubepool.disco"]
    command += ["--connect", connect, "--num-groups", str(num_groups)]
    if num_nodes > 1:
        command += ["--node", str(node), "--num-nodes", str(num_nodes)]
    if controller_pid:
        command += ["--controller-pid", str(controller_pid)]
    return command


def tune_channel(channel: Channel, timeout: float) -> None:
    """Socket options of a controller's channel to a worker (buffers, Nagle, timeouts)."""
    sock = channel.sock
    if sock.family == getattr(socket, "AF_UNIX", None):
        # Each command takes a buffer of the sender's until the worker reads it: a
        # larger send buffer (the kernel caps it at net.core.wmem_max) lets the
        # controller queue more commands to a busy worker before it waits.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UNIX_SEND_BUFFER)
    else:
        # Commands are small writes in a row: without TCP_NODELAY, Nagle's algorithm
        # holds each one back until the previous is acknowledged.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    set_socket_timeout(sock, socket.SO_RCVTIMEO, 0.0)
    set_socket_timeout(sock, socket.SO_SNDTIMEO, timeout)


class _MPITransport:
    """Worker processes under ``mpiexec`` (one per node), one authenticated channel each.

    The controller starts node 0's workers itself; with ``num_nodes > 1`` it also waits
    for the other nodes (``python -m cubepool.disco.remote``) to connect to its listener,
    tells each its index, and each starts its own workers, which connect back here.
    Every connection (worker or node) is handshaken concurrently with a deadline of its
    own (:func:`~cubepool.disco.listener.accept_peers`).
    """

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
        *,
        key: bytes | None = None,
        key_file: str | None = None,
        port: int = 0,
        num_nodes: int = 1,
        force_tcp: bool = False,
        listening: Callable[[int], None] | None = None,
    ) -> None:
        if importlib.util.find_spec("mpi4py") is None:
            raise MPIUnavailable('mpi4py is not installed: pip install "cubepool[disco]"')
        if hostfile is not None and key_file is None:
            raise InvalidArgument(
                "a session across hosts (hostfile=) needs key_file=: a file holding the "
                "session key in hex (mode 0600) at that path on every host; mpiexec would "
                "send a key in its environment to the other hosts in clear text"
            )
        if key_file is not None:
            try:
                key = read_key_file(key_file)
            except FrameRejected as exc:
                raise InvalidArgument(f"key_file: {exc}") from None
        self._timeout = timeout
        self._closed = False
        self._channels: dict[int, Channel] = {}
        self._by_fd: dict[int, int] = {}
        # The workers' channels, polled together by `receive` (poll, not select: select
        # refuses descriptors of 1024 and more, which a process with many files open
        # or a large session hands out).
        self._poll = select.poll()
        self._nodes: dict[int, Channel] = {}
        self.node_hosts: dict[int, str] = {}
        self.worker_pids: dict[int, int] = {}
        self.worker_hosts: dict[int, str] = {}
        self._num_workers = num_workers
        self._num_nodes = num_nodes
        self._num_groups = num_groups
        self._per_node = num_workers // num_nodes
        self._local = hostfile is None and _is_loopback(address) and num_nodes == 1
        self._key = key if key is not None else new_key()
        # The workers read the key from a file: the user's, or one of this session's
        # (made when mpiexec starts, removed once every worker has connected).
        self._key_file: PrivateKeyFile | None = None
        # Found before anything is made: a missing mpiexec used to leave the Unix
        # socket's folder behind in the temporary directory.
        launcher = find_mpiexec(mpiexec)
        # A session on this host talks over a Unix socket: a write to it costs about a
        # fifth of one to loopback TCP, and each command is a write to every worker.
        self._socket_dir: str | None = None
        listener = None
        if self._local and hasattr(socket, "AF_UNIX") and not force_tcp:
            listener = self._listen_unix()
        if listener is not None:
            self._listener, connect = listener
        else:
            try:
                self._listener = socket.create_server((address, port), backlog=64)
            except OSError as exc:
                raise DiscoError(f"cannot listen on {address}:{port}: {exc}") from exc
            connect = f"{address}:{self._listener.getsockname()[1]}"
        self.connect = connect
        if listening is not None:
            # What must wait for the port to be this session's (a loopback key for the
            # nodes, SocketSession), before anything connects.
            try:
                listening(int(connect.rpartition(":")[2]))
            except BaseException:
                self._close_listener()
                raise
        self.command = worker_command(
            launcher,
            hostfile,
            mpiexec_args,
            self._per_node,
            python,
            connect,
            num_groups,
            0,
            num_nodes,
            os.getpid() if self._local else 0,
        )
        # The workers record their MPI shared-memory files for the close to remove should
        # they never finalize (cubepool.disco.segments).
        self._segments = MPISegments()
        try:
            if key_file is None:
                self._key_file = PrivateKeyFile(self._key)
                key_file = self._key_file.path
            self.process = start_mpiexec(
                self.command, key_file, extra_env=self._segments.environment()
            )
        except BaseException:
            self._close_listener()
            self._segments.remove()
            raise
        self._segments.watch(self.process)
        try:
            self._accept(startup_timeout)
            # Every worker of this host has said hello, after its record: all are in.
            self._segments.collect()
        except BaseException:
            self.close(force=True)
            raise
        # Every worker is connected: no one needs the startup files, and no one else may
        # join, so the listener goes too (a late node is refused at once, instead of
        # waiting in the kernel's queue for an accept that never comes).
        self._close_listener()

    def _listen_unix(self) -> tuple[socket.socket, str] | None:
        """A listening Unix socket in a new private folder, and its ``unix:`` address;
        None (nothing left behind) where the system refuses one, so the session listens
        on loopback TCP instead. A socket's path must fit ``sun_path`` (108 bytes on
        Linux, 104 on macOS): under a long ``TMPDIR`` the bind used to fail as a bare
        ``OSError`` ("AF_UNIX path too long") and leave the folder behind."""
        folder = tempfile.mkdtemp(prefix="cubepool-disco-")
        path = os.path.join(folder, "control")
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.bind(path)
                sock.listen(64)
            except BaseException:
                sock.close()
                raise
        except OSError:
            shutil.rmtree(folder, ignore_errors=True)
            return None
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self._socket_dir = folder
        return sock, f"unix:{path}"

    def _remove_startup_files(self) -> None:
        """Removes the Unix socket's folder and this session's key file, if any."""
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None
        if self._key_file is not None:
            self._key_file.remove()

    def _take(self, hello: object, channel: Channel) -> bool:
        """Keep an authenticated peer: a worker of a known node, or a new node."""
        if isinstance(hello, (Hello, NodeHello)) and not hello.well_formed():
            return False
        if isinstance(hello, Hello):
            worker_id = hello.worker_id
            node = worker_id // self._per_node
            if (
                not 0 <= worker_id < self._num_workers
                or worker_id in self._channels
                or (node != 0 and node not in self._nodes)
            ):
                return False
            tune_channel(channel, self._timeout)
            self._channels[worker_id] = channel
            self._by_fd[channel.fd] = worker_id
            self._poll.register(channel.fd, select.POLLIN)
            self.worker_pids[worker_id] = hello.pid
            self.worker_hosts[worker_id] = hello.host
            return True
        if isinstance(hello, NodeHello):
            node = len(self._nodes) + 1
            if node >= self._num_nodes or hello.num_workers != self._per_node:
                with contextlib.suppress(OSError):
                    channel.send(
                        encode_message(
                            f"refused: the session takes {self._num_nodes - 1} remote node(s) "
                            f"of {self._per_node} worker(s); this one offers "
                            f"{hello.num_workers}"
                        )
                    )
                return False
            set_socket_timeout(channel.sock, socket.SO_SNDTIMEO, self._timeout)
            welcome = NodeWelcome(node, self._num_nodes, self._num_groups, self.connect)
            try:
                channel.send(encode_message(welcome))
            except OSError:
                return False
            self._nodes[node] = channel
            self.node_hosts[node] = hello.host
            return True
        return False

    def _check_launchers(self) -> None:
        status = self.process.poll()
        if status is not None:
            raise DiscoError(
                f"mpiexec exited with status {status} before all workers connected "
                f"({sorted(self._channels)} of {self._num_workers}); command: {self.command}"
            )
        for node, channel in self._nodes.items():
            # A node says only one thing after its welcome: that it failed.
            if _readable_now(channel.fd):
                try:
                    channel.read_some()
                    payload = channel.poll_payload()
                    what = decode_message(payload) if payload is not None else "nothing"
                except (EOFError, OSError, FrameRejected) as exc:
                    what = f"its channel closed ({exc})"
                raise DiscoError(
                    f"node {node} ({self.node_hosts[node]}) failed to start its workers: {what}"
                )

    def _accept(self, startup_timeout: float) -> None:
        deadline = time.monotonic() + startup_timeout

        def timeout() -> BaseException:
            if len(self._nodes) < self._num_nodes - 1:
                host, _, port = self.connect.rpartition(":")
                return DiscoTimeout(
                    f"the remote nodes (python -m cubepool.disco.remote {host} {port} "
                    f"{self._per_node}); {len(self._nodes)} of {self._num_nodes - 1} came",
                    startup_timeout,
                    [],
                )
            missing = sorted(set(range(self._num_workers)) - set(self._channels))
            return DiscoTimeout("the workers' hello", startup_timeout, missing)

        accept_peers(
            self._listener,
            self._key,
            self._take,
            lambda: len(self._channels) == self._num_workers,
            deadline,
            self._check_launchers,
            timeout,
        )

    def _died(self, worker_id: int, what: str) -> WorkerDied:
        try:
            status = self.process.wait(1.0)
            detail = f"{what}; mpiexec exited with status {status}"
        except subprocess.TimeoutExpired:
            detail = what
        return WorkerDied(worker_id, detail)

    def prepare(self, command: Command) -> tuple[bytes, str]:
        """``command``'s payload less its number (encoded once: each channel seals its
        own frame of it), and its action's name for errors."""
        return command_body(encode_command(command)), command.action.name

    def send_prepared(
        self, worker_ids: Sequence[int], prepared: tuple[bytes, str], number: int
    ) -> None:
        body, action = prepared
        for worker_id in worker_ids:
            try:
                self._channels[worker_id].send_numbered(body, number)
            except BlockingIOError:
                raise DiscoTimeout(f"sending {action}", self._timeout, [worker_id]) from None
            except OSError as exc:
                if self._read_last_words():
                    continue  # a last message (a refusal: why a worker ended) comes as a reply
                raise self._died(worker_id, f"its channel is closed ({exc})") from None

    def _read_last_words(self) -> bool:
        """Reads what every worker has sent and not yet been read (up to each channel's
        end) into the channels' buffers, where ``receive`` finds it; whether any channel
        holds something. A worker that refuses a frame says so and ends at once (and
        mpiexec then ends the others), so a write to, or a read from, any of them can
        fail before the refusal is read."""
        for channel in self._channels.values():
            with contextlib.suppress(EOFError, OSError):
                while _readable_now(channel.fd):
                    channel.read_some()
        return any(channel.pending for channel in self._channels.values())

    def _next_buffered(self) -> tuple[int, Message] | None:
        for worker_id, channel in self._channels.items():
            if channel.pending:
                message = self._open(worker_id, channel)
                if message is not None:
                    return worker_id, message
        return None

    def _open(self, worker_id: int, channel: Channel) -> Message | None:
        try:
            payload = channel.poll_payload()
        except FrameRejected as exc:
            raise FrameRejected(
                f"worker {worker_id}'s channel: {exc.reason}; the session is shut down"
            ) from None
        if payload is None:
            return None
        message: Message = decode_message(payload)
        return message

    def receive(self, timeout: float) -> tuple[int, Message] | None:
        found = self._next_buffered()
        if found is not None:
            return found
        deadline = time.monotonic() + timeout
        while True:
            # poll takes a C int of milliseconds: a longer wait is polled again.
            wait_ms = min(math.ceil(max(0.0, deadline - time.monotonic()) * 1000), _LONGEST_POLL)
            ready = [fd for fd, _ in self._poll.poll(wait_ms)]
            if not ready:
                return None
            for fd in ready:
                worker_id = self._by_fd[fd]
                channel = self._channels[worker_id]
                try:
                    channel.read_some()
                except FrameRejected as exc:
                    raise FrameRejected(
                        f"worker {worker_id}'s channel: {exc.reason}; the session is shut down"
                    ) from None
                except (EOFError, OSError):
                    # What a worker sent before it ended comes first (a refusal says why
                    # it ended, and mpiexec may have ended the others since).
                    self._read_last_words()
                    found = self._next_buffered()
                    if found is not None:
                        return found
                    raise self._died(worker_id, "its channel closed") from None
                message = self._open(worker_id, channel)
                if message is not None:
                    return worker_id, message
            if time.monotonic() >= deadline:
                return None

    def close(self, force: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        self._segments.note()  # ranks still running: any file they have not recorded
        if not force:
            shutdown = encode_command(Command(DiscoAction.kShutDown, 0, (), 0))
            for channel in self._channels.values():
                with contextlib.suppress(OSError):
                    write_all(channel.fd, channel.seal(shutdown))
        stop_process_group(self.process, 0.0 if force else SHUTDOWN_GRACE)
        if self._local:
            for pid in self.worker_pids.values():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        for channel in self._channels.values():
            channel.close()
        for channel in self._nodes.values():  # a node ends its workers once this closes
            channel.close()
        self._close_listener()
        self._segments.remove()  # what killed ranks could not (cubepool.disco.segments)

    def _close_listener(self) -> None:
        """Closes the listening socket (again: nothing) and removes the startup files."""
        self._listener.close()
        self._remove_startup_files()

    @property
    def listening(self) -> bool:
        """Whether the listener is open (only while the session starts)."""
        return self._listener.fileno() >= 0


#: TVM's default ``entrypoint`` of a ``ProcessSession``: TVM's worker module, which
#: registers TVM's ``tests.disco.*`` functions; here cubepool's worker with those
#: functions (:mod:`cubepool.disco.testing`).
TVM_ENTRYPOINT = "tvm.exec.disco_worker"

#: The ``entrypoint`` of cubepool's own worker (``python -m cubepool.disco``) alone.
OWN_ENTRYPOINT = "cubepool.disco"


def entrypoint_module(entrypoint: str) -> str | None:
    """The module a ``ProcessSession``'s workers import at start for ``entrypoint``: the
    counterpart of TVM's :data:`TVM_ENTRYPOINT`, None for :data:`OWN_ENTRYPOINT`
    (cubepool's worker, nothing more), or ``entrypoint`` itself. ``InvalidArgument``
    unless it is a dotted module name (``pkg.module``)."""
    if not isinstance(entrypoint, str) or not all(
        part.isidentifier() for part in entrypoint.split(".")
    ):
        raise InvalidArgument(
            f"entrypoint must be a module name (such as {TVM_ENTRYPOINT!r}), got {entrypoint!r}"
        )
    if entrypoint == OWN_ENTRYPOINT:
        return None
    return TVM_MODULES.get(entrypoint, entrypoint)


class _MPISession(Session):
    """What sessions of MPI worker processes (``ProcessSession``, ``SocketSession``) show
    of their workers; ``_mpi`` is their transport."""

    _mpi: _MPITransport
    available_ccls = ("mpi", HOST_CCL)

    def _import_at_start(self, module: str | None, what: str) -> None:
        """Have every worker import ``module`` (nothing for None), the session just
        started; if one cannot, shut the session down and raise ``InvalidArgument``
        naming ``what`` (the argument that asked for it) and the worker's error."""
        if module is None:
            return
        try:
            self.import_python_module(module)
        except WorkerError as exc:
            self._close(force=True, reason=f"the workers could not import {module!r}")
            raise InvalidArgument(
                f"{what}: worker {exc.worker_id} cannot import {module!r}: {exc.exc_type}: "
                f"{exc.message}"
            ) from exc
        except BaseException:
            self._close(force=True, reason=f"the import of {module!r} at start failed")
            raise

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
        """The process id of this host's ``mpiexec`` (node 0's)."""
        return self._mpi.process.pid


class ProcessSession(_MPISession):
    """A session whose workers are MPI processes started by ``mpiexec``.

    ``num_workers`` ranks in ``num_groups`` groups; ``timeout`` bounds every wait,
    ``startup_timeout`` the start, ``failure_grace`` the wait for the others after a
    worker failed. ``address`` is where the controller listens and the workers connect
    over TCP (loopback by default; a loopback address and no host file make it a Unix
    socket instead); ``hostfile`` is passed to ``mpiexec -f`` to place ranks on
    several machines, and then ``key_file`` is required: a file holding the session key
    in hex, readable by its owner only, at that path on every host (the ranks read it
    there; without a host file the session makes a private key file of its own, which
    ranks on other hosts cannot read). ``mpiexec`` and ``mpiexec_args`` choose and tune
    the launcher; ``python`` is the interpreter the ranks run (the same path on every
    host). Collectives run on MPI (the ``"mpi"`` engine of :meth:`~Session.init_ccl`).

    The first four parameters are TVM's, in TVM's order: ``ProcessSession(num_workers,
    num_groups=1, entrypoint="tvm.exec.disco_worker", build_ring=False)``. TVM's
    ``entrypoint`` is the module its workers run; cubepool's workers always run
    cubepool's (``python -m cubepool.disco``), and import ``entrypoint`` at start, before
    the session is returned (so its ``register_func`` calls run on every worker): TVM's
    default, ``"tvm.exec.disco_worker"``, stands for :mod:`cubepool.disco.testing`, the
    ``tests.disco.*`` functions TVM's worker module registers, so TVM's tests find them
    as written; ``"cubepool.disco"`` imports nothing more. A module the workers cannot
    import shuts the session down and raises ``InvalidArgument`` naming ``entrypoint``
    and the worker's error. ``build_ring`` is checked and changes nothing
    (:func:`~cubepool.disco.session.check_build_ring`).
    """

    def __init__(
        self,
        num_workers: int,
        num_groups: int = 1,
        entrypoint: str = TVM_ENTRYPOINT,
        build_ring: bool = False,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        startup_timeout: float = 60.0,
        failure_grace: float = DEFAULT_FAILURE_GRACE,
        address: str = "127.0.0.1",
        hostfile: str | os.PathLike[str] | None = None,
        key_file: str | os.PathLike[str] | None = None,
        mpiexec: str | None = None,
        mpiexec_args: Sequence[str] = (),
        python: str = sys.executable,
    ) -> None:
        _check_shape(num_workers, num_groups)
        module = entrypoint_module(entrypoint)
        _check_timeouts(timeout, failure_grace, startup_timeout)
        check_build_ring(build_ring)
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
            key_file=None if key_file is None else os.fspath(key_file),
        )
        super().__init__(self._mpi, num_workers, num_groups, timeout, failure_grace)
        self._import_at_start(module, f"entrypoint {entrypoint!r}")


_LONGEST_POLL = 2**31 - 1
"""The longest wait ``poll`` takes, in milliseconds (a C int)."""


def _readable_now(fd: int) -> bool:
    """Whether ``fd`` has something to read (or has ended) now: ``poll`` with no wait
    (``select`` refuses descriptors of 1024 and more). A closed channel's descriptor
    (-1) has nothing to read."""
    if fd < 0:
        return False
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))
