"""SocketSession across nodes: each node a separate process on this machine.

One session of 3 nodes x 2 workers in 2 groups of 3 (so each group spans two nodes)
serves the collective tests: every collective, within the groups and across all
workers, and send/receive between workers of different nodes, checked against numpy.
The other tests start their own sessions: a node with the wrong key or worker count is
refused, a missing key is a typed error, and after shutdown no node or worker is left.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from disco_nodes import NodesSession, free_port, node_env
from disco_procs import wait_gone

import cubepool
from cubepool import disco
from cubepool.disco.protocol import Hello, NodeHello, encode_message
from cubepool.disco.socket_session import session_key
from cubepool.disco.wire import connect_channel

NODES, PER_NODE, GROUPS = 3, 2, 2
N = NODES * PER_NODE
GROUP = N // GROUPS


@pytest.fixture(scope="module")
def nodes() -> Iterator[NodesSession]:
    """One 3-node session for the module; afterwards every node exited 0, no worker left."""
    started = NodesSession(NODES, PER_NODE, GROUPS, timeout=30)
    started.session.import_python_module("disco_helpers")
    pids = started.session.worker_pids
    yield started
    assert started.close() == [0] * (NODES - 1)
    assert wait_gone(pids) == []


@pytest.fixture
def sess(nodes: NodesSession) -> disco.SocketSession:
    """The module's session."""
    return nodes.session


def put(session: disco.Session, values: list[Any]) -> disco.DRef:
    """A DRef holding ``values[i]`` on worker i."""
    ref = session.empty(values[0].shape, str(values[0].dtype))
    for worker, value in enumerate(values):
        ref.debug_copy_from(worker, value)
    return ref


def fetch(ref: disco.DRef) -> list[Any]:
    """The value of ``ref`` on every worker."""
    return [ref.debug_get_from_remote(worker) for worker in range(N)]


def members(worker: int, in_group: bool) -> list[int]:
    """The workers a collective of ``worker`` spans."""
    if not in_group:
        return list(range(N))
    first = worker // GROUP * GROUP
    return list(range(first, first + GROUP))


def values_of(seed: int, shape: tuple[int, ...] = (5,)) -> list[Any]:
    """One array of small integers (as float64: sums are exact) per worker."""
    rng = np.random.default_rng(seed)
    return [rng.integers(-9, 10, shape).astype(np.float64) for _ in range(N)]


def test_worker_ids_are_global_across_nodes(sess: disco.SocketSession) -> None:
    assert (sess.num_nodes, sess.num_workers_per_node, sess.num_workers) == (NODES, PER_NODE, N)
    ids = sess.get_global_func("runtime.disco.worker_id")()
    assert [ids.debug_get_from_remote(w) for w in range(N)] == list(range(N))
    assert len(set(sess.worker_pids)) == N


@pytest.mark.parametrize("op", ["sum", "prod", "min", "max", "avg"])
@pytest.mark.parametrize("in_group", [True, False])
def test_allreduce_across_nodes(sess: disco.SocketSession, op: str, in_group: bool) -> None:
    values = values_of(1)
    src, dst = put(sess, values), sess.empty((5,), "float64")
    sess.allreduce(src, dst, op=op, in_group=in_group)
    reduce = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max, "avg": np.mean}[op]
    for worker, got in enumerate(fetch(dst)):
        stacked = np.stack([values[m] for m in members(worker, in_group)])
        np.testing.assert_allclose(got, reduce(stacked, axis=0))


@pytest.mark.parametrize("in_group", [True, False])
def test_allgather_across_nodes(sess: disco.SocketSession, in_group: bool) -> None:
    values = values_of(2, (2,))
    parts = GROUP if in_group else N
    src, dst = put(sess, values), sess.empty((parts, 2), "float64")
    sess.allgather(src, dst, in_group=in_group)
    for worker, got in enumerate(fetch(dst)):
        np.testing.assert_array_equal(got, np.stack([values[m] for m in members(worker, in_group)]))


@pytest.mark.parametrize("in_group", [True, False])
def test_broadcast_scatter_gather_across_nodes(sess: disco.SocketSession, in_group: bool) -> None:
    parts = GROUP if in_group else N
    array = np.arange(parts * 3, dtype=np.float32).reshape(parts, 3)
    for got in fetch(sess.broadcast(array, in_group=in_group)):
        np.testing.assert_array_equal(got, array)
    for worker, got in enumerate(fetch(sess.scatter(array, in_group=in_group))):
        np.testing.assert_array_equal(got, array[members(worker, in_group).index(worker)])
    values = [np.full(3, w, np.float32) for w in range(N)]
    src = put(sess, values)
    dst = sess.empty((parts, 3), "float32", worker0_only=True, in_group=in_group)
    sess.gather_to_worker0(src, dst, in_group=in_group)
    roots = range(0, N, GROUP) if in_group else [0]
    for root in roots:
        expected = np.stack([values[m] for m in members(root, in_group)])
        np.testing.assert_array_equal(dst.debug_get_from_remote(root), expected)


def test_send_and_receive_between_nodes(sess: disco.SocketSession) -> None:
    values = values_of(3)
    src, dst = put(sess, values), sess.empty((5,), "float64")
    sess.get_global_func("tests.disco.ring")(src, dst)  # 1 -> 2 and 5 -> 0 cross nodes
    for worker, got in enumerate(fetch(dst)):
        np.testing.assert_array_equal(got, values[(worker - 1) % N])
    buf = put(sess, values)
    sess.get_global_func("tests.disco.pipeline")(buf)  # group 0 (nodes 0, 1) -> group 1
    for worker, got in enumerate(fetch(buf)):
        np.testing.assert_array_equal(got, values[worker % GROUP])


def test_init_ccl_takes_one_device_per_worker_of_a_node(sess: disco.SocketSession) -> None:
    with pytest.raises(cubepool.InvalidArgument, match=r"available: \['mpi', 'cpuccl'\]"):
        sess.init_ccl("nccl", 0, 1)
    with pytest.raises(cubepool.InvalidArgument, match=r"one device id per worker of a node \(2\)"):
        sess.init_ccl("mpi", 0)
    sess.init_ccl("mpi", *range(N))  # as TVM: each worker takes the id of its local index
    sess.init_ccl("mpi", 0, 1)
    assert sess.ccl == "mpi"


def test_a_node_with_the_wrong_key_is_refused_and_never_joins(tmp_path: Any) -> None:
    port = free_port()
    env = node_env("ab" * 32)
    command = [sys.executable, "-m", "cubepool.disco.remote", "127.0.0.1", str(port), "1"]
    intruder = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
    with pytest.raises(disco.DiscoTimeout, match=r"remote nodes.*0 of 1 came"):
        disco.SocketSession(2, 1, 1, "127.0.0.1", port, key="cd" * 32, startup_timeout=4)
    _, err = intruder.communicate(timeout=30)
    assert intruder.returncode == 1
    # Told so at once (a connection closed before any answer is tried again).
    assert b"refused the handshake: its session key is not this one" in err, err


@pytest.mark.parametrize(
    "hello",
    [
        Hello("x", 1, "h"),  # a TypeError ended the session's start at once
        Hello(0, 0, "h"),  # pid 0: a local session's close would signal its group
        Hello(0, 1, b"h"),
        NodeHello(1, "x", "h"),  # a node was taken with a pid that is no int
        NodeHello(1, -1, "h"),
        NodeHello(True, 5, "h"),
    ],
)
def test_a_peer_with_the_key_and_a_malformed_hello_is_refused(hello: Any) -> None:
    key = secrets.token_hex(32)
    port = free_port()
    sent = threading.Event()

    def peer() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not sent.is_set():
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=1)
            except OSError:
                time.sleep(0.05)
                continue
            with sock:
                connect_channel(sock, session_key(key), 5).send(encode_message(hello))
                sent.set()
                time.sleep(1)

    thread = threading.Thread(target=peer, daemon=True)
    thread.start()
    with pytest.raises(disco.DiscoTimeout, match=r"remote nodes.*0 of 1 came"):
        disco.SocketSession(2, 1, 1, "127.0.0.1", port, key=key, startup_timeout=3)
    thread.join()
    assert sent.is_set()


def test_a_node_offering_the_wrong_worker_count_is_refused() -> None:
    with pytest.raises(disco.DiscoTimeout, match="0 of 1 came"):
        started = NodesSession(2, 2, startup_timeout=6, remote_workers=1)
        started.close()


def test_a_session_needs_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUBEPOOL_DISCO_AUTHKEY", raising=False)
    with pytest.raises(cubepool.InvalidArgument, match="CUBEPOOL_DISCO_AUTHKEY"):
        disco.SocketSession(2, 1, 1, "127.0.0.1", 0)
    with pytest.raises(cubepool.InvalidArgument, match="bad session key"):
        disco.SocketSession(2, 1, 1, "127.0.0.1", 0, key="not hex")
    with pytest.raises(cubepool.InvalidArgument, match="do not split into 3 groups"):
        disco.SocketSession(2, 2, 3, "127.0.0.1", 0, key="ab" * 32)


@pytest.mark.parametrize("key", [bytes(range(32)), bytearray(range(32)), bytes(range(32)).hex()])
def test_a_key_may_be_bytes_like_or_hex(key: Any) -> None:
    assert session_key(key) == session_key(memoryview(bytes(range(32)))) == bytes(range(32))


@pytest.mark.parametrize(
    ("key", "named"),
    [(12345, "int"), (["00" * 32], "list"), (3.5, "float"), (bytearray(8), "8 bytes")],
)
def test_a_key_of_the_wrong_type_is_an_invalid_argument(key: Any, named: str) -> None:
    """(An int once raised AttributeError from inside the key's parsing.)"""
    with pytest.raises(cubepool.InvalidArgument, match=rf"bad session key \(key=\): .*{named}"):
        disco.SocketSession(2, 1, 1, "127.0.0.1", 0, key=key)


def test_a_remote_without_a_key_exits_with_status_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.delenv("CUBEPOOL_DISCO_AUTHKEY", raising=False)
    monkeypatch.setenv("CUBEPOOL_DISCO_LOOPBACK_KEYS", str(tmp_path / "keys"))
    # On a loopback host it waits for a loopback session's key until --connect-timeout.
    command = [sys.executable, "-m", "cubepool.disco.remote", "127.0.0.1", "1", "1"]
    done = subprocess.run([*command, "--connect-timeout", "0.5"], capture_output=True, timeout=60)
    assert done.returncode == 2 and b"CUBEPOOL_DISCO_AUTHKEY" in done.stderr


def test_a_remote_with_a_bad_key_file_exits_with_status_2(tmp_path: Any) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("not a hex key\n")
    command = [sys.executable, "-m", "cubepool.disco.remote", "127.0.0.1", "1", "1"]
    done = subprocess.run([*command, "--key-file", str(key_file)], capture_output=True, timeout=60)
    assert done.returncode == 2 and b"cubepool.disco.remote:" in done.stderr


def mpi_segments(pids: list[int]) -> list[str]:
    """The MPI shared-memory files (``/dev/shm/mpich_shm_*``) processes ``pids`` map, or
    a skip where there is no ``/proc`` or this MPI keeps none."""
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("no /proc: the shared-memory files cannot be seen")
    found = set()
    for pid in pids:
        with open(f"/proc/{pid}/maps", encoding="utf-8") as handle:
            for line in handle:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/dev/shm/mpich_shm_"):
                    found.add(parts[5].rstrip("\n"))
    if not found:
        pytest.skip("this MPI keeps no shared-memory file in /dev/shm")
    return sorted(found)


def test_a_killed_worker_on_a_remote_node_ends_the_session_and_leaves_nothing() -> None:
    """Nothing left includes the MPI shared-memory file of each node's workers (one per
    node: each node's workers are a job of their own): the remote node's worker, killed
    as soon as the session stood, had its file stay behind every time, the node having
    looked at its workers' /proc too late (or never, killed before the first look)."""
    started = NodesSession(2, 1, timeout=20)
    session = started.session
    pids = session.worker_pids
    segments = mpi_segments(pids)
    os.kill(pids[1], signal.SIGKILL)  # node 1's only worker
    with pytest.raises(disco.WorkerDied, match="worker 1 died"):
        for _ in range(200):
            session.sync_workers()
            time.sleep(0.05)
    assert session.closed
    statuses = started.close()
    assert statuses[0] is not None  # the node ended by itself, not killed by the test
    assert wait_gone(pids) == []
    assert len(segments) == 2
    assert [path for path in segments if os.path.exists(path)] == []


def test_nodes_and_workers_end_when_the_controller_is_killed(tmp_path: Any) -> None:
    """The controller (a separate process here) dies without a word: the remote node sees
    its channel close and stops its workers; node 0's workers end by themselves. Neither
    node leaves an MPI shared-memory file or a folder in the temporary directory (the
    controller's folder of its workers' records went once they had all said hello)."""
    port = free_port()
    key = "ef" * 32
    env = node_env(key) | {"TMPDIR": str(tmp_path)}
    script = textwrap.dedent(
        f"""
        import time
        from cubepool import disco
        session = disco.SocketSession(2, 1, 1, "127.0.0.1", {port}, key="{key}")
        print(*session.worker_pids, flush=True)
        time.sleep(600)
        """
    )
    remote = subprocess.Popen(
        [sys.executable, "-m", "cubepool.disco.remote", "127.0.0.1", str(port), "1"], env=env
    )
    controller = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert controller.stdout is not None
        pids = [int(word) for word in controller.stdout.readline().split()]
        assert len(pids) == 2
        segments = mpi_segments(pids)
    finally:
        controller.kill()
        controller.wait()
        if controller.stdout is not None:
            controller.stdout.close()
    assert remote.wait(30) == 0
    assert wait_gone(pids, timeout=30) == []
    assert len(segments) == 2
    assert [path for path in segments if os.path.exists(path)] == []
    assert sorted(path.name for path in tmp_path.iterdir()) == []


@pytest.fixture
def namespace() -> Iterator[tuple[str, str, str]]:
    """A network namespace joined to this one by a veth pair: (namespace, the address of
    this side, the address of its side). Skips where namespaces cannot be made (not
    root, no ``ip``)."""
    tag = f"{os.getpid() % 100000}"
    name, host_end, ns_end = f"cpdisco-{tag}", f"cpdh{tag}", f"cpdn{tag}"
    here, there = "10.213.0.1", "10.213.0.2"
    steps = [
        ["ip", "netns", "add", name],
        ["ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end],
        ["ip", "link", "set", ns_end, "netns", name],
        ["ip", "addr", "add", f"{here}/24", "dev", host_end],
        ["ip", "link", "set", host_end, "up"],
        ["ip", "netns", "exec", name, "ip", "addr", "add", f"{there}/24", "dev", ns_end],
        ["ip", "netns", "exec", name, "ip", "link", "set", ns_end, "up"],
        ["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"],
    ]
    try:
        for step in steps:
            done = subprocess.run(step, capture_output=True, timeout=30)
            if done.returncode != 0:
                pytest.skip(f"cannot make a network namespace: {step}: {done.stderr!r}")
        yield name, here, there
    except FileNotFoundError as exc:
        pytest.skip(f"cannot make a network namespace: {exc}")
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", host_end], capture_output=True, timeout=30)


def test_a_node_in_another_network_namespace(
    namespace: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node 1 runs in its own network namespace, reaching the controller and node 0 over
    a veth pair only (UCX restricted to TCP, so MPI's bytes cross it too)."""
    name, here, _ = namespace
    monkeypatch.setenv("UCX_TLS", "tcp,self")
    key, port = "a1" * 32, free_port()
    env = node_env(key)
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    command = [sys.executable, "-m", "cubepool.disco.remote", here, str(port), "2"]
    remote = subprocess.Popen(["ip", "netns", "exec", name, *command], env=env)
    try:
        with disco.SocketSession(2, 2, 2, here, port, key=key, timeout=30) as sess:
            sess.import_python_module("disco_helpers")
            values = [np.full(3, w + 1, np.float64) for w in range(4)]
            src, dst = sess.empty((3,), "float64"), sess.empty((3,), "float64")
            for worker, value in enumerate(values):
                src.debug_copy_from(worker, value)
            sess.allreduce(src, dst, in_group=False)
            assert [dst.debug_get_from_remote(w).tolist() for w in range(4)] == [[10.0] * 3] * 4
            sess.get_global_func("tests.disco.ring")(src, dst)  # 1 -> 2 and 3 -> 0 cross
            got = [dst.debug_get_from_remote(w).tolist() for w in range(4)]
            assert got == [values[(w - 1) % 4].tolist() for w in range(4)]
            pids = sess.worker_pids
        assert remote.wait(30) == 0
        assert wait_gone(pids) == []
    finally:
        if remote.poll() is None:
            remote.kill()
            remote.wait()


def test_a_node_ends_at_any_frame_after_its_welcome(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller says nothing to a node after its welcome: a frame, or bytes that
    cannot be one, end the node (and its workers) as the channel's end does, where the
    node used to buffer whatever came."""
    import argparse
    import threading

    from test_disco_wire import KEY, channel_pair

    from cubepool.disco import remote
    from cubepool.disco.protocol import NodeWelcome

    started: list[subprocess.Popen[bytes]] = []

    def start(command: list[str], key_file: str, **_: object) -> subprocess.Popen[bytes]:
        assert os.path.exists(key_file)  # the workers' key, in a private file
        started.append(subprocess.Popen(["sleep", "60"], start_new_session=True))
        return started[-1]

    monkeypatch.setattr(remote, "start_mpiexec", start)
    monkeypatch.setattr(remote, "find_mpiexec", lambda explicit: "mpiexec")
    monkeypatch.setattr(remote, "SHUTDOWN_GRACE", 0.1)
    args = argparse.Namespace(mpiexec=None, num_workers=1, python=sys.executable)
    welcome = NodeWelcome(1, 2, 1, "127.0.0.1:1")
    for extra in (b"a frame", None):
        controller, node = channel_pair()
        outcome: list[int] = []
        thread = threading.Thread(
            target=lambda node=node, outcome=outcome: outcome.append(
                remote._serve(node, welcome, KEY, args)
            )
        )
        thread.start()
        time.sleep(0.3)
        assert thread.is_alive()  # serving while nothing comes
        if extra is None:  # bytes no frame can be: a length past any limit
            os.write(controller.fd, b"\xff" * 64)
        else:
            controller.send(extra)
        thread.join(10)
        assert not thread.is_alive() and outcome == [0]
        assert started[-1].poll() is not None  # its workers' process group is gone
        controller.close()
        node.close()
