"""How the session key reaches the workers: a file, never ``mpiexec``'s environment.

MPICH's ``mpiexec`` sends its environment to the proxies of other hosts in clear text,
to whoever connects to its control port first; a review took the key from there and
had the controller unpickle its frames. These tests check that no ``mpiexec`` a session
starts holds the key, that a session across hosts asks for a key file, and that key
files are read only when private to their owner.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import cubepool
from cubepool import disco
from cubepool.disco.errors import FrameRejected
from cubepool.disco.keys import (
    AUTHKEY_ENV,
    KEY_FILE_ENV,
    PrivateKeyFile,
    read_key_file,
    worker_key,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc and file modes")


def key_file(folder: Path, key: bytes, mode: int = 0o600) -> Path:
    """``key`` in hex in a file of ``folder`` with ``mode``."""
    path = folder / "key"
    path.write_text(key.hex() + "\n")
    path.chmod(mode)
    return path


def test_a_key_file_is_read_only_when_private_to_its_owner(tmp_path: Path) -> None:
    key = os.urandom(32)
    path = key_file(tmp_path, key)
    assert read_key_file(path) == key
    path.chmod(0o400)
    assert read_key_file(path) == key
    for mode in (0o640, 0o604, 0o620):
        path.chmod(mode)
        with pytest.raises(FrameRejected, match=rf"key file {path} may be read .*chmod 600"):
            read_key_file(path)
    with pytest.raises(FrameRejected, match="key file /dev/null is not a regular file"):
        read_key_file("/dev/null")
    with pytest.raises(FrameRejected, match=r"cannot read key file .*Is a directory"):
        read_key_file(tmp_path)
    path.chmod(0o600)
    path.write_text("not hex\n")
    with pytest.raises(FrameRejected, match=f"key file {path}:"):
        read_key_file(path)
    with pytest.raises(FrameRejected, match="cannot read key file"):
        read_key_file(tmp_path / "missing")
    # A name no file can have: a bare ValueError before (helper-145's find).
    with pytest.raises(FrameRejected, match=r"cannot read key file .*null byte"):
        read_key_file("a\0b")


def test_a_key_file_in_a_fifo_or_of_another_user_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    # Refused at once: an open that waited for a writer would hang the session's start.
    with pytest.raises(FrameRejected, match=f"key file {fifo} is not a regular file"):
        read_key_file(fifo)
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    path = key_file(tmp_path, os.urandom(32))
    os.chown(path, 65534, 65534)
    with pytest.raises(FrameRejected, match=rf"key file {path} belongs to user 65534, not"):
        read_key_file(path)


def test_a_key_file_reached_through_a_link_is_refused(tmp_path: Path) -> None:
    """A private key file through a symbolic link was read: whoever may change the link
    (here in a folder anyone may write) chooses the key. Refused as ssh's StrictModes
    would, naming the file."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    key = os.urandom(32)
    target = key_file(private, key)
    assert read_key_file(target) == key
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(FrameRejected, match=f"key file {link} is a symbolic link"):
        read_key_file(link)


@pytest.mark.parametrize("sticky", [False, True])
def test_a_key_file_in_a_folder_others_may_write_is_refused_unless_sticky(
    tmp_path: Path, sticky: bool
) -> None:
    """A 0600 key file in a folder anyone may write (0777, no sticky bit) was read:
    another user could rename it away and put a file of theirs in its place. A sticky
    folder (``/tmp``'s 1777) lets no one but the owner rename or remove the file."""
    shared = tmp_path / "shared"
    shared.mkdir()
    key = os.urandom(32)
    path = key_file(shared, key)
    shared.chmod(0o1777 if sticky else 0o777)
    if sticky:
        assert read_key_file(path) == key
        return
    with pytest.raises(
        FrameRejected,
        match=rf"key file {path} is in folder {shared}, which others may write \(mode 0777, "
        rf"not sticky\).*chmod go-w {shared}",
    ):
        read_key_file(path)
    shared.chmod(0o775)  # its group may write it: refused as well
    with pytest.raises(FrameRejected, match=r"which others may write \(mode 0775"):
        read_key_file(path)
    # A private folder inside the writable one is no better: the folder above it can
    # be renamed away.
    shared.chmod(0o777)
    inner = shared / "inner"
    inner.mkdir(mode=0o700)
    with pytest.raises(FrameRejected, match=f"is in folder {shared}, which others may write"):
        read_key_file(key_file(inner, key))


def test_a_key_file_in_a_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    path = key_file(theirs, os.urandom(32))
    os.chown(theirs, 65534, 65534)
    with pytest.raises(
        FrameRejected, match=rf"key file {path} is in folder {theirs} of user 65534, neither"
    ):
        read_key_file(path)


def test_a_worker_takes_its_key_out_of_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = os.urandom(32)
    monkeypatch.setenv(KEY_FILE_ENV, str(key_file(tmp_path, key)))
    monkeypatch.setenv(AUTHKEY_ENV, os.urandom(32).hex())  # the file wins
    assert worker_key() == key
    assert KEY_FILE_ENV not in os.environ and AUTHKEY_ENV not in os.environ
    monkeypatch.setenv(AUTHKEY_ENV, key.hex())  # a worker started by hand
    assert worker_key() == key and AUTHKEY_ENV not in os.environ
    with pytest.raises(FrameRejected, match="no session key"):
        worker_key()


def test_a_private_key_file_is_the_owners_alone_and_removed(tmp_path: Path) -> None:
    key = os.urandom(32)
    made = PrivateKeyFile(key)
    folder = os.path.dirname(made.path)
    assert os.stat(folder).st_mode & 0o777 == 0o700
    assert os.stat(made.path).st_mode & 0o777 == 0o600
    assert read_key_file(made.path) == key
    made.remove()
    made.remove()
    assert not os.path.exists(folder)


def test_a_session_across_hosts_needs_a_key_file(tmp_path: Path) -> None:
    pytest.importorskip("mpi4py")
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    with pytest.raises(cubepool.InvalidArgument, match="needs key_file="):
        disco.ProcessSession(2, hostfile=hosts)
    shared = key_file(tmp_path, os.urandom(32), 0o644)
    with pytest.raises(cubepool.InvalidArgument, match=r"key_file: key file .* \(chmod 600 "):
        disco.ProcessSession(2, hostfile=hosts, key_file=shared)


def launcher_environment(session: disco.ProcessSession) -> bytes:
    """The environment ``session``'s ``mpiexec`` was started with."""
    return Path(f"/proc/{session.launcher_pid}/environ").read_bytes()


def test_no_mpiexec_holds_the_key_in_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mpi4py")
    # A key the controller's environment holds (for SocketSession) is not passed on.
    inherited = os.urandom(32).hex()
    monkeypatch.setenv(AUTHKEY_ENV, inherited)
    with disco.ProcessSession(2, startup_timeout=60) as session:
        environment = launcher_environment(session)
        key = session._mpi._key.hex().encode()
        assert key not in environment and inherited.encode() not in environment
        assert AUTHKEY_ENV.encode() not in environment
        # The session's own key file was removed once the workers connected.
        path = next(
            item.split(b"=", 1)[1]
            for item in environment.split(b"\0")
            if item.startswith(KEY_FILE_ENV.encode() + b"=")
        )
        assert not os.path.exists(path)
        assert session.sync_worker_0() is None
    # Across hosts: the user's key file, at one path on every host (here one host).
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    shared = key_file(tmp_path, os.urandom(32))
    with disco.ProcessSession(2, hostfile=hosts, key_file=shared) as session:
        environment = launcher_environment(session)
        assert shared.read_text().strip().encode() not in environment
        assert f"{KEY_FILE_ENV}={shared}".encode() in environment.split(b"\0")
        assert session.sync_worker_0() is None
    assert shared.exists()  # the user's file is the user's to remove


def test_a_key_file_named_through_a_link_and_dotdot_is_checked_where_it_is(
    tmp_path: Path,
) -> None:
    """``link/../key`` with ``link`` leading into an open folder's subfolder is that open
    folder's ``key`` (the kernel follows the link first); its folder was checked as the
    text made it (``tmp_path``, private), and the key was read."""
    shared = tmp_path / "shared"
    (shared / "sub").mkdir(parents=True)
    key = os.urandom(32)
    key_file(shared, key)
    shared.chmod(0o777)
    (tmp_path / "link").symlink_to(shared / "sub")
    with pytest.raises(FrameRejected, match=f"is in folder {shared}, which others may write"):
        read_key_file(f"{tmp_path}/link/../key")


def test_a_sessions_own_key_is_kept_where_its_workers_accept_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``$TMPDIR`` its group may write (a shared project folder, umask 002) held the
    session's own key, which the session's workers then refused: the key goes to the
    first of the temporary folder, ``$XDG_RUNTIME_DIR`` and home that passes."""
    import tempfile

    group = tmp_path / "group"
    group.mkdir()
    group.chmod(0o775)
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setattr(tempfile, "tempdir", str(group))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    key = os.urandom(32)
    private = PrivateKeyFile(key)
    try:
        assert Path(private.path).parent.parent == runtime
        assert read_key_file(private.path) == key
    finally:
        private.remove()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(group))
    monkeypatch.setenv("HOME", str(group))
    with pytest.raises(FrameRejected, match="no folder to keep the session's key in"):
        PrivateKeyFile(key)


def test_a_link_named_key_does_not_move_the_sessions_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The temporary folder was checked through a name in it (``key``): anyone who may
    write there (``/tmp``) could make that name a link into an open folder and send
    every session's key to the home folder."""
    import tempfile

    base = tmp_path / "base"
    base.mkdir(mode=0o700)
    opened = tmp_path / "open"
    opened.mkdir()
    opened.chmod(0o777)
    (base / "key").symlink_to(opened / "x")
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    private = PrivateKeyFile(os.urandom(32))
    try:
        assert Path(private.path).parent.parent == base
    finally:
        private.remove()
