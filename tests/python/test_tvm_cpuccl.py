"""A port of TVM's ``tests/python/disco/test_cpuccl.py`` (apache/tvm, added by
1230673345) to cubepool.disco.

Each test keeps TVM's steps and assertions, on TVM's session matrix (``ThreadedSession``,
``ProcessSession``, a two-node ``SocketSession``), each session made with
``build_ring=True`` and its collectives chosen with ``init_ccl("cpuccl", 0, 1)`` as TVM's
are. Adapted:

* ``tvm.runtime.disco`` -> ``cubepool.disco``; the session kinds are the factories of
  ``disco_tvm`` (sessions are shut down after each test, as TVM's ``finally`` does).
  ``create_socket_session`` starts the remote node with ``python -m
  cubepool.disco.remote`` (TVM: ``tvm.exec.disco_remote_socket_session``) and a session
  key, which TVM's sockets do not have.
* ``"cpuccl"`` is TVM's ring of host collectives; here it names each session's own host
  engine (MPI or threads), and ``runtime.disco.compiled_ccl`` returns it.
* ``test_mlp`` and ``test_attention`` compile Relax modules (TVM's compiler, which
  cubepool does not have): skipped with that reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np
import pytest
from disco_tvm import close_all, create_socket_session, process_session, threaded_session

from cubepool import disco as di

SessionKind = Callable[..., di.Session]
T = TypeVar("T")

_CCL = "cpuccl"
_all_session_kinds: list[SessionKind] = [threaded_session, process_session, create_socket_session]
_COMPILES = "compiles a Relax module with TVM's compiler, which cubepool does not have"


@pytest.fixture(autouse=True)
def _close_sessions() -> Iterator[None]:
    yield
    close_all()


def _session_id(session_kind: SessionKind) -> str:
    return session_kind.__name__


def _run_with_ccl_session(
    session_kind: SessionKind, devices: list[int], func: Callable[[di.Session], T]
) -> T:
    sess = session_kind(num_workers=len(devices), build_ring=True)
    try:
        sess.init_ccl(_CCL, *devices)
        return func(sess)
    finally:
        sess.shutdown()


def _numpy(value: Any) -> Any:
    return value.numpy()


def test_cpuccl_is_the_compiled_ccl() -> None:
    """What TVM's tests take as their CCL (``compiled_ccl()``) is this file's."""
    compiled_ccl = di.get_global_func("runtime.disco.compiled_ccl", allow_missing=True)
    assert compiled_ccl is not None
    assert compiled_ccl() == _CCL


@pytest.mark.parametrize("session_kind", _all_session_kinds, ids=_session_id)
def test_init(session_kind: SessionKind) -> None:
    devices = [0, 1]

    def run_test(sess: di.Session) -> None:
        assert sess.ccl == _CCL

    _run_with_ccl_session(session_kind, devices, run_test)


@pytest.mark.parametrize("session_kind", _all_session_kinds, ids=_session_id)
def test_allreduce(session_kind: SessionKind) -> None:
    devices = [0, 1]

    def run_test(sess: di.Session) -> None:
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

    _run_with_ccl_session(session_kind, devices, run_test)


@pytest.mark.parametrize("session_kind", _all_session_kinds, ids=_session_id)
def test_allgather(session_kind: SessionKind) -> None:
    devices = [0, 1]

    def run_test(sess: di.Session) -> None:
        array = np.arange(36, dtype="float32")
        d_src = sess.empty((3, 3, 2), "float32")
        d_dst = sess.empty((3, 4, 3), "float32")
        d_src.debug_copy_from(0, array[:18])
        d_src.debug_copy_from(1, array[18:])
        sess.allgather(d_src, d_dst)
        np.testing.assert_equal(_numpy(d_dst.debug_get_from_remote(0)), array.reshape(3, 4, 3))
        np.testing.assert_equal(_numpy(d_dst.debug_get_from_remote(1)), array.reshape(3, 4, 3))

    _run_with_ccl_session(session_kind, devices, run_test)


@pytest.mark.parametrize("session_kind", _all_session_kinds, ids=_session_id)
@pytest.mark.parametrize("use_explicit_output", [True, False])
def test_broadcast(session_kind: SessionKind, use_explicit_output: bool) -> None:
    devices = [0, 1]

    def run_test(sess: di.Session) -> None:
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

    _run_with_ccl_session(session_kind, devices, run_test)


@pytest.mark.parametrize("session_kind", _all_session_kinds, ids=_session_id)
@pytest.mark.parametrize("use_explicit_output", [True, False])
def test_scatter(session_kind: SessionKind, use_explicit_output: bool) -> None:
    devices = [0, 1]

    def run_test(sess: di.Session) -> None:
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

    _run_with_ccl_session(session_kind, devices, run_test)


@pytest.mark.parametrize("session_kind", _all_session_kinds, ids=_session_id)
def test_scatter_with_implicit_reshape(session_kind: SessionKind) -> None:
    devices = [0, 1]

    def run_test(sess: di.Session) -> None:
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

    _run_with_ccl_session(session_kind, devices, run_test)


@pytest.mark.parametrize("session_kind", _all_session_kinds, ids=_session_id)
def test_gather(session_kind: SessionKind) -> None:
    devices = [0, 1]

    def run_test(sess: di.Session) -> None:
        array = np.arange(36, dtype="float32")
        d_src = sess.empty((3, 3, 2), "float32")
        d_dst = sess.empty((3, 4, 3), "float32", worker0_only=True)
        d_src.debug_copy_from(0, array[:18])
        d_src.debug_copy_from(1, array[18:])
        sess.gather_to_worker0(d_src, d_dst)
        np.testing.assert_equal(_numpy(d_dst.debug_get_from_remote(0)), array.reshape(3, 4, 3))

    _run_with_ccl_session(session_kind, devices, run_test)


@pytest.mark.skip(reason=_COMPILES)
@pytest.mark.parametrize("session_kind", _all_session_kinds, ids=_session_id)
def test_mlp(session_kind: SessionKind) -> None:
    """TVM builds an MLP and its sharded version with ``tvm.compile`` and runs the latter
    through ``sess.load_vm_module``."""


@pytest.mark.skip(reason=_COMPILES)
@pytest.mark.parametrize("session_kind", _all_session_kinds, ids=_session_id)
def test_attention(session_kind: SessionKind) -> None:
    """TVM builds an attention block and its sharded version with ``tvm.compile`` and runs
    the latter through ``sess.load_vm_module``."""
