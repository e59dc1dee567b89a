"""Tensors backed by a real MemoryManagement (cubepool.empty(..., memory=mm))."""

from __future__ import annotations

import gc

import numpy as np

import cubepool


def test_empty_reserves_from_the_memory_management() -> None:
    mm = cubepool.MemoryManagement()
    t = cubepool.empty((16, 16), "float32", memory=mm)
    assert t.nbytes == 1024
    assert mm.memory_usage().bytes_in_use == 1024
    a = np.asarray(t)
    a[:] = 3.0
    assert np.asarray(t)[5, 5] == 3.0
    assert t.data_ptr() % 64 == 0
    del a, t
    gc.collect()
    assert mm.memory_usage().bytes_in_use == 0


def test_a_tensor_outlives_its_memory_management() -> None:
    mm = cubepool.MemoryManagement()
    t = cubepool.empty((8,), "int64", memory=mm)
    np.asarray(t)[:] = np.arange(8)
    del mm
    gc.collect()
    assert np.asarray(t).tolist() == list(range(8))


def test_views_of_a_managed_tensor_keep_it_reserved() -> None:
    mm = cubepool.MemoryManagement()
    t = cubepool.empty((4, 4), "float32", memory=mm)
    view = cubepool.create_view(t, (16,), "float32")
    del t
    gc.collect()
    assert mm.memory_usage().bytes_in_use == 64
    np.asarray(view)[:] = 1.0
    del view
    gc.collect()
    assert mm.memory_usage().bytes_in_use == 0
