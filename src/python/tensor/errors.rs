//! Mapping of the tensor error families onto `cubepool._errors` classes.

use pyo3::exceptions::{PyMemoryError, PyOSError};
use pyo3::prelude::*;

use crate::python::errors::classes::{
    CubepoolError, TensorError as TensorErrorClass, TensorFormatError as TensorFormatErrorClass,
};
use crate::tensor::error::ExceptionClass as Class;
use crate::tensor::format::LoadError;
use crate::tensor::{TensorError, TensorFormatError};

fn new_err(class: Class, message: String) -> PyErr {
    match class {
        Class::Memory => PyMemoryError::new_err(message),
        Class::Os => PyOSError::new_err(message),
        Class::Cubepool => CubepoolError::new_err(message),
        Class::Tensor => TensorErrorClass::new_err(message),
        Class::TensorFormat => TensorFormatErrorClass::new_err(message),
    }
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

/// A failure to load the file at `path`: the exception [`LoadError`] maps to, its
/// message led by the path, so that the error names the file it is about.
pub(crate) fn load_error_at(err: LoadError, path: &std::path::Path) -> PyErr {
    let (class, message) = match err {
        LoadError::Format(e) => (e.exception_class(), e.to_string()),
        LoadError::Tensor(e) => (e.exception_class(), e.to_string()),
    };
    new_err(class, format!("{}: {message}", path.display()))
}

impl From<LoadError> for PyErr {
    fn from(err: LoadError) -> PyErr {
        match err {
            LoadError::Format(e) => e.into(),
            LoadError::Tensor(e) => e.into(),
        }
    }
}
