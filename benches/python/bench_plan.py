"""How ``cubepool.plan`` scales with trace length and distinct sizes: seconds and peak
resident memory; and the plan's figures on real traces.

For each length, the synthetic trace of ``synthetic_trace.py`` (no phases, so the plan
is derived on the whole trace) is written once to ``--cache`` as cubepool trace v1, then
a fresh Python process loads it (``cubepool.load_trace``) and plans it. The child reports
its load time, its plan time (the static placement of the whole trace included, and
apart), its CPU time, the replays the plan ran, the candidate set it searched, the
planned utilization, its resident memory after loading and its peak resident memory
(``VmHWM``, which covers the load and the plan, since the process does nothing else).
One run per trace: a plan is seconds to minutes, and its figure is what a user waits.

- ``--lengths``: synthetic traces (its 160-size vocabulary), default 10k, 100k, 1M.
- ``--sized LENGTH:SIZES``: synthetic traces with exactly SIZES distinct sizes (the
  issue's bar: 1,000,000 events with 10 sizes in under 20 s).
- ``--dynamic``: dynamic-shape traces (``dynamic_trace.py``: nearly every size once),
  default 30k, 60k, 120k events (the bar: 120,000 events, 50,000+ sizes, in 10 s and
  300 MB).
- ``--report LENGTH``: ``cubepool report`` on a dynamic-shape trace of that length, in
  a fresh process (the bar: 240,000 events in under 5 s).

    python benches/python/bench_plan.py                      # all of the above
    python benches/python/bench_plan.py --lengths 10000 --sized --dynamic --report --no-real \
        --json out.json                                     # the 10k synthetic trace only

(An option given with no value runs none of its kind: ``--sized --dynamic --report``
above leave out their defaults, which include traces of 1,000,000 events.)

Also plans each real trace (``--real DIR``, default ``/work/shared/traces`` when it
exists, else the bundled examples, and the captured ``benches/traces``) and reports the
utilization of the default layout, of the plan for the next run (derived from the early
part, replayed on the whole trace), of the static placement of the whole trace (with
``--static-time-limit``, default 10 s) and the floor, so a speed-up that makes plans
worse shows here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import synthetic_trace  # noqa: E402

sys.path.insert(0, str(HERE.parent))
import report  # noqa: E402  (benches/report.py: the tables BENCHMARKS.md has)

STATUS = r"""
import contextlib, io, json, resource, sys, time

def status_kib(field):
    # /proc/self/status, not ru_maxrss: Linux keeps ru_maxrss across exec, so it would
    # report the parent's peak when that was higher.
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise LookupError(field)
"""
"""What both children start with: their imports and a reader of /proc/self/status."""

CHILD = (
    STATUS
    + r"""
import cubepool

path = sys.argv[1]
static_time_limit = float(sys.argv[2])
start = time.perf_counter()
trace = cubepool.load_trace(path)
loaded = time.perf_counter()
after_load = status_kib("VmRSS")
cpu = resource.getrusage(resource.RUSAGE_SELF)
planned = cubepool.plan(trace, static_time_limit=static_time_limit)
done = time.perf_counter()
used = resource.getrusage(resource.RUSAGE_SELF)
static = planned.static
print(json.dumps({
    "events": len(trace),
    # Its steps: the phases its header names, but the setup.
    "steps": sum(name.lower() != "setup" for name, _ in trace.phases),
    "allocations": trace.allocations,
    "distinct_sizes": len(trace.distinct_sizes()),
    "load_s": loaded - start,
    "plan_s": done - loaded,
    "search_s": planned.seconds,
    "plan_cpu_s": used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime,
    "load_average": __import__("os").getloadavg()[0],
    "replays": planned.replays,
    "candidates": planned.candidates.split(":")[0] if planned.candidates else "candidates full",
    "utilization": planned.result.utilization,
    "default_utilization": planned.baseline.utilization,
    "peak_live": trace.peak_live,
    "plan_reserved": planned.result.peak_reserved,
    "default_reserved": planned.baseline.peak_reserved,
    "static": None if static is None else static.to_dict(),
    "layout": cubepool.describe(planned.config),
    "rss_after_load_mib": after_load / 1024,
    "peak_rss_mib": status_kib("VmHWM") / 1024,
}))
"""
)

REPORT_CHILD = (
    STATUS
    + r"""
start = time.perf_counter()
sys.argv = ["cubepool", "report", sys.argv[1]]
out = io.StringIO()
with contextlib.redirect_stdout(out):
    from cubepool.cli import main
    code = main(sys.argv[1:])
done = time.perf_counter()
used = resource.getrusage(resource.RUSAGE_SELF)
text = out.getvalue()
print(json.dumps({
    "code": code,
    "report_s": done - start,
    "report_cpu_s": used.ru_utime + used.ru_stime,
    "peak_rss_mib": status_kib("VmHWM") / 1024,
    "candidates": next(
        (line.split(":")[0] for line in text.splitlines() if line.startswith("candidates ")),
        "candidates full",
    ),
}))
"""
)


def run_child(path: Path, static_time_limit: float = 1.0, code: str = CHILD) -> dict[str, Any]:
    """Load and plan ``path`` in a fresh interpreter (or run ``code`` on it); its JSON
    line of figures."""
    out = subprocess.run(
        [sys.executable, "-c", code, str(path), str(static_time_limit)],
        check=True,
        capture_output=True,
        text=True,
    )
    figures: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def dynamic(cache: Path, length: int, seed: int) -> Path:
    """The cached file of the dynamic-shape trace of ``length`` events."""
    import dynamic_trace

    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"dynamic-{length}-seed{seed}.jsonl.gz"
    if not path.exists():
        partial = path.with_suffix(".partial.jsonl.gz")
        dynamic_trace.trace(length, seed).write(partial)
        partial.rename(path)
    return path


def sized(cache: Path, length: int, sizes: int, seed: int) -> Path:
    """The cached file of the synthetic trace of ``length`` events and ``sizes``
    distinct sizes."""
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"synthetic-{length}-sizes{sizes}-seed{seed}.jsonl.gz"
    if not path.exists():
        partial = path.with_suffix(".partial")
        synthetic_trace.write(partial, length, seed, sizes)
        partial.rename(path)
    return path


def synthetic(cache: Path, length: int, seed: int) -> Path:
    """The cached file of the synthetic trace of ``length`` events, written if missing."""
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"synthetic-{length}-seed{seed}.jsonl.gz"
    if not path.exists():
        partial = path.with_suffix(".partial")
        synthetic_trace.write(partial, length, seed)
        partial.rename(path)
    return path


CAPTURED = HERE.parent / "traces"
"""The traces captured by ``scripts/capture_traces.py``."""


def real_traces(directory: Path | None) -> list[Path]:
    """The shared real traces, else the bundled examples; then the captured ones."""
    if directory is not None and directory.is_dir():
        shared = sorted(directory.glob("*.jsonl"))
    else:
        import cubepool.examples

        shared = [cubepool.examples.path(name) for name in cubepool.examples.names()]
    return shared + sorted(CAPTURED.glob("*.jsonl.gz"))


def markdown(
    synthetic_rows: list[dict[str, Any]],
    real_rows: list[dict[str, Any]],
    report_rows: list[dict[str, Any]] | None = None,
) -> str:
    """Tables (as BENCHMARKS.md has them, ``benches/report.py``): plan cost against
    length and distinct sizes, ``cubepool report`` on long traces, and the plan's
    figures on real traces."""
    parts = [report.plan_scale_table(synthetic_rows)]
    if report_rows:
        parts.append(report.report_scale_table(report_rows))
    if real_rows:
        parts.append(report.plan_figures_table(real_rows))
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark, prints the tables, writes JSON when asked."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    parser.add_argument(
        "--sized",
        nargs="*",
        default=["100000:10", "1000000:10"],
        help="LENGTH:SIZES synthetic traces with that many distinct sizes",
    )
    parser.add_argument("--dynamic", type=int, nargs="*", default=[30_000, 60_000, 120_000])
    parser.add_argument("--report", type=int, nargs="*", default=[240_000])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("CARGO_TARGET_DIR", "target")) / "bench-traces",
        help="where the synthetic traces are written (default target/bench-traces)",
    )
    parser.add_argument("--real", type=Path, default=Path("/work/shared/traces"))
    parser.add_argument("--no-real", action="store_true", help="skip the real traces")
    parser.add_argument(
        "--static-time-limit",
        type=float,
        default=10.0,
        help="seconds for the static placement of each real trace (default 10)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)

    def measured(row: dict[str, Any], kind: str) -> dict[str, Any]:
        row["kind"] = kind
        print(json.dumps(row), file=sys.stderr, flush=True)
        return row

    synthetic_rows = [
        measured(run_child(synthetic(args.cache, length, args.seed)), "synthetic")
        for length in args.lengths
    ]
    scale_rows = []
    for spec in args.sized:
        length, sizes = (int(x) for x in spec.split(":"))
        path = sized(args.cache, length, sizes, args.seed)
        scale_rows.append(measured(run_child(path), f"synthetic, {sizes} sizes"))
    scale_rows += [
        measured(run_child(dynamic(args.cache, length, args.seed)), "dynamic shapes")
        for length in args.dynamic
    ]
    report_rows = []
    for length in args.report:
        row = run_child(dynamic(args.cache, length, args.seed), code=REPORT_CHILD)
        row["events"] = length
        report_rows.append(measured(row, "dynamic shapes"))
    real_rows = []
    if not args.no_real:
        for path in real_traces(args.real):
            row = run_child(path, args.static_time_limit)
            row["name"] = path.name.split(".")[0]
            real_rows.append(measured(row, "real"))
    print(markdown(synthetic_rows + scale_rows, real_rows, report_rows))
    if args.json is not None:
        figures = {
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
            # When the run ended: BENCHMARKS.md says so where this run is newer than
            # the rest of the file's.
            "ended": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "static_time_limit": args.static_time_limit,
            "synthetic": synthetic_rows,
            "scale": scale_rows,
            "report": report_rows,
            "real": real_rows,
        }
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
