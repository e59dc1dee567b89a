"""Joining the MPI worlds of a ``SocketSession``'s nodes into one.

Each node of a ``SocketSession`` starts its own workers with its own ``mpiexec``, so each
node is an MPI world of its own. Once every worker has connected to the controller, the
controller has the workers join those worlds with MPI's dynamic-process calls, which
every MPI implements: worker 0 opens a port (``MPI_Open_port``), then for node 1, 2, ...
in turn (the next only once the last has joined everywhere: an accept takes whichever
connect comes first) the ranks joined so far accept (``MPI_Comm_accept``) while the
node's ranks connect (``MPI_Comm_connect``), and both sides merge the two into one communicator, the
new node's ranks after the others'. After the last node, every worker's world has global
rank ``node * workers_per_node + local rank``: collectives, groups and send/receive run
through MPI across nodes as within one.

The worker-side steps are registered functions (``runtime.disco._mpi_*``), sent as calls
like any other; :func:`join_nodes` drives them from the controller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cubepool.disco.communicator import MPICommunicator
from cubepool.disco.errors import DiscoError
from cubepool.disco.registry import register_func
from cubepool.disco.worker import current_worker

if TYPE_CHECKING:
    from cubepool.disco.session import Session


def _mpi() -> MPICommunicator:
    communicator = current_worker().communicator
    if not isinstance(communicator, MPICommunicator):
        raise DiscoError("joining nodes needs workers whose collectives run on MPI")
    return communicator


@register_func("runtime.disco._mpi_open_port")
def mpi_open_port() -> str | None:
    """Open the port the other nodes connect to: its name on worker 0, None elsewhere."""
    communicator = _mpi()
    return communicator.open_port() if communicator.rank == 0 else None


@register_func("runtime.disco._mpi_join")
def mpi_join(port: str, node: int) -> None:
    """Take node ``node`` into the joined world: the nodes before it accept, its own
    ranks connect, the nodes after it do nothing (they join at their own turn)."""
    communicator = _mpi()
    if communicator.node < node:
        communicator.join_accept(port, node)
    elif communicator.node == node:
        communicator.join_connect(port)


@register_func("runtime.disco._mpi_close_port")
def mpi_close_port(port: str) -> None:
    """Close the port of :func:`mpi_open_port` (on worker 0)."""
    communicator = _mpi()
    if communicator.rank == 0:
        communicator.close_port(port)


def join_nodes(session: Session, num_nodes: int) -> None:
    """Join the MPI worlds of ``num_nodes`` nodes (every worker connected) into one.

    Waits until every worker is done; a node that cannot join ends in the session's
    ``DiscoTimeout`` or ``WorkerError``.
    """
    if num_nodes < 2:
        return
    port = session.get_global_func("runtime.disco._mpi_open_port")().debug_get_from_remote(0)
    if not isinstance(port, str):
        raise DiscoError(f"worker 0 opened no MPI port (got {port!r})")
    for node in range(1, num_nodes):
        # One node at a time: the port is the same for all, and an accept takes whichever
        # connect comes first, so node k+1 must not connect before node k has joined.
        session._run_builtin("runtime.disco._mpi_join", port, node)
        session.sync_workers()
    session._run_builtin("runtime.disco._mpi_close_port", port)
    session.sync_workers()
