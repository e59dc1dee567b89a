"""Tensors: construction, the buffer protocol, TVM's copy and view rules, memory= backing."""

from __future__ import annotations

import gc
import re
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

import cubepool as cp
from cubepool._cubepool import is_plain_buffer_format

NUMPY_DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
]


def test_constants() -> None:
    assert cp.ALLOC_ALIGNMENT == 64
    assert cp.TEMP_ALLOCA_ALIGNMENT == 64
    assert cp.MAX_STACK_ALLOCA == 1024
    assert cp.DEFAULT_WORKSPACE_ALIGNMENT == 1
    assert cp.TENSOR_MAGIC == 0xDD5E40F096B4A13F
    assert cp.PARAM_DICT_MAGIC == 0xF7E58D4F05049CB7


def test_device_type_to_str() -> None:
    assert cp.device_type_to_str(1) == "cpu"
    assert cp.device_type_to_str(2) == "cuda"
    assert cp.device_type_to_str(3) == "cuda_host"
    assert cp.device_type_to_str(13) == "cuda_managed"
    with pytest.raises(cp.TensorError, match="unknown type = 99"):
        cp.device_type_to_str(99)


def test_a_device_pickles_as_itself() -> None:
    import pickle

    for device in (cp.Device(), cp.Device("cpu", 1), cp.Device("cuda", 3), cp.Device(2, 0)):
        again = pickle.loads(pickle.dumps(device))
        assert again == device and repr(again) == repr(device)


def test_device() -> None:
    d = cp.Device("cpu:0")
    assert (d.device_type, d.device_id, d.kind) == (1, 0, "cpu")
    assert str(d) == "cpu:0"
    assert repr(d) == "Device('cpu:0')"
    assert d == cp.Device("cpu") == cp.Device(1, 0) == cp.Device()
    assert hash(d) == hash(cp.Device("cpu", 0))
    assert cp.Device("cuda", 2) == cp.Device("cuda:2")
    assert d.__dlpack_device__() == (1, 0)
    for bad in ["gpu", "cpu:", "cpu:-1", ""]:
        with pytest.raises(cp.TensorError):
            cp.Device(bad)
    with pytest.raises(ValueError):
        cp.Device("cpu:0", 1)


@pytest.mark.parametrize("dtype", [*NUMPY_DTYPES, "bfloat16", "float32x4"])
def test_empty_properties_and_alignment(dtype: str) -> None:
    t = cp.empty((2, 3), dtype)
    assert t.shape == (2, 3)
    assert t.dtype == dtype
    assert t.device == cp.Device("cpu:0")
    assert t.byte_offset == 0
    assert t.ndim == 2
    assert t.size == 6
    assert t.strides == (3, 1)
    assert not t.readonly
    assert t.data_ptr() % cp.ALLOC_ALIGNMENT == 0
    itemsize = {"bool": 1, "bfloat16": 2, "float32x4": 16}.get(dtype) or np.dtype(dtype).itemsize
    assert t.nbytes == 6 * itemsize
    assert bytes(memoryview(t).cast("B")) == bytes(t.nbytes)  # zero-filled
    assert re.fullmatch(
        rf"<Tensor shape=\[2, 3\] dtype={dtype} device=cpu:0 byte_offset=0 nbytes=\d+>", repr(t)
    )


def test_empty_arguments() -> None:
    assert cp.empty(5).shape == (5,)
    assert cp.empty(5).dtype == "float32"
    assert cp.empty([], "int8").shape == ()
    assert cp.empty((0, 7), "int8").nbytes == 0
    assert cp.empty((2,), np.dtype("int16")).dtype == "int16"
    assert cp.empty((2,), "float32", device="cpu:0").nbytes == 8
    assert cp.empty((2,), "float32", device=(1, 0)).nbytes == 8
    with pytest.raises(cp.TensorError, match="negative dimension"):
        cp.empty((2, -1), "float32")
    with pytest.raises(cp.TensorError, match="unknown dtype"):
        cp.empty((2,), "float8")
    with pytest.raises(cp.TensorError, match="not supported"):
        cp.empty((2,), "float32", device="cuda:0")
    with pytest.raises(cp.TensorError, match="overflows"):
        cp.empty((2**62, 2**62), "float32")
    with pytest.raises(TypeError):
        cp.empty("abc", "float32")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cp.Tensor()


def test_tensor_error_is_value_error() -> None:
    assert issubclass(cp.TensorError, cp.CubepoolError)
    assert issubclass(cp.TensorError, ValueError)
    assert issubclass(cp.TensorFormatError, cp.CubepoolError)
    assert issubclass(cp.TensorFormatError, ValueError)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_asarray_is_zero_copy_and_typed(dtype: str) -> None:
    t = cp.empty((3, 4), dtype)
    a = np.asarray(t)
    assert a.dtype == np.dtype(dtype)
    assert a.shape == (3, 4)
    assert a.flags.c_contiguous and a.flags.writeable
    assert a.ctypes.data == t.data_ptr()
    a[...] = np.arange(12).reshape(3, 4).astype(dtype)
    again = t.numpy()
    assert again.ctypes.data == t.data_ptr()
    np.testing.assert_array_equal(again, np.arange(12).reshape(3, 4).astype(dtype))


def test_buffer_formats() -> None:
    expected = {
        "bool": "?",
        "int8": "b",
        "int16": "h",
        "int32": "i",
        "int64": "q",
        "uint8": "B",
        "uint16": "H",
        "uint32": "I",
        "uint64": "Q",
        "float16": "e",
        "float32": "f",
        "float64": "d",
        "bfloat16": "H",
    }
    for dtype, fmt in expected.items():
        m = memoryview(cp.empty((2, 5), dtype))
        assert m.format == fmt, dtype
        assert m.shape == (2, 5)
        assert m.strides == (5 * m.itemsize, m.itemsize)
        assert not m.readonly
    lanes = memoryview(cp.empty((2,), "float32x4"))
    assert (lanes.format, lanes.shape, lanes.strides) == ("f", (2, 4), (16, 4))
    assert memoryview(cp.empty((), "int32")).shape == ()


def test_bfloat16_exports_raw_bits() -> None:
    t = cp.empty((2,), "bfloat16")
    a = np.asarray(t)
    assert a.dtype == np.uint16
    # 1.0 in bfloat16 is the top half of float32 1.0.
    a[:] = np.array([1.0, -2.0], dtype=np.float32).view(np.uint32) >> 16
    assert cp.copy_to_bytes(t) == bytes.fromhex("803f00c0")


def test_buffer_keeps_tensor_alive() -> None:
    t = cp.empty((1000,), "float64")
    a = np.asarray(t)
    a[:] = 7.0
    del t
    gc.collect()
    junk = [cp.empty((1000,), "float64") for _ in range(10)]
    assert (a == 7.0).all()
    del junk


def test_copy_from_to_rules() -> None:
    src = cp.empty((2,), "float32")
    np.asarray(src)[:] = [1.5, 2.5]
    dst = cp.empty((8,), "uint8")  # same byte size, other dtype: allowed (TVM)
    cp.copy_from_to(src, dst)
    assert cp.copy_to_bytes(dst) == np.array([1.5, 2.5], np.float32).tobytes()
    with pytest.raises(cp.TensorError, match="The size in bytes must exactly match"):
        cp.copy_from_to(src, cp.empty((3,), "float32"))
    with pytest.raises(TypeError):
        cp.copy_from_to(np.zeros(2, np.float32), dst)  # type: ignore[arg-type]
    big_src = cp.empty((1 << 19,), "float32")
    np.asarray(big_src)[:] = 3.0
    big_dst = cp.empty((1 << 19,), "float32")
    cp.copy_from_to(big_src, big_dst)  # large enough to run detached
    assert (np.asarray(big_dst) == 3.0).all()


def test_copy_between_overlapping_views() -> None:
    t = cp.empty((8,), "int32")
    np.asarray(t)[:] = np.arange(8)
    lo = cp.create_view(t, (6,), "int32")
    hi = cp.create_view(t, (6,), "int32", 8)
    cp.copy_from_to(lo, hi)
    np.testing.assert_array_equal(np.asarray(t), [0, 1, 0, 1, 2, 3, 4, 5])


def test_copy_to_always_allocates() -> None:
    src = cp.empty((3,), "int64")
    np.asarray(src)[:] = [1, 2, 3]
    out = cp.copy_to(src, "cpu")
    assert out.data_ptr() != src.data_ptr()
    assert out.shape == src.shape and out.dtype == src.dtype
    np.testing.assert_array_equal(np.asarray(out), [1, 2, 3])
    np.asarray(out)[0] = 9
    assert np.asarray(src)[0] == 1
    assert cp.copy_to(src).data_ptr() % 64 == 0
    with pytest.raises(cp.TensorError):
        cp.copy_to(src, cp.Device("cuda:0"))


def test_create_view_rules() -> None:
    t = cp.empty((4,), "float32")
    np.asarray(t)[:] = [0, 1, 2, 3]
    v = cp.create_view(t, (2,), "float32", 8)
    assert v.byte_offset == 8
    assert v.data_ptr() == t.data_ptr() + 8
    np.testing.assert_array_equal(np.asarray(v), [2, 3])
    vv = cp.create_view(v, (4,), "uint8", 4)
    assert vv.byte_offset == 12
    message = (
        "View with shape [3] and datatype float32 would have a size of 12 bytes.  This would "
        "occupy bytes 8 <= i_byte < 20 within the backing array.  However, the Tensor being "
        "viewed only contains 16 bytes (shape = [4], dtype= float32)."
    )
    with pytest.raises(cp.TensorError) as info:
        cp.create_view(t, (3,), "float32", 8)
    assert str(info.value) == message
    with pytest.raises(cp.TensorError):
        cp.create_view(t, (1,), "float32", 2**64 - 1)
    with pytest.raises(cp.InvalidArgument, match="relative_byte_offset must be non-negative"):
        cp.create_view(t, (1,), "float32", -1)
    with pytest.raises(cp.TensorError, match="negative"):
        cp.create_view(t, (-1,), "float32")
    # The view keeps the source's memory alive.
    del t
    gc.collect()
    np.testing.assert_array_equal(np.asarray(v), [2, 3])
    np.testing.assert_array_equal(np.asarray(vv), np.array([3], np.float32).view(np.uint8))


def test_copy_from_bytes_and_to_bytes() -> None:
    t = cp.empty((2,), "int16")
    cp.copy_from_bytes(t, b"\x01\x00\x02\x00")
    np.testing.assert_array_equal(np.asarray(t), [1, 2])
    cp.copy_from_bytes(t, np.array([5, 6], np.int16))
    cp.copy_from_bytes(t, bytearray(b"\x07\x00\x08\x00"))
    assert cp.copy_to_bytes(t) == b"\x07\x00\x08\x00"
    with pytest.raises(cp.TensorError, match="The size in bytes must exactly match"):
        cp.copy_from_bytes(t, b"\x00" * 3)
    with pytest.raises(cp.TensorError, match="C-contiguous"):
        cp.copy_from_bytes(t, np.zeros(4, np.int16)[::2])
    out = bytearray(4)
    assert cp.copy_to_bytes(t, out) is None
    assert out == b"\x07\x00\x08\x00"
    with pytest.raises(cp.TensorError, match="The size in bytes must exactly match"):
        cp.copy_to_bytes(t, bytearray(5))
    with pytest.raises(cp.TensorError, match="read-only"):
        cp.copy_to_bytes(t, b"\x00" * 4)
    # A source aliasing the destination is fine (memmove).
    cp.copy_from_bytes(t, memoryview(t))
    assert cp.copy_to_bytes(t) == b"\x07\x00\x08\x00"
    t.copyfrom(np.array([3, 4], np.int16))
    t.copyfrom(cp.copy_to(t))
    np.testing.assert_array_equal(np.asarray(t), [3, 4])


class BytearrayMemory:
    """Stand-in for cubepool.MemoryManagement: reserve(n) returns a bytearray."""

    def __init__(self) -> None:
        self.handles: list[bytearray] = []

    def reserve(self, nbytes: int) -> bytearray:
        handle = bytearray(nbytes)
        self.handles.append(handle)
        return handle


def test_empty_with_memory_holds_the_handle() -> None:
    memory = BytearrayMemory()
    t = cp.empty((4,), "float32", memory=memory)
    assert len(memory.handles) == 1
    handle = memory.handles[0]
    assert len(handle) == 16
    np.asarray(t)[:] = [1, 2, 3, 4]
    assert bytes(handle) == np.array([1, 2, 3, 4], np.float32).tobytes()
    # The tensor holds a buffer export: the handle cannot be resized (released) meanwhile.
    with pytest.raises(BufferError):
        handle.extend(b"x")
    view = cp.create_view(t, (2,), "float32", 8)
    del t
    gc.collect()
    with pytest.raises(BufferError):
        handle.extend(b"x")
    del view
    gc.collect()
    handle.extend(b"x")  # every export released
    assert cp.empty((0,), "float32", memory=memory).nbytes == 0
    assert len(memory.handles) == 1  # nothing reserved for zero bytes


def test_empty_with_memory_validates_the_buffer() -> None:
    class Misaligned:
        def reserve(self, nbytes: int) -> memoryview:
            base = np.zeros(nbytes + 64, np.uint8)
            offset = (-base.ctypes.data) % 64 + 1
            return base.data[offset : offset + nbytes]

    class TooSmall:
        def reserve(self, nbytes: int) -> bytearray:
            return bytearray(nbytes - 1)

    class ReadOnly:
        def reserve(self, nbytes: int) -> bytes:
            return bytes(nbytes)

    class NoBuffer:
        def reserve(self, nbytes: int) -> int:
            return nbytes

    with pytest.raises(cp.TensorError, match="not aligned to 4 bytes"):
        cp.empty((4,), "float32", memory=Misaligned())
    assert cp.empty((4,), "int8", memory=Misaligned()).nbytes == 4  # int8 needs no alignment
    with pytest.raises(cp.TensorError, match="has 15 bytes but 16 bytes were requested"):
        cp.empty((4,), "float32", memory=TooSmall())
    with pytest.raises(cp.TensorError, match="read-only"):
        cp.empty((4,), "float32", memory=ReadOnly())
    with pytest.raises(TypeError):
        cp.empty((4,), "float32", memory=NoBuffer())
    with pytest.raises(cp.TensorError):
        cp.empty((4,), "float32", device="cuda", memory=BytearrayMemory())


def test_a_buffer_of_python_objects_never_backs_or_receives_a_tensor() -> None:
    # An object array's items are pointers it owns: a tensor over one (empty(memory=...)
    # of a reserve returning one) wrote bytes the array then freed as objects (SIGSEGV).
    class Objects:
        def reserve(self, nbytes: int) -> np.ndarray:
            return np.empty(nbytes // 8 + 1, dtype=object)

    with pytest.raises(cp.TensorError, match='must hold numbers or bytes, not items of format "O"'):
        cp.empty((4,), "uint8", memory=Objects())
    tensor = cp.empty((8,), "uint8")
    with pytest.raises(cp.TensorError, match="must hold numbers or bytes"):
        cp.copy_to_bytes(tensor, np.empty(1, dtype=object))
    with pytest.raises(cp.TensorError, match="must hold numbers or bytes"):
        cp.copy_from_bytes(tensor, np.zeros(1, dtype=[("a", "O")]))
    # Numbers and bytes of any kind still back and receive tensors.
    for out in (bytearray(8), np.zeros(2, np.float32), np.zeros(1, "S8"), np.zeros(4, np.int16)):
        cp.copy_to_bytes(tensor, out)
    assert is_plain_buffer_format("<d") and not is_plain_buffer_format("O")


def test_tensor_keeps_a_scalars_shape_and_a_tensors_dtype() -> None:
    # ascontiguousarray made a 0-d input 1-d, and a Tensor went through numpy, so
    # bfloat16 came back uint16 and float32x4 as float32 with an axis more.
    for scalar in (np.float32(3.5), np.array(3.5, np.float32), 3.5):
        t = cp.tensor(scalar)
        assert t.shape == () and float(np.asarray(t)) == 3.5
    assert cp.tensor([[1, 2], [3, 4]]).shape == (2, 2)
    for dtype in ("bfloat16", "float32x4", "int32"):
        source = cp.empty((2,), dtype)
        cp.copy_from_bytes(source, bytes(range(source.nbytes)))
        copied = cp.tensor(source)
        assert (copied.shape, copied.dtype) == ((2,), dtype)
        assert cp.copy_to_bytes(copied) == cp.copy_to_bytes(source)


def test_a_zero_dimensional_buffer_is_copied_from_and_into() -> None:
    # numpy exports a 0-d array or scalar without a shape, which was refused with a bare
    # "BufferError: shape is null".
    s = cp.empty((), "float32")
    s.copyfrom(np.float32(3.5))
    assert float(np.asarray(s)) == 3.5
    cp.copy_from_bytes(s, np.array(1.25, np.float32))
    out = np.zeros((), np.float32)
    cp.copy_to_bytes(s, out)
    assert float(out) == 1.25
    with pytest.raises(TypeError, match=r"copy_from_bytes: its source \(object\) exports no"):
        cp.copy_from_bytes(s, object())
    with pytest.raises(cp.TensorError, match="holds numbers, not items of dtype object"):
        s.copyfrom(np.array(object(), dtype=object))  # 0-d, of objects


def test_copyfrom_converts_an_arrays_values_to_the_tensors_dtype() -> None:
    # The bytes were copied as they were: int32 1 and 2 read as float32 1e-45 and 3e-45.
    t = cp.empty((2,), "float32")
    t.copyfrom(np.array([1, 2], np.int32))
    np.testing.assert_array_equal(t.numpy(), [1.0, 2.0])
    # numpy's casts, as TVM's np.ascontiguousarray(source, dtype=...) makes them.
    ints = cp.empty((2, 2), "int16")
    ints.copyfrom(np.array([[1.9, -2.9], [3.0, 4.5]], np.float64))
    np.testing.assert_array_equal(ints.numpy(), [[1, -2], [3, 4]])
    ints.copyfrom(np.array([[True, False], [False, True]]))
    np.testing.assert_array_equal(ints.numpy(), [[1, 0], [0, 1]])
    # A strided array of another dtype, read in C order.
    strided = np.arange(6, dtype=np.int64).reshape(2, 3).T
    floats = cp.empty((3, 2), "float64")
    floats.copyfrom(strided)
    np.testing.assert_array_equal(floats.numpy(), strided.astype(np.float64))
    # A vector dtype: its lanes are a last axis, as numpy sees the tensor.
    lanes = cp.empty((2,), "float32x2")
    lanes.copyfrom(np.array([[1, 2], [3, 4]], np.int8))
    np.testing.assert_array_equal(lanes.numpy(), [[1.0, 2.0], [3.0, 4.0]])
    # The shape must be the tensor's, whatever the byte sizes.
    with pytest.raises(cp.TensorError, match=r"source shape \[4\], tensor shape \[2, 2\]"):
        ints.copyfrom(np.arange(4, dtype=np.int16))
    with pytest.raises(cp.TensorError, match=r"source shape \[2\], tensor shape \[2, 2\]"):
        lanes.copyfrom(np.zeros(2, np.float64))
    np.testing.assert_array_equal(ints.numpy(), [[1, 0], [0, 1]])


def test_copyfrom_rounds_numbers_to_bfloat16_and_takes_uint16_as_its_bits() -> None:
    t = cp.empty((7,), "bfloat16")
    values = np.array([1.0, 3.14159265, -0.0, np.inf, np.nan, 1.00390625, 1.01171875], np.float32)
    t.copyfrom(values)
    # 1.00390625 and 1.01171875 lie halfway between two bfloat16s: ties go to the even.
    assert [hex(b) for b in t.numpy()] == [
        "0x3f80",
        "0x4049",
        "0x8000",
        "0x7f80",
        "0x7fc0",
        "0x3f80",
        "0x3f82",
    ]
    t.copyfrom([2, 0.5, -1, 0, 0, 0, 0])  # a list: its numbers, converted
    assert t.numpy()[:3].tolist() == [0x4000, 0x3F00, 0xBF80]
    # A uint16 array is bits, as a bfloat16 tensor exports them: a round trip keeps them.
    bits = np.array([0x3F80, 0x4049, 0x0001, 0xFFFF, 0x7F7F, 0x8000, 0x1234], np.uint16)
    t.copyfrom(bits)
    np.testing.assert_array_equal(t.numpy(), bits)
    u = cp.empty((7,), "bfloat16")
    u.copyfrom(t.numpy())
    assert cp.copy_to_bytes(u) == cp.copy_to_bytes(t)


def test_copyfrom_takes_array_likes_as_tvm_does() -> None:
    # A list raised a bare TypeError ("exports no buffer"); TVM makes an array of it.
    t = cp.empty((2,), "float32")
    t.copyfrom([1.0, 2.0])
    np.testing.assert_array_equal(t.numpy(), [1.0, 2.0])
    t.copyfrom((3, 4))
    np.testing.assert_array_equal(t.numpy(), [3.0, 4.0])
    grid = cp.empty((2, 2), "int32")
    grid.copyfrom([[1, 2], [3, 4]])
    np.testing.assert_array_equal(grid.numpy(), [[1, 2], [3, 4]])
    scalar = cp.empty((), "int8")
    scalar.copyfrom(-5)
    assert int(scalar.numpy()) == -5
    flags = cp.empty((3,), "bool")
    flags.copyfrom([1, 0, 2])
    assert flags.numpy().tolist() == [True, False, True]
    # A buffer is an array of its items, not of its bytes (copy_from_bytes copies bytes).
    t.copyfrom(memoryview(np.array([5.0, 6.0])))
    np.testing.assert_array_equal(t.numpy(), [5.0, 6.0])


@pytest.mark.parametrize(
    ("source", "kind", "problem"),
    [
        ([1.0, 2.0, 3.0], None, r"source shape \[3\], tensor shape \[2\]"),
        ([[1.0], [2.0]], None, r"source shape \[2, 1\], tensor shape \[2\]"),
        ([[1.0], [2.0, 3.0]], "list", "inhomogeneous"),
        (object(), "object", "dtype object"),
        (None, "NoneType", "dtype object"),
        ([1, None], "list", "dtype object"),
        (["a", "b"], "list", "could not convert string to float"),
        (b"\x00" * 8, "bytes", "could not convert"),
        (iter([1.0, 2.0]), "list_iterator", "dtype object"),
    ],
)
def test_copyfrom_refuses_what_it_cannot_convert_and_leaves_the_tensor(
    source: object, kind: str | None, problem: str
) -> None:
    t = cp.empty((2,), "float32")
    t.copyfrom([7.0, 8.0])
    expected = problem if kind is None else rf"copyfrom: its source \({kind}\) .*{problem}"
    with pytest.raises(cp.TensorError, match=expected):
        t.copyfrom(source)
    np.testing.assert_array_equal(t.numpy(), [7.0, 8.0])


def test_copyfrom_refuses_an_int_out_of_the_dtypes_range() -> None:
    small = cp.empty((2,), "int8")
    small.copyfrom([1, 2])
    with pytest.raises(cp.TensorError, match=r"copyfrom: its source \(list\) .*out of bounds"):
        small.copyfrom([1, 300])
    np.testing.assert_array_equal(small.numpy(), [1, 2])


def test_copyfrom_returns_the_tensor_as_tvms_does() -> None:
    t = cp.empty((2,), "float32")
    assert t.copyfrom([1.0, 2.0]) is t
    other = cp.empty((2,), "float32")
    assert other.copyfrom(t) is other
    np.testing.assert_array_equal(other.numpy(), [1.0, 2.0])


def test_copyfrom_converts_numbers_numpy_keeps_as_objects() -> None:
    # An int past int64, a Fraction, a Decimal: numpy keeps them as objects, and
    # np.array(source, dtype=...) (TVM's call) converts them; they were refused.
    t = cp.empty((2,), "float32")
    t.copyfrom([2**70, 1])
    np.testing.assert_array_equal(t.numpy(), np.array([2.0**70, 1.0], np.float32))
    t.copyfrom([Fraction(1, 2), Decimal("0.25")])
    np.testing.assert_array_equal(t.numpy(), [0.5, 0.25])
    wide = cp.empty((), "float64")
    wide.copyfrom(10**30)
    assert float(wide.numpy()) == 1e30
    # Into an int64 tensor the same int is out of range: refused, the tensor kept.
    ints = cp.empty((1,), "int64")
    ints.copyfrom([3])
    with pytest.raises(cp.TensorError, match=r"copyfrom: its source \(list\)"):
        ints.copyfrom([2**70])
    assert ints.numpy().tolist() == [3]


class _Counted:
    """An array-like that counts its conversions and may fail in them."""

    def __init__(self, values: list[float], fail: BaseException | None = None) -> None:
        self.values = values
        self.fail = fail
        self.calls = 0

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray[Any, Any]:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return np.array(self.values, dtype=dtype)


def test_copyfrom_converts_an_array_like_once_and_names_its_failure() -> None:
    t = cp.empty((2,), "float32")
    source = _Counted([1.5, 2.5])
    t.copyfrom(source)
    assert source.calls == 1
    np.testing.assert_array_equal(t.numpy(), [1.5, 2.5])
    # Whatever its __array__ raises is a TensorError naming copyfrom (it escaped as is).
    broken = _Counted([0.0, 0.0], fail=RuntimeError("boom"))
    with pytest.raises(cp.TensorError, match=r"copyfrom: its source \(_Counted\) .*boom"):
        t.copyfrom(broken)
    np.testing.assert_array_equal(t.numpy(), [1.5, 2.5])
