"""A session's listener and channels under attack: idle, slow and garbage connections do
not stall startup, nor does running out of descriptors; a tampered frame on a live
session is refused and nothing in it runs."""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from disco_procs import wait_gone

from cubepool import disco
from cubepool.disco.listener import ACCEPT_PAUSE, accept_peers
from cubepool.disco.process import find_mpiexec
from cubepool.disco.protocol import NUMBER_SIZE
from cubepool.disco.wire import MAX_FRAME, Channel, connect_channel, write_all

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
    # (the TCP listener of a SocketSession is attacked in test_disco_socket_session.py)
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
    assert (tmp_path / "ran-0").exists()
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
    thread here); the hellos taken."""
    key = os.urandom(32)
    taken: list[object] = []

    def peer() -> None:
        with (
            contextlib.suppress(disco.DiscoError, OSError),  # (a listener that failed)
            socket.create_connection(listener.getsockname()[:2]) as sock,
        ):
            connect_channel(sock, key, seconds).send(pickle.dumps("hello"))

    thread = threading.Thread(target=peer)
    thread.start()
    try:
        accept_peers(
            listener,
            key,
            lambda hello, channel: taken.append(hello) is None and False,
            lambda: bool(taken),
            time.monotonic() + seconds,
            lambda: None,
            lambda: disco.DiscoTimeout("the peer's hello", seconds, [0]),
        )
    finally:
        if not taken:
            listener.close()  # the peer waiting in its queue learns at once
        thread.join()
    return taken


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
