//! `cubepool.TensorMemoryPool`, subclassable from Python.

use crate::python::args;
use pyo3::exceptions::PyMemoryError;
use pyo3::prelude::*;

use super::{extract_device, extract_dtype, extract_shape, tensor_over_buffer, PyDevice, PyTensor};
use crate::tensor::pool::{default_alloc, PoolConfig, TensorMemoryPool};
use crate::tensor::{Device, Tensor};

/// A thread-safe cache of backing buffers for compact tensors (TVM's
/// ``runtime.TensorMemoryPool``).
///
/// ``empty`` rounds the byte size up to ``page_size`` and reuses the most recently freed
/// backing of that size whose address meets the dtype's alignment (``max(64, itemsize)``),
/// else calls ``alloc_backing``. A tensor that dies returns its backing to the cache once
/// no view or export uses it; live tensors keep the pool's books alive. ``clear()`` releases
/// the cache; live tensors stay valid and return later. ``used_memory()`` counts cached and
/// checked-out backing. ``max_cached_bytes`` bounds the cache (oldest entries are released
/// first); ``None`` leaves it unbounded. When ``alloc_backing`` raises ``MemoryError``, the
/// cache is released and the allocation retried once.
///
/// Subclasses may override ``alloc_backing(nbytes, alignment, device)`` to supply memory
/// from elsewhere: return a ``Tensor`` or a writable C-contiguous buffer (for example a
/// numpy array) of at least ``nbytes`` bytes at an address aligned to ``alignment``.
/// Anything else is rejected with ``TensorError``. Subclasses taking other constructor
/// arguments must also override ``__new__``.
#[pyclass(
    name = "TensorMemoryPool",
    module = "cubepool._cubepool",
    frozen,
    subclass
)]
pub(crate) struct PyTensorMemoryPool {
    core: TensorMemoryPool,
}

/// Turns what `alloc_backing` returned into a backing tensor (validated by the pool).
fn backing_from_result(obj: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    if let Ok(t) = obj.cast::<PyTensor>() {
        return Ok(t.get().inner.clone());
    }
    tensor_over_buffer(obj, "alloc_backing")
}

#[pymethods]
impl PyTensorMemoryPool {
    #[new]
    #[pyo3(signature = (page_size = 4096, device = None, max_cached_bytes = None))]
    fn py_new(
        #[pyo3(from_py_with = args::page_size)] page_size: usize,
        device: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = args::max_cached_bytes)] max_cached_bytes: Option<usize>,
    ) -> PyResult<Self> {
        let device = extract_device(device)?;
        let core = TensorMemoryPool::new(PoolConfig {
            page_size,
            device,
            max_cached_bytes,
        })?;
        Ok(PyTensorMemoryPool { core })
    }

    /// A compact tensor of ``shape`` and ``dtype`` backed by pooled memory.
    #[pyo3(signature = (shape, dtype = None))]
    fn empty(
        slf: &Bound<'_, Self>,
        shape: &Bound<'_, PyAny>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyTensor> {
        let py = slf.py();
        let shape = extract_shape(shape)?;
        let dtype = match dtype {
            Some(d) if !d.is_none() => extract_dtype(d)?,
            _ => crate::tensor::DataType::parse("float32")?,
        };
        let pool = &slf.get().core;
        let tensor = pool.empty_with(
            &shape,
            dtype,
            |nbytes, alignment, device: Device| {
                let result = slf.call_method1(
                    "alloc_backing",
                    (nbytes, alignment, PyDevice { inner: device }),
                )?;
                backing_from_result(&result)
            },
            |e: &PyErr| e.is_instance_of::<PyMemoryError>(py),
        )?;
        Ok(PyTensor::new(tensor))
    }

    /// A bounded view of ``backing`` (same rules as ``cubepool.create_view``); the view keeps
    /// the backing alive.
    #[pyo3(signature = (backing, shape, dtype, byte_offset = 0))]
    fn create_view(
        &self,
        backing: &Bound<'_, PyTensor>,
        shape: &Bound<'_, PyAny>,
        dtype: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = args::byte_offset)] byte_offset: u64,
    ) -> PyResult<PyTensor> {
        let view = self.core.create_view(
            &backing.get().inner,
            &extract_shape(shape)?,
            extract_dtype(dtype)?,
            byte_offset,
        )?;
        Ok(PyTensor::new(view))
    }

    /// Allocates fresh ``uint8[nbytes]`` backing aligned to ``alignment`` on ``device``.
    /// Override in a subclass to take memory from elsewhere.
    fn alloc_backing(
        &self,
        #[pyo3(from_py_with = args::nbytes)] nbytes: usize,
        #[pyo3(from_py_with = args::alignment)] alignment: usize,
        device: &Bound<'_, PyAny>,
    ) -> PyResult<PyTensor> {
        let device = extract_device(Some(device))?;
        Ok(PyTensor::new(default_alloc(nbytes, alignment, device)?))
    }

    /// Releases the cached backing; live tensors remain valid and return to the cache later.
    fn clear(&self) -> PyResult<()> {
        Ok(self.core.clear()?)
    }

    /// Bytes held by this pool: cached plus checked-out backing.
    fn used_memory(&self) -> PyResult<usize> {
        Ok(self.core.used_memory()?)
    }

    /// Bytes of cached (idle) backing.
    #[getter]
    fn cached_bytes(&self) -> PyResult<usize> {
        Ok(self.core.cached_bytes()?)
    }

    /// Number of backing buffers checked out to live tensors.
    #[getter]
    fn checked_out(&self) -> PyResult<usize> {
        Ok(self.core.checked_out()?)
    }

    /// Backing sizes round up to a multiple of this.
    #[getter]
    fn page_size(&self) -> usize {
        self.core.config().page_size
    }

    /// The device the pool allocates on.
    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice {
            inner: self.core.config().device,
        }
    }

    /// The cache bound in bytes, or ``None``.
    #[getter]
    fn max_cached_bytes(&self) -> Option<usize> {
        self.core.config().max_cached_bytes
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let core = &slf.get().core;
        Ok(format!(
            "<{} page_size={} device={} used_memory={} cached_bytes={} checked_out={}>",
            slf.get_type().name()?,
            core.config().page_size,
            core.config().device,
            core.used_memory()?,
            core.cached_bytes()?,
            core.checked_out()?
        ))
    }
}
