"""The ``cubepool`` command line: what pool layouts do with an allocation trace.

``cubepool report --example gpt2-train --out mem.html`` tells the whole story of one trace:
the default layout's replay, a comparison with CubeCL's presets and a model of PyTorch's
caching allocator, a planned layout, and a picture of memory over time. The other
commands do one step each: ``replay``, ``compare``, ``plan``, ``sweep``, ``plot``, and
``convert`` (any supported format to cubepool trace v1).

Without ``--config`` the default layout is the one Python uses: ``CUBEPOOL_MEMORY_POOLS``,
else ``memory.pools`` in the nearest ``cubepool.toml``, else cubepool's default; every
command says which it used. Sizes (``--limit 300MiB``) are read as the pools language
reads them: ``KiB``/``MiB``/``GiB`` are powers of 1024, ``KB``/``MB``/``GB`` powers of 1000.

Exit status: 0 when every replay served every reservation, 3 when a replay is incomplete
(reservations failed under ``--limit``, or were too big for every pool), 1 for an error
in the inputs or the work (a file that cannot be read or written), 2 for a usage error
(arguments missing, clashing or out of range: argparse's ``parser.error``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final, NoReturn, TextIO, cast

from cubepool import examples, importers
from cubepool._cubepool import (
    MemoryConfiguration,
    MemoryDeviceProperties,
    PoolReplay,
    ReplayResult,
    TorchAllocatorModel,
    Trace,
    __version__,
)
from cubepool._cubepool import parse_size as _parse_size
from cubepool._errors import CubepoolError, InvalidArgument
from cubepool._files import check_output_path, write_text
from cubepool._format import counted, human_bytes, listed, table, unique_labels
from cubepool._progress import ProgressBar
from cubepool._terminal import ShownControls, name_cell, one_line, short_name
from cubepool._trace import (
    example_shadowing,
    existing_trace_source,
    load_trace_with_report,
    replay,
    trace_label,
)
from cubepool.compare import COMPARE_DEFAULTS, compare, failure_text
from cubepool.layouts import (
    PRESETS,
    TORCH_MODELS,
    Layout,
    check_plan_path_text,
    config_from_arg,
    default_configuration,
    describe,
    to_spec,
)
from cubepool.place import MAX_TIME_LIMIT
from cubepool.plan import plan
from cubepool.plan.candidates import DERIVE_CHOICES, REPORT_FEW_FROM_EVENTS
from cubepool.plan.planned import check_plan_path
from cubepool.plan.static import DEFAULT_TIME_LIMIT as STATIC_TIME_LIMIT
from cubepool.plot import output_path, plot
from cubepool.recorded import difference_percent, differences, matching_model, recorded_dict
from cubepool.sweep import METRICS, sweep

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

INCOMPLETE: int = 3
"""The exit status when a replay is incomplete (some reservations failed)."""

_TRACE_SUFFIXES = (".jsonl", ".jsonl.gz")

# Python keyword hints in library messages, as the command line spells them.
_SHELL_WORDS = (
    ("pass strict=False to skip", "pass --lenient to skip"),
    ("choose one with device=...", "choose one with --device"),
    ("choose another with device=...", "choose another with --device"),
    ("choose one with stream=...", "choose one with --stream"),
    ("leave device=None", "leave out --device"),
    ("leave stream=None", "leave out --stream"),
    ("leave device and stream None", "leave out --device and --stream"),
    ("device=", "--device "),
    ("stream=", "--stream "),
)


# An import's bound (`max_events=4,000,000`) and the advice to raise it as Python
# does (`max_events=N (None lifts it) or the ... variable`): the command line has the
# environment variable only.
_IMPORT_BOUND = re.compile(r"\bmax_(?:events|bytes)=([\d,]+)")
_RAISE_BOUND = re.compile(
    r"raise the bound with max_\w+=N \(None lifts it\) or the (\w+) environment variable"
)


def parse_size(text: str) -> int:
    """Bytes from a size as the pools language writes it: ``4096``, ``64KiB``, ``1.5 GiB``,
    ``300MB`` (KiB = 1024 bytes, KB = 1000)."""
    try:
        return _parse_size(text, "size")
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_MOST: Final = (1 << 64) - 1
"""The largest count an option takes: counts go to Rust as 64-bit integers."""
_SHOWN_DIGITS: Final = 40
"""The most digits of a refused count an error shows (a longer one is told by length)."""


def _positive(text: str) -> int:
    """A count from 1 to :data:`_MOST`, refused here (argparse names the option) rather
    than by the work that would take it, after minutes and under an internal name."""
    digits = text.strip().lstrip("+").lstrip("0")
    if digits.isascii() and digits.isdigit() and len(digits) > _SHOWN_DIGITS:
        # Told by its length, not its value (int() refuses more than 4,300 digits).
        raise argparse.ArgumentTypeError(
            f"must be at most {_MOST:,} (64 bits), not a {len(digits):,}-digit number"
        )
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    if value > _MOST:
        raise argparse.ArgumentTypeError(f"must be at most {_MOST:,} (64 bits), not {value:,}")
    return value


def _output(text: str) -> str:
    """A path to write: refused here when empty (it names no file; open() and the
    folder checks would say "Is a directory" of the working folder)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path names no file to write")
    return text


def _input(text: str) -> str:
    """A path to read: refused here when empty (it names no file; the readers said "no
    such trace file" or "No such file or directory" of nothing)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path names no file")
    return text


def _plan_output(text: str) -> str:
    """A path for ``plan --save``: :func:`_output`'s, that a layout can name (a plan file
    is read back as ``planned(file=PATH)``, and the pools language ends a value at
    ``,``, ``(``, ``)``, ``;``, ``=``, ``#``: :func:`cubepool.layouts.check_plan_path_text`),
    refused here as a usage error naming the option, before the trace is read."""
    try:
        return check_plan_path_text(_output(text))
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    """A time limit: a positive number of seconds below the solver's bound."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < MAX_TIME_LIMIT:
        raise argparse.ArgumentTypeError(
            f"must be a positive number of seconds below {MAX_TIME_LIMIT:,.0f}, not {text}"
        )
    return value


def _derive(text: str) -> str | int:
    if text in DERIVE_CHOICES:
        return text
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(
            f"takes {', '.join(DERIVE_CHOICES)} or a positive event count, not {text!r}"
        )
    return count


# --------------------------------------------------------------------------- helpers


def _add_trace(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "trace",
        nargs="?",
        type=_input,
        help="a trace file: cubepool trace v1 (.jsonl[.gz]), a PyTorch profiler trace or "
        "memory snapshot, or an RMM log; or a bundled example's name (a regular file of "
        "that name here is read instead, and a note says so; --example NAME is always the "
        "example)",
    )
    parser.add_argument("--example", choices=examples.names(), help="a bundled real trace")
    parser.add_argument("--device", help="the device to import (cpu, cuda:0, ...)")
    parser.add_argument("--stream", type=int, help="the stream to import (snapshots, RMM)")
    parser.add_argument("--lenient", action="store_true", help="skip and count malformed entries")
    _add_start_empty(parser)


def _add_start_empty(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--start-empty",
        action="store_true",
        help="start an imported trace empty: leave out the blocks live before the recording "
        "began (by default they are allocated at its start) and drop their frees",
    )


def _add_device(
    parser: argparse.ArgumentParser,
    *,
    layouts: str | None,
    repeatable: str | None = "repeatable",
    plan: bool = False,
) -> None:
    """The device's flags, and ``--config`` where the command takes layouts (``layouts``
    names its default); ``repeatable`` says what several mean (``None``: one only);
    ``plan`` for ``plan``'s, whose search takes no ``--limit``."""
    if layouts is not None:
        several = f"{repeatable} " if repeatable is not None else "one layout "
        parser.add_argument(
            "--config",
            action="append",
            metavar="LAYOUT",
            help=f"a layout: a preset ({', '.join(PRESETS)}), a model of PyTorch's caching "
            f"allocator to compare with ({', '.join(TORCH_MODELS)}), pools-language text, or a "
            f"layout file (JSON as 'cubepool plan --save' writes, pools text, cubepool.toml); "
            f"{several}(default: {layouts}, where the default layout is "
            "CUBEPOOL_MEMORY_POOLS or cubepool.toml when they name one; '--config default' "
            "names cubepool's own default layout)",
        )
    parser.add_argument("--max-page-size", type=parse_size, help="the device's largest page")
    parser.add_argument("--alignment", type=parse_size, help="the device's alignment")
    parser.add_argument(
        "--limit",
        type=parse_size,
        help="the device's memory (e.g. 16GiB)"
        + ("; the search itself does not take it, the plan's replay beside does" if plan else ""),
    )


class UsageError(Exception):
    """Arguments that cannot go together, or are missing: ``main`` reports it as argparse
    reports its own (``parser.error``, exit status 2)."""


def _properties(args: argparse.Namespace) -> MemoryDeviceProperties | None:
    """The device of ``--max-page-size`` and ``--alignment`` (checked before any work)."""
    if args.max_page_size is None and args.alignment is None:
        return None
    try:
        return MemoryDeviceProperties(args.max_page_size, args.alignment)
    except ValueError as exc:  # PoolConfigError, InvalidArgument
        flags = re.sub(r"\b(max_page_size|alignment)\b", r"--\1", str(exc))
        flags = flags.replace("max_page_size", "max-page-size")
        # A value the user did not give is the device's default: say so, not blame a flag.
        for flag, given in (
            ("--alignment", args.alignment),
            ("--max-page-size", args.max_page_size),
        ):
            if given is None:
                flags = re.sub(rf"{flag} \(([^)]*)\)", rf"{flag} (\1, the default)", flags)
        raise UsageError(flags) from None


def _device(properties: MemoryDeviceProperties | None) -> MemoryDeviceProperties:
    """The device a replay with ``properties`` runs on (``None``: the default device), so
    that a layout is described as replayed (pages shrunk to its largest page)."""
    return MemoryDeviceProperties() if properties is None else properties


def _default_layout() -> tuple[str, Layout, str]:
    """The layout Python's ``config=None`` means, its label, and where it came from."""
    configured = MemoryConfiguration.from_environment()
    if configured is not None:
        config, source = configured
        return "configured", config, source
    return "default", default_configuration(), "cubepool's default"


def _layouts(args: argparse.Namespace, default: Sequence[str]) -> list[tuple[str, Layout]]:
    """The ``--config`` layouts, else ``default``, whose ``default`` is the layout the
    environment names when it names one (said on stderr)."""
    chosen = getattr(args, "config", None)
    if chosen:
        layouts = [_config_arg(text) for text in chosen]
        # Two files of one name are labelled by their paths.
        labels = unique_labels([label for label, _ in layouts], chosen)
        return [(label, config) for label, (_, config) in zip(labels, layouts, strict=True)]
    out = []
    for text in default:
        if text == "default":
            label, config, source = _default_layout()
            if label == "configured":
                print(f"cubepool: layout 'configured' is from {source}", file=sys.stderr)
            out.append((label, config))
        else:
            out.append(config_from_arg(text))
    return out


def _config_arg(text: str) -> tuple[str, Layout]:
    """The layout of a ``--config`` value; an error says which value (a layout file's
    names the file already)."""
    try:
        return config_from_arg(text)
    except (CubepoolError, ValueError) as exc:
        message = str(exc).removeprefix(f"{text}: ")
        # Layout text of any length is shown cut short, as the message cuts it.
        shown = text if len(text) <= _SHOWN_CONFIG else f"{text[: _SHOWN_CONFIG - 3]}..."
        if not os.path.isfile(text) and getattr(exc, "kind", None) != "PlanFile":
            # The value itself is wrong (an unknown name, text that is no layout): an
            # argument out of range, exit status 2, as --help says; a layout file that
            # does not hold one, or a plan file the layout names that cannot be read, is
            # an input's error (1).
            raise UsageError(f"--config {shown}: {message}") from None
        raise InvalidArgument(f"--config {shown}: {message}") from None
    except OSError as exc:
        # A file that cannot be read (missing, a device, a folder): named as the flag's
        # value, as every other --config error is.
        if exc.errno is None or exc.filename is None:
            raise
        raise type(exc)(exc.errno, exc.strerror, f"--config {exc.filename}") from None


# The most characters of a --config value an error shows.
_SHOWN_CONFIG: Final = 80


def _source(args: argparse.Namespace) -> tuple[str, str]:
    """The trace file and its name, checked (before any work); a name that is not
    UTF-8 is shown with U+FFFD for its other bytes, as an import names its workload."""
    if args.example is not None:
        if args.trace is not None:
            raise UsageError("give a trace PATH or --example NAME, not both")
        return str(examples.path(args.example)), args.example
    if args.trace is None:
        raise UsageError("give a trace PATH or --example NAME")
    label = trace_label(args.trace)
    return existing_trace_source(args.trace), label


def _refuse_writing_over(output: str, source: str, option: str, what: str = "trace") -> None:
    """Refuses an output path that names the input ``source`` (the same file, by any
    name or link): the write would replace the input (a ``what``) with what was made of
    it."""
    try:
        same = os.path.samefile(output, source)
    except OSError:
        # One of them does not exist (or cannot be looked at): not the same file.
        return
    if same:
        raise UsageError(f"{option} {output} names the input {what}; writing it would replace it")


def _v1_notes(args: argparse.Namespace) -> None:
    """Says which import flags change nothing for a cubepool trace v1 file (``--device``
    and ``--stream`` are refused by the reader: the file holds one of each)."""
    if args.lenient:
        print(
            "cubepool: --lenient skips malformed entries of imported formats (profiler "
            "traces, snapshots, RMM logs); a cubepool trace v1 file is read strictly",
            file=sys.stderr,
        )
    if args.start_empty:
        print(
            "cubepool: --start-empty leaves out the blocks live before an imported "
            "recording began (snapshots, profiler traces, RMM logs); a cubepool trace v1 "
            "file is read as it is",
            file=sys.stderr,
        )


def _model_notes(properties: MemoryDeviceProperties | None, layouts: Sequence[Layout]) -> None:
    """Says that ``--max-page-size`` and ``--alignment`` change nothing where every
    layout is a model of PyTorch's caching allocator (which has no pages or alignment
    to take from the device), so that they are not ignored unsaid."""
    if properties is None or not layouts:
        return
    if all(isinstance(layout, TorchAllocatorModel) for layout in layouts):
        print(
            "cubepool: --max-page-size and --alignment fit pool layouts to the device; "
            "the models of PyTorch's caching allocator have no pages or alignment to "
            "take from it, so they change nothing here",
            file=sys.stderr,
        )


def _load(args: argparse.Namespace) -> tuple[str, Trace]:
    source, name = _source(args)
    if args.example is None:
        _shadowing_note(args.trace)
    if importers.detect_format(source) == "cubepool":
        _v1_notes(args)
    trace, dropped = load_trace_with_report(
        source,
        device=args.device,
        stream=args.stream,
        strict=not args.lenient,
        live_before=not args.start_empty,
    )
    if dropped is not None:
        print(f"cubepool: imported {name}: {_shell(dropped.summary())}", file=sys.stderr)
    # Named as Python names it: by its workload, else by its file.
    return trace.workload or name, trace


def _shadowing_note(ref: str, *, flag: bool = True) -> None:
    """Says, where a trace argument is a bundled example's bare name that also names
    something here, which of the two is read (:func:`cubepool._trace.trace_source`);
    ``flag``: the command takes ``--example`` (sweep does not: ``example:NAME``)."""
    note = example_shadowing(ref, flag=flag)
    if note is not None:
        print(f"cubepool: {note}", file=sys.stderr)


def _trace_line(name: str, trace: Trace) -> str:
    """The line that opens replay, compare, plan and report: the trace's name, its size
    and its first phases (names cut to :data:`cubepool._terminal.MAX_NAME_CHARS`)."""
    phases = [short_name(p) for p, _ in trace.phases]
    listing = one_line(listed(phases)) if phases else ""
    return (
        f"trace {name_cell(name)}: {len(trace):,} events, "
        f"{trace.allocations:,} allocations, peak live {human_bytes(trace.peak_live)}"
        + (f"; phases {listing}" if listing else "")
    )


def _pools_table(result: ReplayResult) -> str:
    rows = []
    for pool in result.pools:
        if not pool.reservations and not pool.pages_peak:
            continue
        kind = (
            pool.to_dict()["pool_type"]  # a pool of the torch model
            if pool.options is None
            else describe(MemoryConfiguration.custom([pool.options]))
        )
        rows.append(
            [
                str(pool.index),
                kind,
                f"{pool.reservations:,}",
                human_bytes(pool.peak_in_use),
                human_bytes(pool.peak_reserved),
                # A virtual pool holds no pages: its count is of runs of mapped granules.
                f"{pool.pages_peak:,}" + (" mapped runs" if _is_virtual(pool) else ""),
            ]
        )
    headers = ["pool", "kind", "reservations", "peak in use", "peak reserved", "pages (peak)"]
    return table(headers, rows)


def _is_virtual(pool: PoolReplay) -> bool:
    """Whether a replayed pool is a virtual one (mapped granules, not pages)."""
    return pool.options is not None and pool.options.pool_type.kind == "virtual_pages"


def _result_table(label: str, result: ReplayResult) -> str:
    row = [
        label,
        human_bytes(result.peak_reserved),
        human_bytes(result.peak_in_use),
        f"{result.utilization:.3f}" if result.complete else "incomplete",
        f"{result.storage_allocations:,}",
        f"{result.failed_reserves:,}",
        f"{result.ns_per_event:.0f}",
    ]
    headers = [
        "layout",
        "peak reserved",
        "peak in use",
        "utilization",
        "storage allocs",
        "failed",
        "ns/event",
    ]
    return table(headers, [row])


def _failures_line(result: ReplayResult) -> str:
    """Why a replay is incomplete, for the text under its table."""
    return (
        f"INCOMPLETE: {result.failed_reserves:,} reservations failed "
        f"({failure_text(result.failures, result.limit)}), the first at event "
        f"{result.first_failed_event:,}; the peaks cover only what was served"
    )


def _status(complete: bool) -> int:
    if not complete:
        print("cubepool: incomplete: some reservations failed (exit status 3)", file=sys.stderr)
    return 0 if complete else INCOMPLETE


def _json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def _check_out(args: argparse.Namespace) -> None:
    """Checks ``--out`` before any work, and puts the path that will be written back."""
    if getattr(args, "out", None) is not None:
        args.out = str(output_path(args.out))


# --------------------------------------------------------------------------- commands


def cmd_replay(args: argparse.Namespace) -> int:
    """Replays one trace through one layout and prints the result and its pools."""
    choices = [*([args.preset] if args.preset else []), *(args.config or [])]
    if len(choices) > 1:
        raise UsageError("give one layout (compare takes several)")
    # No flag is ignored without a word.
    if args.timeline and not args.json:
        raise UsageError("--timeline adds the timeline to --json's output: give --json too")
    if args.top is not None and not (args.at_peak and not args.json):
        raise UsageError(
            "--top is how many pinned segments --at-peak lists in text: give --at-peak "
            "(without --json, whose at_peak holds the whole address space)"
        )
    _source(args)
    properties = _properties(args)
    if choices:
        label, config = _config_arg(choices[0])
        source = "--preset" if args.preset else "--config"
    else:
        label, config, source = _default_layout()
    _model_notes(properties, [config])
    name, trace = _load(args)
    result = replay(trace, config, properties, limit=args.limit)
    recording = trace.recording
    if args.json:
        extra: dict[str, Any] = {}
        if recording is not None:
            extra["recorded"] = recorded_dict(recording, timeline=args.timeline)
            # An incomplete replay's peak covers only what was served: no difference.
            extra["vs_recorded_percent"] = (
                difference_percent(result.peak_reserved, recording) if result.complete else None
            )
        if args.at_peak:
            extra["at_peak"] = result.at_peak(trace).to_dict()
        _json(
            {
                "trace": name,
                "layout": label,
                "layout_source": source,
                **result.to_dict(timeline=args.timeline),
                **extra,
            }
        )
        return _status(result.complete)
    print(_trace_line(name, trace))
    print(f"layout {label} (from {source}): {describe(config, _device(properties))}")
    print()
    print(_result_table(label, result))
    if recording is not None:
        print()
        print("\n".join(differences(recording, [(label, config, result)])))
        diff = difference_percent(result.peak_reserved, recording)
        if diff is not None and result.complete and not isinstance(config, TorchAllocatorModel):
            print(f"  {label}: {diff:+.1f} % against the recorded peak")
    print()
    print(_pools_table(result))
    if not result.complete:
        print(f"\n{_failures_line(result)}")
    if args.at_peak:
        print()
        print(result.at_peak(trace).text(top=5 if args.top is None else args.top), end="")
    return _status(result.complete)


def cmd_compare(args: argparse.Namespace) -> int:
    """Replays one trace through several layouts: one table, best first."""
    _source(args)
    properties = _properties(args)
    layouts = _layouts(args, COMPARE_DEFAULTS)
    _model_notes(properties, [layout for _, layout in layouts])
    name, trace = _load(args)
    comparison = compare(
        trace,
        layouts,
        properties,
        limit=args.limit,
        objective=args.objective,
        name=name,
    )
    if args.json:
        _json(comparison.to_dict())
        return _status(comparison.complete)
    print(_trace_line(name, trace))
    print()
    print(comparison.table())
    return _status(comparison.complete)


def cmd_plan(args: argparse.Namespace) -> int:
    """Searches a layout for the trace and shows how it compares."""
    source, _ = _source(args)
    if args.save is not None:
        check_plan_path(args.save)
        _refuse_writing_over(args.save, source, "--save")
    properties = _properties(args)
    others = _layouts(args, COMPARE_DEFAULTS)
    name, trace = _load(args)
    planned = plan(
        trace,
        args.objective,
        properties,
        derive=args.derive,
        max_storage_allocations=args.max_storage_allocations,
        progress=ProgressBar(None if args.progress is None else args.progress),
        candidates=args.candidates,
        static_time_limit=args.static_time_limit,
    )
    if args.save is not None:
        if planned.is_planned():
            # The layout follows a plan file: --save writes that file (a layout file too).
            planned.save_planned(args.save)
        else:
            write_text(args.save, json.dumps(to_spec(planned.config), indent=2) + "\n")
    # The plan beside the layouts compared with it (the presets and every --config),
    # under --limit where one is given: the search itself replays on an unlimited device.
    comparison = compare(
        trace,
        [("planned", planned.config), *others],
        properties,
        limit=args.limit,
        name=name,
        objective=args.objective,
    )
    if args.json:
        # The exit status is the text's: whether the plan and the layouts beside it all
        # hold the trace (within --limit); `complete_within_limit` is the plan's own.
        extra: dict[str, object] = {"compared": comparison.to_dict()["rows"]}
        if args.limit is not None:
            (mine,) = [row for row in comparison.rows if row.label == "planned"]
            extra["complete_within_limit"] = mine.result.complete
        _json({"trace": name, **planned.to_dict(), **extra})
        return _status(comparison.complete)
    print(_trace_line(name, trace))
    print()
    print(planned.summary())
    print()
    print(comparison.table())
    if args.save is not None:
        print(f"\nlayout saved to {args.save} (use it with --config {args.save})")
    return _status(comparison.complete)


def cmd_sweep(args: argparse.Namespace) -> int:
    """Replays every trace through every layout, on local processes."""
    if not args.traces:
        raise UsageError("give at least one trace (a path or an example name)")
    properties = _properties(args)
    sources = [existing_trace_source(ref) for ref in args.traces]
    for ref in args.traces:
        _shadowing_note(ref, flag=False)
    if all(importers.detect_format(source) == "cubepool" for source in sources):
        _v1_notes(args)
        if args.device is not None or args.stream is not None:
            # replay and convert refuse them for such a file (the reader does); a sweep
            # may mix formats, so its flags pick among the imported files' devices and
            # are not refused, but with none to pick among they are not ignored unsaid.
            print(
                "cubepool: --device and --stream pick what to import from profiler traces, "
                "snapshots and RMM logs; a cubepool trace v1 file holds one device and "
                "stream, so they change nothing here",
                file=sys.stderr,
            )
    layouts = _layouts(args, COMPARE_DEFAULTS)
    _model_notes(properties, [layout for _, layout in layouts])
    result = sweep(
        args.traces,
        layouts,
        properties=properties,
        limit=args.limit,
        max_workers=args.workers,
        progress=ProgressBar(None if args.progress is None else args.progress),
        device=args.device,
        stream=args.stream,
        live_before=not args.start_empty,
        strict=not args.lenient,
    )
    # What each imported trace's import dropped or skipped, as `replay` says it.
    for name, report in result.imports.items():
        print(f"cubepool: imported {name}: {_shell(report.summary())}", file=sys.stderr)
    if args.json:
        _json(result.to_dict())
        return _status(result.complete)
    print(result.table(args.metric))
    return _status(result.complete)


def cmd_plot(args: argparse.Namespace) -> int:
    """Draws memory over time for one or more layouts."""
    _check_out(args)
    source, _ = _source(args)
    if args.out is not None:
        _refuse_writing_over(args.out, source, "--out")
    properties = _properties(args)
    layouts = _layouts(args, ["default"])
    _model_notes(properties, [layout for _, layout in layouts])
    name, trace = _load(args)
    results = [
        (label, replay(trace, config, properties, limit=args.limit, samples=1024))
        for label, config in layouts
    ]
    written = plot(
        trace,
        out=args.out,
        properties=properties,
        results=results,
        name=name,
        y_scale="shared" if args.shared_y else "panel",
    )
    print(f"wrote {written}")
    return _status(all(result.complete for _, result in results))


def cmd_convert(args: argparse.Namespace) -> int:
    """Converts a trace of any supported format to cubepool trace v1."""
    if args.example is not None:
        if args.output is not None:
            raise UsageError("give INPUT OUTPUT or --example NAME OUTPUT")
        args.input, args.output = str(examples.path(args.example)), args.input
    if args.input is None or args.output is None:
        raise UsageError("give INPUT OUTPUT (or --example NAME OUTPUT)")
    # Checked here, not by the parser: with --example the first positional is OUTPUT.
    for name, value in (("INPUT", args.input), ("OUTPUT", args.output)):
        if not value:
            raise UsageError(f"{name}: an empty path names no file")
    if not str(args.output).lower().endswith(_TRACE_SUFFIXES):
        raise UsageError(
            f"{args.output}: the output is cubepool trace v1, JSON Lines; "
            "name it .jsonl (or .jsonl.gz to compress it)"
        )
    output = str(args.output)
    if output.lower().endswith(".gz") and not output.endswith(".gz"):
        # Trace.write compresses a name ending in ".gz" only (as gzip and Python's
        # readers tell it): any other case would be written as plain text.
        raise UsageError(
            f"{output}: write the suffix .gz in lower case to compress the trace "
            f"({output[-3:]} would be written uncompressed)"
        )
    if not os.path.exists(args.input):
        raise FileNotFoundError(2, "no such trace file", args.input)
    check_output_path(args.output)
    _refuse_writing_over(args.output, args.input, "OUTPUT")
    fmt = importers.detect_format(args.input)
    if fmt == "cubepool":
        _v1_notes(args)
    trace, dropped = load_trace_with_report(
        args.input,
        device=args.device,
        stream=args.stream,
        strict=not args.lenient,
        live_before=not args.start_empty,
    )
    trace.write(args.output)
    print(
        f"wrote {args.output}: {len(trace):,} events, {trace.allocations:,} allocations "
        f"(from {fmt})"
    )
    if dropped is not None:
        print(f"import report: {_shell(dropped.summary())}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """The whole story of one trace: the default layout's replay, a comparison with
    CubeCL's presets and the models of PyTorch's caching allocator, a planned layout,
    and the picture."""
    _check_out(args)
    trace_path, _ = _source(args)
    if args.out is not None:
        _refuse_writing_over(args.out, trace_path, "--out")
    label, config, source = _default_layout()
    extra = [_config_arg(c) for c in args.config or []]
    properties = _properties(args)
    name, trace = _load(args)
    print(_trace_line(name, trace))
    first = replay(trace, config, properties, limit=args.limit)
    print(
        f"\n1. Replay with the {label} layout (from {source}):",
        describe(config, _device(properties)),
    )
    print(_result_table(label, first))
    print()
    print(_pools_table(first))
    if not first.complete:
        print(f"\n{_failures_line(first)}")
    # An incomplete replay's peak is that of the reservations it served.
    served = "" if first.complete else " (of the reservations it served)"
    print(f"\nWhy the {label} layout reserves more than is live, at its peak{served}:")
    print(first.at_peak(trace).text(top=3), end="")

    # CubeCL's presets and, for the question of what PyTorch itself would reserve, the
    # models of its caching allocator.
    layouts = [(label, config)]
    # The model with the recorded run's settings (expandable segments or not, and the
    # snapshot's allocator settings), where the file says them; both models where it
    # does not.
    matching = matching_model(trace.recording)
    models = TORCH_MODELS if matching is None else (matching,)
    if matching is not None:
        used = TorchAllocatorModel.parse(matching).expandable_segments
        print(
            f"\nthe recorded run {'used' if used else 'did not use'} "
            f"expandable segments: the comparison models PyTorch as {matching}"
        )
    layouts += [config_from_arg(p) for p in (*COMPARE_DEFAULTS[1:], *models)]
    if not args.no_plan:
        print("\n2. Plan a layout for this trace (replaying candidates):")
        planned = plan(
            trace,
            properties=properties,
            progress=ProgressBar(None if args.progress is None else args.progress),
            # A long trace is planned with the few set; the summary says so.
            candidates="few" if len(trace) > REPORT_FEW_FROM_EVENTS else "auto",
        )
        print(planned.summary())
        layouts.insert(0, ("planned", planned.config))
    layouts += extra
    comparison = compare(trace, layouts, properties, limit=args.limit, name=name)
    print(f"\n{3 if not args.no_plan else 2}. Compare the layouts (best first):")
    print(comparison.table())
    if args.out is not None:
        # One panel per layout, in the table's order (best first).
        written = plot(
            trace,
            out=args.out,
            properties=properties,
            results=[(row.label, row.result) for row in comparison.rows],
            name=name,
            y_scale="shared" if args.shared_y else "panel",
        )
        print(f"\nwrote {written}: memory over time, one panel per layout")
    return _status(comparison.complete and first.complete)


# --------------------------------------------------------------------------- parser


def _add_shared_y(parser: argparse.ArgumentParser) -> None:
    """The picture's ``--shared-y`` flag (``plot``'s and ``report``'s)."""
    parser.add_argument(
        "--shared-y",
        action="store_true",
        help="draw every panel on one y axis (default: each panel up to its own peak)",
    )


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors say what is wrong first, in one line, and
    then where the help is, instead of the whole usage followed by the error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n(see '{self.prog} --help')\n")

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        # argparse drops an OSError of this write (`--help > /dev/full` exited 0 unsaid
        # where stdout is unbuffered); one to stdout is raised here, for `main` to say.
        if file is None or file is not sys.stdout:
            super()._print_message(message, file)
        elif message:
            file.write(message)


# Options that take a value which may start with '-' (argparse reads `--limit -5MiB` as
# two options and says "expected one argument"; the value's own check should answer).
_VALUE_OPTIONS = (
    "--limit",
    "--max-page-size",
    "--alignment",
    "--stream",
    "--derive",
    "--time-limit",
    "--static-time-limit",
)


def _join_dashed_values(argv: Sequence[str]) -> list[str]:
    """``--limit -5MiB`` as ``--limit=-5MiB``, so the size's check refuses it by name."""
    out: list[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        item = items[i]
        following = items[i + 1] if i + 1 < len(items) else ""
        if item in _VALUE_OPTIONS and following[:1] == "-" and following[1:2].isdigit():
            out.append(f"{item}={following}")
            i += 2
            continue
        out.append(item)
        i += 1
    return out


def cmd_place(args: argparse.Namespace) -> int:
    """Places MiniMalloc CSV buffers and writes ``id,lower,upper,size,offset`` lines."""
    from cubepool.place import place_csv

    _refuse_writing_over(args.out, args.input, "--out", "CSV")
    placed = place_csv(args.input, args.out, capacity=args.capacity, time_limit=args.time_limit)
    proof = "optimal" if placed.optimal else "not proven optimal"
    print(
        f"{args.input}: {counted(len(placed), 'buffer')} placed in height {placed.height:,} "
        f"(lower bound {placed.lower_bound:,}, utilization {placed.utilization:.3f}, "
        f"{proof}, by {placed.method} in {placed.seconds:.2f} s) -> {args.out}"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``cubepool`` command."""
    parser = _Parser(
        prog="cubepool",
        description="What GPU-style memory pool layouts do with an allocation trace.",
        epilog="Without --config, the default layout is CUBEPOOL_MEMORY_POOLS, else "
        "memory.pools in the nearest cubepool.toml, else cubepool's default. Sizes: KiB, MiB, "
        "GiB, TiB are powers of 1024; KB, MB, GB, TB powers of 1000. Exit status: 0, or 3 when a "
        "replay is incomplete (reservations failed), 1 on errors in the inputs or the work "
        "(a file that cannot be read or written), 2 on usage errors (arguments missing, "
        "clashing or out of range).",
    )
    parser.add_argument("--version", action="version", version=f"cubepool {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    def progress_flags(p: argparse.ArgumentParser) -> None:
        group = p.add_mutually_exclusive_group()
        group.add_argument(
            "--progress", action="store_true", default=None, help="always show progress"
        )
        group.add_argument(
            "--no-progress", dest="progress", action="store_false", help="never show progress"
        )

    rp = commands.add_parser(
        "report",
        help="the whole story: replay, plan, compare, picture",
        description="Replay with the default layout, plan a layout, compare with CubeCL's "
        "SubSlices and ExclusivePages and with models of PyTorch's caching allocator (torch, "
        "torch_expandable), and draw memory over time.",
    )
    _add_trace(rp)
    _add_device(rp, layouts=None)
    rp.add_argument("--config", action="append", metavar="LAYOUT", help="more layouts")
    rp.add_argument(
        "--out",
        type=_output,
        help="write the picture here (.html, .svg, or .png with matplotlib; as plot --out), "
        "checked before any work",
    )
    rp.add_argument("--no-plan", action="store_true", help="skip planning")
    _add_shared_y(rp)
    progress_flags(rp)
    rp.set_defaults(run=cmd_report)

    r = commands.add_parser("replay", help="replay a trace through a pool layout")
    _add_trace(r)
    _add_device(r, layouts="default", repeatable=None)
    r.add_argument("--preset", choices=sorted(PRESETS), help="a preset (same as --config)")
    r.add_argument("--json", action="store_true", help="print the result as JSON")
    r.add_argument("--timeline", action="store_true", help="include the timeline in --json")
    r.add_argument(
        "--at-peak",
        action="store_true",
        help="show why reserved exceeds live at the peak: the gap's parts and the pinned "
        "segments with the most free bytes (in --json: the whole address space)",
    )
    r.add_argument("--top", type=_positive, help="pinned segments --at-peak lists (default 5)")
    r.set_defaults(run=cmd_replay)

    c = commands.add_parser("compare", help="replay a trace through several layouts")
    _add_trace(c)
    _add_device(c, layouts=", ".join(COMPARE_DEFAULTS))
    c.add_argument(
        "--objective",
        choices=["reserved", "storage_allocations"],
        default="reserved",
        help="what ranks the layouts, after complete replays first: peak bytes reserved "
        "(the default), then storage allocations; or storage allocations, then bytes",
    )
    c.add_argument("--json", action="store_true", help="print the comparison as JSON")
    c.set_defaults(run=cmd_compare)

    p = commands.add_parser("plan", help="search a layout for a trace")
    _add_trace(p)
    _add_device(
        p,
        layouts=", ".join(COMPARE_DEFAULTS),
        repeatable="repeatable: the layouts shown beside the plan",
        plan=True,
    )
    p.add_argument(
        "--objective",
        choices=["reserved", "storage_allocations"],
        default="reserved",
        help="what the plan makes least: peak bytes reserved (the default) or storage "
        "allocations (cudaMalloc calls)",
    )
    p.add_argument(
        "--derive",
        type=_derive,
        default="first_step",
        help="derive on: first_step (the default: two_steps where the trace names at least "
        "3 steps, else one_step), two_steps (the setup and two steps as recorded), one_step "
        "(the first step, run once more), all, or the first N events",
    )
    p.add_argument("--max-storage-allocations", type=_positive, help="budget of cudaMalloc calls")
    p.add_argument(
        "--candidates",
        choices=["auto", "full", "reduced", "few"],
        default="auto",
        help="how many candidate layouts to search (auto: the full set up to 50,000 events)",
    )
    p.add_argument(
        "--static-time-limit",
        type=_seconds,
        default=STATIC_TIME_LIMIT,
        help="seconds for the static placement of the whole trace (default %(default)s)",
    )
    p.add_argument(
        "--save",
        type=_plan_output,
        help="write the planned layout here as JSON (for a planned layout, its plan file,"
        " which --config reads as the layout that follows it); checked before the search:"
        " the path may not hold , ( ) ; = # (the pools language ends a value there) nor"
        " start or end with a space",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help='print the plan as JSON, with the layouts compared beside it under "compared"',
    )
    progress_flags(p)
    p.set_defaults(run=cmd_plan)

    s = commands.add_parser("sweep", help="replay many traces through many layouts")
    s.add_argument(
        "traces",
        nargs="*",
        type=_input,
        help="trace files or bundled example names (a regular file named as an example is "
        "read instead, and a note says so; example:NAME is always the example)",
    )
    _add_device(s, layouts=", ".join(COMPARE_DEFAULTS))
    s.add_argument("--device", help="the device to import from traces that hold several")
    s.add_argument("--stream", type=int, help="the stream to import (snapshots, RMM)")
    s.add_argument(
        "--lenient",
        action="store_true",
        help="skip malformed entries of imported formats (replay --lenient counts them)",
    )
    _add_start_empty(s)
    s.add_argument(
        "--workers", type=_positive, help="local processes, at least 1 (default: the CPU count)"
    )
    s.add_argument(
        "--metric", default="utilization", choices=METRICS, help="the figure in the table"
    )
    s.add_argument("--json", action="store_true", help="print every replay as JSON")
    progress_flags(s)
    s.set_defaults(run=cmd_sweep)

    pl = commands.add_parser("plot", help="draw memory over time")
    _add_trace(pl)
    _add_device(pl, layouts="default")
    pl.add_argument(
        "--out",
        type=_output,
        required=True,
        help="mem.html (interactive), mem.svg, or mem.png, mem.pdf, ... (matplotlib; .pgf "
        "needs LaTeX too); a name without a suffix gets .html added (mem. is written as "
        "mem.html), a name that is a suffix alone (.html) is taken as it is, and a device "
        "or FIFO (/dev/null) is refused: the picture is written beside it and renamed "
        "into place",
    )
    _add_shared_y(pl)
    pl.set_defaults(run=cmd_plot)

    cv = commands.add_parser("convert", help="convert a trace to cubepool trace v1")
    cv.add_argument("input", nargs="?", help="a trace of any supported format")
    cv.add_argument("output", nargs="?", help="the cubepool trace v1 file (.jsonl, or .jsonl.gz)")
    cv.add_argument(
        "--example", choices=examples.names(), help="a bundled real trace instead of INPUT"
    )
    cv.add_argument("--device", help="the device to import (cpu, cuda:0, ...)")
    cv.add_argument("--stream", type=int, help="the stream to import")
    cv.add_argument("--lenient", action="store_true", help="skip and count malformed entries")
    _add_start_empty(cv)
    cv.set_defaults(run=cmd_convert)

    pc = commands.add_parser("place", help="place buffers with lifetimes (MiniMalloc CSV) offline")
    pc.add_argument(
        "input",
        type=_input,
        help="MiniMalloc CSV: a header naming id (or buffer, buffer_id), lower (or begin, "
        "start), upper (or end, inclusive: upper = end + 1) and size in any order, and "
        "optionally alignment (1), hint (-1), gaps (empty) and offset (ignored, so this "
        "command's output reads)",
    )
    pc.add_argument(
        "--capacity", type=parse_size, help="the most bytes (an int or a size such as 1MiB)"
    )
    pc.add_argument(
        "--time-limit", type=_seconds, help="seconds to search (default 10)", dest="time_limit"
    )
    pc.add_argument(
        "--out",
        type=_output,
        required=True,
        help="CSV to write: id,lower,upper,size,offset (half-open: an end is written as "
        "upper = end + 1)",
    )
    pc.set_defaults(run=cmd_place)
    for command in commands.choices.values():
        # Usage errors found by a command are told as its parser tells its own.
        command.set_defaults(parser=command)
    return parser


def _shell(message: str) -> str:
    """A library message as a shell user reads it: flags, not keyword arguments."""
    message = _IMPORT_BOUND.sub(r"\1", message)
    message = _RAISE_BOUND.sub(r"raise the bound with the \1 environment variable", message)
    for python, flag in _SHELL_WORDS:
        message = message.replace(python, flag)
    return message


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cubepool`` command. What it prints has its control characters
    shown as escapes (:mod:`cubepool._terminal`), so that names from a trace cannot drive
    the terminal."""
    stdout, stderr = sys.stdout, sys.stderr
    # A closed stream (None: what Python makes of a closed descriptor) prints nothing: a
    # closed stdout stays None (print() to it does nothing), and a closed stderr becomes
    # a stream that keeps nothing, since print(file=None) writes to stdout (a note
    # meant for stderr landed in --json's output).
    shown_out = None if stdout is None else cast("TextIO", ShownControls(stdout))
    shown_err = (
        cast("TextIO", io.StringIO()) if stderr is None else cast("TextIO", ShownControls(stderr))
    )
    sys.stdout, sys.stderr = shown_out, shown_err
    try:
        return _main(argv)
    finally:
        # Each put back unless replaced meanwhile (`_stdout_failed` sets stdout aside).
        if sys.stdout is shown_out:
            sys.stdout = stdout
        if sys.stderr is shown_err:
            sys.stderr = stderr


def _terminated(signum: int, _frame: object) -> NoReturn:
    """SIGTERM (``timeout``, a CI's kill): exit as the shell reports the signal, through
    Python's exit, so the ``atexit`` cleanup runs (the temporary plan file)."""
    raise SystemExit(128 + signum)


def _main(argv: Sequence[str] | None) -> int:
    """:func:`main`, writing to ``sys.stdout`` and ``sys.stderr`` as they are."""
    if threading.current_thread() is not threading.main_thread():
        return _run(argv)
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        return _run(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(argv: Sequence[str] | None) -> int:
    """:func:`_main`'s work."""
    try:
        args = build_parser().parse_args(
            _join_dashed_values(sys.argv[1:] if argv is None else argv)
        )
    except SystemExit as exiting:
        if exiting.code not in (0, None):
            raise
        # `--help` (or `--version`) was written to stdout: flush it here, so that a
        # write that fails (`> /dev/full`) is said, as the commands' output is.
        return _flushed()
    except OSError as error:  # the same, written unbuffered (see `_Parser`)
        return _stdout_failed(error)
    past_reader = None
    if sys.stdout is not None and any(
        getattr(args, name, None) is not None for name in _FILE_OUTPUTS
    ):
        # A reader that leaves (`| head`) does not cancel the file asked for.
        past_reader = _PastReader(sys.stdout)
        sys.stdout = cast("TextIO", past_reader)
    try:
        importers.check_environment()
        code: int = args.run(args)
        if past_reader is not None:
            past_reader.flush()
    except UsageError as error:
        args.parser.error(str(error))
    except BrokenPipeError as error:
        # The reader (`| head`) has seen enough: stop quietly, as shell tools do.
        return _stdout_failed(error)
    except OSError as error:
        where = f"{error.filename}: " if error.filename else ""
        print(f"cubepool: {where}{error.strerror or error}", file=sys.stderr)
        return 1
    except (CubepoolError, LookupError, ImportError, ValueError) as error:
        print(f"cubepool: {_shell(str(error))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Ctrl-C: one line, and the shell's status for SIGINT, not a traceback.
        print("cubepool: interrupted", file=sys.stderr)
        return 130
    finally:
        if past_reader is not None and sys.stdout is past_reader:
            # Put back what was wrapped (main puts back the caller's), unless the reader
            # left: then nothing more is written there, the flush at exit included.
            sys.stdout = open(os.devnull, "w") if past_reader.reader_left else past_reader.stream
    return code


# The options naming a file a command writes (plan --save, plot and report --out,
# convert's OUTPUT, place --out).
_FILE_OUTPUTS: Final = ("save", "out", "output")


class _PastReader:
    """Stdout for a command that writes a file: once the reader of stdout has left (a
    closed pipe), what is printed goes nowhere and the command goes on to write its
    file, where stopping (as a command that only prints does) would leave it unwritten
    and exit 0. Other errors of the stream are raised as they come."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.reader_left = False

    def write(self, text: str) -> int:
        """Writes ``text`` unless the reader has left; returns ``len(text)``."""
        if not self.reader_left:
            try:
                self.stream.write(text)
            except BrokenPipeError:
                self.reader_left = True
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        """Writes each of ``lines`` as :meth:`write` does."""
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        """Flushes the stream unless the reader has left."""
        if not self.reader_left:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self.reader_left = True

    def __getattr__(self, name: str) -> object:
        return getattr(self.stream, name)


def _flushed() -> int:
    """Flushes stdout: 0, or what :func:`_stdout_failed` says where it cannot be written
    (a closed stdout, None, has nothing to flush)."""
    if sys.stdout is None:
        return 0
    try:
        sys.stdout.flush()
    except OSError as error:
        return _stdout_failed(error)
    return 0


def _stdout_failed(error: OSError) -> int:
    """The exit status of a write to stdout that failed with ``error``: 0 for a closed
    pipe (the reader, ``| head``, has seen enough), else 1 with the error on stderr.
    Stdout is set to nothing, so the flush at exit has nothing more to fail on."""
    sys.stdout = open(os.devnull, "w")
    if isinstance(error, BrokenPipeError):
        return 0
    print(f"cubepool: writing the output (stdout): {error.strerror or error}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
