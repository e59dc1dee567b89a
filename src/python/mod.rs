//! The only module that knows about pyo3: thin wrappers over the core.
#![allow(unsafe_code)]

use pyo3::prelude::*;

mod tensor;

/// The compiled half of the `cubepool` package.
#[pymodule]
fn _cubepool(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    tensor::register(m)?;
    Ok(())
}
