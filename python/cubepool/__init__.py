"""cubepool: GPU-style memory pools, driven from Python.

Reserve real host memory from CubeCL-style pools (``MemoryManagement``) and see the
bytes without copying (``memoryview(handle)``, ``numpy.frombuffer(handle)``), or replay
a recorded allocation trace through pool layouts: ``load_trace`` (cubepool, PyTorch
profiler and snapshot, RMM formats), ``replay``, ``compare``, ``plan``, ``sweep`` and
``plot``.
"""

from __future__ import annotations

from cubepool import examples
from cubepool._cubepool import (
    EXCLUSIVE_MEMORY_ONLY,
    ManagedMemoryBinding,
    ManagedMemoryHandle,
    MemoryConfiguration,
    MemoryDeviceProperties,
    MemoryManagement,
    MemoryPoolOptions,
    MemoryUsage,
    PoolReplay,
    PoolType,
    ReplayResult,
    Resource,
    Timeline,
    Trace,
    __version__,
    optimal_align,
)
from cubepool._errors import (
    BufferTooBig,
    CubepoolError,
    HandleReleased,
    InvalidArgument,
    NotFound,
    OutOfMemory,
    PoolCapacityExceeded,
    PoolConfigError,
    TraceFormatError,
)
from cubepool._trace import load_trace, load_trace_with_report, replay
from cubepool.compare import Comparison, compare
from cubepool.layouts import default_configuration, describe
from cubepool.plan import Plan, plan
from cubepool.plot import plot
from cubepool.sweep import Sweep, sweep

__all__ = [
    "EXCLUSIVE_MEMORY_ONLY",
    "BufferTooBig",
    "Comparison",
    "CubepoolError",
    "HandleReleased",
    "InvalidArgument",
    "ManagedMemoryBinding",
    "ManagedMemoryHandle",
    "MemoryConfiguration",
    "MemoryDeviceProperties",
    "MemoryManagement",
    "MemoryPoolOptions",
    "MemoryUsage",
    "NotFound",
    "OutOfMemory",
    "Plan",
    "PoolCapacityExceeded",
    "PoolConfigError",
    "PoolReplay",
    "PoolType",
    "ReplayResult",
    "Resource",
    "Sweep",
    "Timeline",
    "Trace",
    "TraceFormatError",
    "__version__",
    "compare",
    "default_configuration",
    "describe",
    "examples",
    "load_trace",
    "load_trace_with_report",
    "optimal_align",
    "plan",
    "plot",
    "replay",
    "sweep",
]
