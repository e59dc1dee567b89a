"""TVM's Disco calls that cubepool's API takes as TVM's tests write them: the controller's
``runtime.disco.compiled_ccl``, ``ProcessSession``'s positional order and its
``entrypoint`` (TVM's default stands for cubepool's worker with TVM's ``tests.disco.*``
functions, :mod:`cubepool.disco.testing`), and TVM's worker module imported by name."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import cubepool
from cubepool import disco
from cubepool.disco import process

TESTS = Path(__file__).parent


@pytest.fixture
def helpers_on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Worker processes find the tests' modules (``disco_helpers``)."""
    path = os.pathsep.join(p for p in [str(TESTS), os.environ.get("PYTHONPATH")] if p)
    monkeypatch.setenv("PYTHONPATH", path)
    yield


def test_compiled_ccl_is_registered_on_the_controller() -> None:
    """TVM's test_ccl.py skips unless the controller has it, then runs
    ``init_ccl(compiled_ccl(), ...)``; test_loader.py skips unless it is ``"nccl"``."""
    compiled_ccl = disco.get_global_func("runtime.disco.compiled_ccl", allow_missing=True)
    assert compiled_ccl is not None
    assert compiled_ccl() == "cpuccl"
    for kind in (disco.ThreadedSession, disco.ProcessSession, disco.SocketSession):
        assert compiled_ccl() in kind.available_ccls
    with disco.ThreadedSession(4, 2, timeout=30) as sess:
        sess.init_ccl(compiled_ccl(), 0, 1, 2, 3)
        # TVM's CCL test functions are registered under the compiled CCL's name.
        array = np.arange(3, dtype="float32")
        d_array = sess.empty((3,), "float32")
        d_array.debug_copy_from(2, array)
        sess.get_global_func(f"runtime.disco.{compiled_ccl()}.test_worker2_sends_to_worker0")(
            d_array
        )
        np.testing.assert_equal(d_array.debug_get_from_remote(0).numpy(), array)
        # ... and workers have it as the controller does.
        names = sess.get_global_func("runtime.disco.compiled_ccl")()
        assert names.debug_get_from_remote(3) == "cpuccl"


def test_a_process_session_takes_tvms_positional_order() -> None:
    """``ProcessSession(num_workers, num_groups, entrypoint, build_ring)``: TVM's order
    was refused (``TypeError``: too many positional arguments); TVM's default entrypoint
    gives the workers TVM's ``tests.disco.*`` functions, as TVM's worker module does."""
    with disco.ProcessSession(2, 1, "tvm.exec.disco_worker", True, timeout=30) as sess:
        result = sess.get_global_func("tests.disco.add_one")(1)
        assert [result.debug_get_from_remote(i) for i in range(2)] == [2, 2]
    with disco.ProcessSession(num_workers=2, timeout=30) as sess:  # TVM's default
        suffixed = sess.get_global_func("tests.disco.str")("hello")
        assert suffixed.debug_get_from_remote(1) == "hello_suffix"


def test_cubepools_own_entrypoint_imports_nothing_more() -> None:
    with disco.ProcessSession(2, entrypoint="cubepool.disco", timeout=30) as sess:
        with pytest.raises(cubepool.NotFound, match=r"tests\.disco\.add_one"):
            sess.get_global_func("tests.disco.add_one")
        ids = sess.get_global_func("runtime.disco.worker_id")()
        assert [ids.debug_get_from_remote(i) for i in range(2)] == [0, 1]


@pytest.mark.usefixtures("helpers_on_path")
def test_an_entrypoint_module_is_imported_on_every_worker_at_start() -> None:
    with disco.ProcessSession(2, 1, "disco_helpers", timeout=30) as sess:
        pids = sess.get_global_func("tests.disco.pid")()
        assert [pids.debug_get_from_remote(i) for i in range(2)] == sess.worker_pids


def test_an_entrypoint_the_workers_cannot_import_ends_the_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[disco.Session] = []
    original = process._MPISession._import_at_start

    def keep(self: process._MPISession, module: str | None, what: str) -> None:
        made.append(self)
        original(self, module, what)

    monkeypatch.setattr(process._MPISession, "_import_at_start", keep)
    with pytest.raises(
        cubepool.InvalidArgument,
        match=r"entrypoint 'no_such_module_of_cubepool': worker \d cannot import "
        "'no_such_module_of_cubepool': builtins.ModuleNotFoundError",
    ):
        disco.ProcessSession(2, entrypoint="no_such_module_of_cubepool", timeout=30)
    assert len(made) == 1 and made[0].closed


@pytest.mark.parametrize("entrypoint", ["", "a b", "pkg..mod", "-m", 3, None])
def test_an_entrypoint_that_is_no_module_name_is_refused_before_starting(
    monkeypatch: pytest.MonkeyPatch, entrypoint: object
) -> None:
    def no_launch(*_: object, **__: object) -> None:
        raise AssertionError("mpiexec was started for a session with a bad entrypoint")

    monkeypatch.setattr(process, "start_mpiexec", no_launch)
    with pytest.raises(cubepool.InvalidArgument, match="entrypoint must be a module name"):
        disco.ProcessSession(2, entrypoint=entrypoint)  # type: ignore[arg-type]
    with pytest.raises(cubepool.InvalidArgument, match="entrypoint must be a module name"):
        disco.SocketSession(1, 2, entrypoint=entrypoint)  # type: ignore[arg-type]


def test_tvms_worker_module_is_imported_by_its_name() -> None:
    """TVM's test_callback.py runs ``import_python_module("tvm.exec.disco_worker")``;
    for a ThreadedSession TVM's test_session.py imports that module on the controller,
    which is :mod:`cubepool.disco.testing` here."""
    with disco.ThreadedSession(2, timeout=30) as sess:
        sess.import_python_module("tvm.exec.disco_worker")
        shape = sess.get_global_func("tests.disco.shape_tuple")((1, 2, 3))
        assert shape.debug_get_from_remote(1) == (1, 2, 3, 4, 5)
        device = sess.get_global_func("runtime.disco.device")()
        fget_item = sess.get_global_func("tests.disco.test_callback")(device)
        # The callback stays on the workers (it cannot travel), and gives TVM's arrays.
        loaded = sess.call_packed(fget_item, "B", 1)
        np.testing.assert_equal(
            loaded.debug_get_from_remote(1).numpy(), np.arange(4, dtype="float32").reshape(2, 2)
        )
        with pytest.raises(disco.WorkerError, match="Unexpected index 2"):
            sess.call_packed(fget_item, "C", 2)
            sess.sync_workers()
