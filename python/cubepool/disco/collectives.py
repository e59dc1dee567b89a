"""The in-worker functions of TVM's Disco, and their registered names.

Call these from code that a session runs on its workers (a function registered with
``register_func`` and called through ``Session.call_packed``): ``worker_id()``, the
collectives (``allreduce``, ``allgather``, ``broadcast_from_worker0``,
``scatter_from_worker0``, ``gather_to_worker0``), the point-to-point transfers
(``send_to_worker``, ``recv_from_worker``, ``send_to_next_group``,
``recv_from_prev_group``, ``recv_from_worker0``), ``sync_worker`` and
``disco_empty_tensor``. Each is also registered under TVM's name
(``runtime.disco.allreduce``, ...), which is how the controller's ``Session`` methods
reach them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import cubepool
from cubepool._errors import InvalidArgument
from cubepool.disco.communicator import MPICommunicator, ThreadCommunicator
from cubepool.disco.protocol import HOST_CCL, REDUCE_OPS, ReduceKind
from cubepool.disco.registry import register_func
from cubepool.disco.worker import PREPARERS, DiscoWorker, current_worker

#: The ``ReduceKind`` of each int (what the session sends): a dict lookup is cheaper than
#: the enum's constructor, on a path every allreduce takes.
_KINDS = {int(kind): kind for kind in ReduceKind}


def _reduce_kind(kind: Any) -> ReduceKind:
    """A ``ReduceKind`` from an int, a name (``"sum"``), or a one-element sequence (TVM
    passes ``ShapeTuple([kind])``); ``InvalidArgument`` for anything else."""
    if type(kind) is int and kind in _KINDS:
        return _KINDS[kind]
    if isinstance(kind, str):
        if kind not in REDUCE_OPS:
            raise InvalidArgument(f"unknown reduce op {kind!r}; choose from {list(REDUCE_OPS)}")
        return REDUCE_OPS[kind]
    if isinstance(kind, tuple | list) and len(kind) == 1:
        kind = kind[0]
    try:
        return ReduceKind(int(kind))
    except (TypeError, ValueError):
        raise InvalidArgument(f"unknown ReduceKind {kind!r}") from None


@register_func("runtime.disco.worker_id")
def worker_id() -> int:
    """The global id of the worker running this code (TVM's ``WorkerId``)."""
    return current_worker().worker_id


@register_func("runtime.disco.num_workers")
def num_workers() -> int:
    """How many workers the session has."""
    return current_worker().num_workers


@register_func("runtime.disco.worker_rank")
def worker_rank() -> int:
    """The global id of the worker running this code (TVM's ``worker_rank``, an int where
    TVM's ``worker_id`` is a one-element shape; here both are ints)."""
    return current_worker().worker_id


@register_func("runtime.disco.world_size")
def world_size() -> int:
    """How many workers the session has (TVM's ``world_size``)."""
    return current_worker().num_workers


@register_func("runtime.disco.device")
def device() -> cubepool.Device:
    """The device this worker's tensors are on (TVM's ``default_device``): host memory,
    ``cpu:0``, whatever ``init_ccl`` recorded as the worker's device id."""
    return cubepool.Device("cpu", 0)


@register_func("runtime.disco.sync_worker")
def sync_worker() -> None:
    """Wait until this worker's work is done (TVM's ``SyncWorker``; host work is synchronous)."""
    current_worker()


@register_func("runtime.disco.empty")
def disco_empty_tensor(
    shape: Any,
    dtype: str,
    device: Any = None,
    worker0_only: bool = False,
    in_group: bool = True,
) -> cubepool.Tensor | None:
    """An uninitialised tensor from this worker's pools (TVM's ``DiscoEmptyTensor``).

    With ``worker0_only``, only worker 0 (each group's worker 0 if ``in_group``) allocates
    and the other workers return None.
    """
    worker = current_worker()
    if worker0_only and not (worker.worker_id == 0 or (in_group and worker.is_group_root)):
        return None
    return worker.empty(tuple(shape), dtype, device)


@register_func("runtime.disco.allreduce")
def allreduce(send: Any, reduce_kind: Any, in_group: bool, recv: Any) -> None:
    """Reduce ``send`` over the workers (or the group) into ``recv`` (TVM's ``AllReduce``)."""
    current_worker().communicator.allreduce(send, _reduce_kind(reduce_kind), in_group, recv)


@register_func("runtime.disco.allgather")
def allgather(send: Any, in_group: bool, recv: Any) -> None:
    """Concatenate every worker's ``send`` into ``recv`` (TVM's ``AllGather``)."""
    current_worker().communicator.allgather(send, in_group, recv)


def _prepare_allreduce(
    send: Any, reduce_kind: Any, in_group: bool, recv: Any
) -> Callable[[], None]:
    """:func:`allreduce` on these operands as a call to repeat (the worker's replays)."""
    communicator = current_worker().communicator
    return communicator.prepare_allreduce(send, _reduce_kind(reduce_kind), in_group, recv)


def _prepare_allgather(send: Any, in_group: bool, recv: Any) -> Callable[[], None]:
    """:func:`allgather` on these operands as a call to repeat (the worker's replays)."""
    return current_worker().communicator.prepare_allgather(send, in_group, recv)


PREPARERS[allreduce] = _prepare_allreduce
PREPARERS[allgather] = _prepare_allgather


@register_func("runtime.disco.broadcast_from_worker0")
def broadcast_from_worker0(send: Any, in_group: bool, recv: Any) -> None:
    """Copy worker 0's ``send`` into every ``recv`` (TVM's ``BroadcastFromWorker0``)."""
    current_worker().communicator.broadcast_from_worker0(send, in_group, recv)


@register_func("runtime.disco.scatter_from_worker0")
def scatter_from_worker0(send: Any, in_group: bool, recv: Any) -> None:
    """Split worker 0's ``send`` into equal parts, one per worker (TVM's ``ScatterFromWorker0``).

    ``send`` is read on worker 0 only (each group's worker 0 if ``in_group``); the other
    workers may pass None.
    """
    current_worker().communicator.scatter_from_worker0(send, in_group, recv)


@register_func("runtime.disco.gather_to_worker0")
def gather_to_worker0(send: Any, in_group: bool, recv: Any) -> None:
    """Concatenate every worker's ``send`` into worker 0's ``recv`` (TVM's ``GatherToWorker0``).

    ``recv`` is written on worker 0 only (each group's worker 0 if ``in_group``); the other
    workers may pass None.
    """
    current_worker().communicator.gather_to_worker0(send, in_group, recv)


@register_func("runtime.disco.send_to_worker")
def send_to_worker(buffer: Any, receiver_id: int) -> None:
    """Send ``buffer`` to the worker of global id ``receiver_id`` (TVM's ``SendToWorker``)."""
    current_worker().communicator.send(buffer, receiver_id)


@register_func("runtime.disco.recv_from_worker")
def recv_from_worker(buffer: Any, sender_id: int) -> None:
    """Receive into ``buffer`` from the worker ``sender_id`` (TVM's ``RecvFromWorker``)."""
    current_worker().communicator.recv(buffer, sender_id)


@register_func("runtime.disco.recv_from_worker0")
def recv_from_worker0(buffer: Any) -> None:
    """Receive ``buffer`` from worker 0; a no-op on worker 0 (TVM's ``RecvFromWorker0``).

    Worker 0 sends with ``send_to_worker(buffer, i)`` for each receiving worker ``i``.
    """
    worker = current_worker()
    if worker.worker_id != 0:
        worker.communicator.recv(buffer, 0)


@register_func("runtime.disco.send_to_next_group")
def send_to_next_group(buffer: Any) -> None:
    """Send ``buffer`` to this worker's counterpart in the next group (TVM's ``SendToNextGroup``).

    Raises ``InvalidArgument`` on a worker of the last group.
    """
    worker = current_worker()
    if worker.group_id == worker.num_groups - 1:
        raise InvalidArgument(f"worker {worker.worker_id} is in the last group: no next group")
    worker.communicator.send(buffer, worker.worker_id + worker.group_size)


@register_func("runtime.disco.recv_from_prev_group")
def recv_from_prev_group(buffer: Any) -> None:
    """Receive ``buffer`` from this worker's counterpart in the previous group.

    TVM's ``RecvFromPrevGroup``; raises ``InvalidArgument`` on a worker of the first group.
    """
    worker = current_worker()
    if worker.group_id == 0:
        raise InvalidArgument(f"worker {worker.worker_id} is in the first group: no previous group")
    worker.communicator.recv(buffer, worker.worker_id - worker.group_size)


@register_func("runtime.disco.memory_report")
def memory_report() -> cubepool.MemoryReport:
    """This worker's ``MemoryManagement.memory_report()``."""
    return current_worker().memory.memory_report()


@register_func("runtime.disco.record_memory")
def record_memory(label: str) -> cubepool.MemoryRecord:
    """Record this worker's memory under ``label`` (``MemoryManagement.record_memory``)."""
    return current_worker().memory.record_memory(label)


@register_func("runtime.disco.live_registers")
def live_registers() -> list[int]:
    """The ids of this worker's live registers, sorted (to check that ``DRef``s are freed)."""
    return sorted(current_worker().registers)


@register_func("runtime.disco._init_ccl")
def init_ccl(ccl: str, device_ids: tuple[int, ...], workers_per_node: int) -> None:
    """Record the engine and this worker's device (``Session.init_ccl`` checked both on the
    controller); ``InvalidArgument`` if ``ccl`` is not what this worker's collectives run
    on."""
    worker = current_worker()
    if ccl != worker.communicator.name:
        raise InvalidArgument(
            f"worker {worker.worker_id} runs its collectives on {worker.communicator.name!r}, "
            f"not {ccl!r}"
        )
    worker.ccl = ccl
    worker.device_id = device_ids[worker.worker_id % workers_per_node]


@register_func("runtime.disco.compiled_ccl")
def compiled_ccl() -> str:
    """The collective library this build has: ``"cpuccl"`` (TVM's ``compiled_ccl``,
    which names the one GPU library, ``"nccl"`` or ``"rccl"``, TVM was compiled with).

    cubepool has no GPU library; its collectives run on host memory, and every session
    kind takes TVM's name for those, ``"cpuccl"``, in ``init_ccl`` (as its own engine:
    MPI or threads). Registered in every process that imports ``cubepool.disco``, the
    controller too (``cubepool.disco.get_global_func`` is TVM's ``get_global_func``), so
    TVM's tests that parametrize over ``compiled_ccl()`` (``test_ccl.py``) run on host
    memory, and those that need ``"nccl"`` (``test_loader.py``) skip, as on a TVM built
    without it."""
    return HOST_CCL


#: Modules of TVM's that a worker is asked to import, and cubepool's counterparts:
#: TVM's worker module registers TVM's ``tests.disco.*`` functions through TVM's own
#: registry, which cubepool's workers do not look in (:mod:`cubepool.disco.testing`
#: registers them in cubepool's).
TVM_MODULES = {"tvm.exec.disco_worker": "cubepool.disco.testing"}


@register_func("runtime.disco._import_python_module")
def import_python_module(module_name: str) -> None:
    """Import ``module_name`` on this worker (so its ``register_func`` calls run); a name
    in :data:`TVM_MODULES` imports its cubepool counterpart."""
    importlib.import_module(TVM_MODULES.get(module_name, module_name))


def _tvm_test_world(what: str) -> DiscoWorker:
    """This worker, checked to be in the world TVM's CCL test functions need: 4 workers
    in 2 groups (``InvalidArgument`` otherwise, as TVM's checks fail)."""
    worker = current_worker()
    if worker.num_workers != 4 or worker.num_groups != 2:
        raise InvalidArgument(
            f"{what} needs 4 workers in 2 groups (TVM's test), got {worker.num_workers} in "
            f"{worker.num_groups}"
        )
    return worker


def ccl_test_send_to_next_group_recv_from_prev_group(buffer: Any) -> None:
    """TVM's CCL test function: group 0 sends ``buffer`` to group 1, which receives it."""
    worker = _tvm_test_world("test_send_to_next_group_recv_from_prev_group")
    if worker.group_id == 0:
        send_to_next_group(buffer)
    else:
        recv_from_prev_group(buffer)


def ccl_test_worker2_sends_to_worker0(buffer: Any) -> None:
    """TVM's CCL test function: worker 2 sends ``buffer`` to worker 0."""
    worker = _tvm_test_world("test_worker2_sends_to_worker0")
    if worker.worker_id == 2:
        send_to_worker(buffer, 0)
    elif worker.worker_id == 0:
        recv_from_worker(buffer, 2)


#: The in-worker functions TVM registers a second time under each collective engine's
#: name (``runtime.disco.<ccl>.allreduce``, ...: its ``nccl.cc``), with the two test
#: functions its CCL library carries; here under each engine a session runs on.
_PER_ENGINE: dict[str, Callable[..., Any]] = {
    "allreduce": allreduce,
    "allgather": allgather,
    "broadcast_from_worker0": broadcast_from_worker0,
    "scatter_from_worker0": scatter_from_worker0,
    "gather_to_worker0": gather_to_worker0,
    "recv_from_worker0": recv_from_worker0,
    "send_to_next_group": send_to_next_group,
    "recv_from_prev_group": recv_from_prev_group,
    "send_to_worker": send_to_worker,
    "recv_from_worker": recv_from_worker,
    "sync_worker": sync_worker,
    "test_send_to_next_group_recv_from_prev_group": (
        ccl_test_send_to_next_group_recv_from_prev_group
    ),
    "test_worker2_sends_to_worker0": ccl_test_worker2_sends_to_worker0,
}
for _engine in (MPICommunicator.name, ThreadCommunicator.name, HOST_CCL):
    for _name, _func in _PER_ENGINE.items():
        register_func(f"runtime.disco.{_engine}.{_name}", _func)
