"""The command protocol between a Disco controller and its workers.

The controller sends each worker a stream of :class:`Command`s on its own channel; the
worker runs them in order. Most commands are not answered (``reply == 0``): a call, a
collective and a register kill are pipelined, as in TVM. A command that the controller
waits for carries a positive sequence number in ``reply`` and is answered with a
:class:`Reply` of that number. A command that raises is answered with a :class:`Failure`
at once, whether or not it asked for a reply, so the controller learns of it at its next
wait.

The actions are TVM's ``DiscoAction`` with the seed's values. Where we differ from TVM:

* Worker 0 is a process (or thread) of its own, never the controller's thread: MPI ranks
  are separate processes, and the controller must stay interactive. So there is no
  ``WorkerZeroData`` side channel; ``kCopyFromWorker0`` and ``kCopyToWorker0`` carry the
  bytes on worker 0's channel.
* Each worker has its own channel, so commands meant for one worker (the copies, the
  debug reads and writes, a sync) go to that worker only, not to all.
* Answers carry a sequence number, so an answer left over from a wait that ended early (a
  failure elsewhere) is recognised and dropped rather than taken for the next one.
* Failures are sent back with the worker id and traceback instead of ending the worker.

On a socket (``ProcessSession``, ``SocketSession``) every message travels as the payload
of an authenticated frame (:mod:`cubepool.disco.wire`); a command's payload is
:func:`encode_command`'s pickle of plain values only. Pickling the ``Command`` and
``RegRef`` named tuples and the ``DiscoAction`` enum would cost each command a few
microseconds on the controller and on every worker, which shows beside an MPI
collective of a few dozen microseconds. Payloads are unpickled only after their frame's
tag checked, so only a holder of the session key can make a peer unpickle anything.
"""

from __future__ import annotations

import pickle
from enum import IntEnum
from typing import Any, NamedTuple

#: TVM's name for collectives on host memory (its ``cpuccl`` library): each session
#: takes it as its own engine (``Session.init_ccl``).
HOST_CCL = "cpuccl"


class DiscoAction(IntEnum):
    """All kinds of Disco commands, with the values of TVM's ``DiscoAction``."""

    kShutDown = 0
    kKillReg = 1
    kGetGlobalFunc = 2
    kCallPacked = 3
    kSyncWorker = 4
    kCopyFromWorker0 = 5
    kCopyToWorker0 = 6
    kDebugGetFromRemote = 7
    kDebugSetRegister = 8


class ReduceKind(IntEnum):
    """The reductions of ``allreduce``, with the values of TVM's ``ReduceKind``."""

    kSum = 0
    kProd = 1
    kMin = 2
    kMax = 3
    kAvg = 4


#: The reduce op names ``Session.allreduce`` accepts, as in ``tvm.runtime.disco``.
REDUCE_OPS: dict[str, ReduceKind] = {
    "sum": ReduceKind.kSum,
    "prod": ReduceKind.kProd,
    "min": ReduceKind.kMin,
    "max": ReduceKind.kMax,
    "avg": ReduceKind.kAvg,
}


def disco_action_to_str(action: int) -> str:
    """The name of a :class:`DiscoAction` (TVM's ``DiscoAction2String``)."""
    return DiscoAction(action).name


def reduce_kind_to_str(kind: int) -> str:
    """The name of a :class:`ReduceKind` (TVM's ``ReduceKind2String``)."""
    return ReduceKind(kind).name


class RegRef(NamedTuple):
    """A register id standing for a ``DRef`` argument on the wire."""

    reg_id: int


class Command(NamedTuple):
    """One command from the controller to a worker.

    ``reg_id`` is the register the command writes or reads (0 where none); ``args`` are
    its operands (for ``kCallPacked``: the function's register, then the call's
    arguments, with ``RegRef`` for each ``DRef``); ``reply`` is 0 for a command that is
    not answered, else the sequence number of the answer; ``number`` counts the
    controller's sends (one number for a command sent to several workers), so the
    failures of one command on several workers are reported once.
    """

    action: DiscoAction
    reg_id: int
    args: tuple[Any, ...]
    reply: int
    number: int = 0


def _is_count(value: object) -> bool:
    """Whether ``value`` is a non-negative int (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_pid(value: object) -> bool:
    """Whether ``value`` can name one process: a positive int that fits a ``pid_t``
    (``os.kill`` of 0 or -1 would signal a process group or every process)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**31


class Hello(NamedTuple):
    """A worker's first message on a fresh channel: who it is."""

    worker_id: int
    pid: int
    host: str

    def well_formed(self) -> bool:
        """Whether each field has its type and range: a hello is unpickled as its
        (authenticated) peer sent it, and a peer of a local session is sent SIGKILL by
        its pid at close."""
        return _is_count(self.worker_id) and _is_pid(self.pid) and isinstance(self.host, str)


class NodeHello(NamedTuple):
    """A remote node's first message (``python -m cubepool.disco.remote``): how many
    workers it will start."""

    num_workers: int
    pid: int
    host: str

    def well_formed(self) -> bool:
        """Whether each field has its type and range (see :meth:`Hello.well_formed`)."""
        return _is_count(self.num_workers) and _is_pid(self.pid) and isinstance(self.host, str)


class NodeWelcome(NamedTuple):
    """The controller's answer to a :class:`NodeHello`: the node's index (its workers'
    global ids are ``node * workers_per_node + local rank``), the session's shape, and
    where the workers connect."""

    node: int
    num_nodes: int
    num_groups: int
    connect: str


class Reply(NamedTuple):
    """A worker's answer to the command whose ``reply`` was ``seq``."""

    worker_id: int
    seq: int
    value: Any


class Failure(NamedTuple):
    """A command raised on a worker; ``seq`` is its ``reply`` (0 if not answered) and
    ``number`` its ``Command.number``."""

    worker_id: int
    seq: int
    number: int
    exc_type: str
    message: str
    traceback: str


Message = Reply | Failure


#: The ``DiscoAction`` of each wire value (a dict is cheaper than the enum's lookup).
_ACTIONS = {int(action): action for action in DiscoAction}


def encode_message(message: Any) -> bytes:
    """The payload of a worker's or node's message (a ``Hello``, ``Reply``, ...)."""
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def decode_message(payload: bytes) -> Any:
    """The message in an authenticated payload of :func:`encode_message`."""
    return pickle.loads(payload)


def encode_command(command: Command) -> bytes:
    """The payload that carries ``command`` on a socket (see the module's docs).

    The payload is a pickled tuple ``(action, reg_id, args, refs, reply)``, where ``refs``
    lists the positions in ``args`` that are register ids (``RegRef``), then the
    command's ``number`` as :data:`NUMBER_SIZE` big-endian bytes. The number is outside
    the pickle so that a command repeated with the same operands has the same
    :func:`command_body` every time (the worker replays it from that: see
    ``DiscoWorker``); ``pickle.loads`` ignores the bytes after the pickle's end.
    """
    action, reg_id, args, reply, number = command
    # (List comprehensions: cheaper than tuple() of a generator, once per command.)
    refs = tuple([index for index, arg in enumerate(args) if type(arg) is RegRef])
    if refs:
        args = tuple([arg[0] if type(arg) is RegRef else arg for arg in args])
    body = pickle.dumps((int(action), reg_id, args, refs, reply), _PROTOCOL)
    return body + number.to_bytes(NUMBER_SIZE, "big")


_PROTOCOL = pickle.HIGHEST_PROTOCOL
#: Bytes of a command's ``number`` at the end of its payload.
NUMBER_SIZE = 8
#: ``tuple.__new__`` builds the same ``RegRef`` and ``Command`` as their constructors,
#: without the named tuples' Python-level ``__new__``: every command a worker reads is
#: decoded here.
_tuple_new = tuple.__new__


#: A command as its payload carries it (see :func:`encode_command`): ``(action value,
#: reg_id, args with register ids in place of the RegRefs, the positions of those ids in
#: args, reply)``. A worker runs a call in this form without building the ``Command``
#: and its ``RegRef`` s (:func:`command_from_raw` builds them).
RawCommand = tuple[int, int, tuple[Any, ...], tuple[int, ...], int]


def command_body(payload: bytes) -> bytes:
    """The part of a command's payload that says what it does: all but its ``number``
    (two commands with the same body do the same thing)."""
    return payload[:-NUMBER_SIZE]


def command_number(payload: bytes) -> int:
    """The ``number`` of the command in a payload of :func:`encode_command`."""
    return int.from_bytes(payload[-NUMBER_SIZE:], "big")


def decode_raw_command(payload: bytes | bytearray) -> RawCommand:
    """The fields of the command in a payload made by :func:`encode_command`, as sent (an
    authenticated payload: this unpickles), without its number."""
    raw: RawCommand = pickle.loads(payload)
    return raw


def command_from_raw(raw: RawCommand, number: int = 0) -> Command:
    """The :class:`Command` of a :func:`decode_raw_command` result and its number."""
    action, reg_id, args, refs, reply = raw
    if refs:
        values = list(args)
        for index in refs:
            values[index] = _tuple_new(RegRef, (values[index],))
        args = tuple(values)
    return _tuple_new(Command, (_ACTIONS[action], reg_id, args, reply, number))


def decode_command(payload: bytes) -> Command:
    """The command in a payload made by :func:`encode_command` (an authenticated one:
    this unpickles)."""
    return command_from_raw(pickle.loads(payload), command_number(payload))
