"""Regression tests for memory-safety and liveness rules found in review."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import cubepool


def run_isolated(code: str) -> subprocess.CompletedProcess[str]:
    """Runs `code` in a fresh interpreter with a timeout, so a hang or crash fails the test."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_bind_refuses_a_handle_of_another_memory_management() -> None:
    mm1, mm2 = cubepool.MemoryManagement(), cubepool.MemoryManagement()
    h = mm1.handle()
    with pytest.raises(cubepool.InvalidArgument, match="another MemoryManagement"):
        mm2.bind(h, 1 << 20)
    del mm2
    gc.collect()
    mm1.bind(h, 64)
    memoryview(h)[:8] = b"AAAAAAAA"


def test_a_finalizer_using_the_memory_management_during_an_error_does_not_deadlock() -> None:
    proc = run_isolated(
        """
        import gc, cubepool
        mm = cubepool.MemoryManagement()
        class D:
            def __del__(self):
                mm.memory_usage()
        for _ in range(50):
            a = D(); a.self = a; del a
            gc.set_threshold(1)
            try:
                mm.reserve(1 << 62)
            except cubepool.CubepoolError:
                pass
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_threads_and_finalizers_do_not_deadlock() -> None:
    proc = run_isolated(
        """
        import gc, sys, threading, cubepool
        sys.setswitchinterval(1e-6)
        mm = cubepool.MemoryManagement()
        class D:
            def __del__(self):
                sum(range(100))
        def errors():
            for _ in range(300):
                a = D(); a.self = a; del a
                try:
                    mm.reserve(1 << 62)
                except cubepool.CubepoolError:
                    pass
        def usage():
            for _ in range(3000):
                mm.memory_usage()
        gc.set_threshold(1)
        threads = [threading.Thread(target=errors), threading.Thread(target=usage)]
        for t in threads: t.start()
        for t in threads: t.join()
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stderr


def test_an_unbound_handle_cannot_be_cloned_or_bound_twice() -> None:
    mm = cubepool.MemoryManagement()
    h = mm.handle()
    with pytest.raises(cubepool.InvalidArgument, match="not bound"):
        h.clone()
    mm.bind(h, 64)
    with pytest.raises(cubepool.InvalidArgument, match="already bound"):
        mm.bind(h, 64)
    failure = mm.launch("k", writes=[h], fail="x")
    keep = h.clone()
    del keep
    claim = mm.claim(h)
    assert claim is not None and claim.failure == failure


class LyingSequence:
    """Claims an enormous length (pyo3 would size a Vec by it)."""

    def __len__(self) -> int:
        return 2**40

    def __getitem__(self, index: int) -> int:
        raise IndexError


def test_a_sequence_lying_about_its_length_is_an_error_not_an_abort() -> None:
    proc = run_isolated(
        """
        import cubepool
        class Liar:
            def __len__(self): return 2**40
            def __getitem__(self, i): raise IndexError
        t = cubepool.empty(Liar())
        assert t.shape == (), t.shape
        class Stream:
            def read(self, n): return Liar()
        try:
            cubepool.load_tensor(Stream())
        except TypeError as e:
            print("ok", e)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok")


@pytest.mark.parametrize(
    "properties",
    [
        {"max_page_size": 1 << 26, "alignment": 1 << 26},
        {"max_page_size": 1 << 63, "alignment": 1 << 62},
    ],
)
def test_extreme_device_properties_give_errors_not_panics(properties: dict[str, int]) -> None:
    props = cubepool.MemoryDeviceProperties(**properties)
    for config in (
        cubepool.MemoryConfiguration.sub_slices(),
        cubepool.MemoryConfiguration.exclusive_pages(),
        cubepool.MemoryConfiguration.custom(
            [cubepool.MemoryPoolOptions(cubepool.PoolType.sliced_pages(1, 1, 4))]
        ),
    ):
        config.pools(props)
        mm = cubepool.MemoryManagement(config, props)
        with pytest.raises(cubepool.CubepoolError):
            mm.reserve(1 << 62)


def test_reports_read_back_from_data_do_not_overflow() -> None:
    data = cubepool.MemoryManagement().memory_report().to_dict()
    data["persistent"]["usage"]["bytes_in_use"] = 2**64 - 1
    data["dynamic"][0]["usage"]["bytes_in_use"] = 2**64 - 1
    report = cubepool.MemoryReport.from_dict(data)
    assert report.usage.bytes_in_use == 2**64 - 1
    assert "MemoryReport" in repr(report)
    assert str(report)


def test_a_report_without_pools_gives_a_typed_error_for_its_layout() -> None:
    data = cubepool.MemoryManagement().memory_report().to_dict()
    data["dynamic"] = []
    with pytest.raises(cubepool.PoolConfigError):
        cubepool.MemoryReport.from_dict(data).configuration()


def test_pickled_layouts_are_equal() -> None:
    import pickle

    from cubepool.layouts import from_spec, to_spec

    config = cubepool.MemoryConfiguration.custom(
        [cubepool.MemoryPoolOptions(cubepool.PoolType.sliced_pages(1000, 1000, 1024))]
    )
    assert pickle.loads(pickle.dumps(config)) == config
    assert from_spec(to_spec(config)) == config


def test_extreme_importer_times_are_a_trace_format_error(tmp_path: pytest.TempPathFactory) -> None:
    import pickle
    from pathlib import Path

    snapshot = {
        "segments": [],
        "device_traces": [
            [
                {"action": "alloc", "addr": 1, "size": 10, "time_us": -4e18, "stream": 0},
                {"action": "alloc", "addr": 2, "size": 10, "time_us": 4e18, "stream": 0},
            ]
        ],
    }
    path = Path(str(tmp_path)) / "snapshot.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    with pytest.raises(cubepool.TraceFormatError):
        cubepool.load_trace(path)


def test_handles_dropped_on_many_threads_are_all_given_back() -> None:
    # Dropped handles are buried in a GIL-guarded list and given back by the next
    # operation of any thread; switching threads as often as possible interleaves
    # burying, giving back and reserving.
    proc = run_isolated(
        """
        import sys, threading, cubepool
        sys.setswitchinterval(1e-6)
        mm = cubepool.MemoryManagement()
        def work(seed):
            kept = []
            for i in range(3000):
                h = mm.reserve(64 + (seed * 7919 + i * 104729) % 70000)
                memoryview(h)[:1] = b"x"
                if i % 5 == 0:
                    kept.append(h.clone())
                if i % 7 == 0 and kept:
                    kept.pop(0).release()
                del h
        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        usage = mm.memory_usage()
        assert usage.number_allocs == 0, usage
        mm.check_invariants()
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def _overcommit_mode() -> str:
    try:
        return Path("/proc/sys/vm/overcommit_memory").read_text().strip()
    except OSError:
        return "unknown"


@pytest.mark.skipif(
    _overcommit_mode() not in ("0", "2"),
    reason="only a Linux host that checks overcommit refuses memory it does not have",
)
def test_a_reserve_past_the_hosts_memory_is_out_of_memory_not_a_killed_process() -> None:
    """The default layout maps host memory through the overcommit check, as numpy.empty's
    memory goes: 1 TiB on a host with less raises OutOfMemory (a writable view of it
    used to be handed out, and writing it ended the process), and what was reserved
    before is intact."""
    meminfo = Path("/proc/meminfo").read_text()
    total = sum(
        int(line.split()[1]) * 1024
        for line in meminfo.splitlines()
        if line.startswith(("MemTotal:", "SwapTotal:"))
    )
    if total >= 2**40:
        pytest.skip("the host has a TiB of memory and swap")
    mm = cubepool.MemoryManagement()
    kept = mm.reserve(4096)
    memoryview(kept)[:4] = b"kept"
    with pytest.raises(cubepool.OutOfMemory, match=r"1\.0 TiB"):
        mm.reserve(2**40)
    assert bytes(memoryview(kept)[:4]) == b"kept"
    again = mm.reserve(1 << 20)
    assert again.size == 1 << 20


@pytest.mark.parametrize("layout", ["exclusive_pages", "sub_slices", "virtual_pages"])
def test_a_fresh_reservation_does_not_show_what_the_process_freed(layout: str) -> None:
    """Pages a pool takes from the host read as zeros: a new reservation never shows the
    bytes of an object the process freed (an exclusive page showed a freed bytearray's)."""
    mm = cubepool.MemoryManagement(layout)
    for size in (5200, 3 << 20):
        secret = bytearray(b"SECRET-TOKEN-" * (size // 13))
        del secret
        handles = [mm.reserve(size) for _ in range(4)]
        for handle in handles:
            assert bytes(memoryview(handle)).count(b"SECRET-TOKEN-") == 0
