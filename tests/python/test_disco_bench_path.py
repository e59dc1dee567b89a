"""benches/python/bench_disco_path.py runs both sides (its callgrind figures are in the
README): a worker's command path and the controller's, a few commands each; and
benches/python/bench_disco_split.py prints each kind of round."""

from __future__ import annotations

import importlib.util
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from cubepool import disco

BENCH = Path(__file__).resolve().parents[2] / "benches" / "python" / "bench_disco_path.py"


@pytest.mark.parametrize("side", ["worker", "controller"])
def test_bench_disco_path_runs(side: str, capsys: pytest.CaptureFixture[str]) -> None:
    module = runpy.run_path(str(BENCH))
    module[f"{side}_side"](20, True)
    assert f"{side}: " in capsys.readouterr().out
    module[f"{side}_side"](20, False)  # the setup alone prints nothing
    assert capsys.readouterr().out == ""
    with pytest.raises(disco.DiscoError, match="not inside a Disco worker"):
        disco.worker_id()  # this thread is no worker afterwards


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="needs mpi4py")
def test_bench_disco_path_runs_on_mpi() -> None:
    """``--mpi`` (the README's callgrind figures) runs the worker side through the real
    ``MPICommunicator`` on one rank (in a process of its own: MPI starts there)."""
    result = subprocess.run(
        [
            *(sys.executable, str(BENCH), "--side", "worker", "--mpi"),
            *("--elements", "64", "--count", "20"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert result.stdout.startswith("worker: ") and "over 20" in result.stdout


SPLIT = BENCH.parent / "bench_disco_split.py"


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="needs mpi4py")
def test_bench_disco_split_prints_each_kind_of_round() -> None:
    """benches/python/bench_disco_split.py (its figures are in the README) runs a few
    collectives of each kind and prints where worker 0's time went."""
    result = subprocess.run(
        [sys.executable, str(SPLIT), "--count", "4", "--repeat", "1", "--bytes", "4096"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    lines = result.stdout.splitlines()
    assert lines[0].startswith("# allgather of 4096 bytes, 2 ranks")
    assert [line.split(":")[0] for line in lines[1:]] == ["loop", "disco", "presend"]
    assert "mpi" in lines[1] and "recv" not in lines[1]
    for line in lines[2:]:
        assert "recv" in line and "run outside MPI" in line


#: Run in a fresh process (MPI initialised on one rank, not in the test runner).
_CACHE_SCRIPT = """
import sys
import numpy as np
import cubepool
from cubepool._errors import InvalidArgument
from cubepool.disco.communicator import MPICommunicator
from cubepool.disco.protocol import ReduceKind

comm = MPICommunicator(1)
memory = cubepool.MemoryManagement(name="cache-test")

def tensor(values, dtype="float32"):
    t = cubepool.empty((len(values),), dtype, memory=memory)
    cubepool.copy_from_bytes(t, np.asarray(values, dtype=dtype))
    return t

src, dst = tensor([1, 2, 3, 4]), tensor([0, 0, 0, 0])
comm.allreduce(src, ReduceKind.kSum, True, dst)
assert np.asarray(memoryview(dst)).tolist() == [1, 2, 3, 4]
# The same objects again: the cached operands, new contents.
cubepool.copy_from_bytes(src, np.asarray([5, 6, 7, 8], dtype="float32"))
comm.allreduce(src, ReduceKind.kSum, True, dst)
assert np.asarray(memoryview(dst)).tolist() == [5, 6, 7, 8]
# Other operands are checked again: a size mismatch still raises, and the cached entry
# of the good pair stays usable.
try:
    comm.allreduce(src, ReduceKind.kSum, True, tensor([0, 0, 0]))
except InvalidArgument as exc:
    assert "send is 4 x float32 but recv is 3 x float32" in str(exc), exc
else:
    sys.exit("a mis-sized allreduce after a cached one was not refused")
comm.allreduce(src, ReduceKind.kAvg, True, dst)  # another op: not the cached one
assert np.asarray(memoryview(dst)).tolist() == [5, 6, 7, 8]
comm.allreduce(dst, ReduceKind.kSum, True, dst)  # in place
assert np.asarray(memoryview(dst)).tolist() == [5, 6, 7, 8]
gathered = tensor([0, 0, 0, 0])
comm.allgather(src, True, gathered)
comm.allgather(src, True, gathered)
try:
    comm.allgather(src, True, tensor([0, 0]))
except InvalidArgument:
    pass
else:
    sys.exit("a mis-sized allgather after a cached one was not refused")
# forget() lets go of the operands: the only references left are the script's.
comm.forget()
comm.allreduce(dst, ReduceKind.kSum, True, dst)
before = sys.getrefcount(src)
comm.allgather(src, True, gathered)
held = sys.getrefcount(src)
comm.allreduce(src, ReduceKind.kSum, True, dst)
comm.forget()
assert held > before and sys.getrefcount(src) == before, (before, held)
comm.close()
print("ok")
"""


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="needs mpi4py")
def test_mpi_communicator_reuses_checked_operands_and_forgets_them() -> None:
    """A repeated collective on the same tensors reuses what its checks resolved; other
    operands are checked again; ``forget`` (every ``kKillReg``) drops the references."""
    result = subprocess.run(
        [sys.executable, "-c", _CACHE_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
