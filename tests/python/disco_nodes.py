"""Start a ``SocketSession`` with its remote nodes as separate processes on this machine."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from cubepool import disco

TESTS = Path(__file__).parent


def free_port() -> int:
    """A TCP port that was free a moment ago (as TVM's test takes one)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def node_env(key: str) -> dict[str, str]:
    """The environment of a remote node: the session key, and the tests' helper module on
    the path of its workers."""
    env = dict(os.environ)
    env["CUBEPOOL_DISCO_AUTHKEY"] = key
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(TESTS), env.get("PYTHONPATH")] if p)
    return env


def start_remote(port: int, num_workers: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``python -m cubepool.disco.remote 127.0.0.1 PORT NUM_WORKERS`` as a process."""
    command = [sys.executable, "-m", "cubepool.disco.remote", "127.0.0.1", str(port)]
    return subprocess.Popen([*command, str(num_workers)], env=env)


class NodesSession:
    """A ``SocketSession`` of ``num_nodes`` nodes on this machine: the controller in this
    process (started on a thread, as TVM's test does), each other node a process of
    ``cubepool.disco.remote`` offering ``remote_workers`` workers (default
    ``per_node``). ``close()`` shuts the session down and waits for the nodes.
    """

    def __init__(
        self,
        num_nodes: int,
        per_node: int,
        num_groups: int = 1,
        remote_workers: int | None = None,
        **options: Any,
    ) -> None:
        self.key = secrets.token_hex(32)
        self.port = free_port()
        env = node_env(self.key)
        self.remotes: list[subprocess.Popen[bytes]] = []
        result: dict[str, Any] = {}

        def serve() -> None:
            try:
                result["session"] = disco.SocketSession(
                    num_nodes,
                    per_node,
                    num_groups,
                    "127.0.0.1",
                    self.port,
                    key=self.key,
                    **options,
                )
            except BaseException as exc:
                result["error"] = exc

        # Node 0's workers inherit this process's environment: the helpers' path too.
        previous = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = env["PYTHONPATH"]
        try:
            thread = threading.Thread(target=serve)
            thread.start()
            offer = per_node if remote_workers is None else remote_workers
            self.remotes = [start_remote(self.port, offer, env) for _ in range(num_nodes - 1)]
            thread.join()
        finally:
            if previous is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = previous
        if "error" in result:
            self.close()
            raise result["error"]
        self.session: disco.SocketSession = result["session"]

    def close(self) -> list[int | None]:
        """Shut the session down; each remote node's exit status (None: it was killed)."""
        if hasattr(self, "session"):
            self.session.shutdown()
        statuses: list[int | None] = []
        for remote in self.remotes:
            try:
                statuses.append(remote.wait(30))
            except subprocess.TimeoutExpired:
                remote.kill()
                remote.wait()
                statuses.append(None)
        return statuses
