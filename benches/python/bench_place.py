"""Offline placement: MiniMalloc's challenging instances and a 100,000-buffer input.

For each of MiniMalloc's challenging instances (A-E in ``../shared/placement``, F-K
bundled in ``benches/placement``): whether ``cubepool place --capacity
1048576`` finds a placement and in how long, and the best height with no capacity (the
same time limit). Then the static placement of every trace we hold (``--traces``
folders: ``cubepool.place(trace, time_limit=...)``, the figure issue 27 asks within 2 % of
the floor), with wall and CPU seconds. Then a synthetic trace-like input of ``--buffers``
buffers (many short lifetimes, a few long ones, lognormal sizes, fixed seed) placed with
no capacity.

    python benches/python/bench_place.py [--time-limit 10] [--buffers 100000] [--json OUT]
    python benches/python/bench_place.py --only-traces   # the traces' table alone

Timings depend on the machine and its load: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import cubepool

ROOT = Path(__file__).resolve().parents[2]
INSTANCES = [ROOT.parent / "shared" / "placement", ROOT / "benches" / "placement"]
TRACES = [ROOT.parent / "shared" / "traces", ROOT / "benches" / "traces"]
CAPACITY = 1048576


def synthetic(n: int, seed: int = 7) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    rows = []
    for k in range(n):
        width = 1 + (rng.randrange(5000) if rng.random() < 0.02 else rng.randrange(200))
        size = max(1, int(rng.lognormvariate(12, 1.5)))
        rows.append((k, k + width, size))
    return rows


def trace_table(folders: list[Path], time_limit: float) -> list[dict[str, object]]:
    """Places every trace in `folders` as a whole and prints height over the floor."""
    print(
        "| trace | buffers | floor (peak live) | height | over the floor | optimal | wall | CPU |"
    )
    print("|---|---:|---:|---:|---:|---|---:|---:|")
    rows: list[dict[str, object]] = []
    paths = [p for folder in folders for p in sorted(folder.glob("*.jsonl*"))]
    for path in paths:
        trace = cubepool.load_trace(path)
        cpu = time.process_time()
        placed = cubepool.place(trace, time_limit=time_limit)
        cpu = time.process_time() - cpu
        over = placed.height / max(placed.lower_bound, 1) - 1
        name = path.name.split(".")[0]
        rows.append(
            {
                "trace": name,
                "buffers": len(placed),
                "lower_bound": placed.lower_bound,
                "height": placed.height,
                "over": over,
                "optimal": placed.optimal,
                "seconds": placed.seconds,
                "cpu_seconds": cpu,
            }
        )
        print(
            f"| {name} | {len(placed)} | {placed.lower_bound:,} | {placed.height:,} | "
            f"{100 * over:.2f} % | {'yes' if placed.optimal else 'no'} | "
            f"{placed.seconds:.2f} s | {cpu:.2f} s |",
            flush=True,
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--buffers", type=int, default=100_000)
    parser.add_argument(
        "--synthetic-time-limit",
        type=float,
        default=10.0,
        help="seconds for the synthetic input (default 10: the issue's bar)",
    )
    parser.add_argument(
        "--instances", type=Path, nargs="*", default=INSTANCES, help="folders of *.csv instances"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--traces", type=Path, nargs="*", default=TRACES)
    parser.add_argument(
        "--only-traces",
        action="store_true",
        help="place the traces only (no instances, no synthetic)",
    )
    args = parser.parse_args()
    results: dict[str, object] = {"time_limit_s": args.time_limit, "instances": []}
    results["traces"] = trace_table(args.traces, args.time_limit)
    if args.only_traces:
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        return 0
    print(
        "| instance | buffers | peak live | at capacity 1,048,576 | time | "
        "best height, no capacity | utilization | proven optimal |"
    )
    print("|---|---:|---:|---|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.csv"
        paths = [p for folder in args.instances for p in sorted(folder.glob("*.csv"))]
        for path in sorted(paths, key=lambda p: p.name):
            row: dict[str, object] = {"instance": path.name}
            cpu = time.process_time()
            try:
                fit = cubepool.place_csv(path, out, capacity=CAPACITY, time_limit=args.time_limit)
                row.update(fits=True, fit_seconds=fit.seconds, buffers=len(fit))
            except cubepool.PlacementInfeasible as error:
                row.update(fits=False, fit_reason=error.reason, fit_seconds=None)
            # CPU seconds beside the wall clock: on a shared machine they differ.
            row["fit_cpu_seconds"] = time.process_time() - cpu
            cpu = time.process_time()
            free = cubepool.place_csv(path, out, time_limit=args.time_limit)
            row["free_cpu_seconds"] = time.process_time() - cpu
            row.update(
                buffers=len(free),
                lower_bound=free.lower_bound,
                height=free.height,
                utilization=free.utilization,
                optimal=free.optimal,
                free_seconds=free.seconds,
            )
            results["instances"].append(row)  # type: ignore[attr-defined]
            fit_cell = "yes" if row["fits"] else f"no ({row.get('fit_reason')})"
            secs = row["fit_seconds"]
            time_cell = f"{secs:.2f} s" if isinstance(secs, float) else "-"
            print(
                f"| {path.name} | {len(free)} | {free.lower_bound:,} | {fit_cell} | {time_cell} | "
                f"{free.height:,} | {free.utilization:.3f} | {'yes' if free.optimal else 'no'} |"
            )
    rows = synthetic(args.buffers)
    cpu = time.process_time()
    placed = cubepool.place(rows, time_limit=args.synthetic_time_limit)
    results["synthetic"] = {
        "cpu_seconds": time.process_time() - cpu,
        "time_limit_s": args.synthetic_time_limit,
        "buffers": len(rows),
        "height": placed.height,
        "lower_bound": placed.lower_bound,
        "utilization": placed.utilization,
        "seconds": placed.seconds,
    }
    print(
        f"\n{len(rows):,} synthetic buffers: height {placed.height:,}, lower bound "
        f"{placed.lower_bound:,} (utilization {placed.utilization:.3f}) in {placed.seconds:.2f} s"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
