//! One exception tree: core errors become the classes of `cubepool._errors`.

use pyo3::prelude::*;
use pyo3::type_object::PyTypeInfo;

use crate::config::{ConfigLoadError, ConfigTextError, PoolConfigError};
use crate::error::PoolError;
use crate::management::InstallMemoryPoolsError;
use crate::report::PlanError;
use crate::trace::TraceError;

/// Declares the bound classes (module `classes`) and `bind_classes`, from one list.
macro_rules! bound_classes {
    ($($class:ident),* $(,)?) => {
        /// Rust types for the classes of `python/cubepool/_errors.py`, bound by name
        /// with `import_exception!`.
        pub(crate) mod classes {
            $(pyo3::import_exception!(cubepool._errors, $class);)*
        }

        /// Imports `cubepool._errors` and resolves every class of [`classes`], when the
        /// extension is imported: a missing class is an ImportError naming it then. Each is
        /// checked here with errors first, so the binding's own import (which panics
        /// on failure) cannot fail, at import or on any later raise.
        pub(crate) fn bind_classes(py: Python<'_>) -> PyResult<()> {
            let module = py.import("cubepool._errors")?;
            $(
                let class = module.getattr(stringify!($class));
                if !class.is_ok_and(|class| class.is_instance_of::<pyo3::types::PyType>()) {
                    return Err(pyo3::exceptions::PyImportError::new_err(concat!(
                        "cubepool._errors has no exception class ",
                        stringify!($class),
                        ", which the compiled module binds"
                    )));
                }
                let _ = classes::$class::type_object(py);
            )*
            Ok(())
        }
    };
}

bound_classes!(
    CubepoolError,
    PoolCapacityExceeded,
    BufferTooBig,
    PoolConfigError,
    InstallMemoryPoolsError,
    NotFound,
    OutOfMemory,
    StorageError,
    DeviceUnavailable,
    HandleReleased,
    InvalidArgument,
    TensorError,
    TensorFormatError,
    TraceFormatError,
    PlacementFormatError,
    PlacementInfeasible,
);

use classes::{
    BufferTooBig, CubepoolError, HandleReleased, InstallMemoryPoolsError as InstallError,
    InvalidArgument, NotFound, OutOfMemory, PoolCapacityExceeded, PoolConfigError as ConfigError,
    StorageError, TraceFormatError,
};

/// The Python exception for a CUDA device that cannot be used (DeviceUnavailable, a
/// StorageError).
pub(crate) fn device_unavailable(py: Python<'_>, error: &crate::storage::cuda::CudaError) -> PyErr {
    raise::<classes::DeviceUnavailable>(py, error.to_string(), &[])
}

/// An instance of the exception class `E` with `message` and attributes.
fn raise<E: PyTypeInfo>(py: Python<'_>, message: String, attrs: &[(&str, Py<PyAny>)]) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let value = E::type_object(py).call1((message.clone(),))?;
        for (name, attr) in attrs {
            value.setattr(*name, attr.bind(py))?;
        }
        Ok(PyErr::from_value(value))
    };
    build().unwrap_or_else(|error| error)
}

fn int(py: Python<'_>, value: u64) -> Py<PyAny> {
    value
        .into_pyobject(py)
        .map(|v| v.into_any().unbind())
        .unwrap_or_else(|_| py.None())
}

fn opt_str(py: Python<'_>, value: Option<&str>) -> Py<PyAny> {
    match value {
        Some(text) => text
            .into_pyobject(py)
            .map(|v| v.into_any().unbind())
            .unwrap_or_else(|_| py.None()),
        None => py.None(),
    }
}

/// The Python exception for a pool error.
pub(crate) fn pool_error(py: Python<'_>, error: PoolError) -> PyErr {
    let message = error.to_string();
    match error {
        PoolError::PoolCapacityExceeded {
            size,
            capacity,
            in_use,
        } => raise::<PoolCapacityExceeded>(
            py,
            message,
            &[
                ("size", int(py, size)),
                ("capacity", int(py, capacity)),
                ("in_use", int(py, in_use)),
            ],
        ),
        PoolError::BufferTooBig { size, .. } => {
            raise::<BufferTooBig>(py, message, &[("size", int(py, size))])
        }
        PoolError::OutOfMemory { size } => {
            raise::<OutOfMemory>(py, message, &[("size", int(py, size))])
        }
        PoolError::NotFound { .. } => raise::<NotFound>(py, message, &[]),
        PoolError::Storage { .. } => raise::<StorageError>(py, message, &[]),
        PoolError::InvalidArgument { .. } => raise::<InvalidArgument>(py, message, &[]),
    }
}

/// The Python exception for a configuration error, with the text position if known.
pub(crate) fn config_error(
    py: Python<'_>,
    error: &PoolConfigError,
    position: Option<usize>,
) -> PyErr {
    let position = match position {
        Some(position) => int(py, position as u64),
        None => py.None(),
    };
    raise::<ConfigError>(
        py,
        error.to_string(),
        &[
            ("kind", opt_str(py, Some(error.kind()))),
            ("field", opt_str(py, error.field())),
            ("position", position),
            ("source", py.None()),
        ],
    )
}

/// The Python exception for configuration text that could not be read: a
/// `PoolConfigError` whose message ends with the position.
pub(crate) fn config_text_error(py: Python<'_>, error: &ConfigTextError) -> PyErr {
    raise::<ConfigError>(
        py,
        error.to_string(),
        &[
            ("kind", opt_str(py, Some(error.error.kind()))),
            ("field", opt_str(py, error.error.field())),
            ("position", int(py, error.position as u64)),
            ("source", py.None()),
        ],
    )
}

/// The Python exception for a configured layout that could not be read: the OS
/// error for an unreadable file, else a `PoolConfigError` with `source` naming where
/// the text came from.
pub(crate) fn config_load_error(py: Python<'_>, error: ConfigLoadError) -> PyErr {
    let message = error.to_string();
    let (kind, position, origin) = (error.kind(), error.position(), error.origin());
    let field = match &error {
        ConfigLoadError::Text { error, .. } => error.error.field().map(str::to_string),
        ConfigLoadError::WrongType { key, .. } => Some(key.to_string()),
        _ => None,
    };
    if let ConfigLoadError::Io { error, path } = error {
        return os_error(py, &error, &path);
    }
    raise::<ConfigError>(
        py,
        message,
        &[
            ("kind", opt_str(py, Some(kind))),
            ("field", opt_str(py, field.as_deref())),
            (
                "position",
                position.map_or_else(|| py.None(), |p| int(py, p as u64)),
            ),
            ("source", opt_str(py, Some(&origin))),
        ],
    )
}

/// The `OSError` (the subclass its errno picks) for `error` on `path`, with the file
/// named (`filename` set), as `open()` raises it.
pub(crate) fn os_error(_py: Python<'_>, error: &std::io::Error, path: &std::path::Path) -> PyErr {
    io_error_at(error, path)
}

/// [`os_error`] without the GIL at hand: `OSError(errno, strerror, filename)`, which
/// Python turns into the subclass the errno picks (`FileNotFoundError`, ...) when it
/// is raised; an error with no errno becomes an `OSError` whose message names `path`.
pub(crate) fn io_error_at(error: &std::io::Error, path: &std::path::Path) -> PyErr {
    let path = path.display().to_string();
    match error.raw_os_error() {
        Some(code) => {
            let text = error.to_string();
            let strerror = text
                .strip_suffix(&format!(" (os error {code})"))
                .unwrap_or(&text)
                .to_string();
            pyo3::exceptions::PyOSError::new_err((code, strerror, path))
        }
        None => pyo3::exceptions::PyOSError::new_err(format!("{path}: {error}")),
    }
}

/// The Python exception for a layout that could not be installed:
/// `InstallMemoryPoolsError` (kind "PoolsInUse", `bytes_in_use`), or a
/// `PoolConfigError` for an invalid layout.
pub(crate) fn install_error(py: Python<'_>, error: InstallMemoryPoolsError) -> PyErr {
    match error {
        InstallMemoryPoolsError::InvalidConfiguration(error) => config_error(py, &error, None),
        InstallMemoryPoolsError::PoolsInUse { bytes_in_use } => raise::<InstallError>(
            py,
            error.to_string(),
            &[
                ("kind", opt_str(py, Some(error.kind()))),
                ("bytes_in_use", int(py, bytes_in_use)),
            ],
        ),
    }
}

/// The Python exception for a plan that could not be made: `InvalidArgument` for a
/// bad headroom, `PoolConfigError` for a report whose pools make no layout.
pub(crate) fn plan_error(py: Python<'_>, error: PlanError) -> PyErr {
    match error {
        PlanError::InvalidHeadroom { .. } | PlanError::PlannedPool { .. } => {
            invalid_argument(py, error.to_string())
        }
        PlanError::InvalidPools(error) => config_error(py, &error, None),
    }
}

/// The Python exception for a trace that could not be read: `TraceFormatError(message,
/// path, line)`, or the OS error.
pub(crate) fn trace_error(py: Python<'_>, path: Option<&str>, error: TraceError) -> PyErr {
    match error {
        TraceError::Io { source, path: file } => match (file.as_str(), path) {
            ("", None) => PyErr::from(source),
            ("", Some(path)) | (path, _) => os_error(py, &source, std::path::Path::new(path)),
        },
        TraceError::Parse { line, message } => trace_format_error(py, message, path, Some(line)),
        TraceError::TooLarge { line, bound, max } => {
            let variable = if bound == "max_events" {
                "CUBEPOOL_MAX_IMPORT_EVENTS"
            } else {
                "CUBEPOOL_MAX_IMPORT_BYTES"
            };
            let message = format!(
                "the trace holds more than {bound}={max} {}; raise the bound with {bound}=N \
                 (None lifts it) or the {variable} environment variable",
                crate::trace::format::limit_unit(bound)
            );
            trace_format_error(py, message, path, Some(line))
        }
    }
}

/// `TraceFormatError(message, path, line)`.
pub(crate) fn trace_format_error(
    py: Python<'_>,
    message: String,
    path: Option<&str>,
    line: Option<usize>,
) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let class = TraceFormatError::type_object(py);
        Ok(PyErr::from_value(class.call1((
            message.clone(),
            path,
            line,
        ))?))
    };
    build().unwrap_or_else(|error| error)
}

/// `InvalidArgument` (also a `ValueError`) with this message.
pub(crate) fn invalid_argument(py: Python<'_>, message: String) -> PyErr {
    raise::<InvalidArgument>(py, message, &[])
}

/// `HandleReleased` (also a `ValueError`).
pub(crate) fn handle_released(py: Python<'_>) -> PyErr {
    raise::<HandleReleased>(
        py,
        "the handle was released and can no longer be used".to_string(),
        &[],
    )
}

/// `CubepoolError` for a memory management that cannot be used now: poisoned by a
/// panic, or re-entered while busy.
pub(crate) fn unavailable(py: Python<'_>, why: super::gil_cell::Unavailable) -> PyErr {
    let message = match why {
        super::gil_cell::Unavailable::Poisoned => {
            "the memory management is unusable: an earlier operation panicked"
        }
        super::gil_cell::Unavailable::Busy => {
            "the memory management is busy: it was re-entered while an operation was in \
             progress (from a finalizer?)"
        }
    };
    raise::<CubepoolError>(py, message.to_string(), &[])
}

/// Reads a byte size that a person may write as text: a non-negative int, or a size
/// in the grammar of the pools language (`"300MiB"`, `"1.5 GiB"`, `"64KB"`; KiB = 1024,
/// KB = 1000; see [`crate::config::text::parse_size`]). For limits and pool sizes, not
/// for offsets and counts, which [`size_arg`] reads.
pub(crate) fn byte_size_arg(value: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    if let Ok(text) = value.cast::<pyo3::types::PyString>() {
        let text = text.to_string_lossy();
        return crate::config::text::parse_size(&text).map_err(|why| {
            let shown = crate::config::text::quoted_prefix(&text);
            invalid_argument(value.py(), format!("{what}: {shown:?} {why}"))
        });
    }
    read_size(value, what, "an int or a size such as \"300MiB\"")
}

/// [`byte_size_arg`] for an optional argument (None: absent).
pub(crate) fn opt_byte_size_arg(
    value: Option<&Bound<'_, PyAny>>,
    what: &str,
) -> PyResult<Option<u64>> {
    match value {
        Some(value) if !value.is_none() => byte_size_arg(value, what).map(Some),
        _ => Ok(None),
    }
}

/// The name of a value's type, for messages.
pub(crate) fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|name| name.to_string())
        .unwrap_or_default()
}

/// Reads a non-negative integer argument, naming it in the error.
pub(crate) fn size_arg(value: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    read_size(value, what, "an int")
}

/// [`size_arg`], where a value of the wrong type is told it must be `expected`.
fn read_size(value: &Bound<'_, PyAny>, what: &str, expected: &str) -> PyResult<u64> {
    let py = value.py();
    let wrong_type = |shown: String| {
        pyo3::exceptions::PyTypeError::new_err(format!("{what} must be {expected}, got {shown}"))
    };
    // `True` is an int to Python, but never a size anyone meant.
    if value.is_instance_of::<pyo3::types::PyBool>() {
        return Err(wrong_type("bool".into()));
    }
    // An object that stands for an int (`__index__`) is asked once. What it raises is
    // raised as it is (a Ctrl-C inside it stays a KeyboardInterrupt), but a TypeError
    // (its `__index__` returned no int, or is no method), which names the argument,
    // with the original as its cause.
    let index;
    let value = if value.is_instance_of::<pyo3::types::PyInt>() {
        value
    } else if value.get_type().hasattr("__index__")? {
        let called = py.import("operator")?.getattr("index")?.call1((value,));
        index = match called {
            Err(error) if error.is_instance_of::<pyo3::exceptions::PyTypeError>(py) => {
                let named = wrong_type(format!("{} ({})", type_name(value), error.value(py)));
                named.set_cause(py, Some(error));
                return Err(named);
            }
            other => other?,
        };
        &index
    } else {
        return Err(wrong_type(type_name(value)));
    };
    if let Ok(size) = value.extract::<u64>() {
        return Ok(size);
    }
    match value.extract::<i64>() {
        Ok(negative) => Err(invalid_argument(
            py,
            format!("{what} must be non-negative, got {negative}"),
        )),
        Err(_) if value.is_instance_of::<pyo3::types::PyInt>() => {
            // A huge int is named by its size, not its digits: a message stays one
            // short line (and Python refuses to print ints past 4300 digits).
            let bits: u64 = value.call_method0("bit_length")?.extract()?;
            let negative = value.lt(0)?;
            let shown = if bits <= 128 {
                value.to_string()
            } else {
                format!("a {bits}-bit integer")
            };
            Err(invalid_argument(
                py,
                if negative {
                    format!("{what} must be non-negative, got {shown}")
                } else {
                    format!("{what} is too large: {shown} does not fit in 64 bits")
                },
            ))
        }
        Err(_) => Err(wrong_type(type_name(value))),
    }
}

/// Reads an optional non-negative integer argument.
pub(crate) fn opt_size_arg(value: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<u64>> {
    match value {
        Some(value) if !value.is_none() => size_arg(value, what).map(Some),
        _ => Ok(None),
    }
}
