"""Issue 32 on a GPU: device memory through CUDA's virtual-memory calls, DLPack round
trips with torch and cupy, bytes intact after other handles' unmaps. Marked ``gpu``:
skipped without a CUDA driver and device (``scripts/gpu-check`` runs them on one)."""

from __future__ import annotations

import gc
import subprocess
import sys
from typing import Any

import pytest

import cubepool
from cubepool import DeviceUnavailable, MemoryManagement

MIB = 1 << 20


def _gpu_reason() -> str | None:
    try:
        cubepool.cuda_memory_info("cuda:0")
    except DeviceUnavailable as error:
        return str(error)
    return None


_NO_GPU = _gpu_reason()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_NO_GPU is not None, reason=f"no CUDA GPU: {_NO_GPU}"),
]


def _free_bytes() -> int:
    return cubepool.cuda_memory_info("cuda:0")[0]


def test_maps_and_unmaps_change_what_the_device_reports() -> None:
    mm = MemoryManagement(device="cuda:0")
    assert mm.device == "cuda:0"
    before = _free_bytes()
    handle = mm.reserve(256 * MIB)
    during = _free_bytes()
    assert before - during >= 256 * MIB, (before, during)
    # Reports and statistics read the device's pools as they read the host's.
    assert mm.memory_stats()["reserved_bytes.all.current"] >= 256 * MIB
    assert mm.memory_usage().bytes_in_use == 256 * MIB
    mm.check_invariants()
    handle.release()
    mm.cleanup()
    after = _free_bytes()
    assert after - during >= 256 * MIB, (during, after)


def test_the_buffer_protocol_refuses_device_memory() -> None:
    handle = MemoryManagement(device="cuda:0").reserve(4096)
    assert handle.__dlpack_device__() == (2, 0)
    with pytest.raises(BufferError, match=r"cuda:0.*dlpack"):
        memoryview(handle)


def test_torch_sees_the_same_bytes() -> None:
    torch: Any = pytest.importorskip("torch")
    mm = MemoryManagement(device="cuda:0")
    handle = mm.reserve(MIB)
    first = torch.from_dlpack(handle)
    assert first.device.type == "cuda"
    assert first.numel() == MIB
    first.fill_(7)
    second = torch.from_dlpack(handle)
    assert second.data_ptr() == first.data_ptr()
    torch.cuda.synchronize()
    assert int(second[MIB - 1]) == 7


def test_cupy_sees_the_same_bytes() -> None:
    cupy: Any = pytest.importorskip("cupy")
    mm = MemoryManagement(device="cuda:0")
    handle = mm.reserve(MIB)
    array = cupy.from_dlpack(handle)
    array[:] = 3
    again = cupy.from_dlpack(handle)
    assert again.data.ptr == array.data.ptr
    assert int(again[-1]) == 3


def test_bytes_stay_intact_after_other_handles_unmap() -> None:
    torch: Any = pytest.importorskip("torch")
    mm = MemoryManagement(device="cuda:0")
    keep = mm.reserve(64 * MIB)
    others = [mm.reserve(32 * MIB) for _ in range(8)]
    pattern = torch.arange(64 * MIB, dtype=torch.int64, device="cuda") % 251
    kept = torch.from_dlpack(keep)
    kept.copy_(pattern.to(torch.uint8))
    mapped = mm.memory_usage().bytes_reserved
    for handle in others:
        handle.release()
    mm.cleanup()
    gc.collect()
    assert mm.memory_usage().bytes_reserved < mapped, "the others' granules were unmapped"
    torch.cuda.synchronize()
    assert torch.equal(kept, pattern.to(torch.uint8))


_TORCH_RUN = """
import cubepool.torch
cubepool.torch.use("default")
import torch
with cubepool.torch.record("fresh") as run:
    x = torch.ones(1 << 20, device="cuda")
    y = (x * 2).sum()
    assert int(y) == 2 << 20
    stats = cubepool.torch.memory_stats()
    assert stats["allocated_bytes.all.current"] >= 4 << 20, stats
    del x
    torch.cuda.synchronize()
assert run.trace is not None and len(run.trace) >= 2
state = cubepool.torch.state()
assert state["errors"] == {}, state
print("predicted", cubepool.torch.predict(run.trace).peak_reserved)
"""


def test_torch_allocator_in_a_fresh_process() -> None:
    pytest.importorskip("torch")
    done = subprocess.run(
        [sys.executable, "-c", _TORCH_RUN], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "predicted" in done.stdout
