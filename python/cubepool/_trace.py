"""Loading traces and replaying them through pool layouts."""

from __future__ import annotations

import os

from cubepool._cubepool import (
    MemoryConfiguration,
    MemoryDeviceProperties,
    ReplayResult,
    Trace,
    load_trace_v1,
    replay_trace,
)


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Reads an allocation trace: cubepool trace v1 JSON Lines, plain or gzip-compressed.

    Raises ``TraceFormatError`` (with ``path`` and ``line``) for a malformed file and
    ``FileNotFoundError`` for a missing one.
    """
    return load_trace_v1(os.fspath(path))


def replay(
    trace: Trace,
    config: MemoryConfiguration | None = None,
    properties: MemoryDeviceProperties | None = None,
    *,
    limit: int | None = None,
) -> ReplayResult:
    """Replays ``trace`` through the pool layout ``config`` (the default when None).

    Runs in Rust on virtual storage (no bytes are allocated, so a trace recorded on a
    large GPU replays anywhere) with the GIL released. With ``limit``, storage beyond
    that many bytes fails and the reservations that needed it are counted in
    ``failed_reserves``.
    """
    return replay_trace(trace, config, properties, limit=limit)
