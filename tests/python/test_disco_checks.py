"""A session survives what the controller can check, and registers behave as TVM's."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import cubepool
from cubepool import disco
from cubepool.disco.protocol import Command, encode_command


@pytest.fixture
def sess() -> Iterator[disco.Session]:
    session = disco.ThreadedSession(4, timeout=10)
    yield session
    session.shutdown()


def test_the_mis_shaped_broadcast_is_refused_and_the_session_goes_on(sess: disco.Session) -> None:
    x = sess.empty((4, 4), "float32")
    with pytest.raises(cubepool.InvalidArgument, match=r"send is \(3,\) float64 but recv is"):
        sess.broadcast(np.zeros(3, np.float64), x)
    sess.broadcast(np.ones((4, 4), np.float32), x)
    np.testing.assert_array_equal(x.debug_get_from_remote(3), np.ones((4, 4)))
    assert not sess.closed


def test_bad_arguments_are_refused_on_the_controller(sess: disco.Session) -> None:
    a, b = sess.empty((6,), "float32"), sess.empty((4,), "float32")
    with pytest.raises(cubepool.InvalidArgument, match="allgather"):
        sess.allgather(a, b)
    with pytest.raises(cubepool.InvalidArgument, match="in_group must be a bool"):
        sess.allreduce(a, a, in_group="yes")  # type: ignore[arg-type]
    with pytest.raises(cubepool.InvalidArgument, match="non-negative ints"):
        sess.empty((-1,), "float32")
    with pytest.raises(cubepool.InvalidArgument, match="unknown dtype"):
        sess.empty((2,), "float7")
    with pytest.raises(cubepool.InvalidArgument, match="must be a DRef"):
        sess.allreduce(np.zeros(6), a)  # type: ignore[arg-type]
    root_only = sess.empty((6,), "float32", worker0_only=True, in_group=False)
    with pytest.raises(cubepool.InvalidArgument, match=r"not a tensor on worker\(s\) \[1, 2, 3\]"):
        sess.allreduce(root_only, a)
    sess.sync_workers()
    assert not sess.closed


def test_the_controller_takes_the_dtypes_the_workers_take(sess: disco.Session) -> None:
    # The controller checked dtypes with numpy: it refused bfloat16 and float32x4, which
    # the workers hold, and took complex64 and S4, which they refuse, so the error
    # surfaced at some later, unrelated wait.
    for dtype, nbytes in (("bfloat16", 4), ("float32x4", 32), ("float16", 4), ("bool", 2)):
        ref = sess.empty((2,), dtype)
        assert ref.debug_get_from_remote(1).nbytes == nbytes, dtype
    for dtype in ("complex64", "S4", "datetime64[s]", "int4"):
        with pytest.raises(cubepool.InvalidArgument, match="unknown dtype"):
            sess.empty((2,), dtype)
    sess.sync_workers()
    assert not sess.closed


def test_a_numpy_array_a_worker_function_returns_is_copied_from_worker_0(
    sess: disco.Session,
) -> None:
    # debug_get_from_remote read it, copy_from_worker_0 refused it ("holds a ndarray, not
    # a Tensor").
    sess.import_python_module("disco_helpers")
    ref = sess.get_global_func("tests.disco.numpy_ones")(4)
    host = np.zeros(4, np.float32)
    sess.copy_from_worker_0(host, ref)
    np.testing.assert_array_equal(host, np.ones(4, np.float32))
    with pytest.raises(cubepool.InvalidArgument, match="host_array has 8 bytes"):
        sess.copy_from_worker_0(np.zeros(2, np.float32), ref)


def test_debug_copy_from_copies_into_the_registers_tensor(sess: disco.Session) -> None:
    values = np.arange(18, dtype=np.float32)
    x = sess.empty((3, 3, 2), "float32")
    x.debug_copy_from(1, values)
    got = x.debug_get_from_remote(1)
    assert got.shape == (3, 3, 2)  # the shape is kept
    np.testing.assert_array_equal(got.reshape(-1), values)
    with pytest.raises(cubepool.InvalidArgument, match="sizes must match"):
        x.debug_copy_from(1, np.arange(5, dtype=np.float32))


def test_debug_copy_from_of_a_list_keeps_the_registers_tensor(sess: disco.Session) -> None:
    # A list replaced the register's tensor on the worker, while the controller kept the
    # register's layout, a (2,) float32 tensor: copy_from_worker_0 passed its checks
    # and then failed on the worker ("holds a list, not a Tensor"), as did collectives.
    # As TVM's debug_copy_from makes an array of the value, it is copied into the tensor.
    x = sess.empty((2,), "float32")
    x.debug_copy_from(0, [1.5, 2.5])
    host = np.zeros(2, np.float32)
    sess.copy_from_worker_0(host, x)
    np.testing.assert_array_equal(host, [1.5, 2.5])
    x.debug_copy_from(3, (7, 8))  # converted to the tensor's dtype, as copyfrom converts
    got = x.debug_get_from_remote(3)
    assert (got.shape, got.dtype) == ((2,), np.float32)
    np.testing.assert_array_equal(got, [7.0, 8.0])
    sess.allreduce(x, x, "max")
    np.testing.assert_array_equal(x.debug_get_from_remote(1), [7.0, 8.0])
    # What does not fit the tensor is refused on the controller; nothing is sent.
    with pytest.raises(
        cubepool.InvalidArgument,
        match=r"debug_copy_from: source shape \[3\], tensor shape \[2\]",
    ):
        x.debug_copy_from(2, [1.0, 2.0, 3.0])
    with pytest.raises(cubepool.InvalidArgument, match=r"debug_copy_from: its source \(str\)"):
        x.debug_copy_from(2, "ab")
    np.testing.assert_array_equal(x.debug_get_from_remote(2), [7.0, 8.0])
    # Where the controller knows no layout, the worker converts, and refuses, the same way.
    sess.import_python_module("cubepool.disco.testing")
    unknown = sess.get_global_func("tests.disco.add_one_tensor")(x)
    assert unknown.layout is None
    unknown.debug_copy_from(0, [5, 6])
    sess.copy_from_worker_0(host, unknown)
    np.testing.assert_array_equal(host, [5.0, 6.0])
    with pytest.raises(disco.WorkerError, match=r"source shape \[3\], tensor shape \[2\]"):
        unknown.debug_copy_from(0, [1, 2, 3])
        sess.sync_worker_0()
    sess.copy_from_worker_0(host, unknown)
    np.testing.assert_array_equal(host, [5.0, 6.0])
    assert not sess.closed


def test_cubepool_tensor_from_an_array() -> None:
    t = cubepool.tensor(np.arange(6, dtype=np.int32).reshape(2, 3))
    assert t.shape == (2, 3) and str(t.dtype) == "int32"
    np.testing.assert_array_equal(t.numpy(), np.arange(6).reshape(2, 3))
    with pytest.raises(cubepool.InvalidArgument):
        cubepool.tensor([object()])


def test_a_repeated_collective_is_sent_again_only_for_the_same_operands(
    sess: disco.Session,
) -> None:
    """The session keeps a checked collective to send it again (``Session._repeat``,
    keyed by the operands' ids); a new operand at a freed one's address, an option that
    is not a bool or an unhashable op are checked again, and a refused call leaves the
    session usable."""
    src = sess.broadcast(np.arange(3, dtype=np.float32))
    dst = sess.empty((12,), "float32")
    for _ in range(3):
        sess.allgather(src, dst)
        sess.allreduce(src, src, "max")
    np.testing.assert_array_equal(dst.debug_get_from_remote(2), np.tile(np.arange(3), 4))
    assert len(sess._kept) == 2
    key = ("runtime.disco.allgather", id(src), id(dst), True)
    kept = sess._kept[key]
    del dst
    # A new operand at the freed one's address (CPython reuses memory) finds the kept
    # entry under its key, as here; the entry's dead reference must send it to the checks.
    bad = sess.empty((13,), "float32")
    sess._kept[("runtime.disco.allgather", id(src), id(bad), True)] = kept
    with pytest.raises(cubepool.InvalidArgument, match="allgather"):
        sess.allgather(src, bad)
    with pytest.raises(cubepool.InvalidArgument, match="in_group must be a bool"):
        sess.allreduce(src, src, "max", in_group=1)  # equal to True as a key, not a bool
    with pytest.raises(cubepool.InvalidArgument, match="unknown reduce op"):
        sess.allreduce(src, src, ["max"])  # type: ignore[arg-type]  # unhashable
    dst = sess.empty((12,), "float32")
    sess.allgather(src, dst)
    np.testing.assert_array_equal(dst.debug_get_from_remote(0), np.tile(np.arange(3), 4))
    assert not sess.closed


def test_an_interrupted_send_ends_the_session_and_says_why(sess: disco.Session) -> None:
    """A KeyboardInterrupt while a command is sent may leave a cut frame on a channel: the
    session ends, saying so; an ordinary error before anything is written does not."""
    src = sess.broadcast(np.arange(4, dtype=np.float32))
    transport: Any = sess._transport
    real = transport.send_prepared

    def refuse(*args: Any) -> None:
        raise TypeError("cannot go")

    transport.send_prepared = refuse
    with pytest.raises(TypeError, match="cannot go"):
        sess.allreduce(src, src, "sum")
    assert not sess.closed

    def interrupted(*args: Any) -> None:
        transport.send_prepared = real
        raise KeyboardInterrupt

    transport.send_prepared = interrupted
    with pytest.raises(KeyboardInterrupt):
        sess.allreduce(src, src, "sum")
    assert sess.closed
    with pytest.raises(disco.SessionClosed, match="by KeyboardInterrupt while a command"):
        sess.sync_workers()


def test_an_argument_that_cannot_be_pickled_is_named_and_the_session_goes_on(
    sess: disco.Session,
) -> None:
    """Worker processes get a call's arguments pickled (their transport encodes each
    command with ``encode_command``, as this one is made to): an argument that does not
    pickle is refused on the controller as ``InvalidArgument``, naming the function, the
    argument's position and type, with pickle's error chained. Nothing was sent, so the
    session goes on, and a register freed before it is still freed by the next send."""
    transport: Any = sess._transport
    threads_prepare = transport.prepare

    def pickling(command: Command) -> Any:
        encode_command(command)  # what ProcessSession's transport sends
        return threads_prepare(command)

    transport.prepare = pickling
    worker_id = sess.get_global_func("runtime.disco.worker_id")
    kept = sess.broadcast(np.arange(4, dtype=np.float32))
    plain = worker_id()  # a register of no tensor: a value replaces what it holds
    freed = sess.empty((4,), "float32")
    freed_reg = freed.reg_id
    del freed  # its kill waits for the next send
    with pytest.raises(cubepool.InvalidArgument) as refused:
        worker_id(1, threading.Lock())
    message = str(refused.value)
    assert "'runtime.disco.worker_id'" in message
    assert "argument 2, a _thread.lock," in message
    assert isinstance(refused.value.__cause__, TypeError)
    assert "cannot pickle" in str(refused.value.__cause__)
    with pytest.raises(cubepool.InvalidArgument, match=r"argument 1 \(value\), a _thread\.lock"):
        plain.debug_copy_from(1, threading.Lock())
    assert freed_reg in sess._dead_registers  # not dropped by the refused sends
    assert not sess.closed
    assert worker_id().debug_get_from_remote(3) == 3
    assert freed_reg not in sess._dead_registers
    np.testing.assert_array_equal(kept.debug_get_from_remote(2), np.arange(4))
