"""A ``SocketSession`` on a loopback host with no key, as TVM's tests start one: the
session leaves a key in a private folder of its user's, where its nodes find it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from disco_nodes import TESTS, free_port

from cubepool import InvalidArgument, disco
from cubepool.disco.errors import FrameRejected
from cubepool.disco.keys import (
    AUTHKEY_ENV,
    LOOPBACK_KEYS_ENV,
    LoopbackKey,
    loopback_address,
    loopback_key_folder,
    loopback_key_path,
    read_loopback_key,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="file modes and MPI")


@pytest.fixture
def keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder of loopback keys of this test's own, and no key in the environment."""
    folder = tmp_path / "keys"
    monkeypatch.setenv(LOOPBACK_KEYS_ENV, str(folder))
    monkeypatch.delenv(AUTHKEY_ENV, raising=False)
    return folder


def _node(
    port: int, host: str = "localhost", *extra: str, capture: bool = False
) -> subprocess.Popen[bytes]:
    """``python -m cubepool.disco.remote HOST PORT 1`` (its stderr piped with ``capture``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(TESTS), env.get("PYTHONPATH")] if p)
    command = [sys.executable, "-m", "cubepool.disco.remote", host, str(port), "1", *extra]
    return subprocess.Popen(command, env=env, stderr=subprocess.PIPE if capture else None)


def _session(port: int, **options: Any) -> dict[str, Any]:
    """Starts TVM's ``SocketSession(2, 1, 1, "localhost", port)`` on a thread, as TVM's
    test does; the result (``session`` or ``error``) once the thread is joined."""
    result: dict[str, Any] = {}

    def serve() -> None:
        try:
            result["session"] = disco.SocketSession(2, 1, 1, "localhost", port, **options)
        except Exception as exc:
            result["error"] = exc

    result["thread"] = threading.Thread(target=serve)
    result["thread"].start()
    return result


def test_a_loopback_session_with_no_key_runs_as_tvms_test_starts_it(keys: Path) -> None:
    port = free_port()
    started = _session(port)
    node = _node(port)
    started["thread"].join()
    sess = started["session"]
    try:
        x = sess.empty((3,), "float32")
        x.debug_copy_from(1, np.arange(3, dtype=np.float32))
        np.testing.assert_array_equal(x.debug_get_from_remote(1).numpy(), [0.0, 1.0, 2.0])
        # Every node is in: the key left for them is gone.
        assert not Path(loopback_key_path(port)).exists()
    finally:
        sess.shutdown()
    assert node.wait(60) == 0


def test_a_node_that_read_a_dead_sessions_key_reads_the_new_one(keys: Path) -> None:
    port = free_port()
    LoopbackKey(port, os.urandom(32))  # left by a session that died on this port
    node = _node(port)  # reads the stale key, is refused, reads again
    time.sleep(1.5)  # so that it has read the stale key before the session replaces it
    started = _session(port, startup_timeout=30.0)
    started["thread"].join()
    assert "error" not in started, started.get("error")
    started["session"].shutdown()
    assert node.wait(60) == 0


def test_a_session_of_one_node_needs_no_key(keys: Path) -> None:
    sess = disco.SocketSession(1, 2)
    try:
        ids = sess.get_global_func("runtime.disco.worker_id")()
        assert [ids.debug_get_from_remote(w) for w in (0, 1)] == [0, 1]
    finally:
        sess.shutdown()


def test_without_a_key_a_session_across_hosts_or_on_any_port_is_refused(keys: Path) -> None:
    with pytest.raises(InvalidArgument, match="needs a key shared with its remote nodes"):
        disco.SocketSession(2, 1, 1, "localhost", 0)  # its nodes could not find the port
    with pytest.raises(InvalidArgument, match="needs a key shared with its remote nodes"):
        disco.SocketSession(2, 1, 1, "192.0.2.1", free_port())  # not this host
    node = _node(free_port(), "192.0.2.1", capture=True)
    _, err = node.communicate(timeout=60)
    assert node.returncode == 2 and b"'192.0.2.1' is not one" in err


def test_a_node_waits_for_the_key_only_until_its_timeout(keys: Path) -> None:
    node = _node(free_port(), "127.0.0.1", "--connect-timeout", "0.5", capture=True)
    _, err = node.communicate(timeout=60)
    assert node.returncode == 2 and b"no loopback session on port" in err


def test_the_key_folder_is_private_to_its_user(
    keys: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = Path(loopback_key_folder())
    assert folder == keys and (folder.stat().st_mode & 0o777) == 0o700
    folder.chmod(0o755)
    with pytest.raises(FrameRejected, match="others may enter it"):
        loopback_key_folder()
    folder.chmod(0o700)
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    monkeypatch.setenv(LOOPBACK_KEYS_ENV, str(link))
    with pytest.raises(FrameRejected, match=r"cannot open the loopback key folder .*link"):
        loopback_key_folder()


def test_an_xdg_runtime_dir_not_private_to_the_user_is_not_used(
    keys: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(LOOPBACK_KEYS_ENV)
    shared = tmp_path / "run"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(shared))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert loopback_key_folder() == str(tmp_path / "home" / ".cache" / "cubepool-disco")
    shared.chmod(0o700)
    assert loopback_key_folder() == str(shared / "cubepool-disco")


def test_a_umask_that_takes_the_users_rights_is_undone(keys: Path) -> None:
    old = os.umask(0o277)
    try:
        folder = Path(loopback_key_folder())
    finally:
        os.umask(old)
    assert (folder.stat().st_mode & 0o777) == 0o700


def test_a_session_that_cannot_bind_its_port_leaves_the_running_ones_key(keys: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        running = LoopbackKey(port, b"\x07" * 32)  # the key of the session holding the port
        with pytest.raises(disco.DiscoError, match="cannot listen"):
            disco.SocketSession(2, 1, 1, "localhost", port, startup_timeout=5.0)
        assert read_loopback_key(port, 0.0) == b"\x07" * 32
        running.remove()


def test_a_key_is_private_and_removed_only_by_its_session(keys: Path) -> None:
    first = LoopbackKey(4242, b"\x01" * 32)
    assert (Path(first.path).stat().st_mode & 0o777) == 0o600
    assert read_loopback_key(4242, 0.0) == b"\x01" * 32
    second = LoopbackKey(4242, b"\x02" * 32)  # a new session on the same port
    first.remove()  # not its key any more: left alone
    assert read_loopback_key(4242, 0.0) == b"\x02" * 32
    second.remove()
    with pytest.raises(FrameRejected, match="no loopback session on port 4242"):
        read_loopback_key(4242, 0.0)


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("localhost", "127.0.0.1"),
        ("127.0.0.1", "127.0.0.1"),
        ("127.8.9.10", "127.8.9.10"),
        ("::1", None),
        ("192.0.2.1", None),
        ("no-such-host.invalid", None),
        ("0.0.0.0", None),
    ],
)
def test_loopback_hosts_are_the_ipv4_ones_a_session_listens_on(
    host: str, address: str | None
) -> None:
    # A SocketSession listens on IPv4: a node sent to ::1 first could meet another listener.
    assert loopback_address(host) == address
