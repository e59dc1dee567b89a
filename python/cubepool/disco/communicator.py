"""Where collectives run: MPI for processes, a shared-memory rendezvous for threads.

A :class:`Communicator` moves the bytes of tensors between the workers of one session.
Tensors are handed over as they are, through the buffer protocol, so MPI reads and
writes the worker's own pool memory without a copy. Every method checks its operands
first and raises ``InvalidArgument`` naming the problem, rather than letting MPI abort.

Groups: the ``num_workers`` workers form ``num_groups`` groups of ``group_size``
consecutive workers; ``in_group=True`` runs a collective within each group (worker 0 of
a group is its root), ``in_group=False`` across all workers (the root is worker 0).
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from cubepool._errors import InvalidArgument
from cubepool._tensor import bfloat16_bits, bfloat16_values
from cubepool.disco.errors import DiscoError, MPIUnavailable
from cubepool.disco.protocol import ReduceKind

_NUMPY_REDUCE = {
    ReduceKind.kSum: np.add,
    ReduceKind.kProd: np.multiply,
    ReduceKind.kMin: np.minimum,
    ReduceKind.kMax: np.maximum,
    ReduceKind.kAvg: np.add,
}


def as_array(buffer: Any, name: str) -> npt.NDArray[Any]:
    """A numpy view of ``buffer``'s memory (no copy); ``InvalidArgument`` if it has none."""
    if buffer is None:
        raise InvalidArgument(f"{name} is None on this worker")
    try:
        array = np.asarray(memoryview(buffer))
    except TypeError as exc:
        raise InvalidArgument(
            f"{name} must export the buffer protocol (a Tensor), got {type(buffer).__name__}"
        ) from exc
    return array


def finish_average(recv: npt.NDArray[Any], count: int) -> None:
    """Divide a sum by ``count`` in place: exactly for floats, toward zero for integers."""
    if np.issubdtype(recv.dtype, np.integer):
        quotient = np.abs(recv) // count
        np.copyto(recv, np.where(recv < 0, -quotient, quotient))
    else:
        np.divide(recv, count, out=recv)


def check_same_layout(send: npt.NDArray[Any], recv: npt.NDArray[Any], what: str) -> None:
    """``InvalidArgument`` unless two operands have one dtype and one size."""
    if send.dtype != recv.dtype or send.size != recv.size:
        raise InvalidArgument(
            f"{what}: send is {send.size} x {send.dtype} but recv is {recv.size} x {recv.dtype}"
        )


def _is_bfloat16(operand: Any) -> bool:
    """Whether ``operand`` is a ``bfloat16`` tensor (any lanes): its buffer is the
    ``uint16`` of its bits, which a reduction must not add as integers."""
    dtype = getattr(operand, "dtype", None)
    return isinstance(dtype, str) and dtype.startswith("bfloat16")


def check_reducible(
    send: Any, recv: Any, send_view: npt.NDArray[Any], recv_view: npt.NDArray[Any]
) -> bool:
    """Check an allreduce's operands (one layout, a dtype that reduces); whether they
    are ``bfloat16``, which is reduced in float32 and rounded back (as NCCL reduces
    ``ncclBfloat16``): their buffers hold ``uint16`` bits, and adding those as integers
    made sums of NaNs and tiny numbers. ``bool`` is refused, as TVM's collectives
    refuse it (numpy made a sum an or, and an average failed)."""
    check_same_layout(send_view, recv_view, "allreduce")
    if send_view.dtype == np.bool_:
        raise InvalidArgument("allreduce: bool tensors do not reduce (TVM refuses them too)")
    bfloat16 = _is_bfloat16(send)
    if bfloat16 != _is_bfloat16(recv):
        raise InvalidArgument(
            "allreduce: send and recv must both be bfloat16 or neither (the other is "
            f"{(recv if bfloat16 else send).dtype}, of the same bytes)"
        )
    return bfloat16


def in_place(
    send: Any, recv: Any, send_view: npt.NDArray[Any], recv_view: npt.NDArray[Any]
) -> bool:
    """Whether ``send`` and ``recv`` are one buffer (an in-place collective).

    ``InvalidArgument`` if they overlap without being the same bytes: MPI forbids
    aliased operands.
    """
    if send is recv:
        return True
    if not np.may_share_memory(send_view, recv_view):  # a bounds check: cheap
        return False
    if send_view.ctypes.data == recv_view.ctypes.data and send_view.nbytes == recv_view.nbytes:
        return True
    raise InvalidArgument("send and recv overlap without being the same buffer")


def check_parts(whole: npt.NDArray[Any], part: npt.NDArray[Any], parts: int, what: str) -> None:
    """``InvalidArgument`` unless ``whole`` is ``parts`` copies of ``part``'s layout."""
    if whole.dtype != part.dtype or whole.size != part.size * parts:
        raise InvalidArgument(
            f"{what}: the whole buffer is {whole.size} x {whole.dtype}, expected "
            f"{parts} parts of {part.size} x {part.dtype}"
        )


class Communicator(Protocol):
    """The collectives one worker can take part in (TVM's CCL functions)."""

    #: The engine's name, as ``Session.init_ccl`` takes it (TVM's ``nccl``, ``rccl``).
    name: str
    rank: int
    size: int
    group_size: int

    def allreduce(self, send: Any, kind: ReduceKind, in_group: bool, recv: Any) -> None:
        """Reduce ``send`` over the workers into every ``recv``."""

    def allgather(self, send: Any, in_group: bool, recv: Any) -> None:
        """Concatenate every worker's ``send`` into every ``recv``."""

    def prepare_allreduce(
        self, send: Any, kind: ReduceKind, in_group: bool, recv: Any
    ) -> Callable[[], None]:
        """What ``allreduce(send, kind, in_group, recv)`` does, as a call to repeat: the
        operands checked once, here (``InvalidArgument`` as ``allreduce``)."""

    def prepare_allgather(self, send: Any, in_group: bool, recv: Any) -> Callable[[], None]:
        """What ``allgather(send, in_group, recv)`` does, as a call to repeat (as
        :meth:`prepare_allreduce`)."""

    def broadcast_from_worker0(self, send: Any, in_group: bool, recv: Any) -> None:
        """Copy the root's ``send`` into every ``recv``."""

    def scatter_from_worker0(self, send: Any, in_group: bool, recv: Any) -> None:
        """Split the root's ``send`` into equal parts, part ``i`` to worker ``i``."""

    def gather_to_worker0(self, send: Any, in_group: bool, recv: Any) -> None:
        """Concatenate every worker's ``send`` into the root's ``recv``."""

    def send(self, buffer: Any, receiver_id: int) -> None:
        """Send ``buffer`` to the worker of global id ``receiver_id``."""

    def recv(self, buffer: Any, sender_id: int) -> None:
        """Receive into ``buffer`` from the worker of global id ``sender_id``."""

    def forget(self) -> None:
        """Drop the operands cached from earlier collectives (the worker calls this when
        the controller frees registers, so a freed tensor is not kept alive here)."""

    def close(self) -> None:
        """Release what the communicator holds."""


def _views(buffer: Any, name: str) -> tuple[memoryview, npt.NDArray[Any]]:
    """``buffer``'s memoryview and a numpy view of it (``InvalidArgument`` as
    :func:`as_array`)."""
    array = as_array(buffer, name)
    view: Any = array.base  # the memoryview that as_array made
    if not isinstance(view, memoryview):
        view = memoryview(array)  # type: ignore[arg-type]
    return view, array


def _message(view: memoryview, array: npt.NDArray[Any], types: dict[str, Any]) -> Any:
    """The buffer argument of an mpi4py collective for ``view``: ``[view, datatype]`` with
    the predefined MPI datatype mpi4py itself would look up for the buffer's type code
    (``types``: mpi4py's own table), so that it skips that lookup at each call (about a
    fifth of an ``Allgather`` call's Python-side cost); ``view`` where there is none."""
    datatype = types.get(array.dtype.char)
    return view if datatype is None else [view, datatype]


def _check_peer(rank: int, peer: int, size: int, what: str) -> None:
    if not 0 <= peer < size:
        raise InvalidArgument(f"{what}: worker id {peer} is out of range 0..{size - 1}")
    if peer == rank:
        raise InvalidArgument(f"{what}: worker {rank} cannot address itself")


class MPICommunicator:
    """Collectives through mpi4py, one worker per MPI rank.

    On one node the world is ``MPI.COMM_WORLD``. A ``SocketSession`` starts one MPI world
    per node (each node's own ``mpiexec``); the controller then joins them into one with
    MPI's own dynamic-process calls (:meth:`join_accept`, :meth:`join_connect`: node 0
    opens a port, each further node connects and the sides merge, the new node's ranks
    after the others'), so every collective and point-to-point transfer runs through MPI
    across nodes, with global ranks ``node * workers_per_node + local rank``.

    Invariants: ``rank``/``size`` are global; ``_world`` is None until every node has
    joined, and then its rank is ``rank``. ``_last_allreduce`` / ``_last_allgather`` hold
    the operands of the last allreduce / allgather that passed the checks, with what the
    checks resolved (memoryviews, MPI op, communicator): a tensor's layout never changes,
    so a collective on the very same objects (``is``) reuses them without checking again,
    as a repeated ``sess.allreduce(src, dst)`` does. They are dropped by :meth:`forget`
    (on every ``kKillReg``), so they keep no freed register's tensor alive.
    """

    name = "mpi"

    def __init__(self, num_groups: int, node: int = 0, num_nodes: int = 1) -> None:
        try:
            from mpi4py import MPI
        except ImportError as exc:  # pragma: no cover - the extra is installed in CI
            raise MPIUnavailable('mpi4py is not installed: pip install "cubepool[disco]"') from exc
        self._mpi = MPI
        self._local = MPI.COMM_WORLD
        local_size = self._local.Get_size()
        if not 0 <= node < num_nodes:
            raise InvalidArgument(f"node {node} is out of range 0..{num_nodes - 1}")
        self.node = node
        self.num_nodes = num_nodes
        self.rank: int = node * local_size + self._local.Get_rank()
        self.size: int = local_size * num_nodes
        if num_groups < 1 or self.size % num_groups:
            raise InvalidArgument(f"{self.size} workers do not split into {num_groups} groups")
        self.num_groups = num_groups
        self.group_size = self.size // num_groups
        self._world: Any = None
        self._group: Any = None
        self._joined: Any = self._local  # the nodes merged so far that this rank is in
        if num_nodes == 1:
            self._set_world(self._local)
        self._ops = {
            ReduceKind.kSum: MPI.SUM,
            ReduceKind.kProd: MPI.PROD,
            ReduceKind.kMin: MPI.MIN,
            ReduceKind.kMax: MPI.MAX,
            ReduceKind.kAvg: MPI.SUM,
        }
        self._last_allreduce: tuple[Any, ...] | None = None
        self._last_allgather: tuple[Any, ...] | None = None
        #: mpi4py's table of predefined datatypes by type code (empty if it has none).
        self._types: dict[str, Any] = dict(getattr(MPI, "_typedict", {}))

    def _set_world(self, world: Any) -> None:
        if world.Get_size() != self.size or world.Get_rank() != self.rank:
            raise DiscoError(
                f"joined MPI world has rank {world.Get_rank()} of {world.Get_size()}, expected "
                f"{self.rank} of {self.size}"
            )
        self._world = world
        self._group = world.Split(color=self.rank // self.group_size, key=self.rank)

    def open_port(self) -> str:
        """Open an MPI port for the other nodes to connect to (worker 0 only)."""
        port: str = self._mpi.Open_port()
        return port

    def close_port(self, port: str) -> None:
        """Close a port of :meth:`open_port`."""
        self._mpi.Close_port(port)

    def join_accept(self, port: str, node: int) -> None:
        """Take node ``node`` into the world this rank is in (every rank of the nodes
        before it calls this; node 0's rank 0 holds ``port``)."""
        inter = self._joined.Accept(port if self.rank == 0 else None, root=0)
        self._merge(inter, high=False, last=node == self.num_nodes - 1)

    def join_connect(self, port: str) -> None:
        """Join this node's ranks to the nodes before it (every rank of this node)."""
        inter = self._local.Connect(port, root=0)
        self._merge(inter, high=True, last=self.node == self.num_nodes - 1)

    def _merge(self, inter: Any, high: bool, last: bool) -> None:
        merged = inter.Merge(high=high)
        inter.Disconnect()
        if self._joined is not self._local:
            self._joined.Free()
        self._joined = merged
        if last:
            self._set_world(merged)

    @property
    def world(self) -> Any:
        """The MPI communicator of every worker of the session, ranks in worker order (on
        several nodes: the joined one); ``DiscoError`` before the nodes have joined."""
        return self._comm(False)

    @property
    def group(self) -> Any:
        """The MPI communicator of this worker's group (what a collective with
        ``in_group=True`` runs on); ``DiscoError`` before the nodes have joined."""
        return self._comm(True)

    def _comm(self, in_group: bool) -> Any:
        if self._world is None:
            raise DiscoError("the nodes' MPI worlds are not joined yet")
        return self._group if in_group else self._world

    def _allreduce_operands(
        self, send: Any, kind: ReduceKind, in_group: bool, recv: Any
    ) -> tuple[Any, ...]:
        """Check an allreduce's operands; ``(send, recv, kind, in_group, MPI send
        message, MPI recv message, MPI op, communicator, divisor of an average or 0,
        the numpy view the average divides, hooks)``: ``hooks`` is None, or for
        ``bfloat16`` the calls that widen ``send`` into the float32 message before the
        reduction and round the float32 result into ``recv`` after it."""
        send_buf, send_view = _views(send, "send")
        recv_buf, recv_view = _views(recv, "recv")
        bfloat16 = check_reducible(send, recv, send_view, recv_view)
        comm = self._comm(in_group)
        same = in_place(send, recv, send_view, recv_view)
        average = comm.Get_size() if kind == ReduceKind.kAvg else 0
        op = self._ops[kind]
        if bfloat16:
            # Reduced as float32 copies: widened before, rounded back into recv after.
            wide_send = np.empty(send_view.size, np.float32)
            wide_recv = np.empty(send_view.size, np.float32)
            flat_send, flat_recv = send_view.reshape(-1), recv_view.reshape(-1)

            def widen() -> None:
                np.copyto(wide_send, bfloat16_values(flat_send))

            def narrow() -> None:
                np.copyto(flat_recv, bfloat16_bits(wide_recv))

            hooks: tuple[Callable[[], None], Callable[[], None]] | None = (widen, narrow)
            send_spec: Any = wide_send
            recv_spec: Any = wide_recv
            recv_view = wide_recv
        else:
            hooks = None
            send_spec = self._mpi.IN_PLACE if same else _message(send_buf, send_view, self._types)
            recv_spec = _message(recv_buf, recv_view, self._types)
        return (
            send,
            recv,
            kind,
            in_group,
            send_spec,
            recv_spec,
            op,
            comm,
            average,
            recv_view,
            hooks,
        )

    def allreduce(self, send: Any, kind: ReduceKind, in_group: bool, recv: Any) -> None:
        """Reduce ``send`` over the workers into every ``recv`` (``MPI_Allreduce``)."""
        last = self._last_allreduce
        if (
            last is None
            or last[0] is not send
            or last[1] is not recv
            or last[2] is not kind
            or last[3] is not in_group
        ):
            last = self._last_allreduce = self._allreduce_operands(send, kind, in_group, recv)
        hooks = last[10]
        if hooks is not None:
            hooks[0]()
        last[7].Allreduce(last[4], last[5], op=last[6])
        if last[8]:
            finish_average(last[9], last[8])
        if hooks is not None:
            hooks[1]()

    def prepare_allreduce(
        self, send: Any, kind: ReduceKind, in_group: bool, recv: Any
    ) -> Callable[[], None]:
        """Check an allreduce's operands now; the call that runs it, without checking
        again (valid while ``send`` and ``recv`` live: a tensor's layout never changes)."""
        operands = self._allreduce_operands(send, kind, in_group, recv)
        run = functools.partial(operands[7].Allreduce, operands[4], operands[5], op=operands[6])
        divisor, recv_view, hooks = operands[8], operands[9], operands[10]
        if not divisor and hooks is None:
            return run

        def reduce() -> None:
            if hooks is not None:
                hooks[0]()
            run()
            if divisor:
                finish_average(recv_view, divisor)
            if hooks is not None:
                hooks[1]()

        return reduce

    def _allgather_operands(self, send: Any, in_group: bool, recv: Any) -> tuple[Any, ...]:
        """Check an allgather's operands; ``(send, recv, in_group, MPI send message, MPI
        recv message, communicator)``."""
        comm = self._comm(in_group)
        send_buf, send_view = _views(send, "send")
        recv_buf, recv_view = _views(recv, "recv")
        check_parts(recv_view, send_view, comm.Get_size(), "allgather")
        send_spec, recv_spec = (
            _message(send_buf, send_view, self._types),
            _message(recv_buf, recv_view, self._types),
        )
        return (send, recv, in_group, send_spec, recv_spec, comm)

    def allgather(self, send: Any, in_group: bool, recv: Any) -> None:
        """Concatenate every worker's ``send`` into every ``recv`` (``MPI_Allgather``)."""
        last = self._last_allgather
        if last is None or last[0] is not send or last[1] is not recv or last[2] is not in_group:
            last = self._last_allgather = self._allgather_operands(send, in_group, recv)
        last[5].Allgather(last[3], last[4])

    def prepare_allgather(self, send: Any, in_group: bool, recv: Any) -> Callable[[], None]:
        """Check an allgather's operands now; the call that runs it, without checking
        again (as :meth:`prepare_allreduce`)."""
        operands = self._allgather_operands(send, in_group, recv)
        return functools.partial(operands[5].Allgather, operands[3], operands[4])

    def forget(self) -> None:
        """Drop the operands cached by :meth:`allreduce` and :meth:`allgather`."""
        self._last_allreduce = self._last_allgather = None

    def broadcast_from_worker0(self, send: Any, in_group: bool, recv: Any) -> None:
        """Copy the root's ``send`` into every ``recv`` (``MPI_Bcast``)."""
        comm = self._comm(in_group)
        recv_view = as_array(recv, "recv")
        if comm.Get_rank() == 0:
            send_view = as_array(send, "send")
            check_same_layout(send_view, recv_view, "broadcast_from_worker0")
            if not in_place(send, recv, send_view, recv_view):
                np.copyto(recv_view, send_view.reshape(recv_view.shape))
        comm.Bcast(recv, root=0)

    def scatter_from_worker0(self, send: Any, in_group: bool, recv: Any) -> None:
        """Split the root's ``send`` among the workers (``MPI_Scatter``)."""
        comm = self._comm(in_group)
        recv_view = as_array(recv, "recv")
        if comm.Get_rank() == 0:
            check_parts(as_array(send, "send"), recv_view, comm.Get_size(), "scatter")
            comm.Scatter(send, recv, root=0)
        else:
            comm.Scatter(None, recv, root=0)

    def gather_to_worker0(self, send: Any, in_group: bool, recv: Any) -> None:
        """Concatenate every worker's ``send`` into the root's ``recv`` (``MPI_Gather``)."""
        comm = self._comm(in_group)
        send_view = as_array(send, "send")
        if comm.Get_rank() == 0:
            check_parts(as_array(recv, "recv"), send_view, comm.Get_size(), "gather")
            comm.Gather(send, recv, root=0)
        else:
            comm.Gather(send, None, root=0)

    def send(self, buffer: Any, receiver_id: int) -> None:
        """Send ``buffer`` to worker ``receiver_id`` (``MPI_Send``)."""
        _check_peer(self.rank, receiver_id, self.size, "send")
        as_array(buffer, "buffer")
        self._comm(False).Send(buffer, dest=receiver_id)

    def recv(self, buffer: Any, sender_id: int) -> None:
        """Receive into ``buffer`` from worker ``sender_id`` (``MPI_Recv``)."""
        _check_peer(self.rank, sender_id, self.size, "recv")
        as_array(buffer, "buffer")
        self._comm(False).Recv(buffer, source=sender_id)

    def close(self) -> None:
        """Free the group communicator."""
        self.forget()
        if self._group is not None:
            self._group.Free()


class _Rendezvous:
    """The meeting point of the threads of one communicator (the world, or a group).

    A collective is two barriers: each thread puts its operand in its slot, waits (1),
    reads what it needs from the slots into a private result, waits (2), then writes its
    result. Slots are written only before (1) and read only between (1) and (2), so no
    thread reads a slot that another rewrites.
    """

    def __init__(self, size: int, timeout: float) -> None:
        self.size = size
        self.slots: list[npt.NDArray[Any] | None] = [None] * size
        self.barrier = threading.Barrier(size, timeout=timeout)

    def meet(self) -> None:
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError as exc:
            raise DiscoError(
                "a collective was abandoned: another worker failed, timed out, or the "
                "session shut down"
            ) from exc


class ThreadFabric:
    """What the threads of one ``ThreadedSession`` share to run collectives in-process."""

    def __init__(self, num_workers: int, num_groups: int, timeout: float) -> None:
        if num_groups < 1 or num_workers % num_groups:
            raise InvalidArgument(f"{num_workers} workers do not split into {num_groups} groups")
        self.size = num_workers
        self.group_size = num_workers // num_groups
        self.timeout = timeout
        self.world = _Rendezvous(num_workers, timeout)
        self.groups = [_Rendezvous(self.group_size, timeout) for _ in range(num_groups)]
        self.mailboxes: dict[tuple[int, int], queue.Queue[npt.NDArray[Any]]] = {
            (src, dst): queue.Queue()
            for src in range(num_workers)
            for dst in range(num_workers)
            if src != dst
        }

    def abort(self) -> None:
        """Release every thread waiting in a collective (they raise ``DiscoError``)."""
        for rendezvous in [self.world, *self.groups]:
            rendezvous.barrier.abort()


class ThreadCommunicator:
    """Collectives among the threads of a ``ThreadedSession``, through shared memory."""

    name = "threads"

    def __init__(self, fabric: ThreadFabric, rank: int) -> None:
        self._fabric = fabric
        self.rank = rank
        self.size = fabric.size
        self.group_size = fabric.group_size

    def _place(self, in_group: bool) -> tuple[_Rendezvous, int]:
        if in_group:
            return self._fabric.groups[self.rank // self.group_size], self.rank % self.group_size
        return self._fabric.world, self.rank

    def _exchange(self, in_group: bool, operand: npt.NDArray[Any] | None) -> list[Any]:
        """Put ``operand`` in this thread's slot and return every slot after barrier (1)."""
        rendezvous, local = self._place(in_group)
        rendezvous.slots[local] = operand
        rendezvous.meet()
        return rendezvous.slots

    def _done(self, in_group: bool) -> None:
        """Barrier (2): every thread has read the slots."""
        self._place(in_group)[0].meet()

    def allreduce(self, send: Any, kind: ReduceKind, in_group: bool, recv: Any) -> None:
        """Reduce ``send`` over the threads into every ``recv``."""
        send_view, recv_view = as_array(send, "send"), as_array(recv, "recv")
        bfloat16 = check_reducible(send, recv, send_view, recv_view)
        operand = send_view.reshape(-1)
        slots = self._exchange(in_group, bfloat16_values(operand) if bfloat16 else operand)
        result = np.array(slots[0], copy=True)
        ufunc = _NUMPY_REDUCE[kind]
        for other in slots[1:]:
            ufunc(result, other, out=result)
        self._done(in_group)
        if kind == ReduceKind.kAvg:
            finish_average(result, len(slots))
        # bfloat16 rounded to nearest (ties to even), as `Tensor.copyfrom` rounds.
        np.copyto(recv_view.reshape(-1), bfloat16_bits(result) if bfloat16 else result)

    def allgather(self, send: Any, in_group: bool, recv: Any) -> None:
        """Concatenate every thread's ``send`` into every ``recv``."""
        send_view, recv_view = as_array(send, "send"), as_array(recv, "recv")
        parts = self.group_size if in_group else self.size
        check_parts(recv_view, send_view, parts, "allgather")
        result = np.concatenate(self._exchange(in_group, send_view.reshape(-1)))
        self._done(in_group)
        np.copyto(recv_view.reshape(-1), result)

    def prepare_allreduce(
        self, send: Any, kind: ReduceKind, in_group: bool, recv: Any
    ) -> Callable[[], None]:
        """:meth:`allreduce` on these operands, as a call to repeat (threads check the
        operands at every call: their collectives copy through numpy anyway)."""
        return functools.partial(self.allreduce, send, kind, in_group, recv)

    def prepare_allgather(self, send: Any, in_group: bool, recv: Any) -> Callable[[], None]:
        """:meth:`allgather` on these operands, as a call to repeat (as
        :meth:`prepare_allreduce`)."""
        return functools.partial(self.allgather, send, in_group, recv)

    def broadcast_from_worker0(self, send: Any, in_group: bool, recv: Any) -> None:
        """Copy the root's ``send`` into every ``recv``."""
        recv_view = as_array(recv, "recv")
        root = self._place(in_group)[1] == 0
        operand = None
        if root:
            operand = as_array(send, "send")
            check_same_layout(operand, recv_view, "broadcast_from_worker0")
        slots = self._exchange(in_group, operand)
        result = np.array(slots[0], copy=True).reshape(-1)
        self._done(in_group)
        np.copyto(recv_view.reshape(-1), result)

    def scatter_from_worker0(self, send: Any, in_group: bool, recv: Any) -> None:
        """Split the root's ``send`` among the threads."""
        recv_view = as_array(recv, "recv")
        rendezvous, local = self._place(in_group)
        operand = None
        if local == 0:
            operand = as_array(send, "send")
            check_parts(operand, recv_view, rendezvous.size, "scatter")
        slots = self._exchange(in_group, operand)
        part = slots[0].reshape(rendezvous.size, -1)[local].copy()
        self._done(in_group)
        np.copyto(recv_view.reshape(-1), part)

    def gather_to_worker0(self, send: Any, in_group: bool, recv: Any) -> None:
        """Concatenate every thread's ``send`` into the root's ``recv``."""
        send_view = as_array(send, "send")
        rendezvous, local = self._place(in_group)
        recv_view = None
        if local == 0:
            recv_view = as_array(recv, "recv")
            check_parts(recv_view, send_view, rendezvous.size, "gather")
        slots = self._exchange(in_group, send_view.reshape(-1))
        result = np.concatenate(slots) if recv_view is not None else None
        self._done(in_group)
        if recv_view is not None and result is not None:
            np.copyto(recv_view.reshape(-1), result)

    def send(self, buffer: Any, receiver_id: int) -> None:
        """Send a copy of ``buffer`` to thread ``receiver_id``."""
        _check_peer(self.rank, receiver_id, self.size, "send")
        view = as_array(buffer, "buffer")
        self._fabric.mailboxes[(self.rank, receiver_id)].put(view.reshape(-1).copy())

    def recv(self, buffer: Any, sender_id: int) -> None:
        """Receive into ``buffer`` what thread ``sender_id`` sent."""
        _check_peer(self.rank, sender_id, self.size, "recv")
        view = as_array(buffer, "buffer")
        try:
            data = self._fabric.mailboxes[(sender_id, self.rank)].get(timeout=self._fabric.timeout)
        except queue.Empty as exc:
            raise DiscoError(
                f"worker {self.rank} received nothing from worker {sender_id} within "
                f"{self._fabric.timeout} s"
            ) from exc
        check_same_layout(data, view, "recv")
        np.copyto(view.reshape(-1), data)

    def forget(self) -> None:
        """Nothing cached."""

    def close(self) -> None:
        """Nothing to release: the fabric belongs to the session."""
