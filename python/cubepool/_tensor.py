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

    A ``Tensor`` is copied with its own dtype (``bfloat16``, ``float32x4``: dtypes numpy
    has no name for) and a scalar or 0-d array stays 0-d, as TVM's ``tensor`` keeps them.

    Raises ``InvalidArgument`` for values numpy cannot make an array of fixed-size items
    from (objects, ragged lists).
    """
    if isinstance(array, Tensor):
        copied = empty(array.shape, array.dtype, device=device, memory=memory)
        copied.copyfrom(array)
        return copied
    try:
        # C order, and as many dimensions as given (ascontiguousarray makes a 0-d one 1-d).
        values = np.asarray(array, order="C")
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"tensor() needs array-like values: {exc}") from exc
    if values.dtype.hasobject or values.dtype.itemsize == 0:
        raise InvalidArgument(f"tensor() cannot hold values of dtype {values.dtype}")
    result = empty(values.shape, str(values.dtype), device=device, memory=memory)
    copy_from_bytes(result, values)
    return result
