"""``DRef``: an object that lives on every worker under one register id."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from cubepool._cubepool import Device

if TYPE_CHECKING:
    from cubepool.disco.checks import RemoteLayout
    from cubepool.disco.session import Session


#: How deep :func:`as_host_value` goes into nested lists and tuples.
_MAX_NESTING = 32


class HostArray(np.ndarray):
    """A worker's tensor copied to the controller (what ``DRef.debug_get_from_remote``
    returns for one): a numpy array that also has TVM's ``Tensor.numpy()``. What numpy
    computes from it (``a.sum()``, ``a + 1``) is a plain array or scalar."""

    def numpy(self) -> np.ndarray:
        """A copy of this array as a plain ``numpy.ndarray`` (TVM's ``Tensor.numpy``)."""
        return np.array(self, copy=True).view(np.ndarray)

    @property
    def device(self) -> Any:  # numpy's is the str "cpu"
        """Where it is, as TVM's ``Tensor.device`` says it: ``cubepool.Device("cpu", 0)``
        (TVM's ``tvm.cpu()``), which ``cubepool.Tensor.device`` also gives; numpy's own
        is the string ``"cpu"``, which a TVM test comparing with ``tvm.cpu()`` fails."""
        return Device("cpu", 0)

    def __array_wrap__(self, array: Any, context: Any = None, return_scalar: bool = False) -> Any:
        result = np.asarray(array).view(np.ndarray)
        return result[()] if return_scalar else result


def map_containers(
    value: Any,
    kind: type,
    convert: Callable[[Any], Any],
    depth: int = 0,
    seen: dict[int, Any] | None = None,
) -> Any:
    """``value`` with ``convert(x)`` for ``value`` itself or each ``x`` of type ``kind``
    inside its lists, tuples and dicts (TVM's ``Array`` and ``Map``): each container
    converted once (a structure that holds one list twice costs one walk of it), at most
    32 levels deep; other objects as they are."""
    if isinstance(value, kind):
        return convert(value)
    if type(value) not in (list, tuple, dict) or depth >= _MAX_NESTING:
        return value
    seen = {} if seen is None else seen
    if id(value) not in seen:
        step = depth + 1
        if type(value) is dict:
            done: Any = {k: map_containers(v, kind, convert, step, seen) for k, v in value.items()}
        else:
            done = type(value)(map_containers(v, kind, convert, step, seen) for v in value)
        seen[id(value)] = done
    return seen[id(value)]


def as_host_value(value: Any) -> Any:
    """``value`` as ``debug_get_from_remote`` returns it: every array, alone or in lists,
    tuples and dicts, as a :class:`HostArray`."""
    return map_containers(value, np.ndarray, lambda array: array.view(HostArray))


class DRef:
    """An object that exists on all workers (TVM's ``DRef``).

    The controller gives each object a register id; every worker keeps its own value under
    that id. When the ``DRef`` is freed on the controller, the register is freed on every
    worker (``kKillReg``, sent before the session's next command).
    """

    __slots__ = ("__weakref__", "layout", "reg_id", "session")

    def __init__(self, session: Session, reg_id: int, layout: RemoteLayout | None = None) -> None:
        self.session = session
        self.reg_id = reg_id
        #: What the controller knows of the tensor in this register (None: nothing).
        self.layout = layout

    def __del__(self) -> None:
        session = getattr(self, "session", None)
        if session is not None:
            session._release_register(self.reg_id)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} reg={self.reg_id} workers={self.session.num_workers}>"

    def debug_get_from_remote(self, worker_id: int) -> Any:
        """The value of this register on worker ``worker_id``: a copy for a tensor (a
        :class:`HostArray`, a numpy array with TVM's ``.numpy()``), and so for each tensor
        of a list or tuple (TVM's ``Array`` of tensors)."""
        return self.session._debug_get(self, worker_id)

    def debug_copy_from(self, worker_id: int, value: Any) -> None:
        """Copy ``value`` into this register on worker ``worker_id`` (TVM's semantics).

        When the register holds a tensor and ``value`` is an array (numpy, a
        ``cubepool.Tensor``), its bytes are copied into that tensor: the tensor keeps its
        shape and dtype, every reference to it sees the write, and the byte sizes must
        match (``InvalidArgument`` on the controller when it knows the tensor's layout,
        else a ``WorkerError``), as TVM copies an array, with no conversion of dtype. Any
        other value (a list, a scalar) is converted into that tensor as
        ``Tensor.copyfrom`` converts it: its values to the tensor's dtype, and it must
        have the tensor's shape (the same errors otherwise): ``[7, 8]`` into a float64
        tensor is 7.0 and 8.0, where TVM first makes such a value an array of its own
        dtype (``[7, 8]`` an int64 one) and copies that.
        Either way the register keeps its tensor. Into an empty register (a worker of a
        ``worker0_only`` tensor, or no tensor), an array becomes a fresh tensor from that
        worker's pools, and any other value is stored as it is. Worker processes get
        ``value`` pickled: one that cannot be pickled raises ``InvalidArgument``, and
        nothing is sent.
        """
        self.session._debug_set(self, worker_id, value)


class DPackedFunc(DRef):
    """A function on every worker (what ``Session.get_global_func`` returns).

    ``name`` is the name it was looked up by (``get_global_func``'s), which errors about
    its calls quote; None where the function came some other way.
    """

    __slots__ = ("name",)

    def __init__(
        self,
        session: Session,
        reg_id: int,
        layout: RemoteLayout | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(session, reg_id, layout)
        self.name = name

    def __call__(self, *args: Any) -> DRef:
        """Call the function on every worker; the result stays there, in a new ``DRef``."""
        return self.session.call_packed(self, *args)
