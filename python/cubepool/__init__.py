"""cubepool: GPU-style memory pools, driven from Python.

Reserve real host memory from CubeCL-style pools (``MemoryManagement``) and see the
bytes without copying (``memoryview(handle)``, ``numpy.frombuffer(handle)``), or replay
a recorded allocation trace through a pool layout (``load_trace``, ``replay``).
"""

from __future__ import annotations

from cubepool import examples
from cubepool._cubepool import (
    EXCLUSIVE_MEMORY_ONLY,
    Claim,
    ErrorGraph,
    FailureId,
    ManagedMemoryBinding,
    ManagedMemoryHandle,
    MemoryConfiguration,
    MemoryDeviceProperties,
    MemoryManagement,
    MemoryPoolKind,
    MemoryPoolOptions,
    MemoryPoolReport,
    MemoryRecord,
    MemoryReport,
    MemoryUsage,
    PoolType,
    ReplayResult,
    Resource,
    SharedMemoryBindings,
    Skipped,
    Trace,
    __version__,
    optimal_align,
)
from cubepool._errors import (
    BufferTooBig,
    CubepoolError,
    HandleReleased,
    InstallMemoryPoolsError,
    InvalidArgument,
    NotFound,
    OutOfMemory,
    PoolCapacityExceeded,
    PoolConfigError,
    TraceFormatError,
)
from cubepool._trace import load_trace, replay

__all__ = [
    "EXCLUSIVE_MEMORY_ONLY",
    "BufferTooBig",
    "Claim",
    "CubepoolError",
    "ErrorGraph",
    "FailureId",
    "HandleReleased",
    "InstallMemoryPoolsError",
    "InvalidArgument",
    "ManagedMemoryBinding",
    "ManagedMemoryHandle",
    "MemoryConfiguration",
    "MemoryDeviceProperties",
    "MemoryManagement",
    "MemoryPoolKind",
    "MemoryPoolOptions",
    "MemoryPoolReport",
    "MemoryRecord",
    "MemoryReport",
    "MemoryUsage",
    "NotFound",
    "OutOfMemory",
    "PoolCapacityExceeded",
    "PoolConfigError",
    "PoolType",
    "ReplayResult",
    "Resource",
    "SharedMemoryBindings",
    "Skipped",
    "Trace",
    "TraceFormatError",
    "__version__",
    "examples",
    "load_trace",
    "optimal_align",
    "replay",
]
