"""cubepool.sweep on a real Dask cluster (skipped when ``distributed`` is not installed)."""

from __future__ import annotations

import pytest

import cubepool

distributed = pytest.importorskip("distributed")


def test_sweep_on_a_local_dask_cluster() -> None:
    trace = cubepool.load_trace(cubepool.examples.path("transformer-train"))
    planned = cubepool.plan(trace).config
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        result = cubepool.sweep(
            {"loaded": trace, "bundled": "gpt2-train"},
            ["default", ("planned", planned)],
            client.get_executor(),
        )
        # The replays ran on the cluster's worker processes.
        assert len(client.scheduler_info()["workers"]) == 2
    grid = result.pivot()
    assert set(grid) == {"loaded", "bundled"}
    assert grid["loaded"]["planned"] >= 0.95
    assert grid["loaded"]["default"] == pytest.approx(cubepool.replay(trace).utilization)
