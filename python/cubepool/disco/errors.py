"""The errors of a Disco session, under :class:`cubepool.CubepoolError`.

A session raises :class:`WorkerError` when code on a worker raised (it carries the worker
id and the worker's traceback), :class:`WorkerDied` when a worker process ended without
being asked to, :class:`DiscoTimeout` when a wait ran past the session's timeout, and
:class:`SessionClosed` when the session was used after ``shutdown()``, and
:class:`DiscoUnsupported` for a part of TVM's Disco that needs what cubepool does not
have (TVM's compiler and VM).
"""

from __future__ import annotations

from cubepool._errors import CubepoolError


class DiscoError(CubepoolError):
    """Root of the errors of a Disco session."""


class WorkerError(DiscoError):
    """Code on a worker raised.

    Attributes: ``worker_id`` (the global id of the worker), ``exc_type`` (the qualified
    name of the exception class on the worker), ``message`` (its text), ``remote_traceback``
    (the worker's formatted traceback), ``others`` (errors reported by other workers for
    the same wait, in the order they arrived), ``session_closed`` (whether the session
    was shut down after the failure) and ``closed_because`` (why it was).
    """

    def __init__(
        self,
        worker_id: int,
        exc_type: str,
        message: str,
        remote_traceback: str,
    ) -> None:
        self.worker_id = worker_id
        self.exc_type = exc_type
        self.message = message
        self.remote_traceback = remote_traceback
        self.others: list[WorkerError] = []
        self.session_closed = False
        self.closed_because = "some workers did not answer after the failure"
        super().__init__(worker_id, exc_type, message, remote_traceback)

    def __str__(self) -> str:
        text = (
            f"worker {self.worker_id} raised {self.exc_type}: {self.message}\n"
            f"--- traceback on worker {self.worker_id} ---\n{self.remote_traceback.rstrip()}"
        )
        if self.others:
            ids = sorted({other.worker_id for other in self.others})
            text += f"\n({len(self.others)} more error(s) from worker(s) {ids} in .others)"
        if self.session_closed:
            text += f"\nthe session was shut down: {self.closed_because}"
        return text


class WorkerDied(DiscoError):
    """A worker ended without being asked to; the session is shut down.

    Attributes: ``worker_id`` (the first worker found gone) and ``detail`` (what was seen:
    the exit status of the launcher, a closed channel, ...).
    """

    def __init__(self, worker_id: int, detail: str) -> None:
        self.worker_id = worker_id
        self.detail = detail
        super().__init__(worker_id, detail)

    def __str__(self) -> str:
        return f"worker {self.worker_id} died ({self.detail}); the session is shut down"


class DiscoTimeout(DiscoError, TimeoutError):
    """A wait on workers ran past its timeout; the session is shut down.

    Attributes: ``waiting_for`` (what the controller waited for), ``timeout`` (seconds)
    and ``worker_ids`` (the workers that did not answer).
    """

    def __init__(self, waiting_for: str, timeout: float, worker_ids: list[int]) -> None:
        self.waiting_for = waiting_for
        self.timeout = timeout
        self.worker_ids = worker_ids
        super().__init__(waiting_for, timeout, worker_ids)

    def __str__(self) -> str:
        return (
            f"no answer to {self.waiting_for} from worker(s) {self.worker_ids} within "
            f"{self.timeout} s; the session is shut down"
        )


class FrameRejected(DiscoError):
    """A frame or a handshake on a Disco channel failed authentication, or is not a frame.

    Attributes: ``reason`` (what was wrong). Nothing in a refused frame is decoded or run;
    the channel it came on is closed (its bytes were forged, changed, lost or replayed),
    and a session that sees one on a worker's channel is shut down.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)

    def __str__(self) -> str:
        return self.reason


class SessionClosed(DiscoError):
    """The session was shut down (by ``shutdown()``, or after a failure it reported)."""


class MPIUnavailable(DiscoError, ImportError):
    """mpi4py or an MPI launcher is missing: install the extra, ``cubepool[disco]``."""


class DiscoUnsupported(DiscoError, NotImplementedError):
    """A part of TVM's Disco API that needs TVM itself, which cubepool does not have
    (its compiler and Relax VM: ``Session.load_vm_module``). Raised before anything is
    sent; the session goes on.

    Attributes: ``feature`` (the method or function asked for) and ``reason`` (what it
    would need).
    """

    def __init__(self, feature: str, reason: str) -> None:
        self.feature = feature
        self.reason = reason
        super().__init__(feature, reason)

    def __str__(self) -> str:
        return f"{self.feature} is not supported by cubepool.disco: {self.reason}"
