"""Loading traces of any supported format and replaying them through pool layouts."""

from __future__ import annotations

import errno
import os
import sys
import types
import warnings

from cubepool import examples, importers
from cubepool._cubepool import (
    MemoryConfiguration,
    MemoryDeviceProperties,
    ReplayResult,
    TorchAllocatorModel,
    Trace,
    load_trace_v1,
    replay_torch_model,
    replay_trace,
)
from cubepool._errors import InvalidArgument, TraceSelectionError
from cubepool._files import non_regular, printable_name
from cubepool.importers import ImportReport
from cubepool.layouts import LayoutLike, default_configuration, resolve_layout

DEFAULT_SAMPLES = 512
"""Points of a replay's timeline unless asked otherwise (the peaks are exact anyway)."""


def load_trace_with_report(
    path: str | os.PathLike[str],
    *,
    device: str | int | None = None,
    stream: int | None = None,
    strict: bool = True,
    max_bytes: int | None = importers.MAX_DOCUMENT_BYTES,
    max_events: int | None = importers.MAX_EVENTS,
    live_before: bool = True,
) -> tuple[Trace, ImportReport | None]:
    """Read an allocation trace of any supported format, and say what the import dropped.

    ``path`` may also be a bundled example's name (``"gpt2-train"``, see
    :func:`trace_source`). The format is found from the content
    (:func:`cubepool.importers.detect_format`):
    cubepool trace v1 JSON Lines is read by the Rust loader; PyTorch profiler traces,
    PyTorch memory snapshots and RMM logs go through :func:`cubepool.importers.import_trace`
    (with ``device``, ``stream``, ``strict``, ``live_before``, ``max_bytes`` and
    ``max_events``: the bounds of :data:`cubepool.importers.MAX_DOCUMENT_BYTES` and
    :data:`cubepool.importers.MAX_EVENTS`), keeping the imported header (workload, source,
    phases).

    Returns:
        The trace, and the importer's report of what it dropped or kept specially
        (``None`` for a cubepool trace, which is read as it is).

    Raises:
        TraceFormatError: the file is malformed or of no known format.
        InvalidArgument: ``CUBEPOOL_MAX_IMPORT_BYTES`` or ``CUBEPOOL_MAX_IMPORT_EVENTS``
            holds no positive integer.
        TraceSelectionError: ``device``/``stream`` given for a cubepool trace, or not in
            the file.
        OSError: the file cannot be read.
    """
    importers.check_environment()
    path = existing_trace_source(path)
    fmt = importers.detect_format(path)
    if fmt == "cubepool":
        if device is not None or stream is not None:
            raise TraceSelectionError(
                "a cubepool trace holds one device and stream: leave device and stream None",
                path,
            )
        return load_trace_v1(os.fspath(path), max_events=max_events, max_bytes=max_bytes), None
    imported = importers.import_trace(
        path,
        device=device,
        stream=stream,
        strict=strict,
        max_bytes=max_bytes,
        max_events=max_events,
        live_before=live_before,
    )
    return imported.trace, imported.dropped


def load_trace(
    path: str | os.PathLike[str],
    *,
    device: str | int | None = None,
    stream: int | None = None,
    strict: bool = True,
    max_bytes: int | None = importers.MAX_DOCUMENT_BYTES,
    max_events: int | None = importers.MAX_EVENTS,
    live_before: bool = True,
) -> Trace:
    """Read an allocation trace: cubepool trace v1 (``.jsonl``, gzip too), a PyTorch
    profiler trace, a PyTorch memory snapshot or an RMM log, told apart by content; or
    a bundled example by its name (``load_trace("transformer-train")``).

    ``device`` and ``stream`` choose what to import from files that hold several (see
    :func:`cubepool.importers.import_trace`), within the bounds ``max_bytes`` and
    ``max_events`` (see :data:`cubepool.importers.MAX_EVENTS`), with the blocks live
    before the recording began at the trace's start unless ``live_before=False`` (see
    :func:`cubepool.importers.import_trace`); :func:`load_trace_with_report` also returns
    what the import dropped.

    Raises ``TraceFormatError`` (with ``path`` and ``line``) for a malformed file,
    ``TraceSelectionError`` for a device or stream the file does not hold, and
    ``FileNotFoundError`` for a missing one. Where ``device`` is ``None`` and the file
    holds blocks on several devices, the device imported is said in a ``UserWarning``
    (the report that says it is not returned here).
    """
    trace, report = load_trace_with_report(
        path,
        device=device,
        stream=stream,
        strict=strict,
        max_bytes=max_bytes,
        max_events=max_events,
        live_before=live_before,
    )
    if report is not None and report.device_choice:
        warnings.warn(
            f"{printable_name(os.fspath(path))}: {report.device_choice}",
            UserWarning,
            stacklevel=_callers_level(),
        )
    return trace


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
"""The folder of cubepool's Python files (this one's)."""


def _callers_level() -> int:
    """The ``stacklevel`` of ``warnings.warn``, called from the function that calls
    this, that names the first frame outside cubepool: the user's line that asked for
    the trace, whether through :func:`load_trace` or ``replay``, ``compare``, ``plan``
    (so that warning filters by module and "once per place" work as for any warning)."""
    level = 2  # the caller of warn, then its callers
    frame: types.FrameType | None = sys._getframe(2)  # the caller of this one's caller
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    return level


TraceLike = Trace | str | os.PathLike[str]
"""Anything a trace argument takes (see :func:`resolve_trace`): a loaded :class:`Trace`,
a trace file's path, or a bundled example's name (``"gpt2-train"``, or
``"example:gpt2-train"``)."""

_EXAMPLE = "example:"


def trace_source(value: str | os.PathLike[str]) -> str:
    """The file a trace argument names: a bundled example's path for an example's name
    (``"example:gpt2-train"``, or ``"gpt2-train"`` unless a regular file of that name is
    here: a file you have wins over the example, while a folder or anything else that
    is no trace file is passed over for it; :func:`example_shadowing` says which), else
    the path as given (a ``bytes`` path decoded as ``open()`` takes it)."""
    text = os.fsdecode(value)
    if text.startswith(_EXAMPLE):
        return str(examples.path(text[len(_EXAMPLE) :]))
    if text in examples.names() and not os.path.isfile(text):
        return str(examples.path(text))
    return text


def example_shadowing(value: str | os.PathLike[str], *, flag: bool = True) -> str | None:
    """What :func:`trace_source` chose, in words, where ``value`` is a bundled example's
    bare name that also names something here (a file, a folder, ...); None where the
    name is not ambiguous. The command line says it on stderr, naming how to ask for the
    example: ``--example NAME`` where the command has that flag (``flag``), else
    ``example:NAME`` (sweep's traces)."""
    text = os.fsdecode(value)
    if text not in examples.names() or not os.path.lexists(text):
        return None
    if os.path.isfile(text):
        ask = f"--example {text}" if flag else f"{_EXAMPLE}{text}"
        return (
            f"{text} names a file here and a bundled example: reading the file "
            f"({ask} reads the example)"
        )
    kind = non_regular(text) or "no file to read"
    return f"{text} here is {kind}, not a trace file: reading the bundled example {text}"


_SUFFIXES = (".gz", ".jsonl", ".json", ".csv", ".pickle", ".pkl")


def existing_trace_source(value: str | os.PathLike[str]) -> str:
    """:func:`trace_source` of ``value``, once it is known to exist.

    Raises:
        FileNotFoundError: no such file; for a bare name (no folder, no trace suffix),
            most likely a bundled example's mistyped, the message lists the examples.
    """
    source = trace_source(value)
    if os.path.exists(source):
        return source
    text = os.fsdecode(value)
    if os.sep in text or "/" in text or text.lower().endswith(_SUFFIXES):
        raise FileNotFoundError(errno.ENOENT, "no such trace file", text)
    raise FileNotFoundError(
        errno.ENOENT,
        f"no such trace file or bundled example (the examples: {', '.join(examples.names())})",
        text,
    )


def trace_name(trace: Trace, ref: TraceLike) -> str:
    """The one name of a trace, in the command line's output and Python's alike: the
    workload its header names, else the name of the file it came from
    (:func:`trace_label` of ``ref``)."""
    return trace.workload or trace_label(ref)


def trace_label(ref: TraceLike) -> str:
    """The name a trace goes by before it is read: an example's name, a file's name
    without its suffixes (its bytes that are not UTF-8 shown as U+FFFD, so the label
    prints and encodes anywhere), or a loaded trace's workload (see :func:`trace_name`,
    which tables use once the trace is read)."""
    if isinstance(ref, Trace):
        return ref.workload or "trace"
    text = os.fspath(ref)
    if text.startswith(_EXAMPLE):
        return text[len(_EXAMPLE) :]
    name = printable_name(text)
    while name.endswith(_SUFFIXES):
        name = name[: name.rindex(".")]
    return name


def resolve_trace(
    value: TraceLike,
    *,
    device: str | int | None = None,
    stream: int | None = None,
    strict: bool = True,
) -> Trace:
    """Turn any trace argument into a :class:`Trace`: the one rule of every function that
    takes a trace. A path (or an example's name, see :func:`trace_source`) is read with
    :func:`load_trace`, with ``device``, ``stream`` and ``strict``.

    Raises:
        InvalidArgument: ``device`` or ``stream`` given with a loaded trace (they choose
            what to read from a file).
        TypeError: a value of another type.
    """
    if isinstance(value, Trace):
        if device is not None or stream is not None:
            raise InvalidArgument(
                "device and stream choose what to read from a trace file; this trace is "
                "already loaded"
            )
        return value
    if isinstance(value, str | os.PathLike):
        return load_trace(trace_source(value), device=device, stream=stream, strict=strict)
    raise TypeError(
        f"a trace is a Trace, a path or a bundled example's name, got {type(value).__name__}"
    )


def replay(
    trace: TraceLike,
    config: LayoutLike | None = None,
    properties: MemoryDeviceProperties | None = None,
    *,
    limit: int | str | None = None,
    samples: int = DEFAULT_SAMPLES,
    device: str | int | None = None,
    stream: int | None = None,
) -> ReplayResult:
    """Replays ``trace`` through the pool layout ``config``. When None, the layout the
    environment names (``CUBEPOOL_MEMORY_POOLS``, else ``memory.pools`` in the nearest
    ``cubepool.toml``; see ``MemoryConfiguration.from_environment``), else
    :func:`cubepool.default_configuration`.

    Runs in Rust on virtual storage (no bytes are allocated, so a trace recorded on a
    large GPU replays anywhere) with the GIL released. With ``limit``, storage beyond
    that many bytes fails and the reservations that needed it are counted in
    ``failed_reserves``. The result's ``timeline`` keeps at most ``samples`` points, each
    with the extremes of its run of events, so the peaks are exact at any resolution.

    ``config`` may also be a :class:`TorchAllocatorModel` (``torch``,
    ``torch_expandable``): the trace then runs through the model of PyTorch's caching
    allocator, which has no pages or alignment to take from ``properties`` (ignored);
    under ``limit`` it returns its cached segments and retries before a request fails.
    The result has two pools, PyTorch's small pool and large pool.

    ``trace`` may be a path or a bundled example's name (read with ``device`` and
    ``stream``, see :func:`resolve_trace`); ``config`` anything a layout argument takes
    (a preset name such as ``"sub_slices"``, pools-language text, a saved layout file,
    a :class:`cubepool.Plan`; see :func:`cubepool.layouts.resolve_layout`); ``limit`` an
    int or a size such as ``"300MiB"`` (KiB = 1024 bytes, KB = 1000, as the pools
    language reads them).

    A reservation that fails (``failed_reserves``, by cause in ``failures``) makes the
    replay incomplete (``complete`` is False, ``utilization`` NaN): its peaks cover only
    what the layout served.
    """
    loaded = resolve_trace(trace, device=device, stream=stream)
    layout = None if config is None else resolve_layout(config)[1]
    if isinstance(layout, TorchAllocatorModel):
        return replay_torch_model(loaded, layout, limit=limit, samples=samples)
    if layout is None:
        configured = MemoryConfiguration.from_environment()
        layout = default_configuration() if configured is None else configured[0]
    return replay_trace(loaded, layout, properties, limit=limit, samples=samples)
