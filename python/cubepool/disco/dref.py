"""``DRef``: an object that lives on every worker under one register id."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cubepool.disco.session import Session


class DRef:
    """An object that exists on all workers (TVM's ``DRef``).

    The controller gives each object a register id; every worker keeps its own value under
    that id. When the ``DRef`` is freed on the controller, the register is freed on every
    worker (``kKillReg``, sent before the session's next command).
    """

    __slots__ = ("__weakref__", "reg_id", "session")

    def __init__(self, session: Session, reg_id: int) -> None:
        self.session = session
        self.reg_id = reg_id

    def __del__(self) -> None:
        session = getattr(self, "session", None)
        if session is not None:
            session._release_register(self.reg_id)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} reg={self.reg_id} workers={self.session.num_workers}>"

    def debug_get_from_remote(self, worker_id: int) -> Any:
        """The value of this register on worker ``worker_id`` (a numpy copy for a tensor)."""
        return self.session._debug_get(self, worker_id)

    def debug_copy_from(self, worker_id: int, value: Any) -> None:
        """Set this register on worker ``worker_id`` to ``value``.

        An array (numpy, ``cubepool.Tensor``) is copied into a fresh tensor from that
        worker's pools; any other value is sent as it is.
        """
        self.session._debug_set(self, worker_id, value)


class DPackedFunc(DRef):
    """A function on every worker (what ``Session.get_global_func`` returns)."""

    __slots__ = ()

    def __call__(self, *args: Any) -> DRef:
        """Call the function on every worker; the result stays there, in a new ``DRef``."""
        return self.session.call_packed(self, *args)
