//! TVM's tensor and parameter-dict files from Python: bytes, paths and binary streams.

use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyMemoryView, PyString};

use super::errors::load_error_at;
use super::{as_tensor, tensor_over_buffer, PyTensor};
use crate::atomic_file::write_atomic;
use crate::python::errors::io_error_at;
use crate::tensor::format::{self, LoadError, ReadSource, SliceSource, Source};
use crate::tensor::{Tensor, TensorFormatError};

/// Largest single `read` asked of a Python stream.
const STREAM_CHUNK: usize = 1 << 20;

/// A Python binary stream as a `std::io::Read`; a Python exception from `read` is kept to
/// be re-raised as is.
struct PyReader<'py> {
    stream: Bound<'py, PyAny>,
    error: Option<PyErr>,
}

impl Read for PyReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = buf.len().min(STREAM_CHUNK);
        let chunk = match self.stream.call_method1("read", (want,)) {
            Ok(chunk) => chunk,
            Err(e) => {
                self.error = Some(e);
                return Err(io::Error::other("read() raised"));
            }
        };
        if chunk.is_none() {
            return Ok(0);
        }
        // Only bytes-like objects, read through the buffer protocol: extracting a Vec
        // would size it by `len()`, which a hostile object controls.
        let bytes = match pyo3::buffer::PyBuffer::<u8>::get(&chunk) {
            Ok(view) if !chunk.is_instance_of::<PyString>() => view,
            _ => {
                self.error = Some(PyTypeError::new_err("read() must return bytes"));
                return Err(io::Error::other("read() returned no bytes"));
            }
        };
        let len = bytes.len_bytes();
        if len > want {
            self.error = Some(PyTypeError::new_err("read(n) returned more than n bytes"));
            return Err(io::Error::other("read() returned too much"));
        }
        if let Err(e) = bytes.copy_to_slice(self.stream.py(), &mut buf[..len]) {
            self.error = Some(e);
            return Err(io::Error::other("read() returned an unreadable buffer"));
        }
        Ok(len)
    }
}

/// What a `file` argument is.
enum Input<'py> {
    Bytes(Bound<'py, PyAny>),
    Path(PathBuf),
    Stream(Bound<'py, PyAny>),
}

fn classify<'py>(file: &Bound<'py, PyAny>, allow_bytes: bool) -> PyResult<Input<'py>> {
    let py = file.py();
    if allow_bytes
        && (file.is_instance_of::<PyBytes>()
            || file.is_instance_of::<PyByteArray>()
            || file.is_instance_of::<PyMemoryView>())
    {
        return Ok(Input::Bytes(file.clone()));
    }
    if file.is_instance_of::<PyString>() || file.hasattr("__fspath__")? {
        let path = py.import("os")?.call_method1("fspath", (file,))?;
        return Ok(Input::Path(path.extract::<PathBuf>()?));
    }
    if file.hasattr("read")? || file.hasattr("write")? {
        return Ok(Input::Stream(file.clone()));
    }
    if allow_bytes && file.hasattr("__buffer__")? {
        return Ok(Input::Bytes(file.clone()));
    }
    Err(PyTypeError::new_err(format!(
        "expected {}a path or a binary file object, got {}",
        if allow_bytes { "bytes, " } else { "" },
        file.get_type().name()?
    )))
}

/// Runs `read` over the input; in-memory inputs and files must hold exactly one object.
fn load<T, F>(input: Input<'_>, what: &'static str, read: F) -> PyResult<T>
where
    F: Fn(&mut dyn SourceDyn) -> Result<T, LoadError>,
{
    match input {
        Input::Bytes(obj) => {
            let data = tensor_over_buffer(&obj, "load")?.to_bytes()?;
            let mut src = SliceSource::new(&data);
            let out = read(&mut src)?;
            format::expect_end(&src, what)?;
            Ok(out)
        }
        Input::Path(path) => {
            // Only a regular file, opened without waiting (a FIFO would block).
            let f = crate::regular_file::open_regular_file(&path)
                .map_err(|e| io_error_at(&e, &path))?;
            let len = f.metadata().map_err(|e| io_error_at(&e, &path))?.len();
            let mut src = ReadSource::new(BufReader::new(f), Some(len));
            read(&mut src)
                .and_then(|out| Ok(format::expect_end(&src, what).map(|()| out)?))
                .map_err(|e| load_error_at(e, &path))
        }
        Input::Stream(stream) => {
            let mut src = ReadSource::new(
                PyReader {
                    stream,
                    error: None,
                },
                None,
            );
            match read(&mut src) {
                Ok(out) => Ok(out),
                Err(e) => Err(src.into_inner().error.take().unwrap_or_else(|| e.into())),
            }
        }
    }
}

/// Object-safe view of a `Source`, so one closure serves every input kind.
trait SourceDyn {
    fn take_dyn(&mut self, n: u64, what: &'static str) -> Result<Vec<u8>, TensorFormatError>;
    fn remaining_dyn(&self) -> Option<u64>;
}

impl<S: Source> SourceDyn for S {
    fn take_dyn(&mut self, n: u64, what: &'static str) -> Result<Vec<u8>, TensorFormatError> {
        self.take(n, what).map(|c| c.into_owned())
    }
    fn remaining_dyn(&self) -> Option<u64> {
        self.remaining()
    }
}

impl Source for dyn SourceDyn + '_ {
    fn take(
        &mut self,
        n: u64,
        what: &'static str,
    ) -> Result<std::borrow::Cow<'_, [u8]>, TensorFormatError> {
        self.take_dyn(n, what).map(std::borrow::Cow::Owned)
    }
    fn remaining(&self) -> Option<u64> {
        self.remaining_dyn()
    }
}

/// Writes `data` to the file at `path` whole or not at all: a failed write leaves the
/// file it would replace as it was ([`write_atomic`]).
fn save_file(path: &Path, data: &[u8]) -> io::Result<()> {
    write_atomic(path, |file| file.write_all(data))
}

fn write_out(py: Python<'_>, file: &Bound<'_, PyAny>, data: &[u8]) -> PyResult<()> {
    match classify(file, false)? {
        Input::Path(path) => {
            let owned = data.to_vec();
            py.detach(|| save_file(&path, &owned))
                .map_err(|e| io_error_at(&e, &path))?;
            Ok(())
        }
        Input::Stream(stream) => write_all(py, &stream, data),
        Input::Bytes(_) => Err(PyTypeError::new_err("cannot write into bytes")),
    }
}

/// Writes all of `data` to a Python stream: a raw stream (`open(path, "wb",
/// buffering=0)`, a socket's file) may take part of it and return how much (Linux writes
/// at most 2 GiB less 4 KiB a call), so the rest is offered again. A raw stream that
/// takes nothing, or returns None (non-blocking, it would block), is an error saying
/// how much it took; another stream's None, or an answer that is no count, is taken as
/// all written (a file-like object of the user's may return nothing).
fn write_all(py: Python<'_>, stream: &Bound<'_, PyAny>, data: &[u8]) -> PyResult<()> {
    let mut written = 0usize;
    while written < data.len() {
        let answer = stream.call_method1("write", (PyBytes::new(py, &data[written..]),))?;
        let taken = match answer.extract::<usize>() {
            Ok(taken) => taken,
            Err(_) if answer.is_none() && is_raw(stream)? => 0,
            Err(_) => return Ok(()),
        };
        if taken == 0 {
            return Err(pyo3::exceptions::PyOSError::new_err(format!(
                "the stream took {written} of {} bytes, then none",
                data.len()
            )));
        }
        written = written.saturating_add(taken).min(data.len());
    }
    Ok(())
}

/// Whether `stream` is a raw stream (`io.RawIOBase`), whose `write` may take part.
fn is_raw(stream: &Bound<'_, PyAny>) -> PyResult<bool> {
    let raw = stream.py().import("io")?.getattr("RawIOBase")?;
    stream.is_instance(&raw)
}

fn params_from_mapping(params: &Bound<'_, PyAny>) -> PyResult<Vec<(String, Tensor)>> {
    let items = params.call_method0("items")?;
    let mut out = Vec::new();
    for item in items.try_iter()? {
        let (name, value): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item?.extract()?;
        let name: String = name
            .extract()
            .map_err(|_| PyTypeError::new_err("parameter names must be str"))?;
        out.push((name, as_tensor(&value)?));
    }
    Ok(out)
}

fn dict_from_params<'py>(
    py: Python<'py>,
    params: Vec<(String, Tensor)>,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (name, tensor) in params {
        dict.set_item(name, PyTensor::new(tensor))?;
    }
    Ok(dict)
}

/// Serialises ``tensor`` (a ``Tensor`` or any DLPack producer) as one TVM tensor record.
/// Returns the bytes when ``file`` is ``None``; otherwise writes them to ``file`` (a path or
/// a binary file object) and returns ``None``.
#[pyfunction]
#[pyo3(signature = (tensor, file = None))]
fn save_tensor<'py>(
    py: Python<'py>,
    tensor: &Bound<'py, PyAny>,
    file: Option<&Bound<'py, PyAny>>,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let tensor = as_tensor(tensor)?;
    let mut out = Vec::new();
    format::write_tensor(&tensor, &mut out)?;
    match file {
        Some(f) if !f.is_none() => {
            write_out(py, f, &out)?;
            Ok(None)
        }
        _ => Ok(Some(PyBytes::new(py, &out))),
    }
}

/// Writes ``tensor`` as one TVM tensor record to the file at ``path``.
#[pyfunction]
fn save_tensor_to_file(
    py: Python<'_>,
    tensor: &Bound<'_, PyAny>,
    path: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let tensor = as_tensor(tensor)?;
    let mut out = Vec::new();
    format::write_tensor(&tensor, &mut out)?;
    let path = path.extract::<PathBuf>()?;
    py.detach(|| save_file(&path, &out))
        .map_err(|e| io_error_at(&e, &path))?;
    Ok(())
}

/// Loads one TVM tensor record into a fresh CPU tensor. ``file`` is a bytes-like object or a
/// path (which must hold exactly one record), or a binary file object (one record is read
/// from its current position). Malformed input raises ``TensorFormatError``.
#[pyfunction]
fn load_tensor(file: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
    load(classify(file, true)?, "tensor record", |src| {
        format::read_tensor(src)
    })
    .map(PyTensor::new)
}

/// Loads the single TVM tensor record in the file at ``path``.
#[pyfunction]
fn load_tensor_from_file(path: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
    let input = Input::Path(path.extract::<PathBuf>()?);
    load(input, "tensor record", |src| format::read_tensor(src)).map(PyTensor::new)
}

/// Serialises a ``{name: tensor}`` mapping in TVM's parameter-dict format (TVM's
/// ``save_param_dict``), in the mapping's order.
#[pyfunction]
fn save_param_dict<'py>(
    py: Python<'py>,
    params: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let params = params_from_mapping(params)?;
    let mut out = Vec::new();
    format::write_param_dict(&params, &mut out)?;
    Ok(PyBytes::new(py, &out))
}

/// Writes a ``{name: tensor}`` mapping to the file at ``path`` in TVM's parameter-dict
/// format.
#[pyfunction]
fn save_param_dict_to_file(
    py: Python<'_>,
    params: &Bound<'_, PyAny>,
    path: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let params = params_from_mapping(params)?;
    let mut out = Vec::new();
    format::write_param_dict(&params, &mut out)?;
    let path = path.extract::<PathBuf>()?;
    py.detach(|| save_file(&path, &out))
        .map_err(|e| io_error_at(&e, &path))?;
    Ok(())
}

/// Loads a TVM parameter dict from bytes (or a path or binary file object) into a
/// ``{name: Tensor}`` dict in file order. Malformed input raises ``TensorFormatError``.
#[pyfunction]
fn load_param_dict<'py>(py: Python<'py>, data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    let params = load(classify(data, true)?, "parameter dict", |src| {
        format::read_param_dict(src)
    })?;
    dict_from_params(py, params)
}

/// Loads the TVM parameter dict in the file at ``path``.
#[pyfunction]
fn load_param_dict_from_file<'py>(
    py: Python<'py>,
    path: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let input = Input::Path(path.extract::<PathBuf>()?);
    let params = load(input, "parameter dict", |src| format::read_param_dict(src))?;
    dict_from_params(py, params)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(save_tensor, m)?)?;
    m.add_function(wrap_pyfunction!(save_tensor_to_file, m)?)?;
    m.add_function(wrap_pyfunction!(load_tensor, m)?)?;
    m.add_function(wrap_pyfunction!(load_tensor_from_file, m)?)?;
    m.add_function(wrap_pyfunction!(save_param_dict, m)?)?;
    m.add_function(wrap_pyfunction!(save_param_dict_to_file, m)?)?;
    m.add_function(wrap_pyfunction!(load_param_dict, m)?)?;
    m.add_function(wrap_pyfunction!(load_param_dict_from_file, m)?)?;
    Ok(())
}
