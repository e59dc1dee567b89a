"""A worker's replays: a command read from a socket again runs the call it made the first
time, without decoding or checking; never on a stale register, never holding a freed one.

Most tests drive one in-process worker through a real authenticated channel (a socket
pair), so they see exactly what a ``ProcessSession``'s worker runs; the last ones run the
collectives' prepared MPI calls in a ``ProcessSession`` of two ranks.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import socket
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cubepool import disco
from cubepool.disco import worker as worker_module
from cubepool.disco.communicator import ThreadCommunicator, ThreadFabric
from cubepool.disco.protocol import (
    Command,
    DiscoAction,
    Failure,
    RegRef,
    Reply,
    decode_message,
    encode_command,
)
from cubepool.disco.wire import Channel
from cubepool.disco.worker import MAX_REPLAYS, DiscoWorker, _SocketChannel

KEY = bytes(range(32))
TESTS = Path(__file__).parent

#: What the registered test functions saw, in call order.
SEEN: list[Any] = []


class Thing:
    """A register value that can be watched with a weak reference."""


THINGS: list[weakref.ref[Thing]] = []


@disco.register_func("tests.replay.record", override=True)
def record(*args: Any) -> None:
    """Note the arguments."""
    SEEN.append(args)


@disco.register_func("tests.replay.bump", override=True)
def bump(array: Any) -> None:
    """Note a copy of ``array``, then change it in place."""
    SEEN.append(np.array(array, copy=True))
    array += 1


@disco.register_func("tests.replay.fail_third", override=True)
def fail_third() -> None:
    """Raise on the third call."""
    SEEN.append("call")
    if len(SEEN) == 3:
        raise ValueError("the third call fails")


@disco.register_func("tests.replay.make", override=True)
def make() -> Thing:
    """A new ``Thing``, watched in ``THINGS``."""
    thing = Thing()
    THINGS.append(weakref.ref(thing))
    return thing


@disco.register_func("tests.replay.value", override=True)
def value(x: int) -> int:
    """``x``."""
    return x


class Driver:
    """One worker thread behind an authenticated socket pair; commands numbered 1, 2..."""

    def __init__(self) -> None:
        controller_sock, self.worker_sock = socket.socketpair()
        self.controller = Channel(controller_sock, KEY, KEY)
        self.worker = DiscoWorker(
            0,
            1,
            1,
            _SocketChannel(Channel(self.worker_sock, KEY, KEY)),
            ThreadCommunicator(ThreadFabric(1, 1, 5.0), 0),
        )
        self.thread = threading.Thread(target=self.worker.run)
        self.thread.start()
        self.number = 0
        self.functions: dict[str, int] = {}

    def send(self, action: DiscoAction, reg_id: int, args: tuple[Any, ...], reply: int = 0) -> int:
        self.number += 1
        self.controller.send(encode_command(Command(action, reg_id, args, reply, self.number)))
        return self.number

    def func(self, name: str) -> int:
        """The register of function ``name`` on the worker (asked for once)."""
        if name not in self.functions:
            self.functions[name] = reg = 100 + len(self.functions)
            self.send(DiscoAction.kGetGlobalFunc, reg, (name,))
        return self.functions[name]

    def call(self, name: str, *args: Any, into: int = 0) -> int:
        """``kCallPacked`` of ``name`` (unanswered); its number."""
        return self.send(DiscoAction.kCallPacked, into, (self.func(name), *args))

    def sync(self) -> None:
        """Wait until the worker has run everything sent (failures were sent before)."""
        number = self.send(DiscoAction.kSyncWorker, 0, (), 999)
        answer = decode_message(self.controller.recv())
        assert answer == Reply(0, 999, None), (number, answer)

    def close(self) -> None:
        self.send(DiscoAction.kShutDown, 0, ())
        self.thread.join(10)
        assert not self.thread.is_alive()
        self.controller.close()
        self.worker_sock.close()


@pytest.fixture
def driver() -> Iterator[Driver]:
    SEEN.clear()
    THINGS.clear()
    made = Driver()
    yield made
    made.close()
    assert made.worker.replays == {}  # dropped at the end of the loop


def test_a_repeated_call_is_decoded_once_and_replayed(
    driver: Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded: list[int] = []
    decode = worker_module.decode_raw_command

    def counting(payload: bytes) -> Any:
        raw = decode(payload)
        decoded.append(raw[0])
        return raw

    monkeypatch.setattr(worker_module, "decode_raw_command", counting)
    driver.send(DiscoAction.kDebugSetRegister, 2, (40,))
    for _ in range(5):
        driver.call("tests.replay.record", RegRef(2), 5, "sum", None, 1.5)
    driver.sync()
    assert SEEN == [(40, 5, "sum", None, 1.5)] * 5
    calls = decoded.count(int(DiscoAction.kCallPacked))
    assert calls == 1  # the four others were replayed from their body
    assert len(driver.worker.replays) == 1


def test_a_replay_never_sees_a_stale_register(driver: Driver) -> None:
    driver.send(DiscoAction.kDebugSetRegister, 2, (40,))
    driver.call("tests.replay.record", RegRef(2))
    driver.call("tests.replay.record", RegRef(2))
    driver.send(DiscoAction.kDebugSetRegister, 2, (41,))  # replaced
    driver.call("tests.replay.record", RegRef(2))
    driver.call("tests.replay.value", 42, into=2)  # a call that writes the register
    driver.call("tests.replay.record", RegRef(2))
    driver.sync()
    assert SEEN == [(40,), (40,), (41,), (42,)]


def test_replays_are_dropped_on_kill_and_keep_no_freed_value(driver: Driver) -> None:
    driver.call("tests.replay.make", into=2)
    driver.call("tests.replay.record", RegRef(2))
    driver.call("tests.replay.record", RegRef(2))
    driver.sync()
    assert len(driver.worker.replays) == 1  # holds the Thing through its arguments
    del SEEN[:]
    driver.send(DiscoAction.kKillReg, 0, (2,))
    driver.sync()
    gc.collect()
    assert driver.worker.replays == {}
    assert [ref() for ref in THINGS] == [None]  # nothing holds the freed register's value


def test_a_call_with_a_mutable_argument_is_decoded_every_time(driver: Driver) -> None:
    array = np.zeros(3, np.int64)
    driver.call("tests.replay.bump", array)
    driver.call("tests.replay.bump", array)
    driver.sync()
    # Each call got its own copy from the payload, not the array the first one changed.
    np.testing.assert_array_equal(SEEN[0], [0, 0, 0])
    np.testing.assert_array_equal(SEEN[1], [0, 0, 0])
    assert driver.worker.replays == {}


def test_a_failing_replay_reports_its_own_number_and_the_worker_goes_on(
    driver: Driver,
) -> None:
    numbers = [driver.call("tests.replay.fail_third") for _ in range(4)]
    failure = decode_message(driver.controller.recv())
    assert isinstance(failure, Failure)
    assert (failure.seq, failure.number) == (0, numbers[2])
    assert "the third call fails" in failure.message
    assert "ValueError" in failure.exc_type and "fail_third" in failure.traceback
    driver.sync()
    assert SEEN == ["call"] * 4


def test_a_call_on_an_unset_register_fails_and_is_not_kept(driver: Driver) -> None:
    number = driver.call("tests.replay.record", RegRef(77))
    failure = decode_message(driver.controller.recv())
    assert isinstance(failure, Failure) and failure.number == number
    assert "register 77 is not set on worker 0" in failure.message
    driver.sync()
    assert driver.worker.replays == {} and SEEN == []


def test_replays_are_bounded(driver: Driver) -> None:
    for index in range(MAX_REPLAYS + 5):
        driver.call("tests.replay.record", index)
    driver.sync()
    assert len(SEEN) == MAX_REPLAYS + 5
    assert 0 < len(driver.worker.replays) <= MAX_REPLAYS


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="needs mpi4py")
def test_replayed_collectives_in_mpi_processes_match_numpy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Collectives repeated on the same tensors (replayed: MPI's call prepared once) see
    each call's new contents: in-place sums double, averages of integers divide toward
    zero each time, an allgather after its source changed gathers the new values."""
    path = os.pathsep.join(p for p in [str(TESTS), os.environ.get("PYTHONPATH")] if p)
    monkeypatch.setenv("PYTHONPATH", path)
    with disco.ProcessSession(2, timeout=60) as sess:
        x = sess.broadcast(np.ones(5, np.float64))
        for _ in range(6):
            sess.allreduce(x, x, "sum")
        assert [x.debug_get_from_remote(w).tolist() for w in range(2)] == [[64.0] * 5] * 2
        ints = sess.empty((3,), "int32")
        for worker in range(2):
            ints.debug_copy_from(worker, np.array([7, -7, 9], np.int32) * (worker + 1))
        avg = sess.empty((3,), "int32")
        sess.allreduce(ints, avg, "avg")
        sess.allreduce(ints, ints, "avg")  # in place
        sess.allreduce(ints, ints, "avg")  # replayed: the same again
        for worker in range(2):
            np.testing.assert_array_equal(avg.debug_get_from_remote(worker), [10, -10, 13])
            np.testing.assert_array_equal(ints.debug_get_from_remote(worker), [10, -10, 13])
        part = sess.broadcast(np.arange(4, dtype=np.float32))
        whole = sess.empty((8,), "float32")
        sess.allgather(part, whole)
        sess.allreduce(part, part, "sum")  # new contents, same registers
        sess.allgather(part, whole)  # replayed
        expected = np.concatenate([np.arange(4) * 2] * 2)
        for worker in range(2):
            np.testing.assert_array_equal(whole.debug_get_from_remote(worker), expected)
