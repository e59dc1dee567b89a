"""Disco: TVM's distributed runtime on host memory, with collectives through MPI.

A controller drives workers through a command queue (``ThreadedSession``,
``ProcessSession``, ``SocketSession`` across nodes); objects live on every worker under
one register id (``DRef``); tensors come from each worker's own ``MemoryManagement`` and
move between workers by collectives (``allreduce``, ``allgather``,
``broadcast_from_worker0``, ...), which a ``ProcessSession`` or ``SocketSession`` runs
through mpi4py and ``ThreadedSession`` in-process. Install the MPI pieces with
``pip install "cubepool[disco]"``.

TVM's ``tests.disco.*`` worker functions are in :mod:`cubepool.disco.testing` (imported
on demand, not here).
"""

from __future__ import annotations

from cubepool.disco import collectives, loader, nodes, upload
from cubepool.disco.collectives import (
    allgather,
    allreduce,
    broadcast_from_worker0,
    disco_empty_tensor,
    gather_to_worker0,
    num_workers,
    recv_from_prev_group,
    recv_from_worker,
    recv_from_worker0,
    scatter_from_worker0,
    send_to_next_group,
    send_to_worker,
    sync_worker,
    worker_id,
)
from cubepool.disco.dref import DPackedFunc, DRef
from cubepool.disco.errors import (
    DiscoError,
    DiscoTimeout,
    DiscoUnsupported,
    FrameRejected,
    MPIUnavailable,
    SessionClosed,
    WorkerDied,
    WorkerError,
)
from cubepool.disco.process import ProcessSession
from cubepool.disco.protocol import (
    REDUCE_OPS,
    DiscoAction,
    ReduceKind,
    disco_action_to_str,
    reduce_kind_to_str,
)
from cubepool.disco.registry import get_global_func, list_global_func_names, register_func
from cubepool.disco.session import Session, ThreadedSession
from cubepool.disco.socket_session import SocketSession
from cubepool.disco.worker import DiscoWorker, current_worker

__all__ = [
    "REDUCE_OPS",
    "DPackedFunc",
    "DRef",
    "DiscoAction",
    "DiscoError",
    "DiscoTimeout",
    "DiscoUnsupported",
    "DiscoWorker",
    "FrameRejected",
    "MPIUnavailable",
    "ProcessSession",
    "ReduceKind",
    "Session",
    "SessionClosed",
    "SocketSession",
    "ThreadedSession",
    "WorkerDied",
    "WorkerError",
    "allgather",
    "allreduce",
    "broadcast_from_worker0",
    "collectives",
    "current_worker",
    "disco_action_to_str",
    "disco_empty_tensor",
    "gather_to_worker0",
    "get_global_func",
    "list_global_func_names",
    "loader",
    "nodes",
    "num_workers",
    "recv_from_prev_group",
    "recv_from_worker",
    "recv_from_worker0",
    "reduce_kind_to_str",
    "register_func",
    "scatter_from_worker0",
    "send_to_next_group",
    "send_to_worker",
    "sync_worker",
    "upload",
    "worker_id",
]
