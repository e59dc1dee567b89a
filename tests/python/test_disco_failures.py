"""cubepool.disco failures: a killed worker, a timeout, a worker stuck in a collective after
a peer failed, interpreter exit; none leaves a process or a thread behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from disco_procs import alive, wait_gone

from cubepool import disco
from cubepool.disco.session import FORCED_JOIN

TESTS = Path(__file__).parent


def process_session(num_workers: int, **options: float) -> disco.ProcessSession:
    """A process session whose workers can import the tests' helper module."""
    with pytest.MonkeyPatch.context() as patch:
        path = os.pathsep.join(p for p in [str(TESTS), os.environ.get("PYTHONPATH")] if p)
        patch.setenv("PYTHONPATH", path)
        session = disco.ProcessSession(num_workers, **options)  # type: ignore[arg-type]
    session.import_python_module("disco_helpers")
    return session


def all_processes(session: disco.ProcessSession) -> list[int]:
    """The launcher's and every worker's pid."""
    return [session.launcher_pid, *session.worker_pids]


def test_killed_worker_ends_the_session_with_a_clear_error() -> None:
    with process_session(4, timeout=20) as session:
        pids = all_processes(session)
        session.sync_workers()
        os.kill(session.worker_pids[2], signal.SIGKILL)
        # Found dead, not waited for: a wait past the timeout would be DiscoTimeout.
        with pytest.raises(disco.WorkerDied, match="died") as info:
            for _ in range(100):
                session.sync_workers()
                time.sleep(0.05)
        assert "the session is shut down" in str(info.value)
        assert session.closed
        with pytest.raises(disco.SessionClosed):
            session.sync_worker_0()
    assert wait_gone(pids) == []


def test_wait_past_the_timeout_shuts_the_session_down() -> None:
    session = process_session(2, timeout=1.0)
    pids = all_processes(session)
    session.get_global_func("tests.disco.sleep")(30.0)
    with pytest.raises(disco.DiscoTimeout, match=r"within 1\.0 s") as info:
        session.sync_worker_0()
    assert info.value.worker_ids == [0]
    assert isinstance(info.value, TimeoutError)
    assert session.closed
    assert wait_gone(pids) == []


def test_worker_stuck_in_a_collective_after_a_peer_failed() -> None:
    session = process_session(4, timeout=20, failure_grace=0.5)
    pids = all_processes(session)
    src = session.empty((8,), "float32")
    dst = session.empty((8,), "float32")
    session.get_global_func("tests.disco.fail_then_allreduce")(1, src, dst)
    with pytest.raises(disco.WorkerError, match="failed before the collective") as info:
        session.sync_workers()
    assert info.value.worker_id == 1 and info.value.session_closed
    assert "the session was shut down" in str(info.value)
    assert session.closed
    assert wait_gone(pids) == []


def test_threads_stuck_in_a_collective_are_released() -> None:
    session = disco.ThreadedSession(4, timeout=20, failure_grace=0.5)
    session.import_python_module("disco_helpers")
    src = session.empty((8,), "float32")
    dst = session.empty((8,), "float32")
    session.get_global_func("tests.disco.fail_then_allreduce")(3, src, dst)
    with pytest.raises(disco.WorkerError, match="failed before the collective") as info:
        session.sync_workers()
    assert info.value.session_closed
    assert not any(thread.is_alive() for thread in session.worker_threads)


@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_a_wait_on_worker_0_alone_sees_the_others_stuck_after_its_failure(kind: str) -> None:
    # Worker 0 fails before a collective the others enter. sync_worker_0 reported its
    # error and left the session open; the next wait then ran to the whole timeout.
    # The others are now asked to sync within failure_grace, and found stuck.
    if kind == "threads":
        session: disco.Session = disco.ThreadedSession(4, timeout=60, failure_grace=0.5)
        session.import_python_module("disco_helpers")
    else:
        session = process_session(4, timeout=60, failure_grace=0.5)
    src = session.empty((8,), "float32")
    dst = session.empty((8,), "float32")
    session.get_global_func("tests.disco.fail_then_allreduce")(0, src, dst)
    with pytest.raises(disco.WorkerError, match="failed before the collective") as info:
        session.sync_worker_0()
    assert info.value.worker_id == 0 and info.value.session_closed
    assert "did not sync within failure_grace" in info.value.closed_because
    assert session.closed


def test_a_failure_the_others_did_not_share_leaves_the_session_open() -> None:
    session = disco.ThreadedSession(2, timeout=20, failure_grace=0.5)
    session.import_python_module("disco_helpers")
    session.get_global_func("tests.disco.raise_on")(0, "worker 0 alone")
    with pytest.raises(disco.WorkerError, match="worker 0 alone") as info:
        session.sync_worker_0()
    assert not info.value.session_closed and not session.closed
    session.sync_workers()
    session.shutdown()


def test_shutdown_is_idempotent_and_leaves_nothing() -> None:
    session = process_session(2)
    pids = all_processes(session)
    ref = session.broadcast(np.arange(4, dtype=np.int32))
    session.shutdown()
    session.shutdown()
    del ref  # freeing a DRef of a closed session is harmless
    assert wait_gone(pids) == []
    threaded = disco.ThreadedSession(2)
    threaded.shutdown()
    assert not any(thread.is_alive() for thread in threaded.worker_threads)


def test_interpreter_exit_leaves_no_process() -> None:
    script = textwrap.dedent(
        """
        from cubepool import disco
        session = disco.ProcessSession(2)
        print(session.launcher_pid, *session.worker_pids, flush=True)
        # no shutdown: interpreter exit must stop the workers
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    pids = [int(word) for word in done.stdout.split()]
    assert len(pids) == 3
    assert wait_gone(pids) == []


def test_workers_end_when_the_controller_is_killed() -> None:
    script = textwrap.dedent(
        """
        import time
        from cubepool import disco
        session = disco.ProcessSession(2)
        session.import_python_module("disco_helpers")
        buffer = session.empty((4,), "float32")
        session.get_global_func("tests.disco.block_forever")(buffer)  # worker 0 stuck in MPI
        print(session.launcher_pid, *session.worker_pids, flush=True)
        time.sleep(600)
        """
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(TESTS), env.get("PYTHONPATH")] if p)
    controller = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert controller.stdout is not None
        pids = [int(word) for word in controller.stdout.readline().split()]
        assert len(pids) == 3
        time.sleep(0.5)  # worker 0 is now inside MPI_Recv
    finally:
        controller.kill()  # no interpreter exit: the workers must notice by themselves
        controller.wait()
        if controller.stdout is not None:
            controller.stdout.close()
    assert wait_gone(pids, timeout=30) == []


def test_a_missing_or_failing_launcher_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(disco.MPIUnavailable, match="cannot start"):
        disco.ProcessSession(2, mpiexec=str(tmp_path / "no-mpiexec"), startup_timeout=5)
    with pytest.raises(disco.DiscoError, match="mpiexec exited with status 1 before"):
        disco.ProcessSession(2, mpiexec="false", startup_timeout=5)


def test_shape_of_the_session_is_checked() -> None:
    with pytest.raises(ValueError, match=r"num_workers \(3\) must be a positive multiple"):
        disco.ThreadedSession(3, 2)
    with pytest.raises(ValueError, match="num_workers must be at least 1"):
        disco.ProcessSession(0)


def test_alive_sees_this_process() -> None:
    assert alive(os.getpid())


def test_threaded_shutdown_after_hung_workers_takes_one_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every worker hangs in its own code: the wait ends at the timeout, and closing joins
    the threads against one short deadline and abandons them, instead of waiting the
    timeout for each thread in turn (which took 1 + 4 timeouts here)."""
    waited: list[float] = []
    real_join = threading.Thread.join

    def recording_join(thread: threading.Thread, timeout: float | None = None) -> None:
        if thread.name.startswith("disco-worker-"):
            assert timeout is not None, "a worker thread was joined without a deadline"
            waited.append(timeout)
        real_join(thread, timeout)

    monkeypatch.setattr(threading.Thread, "join", recording_join)
    release = threading.Event()
    disco.register_func("tests.disco.hang", lambda: release.wait(60), override=True)
    timeout = 2.0
    session = disco.ThreadedSession(4, timeout=timeout)
    try:
        session.get_global_func("tests.disco.hang")()
        started = time.monotonic()
        with pytest.raises(disco.DiscoTimeout):
            session.sync_workers()
        session.shutdown()
        elapsed = time.monotonic() - started
        assert session.closed
        assert all(thread.is_alive() for thread in session.worker_threads)  # abandoned
        # Two rounds against one deadline each: about 2 x FORCED_JOIN in all.
        assert sum(waited) <= 2 * FORCED_JOIN + 0.2, waited
        assert elapsed < 3 * timeout, elapsed
    finally:
        release.set()
    for thread in session.worker_threads:
        real_join(thread, 10)
    assert not any(thread.is_alive() for thread in session.worker_threads)
