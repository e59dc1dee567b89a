"""A port of TVM's ``tests/python/disco/test_ccl.py`` (apache/tvm) to cubepool.disco.

Each test keeps TVM's steps and assertions; the session matrix is TVM's
(``ThreadedSession``, ``ProcessSession``). Adapted:

* ``tvm.runtime.disco`` -> ``cubepool.disco``; the session kinds are the factories of
  ``disco_tvm`` (their workers import ``disco_helpers``; sessions are shut down after
  each test). TVM's CCL test functions (``runtime.disco.<ccl>.test_*``) are cubepool's
  own, as they are TVM's CCL library's.
* TVM parametrizes over the one CCL it was compiled with
  (``runtime.disco.compiled_ccl``: ``"nccl"`` or ``"rccl"``); here ``ccl`` is each
  session kind's own engine by its own name, ``available_ccls[0]`` (``"threads"`` or
  ``"mpi"``), and ``init_ccl`` is called with it exactly as TVM does. cubepool's
  ``compiled_ccl()`` is ``"cpuccl"``, TVM's name for those engines: the tests with that
  name are ``test_tvm_cpuccl.py``'s.
* ``debug_get_from_remote(i).numpy()`` -> ``np.asarray(...)``.
* ``test_mlp`` and ``test_attention`` compile Relax modules (TVM's compiler, which
  cubepool does not have): skipped with that reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from disco_tvm import close_all, process_session, threaded_session

from cubepool import disco as di

SessionKind = Callable[..., di.Session]

_all_session_kinds: list[SessionKind] = [threaded_session, process_session]
_CCL = {threaded_session: di.ThreadedSession.available_ccls[0]}
_CCL[process_session] = di.ProcessSession.available_ccls[0]
_COMPILES = "compiles a Relax module with TVM's compiler, which cubepool does not have"


@pytest.fixture(autouse=True)
def _close_sessions() -> Iterator[None]:
    yield
    close_all()


def _numpy(value: Any) -> Any:
    return np.asarray(value)


@pytest.mark.parametrize("session_kind", _all_session_kinds)
def test_init(session_kind: SessionKind) -> None:
    ccl = _CCL[session_kind]
    devices = [0, 1]
    sess = session_kind(num_workers=len(devices))
    sess.init_ccl(ccl, *devices)


@pytest.mark.parametrize("session_kind", _all_session_kinds)
def test_allreduce(session_kind: SessionKind) -> None:
    ccl = _CCL[session_kind]
    devices = [0, 1]
    sess = session_kind(num_workers=len(devices))
    sess.init_ccl(ccl, *devices)

    array_1 = np.arange(12, dtype="float32").reshape(3, 4)
    array_2 = np.arange(start=1, stop=-11, step=-1, dtype="float32").reshape(3, 4)
    d_array = sess.empty((3, 4), "float32")
    d_array.debug_copy_from(0, array_1)
    d_array.debug_copy_from(1, array_2)
    for op, np_op in [
        ("sum", np.add),
        ("prod", np.multiply),
        ("min", np.minimum),
        ("max", np.maximum),
        ("avg", lambda a, b: (a + b) * 0.5),
    ]:
        dst_array = sess.empty((3, 4), "float32")
        sess.allreduce(d_array, dst_array, op=op)
        result = _numpy(dst_array.debug_get_from_remote(0))
        expected = np_op(array_1, array_2)
        np.testing.assert_equal(result, expected)


@pytest.mark.parametrize("session_kind", _all_session_kinds)
def test_group_allreduce(session_kind: SessionKind) -> None:
    ccl = _CCL[session_kind]
    devices = [0, 1, 2, 3]
    sess = session_kind(num_workers=len(devices), num_groups=2)
    sess.init_ccl(ccl, *devices)

    array_1 = np.arange(12, dtype="float32").reshape(3, 4)
    array_2 = np.arange(start=1, stop=-11, step=-1, dtype="float32").reshape(3, 4)
    array_3 = np.arange(30, dtype="float32").reshape(5, 6)
    array_4 = np.arange(start=1, stop=-29, step=-1, dtype="float32").reshape(5, 6)
    d_array_1 = sess.empty((3, 4), "float32")
    d_array_2 = sess.empty((5, 6), "float32")
    d_array_1.debug_copy_from(0, array_1)
    d_array_1.debug_copy_from(1, array_2)
    d_array_2.debug_copy_from(2, array_3)
    d_array_2.debug_copy_from(3, array_4)
    for op, np_op in [
        ("sum", np.add),
        ("prod", np.multiply),
        ("min", np.minimum),
        ("max", np.maximum),
        ("avg", lambda a, b: (a + b) * 0.5),
    ]:
        dst_array_1 = sess.empty((3, 4), "float32")
        dst_array_2 = sess.empty((5, 6), "float32")
        sess.allreduce(d_array_1, dst_array_1, op=op, in_group=True)
        sess.allreduce(d_array_2, dst_array_2, op=op, in_group=True)
        result_1 = _numpy(dst_array_1.debug_get_from_remote(0))
        result_2 = _numpy(dst_array_2.debug_get_from_remote(2))
        expected_1 = np_op(array_1, array_2)
        expected_2 = np_op(array_3, array_4)
        np.testing.assert_equal(result_1, expected_1)
        np.testing.assert_equal(result_2, expected_2)


@pytest.mark.parametrize("session_kind", _all_session_kinds)
def test_allgather(session_kind: SessionKind) -> None:
    ccl = _CCL[session_kind]
    devices = [0, 1]
    sess = session_kind(num_workers=len(devices))
    sess.init_ccl(ccl, *devices)

    array = np.arange(36, dtype="float32")
    d_src = sess.empty((3, 3, 2), "float32")
    d_dst = sess.empty((3, 4, 3), "float32")
    d_src.debug_copy_from(0, array[:18])
    d_src.debug_copy_from(1, array[18:])
    sess.allgather(d_src, d_dst)
    np.testing.assert_equal(_numpy(d_dst.debug_get_from_remote(0)), array.reshape(3, 4, 3))
    np.testing.assert_equal(_numpy(d_dst.debug_get_from_remote(1)), array.reshape(3, 4, 3))


@pytest.mark.parametrize("session_kind", _all_session_kinds)
def test_group_allgather(session_kind: SessionKind) -> None:
    ccl = _CCL[session_kind]
    devices = [0, 1, 2, 3]
    sess = session_kind(num_workers=len(devices), num_groups=2)
    sess.init_ccl(ccl, *devices)

    array_1 = np.arange(36, dtype="float32")
    array_2 = np.arange(48, dtype="float32")
    d_src_1 = sess.empty((3, 3, 2), "float32")
    d_dst_1 = sess.empty((3, 4, 3), "float32")
    d_src_2 = sess.empty((2, 4, 3), "float32")
    d_dst_2 = sess.empty((2, 6, 4), "float32")
    d_src_1.debug_copy_from(0, array_1[:18])
    d_src_1.debug_copy_from(1, array_1[18:])
    d_src_2.debug_copy_from(2, array_2[:24])
    d_src_2.debug_copy_from(3, array_2[24:])
    sess.allgather(d_src_1, d_dst_1, in_group=True)
    sess.allgather(d_src_2, d_dst_2, in_group=True)
    np.testing.assert_equal(_numpy(d_dst_1.debug_get_from_remote(0)), array_1.reshape(3, 4, 3))
    np.testing.assert_equal(_numpy(d_dst_1.debug_get_from_remote(1)), array_1.reshape(3, 4, 3))
    np.testing.assert_equal(_numpy(d_dst_2.debug_get_from_remote(2)), array_2.reshape(2, 6, 4))
    np.testing.assert_equal(_numpy(d_dst_2.debug_get_from_remote(3)), array_2.reshape(2, 6, 4))


@pytest.mark.parametrize("session_kind", _all_session_kinds)
@pytest.mark.parametrize("use_explicit_output", [True, False])
def test_broadcast(session_kind: SessionKind, use_explicit_output: bool) -> None:
    ccl = _CCL[session_kind]
    devices = [0, 1]
    sess = session_kind(num_workers=len(devices))
    sess.init_ccl(ccl, *devices)

    array = np.arange(12, dtype="float32").reshape(3, 4)

    if use_explicit_output:
        src_array = sess.empty((3, 4), "float32", worker0_only=True)
        src_array.debug_copy_from(0, array)
        dst_array = sess.empty((3, 4), "float32")
        sess.broadcast_from_worker0(src_array, dst_array)
    else:
        dst_array = sess.broadcast(array)

    result = _numpy(dst_array.debug_get_from_remote(1))
    np.testing.assert_equal(result, array)


@pytest.mark.parametrize("session_kind", _all_session_kinds)
def test_group_broadcast(session_kind: SessionKind) -> None:
    ccl = _CCL[session_kind]
    devices = [0, 1, 2, 3]
    sess = session_kind(num_workers=len(devices), num_groups=2)
    sess.init_ccl(ccl, *devices)

    array_1 = np.arange(12, dtype="float32").reshape(3, 4)
    array_2 = np.multiply(array_1, -1)

    src_array = sess.empty((3, 4), "float32", worker0_only=True, in_group=True)
    src_array.debug_copy_from(0, array_1)
    src_array.debug_copy_from(2, array_2)
    dst_array = sess.empty((3, 4), "float32")
    sess.broadcast_from_worker0(src_array, dst_array)

    result_1 = _numpy(dst_array.debug_get_from_remote(1))
    np.testing.assert_equal(result_1, array_1)

    result_3 = _numpy(dst_array.debug_get_from_remote(3))
    np.testing.assert_equal(result_3, array_2)


@pytest.mark.parametrize("session_kind", _all_session_kinds)
@pytest.mark.parametrize("use_explicit_output", [True, False])
def test_scatter(
    session_kind: SessionKind, use_explicit_output: bool, capfd: pytest.CaptureFixture[str]
) -> None:
    ccl = _CCL[session_kind]
    devices = [0, 1]
    sess = session_kind(num_workers=len(devices))
    sess.init_ccl(ccl, *devices)

    array = np.arange(36, dtype="float32").reshape(2, 6, 3)

    if use_explicit_output:
        d_src = sess.empty((2, 6, 3), "float32", worker0_only=True)
        d_dst = sess.empty((6, 3), "float32")
        d_src.debug_copy_from(0, array)
        sess.scatter_from_worker0(d_src, d_dst)
    else:
        d_dst = sess.scatter(array)

    np.testing.assert_equal(_numpy(d_dst.debug_get_from_remote(0)), array[0, :, :])
    np.testing.assert_equal(_numpy(d_dst.debug_get_from_remote(1)), array[1, :, :])

    captured = capfd.readouterr()
    assert not captured.err, (
        "No warning messages should be generated from disco.Session.scatter_from_worker0"
    )


@pytest.mark.parametrize("session_kind", _all_session_kinds)
def test_group_scatter(session_kind: SessionKind, capfd: pytest.CaptureFixture[str]) -> None:
    ccl = _CCL[session_kind]
    devices = [0, 1, 2, 3]
    sess = session_kind(num_workers=len(devices), num_groups=2)
    sess.init_ccl(ccl, *devices)

    array_1 = np.arange(36, dtype="float32").reshape(2, 6, 3)
    array_2 = np.multiply(array_1, -1)

    d_src = sess.empty((2, 6, 3), "float32", worker0_only=True, in_group=True)
    d_src.debug_copy_from(0, array_1)
    d_src.debug_copy_from(2, array_2)
    d_dst = sess.empty((6, 3), "float32")
    sess.scatter_from_worker0(d_src, d_dst)

    np.testing.assert_equal(_numpy(d_dst.debug_get_from_remote(0)), array_1[0, :, :])
    np.testing.assert_equal(_numpy(d_dst.debug_get_from_remote(1)), array_1[1, :, :])
    np.testing.assert_equal(_numpy(d_dst.debug_get_from_remote(2)), array_2[0, :, :])
    np.testing.assert_equal(_numpy(d_dst.debug_get_from_remote(3)), array_2[1, :, :])

    captured = capfd.readouterr()
    assert not captured.err, (
        "No warning messages should be generated from disco.Session.scatter_from_worker0"
    )


@pytest.mark.parametrize("session_kind", _all_session_kinds)
def test_scatter_with_implicit_reshape(
    session_kind: SessionKind, capfd: pytest.CaptureFixture[str]
) -> None:
    """Scatter may perform an implicit reshape (TVM's docstring): the 2 workers do not
    divide the outermost dimension (3), but they divide the element count; allowed for
    ``scatter_from_worker0``, not for ``scatter`` (which allocates)."""
    ccl = _CCL[session_kind]
    devices = [0, 1]
    sess = session_kind(num_workers=len(devices))
    sess.init_ccl(ccl, *devices)

    array = np.arange(36, dtype="float32").reshape(3, 4, 3)

    d_src = sess.empty((3, 4, 3), "float32", worker0_only=True)
    d_dst = sess.empty((3, 3, 2), "float32")
    d_src.debug_copy_from(0, array)
    sess.scatter_from_worker0(d_src, d_dst)

    np.testing.assert_equal(
        _numpy(d_dst.debug_get_from_remote(0)), array.flat[:18].reshape(3, 3, 2)
    )
    np.testing.assert_equal(
        _numpy(d_dst.debug_get_from_remote(1)), array.flat[18:].reshape(3, 3, 2)
    )

    captured = capfd.readouterr()
    assert not captured.err, (
        "No warning messages should be generated from disco.Session.scatter_from_worker0"
    )


@pytest.mark.parametrize("session_kind", _all_session_kinds)
def test_gather(session_kind: SessionKind, capfd: pytest.CaptureFixture[str]) -> None:
    ccl = _CCL[session_kind]
    devices = [0, 1]
    sess = session_kind(num_workers=len(devices))
    sess.init_ccl(ccl, *devices)

    array = np.arange(36, dtype="float32")
    d_src = sess.empty((3, 3, 2), "float32")
    d_dst = sess.empty((3, 4, 3), "float32", worker0_only=True)
    d_src.debug_copy_from(0, array[:18])
    d_src.debug_copy_from(1, array[18:])
    sess.gather_to_worker0(d_src, d_dst)
    np.testing.assert_equal(_numpy(d_dst.debug_get_from_remote(0)), array.reshape(3, 4, 3))

    captured = capfd.readouterr()
    assert not captured.err, (
        "No warning messages should be generated from disco.Session.gather_to_worker0"
    )


@pytest.mark.parametrize("session_kind", _all_session_kinds)
def test_group_gather(session_kind: SessionKind, capfd: pytest.CaptureFixture[str]) -> None:
    ccl = _CCL[session_kind]
    devices = [0, 1, 2, 3]
    sess = session_kind(num_workers=len(devices), num_groups=2)
    sess.init_ccl(ccl, *devices)

    array_1 = np.arange(36, dtype="float32")
    array_2 = np.multiply(array_1, -1)
    d_src = sess.empty((3, 3, 2), "float32")
    d_dst = sess.empty((3, 4, 3), "float32", worker0_only=True, in_group=True)
    d_src.debug_copy_from(0, array_1[:18])
    d_src.debug_copy_from(1, array_1[18:])
    d_src.debug_copy_from(2, array_2[:18])
    d_src.debug_copy_from(3, array_2[18:])
    sess.gather_to_worker0(d_src, d_dst)
    np.testing.assert_equal(_numpy(d_dst.debug_get_from_remote(0)), array_1.reshape(3, 4, 3))
    np.testing.assert_equal(_numpy(d_dst.debug_get_from_remote(2)), array_2.reshape(3, 4, 3))

    captured = capfd.readouterr()
    assert not captured.err, (
        "No warning messages should be generated from disco.Session.gather_to_worker0"
    )


@pytest.mark.parametrize("session_kind", _all_session_kinds)
def test_send_to_next_group_receive_from_prev_group(session_kind: SessionKind) -> None:
    ccl = _CCL[session_kind]
    devices = [0, 1, 2, 3]
    sess = session_kind(num_workers=len(devices), num_groups=2)
    sess.init_ccl(ccl, *devices)

    array_1 = np.arange(12, dtype="float32").reshape(3, 4)
    array_2 = np.arange(start=1, stop=-11, step=-1, dtype="float32").reshape(3, 4)
    d_array = sess.empty((3, 4), "float32")
    d_array.debug_copy_from(0, array_1)
    d_array.debug_copy_from(1, array_2)
    sess.get_global_func("runtime.disco." + ccl + ".test_send_to_next_group_recv_from_prev_group")(
        d_array
    )

    result_1 = _numpy(d_array.debug_get_from_remote(2))
    result_2 = _numpy(d_array.debug_get_from_remote(3))
    np.testing.assert_equal(result_1, array_1)
    np.testing.assert_equal(result_2, array_2)


@pytest.mark.parametrize("session_kind", _all_session_kinds)
def test_worker2_send_to_worker0(session_kind: SessionKind) -> None:
    ccl = _CCL[session_kind]
    devices = [0, 1, 2, 3]
    sess = session_kind(num_workers=len(devices), num_groups=2)
    sess.init_ccl(ccl, *devices)

    array = np.arange(start=1, stop=-11, step=-1, dtype="float32").reshape(3, 4)
    d_array = sess.empty((3, 4), "float32")
    d_array.debug_copy_from(2, array)
    sess.get_global_func("runtime.disco." + ccl + ".test_worker2_sends_to_worker0")(d_array)

    result = _numpy(d_array.debug_get_from_remote(0))
    np.testing.assert_equal(result, array)


@pytest.mark.skip(reason=_COMPILES)
@pytest.mark.parametrize("session_kind", _all_session_kinds)
def test_mlp(session_kind: SessionKind) -> None:
    """TVM builds an MLP and its sharded form (broadcast, then allreduce) with Relax."""


@pytest.mark.skip(reason=_COMPILES)
@pytest.mark.parametrize("session_kind", _all_session_kinds)
def test_attention(session_kind: SessionKind) -> None:
    """TVM builds attention and its sharded form (broadcast, then allreduce) with Relax."""
