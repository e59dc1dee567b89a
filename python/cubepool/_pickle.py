"""A restricted unpickler that builds only plain containers and scalars.

PyTorch CUDA memory snapshots (``torch.cuda.memory._dump_snapshot``) are pickles of plain
dicts, lists, strings and numbers. Unpickling an untrusted file with :func:`pickle.load`
can run any code, so cubepool reads them with :func:`restricted_loads`, whose machine is
in the compiled extension (``_cubepool.restricted_unpickle``, ``src/python/unpickle.rs``,
reading the opcodes with ``src/trace/pickle_ops.rs``). It builds ``None``, bools, ints,
floats, str, bytes, bytearray, tuples, lists, dicts, sets and frozensets, and refuses
every opcode that would run code or reach outside the pickle: globals (``GLOBAL``,
``STACK_GLOBAL``, ``INST``, copyreg extensions), calls and states (``REDUCE``,
``BUILD``, ``OBJ``, ``NEWOBJ``, ``NEWOBJ_EX``), persistent ids and out-of-band buffers.
Nothing callable is ever looked up. Dict keys and set members must be str, bytes,
``None`` or bools, as a snapshot's are: an int, float or tuple key is refused, since
tuples hash recursively (a key nested thousands deep overflowed the C stack) and ints,
floats and tuples hash alike in every process (keys chosen to collide made a dict's
inserts quadratic).

Why a machine of its own:

- the C unpickler sizes its memo array from the index a ``LONG_BINPUT`` opcode names,
  so a ten-byte hostile pickle can make it allocate and zero tens of GiB; this one keeps
  the indices as they come;
- Python's pure unpickler (``pickle._Unpickler``, with ``find_class`` refusing every
  global) was safe but read about 20 MB of snapshot a second, so a snapshot of a long run
  (hundreds of MB of stack frames) took minutes; this one reads at the C unpickler's pace;
- ``serde-pickle``, the Rust crate, decodes into a tree of its own values, which would
  then be copied into Python objects, and a tree copies an object the pickle references
  twice where Python's pickle shares it.

Protocols 2 and 3 write sets (and protocol 2 writes bytes) as calls of ``builtins.set``
or ``_codecs.encode``; those are refused like any global. PyTorch writes snapshots with
the default protocol (4 or 5), where they have opcodes of their own.
"""

from __future__ import annotations

import pickle

from cubepool import _cubepool
from cubepool._errors import TraceFormatError

__all__ = ["restricted_loads"]


_MESSAGE_CHARS = 200
"""The most characters of an unpickling error kept in the message (it can quote the
pickle: a memo index of thousands of digits)."""


def _brief(exc: BaseException) -> str:
    """``str(exc)``, cut to :data:`_MESSAGE_CHARS`."""
    text = str(exc)
    return text if len(text) <= _MESSAGE_CHARS else f"{text[:_MESSAGE_CHARS]}..."


def restricted_loads(data: bytes, *, path: str | None = None) -> object:
    """Unpickle ``data``, building plain containers and scalars only.

    Args:
        data: the whole pickle.
        path: the file it came from, named in errors.

    Returns:
        The unpickled plain object.

    Raises:
        TraceFormatError: the pickle uses an opcode that would run code or reach outside
            it (a global, a call, a persistent id), has a dict key or set member that is
            not a str, bytes, None or a bool, or is malformed or truncated. Nothing from
            the pickle is ever executed.
    """
    try:
        obj: object = _cubepool.restricted_unpickle(bytes(data))
    except EOFError as exc:
        raise TraceFormatError(
            f"truncated pickle: the data ends before the pickle does ({len(data):,} bytes; "
            f"{_brief(exc)})",
            path,
        ) from exc
    except pickle.UnpicklingError as exc:
        raise TraceFormatError(f"refused or malformed pickle: {_brief(exc)}", path) from exc
    except MemoryError as exc:
        raise TraceFormatError(
            "malformed pickle: it asks for more memory than exists", path
        ) from exc
    except Exception as exc:
        # A value Python cannot build from the pickle's bytes: a text number or string
        # that does not parse (ValueError, UnicodeDecodeError), an escape Python warns
        # of where warnings are errors, ...
        raise TraceFormatError(
            f"malformed pickle: {type(exc).__name__}: {_brief(exc)}", path
        ) from exc
    return obj
