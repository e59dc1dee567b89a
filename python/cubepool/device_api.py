"""TVM's ``DeviceAPI`` and the rest of ``tvm::runtime`` that cubepool lacked, on host memory.

``DeviceAPI.get(device)`` gives the API of a device; cubepool has one for ``cpu``,
backed by a ``MemoryManagement``: data spaces and workspaces are reservations from its
pools, so reuse of freed workspace bytes shows in ``memory_report()`` (the bytes
reserved stay flat while workspaces come and go). Also here: ``runtime_enabled``,
``get_preferred_host_device``, ``create_tensor_memory_pool``, ``DeviceAttrKind``,
``TVMDeviceExtType`` and ``kDefaultWorkspaceAlignment`` with TVM's values.
"""

from __future__ import annotations

import os
import threading
from enum import IntEnum
from typing import Any, ClassVar

from cubepool._cubepool import (
    ALLOC_ALIGNMENT,
    DEFAULT_WORKSPACE_ALIGNMENT,
    Device,
    ManagedMemoryHandle,
    MemoryManagement,
    MemoryReport,
    Tensor,
    TensorMemoryPool,
    copy_from_to,
    is_plain_buffer_format,
)
from cubepool._errors import InvalidArgument

#: Bytes each workspace allocation aligns to by default (TVM's ``kDefaultWorkspaceAlignment``).
kDefaultWorkspaceAlignment: int = DEFAULT_WORKSPACE_ALIGNMENT

_DeviceLike = Device | str | tuple[int, int]


class TVMDeviceExtType(IntEnum):
    """TVM's device types beyond DLPack's, with TVM's values."""

    kDLAOCL = 32
    kDLSDAccel = 33
    kOpenGL = 34
    kDLMicroDev = 35
    TVMDeviceExtType_End = 36


class DeviceAttrKind(IntEnum):
    """The attributes ``DeviceAPI.get_attr`` can be asked for (TVM's ``DeviceAttrKind``)."""

    kExist = 0
    kMaxThreadsPerBlock = 1
    kWarpSize = 2
    kMaxSharedMemoryPerBlock = 3
    kComputeVersion = 4
    kDeviceName = 5
    kMaxClockRate = 6
    kMultiProcessorCount = 7
    kMaxThreadDimensions = 8
    kMaxRegistersPerBlock = 9
    kGcnArch = 10
    kApiVersion = 11
    kDriverVersion = 12
    kL2CacheSizeBytes = 13
    kTotalGlobalMemory = 14
    kAvailableGlobalMemory = 15
    kImagePitchAlignment = 16


def _device(device: _DeviceLike) -> Device:
    if isinstance(device, Device):
        return device
    if isinstance(device, tuple):
        return Device(*device)
    return Device(device)


def _is_cpu(device: Device) -> bool:
    return device.kind == "cpu"


def _host_memory(name: str) -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf(name)
    except (ValueError, OSError):
        return None


class DeviceAPI:
    """The memory interface of one device (TVM's ``DeviceAPI``), on cubepool's pools.

    Invariant: ``_live`` holds the id of every data space and workspace handed out and
    not yet freed, so a free of a foreign or already freed handle is refused by name.
    """

    _instances: ClassVar[dict[tuple[int, int], DeviceAPI]] = {}
    _instances_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, device: _DeviceLike = "cpu", memory: MemoryManagement | None = None):
        dev = _device(device)
        if not _is_cpu(dev):
            raise InvalidArgument(f"no DeviceAPI for {dev!r}: cubepool allocates host memory only")
        self._device = dev
        self._memory = memory if memory is not None else MemoryManagement(name=f"device-{dev.kind}")
        self._live: dict[int, str] = {}
        self._lock = threading.Lock()

    @classmethod
    def get(cls, device: _DeviceLike, allow_missing: bool = False) -> DeviceAPI | None:
        """The shared API of ``device`` (TVM's ``DeviceAPI::Get``).

        For a device cubepool cannot allocate on, ``InvalidArgument``, or None with
        ``allow_missing``.
        """
        dev = _device(device)
        if not _is_cpu(dev):
            if allow_missing:
                return None
            raise InvalidArgument(f"no DeviceAPI for {dev!r}: cubepool allocates host memory only")
        key = dev.__dlpack_device__()
        with cls._instances_lock:
            api = cls._instances.get(key)
            if api is None:
                api = cls._instances[key] = cls(dev)
            return api

    @property
    def device(self) -> Device:
        """The device this API allocates on."""
        return self._device

    @property
    def memory(self) -> MemoryManagement:
        """The pools behind data spaces and workspaces."""
        return self._memory

    def memory_report(self) -> MemoryReport:
        """The report of the pools behind this API."""
        return self._memory.memory_report()

    @property
    def live_allocations(self) -> int:
        """Data spaces and workspaces handed out and not yet freed."""
        with self._lock:
            return len(self._live)

    def _reserve(self, nbytes: int, alignment: int, kind: str) -> ManagedMemoryHandle:
        if nbytes < 0:
            raise InvalidArgument(f"{kind}: nbytes must be non-negative, got {nbytes}")
        if alignment < 1 or alignment & (alignment - 1):
            raise InvalidArgument(f"{kind}: alignment must be a power of two, got {alignment}")
        pool_alignment = self._memory.properties.alignment
        if alignment > pool_alignment:
            raise InvalidArgument(
                f"{kind}: alignment {alignment} is above the pools' {pool_alignment} bytes"
            )
        handle = self._memory.reserve(nbytes)
        with self._lock:
            self._live[handle.id] = kind
        return handle

    def _free(self, handle: ManagedMemoryHandle, kind: str) -> None:
        with self._lock:
            owner = self._live.get(handle.id)
            if owner != kind:
                raise InvalidArgument(
                    f"{kind} does not own handle {handle.id}: "
                    + ("it was freed already, or came from elsewhere" if owner is None else owner)
                )
            handle.release()  # BufferError while views of it exist: it stays live
            del self._live[handle.id]

    def alloc_data_space(
        self, nbytes: int, alignment: int = ALLOC_ALIGNMENT, type_hint: Any = None
    ) -> ManagedMemoryHandle:
        """Reserve ``nbytes`` aligned to ``alignment`` (TVM's ``AllocDataSpace``).

        The handle exports its bytes (``memoryview(handle)``); free it with
        ``free_data_space``. ``type_hint`` is accepted for TVM's signature and unused.
        """
        return self._reserve(nbytes, alignment, "alloc_data_space")

    def free_data_space(self, handle: ManagedMemoryHandle) -> None:
        """Give back a data space (TVM's ``FreeDataSpace``)."""
        self._free(handle, "alloc_data_space")

    def alloc_workspace(self, nbytes: int, type_hint: Any = None) -> ManagedMemoryHandle:
        """Reserve a temporary workspace of ``nbytes`` (TVM's ``AllocWorkspace``).

        Workspaces come from the same pools as data spaces, so a freed workspace's slice
        is reused by the next one of its size class, and ``memory_report()`` shows it.
        """
        return self._reserve(nbytes, kDefaultWorkspaceAlignment, "alloc_workspace")

    def free_workspace(self, handle: ManagedMemoryHandle) -> None:
        """Give back a workspace (TVM's ``FreeWorkspace``)."""
        self._free(handle, "alloc_workspace")

    def copy_data_from_to(self, source: Any, destination: Any, stream: Any = None) -> None:
        """Copy ``source``'s bytes into ``destination`` (TVM's ``CopyDataFromTo``).

        Both are Tensors, handles or C-contiguous buffers of the same byte size. Host
        copies are synchronous; ``stream`` is accepted and unused.
        """
        if isinstance(source, Tensor) and isinstance(destination, Tensor):
            copy_from_to(source, destination)
            return
        try:
            views = memoryview(source), memoryview(destination)
            src, dst = views[0].cast("B"), views[1].cast("B")
        except TypeError as exc:
            raise InvalidArgument(f"copy_data_from_to needs C-contiguous buffers: {exc}") from exc
        for name, view in zip(("source", "destination"), views, strict=True):
            if not is_plain_buffer_format(view.format):
                # An object array's items are pointers it owns: bytes written over them
                # would be freed as objects, and read from them would be addresses.
                raise InvalidArgument(
                    f"copy_data_from_to: the {name} must hold numbers or bytes, not items of "
                    f"format {view.format!r}"
                )
        if dst.readonly:
            raise InvalidArgument("copy_data_from_to: the destination is read-only")
        if src.nbytes != dst.nbytes:
            raise InvalidArgument(
                f"copy_data_from_to: {src.nbytes} source bytes into {dst.nbytes} destination bytes"
            )
        dst[:] = src

    def stream_sync(self, stream: Any = None) -> None:
        """Wait for the work of ``stream`` (TVM's ``StreamSync``): host work is synchronous."""

    def get_attr(self, kind: DeviceAttrKind | int) -> Any:
        """The value of attribute ``kind`` for this device, or None where a CPU has none.

        ``kExist`` is True, ``kDeviceName`` ``"cpu"``, ``kTotalGlobalMemory`` and
        ``kAvailableGlobalMemory`` the host's physical and available bytes.
        """
        try:
            attr = DeviceAttrKind(kind)
        except ValueError:
            raise InvalidArgument(f"unknown DeviceAttrKind {kind!r}") from None
        if attr == DeviceAttrKind.kExist:
            return True
        if attr == DeviceAttrKind.kDeviceName:
            return self._device.kind
        if attr == DeviceAttrKind.kTotalGlobalMemory:
            return _host_memory("SC_PHYS_PAGES")
        if attr == DeviceAttrKind.kAvailableGlobalMemory:
            return _host_memory("SC_AVPHYS_PAGES")
        return None


# TVM's RuntimeEnabled (src/runtime/module.cc) reads these names exactly as written:
# "cpu", its device runtimes by name, and "nvptx...", "rocm..." and "llvm..." by how the
# name starts (so "llvm -mcpu=skylake" is an llvm target). Anything else, a name in
# another case included, is unknown to it.
_DEVICE_TARGETS = frozenset(
    {"cuda", "gpu", "cl", "opencl", "mtl", "metal", "tflite", "vulkan", "rpc", "hexagon"}
)
_DEVICE_PREFIXES = ("nvptx", "rocm")


def runtime_enabled(target: str) -> bool:
    """Whether this runtime can run ``target`` (TVM's ``RuntimeEnabled``).

    True for the host: ``cpu``, and any name starting with ``llvm`` (``llvm -mcpu=...``).
    False for the device runtimes TVM names (``cuda``, ``gpu``, ``cl``, ``opencl``,
    ``mtl``, ``metal``, ``tflite``, ``vulkan``, ``rpc``, ``hexagon``, and any name starting
    with ``nvptx`` or ``rocm``): cubepool runs on host memory. The names are TVM's, as
    written: any other (``c``, ``CPU``, ``cuda -arch=sm_80``, ``""``) is an
    ``InvalidArgument``, as TVM rejects it ("Unknown optional runtime"); a target that
    is not a ``str`` is an ``InvalidArgument`` too.
    """
    if not isinstance(target, str):
        raise InvalidArgument(f"runtime_enabled: target must be a str, got {type(target).__name__}")
    if target == "cpu" or target.startswith("llvm"):
        return True
    if target in _DEVICE_TARGETS or target.startswith(_DEVICE_PREFIXES):
        return False
    raise InvalidArgument(f"unknown runtime target {target!r}")


def get_preferred_host_device(device: _DeviceLike) -> Device:
    """The host device to stage ``device``'s data in (TVM's ``GetPreferredHostDevice``).

    Pinned host memory (``cuda_host``, ``rocm_host``) for CUDA and ROCm, else ``cpu``.
    """
    kind = _device(device).kind
    if kind == "cuda":
        return Device("cuda_host", 0)
    if kind == "rocm":
        return Device("rocm_host", 0)
    return Device("cpu", 0)


def create_tensor_memory_pool(device: _DeviceLike = "cpu") -> TensorMemoryPool:
    """The default tensor pool of ``device`` (TVM's ``CreateTensorMemoryPool``)."""
    dev = _device(device)
    if not _is_cpu(dev):
        raise InvalidArgument(
            f"no tensor memory pool for {dev!r}: cubepool allocates host memory only"
        )
    return TensorMemoryPool(device=dev)
