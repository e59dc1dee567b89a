"""``cubepool.tensor``: a tensor from an array in one call (TVM's ``tvm.runtime.tensor``),
and the conversion ``Tensor.copyfrom`` applies to a source that is not a ``Tensor``."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from cubepool._cubepool import MemoryManagement, Tensor, copy_from_bytes, empty
from cubepool._errors import CubepoolError, InvalidArgument, TensorError


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


def copyfrom_values(tensor: Tensor, source: Any) -> np.ndarray[Any, Any]:
    """What ``tensor.copyfrom(source)`` copies into ``tensor`` (it calls this for a source
    that is not a ``Tensor``): ``source``'s values converted to the tensor's dtype in a
    C-contiguous array of the tensor's shape (its lanes as a last axis), as
    :func:`convert_values` makes it. ``TensorError`` naming ``copyfrom`` otherwise."""
    # The tensor's own array (a view): its shape with a vector dtype's lanes as a last
    # axis, and its element type, bfloat16's exported as the uint16 of its bits.
    exported = np.asarray(tensor)
    dtype = "bfloat16" if tensor.dtype.startswith("bfloat16") else exported.dtype.name
    return convert_values(source, exported.shape, dtype, "copyfrom", TensorError)


def convert_values(
    source: Any, shape: tuple[int, ...], dtype: str, what: str, error: type[CubepoolError]
) -> np.ndarray[Any, Any]:
    """``source``'s values as a C-contiguous array of ``shape`` and the element type of
    ``dtype`` (one lane's: ``"float32"``, ``"bfloat16"``, ...), converted as TVM's
    ``copyfrom`` converts them.

    A numpy array is cast to ``dtype`` as numpy casts (``np.ascontiguousarray(source,
    dtype=...)``: floats to ints truncate, ints wrap); anything else is made an array of
    ``dtype`` first (``np.array(source, dtype=...)``: a list, a scalar, a buffer, an
    object with ``__array__``). Its shape must be ``shape``. ``bfloat16`` (stored as its
    16 bits, a ``uint16``, as a tensor exports it) takes a ``uint16`` array as those bits
    and an ml_dtypes ``bfloat16`` array by its bits, and rounds any other numbers first
    to float32 and then to the nearest bfloat16 (ties to even; as ml_dtypes and torch
    round), where TVM takes any array's bytes as bits.

    Raises ``error`` naming ``what`` for a source that cannot be converted (objects,
    ragged lists, strings that are not numbers, ints out of range of ``dtype``) or whose
    shape is not ``shape``.
    """
    kind = type(source).__name__
    values: np.ndarray[Any, Any]
    try:
        if isinstance(source, np.ndarray):
            values = source
        else:
            # The source as numpy makes it, once (an object's ``__array__`` is called
            # once). Items numpy keeps as objects pass only where each is a number (a
            # Python int past int64, a Fraction, a Decimal: converted below, as TVM's
            # np.array converts them); any other (None would become a NaN, an object
            # whatever float() makes of it) is refused.
            values = np.asarray(source)
            if values.dtype.hasobject:
                if not all(isinstance(item, numbers.Number) for item in values.flat):
                    raise TypeError(f"numpy makes an array of dtype {values.dtype} of it")
            elif values.dtype.itemsize == 0:
                raise TypeError(f"numpy makes an array of dtype {values.dtype} of it")
            if dtype != "bfloat16":
                # TVM's np.array(source, dtype=...): from Python's own values (a list, a
                # scalar) again, so that an int out of the dtype's range is refused, not
                # wrapped as an array's cast would; from an array-like, its array.
                plain = not hasattr(source, "__array__")
                values = np.array(source if plain else values, dtype=dtype)
    except Exception as exc:  # whatever converting raised, __array__'s own included
        raise error(
            f"{what}: its source ({kind}) cannot be converted to an array of {dtype}: {exc}"
        ) from exc
    if values.shape != shape:
        raise error(
            f"{what}: source shape {list(values.shape)}, tensor shape {list(shape)}: "
            "the shapes must be the same"
        )
    if values.dtype.hasobject or values.dtype.itemsize == 0:
        raise error(f"{what}: a tensor holds numbers, not items of dtype {values.dtype}")
    try:
        if dtype == "bfloat16":
            return bfloat16_bits(values)
        return np.asarray(values, dtype=dtype, order="C")
    except Exception as exc:
        raise error(
            f"{what}: its source ({kind}, dtype {values.dtype}) cannot be converted to "
            f"{dtype}: {exc}"
        ) from exc


def bfloat16_bits(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The bfloat16 bits of ``values`` (C order): a ``uint16`` array is bits already, an
    ml_dtypes ``bfloat16`` one is viewed as its bits, other numbers are rounded from
    float32 to the nearest bfloat16, ties to even (a NaN stays a NaN, made quiet)."""
    if values.dtype == np.uint16:
        return np.asarray(values, order="C")
    if values.dtype.name == "bfloat16" and values.dtype.itemsize == 2:
        return np.ascontiguousarray(values).view(np.uint16).reshape(values.shape)
    floats = np.asarray(values, dtype=np.float32, order="C")
    bits = floats.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    quiet = (bits >> 16) | 0x0040
    return np.asarray(np.where(np.isnan(floats), quiet, rounded), dtype=np.uint16, order="C")


def bfloat16_values(bits: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The float32 values of bfloat16 ``bits`` (``uint16``; exact: bfloat16 is
    float32's top half)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)
