"""``python -m cubepool.disco.remote HOST PORT NUM_WORKERS``: one remote node of a
``SocketSession`` (TVM's ``python -m tvm.exec.disco_remote_socket_session``).

The node connects to the controller at ``HOST:PORT`` (retrying until
``--connect-timeout`` while the controller is not listening yet or drops the handshake),
proves the session key (``--key-file``, a file only its owner may read, or
``CUBEPOOL_DISCO_AUTHKEY`` in hex, or with neither and a loopback ``HOST`` the key its
session left for its user's nodes: :mod:`cubepool.disco.keys`), offers ``NUM_WORKERS``
workers and is told its node index. It then starts its workers with its own ``mpiexec``
(they connect to the controller themselves, reading the key from a private file of the
node's, never from ``mpiexec``'s environment: :mod:`cubepool.disco.keys`) and stays
until the controller closes the node's channel (the session ended: the workers get
``SHUTDOWN_GRACE`` seconds to finish, then their process group is killed) or its
workers' ``mpiexec`` ends (a failure is reported to the controller first). Exit status:
0 after a session that ended normally, 1 when the controller refused the node or the
workers failed, 2 for a missing or bad key.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import socket
import sys
import time

from cubepool.disco.errors import DiscoError, FrameRejected, MPIUnavailable
from cubepool.disco.keys import (
    AUTHKEY_ENV,
    NoSessionKey,
    PrivateKeyFile,
    loopback_address,
    read_key_file,
    read_loopback_key,
)
from cubepool.disco.process import (
    SHUTDOWN_GRACE,
    find_mpiexec,
    start_mpiexec,
    stop_process_group,
    worker_command,
)
from cubepool.disco.protocol import NodeHello, NodeWelcome, decode_message, encode_message
from cubepool.disco.segments import MPISegments
from cubepool.disco.wire import (
    Channel,
    KeyRefused,
    connect_retrying,
    keep_alive,
    parse_key,
    set_socket_timeout,
)
from cubepool.disco.worker import HANDSHAKE_DEADLINE

#: The largest frame the controller sends a node (its welcome, a few hundred bytes).
NODE_FRAME_LIMIT = 1 << 16


def _connect(host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection to the controller, retried until ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=HANDSHAKE_DEADLINE)
        except OSError as exc:
            if time.monotonic() >= deadline:
                why = ""
                if isinstance(exc, ConnectionRefusedError):
                    # A session stops listening once all its nodes are in.
                    why = (
                        " (nothing listens there: no session was started on that port, "
                        "or its session already has all its nodes)"
                    )
                raise DiscoError(
                    f"cannot reach the controller at {host}:{port} within {timeout:.3g} s: "
                    f"{exc}{why}"
                ) from None
            time.sleep(0.2)
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # The node then idles on this connection until the session ends: a controller
        # host gone without closing is noticed by keepalive (the node stops its
        # workers), where the node waited for ever.
        keep_alive(sock)
        return sock


def _read_key(key_file: str | None) -> bytes | None:
    """The key of ``--key-file`` or ``CUBEPOOL_DISCO_AUTHKEY``; None for neither."""
    if key_file is not None:
        return read_key_file(key_file)
    text = os.environ.get(AUTHKEY_ENV)
    return parse_key(text) if text else None


def _join(args: argparse.Namespace, key: bytes | None) -> tuple[Channel, bytes]:
    """This node's channel to the controller, and the key it proved. With no key given,
    the loopback session's, read again after a refusal until ``--connect-timeout``
    passes: a node started before its session may have read a key a session that died
    on the same port left."""
    end = time.monotonic() + args.connect_timeout
    while True:
        proven = key or read_loopback_key(args.port, max(0.0, end - time.monotonic()))
        try:
            # A new connection when the controller's listener dropped the handshake (a
            # flood of connections filled its table), up to --connect-timeout. Only the
            # welcome comes this way: a small frame.
            channel = connect_retrying(
                lambda: _connect(args.host, args.port, max(0.0, end - time.monotonic())),
                proven,
                HANDSHAKE_DEADLINE,
                window=max(0.0, end - time.monotonic()),
                max_frame=NODE_FRAME_LIMIT,
            )
            return channel, proven
        except KeyRefused:
            if key is not None or time.monotonic() >= end:
                raise
            time.sleep(0.2)


def _serve(channel: Channel, welcome: NodeWelcome, key: bytes, args: argparse.Namespace) -> int:
    """Start this node's workers and stay until the session or the workers end."""
    command = worker_command(
        find_mpiexec(args.mpiexec),
        None,
        [],
        args.num_workers,
        args.python,
        welcome.connect,
        welcome.num_groups,
        welcome.node,
        welcome.num_nodes,
    )
    key_file = PrivateKeyFile(key)
    # The workers' MPI shared-memory files, which each records after MPI_Init and the
    # node removes at the end: a worker killed takes the others down before they
    # finalize (cubepool.disco.segments).
    segments = MPISegments()
    try:
        process = start_mpiexec(command, key_file.path, extra_env=segments.environment())
    except BaseException:
        key_file.remove()
        segments.remove()
        raise
    segments.watch(process)
    status = 0
    collected = False  # every worker's record read and their folder gone
    try:
        while True:
            if not collected:
                collected = segments.collect(args.num_workers)
            ready, _, _ = select.select([channel.fd], [], [], 0.2)
            if ready:
                # The controller says nothing more after its welcome: any frame, or any
                # byte that cannot be one, ends the node as the channel's end does (and
                # nothing is held: a frame is taken out of the buffer as soon as whole).
                try:
                    channel.read_some()
                    if channel.poll_payload() is not None:
                        break
                except (EOFError, OSError, FrameRejected):
                    break
            code = process.poll()
            if code is not None:
                if code != 0:
                    status = 1
                    with contextlib.suppress(OSError):
                        channel.send(encode_message(f"its mpiexec exited with status {code}"))
                break
    finally:
        segments.note()
        stop_process_group(process, SHUTDOWN_GRACE)
        key_file.remove()
        segments.remove()
    return status


def _welcome(channel: Channel, deadline: float = HANDSHAKE_DEADLINE) -> bytes:
    """The controller's answer to this node's hello, within ``deadline`` seconds
    (:data:`HANDSHAKE_DEADLINE`, as the handshake's). The controller answers a node's
    hello as soon as it reads it, so one that proved the key and then says nothing
    (stalled, or its host gone without closing the connection) is a
    :class:`DiscoError`, not a node waiting for ever. The channel has no read deadline
    again afterwards: the node then waits on the controller's commands for as long as
    the session lives."""
    set_socket_timeout(channel.sock, socket.SO_RCVTIMEO, deadline)
    try:
        payload = channel.recv()
    except BlockingIOError:
        raise DiscoError(
            f"the controller proved the session key but sent no welcome within "
            f"{deadline:g} s of this node's hello"
        ) from None
    set_socket_timeout(channel.sock, socket.SO_RCVTIMEO, 0)
    return payload


def main(argv: list[str] | None = None) -> int:
    """Run one remote node (see the module's docs); the exit status."""
    parser = argparse.ArgumentParser(prog="python -m cubepool.disco.remote")
    parser.add_argument("host", help="the controller's host")
    parser.add_argument("port", type=int, help="the controller's port")
    parser.add_argument("num_workers", type=int, help="workers on this node")
    parser.add_argument(
        "--key-file",
        help=f"a file holding the hex key, mode 0600 or 0400 (else {AUTHKEY_ENV})",
    )
    parser.add_argument(
        "--connect-timeout",
        type=float,
        default=60.0,
        help="seconds to keep trying to reach the controller (default 60)",
    )
    parser.add_argument("--mpiexec", help="the mpiexec to start the workers with")
    parser.add_argument("--python", default=sys.executable, help="the workers' interpreter")
    args = parser.parse_args(argv)
    if args.num_workers < 1:
        parser.error(f"NUM_WORKERS must be at least 1, got {args.num_workers}")
    try:
        key = _read_key(args.key_file)
        if key is None:
            # The address the check found, connected to as the session listens (IPv4):
            # a name resolved again, or to ::1 first, might reach another listener.
            address = loopback_address(args.host)
            if address is None:
                raise NoSessionKey(
                    f"no session key: set {AUTHKEY_ENV} (hex) or pass --key-file (only a "
                    f"session on a loopback host leaves its nodes a key; {args.host!r} is "
                    "not one)"
                )
            args.host = address
    except (FrameRejected, OSError) as exc:
        print(f"cubepool.disco.remote: {exc}", file=sys.stderr)
        return 2
    try:
        try:
            channel, key = _join(args, key)
        except NoSessionKey as exc:
            print(f"cubepool.disco.remote: {exc}", file=sys.stderr)
            return 2
        channel.send(encode_message(NodeHello(args.num_workers, os.getpid(), socket.gethostname())))
        answer = decode_message(_welcome(channel))  # authenticated: the controller's
        if not isinstance(answer, NodeWelcome):
            print(f"cubepool.disco.remote: the controller {answer}", file=sys.stderr)
            return 1
        return _serve(channel, answer, key, args)
    except (DiscoError, MPIUnavailable, OSError, EOFError) as exc:
        print(f"cubepool.disco.remote: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
