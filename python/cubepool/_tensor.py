"""``cubepool.tensor``: a tensor from an array in one call (TVM's ``tvm.runtime.tensor``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from cubepool._cubepool import MemoryManagement, Tensor, copy_from_bytes, empty
from cubepool._errors import InvalidArgument


def tensor(array: Any, device: Any = None, memory: MemoryManagement | None = None) -> Tensor:
    """A new tensor with the shape, dtype and values of ``array`` (anything numpy takes:
    a numpy array, a list, a ``Tensor``), on ``device`` (the host when None), its bytes from
    ``memory`` (the default ``MemoryManagement`` when None).

    Raises ``InvalidArgument`` for values numpy cannot make an array of fixed-size items
    from (objects, ragged lists).
    """
    try:
        values = np.ascontiguousarray(array)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"tensor() needs array-like values: {exc}") from exc
    if values.dtype.hasobject or values.dtype.itemsize == 0:
        raise InvalidArgument(f"tensor() cannot hold values of dtype {values.dtype}")
    result = empty(values.shape, str(values.dtype), device=device, memory=memory)
    copy_from_bytes(result, values)
    return result
