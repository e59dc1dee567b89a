"""The ``cubepool`` command line: replay a trace through pool layouts."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from cubepool import examples
from cubepool._cubepool import MemoryConfiguration, ReplayResult, Trace
from cubepool._errors import CubepoolError
from cubepool._format import human_bytes, table
from cubepool._trace import load_trace, replay

PRESETS = {
    "sub_slices": MemoryConfiguration.sub_slices,
    "exclusive_pages": MemoryConfiguration.exclusive_pages,
}


def _load(args: argparse.Namespace) -> tuple[str, Trace]:
    if args.example is not None:
        return args.example, load_trace(examples.path(args.example))
    if args.path is None:
        raise SystemExit("cubepool: give a trace PATH or --example NAME")
    return str(args.path), load_trace(args.path)


def _result_rows(name: str, result: ReplayResult) -> list[list[object]]:
    return [
        [
            name,
            human_bytes(result.peak_reserved),
            human_bytes(result.peak_in_use),
            f"{result.utilization:.4f}",
            f"{result.storage_allocations:,}",
            f"{result.failed_reserves:,}",
            f"{result.ns_per_event:.1f}",
        ]
    ]


RESULT_HEADERS = [
    "layout",
    "peak reserved",
    "peak in use",
    "utilization",
    "storage allocs",
    "failed",
    "ns/event",
]


def cmd_replay(args: argparse.Namespace) -> int:
    """Replays one trace through one layout and prints the result."""
    name, trace = _load(args)
    config = PRESETS[args.preset]()
    result = replay(trace, config)
    if args.json:
        out = {"trace": name, "layout": args.preset, **result.to_dict()}
        print(json.dumps(out, indent=2))
        return 0
    print(
        f"trace {name}: {len(trace):,} events, {trace.allocations:,} allocations, "
        f"peak live {human_bytes(trace.peak_live)}"
    )
    print()
    print(table(RESULT_HEADERS, _result_rows(args.preset, result)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``cubepool`` command."""
    parser = argparse.ArgumentParser(
        prog="cubepool", description="Replay allocation traces through GPU-style memory pools."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    rp = commands.add_parser("replay", help="replay a trace through a pool layout")
    rp.add_argument("path", nargs="?", help="a trace file (cubepool trace v1, .jsonl[.gz])")
    rp.add_argument("--example", choices=examples.names(), help="a bundled real trace")
    rp.add_argument("--preset", choices=sorted(PRESETS), default="sub_slices")
    rp.add_argument("--json", action="store_true", help="print the result as JSON")
    rp.set_defaults(run=cmd_replay)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cubepool`` command."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except (CubepoolError, OSError, LookupError) as error:
        print(f"cubepool: {error}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
