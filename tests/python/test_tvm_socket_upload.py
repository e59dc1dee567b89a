"""A port of TVM's ``tests/python/disco/test_socket_upload.py`` (apache/tvm, added by
1230673345) to cubepool.disco: ``upload_vm_module`` over a ``SocketSession`` of four
nodes, each in a directory of its own.

The steps and assertions of the upload half are TVM's: the controller (node 0) holds
the module file in its directory, the other nodes' directories start empty, and after
``upload_vm_module(path)`` every node has the file at ``path`` in its directory with the
controller's sha256. The nodes start first, with no key (``python -m
cubepool.disco.remote localhost PORT N``, TVM's ``tvm.exec.disco_remote_socket_session``),
and find the key the session leaves for its user's loopback nodes. Adapted:

* The file is random bytes: TVM compiles a Relax module and exports it as a shared
  library, which needs TVM's compiler. So the half that loads and runs it
  (``load_vm_module``, ``mod["double"]``) cannot run; that ``load_vm_module`` says why is
  checked in its place.
* ``SocketSessionTester`` keeps TVM's order (nodes, then the session); its close asserts
  that every node exited 0.
"""

from __future__ import annotations

import hashlib
import pathlib
import socket
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from cubepool import disco as di
from cubepool.disco.keys import AUTHKEY_ENV, LOOPBACK_KEYS_ENV

_NUM_NODES = 4
_NUM_WORKERS = 4
_REL_PATH = "./mod.so"


def _node_dir_name(node_id: int) -> str:
    return f"upload_node{node_id}"


def _get_free_port() -> int:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("", 0))
    port: int = sock.getsockname()[1]
    sock.close()
    return port


def _sha256(path: str | pathlib.Path) -> str:
    with open(path, "rb") as file:
        return hashlib.sha256(file.read()).hexdigest()


class SocketSessionTester:
    def __init__(
        self,
        num_workers: int,
        node_cwds: list[pathlib.Path],
        num_groups: int = 1,
        build_ring: bool = True,
    ) -> None:
        self.sess: di.SocketSession | None = None
        self.remote_nodes: list[subprocess.Popen[bytes]] = []
        num_nodes = len(node_cwds)
        assert num_workers % num_nodes == 0
        num_workers_per_node = num_workers // num_nodes
        server_host = "localhost"
        server_port = _get_free_port()

        cmd = "cubepool.disco.remote"
        for cwd in node_cwds[1:]:  # node 0 is this process
            self.remote_nodes.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        cmd,
                        server_host,
                        str(server_port),
                        str(num_workers_per_node),
                    ],
                    cwd=str(cwd),
                    stdout=sys.stdout,
                    stderr=sys.stderr,
                )
            )

        self.sess = di.SocketSession(
            num_nodes,
            num_workers_per_node,
            num_groups,
            server_host,
            server_port,
            build_ring,
        )

    def close(self) -> list[int | None]:
        """Shut the session down; each node's exit status (None: killed)."""
        statuses: list[int | None] = []
        try:
            if self.sess is not None:
                self.sess.shutdown()
                self.sess = None
        finally:
            for node in self.remote_nodes:
                try:
                    statuses.append(node.wait(timeout=30))
                except subprocess.TimeoutExpired:
                    node.kill()
                    node.wait()
                    statuses.append(None)
            self.remote_nodes = []
        return statuses


def test_upload_vm_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(AUTHKEY_ENV, raising=False)
    with tempfile.TemporaryDirectory(prefix="disco_upload_") as tmp_root:
        root = pathlib.Path(tmp_root)
        # The loopback session's key, where its nodes look (a folder of this test's).
        monkeypatch.setenv(LOOPBACK_KEYS_ENV, str(root / "keys"))
        node_dirs = [root / _node_dir_name(i) for i in range(_NUM_NODES)]

        for node_dir in node_dirs:
            node_dir.mkdir()

        monkeypatch.chdir(node_dirs[0])

        # TVM: tvm.compile(...).export_library(_REL_PATH); here the bytes stand for it.
        pathlib.Path(_REL_PATH).write_bytes(np.random.default_rng(0).bytes(200_000))
        expected_sha = _sha256(_REL_PATH)

        # Precondition: only the controller has the artifact.
        for node_dir in node_dirs[1:]:
            assert not (node_dir / _REL_PATH).exists()

        tester = SocketSessionTester(_NUM_WORKERS, node_dirs)
        try:
            sess = tester.sess
            assert sess is not None
            sess._sync_all()
            sess.upload_vm_module(_REL_PATH)
            sess._sync_all()

            for i, node_dir in enumerate(node_dirs):
                written = node_dir / _REL_PATH
                assert written.is_file(), f"{_node_dir_name(i)} never received the module"
                digest = _sha256(written)
                assert digest == expected_sha, f"{_node_dir_name(i)} got a corrupt copy"

            # TVM loads and runs the module here; that needs TVM's compiler and VM.
            with pytest.raises(di.DiscoUnsupported, match="TVM's compiler"):
                sess.load_vm_module(_REL_PATH)
            # The workers run TVM's worker functions (TVM's tests.disco.*) as TVM's do.
            ones = sess.get_global_func("tests.disco.add_one")(1)
            assert [ones.debug_get_from_remote(i) for i in range(_NUM_WORKERS)] == [2] * 4
        finally:
            assert tester.close() == [0] * (_NUM_NODES - 1)
