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
from collections.abc import Iterable

from cubepool._cubepool import Placement, Trace, place_buffers
from cubepool._cubepool import place_csv as _place_csv
from cubepool._errors import PlacementFormatError
from cubepool._files import atomic_path, check_output_path, refuse_non_regular
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
            placement found is returned when it passes. The limit bounds every part
            of the search on inputs of any size; on sparse ones the greedy orders take
            milliseconds, well inside their share of a usual limit (a tenth, or a
            fortieth with a capacity, on inputs of at most 4,000
            buffers (:data:`SEARCH_MAX_BUFFERS`), which the exact search then takes).

    Returns:
        A :class:`Placement`: ``offsets`` in input order, ``height``, ``lower_bound``
        (peak live bytes), ``optimal``, ``method`` and ``seconds``.

    Raises:
        PlacementInfeasible: nothing fits ``capacity`` (``reason`` says why: the peak
            live bytes exceed it, the search proved it, or the time limit passed), with
            the best height found.
        InvalidArgument: an empty lifetime, sizes past 2**64, or a bad time limit.
        KeyboardInterrupt: Ctrl-C (or another signal handler's exception) stops the
            search: the waiting caller runs Python's signal handlers every 50 ms and
            raises their exception once the search has stopped, not after the limit.
    """
    return place_buffers(buffers, capacity, time_limit)


def place_csv(
    input: str | os.PathLike[str],
    output: str | os.PathLike[str],
    capacity: int | str | None = None,
    time_limit: float | None = None,
) -> Placement:
    """Places MiniMalloc CSV and writes its output format, ``id,lower,upper,size,offset``.

    The header names the columns in any order, as MiniMalloc's reader names them:
    ``id`` (or ``buffer``, ``buffer_id``), ``lower`` (or ``begin``, ``start``),
    ``upper`` (or ``end``, the last time the buffer lives: its upper time is end + 1),
    ``size``, and optionally ``alignment`` (only ``1`` or empty: cubepool does not
    align), ``hint`` (only a negative number, MiniMalloc's ``-1`` for none, or empty),
    ``gaps`` (only empty) and ``offset``, which is ignored, so this function's output
    can be placed again (under another capacity or time limit). MiniMalloc's older
    headers, ``buffer,start,end,size`` and ``id,begin,end,size``, read so.

    ``output`` gets ``id,lower,upper,size,offset`` lines in the input's order, with
    half-open lifetimes (an ``end`` is written back as its upper time, end + 1), written
    whole or not at all (a failed write, a full disk, raises an ``OSError`` naming
    ``output`` and leaves nothing under its name). Malformed input (an unknown or
    repeated column, an alignment, hint or gaps that asks what cubepool cannot do)
    raises :class:`PlacementFormatError` naming the file and line; otherwise as
    :func:`place`.
    """
    check_output_path(output)
    path = os.fspath(input)
    _check_input_file(path)
    with atomic_path(output) as temporary:
        return _place_csv(path, os.fspath(temporary), capacity, time_limit)


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


__all__ = [
    "DEFAULT_TIME_LIMIT",
    "MAX_TIME_LIMIT",
    "SEARCH_MAX_BUFFERS",
    "Placement",
    "place",
    "place_csv",
]
