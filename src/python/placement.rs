//! `place_buffers`, `place_csv` and the `Placement` result: offline placement for Python.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::type_object::PyTypeInfo;

use super::errors::classes::{CubepoolError, PlacementFormatError, PlacementInfeasible};
use super::errors::{invalid_argument, io_error_at, opt_byte_size_arg};
use super::trace::PyTrace;
use crate::placement::csv::{read_csv, write_csv};
use crate::placement::{
    place_until, InfeasibleBecause, PlaceOptions, Placement, PlacementError, Problem,
    DEFAULT_TIME_LIMIT,
};

/// A checked placement: an offset per buffer, the height, and how far it is from the
/// lower bound (peak live bytes).
#[pyclass(name = "Placement", module = "cubepool._cubepool", frozen)]
pub(crate) struct PyPlacement {
    inner: Placement,
}

#[pymethods]
impl PyPlacement {
    /// The offset of each buffer, in input order.
    #[getter]
    fn offsets(&self) -> Vec<u64> {
        self.inner.offsets.clone()
    }

    /// The largest offset plus size: the bytes the placement reserves.
    #[getter]
    fn height(&self) -> u64 {
        self.inner.height
    }

    /// Peak live bytes: no placement is lower.
    #[getter]
    fn lower_bound(&self) -> u64 {
        self.inner.lower_bound
    }

    /// Whether no placement is lower (the height is the lower bound, or the exact
    /// search proved one byte less does not fit).
    #[getter]
    fn optimal(&self) -> bool {
        self.inner.optimal
    }

    /// Which placer made it: `"heuristic"` or `"search"`.
    #[getter]
    fn method(&self) -> &'static str {
        self.inner.method.as_str()
    }

    /// Seconds the placement took.
    #[getter]
    fn seconds(&self) -> f64 {
        self.inner.elapsed.as_secs_f64()
    }

    /// The lower bound over the height (1.0 with no bytes).
    #[getter]
    fn utilization(&self) -> f64 {
        if self.inner.height == 0 {
            1.0
        } else {
            self.inner.lower_bound as f64 / self.inner.height as f64
        }
    }

    fn __len__(&self) -> usize {
        self.inner.offsets.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "<Placement buffers={} height={} lower_bound={} optimal={} method={} seconds={:.3}>",
            self.inner.offsets.len(),
            self.inner.height,
            self.inner.lower_bound,
            if self.inner.optimal { "True" } else { "False" },
            self.inner.method.as_str(),
            self.inner.elapsed.as_secs_f64()
        )
    }
}

/// Places buffers given as `(lower, upper, size)` rows, or a `Trace`'s allocations by
/// event index. See `cubepool.place`.
#[pyfunction]
#[pyo3(signature = (buffers, capacity = None, time_limit = None))]
pub(crate) fn place_buffers(
    py: Python<'_>,
    buffers: &Bound<'_, PyAny>,
    capacity: Option<&Bound<'_, PyAny>>,
    time_limit: Option<f64>,
) -> PyResult<PyPlacement> {
    let options = options(py, capacity, time_limit)?;
    let problem = if let Ok(trace) = buffers.cast::<PyTrace>() {
        let trace = std::sync::Arc::clone(&trace.get().inner);
        py.detach(|| Problem::from_trace(&trace))
    } else {
        let mut rows = Vec::new();
        for (index, row) in buffers.try_iter()?.enumerate() {
            let (lower, upper, size): (u64, u64, u64) = row?.extract().map_err(|_| {
                pyo3::exceptions::PyTypeError::new_err(format!(
                    "buffers[{index}] must be a (lower, upper, size) tuple of non-negative \
                     ints below 2**64"
                ))
            })?;
            rows.push(crate::placement::Buffer { lower, upper, size });
        }
        Problem::new(rows)
    }
    .map_err(|e| placement_error(py, e))?;
    let placed = place_interruptibly(py, &problem, &options)?;
    Ok(PyPlacement { inner: placed })
}

/// Reads MiniMalloc CSV from `input`, places it, and writes
/// `id,lower,upper,size,offset` lines to `output`. See `cubepool.place_csv`.
#[pyfunction]
#[pyo3(signature = (input, output, capacity = None, time_limit = None))]
pub(crate) fn place_csv(
    py: Python<'_>,
    input: PathBuf,
    output: PathBuf,
    capacity: Option<&Bound<'_, PyAny>>,
    time_limit: Option<f64>,
) -> PyResult<PyPlacement> {
    let options = options(py, capacity, time_limit)?;
    let shown = input.display().to_string();
    // Only a regular file, opened and read without waiting (a FIFO, or one put in the
    // place of the file the caller checked, would block: `regular_file`).
    let data = crate::regular_file::open_regular_file(&input)
        .and_then(|mut file| {
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut file, &mut data)
                .map_err(crate::regular_file::read_error)?;
            Ok(data)
        })
        .map_err(|e| os_error(&e, &shown))?;
    let read = py
        .detach(|| read_csv(&data))
        .map_err(|e| format_error(py, e.to_string(), &shown, Some(e.line())))?;
    // A file whose buffers cannot be placed at all is a bad input file: named.
    let problem = Problem::new(read.buffers.clone()).map_err(|e| match e {
        PlacementError::EmptyLifetime { .. } | PlacementError::SizesOverflow => {
            format_error(py, e.to_string(), &shown, None)
        }
        e => placement_error(py, e),
    })?;
    let placed = place_interruptibly(py, &problem, &options)?;
    let shown_out = output.display().to_string();
    let file = std::fs::File::create(&output).map_err(|e| os_error(&e, &shown_out))?;
    write_csv(
        std::io::BufWriter::new(file),
        &read.ids,
        &read.buffers,
        &placed.offsets,
    )
    .map_err(|e| os_error(&e, &shown_out))?;
    Ok(PyPlacement { inner: placed })
}

/// How long the caller waits for the search between two looks at Python's signals.
const SIGNAL_SLICE: Duration = Duration::from_millis(50);

/// `place(problem, options)` on a thread of its own while the caller, the GIL
/// released, waits for it in slices of [`SIGNAL_SLICE`] and runs Python's signal
/// handlers between them: a handler's exception (Ctrl-C's `KeyboardInterrupt`, the
/// command line's `SystemExit` on SIGTERM) stops the search and is raised once it has
/// ended, instead of after the whole time limit. Where no thread can be made the
/// search runs on the caller's, as before.
fn place_interruptibly(
    py: Python<'_>,
    problem: &Problem,
    options: &PlaceOptions,
) -> PyResult<Placement> {
    let stop = AtomicBool::new(false);
    let outcome = py.detach(|| {
        std::thread::scope(|scope| {
            let (send, receive) = mpsc::channel();
            let stop = &stop;
            let search = move || {
                // The receiver is gone only once the caller has stopped waiting.
                let _ = send.send(place_until(problem, options, stop));
            };
            let Ok(thread) = std::thread::Builder::new()
                .name("cubepool-place".into())
                .spawn_scoped(scope, search)
            else {
                return Ok(place_until(problem, options, stop));
            };
            let mut signalled = None;
            let result = loop {
                match receive.recv_timeout(SIGNAL_SLICE) {
                    Ok(result) => break Some(result),
                    // The thread ended without a result: it panicked (joined below).
                    Err(mpsc::RecvTimeoutError::Disconnected) => break None,
                    Err(mpsc::RecvTimeoutError::Timeout) if signalled.is_none() => {
                        // Not attached once the interpreter is finalizing: no handler
                        // runs then.
                        if let Some(Err(error)) = Python::try_attach(|py| py.check_signals()) {
                            stop.store(true, Ordering::Relaxed);
                            signalled = Some(error);
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                }
            };
            // Joined here, a panic of the search's (never seen) is not the scope's.
            let _ = thread.join();
            match (signalled, result) {
                (Some(error), _) => Err(error),
                (None, Some(result)) => Ok(result),
                (None, None) => Err(CubepoolError::new_err(
                    "internal error: the placement search ended without a result",
                )),
            }
        })
    });
    outcome?.map_err(|e| placement_error(py, e))
}

fn options(
    py: Python<'_>,
    capacity: Option<&Bound<'_, PyAny>>,
    time_limit: Option<f64>,
) -> PyResult<PlaceOptions> {
    let capacity = opt_byte_size_arg(capacity, "capacity")?;
    let time_limit = match time_limit {
        None => DEFAULT_TIME_LIMIT,
        Some(seconds) if seconds.is_finite() && seconds > 0.0 && seconds < 1e9 => {
            Duration::from_secs_f64(seconds)
        }
        Some(seconds) => {
            return Err(invalid_argument(
                py,
                format!(
                    "time_limit must be a positive number of seconds below 1,000,000,000, \
                     got {seconds}"
                ),
            ))
        }
    };
    Ok(PlaceOptions {
        capacity,
        time_limit,
    })
}

fn os_error(error: &std::io::Error, path: &str) -> PyErr {
    // The strerror without Rust's " (os error N)": the input's read was Python's, which
    // told "Input/output error", until the reader took every header form itself.
    io_error_at(error, std::path::Path::new(path))
}

/// `PlacementFormatError(message, path, line)`: `line` where the problem is on one.
fn format_error(py: Python<'_>, message: String, path: &str, line: Option<usize>) -> PyErr {
    // The reader's message starts with the line, which the class prints itself.
    let message = match line {
        Some(_) => message
            .split_once(": ")
            .map_or(message.clone(), |(_, rest)| rest.to_string()),
        None => message,
    };
    let build = || -> PyResult<PyErr> {
        let class = PlacementFormatError::type_object(py);
        Ok(PyErr::from_value(class.call1((message, path, line))?))
    };
    build().unwrap_or_else(|error| error)
}

/// The Python exception for a placement error: `PlacementInfeasible` (with
/// `capacity`, `best_height`, `lower_bound` and `reason`) for a capacity that does
/// not fit, `InvalidArgument` for bad buffers, `CubepoolError` for a failed check.
pub(crate) fn placement_error(py: Python<'_>, error: PlacementError) -> PyErr {
    let message = error.to_string();
    let (capacity, best_height, lower_bound, reason) = match error {
        PlacementError::EmptyLifetime { .. } | PlacementError::SizesOverflow => {
            return invalid_argument(py, message)
        }
        // A stopped search raises the exception that stopped it (`place_interruptibly`).
        PlacementError::CheckFailed(_) | PlacementError::Stopped => {
            return CubepoolError::new_err(message)
        }
        PlacementError::Infeasible {
            capacity,
            best_height,
            lower_bound,
            why,
        } => (
            capacity,
            best_height,
            lower_bound,
            match why {
                InfeasibleBecause::PeakLive => "peak_live",
                InfeasibleBecause::Exhausted => "exhausted",
            },
        ),
        PlacementError::TimeLimit {
            capacity,
            best_height,
            lower_bound,
            ..
        } => (capacity, best_height, lower_bound, "time_limit"),
    };
    let build = || -> PyResult<PyErr> {
        let class = PlacementInfeasible::type_object(py);
        Ok(PyErr::from_value(class.call1((
            message.clone(),
            capacity,
            best_height,
            lower_bound,
            reason,
        ))?))
    };
    build().unwrap_or_else(|error| error)
}
