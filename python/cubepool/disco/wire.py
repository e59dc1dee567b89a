"""The authenticated wire of a Disco channel: a key-proving handshake, then sealed frames.

Both ends of a channel know the session key ``K`` (32 random bytes by default; the
controller makes it and hands it to the workers it starts through the environment, or
the user gives it to every node of a ``SocketSession``). Nothing that arrives from the
network is unpickled before it is authenticated.

Handshake (fixed-size messages, no pickle, no length read from the peer):

1. the accepting side (the controller) sends ``MAGIC || n_s`` (a 32-byte nonce);
2. the connecting side sends ``MAGIC || n_c || HMAC(K, "client" || n_s || n_c)``;
3. the accepting side checks that tag and answers ``HMAC(K, "server" || n_c || n_s)``,
   which the connecting side checks; a tag that does not check is answered with
   :data:`REFUSED` (32 zero bytes) before the connection is closed, so that a peer with
   another key is told so, while one whose connection closes before any answer (a
   listener that dropped it for a newcomer) may try again.

Each side has then proved that it knows ``K`` without sending it, and both derive one
key per direction, ``k_up = HMAC(K, "up" || n_s || n_c)`` (connecting side to accepting
side) and ``k_down = HMAC(K, "down" || n_s || n_c)``. Fresh nonces make the keys new for
every connection, so a frame recorded on one channel (or one session) is refused on
any other.

Frames: a 4-byte big-endian length (or -1 and an 8-byte one, ``multiprocessing``'s
framing), a 32-byte tag, then the payload, where the tag is a MAC of ``seq || payload``
under the direction's key (keyed BLAKE2s for payloads up to 64 KiB, HMAC-SHA256 for
larger ones: :class:`FrameMac`) and ``seq`` is the frame's number on that channel and
in that direction (0, 1, 2, ...: never sent, counted by both ends). The
receiver checks the tag before it looks at the payload; a frame that is changed,
dropped, replayed, reordered or moved from another channel fails the check, and the
channel is closed (:class:`FrameRejected`): a stream that lost one frame cannot be
trusted to resynchronise. The length is read before the tag can be checked, so it is
trusted only to say where the frame ends: one above what a receiver could hold
(:data:`FRAME_LIMIT`) is refused at once, reads are never sized by it
(:data:`MAX_READ`), and a frame too large for the receiver's memory is refused too
(:meth:`Opener.out_of_memory`), not left to raise ``MemoryError``.

What the key does not give: confidentiality (payloads travel in clear: arrays, function
names and arguments can be read by anyone on the path) and availability (anyone on the
path can drop or delay bytes, which ends the session with a typed error).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import os
import secrets
import socket
import struct
import time
from collections.abc import Callable

from cubepool._cubepool import SmallFrameMac
from cubepool.disco.errors import FrameRejected

#: The first bytes of both handshake messages: the protocol and its version (2: frames
#: of up to 64 KiB tagged with keyed BLAKE2s; 3: a command's number after its pickle,
#: :func:`~cubepool.disco.protocol.encode_command`). A peer of another version is
#: refused at the handshake, not at its first frame.
MAGIC = b"cpdisco3"
NONCE_SIZE = 32
TAG_SIZE = hashlib.sha256().digest_size
#: Bytes the accepting side sends first, then the connecting side's answer, then the
#: accepting side's proof.
SERVER_HELLO_SIZE = len(MAGIC) + NONCE_SIZE
CLIENT_HELLO_SIZE = len(MAGIC) + NONCE_SIZE + TAG_SIZE
SERVER_PROOF_SIZE = TAG_SIZE
#: What the accepting side sends instead of its proof to a peer whose tag does not check
#: (not authenticated: it can only end a handshake that anyone on the path could end).
REFUSED = bytes(SERVER_PROOF_SIZE)

_LENGTH = struct.Struct("!i")
_LONG_LENGTH = struct.Struct("!Q")
_SEQ = struct.Struct("!Q")
#: The largest payload framed with a 4-byte length.
_SHORT_FRAME = 0x7FFFFFFF
#: The largest payload the framing carries (1 TiB): a length beyond it is not a frame.
MAX_FRAME = 1 << 40
#: Payloads up to this size are tagged with keyed BLAKE2s in one call on ``seq ||
#: payload``; larger ones with HMAC-SHA256, without copying (see ``FrameMac``).
_ONE_SHOT = 1 << 16
#: Bytes of the number :meth:`Sealer.send_numbered` puts after a body (the command
#: number's, ``protocol.NUMBER_SIZE``; ``SmallFrameMac.send`` writes 8).
NUMBER_BYTES = 8
#: ``SmallFrameMac.dispatch``'s status for a frame whose tag does not match.
_TAG_MISMATCH = 3
#: Bytes before a small frame's payload: its 4-byte length and its tag.
_SMALL_HEADER = _LENGTH.size + TAG_SIZE


def _physical_memory() -> int | None:
    """This machine's memory in bytes, or None where the system does not say."""
    try:
        pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None
    return pages * page if pages > 0 and page > 0 else None


#: The largest payload a receiver accepts by default: :data:`MAX_FRAME`, or this
#: machine's memory where that is less. A receiver holds a frame whole before its tag
#: can be checked, so a longer one could never be taken here: its length is refused at
#: the header (``FrameRejected``), before a byte of it is buffered. Directions that
#: carry less (a hello, a node's channel) pass their own bound (``max_frame``).
FRAME_LIMIT = min(MAX_FRAME, _physical_memory() or MAX_FRAME)


def new_key() -> bytes:
    """A fresh random session key."""
    return secrets.token_bytes(32)


def parse_key(text: str | bytes | bytearray | memoryview) -> bytes:
    """A session key from its hex text (as ``CUBEPOOL_DISCO_AUTHKEY`` holds it) or its
    bytes (``bytes``, ``bytearray`` or ``memoryview``: copied, so a later change to the
    caller's buffer does not change the key).

    Raises ``FrameRejected`` for anything else, for text that is not hex, or for a key
    shorter than 16 bytes.
    """
    if isinstance(text, bytes | bytearray | memoryview):
        key = bytes(text)
    elif isinstance(text, str):
        try:
            key = bytes.fromhex(text.strip())
        except ValueError:
            raise FrameRejected(
                "the Disco key must be hex text (e.g. secrets.token_hex(32))"
            ) from None
    else:
        raise FrameRejected(f"the Disco key must be bytes or hex text, not {type(text).__name__}")
    if len(key) < 16:
        raise FrameRejected(f"the Disco key is {len(key)} bytes; it needs at least 16")
    return key


def _tag(key: bytes, *parts: bytes) -> bytes:
    return hmac.digest(key, b"".join(parts), "sha256")


class Handshake:
    """The handshake's computations, for one side of one connection (see the module)."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def server_hello(self) -> tuple[bytes, bytes]:
        """``(message, nonce)``: what the accepting side sends first."""
        nonce = os.urandom(NONCE_SIZE)
        return MAGIC + nonce, nonce

    def client_answer(self, server_hello: bytes) -> tuple[bytes, bytes, bytes]:
        """``(answer, server nonce, client nonce)`` to a server hello; ``FrameRejected`` if
        it is not one."""
        if len(server_hello) != SERVER_HELLO_SIZE or not server_hello.startswith(MAGIC):
            raise FrameRejected("the peer is not a Disco controller (bad handshake)")
        server_nonce = server_hello[len(MAGIC) :]
        client_nonce = os.urandom(NONCE_SIZE)
        proof = _tag(self.key, b"client", server_nonce, client_nonce)
        return MAGIC + client_nonce + proof, server_nonce, client_nonce

    def check_client(self, answer: bytes, server_nonce: bytes) -> tuple[bytes, bytes]:
        """``(server proof, client nonce)`` for a client's answer; ``FrameRejected`` if the
        client does not know the key."""
        if len(answer) != CLIENT_HELLO_SIZE or not answer.startswith(MAGIC):
            raise FrameRejected("the peer is not a Disco worker or node (bad handshake)")
        client_nonce = answer[len(MAGIC) : len(MAGIC) + NONCE_SIZE]
        proof = answer[len(MAGIC) + NONCE_SIZE :]
        expected = _tag(self.key, b"client", server_nonce, client_nonce)
        if not hmac.compare_digest(proof, expected):
            raise FrameRejected("the peer does not know the session key")
        return _tag(self.key, b"server", client_nonce, server_nonce), client_nonce

    def check_server(self, proof: bytes, server_nonce: bytes, client_nonce: bytes) -> None:
        """``FrameRejected`` unless the server's proof shows that it knows the key."""
        if proof == REFUSED:
            raise KeyRefused(
                "the controller refused the handshake: its session key is not this one"
            )
        expected = _tag(self.key, b"server", client_nonce, server_nonce)
        if len(proof) != SERVER_PROOF_SIZE or not hmac.compare_digest(proof, expected):
            raise FrameRejected("the controller does not know the session key")

    def channel_keys(self, server_nonce: bytes, client_nonce: bytes) -> tuple[bytes, bytes]:
        """``(k_up, k_down)``: the keys of frames from the connecting side and to it."""
        return (
            _tag(self.key, b"up", server_nonce, client_nonce),
            _tag(self.key, b"down", server_nonce, client_nonce),
        )


class FrameMac:
    """The tags of the frames of one direction, under that direction's key ``k``.

    A payload of up to 64 KiB (every command, answer and small value) is tagged with
    keyed BLAKE2s (RFC 7693's MAC mode: one call, a 32-byte tag) under
    ``k_small = HMAC-SHA256(k, "blake2s frames")``; a larger one (a copy's bytes) with
    HMAC-SHA256 under ``k``, whose hashing runs faster per byte here (SHA extensions).
    Both are MACs of ``seq || payload`` (``seq`` as 8 big-endian bytes). The choice
    follows the frame's length, which the receiver reads before checking: a changed
    length changes which bytes and which MAC are checked, and fails the check like any
    other change. The header's form is not covered: a small frame sent with the long
    header (the same length, written in 8 bytes) is read as the same frame, the same
    payload under the same number, so it changes nothing. The small frames' BLAKE2s runs
    in the extension
    (``cubepool._cubepool.SmallFrameMac``, checked against ``hashlib.blake2s``): opening
    a command's frame is one call there (RustCrypto's ``blake2`` crate; README's Disco
    section has the instruction counts), against 13,700 instructions for the same with
    ``hashlib`` in Python (8,000 for a tag from a copied keyed state, 15,700 for
    HMAC-SHA256 from its two pad states copied per frame).
    """

    __slots__ = ("_inner", "_outer", "small")

    def __init__(self, key: bytes) -> None:
        #: Keyed BLAKE2s of the small frames, in the extension (the same tags as
        #: ``hashlib.blake2s``; one call opens a whole frame: ``Opener.next_payload``).
        self.small = SmallFrameMac(hmac.digest(key, b"blake2s frames", "sha256"), _ONE_SHOT)
        block = hashlib.sha256().block_size
        if len(key) > block:
            key = hashlib.sha256(key).digest()
        key = key.ljust(block, b"\0")
        self._inner = hashlib.sha256(bytes(byte ^ 0x36 for byte in key))
        self._outer = hashlib.sha256(bytes(byte ^ 0x5C for byte in key))

    def tag(self, seq: int, payload: bytes) -> bytes:
        """The tag of frame ``seq`` carrying ``payload`` (see the class)."""
        if len(payload) <= _ONE_SHOT:
            tag: bytes = self.small.tag(seq, payload)
            return tag
        inner = self._inner.copy()
        inner.update(_SEQ.pack(seq))
        inner.update(payload)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()


class Sealer:
    """The sending end of one direction of a channel: frames with their tags.

    Invariant: ``seq`` is the number of frames sealed so far, the number the next one is
    tagged with.
    """

    __slots__ = ("_mac", "key", "seq")

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.seq = 0
        self._mac = FrameMac(key)

    def seal(self, payload: bytes) -> bytes:
        """The frame that carries ``payload`` (length, tag, payload); a small one made in
        one call into the extension (``SmallFrameMac.seal``)."""
        seq = self.seq
        self.seq = seq + 1
        if len(payload) <= _ONE_SHOT:
            frame: bytes = self._mac.small.seal(seq, payload)
            return frame
        tag = self._mac.tag(seq, payload)
        size = len(payload) + TAG_SIZE
        if size > _SHORT_FRAME:
            return _LENGTH.pack(-1) + _LONG_LENGTH.pack(size) + tag + payload
        return _LENGTH.pack(size) + tag + payload

    def send_numbered(self, fd: int, body: bytes, number: int) -> None:
        """Seal the frame carrying ``body`` and then ``number`` as :data:`NUMBER_BYTES`
        big-endian bytes (a command's payload: ``protocol.encode_command``) and write it
        to the socket ``fd``: a small one in one call into the extension
        (``SmallFrameMac.send``, which writes with the GIL released), with no payload
        object built here. Errors as :func:`write_all`'s."""
        if len(body) + NUMBER_BYTES > _ONE_SHOT:
            write_all(fd, self.seal(body + number.to_bytes(NUMBER_BYTES, "big")))
            return
        seq = self.seq
        try:
            self._mac.small.send(fd, seq, body, number)
        except (TypeError, ValueError, OverflowError):
            raise  # refused before a byte was written: ``seq`` is still the next frame's
        except BaseException:
            self.seq = seq + 1  # perhaps written in part: counted as sent (the channel is done)
            raise
        self.seq = seq + 1


class Opener:
    """The receiving end of one direction of a channel: frames out of a byte stream.

    Bytes are fed as they arrive (``feed``); ``next_payload`` gives the payload of the
    next complete frame once its tag checks, or None while the frame is incomplete. A
    frame's length is read before its tag can be checked, so it is trusted for nothing
    but where the frame ends: a length above ``max_frame`` is refused at the header, and
    the buffer grows only by the bytes fed, never to the length a header claims.

    Invariants: ``_buffer[_start:]`` holds the bytes fed and not yet consumed, the start
    of a frame at ``_start``; ``seq`` is the number of frames opened so far. Once the
    opener has refused the channel for want of memory (:meth:`out_of_memory`), its
    buffer is empty and every later ``feed`` or ``next_payload`` raises that refusal.
    """

    __slots__ = (
        "_buffer",
        "_mac",
        "_open_small",
        "_refusal",
        "_start",
        "key",
        "max_frame",
        "seq",
    )

    def __init__(self, key: bytes, max_frame: int = FRAME_LIMIT) -> None:
        self.key = key
        self.seq = 0
        #: The largest payload accepted; a longer frame is refused at its header.
        self.max_frame = max_frame
        self._mac = FrameMac(key)
        self._open_small = self._mac.small.open
        self._buffer = bytearray()
        self._start = 0
        self._refusal: FrameRejected | None = None

    def feed(self, data: bytes) -> None:
        """Add bytes read from the channel.

        The bytes already consumed are dropped first (``del`` from a bytearray's front
        moves no bytes in CPython), so the buffer holds at most one partial frame and the
        new bytes: a stream whose reads keep ending inside a frame does not grow it.
        Raises the opener's refusal once it has refused the channel (:meth:`out_of_memory`).
        """
        if self._refusal is not None:
            raise self._refusal
        if self._start:
            del self._buffer[: self._start]
            self._start = 0
        self._buffer += data

    @property
    def buffered(self) -> int:
        """Bytes fed and not yet consumed."""
        return len(self._buffer) - self._start

    def missing(self) -> int:
        """At least how many more bytes the next frame needs (1 while its header is cut)."""
        sizes = self._sizes()
        if sizes is None:
            return 1
        header, size = sizes
        return max(1, self._start + header + size - len(self._buffer))

    def _sizes(self) -> tuple[int, int] | None:
        buffer, start = self._buffer, self._start
        available = len(buffer) - start
        if available < _LENGTH.size:
            return None
        (size,) = _LENGTH.unpack_from(buffer, start)
        header = _LENGTH.size
        if size == -1:
            if available < _LENGTH.size + _LONG_LENGTH.size:
                return None
            (size,) = _LONG_LENGTH.unpack_from(buffer, start + _LENGTH.size)
            header += _LONG_LENGTH.size
        if size < TAG_SIZE or size > self.max_frame + TAG_SIZE:
            raise FrameRejected(
                f"frame {self.seq} has an impossible length {size} (a frame here carries "
                f"{TAG_SIZE} to {self.max_frame + TAG_SIZE} bytes)"
            )
        return header, size

    def out_of_memory(self) -> FrameRejected:
        """Refuse the channel because the frame being read does not fit in this process's
        memory (a ``MemoryError`` while it was read or opened): the buffer is dropped, so
        the memory comes back, and the refusal is returned to raise, and raised again by
        every later ``feed`` or ``next_payload`` (the stream cannot be resynchronised).
        """
        try:
            sizes = self._sizes()
        except FrameRejected:
            sizes = None
        what = f"{sizes[1] - TAG_SIZE}-byte payload" if sizes is not None else "payload"
        refusal = FrameRejected(
            f"frame {self.seq}'s {what} does not fit in this process's memory (its length "
            "is not authenticated before the whole frame is in); the channel is closed"
        )
        self._buffer.clear()
        self._start = 0
        self._refusal = refusal

        def refuse(buffer: bytearray, start: int, seq: int) -> bytes | None:
            raise refusal  # next_payload's first call: its usual case checks nothing more

        self._open_small = refuse
        return refusal

    def next_payload(self) -> bytes | None:
        """The next frame's payload, checked; None while it is incomplete.

        Raises ``FrameRejected`` when the frame's tag does not match (the bytes are then
        left unread: the channel is done).

        Every command a worker runs comes through here, so the usual case (a payload of
        up to 64 KiB after a 4-byte length, whole in the buffer) is one call into the
        extension (``SmallFrameMac.open``: the header read, the keyed BLAKE2s tag computed
        and compared in constant time, the payload copied out); the rest (a long header,
        a large frame, a frame not all here yet) is read here.
        """
        buffer, start, seq = self._buffer, self._start, self.seq
        try:
            payload: bytes | None = self._open_small(buffer, start, seq)
        except ValueError:
            raise self._rejected() from None
        if payload is not None:  # a command or an answer, whole in the buffer
            end = start + _SMALL_HEADER + len(payload)
        else:
            sizes = self._sizes()
            if sizes is None:
                return None
            header, size = sizes
            end = start + header + size
            if end > len(buffer):
                return None
            try:
                with memoryview(buffer) as view:  # one copy of a large payload, not two
                    payload = bytes(view[start + header + TAG_SIZE : end])
            except MemoryError:
                raise self.out_of_memory() from None
            if not hmac.compare_digest(
                buffer[start + header : start + header + TAG_SIZE], self._mac.tag(seq, payload)
            ):
                raise self._rejected()
        self.seq = seq + 1
        if end == len(buffer):
            buffer.clear()
            self._start = 0
        else:
            self._start = end
        return payload

    def dispatch(
        self, handlers: dict[bytes, Callable[[], object]], trailer: int
    ) -> tuple[bytes | None, BaseException | None]:
        """Open the whole small frames in the buffer in order and, for each whose payload
        less its last ``trailer`` bytes is a key of ``handlers``, call that handler, all
        in one call into the extension (``SmallFrameMac.dispatch``). Stops at the first
        frame it does not handle: ``(its payload, None)``; at a handler that raised:
        ``(that frame's payload, the exception)``; where no whole small frame is left:
        ``(None, None)`` (:meth:`next_payload` takes it from there). Raises
        ``FrameRejected`` at a frame whose tag does not match (the frames before it are
        consumed, that one is not)."""
        start, seq, status, payload, error = self._mac.small.dispatch(
            self._buffer, self._start, self.seq, handlers, trailer
        )
        self.seq = seq
        if start == len(self._buffer):
            self._buffer.clear()
            self._start = 0
        else:
            self._start = start
        if status == _TAG_MISMATCH:
            raise self._rejected()
        return payload, error

    def _rejected(self) -> FrameRejected:
        return FrameRejected(
            f"frame {self.seq} failed authentication (tag mismatch): it was "
            "forged, changed, replayed or is out of order"
        )


#: Bytes a channel asks its socket for at a time (more when a frame needs more).
READ_CHUNK = 1 << 16
#: The most bytes a channel asks its socket for in one read, however long the frame
#: being read says it is: its length is not authenticated until the whole frame is in,
#: so it sizes no read and no allocation (a large frame comes in reads of up to this).
MAX_READ = 1 << 20


def set_socket_timeout(sock: socket.socket, option: int, seconds: float) -> None:
    """Set a kernel send/receive timeout (``SO_SNDTIMEO``/``SO_RCVTIMEO``), which keeps the
    socket blocking for ``os.read``/``os.write``; 0 means none."""
    whole = int(seconds)
    sock.setsockopt(
        socket.SOL_SOCKET, option, struct.pack("ll", whole, int((seconds - whole) * 1e6))
    )


#: TCP keepalive of a channel that may idle for a whole session (a remote node's to its
#: controller, which says nothing after the welcome): the first probe after this many
#: idle seconds, then one every :data:`KEEPALIVE_INTERVAL` seconds, and the connection
#: is dead after :data:`KEEPALIVE_PROBES` unanswered. A host that vanishes without
#: closing (powered off, cut off) is then noticed within about a minute, where the
#: channel waited for ever; a probe is a few bytes every half minute of silence.
KEEPALIVE_IDLE = 30
KEEPALIVE_INTERVAL = 10
KEEPALIVE_PROBES = 3


def keep_alive(sock: socket.socket) -> None:
    """Turn TCP keepalive on for ``sock`` (see :data:`KEEPALIVE_IDLE`), where the
    platform has the options (Linux has all three; elsewhere the system's defaults)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
    ):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to the socket ``fd`` (``BlockingIOError`` when its send
    timeout passes first)."""
    written = os.write(fd, data)  # the usual case: all of it at once
    if written < len(data):
        view = memoryview(data)[written:]
        while view:
            view = view[os.write(fd, view) :]


class Channel:
    """One end of an authenticated channel over a connected, blocking socket.

    ``send`` seals a payload and writes it; ``recv`` reads until a whole frame is in and
    returns its checked payload. ``pending`` says whether a frame may be waiting in the
    buffer without a read (so a caller that selects on sockets looks here first).

    A close from one thread while another reads (a session shut down while a wait
    receives: sessions serialise sends with close, not waits) never lets that read reach
    a file that reuses the descriptor's number: every read lists itself in ``_readers``
    while it holds the number, and a close made while any is listed shuts the socket
    down (which ends a blocked read at once) and leaves the closing of the socket to the
    last of them. Invariant: once ``_closing`` is set, the socket is closed by the first
    of the close and the reads' ends to find ``_readers`` empty (closing a socket twice
    is a no-op).

    No lock: ``list.append``/``list.pop`` are atomic under the GIL (the extension is built
    for the stable ABI, which free-threaded Pythons do not load), and a read lists itself
    before it reads ``_closing``, while a close sets ``_closing`` before it reads
    ``_readers``, so one of the two always sees the other. (A lock would cost a read two
    ``with`` blocks, about 3,000 instructions each under callgrind on CPython 3.11; the
    list's two calls are lost in the noise of a send and read's 20,000 to 25,000.)
    """

    def __init__(
        self,
        sock: socket.socket,
        send_key: bytes,
        recv_key: bytes,
        max_frame: int = FRAME_LIMIT,
    ) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self._sealer = Sealer(send_key)
        self._opener = Opener(recv_key, max_frame)
        self._readers: list[None] = []
        self._closing = False

    def fileno(self) -> int:
        """The socket's file descriptor (for ``select``)."""
        return self.fd

    def send(self, payload: bytes) -> None:
        """Seal ``payload`` and write the frame (``BlockingIOError`` past the send timeout,
        ``OSError`` when the peer is gone)."""
        write_all(self.fd, self._sealer.seal(payload))

    def seal(self, payload: bytes) -> bytes:
        """The frame for ``payload``, to write with :func:`write_all` (counts as sent)."""
        return self._sealer.seal(payload)

    def send_numbered(self, body: bytes, number: int) -> None:
        """Seal and write the payload ``body`` + ``number`` (:meth:`Sealer.send_numbered`)."""
        self._sealer.send_numbered(self.fd, body, number)

    @property
    def pending(self) -> bool:
        """Whether bytes are buffered (a whole frame may be there)."""
        return self._opener.buffered > 0

    def poll_payload(self) -> bytes | None:
        """The next whole frame's payload from the buffer, without reading; None if none."""
        return self._opener.next_payload()

    def dispatch(
        self, handlers: dict[bytes, Callable[[], object]], trailer: int
    ) -> tuple[bytes | None, BaseException | None]:
        """Run the handlers of the frames already buffered, without reading
        (:meth:`Opener.dispatch`)."""
        return self._opener.dispatch(handlers, trailer)

    def read_some(self) -> None:
        """Read what the socket has (blocks until something comes); ``EOFError`` at its end,
        ``FrameRejected`` for a frame whose length is impossible or that does not fit in
        memory.

        A read asks for what the frame being read still needs, at least
        :data:`READ_CHUNK` and at most :data:`MAX_READ` bytes, so a changed length costs no
        allocation: the buffer grows only by the bytes that arrived.
        """
        opener = self._opener
        readers = self._readers
        readers.append(None)  # before `_closing` is read (see the class)
        try:
            if self._closing:
                raise OSError(errno.EBADF, "the Disco channel is closed")
            chunk = os.read(self.fd, min(max(READ_CHUNK, opener.missing()), MAX_READ))
            if not chunk:
                raise EOFError("the peer closed the channel")
            opener.feed(chunk)
        except MemoryError:
            raise opener.out_of_memory() from None
        finally:
            readers.pop()
            if self._closing and not readers:
                self.sock.close()  # the last read after a close

    def recv(self) -> bytes:
        """The next frame's payload (blocks); ``EOFError`` at the end, ``FrameRejected`` for
        a frame that fails authentication."""
        while True:
            payload = self._opener.next_payload()
            if payload is not None:
                return payload
            self.read_some()

    def close(self) -> None:
        """Close the socket. The channel's descriptor number is forgotten first: a read
        or write after the close fails (``EBADF``) instead of reaching whatever file
        reuses the number. A read in progress on another thread keeps the number until
        it ends: the socket is shut down now (a blocked read sees the end of the channel
        at once) and closed by the last such read (see the class)."""
        self._closing = True
        self.fd = -1
        if not self._readers:
            self.sock.close()
            return
        # A read holds the number: wake it. Should it have ended and closed the socket
        # meanwhile, the socket object's descriptor is gone, and this is EBADF.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        if not self._readers:
            self.sock.close()  # it ended before it saw the close: close it here


class KeyRefused(FrameRejected):
    """The controller answered the handshake with :data:`REFUSED`: it holds another
    session key."""


class HandshakeDropped(FrameRejected):
    """The controller closed (or reset) a connection before it proved the key: its
    listener may have dropped the handshake for a newcomer (a full table,
    :mod:`cubepool.disco.listener`), so a new connection may succeed
    (:func:`connect_retrying`)."""


def _read_exactly(sock: socket.socket, size: int, deadline: float) -> bytes:
    """``size`` bytes from ``sock`` by ``deadline`` (a ``time.monotonic()`` value), or
    ``TimeoutError``: the bound is the whole read's, so a peer trickling a byte at a
    time cannot stretch it (a timeout per ``recv`` would allow ``size`` of them)."""
    data = bytearray()
    while len(data) < size:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise HandshakeDropped("the controller closed the connection during the handshake")
        data += chunk
    return bytes(data)


def connect_channel(
    sock: socket.socket,
    key: bytes,
    timeout: float,
    max_frame: int = FRAME_LIMIT,
    queued: float = 0.0,
) -> Channel:
    """Run the connecting side's handshake on ``sock`` (within ``timeout`` seconds, and
    ``queued`` seconds more for the controller's hello) and return its channel, which
    accepts frames of up to ``max_frame`` bytes of payload; ``FrameRejected`` if the
    controller does not prove the key in time (:class:`HandshakeDropped` if it closed
    or reset the connection first).

    ``queued`` is for the wait before the handshake starts: a connection not yet
    accepted waits in the listener's queue behind the others, which a flood of
    connections makes long, and the controller's hello is its first byte. Once the
    hello is in, the rest has ``timeout`` seconds."""
    deadline = time.monotonic() + timeout + queued
    sock.settimeout(timeout + queued)
    try:
        handshake = Handshake(key)
        answer, server_nonce, client_nonce = handshake.client_answer(
            _read_exactly(sock, SERVER_HELLO_SIZE, deadline)
        )
        deadline = min(deadline, time.monotonic() + timeout)
        sock.settimeout(max(deadline - time.monotonic(), 1e-3))
        sock.sendall(answer)
        handshake.check_server(
            _read_exactly(sock, SERVER_PROOF_SIZE, deadline), server_nonce, client_nonce
        )
    except TimeoutError:
        raise FrameRejected(
            f"the controller did not finish the handshake within {timeout + queued:g} s"
        ) from None
    except OSError as exc:  # (ECONNRESET: closed with the answer unread; EPIPE)
        raise HandshakeDropped(
            f"the controller closed the connection during the handshake ({exc})"
        ) from None
    sock.settimeout(None)
    up, down = handshake.channel_keys(server_nonce, client_nonce)
    return Channel(sock, send_key=up, recv_key=down, max_frame=max_frame)


#: Seconds a worker or node goes on opening new connections while the controller drops
#: its handshakes (:func:`connect_retrying`): a session's default startup timeout.
RECONNECT_WINDOW = 60.0
#: Seconds before the first new connection; each later wait doubles, up to a second.
_RECONNECT_PAUSE = 0.05


def connect_retrying(
    open_socket: Callable[[], socket.socket],
    key: bytes,
    timeout: float,
    window: float = RECONNECT_WINDOW,
    max_frame: int = FRAME_LIMIT,
) -> Channel:
    """:func:`connect_channel` on a connection from ``open_socket()``, and on a new one
    each time the controller drops the handshake before it proves the key
    (:class:`HandshakeDropped`: a listener whose table of pending handshakes a flood of
    connections filled drops the oldest), for up to ``window`` seconds.

    Each connection may wait in the listener's queue for what is left of the window
    before the controller's hello comes (``queued`` of :func:`connect_channel`): under a
    flood a connection waited there past ``timeout``, and a new one would only have
    gone to the back of the queue. Any other error ends it: ``open_socket``'s (the
    controller's listener is gone), a controller that does not prove the key or finish
    the handshake in ``timeout`` seconds from its hello (``FrameRejected``).
    """
    end = time.monotonic() + window
    pause = _RECONNECT_PAUSE
    while True:
        sock = open_socket()
        try:
            queued = max(0.0, end - time.monotonic() - timeout)
            return connect_channel(sock, key, timeout, max_frame, queued)
        except HandshakeDropped:
            sock.close()
            if time.monotonic() + pause >= end:
                raise
        except BaseException:
            sock.close()
            raise
        time.sleep(pause * (0.5 + secrets.randbelow(1000) / 1000))  # (apart from the others)
        pause = min(2 * pause, 1.0)
