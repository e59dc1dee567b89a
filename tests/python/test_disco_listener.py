"""A session's listener and channels under attack: idle, slow and garbage connections do
not stall startup, nor does running out of descriptors; a tampered frame on a live
session is refused and nothing in it runs."""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import secrets
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import disco_nodes
import numpy as np
import pytest
from disco_nodes import NodesSession, free_port, node_env, start_remote
from disco_procs import wait_gone

from cubepool import disco
from cubepool.disco import listener as listener_module
from cubepool.disco.listener import ACCEPT_PAUSE, accept_peers
from cubepool.disco.process import find_mpiexec
from cubepool.disco.protocol import NUMBER_SIZE, NodeHello, encode_message
from cubepool.disco.wire import (
    MAGIC,
    MAX_FRAME,
    SERVER_HELLO_SIZE,
    SERVER_PROOF_SIZE,
    Channel,
    Handshake,
    connect_channel,
    connect_retrying,
    write_all,
)
from cubepool.disco.wire import _read_exactly as read_exactly

pytest.importorskip("mpi4py")

TESTS = Path(__file__).parent

#: Opens 5 idle, 5 slow and 5 garbage connections to the address after ``--connect``,
#: writes the file named by ``ATTACK_READY`` once all are open, and holds them for
#: ``ATTACK_HOLD`` seconds: longer than the session's startup timeout, so a listener
#: that waited for any of them in turn would fail to start.
ATTACKER = textwrap.dedent(
    """
    import os, socket, sys, time
    target = sys.argv[sys.argv.index("--connect") + 1]
    def connect():
        if target.startswith("unix:"):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(target[5:])
        else:
            host, _, port = target.rpartition(":")
            s = socket.create_connection((host, int(port)))
        return s
    idle = [connect() for _ in range(5)]
    slow = [connect() for _ in range(5)]
    garbage = [connect() for _ in range(5)]
    for n, s in enumerate(garbage):
        # random bytes; the protocol's magic with a wrong proof; a huge frame header
        s.sendall([os.urandom(300), b"cpdisco1" + os.urandom(64),
                   b"cpdisco1" + bytes(64) + b"\\xff\\xff\\xff\\xff" + b"\\x7f" * 8,
                   b"GET / HTTP/1.1\\r\\n\\r\\n", os.urandom(72)][n])
    open(os.environ["ATTACK_READY"], "w").close()
    end = time.monotonic() + float(os.environ["ATTACK_HOLD"])
    hello = b"cpdisco1" + os.urandom(64)
    step = 0
    while time.monotonic() < end:
        for s in slow:  # one byte of a plausible answer at a time
            try:
                s.send(hello[step % len(hello) : step % len(hello) + 1])
            except OSError:
                pass
        step += 1
        time.sleep(0.3)
    """
)


def attacking_mpiexec(tmp_path: Path, hold: float) -> str:
    """An ``mpiexec`` that first starts the attacker on the session's address and waits
    until its 15 connections are open, then runs the real ``mpiexec``."""
    (tmp_path / "attacker.py").write_text(ATTACKER)
    ready = tmp_path / "ready"
    wrapper = tmp_path / "mpiexec"
    wrapper.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            ATTACK_READY={ready} ATTACK_HOLD={hold} {sys.executable} {tmp_path}/attacker.py "$@" &
            while [ ! -e {ready} ]; do sleep 0.05; done
            exec {find_mpiexec()} "$@"
            """
        )
    )
    wrapper.chmod(0o755)
    return str(wrapper)


def test_startup_survives_idle_slow_and_garbage_connections(tmp_path: Path) -> None:
    # (a TCP listener under a flood from another host: the last test of this file)
    mpiexec = attacking_mpiexec(tmp_path, hold=30.0)
    session = disco.ProcessSession(
        2,
        mpiexec=mpiexec,
        startup_timeout=15.0,  # < the attack's 30 s: no idle connection may be waited out
    )
    with session:
        x = session.broadcast(np.arange(4, dtype=np.float32))
        np.testing.assert_array_equal(x.debug_get_from_remote(1), np.arange(4))
    assert wait_gone([session.launcher_pid, *session.worker_pids]) == []


def process_session(num_workers: int, **options: object) -> disco.ProcessSession:
    with pytest.MonkeyPatch.context() as patch:
        path = os.pathsep.join(p for p in [str(TESTS), os.environ.get("PYTHONPATH")] if p)
        patch.setenv("PYTHONPATH", path)
        session = disco.ProcessSession(num_workers, **options)  # type: ignore[arg-type]
    session.import_python_module("disco_helpers")
    return session


def flip_next_frame(channel: Channel) -> None:
    """Make the next command sent on ``channel`` arrive with one flipped bit (its frame
    sealed as the channel seals it, then changed on the way)."""
    send_numbered = channel.send_numbered

    def tampered(body: bytes, number: int) -> None:
        channel.send_numbered = send_numbered  # type: ignore[method-assign]
        frame = bytearray(channel.seal(body + number.to_bytes(NUMBER_SIZE, "big")))
        frame[-1] ^= 0x01
        write_all(channel.fd, bytes(frame))

    channel.send_numbered = tampered  # type: ignore[method-assign]


def test_a_tampered_command_is_refused_by_the_worker_and_nothing_runs(tmp_path: Path) -> None:
    session = process_session(2, timeout=20, failure_grace=1.0)
    pids = [session.launcher_pid, *session.worker_pids]
    touch = session.get_global_func("tests.disco.touch")
    session.sync_workers()
    flip_next_frame(session._mpi._channels[1])
    touch(str(tmp_path))  # worker 0 gets it whole, worker 1 with a flipped bit
    with pytest.raises(disco.DiscoError) as info:
        session.sync_workers()
    text = str(info.value)
    assert "refused a command" in text and "failed authentication" in text
    assert "nothing in it ran" in text
    # Worker 0 got the command whole and may have run it, or not: the refusing worker
    # ends at once and mpiexec then ends the others (CI once saw ran-0 missing). The
    # tampered copy never runs.
    assert not (tmp_path / "ran-1").exists()
    assert session.closed
    with pytest.raises(disco.SessionClosed, match="after this failure"):
        session.sync_worker_0()
    assert wait_gone(pids) == []


def test_a_refusal_is_reported_when_the_worker_is_gone_before_the_next_command(
    tmp_path: Path,
) -> None:
    """A worker that refuses a frame says so and ends at once (mpiexec then ends the
    others): the next command's write fails, and the session reports the refusal, not
    a closed channel (CI once saw the latter when the worker ended first)."""
    session = process_session(2, timeout=20, failure_grace=1.0)
    pids = [session.launcher_pid, *session.worker_pids]
    touch = session.get_global_func("tests.disco.touch")
    session.sync_workers()
    flip_next_frame(session._mpi._channels[1])
    touch(str(tmp_path))
    # It ended before the next write, and mpiexec ended the other worker: every write
    # and read of the next command fails before the refusal is read.
    assert wait_gone(session.worker_pids) == []
    with pytest.raises(disco.DiscoError) as info:
        session.sync_workers()
    text = str(info.value)
    assert "refused a command" in text and "failed authentication" in text, text
    assert not (tmp_path / "ran-1").exists()
    assert session.closed
    assert wait_gone(pids) == []


def test_a_tampered_answer_is_refused_by_the_controller() -> None:
    session = process_session(2, timeout=20)
    pids = [session.launcher_pid, *session.worker_pids]
    channel = session._mpi._channels[0]
    real_read = channel.read_some

    def read_some() -> None:  # the answer arrives with a flipped bit
        channel.read_some = real_read  # type: ignore[method-assign]
        data = os.read(channel.fd, 1 << 16)
        channel._opener.feed(data[:-1] + bytes([data[-1] ^ 1]))

    channel.read_some = read_some  # type: ignore[method-assign]
    with pytest.raises(disco.FrameRejected, match=r"worker 0's channel: frame \d+ failed"):
        session.sync_worker_0()
    assert session.closed
    assert wait_gone(pids) == []


#: A long frame header claiming 1 TiB: a length prefix changed on the way (no key used).
CHANGED_LENGTH = struct.pack("!i", -1) + struct.pack("!Q", MAX_FRAME)


def test_a_changed_length_is_refused_by_the_worker_before_it_reads_more() -> None:
    """A frame's length is not authenticated until the frame is in: a worker refuses one
    no frame could have (it used to ask os.read for 1 TiB and die of MemoryError)."""
    session = process_session(2, timeout=20, failure_grace=1.0)
    pids = [session.launcher_pid, *session.worker_pids]
    session.sync_workers()
    write_all(session._mpi._channels[1].fd, CHANGED_LENGTH)  # then the next command
    with pytest.raises(disco.DiscoError) as info:
        session.sync_workers()
    text = str(info.value)
    assert "worker 1 refused a command" in text and "impossible length" in text, text
    assert session.closed
    assert wait_gone(pids) == []


def test_a_changed_length_is_refused_by_the_controller() -> None:
    """The same on the way back: the controller refuses the worker's channel and shuts
    the session down (it used to raise MemoryError and leave the session open)."""
    session = process_session(2, timeout=20)
    pids = [session.launcher_pid, *session.worker_pids]
    session.get_global_func("tests.disco.write_raw")(CHANGED_LENGTH)  # before its answers
    with pytest.raises(disco.FrameRejected, match=r"worker \d's channel: frame \d+ has an imp"):
        session.sync_workers()
    assert session.closed
    assert wait_gone(pids) == []


def test_a_local_process_session_talks_over_a_unix_socket_and_leaves_no_file() -> None:
    with disco.ProcessSession(2) as session:
        connect = session._mpi.connect
        assert connect.startswith("unix:")
        socket_file = connect.removeprefix("unix:")
        # Once every worker is connected, the socket's file and folder are gone, so even a
        # controller killed outright leaves nothing behind.
        assert not os.path.exists(socket_file)
        assert not os.path.exists(os.path.dirname(socket_file))
        array = np.arange(6, dtype=np.float32)
        remote = session.empty((6,), "float32")
        remote.debug_copy_from(0, array)
        np.testing.assert_array_equal(remote.debug_get_from_remote(0), array)


class Crowded(socket.socket):
    """A listening socket whose first ``failures`` accepts fail with ``error``, as at the
    process's file limit (EMFILE) or the system's (ENFILE, ENOBUFS, ENOMEM)."""

    failures = 0
    error = errno.EMFILE
    calls = 0

    def accept(self) -> tuple[socket.socket, Any]:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise OSError(self.error, os.strerror(self.error))
        return super().accept()


def accept_one_peer(listener: socket.socket, seconds: float = 10.0) -> list[object]:
    """Run ``accept_peers`` on ``listener`` until one peer holding the key says hello (a
    thread here, whose failure against a listener that failed is passed over); the
    hellos taken (:func:`serve_one_hello`)."""
    key = os.urandom(32)

    def peer() -> None:
        with (
            contextlib.suppress(disco.DiscoError, OSError),  # (a listener that failed)
            socket.create_connection(listener.getsockname()[:2]) as sock,
        ):
            connect_channel(sock, key, seconds).send(pickle.dumps("hello"))

    return serve_one_hello(listener, key, peer, seconds)


@pytest.mark.parametrize(
    "error", [errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED]
)
def test_accepting_pauses_out_of_descriptors_and_goes_on(error: int) -> None:
    """(EMFILE once escaped ``accept_peers`` as a bare OSError and ended the startup.)"""
    with Crowded(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.failures, listener.error = 3, error
        start = time.monotonic()
        assert accept_one_peer(listener) == ["hello"]
        assert listener.calls == 4  # one accept per pause, not a busy loop
        if error != errno.ECONNABORTED:  # (that one only lost a connection)
            assert time.monotonic() - start >= 3 * ACCEPT_PAUSE * 0.9


def test_a_listener_that_cannot_accept_is_a_disco_error() -> None:
    with Crowded(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.failures, listener.error = 1, errno.EBADF
        with pytest.raises(disco.DiscoError, match="cannot accept connections"):
            accept_one_peer(listener)


#: 200 idle connections to the port in ``argv[1]``, held for 30 s; "ready" once open.
FLOOD = textwrap.dedent(
    """
    import socket, sys, time
    held = [socket.create_connection(("127.0.0.1", int(sys.argv[1]))) for _ in range(200)]
    print("ready", flush=True)
    time.sleep(30)
    """
)

#: A listener at a file limit of 64 behind 200 idle connections (FLOOD), then one peer
#: holding the key: prints the hellos ``accept_peers`` took within 4 s.
AT_THE_FILE_LIMIT = textwrap.dedent(
    """
    import os, pickle, resource, socket, subprocess, sys, threading, time
    from cubepool.disco.listener import accept_peers
    from cubepool.disco.wire import connect_channel
    listener = socket.create_server(("127.0.0.1", 0), backlog=256)
    address = listener.getsockname()
    flood = subprocess.Popen(
        [sys.executable, "-c", sys.argv[1], str(address[1])], stdout=subprocess.PIPE
    )
    assert flood.stdout.readline() == b"ready\\n"
    peer = socket.socket()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    key = os.urandom(32)
    def hello():
        peer.connect(address)
        connect_channel(peer, key, 10.0).send(pickle.dumps("hello"))
    threading.Thread(target=hello, daemon=True).start()
    taken = []
    try:
        accept_peers(listener, key, lambda hello, channel: taken.append(hello) is None and False,
                     lambda: bool(taken), time.monotonic() + 4.0, lambda: None,
                     lambda: TimeoutError("no hello within 4 s"))
    finally:
        flood.kill()
    print(taken)
    """
)


def test_idle_connections_at_the_file_limit_do_not_stop_a_peer() -> None:
    """At 64 files, 200 idle connections used to take every descriptor (512 could be
    pending) and ``accept`` failed with EMFILE; now at most 16 handshake at once."""
    done = subprocess.run(
        [sys.executable, "-c", AT_THE_FILE_LIMIT, FLOOD],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['hello']"


#: A listener whose table holds one pending connection (``pending_limit`` patched),
#: behind connections that each send a byte just as the next one connects: the byte's
#: event and the accept that drops its sender for the newcomer come in one batch. Then
#: one peer holding the key: prints the hellos ``accept_peers`` took, or its error.
EVICTED_IN_ONE_BATCH = textwrap.dedent(
    """
    import os, pickle, socket, threading, time
    from cubepool.disco import listener as module
    from cubepool.disco.wire import connect_channel
    module.pending_limit = lambda: 1
    server = socket.create_server(("127.0.0.1", 0), backlog=256)
    address = server.getsockname()
    key = os.urandom(32)
    def attack_then_hello():
        held = [socket.create_connection(address)]
        for _ in range(100):
            time.sleep(0.005)
            newcomer = socket.socket()
            newcomer.setblocking(False)
            newcomer.connect_ex(address)
            held[-1].send(b"x")  # readable in the batch that accepts the newcomer
            held.append(newcomer)
        time.sleep(0.2)
        peer = socket.create_connection(address)
        connect_channel(peer, key, 10.0).send(pickle.dumps("hello"))
        time.sleep(1.0)
    threading.Thread(target=attack_then_hello, daemon=True).start()
    taken = []
    try:
        module.accept_peers(
            server, key, lambda hello, channel: taken.append(hello) is None and False,
            lambda: bool(taken), time.monotonic() + 20.0, lambda: None,
            lambda: TimeoutError("no hello within 20 s"),
        )
        print(taken)
    except Exception as error:
        print(type(error).__name__, error)
    """
)


def test_a_connection_dropped_for_a_newer_one_is_not_handled_again() -> None:
    """A pending connection dropped for a newcomer (a full table) while its own event
    was in the same batch was handled after its close: ``unregister`` of the closed
    socket raised ValueError, and the session's start failed, no key needed."""
    done = subprocess.run(
        [sys.executable, "-c", EVICTED_IN_ONE_BATCH],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['hello']", done.stdout


def test_a_descriptor_past_1024_is_polled() -> None:
    """The controller waited for its workers with ``select``, which refuses a descriptor
    of 1024 or more (a process with many files open, or a large session)."""
    import resource

    from cubepool.disco.process import _readable_now

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1600:
        pytest.skip(f"the file limit ({hard}) is too low for a descriptor past 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1600), hard))
    reader, writer = socket.socketpair()
    high = os.dup2(reader.fileno(), 1500)
    try:
        assert not _readable_now(high)
        writer.send(b"x")
        assert _readable_now(high)
    finally:
        os.close(high)
        reader.close()
        writer.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


#: The table of pending handshakes in the tests of a full table (``pending_limit``).
SMALL_TABLE = 4


def crowd(address: tuple[str, int], count: int, source: str | None = None) -> list[socket.socket]:
    """``count`` idle connections to ``address`` (from the address ``source``), each
    returned once the listener has accepted it (its server hello read): so each took a
    place in the table, after dropping another if the table was full."""
    held: list[socket.socket] = []
    for _ in range(count):
        sock = socket.socket()
        held.append(sock)
        if source is not None:
            sock.bind((source, 0))
        sock.settimeout(30.0)
        sock.connect(address)
        assert sock.recv(SERVER_HELLO_SIZE, socket.MSG_WAITALL)[:8] == MAGIC
    return held


def serve_one_hello(
    listener: socket.socket, key: bytes, peer: Callable[[], None], seconds: float = 20.0
) -> list[object]:
    """``accept_peers`` on ``listener`` until a hello comes, while ``peer`` runs on a
    thread (its exception, if any, raised here at once); the hellos taken. Where none
    came, the listener is closed, so that a peer waiting in its queue learns at once."""
    taken: list[object] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            peer()
        except BaseException as exc:
            failed.append(exc)

    def check() -> None:
        if failed:
            raise failed[0]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        accept_peers(
            listener,
            key,
            lambda hello, channel: taken.append(hello) is None and False,
            lambda: bool(taken),
            time.monotonic() + seconds,
            check,
            lambda: disco.DiscoTimeout("the peer's hello", seconds, [0]),
        )
    finally:
        if not taken:
            listener.close()
        thread.join(30.0)
    return taken


def can_bind(address: str) -> bool:
    """Whether a socket can take ``address`` as its own (127.0.0.2: Linux, not macOS)."""
    with socket.socket() as sock:
        try:
            sock.bind((address, 0))
        except OSError:
            return False
    return True


@pytest.fixture
def small_table(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(listener_module, "pending_limit", lambda: SMALL_TABLE)
    with socket.create_server(("127.0.0.1", 0), backlog=256) as server:
        yield server


def test_a_peer_that_proved_the_key_is_not_dropped_for_newcomers(small_table: Any) -> None:
    """A full table dropped its oldest connection for each newcomer, even one that had
    proved the key and was about to say hello: idle connections from anyone who can
    reach the port ended a worker (it then exited with status 3) and the session's
    start with it (seen with 256 files open, where the table holds 64)."""
    key = os.urandom(32)
    address = small_table.getsockname()
    held: list[socket.socket] = []

    def peer() -> None:
        sock = socket.create_connection(address)
        held.append(sock)
        channel = connect_channel(sock, key, 30.0)  # the listener checked its answer
        held.extend(crowd(address, 3 * SMALL_TABLE))
        channel.send(pickle.dumps("hello"))

    try:
        assert serve_one_hello(small_table, key, peer) == ["hello"]
    finally:
        for sock in held:
            sock.close()


def test_a_flood_from_another_address_drops_only_its_own_connections(
    small_table: Any,
) -> None:
    """A full table dropped its oldest connection, whoever's: a flood of idle connections
    from another host took the place of a worker's handshake before its answer came.
    Now the newcomer takes the place of the oldest connection of the address holding
    the most: the flood's own (which the table still bounds)."""
    if not can_bind("127.0.0.2"):
        pytest.skip("no 127.0.0.2 here to flood from")
    key = os.urandom(32)
    address = small_table.getsockname()
    held: list[socket.socket] = []

    def peer() -> None:
        deadline = time.monotonic() + 30.0
        sock = socket.create_connection(address)
        held.append(sock)
        handshake = Handshake(key)
        answer, server_nonce, client_nonce = handshake.client_answer(
            read_exactly(sock, SERVER_HELLO_SIZE, deadline)
        )
        held.extend(crowd(address, 3 * SMALL_TABLE, source="127.0.0.2"))
        sock.sendall(answer)  # only now
        proof = read_exactly(sock, SERVER_PROOF_SIZE, deadline)
        handshake.check_server(proof, server_nonce, client_nonce)
        up, down = handshake.channel_keys(server_nonce, client_nonce)
        Channel(sock, send_key=up, recv_key=down).send(pickle.dumps("hello"))

    try:
        # (Whether the flood's oldest were dropped cannot be told from here: the
        # listener closes every pending connection when it returns.)
        assert serve_one_hello(small_table, key, peer) == ["hello"]
    finally:
        for sock in held:
            sock.close()


def test_a_connection_waiting_in_the_listeners_queue_is_not_timed_out() -> None:
    """Under a flood a node's connection waited in the listener's queue, unaccepted,
    past its 10 s handshake timeout, and the node gave up ('the controller did not
    finish the handshake'): the wait for the controller's hello now takes from the
    retry window, and the handshake's timeout runs from the hello."""
    key = os.urandom(32)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        address = listener.getsockname()
        # Accepted 1 s late, against a handshake timeout of 0.3 s: refused without a
        # window to wait in...
        late = socket.create_connection(address)
        with pytest.raises(
            disco.FrameRejected, match=r"did not finish the handshake within 0\.3 s"
        ):
            connect_channel(late, key, 0.3)
        late.close()
        # ... taken when the wait comes out of the window.
        channels: list[Channel] = []

        def peer() -> None:
            channel = connect_retrying(lambda: socket.create_connection(address), key, 0.3, 30.0)
            channels.append(channel)
            channel.send(pickle.dumps("hello"))

        thread = threading.Thread(target=peer, daemon=True)
        thread.start()
        time.sleep(1.0)  # the listener accepts nothing meanwhile
        assert serve_one_hello(listener, key, lambda: None) == ["hello"]
        thread.join(30.0)
        assert len(channels) == 1
        channels[0].close()


@pytest.mark.parametrize(
    "garbage", [b"GET / HTTP/1.1\r\n\r\n", b"cpdisco1", b"\x16\x03\x01\x02\x00\x01"]
)
def test_garbage_is_dropped_at_its_first_wrong_byte(
    monkeypatch: pytest.MonkeyPatch, garbage: bytes
) -> None:
    """The module says so, but the answer was checked only once its 80 bytes were in:
    an HTTP request or a TLS hello held its place in the table until the deadline."""
    monkeypatch.setattr(listener_module, "HANDSHAKE_TIMEOUT", 600.0)
    key = os.urandom(32)
    with socket.create_server(("127.0.0.1", 0)) as server:
        address = server.getsockname()

        def peer() -> None:
            with socket.create_connection(address, timeout=10.0) as sock:
                assert sock.recv(SERVER_HELLO_SIZE, socket.MSG_WAITALL)[:8] == MAGIC
                sock.sendall(garbage)
                with contextlib.suppress(ConnectionResetError):
                    assert sock.recv(1) == b""  # (a TimeoutError before: still pending)
            with socket.create_connection(address) as sock:
                connect_channel(sock, key, 10.0).send(pickle.dumps("hello"))

        assert serve_one_hello(server, key, peer) == ["hello"]


def drop_first_answers(monkeypatch: pytest.MonkeyPatch, count: int) -> list[str]:
    """Make the listener drop the first ``count`` connections whose answer comes, as a
    full table drops a handshake for a newcomer; the sources of those dropped."""
    dropped: list[str] = []
    real_step = listener_module._Pending.step

    def step(self: Any, handshake: Handshake) -> Any:
        if self.opener is None and len(dropped) < count:
            name = self.sock.getpeername()
            dropped.append(name[0] if isinstance(name, tuple) else "")
            raise disco.FrameRejected("dropped by the test")
        return real_step(self, handshake)

    monkeypatch.setattr(listener_module._Pending, "step", step)
    return dropped


def test_workers_connect_again_when_their_handshake_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker whose handshake the listener dropped (a full table) ended, and so did
    the session's start: now it opens a new connection."""
    dropped = drop_first_answers(monkeypatch, 3)
    with disco.ProcessSession(2, startup_timeout=30.0) as session:
        x = session.broadcast(np.arange(4, dtype=np.float32))
        np.testing.assert_array_equal(x.debug_get_from_remote(1), np.arange(4))
    assert len(dropped) == 3
    assert wait_gone([session.launcher_pid, *session.worker_pids]) == []


def broadcast_through_two_nodes() -> None:
    """Starts a session of two nodes of one worker, broadcasts to the remote node's
    worker, and checks that the node then ends with status 0."""
    nodes = NodesSession(2, 1, startup_timeout=30.0)
    try:
        x = nodes.session.broadcast(np.arange(4, dtype=np.float32))
        np.testing.assert_array_equal(x.debug_get_from_remote(1), np.arange(4))
    finally:
        assert nodes.close() == [0]


def test_nodes_and_their_workers_connect_again_when_their_handshake_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same over TCP, for a session of a remote node: the first 3 answers are dropped,
    whichever of the node's and the 2 workers' they are."""
    dropped = drop_first_answers(monkeypatch, 3)
    broadcast_through_two_nodes()
    assert dropped == ["127.0.0.1"] * 3


def test_a_node_connects_again_when_its_handshake_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A remote node whose handshake the listener dropped exited with status 1 and never
    joined: now it opens a new connection and says hello (refused here, and it exits)."""
    dropped = drop_first_answers(monkeypatch, 1)
    key = secrets.token_hex(32)
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        node = start_remote(port, 3, node_env(key))
        taken: list[object] = []

        def take(hello: object, channel: Channel) -> bool:
            taken.append(hello)
            channel.send(encode_message("refused by the test"))
            return False

        try:
            accept_peers(
                server,
                bytes.fromhex(key),
                take,
                lambda: bool(taken),
                time.monotonic() + 30.0,
                lambda: None,
                lambda: disco.DiscoTimeout("the node's hello", 30.0, []),
            )
        finally:
            status = node.wait(30)
    assert dropped == ["127.0.0.1"]
    assert [type(hello) for hello in taken] == [NodeHello]
    assert status == 1  # refused


#: Floods the port in ``argv[1]`` from the address in ``argv[2]`` with idle connections
#: (each closed once 100 newer ones are open) until killed, from before the port listens.
# The flood runs at the lowest priority: another host's flood takes the listener's table,
# not the CPU of the session's own processes, which this one, a busy loop on the same
# machine, took from their start on 2 cores under load (a CI run timed out at 30 s).
FLOOD_FROM = textwrap.dedent(
    """
    import collections, errno, os, socket, sys
    os.nice(19)
    held = collections.deque()
    while True:
        sock = socket.socket()
        sock.setblocking(False)
        sock.bind((sys.argv[2], 0))
        if sock.connect_ex(("127.0.0.1", int(sys.argv[1]))) not in (0, errno.EINPROGRESS):
            sock.close()
            continue
        held.append(sock)
        if len(held) > 100:
            held.popleft().close()
    """
)


def test_a_session_starts_under_a_flood_of_idle_connections_from_another_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A session's start (a remote node and its workers, over TCP) while another address
    floods the port with idle connections: with a table of 16, the flood dropped the
    workers' and the node's handshakes, and the start failed (so it did with the table
    of 64 that 256 open files give, under a faster flood)."""
    if not can_bind("127.0.0.2"):
        pytest.skip("no 127.0.0.2 here to flood from")
    monkeypatch.setattr(listener_module, "pending_limit", lambda: 16)
    port = free_port()
    monkeypatch.setattr(disco_nodes, "free_port", lambda: port)
    flood = subprocess.Popen([sys.executable, "-c", FLOOD_FROM, str(port), "127.0.0.2"])
    try:
        broadcast_through_two_nodes()
    finally:
        flood.kill()
        flood.wait()


def test_a_late_node_is_refused_at_once_once_every_node_is_in() -> None:
    """The listener stayed bound after the start, never accepted from again: a late
    node's connection sat in the kernel's queue, and the node waited out its timeout to
    report that the controller "did not finish the handshake". Now the listener closes
    once every worker and node is in, so a connection is refused at once, and the node
    says that nothing listens."""
    nodes = NodesSession(2, 1, timeout=30)
    try:
        session = nodes.session
        started = time.monotonic()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", session.port), timeout=10).close()
        assert time.monotonic() - started < 5
        late = subprocess.run(
            [
                *(sys.executable, "-m", "cubepool.disco.remote", "127.0.0.1"),
                *(str(session.port), "1", "--connect-timeout", "1"),
            ],
            env=node_env(nodes.key),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert late.returncode == 1
        assert "Connection refused (nothing listens there" in late.stderr
        assert "already has all its nodes" in late.stderr
        ids = session.get_global_func("runtime.disco.worker_id")()
        assert [ids.debug_get_from_remote(w) for w in range(2)] == [0, 1]
        assert not session._mpi.listening
    finally:
        assert nodes.close() == [0]


def test_a_process_session_closes_its_listener_once_started() -> None:
    with disco.ProcessSession(2, timeout=30) as session:
        assert not session._mpi.listening
