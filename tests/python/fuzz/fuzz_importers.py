"""Fuzz every trace reader cubepool has, from Python, and keep what breaks one.

    python tests/python/fuzz/fuzz_importers.py [--examples N]

The seeds are the importer corpus (``tests/python/corpus/importers/``: profiler traces,
snapshots, RMM logs) and the trace v1 corpus (``fuzz/corpus/trace_replay/``). Hypothesis
mutates them (truncations, byte changes, insertions, deletions, splices of numbers at
the extremes of 64 bits, gzip on or off) and every input goes the whole way a user's
file goes: :func:`cubepool.load_trace_with_report` (format detection, the importers or
the Rust v1 reader, ``TraceBuilder``), then a replay, then ``convert``'s writer and
the v1 reader again. Only ``TraceFormatError`` and ``TraceSelectionError`` may come out,
and whatever loads must be a valid trace (time order, dense ids, frees of live ids)
that replays and converts to the same events. An input that breaks this is saved as
``tests/python/corpus/importers/crash-<hash>.bin`` and the script fails; add it to the corpus
``MANIFEST.json`` with its expected outcome once fixed.

``tests/python/test_fuzz_smoke.py`` runs the same check on every seed and a few hundred
mutations in the test suite; this script is the long run (about 250 inputs a second
here: ``--examples 3000`` took 12 s, so ``--examples 100000`` takes some 7 minutes).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cubepool
from cubepool._errors import TraceFormatError, TraceSelectionError
from cubepool.importers import import_trace, write_trace_v1

ROOT = Path(__file__).resolve().parents[3]
CORPORA = (
    ROOT / "tests" / "python" / "corpus" / "importers",
    ROOT / "fuzz" / "corpus" / "trace_replay",
)
CRASHES = ROOT / "tests" / "python" / "corpus" / "importers"
# Bounds small enough that no mutant costs more than a moment.
LIMITS = {"max_bytes": 1 << 22, "max_events": 50_000}
EXTREMES = (b"0", b"-1", b"18446744073709551615", b"18446744073709551616", b"1e308", b"NaN")


def seeds() -> list[bytes]:
    """Every seed file's bytes, in a stable order."""
    files = sorted(
        f
        for corpus in CORPORA
        for f in corpus.iterdir()
        if f.is_file() and f.name not in ("MANIFEST.json", "README.md")
    )
    return [f.read_bytes() for f in files]


def mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    """Apply ``edits`` (kind, position, value) to ``data``."""
    buf = bytearray(data)
    for kind, pos, value in edits:
        pos = pos % (len(buf) + 1)
        if kind == 0:
            del buf[pos:]
        elif kind == 1 and buf:
            buf[min(pos, len(buf) - 1)] = value
        elif kind == 2:
            buf.insert(pos, value)
        elif kind == 3:
            del buf[pos : pos + 1 + value % 16]
        else:
            buf[pos:pos] = EXTREMES[value % len(EXTREMES)]
    return bytes(buf)


def check(data: bytes, directory: Path) -> str:
    """Run ``data`` the whole way a trace file goes; return ``"ok"`` or the refusal's
    class. Raises AssertionError (or any other exception) on a bug."""
    path = directory / "input"
    path.write_bytes(data)
    try:
        trace, report = cubepool.load_trace_with_report(path, strict=False, **LIMITS)
    except (TraceFormatError, TraceSelectionError) as exc:
        assert str(exc), "an error names its problem"
        return type(exc).__name__
    events = trace.events()
    times = [e[0] for e in events]
    assert times == sorted(times), "events are in time order"
    result = cubepool.replay(trace, samples=8)
    assert result.peak_live == trace.peak_live
    assert len(result.timeline) <= 8
    if report is not None:
        # What loaded converts to v1 and reads back to the same events.
        imported = import_trace(path, strict=False, **LIMITS)
        out = directory / "out.jsonl"
        write_trace_v1(imported, out)
        assert cubepool.load_trace(out).events() == events
    return "ok"


def save_crash(data: bytes) -> Path:
    """Keep a crashing input in the importer corpus."""
    path = CRASHES / f"crash-{hashlib.sha256(data).hexdigest()[:16]}.bin"
    path.write_bytes(data)
    return path


SEEDS = seeds()
inputs = st.builds(
    lambda seed, edits, compress: (
        gzip.compress(mutate(seed, edits), mtime=0) if compress else mutate(seed, edits)
    ),
    st.sampled_from(SEEDS),
    st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 1 << 20), st.integers(0, 255)), max_size=6
    ),
    st.booleans(),
)


def fuzz(examples: int) -> None:
    """Run ``examples`` mutated inputs through :func:`check`, saving the first crash."""

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(inputs)
    def run(data: bytes) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                check(data, Path(tmp))
            except Exception:
                print(f"crash saved to {save_crash(data)}", file=sys.stderr)
                raise

    run()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=2_000, help="mutated inputs to run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        outcomes = [check(seed, Path(tmp)) for seed in SEEDS]
    print(f"{len(SEEDS)} seeds: {outcomes.count('ok')} load, the rest are refused")
    fuzz(args.examples)
    print(f"{args.examples} mutated inputs: no crash")
    return 0


if __name__ == "__main__":
    sys.exit(main())
