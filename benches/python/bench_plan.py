"""How ``cubepool.plan`` scales with trace length: seconds and peak resident memory.

For each length, the synthetic trace of ``synthetic_trace.py`` (no phases, so the plan
is derived on the whole trace) is written once to ``--cache`` as cubepool trace v1, then
a fresh Python process loads it (``cubepool.load_trace``) and plans it. The child reports
its load time, its plan time, the replays the plan ran, the planned utilization, its
resident memory after loading and its peak resident memory (``VmHWM``, which covers the
load and the plan, since the process does nothing else). One run per length: a plan
is seconds to minutes, and its figure is what a user waits.

    python benches/python/bench_plan.py                      # 10k, 100k, 1M events
    python benches/python/bench_plan.py --lengths 10000 --json out.json

Also plans each shared real trace (``--real DIR``, default ``/work/shared/traces`` when
it exists, else the bundled examples) and reports its planned utilization, so a speed-up
that makes plans worse shows here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import synthetic_trace  # noqa: E402

CHILD = r"""
import json, resource, sys, time
import cubepool

def status_kib(field):
    # /proc/self/status, not ru_maxrss: Linux keeps ru_maxrss across exec, so it would
    # report the parent's peak when that was higher.
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise LookupError(field)

path = sys.argv[1]
start = time.perf_counter()
trace = cubepool.load_trace(path)
loaded = time.perf_counter()
after_load = status_kib("VmRSS")
cpu = resource.getrusage(resource.RUSAGE_SELF)
planned = cubepool.plan(trace)
done = time.perf_counter()
used = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({
    "events": len(trace),
    "allocations": trace.allocations,
    "load_s": loaded - start,
    "plan_s": done - loaded,
    "plan_cpu_s": used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime,
    "load_average": __import__("os").getloadavg()[0],
    "replays": planned.replays,
    "utilization": planned.result.utilization,
    "layout": cubepool.describe(planned.config),
    "rss_after_load_mib": after_load / 1024,
    "peak_rss_mib": status_kib("VmHWM") / 1024,
}))
"""


def run_child(path: Path) -> dict[str, Any]:
    """Load and plan ``path`` in a fresh interpreter; its JSON line of figures."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)],
        check=True,
        capture_output=True,
        text=True,
    )
    figures: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def synthetic(cache: Path, length: int, seed: int) -> Path:
    """The cached file of the synthetic trace of ``length`` events, written if missing."""
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"synthetic-{length}-seed{seed}.jsonl.gz"
    if not path.exists():
        partial = path.with_suffix(".partial")
        synthetic_trace.write(partial, length, seed)
        partial.rename(path)
    return path


def real_traces(directory: Path | None) -> list[Path]:
    """The shared real traces, else the bundled examples."""
    if directory is not None and directory.is_dir():
        return sorted(directory.glob("*.jsonl"))
    import cubepool.examples

    return [cubepool.examples.path(name) for name in cubepool.examples.names()]


def markdown(synthetic_rows: list[dict[str, Any]], real_rows: list[dict[str, Any]]) -> str:
    """Two tables: plan cost against length, and planned utilization on real traces."""
    lines = [
        "| events | load (s) | plan (s) | plan CPU (s) | replays | RSS after load (MiB) "
        "| peak RSS (MiB) | planned utilization |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in synthetic_rows:
        lines.append(
            f"| {r['events']:,} | {r['load_s']:.2f} | {r['plan_s']:.1f} "
            f"| {r.get('plan_cpu_s', float('nan')):.1f} | {r['replays']:,} "
            f"| {r['rss_after_load_mib']:.0f} | {r['peak_rss_mib']:.0f} "
            f"| {r['utilization']:.3f} |"
        )
    if real_rows:
        lines += [
            "",
            "| trace | events | plan (s) | replays | planned utilization | layout |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for r in real_rows:
            lines.append(
                f"| {r['name']} | {r['events']:,} | {r['plan_s']:.1f} | {r['replays']:,} "
                f"| {r['utilization']:.3f} | {r['layout']} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark, prints the tables, writes JSON when asked."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("CARGO_TARGET_DIR", "target")) / "bench-traces",
        help="where the synthetic traces are written (default target/bench-traces)",
    )
    parser.add_argument("--real", type=Path, default=Path("/work/shared/traces"))
    parser.add_argument("--no-real", action="store_true", help="skip the real traces")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)

    synthetic_rows = []
    for length in args.lengths:
        row = run_child(synthetic(args.cache, length, args.seed))
        synthetic_rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    real_rows = []
    if not args.no_real:
        for path in real_traces(args.real):
            row = run_child(path)
            row["name"] = path.name.split(".")[0]
            real_rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print(markdown(synthetic_rows, real_rows))
    if args.json is not None:
        figures = {
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
            "synthetic": synthetic_rows,
            "real": real_rows,
        }
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
