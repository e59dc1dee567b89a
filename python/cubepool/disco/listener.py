"""The controller's listener: every connection's handshake at once, each with a deadline.

:func:`accept_peers` takes connections off a listening socket until the caller has what
it waits for. Each connection goes through the handshake of :mod:`cubepool.disco.wire`
and then sends one authenticated hello frame; all pending connections advance together
(non-blocking sockets and one ``select``), and each has :data:`HANDSHAKE_TIMEOUT` seconds
from its accept to finish. So a connection that stays idle, trickles bytes or sends
garbage costs the others nothing: it is dropped at its first wrong byte or at its
deadline, whichever comes first. Nothing a connection sends is unpickled before its
hello frame's tag checks.
"""

from __future__ import annotations

import pickle
import selectors
import socket
import time
from collections.abc import Callable
from typing import Any

from cubepool.disco.errors import FrameRejected
from cubepool.disco.wire import (
    CLIENT_HELLO_SIZE,
    Channel,
    Handshake,
    Opener,
)

#: Seconds a connection has, from its accept, to prove the key and say hello (workers
#: and nodes do it in milliseconds; an idle or slow peer is dropped after this).
HANDSHAKE_TIMEOUT = 5.0
#: The largest hello frame accepted (hellos are a few dozen bytes).
MAX_HELLO = 1 << 12
#: Connections handshaking at once; beyond it, the oldest is dropped for the newest.
MAX_PENDING = 512


class _Pending:
    """One connection in its handshake.

    Invariant: ``opener`` is None until the client's answer checked; ``answer`` holds the
    bytes of that answer read so far.
    """

    def __init__(self, sock: socket.socket, handshake: Handshake) -> None:
        self.sock = sock
        self.deadline = time.monotonic() + HANDSHAKE_TIMEOUT
        hello, self.server_nonce = handshake.server_hello()
        self.answer = bytearray()
        self.opener: Opener | None = None
        self.keys: tuple[bytes, bytes] | None = None
        sock.setblocking(False)
        sock.send(hello)  # 40 bytes into a fresh socket's buffer: never short

    def step(self, handshake: Handshake) -> Any:
        """Read what arrived; the peer's hello once it is in (else None). Raises
        ``FrameRejected`` or ``OSError`` when the connection must be dropped."""
        data = self.sock.recv(1 << 12)
        if not data:
            raise FrameRejected("closed during the handshake")
        if self.opener is None:
            need = CLIENT_HELLO_SIZE - len(self.answer)
            self.answer += data[:need]
            data = data[need:]
            if len(self.answer) < CLIENT_HELLO_SIZE:
                return None
            proof, client_nonce = handshake.check_client(bytes(self.answer), self.server_nonce)
            self.sock.send(proof)  # 32 bytes: fits the buffer
            self.keys = handshake.channel_keys(self.server_nonce, client_nonce)
            self.opener = Opener(self.keys[0])
        self.opener.feed(data)
        if self.opener.buffered > MAX_HELLO:
            raise FrameRejected("hello frame too large")
        payload = self.opener.next_payload()
        if payload is None:
            return None
        return pickle.loads(payload)  # authenticated: sent by a holder of the key

    def channel(self) -> Channel:
        """The connection as a channel (blocking again), once its hello is in."""
        assert self.keys is not None and self.opener is not None
        self.sock.setblocking(True)
        up, down = self.keys
        channel = Channel(self.sock, send_key=down, recv_key=up)
        channel._opener = self.opener  # frames after the hello may be buffered already
        return channel


def accept_peers(
    listener: socket.socket,
    key: bytes,
    take: Callable[[Any, Channel], bool],
    done: Callable[[], bool],
    deadline: float,
    check: Callable[[], None],
    on_timeout: Callable[[], BaseException],
) -> None:
    """Accept and handshake connections on ``listener`` until ``done()``.

    ``take(hello, channel)`` is called with each authenticated peer's hello and returns
    whether it keeps the channel (False closes it: a duplicate, a hello of the wrong
    kind). ``check()`` runs about every 0.1 s and may raise (a launcher that exited);
    past ``deadline`` (a ``time.monotonic()`` value) ``on_timeout()``'s exception is
    raised. Connections still handshaking at the end are closed.
    """
    handshake = Handshake(key)
    selector = selectors.DefaultSelector()
    listener.setblocking(False)
    selector.register(listener, selectors.EVENT_READ, None)
    pending: dict[int, _Pending] = {}

    def drop(peer: _Pending) -> None:
        pending.pop(peer.sock.fileno(), None)
        selector.unregister(peer.sock)
        peer.sock.close()

    try:
        while not done():
            check()
            now = time.monotonic()
            if now >= deadline:
                raise on_timeout()
            for peer in [p for p in pending.values() if p.deadline <= now]:
                drop(peer)
            wake = min([deadline, now + 0.1, *(p.deadline for p in pending.values())])
            for event, _ in selector.select(max(0.0, wake - now)):
                if event.data is None:
                    try:
                        sock, _ = listener.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    if len(pending) >= MAX_PENDING:
                        drop(min(pending.values(), key=lambda p: p.deadline))
                    try:
                        peer = _Pending(sock, handshake)
                    except OSError:
                        sock.close()
                        continue
                    pending[sock.fileno()] = peer
                    selector.register(sock, selectors.EVENT_READ, peer)
                    continue
                peer = event.data
                try:
                    hello = peer.step(handshake)
                except (BlockingIOError, InterruptedError):
                    continue
                except (FrameRejected, OSError, pickle.UnpicklingError, EOFError):
                    drop(peer)
                    continue
                except Exception:  # an authenticated peer sent a hello we cannot load
                    drop(peer)
                    continue
                if hello is None:
                    continue
                pending.pop(peer.sock.fileno(), None)
                selector.unregister(peer.sock)
                channel = peer.channel()
                if not take(hello, channel):
                    channel.close()
                if done():
                    break
    finally:
        for peer in list(pending.values()):
            drop(peer)
        selector.close()
        listener.setblocking(True)
