//! The value classes of the memory management: `MemoryUsage` and `Resource`,
//! immutable copies of core values, converted and nothing more.

use pyo3::prelude::*;

use crate::management::Resource;
use crate::usage::MemoryUsage;

/// Memory in use, padding and reserved bytes of an allocator.
#[pyclass(
    name = "MemoryUsage",
    module = "cubepool._cubepool",
    frozen,
    eq,
    hash,
    skip_from_py_object
)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct PyMemoryUsage {
    pub(crate) inner: MemoryUsage,
}

#[pymethods]
impl PyMemoryUsage {
    #[new]
    #[pyo3(signature = (number_allocs = 0, bytes_in_use = 0, bytes_padding = 0, bytes_reserved = 0))]
    fn new(
        #[pyo3(from_py_with = super::args::number_allocs)] number_allocs: u64,
        #[pyo3(from_py_with = super::args::bytes_in_use)] bytes_in_use: u64,
        #[pyo3(from_py_with = super::args::bytes_padding)] bytes_padding: u64,
        #[pyo3(from_py_with = super::args::bytes_reserved)] bytes_reserved: u64,
    ) -> Self {
        Self {
            inner: MemoryUsage {
                number_allocs,
                bytes_in_use,
                bytes_padding,
                bytes_reserved,
            },
        }
    }

    /// The number of live allocations.
    #[getter]
    fn number_allocs(&self) -> u64 {
        self.inner.number_allocs
    }

    /// The bytes the live allocations asked for.
    #[getter]
    fn bytes_in_use(&self) -> u64 {
        self.inner.bytes_in_use
    }

    /// The bytes added to round live allocations up to the alignment.
    #[getter]
    fn bytes_padding(&self) -> u64 {
        self.inner.bytes_padding
    }

    /// The bytes held from the storage.
    #[getter]
    fn bytes_reserved(&self) -> u64 {
        self.inner.bytes_reserved
    }

    /// The usage as a dict of its four fields.
    pub(crate) fn to_dict(&self, py: Python<'_>) -> PyResult<Py<pyo3::types::PyDict>> {
        let dict = pyo3::types::PyDict::new(py);
        dict.set_item("number_allocs", self.inner.number_allocs)?;
        dict.set_item("bytes_in_use", self.inner.bytes_in_use)?;
        dict.set_item("bytes_padding", self.inner.bytes_padding)?;
        dict.set_item("bytes_reserved", self.inner.bytes_reserved)?;
        Ok(dict.unbind())
    }

    fn __repr__(&self) -> String {
        format!(
            "MemoryUsage(number_allocs={}, bytes_in_use={}, bytes_padding={}, bytes_reserved={})",
            self.inner.number_allocs,
            self.inner.bytes_in_use,
            self.inner.bytes_padding,
            self.inner.bytes_reserved
        )
    }
}

/// Where the bytes of a reservation are: pool index, storage buffer, offset, address.
#[pyclass(
    name = "Resource",
    module = "cubepool._cubepool",
    frozen,
    eq,
    skip_from_py_object
)]
#[derive(Clone, PartialEq)]
pub(crate) struct PyResource {
    pub(crate) inner: Resource,
}

#[pymethods]
impl PyResource {
    /// The index of the pool holding it (the persistent pool follows the dynamic ones),
    /// or None for a zero-byte reservation.
    #[getter]
    fn pool(&self) -> Option<usize> {
        self.inner.pool
    }

    /// The id of the storage buffer (page) holding it, or None for zero bytes.
    #[getter]
    fn storage_id(&self) -> Option<u64> {
        self.inner.storage_id
    }

    /// The offset of the first byte in the page.
    #[getter]
    fn offset(&self) -> u64 {
        self.inner.offset
    }

    /// The bytes reserved.
    #[getter]
    fn size(&self) -> u64 {
        self.inner.size
    }

    /// The address of the first byte (0 for zero bytes).
    #[getter]
    fn address(&self) -> u64 {
        self.inner.address
    }

    fn __repr__(&self) -> String {
        // As Python writes the getters' values: None, not Rust's `Some(0)`.
        fn py_option<T: std::fmt::Display>(value: Option<T>) -> String {
            value.map_or_else(|| "None".to_string(), |v| v.to_string())
        }
        format!(
            "Resource(pool={}, storage_id={}, offset={}, size={}, address={:#x})",
            py_option(self.inner.pool),
            py_option(self.inner.storage_id),
            self.inner.offset,
            self.inner.size,
            self.inner.address
        )
    }
}
