"""The planned layout against the default and the floor, trace by trace.

For each trace: its floor (peak live bytes); the default layout's peak reserved bytes
and utilization; the planned layout's (a plan file derived from the setup and the first
step, run once more, then replayed on the whole trace: the plan for the next run) with
its misses (requests served beside the arena) when followed live with ``mm.step()`` at
the phases; what ``cubepool.plan`` chose (``planned`` where it kept the planned
layout); and on the derivation trace, what the planned layout and the default reserve
and the planned layout's storage allocations (what the planner's guard and budget see).
A trace whose header names no steps gets a plan derived on the whole trace, which is
then no plan for a next run but the static placement followed (marked so).

    python benches/python/bench_planned.py [TRACE ...] [--json OUT] [--replicas]

``--replicas``: also the utilization of the default and the planned layout on the
derivation trace and each perturbed replica the planner ranks finalists on (traces with
steps only).

With no trace, the shared traces (``../shared/traces``) and the captured ones
(``benches/traces``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import cubepool
from cubepool.plan.candidates import _REPLICAS
from cubepool.plan.derivation import derivation_trace, perturb
from cubepool.plan.planned import follow, save_planned

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TRACES = [
    *sorted((ROOT.parent / "shared" / "traces").glob("*.jsonl")),
    *sorted((ROOT / "benches" / "traces").glob("*.jsonl.gz")),
]


def measure(path: Path, folder: Path) -> dict[str, Any]:
    trace = cubepool.load_trace(path)
    name = path.name.split(".")[0]
    derived, _, _ = derivation_trace(trace)
    layout = save_planned(trace, folder / f"{name}.plan.json")
    default = cubepool.replay(trace)
    planned = cubepool.replay(trace, layout)
    on_derived = cubepool.replay(derived, layout)
    default_derived = cubepool.replay(derived)
    chosen = cubepool.plan(trace)
    return {
        "trace": name,
        "steps": derived is not trace,
        "floor": trace.peak_live,
        "default": default.peak_reserved,
        "planned": planned.peak_reserved,
        "planned_complete": planned.complete,
        "misses": follow(trace, layout),
        "plan_chose": "planned" if chosen.is_planned() else "other",
        "plan": chosen.result.peak_reserved,
        "derivation_planned": on_derived.peak_reserved,
        "derivation_default": default_derived.peak_reserved,
        "derivation_storage_allocations": on_derived.storage_allocations,
    }


def replicas(path: Path, folder: Path) -> str | None:
    """One line: the default's and the planned layout's utilization on the derivation
    trace, then on each perturbed replica (``default/planned``); None without steps."""
    trace = cubepool.load_trace(path)
    derived, start, _ = derivation_trace(trace)
    if derived is trace:
        return None
    layout = save_planned(trace, folder / "replicas.plan.json")
    copies = [derived] + [perturb(derived, start, w, seed, extra) for w, extra, seed in _REPLICAS]
    cells = []
    for copy in copies:
        default = cubepool.replay(copy)
        planned = cubepool.replay(copy, layout)
        live = copy.peak_live
        cells.append(f"{live / default.peak_reserved:.3f}/{live / planned.peak_reserved:.3f}")
    return f"{path.name.split('.')[0]:20} " + " ".join(cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--replicas", action="store_true", help="also the replicas' table")
    args = parser.parse_args(argv)
    traces = args.traces or DEFAULT_TRACES
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for path in traces:
            rows.append(measure(path, Path(folder)))
    mib = 1 << 20
    print(
        f"{'trace':20} {'steps':>5} {'floor MiB':>10} {'default':>16} {'planned':>16} "
        f"{'misses':>13} {'plan()':>16}  derivation: planned/default MiB, allocations"
    )
    for row in rows:
        cells = {
            key: f"{row[key] / mib:8.1f} {row['floor'] / row[key]:.3f}"
            for key in ("default", "planned", "plan")
        }
        misses = row["misses"]
        total = misses["hits"] + misses["misses"]
        mark = "" if row["steps"] else "*"
        print(
            f"{row['trace'] + mark:20} {'yes' if row['steps'] else 'no':>5} "
            f"{row['floor'] / mib:10.1f} {cells['default']:>16} {cells['planned']:>16} "
            f"{misses['misses']:>6}/{total:<6} {cells['plan']:>16}"
            + (" (planned)" if row["plan_chose"] == "planned" else "")
            + f"  {row['derivation_planned'] / mib:.1f}/{row['derivation_default'] / mib:.1f}, "
            f"{row['derivation_storage_allocations']}"
        )
    print("\nreserved MiB and utilization (floor / reserved); * no steps: derived on the whole")
    print("trace, so the planned column is the static placement followed, not a next run")
    if args.replicas:
        print("\ndefault/planned utilization: derivation trace, then each perturbed replica")
        with tempfile.TemporaryDirectory() as folder:
            for path in traces:
                line = replicas(path, Path(folder))
                if line is not None:
                    print(line)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
