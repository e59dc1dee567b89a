"""What a Disco session leaves behind when it cannot start or is built with bad options:
a typed error before anything starts, and no process, socket, folder or thread after it."""

from __future__ import annotations

import gc
import json
import mmap
import os
import signal
import subprocess
import sys
import tempfile
import threading
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from disco_procs import wait_gone

import cubepool
from cubepool import disco
from cubepool.disco import process, session
from cubepool.disco import segments as segments_module

#: Options no session takes: each is refused as ``InvalidArgument`` naming the option.
BAD_OPTIONS: list[tuple[tuple[Any, ...], dict[str, Any], str]] = [
    ((2.0,), {}, "num_workers must be an int"),
    (("2",), {}, "num_workers must be an int"),
    ((True,), {}, "num_workers must be an int"),
    ((2, 1.0), {}, "num_groups must be an int"),
    ((2,), {"timeout": float("nan")}, "timeout must be more than 0"),
    ((2,), {"timeout": "1"}, "timeout must be a number"),
    ((2,), {"timeout": 0}, "timeout must be more than 0"),
    ((2,), {"timeout": -1.0}, "timeout must be more than 0"),
    ((2,), {"timeout": float("inf")}, "timeout must be at most"),
    ((2,), {"timeout": 1e30}, "timeout must be at most"),
    ((2,), {"failure_grace": float("nan")}, "failure_grace must be 0 or more"),
    ((2,), {"failure_grace": -1}, "failure_grace must be 0 or more"),
    ((2,), {"failure_grace": None}, "failure_grace must be a number"),
]


@pytest.mark.parametrize(("args", "options", "message"), BAD_OPTIONS)
def test_a_process_session_refuses_bad_options_before_starting_anything(
    monkeypatch: pytest.MonkeyPatch, args: tuple[Any, ...], options: dict[str, Any], message: str
) -> None:
    """``ProcessSession(2.0)`` started mpiexec and its workers, then raised ``TypeError``
    before the session could stop them (they stayed until the interpreter exited); a
    NaN, string or huge timeout raised ``ValueError``, ``TypeError`` or ``OverflowError``
    once the workers had started."""

    def no_launch(*_: object, **__: object) -> None:
        raise AssertionError("mpiexec was started for a session with bad options")

    monkeypatch.setattr(process, "start_mpiexec", no_launch)
    with pytest.raises(cubepool.InvalidArgument, match=message):
        disco.ProcessSession(*args, **options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startup_timeout": float("nan")}, "startup_timeout must be more than 0"),
        ({"startup_timeout": 0}, "startup_timeout must be more than 0"),
        ({"startup_timeout": "60"}, "startup_timeout must be a number"),
    ],
)
def test_a_nan_or_empty_startup_timeout_is_refused(
    monkeypatch: pytest.MonkeyPatch, options: dict[str, Any], message: str
) -> None:
    """A NaN ``startup_timeout`` was taken, and a start that never completed waited
    forever (no time is ``>=`` NaN)."""

    def no_launch(*_: object, **__: object) -> None:
        raise AssertionError("mpiexec was started for a session with bad options")

    monkeypatch.setattr(process, "start_mpiexec", no_launch)
    with pytest.raises(cubepool.InvalidArgument, match=message):
        disco.ProcessSession(2, **options)
    with pytest.raises(cubepool.InvalidArgument, match=message):
        disco.SocketSession(1, 2, key=bytes(32), **options)


@pytest.mark.parametrize(("args", "options", "message"), BAD_OPTIONS)
def test_a_threaded_session_refuses_bad_options_before_starting_a_thread(
    args: tuple[Any, ...], options: dict[str, Any], message: str
) -> None:
    before = set(threading.enumerate())
    with pytest.raises(cubepool.InvalidArgument, match=message):
        disco.ThreadedSession(*args, **options)
    assert set(threading.enumerate()) <= before


def test_numpy_counts_and_times_are_taken_as_ints_and_numbers_are() -> None:
    """The checks refuse floats and bools, not integers or reals of another type (as
    ``range`` and the waits take numpy's)."""
    with disco.ThreadedSession(
        np.int64(2), num_groups=np.int32(1), timeout=np.float32(30.0), failure_grace=np.int64(1)
    ) as sess:
        assert sess.num_workers == 2


def test_a_session_whose_construction_fails_still_stops_its_transport(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The transport's workers run before ``Session.__init__`` is done: should it raise,
    collecting the half-made session closes the transport (the finalizer is set first)."""
    closed: list[bool] = []

    class Transport:
        def close(self, force: bool = False) -> None:
            closed.append(force)

    def broken() -> None:
        raise RuntimeError("broken")

    # Earlier tests' sessions collected first: collected under the patch below, a shut
    # down session's finalizer read the patched module (a failure of the suite's run).
    gc.collect()
    # Session.__init__ makes its locks after the transport is in hand: make that fail.
    monkeypatch.setattr(session, "threading", types.SimpleNamespace(RLock=broken))
    with pytest.raises(RuntimeError, match="broken"):
        session.Session(Transport(), 2, 1, 1.0, 1.0)  # type: ignore[arg-type]
    gc.collect()
    assert closed == [True]


def _startup_folders(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir() if path.name.startswith("cubepool-"))


def test_a_missing_mpiexec_leaves_no_socket_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The Unix socket's folder was made before mpiexec was looked for, and stayed in the
    temporary directory when none was found."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def no_mpiexec(explicit: str | None = None) -> str:
        raise disco.MPIUnavailable("no mpiexec found (test)")

    monkeypatch.setattr(process, "find_mpiexec", no_mpiexec)
    with pytest.raises(disco.MPIUnavailable):
        disco.ProcessSession(2)
    assert _startup_folders(tmp_path) == []


def test_a_temporary_directory_too_deep_for_a_unix_socket_falls_back_to_tcp(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Under a TMPDIR too long for a socket's path (108 bytes on Linux), the bind failed
    as a bare ``OSError`` ("AF_UNIX path too long") and left its folder behind; the
    session now listens on loopback TCP instead."""
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    launched: list[list[str]] = []

    def record(command: list[str], key_file: str, **_: object) -> None:
        launched.append(command)
        raise disco.MPIUnavailable("stop here (test)")

    monkeypatch.setattr(process, "start_mpiexec", record)
    with pytest.raises(disco.MPIUnavailable, match="stop here"):
        disco.ProcessSession(2)
    (command,) = launched
    address = command[command.index("--connect") + 1]
    assert address.startswith("127.0.0.1:"), address
    assert _startup_folders(deep) == []


def _mpi_segments(session: disco.ProcessSession) -> list[str]:
    """The MPI shared-memory files the session's workers map (Linux), or a skip."""
    if not Path("/proc/self/maps").exists():
        pytest.skip("no /proc: the shared-memory files cannot be seen")
    found = set()
    for pid in session.worker_pids:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            path = line.split(None, 5)[5] if len(line.split(None, 5)) == 6 else ""
            if path.startswith("/dev/shm/mpich_shm_"):
                found.add(path)
    if not found:
        session.shutdown()
        pytest.skip("this MPI keeps no shared-memory file in /dev/shm")
    return sorted(found)


def test_a_session_collected_unclosed_leaves_no_mpi_shared_memory() -> None:
    """A session collected without shutdown() kills its ranks (a forced close), which
    never reach MPI_Finalize, where MPICH removes its /dev/shm/mpich_shm_* file: 1 to 4
    MiB stayed behind for each such session until the machine restarted."""
    session = disco.ProcessSession(2)
    segments = _mpi_segments(session)
    pids = session.worker_pids
    del session
    gc.collect()
    assert wait_gone(pids) == []
    assert [path for path in segments if os.path.exists(path)] == []


def test_a_killed_worker_leaves_no_mpi_shared_memory() -> None:
    """A worker killed takes the others down (mpiexec ends them) before they finalize:
    the files were noted at the start, and the close removes them."""
    session = disco.ProcessSession(2)
    segments = _mpi_segments(session)
    pids = session.worker_pids
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(disco.WorkerDied):
        session.sync_workers()
    assert wait_gone(pids) == []
    assert [path for path in segments if os.path.exists(path)] == []


def test_a_normal_shutdown_still_leaves_the_removal_to_mpi() -> None:
    session = disco.ProcessSession(2)
    segments = _mpi_segments(session)
    session.shutdown()
    assert [path for path in segments if os.path.exists(path)] == []


def _map_files(paths: list[Path]) -> subprocess.Popen[bytes]:
    """A process that maps the first byte of each of ``paths``, once it has printed a
    line."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import mmap, sys, time\n"
            "files = [open(p, 'r+b') for p in sys.argv[1:]]\n"
            "maps = [mmap.mmap(f.fileno(), 1) for f in files]\n"
            "print(flush=True); time.sleep(60)",
            *map(str, paths),
        ],
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stdout.readline() == b"\n"
    return child


def _stop(child: subprocess.Popen[bytes]) -> None:
    child.kill()
    child.communicate()


def test_only_the_files_noted_are_removed_and_only_while_they_are_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file finalize removed and another job made again under the same name (another
    inode) is left alone, and a file of another name is never noted."""
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(segments_module, "_SHM_DIR", f"{shm}/")
    mine, theirs = shm / "mpich_shm_1_0", shm / "user_data"
    mine.write_bytes(b"x")
    theirs.write_bytes(b"y")
    child = _map_files([mine, theirs])
    try:
        # The child stands for a rank: a descendant of the "launcher", this process.
        segments = segments_module.MPISegments(os.getpid())
        segments.note()
    finally:
        _stop(child)
    segments.remove()
    assert sorted(path.name for path in shm.iterdir()) == ["user_data"]
    mine.write_bytes(b"again")  # the same name, another file
    segments = segments_module.MPISegments(os.getpid())
    segments._files.add((str(mine), 0, 0))
    segments.remove()
    assert mine.exists()


def fake_shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder of the test's own that stands for /dev/shm (skipped without /proc, where
    nothing is recorded)."""
    if not Path("/proc/self/maps").exists():
        pytest.skip("no /proc: nothing is recorded")
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(segments_module, "_SHM_DIR", f"{shm}/")
    return shm


def test_a_rank_records_its_files_and_the_launcher_removes_them_after_it_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank killed before any look at its /proc (a remote node's worker killed as soon
    as the session stood) left its file every time: each rank now records its files in
    the launcher's private folder right after MPI_Init, and the record outlives it."""
    shm = fake_shm(tmp_path, monkeypatch)
    mine = shm / "mpich_shm_1_0"
    mine.write_bytes(b"x")
    segments = segments_module.MPISegments()
    environment = segments.environment()
    folder = Path(environment[segments_module.RECORDS_ENV])
    assert folder.stat().st_mode & 0o777 == 0o700
    # This process stands for the rank: it maps the file and records it, then "dies"
    # (unmaps it); the launcher never looked at its /proc.
    with mine.open("r+b") as handle, mmap.mmap(handle.fileno(), 1):
        monkeypatch.setenv(segments_module.RECORDS_ENV, str(folder))
        segments_module.record_segments()
        assert segments_module.RECORDS_ENV not in os.environ  # read once, then gone
    assert [path.name for path in folder.iterdir()] == [str(os.getpid())]
    # The folder goes once as many ranks as the launcher started have recorded (a remote
    # node, then killed, leaves none behind); what they recorded stays noted.
    assert not segments.collect(2) and folder.exists()
    assert segments.collect(1) and not folder.exists()
    segments.remove()
    assert not mine.exists()


def test_records_name_only_this_users_mpi_files_in_dev_shm_that_no_other_process_maps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records' paths are checked, not trusted: each must be an MPI file right under
    /dev/shm, a regular file of this user, still the inode recorded, written on this
    boot, and mapped by no process but the launch's ranks; anything else is left. (A
    record's pid is taken as a rank's: only this user writes the folder.)"""
    shm = fake_shm(tmp_path, monkeypatch)
    elsewhere = tmp_path / "mpich_shm_elsewhere_0"
    user_data = shm / "user_data"
    traversal = shm / "mpich_shm_x" / ".." / "user_data"
    other_inode = shm / "mpich_shm_other_0"
    other_boot = shm / "mpich_shm_boot_0"
    in_use = shm / "mpich_shm_in_use_0"
    link = shm / "mpich_shm_link_0"
    mine = shm / "mpich_shm_mine_0"
    for path in (elsewhere, user_data, other_inode, other_boot, in_use, mine):
        path.write_bytes(b"x")
    link.symlink_to(mine)

    def entry(path: Path) -> list[Any]:
        status = os.lstat(path)
        return [str(path), status.st_dev, status.st_ino]

    segments = segments_module.MPISegments()
    folder = Path(segments.environment()[segments_module.RECORDS_ENV])
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    files = [entry(path) for path in (elsewhere, user_data, in_use, link, mine)]
    files += [[str(traversal), *entry(user_data)[1:]], [*entry(other_inode)[:2], 0]]
    (folder / "1").write_text(json.dumps({"boot": boot, "pid": 1, "files": files}))
    other = {"boot": "another boot", "pid": 2, "files": [entry(other_boot)]}
    (folder / "2").write_text(json.dumps(other))
    (folder / "3").write_text("not json")
    holder = _map_files([in_use])  # another job's process, say
    try:
        segments.remove()
        left = sorted(path.name for path in shm.iterdir())
    finally:
        _stop(holder)
    kept = [user_data, other_inode, other_boot, in_use, link]
    assert left == sorted(path.name for path in kept)
    assert elsewhere.exists()
    assert not folder.exists()


def test_a_launcher_that_has_ended_has_no_descendants_noted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once mpiexec has ended and been reaped (a worker died: the session waited for
    it), its pid may be another process's: the close's last look read the descendants
    of whatever had it, and removed their MPI files (another job's, live) with its own.
    A launcher still running is looked under as before."""
    looked: list[int] = []

    def descendants(pid: int) -> list[int]:
        looked.append(pid)
        return []

    monkeypatch.setattr(segments_module, "_descendants", descendants)
    ended = subprocess.Popen([sys.executable, "-c", ""])
    ended.wait()
    segments_module.MPISegments(ended).note()
    assert looked == []
    running = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        segments_module.MPISegments(running).note()
        assert looked == [running.pid]
    finally:
        running.communicate()


def test_the_finalizer_waits_for_a_send_under_way_before_closing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At exit the finalizer closes a session still open while a daemon thread may be
    sending through it: it closed the channels without the session's lock, so that a
    send's next write could reach a file that reused a channel's number. It waits for
    the send now, as ``shutdown`` does."""
    events: list[str] = []
    close = session._ThreadTransport.close

    def closing(self: Any, force: bool = False) -> None:
        events.append("closed")
        close(self, force)

    monkeypatch.setattr(session._ThreadTransport, "close", closing)
    sess = disco.ThreadedSession(1)
    sending = threading.Event()

    def send() -> None:
        with sess._lock:  # what a send holds
            sending.set()
            threading.Event().wait(0.3)
            events.append("sent")

    sender = threading.Thread(target=send)
    sender.start()
    sending.wait(10)
    sess._finalizer()  # as at exit
    sender.join(10)
    assert events == ["sent", "closed"]
