"""The ``cubepool`` command line: what pool layouts do with an allocation trace.

``cubepool report --example gpt2-train --out mem.html`` tells the whole story of one trace:
the default layout's replay, a comparison with CubeCL's presets and a model of PyTorch's
caching allocator, a planned layout, and a picture of memory over time. The other
commands do one step each: ``replay``, ``compare``, ``plan``, ``sweep``, ``plot``, and
``convert`` (any supported format to cubepool trace v1).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from cubepool import examples, importers
from cubepool._cubepool import MemoryConfiguration, MemoryDeviceProperties, ReplayResult, Trace
from cubepool._errors import CubepoolError
from cubepool._format import human_bytes, table
from cubepool._trace import load_trace_with_report, replay
from cubepool.compare import COMPARE_DEFAULTS, compare
from cubepool.layouts import PRESETS, TORCH_MODELS, Layout, config_from_arg, describe, to_spec
from cubepool.plan import plan
from cubepool.plot import plot
from cubepool.sweep import sweep

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from ``4096``, ``64KiB``, ``1.5 GiB``, ``2g`` (binary units)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 4096, 64KiB or 2GiB)")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def _derive(text: str) -> str | int:
    if text in ("first_step", "all"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--derive takes first_step, all or an event count, not {text!r}"
        ) from None


class ProgressBar:
    """A one-line progress bar on stderr, drawn only where stderr is a terminal (or when
    forced), so logs and pipes stay clean. Plain text: no dependency is worth it."""

    def __init__(self, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._shown: tuple[str, int] | None = None
        self._started = time.perf_counter()

    def __call__(self, done: int, total: int, stage: str) -> None:
        """Show ``done`` of ``total`` for ``stage``."""
        if not self.enabled or total <= 0:
            return
        percent = 100 * done // total
        if self._shown == (stage, percent) and done != total:
            return
        self._shown = (stage, percent)
        width = 28
        filled = width * done // total
        elapsed = time.perf_counter() - self._started
        self.stream.write(
            f"\r{stage:<18} [{'#' * filled}{'.' * (width - filled)}] "
            f"{done:,}/{total:,} {elapsed:5.1f}s"
        )
        if done == total:
            self.stream.write("\n")
        self.stream.flush()


# --------------------------------------------------------------------------- helpers


def _add_trace(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "trace",
        nargs="?",
        help="a trace file: cubepool trace v1 (.jsonl[.gz]), a PyTorch profiler trace or "
        "memory snapshot, or an RMM log",
    )
    parser.add_argument("--example", choices=examples.names(), help="a bundled real trace")
    parser.add_argument("--device", help="the device to import (cpu, cuda:0, ...)")
    parser.add_argument("--stream", type=int, help="the stream to import (snapshots, RMM)")
    parser.add_argument("--lenient", action="store_true", help="skip and count malformed entries")


def _add_device(parser: argparse.ArgumentParser, *, layouts: str | None) -> None:
    if layouts is not None:
        parser.add_argument(
            "--config",
            action="append",
            metavar="LAYOUT",
            help=f"a layout: a preset ({', '.join(PRESETS)}), a model of PyTorch's caching "
            f"allocator to compare with ({', '.join(TORCH_MODELS)}), or a JSON layout file as "
            f"'cubepool plan --save' writes; repeatable (default: {layouts})",
        )
    parser.add_argument("--max-page-size", type=parse_size, help="the device's largest page")
    parser.add_argument("--alignment", type=parse_size, help="the device's alignment")
    parser.add_argument("--limit", type=parse_size, help="the device's memory (e.g. 16GiB)")


def _properties(args: argparse.Namespace) -> MemoryDeviceProperties | None:
    if args.max_page_size is None and args.alignment is None:
        return None
    return MemoryDeviceProperties(args.max_page_size, args.alignment)


def _layouts(args: argparse.Namespace, default: Sequence[str]) -> list[tuple[str, Layout]]:
    return [config_from_arg(text) for text in (args.config or default)]


def _load(args: argparse.Namespace) -> tuple[str, Trace]:
    if args.example is not None:
        if args.trace is not None:
            raise SystemExit("cubepool: give a trace PATH or --example NAME, not both")
        source: str | Path = examples.path(args.example)
        name = args.example
    elif args.trace is not None:
        source = name = args.trace
    else:
        raise SystemExit("cubepool: give a trace PATH or --example NAME")
    trace, dropped = load_trace_with_report(
        source, device=args.device, stream=args.stream, strict=not args.lenient
    )
    if dropped is not None:
        print(f"cubepool: imported {name}: {dropped.summary()}", file=sys.stderr)
    return name, trace


def _trace_line(name: str, trace: Trace) -> str:
    phases = ", ".join(p for p, _ in trace.phases)
    return (
        f"trace {name}: {len(trace):,} events, {trace.allocations:,} allocations, "
        f"peak live {human_bytes(trace.peak_live)}" + (f"; phases {phases}" if phases else "")
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
                f"{pool.pages_peak:,}",
            ]
        )
    headers = ["pool", "kind", "reservations", "peak in use", "peak reserved", "pages (peak)"]
    return table(headers, rows)


def _result_table(label: str, result: ReplayResult) -> str:
    row = [
        label,
        human_bytes(result.peak_reserved),
        human_bytes(result.peak_in_use),
        f"{result.utilization:.3f}",
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


def _json(data: Any) -> None:
    print(json.dumps(data, indent=2))


# --------------------------------------------------------------------------- commands


def cmd_replay(args: argparse.Namespace) -> int:
    """Replays one trace through one layout and prints the result and its pools."""
    name, trace = _load(args)
    label, config = config_from_arg(args.preset or (args.config or ["default"])[-1])
    result = replay(trace, config, _properties(args), limit=args.limit)
    if args.json:
        _json({"trace": name, "layout": label, **result.to_dict(timeline=args.timeline)})
        return 0
    print(_trace_line(name, trace))
    print(f"layout {label}: {describe(config)}")
    print()
    print(_result_table(label, result))
    print()
    print(_pools_table(result))
    if result.failed_reserves:
        print(
            f"\n{result.failed_reserves:,} reservations failed under the limit, the first "
            f"at event {result.first_failed_event:,}"
        )
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Replays one trace through several layouts: one table, best first."""
    name, trace = _load(args)
    comparison = compare(
        trace,
        _layouts(args, COMPARE_DEFAULTS),
        _properties(args),
        limit=args.limit,
        objective=args.objective,
        name=name,
    )
    if args.json:
        _json(comparison.to_dict())
        return 0
    print(_trace_line(name, trace))
    print()
    print(comparison.table())
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    """Searches a layout for the trace and shows how it compares."""
    name, trace = _load(args)
    properties = _properties(args)
    planned = plan(
        trace,
        args.objective,
        properties,
        derive=args.derive,
        max_storage_allocations=args.max_storage_allocations,
        progress=ProgressBar(None if args.progress is None else args.progress),
    )
    if args.save is not None:
        Path(args.save).write_text(json.dumps(to_spec(planned.config), indent=2) + "\n")
    if args.json:
        _json({"trace": name, **planned.to_dict()})
        return 0
    print(_trace_line(name, trace))
    print()
    print(planned.summary())
    print()
    comparison = compare(
        trace,
        [("planned", planned.config), *(config_from_arg(p) for p in COMPARE_DEFAULTS)],
        properties,
        name=name,
    )
    print(comparison.table())
    if args.save is not None:
        print(f"\nlayout saved to {args.save} (use it with --config {args.save})")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    """Replays every trace through every layout, on local processes."""
    if not args.traces:
        raise SystemExit("cubepool: give at least one trace (a path or an example name)")
    result = sweep(
        args.traces,
        _layouts(args, COMPARE_DEFAULTS),
        properties=_properties(args),
        limit=args.limit,
        max_workers=args.workers,
        progress=ProgressBar(None if args.progress is None else args.progress),
    )
    if args.json:
        _json(result.to_dict())
        return 0
    print(result.table(args.metric))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    """Draws memory over time for one or more layouts."""
    _, trace = _load(args)
    written = plot(trace, _layouts(args, ["default"]), args.out, _properties(args))
    print(f"wrote {written}")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    """Converts a trace of any supported format to cubepool trace v1."""
    fmt = importers.detect_format(args.input)
    if fmt == "cubepool":
        trace, _ = load_trace_with_report(args.input)
        imported = importers.ImportedTrace(
            header={"format": "cubepool-trace", "version": 1, **trace.header},
            events=trace.events(),
        )
    else:
        imported = importers.import_trace(
            args.input, device=args.device, stream=args.stream, strict=not args.lenient
        )
    importers.write_trace_v1(imported, args.output)
    allocs = sum(1 for e in imported.events if e[1] == "alloc")
    print(
        f"wrote {args.output}: {len(imported.events):,} events, {allocs:,} allocations (from {fmt})"
    )
    if fmt != "cubepool":
        print(f"import report: {imported.dropped.summary()}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """The whole story of one trace: the default layout's replay, a comparison with
    CubeCL's presets and the models of PyTorch's caching allocator, a planned layout,
    and the picture."""
    name, trace = _load(args)
    properties = _properties(args)
    print(_trace_line(name, trace))
    default = replay(trace, None, properties, limit=args.limit)
    print("\n1. Replay with the default layout:", describe(PRESETS["default"]()))
    print(_result_table("default", default))
    print()
    print(_pools_table(default))

    # CubeCL's presets and, for the question of what PyTorch itself would reserve, the
    # models of its caching allocator.
    layouts = [config_from_arg(p) for p in (*COMPARE_DEFAULTS, *TORCH_MODELS)]
    if not args.no_plan:
        print("\n2. Plan a layout for this trace (replaying candidates):")
        planned = plan(
            trace,
            properties=properties,
            progress=ProgressBar(None if args.progress is None else args.progress),
        )
        print(planned.summary())
        layouts.insert(0, ("planned", planned.config))
    layouts += [config_from_arg(c) for c in args.config or []]
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
        )
        print(f"\nwrote {written}: memory over time, one panel per layout")
    return 0


# --------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``cubepool`` command."""
    parser = argparse.ArgumentParser(
        prog="cubepool",
        description="What GPU-style memory pool layouts do with an allocation trace.",
    )
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
    rp.add_argument("--out", help="write the picture here (.html, .svg, or .png with matplotlib)")
    rp.add_argument("--no-plan", action="store_true", help="skip planning")
    progress_flags(rp)
    rp.set_defaults(run=cmd_report)

    r = commands.add_parser("replay", help="replay a trace through a pool layout")
    _add_trace(r)
    _add_device(r, layouts="default")
    r.add_argument("--preset", choices=sorted(PRESETS), help="a preset (same as --config)")
    r.add_argument("--json", action="store_true", help="print the result as JSON")
    r.add_argument("--timeline", action="store_true", help="include the timeline in --json")
    r.set_defaults(run=cmd_replay)

    c = commands.add_parser("compare", help="replay a trace through several layouts")
    _add_trace(c)
    _add_device(c, layouts=", ".join(COMPARE_DEFAULTS))
    c.add_argument("--objective", choices=["reserved", "storage_allocations"], default="reserved")
    c.add_argument("--json", action="store_true", help="print the comparison as JSON")
    c.set_defaults(run=cmd_compare)

    p = commands.add_parser("plan", help="search a layout for a trace")
    _add_trace(p)
    _add_device(p, layouts=None)
    p.add_argument("--objective", choices=["reserved", "storage_allocations"], default="reserved")
    p.add_argument(
        "--derive",
        type=_derive,
        default="first_step",
        help="derive on: first_step (default), all, or the first N events",
    )
    p.add_argument("--max-storage-allocations", type=int, help="budget of cudaMalloc calls")
    p.add_argument("--save", help="write the planned layout here as JSON")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    progress_flags(p)
    p.set_defaults(run=cmd_plan)

    s = commands.add_parser("sweep", help="replay many traces through many layouts")
    s.add_argument("traces", nargs="*", help="trace files or bundled example names")
    _add_device(s, layouts=", ".join(COMPARE_DEFAULTS))
    s.add_argument("--workers", type=int, help="local processes (default: the CPU count)")
    s.add_argument("--metric", default="utilization", help="the figure in the table")
    s.add_argument("--json", action="store_true", help="print every replay as JSON")
    progress_flags(s)
    s.set_defaults(run=cmd_sweep)

    pl = commands.add_parser("plot", help="draw memory over time")
    _add_trace(pl)
    _add_device(pl, layouts="default")
    pl.add_argument("--out", required=True, help="mem.html, mem.svg, or mem.png (matplotlib)")
    pl.set_defaults(run=cmd_plot)

    cv = commands.add_parser("convert", help="convert a trace to cubepool trace v1")
    cv.add_argument("input", help="a trace of any supported format")
    cv.add_argument("output", help="the cubepool trace v1 file (.jsonl, or .jsonl.gz)")
    cv.add_argument("--device", help="the device to import (cpu, cuda:0, ...)")
    cv.add_argument("--stream", type=int, help="the stream to import")
    cv.add_argument("--lenient", action="store_true", help="skip and count malformed entries")
    cv.set_defaults(run=cmd_convert)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cubepool`` command."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except (CubepoolError, OSError, LookupError, ImportError) as error:
        print(f"cubepool: {error}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
