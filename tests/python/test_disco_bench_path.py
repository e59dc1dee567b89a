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
