"""Compares two criterion runs benchmark by benchmark: before and after a change.

    # before: in a checkout of the old commit
    cargo bench --bench pools --bench peers -- --warm-up-time 1 --measurement-time 3
    # after: benches/run_all.sh (or the same cargo bench) in this checkout, then
    python benches/compare.py OLD_CHECKOUT/target/criterion target/criterion

For every benchmark id both runs have, prints criterion's median before and after, their
ratio and whether the medians' 95 % confidence intervals overlap; then the median and
range of the ratios of cubepool's benchmarks and of the peers'. The peers (CubeCL,
offset-allocator, malloc), unchanged and run in the same two runs, are the control: their
ratios show how far two runs of the same code drift apart on this machine, which a
change's ratio has to exceed before it means anything.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

PEERS = ("cubecl", "offset", "system")
"""Name parts of the benchmarks whose code a cubepool change does not touch."""


def load(root: Path) -> dict[str, tuple[float, float, float]]:
    """Every benchmark under ``root`` by full id: median, and its 95 % interval."""
    found = {}
    for meta_path in root.glob("**/new/benchmark.json"):
        meta = json.loads(meta_path.read_text())
        median = json.loads((meta_path.parent / "estimates.json").read_text())["median"]
        interval = median["confidence_interval"]
        found[meta["full_id"]] = (
            median["point_estimate"],
            interval["lower_bound"],
            interval["upper_bound"],
        )
    return found


def is_peer(full_id: str) -> bool:
    """Whether ``full_id`` times a peer's code rather than cubepool's."""
    parts = full_id.split("/")
    return len(parts) > 1 and parts[1].startswith(PEERS)


def main(argv: list[str] | None = None) -> int:
    """Prints the comparison table and the control's spread."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="target/criterion of the old run")
    parser.add_argument("after", type=Path, help="target/criterion of the new run")
    args = parser.parse_args(argv)
    before, after = load(args.before), load(args.after)
    print("| benchmark | before | after | after / before | 95 % intervals overlap |")
    print("|---|---:|---:|---:|:-:|")
    ratios: dict[bool, list[float]] = {True: [], False: []}
    for full_id in sorted(set(before) & set(after)):
        old, new = before[full_id], after[full_id]
        ratio = new[0] / old[0]
        overlap = new[1] <= old[2] and old[1] <= new[2]
        ratios[is_peer(full_id)].append(ratio)
        print(
            f"| {full_id} | {old[0]:,.1f} ns | {new[0]:,.1f} ns | {ratio:.3f} "
            f"| {'yes' if overlap else 'no'} |"
        )
    for peer, label in ((True, "peers (unchanged code, the control)"), (False, "cubepool")):
        values = ratios[peer]
        if values:
            print(
                f"\n{label}: {len(values)} benchmarks, after / before median "
                f"{statistics.median(values):.3f}, range {min(values):.3f}-{max(values):.3f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
