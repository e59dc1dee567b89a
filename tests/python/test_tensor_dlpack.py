"""DLPack: exporting capsules, numpy/torch consumers, importing any producer."""

from __future__ import annotations

import ctypes
import gc
import weakref
from typing import Any

import numpy as np
import pytest

import cubepool as cp


def capsule_name(capsule: object) -> str:
    return repr(capsule).split('"')[1]


def test_dlpack_device() -> None:
    assert cp.empty((1,), "int8").__dlpack_device__() == (1, 0)


def test_legacy_and_versioned_capsules() -> None:
    t = cp.empty((2, 3), "float32")
    assert capsule_name(t.__dlpack__()) == "dltensor"
    assert capsule_name(t.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"
    assert capsule_name(t.__dlpack__(max_version=(0, 8))) == "dltensor"
    with pytest.raises(BufferError, match="stream=None"):
        t.__dlpack__(stream=1)
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(2, 0))
    assert capsule_name(t.__dlpack__(dl_device=(1, 0), stream=None)) == "dltensor"


@pytest.mark.parametrize(
    "dtype", ["bool", "int8", "int32", "int64", "uint16", "uint64", "float16", "float32", "float64"]
)
def test_numpy_from_dlpack_shares_memory(dtype: str) -> None:
    t = cp.empty((2, 3), dtype)
    a = np.from_dlpack(t)
    assert a.dtype == np.dtype(dtype)
    assert a.shape == (2, 3)
    assert a.ctypes.data == t.data_ptr()
    assert a.flags.writeable  # numpy asks for a versioned capsule; we export flags 0
    a[1, 2] = 1
    assert np.asarray(t)[1, 2] == 1


def test_views_export_their_offset() -> None:
    t = cp.empty((4,), "int32")
    np.asarray(t)[:] = [10, 11, 12, 13]
    v = cp.create_view(t, (2,), "int32", 8)
    np.testing.assert_array_equal(np.from_dlpack(v), [12, 13])


def test_capsules_keep_memory_alive_and_free_once() -> None:
    pool = cp.TensorMemoryPool()
    t = pool.empty((16,), "float32")
    cap = t.__dlpack__()
    del t
    gc.collect()
    assert pool.cached_bytes == 0  # the unconsumed capsule holds the backing
    del cap
    gc.collect()
    assert pool.cached_bytes == 4096  # its destructor called the deleter

    t = pool.empty((16,), "float32")
    a = np.from_dlpack(t)
    del t
    gc.collect()
    assert pool.cached_bytes == 0  # numpy consumed it and holds it
    a[:] = 1.0
    del a
    gc.collect()
    assert pool.cached_bytes == 4096
    assert pool.checked_out == 0


def test_consumed_capsule_is_not_deleted_twice() -> None:
    t = cp.empty((3,), "int64")
    np.asarray(t)[:] = [1, 2, 3]
    cap = t.__dlpack__(max_version=(1, 0))
    u = cp.from_dlpack(cap)
    assert capsule_name(cap) == "used_dltensor_versioned"
    with pytest.raises(ValueError, match="already consumed"):
        cp.from_dlpack(cap)
    del cap
    gc.collect()
    np.testing.assert_array_equal(np.asarray(u), [1, 2, 3])
    assert u.data_ptr() == t.data_ptr()


def test_copy_true_exports_a_copy() -> None:
    t = cp.empty((2,), "int32")
    a = np.from_dlpack(t, copy=True)
    assert a.ctypes.data != t.data_ptr()


def test_from_dlpack_numpy_zero_copy_keeps_producer_alive() -> None:
    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    ref = weakref.ref(a)
    t = cp.from_dlpack(a)
    assert (t.shape, t.dtype) == ((2, 3), "float64")
    assert t.data_ptr() == a.ctypes.data
    a[0, 0] = 42.0
    assert np.asarray(t)[0, 0] == 42.0
    del a
    gc.collect()
    assert ref() is not None  # the tensor owns the producer
    np.testing.assert_array_equal(np.asarray(t).ravel()[1:], [1, 2, 3, 4, 5])
    del t
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint32", "float16", "float32", "int64"])
def test_from_dlpack_dtypes(dtype: str) -> None:
    a = (np.arange(5) % 2).astype(dtype)
    t = cp.from_dlpack(a)
    assert t.dtype == dtype
    np.testing.assert_array_equal(np.asarray(t), a)


def test_from_dlpack_readonly_producer() -> None:
    a = np.arange(4, dtype=np.int32)
    a.flags.writeable = False
    t = cp.from_dlpack(a)
    assert t.readonly
    assert not np.asarray(t).flags.writeable
    with pytest.raises(cp.TensorError, match="read-only"):
        cp.copy_from_to(cp.empty((4,), "int32"), t)
    with pytest.raises(cp.TensorError, match="read-only"):
        cp.copy_from_bytes(t, bytes(16))
    with pytest.raises(BufferError):
        t.__dlpack__()  # legacy capsules cannot say read-only
    b = np.from_dlpack(t)
    assert not b.flags.writeable
    np.testing.assert_array_equal(b, [0, 1, 2, 3])


def test_from_dlpack_non_compact_copies_unless_forbidden() -> None:
    a = np.arange(10, dtype=np.int16)[::2]
    t = cp.from_dlpack(a)
    np.testing.assert_array_equal(np.asarray(t), [0, 2, 4, 6, 8])
    assert t.data_ptr() != a.ctypes.data
    f = np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(np.asarray(cp.from_dlpack(f)), f)
    with pytest.raises(BufferError, match="copy=False"):
        cp.from_dlpack(a, copy=False)
    c = np.arange(3, dtype=np.int8)
    assert cp.from_dlpack(c, copy=True).data_ptr() != c.ctypes.data
    assert cp.from_dlpack(c, copy=False).data_ptr() == c.ctypes.data


def test_from_dlpack_rejects_what_it_cannot_hold() -> None:
    with pytest.raises(cp.TensorError, match="unsupported dtype"):
        cp.from_dlpack(np.zeros(3, np.complex64))
    with pytest.raises(TypeError):
        cp.from_dlpack([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(cp.TensorError):
        cp.from_dlpack(np.zeros(3), device="cuda:0")

    class Legacy:
        """A producer that predates max_version."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __dlpack__(self, stream: object = None) -> object:
            return self.inner.__dlpack__()

    legacy = cp.from_dlpack(Legacy(np.arange(3, dtype=np.uint8)))
    np.testing.assert_array_equal(np.asarray(legacy), [0, 1, 2])


def test_round_trip_through_cubepool() -> None:
    t = cp.empty((5,), "uint8")
    u = cp.from_dlpack(t)
    assert u.data_ptr() == t.data_ptr()
    np.asarray(u)[:] = 3
    assert cp.copy_to_bytes(t) == b"\x03" * 5
    del t
    gc.collect()
    assert cp.copy_to_bytes(u) == b"\x03" * 5


def test_torch_round_trip() -> None:
    torch = pytest.importorskip("torch")
    t = cp.empty((2, 3), "float32")
    x = torch.from_dlpack(t)
    x[0, 0] = 5.0
    assert np.asarray(t)[0, 0] == 5.0
    y = torch.arange(6, dtype=torch.int32)
    u = cp.from_dlpack(y)
    y[0] = 7
    assert np.asarray(u)[0] == 7
    b = cp.empty((4,), "bfloat16")
    assert torch.from_dlpack(b).dtype == torch.bfloat16
    z = cp.from_dlpack(torch.ones(2, dtype=torch.bfloat16))
    assert z.dtype == "bfloat16"
    assert cp.copy_to_bytes(z) == bytes.fromhex("803f803f")


@pytest.mark.parametrize("exporter", ["tensor", "handle"])
@pytest.mark.parametrize(
    ("keywords", "error", "named"),
    [
        ({"max_version": (-1, 0)}, cp.InvalidArgument, r"max_version\[0\] must be non-negative"),
        ({"max_version": (1, 2**70)}, cp.InvalidArgument, r"max_version\[1\] is too large"),
        ({"max_version": (1,)}, TypeError, r"max_version must be a \(major, minor\) tuple"),
        ({"max_version": "1.0"}, TypeError, r"max_version must be a \(major, minor\) tuple"),
        ({"dl_device": (2**31, 0)}, ValueError, r"dl_device\[0\] must fit in 32 bits"),
        ({"dl_device": (1, -(2**40))}, ValueError, r"dl_device\[1\] must fit in 32 bits"),
        ({"dl_device": (1, "0")}, TypeError, r"dl_device\[1\] must be an int"),
        ({"copy": 2}, TypeError, r"copy must be True, False or None, got int"),
    ],
)
def test_bad_dlpack_keywords_are_typed_errors_that_name_them(
    exporter: str, keywords: dict[str, Any], error: type[Exception], named: str
) -> None:
    """`__dlpack__`'s keywords were PyO3's to read: a version or device past its C type
    raised a bare OverflowError ("out of range integral type conversion attempted") and
    a non-bool copy a TypeError naming no argument."""
    mm = cp.MemoryManagement()
    obj: Any = cp.empty((4,), "float32") if exporter == "tensor" else mm.reserve(16)
    with pytest.raises(error, match=named):
        obj.__dlpack__(**keywords)
    # What consumers pass still works, and an unheard-of version is still a version.
    assert capsule_name(obj.__dlpack__(max_version=(1, 0), dl_device=(1, 0), copy=False)) == (
        "dltensor_versioned"
    )
    assert capsule_name(obj.__dlpack__(max_version=(2**40, 0))) == "dltensor_versioned"
    assert capsule_name(obj.__dlpack__(max_version=None, dl_device=None, copy=None)) == "dltensor"


def test_from_dlpack_names_a_bad_copy_keyword() -> None:
    with pytest.raises(TypeError, match=r"copy must be True, False or None, got int"):
        cp.from_dlpack(cp.empty((2,), "int8"), copy=2)


def test_numpy_booleans_are_taken_for_copy() -> None:
    """The keyword readers named their errors but refused ``np.False_`` and
    ``np.bool_(True)``, which PyO3's conversion had taken."""
    source = cp.empty((3,), "float32")
    copied = cp.from_dlpack(source, copy=np.bool_(True))
    assert copied.shape == (3,)
    assert np.from_dlpack(source, copy=np.False_).shape == (3,)
    handle = cp.MemoryManagement().reserve(16)
    assert handle.__dlpack__(copy=np.False_) is not None


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManaged(ctypes.Structure):
    pass


class _DLManagedVersioned(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_DLManaged._fields_ = [
    ("dl_tensor", _DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER),
]
_DLManagedVersioned._fields_ = [
    ("major", ctypes.c_uint32),
    ("minor", ctypes.c_uint32),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", _DLTensor),
]


class _CtypesProducer:
    """A DLPack producer written as a C library would write one: a capsule over ``data``
    (kept alive here) with the dtype and flags given, whose deleter counts its calls."""

    def __init__(self, data: np.ndarray, count: int, dtype: tuple[int, int, int], **kw: Any):
        self.data, self.deleted = data, 0
        self.shape = (ctypes.c_int64 * 1)(count)
        self.deleter = _DELETER(self._delete)
        tensor = _DLTensor(
            data.ctypes.data, _DLDevice(1, 0), 1, _DLDataType(*dtype), self.shape, None, 0
        )
        if kw.get("legacy"):
            self.managed: ctypes.Structure = _DLManaged(tensor, None, self.deleter)
            self.name = b"dltensor"
        else:
            self.managed = _DLManagedVersioned(1, 1, None, self.deleter, kw["flags"], tensor)
            self.name = b"dltensor_versioned"

    def _delete(self, _: int) -> None:
        self.deleted += 1

    def __dlpack__(self, **_: Any) -> object:
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self.managed), self.name, None)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


def test_from_dlpack_refuses_sub_byte_types_unless_padded() -> None:
    # DLPack 1.1: a type narrower than a byte is packed unless the producer sets
    # DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (1 << 2). cubepool holds uint1 as a byte
    # an element, so 4,096 packed uint1 (512 bytes) read as 4,096 bytes ran past the
    # producer's memory. (The buffer here is 4,096 bytes so that the old reading is
    # wrong, not a crash.)
    data = np.full(4096, 1, np.uint8)
    packed = _CtypesProducer(data, 4096, (1, 1, 1), flags=0)
    with pytest.raises(BufferError, match="1-bit dtype may be packed"):
        cp.from_dlpack(packed)
    legacy = _CtypesProducer(data, 4096, (1, 1, 1), legacy=True)
    with pytest.raises(BufferError, match="SUBBYTE_TYPE_PADDED"):
        cp.from_dlpack(legacy)
    assert packed.deleted == legacy.deleted == 0  # refused before taking ownership
    # A type cubepool cannot hold at all says so first, padded or not.
    int4 = _CtypesProducer(data, 4096, (0, 4, 1), flags=0)
    with pytest.raises(cp.TensorError, match=r"unsupported dtype \(code=0, bits=4"):
        cp.from_dlpack(int4)
    # Padded, as the flag says: a byte an element, imported as bool without a copy.
    padded = _CtypesProducer(data, 4096, (1, 1, 1), flags=1 << 2)
    t = cp.from_dlpack(padded)
    assert (t.dtype, t.shape, t.data_ptr()) == ("bool", (4096,), data.ctypes.data)
    assert np.asarray(t).all()
    del t
    gc.collect()
    assert padded.deleted == 1


def test_from_dlpack_refuses_more_dimensions_than_a_tensor_may_have() -> None:
    # A tensor file or a capsule of 65 dimensions made a tensor that neither the buffer
    # protocol nor cubepool's own shapes take: every way in stops at 64.
    a = np.zeros((1,) * 64, np.int8)
    assert cp.from_dlpack(a).ndim == 64
    over = _CtypesProducer(np.zeros(8, np.uint8), 1, (1, 8, 1), flags=0)
    over.managed.dl_tensor.ndim = 65
    over.shape = (ctypes.c_int64 * 65)(*([1] * 65))
    over.managed.dl_tensor.shape = over.shape
    with pytest.raises(ValueError, match="invalid ndim 65 \\(at most 64\\)"):
        cp.from_dlpack(over)
