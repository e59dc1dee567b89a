"""``SocketSession``: a session whose workers run on several nodes (TVM's ``SocketSession``).

The controller listens on ``HOST:PORT`` and starts node 0's workers itself (one
``mpiexec``). Every other node runs ``python -m cubepool.disco.remote HOST PORT
NUM_WORKERS`` (:mod:`cubepool.disco.remote`, TVM's ``tvm.exec.disco_remote_socket_session``):
it connects, proves the session key, is told its node index, and starts its own workers
with its own ``mpiexec``; they connect back to the same listener. Worker ids are global:
node ``k``'s local worker ``i`` is worker ``k * num_workers_per_node + i``, and groups are
runs of consecutive ids, so a group may span nodes, as in TVM.

Collectives, groups and send/receive run on MPI across nodes. The nodes' worlds are
joined with MPI's own connect/accept (:mod:`cubepool.disco.nodes`) rather than started as
one world by one ``mpiexec``, because that is what TVM's model asks for: each node starts
its own workers, and nothing but the nodes themselves needs to reach them (no ssh from
the controller, no host file, no launcher that knows every host). One world for all
hosts is what ``ProcessSession(hostfile=...)`` already gives.

Every connection to the listener (node or worker) is authenticated with the session key
and every later frame carries a MAC (:mod:`cubepool.disco.wire`): the key must reach
every node out of band, in ``CUBEPOOL_DISCO_AUTHKEY`` (hex) or a key file.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Sequence

from cubepool._errors import InvalidArgument
from cubepool.disco.errors import DiscoError, FrameRejected
from cubepool.disco.keys import AUTHKEY_ENV, LoopbackKey, loopback_address
from cubepool.disco.nodes import join_nodes
from cubepool.disco.process import (
    TVM_ENTRYPOINT,
    _MPISession,
    _MPITransport,
    entrypoint_module,
)
from cubepool.disco.session import (
    DEFAULT_FAILURE_GRACE,
    DEFAULT_TIMEOUT,
    _check_timeouts,
    check_build_ring,
)
from cubepool.disco.wire import parse_key


def session_key(key: str | bytes | bytearray | memoryview | None) -> bytes:
    """The key of a multi-node session: ``key`` (bytes-like, or hex text), else the hex in
    ``CUBEPOOL_DISCO_AUTHKEY``; ``InvalidArgument`` naming the fix and where the key came
    from when there is none or it is not a key (a wrong type included)."""
    source = "key="
    if key is None:
        source = AUTHKEY_ENV
        key = os.environ.get(AUTHKEY_ENV)
        if not key:
            raise InvalidArgument(
                f"a SocketSession needs a key shared with its remote nodes: set {AUTHKEY_ENV} "
                "to the same hex key (python -c 'import secrets; print(secrets.token_hex(32))') "
                "for the controller and every `python -m cubepool.disco.remote`, or pass key= "
                "(a session on a loopback host with a port given makes one for its nodes)"
            )
    try:
        return parse_key(key)
    except FrameRejected as exc:
        raise InvalidArgument(f"bad session key ({source}): {exc.reason}") from None


class SocketSession(_MPISession):
    """A session over ``num_nodes`` nodes of ``num_workers_per_node`` workers each.

    As TVM's ``SocketSession(num_nodes, num_workers_per_node, num_groups, host, port)``:
    the controller listens on ``host:port`` and waits up to ``startup_timeout`` seconds
    for the ``num_nodes - 1`` remote nodes and all workers (``port=0`` picks a free port,
    shown by :attr:`port` once started: of use with one node only, since remote nodes
    must know the port before the session is up); node 0's workers run on this host. ``key`` is the
    session key (bytes-like or hex; default ``CUBEPOOL_DISCO_AUTHKEY``), which every remote
    node must hold too. With neither, a session of one node makes a key of its own, and
    one whose ``host`` is a loopback address (TVM's tests use ``"localhost"``) and whose
    ``port`` is given leaves a new key where its user's ``python -m cubepool.disco.remote
    HOST PORT N`` finds it (:mod:`cubepool.disco.keys`), until every node is in.
    ``timeout``, ``failure_grace``, ``mpiexec``, ``mpiexec_args``, ``python`` and
    ``entrypoint`` (keyword only here: TVM's ``SocketSession`` has none, and its nodes'
    workers run TVM's default, whose ``tests.disco.*`` functions every worker imports
    here too) are as for ``ProcessSession``.
    """

    def __init__(
        self,
        num_nodes: int,
        num_workers_per_node: int,
        num_groups: int = 1,
        host: str = "127.0.0.1",
        port: int = 0,
        build_ring: bool = False,
        *,
        entrypoint: str = TVM_ENTRYPOINT,
        key: str | bytes | bytearray | memoryview | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        startup_timeout: float = 60.0,
        failure_grace: float = DEFAULT_FAILURE_GRACE,
        mpiexec: str | None = None,
        mpiexec_args: Sequence[str] = (),
        python: str = sys.executable,
    ) -> None:
        for name, value in (
            ("num_nodes", num_nodes),
            ("num_workers_per_node", num_workers_per_node),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"{name} must be an int >= 1, got {value!r}")
        num_workers = num_nodes * num_workers_per_node
        if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1:
            raise InvalidArgument(f"num_groups must be an int >= 1, got {num_groups!r}")
        if num_workers % num_groups:
            raise InvalidArgument(
                f"{num_workers} workers ({num_nodes} node(s) of {num_workers_per_node}) do "
                f"not split into {num_groups} groups"
            )
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise InvalidArgument(f"port must be an int in 0..65535, got {port!r}")
        module = entrypoint_module(entrypoint)
        _check_timeouts(timeout, failure_grace, startup_timeout)
        check_build_ring(build_ring)
        self._num_nodes = num_nodes
        left: list[LoopbackKey] = []
        listening = None
        given = key is not None or bool(os.environ.get(AUTHKEY_ENV))
        if not given and num_nodes == 1:
            key = secrets.token_bytes(32)  # no remote node needs to know it
        elif not given and port and (address := loopback_address(host)) is not None:
            # Listens on the address it checked (resolved once), and leaves the key only
            # once the port is its own: a session that cannot bind it replaces no
            # running session's key.
            new_key = secrets.token_bytes(32)
            host, key = address, new_key

            def listening(bound: int) -> None:
                try:
                    left.append(LoopbackKey(bound, new_key))
                except (OSError, FrameRejected) as exc:
                    raise InvalidArgument(f"cannot leave a loopback session key: {exc}") from None

        try:
            self._mpi = _MPITransport(
                num_workers,
                num_groups,
                timeout,
                startup_timeout,
                host,
                None,
                mpiexec,
                mpiexec_args,
                python,
                key=session_key(key),
                port=port,
                num_nodes=num_nodes,
                force_tcp=True,
                listening=listening,
            )
            super().__init__(
                self._mpi,
                num_workers,
                num_groups,
                timeout,
                failure_grace,
                workers_per_node=num_workers_per_node,
            )
            try:
                join_nodes(self, num_nodes)
            except BaseException as exc:
                self._close(force=True, reason=f"the nodes' MPI worlds did not join: {exc}")
                if isinstance(exc, DiscoError):
                    raise
                raise DiscoError(f"the nodes' MPI worlds did not join: {exc}") from exc
            self._import_at_start(module, f"entrypoint {entrypoint!r}")
        finally:
            # Every node is in (or the session did not start): no one else needs it.
            for loopback in left:
                loopback.remove()

    @property
    def num_nodes(self) -> int:
        """How many nodes the workers run on."""
        return self._num_nodes

    @property
    def num_workers_per_node(self) -> int:
        """Workers on each node."""
        return self._workers_per_node

    @property
    def port(self) -> int:
        """The TCP port the controller listens on."""
        return int(self._mpi.connect.rpartition(":")[2])
