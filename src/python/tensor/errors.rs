//! Mapping of the tensor error families onto `cubepool._errors` classes.

use pyo3::exceptions::{PyMemoryError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use crate::tensor::error::ExceptionClass as Class;
use crate::tensor::format::LoadError;
use crate::tensor::{TensorError, TensorFormatError};

static CUBEPOOL_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static TENSOR_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static TENSOR_FORMAT_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn new_err(class: Class, message: String) -> PyErr {
    Python::attach(|py| {
        let cell = match class {
            Class::Memory => return PyMemoryError::new_err(message),
            Class::Os => return PyOSError::new_err(message),
            Class::Cubepool => (&CUBEPOOL_ERROR, "CubepoolError"),
            Class::Tensor => (&TENSOR_ERROR, "TensorError"),
            Class::TensorFormat => (&TENSOR_FORMAT_ERROR, "TensorFormatError"),
        };
        match cell.0.import(py, "cubepool._errors", cell.1) {
            Ok(cls) => PyErr::from_type(cls.clone(), message),
            // The package is broken if its errors module is missing; still raise something
            // that carries the message.
            Err(_) => PyValueError::new_err(message),
        }
    })
}

impl From<TensorError> for PyErr {
    fn from(err: TensorError) -> PyErr {
        new_err(err.exception_class(), err.to_string())
    }
}

impl From<TensorFormatError> for PyErr {
    fn from(err: TensorFormatError) -> PyErr {
        new_err(err.exception_class(), err.to_string())
    }
}

impl From<LoadError> for PyErr {
    fn from(err: LoadError) -> PyErr {
        match err {
            LoadError::Format(e) => e.into(),
            LoadError::Tensor(e) => e.into(),
        }
    }
}
