"""Per-step instructions, data accesses and simulated cache misses of the targets' loops.

Runs `examples/peer_loops.rs` under valgrind's cachegrind for the default layout with
handles dropped, given back with ``mm.release`` and without handles (slots), and for
offset-allocator, each twice with a different number of steps. The difference of the
two runs' totals divided by the difference of their steps is the cost of one step, the
setup cancelled out. The simulated caches are those of the machines here (AMD EPYC Zen
4): a 32 KiB, 8-way first level and a 1 MiB, 8-way second level, 64-byte lines
(cachegrind models two levels; its "last level" is set to the second). Counts are
deterministic: unlike a time on a shared machine they do not drift. They say what a
step touches, not what it costs in time: cachegrind simulates caches, it does not time
them.

Each row also names where its misses are: the first-level misses a step of each place
(the function a counted line ran in and the line's source file), from the same two
runs. With line tables in the binary (the ``lines`` profile of ``Cargo.toml``, the
release build plus line tables, which changes no code), inlined code counts to its own
file, so a place is a book (``src/pool/arena.rs``, ``src/pool/chunks/claim.rs``) rather than
the one function everything was inlined into.

    cargo build --profile lines --example peer_loops
    python benches/cache_profile.py --loops target/lines/examples/peer_loops \\
        --json target/bench-results/cache.json

``--quick`` runs a few steps of each (the smoke run; the FIFO's are inside its setup's
window, so they only check that everything runs); without valgrind it says so and
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

# The simulated caches: (bytes, ways, line bytes).
FIRST_LEVEL = (32 * 1024, 8, 64)
SECOND_LEVEL = (1024 * 1024, 8, 64)
# `examples/peer_loops.rs`' workloads: the FIFO's window and the steady state's live
# blocks.
FIFO_WINDOW = 4000
STEADY_LIVE = 10_000


@dataclasses.dataclass(frozen=True)
class Workload:
    """One loop of ``peer_loops``: its name, whether it runs on host memory (else on
    storage without bytes), and the steps of its two runs."""

    name: str
    on_host: bool
    steps: tuple[int, int]


# The FIFO window on host memory (it makes no storage call after its setup) and the
# steady state on storage without bytes (its maps and unmaps would otherwise be kernel
# calls, which cachegrind does not see).
WORKLOADS = (
    Workload("fifo", on_host=True, steps=(200_000, 1_200_000)),
    Workload("steady", on_host=False, steps=(20_000, 120_000)),
)
QUICK_STEPS = {"fifo": (1_000, 2_000), "steady": (100, 200)}
PEERS = ("offset", "virtual", "virtual-release", "virtual-slots")
# The events kept per step (cachegrind's names): instructions, data reads and writes,
# first-level data read and write misses, and the reads and writes that miss the second
# level too.
EVENTS = ("Ir", "Dr", "Dw", "D1mr", "D1mw", "DLmr", "DLmw")
# The events a place's misses sum: first-level data read and write misses.
MISSES = ("D1mr", "D1mw")
# A place (function and source file) with fewer first-level misses a step than this is
# left out of a row's places.
PLACE_FLOOR = 0.01
# The repository, whose files the places name relative to it.
REPOSITORY = Path(__file__).resolve().parents[1]


class ProfileError(Exception):
    """A cachegrind run that failed or whose output cannot be read."""


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


def short_file(path: str) -> str:
    """A source file as the places name it: a crate's file from the crate's directory
    (``offset-allocator-0.2.0/src/lib.rs``), the standard library's from ``library/``
    (``core/src/ptr/mod.rs``), the repository's relative to it."""
    if "/registry/src/" in path:
        # .../registry/src/<index>/<crate-version>/src/lib.rs
        return path.split("/registry/src/", 1)[1].split("/", 1)[-1]
    if "/library/" in path:
        return path.split("/library/", 1)[1]
    root = f"{REPOSITORY}/"
    return path[len(root) :] if path.startswith(root) else path


def read_places(path: Path) -> dict[tuple[str, str], int]:
    """First-level data misses (reads and writes) of a cachegrind output file by place:
    the function a counted line ran in (``fn=``) and the source file of the line
    (``fl=``, where inlined code counts to its own file when the binary has line
    tables; ``???`` without them)."""
    # The columns of the missed events in a count line (its line number first), once
    # the events: line has named them.
    columns: list[int] | None = None
    function, file = "???", "???"
    places: dict[tuple[str, str], int] = {}
    for line in path.read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
            columns = [events.index(name) + 1 for name in MISSES if name in events]
        elif line.startswith("fl="):
            file = short_file(line[3:])
        elif line.startswith("fn="):
            function = line[3:]
        elif line[:1].isdigit():
            if columns is None:
                raise ProfileError(f"{path}: counts before the events: line")
            # A line leaves out its trailing zero counts.
            counts = line.split()
            try:
                missed = sum(int(counts[column]) for column in columns if column < len(counts))
            except ValueError as error:
                raise ProfileError(f"{path}: a count is not a whole number ({error})") from None
            if missed:
                places[(function, file)] = places.get((function, file), 0) + missed
    return places


def places_per_step(
    first: dict[tuple[str, str], int],
    second: dict[tuple[str, str], int],
    steps: tuple[int, int],
) -> list[dict[str, Any]]:
    """The first-level misses a step of each place (the difference of two runs' counts
    over the difference of their steps), most first, those under ``PLACE_FLOOR`` left
    out."""
    between = steps_between(steps)
    rows = [
        {"function": function, "file": file, "misses": (count - first.get(place, 0)) / between}
        for place, count in second.items()
        for function, file in (place,)
    ]
    kept = [row for row in rows if row["misses"] >= PLACE_FLOOR]
    return sorted(kept, key=lambda row: (-row["misses"], row["function"], row["file"]))


def steps_between(steps: tuple[int, int]) -> int:
    """How many more steps the second of two runs took (refused unless more)."""
    low, high = steps
    if high <= low:
        raise ProfileError(f"the second run must take more steps ({low} then {high})")
    return high - low


def per_step(
    first: dict[str, int], second: dict[str, int], steps: tuple[int, int]
) -> dict[str, float]:
    """Each event's count per step: the difference of two runs' totals over the
    difference of their steps."""
    between = steps_between(steps)
    missing = [name for name in EVENTS if name not in first or name not in second]
    if missing:
        raise ProfileError(
            f"the runs did not count {', '.join(missing)} (run with --cache-sim=yes)"
        )
    return {name: (second[name] - first[name]) / between for name in EVENTS}


def cache_flag(level: str, cache: tuple[int, int, int]) -> str:
    """cachegrind's option for one simulated cache."""
    return f"--{level}={cache[0]},{cache[1]},{cache[2]}"


def cachegrind_command(
    loops: Path, workload: Workload, peer: str, steps: int, out: Path
) -> list[str]:
    """The command of one run of the loops under cachegrind, writing to ``out``."""
    command = ["valgrind", "--tool=cachegrind", "--cache-sim=yes"]
    command += [cache_flag("I1", FIRST_LEVEL), cache_flag("D1", FIRST_LEVEL)]
    command += [cache_flag("LL", SECOND_LEVEL), f"--cachegrind-out-file={out}", str(loops)]
    if not workload.on_host:
        command.append("--no-bytes")
    return [*command, workload.name, peer, str(steps)]


def run_cachegrind(loops: Path, workload: Workload, peer: str, steps: int, out: Path) -> None:
    """One run of the loops under cachegrind, writing its totals to ``out``."""
    command = cachegrind_command(loops, workload, peer, steps, out)
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
                totals, places = [], []
                for count in steps:
                    out = Path(scratch) / f"{workload.name}-{peer}-{count}.out"
                    run_cachegrind(loops, workload, peer, count, out)
                    totals.append(read_totals(out))
                    places.append(read_places(out))
                try:
                    counts = per_step(totals[0], totals[1], steps)
                    where = places_per_step(places[0], places[1], steps)
                except ProfileError as error:
                    raise ProfileError(f"{workload.name} {peer}: {error}") from None
                rows.append(
                    {
                        "workload": workload.name,
                        "on_host": workload.on_host,
                        "peer": peer,
                        "steps": list(steps),
                        "per_step": counts,
                        "places": where,
                    }
                )
                shown = ", ".join(f"{name} {count:.2f}" for name, count in counts.items())
                print(f"{workload.name} {peer}: {shown}", flush=True)
    version = subprocess.run(["valgrind", "--version"], capture_output=True, text=True, check=False)
    return {
        "tool": version.stdout.strip() or "valgrind",
        "first_level_bytes": FIRST_LEVEL[0],
        "second_level_bytes": SECOND_LEVEL[0],
        "fifo_window": FIFO_WINDOW,
        "steady_live": STEADY_LIVE,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    """Profiles every workload and peer and writes the counts to ``--json``; 0 without
    valgrind (nothing written), 2 for a missing loops binary, 1 for a failed run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--loops",
        type=Path,
        default=Path("target/lines/examples/peer_loops"),
        help="the built examples/peer_loops.rs (default: %(default)s)",
    )
    parser.add_argument("--json", type=Path, help="where to write the counts")
    parser.add_argument("--quick", action="store_true", help="a few steps of each (smoke run)")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: no cache profile (the report says not measured)")
        return 0
    if not args.loops.is_file():
        print(
            f"error: --loops {args.loops} does not exist "
            "(cargo build --profile lines --example peer_loops)",
            file=sys.stderr,
        )
        return 2
    try:
        result = profile(args.loops, args.quick)
    except ProfileError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.json is not None:
        try:
            args.json.write_text(json.dumps(result, indent=1) + "\n")
        except OSError as error:
            print(f"error: cannot write --json {args.json}: {error}", file=sys.stderr)
            return 1
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
