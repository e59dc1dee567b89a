"""Assembles BENCHMARKS.md from the results that ``benches/run_all.sh`` leaves behind.

Inputs: criterion's ``<group>/<bench>/new/{benchmark,estimates}.json`` files (the
``pools`` and ``peers`` benches), the peak-memory table the ``peers`` bench writes
(``CUBEPOOL_PEERS_JSON``), and the JSON of ``benches/python/bench_reserve.py``.
Every time quoted is criterion's median estimate for one iteration.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

FIFO_WINDOWS = (40, 400, 4000)
TRACES = ("gpt2-train", "gpt2-generate", "transformer-train")
MIB = 1024 * 1024

REGENERATE = "benches/run_all.sh"
SMOKE = "benches/run_all.sh --smoke"
SMOKE_PARTS = (
    "cargo test --bench pools --bench peers",
    "python benches/python/bench_reserve.py --quick",
)


def load_criterion(root: Path) -> dict[str, dict[str, float]]:
    """Every benchmark under ``root``, by full id: its median (ns per iteration), the
    median's 95 % confidence interval (``lo``, ``hi``), and its mean."""
    results: dict[str, dict[str, float]] = {}
    for meta_path in root.glob("**/new/benchmark.json"):
        meta = json.loads(meta_path.read_text())
        estimates = json.loads((meta_path.parent / "estimates.json").read_text())
        median = estimates["median"]
        results[meta["full_id"]] = {
            "median": median["point_estimate"],
            "lo": median["confidence_interval"]["lower_bound"],
            "hi": median["confidence_interval"]["upper_bound"],
            "mean": estimates["mean"]["point_estimate"],
        }
    return results


def duration(ns: float) -> str:
    """A time in the unit that reads best."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def difference(ns: float) -> str:
    """A time difference; negative when the later way was the faster."""
    return f"-{duration(-ns)}" if ns < 0 else duration(ns)


def ratio(value: float) -> str:
    """A ratio such as 3.2x or 0.45x."""
    return f"{value:.1f}x" if value >= 10 else f"{value:.2f}x"


def mib(n: int) -> str:
    """Bytes in MiB."""
    return f"{n / MIB:.1f}"


def table(header: Iterable[str], align: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def command(*args: str) -> str:
    """The first line a command prints, or a note that it failed."""
    try:
        out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return f"({' '.join(args)} unavailable)"
    return out.strip().splitlines()[0]


def machine(measured: float) -> list[str]:
    """What the figures were measured on; ``measured`` is a POSIX time of the run."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    libc, libc_version = platform.libc_ver()
    return [
        f"- CPU: {model}; `nproc` = {command('nproc')}",
        f"- Memory: {memory_total()}",
        f"- OS: {platform.system()} {platform.release()}, {libc} {libc_version}",
        f"- Rust: {command('rustc', '--version')}",
        "- Date: "
        + datetime.datetime.fromtimestamp(measured, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    ]


def peak_rss_kib(path: Path | None) -> int | None:
    """The number in a GNU time ``%M`` output file (KiB), if there is one."""
    if path is None or not path.is_file():
        return None
    try:
        return int(path.read_text().split()[-1])
    except (ValueError, IndexError):
        return None


def memory_total() -> str:
    """Total RAM from /proc/meminfo."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    return "unknown"


# The cubepool variants each target is reported for: (what they are, bench name).
VARIANTS = (
    ("with handles", "cubepool"),
    ("handles given back with `mm.release`", "cubepool-release"),
    ("slots (freed by the caller, like offset-allocator's)", "cubepool-slots"),
)


class Report:
    """The figures, and the sections of BENCHMARKS.md built from them."""

    def __init__(
        self,
        times: dict[str, dict[str, float]],
        memory: list[dict[str, Any]],
        python: dict[str, Any],
        peers_rss_kib: int | None = None,
        measured: float | None = None,
    ) -> None:
        """Keeps the result sets."""
        self.times = times
        self.memory = memory
        self.python = python
        self.peers_rss_kib = peers_rss_kib
        self.measured = time.time() if measured is None else measured

    def t(self, full_id: str) -> float:
        """Median ns per iteration of one benchmark."""
        return self.times[full_id]["median"]

    def fifo(self, peer: str, window: int) -> float:
        """ns per free + reserve in the FIFO window."""
        return self.t(f"peers_fifo_1mib/{peer}/{window}")

    def steady(self, peer: str) -> float:
        """ns per free + reserve in the steady state."""
        return self.t(f"peers_steady_state/{peer}")

    def replay(self, peer: str, trace: str) -> float:
        """ns per replay of a whole trace."""
        return self.t(f"peers_replay/{peer}/{trace}")

    def versus(self, peer_id: str, ours_id: str) -> tuple[float, float, float]:
        """The peer's median over ours, and the widest interval the two medians' 95 %
        confidence intervals allow."""
        peer, ours = self.times[peer_id], self.times[ours_id]
        return peer["median"] / ours["median"], peer["lo"] / ours["hi"], peer["hi"] / ours["lo"]

    def cubecl_ratios(self) -> list[tuple[str, tuple[float, float, float]]]:
        """(workload, CubeCL time / cubepool time with its interval), for every workload
        both run."""
        rows = [
            (
                f"FIFO W={w}",
                self.versus(f"peers_fifo_1mib/cubecl/{w}", f"peers_fifo_1mib/cubepool/{w}"),
            )
            for w in FIFO_WINDOWS
        ]
        rows.append(
            (
                "steady state",
                self.versus("peers_steady_state/cubecl", "peers_steady_state/cubepool"),
            )
        )
        for trace in TRACES:
            for pages, suffix in (("host", ""), ("virtual", "-virtual")):
                rows.append(
                    (
                        f"replay {trace} ({pages} pages)",
                        self.versus(
                            f"peers_replay/cubecl{suffix}/{trace}",
                            f"peers_replay/cubepool{suffix}/{trace}",
                        ),
                    )
                )
        return rows

    def scanning(self, ours: str) -> list[tuple[str, float]]:
        """CubeCL's time over cubepool variant `ours`'s on the workloads where CubeCL
        scans many pages."""
        rows = [
            (f"FIFO W={w}", self.fifo("cubecl", w) / self.fifo(ours, w))
            for w in FIFO_WINDOWS
            if w >= 400
        ]
        rows.append(("steady state", self.steady("cubecl") / self.steady(ours)))
        return rows

    def targets(self) -> str:
        """The issue's targets, met or missed."""
        ratios = self.cubecl_ratios()
        slower = [(name, r) for name, r in ratios if r[0] < 1]
        if slower:
            never_slower = "; ".join(
                f"{name}: {ratio(r)} (interval {ratio(lo)}-{ratio(hi)}"
                + (", within noise)" if hi >= 1 else ")")
                for name, (r, lo, hi) in slower
            )
        else:
            name, (r, _, _) = min(ratios, key=lambda row: row[1][0])
            never_slower = f"slowest: {name} at {ratio(r)}"
        memory = [
            (row["trace"], row["cubepool_peak_reserved"], row["cubecl_peak_bytes_reserved"])
            for row in self.memory
        ]
        at_4k = next(row for row in self.python["reserve"] if row["n"] == 4096)

        def status(met: bool) -> str:
            return "met" if met else "**missed**"

        rows = [
            (
                ">= 10x faster than CubeCL where it scans pages (FIFO W=400, W=4000, steady "
                f"state), {variant}",
                ", ".join(f"{name}: {ratio(r)}" for name, r in self.scanning(ours)),
                status(all(r >= 10 for _, r in self.scanning(ours))),
            )
            for variant, ours in VARIANTS
        ]
        rows.append(
            (
                "never slower than CubeCL (all workloads above and the replays)",
                never_slower,
                status(not slower),
            )
        )
        offset = self.steady("offset")
        rows += [
            (
                f"within 2x of offset-allocator on the steady state, {variant}",
                f"cubepool {duration(self.steady(ours))} vs offset-allocator "
                f"{duration(offset)} ({ratio(self.steady(ours) / offset)} its time)",
                status(self.steady(ours) <= 2 * offset),
            )
            for variant, ours in VARIANTS
        ]
        rows += [
            (
                "no more reserved memory than CubeCL on any shared trace",
                ", ".join(
                    f"{name}: {mib(ours)} vs {mib(theirs)} MiB" for name, ours, theirs in memory
                ),
                status(all(ours <= theirs for _, ours, theirs in memory)),
            ),
            (
                "Python reserve + drop no slower than numpy.empty + drop at 4 KiB",
                f"{at_4k['cubepool_ns']:.0f} ns vs {at_4k['numpy_ns']:.0f} ns",
                status(at_4k["cubepool_ns"] <= at_4k["numpy_ns"]),
            ),
        ]
        return table(("target (issue 7)", "measured", "status"), ("---", "---", "---"), rows)

    def fifo_table(self) -> str:
        """FIFO windows: ratios, then times."""
        rows = []
        for w in FIFO_WINDOWS:
            ours = self.fifo("cubepool", w)
            release = self.fifo("cubepool-release", w)
            slots = self.fifo("cubepool-slots", w)
            peers = [self.fifo(p, w) for p in ("cubecl", "offset", "system")]
            rows.append(
                [
                    str(w),
                    *(ratio(p / ours) for p in peers),
                    duration(ours),
                    duration(release),
                    duration(slots),
                    *(duration(p) for p in peers),
                ]
            )
        return table(
            (
                "W",
                "CubeCL / cubepool",
                "offset / cubepool",
                "system / cubepool",
                "cubepool",
                "cubepool (release)",
                "cubepool (slots)",
                "CubeCL",
                "offset-allocator",
                "malloc/free",
            ),
            ("---:",) + ("---:",) * 9,
            rows,
        )

    def steady_table(self) -> str:
        """Steady state: ratios, then times."""
        ours = self.steady("cubepool")
        release = self.steady("cubepool-release")
        slots = self.steady("cubepool-slots")
        peers = [self.steady(p) for p in ("cubecl", "offset", "system")]
        return table(
            (
                "CubeCL / cubepool",
                "offset / cubepool",
                "offset / cubepool (release)",
                "offset / cubepool (slots)",
                "system / cubepool",
                "cubepool",
                "cubepool (release)",
                "cubepool (slots)",
                "CubeCL",
                "offset-allocator",
                "malloc/free",
            ),
            ("---:",) * 11,
            [
                [
                    ratio(peers[0] / ours),
                    ratio(peers[1] / ours),
                    ratio(peers[1] / release),
                    ratio(peers[1] / slots),
                    ratio(peers[2] / ours),
                    duration(ours),
                    duration(release),
                    duration(slots),
                    *(duration(p) for p in peers),
                ]
            ],
        )

    def cost_table(self) -> str:
        """cubepool's time per step split by what each way of freeing adds."""
        rows = []
        windows: list[int | None] = [*FIFO_WINDOWS, None]
        for window in windows:
            slots, release, dropped = (
                self.steady(peer) if window is None else self.fifo(peer, window)
                for peer in ("cubepool-slots", "cubepool-release", "cubepool")
            )
            rows.append(
                [
                    "steady state" if window is None else f"FIFO W={window}",
                    duration(slots),
                    difference(release - slots),
                    difference(dropped - release),
                    duration(dropped),
                ]
            )
        return table(
            (
                "workload",
                "pools, routing, statistics (slots)",
                "+ handle (release - slots)",
                "+ dropping it (dropped - release)",
                "= dropped handle",
            ),
            ("---", "---:", "---:", "---:", "---:"),
            rows,
        )

    def per_replay(self, peer: str, trace: str, events: int) -> str:
        """The time of one replay, and per event."""
        ns = self.replay(peer, trace)
        return f"{duration(ns)} ({ns / events:.0f} ns/event)"

    def replay_table(self) -> str:
        """Replays: ratios, then times per replay and per event."""
        rows = []
        for trace in TRACES:
            events = next(row["events"] for row in self.memory if row["trace"] == trace)
            ours = self.replay("cubepool", trace)
            ours_virtual = self.replay("cubepool-virtual", trace)
            rows.append(
                [
                    trace,
                    f"{events:,}",
                    ratio(self.replay("cubecl", trace) / ours),
                    ratio(self.replay("cubecl-virtual", trace) / ours_virtual),
                    ratio(self.replay("offset", trace) / ours),
                    ratio(self.replay("system", trace) / ours),
                    *(
                        self.per_replay(p, trace, events)
                        for p in (
                            "cubepool",
                            "cubecl",
                            "cubepool-virtual",
                            "cubecl-virtual",
                            "offset",
                            "system",
                        )
                    ),
                ]
            )
        return table(
            (
                "trace",
                "events",
                "CubeCL / cubepool",
                "CubeCL / cubepool (virtual)",
                "offset / cubepool",
                "system / cubepool",
                "cubepool",
                "CubeCL",
                "cubepool virtual",
                "CubeCL virtual",
                "offset-allocator",
                "malloc/free",
            ),
            ("---", "---:") + ("---:",) * 10,
            rows,
        )

    def memory_table(self) -> str:
        """Peak bytes reserved per trace."""
        rows = []
        for row in self.memory:
            live = row["peak_live"]
            ours = row["cubepool_peak_reserved"]
            theirs = row["cubecl_peak_bytes_reserved"]
            rows.append(
                [
                    row["trace"],
                    ratio(ours / theirs),
                    f"{live / ours:.1%}",
                    f"{live / theirs:.1%}",
                    mib(live),
                    mib(ours),
                    mib(theirs),
                    mib(row["cubecl_peak_storage"]),
                    mib(row["offset_allocator_peak_span"]),
                    *(
                        f"{mib(row[key])} ({live / row[key]:.1%})" if key in row else "-"
                        for key in ("torch_peak_reserved", "torch_expandable_peak_reserved")
                    ),
                ]
            )
        return table(
            (
                "trace",
                "cubepool / CubeCL reserved",
                "cubepool utilization",
                "CubeCL utilization",
                "peak live (MiB)",
                "cubepool peak reserved",
                "CubeCL peak bytes_reserved",
                "CubeCL peak storage",
                "offset-allocator span",
                "torch (model) peak reserved (utilization)",
                "torch_expandable (model) peak reserved (utilization)",
            ),
            ("---",) + ("---:",) * 10,
            rows,
        )

    def layouts_table(self) -> str:
        """Each bundled trace's utilization and storage calls per 100 allocations under
        every preset, the virtual pool and a plan (replayed here, with the cubepool the
        run installed)."""
        import cubepool

        layouts = {
            "compact (default)": "compact",
            "sub_slices": "sub_slices",
            "exclusive_pages": "exclusive_pages",
            "virtual": "virtual(granule=2MiB, keep=none, small=0)",
        }
        rows = []
        for trace_name in TRACES:
            trace = cubepool.load_trace(cubepool.examples.path(trace_name))
            results = [
                cubepool.replay(trace, cubepool.MemoryConfiguration.parse(text))
                for text in layouts.values()
            ]
            results.append(cubepool.plan(trace).result)
            rows.append(
                [trace_name]
                + [
                    f"{r.utilization:.3f} / "
                    f"{100 * (r.storage_allocations + r.storage_frees) / trace.allocations:.1f}"
                    for r in results
                ]
            )
        return table(
            ("trace", *layouts, "planned"), ("---",) + ("---:",) * (len(layouts) + 1), rows
        )

    def python_tables(self) -> str:
        """Reserve + drop from Python, and replay overhead."""
        reserve_rows = []
        for row in self.python["reserve"]:
            n = row["n"]
            label = f"{n // MIB} MiB" if n >= MIB else f"{n // 1024} KiB" if n >= 1024 else f"{n} B"
            reserve_rows.append(
                [
                    label,
                    ratio(row["numpy_ns"] / row["cubepool_ns"]),
                    ratio(row["bytearray_ns"] / row["cubepool_ns"]),
                    f"{row['cubepool_ns']:.0f} ns",
                    f"{row['numpy_ns']:.0f} ns",
                    f"{row['bytearray_ns']:.0f} ns",
                ]
            )
        replay_rows = []
        for row in self.python["replay"]:
            bench = self.times.get(f"replay/cubepool/{row['trace']}")
            replay_rows.append(
                [
                    row["trace"],
                    ratio(row["python_s"] / row["rust_loop_s"]),
                    f"{row['python_s'] * 1e3:.3f} ms",
                    f"{row['rust_loop_s'] * 1e3:.3f} ms",
                    f"{row['overhead_us']:.0f} us",
                    duration(bench["median"]) if bench else "n/a",
                ]
            )
        return "\n\n".join(
            [
                table(
                    (
                        "n",
                        "numpy.empty / cubepool",
                        "bytearray / cubepool",
                        "mm.reserve(n) + drop",
                        "numpy.empty(n, uint8) + drop",
                        "bytearray(n) + drop",
                    ),
                    ("---:",) * 6,
                    reserve_rows,
                ),
                table(
                    (
                        "trace",
                        "Python / Rust loop",
                        "cubepool.replay from Python",
                        "Rust loop (ReplayResult.seconds)",
                        "overhead per call",
                        "Rust `replay()` (criterion, pools bench)",
                    ),
                    ("---", "---:", "---:", "---:", "---:", "---:"),
                    replay_rows,
                ),
            ]
        )

    def core_table(self) -> str:
        """The pools bench (cubepool alone, as the core engineer runs it): the
        ``SubSlices`` preset (sliced pools), the virtual pool, and for replays today's
        default (``compact``); a dash where a layout was not measured."""

        def cell(full_id: str) -> str:
            return duration(self.t(full_id)) if full_id in self.times else "-"

        def row(what: str, group: str, suffix: str = "") -> list[str]:
            return [what] + [
                cell(f"{group}/{layout}{suffix}") for layout in ("cubepool", "virtual", "compact")
            ]

        rows = [row(f"FIFO W={w} (host memory)", "fifo_window_1mib", f"/{w}") for w in FIFO_WINDOWS]
        rows.append(
            row("steady state (virtual storage, reserve then drop)", "steady_state_log_uniform")
        )
        rows += [
            row(f"`replay()` {trace} (virtual storage, with setup)", "replay", f"/{trace}")
            for trace in TRACES
        ]
        return table(
            (
                "benchmark (benches/pools.rs)",
                "SubSlices (sliced pools)",
                "virtual(granule=2MiB, keep=none, small=0)",
                "compact (default)",
            ),
            ("---", "---:", "---:", "---:"),
            rows,
        )


def render(report: Report) -> str:
    """BENCHMARKS.md."""
    python = report.python
    rss = (
        "the peers bench's peak resident set was not measured (no /usr/bin/time)"
        if report.peers_rss_kib is None
        else f"the peers bench's peak resident set was {report.peers_rss_kib / 1024**2:.2f} GiB"
    )
    return f"""# Benchmarks

Regenerate everything (about 5 minutes here; run it on an otherwise idle machine):

    {REGENERATE}

It runs the criterion benches `pools` and `peers`, rebuilds the Python package
(`maturin develop --release`, in `.venv` if there is one), runs
`benches/python/bench_reserve.py`, and writes this file with `benches/report.py`.
Smoke run for CI (builds both benches and runs every benchmark once, plus a
seconds-long Python run; writes nothing here):

    {SMOKE}

which is `{SMOKE_PARTS[0]}` followed by `{SMOKE_PARTS[1]}`.

Measured on:

{chr(10).join(machine(report.measured))}
- Python {python["python"]}, numpy {python["numpy"]}, cubepool {python["cubepool"]}

Times are criterion's median per iteration. A ratio is the peer's time divided by
cubepool's: above 1, cubepool is faster; below 1, the peer is.

## Targets

{report.targets()}

## FIFO window of 1 MiB reserves (free the oldest, reserve one; W live)

{report.fifo_table()}

## Steady state: log-uniform sizes 8 B to 32 MiB, 10,000 live

Each step frees a random live block and reserves a new size in its place.

{report.steady_table()}

## Where cubepool's time goes

The three ways of freeing, side by side: slots have no handle; `mm.release` adds the
handle's descriptor (issued at the reserve, recycled at once); dropping the handle
adds the lock-free hand-back (the last user pushes the descriptor on its thread's
release ring with plain stores; the next operation drains the ring with plain loads
and frees the reservation). A difference below zero means dropping was the faster
in this run.

{report.cost_table()}

## Replay of the bundled traces (each allocator's own reserve and free, per whole replay)

{report.replay_table()}

## Peak memory on the bundled traces (MiB)

{report.memory_table()}

## Utilization by layout (utilization / storage calls per 100 allocations)

Peak live over peak reserved, and storage calls (page allocations and releases, or maps
and unmaps) per 100 allocations, replayed on virtual storage; `virtual` is
`virtual(granule=2MiB, keep=none, small=0)`, `planned` is `cubepool.plan`'s layout.
`python benches/python/virtual_tradeoff.py --table --select --timing 15 --traces DIR`
shows the virtual pool's release knob, how its setting was chosen, and its replay speed.

{report.layouts_table()}

## Python (one process)

{report.python_tables()}

## cubepool alone (benches/pools.rs)

{report.core_table()}

## Method

- **Same work for everyone.** The steady state's 10,000 initial sizes and 65,536
  (victim, size) steps are drawn once from a fixed-seed xorshift64* generator and
  cycled through by every allocator; the FIFO window frees the oldest 1 MiB block
  and reserves a new one (CubeCL's own `benches/dynamic.rs` shape); the replays map
  trace ids to each allocator's handles and start from an empty allocator each time
  (building it, and dropping it with the never-freed allocations, is not timed).
- **cubepool**: `MemoryManagement` with `SubSlices`, 2 GiB max page, alignment 32, on
  `HostStorage` (pages from the global allocator, not zeroed); handles are dropped to
  free (the lock-free path: the dropped handle's descriptor goes on the dropping
  thread's release ring, freed at the next operation; no atomic read-modify-write
  per pair on one thread). "cubepool
  (release)" gives each handle back with `mm.release(handle)` instead (freed at once,
  no atomic operation); "cubepool (slots)" uses `reserve_slot`/`release_slot` without
  handles. The "virtual" replay rows use `VirtualStorage` (address ranges, no bytes).
  Its sliced pools defer coalescing: the block freed last is merged only at the next
  operation, and a reserve of its very extent, when it has no free neighbour, takes it
  back in place. Every FIFO step does that (no merge, no search, no split); in the
  steady state the new size rarely has the freed block's extent. Placements are the
  ones eager coalescing makes (a proptest runs both side by side), so the memory
  figures are unchanged by it.
- **CubeCL 0.10.0** (`cubecl-runtime`): `MemoryManagement::from_configuration(BytesStorage,
  MemoryDeviceProperties {{ max_page_size: 2 GiB, alignment: 32 }}, SubSlices,
  ServerLogger::default(), MemoryManagementOptions::new("bench"))`; the bench refuses to run
  if a `cubecl.toml`/`burn.toml` or a `CUBECL_*` variable could configure it.
  `BytesStorage` zeroes every page with `calloc`; glibc skips that for fresh pages but
  memsets recycled heap memory, so its cost depends on what the process allocated before.
  The replays therefore also run on a CubeCL storage of address ranges without bytes
  ("CubeCL virtual"), against cubepool's `VirtualStorage`: that pair times the pools alone.
  The replays run first and the steady state last, because the steady state's 22 GB
  of freed blocks leave glibc's heap in a state where later `calloc`s zero whole pages.
- **offset-allocator 0.2**: one `Allocator` over 2^32 - 1 units of 32 bytes (a 128 GiB
  virtual range; the issue's 4 GiB cannot hold the steady state's 22 GB live), sizes
  rounded up to whole units. Its "span" in the memory table is the highest byte
  offset it handed out: the size one contiguous buffer would need.
- **system**: `std::alloc::alloc`/`dealloc` (glibc malloc/free) with the same sizes,
  alignment 1 (plain `malloc`, 16-byte aligned). In the steady state its live set is
  22 GB of address space that nothing writes to except glibc's own chunk headers,
  which still cost it page faults on fresh pages.
- **Sizes.** The steady state keeps the issue's 8 B .. 32 MiB range for every allocator
  (no cap): its 10,000 initial sizes add up to 22 GB (20.8 GiB), but no allocator writes
  to the bytes, so the pages stay virtual address space (Linux overcommit) and the
  machine's RAM holds it; {rss}.
- **Peak memory**: CubeCL's `memory_usage().bytes_reserved` (the figure the issue
  names) and, through a counting wrapper around `BytesStorage`, the bytes its storage
  actually held; cubepool's `memory_usage().bytes_reserved`; both read after every
  reserve of an untimed replay. The torch columns are `cubepool::trace::replay_torch`'s
  peak reserved bytes: a model of PyTorch's CUDA caching allocator (the rules of
  `c10/cuda/CUDACachingAllocator.cpp`, see `src/trace/torch_model.rs`) with its default
  settings and with `expandable_segments:True`, no limit; a model, not PyTorch run on a
  GPU.
- **Python**: `timeit`, best of several repeats; each statement (`reserve(n)`,
  `empty(n, uint8)`, `bytearray(n)`) discards its result, so the object is freed within
  the statement. `bytearray(n)` zero-fills; the other two do not. Replay overhead is the
  wall time of `cubepool.replay(trace)` minus the Rust loop time it reports (building the
  pools and storage, crossing into Rust, building the result).
- **Noise.** The machine is shared (2 cores, other jobs running). When this file was
  first generated, two consecutive full runs differed by up to 40 % on single rows and
  up to 30 % on ratios, and no target's verdict changed between them. The peers move
  too: with nothing changed on its side, CubeCL's FIFO W=400 took 518 ns in one full
  run (2026-11-30, 07:36 UTC) and 447 ns in the next (08:17 UTC), so a ratio within
  about 15 % of a target's line can land on either side of it from run to run. The
  "never slower" row gives the interval that the two medians' 95 % confidence
  intervals allow.
"""


def main(argv: list[str] | None = None) -> int:
    """Reads the results and writes BENCHMARKS.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--criterion", type=Path, required=True, help="criterion's output folder (target/criterion)"
    )
    parser.add_argument(
        "--peers-memory", type=Path, required=True, help="the peak-memory JSON of the peers bench"
    )
    parser.add_argument("--python", type=Path, required=True, help="the JSON of bench_reserve.py")
    parser.add_argument(
        "--peers-maxrss",
        type=Path,
        help="a file holding the peers bench's peak resident set in KiB (GNU time %%M)",
    )
    parser.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"))
    args = parser.parse_args(argv)
    report = Report(
        load_criterion(args.criterion),
        json.loads(args.peers_memory.read_text()),
        json.loads(args.python.read_text()),
        peak_rss_kib(args.peers_maxrss),
        # When the peers bench ran (it writes this file first).
        args.peers_memory.stat().st_mtime,
    )
    args.out.write_text(render(report))
    print(f"wrote {os.fspath(args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
