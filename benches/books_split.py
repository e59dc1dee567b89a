"""Where the default's time goes, in ns: the targets' loops built with its books removed.

The default layout keeps books offset-allocator does not: memory management's
PyTorch-style statistics, the pool's usage and high-water marks, and the granule books
(which granules live blocks touch, so that unused ones can be unmapped, and so the map
and unmap calls). This script copies the working tree, builds
``examples/peer_loops.rs`` once as it is and once without each part (and without all
three), each from a textual edit of the source (``EDITS``), and times every build's
FIFO and steady-state loops on storage without bytes, the peers interleaved in each
(``peer_loops --no-bytes WORKLOAD all``), every build in turn, ``--reps`` times. The
best round of each peer in each build is kept, and each build's offset-allocator
timing, taken in the same process, is its yardstick.

The builds are throwaway measurements, not configurations: with the granule books
removed nothing is mapped, which only storage without bytes survives. An edit that no
longer matches the source exactly once stops the script with the file and the text it
looked for (``--check`` checks only that, for CI).

    python benches/books_split.py --json target/bench-results/books.json
    python benches/books_split.py --check
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# Each part of the books: (file, text, replacement) edits that remove it.
EDITS: dict[str, list[tuple[str, str, str]]] = {
    "statistics": [
        (
            "src/management/reserve.rs",
            "let value = read(self, pool, &placement);\n"
            "                self.count_reserved(whole_page, placement.size);",
            "let value = read(self, pool, &placement);\n                let _ = whole_page;",
        ),
        (
            "src/management/release.rs",
            "    let released = pool.release_with(storage, slot)?;\n"
            "    counters.released(\n"
            "        released.size,\n"
            "        released.extent,\n"
            "        whole_page,\n"
            "        &mut storage.counters,\n"
            "    );",
            "    let _ = pool.release_with(storage, slot)?;\n    let _ = (counters, whole_page);",
        ),
    ],
    "pool books": [
        (
            "src/pool/virtual_pages.rs",
            "        self.books.usage.remove(block.size, block.extent);\n",
            "",
        ),
        (
            "src/pool/virtual_pages.rs",
            "        self.books.usage.add(size, extent);\n"
            "        self.books.stats.allocated(size, &self.books.usage);\n",
            "",
        ),
    ],
    "granule books": [
        (
            "src/pool/virtual_pages.rs",
            "        self.chunks.uncover(arena, block.offset, block.extent);\n",
            "",
        ),
        (
            "src/pool/virtual_pages.rs",
            "let missing = self.chunks.claim(arena, block.offset, block.extent);",
            "let missing = 0;",
        ),
    ],
}

# What each part is, for the report.
PARTS: dict[str, str] = {
    "statistics": "memory management's PyTorch-style statistics (`stats.rs`' `Counters`: "
    "live reservations, requested and allocated bytes with their peaks and totals, the "
    "inactive peaks' low-water mark)",
    "pool books": "the pool's usage and high-water marks (`Books`: allocations, bytes in "
    "use and padding, the largest allocation, the bytes-in-use peak)",
    "granule books": "the granule books (`pool/chunks`' claim and uncover: which granules "
    "live blocks touch) and so every map and unmap call",
}

# The builds: a name and the parts removed.
VARIANTS: list[tuple[str, list[str]]] = [
    ("as built", []),
    ("without statistics", ["statistics"]),
    ("without pool books", ["pool books"]),
    ("without granule books", ["granule books"]),
    ("without all three", ["statistics", "pool books", "granule books"]),
]

# Steps per round of each workload (as `benches/run_all.sh`' interleaved loops).
STEPS = {"fifo": 1_000_000, "steady": 100_000}


class EditMismatch(Exception):
    """An edit whose text is not in its file exactly once."""


def edited(text: str, path: str, part: str, old: str, new: str) -> str:
    """``text`` with ``old`` replaced by ``new``; ``old`` must occur exactly once."""
    count = text.count(old)
    if count != 1:
        first = old.strip().splitlines()[0]
        raise EditMismatch(
            f"{path}: the edit removing the {part} expects {first!r} once, found it "
            f"{count} times (update EDITS in benches/books_split.py)"
        )
    return text.replace(old, new)


def edit_texts(root: Path, parts: list[str]) -> dict[Path, tuple[str, str]]:
    """Each file the edits of ``parts`` change under ``root``: its text, and its text
    with them (applied in turn), changing nothing on disk."""
    texts: dict[Path, tuple[str, str]] = {}
    for part in parts:
        for path, old, new in EDITS[part]:
            file = root / path
            original, text = texts.get(file) or (file.read_text(),) * 2
            texts[file] = (original, edited(text, path, part, old, new))
    return texts


def apply(root: Path, parts: list[str]) -> dict[Path, str]:
    """Applies the edits of ``parts`` under ``root``; returns each file's original text."""
    texts = edit_texts(root, parts)
    for file, (_, text) in texts.items():
        file.write_text(text)
    return {file: original for file, (original, _) in texts.items()}


def check(root: Path = ROOT) -> None:
    """Checks that every edit matches the source under ``root`` exactly once (each
    part's edits in turn, as a build applies them), changing nothing."""
    for part in EDITS:
        edit_texts(root, [part])


def tracked_files(root: Path) -> list[str]:
    """The working tree's files git tracks or would (untracked, not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return [name for name in listed.split("\0") if name and (root / name).is_file()]


def copy_tree(root: Path, dest: Path) -> None:
    """Copies the working tree's files to ``dest`` (emptied first), each stamped now:
    cargo tells a changed source by its modification time, so a copy keeping the
    original's older time would pass for the last build's source, and the first build
    would reuse that build (the last variant of an earlier run)."""
    if dest.exists():
        shutil.rmtree(dest)
    for name in tracked_files(root):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / name, target)


def build(tree: Path, target: Path, parts: list[str], out: Path) -> None:
    """Builds ``peer_loops`` in release with ``parts`` removed, to ``out``."""
    originals = apply(tree, parts)
    try:
        env = dict(os.environ, CARGO_TARGET_DIR=str(target))
        built = subprocess.run(
            ["cargo", "build", "--quiet", "--release", "--example", "peer_loops"],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
        )
        if built.returncode != 0:
            # The removed part's helpers go unused; only a failed build's output shows.
            raise RuntimeError(f"building without {parts}: {built.stderr}")
        shutil.copy2(target / "release" / "examples" / "peer_loops", out)
    finally:
        for file, text in originals.items():
            file.write_text(text)


def distinct(binaries: dict[str, Path]) -> None:
    """Checks that no two builds are the same binary: each removes something, so a
    build that equals another was not rebuilt."""
    seen: dict[bytes, str] = {}
    for name, binary in binaries.items():
        digest = hashlib.sha256(binary.read_bytes()).digest()
        if digest in seen:
            raise RuntimeError(f"the builds {seen[digest]!r} and {name!r} are the same binary")
        seen[digest] = name


def run_loops(binary: Path, workload: str, rounds: int) -> dict[str, float]:
    """One interleaved run of ``workload`` on storage without bytes: each peer's best
    round in ns per step."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "loops.json"
        subprocess.run(
            [
                str(binary),
                "--no-bytes",
                "--json",
                str(out),
                workload,
                "all",
                str(STEPS[workload]),
                str(rounds),
            ],
            check=True,
            capture_output=True,
        )
        best: dict[str, float] = json.loads(out.read_text())["best_ns"]
        return best


def measure(binaries: dict[str, Path], reps: int, rounds: int) -> dict[str, dict[str, Any]]:
    """Times every build in turn, ``reps`` times: each peer's best of all
    (``best_ns``), and how far its runs' bests ranged (``range_ns``, the noise)."""
    runs: dict[str, dict[str, dict[str, list[float]]]] = {
        name: {workload: {} for workload in STEPS} for name in binaries
    }
    for _ in range(reps):
        for name, binary in binaries.items():
            for workload in STEPS:
                for peer, ns in run_loops(binary, workload, rounds).items():
                    runs[name][workload].setdefault(peer, []).append(ns)
    results: dict[str, dict[str, Any]] = {}
    for name, workloads in runs.items():
        best = {w: {peer: min(ns) for peer, ns in peers.items()} for w, peers in workloads.items()}
        spread = {
            w: {peer: max(ns) - min(ns) for peer, ns in peers.items()}
            for w, peers in workloads.items()
        }
        results[name] = {"best_ns": best, "range_ns": spread}
    return results


def main(argv: list[str] | None = None) -> int:
    """Builds, times and writes the JSON (or only checks the edits)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the edits apply")
    parser.add_argument("--reps", type=int, default=5, help="runs of every build, in turn")
    parser.add_argument("--rounds", type=int, default=8, help="interleaved rounds per run")
    parser.add_argument(
        "--work",
        type=Path,
        default=ROOT / "target" / "books-split",
        help="where the copy, its builds and the binaries go",
    )
    parser.add_argument("--json", type=Path, help="where to write the results")
    args = parser.parse_args(argv)
    try:
        check()
    except EditMismatch as error:
        print(error, file=sys.stderr)
        return 1
    if args.check:
        print(f"books_split: {sum(map(len, EDITS.values()))} edits apply")
        return 0
    tree, bins = args.work / "tree", args.work / "bin"
    copy_tree(ROOT, tree)
    bins.mkdir(parents=True, exist_ok=True)
    binaries: dict[str, Path] = {}
    for name, parts in VARIANTS:
        binaries[name] = bins / name.replace(" ", "-")
        print(f"building {name}", flush=True)
        build(tree, args.work / "target", parts, binaries[name])
    distinct(binaries)
    results = measure(binaries, args.reps, args.rounds)
    result = {
        "storage": "without bytes",
        "reps": args.reps,
        "rounds": args.rounds,
        "steps": STEPS,
        "parts": PARTS,
        "variants": [{"name": name, "removed": parts, **results[name]} for name, parts in VARIANTS],
    }
    for variant in result["variants"]:
        cells = ", ".join(
            f"{workload} {ns['virtual']:.1f} vs {ns['offset']:.1f} ns"
            for workload, ns in variant["best_ns"].items()
        )
        print(f"{variant['name']}: {cells}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
