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

What it builds is bounded: at most one object for every two bytes of pickle (no pickle
Python's pickler writes with its memo builds more; a snapshot builds one for every 7 or
more), and for a snapshot import :data:`OBJECTS_PER_ENTRY` for each entry
``max_events`` allows (never fewer than 65,536), each counted before it is built;
memory running out is a ``MemoryError``, never a crash.
A pickle of one-byte opcodes each building an object took 88 bytes of memory per byte
of pickle before; it now takes at most some 40 (measured figures in
``src/python/unpickle.rs``).

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
from typing import TYPE_CHECKING, Final

from cubepool import _cubepool
from cubepool._errors import TraceFormatError

if TYPE_CHECKING:
    from cubepool.importers.limits import Limits

__all__ = ["restricted_loads"]


_MESSAGE_CHARS = 200
"""The most characters of an unpickling error kept in the message (it can quote the
pickle: a memo index of thousands of digits)."""


def _brief(exc: BaseException) -> str:
    """``str(exc)``, cut to :data:`_MESSAGE_CHARS`."""
    text = str(exc)
    return text if len(text) <= _MESSAGE_CHARS else f"{text[:_MESSAGE_CHARS]}..."


OBJECTS_PER_ENTRY: Final = 16
"""The objects a snapshot's pickle may build for each entry ``max_events`` allows
(16 x 4,000,000 by default: 64 million, about 4.5 GB of them at most, the memory
``max_events`` is meant to bound). A snapshot as PyTorch writes it builds about 8 an
entry (the entry's dict, its ints and strings, its frames' list, the frame dicts it
shares with other entries built once), and the segments' blocks fewer than their entries."""

LEAST_OBJECTS: Final = 1 << 16
"""The fewest objects an import's bound allows, as any pickle may build by its size
(``src/python/unpickle.rs``): a small snapshot of deep, distinct stacks (four objects a
frame) was refused under a lowered ``max_events`` it was well within (helper-136)."""

_PAST_MAX_OBJECTS: Final = "the pickle builds more than max_objects="
"""How the unpickler's error past ``max_objects`` starts (``src/python/unpickle.rs``)."""


def restricted_loads(
    data: bytes, *, path: str | None = None, limits: Limits | None = None
) -> object:
    """Unpickle ``data``, building plain containers and scalars only.

    It builds at most one object for every two bytes of ``data`` (at least 65,536): no
    pickle Python's pickler writes with its memo builds more (``pickletools.optimize``
    and ``fast`` mode drop the memo, and such a pickle of nothing but empty containers
    may), a PyTorch snapshot builds one for every 7 or more,
    and a pickle of one-byte opcodes each building an object (``]``, ``}``) is refused
    before it builds more, so the memory a load takes is a bounded multiple of its size
    (see ``src/python/unpickle.rs``).

    Args:
        data: the whole pickle.
        path: the file it came from, named in errors.
        limits: the bounds of the import reading it: at most :data:`OBJECTS_PER_ENTRY`
            objects for each entry its ``max_events`` allows, and never fewer than
            65,536.

    Returns:
        The unpickled plain object.

    Raises:
        TraceFormatError: the pickle uses an opcode that would run code or reach outside
            it (a global, a call, a persistent id), has a dict key or set member that is
            not a str, bytes, None or a bool, would build more objects than its size or
            ``limits`` allow, or is malformed or truncated, or memory ran out building
            it. Nothing from the pickle is ever executed.
    """
    max_objects = None
    if limits is not None and limits.max_events is not None:
        max_objects = max(limits.max_events * OBJECTS_PER_ENTRY, LEAST_OBJECTS)
    try:
        obj: object = _cubepool.restricted_unpickle(bytes(data), max_objects)
    except EOFError as exc:
        raise TraceFormatError(
            f"truncated pickle: the data ends before the pickle does ({len(data):,} bytes; "
            f"{_brief(exc)})",
            path,
        ) from exc
    except pickle.UnpicklingError as exc:
        if limits is not None and str(exc).startswith(_PAST_MAX_OBJECTS):
            raise limits.too_many(
                f"entries' worth of objects (its pickle builds more than {max_objects:,}, "
                f"{OBJECTS_PER_ENTRY} an entry, at least {LEAST_OBJECTS:,})"
            ) from exc
        raise TraceFormatError(f"refused or malformed pickle: {_brief(exc)}", path) from exc
    except MemoryError as exc:
        if limits is not None:
            raise limits.out_of_memory() from exc
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
