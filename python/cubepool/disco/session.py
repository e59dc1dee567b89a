"""The controller's side of Disco: ``Session`` and ``ThreadedSession``.

A :class:`Session` sends commands to its workers through a :class:`Transport` and waits
for answers with a timeout. Commands that are not answered (calls, collectives, frees)
are pipelined; a wait (``sync_worker_0``, a copy from a worker, a report) answers for
everything sent before it, and raises the first :class:`WorkerError` any worker reported
meanwhile.

Failure rules: a worker's exception becomes a ``WorkerError`` at the next wait; after a
failure, the workers waited for get ``failure_grace`` seconds to answer, and if some do
not (stuck in a collective with the failed worker), the session is shut down. A dead
worker (``WorkerDied``) or a wait past ``timeout`` (``DiscoTimeout``) shuts the session
down too. ``shutdown()``, leaving a ``with`` block, garbage collection of the session and
interpreter exit all stop the workers.

A session may be driven from several threads: sends are serialized (a command is never
interleaved with another), and so are waits (each takes the answers it asked for).
"""

from __future__ import annotations

import collections
import itertools
import numbers
import operator
import os
import pickle
import queue
import threading
import time
import weakref
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

import numpy as np
import numpy.typing as npt

import cubepool
from cubepool._cubepool import is_plain_buffer_format
from cubepool._errors import InvalidArgument, NotFound
from cubepool._files import open_regular
from cubepool._tensor import convert_values
from cubepool.disco import checks
from cubepool.disco.checks import RemoteLayout
from cubepool.disco.communicator import ThreadCommunicator, ThreadFabric
from cubepool.disco.dref import DPackedFunc, DRef, as_host_value
from cubepool.disco.errors import (
    DiscoError,
    DiscoTimeout,
    DiscoUnsupported,
    FrameRejected,
    SessionClosed,
    WorkerDied,
    WorkerError,
)
from cubepool.disco.protocol import (
    HOST_CCL,
    REDUCE_OPS,
    Command,
    DiscoAction,
    Failure,
    Message,
    RegRef,
    Reply,
)
from cubepool.disco.upload import relative_parts
from cubepool.disco.worker import DiscoWorker

R = TypeVar("R", bound=DRef)

#: The most collectives a session keeps checked and prepared (``Session._kept``).
MAX_KEPT_COLLECTIVES = 64
#: Default seconds a session waits for an answer before it gives up and shuts down.
DEFAULT_TIMEOUT = 60.0
#: Default seconds the other workers get to answer after one reported a failure.
DEFAULT_FAILURE_GRACE = 5.0
#: Seconds a forced close waits for worker threads released from a collective to end
#: (they end in microseconds once released; a thread in user code cannot be ended).
FORCED_JOIN = 0.5


class Transport(Protocol):
    """How a session reaches its workers (threads and queues, or processes and sockets)."""

    def prepare(self, command: Command) -> Any:
        """What :meth:`send_prepared` takes to send ``command`` (its ``number`` aside):
        made once for a command sent many times (the kept collectives). Sends nothing;
        a transport that pickles raises pickle's error for an operand that cannot be
        pickled."""

    def send_prepared(self, worker_ids: Sequence[int], prepared: Any, number: int) -> None:
        """Queue the command :meth:`prepare` made ``prepared`` from, numbered ``number``,
        for each of ``worker_ids``; ``WorkerDied`` if one is gone."""

    def receive(self, timeout: float) -> tuple[int, Message] | None:
        """The next message from any worker, or None after ``timeout`` seconds.

        Raises ``WorkerDied`` when a worker's channel ended.
        """

    def close(self, force: bool = False) -> None:
        """Stop every worker and release everything; ``force`` kills at once."""


def _as_host_bytes(value: Any) -> bytes:
    """A snapshot of the bytes of a C-contiguous buffer (numpy array, Tensor, bytes)."""
    try:
        return memoryview(value).cast("B").tobytes()
    except TypeError as exc:
        raise InvalidArgument(
            f"expected an array or Tensor with C-contiguous bytes, got {type(value).__name__}"
        ) from exc


class _CloseUnreferenced:
    """Closes the transport of a session no longer referenced, or still open at exit,
    where a daemon thread may be sending through it still: the close waits for that
    send (which holds ``lock``, once the session has made it) as
    :meth:`Session.shutdown` does, at most ``timeout`` (the bound a send has of its
    own), so that the send never writes to a file that reuses a channel's descriptor
    number."""

    def __init__(self, transport: Transport, timeout: float) -> None:
        self.transport = transport
        self.timeout = timeout
        self.lock: threading.RLock | None = None

    def __call__(self) -> None:
        lock = self.lock
        acquired = lock is not None and lock.acquire(
            timeout=min(self.timeout, threading.TIMEOUT_MAX)
        )
        try:
            self.transport.close(True)
        finally:
            if acquired:
                assert lock is not None
                lock.release()


class Session:
    """A Disco session: a controller driving ``num_workers`` workers (TVM's ``Session``).

    Build one with :class:`ThreadedSession`, :class:`~cubepool.disco.ProcessSession` or
    :class:`~cubepool.disco.SocketSession`.
    """

    #: The collective engines (TVM's CCLs) this kind of session runs: ``init_ccl`` takes
    #: these names only.
    available_ccls: tuple[str, ...] = ()

    def __init__(
        self,
        transport: Transport,
        num_workers: int,
        num_groups: int,
        timeout: float,
        failure_grace: float,
        workers_per_node: int | None = None,
    ) -> None:
        # First: should anything below raise, collecting the half-made session still
        # stops the workers the transport started.
        unreferenced = _CloseUnreferenced(transport, timeout)
        self._finalizer = weakref.finalize(self, unreferenced)
        # One sender at a time, so commands stay whole; closing takes it too, so that no
        # send is under way when the channels close (a send after a close would write
        # to whatever file reused the channel's descriptor number), the finalizer's
        # close too. Reentrant: a failed send closes the session while it holds it.
        self._lock = unreferenced.lock = threading.RLock()
        self._transport = transport
        self._num_workers = num_workers
        #: Every worker's id: where a command to all of them goes.
        self._everyone = range(num_workers)
        self._num_groups = num_groups
        self._workers_per_node = num_workers if workers_per_node is None else workers_per_node
        self._ccl: str | None = None
        self.timeout = timeout
        self.failure_grace = failure_grace
        self._registers = itertools.count(1)
        self._sequence = itertools.count(1)
        self._numbers = itertools.count(1)
        # Numbers of commands whose failure was raised already: the same command's
        # failures on other workers, arriving later, are not raised again.
        self._reported: set[int] = set()
        # Registers of DRefs freed since the last command; ``__del__`` may run on any
        # thread, so it only appends here, and the next command sends the kill.
        self._dead_registers: collections.deque[int] = collections.deque()
        # One waiter at a time: a waiter takes every answer off the channels, and would
        # drop another waiter's as stale.
        self._ask_lock = threading.Lock()
        self._closed = False
        self._closed_reason = ""
        self._methods: dict[str, DPackedFunc] = {}
        #: Collectives already checked and prepared, to send again without checking or
        #: encoding (:meth:`_repeat`): ``(name, id(src), id(dst), *options)`` -> weak
        #: references to ``src`` and ``dst`` and what the transport prepared. Invariant:
        #: an entry's operands passed the collective's checks, and both references still
        #: lead to them; what was checked (the session, the layouts) never changes for a
        #: live ``DRef`` (a layout is set when the register is made), so the checks would
        #: pass again. At most :data:`MAX_KEPT_COLLECTIVES`; past it all are dropped.
        self._kept: dict[tuple[Any, ...], tuple[weakref.ref[DRef], weakref.ref[DRef], Any]] = {}

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"<{type(self).__name__} workers={self._num_workers} groups={self._num_groups} {state}>"
        )

    # -- properties -------------------------------------------------------------------

    @property
    def num_workers(self) -> int:
        """How many workers the session drives."""
        return self._num_workers

    @property
    def num_groups(self) -> int:
        """How many groups the workers form."""
        return self._num_groups

    @property
    def group_size(self) -> int:
        """Workers per group."""
        return self._num_workers // self._num_groups

    @property
    def closed(self) -> bool:
        """Whether the session was shut down."""
        return self._closed

    # -- lifecycle --------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop every worker; the session cannot be used afterwards. Idempotent."""
        self._close(force=False)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    def _close(self, force: bool, reason: str = "by shutdown()") -> None:
        if self._closed:
            return
        with self._lock:
            if self._closed:  # closed while this waited for the lock: its reason stands
                return
            self._closed = True
            self._closed_reason = reason
            self._finalizer.detach()
            self._methods.clear()
            self._kept.clear()
            self._transport.close(force)

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosed(f"the session was shut down {self._closed_why()}")

    def _closed_why(self) -> str:
        reason = self._closed_reason
        return reason if reason.startswith("by ") else f"after this failure:\n{reason}"

    # -- sending and waiting ----------------------------------------------------------

    def _release_register(self, reg_id: int) -> None:
        if not self._closed:
            self._dead_registers.append(reg_id)

    def _send(self, worker_ids: Sequence[int], command: Command) -> None:
        self._post(worker_ids, self._transport.prepare(command))

    def _post(self, worker_ids: Sequence[int], prepared: Any) -> None:
        """Send the command the transport prepared as ``prepared`` under the next number,
        after a ``kKillReg`` of the registers freed since the last send."""
        with self._lock:
            self._check_open()  # under the lock: no close comes between it and the send
            try:
                dead: list[int] = []
                while self._dead_registers:
                    dead.append(self._dead_registers.popleft())
                if dead:
                    kill = self._transport.prepare(Command(DiscoAction.kKillReg, 0, tuple(dead), 0))
                    self._transport.send_prepared(range(self._num_workers), kill, 0)
                number = next(self._numbers)
                self._transport.send_prepared(worker_ids, prepared, number)
            except (WorkerDied, DiscoTimeout) as exc:
                self._close(force=True, reason=str(exc))
                raise
            except Exception:
                raise  # refused before anything was written (an argument that cannot go)
            except BaseException as exc:
                # KeyboardInterrupt, SystemExit...: a frame may have been cut halfway, and
                # the next one would then fail authentication on the worker.
                self._close(
                    force=True,
                    reason=f"by {type(exc).__name__} while a command was sent (its frame "
                    "may have been cut)",
                )
                raise

    def _ask(
        self, worker_ids: Sequence[int], action: DiscoAction, reg_id: int, args: tuple[Any, ...]
    ) -> dict[int, Any]:
        """Send a command that is answered, and wait for the answers of ``worker_ids``."""
        with self._ask_lock:
            seq = next(self._sequence)
            self._send(worker_ids, Command(action, reg_id, args, seq))
            try:
                return self._wait(seq, worker_ids, f"{action.name} (#{seq})")
            except WorkerError as failure:
                self._check_the_others(failure, worker_ids)
                raise

    def _check_the_others(self, failure: WorkerError, asked: Sequence[int]) -> None:
        """After ``failure`` at a wait that asked only some workers (``sync_worker_0``,
        a copy from worker 0), ask the others to sync within ``failure_grace``: a worker
        left in a collective with the failed one never answers, and then the session is
        shut down now (its next wait ran to the whole ``timeout`` before). What they
        report joins ``failure.others``."""
        others = [w for w in range(self._num_workers) if w not in set(asked)]
        if self._closed or failure.session_closed or not others:
            return
        seq = next(self._sequence)
        try:
            self._send(others, Command(DiscoAction.kSyncWorker, 0, (), seq))
            self._wait(seq, others, f"kSyncWorker (#{seq}) after the failure", self.failure_grace)
        except WorkerError as more:
            failure.others += [more, *more.others]
            failure.session_closed = more.session_closed
            failure.closed_because = more.closed_because
        except DiscoError as stuck:
            failure.session_closed = True
            failure.closed_because = (
                f"worker(s) {others} did not sync within failure_grace "
                f"({self.failure_grace} s) after the failure (stuck in a collective with the "
                f"failed worker?): {stuck}"
            )

    def _wait(
        self, seq: int, worker_ids: Sequence[int], what: str, timeout: float | None = None
    ) -> dict[int, Any]:
        pending = set(worker_ids)
        values: dict[int, Any] = {}
        failures: list[WorkerError] = []
        numbers: list[int] = []
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if failures:
                    failures[0].session_closed = True
                    failures[0].others = failures[1:]
                    self._close(force=True, reason=str(failures[0]))
                    break
                expired = DiscoTimeout(what, limit, sorted(pending))
                self._close(force=True, reason=str(expired))
                raise expired
            try:
                item = self._transport.receive(remaining)
            except (WorkerDied, FrameRejected) as exc:
                if not failures:
                    self._close(force=True, reason=str(exc))
                    raise
                failures[0].session_closed = True
                failures[0].closed_because = str(exc)
                failures[0].others = failures[1:]
                self._close(force=True, reason=str(failures[0]))
                break
            if item is None:
                continue
            worker_id, message = item
            if isinstance(message, Failure):
                if message.seq == seq:
                    pending.discard(worker_id)
                if message.number and message.number in self._reported:
                    continue  # (0: an answer that could not be sent; always raised)
                if not failures:
                    deadline = min(deadline, time.monotonic() + self.failure_grace)
                failures.append(
                    WorkerError(
                        message.worker_id, message.exc_type, message.message, message.traceback
                    )
                )
                numbers.append(message.number)
            elif isinstance(message, Reply) and message.seq == seq:
                values[worker_id] = message.value
                pending.discard(worker_id)
            # Anything else answers an earlier wait that ended early: dropped.
        if failures:
            self._reported.update(number for number in numbers if number)
            first = failures[0]
            first.others = failures[1:]
            raise first
        return values

    def _new_ref(self, cls: type[R], layout: RemoteLayout | None = None) -> R:
        return cls(self, next(self._registers), layout)

    def _encode(self, value: Any) -> Any:
        if isinstance(value, DRef):
            self._own(value)
            return RegRef(value.reg_id)
        return value

    def _own(self, ref: Any, name: str = "argument") -> DRef:
        """``ref`` if it is a ``DRef`` of this session; ``InvalidArgument`` otherwise."""
        if not isinstance(ref, DRef):
            kind = type(ref).__name__
            raise InvalidArgument(f"{name} must be a DRef of this session, got {kind}")
        if ref.session is not self:
            raise InvalidArgument(f"{ref!r} belongs to another session")
        return ref

    def _parts(self, in_group: bool) -> int:
        return self.group_size if in_group else self._num_workers

    # -- TVM's Session API ------------------------------------------------------------

    def get_global_func(self, name: str) -> DPackedFunc:
        """The function registered as ``name`` on every worker, as a callable ``DRef``.

        Waits for every worker to find it: a name missing on some worker raises
        ``NotFound`` here (naming those workers), and the session goes on.
        """
        if not isinstance(name, str):
            raise InvalidArgument(f"a function name must be a str, got {name!r}")
        func = self._new_ref(DPackedFunc)
        func.name = name
        try:
            self._ask(range(self._num_workers), DiscoAction.kGetGlobalFunc, func.reg_id, (name,))
        except WorkerError as exc:
            if self._closed or not exc.exc_type.endswith("NotFound"):
                raise
            workers = sorted({exc.worker_id, *(other.worker_id for other in exc.others)})
            raise NotFound(
                f"no function is registered as {name!r} on worker(s) {workers} (register it "
                "with cubepool.disco.register_func in a module the workers import: "
                "Session.import_python_module)"
            ) from None
        return func

    @property
    def ccl(self) -> str | None:
        """The engine chosen by :meth:`init_ccl` (None until it is called)."""
        return self._ccl

    def init_ccl(self, ccl: str, *device_ids: int) -> None:
        """Choose the collective engine and each worker's device (TVM's ``init_ccl``).

        ``ccl`` must be one of :attr:`available_ccls`: ``"mpi"`` for ``ProcessSession``
        and ``SocketSession``, ``"threads"`` for ``ThreadedSession``, or ``"cpuccl"``
        (TVM's name for collectives on host memory: the session's own engine). TVM's
        ``"nccl"`` and ``"rccl"`` are GPU libraries this host-memory runtime does not
        have: refused, naming what is available. ``device_ids`` gives one device index
        per worker of a node, or more (worker ``i`` takes ``device_ids[i %
        workers_per_node]``, as TVM's local worker id indexes them: the rest go unused,
        as in TVM); the workers record both (``current_worker().ccl``, ``.device_id``).
        Calling it again with the same engine sets the devices again.

        Collectives do not need it: a session that never calls it runs them on its one
        engine, as before. Everything is checked here before anything is sent.
        """
        if not isinstance(ccl, str) or ccl not in self.available_ccls:
            raise InvalidArgument(
                f"ccl {ccl!r} is not available in a {type(self).__name__}; available: "
                f"{list(self.available_ccls)}"
            )
        ids = tuple(device_ids)
        if len(ids) < self._workers_per_node:
            raise InvalidArgument(
                f"init_ccl needs one device id per worker of a node ({self._workers_per_node}), "
                f"got {len(ids)}: {list(ids)}"
            )
        for device_id in ids:
            if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id < 0:
                raise InvalidArgument(f"device ids must be ints >= 0, got {device_id!r}")
        engine = self.available_ccls[0] if ccl == HOST_CCL else ccl
        self._run_builtin("runtime.disco._init_ccl", engine, ids, self._workers_per_node)
        self.sync_workers()
        self._ccl = ccl

    def _get_cached_method(self, name: str) -> DPackedFunc:
        method = self._methods.get(name)
        if method is None:
            method = self._methods[name] = self.get_global_func(name)
        return method

    def call_packed(self, func: DRef, *args: Any) -> DRef:
        """Call ``func`` on every worker with ``args`` (each ``DRef`` stands for its value
        on that worker); the results stay on the workers, in the returned ``DRef``.

        Worker processes (``ProcessSession``, ``SocketSession``) get the other arguments
        pickled: one that cannot be pickled raises ``InvalidArgument`` naming the function,
        the argument's position (from 1) and its type, with pickle's error as its cause.
        Nothing is sent then, and the session goes on.
        """
        result = self._new_ref(DRef)
        self._call(result.reg_id, func, args)
        return result

    def _call(self, reg_id: int, func: DRef, args: tuple[Any, ...]) -> None:
        """``call_packed`` into register ``reg_id``; 0 drops the results (the collectives
        return nothing, and a result register would cost a ``kKillReg`` per call)."""
        encoded = tuple(self._encode(arg) for arg in args)
        command = Command(DiscoAction.kCallPacked, reg_id, (self._encode(func).reg_id, *encoded), 0)
        try:
            prepared = self._transport.prepare(command)
        except Exception as exc:
            # Encoding sends nothing: the session goes on as if the call was not made.
            raise _unsendable(exc, _call_name(func), encoded) from exc
        self._post(self._everyone, prepared)

    def _run_builtin(self, name: str, *args: Any) -> None:
        """Call the registered function ``name`` on every worker, dropping its results."""
        self._call(0, self._get_cached_method(name), args)

    def _repeat(self, key: tuple[Any, ...], src: Any, dst: Any) -> bool:
        """Send again the collective kept under ``key`` if it was kept for these very
        ``src`` and ``dst`` (see ``_kept``); False, sending nothing, otherwise."""
        kept = self._kept.get(key)
        # A dead reference gives None, which no key's id can have been made from.
        if kept is None or kept[0]() is not src or kept[1]() is not dst:
            return False
        self._post(self._everyone, kept[2])
        return True

    def _keep_checked(self, key: tuple[Any, ...], src: DRef, dst: DRef, *args: Any) -> None:
        """Call the registered collective ``key[0]`` with ``args`` (wire values: a
        ``RegRef`` for each ``DRef``) on every worker, dropping its result; its operands
        ``src`` and ``dst`` have passed its checks, so it is kept under ``key`` for
        :meth:`_repeat`."""
        method = self._get_cached_method(key[0])
        command = Command(DiscoAction.kCallPacked, 0, (method.reg_id, *args), 0)
        prepared = self._transport.prepare(command)
        if len(self._kept) >= MAX_KEPT_COLLECTIVES:
            self._kept.clear()
        self._kept[key] = (weakref.ref(src), weakref.ref(dst), prepared)
        self._post(self._everyone, prepared)

    def import_python_module(self, module_name: str) -> None:
        """Import ``module_name`` on every worker (to run its ``register_func`` calls);
        waits, so an import that fails raises ``WorkerError`` here."""
        if not isinstance(module_name, str):
            raise InvalidArgument(f"a module name must be a str, got {module_name!r}")
        self._run_builtin("runtime.disco._import_python_module", module_name)
        self.sync_workers()

    def upload_vm_module(self, path: str | os.PathLike[str]) -> str:
        """Send the file ``path`` to every worker, which writes it at the same ``path``
        relative to its own working directory (TVM's ``upload_vm_module``: no shared file
        system is needed); ``path`` as given, a ``str``, for chaining.

        The controller reads the file (a regular file; ``OSError`` naming it otherwise)
        and sends its bytes once to each worker; each writes them whole or not at all,
        making missing folders and following no symbolic link
        (:func:`cubepool.disco.upload.write_under_cwd`). ``path`` must be relative and
        must not climb out of the working directory with ``..`` (``InvalidArgument``,
        checked before anything is read). Waits for every worker, so a write that fails
        raises ``WorkerError`` here; the session goes on. Workers on one host (threads,
        or processes in the controller's directory) write one file, which ends up with
        the same bytes; a symbolic link there is replaced by a file of the bytes it led
        to.

        The path is read as the workers write it, its ``..`` taken back textually
        (``d/../m.so`` is ``m.so`` on both sides, wherever a link ``d`` leads).
        """
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        if not isinstance(path, str):
            raise InvalidArgument(f"path must be a str or a path, got {type(path).__name__}")
        normalized = "/".join(relative_parts(path))
        with open_regular(normalized, "module file") as handle:
            # A bytearray, as TVM sends it: a worker keeps no replay of a call with a
            # mutable argument, so the bytes are not held once written.
            blob = bytearray(handle.read())
        self._run_builtin("runtime.disco.upload_module", blob, normalized)
        del blob
        self.sync_workers()
        return path

    def load_vm_module(self, path: str | os.PathLike[str], device: Any = None) -> DRef:
        """TVM's ``load_vm_module``: always raises :class:`DiscoUnsupported`.

        TVM loads a module that its compiler built (``tvm.compile(...)
        .export_library(path)``) into its Relax VM on every worker; cubepool has neither
        the compiler nor the VM. Its workers run Python functions registered with
        ``register_func`` (:meth:`import_python_module`, :meth:`get_global_func`).
        """
        raise DiscoUnsupported(
            f"load_vm_module({path!r})",
            "it loads a module built by TVM's compiler into TVM's Relax VM, which "
            "cubepool does not have; register Python functions with "
            "cubepool.disco.register_func in a module the workers import "
            "(Session.import_python_module) and call them with get_global_func",
        )

    def empty(
        self,
        shape: Sequence[int],
        dtype: str,
        device: Any = None,
        worker0_only: bool = False,
        in_group: bool = True,
    ) -> DRef:
        """An uninitialised tensor on every worker, from that worker's pools.

        With ``worker0_only``, only worker 0 (each group's worker 0 if ``in_group``)
        holds one; the others hold None.
        """
        dims = checks.parse_shape(shape)
        name, parsed = checks.parse_dtype(dtype)
        worker0_only = checks.check_flag(worker0_only, "worker0_only")
        in_group = checks.check_flag(in_group, "in_group")
        if isinstance(device, cubepool.Device):
            device = device.__dlpack_device__()  # a plain tuple travels to any worker
        func = self._get_cached_method("runtime.disco.empty")
        ref = func(dims, name, device, worker0_only, in_group)
        holders = frozenset(self._roots(in_group)) if worker0_only else None
        # A dtype numpy has no name for leaves the layout unknown: the workers check.
        ref.layout = None if parsed is None else RemoteLayout(dims, parsed, holders)
        return ref

    def _sync_worker(self, worker_id: int) -> None:
        self._check_worker(worker_id)
        self._ask([worker_id], DiscoAction.kSyncWorker, 0, ())

    def sync_worker_0(self) -> None:
        """Wait until worker 0 has run every command sent so far."""
        self._sync_worker(0)

    def sync_workers(self) -> None:
        """Wait until every worker has run every command sent so far."""
        self._ask(range(self._num_workers), DiscoAction.kSyncWorker, 0, ())

    def _sync_all(self) -> None:
        """TVM's name for :meth:`sync_workers`."""
        self.sync_workers()

    def _clear_ipc_memory_pool(self) -> None:
        """TVM's: clears the CUDA IPC allocator where there is one; host workers have
        none, so, as TVM without it, this does nothing."""

    def copy_from_worker_0(self, host_array: Any, remote_array: DRef) -> None:
        """Copy worker 0's tensor ``remote_array`` into ``host_array`` (a writable buffer
        of the same byte size: a numpy array or a ``cubepool.Tensor``)."""
        remote_array = self._own(remote_array, "remote_array")
        try:
            view = memoryview(host_array)
            target = view.cast("B")
        except TypeError as exc:
            raise InvalidArgument(
                "host_array must be a writable C-contiguous buffer, got "
                f"{type(host_array).__name__}"
            ) from exc
        if not is_plain_buffer_format(view.format):
            # An object array's items are pointers it owns: bytes written over them
            # would be freed as objects.
            raise InvalidArgument(
                f"host_array must hold numbers or bytes, not items of format {view.format!r}"
            )
        if target.readonly:
            raise InvalidArgument("host_array is read-only")
        checks.check_holders(remote_array.layout, [0], "copy_from_worker_0: remote_array")
        checks.check_host_copy(target.nbytes, remote_array.layout, "copy_from_worker_0")
        data: bytes = self._ask([0], DiscoAction.kCopyFromWorker0, remote_array.reg_id, ())[0]
        if target.nbytes != len(data):
            raise InvalidArgument(
                f"host_array has {target.nbytes} bytes, the tensor on worker 0 has {len(data)}"
            )
        target[:] = data

    def copy_to_worker_0(self, host_array: Any, remote_array: DRef | None = None) -> DRef:
        """Copy ``host_array`` into worker 0's tensor ``remote_array`` (allocated on worker
        0 only when None) and return that ``DRef``."""
        array = _host_array(host_array, "host_array")
        if remote_array is None:
            remote_array = self.empty(
                array.shape, str(array.dtype), worker0_only=True, in_group=False
            )
        remote_array = self._own(remote_array, "remote_array")
        checks.check_holders(remote_array.layout, [0], "copy_to_worker_0: remote_array")
        checks.check_host_copy(array.nbytes, remote_array.layout, "copy_to_worker_0")
        self._send(
            [0],
            Command(DiscoAction.kCopyToWorker0, remote_array.reg_id, (_as_host_bytes(array),), 0),
        )
        return remote_array

    def _roots(self, in_group: bool) -> list[int]:
        return list(range(0, self._num_workers, self.group_size)) if in_group else [0]

    def _place_on_roots(self, array: npt.NDArray[Any], in_group: bool) -> DRef:
        roots = self._roots(in_group)
        ref = self._new_ref(DRef, RemoteLayout(array.shape, array.dtype, frozenset(roots)))
        for worker_id in range(self._num_workers):
            value = array if worker_id in roots else None
            self._send([worker_id], Command(DiscoAction.kDebugSetRegister, ref.reg_id, (value,), 0))
        return ref

    def broadcast(self, src: Any, dst: DRef | None = None, in_group: bool = True) -> DRef:
        """Broadcast the host array ``src`` to every worker (into ``dst``, allocated when
        None); with ``in_group`` each group gets it from its own worker 0."""
        array = _host_array(src, "src")
        in_group = checks.check_flag(in_group, "in_group")
        if dst is None:
            dst = self.empty(array.shape, str(array.dtype))
        dst = self._own(dst, "dst")
        checks.check_holders(dst.layout, range(self._num_workers), "broadcast: dst")
        checks.check_same(_layout_of(array), dst.layout, "broadcast")
        self.broadcast_from_worker0(self._place_on_roots(array, in_group), dst, in_group)
        return dst

    def scatter(self, src: Any, dst: DRef | None = None, in_group: bool = True) -> DRef:
        """Scatter the host array ``src`` along its first axis, one slice per worker (of
        each group with ``in_group``), into ``dst`` (allocated when None)."""
        array = _host_array(src, "src")
        in_group = checks.check_flag(in_group, "in_group")
        parts = self._parts(in_group)
        if array.ndim == 0 or array.shape[0] != parts:
            raise InvalidArgument(f"scatter needs a first axis of {parts}, got shape {array.shape}")
        if dst is None:
            dst = self.empty(array.shape[1:], str(array.dtype))
        dst = self._own(dst, "dst")
        checks.check_holders(dst.layout, range(self._num_workers), "scatter: dst")
        checks.check_parts(_layout_of(array), dst.layout, parts, "scatter")
        self.scatter_from_worker0(self._place_on_roots(array, in_group), dst, in_group)
        return dst

    def broadcast_from_worker0(self, src: DRef, dst: DRef, in_group: bool = True) -> None:
        """Copy worker 0's ``src`` into ``dst`` on every worker (of each group)."""
        src, dst = self._own(src, "src"), self._own(dst, "dst")
        in_group = checks.check_flag(in_group, "in_group")
        checks.check_holders(src.layout, self._roots(in_group), "broadcast_from_worker0: src")
        checks.check_holders(dst.layout, range(self._num_workers), "broadcast_from_worker0: dst")
        checks.check_same(src.layout, dst.layout, "broadcast_from_worker0")
        self._run_builtin("runtime.disco.broadcast_from_worker0", src, in_group, dst)

    def scatter_from_worker0(self, from_array: DRef, to_array: DRef, in_group: bool = True) -> None:
        """Split worker 0's ``from_array`` into equal parts, part ``i`` into worker ``i``'s
        ``to_array``."""
        src, dst = self._own(from_array, "from_array"), self._own(to_array, "to_array")
        in_group = checks.check_flag(in_group, "in_group")
        checks.check_holders(src.layout, self._roots(in_group), "scatter_from_worker0: from_array")
        checks.check_holders(dst.layout, range(self._num_workers), "scatter_from_worker0: to_array")
        checks.check_parts(src.layout, dst.layout, self._parts(in_group), "scatter_from_worker0")
        self._run_builtin("runtime.disco.scatter_from_worker0", from_array, in_group, to_array)

    def gather_to_worker0(self, from_array: DRef, to_array: DRef, in_group: bool = True) -> None:
        """Concatenate every worker's ``from_array`` into worker 0's ``to_array``."""
        src, dst = self._own(from_array, "from_array"), self._own(to_array, "to_array")
        in_group = checks.check_flag(in_group, "in_group")
        checks.check_holders(src.layout, range(self._num_workers), "gather_to_worker0: from_array")
        checks.check_holders(dst.layout, self._roots(in_group), "gather_to_worker0: to_array")
        checks.check_parts(dst.layout, src.layout, self._parts(in_group), "gather_to_worker0")
        self._run_builtin("runtime.disco.gather_to_worker0", from_array, in_group, to_array)

    def allreduce(self, src: DRef, dst: DRef, op: str = "sum", in_group: bool = True) -> None:
        """Reduce ``src`` over the workers into ``dst`` with ``op``: ``"sum"``, ``"prod"``,
        ``"min"``, ``"max"`` or ``"avg"`` (integers: the sum divided toward zero)."""
        # The same operands as an earlier call: sent again as they were checked then.
        key = ("runtime.disco.allreduce", id(src), id(dst), op, in_group)
        if type(op) is str and type(in_group) is bool and self._repeat(key, src, dst):
            return
        if not isinstance(op, str) or op not in REDUCE_OPS:
            raise InvalidArgument(f"unknown reduce op {op!r}; choose from {list(REDUCE_OPS)}")
        src, dst = self._own(src, "src"), self._own(dst, "dst")
        in_group = checks.check_flag(in_group, "in_group")
        everyone = self._everyone
        checks.check_holders(src.layout, everyone, "allreduce: src")
        checks.check_holders(dst.layout, everyone, "allreduce: dst")
        checks.check_same(src.layout, dst.layout, "allreduce")
        args = (RegRef(src.reg_id), int(REDUCE_OPS[op]), in_group, RegRef(dst.reg_id))
        self._keep_checked(key, src, dst, *args)

    def allgather(self, src: DRef, dst: DRef, in_group: bool = True) -> None:
        """Concatenate every worker's ``src`` into ``dst`` on every worker."""
        key = ("runtime.disco.allgather", id(src), id(dst), in_group)
        if type(in_group) is bool and self._repeat(key, src, dst):
            return
        src, dst = self._own(src, "src"), self._own(dst, "dst")
        in_group = checks.check_flag(in_group, "in_group")
        everyone = self._everyone
        checks.check_holders(src.layout, everyone, "allgather: src")
        checks.check_holders(dst.layout, everyone, "allgather: dst")
        checks.check_parts(dst.layout, src.layout, self._parts(in_group), "allgather")
        self._keep_checked(key, src, dst, RegRef(src.reg_id), in_group, RegRef(dst.reg_id))

    # -- memory -----------------------------------------------------------------------

    def _gather_values(self, ref: DRef) -> list[Any]:
        values = self._ask(
            range(self._num_workers), DiscoAction.kDebugGetFromRemote, ref.reg_id, ()
        )
        return [values[worker_id] for worker_id in range(self._num_workers)]

    def memory_report(self) -> list[cubepool.MemoryReport]:
        """Every worker's memory report, in worker order."""
        return self._gather_values(self._get_cached_method("runtime.disco.memory_report")())

    def record_memory(self, label: str) -> list[cubepool.MemoryRecord]:
        """Record every worker's memory under ``label``; the records, in worker order."""
        return self._gather_values(self._get_cached_method("runtime.disco.record_memory")(label))

    # -- DRef support -----------------------------------------------------------------

    def _check_worker(self, worker_id: int) -> None:
        if not 0 <= worker_id < self._num_workers:
            raise InvalidArgument(
                f"worker id {worker_id} is out of range 0..{self._num_workers - 1}"
            )

    def _debug_get(self, ref: DRef, worker_id: int) -> Any:
        self._check_worker(worker_id)
        value = self._ask([worker_id], DiscoAction.kDebugGetFromRemote, ref.reg_id, ())[worker_id]
        return as_host_value(value)

    def _debug_set(self, ref: DRef, worker_id: int, value: Any) -> None:
        self._check_worker(worker_id)
        if isinstance(value, cubepool.Tensor):
            value = np.array(value, copy=True)
        elif (
            not isinstance(value, np.ndarray)
            and ref.layout is not None
            and ref.layout.held_by(worker_id)
        ):
            # Into a tensor, any other value (a list, a scalar) is made an array of the
            # tensor's shape and dtype, its values converted as Tensor.copyfrom converts
            # them, and never replaces the tensor the layout describes. (TVM first makes
            # an array of the value's own dtype, [7, 8] an int64 one, and copies that. An
            # array, below, is copied as its bytes, as TVM copies one.)
            layout = ref.layout
            value = convert_values(
                value, layout.shape, str(layout.dtype), "debug_copy_from", InvalidArgument
            )
        if isinstance(value, np.ndarray):
            value = np.ascontiguousarray(value)
            if value.dtype.hasobject and ref.layout is not None:
                # Copied into a tensor, an object array's items are pointers.
                raise InvalidArgument(
                    f"debug_copy_from: a tensor takes numbers, got dtype {value.dtype}"
                )
            if ref.layout is not None and ref.layout.held_by(worker_id):
                checks.check_host_copy(value.nbytes, ref.layout, "debug_copy_from")
        command = Command(DiscoAction.kDebugSetRegister, ref.reg_id, (value,), 0)
        try:
            prepared = self._transport.prepare(command)
        except Exception as exc:
            raise _unsendable(exc, "debug_copy_from", (value,), names=("value",)) from exc
        self._post([worker_id], prepared)


def _call_name(func: DRef) -> str:
    """How errors name a call of ``func``: by the name the function was looked up by."""
    name = func.name if isinstance(func, DPackedFunc) else None
    return f"call of {name!r}" if name is not None else f"call of the function in {func!r}"


def _type_name(value: object) -> str:
    """``value``'s type as errors name it: qualified, but builtins bare (``function``)."""
    kind = type(value)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _unsendable(
    error: Exception, what: str, args: tuple[Any, ...], names: tuple[str, ...] = ()
) -> InvalidArgument:
    """The error for ``what`` (a call) whose ``args`` the transport could not encode
    (``error``, pickle's): it names the first argument that does not pickle on its own,
    by its position from 1 (and its name from ``names`` where there is one) and type."""
    for index, arg in enumerate(args):
        if isinstance(arg, RegRef):
            continue
        try:
            pickle.dumps(arg, pickle.HIGHEST_PROTOCOL)
        except Exception:
            label = f"argument {index + 1}"
            if index < len(names):
                label += f" ({names[index]})"
            return InvalidArgument(
                f"{what}: {label}, a {_type_name(arg)}, cannot be sent to the worker "
                "processes (only values that pickle can; a DRef stands for a value on the "
                f"workers): {type(error).__name__}: {error}"
            )
    return InvalidArgument(
        f"{what}: the arguments cannot be sent to the worker processes: "
        f"{type(error).__name__}: {error}"
    )


def _host_array(value: Any, name: str) -> npt.NDArray[Any]:
    """``value`` as a C-contiguous numpy array of numbers; ``InvalidArgument`` otherwise."""
    try:
        array = np.ascontiguousarray(value)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{name} must be an array: {exc}") from exc
    if array.dtype.hasobject or array.dtype.itemsize == 0:
        raise InvalidArgument(f"{name} must hold numbers, got dtype {array.dtype}")
    return array


def _layout_of(array: npt.NDArray[Any]) -> RemoteLayout:
    return RemoteLayout(array.shape, array.dtype)


class _QueueChannel:
    """A worker thread's channel: its own inbox, and the outbox all workers share."""

    def __init__(
        self,
        worker_id: int,
        inbox: queue.SimpleQueue[Command],
        outbox: queue.SimpleQueue[tuple[int, Message]],
    ) -> None:
        self._worker_id = worker_id
        self._inbox = inbox
        self._outbox = outbox

    def recv(self) -> Command:
        return self._inbox.get()

    def send(self, message: Reply | Failure) -> None:
        self._outbox.put((self._worker_id, message))


class _ThreadTransport:
    """Workers as threads of this process; collectives through a ``ThreadFabric``."""

    def __init__(self, num_workers: int, num_groups: int, timeout: float) -> None:
        self._fabric = ThreadFabric(num_workers, num_groups, timeout)
        self._inboxes: list[queue.SimpleQueue[Command]] = [
            queue.SimpleQueue() for _ in range(num_workers)
        ]
        self._outbox: queue.SimpleQueue[tuple[int, Message]] = queue.SimpleQueue()
        self._threads = []
        for worker_id in range(num_workers):
            worker = DiscoWorker(
                worker_id,
                num_workers,
                num_groups,
                _QueueChannel(worker_id, self._inboxes[worker_id], self._outbox),
                ThreadCommunicator(self._fabric, worker_id),
            )
            thread = threading.Thread(
                target=worker.run, name=f"disco-worker-{worker_id}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    @property
    def threads(self) -> list[threading.Thread]:
        """The worker threads, in worker order."""
        return list(self._threads)

    def prepare(self, command: Command) -> Command:
        return command

    def send_prepared(self, worker_ids: Sequence[int], prepared: Command, number: int) -> None:
        command = prepared._replace(number=number)
        for worker_id in worker_ids:
            if not self._threads[worker_id].is_alive():
                raise WorkerDied(worker_id, "its thread has ended")
            self._inboxes[worker_id].put(command)

    def receive(self, timeout: float) -> tuple[int, Message] | None:
        try:
            return self._outbox.get(timeout=timeout)
        except queue.Empty:
            for worker_id, thread in enumerate(self._threads):
                if not thread.is_alive():
                    raise WorkerDied(worker_id, "its thread has ended") from None
            return None

    def close(self, force: bool = False) -> None:
        """Ask every thread to end and wait for them, all against one deadline:
        ``min(timeout, failure grace)`` for a shutdown, :data:`FORCED_JOIN` seconds when
        the session is closed after a failure (it has waited its timeout already).

        Threads waiting in a collective are released (the fabric is aborted). A thread
        stuck in a function's own code cannot be stopped from outside in Python; it is a
        daemon thread, left to end by itself (``worker_threads`` shows it alive).
        """
        shutdown = Command(DiscoAction.kShutDown, 0, (), 0)
        for inbox in self._inboxes:
            inbox.put(shutdown)
        if force:
            self._fabric.abort()
        grace = FORCED_JOIN if force else min(self._fabric.timeout, DEFAULT_FAILURE_GRACE)
        deadline = time.monotonic() + grace
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(thread.is_alive() for thread in self._threads):
            self._fabric.abort()  # release the ones in a collective, then a last short wait
            deadline = time.monotonic() + FORCED_JOIN
            for thread in self._threads:
                thread.join(max(0.0, deadline - time.monotonic()))


class ThreadedSession(Session):
    """A session whose workers are threads of this process (TVM's ``ThreadedSession``).

    Collectives run in-process through shared memory (the ``"threads"`` engine of
    :meth:`~Session.init_ccl`); each worker still has its own ``MemoryManagement``.
    ``timeout`` bounds every wait, including a collective's.
    """

    available_ccls = ("threads", HOST_CCL)

    def __init__(
        self,
        num_workers: int,
        num_groups: int = 1,
        build_ring: bool = False,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        failure_grace: float = DEFAULT_FAILURE_GRACE,
    ) -> None:
        _check_shape(num_workers, num_groups)
        _check_timeouts(timeout, failure_grace)
        check_build_ring(build_ring)
        self._threads_transport = _ThreadTransport(num_workers, num_groups, timeout)
        super().__init__(self._threads_transport, num_workers, num_groups, timeout, failure_grace)

    @property
    def worker_threads(self) -> list[threading.Thread]:
        """The worker threads, in worker order (all ended after ``shutdown()``)."""
        return self._threads_transport.threads


def check_build_ring(build_ring: bool) -> None:
    """``InvalidArgument`` unless ``build_ring`` is a bool. TVM's ``build_ring`` links the
    workers in a ring for its ``cpuccl`` collectives; cubepool's engines reach every
    worker from every other (in process, or through MPI), so they build no ring and the
    flag changes nothing."""
    if not isinstance(build_ring, bool):
        raise InvalidArgument(f"build_ring must be a bool, got {build_ring!r}")


def _check_shape(num_workers: int, num_groups: int) -> None:
    """``InvalidArgument`` unless ``num_workers`` and ``num_groups`` are ints (not bools)
    and the workers split into the groups. Checked before anything starts: a float
    count used to pass (``2.0 % 1 == 0``), start ``mpiexec`` and its workers, and then
    raise ``TypeError`` from ``range`` before the session could stop them."""
    counts = []
    for name, value in (("num_workers", num_workers), ("num_groups", num_groups)):
        try:
            # Any integer (numpy's too, as `range` takes them), never a float or a bool.
            if isinstance(value, bool):
                raise TypeError
            counts.append(operator.index(value))
        except TypeError:
            raise InvalidArgument(f"{name} must be an int, got {value!r}") from None
    num_workers, num_groups = counts
    if num_workers < 1:
        raise InvalidArgument(f"num_workers must be at least 1, got {num_workers}")
    if num_groups < 1 or num_workers % num_groups:
        raise InvalidArgument(
            f"num_workers ({num_workers}) must be a positive multiple of num_groups ({num_groups})"
        )


def _check_seconds(name: str, value: float, *, zero: bool = False, infinite: bool = False) -> None:
    """``InvalidArgument`` unless ``value`` is a real number of seconds (not a bool, not
    NaN) above 0 (or 0 where ``zero``), and at most ``threading.TIMEOUT_MAX`` (the
    longest wait a lock, queue or socket takes) unless ``infinite`` allows infinity.

    Checked before anything starts: ``timeout=float("nan")``, ``"1"`` or ``1e30`` used to
    start ``mpiexec`` and fail as ``ValueError``, ``TypeError`` or ``OverflowError`` while
    the first worker's socket was tuned (a ``ThreadedSession`` at its first wait), and a
    NaN ``startup_timeout`` waited forever (no time is ``>=`` NaN).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgument(f"{name} must be a number of seconds, got {value!r}")
    if value != value or value < 0 or (value == 0 and not zero):
        least = "0 or more" if zero else "more than 0"
        raise InvalidArgument(f"{name} must be {least} seconds, got {value!r}")
    if value > threading.TIMEOUT_MAX and not (infinite and value == float("inf")):
        raise InvalidArgument(
            f"{name} must be at most {threading.TIMEOUT_MAX:.0f} seconds (the longest wait "
            f"this platform takes), got {value!r}"
        )


def _check_timeouts(
    timeout: float, failure_grace: float, startup_timeout: float | None = None
) -> None:
    """The checks of :func:`_check_seconds` for a session's times (``startup_timeout``
    may be infinite: the start then waits as long as it takes)."""
    _check_seconds("timeout", timeout)
    _check_seconds("failure_grace", failure_grace, zero=True)
    if startup_timeout is not None:
        _check_seconds("startup_timeout", startup_timeout, infinite=True)
