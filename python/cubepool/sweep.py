"""Replaying every (trace, layout) pair of a study, on local processes or a cluster.

:func:`sweep` sends one job per pair to a :class:`concurrent.futures.Executor`: local
processes by default, or any executor, such as a Dask cluster's
(``distributed.Client(...).get_executor()``), to spread a large study over machines.
Jobs carry plain data, so they pickle anywhere: a trace travels as its path (each worker
reads it once and keeps it) or, for an in-memory :class:`Trace`, as its events; a layout
as :func:`cubepool.layouts.to_spec` data, with the text of each plan file a planned
layout follows (a worker on another machine, or in another folder, reads it from a
temporary file of its own where its own file of that name is missing or differs).
Workers send back plain dicts.
"""

from __future__ import annotations

import math
import multiprocessing
import operator
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import (
    Executor,
    Future,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
    as_completed,
)
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from cubepool._cubepool import MemoryDeviceProperties, Trace
from cubepool._errors import InvalidArgument
from cubepool._format import human_bytes, table, unique_labels
from cubepool._progress import progress_callback
from cubepool._terminal import name_cell
from cubepool._trace import (
    TraceLike,
    load_trace_with_report,
    replay,
    trace_label,
    trace_source,
)
from cubepool.compare import COMPARE_DEFAULTS, Layouts, _labelled, failure_text
from cubepool.importers import ImportReport, detect_format
from cubepool.layouts import from_spec, to_spec
from cubepool.plan.planned import temporary_plan_text

__all__ = ["METRICS", "Sweep", "SweepRow", "sweep", "trace_label"]

TraceRef = TraceLike
"""A trace to sweep: a file path, a bundled example's name (``"gpt2-train"`` or
``"example:gpt2-train"``), or a loaded :class:`Trace`."""

# Traces a worker process has read, each with its import's report (None for a cubepool
# trace v1 file), by (path, device, stream, live_before, strict), so that each is read
# once per worker.
_CACHE: dict[
    tuple[str, str | int | None, int | None, bool, bool], tuple[Trace, ImportReport | None]
] = {}


def _resolve(ref: TraceRef) -> str | Trace:
    """A path (as a string) or a loaded trace; bundled examples become their paths."""
    if isinstance(ref, Trace):
        return ref
    return trace_source(ref)


def _load(
    ref: str | Trace,
    device: str | int | None,
    stream: int | None,
    live_before: bool = True,
    strict: bool = True,
) -> tuple[Trace, ImportReport | None]:
    """The trace ``ref`` names, read once per worker, and what its import dropped or
    skipped (None for a loaded trace or a cubepool trace v1 file)."""
    if isinstance(ref, Trace):
        return ref, None
    key = (ref, device, stream, live_before, strict)
    loaded = _CACHE.get(key)
    if loaded is None:
        if detect_format(ref) == "cubepool":
            # One device and stream to a file: ``device`` and ``stream`` pick among those
            # of the imported formats (the reader refuses them for such a file).
            device = stream = None
        loaded = _CACHE[key] = load_trace_with_report(
            ref, device=device, stream=stream, live_before=live_before, strict=strict
        )
    return loaded


# A planned pool's plan file in a layout's text (the pools language ends a value at
# "," or ")").
_PLAN_FILE: Final = re.compile(r"(planned\(\s*file\s*=\s*)([^,)]*)")

# The plan file this worker reads for each (name, text) a job carried: the name itself
# where its file here holds that text, else a temporary file it wrote (so a worker looks
# at each plan once, not at every job).
_LOCAL_PLANS: dict[tuple[str, str], str] = {}


def _plan_texts(spec: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The text of each plan file the layout ``spec`` follows, by the name it gives,
    read here so that a job carries it to workers that cannot read that file."""
    text = spec.get("layout")
    if not isinstance(text, str):
        return ()
    names = dict.fromkeys(match.group(2).strip() for match in _PLAN_FILE.finditer(text))
    return tuple((name, Path(name).read_text(encoding="utf-8")) for name in names)


def _with_local_plans(spec: dict[str, Any], plans: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """``spec`` naming, for each plan file whose text here differs from what the job
    carries (or is missing), a temporary file holding the carried text."""
    local: dict[str, str] = {}
    for name, text in plans:
        if (name, text) not in _LOCAL_PLANS:
            try:
                same = Path(name).read_text(encoding="utf-8") == text
            except (OSError, UnicodeDecodeError):
                same = False
            _LOCAL_PLANS[name, text] = name if same else temporary_plan_text(text)
        if _LOCAL_PLANS[name, text] != name:
            local[name] = _LOCAL_PLANS[name, text]
    if not local:
        return spec
    layout = _PLAN_FILE.sub(
        lambda match: match.group(1) + local.get(match.group(2).strip(), match.group(2)),
        spec["layout"],
    )
    return {**spec, "layout": layout}


def _replay_job(
    ref: str | Trace,
    spec: dict[str, Any],
    properties: tuple[int, int] | None,
    limit: int | str | None,
    device: str | int | None = None,
    stream: int | None = None,
    live_before: bool = True,
    strict: bool = True,
    plans: tuple[tuple[str, str], ...] = (),
) -> dict[str, Any]:
    """One replay of a sweep, run in a worker: plain data in, plain data out."""
    trace, imported = _load(ref, device, stream, live_before, strict)
    props = None if properties is None else MemoryDeviceProperties(*properties)
    spec = _with_local_plans(spec, plans)
    result = replay(trace, from_spec(spec), props, limit=limit, samples=0)
    return {
        **result.to_dict(timeline=False),
        _WORKLOAD: trace.workload,
        _IMPORTED: None if imported is None else imported.to_dict(),
    }


# The keys under which a worker hands back the trace's workload and its import's report
# (not part of the row).
_WORKLOAD: Final = "__workload__"
_IMPORTED: Final = "__imported__"


def _import_report(data: dict[str, Any]) -> ImportReport:
    """An :class:`ImportReport` from its ``to_dict()`` data (as a worker hands it back)."""
    return ImportReport(**{**data, "notes": tuple(data["notes"])})


METRICS: Final = (
    "utilization",
    "fragmentation",
    "peak_reserved",
    "peak_in_use",
    "peak_live",
    "storage_allocations",
    "storage_frees",
    "failed_reserves",
    "ns_per_event",
    "seconds",
    "events",
)
"""The figures :meth:`Sweep.table` and :meth:`Sweep.pivot` show."""


def _figure(metric: str, value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if metric.startswith(("peak", "bytes")):
        return human_bytes(value)
    return f"{value:,}"


@dataclass(frozen=True)
class SweepRow:
    """One (trace, layout) replay of a sweep.

    Attributes:
        trace: the trace's name.
        layout: the layout's name.
        spec: the layout as :func:`cubepool.layouts.to_spec` data.
        result: the replay's figures (``ReplayResult.to_dict(timeline=False)``).
    """

    trace: str
    layout: str
    spec: dict[str, Any]
    result: dict[str, Any]

    @property
    def utilization(self) -> float:
        """Peak live / peak reserved; NaN for an incomplete replay (see ``complete``)."""
        value = self.result["utilization"]
        return math.nan if value is None else float(value)

    @property
    def complete(self) -> bool:
        """Whether the replay served every reservation of the trace."""
        return bool(self.result["complete"])

    @property
    def peak_reserved(self) -> int:
        """The most bytes reserved at once."""
        return int(self.result["peak_reserved"])

    def to_dict(self) -> dict[str, Any]:
        """The row as JSON-ready data."""
        return {"trace": self.trace, "layout": self.layout, "spec": self.spec, **self.result}


@dataclass(frozen=True)
class Sweep:
    """The replays of a sweep, in (trace, layout) order of the request.

    Attributes:
        rows: one per (trace, layout) pair.
        imports: for each trace imported from another format (a PyTorch profiler trace
            or snapshot, an RMM log), by the name its rows carry, what the import
            dropped, kept specially or skipped (with ``strict=False``, the malformed
            entries it skipped); a cubepool trace v1 file or a loaded trace has none.
    """

    rows: tuple[SweepRow, ...]
    imports: Mapping[str, ImportReport] = field(default_factory=dict)

    def pivot(self, metric: str = "utilization") -> dict[str, dict[str, Any]]:
        """``{trace: {layout: metric}}`` for any figure of ``ReplayResult.to_dict()``
        (:data:`METRICS`); an incomplete replay's ratios are None.

        Raises:
            InvalidArgument: ``metric`` is no figure of a replay (the message lists them).
        """
        if metric not in METRICS:
            raise InvalidArgument(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
        out: dict[str, dict[str, Any]] = {}
        for row in self.rows:
            out.setdefault(row.trace, {})[row.layout] = row.result[metric]
        return out

    def table(self, metric: str = "utilization") -> str:
        """A plain-text table: one row per trace, one column per layout, of ``metric``
        (byte counts in binary units, ratios to three places). A replay whose
        reservations failed is marked ``incomplete``, and a note under the table says
        why they failed."""
        grid = self.pivot(metric)
        layouts = list(dict.fromkeys(row.layout for row in self.rows))
        incomplete = {(row.trace, row.layout): row for row in self.rows if not row.complete}

        def cell(trace: str, layout: str) -> str:
            if layout not in grid[trace]:
                return "-"
            value = grid[trace][layout]
            if (trace, layout) in incomplete:
                if value is None or isinstance(value, float):
                    return "incomplete"
                return f"{_figure(metric, value)} (incomplete)"
            return "-" if value is None else _figure(metric, value)

        lines = [[trace, *(cell(trace, layout) for layout in layouts)] for trace in grid]
        text = table([f"trace \\ {metric}", *layouts], lines)
        if incomplete:
            text += "\n\nfailed reservations (peaks of these replays cover only what was served):"
            for (trace, layout), row in incomplete.items():
                limit = (row.result.get("replayed") or {}).get("limit")
                failed = failure_text(row.result["failures"], limit)
                text += f"\n  {name_cell(trace)} / {name_cell(layout)}: {failed}"
        return text

    def to_dict(self) -> dict[str, Any]:
        """The sweep as JSON-ready data: its rows, and its traces' import reports by
        trace name (see ``imports``)."""
        return {
            "rows": [row.to_dict() for row in self.rows],
            "imports": {name: report.to_dict() for name, report in self.imports.items()},
        }

    @property
    def complete(self) -> bool:
        """Whether every replay served every reservation."""
        return all(row.complete for row in self.rows)

    def __repr__(self) -> str:
        traces = len(dict.fromkeys(row.trace for row in self.rows))
        layouts = len(dict.fromkeys(row.layout for row in self.rows))
        incomplete = sum(1 for row in self.rows if not row.complete)
        tail = f", {incomplete} incomplete" if incomplete else ""
        return f"<Sweep {traces} traces x {layouts} layouts: {len(self.rows)} replays{tail}>"

    def __str__(self) -> str:
        return self.table()


def _main_is_importable() -> bool:
    """Whether a spawned process can import this program's ``__main__`` again: true for
    script files, ``python -m``, the REPL and notebooks; false for ``python - <<EOF``."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return path is None or os.path.exists(path)


def _working_directory_exists() -> bool:
    """Whether the working directory still exists: a spawned process is handed it, and
    cannot start (an ``OSError`` from ``os.getcwd``) once it was deleted."""
    try:
        os.getcwd()
    except OSError:
        return False
    return True


def _default_executor(jobs: int, max_workers: int | None) -> Executor:
    workers = max(1, min(jobs, max_workers or os.cpu_count() or 1))
    if not (_main_is_importable() and _working_directory_exists()):
        # Processes could not start; replays release the GIL, so threads run in parallel.
        return ThreadPoolExecutor(workers)
    # "spawn" starts clean interpreters: no inherited threads or locks, same on every OS.
    return ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_started
    )


def _worker_started() -> None:
    """A worker process's first call: SIGINT, which it inherited ignored and blocked
    (:func:`_workers_ignore_sigint`), is unblocked, and stays ignored."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextmanager
def _workers_ignore_sigint(pool: Executor) -> Iterator[None]:
    """While ``pool``, a process pool, starts its workers (its ``submit`` calls): SIGINT
    ignored in this process, so that each worker inherits it ignored through ``exec``.
    A terminal's Ctrl-C goes to the whole process group; workers that took it printed a
    ``KeyboardInterrupt`` traceback each (spawned ones import for a second or two), so
    the caller alone handles it (:func:`_stop_now`). A Ctrl-C meanwhile is held back
    (SIGINT blocked in this thread, which keeps it pending, not discarded) and handled
    once the caller's handler is back. Only on the main thread, where Python's handler
    runs, and where Python installed a handler."""
    if (
        not isinstance(pool, ProcessPoolExecutor)
        or not hasattr(signal, "pthread_sigmask")
        or threading.current_thread() is not threading.main_thread()
    ):
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:
        yield
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        # The handler first, then the mask: a SIGINT held back is delivered to it.
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _stop_now(pool: Executor) -> None:
    """Shuts ``pool`` down without waiting for the replays running (Ctrl-C): the queued
    ones are cancelled, and a process pool's workers terminated, so none is left behind
    (threads cannot be stopped: a thread pool's running replays end on their own)."""
    if not isinstance(pool, ProcessPoolExecutor):
        pool.shutdown(wait=False, cancel_futures=True)
        return
    terminate = getattr(pool, "terminate_workers", None)  # Python 3.14
    if terminate is not None:
        terminate()
        return
    # Before the shutdown, which forgets them.
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(5)
        if process.exitcode is None:
            process.kill()
            process.join()


def sweep(
    traces: TraceRef | Iterable[TraceRef] | Mapping[str, TraceRef],
    configs: Layouts | None = None,
    executor: Executor | None = None,
    *,
    properties: MemoryDeviceProperties | None = None,
    limit: int | str | None = None,
    max_workers: int | None = None,
    progress: Callable[[int, int, str], None] | bool | None = None,
    device: str | int | None = None,
    stream: int | None = None,
    live_before: bool = True,
    strict: bool = True,
) -> Sweep:
    """Replay every trace through every layout.

    Args:
        traces: one trace or several: paths, bundled example names or loaded traces, or
            a mapping from a name to one of those (a single string is one trace).
        configs: one layout or several, as :func:`cubepool.compare` takes them; by
            default the default layout, ``SubSlices`` and ``ExclusivePages``.
        executor: where the replays run: any :class:`concurrent.futures.Executor`, such
            as ``distributed.Client(...).get_executor()``. By default a pool of local
            processes (at most ``max_workers``, the CPU count by default), shut down at
            the end; a given executor is left running. Like every process pool, the
            default one starts fresh interpreters that import the calling script again:
            keep a script's work under ``if __name__ == "__main__":``. (A program read
            from stdin cannot be imported again; it gets threads instead, which run
            replays in parallel too, since replays release the GIL.)
        properties: the device (the default device when None).
        limit: the device's memory, in bytes or as a size such as ``"300MiB"``.
        max_workers: the most local processes when ``executor`` is None (at least 1).
        progress: called as ``progress(done, total, "sweep")`` as replays finish;
            ``True`` draws a progress bar on stderr.
        device: the device to read from trace files that hold several (PyTorch
            profiler traces and snapshots, RMM logs).
        stream: the stream to read from trace files that hold several.
        live_before: put the blocks live before a file's recording began at its start
            (see :func:`cubepool.importers.import_trace`).
        strict: refuse a malformed entry of an imported format (False skips it, see
            :func:`cubepool.importers.import_trace`).

    Returns:
        A :class:`Sweep`; ``sweep.table()`` shows utilization per trace and layout.

    Raises:
        TypeError: ``max_workers`` is not an int (a bool or a float such as 1.5).
        InvalidArgument: ``max_workers`` is below 1.
    """
    if max_workers is not None:
        # An int or anything with __index__ (a numpy integer); a bool or a float is not.
        try:
            if isinstance(max_workers, bool):
                raise TypeError
            max_workers = operator.index(max_workers)
        except TypeError:
            raise TypeError(
                f"max_workers must be an int or None, got {type(max_workers).__name__}"
            ) from None
    if max_workers is not None and max_workers < 1:
        raise InvalidArgument(f"max_workers must be at least 1, got {max_workers}")
    refs: Iterable[TraceRef] = [traces] if isinstance(traces, str | os.PathLike | Trace) else traces
    given_names = isinstance(traces, Mapping)
    named: Sequence[tuple[str, TraceRef]] = (
        list(traces.items()) if isinstance(traces, Mapping) else [(trace_label(t), t) for t in refs]
    )
    report = progress_callback(progress)
    layouts = _labelled(configs if configs is not None else COMPARE_DEFAULTS)
    specs = [(label, to_spec(config)) for label, config in layouts]
    # Each planned layout's plan files, read once here for the jobs to carry.
    plans = {label: _plan_texts(spec) for label, spec in specs}
    props = None if properties is None else (properties.max_page_size, properties.alignment)
    jobs = [
        (index, _resolve(ref), label, spec)
        for index, (_, ref) in enumerate(named)
        for label, spec in specs
    ]
    if not jobs:
        return Sweep(())
    names = [name for name, _ in named]
    own = executor is None
    pool = _default_executor(len(jobs), max_workers) if executor is None else executor
    stopped = False
    try:
        # A process pool starts its workers as jobs are submitted.
        with _workers_ignore_sigint(pool) if own else nullcontext():
            futures: dict[Future[dict[str, Any]], int] = {
                pool.submit(
                    _replay_job,
                    ref,
                    spec,
                    props,
                    limit,
                    device,
                    stream,
                    live_before,
                    strict,
                    plans[label],
                ): index
                for index, (_, ref, label, spec) in enumerate(jobs)
            }
        results: list[dict[str, Any]] = [{} for _ in jobs]
        # Each imported trace's report, by the trace's index (its replays' are alike).
        imported: dict[int, ImportReport] = {}
        for done, future in enumerate(as_completed(futures), start=1):
            index = futures[future]
            results[index] = future.result()
            # Named as the command line and compare() name a trace: by its workload,
            # else its file, unless the caller named it.
            workload = results[index].pop(_WORKLOAD, "")
            if workload and not given_names:
                names[jobs[index][0]] = workload
            report_data = results[index].pop(_IMPORTED, None)
            if report_data is not None:
                imported.setdefault(jobs[index][0], _import_report(report_data))
            if report is not None:
                report(done, len(jobs), "sweep")
    except (KeyboardInterrupt, SystemExit):
        # Ctrl-C (or SIGTERM's exit): no waiting for the replays running.
        if own:
            stopped = True
            _stop_now(pool)
        raise
    finally:
        if own and not stopped:
            pool.shutdown(cancel_futures=True)
    # Two traces of one name (one workload, or one file name in two folders) are named
    # by their paths, so that their rows do not merge.
    paths = [os.fspath(ref) if isinstance(ref, str | os.PathLike) else n for n, ref in named]
    names = unique_labels(names, paths)
    return Sweep(
        tuple(
            SweepRow(names[trace], label, spec, result)
            for (trace, _, label, spec), result in zip(jobs, results, strict=True)
        ),
        {names[trace]: report for trace, report in sorted(imported.items())},
    )
