"""The controller's listener: every connection's handshake at once, each with a deadline.

:func:`accept_peers` takes connections off a listening socket until the caller has what
it waits for. Each connection goes through the handshake of :mod:`cubepool.disco.wire`
and then sends one authenticated hello frame; all pending connections advance together
(non-blocking sockets and one ``select``), and each has :data:`HANDSHAKE_TIMEOUT` seconds
from its accept to finish. So a connection that stays idle, trickles bytes or sends
garbage costs the others nothing: it is dropped at its first wrong byte or at its
deadline, whichever comes first. Nothing a connection sends is unpickled before its
hello frame's tag checks, and nothing it sends before its key proof checks is kept
beyond the proof's 80 bytes.

Descriptors: at most :func:`pending_limit` connections handshake at once (a quarter of
the files the process may open), so a crowd of idle connections cannot take the
descriptors the session's channels need; when ``accept`` still finds none free (or no
buffers), the listener stops accepting for :data:`ACCEPT_PAUSE` seconds, or until a
pending connection is dropped, and the connections wait in the kernel's queue meanwhile.

A full table: a newcomer takes the place of the oldest connection that has not yet
proved the key, from the source address that holds the most such connections. So a
connection that proved the key is never dropped for a newcomer (were every pending one
such, accepting pauses instead), and a flood from fewer addresses than the table has
places, however fast, drops its own connections before those of the session's workers
and nodes. A flood from many addresses (an IPv6 prefix, many hosts), or from the very
address of a worker, can still drop a worker's or a node's handshake before its answer
comes: it then tries again (:func:`cubepool.disco.wire.connect_retrying`), within a
window (60 s for a worker, ``--connect-timeout`` for a node). Among the connections of
a session, answers that have arrived are read before the next accept.
"""

from __future__ import annotations

import contextlib
import errno
import pickle
import selectors
import socket
import time
from collections.abc import Callable
from typing import Any

from cubepool.disco.errors import DiscoError, FrameRejected
from cubepool.disco.wire import (
    CLIENT_HELLO_SIZE,
    MAGIC,
    REFUSED,
    Channel,
    Handshake,
    Opener,
)

#: Seconds a connection has, from its accept, to prove the key and say hello (workers
#: and nodes do it in milliseconds; an idle or slow peer is dropped after this).
HANDSHAKE_TIMEOUT = 5.0
#: The largest hello frame accepted (hellos are a few dozen bytes).
MAX_HELLO = 1 << 12
#: Connections handshaking at once, at most (:func:`pending_limit`); beyond the limit,
#: one that has not proved the key is dropped for the newest (see the module).
MAX_PENDING = 512
#: ``accept`` errors that say the process or the system has no descriptor or buffer to
#: spare: the listener pauses (:data:`ACCEPT_PAUSE`) instead of failing.
_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: ``accept`` errors that say the listening socket itself is unusable (a typed
#: ``DiscoError``); any other error lost one connection, and the listener goes on.
_BROKEN = frozenset({errno.EBADF, errno.EINVAL, errno.ENOTSOCK, errno.EFAULT})
#: Seconds the listener stops accepting when ``accept`` found nothing to spare (less if
#: a pending connection is dropped first).
ACCEPT_PAUSE = 0.1


def pending_limit() -> int:
    """How many connections may handshake at once: a quarter of the files this process
    may open (``RLIMIT_NOFILE``), between 16 and :data:`MAX_PENDING`.

    Each pending connection holds a descriptor for up to :data:`HANDSHAKE_TIMEOUT`
    seconds, so idle connections could otherwise take the descriptors the session needs
    for what it keeps (a channel per worker and node, mpiexec's pipes, the user's files):
    at Linux's usual limit of 1024 this allows 256 (workers handshake in milliseconds, so
    even a large session's start has far fewer at once), at macOS's 256 it allows 64.
    """
    try:
        import resource  # POSIX only
    except ImportError:  # pragma: no cover - Windows
        return MAX_PENDING
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return MAX_PENDING
    return max(16, min(MAX_PENDING, soft // 4))


class _Pending:
    """One connection in its handshake.

    Invariant: ``opener`` is None until the client's answer checked; ``answer`` holds the
    bytes of that answer read so far; ``dropped`` once its socket is closed (an event
    ``select`` reported for it before that is stale). ``source`` is the peer's address
    without its port ("" for a Unix socket's peer), which the table's eviction groups by.
    """

    def __init__(self, sock: socket.socket, source: str, handshake: Handshake) -> None:
        self.sock = sock
        self.source = source
        self.deadline = time.monotonic() + HANDSHAKE_TIMEOUT
        hello, self.server_nonce = handshake.server_hello()
        self.answer = bytearray()
        self.opener: Opener | None = None
        self.keys: tuple[bytes, bytes] | None = None
        self.dropped = False
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
            start = len(self.answer)
            self.answer += data[:need]
            data = data[need:]
            if start < len(MAGIC) and not MAGIC.startswith(self.answer[: len(MAGIC)]):
                raise FrameRejected("the peer is not a Disco worker or node (bad handshake)")
            if len(self.answer) < CLIENT_HELLO_SIZE:
                return None
            try:
                proof, client_nonce = handshake.check_client(bytes(self.answer), self.server_nonce)
            except FrameRejected:
                if self.answer.startswith(MAGIC):  # a peer of this protocol, another key
                    with contextlib.suppress(OSError):
                        self.sock.send(REFUSED)  # (not to try again: wire.connect_retrying)
                raise
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
    raised. Connections still handshaking at the end are closed. Out of descriptors,
    accepting pauses (see the module); ``DiscoError`` if the listener itself is unusable.
    """
    handshake = Handshake(key)
    selector = selectors.DefaultSelector()
    listener.setblocking(False)
    selector.register(listener, selectors.EVENT_READ, None)
    pending: dict[int, _Pending] = {}
    # The pending connections that have not proved the key, by source address, each
    # group in the order of its accepts (the candidates for eviction; no group empty).
    unproven: dict[str, dict[int, _Pending]] = {}
    limit = pending_limit()
    paused_until: float | None = None  # while accepting is paused

    def pause() -> None:
        nonlocal paused_until
        if paused_until is None:
            selector.unregister(listener)  # the connections wait in the kernel's queue
        paused_until = time.monotonic() + ACCEPT_PAUSE

    def resume() -> None:
        nonlocal paused_until
        if paused_until is not None:
            paused_until = None
            selector.register(listener, selectors.EVENT_READ, None)

    def proven(peer: _Pending) -> None:
        group = unproven.get(peer.source)
        if group is not None and group.pop(peer.sock.fileno(), None) is not None and not group:
            del unproven[peer.source]

    def drop(peer: _Pending) -> None:
        # Once only: a peer dropped for a newer one (a full table) may still have an
        # event in the batch being handled, and a closed socket cannot be unregistered.
        if peer.dropped:
            return
        peer.dropped = True
        proven(peer)  # (out of the candidates, proved or not)
        pending.pop(peer.sock.fileno(), None)
        selector.unregister(peer.sock)
        peer.sock.close()
        resume()  # a descriptor is free again

    def accept() -> None:
        if len(pending) >= limit and not unproven:
            pause()  # every pending connection proved the key: none is dropped for a newcomer
            return
        try:
            sock, address = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if exc.errno in _EXHAUSTED:
                pause()
            elif exc.errno in _BROKEN:
                raise DiscoError(f"the listener cannot accept connections: {exc}") from exc
            return  # (otherwise that one connection was lost before it was accepted)
        if len(pending) >= limit:
            crowd = max(unproven.values(), key=len)  # the source holding the most
            drop(next(iter(crowd.values())))  # its oldest
        source = address[0] if isinstance(address, tuple) else ""
        try:
            peer = _Pending(sock, source, handshake)
        except OSError:
            sock.close()
            return
        pending[sock.fileno()] = peer
        unproven.setdefault(source, {})[sock.fileno()] = peer
        selector.register(sock, selectors.EVENT_READ, peer)

    try:
        while not done():
            check()
            now = time.monotonic()
            if now >= deadline:
                raise on_timeout()
            if paused_until is not None and now >= paused_until:
                resume()
            for peer in [p for p in pending.values() if p.deadline <= now]:
                drop(peer)
            wake = min([deadline, now + 0.1, *(p.deadline for p in pending.values())])
            events = selector.select(max(0.0, wake - now))
            # The pending connections' bytes first, the listener's accept last: an answer
            # that has come is checked before a newcomer could take its connection's place.
            events.sort(key=lambda event: event[0].data is None)
            for event, _ in events:
                if event.data is None:
                    accept()
                    continue
                peer = event.data
                if peer.dropped:
                    continue  # dropped earlier in this batch, for a newer connection
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
                if peer.opener is not None:
                    proven(peer)  # proved the key: no newcomer takes its place
                if hello is None:
                    continue
                pending.pop(peer.sock.fileno(), None)
                selector.unregister(peer.sock)
                resume()  # its place in the table is free
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
