"""A port of TVM's ``tests/python/disco/test_callback.py`` (apache/tvm) to cubepool.disco.

TVM's test builds ``transform_params`` (two TIR slices of the parameters a callback
loads) with its compiler, loads it on two workers with ``load_vm_module``, and calls it
with each worker's rank and the callback that ``tests.disco.test_callback`` made there:
a function that lives in a register on each worker and is passed to another call. The
steps and assertions are TVM's; adapted:

* ``tvm.runtime.disco`` -> ``cubepool.disco``; the workers import TVM's worker module by
  TVM's name (``import_python_module("tvm.exec.disco_worker")``), which is
  :mod:`cubepool.disco.testing` here, and ``tests.disco.test_callback`` is its.
* ``init_ccl("nccl", ...)`` -> ``"cpuccl"`` (cubepool's collectives are on host memory);
  the parameters are on ``cpu``, not ``cuda(0)``: TVM's ``tvm.cpu()`` is
  ``cubepool.Device("cpu", 0)``, what ``.device`` of a tensor copied back gives.
* ``transform_params`` is ``tests.disco.transform_params`` of ``disco_helpers``, the same
  slices in Python, since ``load_vm_module`` needs TVM's compiler; that
  ``load_vm_module`` says so is checked too.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import cubepool
from cubepool import disco

TESTS = Path(__file__).parent


def test_callback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Simulate lazy loading of parameters in a callback."""
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(p for p in [str(TESTS), os.environ.get("PYTHONPATH")] if p)
    )
    num_shards = 2
    session = disco.ProcessSession(num_workers=num_shards, entrypoint="cubepool.disco")
    try:
        session.import_python_module("tvm.exec.disco_worker")
        session.import_python_module("disco_helpers")
        session.init_ccl("cpuccl", *range(num_shards))

        worker_device = session.get_global_func("runtime.disco.device")()
        worker_id = session.get_global_func("runtime.disco.worker_rank")()
        callback_maker = session.get_global_func("tests.disco.test_callback")
        fget_item = callback_maker(worker_device)
        shlib_path = tmp_path / "libtemp.so"
        with pytest.raises(disco.DiscoUnsupported, match="TVM's compiler"):
            session.load_vm_module(shlib_path.as_posix())
        transform_params = session.get_global_func("tests.disco.transform_params")

        params = transform_params(worker_id, fget_item)

        params_gpu0 = params.debug_get_from_remote(0)
        assert params_gpu0[0].device == cubepool.Device("cpu", 0)
        assert params_gpu0[1].device == cubepool.Device("cpu", 0)
        np.testing.assert_array_equal(
            params_gpu0[0].numpy(),
            [
                [0, 1, 2, 3],
                [4, 5, 6, 7],
            ],
        )
        np.testing.assert_array_equal(
            params_gpu0[1].numpy(),
            [[0], [2]],
        )

        params_gpu1 = params.debug_get_from_remote(1)
        assert params_gpu1[0].device == cubepool.Device("cpu", 0)
        assert params_gpu1[1].device == cubepool.Device("cpu", 0)
        np.testing.assert_array_equal(
            params_gpu1[0].numpy(),
            [
                [8, 9, 10, 11],
                [12, 13, 14, 15],
            ],
        )
        np.testing.assert_array_equal(
            params_gpu1[1].numpy(),
            [[1], [3]],
        )
        assert params_gpu1[0].dtype == np.int32
        assert params_gpu1[1].dtype == np.float32
    finally:
        session.shutdown()
