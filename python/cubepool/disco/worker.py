"""The worker side of Disco: a register file and a loop that runs the controller's commands.

A :class:`DiscoWorker` owns its registers (register id -> object; every ``DRef`` of the
controller names one), its own ``MemoryManagement`` (where its tensors' bytes come
from) and a :class:`~cubepool.disco.communicator.Communicator`. It runs the commands of
its channel in order until ``kShutDown`` or the end of the channel.

Through ``python -m cubepool.disco`` (``__main__.py``), :func:`main` is the entry point
of the workers of a ``ProcessSession``: ``mpiexec -n N python -m cubepool.disco
--connect HOST:PORT --num-groups G``, with the path of a file holding the channel's key
in the environment variable ``CUBEPOOL_DISCO_KEY_FILE`` (:mod:`cubepool.disco.keys`;
a worker started by hand may give the key itself in ``CUBEPOOL_DISCO_AUTHKEY``).
"""

from __future__ import annotations

import argparse
import functools
import os
import select
import socket
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

import cubepool
from cubepool._errors import InvalidArgument
from cubepool.disco import registry
from cubepool.disco.communicator import Communicator
from cubepool.disco.dref import map_containers
from cubepool.disco.errors import DiscoError, FrameRejected
from cubepool.disco.keys import worker_key
from cubepool.disco.protocol import (
    NUMBER_SIZE,
    Command,
    DiscoAction,
    Failure,
    Hello,
    RawCommand,
    RegRef,
    Reply,
    command_body,
    command_from_raw,
    command_number,
    decode_raw_command,
    encode_message,
)
from cubepool.disco.segments import record_segments, remove_own_segments
from cubepool.disco.wire import Channel, connect_retrying

#: ``DiscoAction.kCallPacked``'s and ``kShutDown``'s wire values (a plain int compares
#: faster than the enum).
_CALL_PACKED = int(DiscoAction.kCallPacked)
_SHUT_DOWN = int(DiscoAction.kShutDown)

#: Seconds a worker gives the controller to finish the handshake.
HANDSHAKE_DEADLINE = 10.0

#: The most replays a worker keeps (see ``DiscoWorker``); past it they are all dropped.
MAX_REPLAYS = 64

#: Argument types a replayed call may carry besides registers: immutable values, so a
#: call run again on the same objects sees what a freshly decoded one would.
_IMMUTABLE = frozenset({int, float, bool, str, bytes, type(None)})

#: Actions after which every replay is dropped: they may change what a register holds
#: (``kCallPacked`` only when it writes a result register).
_CHANGES_REGISTERS = frozenset(
    {
        int(DiscoAction.kKillReg),
        int(DiscoAction.kGetGlobalFunc),
        int(DiscoAction.kDebugSetRegister),
        int(DiscoAction.kCopyToWorker0),
    }
)

#: For a registered function, what makes the call to repeat for given arguments (the
#: arguments checked once): the collectives' MPI calls without their per-call checks.
#: A function not listed is replayed as ``func(*args)``. Replays rest on one assumption
#: nothing enforces: no registered function changes the worker's registers or its
#: communicator itself (only the commands in ``_CHANGES_REGISTERS`` and calls that write
#: a result do, and those drop every replay).
PREPARERS: dict[Callable[..., Any], Callable[..., Callable[[], Any]]] = {}


class WorkerChannel(Protocol):
    """The worker's end of its channel to the controller."""

    def recv(self) -> Command | bytes:
        """The next command (blocks): a ``Command`` (a ``ThreadedSession``'s queue) or the
        authenticated payload that carries it (a socket's: made by
        :func:`~cubepool.disco.protocol.encode_command`); ``EOFError`` when the controller
        has gone."""

    def send(self, message: Reply | Failure) -> None:
        """Send an answer or a failure to the controller."""


_current = threading.local()


def current_worker() -> DiscoWorker:
    """The worker running on this thread (TVM's ``ThreadLocalDiscoWorker``).

    Raises ``DiscoError`` outside a worker: the in-worker functions (``worker_id()``,
    the collectives, ...) only make sense in code a session runs.
    """
    worker: DiscoWorker | None = getattr(_current, "worker", None)
    if worker is None:
        raise DiscoError("not inside a Disco worker: call this from a function a session runs")
    return worker


class DiscoWorker:
    """One worker: registers, memory, a communicator, and the command loop.

    Invariant: ``registers`` holds only ids the controller allocated; ids of freed
    ``DRef``s are removed by ``kKillReg``, so a long session does not leak.

    Replays (commands read from a socket): a call that drops its result and is not
    answered (every collective of ``Session.allreduce`` / ``allgather`` ...), once it has
    run without error, is kept under its payload's body (the command without its
    number, :func:`~cubepool.disco.protocol.command_body`) as the call it made: the
    function and its arguments resolved from the registers, or, for a function in
    :data:`PREPARERS` (the collectives), the MPI call with its operands checked. The
    same command again runs that call, without decoding or checking anything; the frames
    already read are opened and their replays run in one call into the extension
    (``Channel.dispatch``), with no Python code between two replays. Invariant:
    every replay was made from the registers as they are now. Registers change only by
    commands (a call that writes a result, ``kKillReg``, ``kGetGlobalFunc``,
    ``kDebugSetRegister``, ``kCopyToWorker0``), and each of these drops every replay
    first, so no replay sees a stale register or keeps a freed register's tensor alive.
    Only calls whose other arguments are immutable values (ints, floats, strings, ...)
    are kept; at most :data:`MAX_REPLAYS`.
    """

    def __init__(
        self,
        worker_id: int,
        num_workers: int,
        num_groups: int,
        channel: WorkerChannel,
        communicator: Communicator,
    ) -> None:
        self.worker_id = worker_id
        self.num_workers = num_workers
        self.num_groups = num_groups
        self.group_size = num_workers // num_groups
        self.channel = channel
        self.communicator = communicator
        self.memory = cubepool.MemoryManagement(name=f"disco-worker-{worker_id}")
        self.registers: dict[int, Any] = {}
        #: The engine chosen by ``Session.init_ccl`` (None until it is called).
        self.ccl: str | None = None
        #: This worker's device index given to ``Session.init_ccl`` (0 until then).
        self.device_id = 0
        #: Command body -> the call it makes (see the class).
        self.replays: dict[bytes, Callable[[], object]] = {}

    @property
    def group_id(self) -> int:
        """The group this worker belongs to."""
        return self.worker_id // self.group_size

    @property
    def is_group_root(self) -> bool:
        """Whether this worker is worker 0 of its group."""
        return self.worker_id % self.group_size == 0

    def empty(self, shape: Any, dtype: str, device: Any = None) -> cubepool.Tensor:
        """An uninitialised tensor whose bytes come from this worker's pools."""
        return cubepool.empty(shape, dtype, device=device, memory=self.memory)

    def run(self) -> bool:
        """Run commands until ``kShutDown`` (True) or the end of the channel or a refused
        frame (False: the controller did not shut the worker down)."""
        _current.worker = self
        channel = self.channel
        try:
            while True:
                try:
                    if isinstance(channel, _SocketChannel) and not self._dispatch(channel):
                        return True  # kShutDown among the frames read
                    command = channel.recv()
                except (EOFError, OSError):
                    return False
                except FrameRejected as exc:
                    self._refuse(exc)
                    return False
                if type(command) is bytes:
                    if not self._run_payload(command):
                        return True  # kShutDown
                elif command[0] == DiscoAction.kShutDown:
                    return True
                else:
                    self._run_one(command)  # type: ignore[arg-type]
        finally:
            _current.worker = None
            self.replays.clear()
            self.registers.clear()
            self.communicator.close()

    def _dispatch(self, channel: _SocketChannel) -> bool:
        """Run the commands already read from a socket: the replays in one call into the
        extension (:meth:`~cubepool.disco.wire.Opener.dispatch`), each other command here;
        False for ``kShutDown``."""
        while True:
            payload, error = channel.dispatch(self.replays, NUMBER_SIZE)
            if payload is None:
                return True  # nothing whole is left: read
            if error is not None:
                if not isinstance(error, Exception):
                    raise error  # (KeyboardInterrupt, SystemExit: as from Python's path)
                self._fail(error, 0, command_number(payload))
            elif not self._run_payload(payload):
                return False

    def _run_payload(self, payload: bytes) -> bool:
        """Run the command in an authenticated payload; False for ``kShutDown``."""
        replay = self.replays.get(payload[:-NUMBER_SIZE])  # (command_body, inline)
        if replay is not None:  # the usual command: a collective run again
            try:
                replay()
            except Exception as exc:
                self._fail(exc, 0, command_number(payload))
            return True
        raw = decode_raw_command(payload)
        action = raw[0]
        if action == _CALL_PACKED and not raw[1] and not raw[4]:
            self._call_to_replay(raw, payload)
            return True
        if action == _SHUT_DOWN:
            return False
        if action in _CHANGES_REGISTERS or action == _CALL_PACKED:
            self.replays.clear()
        self._run_one(command_from_raw(raw, command_number(payload)))
        return True

    def _call_to_replay(self, raw: RawCommand, payload: bytes) -> None:
        """Run a call that drops its result and is not answered; keep it as a replay
        if it ran and its arguments allow (see the class)."""
        _, _, args, refs, _ = raw
        registers = self.registers
        try:
            try:
                func: Callable[..., Any] = registers[args[0]]
                values = list(args)
                for index in refs:
                    values[index] = registers[values[index]]
            except KeyError as exc:
                raise self._unset(exc.args[0]) from None
            del values[0]
            func(*values)
        except Exception as exc:
            self._fail(exc, 0, command_number(payload))
            return
        if not all(type(value) in _IMMUTABLE for value in args):  # (register ids are ints)
            return
        try:
            prepare = PREPARERS.get(func)
            call = prepare(*values) if prepare is not None else functools.partial(func, *values)
        except Exception:  # e.g. an unhashable callable: it ran, it is just not kept
            return
        if len(self.replays) >= MAX_REPLAYS:
            self.replays.clear()
        self.replays[command_body(payload)] = call

    def _refuse(self, exc: FrameRejected) -> None:
        """Tell the controller that a frame was refused (nothing in it ran); the channel
        is done."""
        try:
            self.channel.send(
                Failure(
                    self.worker_id,
                    0,
                    0,
                    f"{FrameRejected.__module__}.{FrameRejected.__qualname__}",
                    f"worker {self.worker_id} refused a command: {exc}; nothing in it ran "
                    "and the worker ended",
                    "",
                )
            )
        except Exception:  # the way back is gone too: ending says enough
            pass

    def _run_one(self, command: Command) -> None:
        reply, number = command.reply, command.number
        try:
            if command.action is DiscoAction.kCallPacked:
                self._call(command.reg_id, command.args)
                value = None
            else:
                value = self._execute(command)
            if reply:
                self.channel.send(Reply(self.worker_id, reply, value))
        except Exception as exc:
            self._fail(exc, reply, number)

    def _fail(self, exc: BaseException, reply: int, number: int) -> None:
        """Tell the controller that the command ``number`` (answered as ``reply``, or 0)
        raised ``exc``."""
        kind = type(exc)
        self.channel.send(
            Failure(
                self.worker_id,
                reply,
                number,
                f"{kind.__module__}.{kind.__qualname__}",
                str(exc),
                "".join(traceback.format_exception(exc)),
            )
        )

    def _register(self, reg_id: int) -> Any:
        try:
            return self.registers[reg_id]
        except KeyError:
            raise self._unset(reg_id) from None

    def _unset(self, reg_id: int) -> DiscoError:
        """The error of a command that names a register this worker does not hold."""
        return DiscoError(
            f"register {reg_id} is not set on worker {self.worker_id} (freed, or never "
            "written here)"
        )

    def _call(self, reg_id: int, args: tuple[Any, ...]) -> None:
        """``kCallPacked``: the function in register ``args[0]`` on the other arguments
        (each ``RegRef`` replaced by its register's value), its result into ``reg_id``
        unless 0. The most frequent command (every collective is one), so it looks the
        registers up inline rather than through :meth:`_register`."""
        registers = self.registers
        try:
            func: Callable[..., Any] = registers[args[0]]
            values = [registers[a.reg_id] if type(a) is RegRef else a for a in args[1:]]
        except KeyError as exc:
            raise self._unset(exc.args[0]) from None
        result = func(*values)
        if reg_id:
            registers[reg_id] = result

    def _execute(self, command: Command) -> Any:
        action, reg_id, args = command.action, command.reg_id, command.args
        if action is DiscoAction.kCallPacked:
            self._call(reg_id, args)
        elif action == DiscoAction.kKillReg:
            for dead in args:
                self.registers.pop(dead, None)
            self.replays.clear()
            self.communicator.forget()
        elif action == DiscoAction.kGetGlobalFunc:
            self.registers[reg_id] = registry.get_global_func(args[0])
        elif action == DiscoAction.kSyncWorker:
            return None
        elif action == DiscoAction.kCopyFromWorker0:
            value = self._register(reg_id)
            if isinstance(value, np.ndarray) and not value.dtype.hasobject:
                # A worker function may return a numpy array (TVM's return NDArrays):
                # its bytes in C order, as debug_get_from_remote reads it.
                return np.ascontiguousarray(value).tobytes()
            return cubepool.copy_to_bytes(self._tensor(reg_id))
        elif action == DiscoAction.kCopyToWorker0:
            cubepool.copy_from_bytes(self._tensor(reg_id), args[0])
        elif action == DiscoAction.kDebugGetFromRemote:
            # A tensor as a numpy copy (the controller must not hold this worker's
            # memory), and so each tensor of a list, tuple or dict.
            return map_containers(
                self._register(reg_id), cubepool.Tensor, lambda t: np.array(t, copy=True)
            )
        elif action == DiscoAction.kDebugSetRegister:
            self._set_register(reg_id, args[0])
        else:
            raise DiscoError(f"unknown Disco action {action!r}")
        return None

    def _tensor(self, reg_id: int) -> cubepool.Tensor:
        value = self._register(reg_id)
        if not isinstance(value, cubepool.Tensor):
            raise DiscoError(
                f"register {reg_id} on worker {self.worker_id} holds a "
                f"{type(value).__name__}, not a Tensor"
            )
        return value

    def _set_register(self, reg_id: int, value: Any) -> None:
        """TVM's ``SetRegister``: an array into a register that holds a tensor is copied
        into that tensor (shape kept, byte sizes must match, every reference sees it), and
        any other value (a list, a scalar) is converted into it as ``Tensor.copyfrom``
        converts (its shape must be the tensor's): the register keeps its tensor, as the
        controller's layout of it says. Into any other register, the value replaces the
        register's value."""
        existing = self.registers.get(reg_id)
        if isinstance(existing, cubepool.Tensor):
            if not isinstance(value, np.ndarray | cubepool.Tensor):
                existing.copyfrom(value)
                return
            array = np.ascontiguousarray(value)
            if array.dtype.hasobject:
                # An object array's items are pointers: copied into a tensor, they would
                # come back out as pointers the receiving array does not own.
                raise InvalidArgument(
                    f"cannot copy an array of dtype {array.dtype} into register {reg_id}'s "
                    f"tensor on worker {self.worker_id}: a tensor holds numbers"
                )
            if array.nbytes != existing.nbytes:
                raise InvalidArgument(
                    f"cannot copy {array.nbytes} bytes ({array.shape} {array.dtype}) into "
                    f"register {reg_id}'s tensor of {existing.nbytes} bytes "
                    f"({tuple(existing.shape)} {existing.dtype}) on worker {self.worker_id}"
                )
            cubepool.copy_from_bytes(existing, array)
            return
        self.registers[reg_id] = self._adopt(value)

    def _adopt(self, value: Any) -> Any:
        """A value sent by the controller, with arrays copied into this worker's pools."""
        if isinstance(value, np.ndarray | cubepool.Tensor):
            array = np.ascontiguousarray(value)
            tensor = self.empty(array.shape, str(array.dtype))
            cubepool.copy_from_bytes(tensor, array)
            return tensor
        return value


class _SocketChannel:
    """A worker's channel over an authenticated socket (:class:`~cubepool.disco.wire.Channel`).

    Commands come as sealed frames, read in chunks: when the controller is ahead
    (pipelined commands), one read takes several, instead of two system calls each.
    A frame whose tag does not check raises ``FrameRejected`` before anything in it is
    decoded; the worker then reports it and ends. ``recv`` gives a command's payload as
    it came (authenticated, not decoded): the worker replays a repeated command from
    that without decoding it; ``dispatch`` runs the replays of the frames already read.
    """

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self.recv: Callable[[], bytes] = channel.recv  # one call less per command
        #: Runs the replays of the commands already read (``Channel.dispatch``).
        self.dispatch: Callable[
            [dict[bytes, Callable[[], object]], int], tuple[bytes | None, BaseException | None]
        ] = channel.dispatch

    def send(self, message: Reply | Failure) -> None:
        try:
            payload = encode_message(message)
        except Exception as exc:  # the value could not be pickled: say so instead
            if isinstance(message, Failure):
                raise
            kind = type(exc)
            payload = encode_message(
                Failure(
                    message.worker_id,
                    message.seq,
                    0,
                    f"{kind.__module__}.{kind.__qualname__}",
                    f"the result cannot be sent to the controller: {exc}",
                    traceback.format_exc(),
                )
            )
        self._channel.send(payload)


#: Seconds a worker lives on once its controller is gone, to finish a normal shutdown.
ORPHAN_GRACE = 5.0


def _watch_controller(connection_fd: int, controller_pid: int) -> None:
    """End this process once its controller is gone, even while its main thread is stuck
    in an MPI collective: when the channel hangs up (on any host, where ``poll`` has
    ``POLLRDHUP``), or when the controller process has ended (same host, pid given)."""
    hang_up = getattr(select, "POLLRDHUP", 0)
    poller = select.poll() if hang_up else None
    if poller is not None:
        poller.register(connection_fd, hang_up)  # POLLHUP and POLLERR come anyway

    def controller_gone() -> bool:
        if poller is not None:
            if poller.poll(500):
                return True
        else:
            time.sleep(0.5)
        if controller_pid:
            try:
                os.kill(controller_pid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                pass
        return False

    def watch() -> None:
        while not controller_gone():
            pass
        time.sleep(ORPHAN_GRACE)
        _exit_unfinalized()

    threading.Thread(target=watch, name="disco-controller-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    """Entry point of a worker process of a ``ProcessSession`` or ``SocketSession`` (one
    per MPI rank of its node)."""
    parser = argparse.ArgumentParser(prog="python -m cubepool.disco")
    parser.add_argument(
        "--connect", required=True, help="HOST:PORT of the controller, or unix:PATH on its host"
    )
    parser.add_argument("--num-groups", type=int, default=1)
    parser.add_argument("--controller-pid", type=int, default=0)
    parser.add_argument("--node", type=int, default=0, help="this node's index")
    parser.add_argument("--num-nodes", type=int, default=1)
    args = parser.parse_args(argv)
    from cubepool.disco.communicator import MPICommunicator

    key = worker_key()
    communicator = MPICommunicator(args.num_groups, args.node, args.num_nodes)
    # MPI_Init made this host's shared-memory file: recorded for the launcher before the
    # hello (cubepool.disco.segments), so a worker killed once the session has started,
    # however soon, has its file removed.
    record_segments()

    def open_socket() -> socket.socket:
        if args.connect.startswith("unix:"):  # a session on this host
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(args.connect.removeprefix("unix:"))
            except BaseException:
                sock.close()
                raise
            return sock
        host, _, port = args.connect.rpartition(":")
        sock = socket.create_connection((host, int(port)))
        # Answers are small writes too: no Nagle delay (see the controller's side).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    # A new connection when the controller's listener dropped the handshake (a flood of
    # connections filled its table: cubepool.disco.listener), not the end of the worker.
    channel = connect_retrying(open_socket, key, HANDSHAKE_DEADLINE)
    _watch_controller(channel.fd, args.controller_pid)
    channel.send(encode_message(Hello(communicator.rank, os.getpid(), socket.gethostname())))
    worker = DiscoWorker(
        communicator.rank,
        communicator.size,
        args.num_groups,
        _SocketChannel(channel),
        communicator,
    )
    shut_down = worker.run()
    channel.close()
    if not shut_down:
        # The controller is gone without a shutdown, and another rank may be stuck in
        # MPI waiting for this one: MPI_Finalize at exit would wait for it too (with the
        # watch thread unable to run), so end now; the launcher sees status 3.
        _exit_unfinalized()
    return 0


def _exit_unfinalized() -> None:
    """End this worker now, without ``MPI_Finalize`` (status 3), first removing the MPI
    shared-memory files it maps, which finalize would have removed: the controller is
    gone (killed, perhaps), so no one else may (:mod:`cubepool.disco.segments`). Every
    rank of this host ends the same way; the files' names go, the mappings stay valid
    until each rank's exit."""
    try:
        remove_own_segments()
    finally:
        os._exit(3)
