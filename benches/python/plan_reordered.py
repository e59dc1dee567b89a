"""A plan against a next run whose order moves: the plan's layout and the default on a
trace whose held-out step has its events moved a few places.

    python benches/python/plan_reordered.py [TRACE ...] [--window 4] [--seeds 2]

For each trace (a bundled example's name or a path; by default the shared traces with
steps that ship with cubepool), ``cubepool.plan`` derives its plan as ``cubepool plan``
does, then the plan's layout and the default layout replay the trace as recorded and
copies whose last step has each event (allocations and frees) moved up to ``--window``
places
(``cubepool.plan.derivation.perturb``, seeds 0, 1, ...). The planned arena matches
requests by their size and order in a step; this shows what it reserves where a next
run does not repeat that order (README, "Plans generalise").
"""

from __future__ import annotations

import argparse

import cubepool
from cubepool._format import human_bytes, table
from cubepool.layouts import describe
from cubepool.plan.derivation import perturb

DEFAULT_TRACES = ("gpt2-train", "transformer-train")


def main() -> None:
    """Print, per trace and copy, the plan's and the default's peak reserved bytes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", default=list(DEFAULT_TRACES))
    parser.add_argument("--window", type=float, default=4.0)
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args()
    rows = []
    for name in args.traces:
        trace = cubepool.load_trace(name)
        planned = cubepool.plan(trace)
        steps = [first for phase, first in trace.phases if phase.lower() != "setup"]
        if not steps:
            print(f"{trace.workload}: no step to move (its header names none); left out")
            continue
        copies = [("as recorded", trace)] + [
            (
                f"last step moved (window {args.window:g}, seed {seed})",
                perturb(trace, steps[-1], args.window, seed),
            )
            for seed in range(args.seeds)
        ]
        for label, copy in copies:
            mine = cubepool.replay(copy, planned.config)
            default = cubepool.replay(copy, "default")
            rows.append(
                [
                    trace.workload,
                    "planned arena" if planned.is_planned() else describe(planned.config),
                    label,
                    human_bytes(mine.peak_reserved),
                    human_bytes(default.peak_reserved),
                    f"{mine.peak_reserved / default.peak_reserved:.3f}",
                ]
            )
    print(
        table(["trace", "plan", "run", "plan reserved", "default reserved", "plan / default"], rows)
    )


if __name__ == "__main__":
    main()
