"""Loads no store can forward: where a program reads back bytes it has just written
in pieces of another shape.

A load of bytes that recent stores wrote is served from the store queue only when one
store holds all of them; a load that spans two stores, or more than the one store it
overlaps (a 16-byte read of two 8-byte writes, a 4-byte read of a 2-byte write and
padding), waits until those stores reach the cache, a stall of some dozen cycles on
the machines here (AMD EPYC Zen 4) that no instruction count shows. This script runs a
program under valgrind's lackey, which lists every instruction, load and store with
its address and size, and replays that list through a model of the store queue: the
last ``--window`` stores (Zen 4's queue holds 64); a load that overlaps the youngest
store in the window that it overlaps, without lying wholly inside it, is counted
against the pair of instructions, and each pair is named by its source lines
(``addr2line``, with the line tables of the ``lines`` profile in ``Cargo.toml``, which
changes no code). A pair counted once per event of a replay (or step of a loop) is a
stall on every one.

    cargo build --profile lines --example replay_ab
    python benches/forwarding.py --per 6870 -- target/lines/examples/replay_ab \\
        ../shared/traces/gpt2-train.jsonl compact default 0

With ``--steps SHORT LONG`` it runs the command twice, ``{steps}`` in it replaced by
each number, and counts per step the pairs the longer run adds (the setup cancels out):

    cargo build --profile lines --example peer_loops
    python benches/forwarding.py --steps 3000 6000 -- target/lines/examples/peer_loops \\
        --no-bytes fifo virtual {steps}

The model is the queue's rule alone: a real core may also fail to forward a load that
is inside one store but misaligned to it, and a store may have left the queue before
the window says (a store retires and drains in a few dozen cycles unless the queue is
blocked). So a pair found with a small window (``--window 16``) is a near stall; one
that needs 48 is likely gone by the load. Counts are deterministic, as callgrind's.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

# Where valgrind maps the main program of a position-independent executable on amd64:
# the program's own addresses are this far above its file's. Shared libraries lie
# from LIBRARIES up; their accesses are counted but not named.
PIE_BASE = 0x108000
LIBRARIES = 0x4000000


@dataclasses.dataclass(frozen=True)
class Pair:
    """A load no store could forward, and the store it overlapped: the instructions'
    addresses and the sizes of their accesses."""

    load: int
    load_size: int
    store: int
    store_size: int


def unforwarded(lines: Iterable[str], window: int) -> collections.Counter[Pair]:
    """Counts, per pair of instructions, the loads of lackey's ``--trace-mem`` lines
    that overlap the youngest of the last ``window`` stores they overlap without lying
    inside it. A modify (``M``, a read and a write of the same bytes) is a load, then
    a store. Lines that are not accesses (valgrind's own, ``==``) are skipped."""
    if window < 1:
        raise ValueError(f"--window must be at least 1, not {window}")
    stores: collections.deque[tuple[int, int, int]] = collections.deque(maxlen=window)
    counts: collections.Counter[Pair] = collections.Counter()
    instruction = 0
    for line in lines:
        kind, _, rest = line.strip().partition(" ")
        address, _, size = rest.strip().partition(",")
        try:
            at, length = int(address, 16), int(size)
        except ValueError:
            continue
        if kind == "I":
            instruction = at
            continue
        if kind in ("L", "M"):
            end = at + length
            for start, stored, by in reversed(stores):
                if start < end and at < start + stored:
                    if not (start <= at and end <= start + stored):
                        counts[Pair(instruction, length, by, stored)] += 1
                    break
        if kind in ("S", "M"):
            stores.append((at, length, instruction))
    return counts


def source_lines(binary: Path, addresses: list[int]) -> dict[int, str]:
    """Each address of the program as ``file:line`` with the chain it was inlined
    through, innermost first (``addr2line -i``)."""
    own = [a for a in addresses if PIE_BASE <= a < LIBRARIES]
    named = {a: "(a shared library)" for a in addresses if a not in own}
    if not own:
        return named
    out = subprocess.run(
        ["addr2line", "-a", "-i", "-e", str(binary)] + [hex(a - PIE_BASE) for a in own],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    names: dict[int, list[str]] = {}
    current: list[str] = []
    for line in out.splitlines():
        if line.startswith("0x"):
            current = names.setdefault(int(line, 16) + PIE_BASE, [])
        elif line:
            line = re.sub(r".*/registry/src/[^/]+/", "", line.split("/library/")[-1])
            current.append(line.replace(str(Path.cwd()) + "/", ""))
    named.update({a: " <- ".join(names.get(a, ["?"])[:3]) for a in own})
    return named


def per_step(
    short: collections.Counter[Pair], long: collections.Counter[Pair], steps: int
) -> dict[Pair, float]:
    """Each pair's count a step, from runs of two numbers of steps ``steps`` apart: the
    difference of their counts over ``steps``, so that the setup both ran cancels out
    (as ``cache_profile.py`` does). Pairs the longer run counts no more often than the
    shorter are left out."""
    if steps < 1:
        raise ValueError(f"--steps must name two numbers, the second larger, not {steps} apart")
    return {pair: (n - short[pair]) / steps for pair, n in long.items() if n > short[pair]}


def traced(command: list[str], window: int) -> collections.Counter[Pair] | None:
    """``unforwarded`` of ``command`` run under lackey, or None (said on stderr) where
    it fails."""
    with tempfile.TemporaryDirectory() as work:
        log = Path(work) / "lackey.log"
        run = subprocess.run(
            ["valgrind", "--tool=lackey", "--trace-mem=yes", f"--log-file={log}", *command],
            stdout=subprocess.DEVNULL,
        )
        if run.returncode != 0:
            print(f"forwarding.py: {' '.join(command)} exited {run.returncode}", file=sys.stderr)
            return None
        with log.open() as lines:
            return unforwarded(lines, window)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=int, default=48, help="stores the queue holds")
    parser.add_argument("--per", type=int, default=1, help="divide counts by this (events)")
    parser.add_argument(
        "--steps",
        type=int,
        nargs=2,
        metavar=("SHORT", "LONG"),
        help="run the command twice, {steps} in it replaced by each, and count per step",
    )
    parser.add_argument("--top", type=int, default=12, help="pairs to list")
    parser.add_argument(
        "command", nargs="+", help="the program (with line tables) and its arguments"
    )
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("forwarding.py: valgrind is not installed", file=sys.stderr)
        return 1
    if args.steps and not any("{steps}" in word for word in args.command):
        parser.error("--steps needs {steps} in the command")
    if args.steps and args.per != 1:
        parser.error("--per and --steps both divide the counts: give one")
    if args.steps:
        runs = [
            traced([word.replace("{steps}", str(n)) for word in args.command], args.window)
            for n in args.steps
        ]
        if runs[0] is None or runs[1] is None:
            return 1
        try:
            counts = per_step(runs[0], runs[1], args.steps[1] - args.steps[0])
        except ValueError as error:
            parser.error(str(error))
    else:
        total = traced(args.command, args.window)
        if total is None:
            return 1
        counts = {pair: n / args.per for pair, n in total.items()}
    top = sorted(counts.items(), key=lambda item: -item[1])[: args.top]
    binary = Path(args.command[0])
    names = source_lines(binary, sorted({a for p, _ in top for a in (p.load, p.store)}))
    for pair, count in top:
        print(f"{count:8.3f}  load of {pair.load_size} at {names[pair.load]}")
        print(f"{'':8}  after a store of {pair.store_size} at {names[pair.store]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
