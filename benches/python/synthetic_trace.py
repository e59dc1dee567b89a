"""A deterministic synthetic allocation trace with no phases, of any length.

It stands in for a production trace too long to record and ship: a stationary stream of
allocations whose sizes and lifetimes mix like a training or serving run's, with no
step structure a planner could lean on.

- **Sizes** come from a fixed vocabulary, as in real traces (the shared ones hold 18 to
  286 distinct sizes): 160 sizes drawn once per seed from four bands, each rounded as
  PyTorch rounds tensor bytes (to 8 B below 4 KiB, else to 512 B), drawn with Zipf-like
  weights so a few sizes dominate: small (8 B - 4 KiB) 45 % of allocations, medium
  (4 KiB - 1 MiB) 35 %, large (1 - 8 MiB) 17 %, huge (8 - 64 MiB) 3 %.
- **Lifetimes** are counted in later allocations: 70 % short (1 - 20, temporaries), 25 %
  medium (20 - 500, activations kept for a backward pass), 5 % long (500 - 20,000,
  caches, optimizer buffers); larger tensors lean longer. Lifetimes are log-uniform in
  each band.
- **Weights**: the first allocations are 64 tensors (64 KiB - 32 MiB) that are never
  freed, as a model's parameters are.
- **Times** grow by 100 ns - 10 us per event.

Live bytes settle within 2.4-3.6 GiB (about 750 live allocations) from about the
10,000th event on, and keep setting new highs at random points: the 1,000,000-event trace
(seed 0) peaks at 3.9 GiB near its end, so no prefix tells its peak. Allocations still
live at the end stay live.

    python benches/python/synthetic_trace.py 1000000 out.jsonl.gz   # or import it
"""

from __future__ import annotations

import argparse
import gzip
import heapq
import itertools
import json
import math
import random
import sys
from pathlib import Path

import cubepool

KIB = 1024
MIB = 1024 * KIB

BANDS = ((8, 4 * KIB, 0.45), (4 * KIB, MIB, 0.35), (MIB, 8 * MIB, 0.17), (8 * MIB, 64 * MIB, 0.03))
"""(smallest, largest, share of allocations) of each size band."""
SIZES_PER_BAND = 40
LIFETIMES = ((1, 20, 0.70), (20, 500, 0.25), (500, 20_000, 0.05))
"""(shortest, longest, share) of each lifetime band, in later allocations."""
WEIGHTS = 64


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def _tensor_bytes(n: float) -> int:
    step = 8 if n < 4 * KIB else 512
    return max(step, round(n / step) * step)


def _per_band(distinct: int) -> list[int]:
    """How many of ``distinct`` sizes each band gets: by its share of allocations
    (largest remainders), at least one each."""
    if distinct < len(BANDS):
        raise ValueError(f"at least {len(BANDS)} distinct sizes (one per band), got {distinct}")
    exact = [share * distinct for _, _, share in BANDS]
    counts = [max(1, math.floor(x)) for x in exact]
    by_remainder = sorted(range(len(BANDS)), key=lambda k: math.floor(exact[k]) - exact[k])
    for k in itertools.cycle(by_remainder):
        if sum(counts) >= distinct:
            break
        counts[k] += 1
    return counts


def events(
    length: int, seed: int = 0, distinct: int | None = None
) -> list[tuple[int, str, int, int]]:
    """The first ``length`` events of the synthetic workload ``seed``, as
    ``(t_ns, op, id, size)`` tuples (size 0 for frees). With ``distinct``, the trace
    holds exactly that many distinct sizes (spread over the bands by their shares, the
    weights drawn from them too) instead of the default vocabulary's 160 and the
    weights' own."""
    rng = random.Random(seed)
    vocabulary: list[tuple[list[int], list[float]]] = []
    counts = [SIZES_PER_BAND] * len(BANDS) if distinct is None else _per_band(distinct)
    for (low, high, _), count in zip(BANDS, counts, strict=True):
        drawn: set[int] = set()
        while len(drawn) < count if distinct is not None else not drawn:
            drawn |= {
                _tensor_bytes(_log_uniform(rng, low, high))
                for _ in range(count if distinct is None else 1)
            }
        sizes = sorted(drawn)
        rng.shuffle(sizes)
        vocabulary.append((sizes, [1.0 / (rank + 1) for rank in range(len(sizes))]))
    weight_sizes = sorted(s for sizes, _ in vocabulary[1:] for s in sizes)
    band_weights = [share for _, _, share in BANDS]
    life_weights = [share for _, _, share in LIFETIMES]

    out: list[tuple[int, str, int, int]] = []
    frees: list[tuple[int, int]] = []  # (allocation number at which it is freed, id)
    t = 0
    allocated = 0
    while len(out) < length:
        while frees and frees[0][0] <= allocated and len(out) < length:
            _, ident = heapq.heappop(frees)
            t += rng.randint(100, 10_000)
            out.append((t, "free", ident, 0))
        if len(out) >= length:
            break
        t += rng.randint(100, 10_000)
        if allocated < WEIGHTS:
            size = (
                _tensor_bytes(_log_uniform(rng, 64 * KIB, 32 * MIB))
                if distinct is None
                else rng.choice(weight_sizes)
            )
            out.append((t, "alloc", allocated, size))
            allocated += 1
            continue
        band = rng.choices(range(len(BANDS)), band_weights)[0]
        sizes, weights = vocabulary[band]
        size = rng.choices(sizes, weights)[0]
        # Larger tensors lean towards longer lives: each band up shifts the odds.
        lives = [w * (1 + band) ** k for k, w in enumerate(life_weights)]
        low, high, _ = LIFETIMES[rng.choices(range(len(LIFETIMES)), lives)[0]]
        life = max(1, round(_log_uniform(rng, low, high)))
        out.append((t, "alloc", allocated, size))
        heapq.heappush(frees, (allocated + life, allocated))
        allocated += 1
    return out


def trace(length: int, seed: int = 0, distinct: int | None = None) -> cubepool.Trace:
    """The synthetic trace of ``length`` events (see :func:`events`), no phases."""
    return cubepool.Trace.from_events(
        events(length, seed, distinct), {"workload": f"synthetic-{length}-seed{seed}"}
    )


def write(path: Path, length: int, seed: int = 0, distinct: int | None = None) -> None:
    """Write the trace as cubepool trace v1 (gzip when ``path`` ends in ``.gz``)."""
    opener = gzip.open if path.suffix == ".gz" else open
    header = {
        "format": "cubepool-trace",
        "version": 1,
        "workload": f"synthetic-{length}-seed{seed}",
        "source": "benches/python/synthetic_trace.py",
    }
    with opener(path, "wt", encoding="utf-8") as out:
        out.write(json.dumps(header) + "\n")
        for t, op, ident, size in events(length, seed, distinct):
            event = {"t": t, "op": op, "id": ident}
            if op == "alloc":
                event["size"] = size
            out.write(json.dumps(event) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("events", type=int)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sizes", type=int, help="exactly this many distinct sizes")
    args = parser.parse_args(argv)
    write(args.out, args.events, args.seed, args.sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
