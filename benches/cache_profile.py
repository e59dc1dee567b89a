"""Per-step instructions, data accesses and simulated cache misses of the targets' loops.

Runs `examples/peer_loops.rs` under valgrind's cachegrind (a simulated 32 KiB, 8-way
first-level data cache with 64-byte lines, as the machines here have) for the default
layout with handles dropped, given back with ``mm.release`` and without handles
(slots), and for offset-allocator, each twice with a different number of steps. The
difference of the two runs' totals divided by the difference of their steps is the
cost of one step, the setup cancelled out. Counts are deterministic: unlike a time on a
shared machine they do not drift, so they name where a gap in time comes from.

    python benches/cache_profile.py --loops target/release/examples/peer_loops \\
        --json target/bench-results/cache.json

``--quick`` runs a few steps of each (the smoke run); without valgrind it says so and
exits 0 without writing, so that the report says the counts were not measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# The workloads: the FIFO window on host memory (it makes no storage call after its
# setup) and the steady state on storage without bytes (its maps and unmaps would
# otherwise be kernel calls, which cachegrind does not see).


@dataclasses.dataclass(frozen=True)
class Workload:
    """One loop of ``peer_loops``: its name, whether it runs on host memory, and the
    steps of its two runs."""

    name: str
    bytes: bool
    steps: tuple[int, int]


WORKLOADS = (
    Workload("fifo", bytes=True, steps=(200_000, 1_200_000)),
    Workload("steady", bytes=False, steps=(20_000, 120_000)),
)
QUICK_STEPS = {"fifo": (1_000, 2_000), "steady": (100, 200)}
PEERS = ("offset", "virtual", "virtual-release", "virtual-slots")
# cachegrind's event names, and the ones the report reads.
EVENTS = ("Ir", "Dr", "Dw", "D1mr", "D1mw", "I1mr")


class ProfileError(Exception):
    """A cachegrind output that cannot be read."""


def read_totals(path: Path) -> dict[str, int]:
    """The program totals of a cachegrind output file, by event name (its ``events:``
    and ``summary:`` lines)."""
    events: list[str] | None = None
    summary: list[str] | None = None
    for line in path.read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("summary:"):
            summary = line.split()[1:]
    if events is None or summary is None:
        raise ProfileError(f"{path}: no events: or summary: line (not a cachegrind output?)")
    if len(events) != len(summary):
        raise ProfileError(
            f"{path}: {len(events)} events named but {len(summary)} totals in the summary"
        )
    try:
        return {name: int(value) for name, value in zip(events, summary, strict=True)}
    except ValueError as error:
        raise ProfileError(f"{path}: a total is not a whole number ({error})") from None


def per_step(
    first: dict[str, int], second: dict[str, int], steps: tuple[int, int]
) -> dict[str, float]:
    """Each event's count per step: the difference of two runs' totals over the
    difference of their steps."""
    low, high = steps
    if high <= low:
        raise ValueError(f"the second run must take more steps ({low} then {high})")
    missing = [name for name in EVENTS if name not in first or name not in second]
    if missing:
        raise ProfileError(
            f"the runs did not count {', '.join(missing)} (run with --cache-sim=yes)"
        )
    return {name: (second[name] - first[name]) / (high - low) for name in EVENTS}


def run_cachegrind(loops: Path, workload: Workload, peer: str, steps: int, out: Path) -> None:
    """One run of the loops under cachegrind, writing its totals to ``out``."""
    command = [
        "valgrind",
        "--tool=cachegrind",
        "--cache-sim=yes",
        "--I1=32768,8,64",
        "--D1=32768,8,64",
        f"--cachegrind-out-file={out}",
        str(loops),
    ]
    if not workload.bytes:
        command.append("--no-bytes")
    command += [workload.name, peer, str(steps)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ProfileError(
            f"{' '.join(command)} exited with {done.returncode}: {done.stderr.strip()[-2000:]}"
        )


def profile(loops: Path, quick: bool) -> dict[str, Any]:
    """Every workload and peer's counts per step."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        for workload in WORKLOADS:
            steps = QUICK_STEPS[workload.name] if quick else workload.steps
            for peer in PEERS:
                totals = []
                for count in steps:
                    out = Path(scratch) / f"{workload.name}-{peer}-{count}.out"
                    run_cachegrind(loops, workload, peer, count, out)
                    totals.append(read_totals(out))
                counts = per_step(totals[0], totals[1], steps)
                rows.append(
                    {
                        "workload": workload.name,
                        "bytes": workload.bytes,
                        "peer": peer,
                        "steps": list(steps),
                        "per_step": counts,
                    }
                )
                shown = ", ".join(f"{name} {count:.2f}" for name, count in counts.items())
                print(f"{workload.name} {peer}: {shown}", flush=True)
    version = subprocess.run(["valgrind", "--version"], capture_output=True, text=True, check=False)
    return {
        "tool": version.stdout.strip() or "valgrind",
        "cache": "I1 and D1: 32 KiB, 8-way, 64-byte lines",
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--loops",
        type=Path,
        default=Path("target/release/examples/peer_loops"),
        help="the built examples/peer_loops.rs (default: %(default)s)",
    )
    parser.add_argument("--json", type=Path, help="where to write the counts")
    parser.add_argument("--quick", action="store_true", help="a few steps of each (smoke run)")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: no cache profile (the report says not measured)")
        return 0
    if not args.loops.is_file():
        print(f"error: {args.loops} does not exist (cargo build --release --example peer_loops)")
        return 2
    try:
        result = profile(args.loops, args.quick)
    except ProfileError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
