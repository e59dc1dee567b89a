"""A deterministic dynamic-shape allocation trace: lognormal sizes, as a new user makes one.

Inference with dynamic shapes (variable sequence lengths, batch sizes) allocates tensors
of nearly every size once or a few times; the planner's candidates and per-size groups
grow with the distinct sizes, so this is the trace that shows whether planning scales
with them. Each allocation's size is lognormal (median 256 KiB, sigma 2, clamped to
1 B - 256 MiB, in whole bytes), and it lives for
a log-uniform 1-2,000 later allocations; the trace has no phases, so a plan is derived
on the whole of it. Built with ``Trace.from_events``, as the issue's user did.

    python benches/python/dynamic_trace.py 120000   # prints events and distinct sizes
"""

from __future__ import annotations

import argparse
import heapq
import math
import random

import cubepool

KIB = 1024
MIB = 1024 * KIB


def events(length: int, seed: int = 0) -> list[tuple[int, str, int, int]]:
    """The first ``length`` events of dynamic-shape workload ``seed``, as
    ``(t_ns, op, id, size)`` tuples (size 0 for frees)."""
    rng = random.Random(seed)
    out: list[tuple[int, str, int, int]] = []
    frees: list[tuple[int, int]] = []
    t = 0
    allocated = 0
    while len(out) < length:
        while frees and frees[0][0] <= allocated and len(out) < length:
            _, ident = heapq.heappop(frees)
            t += rng.randint(100, 10_000)
            out.append((t, "free", ident, 0))
        if len(out) >= length:
            break
        raw = rng.lognormvariate(math.log(256 * KIB), 2.0)
        size = max(1, min(256 * MIB, round(raw)))
        life = int(math.exp(rng.uniform(0.0, math.log(2000.0))))
        t += rng.randint(100, 10_000)
        out.append((t, "alloc", allocated, size))
        heapq.heappush(frees, (allocated + life, allocated))
        allocated += 1
    return out


def trace(length: int, seed: int = 0) -> cubepool.Trace:
    """The trace of :func:`events`."""
    return cubepool.Trace.from_events(events(length, seed), {"workload": "dynamic-shapes"})


def main() -> None:
    """Prints the trace's length and distinct sizes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("length", type=int)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    made = trace(args.length, args.seed)
    print(len(made), len(made.distinct_sizes()), made.peak_live)


if __name__ == "__main__":
    main()
