"""Session factories for the ports of TVM's Disco tests (``test_tvm_session.py``,
``test_tvm_ccl.py``), called as TVM's tests call theirs: ``session_kind(num_workers=N,
num_groups=G, build_ring=B)``.

Where the ports differ from TVM here: each session's workers import the tests' helper
module ``disco_helpers`` (TVM's workers have ``tests.disco.*`` and the CCL test functions
built in), and every session a test opened is shut down after it (:func:`close_all`;
TVM's tests leave that to garbage collection), so no worker outlives its test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from disco_nodes import NodesSession

from cubepool import disco

TESTS = Path(__file__).parent
_OPEN: list[disco.Session] = []
_NODES: list[NodesSession] = []

#: Seconds any wait of these sessions may take (generous: the machine may be loaded).
TIMEOUT = 60.0


def _ready(session: disco.Session) -> disco.Session:
    session.import_python_module("disco_helpers")
    _OPEN.append(session)
    return session


def threaded_session(
    num_workers: int, num_groups: int = 1, build_ring: bool = False
) -> disco.Session:
    """TVM's ``di.ThreadedSession``."""
    return _ready(disco.ThreadedSession(num_workers, num_groups, build_ring, timeout=TIMEOUT))


def process_session(
    num_workers: int, num_groups: int = 1, build_ring: bool = False
) -> disco.Session:
    """TVM's ``di.ProcessSession``; the workers find the helper module on their path."""
    with pytest.MonkeyPatch.context() as patch:
        path = os.pathsep.join(p for p in [str(TESTS), os.environ.get("PYTHONPATH")] if p)
        patch.setenv("PYTHONPATH", path)
        session = disco.ProcessSession(
            num_workers, num_groups, build_ring=build_ring, timeout=TIMEOUT
        )
    return _ready(session)


def create_socket_session(
    num_workers: int, num_groups: int = 1, build_ring: bool = False
) -> disco.Session:
    """TVM's ``create_socket_session``: a ``SocketSession`` of two nodes (this process and
    one ``python -m cubepool.disco.remote`` process), ``num_workers // 2`` workers each."""
    assert num_workers % 2 == 0
    nodes = NodesSession(2, num_workers // 2, num_groups, build_ring=build_ring, timeout=TIMEOUT)
    _NODES.append(nodes)
    return _ready(nodes.session)


def close_all() -> None:
    """Shut down every session opened since the last call; remote nodes must exit 0."""
    while _OPEN:
        _OPEN.pop().shutdown()
    while _NODES:
        assert _NODES.pop().close() == [0]
