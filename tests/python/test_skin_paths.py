"""The skin's shared paths (issue 21): one DLPack export path for both capsule layouts,
one byte-export helper for handles and tensors, one handle-or-binding dispatch, and the
exception classes bound as types rather than looked up by name."""

from __future__ import annotations

import ctypes
import gc
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cubepool
import cubepool as cp
from conftest import custom, sliced
from cubepool import _errors


def capsule_name(capsule: object) -> str:
    return repr(capsule).split('"')[1]


# --- DLPack: one path, two layouts ------------------------------------------------------


def test_both_dlpack_layouts_give_the_same_bytes_and_keep_the_owner_alive() -> None:
    pool = cp.TensorMemoryPool()
    t = pool.empty((3, 4), "int32")
    np.asarray(t)[:] = np.arange(12, dtype=np.int32).reshape(3, 4)
    legacy_capsule = t.__dlpack__()
    versioned_capsule = t.__dlpack__(max_version=(1, 0))
    legacy = cp.from_dlpack(legacy_capsule)
    versioned = cp.from_dlpack(versioned_capsule)
    assert capsule_name(legacy_capsule) == "used_dltensor"
    assert capsule_name(versioned_capsule) == "used_dltensor_versioned"
    for imported in (legacy, versioned):
        assert (imported.shape, imported.dtype) == ((3, 4), "int32")
        assert imported.data_ptr() == t.data_ptr()
        assert not imported.readonly
    del t, legacy_capsule, versioned_capsule, imported
    gc.collect()
    assert pool.cached_bytes == 0  # each import holds the backing
    np.testing.assert_array_equal(np.asarray(legacy), np.asarray(versioned))
    np.asarray(legacy)[0, 0] = 99  # the same memory, seen through both
    assert np.asarray(versioned)[0, 0] == 99
    del legacy
    gc.collect()
    assert pool.cached_bytes == 0  # the versioned import still holds it
    np.testing.assert_array_equal(np.asarray(versioned).ravel()[1:], np.arange(1, 12))
    del versioned
    gc.collect()
    assert pool.cached_bytes == 4096  # both deleters ran, once each
    assert pool.checked_out == 0


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_an_unconsumed_capsule_of_either_layout_frees_its_export(
    max_version: tuple[int, int] | None,
) -> None:
    pool = cp.TensorMemoryPool()
    t = pool.empty((8,), "float64")
    cap = t.__dlpack__(max_version=max_version)
    del t
    gc.collect()
    assert pool.cached_bytes == 0
    del cap
    gc.collect()
    assert pool.cached_bytes == 4096


def test_the_versioned_layout_carries_read_only_and_copied_flags() -> None:
    a = np.arange(4, dtype=np.int16)
    a.flags.writeable = False
    readonly = cp.from_dlpack(a)
    again = cp.from_dlpack(readonly.__dlpack__(max_version=(1, 0)))
    assert again.readonly
    copied = cp.from_dlpack(readonly.__dlpack__(max_version=(1, 0), copy=True))
    assert copied.data_ptr() != readonly.data_ptr()
    np.testing.assert_array_equal(np.asarray(copied), [0, 1, 2, 3])


# --- One byte-export helper ----------------------------------------------------------


def test_zero_byte_handles_and_tensors_export_empty_views() -> None:
    mm = custom(sliced(4096, 4096))
    h = mm.reserve(0)
    t = cp.empty((0,), "float32")
    for view in (memoryview(h), memoryview(t)):
        assert view.nbytes == 0
        assert bytes(view) == b""
        view.release()
    h.release()  # no export left counted


def request_writable_buffer(obj: object) -> None:
    """Asks for a writable export of ``obj`` with PyBUF_WRITABLE, then releases it."""
    view = (ctypes.c_byte * 256)()  # room for a Py_buffer
    get = ctypes.pythonapi.PyObject_GetBuffer
    get.argtypes = [ctypes.py_object, ctypes.c_void_p, ctypes.c_int]
    release = ctypes.pythonapi.PyBuffer_Release
    release.argtypes = [ctypes.c_void_p]
    get(obj, ctypes.addressof(view), 0x0001)  # raises the exporter's error
    release(ctypes.addressof(view))


def test_read_only_bytes_refuse_writable_exports() -> None:
    a = np.arange(4, dtype=np.uint8)
    a.flags.writeable = False
    t = cp.from_dlpack(a)
    assert memoryview(t).readonly
    with pytest.raises(BufferError, match="read-only"):
        request_writable_buffer(t)
    mm = custom(sliced(4096, 4096))
    h = mm.reserve(16)
    request_writable_buffer(h)  # handles are writable
    request_writable_buffer(cp.empty((2,), "int8"))
    h.release()  # the writable export was given back


def test_a_failed_handle_export_leaves_no_export_counted() -> None:
    mm = custom(sliced(4096, 4096))
    unbound = mm.handle()
    with pytest.raises(cubepool.InvalidArgument, match="not bound"):
        memoryview(unbound)
    mm.bind(unbound, 64)
    view = memoryview(unbound)
    assert view.nbytes == 64
    view.release()
    unbound.release()  # refused if the failed export had been counted
    assert unbound.released


# --- One handle-or-binding dispatch --------------------------------------------------


def test_every_target_taking_method_names_its_accepted_types() -> None:
    mm = custom(sliced(4096, 4096))
    with pytest.raises(TypeError, match="resource"):
        mm.resource(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pin"):
        mm.shared_bindings([42])  # type: ignore[list-item]
    for method in (mm.write, mm.claim):
        with pytest.raises(TypeError, match="ManagedMemoryHandle"):
            method(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ManagedMemoryHandle"):
        mm.launch("k", reads=[42])  # type: ignore[list-item]


def test_handles_and_bindings_resolve_to_the_same_reservation() -> None:
    mm = custom(sliced(4096, 4096))
    h = mm.reserve(128)
    b = h.binding()
    assert mm.resource(h) == mm.resource(b)
    mm.launch("k", writes=[b], fail="boom")
    claim_h, claim_b = mm.claim(h), mm.claim(b)
    assert claim_h is not None and claim_h == claim_b
    mm.write(h)
    assert mm.claim(b) is None
    with mm.shared_bindings([h, b]) as pinned:
        assert pinned.ids == [h.id, h.id]


def test_foreign_bindings_are_refused_by_every_graph_method() -> None:
    mm, other = custom(sliced(4096, 4096)), custom(sliced(4096, 4096))
    foreign = other.reserve(16).binding()
    with pytest.raises(cubepool.InvalidArgument, match=f"binding {foreign.id} belongs"):
        mm.write(foreign)
    with pytest.raises(cubepool.InvalidArgument, match="another MemoryManagement"):
        mm.shared_bindings([foreign])
    with pytest.raises(cubepool.InvalidArgument, match="another MemoryManagement"):
        mm.resource(foreign)


# --- Exception classes bound as types ------------------------------------------------


def test_raised_errors_are_the_classes_of_the_errors_module() -> None:
    mm = custom(sliced(4096, 4096, 4096))
    held = mm.reserve(4096)
    with pytest.raises(_errors.CubepoolError) as caught:
        mm.reserve(4096)
    assert type(caught.value) is _errors.PoolCapacityExceeded
    assert (caught.value.size, caught.value.capacity) == (4096, 4096)
    held.release()
    with pytest.raises(_errors.InvalidArgument) as invalid:
        mm.reserve(-1)
    assert type(invalid.value) is _errors.InvalidArgument
    with pytest.raises(_errors.TensorError) as tensor:
        cp.empty((-1,), "float32")
    assert type(tensor.value) is _errors.TensorError
    with pytest.raises(_errors.PoolConfigError) as config:
        cubepool.MemoryManagement("sliced(")
    assert type(config.value) is _errors.PoolConfigError
    assert config.value.kind is not None


def test_a_class_missing_from_the_errors_module_fails_the_import_by_name() -> None:
    # A stand-in `cubepool._errors` whose NotFound is no class: the Python imports of
    # the name still succeed, so the refusal comes from the extension's own check.
    script = textwrap.dedent(
        """
        import importlib.util, os, sys
        package = importlib.util.find_spec("cubepool")  # found, not imported
        path = os.path.join(package.submodule_search_locations[0], "_errors.py")
        spec = importlib.util.spec_from_file_location("cubepool._errors", path)
        fake = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fake)
        fake.NotFound = "not a class"
        sys.modules["cubepool._errors"] = fake
        import cubepool
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode != 0
    assert "ImportError: cubepool._errors has no exception class NotFound" in done.stderr
