"""The restricted unpickler's budget of objects, and memory running out while it builds.

A pickle can build an object with every byte (``]``, ``}``): 10 MiB of ``]`` in a 10 KB
gzip took 950 MB, and under a memory limit the process aborted or hung. The unpickler
now builds at most one object for every two bytes of pickle (and a snapshot import at
most ``OBJECTS_PER_ENTRY`` for each entry ``max_events`` allows), and memory running out
is a ``MemoryError`` it raises, not a panic (``src/python/unpickle.rs``).
"""

from __future__ import annotations

import gzip
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from cubepool._errors import TraceFormatError
from cubepool._pickle import OBJECTS_PER_ENTRY, restricted_loads
from cubepool.importers import import_trace

_HEAD = b"\x80\x04}(\x8c\rdevice_traces]\x8c\x04junk("
"""A snapshot's dict, its device traces, and a list under ``junk`` to fill."""


def _lists_snapshot(path: Path, mib: int) -> Path:
    """A gzip of a snapshot holding ``mib`` MiB of ``]``: an empty list a byte."""
    with gzip.open(path, "wb", 6) as out:
        out.write(_HEAD)
        for _ in range(mib):
            out.write(b"]" * (1 << 20))
        out.write(b"lu.")
    return path


_PROBE = """
import resource, sys
from pathlib import Path
from cubepool._pickle import restricted_loads
from cubepool.importers import import_trace
from cubepool.importers.limits import Limits

path, kwargs, how, limit = sys.argv[1], eval(sys.argv[2]), sys.argv[3], int(sys.argv[4])
# The pickle read first where it is unpickled alone, so that the limit falls on the load.
data = Path(path).read_bytes() if how == "loads" else b""
if limit:
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + limit, mapped + limit))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    if how == "loads":
        restricted_loads(data, path=path, limits=Limits(path, None, None))
    else:
        import_trace(path, **kwargs)
except Exception as exc:
    print(type(exc).__name__, exc)
print("grew", (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)
"""


def _in_child(
    path: Path, kwargs: str = "{}", *, how: str = "import", limit: int = 0
) -> tuple[str, int]:
    """What importing ``path`` (``how="import"``) or unpickling it alone (``"loads"``)
    printed in a child process, and by how many bytes its peak resident memory grew;
    under an address-space limit of ``limit`` more bytes than the child has mapped
    before, where given."""
    child = subprocess.run(
        [sys.executable, "-c", _PROBE, str(path), kwargs, how, str(limit)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    *lines, grew = child.stdout.splitlines()
    return "\n".join(lines), int(grew.split()[1])


def test_a_pickle_of_empty_lists_is_refused_before_it_takes_90_times_its_size(
    tmp_path: Path,
) -> None:
    # 10 MiB of `]`: 5 million lists built (36 bytes per byte of pickle measured, peak
    # 420 MB) where the pickle was all built first (88 bytes a byte, 950 MB).
    path = _lists_snapshot(tmp_path / "lists.pickle.gz", 10)
    printed, grew = _in_child(path)
    assert printed.startswith("TraceFormatError"), printed
    assert "the pickle builds more than 5242895 objects, one for every 2 of its" in printed
    assert grew < 50 * (10 << 20), grew


def test_the_import_bounds_the_objects_by_its_bound_on_entries(tmp_path: Path) -> None:
    # 10,000 entries allowed: 160,000 objects at most, some 10 MB, for a pickle whose
    # size alone would allow 5 million.
    path = _lists_snapshot(tmp_path / "lists.pickle.gz", 10)
    printed, grew = _in_child(path, "{'max_events': 10_000}")
    assert printed.startswith("TraceFormatError"), printed
    assert "more than max_events=10,000 entries' worth of objects" in printed
    assert f"more than {10_000 * OBJECTS_PER_ENTRY:,}" in printed
    # The pickle's bytes (decompressed, then as bytes) and the 160,000 lists.
    assert grew < 6 * (10 << 20), grew


def test_a_small_snapshot_of_deep_distinct_stacks_loads_under_a_lowered_bound(
    tmp_path: Path,
) -> None:
    """Each distinct frame builds four objects (its dict, two strs, an int), so 20
    entries of 30 frames each build some 2,600: past 16 for each of ``max_events=40``
    (640), and refused there although the file holds half as many entries as allowed
    (helper-136's find). The objects a bound on entries allows are never fewer than any
    pickle may build (65,536)."""
    entries = [
        {
            "action": "alloc",
            "addr": 0x1000 * (i + 1),
            "size": 64,
            "stream": 0,
            "time_us": i,
            "frames": [
                {"filename": f"m{i}_{k}.py", "line": k, "name": f"f{i}_{k}"} for k in range(30)
            ],
        }
        for i in range(20)
    ]
    path = tmp_path / "deep.pickle"
    path.write_bytes(pickle.dumps({"device_traces": [entries], "segments": []}))
    imported = import_trace(path, max_events=40)
    assert len(imported.events) == 20 and len(imported.trace.frames(0) or []) == 30


@pytest.mark.parametrize(
    ("name", "opcodes"),
    [
        # The marks grow as a vector of their own: `try_reserve` fails.
        ("marks", b"(" * (64 << 20)),
        # One str of 160 MiB: CPython's constructor returns NULL (PyO3's panicked).
        ("string", b"\x8d" + (160 << 20).to_bytes(8, "little") + b"x" * (160 << 20)),
        # 12 million lists within the budget (two bytes each): a list or the stack
        # fails.
        ("lists", b"(" + b"]\x94" * (12 << 20) + b"l"),
    ],
)
def test_running_out_of_memory_is_a_typed_error(tmp_path: Path, name: str, opcodes: bytes) -> None:
    # Under an address-space limit of 96 MiB more than the child maps with the pickle
    # read: it aborted (a vector's growth failing) or panicked and hung (a constructor
    # given NULL).
    path = tmp_path / f"{name}.pickle"
    path.write_bytes(b"\x80\x04" + opcodes + b".")
    printed, _ = _in_child(path, how="loads", limit=96 << 20)
    assert printed.startswith("TraceFormatError"), printed
    assert "ran out of memory importing the file" in printed


def test_the_reviewers_repro_under_a_memory_limit_is_a_typed_error(tmp_path: Path) -> None:
    # 20 MiB of `]` under ~1.5 GB of address space aborted the process (SIGABRT), 60 MiB
    # under ~3 GB panicked and hung; both now end in a TraceFormatError, refused by the
    # budget or out of memory, whichever comes first.
    path = _lists_snapshot(tmp_path / "lists.pickle.gz", 60)
    printed, _ = _in_child(path, limit=512 << 20)
    assert printed.startswith("TraceFormatError"), printed
    assert "builds more than" in printed or "ran out of memory" in printed


def test_a_pickle_python_writes_is_never_past_the_budget() -> None:
    # Python's pickler spends two bytes at least on each object it has an unpickler
    # build (an opcode and the memo's), so the densest pickles it writes still load.
    dense: list[object] = [
        [[] for _ in range(100_000)],
        [{} for _ in range(100_000)],
        [(i,) for i in range(257, 100_257)],
        list(range(257, 100_257)),
        [str(i % 10) * 2 for i in range(100_000)],
    ]
    for obj in dense:
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            data = pickle.dumps(obj, protocol=protocol)
            assert restricted_loads(data) == obj, (protocol, len(data))


def test_the_budget_is_one_object_for_every_two_bytes_and_at_least_65536() -> None:
    # Hand-written, one byte a list: 65,535 lists and the list of them load whatever
    # the size ...
    assert len(restricted_loads(b"\x80\x04(" + b"]" * 65_535 + b"l.")) == 65_535  # type: ignore[arg-type]
    # ... one more does not, refused before it is built ...
    with pytest.raises(TraceFormatError, match="builds more than 65536 objects"):
        restricted_loads(b"\x80\x04(" + b"]" * 65_536 + b"l.")
    # ... and past that, half the pickle's bytes, padded with `N0` (None, popped: no
    # object built): n + 1 objects in 2n + 5 bytes load, in 2n - 1 bytes do not.
    n = 100_000
    lists = b"\x80\x04(" + b"]" * n + b"l"
    assert len(restricted_loads(lists + b"N0" * (n // 2) + b".")) == n  # type: ignore[arg-type]
    with pytest.raises(TraceFormatError, match=f"builds more than {n - 1} objects"):
        restricted_loads(lists + b"N0" * (n // 2 - 3) + b".")


def test_memo_copies_and_singletons_are_not_counted() -> None:
    # A million references to one list, a million None and small ints: nothing built.
    data = b"\x80\x04]\x94(" + b"h\x00NK\x07\x88" * 250_000 + b"l."
    assert len(restricted_loads(data)) == 1_000_000  # type: ignore[arg-type]


def test_snapshots_still_load_identically(tmp_path: Path) -> None:
    # Snapshot-shaped pickles build one object for every 7.6 bytes or more (the corpus;
    # 9 or more at scale): well inside one for every 2.
    frames = [{"filename": f"m{k}.py", "line": 300 + k, "name": f"f{k}"} for k in range(50)]
    entries = [
        {
            "action": "alloc" if i % 2 == 0 else "free_completed",
            "addr": 0x7F00_0000_0000 + 0x1000 * (i // 2),
            "size": 512 << (i % 7),
            "stream": 0,
            "time_us": 1_700_000_000_000_000 + i,
            "frames": frames[i % 13 : i % 13 + 8],
            "compile_context": "N/A",
            "user_metadata": "",
        }
        for i in range(40_000)
    ]
    doc = {"segments": [], "device_traces": [entries], "allocator_settings": {}}
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        data = pickle.dumps(doc, protocol=protocol)
        assert restricted_loads(data) == pickle.loads(data)
        path = tmp_path / f"p{protocol}.pickle"
        path.write_bytes(data)
        trace = import_trace(path, max_events=40_000)
        assert len(trace.trace) == 40_000
    corpus = Path(__file__).parent / "corpus" / "importers"
    for name in ("snapshot_two_devices.pickle", "snapshot_live_before.pickle"):
        data = (corpus / name).read_bytes()
        assert restricted_loads(data) == pickle.loads(data)
