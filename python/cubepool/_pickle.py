"""A restricted unpickler that builds only plain containers and scalars.

PyTorch CUDA memory snapshots (``torch.cuda.memory._dump_snapshot``) are pickles of plain
dicts, lists, strings and numbers. Unpickling an untrusted file with :func:`pickle.load`
can run any code, so cubepool reads them with :class:`RestrictedUnpickler`, which refuses
every global (class, function, ``copyreg`` extension) and every persistent id. Without a
global nothing callable ever reaches the stack, so ``REDUCE``, ``NEWOBJ``, ``INST``,
``OBJ`` and ``BUILD`` cannot run code: they fail with an error instead.

It subclasses the pure-Python unpickler (``pickle._Unpickler``) on purpose: the C
unpickler sizes its memo array from the index a ``LONG_BINPUT`` opcode names, so a
ten-byte hostile pickle can make it allocate and zero tens of GiB; the Python one keeps
its memo in a dict. The price is speed: about 3 MB of pickle a second, against some
20 MB a second for the C unpickler.

Protocols 2 and 3 write sets (and protocol 2 writes bytes) as calls of ``builtins.set``
or ``_codecs.encode``; those are refused like any global. PyTorch writes snapshots with
the default protocol (4 or 5), where they have opcodes of their own.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from typing import Any, ClassVar, NoReturn

from cubepool._errors import TraceFormatError

__all__ = ["RestrictedUnpickler", "restricted_loads"]


def _refuse_extension(self: object) -> None:
    raise pickle.UnpicklingError(
        "the pickle uses a copyreg extension code (a global); cubepool refuses them"
    )


class RestrictedUnpickler(pickle._Unpickler):
    """An unpickler that refuses every global and persistent id.

    Only the objects that pickle opcodes build by themselves come out: ``None``, bools,
    ints, floats, str, bytes, bytearray, tuples, lists, dicts, sets and frozensets.
    """

    # The Python unpickler serves EXT1/EXT2/EXT4 from copyreg's process-wide cache without
    # calling find_class when another pickle loaded the same code before: refuse them here.
    dispatch: ClassVar[dict[int, Callable[[pickle.Unpickler], None]]] = {
        **getattr(pickle._Unpickler, "dispatch"),  # noqa: B009 - not in typeshed
        **{op[0]: _refuse_extension for op in (pickle.EXT1, pickle.EXT2, pickle.EXT4)},
    }

    def find_class(self, module: str, name: str) -> NoReturn:
        """Refuse to look up ``module.name``: cubepool never unpickles objects."""
        raise pickle.UnpicklingError(
            f"the pickle references the global {module}.{name}; cubepool reads only plain "
            "containers and scalars and refuses every class or function"
        )

    def persistent_load(self, pid: Any) -> NoReturn:
        """Refuse persistent ids (they would name objects outside the pickle)."""
        raise pickle.UnpicklingError("the pickle uses a persistent id; cubepool refuses them")


_MESSAGE_CHARS = 200
"""The most characters of an unpickling error kept in the message (it can quote the
pickle: a memo index of thousands of digits)."""


def _brief(exc: BaseException) -> str:
    """``str(exc)``, cut to :data:`_MESSAGE_CHARS`."""
    text = str(exc)
    return text if len(text) <= _MESSAGE_CHARS else f"{text[:_MESSAGE_CHARS]}..."


def restricted_loads(data: bytes, *, path: str | None = None) -> object:
    """Unpickle ``data`` with :class:`RestrictedUnpickler`.

    Args:
        data: the whole pickle.
        path: the file it came from, named in errors.

    Returns:
        The unpickled plain object.

    Raises:
        TraceFormatError: the pickle names a global or persistent id, or is malformed or
            truncated. Nothing from the pickle is ever executed.
    """
    stream = io.BytesIO(data)
    unpickler = RestrictedUnpickler(stream)
    try:
        obj: object = unpickler.load()
    except RecursionError as exc:  # pragma: no cover - the Python unpickler is iterative
        raise TraceFormatError("pickle nested too deeply", path) from exc
    except pickle.UnpicklingError as exc:
        raise TraceFormatError(f"refused or malformed pickle: {_brief(exc)}", path) from exc
    except MemoryError as exc:
        raise TraceFormatError(
            "malformed pickle: it asks for more memory than exists", path
        ) from exc
    except Exception as exc:
        # A corrupt pickle can fail with nearly any exception type (the pickle docs list
        # EOFError, ValueError, TypeError, IndexError, KeyError, struct.error, ...). One
        # that read every byte ran out of data: the file was cut short.
        if stream.tell() >= len(data):
            raise TraceFormatError(
                f"truncated pickle: the data ends before the pickle does ({len(data):,} bytes; "
                f"{type(exc).__name__}: {_brief(exc)})",
                path,
            ) from exc
        raise TraceFormatError(
            f"malformed pickle: {type(exc).__name__}: {_brief(exc)}", path
        ) from exc
    return obj
