"""cubepool as PyTorch's CUDA allocator.

``cubepool.torch.use()`` installs cubepool's pools behind every CUDA tensor PyTorch
allocates, through ``torch.cuda.memory.CUDAPluggableAllocator``: the C entry points
``cubepool_torch_alloc`` / ``cubepool_torch_free`` of cubepool's extension module,
with the signatures PyTorch loads (``void* alloc(ssize_t size, int device,
cudaStream_t stream)``, ``void free(void* ptr, ssize_t size, int device, cudaStream_t
stream)``). Call it before the first CUDA allocation of the process (PyTorch refuses to
change its allocator after that)::

    import cubepool.torch
    cubepool.torch.use()                      # the default layout, on cuda:0
    with cubepool.torch.record("train") as run:
        train()
    print(cubepool.torch.memory_stats()["reserved_bytes.all.peak"])
    cubepool.torch.predict(run.trace)         # what the layout predicts for the run

Stream semantics: PyTorch frees a block with the stream it was allocated on. The block
goes back to the pools at once; that stream may reuse its bytes at once (stream order
keeps its earlier work first), and another stream gets them only after an event
recorded on the freeing stream at the free has completed (waited for when it has
not). Memory goes back to the device (unmapped or freed) only after the device has
finished all queued work. Like PyTorch's pluggable allocators, cubepool does not see
``Tensor.record_stream``: a tensor used on another stream than its own must be
synchronized by the caller before it is freed.

A failed allocation (out of memory) returns NULL to PyTorch, which does not check it
for a pluggable allocator: the run then fails at the first use of the tensor (an illegal
memory access), not with ``torch.OutOfMemoryError``. The reason is written to stderr
and kept for :func:`state` (``last_error``). One device per process.
``torch.cuda.memory_stats()`` and ``torch.cuda.empty_cache()`` do not reach a pluggable
allocator: use :func:`memory_stats` and :func:`empty_cache`.

``torch`` is needed only by :func:`use`; importing this module does not import it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from cubepool import _cubepool
from cubepool._cubepool import MemoryConfiguration, MemoryDeviceProperties, ReplayResult, Trace
from cubepool._errors import InvalidArgument
from cubepool.layouts import LayoutLike, resolve_layout

#: The alignment of every block unless properties say otherwise: PyTorch's own
#: allocator rounds every block to 512 bytes.
ALIGNMENT = 512

__all__ = [
    "Run",
    "default_properties",
    "empty_cache",
    "install",
    "library_path",
    "memory_stats",
    "predict",
    "record",
    "state",
    "symbols",
    "use",
]


def library_path() -> str:
    """The shared library that exports the allocator's C entry points: cubepool's
    extension module."""
    return os.path.abspath(_cubepool.__file__)


def symbols() -> tuple[str, str]:
    """The names of the alloc and free entry points in :func:`library_path`."""
    return _cubepool.torch_allocator_symbols()


def default_properties() -> MemoryDeviceProperties:
    """The device properties the allocator uses unless given others: 512-byte
    alignment (:data:`ALIGNMENT`), the default page limit."""
    return MemoryDeviceProperties(alignment=ALIGNMENT)


def predict(
    trace: Trace,
    layout: LayoutLike = "default",
    properties: MemoryDeviceProperties | None = None,
) -> ReplayResult:
    """What ``layout`` reserves for a recorded run: :func:`cubepool.replay` with the
    allocator's properties, so its peak is comparable with :func:`memory_stats`."""
    from cubepool._trace import replay

    return replay(trace, layout, properties or default_properties())


def _configuration(layout: LayoutLike) -> MemoryConfiguration:
    label, config = resolve_layout(layout)
    if not isinstance(config, MemoryConfiguration):
        raise TypeError(f"cubepool.torch needs a pool layout, got the model {label!r}")
    return config


def install(
    layout: LayoutLike = "default",
    device: str = "cuda:0",
    properties: MemoryDeviceProperties | None = None,
) -> None:
    """Installs a fresh allocator behind the C entry points (without telling PyTorch):
    pools from ``layout`` (anything :func:`cubepool.layouts.resolve_layout` takes) on
    ``device``; ``"cpu"`` serves host memory, which lets the entry points be driven
    through ``ctypes`` without a GPU. Blocks are aligned to 512 bytes unless
    ``properties`` say otherwise.

    Raises:
        DeviceUnavailable: no CUDA driver or no such device.
        InvalidArgument: a bad device name, or the current allocator has live blocks.
        PoolConfigError: a layout that does not build on the device.
    """
    _cubepool.torch_allocator_install(
        _configuration(layout), device, properties or default_properties()
    )


def use(
    layout: LayoutLike = "default",
    device: str = "cuda:0",
    properties: MemoryDeviceProperties | None = None,
) -> None:
    """Installs cubepool (:func:`install`) and makes it PyTorch's CUDA allocator with
    ``torch.cuda.memory.change_current_allocator``. Call it before PyTorch allocates
    CUDA memory.

    Raises:
        InvalidArgument: a device other than ``"cuda:N"`` (PyTorch would take host
            memory for device memory).
    """
    if not device.startswith("cuda"):
        raise InvalidArgument(f'cubepool.torch.use needs a CUDA device ("cuda:N"), got {device!r}')
    import torch

    install(layout, device, properties)
    alloc, free = symbols()
    allocator = torch.cuda.memory.CUDAPluggableAllocator(library_path(), alloc, free)
    torch.cuda.memory.change_current_allocator(allocator)


def memory_stats() -> dict[str, int]:
    """The allocator's statistics under the keys of ``torch.cuda.memory_stats()``
    (``allocated_bytes.all.current``, ``reserved_bytes.all.peak``, ``num_ooms``, ...)."""
    stats: dict[str, int] = _cubepool.torch_allocator_stats()
    return stats


def state() -> dict[str, Any]:
    """The allocator's bookkeeping: ``live`` blocks, ``in_flight_frees`` (frees whose
    stream work may still run), ``cross_stream_waits``, ``last_error`` and ``errors``
    (a count per kind: ``unknown_pointer``, ``double_free``, ``alloc_failed``, ...)."""
    current: dict[str, Any] = _cubepool.torch_allocator_state()
    return current


def empty_cache() -> None:
    """Gives every free page back to the device (``torch.cuda.empty_cache()``'s
    counterpart; PyTorch's own does not reach a pluggable allocator's pools)."""
    _cubepool.torch_allocator_empty_cache()


@dataclass
class Run:
    """A recording in progress; ``trace`` is set when its ``with`` block ends."""

    workload: str
    trace: Trace | None = field(default=None)


@contextmanager
def record(workload: str = "torch") -> Iterator[Run]:
    """Records every allocation and free of the block as a cubepool trace (blocks live
    when it starts are left out), ready for :func:`cubepool.replay` and ``compare``.

    Raises:
        InvalidArgument: a recording is in progress already (blocks do not nest: the
            inner one would end the outer's), or, as the block ends, the recording was
            lost (the allocator was installed again during it).
    """
    run = Run(workload)
    _cubepool.torch_allocator_start_trace(workload)
    try:
        yield run
    finally:
        run.trace = _cubepool.torch_allocator_stop_trace()
    if run.trace is None:
        raise InvalidArgument(
            f"the recording {workload!r} was lost: the allocator was installed again during it"
        )
