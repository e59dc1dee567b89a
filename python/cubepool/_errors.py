"""The cubepool exception tree, rooted at :class:`CubepoolError`.

The compiled module raises these classes by name, so they live in pure Python.
"""

from __future__ import annotations

__all__ = ["CubepoolError", "TensorError", "TensorFormatError"]


class CubepoolError(Exception):
    """Base class of every error cubepool raises on purpose."""


class TensorError(CubepoolError, ValueError):
    """A tensor rule was broken: shape, dtype, device, size, view bounds or alignment."""


class TensorFormatError(CubepoolError, ValueError):
    """A tensor or parameter-dict file is truncated, corrupted or hostile."""
