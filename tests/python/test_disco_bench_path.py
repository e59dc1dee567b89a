"""benches/python/bench_disco_path.py runs both sides (its callgrind figures are in the
README): a worker's command path and the controller's, a few commands each."""

from __future__ import annotations

import runpy
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
