"""The wire form of Disco commands, and a worker's chunked reading of its channel."""

from __future__ import annotations

import os
import socket
import threading
import time
from multiprocessing.connection import Connection

import numpy as np
import pytest

from cubepool.disco.protocol import (
    Command,
    DiscoAction,
    RegRef,
    decode_command,
    encode_command,
    frame_length,
)
from cubepool.disco.worker import READ_CHUNK, _ConnectionChannel


def payload_of(frame: bytes) -> bytes:
    sizes = frame_length(frame, 0)
    assert sizes is not None
    header, size = sizes
    assert len(frame) == header + size
    return frame[header:]


def test_a_command_comes_back_whole_with_its_register_arguments() -> None:
    command = Command(
        DiscoAction.kCallPacked, 7, (3, RegRef(11), 0, True, "sum", RegRef(12)), 0, 42
    )
    decoded = decode_command(payload_of(encode_command(command)))
    assert decoded == command
    assert decoded.action is DiscoAction.kCallPacked
    assert [type(arg) for arg in decoded.args] == [int, RegRef, int, bool, str, RegRef]


def test_plain_integers_are_not_taken_for_registers() -> None:
    command = Command(DiscoAction.kKillReg, 0, (5, 6, 7), 0)
    decoded = decode_command(payload_of(encode_command(command)))
    assert decoded.args == (5, 6, 7)
    assert not any(isinstance(arg, RegRef) for arg in decoded.args)


def test_arrays_travel_by_value() -> None:
    array = np.arange(1000, dtype=np.float64)
    command = Command(DiscoAction.kDebugSetRegister, 3, (array,), 9)
    decoded = decode_command(payload_of(encode_command(command)))
    np.testing.assert_array_equal(decoded.args[0], array)
    assert decoded.reply == 9


def test_a_header_cut_short_is_not_a_frame_yet() -> None:
    frame = encode_command(Command(DiscoAction.kSyncWorker, 0, (), 1))
    assert frame_length(frame[:3], 0) is None
    assert frame_length(b"\xff\xff\xff\xff\x00", 0) is None  # a long header, cut
    assert frame_length(frame, 0) == (4, len(frame) - 4)


@pytest.fixture
def channel_pair() -> tuple[socket.socket, _ConnectionChannel]:
    controller, worker = socket.socketpair()
    channel = _ConnectionChannel(Connection(worker.detach()))
    return controller, channel


def test_a_worker_reads_several_pipelined_commands_from_one_chunk(
    channel_pair: tuple[socket.socket, _ConnectionChannel],
) -> None:
    controller, channel = channel_pair
    commands = [Command(DiscoAction.kCallPacked, 0, (1, RegRef(n)), 0, n) for n in range(50)]
    controller.sendall(b"".join(encode_command(command) for command in commands))
    assert [channel.recv() for _ in commands] == commands
    controller.close()
    with pytest.raises(EOFError):
        channel.recv()


def test_a_worker_reads_frames_split_across_reads_and_larger_than_a_chunk(
    channel_pair: tuple[socket.socket, _ConnectionChannel],
) -> None:
    controller, channel = channel_pair
    big = np.arange(3 * READ_CHUNK, dtype=np.int64)  # 24 chunks of payload
    small = Command(DiscoAction.kSyncWorker, 0, (), 4)
    stream = encode_command(small) + encode_command(
        Command(DiscoAction.kCopyToWorker0, 2, (big,), 0)
    )

    def send_in_pieces() -> None:
        controller.sendall(stream[:2])  # half a header: the worker must wait for the rest
        time.sleep(0.05)
        controller.sendall(stream[2:])

    sender = threading.Thread(target=send_in_pieces)
    sender.start()
    first, second = channel.recv(), channel.recv()
    sender.join()
    assert first == small
    assert second.action is DiscoAction.kCopyToWorker0
    np.testing.assert_array_equal(second.args[0], big)
    controller.close()


def test_a_local_process_session_talks_over_a_unix_socket_and_leaves_no_file() -> None:
    pytest.importorskip("mpi4py")
    from cubepool import disco

    with disco.ProcessSession(2) as session:
        transport = session._transport
        command = transport.command  # type: ignore[attr-defined]
        connect = command[command.index("--connect") + 1]
        assert connect.startswith("unix:")
        socket_file = connect.removeprefix("unix:")
        # Once every worker is connected, the socket's file and folder are gone, so even a
        # controller killed outright leaves nothing behind.
        assert not os.path.exists(socket_file)
        assert not os.path.exists(os.path.dirname(socket_file))
        session.sync_workers()
        array = np.arange(6, dtype=np.float32)
        remote = session.empty((6,), "float32")
        remote.debug_copy_from(0, array)
        np.testing.assert_array_equal(remote.debug_get_from_remote(0), array)
