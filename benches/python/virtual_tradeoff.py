"""The virtual pool's release policy: utilization against storage calls, per trace.

Part 1 (``--table``): for every shared trace, replays the virtual pool with 2 MiB
granules as its release knob ``keep`` moves from eager unmapping to keeping idle
granules up to the high-water mark, and prints utilization (peak live / peak
reserved) and map + unmap calls per 100 allocations.

Part 2 (``--select``): how the default layout was chosen without tuning to all five
traces: a grid of virtual-pool settings (``small``: the range of small requests;
``keep``) is scored on three *selection* traces only (the smallest utilization among
them, among settings within 5 calls per 100 allocations on each), then the winner is
checked on the two *held-back* traces and on perturbed copies of all five (events
reordered within a window and the peak grown 3 % with twins, by ``plan.perturb``; and
every distinct size scaled by a random factor in [0.6, 1.7], a different model of the
same shape).

Part 3 (``--timing N``): replay ns/event of the default layout (the ``virtual_pages``
preset) against the previous default (``compact``), best of N interleaved replays.

Part 4 (``--memory``): every trace's utilization and storage calls under every preset,
the models of PyTorch's caching allocator and ``cubepool.plan``'s layout.

    python benches/python/virtual_tradeoff.py --table --select --timing 15 \\
        --memory --traces /work/shared/traces --json out.json

Part 5 (``--beside``): issue 28's table: utilization and storage calls per 100
allocations of the default beside ``torch_expandable`` (model), ``torch`` (model) and
the eager-unmap limit (``keep=0`` with the default's size split) on every shared trace
and on the captured ones (``benches/traces``, by ``scripts/capture_traces.py``), each
marked chosen-on (the selection traces the default was chosen on) or held-out.

Part 6 (``--fewer-calls``): the default beside settings that make fewer storage calls
(``FEWER_CALLS``: 4 and 8 MiB granules, one range for all sizes) on the same traces:
what a lower figure of calls per 100 allocations costs in utilization.

Part 7 (``--scaled-up``): the default beside ``torch_expandable`` and ``torch``
(models) on the same traces with every size multiplied by 16 and by 128: the captured
CPU runs at the scale of GPU runs, a check the default was not chosen on.

Part 8 (``--variants K``): the default beside ``torch_expandable`` (model) and the
default's placement in one range (``small=0``) on ``K`` variants of each of the same
traces: every distinct size times its own factor in [0.85, 1.15] (``scaled``), the
same program with other tensor shapes. On traces of a few hundred MiB one 2 MiB granule
moves utilization by up to 0.02, so where blocks fall against granule boundaries, luck
that a variant changes, decides a single trace's figure; a variant's figures say what
the same program gets with other sizes, and a goal (at least 0.95; never more than
0.005 below ``torch_expandable``) is checked on every variant, not on one draw.

Part 9 (``--scaled-timing N``): replay ns/event of the default against ``compact``
(best of N interleaved replays, as part 3) on every trace as captured and with its
sizes multiplied by each factor of part 7: issue 28's replay-time bar at the scale of
GPU runs, where most blocks span many granules and the default makes more storage
calls (each one a table update in the replay's storage and the granule books around
it), with the default's storage calls per 100 allocations beside each ratio.

Part 10 (``--scaled-variants K``): part 8's check between the scales of parts 5 and 7:
the default and the default with PyTorch's own size split (``small=1MiB``) and with the
splits between the two (``small=2MiB``, ``4MiB``, ``8MiB``: whether a fixed boundary
other than the default's meets both goals at every scale) beside ``torch_expandable``
(model) on ``K`` variants of each trace as captured and with every size multiplied by 2,
4 and 8 first. The captured CPU runs hold a few hundred MiB, the
GPU runs the goals are judged on up to 80 GiB; in between a granule is a smaller share
of the peak, but still decides a figure, and no setting was chosen there.

Part 11 (``--wider K``): the same layouts on real captures of larger models:
the families of ``benches/traces/wider`` (``scripts/capture_traces.py --wider``: every
model width doubled, so weights grow four times and activations twice, as a real larger
model's do, where part 10 multiplies every size alike), each as captured and on ``K``
variants. They were captured after every choice of the default; nothing was chosen on
them.

``--json PATH`` also writes every part's figures (``benches/report.py`` makes
BENCHMARKS.md's sections of them); ``--quick`` is the smoke run (seconds: the bundled
traces, a short grid, one timed replay).

Three of the traces are bundled; vit-train and mixtral-train are read from ``--traces``
(a folder of ``<name>.jsonl`` files, the shared traces of the project), and left out
when it does not hold them.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from statistics import mean
from typing import Any

import cubepool
from cubepool import MemoryConfiguration, Trace
from cubepool.plan import perturb

TRACES = Path(__file__).resolve().parents[2] / "python" / "cubepool" / "examples" / "data"
SELECTION = ("gpt2-train", "gpt2-generate", "transformer-train")
HELD_BACK = ("vit-train", "mixtral-train")
KEEPS = ("0", "16MiB", "64MiB", "256MiB", "none")
SMALLS = ("0", "64KiB", "256KiB", "1MiB", "16MiB")
MAX_CALLS = 5.0
# Traces captured by scripts/capture_traces.py: held out from every choice.
CAPTURED = Path(__file__).resolve().parents[1] / "traces"
# The same families' models with every width doubled (``capture_traces.py --wider``).
WIDER = CAPTURED / "wider"
# The wider captures of the quick run.
WIDER_QUICK = ("calibrate-layers", "resnet-train")
# The traces the default's later rules (issue 28) were judged on; traces captured after
# them (kv-generate, moe-train, long-context-train, conv-dynamic) are held out from all.
RULES_JUDGED_ON = (
    *SELECTION,
    *HELD_BACK,
    "llama-train",
    "offload-infer",
    "bert-dynamic",
    "calibrate-layers",
    # The fourth rule (a cut segment spares the hole freed whole) was found on it.
    "ssm-train",
)
# The eager-unmap limit of the default: its size split, unmapping at once.
EAGER = "virtual(granule=2MiB, keep=0, small=16MiB)"
# The default layout, and the one it replaced.
DEFAULT = "virtual_pages"
PREVIOUS = "compact"
BESIDE = (DEFAULT, "torch_expandable", "torch", EAGER)
# The layouts of the scaled-up check, and the factors the sizes are multiplied by there
# (the traces' live peaks, 28 to 705 MiB, become 0.4 to 88 GiB: the scale of GPU runs).
SCALED_UP = (
    DEFAULT,
    "torch_expandable",
    "torch",
    # What fewer storage calls would cost at that scale: coarser granules.
    "virtual(granule=8MiB, keep=none, small=16MiB)",
    "virtual(granule=32MiB, keep=none, small=16MiB)",
)
SCALE_FACTORS = (16, 128)
# The layouts of the variants check: the default, the model of PyTorch's allocator it is
# held to, and the default's placement in one range for all sizes (``small=0``, the
# setting the default's size split was weighed against).
VARIANTS = (DEFAULT, "torch_expandable", "virtual(granule=2MiB, keep=none, small=0)")
# The variants' sizes: each distinct size times its own factor within this fraction of 1.
VARIANT_SPREAD = 0.15
# Issue 28's utilization goal for the default on every trace, counted on the variants.
UTILIZATION_GOAL = 0.95
# The scales of part 10's variants: as captured (part 8's draws) and between them and
# part 7's x16.
VARIANT_FACTORS = (1, 2, 4, 8)
# The layouts of part 10: the default, the model it is held to, the default with
# PyTorch's own size split (blocks up to 1 MiB apart, as its small pool keeps them) and
# with the splits between that and the default's 16 MiB.
SCALED_VARIANTS = (
    DEFAULT,
    "torch_expandable",
    "virtual(granule=2MiB, keep=none, small=1MiB)",
    "virtual(granule=2MiB, keep=none, small=2MiB)",
    "virtual(granule=2MiB, keep=none, small=4MiB)",
    "virtual(granule=2MiB, keep=none, small=8MiB)",
)
# Settings that make fewer storage calls than the default on the traces above its bar
# of 5 per 100 allocations: coarser granules (fewer, larger chunks), one range for all
# sizes. The default keeps idle chunks only under the eager limit's peak, so fewer
# calls cost either granularity or a higher peak (issue 28).
FEWER_CALLS = (
    DEFAULT,
    "virtual(granule=4MiB, keep=none, small=16MiB)",
    "virtual(granule=8MiB, keep=none, small=16MiB)",
    "virtual(granule=2MiB, keep=none, small=0)",
)

# One replay's figures: utilization and storage calls per 100 allocations.
Cell = tuple[float, float]


def load(name: str, folder: Path | None) -> Trace | None:
    """A shared trace: from ``folder`` when it holds it, else bundled, else None."""
    for path in ([folder / f"{name}.jsonl"] if folder else []) + [TRACES / f"{name}.jsonl.gz"]:
        if path.exists():
            return cubepool.load_trace(path)
    return None


def scaled(trace: Trace, seed: int, low: float = 0.6, high: float = 1.7) -> Trace:
    """``trace`` with every distinct size scaled by its own random factor in ``[low,
    high]`` (the same program, its order and lifetimes, with other tensor shapes)."""
    rng = random.Random(seed)
    factors: dict[int, float] = {}
    events = []
    for t, op, ident, size in trace.events():
        if op == "alloc":
            factor = factors.setdefault(size, rng.uniform(low, high))
            size = max(1, int(size * factor))
        events.append((t, op, ident, size))
    return Trace.from_events(events, {"workload": f"{trace.workload}-scaled"})


def scaled_by(trace: Trace, factor: int) -> Trace:
    """``trace`` with every size multiplied by ``factor``: the same program at a larger
    scale (a larger batch or model), where tensors span many granules."""
    events = [
        (t, op, ident, size * factor if op == "alloc" else size)
        for t, op, ident, size in trace.events()
    ]
    return Trace.from_events(events, {"workload": f"{trace.workload}-x{factor}"})


def figures(trace: Trace, result: cubepool.ReplayResult) -> Cell:
    """A replay's utilization and storage calls per 100 allocations."""
    calls = result.storage_allocations + result.storage_frees
    return result.utilization, 100 * calls / trace.allocations


def measure(trace: Trace, config: str) -> Cell:
    """Utilization and storage calls per 100 allocations of ``config`` (a layout, or a
    model of PyTorch's caching allocator by name)."""
    if config in cubepool.TorchAllocatorModel.names():
        layout: Any = cubepool.TorchAllocatorModel.parse(config)
    else:
        layout = MemoryConfiguration.parse(config)
    return figures(trace, cubepool.replay(trace, layout))


def cell(figure: Cell) -> str:
    """``utilization / calls``, as the tables print them."""
    return f"{figure[0]:.3f} / {figure[1]:.1f}"


def virtual(small: str, keep: str) -> str:
    """The virtual pool of 2 MiB granules with ``small`` and ``keep``."""
    return f"virtual(granule=2MiB, keep={keep}, small={small})"


def tradeoff(traces: dict[str, Trace], small: str) -> dict[str, Any]:
    """Utilization and calls of every trace as ``keep`` moves, and the previous default's."""
    rows: list[dict[str, Any]] = [
        {
            "keep": keep,
            "config": virtual(small, keep),
            "cells": {name: measure(trace, virtual(small, keep)) for name, trace in traces.items()},
        }
        for keep in KEEPS
    ]
    rows.append(
        {
            "keep": f"({PREVIOUS})",
            "config": PREVIOUS,
            "cells": {name: measure(trace, PREVIOUS) for name, trace in traces.items()},
        }
    )
    print(f"\n## Utilization / storage calls per 100 allocations as keep moves (small={small})")
    print("\n| keep | " + " | ".join(traces) + " |")
    print("|---|" + "---:|" * len(traces))
    for row in rows:
        print(f"| {row['keep']} | " + " | ".join(cell(c) for c in row["cells"].values()) + " |")
    return {"small": small, "rows": rows}


def select(traces: dict[str, Trace], smalls: tuple[str, ...]) -> dict[str, Any]:
    """The grid of settings scored on the selection traces, and the one chosen."""
    names = [name for name in SELECTION if name in traces]
    print("\n## Selection on " + ", ".join(names) + " (min utilization, calls <= 5/100)")
    # The best worst utilization; among equals (to 0.001), the fewest calls.
    best: tuple[float, float, str] | None = None
    rows = []
    for small in smalls:
        for keep in KEEPS:
            config = virtual(small, keep)
            scores = [measure(traces[name], config) for name in names]
            ok = all(calls <= MAX_CALLS for _, calls in scores)
            worst = min(utilization for utilization, _ in scores)
            verdict = "ok" if ok else "too many calls"
            print(f"  {config:50s} {' '.join(cell(s) for s in scores)}  {verdict}")
            rows.append(
                {"config": config, "cells": dict(zip(names, scores, strict=True)), "ok": ok}
            )
            calls = max(c for _, c in scores)
            if ok and (
                best is None
                or worst > best[0] + 0.001
                or (worst > best[0] - 0.001 and calls < best[1])
            ):
                best = (worst, calls, config)
    chosen = None if best is None else best[2]
    if best is None:
        print("\nno setting within the call budget")
    else:
        print(f"\nchosen: {best[2]} (worst selection utilization {best[0]:.3f})")
    return {
        "traces": names,
        "max_calls": MAX_CALLS,
        "rows": rows,
        "chosen": chosen,
        # The chosen setting in the pools language, to compare with the default's.
        "chosen_text": None if chosen is None else str(MemoryConfiguration.parse(chosen)),
    }


def check(traces: dict[str, Trace], config: str) -> list[dict[str, Any]]:
    """``config`` and the previous default on the held-back and perturbed traces."""
    print(f"\n## Check of {config} (and {PREVIOUS}) on held-back and perturbed traces")
    print(f"\n| trace | utilization | calls / 100 allocs | {PREVIOUS} utilization |")
    print("|---|---:|---:|---:|")
    cases: list[tuple[str, Trace]] = [(name, traces[name]) for name in HELD_BACK if name in traces]
    for name, trace in traces.items():
        cases.append((f"{name} perturbed", perturb(trace, 0, 50, seed=1, extra=0.03)))
        cases.append((f"{name} sizes scaled", scaled(trace, seed=2)))
    rows = []
    for label, trace in cases:
        utilization, calls = measure(trace, config)
        previous, _ = measure(trace, PREVIOUS)
        print(f"| {label} | {utilization:.3f} | {calls:.1f} | {previous:.3f} |")
        rows.append(
            {"trace": label, "utilization": utilization, "calls": calls, "previous": previous}
        )
    return rows


def large_tensors(seed: int = 0, steps: int = 300) -> Trace:
    """A synthetic trace of large tensors: each step takes eight tensors, of 256 MiB to
    1.19 GiB (hundreds of granules each, under the previous default's 2 GiB pages), of
    1 to 64 MiB or of 1 KiB to 1 MiB alike, and frees them in reverse."""
    rng = random.Random(seed)
    kinds = ((1 << 28, 19 << 26), (1 << 20, 64 << 20), (1 << 10, 1 << 20))
    events: list[tuple[int, str, int, int]] = []
    ident = 0
    for _ in range(steps):
        taken = []
        for _ in range(8):
            low, high = rng.choice(kinds)
            events.append((len(events), "alloc", ident, rng.randint(low, high)))
            taken.append(ident)
            ident += 1
        start = len(events)
        events.extend((start + i, "free", t, 0) for i, t in enumerate(reversed(taken)))
    return Trace.from_events(events, {"workload": "large-tensors (synthetic)"})


def timing(traces: dict[str, Trace], repeats: int) -> dict[str, Any]:
    """Replay ns per event of the default against the previous default: the best of
    ``repeats`` replays each, interleaved so both see the same machine load; the shared
    traces and a synthetic one of large tensors (see ``large_tensors``)."""
    print(f"\n## Replay ns/event, best of {repeats}: {DEFAULT} against {PREVIOUS}")
    print(f"\n| trace | {PREVIOUS} | {DEFAULT} | ratio |")
    print("|---|---:|---:|---:|")
    rows = []
    timed = dict(traces)
    timed["large-tensors (synthetic)"] = large_tensors()
    for name, trace in timed.items():
        best = {label: result.ns_per_event for label, result in fastest(trace, repeats).items()}
        ratio = best[DEFAULT] / best[PREVIOUS]
        print(f"| {name} | {best[PREVIOUS]:.1f} | {best[DEFAULT]:.1f} | {ratio:.3f}x |")
        rows.append({"trace": name, "previous": best[PREVIOUS], "default": best[DEFAULT]})
    return {"repeats": repeats, "rows": rows}


def timing_properties(trace: Trace) -> cubepool.MemoryDeviceProperties:
    """The device properties both layouts of a timed replay are resolved with: the
    default ones, with the largest page raised to the smallest power of two that holds
    ``trace``'s largest allocation where the default's (2 GiB) does not. ``PREVIOUS``
    puts a block over the largest page nowhere, and a replay whose reserves fail does
    less work, so its time is no yardstick (at x128, most captured traces hold blocks of
    2 GiB or more); the default's layout does not read the largest page."""
    default = cubepool.MemoryDeviceProperties()
    largest = max(trace.distinct_sizes(), default=0)
    if largest <= default.max_page_size:
        return default
    return cubepool.MemoryDeviceProperties(max_page_size=1 << (largest - 1).bit_length())


def fastest(trace: Trace, repeats: int) -> dict[str, cubepool.ReplayResult]:
    """The fastest of ``repeats`` replays of ``trace`` under the default and ``PREVIOUS``
    (by ns/event), taken in turn so that both see the same machine load, with
    ``timing_properties``. Raises when either fails a reserve: its time would not be
    the time of holding the trace."""
    layouts = {label: MemoryConfiguration.parse(label) for label in (PREVIOUS, DEFAULT)}
    properties = timing_properties(trace)
    best: dict[str, cubepool.ReplayResult] = {}
    for _ in range(repeats):
        for label, layout in layouts.items():
            result = cubepool.replay(trace, layout, properties, samples=0)
            if not result.complete:
                raise RuntimeError(
                    f"{label} failed {result.failed_reserves} reserves replaying "
                    f"{trace.workload}: its time would not be that of holding the trace"
                )
            if label not in best or result.ns_per_event < best[label].ns_per_event:
                best[label] = result
    return best


def scaled_timing(
    traces: dict[str, Trace], factors: tuple[int, ...], repeats: int
) -> dict[str, Any]:
    """Replay ns/event of the default against ``PREVIOUS`` on ``traces`` as captured and
    with every size multiplied by each of ``factors`` (best of ``repeats``, as
    ``timing``), and the default's storage calls per 100 allocations there."""
    scales = (1, *factors)
    print(f"\n## Replay ns/event, best of {repeats}, sizes scaled up: {DEFAULT} / {PREVIOUS}")
    print("\n| trace | " + " | ".join(f"x{factor}" for factor in scales) + " |")
    print("|---|" + "---:|" * len(scales))
    rows = []
    for name, trace in traces.items():
        cells = []
        for factor in scales:
            bigger = trace if factor == 1 else scaled_by(trace, factor)
            best = fastest(bigger, repeats)
            # The calls are the same in every replay; the fastest's are taken.
            _, calls = figures(bigger, best[DEFAULT])
            ns = {label: result.ns_per_event for label, result in best.items()}
            rows.append(
                {
                    "trace": name,
                    "factor": factor,
                    "previous": ns[PREVIOUS],
                    "default": ns[DEFAULT],
                    "calls": calls,
                }
            )
            cells.append(f"{ns[DEFAULT] / ns[PREVIOUS]:.2f}x / {calls:.1f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    return {"repeats": repeats, "factors": list(scales), "rows": rows}


def memory(traces: dict[str, Trace]) -> dict[str, Any]:
    """Each trace's utilization and storage calls per 100 allocations under every preset,
    the models of PyTorch's caching allocator and ``cubepool.plan``'s layout."""
    layouts = MemoryConfiguration.presets() + cubepool.TorchAllocatorModel.names()
    print("\n## Utilization / storage calls per 100 allocations by layout")
    print("\n| trace | " + " | ".join(layouts) + " | planned | planned layout |")
    print("|---|" + "---:|" * (len(layouts) + 1) + "---|")
    rows = []
    for name, trace in traces.items():
        cells = {layout: measure(trace, layout) for layout in layouts}
        planned = cubepool.plan(trace)
        cells["planned"] = figures(trace, planned.result)
        described = cubepool.describe(planned.config)
        print(f"| {name} | " + " | ".join(cell(c) for c in cells.values()) + f" | {described} |")
        rows.append({"trace": name, "cells": cells, "planned_layout": described})
    return {"layouts": [*layouts, "planned"], "rows": rows}


def captured() -> dict[str, Trace]:
    """The captured traces of ``benches/traces``, by name."""
    return {
        path.name.removesuffix(".jsonl.gz"): cubepool.load_trace(path)
        for path in sorted(CAPTURED.glob("*.jsonl.gz"))
    }


def wider_captures(folder: Path = WIDER) -> dict[str, Trace]:
    """The captures of wider models in ``folder`` (``benches/traces/wider``), by name."""
    return {
        path.name.removesuffix(".jsonl.gz"): cubepool.load_trace(path)
        for path in sorted(folder.glob("*.jsonl.gz"))
    }


def beside(traces: dict[str, Trace]) -> dict[str, Any]:
    """The default beside the models of PyTorch's allocator and its eager-unmap limit on
    ``traces``, each marked chosen-on (the setting was chosen on it), held-out (from the
    setting, not from the later rules) or held-out (all) (captured after every choice)."""
    print("\n## The default beside torch's models and the eager-unmap limit")
    print("\n| trace | role | " + " | ".join(BESIDE) + " |")
    print("|---|---|" + "---:|" * len(BESIDE))
    rows = []
    for name, trace in traces.items():
        role = "chosen-on" if name in SELECTION else "held-out"
        if name not in RULES_JUDGED_ON:
            role = "held-out (all)"
        cells = {layout: measure(trace, layout) for layout in BESIDE}
        print(f"| {name} | {role} | " + " | ".join(cell(c) for c in cells.values()) + " |")
        rows.append({"trace": name, "role": role, "cells": cells})
    return {"layouts": list(BESIDE), "rows": rows}


def fewer_calls(traces: dict[str, Trace]) -> dict[str, Any]:
    """The default beside settings that make fewer storage calls (``FEWER_CALLS``) on
    ``traces``: what a lower figure costs in utilization."""
    print("\n## The default beside settings with fewer storage calls")
    print("\n| trace | " + " | ".join(FEWER_CALLS) + " |")
    print("|---|" + "---:|" * len(FEWER_CALLS))
    rows = []
    for name, trace in traces.items():
        cells = {layout: measure(trace, layout) for layout in FEWER_CALLS}
        print(f"| {name} | " + " | ".join(cell(c) for c in cells.values()) + " |")
        rows.append({"trace": name, "cells": cells})
    return {"layouts": list(FEWER_CALLS), "rows": rows}


def scaled_up(traces: dict[str, Trace], factors: tuple[int, ...]) -> dict[str, Any]:
    """The default beside the models of PyTorch's allocator on ``traces`` with every
    size multiplied by each of ``factors`` (``scaled_by``): the captured CPU runs at the
    scale of GPU runs, which the default was never judged on."""
    print("\n## The default beside torch's models, sizes scaled up")
    print("\n| trace | factor | " + " | ".join(SCALED_UP) + " |")
    print("|---|---:|" + "---:|" * len(SCALED_UP))
    rows = []
    for name, trace in traces.items():
        for factor in factors:
            bigger = scaled_by(trace, factor)
            cells = {layout: measure(bigger, layout) for layout in SCALED_UP}
            print(f"| {name} | {factor} | " + " | ".join(cell(c) for c in cells.values()) + " |")
            rows.append({"trace": name, "factor": factor, "cells": cells})
    return {"layouts": list(SCALED_UP), "factors": list(factors), "rows": rows}


def mean_lowest(cells: list[Cell]) -> str:
    """``mean / lowest`` of the utilizations of a layout's replays of the variants."""
    return f"{mean(u for u, _ in cells):.3f} / {min(u for u, _ in cells):.3f}"


def replay_variants(trace: Trace, count: int, layouts: tuple[str, ...]) -> dict[str, list[Cell]]:
    """Each of ``layouts``' figures on seeds 1 to ``count`` of ``scaled`` of ``trace``,
    sizes within ``VARIANT_SPREAD`` of its own, in seed order."""
    low, high = 1 - VARIANT_SPREAD, 1 + VARIANT_SPREAD
    cells: dict[str, list[Cell]] = {layout: [] for layout in layouts}
    for seed in range(1, count + 1):
        variant = scaled(trace, seed, low, high)
        for layout in layouts:
            cells[layout].append(measure(variant, layout))
    return cells


def variants(traces: dict[str, Trace], count: int) -> dict[str, Any]:
    """Utilization and storage calls of ``VARIANTS`` on ``count`` variants of each of
    ``traces`` (seeds 1 to ``count`` of ``scaled``, sizes within ``VARIANT_SPREAD`` of
    the recorded ones): each layout's mean and lowest, the default's smallest margin over
    ``torch_expandable`` and its variants below ``UTILIZATION_GOAL``."""
    default, expandable, *_ = VARIANTS
    low, high = 1 - VARIANT_SPREAD, 1 + VARIANT_SPREAD
    print(f"\n## {count} variants of each trace (sizes x [{low:g}, {high:g}])")
    print(
        "\n| trace | "
        + " | ".join(f"{layout} mean / lowest" for layout in VARIANTS)
        + f" | smallest margin | below {UTILIZATION_GOAL:g} |"
    )
    print("|---|" + "---:|" * (len(VARIANTS) + 2))
    rows = []
    for name, trace in traces.items():
        cells = replay_variants(trace, count, VARIANTS)
        ours = [u for u, _ in cells[default]]
        margin = min(u - e for u, (e, _) in zip(ours, cells[expandable], strict=True))
        below = sum(u < UTILIZATION_GOAL for u in ours)
        means = " | ".join(mean_lowest(cells[layout]) for layout in VARIANTS)
        print(f"| {name} | {means} | {margin:+.3f} | {below} |")
        rows.append({"trace": name, "cells": cells})
    return {"layouts": list(VARIANTS), "count": count, "spread": VARIANT_SPREAD, "rows": rows}


def default_margin(cells: dict[str, list[Cell]]) -> float:
    """The smallest margin of the default's utilization over ``torch_expandable``'s, replay
    by replay, of ``SCALED_VARIANTS``' ``cells``."""
    default, expandable, *_ = SCALED_VARIANTS
    pairs = zip(cells[default], cells[expandable], strict=True)
    return min(ours[0] - theirs[0] for ours, theirs in pairs)


def print_margin_head(title: str, first: tuple[str, ...], per_layout: str) -> None:
    """Prints a part's ``title`` and the head of its table: the ``first`` columns, one per
    layout of ``SCALED_VARIANTS`` (its name and ``per_layout``) and the default's smallest
    margin over ``torch_expandable``."""
    print(f"\n## {title}")
    heads = " | ".join(f"{layout} {per_layout}" for layout in SCALED_VARIANTS)
    print(f"\n| {' | '.join(first)} | {heads} | smallest margin of the default |")
    print("|---|" + "---:|" * (len(first) + len(SCALED_VARIANTS)))


def scaled_variants(
    traces: dict[str, Trace], factors: tuple[int, ...], count: int
) -> dict[str, Any]:
    """``SCALED_VARIANTS`` on ``count`` variants of each of ``traces`` scaled up by each
    of ``factors`` (``scaled_by``, then seeds 1 to ``count`` of ``scaled`` within
    ``VARIANT_SPREAD``): issue 28's goals between the scale of the CPU captures and that
    of GPU runs, for the default and for PyTorch's own size split."""
    low, high = 1 - VARIANT_SPREAD, 1 + VARIANT_SPREAD
    title = f"{count} variants of each trace scaled up (sizes x factor x [{low:g}, {high:g}])"
    print_margin_head(title, ("trace", "factor"), "mean / lowest")
    rows = []
    for name, trace in traces.items():
        for factor in factors:
            cells = replay_variants(scaled_by(trace, factor), count, SCALED_VARIANTS)
            means = " | ".join(mean_lowest(cells[layout]) for layout in SCALED_VARIANTS)
            print(f"| {name} | {factor} | {means} | {default_margin(cells):+.3f} |")
            rows.append({"trace": name, "factor": factor, "cells": cells})
    return {
        "layouts": list(SCALED_VARIANTS),
        "factors": list(factors),
        "count": count,
        "spread": VARIANT_SPREAD,
        "rows": rows,
    }


def wider(traces: dict[str, Trace], count: int) -> dict[str, Any]:
    """``SCALED_VARIANTS`` on each of ``traces`` (the wider captures) as captured and on
    ``count`` variants (seeds 1 to ``count`` of ``scaled`` within ``VARIANT_SPREAD``):
    issue 28's goals on real captures of larger models. Each layout's cells are the
    trace as captured first, then its variants."""
    title = f"Wider captures, as captured and {count} variants each"
    print_margin_head(title, ("trace", "peak live (MiB)"), "as captured / variants mean")
    rows = []
    for name, trace in traces.items():
        varied = replay_variants(trace, count, SCALED_VARIANTS)
        cells = {layout: [measure(trace, layout), *varied[layout]] for layout in SCALED_VARIANTS}
        shown = " | ".join(
            f"{cell(cells[layout][0])} / {mean(u for u, _ in cells[layout]):.3f}"
            for layout in SCALED_VARIANTS
        )
        live = trace.peak_live / 2**20
        print(f"| {name} | {live:.0f} | {shown} | {default_margin(cells):+.3f} |")
        rows.append({"trace": name, "peak_live": trace.peak_live, "cells": cells})
    return {
        "layouts": list(SCALED_VARIANTS),
        "count": count,
        "spread": VARIANT_SPREAD,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    """Runs the parts asked for; writes their figures as JSON when asked."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", action="store_true", help="the trade-off table")
    parser.add_argument("--select", action="store_true", help="the selection and its check")
    parser.add_argument(
        "--small", default="16MiB", help="small= of the table (default 16MiB, the default's)"
    )
    parser.add_argument("--traces", type=Path, help="a folder with the held-back traces")
    parser.add_argument("--timing", type=int, default=0, help="replays per layout to time")
    parser.add_argument("--memory", action="store_true", help="utilization by layout and a plan")
    parser.add_argument(
        "--beside", action="store_true", help="the default beside torch's models, all traces"
    )
    parser.add_argument(
        "--fewer-calls",
        action="store_true",
        help="the default beside settings with fewer storage calls, all traces",
    )
    parser.add_argument(
        "--scaled-up",
        action="store_true",
        help="the default beside torch's models, every trace's sizes scaled up",
    )
    parser.add_argument(
        "--variants",
        type=int,
        default=0,
        metavar="K",
        help="the default beside torch_expandable on K variants of every trace's sizes",
    )
    parser.add_argument(
        "--scaled-variants",
        type=int,
        default=0,
        metavar="K",
        help="issue 28's goals on K variants of every trace, x1, x2, x4 and x8",
    )
    parser.add_argument(
        "--scaled-timing",
        type=int,
        default=0,
        metavar="N",
        help="replays per layout to time on every trace, as captured and scaled up",
    )
    parser.add_argument(
        "--wider",
        type=int,
        default=0,
        metavar="K",
        help="issue 28's goals on the wider captures, as captured and on K variants each",
    )
    parser.add_argument(
        "--wider-folder",
        type=Path,
        default=WIDER,
        help="the captures --wider reads (default benches/traces/wider; e.g. those of "
        "capture_traces.py --width 4)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: bundled traces, a short grid"
    )
    args = parser.parse_args(argv)
    folder = None if args.quick else args.traces
    loaded = {name: load(name, folder) for name in SELECTION + HELD_BACK}
    traces = {name: trace for name, trace in loaded.items() if trace is not None}
    out: dict[str, Any] = {
        "traces": list(traces),
        "missing": [name for name, trace in loaded.items() if trace is None],
        "default": DEFAULT,
        # The preset's pools in the pools language, and in words.
        "default_text": str(MemoryConfiguration.custom(MemoryConfiguration.parse(DEFAULT).pools())),
        "default_pools": cubepool.describe(MemoryConfiguration.parse(DEFAULT)),
        "previous": PREVIOUS,
    }
    if args.table:
        out["tradeoff"] = tradeoff(traces, args.small)
    if args.select:
        out["selection"] = select(traces, SMALLS[:2] if args.quick else SMALLS)
        chosen = out["selection"]["chosen"]
        if chosen is not None:
            out["check"] = check(traces, chosen)
    if args.timing:
        out["timing"] = timing(traces, args.timing)
    if args.memory:
        out["memory"] = memory(traces)
    if args.beside:
        out["beside"] = beside(traces if args.quick else {**traces, **captured()})
    if args.fewer_calls:
        out["fewer_calls"] = fewer_calls(traces if args.quick else {**traces, **captured()})
    if args.scaled_up:
        out["scaled_up"] = scaled_up(
            traces if args.quick else {**traces, **captured()},
            SCALE_FACTORS[:1] if args.quick else SCALE_FACTORS,
        )
    if args.variants:
        out["variants"] = variants(
            traces if args.quick else {**traces, **captured()},
            min(args.variants, 2) if args.quick else args.variants,
        )
    if args.scaled_variants:
        out["scaled_variants"] = scaled_variants(
            traces if args.quick else {**traces, **captured()},
            VARIANT_FACTORS[1:2] if args.quick else VARIANT_FACTORS,
            min(args.scaled_variants, 2) if args.quick else args.scaled_variants,
        )
    if args.scaled_timing:
        out["scaled_timing"] = scaled_timing(
            traces if args.quick else {**traces, **captured()},
            SCALE_FACTORS[:1] if args.quick else SCALE_FACTORS,
            args.scaled_timing,
        )
    if args.wider:
        every = wider_captures(args.wider_folder)
        chosen = {name: every[name] for name in WIDER_QUICK} if args.quick else every
        out["wider"] = wider(chosen, min(args.wider, 2) if args.quick else args.wider)
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
