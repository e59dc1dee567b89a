"""Other online placements beside the default's, under eager unmapping (issue 28).

The default's utilization on a trace is its eager-unmap limit's (the peak of the
granules live blocks touch, see ``src/pool/virtual_pages.rs``), so what is left below
1.0 is where its placement put the blocks. This script asks whether another rule of
placement, with no more knowledge of the future than the default has, would have put
them better. It replays every trace through a small model of the virtual pool (two
ranges split at 16 MiB as the default's, extents rounded up to 64 bytes, free space
merged with its neighbours, 2 MiB granules mapped while a live block touches them)
under each rule of ``POLICIES``:

- ``best``: the smallest free run that fits, the lowest offset among equals (exact
  best fit; the default's arena approximates it with size classes);
- ``first``: the free run at the lowest offset that fits (address-ordered first fit);
- ``fewest-granules``: the free run where the block touches the fewest granules no
  live block touches (the fewest new granules to map), then best fit.

Each block goes to the start of the free run it takes, as in the default. Figures are
utilization (peak live bytes / peak mapped bytes), beside the default's from
``cubepool.replay`` (its eager-unmap limit, the same figure), on every trace as
captured and on ``--variants K`` variants of each (every distinct size times its own
factor in [0.85, 1.15], as ``virtual_tradeoff.py --variants``).

    python benches/python/fit_policies.py --variants 5 --json out.json

``--traces DIR`` adds the shared traces found there to the captured ones
(``benches/traces``); ``--only NAME`` keeps the traces named.
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from virtual_tradeoff import EAGER, HELD_BACK, SELECTION, captured, load, scaled

import cubepool

GRANULE = 2 << 20
ALIGNMENT = 64
SMALL_MAX = 16 << 20
# A range far larger than any trace: placement never runs out of room.
RANGE = 1 << 50

# A free run: (offset, extent).
Hole = tuple[int, int]
# Which free run of ``holes`` a block of ``extent`` bytes takes (its index), given the
# live blocks per granule of its range; None when none fits.
Policy = Callable[[list[Hole], int, dict[int, int]], int | None]


def new_granules(offset: int, extent: int, touched: dict[int, int]) -> int:
    """The granules a block at ``offset`` of ``extent`` bytes touches that no live block
    touches (what placing it there maps)."""
    first, last = offset // GRANULE, (offset + extent - 1) // GRANULE
    return sum(1 for granule in range(first, last + 1) if granule not in touched)


def best_fit(holes: list[Hole], extent: int, _touched: dict[int, int]) -> int | None:
    """The smallest free run that fits, the lowest offset among equals."""
    fits = [(size, index) for index, (_, size) in enumerate(holes) if size >= extent]
    return min(fits)[1] if fits else None


def first_fit(holes: list[Hole], extent: int, _touched: dict[int, int]) -> int | None:
    """The free run at the lowest offset that fits."""
    return next((index for index, (_, size) in enumerate(holes) if size >= extent), None)


def fewest_granules(holes: list[Hole], extent: int, touched: dict[int, int]) -> int | None:
    """The free run where the block maps the fewest new granules, then best fit."""
    fits = [
        (new_granules(offset, extent, touched), size, index)
        for index, (offset, size) in enumerate(holes)
        if size >= extent
    ]
    return min(fits)[2] if fits else None


POLICIES: dict[str, Policy] = {
    "best": best_fit,
    "first": first_fit,
    "fewest-granules": fewest_granules,
}


class Range:
    """One address range of the model: its free runs (sorted by offset, merged with
    their neighbours) and the live blocks touching each granule."""

    def __init__(self) -> None:
        self.holes: list[Hole] = [(0, RANGE)]
        self.touched: dict[int, int] = {}

    def place(self, extent: int, policy: Policy) -> tuple[int, int]:
        """Places a block of ``extent`` bytes at the start of the run ``policy`` picks;
        returns its offset and the granules it mapped."""
        index = policy(self.holes, extent, self.touched)
        if index is None:
            raise ValueError(f"no free run of {extent} bytes in a range of {RANGE}")
        offset, size = self.holes[index]
        if size == extent:
            del self.holes[index]
        else:
            self.holes[index] = (offset + extent, size - extent)
        mapped = 0
        for granule in range(offset // GRANULE, (offset + extent - 1) // GRANULE + 1):
            count = self.touched.get(granule, 0)
            mapped += count == 0
            self.touched[granule] = count + 1
        return offset, mapped

    def free(self, offset: int, extent: int) -> int:
        """Frees the block at ``offset``; returns the granules it unmapped."""
        unmapped = 0
        for granule in range(offset // GRANULE, (offset + extent - 1) // GRANULE + 1):
            self.touched[granule] -= 1
            if self.touched[granule] == 0:
                del self.touched[granule]
                unmapped += 1
        index = bisect.bisect_left(self.holes, (offset, 0))
        start, end = offset, offset + extent
        if index < len(self.holes) and self.holes[index][0] == end:
            end += self.holes.pop(index)[1]
        if index > 0 and sum(self.holes[index - 1]) == start:
            start = self.holes.pop(index - 1)[0]
            index -= 1
        self.holes.insert(index, (start, end - start))
        return unmapped


def utilization(events: Sequence[tuple[int, str, int, int]], policy: Policy) -> float:
    """Peak live bytes over peak mapped bytes of ``events`` placed by ``policy``, with
    eager unmapping (a granule is mapped while a live block touches it)."""
    ranges = (Range(), Range())
    blocks: dict[int, tuple[Range, int, int, int]] = {}
    live = peak_live = mapped = peak_mapped = 0
    for _, op, ident, size in events:
        if op == "alloc":
            if size == 0:
                continue
            extent = -(-size // ALIGNMENT) * ALIGNMENT
            where = ranges[size > SMALL_MAX]
            offset, granules = where.place(extent, policy)
            blocks[ident] = (where, offset, extent, size)
            live += size
            mapped += granules
            peak_live, peak_mapped = max(peak_live, live), max(peak_mapped, mapped)
        elif ident in blocks:
            where, offset, extent, size = blocks.pop(ident)
            live -= size
            mapped -= where.free(offset, extent)
    return peak_live / (peak_mapped * GRANULE) if peak_mapped else 1.0


def compare(traces: dict[str, cubepool.Trace], variants: int) -> dict[str, Any]:
    """Every policy's utilization beside the default's, per trace and variant."""
    rows = []
    for name, trace in traces.items():
        for seed in range(variants + 1):
            replayed = trace if seed == 0 else scaled(trace, seed, 0.85, 1.15)
            events = replayed.events()
            row: dict[str, Any] = {"trace": name, "variant": seed}
            row["default"] = cubepool.replay(replayed, EAGER).utilization
            for policy, rule in POLICIES.items():
                row[policy] = utilization(events, rule)
            rows.append(row)
    return {"policies": ["default", *POLICIES], "variants": variants, "rows": rows}


def summary(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per policy over every replay: mean, lowest, how many below 0.95, and how many
    replays it beat or lost to the default on (by more than 0.0005)."""
    rows = result["rows"]
    out = []
    for policy in result["policies"]:
        figures = [row[policy] for row in rows]
        out.append(
            {
                "policy": policy,
                "mean": statistics.fmean(figures),
                "lowest": min(figures),
                "below_095": sum(figure < 0.95 for figure in figures),
                "above_default": sum(row[policy] > row["default"] + 5e-4 for row in rows),
                "below_default": sum(row[policy] < row["default"] - 5e-4 for row in rows),
            }
        )
    return out


def print_tables(result: dict[str, Any]) -> None:
    """The traces as captured, then the summary over every replay, as markdown."""
    policies = result["policies"]
    print("| trace | " + " | ".join(f"`{p}`" for p in policies) + " |")
    print("|---|" + "---:|" * len(policies))
    for row in result["rows"]:
        if row["variant"] == 0:
            print(f"| {row['trace']} | " + " | ".join(f"{row[p]:.3f}" for p in policies) + " |")
    replays = len(result["rows"])
    print(f"\nOver {replays} replays (each trace and {result['variants']} variants):\n")
    print("| policy | mean | lowest | below 0.95 | above the default | below the default |")
    print("|---|---:|---:|---:|---:|---:|")
    for s in summary(result):
        print(
            f"| `{s['policy']}` | {s['mean']:.4f} | {s['lowest']:.3f} | {s['below_095']} "
            f"| {s['above_default']} | {s['below_default']} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", type=int, default=0, help="variants of each trace")
    parser.add_argument("--traces", type=Path, default=None, help="folder of shared traces")
    parser.add_argument("--only", action="append", default=[], help="keep only these traces")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures")
    args = parser.parse_args(argv)
    if args.variants < 0:
        parser.error(f"--variants must be at least 0, got {args.variants}")
    traces: dict[str, cubepool.Trace] = {}
    for name in (*SELECTION, *HELD_BACK):
        trace = load(name, args.traces)
        if trace is not None:
            traces[name] = trace
    traces.update(captured())
    if args.only:
        missing = sorted(set(args.only) - set(traces))
        if missing:
            parser.error(f"--only: no trace named {', '.join(missing)}")
        traces = {name: trace for name, trace in traces.items() if name in args.only}
    result = compare(traces, args.variants)
    print_tables(result)
    if args.json:
        args.json.write_text(json.dumps({**result, "summary": summary(result)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
