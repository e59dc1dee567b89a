"""The wire of Disco: command payloads, sealed frames, the handshake, and a worker's
chunked reading of its channel; a tampered frame is refused before it is decoded."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import pickle
import socket
import struct
import threading
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cubepool._cubepool import SmallFrameMac
from cubepool.disco import wire
from cubepool.disco.errors import FrameRejected
from cubepool.disco.protocol import (
    NUMBER_SIZE,
    Command,
    DiscoAction,
    Failure,
    RegRef,
    decode_command,
    decode_message,
    encode_command,
)
from cubepool.disco.wire import (
    FRAME_LIMIT,
    MAGIC,
    MAX_FRAME,
    MAX_READ,
    NUMBER_BYTES,
    READ_CHUNK,
    TAG_SIZE,
    Channel,
    FrameMac,
    Handshake,
    Opener,
    Sealer,
    connect_channel,
    set_socket_timeout,
    write_all,
)
from cubepool.disco.worker import _SocketChannel

KEY = bytes(range(32))


def test_a_command_comes_back_whole_with_its_register_arguments() -> None:
    command = Command(
        DiscoAction.kCallPacked, 7, (3, RegRef(11), 0, True, "sum", RegRef(12)), 0, 42
    )
    decoded = decode_command(encode_command(command))
    assert decoded == command
    assert decoded.action is DiscoAction.kCallPacked
    assert [type(arg) for arg in decoded.args] == [int, RegRef, int, bool, str, RegRef]


def test_plain_integers_are_not_taken_for_registers() -> None:
    decoded = decode_command(encode_command(Command(DiscoAction.kKillReg, 0, (5, 6, 7), 0)))
    assert decoded.args == (5, 6, 7)
    assert not any(isinstance(arg, RegRef) for arg in decoded.args)


def test_arrays_travel_by_value() -> None:
    array = np.arange(1000, dtype=np.float64)
    decoded = decode_command(encode_command(Command(DiscoAction.kDebugSetRegister, 3, (array,), 9)))
    np.testing.assert_array_equal(decoded.args[0], array)
    assert decoded.reply == 9


def frames(payloads: list[bytes], key: bytes = KEY) -> bytes:
    sealer = Sealer(key)
    return b"".join(sealer.seal(payload) for payload in payloads)


def open_all(stream: bytes, key: bytes = KEY) -> list[bytes]:
    opener = Opener(key)
    opener.feed(stream)
    out = []
    while (payload := opener.next_payload()) is not None:
        out.append(payload)
    return out


def test_sealed_frames_open_in_order_small_and_large() -> None:
    payloads = [b"", b"x", os.urandom(100), os.urandom(3 * READ_CHUNK)]
    assert open_all(frames(payloads)) == payloads


def test_a_frame_cut_short_is_not_opened_yet() -> None:
    frame = frames([b"hello"])
    opener = Opener(KEY)
    for byte in frame[:-1]:
        opener.feed(bytes([byte]))
        assert opener.next_payload() is None
    opener.feed(frame[-1:])
    assert opener.next_payload() == b"hello"


def test_every_flipped_bit_of_a_frame_is_refused() -> None:
    frame = frames([encode_command(Command(DiscoAction.kSyncWorker, 0, (), 1))])
    for position in range(len(frame)):
        for bit in (0x01, 0x80):
            tampered = bytearray(frame)
            tampered[position] ^= bit
            opener = Opener(KEY)
            opener.feed(bytes(tampered))
            try:
                payload = opener.next_payload()
            except FrameRejected:
                continue
            # A flipped length bit may make the frame look longer: it is then never
            # complete, so nothing is opened either.
            assert payload is None, f"byte {position} bit {bit:#x} was accepted"


def test_replayed_reordered_or_foreign_frames_are_refused() -> None:
    sealer = Sealer(KEY)
    first, second = sealer.seal(b"one"), sealer.seal(b"two")
    with pytest.raises(FrameRejected, match="frame 1 failed authentication"):
        open_all(first + first)  # replayed
    with pytest.raises(FrameRejected, match="frame 0 failed authentication"):
        open_all(second + first)  # reordered
    with pytest.raises(FrameRejected):
        open_all(first, key=bytes(32))  # another channel's key


def test_an_impossible_length_is_refused_before_any_buffering() -> None:
    opener = Opener(KEY)
    opener.feed(b"\x00\x00\x00\x05abcde")  # shorter than a tag
    with pytest.raises(FrameRejected, match="impossible length"):
        opener.next_payload()


def changed_length(size: int) -> bytes:
    """A long frame header claiming ``size`` bytes, as an on-path attacker writes it."""
    return struct.pack("!i", -1) + struct.pack("!Q", size)


@contextmanager
def attacked_channel(max_frame: int = FRAME_LIMIT) -> Iterator[tuple[socket.socket, Channel]]:
    """A raw sending socket (the attacker's) and the receiving channel at its other end."""
    attacker, end = socket.socketpair()
    receiver = Channel(end, send_key=KEY, recv_key=KEY, max_frame=max_frame)
    try:
        yield attacker, receiver
    finally:
        attacker.close()
        receiver.close()


@pytest.mark.skipif(FRAME_LIMIT == MAX_FRAME, reason="a machine with 1 TiB of memory")
def test_a_length_beyond_this_machines_memory_is_refused_at_the_header() -> None:
    with attacked_channel() as (attacker, receiver):
        write_all(attacker.fileno(), changed_length(MAX_FRAME) + b"x" * 64)
        with pytest.raises(FrameRejected, match="frame 0 has an impossible length"):
            receiver.recv()  # (was MemoryError: os.read asked for 1 TiB)


@pytest.mark.parametrize("claim", [1 << 30, MAX_FRAME])
def test_a_changed_length_sizes_no_read_and_no_buffer(claim: int) -> None:
    """A header claiming 1 GiB or 1 TiB is trusted for nothing but where the frame ends:
    reads stay at most MAX_READ, and the buffer holds only the bytes that came (it used
    to ask os.read for the claimed length: 1 GiB allocated, or MemoryError)."""
    junk = changed_length(claim) + b"x" * (3 * MAX_READ)
    with attacked_channel(max_frame=MAX_FRAME) as (attacker, receiver):  # 1 TiB gets past

        def send() -> None:
            with contextlib.suppress(BlockingIOError):  # (a receiver that stopped reading)
                write_all(attacker.fileno(), junk)
            attacker.shutdown(socket.SHUT_WR)

        set_socket_timeout(attacker, socket.SO_SNDTIMEO, 5.0)

        sender = threading.Thread(target=send)
        tracemalloc.start()
        try:
            sender.start()
            with pytest.raises(EOFError):
                receiver.recv()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            sender.join()
        assert receiver._opener.buffered == len(junk)
    assert peak < 3 * len(junk)  # the bytes that came and a read, not the claim


class _NoRoom(bytearray):
    """A buffer that cannot grow: the process is out of memory."""

    def __iadd__(self, data: Any) -> _NoRoom:
        raise MemoryError


def test_running_out_of_memory_while_receiving_refuses_the_channel() -> None:
    sealer = Sealer(KEY)
    with attacked_channel() as (attacker, receiver):
        first = sealer.seal(b"a" * 10)
        write_all(attacker.fileno(), first + sealer.seal(bytes(READ_CHUNK * 2))[:1000])
        assert receiver.recv() == b"a" * 10  # the next frame is cut: more must be read
        receiver._opener._buffer = _NoRoom(receiver._opener._buffer)
        write_all(attacker.fileno(), b"y" * 1000)
        with pytest.raises(FrameRejected, match="frame 1's 131072-byte payload does not fit"):
            receiver.recv()  # (was a bare MemoryError)
        assert receiver._opener.buffered == 0  # dropped: the memory comes back
        write_all(attacker.fileno(), b"y" * 1000)
        for again in (receiver.recv, receiver.poll_payload):  # the channel stays refused
            with pytest.raises(FrameRejected, match="does not fit"):
                again()


class Bomb:
    """Unpickling this would create a file: proof that a payload was decoded."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path(self.path).touch, ())


def test_a_tampered_frame_is_not_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "decoded"
    frame = bytearray(frames([pickle.dumps(Bomb(str(marker)))]))
    frame[4] ^= 1  # a bit of the tag
    controller, worker = socket.socketpair()
    channel = _SocketChannel(Channel(worker, KEY, KEY))
    controller.sendall(bytes(frame))
    with pytest.raises(FrameRejected):
        channel.recv()
    assert not marker.exists()
    controller.close()
    worker.close()


def test_the_handshake_proves_the_key_both_ways() -> None:
    server, client = Handshake(KEY), Handshake(KEY)
    hello, server_nonce = server.server_hello()
    answer, nonce_seen, client_nonce = client.client_answer(hello)
    assert nonce_seen == server_nonce
    proof, client_nonce_seen = server.check_client(answer, server_nonce)
    assert client_nonce_seen == client_nonce
    client.check_server(proof, server_nonce, client_nonce)
    assert server.channel_keys(server_nonce, client_nonce) == client.channel_keys(
        server_nonce, client_nonce
    )
    with pytest.raises(FrameRejected, match="does not know the session key"):
        Handshake(bytes(32)).check_client(answer, server_nonce)
    with pytest.raises(FrameRejected, match="controller does not know"):
        Handshake(bytes(32)).check_server(proof, server_nonce, client_nonce)
    with pytest.raises(FrameRejected, match="not a Disco controller"):
        client.client_answer(b"HTTP/1.1 200 OK\r\n" + bytes(23))


def test_a_controller_trickling_its_hello_is_refused_at_the_handshakes_deadline() -> None:
    """The deadline is the whole handshake's: with one per ``recv``, a controller that
    sent a byte of its 40-byte hello every 0.3 s held a 0.5 s handshake for 12 s."""
    worker_side, controller_side = socket.socketpair()
    hello = MAGIC + os.urandom(32)
    sent: list[int] = []

    def trickle() -> None:
        with contextlib.suppress(OSError):
            for byte in hello:
                controller_side.send(bytes([byte]))
                sent.append(byte)
                time.sleep(0.3)

    feeder = threading.Thread(target=trickle, daemon=True)
    feeder.start()
    with pytest.raises(FrameRejected, match=r"did not finish the handshake within 0\.5 s"):
        connect_channel(worker_side, KEY, 0.5)
    # Refused while the hello was still trickling in (a deadline per `recv` waited for
    # all of it), not by a bound on the time taken.
    assert len(sent) < len(hello)
    worker_side.close()
    controller_side.close()
    feeder.join()


def test_a_closed_channel_touches_no_file_that_reuses_its_descriptor(tmp_path: Path) -> None:
    """A send after a close (a session closed on a timeout by one thread while another
    sent) wrote the command into whatever the process opened next under the number."""
    mine, theirs = socket.socketpair()
    channel = Channel(mine, send_key=KEY, recv_key=KEY)
    number = channel.fd
    channel.close()
    with open(tmp_path / "victim", "wb", buffering=0) as victim:
        assert victim.fileno() == number  # the lowest free number: the channel's
        with pytest.raises((OSError, ValueError)):
            channel.send_numbered(b"secret", 1)
        with pytest.raises(OSError):
            channel.read_some()
    assert (tmp_path / "victim").read_bytes() == b""
    theirs.close()


def _read_in_thread(channel: Channel) -> tuple[threading.Thread, list[str]]:
    """A thread running one ``channel.read_some()``, and the list it records the outcome in."""
    outcome: list[str] = []

    def read() -> None:
        try:
            channel.read_some()
            outcome.append("read")
        except EOFError:
            outcome.append("end")
        except OSError as exc:
            outcome.append(f"OSError {exc}")

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, outcome


def test_a_close_during_a_read_keeps_the_descriptor_until_the_read_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receiver that had read the channel's descriptor number, then a close from another
    thread, then a file opened under the freed number: the receiver read that file. The
    number now stays the channel's until the read ends, and the read sees the channel's end."""
    mine, theirs = socket.socketpair()
    channel = Channel(mine, send_key=KEY, recv_key=KEY)
    number = channel.fd
    holding, go_on = threading.Event(), threading.Event()
    real_read = os.read

    def paused_read(fd: int, size: int) -> bytes:
        if fd == number and not go_on.is_set():
            holding.set()  # the number is read; the read itself comes after the close
            go_on.wait(10)
        return real_read(fd, size)

    monkeypatch.setattr(wire.os, "read", paused_read)
    thread, outcome = _read_in_thread(channel)
    assert holding.wait(10)
    channel.close()
    with open(tmp_path / "victim", "wb+", buffering=0) as victim:
        victim.write(b"a file the receiver must not read")
        victim.seek(0)
        assert victim.fileno() != number, "the number was freed under a read in progress"
        go_on.set()
        thread.join(10)
        assert victim.tell() == 0
    assert outcome == ["end"]
    # The read ended: the channel's number is free now.
    with open(tmp_path / "after", "wb") as after:
        assert after.fileno() == number
    theirs.close()


def test_a_close_ends_a_read_blocked_on_another_thread_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read blocked on the channel (nothing was sent) ends at the close, seeing the
    channel's end. The close waits for the reader to reach its read, not for a time: a
    reader the scheduler started late closed after, and was refused (EBADF)."""
    mine, theirs = socket.socketpair()
    channel = Channel(mine, send_key=KEY, recv_key=KEY)
    number = channel.fd
    reading = threading.Event()
    real_read = os.read

    def announced_read(fd: int, size: int) -> bytes:
        if fd == number:
            reading.set()  # the read blocks next (or sees the shutdown at once)
        return real_read(fd, size)

    monkeypatch.setattr(wire.os, "read", announced_read)
    thread, outcome = _read_in_thread(channel)
    assert reading.wait(10)
    channel.close()
    thread.join(5)
    assert not thread.is_alive() and outcome == ["end"]
    with pytest.raises(OSError):
        channel.read_some()
    theirs.close()


def test_fresh_nonces_give_every_connection_its_own_keys() -> None:
    handshake = Handshake(KEY)
    first = handshake.channel_keys(os.urandom(32), os.urandom(32))
    second = handshake.channel_keys(os.urandom(32), os.urandom(32))
    assert first != second and first[0] != first[1]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 3))
def test_random_bytes_are_refused_or_wait_for_more(data: bytes, frames_before: int) -> None:
    """A fuzz smoke: any byte stream after good frames opens them, then is either refused
    with ``FrameRejected`` or waits for more bytes; nothing else is raised."""
    good = [f"frame {n}".encode() for n in range(frames_before)]
    opener = Opener(KEY)
    opener.feed(frames(good) + data)
    opened = []
    try:
        while (payload := opener.next_payload()) is not None:
            opened.append(payload)
    except FrameRejected:
        pass
    assert opened[: len(good)] == good
    assert len(opened) == len(good)  # random bytes never pass as a frame


@given(st.binary(max_size=200), st.integers(0, 3))
def test_random_bytes_after_handled_frames_are_refused_or_wait_for_more(
    data: bytes, frames_before: int
) -> None:
    """The fuzz smoke of ``dispatch`` (the extension's loop over buffered frames): good
    frames are handled, then random bytes are refused with ``FrameRejected`` or left
    for more bytes; no handler runs for them and nothing else is raised."""
    ran: list[int] = []
    good = [b"go#" + bytes([n]) for n in range(frames_before)]
    handlers = {b"go": lambda: ran.append(1)}
    opener = Opener(KEY)
    opener.feed(frames(good) + data)
    try:
        payload, error = opener.dispatch(handlers, 2)
        assert payload is None and error is None
    except FrameRejected:
        pass
    assert len(ran) == len(good) and opener.seq == len(good)


def channel_pair() -> tuple[Channel, Channel]:
    """Two ends of an authenticated channel over a socket pair (a real handshake)."""
    server_sock, client_sock = socket.socketpair()
    result: dict[str, Channel] = {}

    def client() -> None:
        result["client"] = connect_channel(client_sock, KEY, 5.0)

    thread = threading.Thread(target=client)
    thread.start()
    handshake = Handshake(KEY)
    hello, server_nonce = handshake.server_hello()
    server_sock.sendall(hello)
    answer = b""
    while len(answer) < 72:
        answer += server_sock.recv(72 - len(answer))
    proof, client_nonce = handshake.check_client(answer, server_nonce)
    server_sock.sendall(proof)
    thread.join()
    up, down = handshake.channel_keys(server_nonce, client_nonce)
    return Channel(server_sock, send_key=down, recv_key=up), result["client"]


def test_the_opener_holds_at_most_a_partial_frame_and_one_read() -> None:
    """Reads that keep ending inside a frame (a pipelined stream read in chunks) do not
    grow the opener's buffer: what was consumed is dropped at the next feed."""
    sealer, opener = Sealer(KEY), Opener(KEY)
    payloads = [bytes([n % 251]) * (30 + n % 17) for n in range(3000)]
    stream = b"".join(sealer.seal(payload) for payload in payloads)
    chunk, opened, largest = 1000, [], 0
    for start in range(0, len(stream), chunk):
        opener.feed(stream[start : start + chunk])
        largest = max(largest, len(opener._buffer))
        while (payload := opener.next_payload()) is not None:
            opened.append(payload)
    assert opened == payloads
    assert largest < chunk + 4 + TAG_SIZE + 64  # one read and one partial frame at most


def test_a_worker_reads_several_pipelined_commands_from_one_chunk() -> None:
    controller, worker_end = channel_pair()
    channel = _SocketChannel(worker_end)
    commands = [Command(DiscoAction.kCallPacked, 0, (1, RegRef(n)), 0, n) for n in range(50)]
    stream = b"".join(controller.seal(encode_command(command)) for command in commands)
    controller.sock.sendall(stream)
    assert [decode_command(channel.recv()) for _ in commands] == commands
    controller.close()
    with pytest.raises(EOFError):
        channel.recv()
    worker_end.close()


def test_a_worker_reads_frames_split_across_reads_and_larger_than_a_chunk() -> None:
    controller, worker_end = channel_pair()
    channel = _SocketChannel(worker_end)
    big = np.arange(3 * READ_CHUNK, dtype=np.int64)  # 24 chunks of payload
    small = Command(DiscoAction.kSyncWorker, 0, (), 4)
    stream = controller.seal(encode_command(small)) + controller.seal(
        encode_command(Command(DiscoAction.kCopyToWorker0, 2, (big,), 0))
    )

    def send_in_pieces() -> None:
        controller.sock.sendall(stream[:2])  # half a header: the worker must wait
        time.sleep(0.05)
        controller.sock.sendall(stream[2:])

    sender = threading.Thread(target=send_in_pieces)
    sender.start()
    first, second = decode_command(channel.recv()), decode_command(channel.recv())
    sender.join()
    assert first == small
    assert second.action is DiscoAction.kCopyToWorker0
    np.testing.assert_array_equal(second.args[0], big)
    controller.close()
    worker_end.close()


def test_a_worker_refuses_a_tampered_command_runs_nothing_and_says_so(tmp_path: Path) -> None:
    from cubepool import disco
    from cubepool.disco.communicator import ThreadCommunicator, ThreadFabric

    ran: list[int] = []
    disco.register_func("tests.disco.wire_mark", lambda: ran.append(1), override=True)
    controller, worker_end = channel_pair()
    worker = disco.DiscoWorker(
        0, 1, 1, _SocketChannel(worker_end), ThreadCommunicator(ThreadFabric(1, 1, 5.0), 0)
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    get = controller.seal(
        encode_command(Command(DiscoAction.kGetGlobalFunc, 1, ("tests.disco.wire_mark",), 0))
    )
    call = bytearray(
        controller.seal(encode_command(Command(DiscoAction.kCallPacked, 0, (RegRef(1),), 0)))
    )
    call[-1] ^= 0x01  # one flipped bit in the payload, after the handshake
    after = controller.seal(encode_command(Command(DiscoAction.kCallPacked, 0, (RegRef(1),), 0)))
    controller.sock.sendall(get + bytes(call) + after)
    thread.join(10)
    assert not thread.is_alive()  # the worker ended
    assert ran == []  # neither the tampered call nor the one after it ran
    failure = decode_message(controller.recv())
    assert isinstance(failure, Failure)
    assert failure.exc_type.endswith("FrameRejected")
    assert "nothing in it ran" in failure.message
    assert "frame 1 failed authentication" in failure.message
    assert len(call) > TAG_SIZE
    controller.close()
    worker_end.close()


def test_a_worker_runs_calls_as_the_socket_carried_them_and_reports_failures() -> None:
    """A call read from a socket runs without a ``Command`` built (its raw form): the
    registers it names are resolved, a result lands in its register, and a call on an
    unset register answers with a ``Failure`` carrying the command's reply and number,
    after which the worker goes on."""
    from cubepool import disco
    from cubepool.disco.communicator import ThreadCommunicator, ThreadFabric
    from cubepool.disco.protocol import Reply

    disco.register_func("tests.disco.wire_add", lambda a, b: a + b, override=True)
    controller, worker_end = channel_pair()
    worker = disco.DiscoWorker(
        0, 1, 1, _SocketChannel(worker_end), ThreadCommunicator(ThreadFabric(1, 1, 5.0), 0)
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    commands = [
        Command(DiscoAction.kGetGlobalFunc, 1, ("tests.disco.wire_add",), 0),
        Command(DiscoAction.kDebugSetRegister, 2, (40,), 0),
        Command(DiscoAction.kCallPacked, 3, (1, RegRef(2), 2), 0, 7),
        Command(DiscoAction.kCallPacked, 4, (1, RegRef(9), 2), 0, 8),  # 9 is not set
        Command(DiscoAction.kCallPacked, 5, (1, RegRef(3), RegRef(2)), 0, 9),
        Command(DiscoAction.kDebugGetFromRemote, 5, (), 11),
        Command(DiscoAction.kShutDown, 0, (), 0),
    ]
    controller.sock.sendall(b"".join(controller.seal(encode_command(c)) for c in commands))
    failure = decode_message(controller.recv())
    assert isinstance(failure, Failure)
    assert (failure.seq, failure.number) == (0, 8)
    assert "register 9 is not set on worker 0" in failure.message
    answer = decode_message(controller.recv())
    assert answer == Reply(0, 11, 82)  # (40 + 2) + 40
    thread.join(10)
    assert not thread.is_alive()
    controller.close()
    worker_end.close()


@settings(max_examples=60, deadline=None)
@given(
    key=st.binary(min_size=16, max_size=130),
    seq=st.integers(0, 2**64 - 1),
    payload=st.binary(max_size=300) | st.sampled_from([bytes(70_000)]),
)
def test_frame_mac_is_keyed_blake2s_up_to_64_kib_then_hmac_sha256(
    key: bytes, seq: int, payload: bytes
) -> None:
    message = seq.to_bytes(8, "big") + payload
    if len(payload) <= 1 << 16:
        small_key = hmac.digest(key, b"blake2s frames", "sha256")
        expected = hashlib.blake2s(message, key=small_key).digest()
    else:
        expected = hmac.digest(key, message, "sha256")
    assert FrameMac(key).tag(seq, payload) == expected


@pytest.mark.parametrize("old", [b"cpdisco1", b"cpdisco2"])
def test_a_peer_of_an_earlier_wire_version_is_refused_at_the_handshake(old: bytes) -> None:
    handshake = Handshake(KEY)
    hello, server_nonce = handshake.server_hello()
    assert hello.startswith(b"cpdisco3")
    old_hello = old + hello[8:]
    with pytest.raises(FrameRejected, match="not a Disco controller"):
        handshake.client_answer(old_hello)
    answer, _, _ = handshake.client_answer(hello)
    with pytest.raises(FrameRejected, match="not a Disco worker or node"):
        handshake.check_client(old + answer[8:], server_nonce)


def test_the_extensions_small_frame_mac_is_hashlibs_keyed_blake2s() -> None:
    """Every message length from 0 to 3 blocks past the 8 bytes of ``seq`` (each block
    boundary crossed), several keys, against ``hashlib.blake2s``."""
    for key in (bytes([7]), bytes(range(16)), os.urandom(32)):
        mac = SmallFrameMac(key, 1 << 16)
        for size in range(0, 200):
            payload = os.urandom(size)
            seq = int.from_bytes(os.urandom(8), "big")
            expected = hashlib.blake2s(seq.to_bytes(8, "big") + payload, key=key).digest()
            assert mac.tag(seq, payload) == expected
    for bad in (b"", bytes(33)):
        with pytest.raises(ValueError, match="1 to 32 bytes"):
            SmallFrameMac(bad, 10)


def test_the_extension_opens_whole_small_frames_and_leaves_the_rest() -> None:
    """``SmallFrameMac.open``: a whole small frame gives its payload; a cut one, a large
    one, a long header or a start past the end give None (Python's general path); a
    changed byte anywhere in the tag or payload raises."""
    limit = 100
    mac = FrameMac(KEY)
    small = SmallFrameMac(hmac.digest(KEY, b"blake2s frames", "sha256"), limit)
    frame = Sealer(KEY).seal(b"x" * 60)
    buffer = bytearray(b"junk" + frame + b"next")
    assert small.open(buffer, 4, 0) == b"x" * 60
    assert small.open(bytearray(frame[:-1]), 0, 0) is None  # cut
    assert small.open(buffer, len(buffer) + 5, 0) is None
    assert small.open(bytearray(frame[:3]), 0, 0) is None  # half a header
    big = bytes(limit + 1)
    big_frame = struct.pack("!i", TAG_SIZE + len(big)) + mac.tag(0, big) + big
    assert small.open(bytearray(big_frame), 0, 0) is None
    assert small.open(bytearray(struct.pack("!i", -1) + bytes(40)), 0, 0) is None
    assert small.open(bytearray(struct.pack("!i", 5) + bytes(40)), 0, 0) is None  # < a tag
    with pytest.raises(ValueError, match="tag mismatch"):
        small.open(bytearray(frame), 0, 1)  # another frame number
    for index in range(4, len(frame)):
        changed = bytearray(frame)
        changed[index] ^= 0x80
        with pytest.raises(ValueError, match="tag mismatch"):
            small.open(changed, 0, 0)


def test_dispatch_runs_the_handlers_of_buffered_frames_and_stops_where_python_must() -> None:
    """``Opener.dispatch``: each whole small frame whose payload less its trailer is a
    handler's key runs that handler; it stops at a frame without one (its payload
    given), at a handler that raised (the frame's payload and the exception), where no
    whole frame is left, and at a forged frame (``FrameRejected``, the ones before it
    run and consumed)."""
    ran: list[str] = []

    def boom() -> None:
        ran.append("boom")
        raise ValueError("boom")

    handlers = {b"a": lambda: ran.append("a"), b"b": boom}
    sealer, opener = Sealer(KEY), Opener(KEY)
    payloads = [b"a#1", b"a#2", b"c#3", b"b#4", b"a#5"]
    stream = b"".join(sealer.seal(payload) for payload in payloads)
    opener.feed(stream[:-3])  # the last frame cut
    assert opener.dispatch(handlers, 2) == (b"c#3", None)
    assert ran == ["a", "a"]
    payload, error = opener.dispatch(handlers, 2)
    assert payload == b"b#4" and isinstance(error, ValueError) and ran[-1] == "boom"
    assert opener.dispatch(handlers, 2) == (None, None)  # a#5 is not all here
    opener.feed(stream[-3:])
    assert opener.dispatch(handlers, 2) == (None, None) and ran[-1] == "a"
    assert opener.seq == 5 and opener.buffered == 0
    good = sealer.seal(b"a#6")
    forged = bytearray(sealer.seal(b"a#7"))
    forged[-1] ^= 1
    opener.feed(good + bytes(forged))
    with pytest.raises(FrameRejected, match="frame 6 failed authentication"):
        opener.dispatch(handlers, 2)
    assert ran.count("a") == 4 and opener.seq == 6  # a#6 ran; the forged one did not


def test_the_extension_seals_small_frames_as_the_python_framing_does() -> None:
    small = SmallFrameMac(hmac.digest(KEY, b"blake2s frames", "sha256"), 100)
    mac = FrameMac(KEY)
    for size in (0, 1, 55, 56, 100):
        payload = os.urandom(size)
        expected = struct.pack("!i", TAG_SIZE + size) + mac.tag(9, payload) + payload
        assert small.seal(9, payload) == expected
    with pytest.raises(ValueError, match="at most 100 bytes, got 101"):
        small.seal(0, bytes(101))


def test_dispatch_refuses_to_number_a_frame_past_the_last() -> None:
    """A frame numbered 2**64 - 1 that passes its check ends the channel with a
    ValueError, not an overflow in the extension."""
    small = SmallFrameMac(hmac.digest(KEY, b"blake2s frames", "sha256"), 100)
    last = 2**64 - 1
    ran: list[str] = []
    frame = small.seal(last, b"a#1")
    with pytest.raises(ValueError, match="frame number past"):
        small.dispatch(bytearray(frame), 0, last, {b"a": lambda: ran.append("a")}, 2)
    assert ran == []


def test_send_numbered_writes_the_frame_seal_makes() -> None:
    """``Sealer.send_numbered`` (the extension's ``SmallFrameMac.send`` for a small
    payload, Python's seal for a large one) writes to the socket the very frame
    ``seal(body + number)`` makes, under the next frame number, and it opens."""
    assert NUMBER_BYTES == NUMBER_SIZE  # the wire's trailer is the command's number
    reader, writer = socket.socketpair()
    with reader, writer:
        sealer, twin, opener = Sealer(KEY), Sealer(KEY), Opener(KEY)
        for body in (b"", b"command body", os.urandom(70_000)):
            number = int.from_bytes(os.urandom(8), "big")
            payload = body + number.to_bytes(8, "big")
            expected = twin.seal(payload)
            thread = threading.Thread(
                target=sealer.send_numbered, args=(writer.fileno(), body, number)
            )
            thread.start()
            data = b""
            while len(data) < len(expected):
                data += reader.recv(1 << 20)
            thread.join()
            assert data == expected
            opener.feed(data)
            assert opener.next_payload() == payload
        assert sealer.seq == twin.seq == 3


def test_the_extensions_send_refuses_what_it_cannot_write() -> None:
    """``SmallFrameMac.send``: a payload over its limit is a ValueError and writes
    nothing; a closed descriptor is an OSError; a full non-blocking socket a
    BlockingIOError (what a send timeout gives)."""
    small = SmallFrameMac(bytes(range(16)), 100)
    reader, writer = socket.socketpair()
    with reader, writer:
        with pytest.raises(ValueError, match="at most 100 bytes, got 101"):
            small.send(writer.fileno(), 0, bytes(93), 1)
        reader.setblocking(False)
        with pytest.raises(BlockingIOError):
            reader.recv(1)  # nothing was written
        writer.setblocking(False)
        with pytest.raises(BlockingIOError):
            for _ in range(1_000_000):
                small.send(writer.fileno(), 0, bytes(92), 1)
    closed_reader, closed_writer = socket.socketpair()
    closed_reader.close()
    with closed_writer, pytest.raises(OSError):
        small.send(closed_writer.fileno(), 0, b"x", 1)


def test_a_send_refused_before_writing_uses_no_frame_number() -> None:
    """A body or number ``SmallFrameMac.send`` refuses before writing leaves the frame
    number for the next frame, so the peer's next frame still opens."""
    reader, writer = socket.socketpair()
    with reader, writer:
        sealer, opener = Sealer(KEY), Opener(KEY)
        for body, number in ((bytearray(b"x"), 1), (b"x", -1), (b"x", 1 << 64)):
            with pytest.raises((TypeError, OverflowError)):
                sealer.send_numbered(writer.fileno(), body, number)  # type: ignore[arg-type]
        assert sealer.seq == 0
        sealer.send_numbered(writer.fileno(), b"body", 7)
        opener.feed(reader.recv(1 << 16))
        assert opener.next_payload() == b"body" + (7).to_bytes(8, "big")


def test_a_node_whose_controller_sends_no_welcome_gives_up_at_the_deadline() -> None:
    """A remote node waits for its welcome at most the handshake's deadline: a
    controller that proved the key and then says nothing (stalled, or its host gone
    without closing) is a ``DiscoError`` naming the wait (helper-130's find: the node
    blocked for ever), and a welcome in time leaves the channel without a deadline."""
    from cubepool.disco.errors import DiscoError
    from cubepool.disco.remote import _welcome

    controller, node = channel_pair()
    started = time.monotonic()
    with pytest.raises(DiscoError, match=r"sent no welcome within 0\.3 s"):
        _welcome(node, deadline=0.3)
    assert time.monotonic() - started < 5
    controller.close()
    node.close()

    controller, node = channel_pair()
    controller.send(b"welcome")
    assert _welcome(node, deadline=5.0) == b"welcome"
    timeout = node.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16)
    assert struct.unpack("ll", timeout) == (0, 0)
    controller.close()
    node.close()


def test_a_remote_nodes_connection_to_its_controller_keeps_alive() -> None:
    """The node's connection idles through the session (the controller says nothing
    after the welcome), so a controller host gone without closing is noticed only by
    TCP keepalive: on, with the module's idle time, interval and probe count (the node
    waited for ever: helper-130's lead)."""
    from cubepool.disco.remote import _connect

    server = socket.create_server(("127.0.0.1", 0))
    try:
        sock = _connect("127.0.0.1", server.getsockname()[1], 5.0)
        try:
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            if hasattr(socket, "TCP_KEEPIDLE"):
                tcp = socket.IPPROTO_TCP
                assert [
                    sock.getsockopt(tcp, socket.TCP_KEEPIDLE),
                    sock.getsockopt(tcp, socket.TCP_KEEPINTVL),
                    sock.getsockopt(tcp, socket.TCP_KEEPCNT),
                ] == [wire.KEEPALIVE_IDLE, wire.KEEPALIVE_INTERVAL, wire.KEEPALIVE_PROBES]
        finally:
            sock.close()
    finally:
        server.close()
