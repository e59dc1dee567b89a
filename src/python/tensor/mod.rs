//! Python skin of `crate::tensor`: `Tensor`, `Device`, `TensorMemoryPool`, the TVM tensor
//! functions, DLPack and the file format.

mod buffer;
pub(crate) mod dlpack;
mod errors;
mod io;
mod pool;

use std::ffi::c_int;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyTuple};

use crate::python::args::i32_arg;
use crate::tensor::{self as core, DataType, Device, Tensor, TensorError};

pub(crate) use buffer::{tensor_over_buffer, PyBufferBacking};

/// Copies of at least this many bytes run with the interpreter detached.
const DETACH_BYTES: usize = 1 << 20;

/// A device: a DLPack device type and an ordinal. ``Device("cpu")``, ``Device("cpu:0")``,
/// ``Device("cuda", 1)`` or ``Device(1, 0)``. cubepool allocates only on ``cpu:0``.
#[pyclass(
    name = "Device",
    module = "cubepool._cubepool",
    frozen,
    eq,
    hash,
    skip_from_py_object
)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PyDevice {
    pub(crate) inner: Device,
}

#[pymethods]
impl PyDevice {
    #[new]
    #[pyo3(signature = (device_type = None, device_id = None))]
    fn py_new(
        device_type: Option<&Bound<'_, PyAny>>,
        device_id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let device_id = match device_id {
            Some(id) if !id.is_none() => Some(i32_arg(id, "device_id")?),
            _ => None,
        };
        let inner = match device_type {
            None => Device::new(core::device::CPU, device_id.unwrap_or(0))?,
            Some(obj) if obj.is_instance_of::<PyString>() => {
                let name: String = obj.extract()?;
                let parsed = Device::parse(&name)?;
                match device_id {
                    Some(_) if name.contains(':') => {
                        return Err(PyValueError::new_err(format!(
                            "device {name:?} already names an ordinal; do not pass device_id"
                        )))
                    }
                    Some(id) => Device::new(parsed.device_type, id)?,
                    None => parsed,
                }
            }
            Some(obj) => Device::new(i32_arg(obj, "device_type")?, device_id.unwrap_or(0))?,
        };
        Ok(PyDevice { inner })
    }

    /// The DLPack device type (1 for CPU).
    #[getter]
    fn device_type(&self) -> i32 {
        self.inner.device_type
    }

    /// The device ordinal.
    #[getter]
    fn device_id(&self) -> i32 {
        self.inner.device_id
    }

    /// The device type's name, as ``device_type_to_str`` gives it (``"cpu"``).
    #[getter]
    fn kind(&self) -> PyResult<&'static str> {
        Ok(core::device_type_to_str(self.inner.device_type)?)
    }

    fn __str__(&self) -> String {
        self.inner.to_string()
    }

    fn __repr__(&self) -> String {
        format!("Device('{}')", self.inner)
    }

    /// ``(device_type, device_id)``, as ``__dlpack_device__`` reports it.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (self.inner.device_type, self.inner.device_id)
    }

    /// Pickles as ``Device(device_type, device_id)`` (a Disco worker's result crosses
    /// processes pickled).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> (Bound<'py, pyo3::types::PyType>, (i32, i32)) {
        let inner = slf.get().inner;
        (slf.get_type(), (inner.device_type, inner.device_id))
    }
}

/// Accepts a ``Device``, a device string (``"cpu"``, ``"cpu:0"``) or a
/// ``(device_type, device_id)`` tuple; ``None`` means ``cpu:0``.
pub(crate) fn extract_device(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Device> {
    let Some(obj) = obj else {
        return Ok(Device::CPU0);
    };
    if obj.is_none() {
        return Ok(Device::CPU0);
    }
    if let Ok(dev) = obj.cast::<PyDevice>() {
        return Ok(dev.get().inner);
    }
    if obj.is_instance_of::<PyString>() {
        return Ok(Device::parse(&obj.extract::<String>()?)?);
    }
    if obj.is_instance_of::<PyTuple>() {
        let (device_type, device_id): (Bound<'_, PyAny>, Bound<'_, PyAny>) = obj.extract()?;
        return Ok(Device::new(
            i32_arg(&device_type, "device_type")?,
            i32_arg(&device_id, "device_id")?,
        )?);
    }
    Err(PyTypeError::new_err(format!(
        "expected a Device, a device string or a (device_type, device_id) tuple, got {}",
        obj.get_type().name()?
    )))
}

/// Accepts a TVM dtype string (``"float32"``) or an object with a string ``name``
/// (a ``numpy.dtype``).
pub(crate) fn extract_dtype(obj: &Bound<'_, PyAny>) -> PyResult<DataType> {
    if obj.is_instance_of::<PyString>() {
        return Ok(DataType::parse(&obj.extract::<String>()?)?);
    }
    if let Ok(name) = obj.getattr("name") {
        if let Ok(name) = name.extract::<String>() {
            return Ok(DataType::parse(&name)?);
        }
    }
    Err(PyTypeError::new_err(format!(
        "dtype must be a TVM dtype string such as \"float32\", got {}",
        obj.get_type().name()?
    )))
}

/// Accepts an int or a sequence of ints.
pub(crate) fn extract_shape(obj: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    if let Ok(n) = obj.extract::<i64>() {
        return Ok(vec![n]);
    }
    if obj.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(
            "shape must be an int or a sequence of ints",
        ));
    }
    // Iterate instead of extracting a Vec: pyo3 sizes a Vec by `len()`, which a
    // hostile object can make enormous.
    use crate::tensor::MAX_NDIM;
    let error = || PyTypeError::new_err("shape must be an int or a sequence of ints");
    let mut shape = Vec::new();
    for item in obj.try_iter().map_err(|_| error())? {
        if shape.len() == MAX_NDIM {
            return Err(PyTypeError::new_err(format!(
                "shape has more than {MAX_NDIM} dimensions"
            )));
        }
        shape.push(item?.extract::<i64>().map_err(|_| error())?);
    }
    Ok(shape)
}

/// A compact row-major tensor in host memory (TVM's ``runtime.Tensor``).
///
/// Make one with ``cubepool.empty``, ``TensorMemoryPool.empty``, ``create_view``,
/// ``copy_to``, ``from_dlpack`` or ``load_tensor``. It exports its memory through the
/// buffer protocol (``numpy.asarray(t)`` is a zero-copy typed array; ``bfloat16`` appears
/// as ``uint16``, its raw bits) and through DLPack (``numpy.from_dlpack(t)``,
/// ``torch.from_dlpack(t)``). Exports and views keep the memory alive.
#[pyclass(name = "Tensor", module = "cubepool._cubepool", frozen)]
pub(crate) struct PyTensor {
    pub(crate) inner: Tensor,
}

impl PyTensor {
    pub(crate) fn new(inner: Tensor) -> Self {
        PyTensor { inner }
    }
}

#[pymethods]
impl PyTensor {
    /// The shape, a tuple of ints.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.shape())
    }

    /// The TVM dtype string (``"float32"``, ``"bfloat16"``, ``"bool"``, ...).
    #[getter]
    fn dtype(&self) -> String {
        self.inner.dtype().to_string()
    }

    /// The device (always ``cpu:0``).
    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice {
            inner: self.inner.device(),
        }
    }

    /// Offset in bytes of the first element inside the backing buffer.
    #[getter]
    fn byte_offset(&self) -> usize {
        self.inner.byte_offset()
    }

    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }

    /// Number of dimensions.
    #[getter]
    fn ndim(&self) -> usize {
        self.inner.shape().len()
    }

    /// Number of elements.
    #[getter]
    fn size(&self) -> usize {
        self.inner.numel()
    }

    /// Row-major strides, in elements.
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.strides())
    }

    /// Whether the memory may not be written (a read-only DLPack import).
    #[getter]
    fn readonly(&self) -> bool {
        self.inner.readonly()
    }

    /// Address of the first element.
    fn data_ptr(&self) -> usize {
        self.inner.data_ptr() as usize
    }

    /// A zero-copy ``numpy.ndarray`` over this tensor (``numpy.asarray(self)``).
    fn numpy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        slf.py().import("numpy")?.call_method1("asarray", (slf,))
    }

    /// Copies ``source`` into this tensor (TVM's ``copyfrom``). A ``Tensor`` is copied as
    /// ``copy_from_to`` copies it. Anything else (a numpy array, a list, a scalar, any
    /// array-like) has its values converted to this tensor's dtype, as TVM converts them
    /// (numpy's casts; ``bfloat16`` takes a ``uint16`` array as its bits and rounds other
    /// numbers to nearest, ties to even), and must have this tensor's shape (a vector
    /// dtype's lanes as a last axis); a strided array is read in C order. A source that
    /// cannot be converted, or of another shape, is a ``TensorError`` naming both, and
    /// the tensor is left as it was. Returns this tensor, as TVM's does.
    /// ``copy_from_bytes`` copies raw bytes.
    fn copyfrom<'py>(
        slf: &Bound<'py, Self>,
        source: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, Self>> {
        if let Ok(src) = source.cast::<PyTensor>() {
            copy_tensors(slf.py(), &src.get().inner, &slf.get().inner, "copy_from_to")?;
            return Ok(slf.clone());
        }
        // The conversion is numpy's: cubepool._tensor.copyfrom_values makes a C-contiguous
        // array of this tensor's shape and element type, whose bytes are then copied (the
        // byte sizes are checked again there).
        let values = slf
            .py()
            .import("cubepool._tensor")?
            .call_method1("copyfrom_values", (slf, source))?;
        copy_from_bytes(&slf.get().inner, &values, "copyfrom")?;
        Ok(slf.clone())
    }

    fn __repr__(&self) -> String {
        format!(
            "<Tensor shape={:?} dtype={} device={} byte_offset={} nbytes={}>",
            self.inner.shape(),
            self.inner.dtype(),
            self.inner.device(),
            self.inner.byte_offset(),
            self.inner.nbytes()
        )
    }

    /// Exports the tensor as a DLPack capsule: legacy ``"dltensor"`` by default, versioned
    /// ``"dltensor_versioned"`` (writable unless the tensor is read-only) when
    /// ``max_version >= (1, 0)``. ``copy=True`` exports a fresh copy.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        #[pyo3(from_py_with = crate::python::args::dlpack_max_version)] max_version: Option<(
            u64,
            u64,
        )>,
        #[pyo3(from_py_with = crate::python::args::dlpack_device)] dl_device: Option<(i32, i32)>,
        #[pyo3(from_py_with = crate::python::args::dlpack_copy)] copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        dlpack::dlpack_method(py, &self.inner, stream, max_version, dl_device, copy)
    }

    /// ``(device_type, device_id)`` of the tensor: ``(1, 0)``.
    fn __dlpack_device__(&self) -> (i32, i32) {
        let d = self.inner.device();
        (d.device_type, d.device_id)
    }

    /// # Safety
    ///
    /// Called by CPython with a valid `Py_buffer`.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let tensor = slf.get().inner.clone();
        // SAFETY: `view` comes from CPython's `bf_getbuffer` (caller contract).
        unsafe { buffer::fill_view(slf.as_any(), &tensor, view, flags) }
    }

    /// # Safety
    ///
    /// Called by CPython with a view this object filled.
    unsafe fn __releasebuffer__(&self, view: *mut pyo3::ffi::Py_buffer) {
        // SAFETY: `view` was filled by `__getbuffer__` (caller contract).
        unsafe { buffer::release_view(view) }
    }
}

fn copy_tensors(py: Python<'_>, src: &Tensor, dst: &Tensor, op: &'static str) -> PyResult<()> {
    if src.nbytes() >= DETACH_BYTES {
        let (src, dst) = (src.clone(), dst.clone());
        py.detach(move || src.region().copy_to(dst.region(), op))?;
    } else {
        src.region().copy_to(dst.region(), op)?;
    }
    Ok(())
}

fn copy_from_bytes(dst: &Tensor, data: &Bound<'_, PyAny>, op: &'static str) -> PyResult<()> {
    let src = tensor_over_buffer(data, op)?;
    copy_tensors(data.py(), &src, dst, op)
}

/// Converts a ``Tensor`` or any DLPack producer to a core tensor.
pub(crate) fn as_tensor(obj: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    if let Ok(t) = obj.cast::<PyTensor>() {
        return Ok(t.get().inner.clone());
    }
    if obj.hasattr("__dlpack__")? {
        return dlpack::from_dlpack(obj, None, None);
    }
    Err(PyTypeError::new_err(format!(
        "expected a cubepool.Tensor or a DLPack producer, got {}",
        obj.get_type().name()?
    )))
}

fn tensor_ref<'a, 'py>(
    obj: &'a Bound<'py, PyAny>,
    what: &str,
) -> PyResult<&'a Bound<'py, PyTensor>> {
    obj.cast::<PyTensor>()
        .map_err(|_| PyTypeError::new_err(format!("{what} must be a cubepool.Tensor")))
}

/// Backs a tensor with memory reserved from a ``MemoryManagement`` (any object whose
/// ``reserve(nbytes)`` returns a writable, C-contiguous buffer of at least ``nbytes``).
fn empty_from_memory(
    memory: &Bound<'_, PyAny>,
    shape: &[i64],
    dtype: DataType,
) -> PyResult<Tensor> {
    let nbytes = core::byte_size(shape, dtype)?;
    if nbytes == 0 {
        // Nothing to reserve: an empty tensor needs no memory.
        return Ok(Tensor::empty(shape, dtype, Device::CPU0)?);
    }
    let handle = memory.call_method1("reserve", (nbytes,))?;
    let backing = PyBufferBacking::acquire(&handle, "empty(memory=...)")?;
    let backing = backing.into_backing();
    if backing.readonly() {
        return Err(TensorError::ReadOnlyBacking {
            what: "reserved buffer",
        }
        .into());
    }
    if backing.len() < nbytes {
        return Err(TensorError::BackingTooSmall {
            what: "reserved buffer",
            actual: backing.len(),
            required: nbytes,
        }
        .into());
    }
    let alignment = dtype.natural_alignment();
    let address = backing.as_ptr() as usize;
    if address % alignment != 0 {
        return Err(TensorError::Misaligned {
            what: "reserved buffer",
            address,
            alignment,
        }
        .into());
    }
    Ok(Tensor::from_backing(
        backing,
        0,
        shape,
        dtype,
        Device::CPU0,
    )?)
}

/// Allocates an uninitialised compact tensor, aligned to
/// ``max(ALLOC_ALIGNMENT, itemsize)`` (TVM's ``runtime.Empty``). Without ``memory``
/// its bytes are zero-filled.
///
/// With ``memory`` (a ``cubepool.MemoryManagement``), the bytes come from
/// ``memory.reserve(nbytes)`` and are held until the tensor and all its views and exports
/// are gone; they must be aligned to the dtype's natural alignment. They are not
/// cleared: like ``numpy.empty``'s, they hold whatever the reservation's bytes held.
#[pyfunction]
#[pyo3(signature = (shape, dtype = None, device = None, memory = None))]
fn empty(
    shape: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
    memory: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyTensor> {
    let shape = extract_shape(shape)?;
    let dtype = match dtype {
        Some(d) if !d.is_none() => extract_dtype(d)?,
        _ => DataType::parse("float32")?,
    };
    let device = extract_device(device)?;
    device.require_cpu()?;
    let tensor = match memory {
        Some(m) if !m.is_none() => empty_from_memory(m, &shape, dtype)?,
        _ => Tensor::empty(&shape, dtype, device)?,
    };
    Ok(PyTensor::new(tensor))
}

/// Copies ``src`` into ``dst``; their sizes in bytes must match exactly (TVM's
/// ``CopyFromTo``: dtypes and shapes may differ).
#[pyfunction]
fn copy_from_to(src: &Bound<'_, PyAny>, dst: &Bound<'_, PyAny>) -> PyResult<()> {
    let src = tensor_ref(src, "src")?;
    let dst = tensor_ref(dst, "dst")?;
    copy_tensors(src.py(), &src.get().inner, &dst.get().inner, "copy_from_to")
}

/// A fresh copy of ``src`` on ``device`` (TVM's ``CopyTo``: always a new allocation).
#[pyfunction]
#[pyo3(signature = (src, device = None))]
fn copy_to(src: &Bound<'_, PyAny>, device: Option<&Bound<'_, PyAny>>) -> PyResult<PyTensor> {
    let src = tensor_ref(src, "src")?;
    let device = extract_device(device)?;
    let py = src.py();
    let tensor = src.get().inner.clone();
    let out = py.detach(move || tensor.copy_to(device))?;
    Ok(PyTensor::new(out))
}

/// A view of ``src`` with ``shape`` and ``dtype`` starting ``relative_byte_offset`` bytes
/// into it (TVM's ``CreateView``); it must fit inside ``src`` and keeps ``src``'s memory
/// alive.
#[pyfunction]
#[pyo3(signature = (src, shape, dtype, relative_byte_offset = 0))]
fn create_view(
    src: &Bound<'_, PyAny>,
    shape: &Bound<'_, PyAny>,
    dtype: &Bound<'_, PyAny>,
    #[pyo3(from_py_with = crate::python::args::relative_byte_offset)] relative_byte_offset: u64,
) -> PyResult<PyTensor> {
    let src = tensor_ref(src, "src")?;
    let view = src.get().inner.create_view(
        &extract_shape(shape)?,
        extract_dtype(dtype)?,
        relative_byte_offset,
    )?;
    Ok(PyTensor::new(view))
}

/// Copies a C-contiguous bytes-like object of exactly ``dst.nbytes`` bytes into ``dst``
/// (TVM's ``CopyFromBytes``).
#[pyfunction(name = "copy_from_bytes")]
fn py_copy_from_bytes(dst: &Bound<'_, PyAny>, data: &Bound<'_, PyAny>) -> PyResult<()> {
    let dst = tensor_ref(dst, "dst")?;
    copy_from_bytes(&dst.get().inner, data, "copy_from_bytes")
}

/// The bytes of ``src`` (TVM's ``CopyToBytes``): a new ``bytes``, or, with ``out``, written
/// into a writable C-contiguous buffer of exactly ``src.nbytes`` bytes (returns ``None``).
#[pyfunction]
#[pyo3(signature = (src, out = None))]
fn copy_to_bytes<'py>(
    src: &Bound<'py, PyAny>,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let src = tensor_ref(src, "src")?;
    let tensor = &src.get().inner;
    match out {
        Some(out) if !out.is_none() => {
            let dst = tensor_over_buffer(out, "copy_to_bytes")?;
            if dst.readonly() {
                return Err(TensorError::ReadOnly {
                    op: "copy_to_bytes",
                }
                .into());
            }
            copy_tensors(src.py(), tensor, &dst, "copy_to_bytes")?;
            Ok(None)
        }
        _ => {
            let bytes = PyBytes::new_with(src.py(), tensor.nbytes(), |buf| {
                Ok(tensor.region().read_into(buf, "copy_to_bytes")?)
            })?;
            Ok(Some(bytes))
        }
    }
}

/// The name of a DLPack device type (TVM's ``DLDeviceType2Str``): 1 -> ``"cpu"``,
/// 2 -> ``"cuda"``, ...; unknown types raise ``TensorError``.
#[pyfunction]
fn device_type_to_str(
    #[pyo3(from_py_with = crate::python::args::device_type)] device_type: i32,
) -> PyResult<&'static str> {
    Ok(core::device_type_to_str(device_type)?)
}

/// Imports a DLPack producer (any object with ``__dlpack__``, or a ``"dltensor"`` capsule)
/// as a ``Tensor`` sharing its memory, which stays alive while the tensor lives. A producer
/// that is not compact row-major is copied unless ``copy=False``; ``copy=True`` always
/// copies.
#[pyfunction(name = "from_dlpack")]
#[pyo3(signature = (x, *, device = None, copy = None))]
fn py_from_dlpack(
    x: &Bound<'_, PyAny>,
    device: Option<&Bound<'_, PyAny>>,
    #[pyo3(from_py_with = crate::python::args::dlpack_copy)] copy: Option<bool>,
) -> PyResult<PyTensor> {
    let device = match device {
        Some(d) if !d.is_none() => Some(extract_device(Some(d))?),
        _ => None,
    };
    Ok(PyTensor::new(dlpack::from_dlpack(x, device, copy)?))
}

/// Whether a buffer of struct-module format `format` (a memoryview's `format`) holds
/// plain numbers or bytes, whose bytes a tensor may read and write; an object array's
/// does not (see `cubepool::tensor::is_plain_buffer_format`).
#[pyfunction]
fn is_plain_buffer_format(format: &str) -> bool {
    crate::tensor::is_plain_buffer_format(format.as_bytes())
}

/// Adds the tensor API to the compiled module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDevice>()?;
    m.add_class::<PyTensor>()?;
    m.add_class::<pool::PyTensorMemoryPool>()?;
    m.add_function(wrap_pyfunction!(empty, m)?)?;
    m.add_function(wrap_pyfunction!(copy_from_to, m)?)?;
    m.add_function(wrap_pyfunction!(copy_to, m)?)?;
    m.add_function(wrap_pyfunction!(create_view, m)?)?;
    m.add_function(wrap_pyfunction!(py_copy_from_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(copy_to_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(device_type_to_str, m)?)?;
    m.add_function(wrap_pyfunction!(is_plain_buffer_format, m)?)?;
    m.add_function(wrap_pyfunction!(py_from_dlpack, m)?)?;
    io::register(m)?;
    m.add("ALLOC_ALIGNMENT", core::ALLOC_ALIGNMENT)?;
    m.add("TEMP_ALLOCA_ALIGNMENT", core::TEMP_ALLOCA_ALIGNMENT)?;
    m.add("MAX_STACK_ALLOCA", core::MAX_STACK_ALLOCA)?;
    m.add(
        "DEFAULT_WORKSPACE_ALIGNMENT",
        core::DEFAULT_WORKSPACE_ALIGNMENT,
    )?;
    m.add("TENSOR_MAGIC", core::TENSOR_MAGIC)?;
    m.add("PARAM_DICT_MAGIC", core::PARAM_DICT_MAGIC)?;
    Ok(())
}
