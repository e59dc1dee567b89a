"""Offline placement: give buffers with lifetimes offsets, in as little memory as possible.

This is the dynamic storage allocation problem that compilers' static memory planners
solve (TVM, XLA's heap simulator, TFLite's greedy by size, MiniMalloc): buffers live
from ``lower`` (inclusive) to ``upper`` (exclusive) and take ``size`` bytes; no two
buffers live at the same time may share a byte. The solver is in Rust
(``src/placement/``): greedy placers with best-fit offsets and a local search for any
size, then, for at most ``SEARCH_MAX_BUFFERS`` buffers, an exact branch and bound over
canonical placements after MiniMalloc's ideas. Every placement passes an independent
checker before it is returned.

``place(trace)`` is the static placement of a whole trace: what a runtime that knows
this exact run in advance (a compiled graph, a CUDA graph) would reserve, next to the
floor no allocator beats, the trace's peak live bytes (``Placement.lower_bound``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from cubepool._cubepool import Placement, Trace, place_buffers
from cubepool._cubepool import place_csv as _place_csv
from cubepool._errors import PlacementFormatError
from cubepool._files import atomic_path, check_output_path, naming_reads, refuse_non_regular
from cubepool.importers.limits import MAX_DOCUMENT_BYTES, MAX_DOCUMENT_BYTES_ENV

#: Seconds a placement may take when no ``time_limit`` is given.
DEFAULT_TIME_LIMIT = 10.0

#: Seconds a time limit must stay below (the solver's bound, about 31 years).
MAX_TIME_LIMIT = 1e9

#: Inputs with at most this many buffers get the exact search after the heuristics.
SEARCH_MAX_BUFFERS = 4000


def place(
    buffers: Trace | Iterable[tuple[int, int, int]],
    capacity: int | str | None = None,
    time_limit: float | None = None,
) -> Placement:
    """Places buffers so that no two live at the same time overlap, as low as possible.

    Args:
        buffers: ``(lower, upper, size)`` rows (lifetime ``[lower, upper)``, ``lower <
            upper``), or a :class:`Trace`, whose allocation ``i`` becomes buffer ``i``,
            live from the index of its alloc event to that of its free (or the end).
        capacity: the most bytes the placement may take (an int or a size such as
            ``"1MiB"``); the first placement that fits is returned. ``None`` asks for
            the lowest height the time limit allows.
        time_limit: seconds to search (default 10, :data:`DEFAULT_TIME_LIMIT`;
            below 1,000,000,000, :data:`MAX_TIME_LIMIT`); the best
            placement found is returned when it passes. Inputs of at most 4,000
            buffers (:data:`SEARCH_MAX_BUFFERS`) always get every greedy order (some
            milliseconds, maybe past a shorter limit), so their result does not
            depend on the machine's load.

    Returns:
        A :class:`Placement`: ``offsets`` in input order, ``height``, ``lower_bound``
        (peak live bytes), ``optimal``, ``method`` and ``seconds``.

    Raises:
        PlacementInfeasible: nothing fits ``capacity`` (``reason`` says why: the peak
            live bytes exceed it, the search proved it, or the time limit passed), with
            the best height found.
        InvalidArgument: an empty lifetime, sizes past 2**64, or a bad time limit.
    """
    return place_buffers(buffers, capacity, time_limit)


def place_csv(
    input: str | os.PathLike[str],
    output: str | os.PathLike[str],
    capacity: int | str | None = None,
    time_limit: float | None = None,
) -> Placement:
    """Places MiniMalloc CSV (``id,lower,upper,size``) and writes its output format.

    The input may also be such output (``id,lower,upper,size,offset``, every line with
    its offset): the offsets are ignored, so a placement can be placed again (under
    another capacity or time limit). ``output`` gets ``id,lower,upper,size,offset``
    lines in the input's order, written whole or not at all (a failed write, a full
    disk, raises an ``OSError`` naming ``output`` and leaves nothing under its name).
    Malformed input raises :class:`PlacementFormatError` naming the file and line;
    otherwise as :func:`place`.
    """
    check_output_path(output)
    with _without_offsets(input) as read, atomic_path(output) as temporary:
        try:
            return _place_csv(read, os.fspath(temporary), capacity, time_limit)
        except PlacementFormatError as error:
            if read == os.fspath(input):
                raise
            # Named as given, not as the copy without offsets.
            raise PlacementFormatError(error.message, input, error.line) from None


_HEADER = b"id,lower,upper,size"
_OUTPUT_HEADER = _HEADER + b",offset"
_BOM = "\ufeff".encode()
"""A UTF-8 byte order mark, which the readers pass over at the start of a file."""


def _check_input_file(path: str) -> None:
    """Refuses, before reading it, an input that is not a regular file
    (:func:`cubepool._files.refuse_non_regular`) or that is larger than the bytes an
    import may read (``CUBEPOOL_MAX_IMPORT_BYTES``, 1 GiB by default): its lines are held
    in memory, and 2 GB of a sparse file took 4.3 GB and 20 s to refuse."""
    refuse_non_regular(path, "buffers file")
    try:
        size = os.stat(path).st_size
    except (OSError, ValueError):
        return  # opening it says why
    if MAX_DOCUMENT_BYTES is not None and size > MAX_DOCUMENT_BYTES:
        raise PlacementFormatError(
            f"the file holds {size:,} bytes, more than an input may "
            f"({MAX_DOCUMENT_BYTES:,}; raise {MAX_DOCUMENT_BYTES_ENV})",
            path,
            None,
        )


@contextmanager
def _without_offsets(input: str | os.PathLike[str]) -> Iterator[str]:
    """The path of ``input`` to place: ``input`` itself, or, where it is the output
    format (``id,lower,upper,size,offset``), a temporary copy without the offsets.

    Raises:
        PlacementFormatError: a line of the output format without five fields.
    """
    path = os.fspath(input)
    _check_input_file(path)
    with open(path, "rb") as file, naming_reads(path):
        header = file.readline().removeprefix(_BOM)
        rest = file.read() if header.rstrip(b"\r\n") == _OUTPUT_HEADER else None
    if rest is None:
        yield path
        return
    kept = [_HEADER]
    # Lines end at a new line (a CR before it dropped), as the CSV reader counts them:
    # `splitlines` also ended one at a lone CR, and an error named a later line. Blank
    # lines at the end are no lines, as there.
    lines = rest.split(b"\n")
    while lines and lines[-1].removesuffix(b"\r") == b"":
        lines.pop()
    for number, line in enumerate(lines, start=2):
        fields = line.removesuffix(b"\r").split(b",")
        if len(fields) != 5:
            raise PlacementFormatError(
                f"expected 5 fields (id,lower,upper,size,offset), found {len(fields)}",
                path,
                number,
            )
        kept.append(b",".join(fields[:4]))
    handle, copy = tempfile.mkstemp(prefix="cubepool-place-", suffix=".csv")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(b"\n".join(kept) + b"\n")
        yield copy
    finally:
        os.unlink(copy)


__all__ = [
    "DEFAULT_TIME_LIMIT",
    "MAX_TIME_LIMIT",
    "SEARCH_MAX_BUFFERS",
    "Placement",
    "place",
    "place_csv",
]
