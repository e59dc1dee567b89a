"""What the controller knows of a ``DRef``'s tensors, and the checks it runs before sending.

A tensor made by ``Session.empty`` (or ``broadcast``/``scatter`` into a fresh one) has a
:class:`RemoteLayout`: its shape and dtype, and which workers hold it. With it, the
controller refuses a collective or a copy whose operands cannot match, with an
``InvalidArgument`` that names both, before anything is sent: the workers never see the
bad call, so the session goes on. A ``DRef`` of unknown layout (the result of a
function) is checked on the workers, as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cubepool._cubepool import empty
from cubepool._errors import InvalidArgument, TensorError


@dataclass(frozen=True)
class RemoteLayout:
    """A tensor's shape and dtype on the workers that hold one.

    ``holders`` is None when every worker holds one, else the ids of those that do (the
    others hold None: ``empty(..., worker0_only=True)``).
    """

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    holders: frozenset[int] | None = None

    @property
    def size(self) -> int:
        """Number of elements (``math.prod`` of Python ints: exact, and several times
        cheaper than ``np.prod`` on a path every checked collective takes)."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of one worker's tensor."""
        return self.size * self.dtype.itemsize

    def held_by(self, worker_id: int) -> bool:
        """Whether worker ``worker_id`` holds a tensor of this layout."""
        return self.holders is None or worker_id in self.holders

    def describe(self) -> str:
        """``(3, 4) float32``, for messages."""
        return f"{self.shape} {self.dtype}"


def parse_shape(shape: Any) -> tuple[int, ...]:
    """A shape as a tuple of non-negative ints; ``InvalidArgument`` otherwise."""
    if isinstance(shape, int | np.integer):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise InvalidArgument(f"a shape must be a sequence of ints, got {shape!r}") from None
    out = []
    for dim in dims:
        if isinstance(dim, bool) or not isinstance(dim, int | np.integer) or dim < 0:
            raise InvalidArgument(f"a shape must hold non-negative ints, got {shape!r}")
        out.append(int(dim))
    return tuple(out)


def parse_dtype(dtype: Any) -> tuple[str, np.dtype[Any] | None]:
    """The name a worker's tensor takes for ``dtype``, and its numpy dtype where numpy
    has one (None for ``bfloat16`` or ``float32x4``: the layout is then left unknown to
    the controller, and the workers check). The workers' own rule decides what is a
    dtype (``cubepool.empty``'s), so the controller neither refuses what they take nor
    takes what they refuse (``complex64``, ``S4``); ``InvalidArgument`` otherwise."""
    try:
        parsed: np.dtype[Any] | None = np.dtype(dtype)
    except TypeError:
        parsed = None
    if parsed is not None:
        name = str(parsed)
    elif isinstance(dtype, str):
        name = dtype
    else:
        raise InvalidArgument(f"unknown dtype {dtype!r}")
    try:
        empty((0,), name)
    except (TensorError, InvalidArgument) as exc:
        raise InvalidArgument(f"unknown dtype {dtype!r}: {exc}") from None
    return name, parsed


def check_flag(value: Any, name: str) -> bool:
    """``value`` as a bool; ``InvalidArgument`` unless it is one."""
    if not isinstance(value, bool | np.bool_):
        raise InvalidArgument(f"{name} must be a bool, got {value!r}")
    return bool(value)


def check_holders(layout: RemoteLayout | None, workers: Sequence[int], what: str) -> None:
    """``InvalidArgument`` if a worker that needs the tensor holds none."""
    if layout is None or layout.holders is None:  # unknown, or held by every worker
        return
    missing = [worker for worker in workers if worker not in layout.holders]
    if missing:
        raise InvalidArgument(f"{what} is not a tensor on worker(s) {missing} (worker0_only)")


def check_same(src: RemoteLayout | None, dst: RemoteLayout | None, what: str) -> None:
    """``InvalidArgument`` unless ``src`` and ``dst`` have one dtype and one size."""
    if src is None or dst is None:
        return
    if src.dtype != dst.dtype or src.size != dst.size:
        raise InvalidArgument(
            f"{what}: send is {src.describe()} but recv is {dst.describe()}; they need the "
            "same dtype and number of elements (nothing was sent)"
        )


def check_parts(
    whole: RemoteLayout | None, part: RemoteLayout | None, parts: int, what: str
) -> None:
    """``InvalidArgument`` unless ``whole`` is ``parts`` times ``part``'s elements."""
    if whole is None or part is None:
        return
    if whole.dtype != part.dtype or whole.size != part.size * parts:
        raise InvalidArgument(
            f"{what}: the whole tensor is {whole.describe()}, expected {parts} parts of "
            f"{part.describe()} (nothing was sent)"
        )


def check_host_copy(nbytes: int, layout: RemoteLayout | None, what: str) -> None:
    """``InvalidArgument`` unless a host buffer of ``nbytes`` fits the remote tensor."""
    if layout is not None and layout.nbytes != nbytes:
        raise InvalidArgument(
            f"{what}: the host array has {nbytes} bytes but the remote tensor is "
            f"{layout.describe()} ({layout.nbytes} bytes); sizes must match (nothing was sent)"
        )
