//! Extractors of integer arguments that name the argument in their errors, for
//! `#[pyo3(from_py_with = ...)]`.
//!
//! PyO3 names an argument only in the `TypeError`s it raises itself: a negative or
//! huge int passed where a `u64` is declared came out as `OverflowError: can't convert
//! negative int to unsigned`, naming nothing. Each extractor here reads its argument
//! as [`size_arg`] does: `InvalidArgument` naming it for a negative int or one past 64
//! bits, `TypeError` naming it for a non-int or a bool.
//!
//! DLPack's keywords are read here too (`max_version`, `dl_device`, `copy`), for the
//! same reason: PyO3's own errors for them named neither the argument nor the value.

use pyo3::prelude::*;

use super::errors::{invalid_argument, size_arg, type_name};

/// Defines, for each `name: kind = "argument";`, `fn name(value) -> PyResult<T>` that
/// reads `argument`: `u64` ([`size_arg`]), `usize` (the same, within the platform's
/// `usize`), or `opt_u64` / `opt_usize` (`None` read as `None`).
macro_rules! named_args {
    ($($name:ident: $kind:ident = $arg:literal;)*) => {$(
        named_args!(@one $name $kind $arg);
    )*};
    (@one $name:ident u64 $arg:literal) => {
        #[doc = concat!("The `", $arg, "` argument, read as [`size_arg`] does.")]
        pub(crate) fn $name(value: &Bound<'_, PyAny>) -> PyResult<u64> {
            size_arg(value, $arg)
        }
    };
    (@one $name:ident usize $arg:literal) => {
        #[doc = concat!("The `", $arg, "` argument, read as [`size_arg`] does.")]
        pub(crate) fn $name(value: &Bound<'_, PyAny>) -> PyResult<usize> {
            narrow(value.py(), size_arg(value, $arg)?, $arg)
        }
    };
    (@one $name:ident opt_u64 $arg:literal) => {
        #[doc = concat!("The `", $arg, "` argument (`None` or an int), read as [`size_arg`] does.")]
        pub(crate) fn $name(value: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
            if value.is_none() {
                return Ok(None);
            }
            size_arg(value, $arg).map(Some)
        }
    };
    (@one $name:ident opt_usize $arg:literal) => {
        #[doc = concat!("The `", $arg, "` argument (`None` or an int), read as [`size_arg`] does.")]
        pub(crate) fn $name(value: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
            if value.is_none() {
                return Ok(None);
            }
            narrow(value.py(), size_arg(value, $arg)?, $arg).map(Some)
        }
    };
}

/// `value` as a narrower integer type, or `InvalidArgument` naming `what`.
fn narrow<T: TryFrom<u64>>(py: Python<'_>, value: u64, what: &str) -> PyResult<T> {
    T::try_from(value).map_err(|_| {
        invalid_argument(
            py,
            format!(
                "{what} is too large: {value} does not fit in {} bits",
                8 * std::mem::size_of::<T>()
            ),
        )
    })
}

named_args! {
    keep: opt_u64 = "keep";
    max_split_size_mb: opt_u64 = "max_split_size_mb";
    page_size: usize = "page_size";
    max_cached_bytes: opt_usize = "max_cached_bytes";
    byte_offset: u64 = "byte_offset";
    relative_byte_offset: u64 = "relative_byte_offset";
    nbytes: usize = "nbytes";
    alignment: usize = "alignment";
    shape: usize = "shape";
    elem_size: usize = "elem_size";
    buffer_align: usize = "buffer_align";
    number_allocs: u64 = "number_allocs";
    bytes_in_use: u64 = "bytes_in_use";
    bytes_padding: u64 = "bytes_padding";
    bytes_reserved: u64 = "bytes_reserved";
    start: usize = "start";
    cut: usize = "cut";
    event_time: u64 = "t";
    alloc_id: u64 = "id";
    alloc_size: u64 = "size";
}

/// The items of the sequence `value`, each read by `item` with its place named
/// (`what[i]`); a `str` (a sequence of characters) and what is no sequence (a set, a
/// dict) are refused.
fn sequence<T>(
    value: &Bound<'_, PyAny>,
    what: &str,
    item: impl Fn(&Bound<'_, PyAny>, &str) -> PyResult<T>,
) -> PyResult<Vec<T>> {
    let items = items_of(value, || format!("{what} must be a sequence"))?;
    // Room for the items the sequence says it holds, taken fallibly, and grown so: a
    // length past what memory holds (`range(2**60)`, or a `__len__` that lies) is a
    // `MemoryError`. PyO3's own `Vec` extraction reserved `len()` items up front,
    // infallibly, and aborted the interpreter.
    let mut out = Vec::new();
    let len = match value.len() {
        Ok(len) => len,
        // A length past what an index holds (`range(2**64)`): past any memory too.
        Err(error) if error.is_instance_of::<pyo3::exceptions::PyOverflowError>(value.py()) => {
            usize::MAX
        }
        // No length to go by: the items are counted as they come.
        Err(_) => 0,
    };
    reserve(&mut out, len, what)?;
    for (index, entry) in items.enumerate() {
        if out.len() == out.capacity() {
            let more = out.len().max(8);
            reserve(&mut out, more, what)?;
        }
        // The item's place is spelled out only for its error: read again under its
        // name, a refused item is refused the same way. (A name formatted per item took
        // `pool_routes` of a million sizes from 0.052 s to 0.094 s.)
        let entry = entry?;
        let value = match item(&entry, what) {
            Ok(value) => value,
            Err(_) => item(&entry, &format!("{what}[{index}]"))?,
        };
        out.push(value);
    }
    Ok(out)
}

/// An iterator over the items of the sequence `value`, in its order; `TypeError` saying
/// `must` (and what `value` is) for a `str` (a sequence of characters) and for what is
/// no sequence (a set's order is no order: limits must ascend).
fn items_of<'py>(
    value: &Bound<'py, PyAny>,
    must: impl Fn() -> String,
) -> PyResult<Bound<'py, pyo3::types::PyIterator>> {
    if value.is_instance_of::<pyo3::types::PyString>()
        || value.cast::<pyo3::types::PySequence>().is_err()
    {
        return Err(not_a(value, must));
    }
    value.try_iter().map_err(|_| not_a(value, must))
}

/// The `TypeError` of `value`, which is not what `must` says.
fn not_a(value: &Bound<'_, PyAny>, must: impl Fn() -> String) -> PyErr {
    pyo3::exceptions::PyTypeError::new_err(format!("{}, got {}", must(), type_name(value)))
}

/// Room for `more` items in `out`, or `MemoryError` naming `what`.
fn reserve<T>(out: &mut Vec<T>, more: usize, what: &str) -> PyResult<()> {
    out.try_reserve(more).map_err(|_| {
        pyo3::exceptions::PyMemoryError::new_err(format!(
            "{what} has more items than memory holds (room for {} asked)",
            out.len().saturating_add(more)
        ))
    })
}

/// A `(low, high)` pair of sizes at `what`, each read as [`size_arg`] does.
fn size_pair(value: &Bound<'_, PyAny>, what: &str) -> PyResult<(u64, u64)> {
    let must = || format!("{what} must be a (low, high) pair of sizes");
    // At most three items are read: a pair, or what is not one.
    let mut items = items_of(value, must)?;
    let mut next = |index: usize| -> PyResult<Option<u64>> {
        items
            .next()
            .transpose()?
            .map(|item| size_arg(&item, &format!("{what}[{index}]")))
            .transpose()
    };
    match (next(0)?, next(1)?, next(2)?) {
        (Some(low), Some(high), None) => Ok((low, high)),
        _ => Err(not_a(value, must)),
    }
}

/// The `sizes` argument: sizes, each read as [`size_arg`] does.
pub(crate) fn sizes(value: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    sequence(value, "sizes", size_arg)
}

/// The `sizes` argument where it may be `None`.
pub(crate) fn opt_sizes(value: &Bound<'_, PyAny>) -> PyResult<Option<Vec<u64>>> {
    if value.is_none() {
        return Ok(None);
    }
    sizes(value).map(Some)
}

/// The `size_ranges` argument (`None`, or `(low, high)` pairs of sizes).
pub(crate) fn opt_size_ranges(value: &Bound<'_, PyAny>) -> PyResult<Option<Vec<(u64, u64)>>> {
    if value.is_none() {
        return Ok(None);
    }
    sequence(value, "size_ranges", size_pair).map(Some)
}

/// The `groups` argument of `range_live_peaks`: sequences of `(low, high)` pairs.
pub(crate) fn range_groups(value: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<(u64, u64)>>> {
    sequence(value, "groups", |group, what| {
        sequence(group, what, size_pair)
    })
}

/// The `draws` argument of `Trace.reordered`: floats.
pub(crate) fn draws(value: &Bound<'_, PyAny>) -> PyResult<Vec<f64>> {
    sequence(value, "draws", |draw, what| {
        draw.extract::<f64>().map_err(|_| {
            pyo3::exceptions::PyTypeError::new_err(format!(
                "{what} must be a float, got {}",
                type_name(draw)
            ))
        })
    })
}

/// The `state` argument of `Trace.reordered_from_state`: 32-bit words.
pub(crate) fn twister_state(value: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    sequence(value, "state", |word, what| {
        narrow(word.py(), size_arg(word, what)?, what)
    })
}

/// The `frames` argument of `TraceBuilder.alloc` (`None`, or strings).
pub(crate) fn opt_frames(value: &Bound<'_, PyAny>) -> PyResult<Option<Vec<String>>> {
    if value.is_none() {
        return Ok(None);
    }
    sequence(value, "frames", |frame, what| {
        frame.extract::<String>().map_err(|_| {
            if frame.is_instance_of::<pyo3::types::PyString>() {
                // A str that is no UTF-8 text, which a trace's frames are.
                pyo3::exceptions::PyValueError::new_err(format!(
                    "{what} is not UTF-8 text (it holds a lone surrogate)"
                ))
            } else {
                pyo3::exceptions::PyTypeError::new_err(format!(
                    "{what} must be a str, got {}",
                    type_name(frame)
                ))
            }
        })
    })
    .map(Some)
}

/// The `limits` argument: sizes, each read as [`size_arg`] does.
pub(crate) fn limits(value: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    sequence(value, "limits", size_arg)
}

/// The `groups` argument: sequences of sizes, each read as [`size_arg`] does.
pub(crate) fn groups(value: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<u64>>> {
    sequence(value, "groups", |group, what| {
        sequence(group, what, size_arg)
    })
}

/// The `ids` argument: allocation ids (32 bits), each read as [`size_arg`] does.
pub(crate) fn ids(value: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    sequence(value, "ids", |id, what| {
        narrow(id.py(), size_arg(id, what)?, what)
    })
}

/// The `device_type` argument of `device_type_to_str`: an int (or anything with
/// `__index__`, as a numpy integer); one past 32 bits is no device type (`TensorError`,
/// as for an unknown one, with the int as given).
pub(crate) fn device_type(value: &Bound<'_, PyAny>) -> PyResult<i32> {
    let py = value.py();
    let refused = || {
        pyo3::exceptions::PyTypeError::new_err(format!(
            "device_type must be an int, got {}",
            type_name(value)
        ))
    };
    if value.is_instance_of::<pyo3::types::PyBool>() {
        return Err(refused());
    }
    let index = py
        .import("operator")?
        .call_method1("index", (value,))
        .map_err(|_| refused())?;
    match index.extract::<i32>() {
        Ok(device_type) => Ok(device_type),
        Err(_) => Err(super::errors::classes::TensorError::new_err(format!(
            "unknown type = {}",
            if index.call_method0("bit_length")?.extract::<u64>()? <= 128 {
                index.to_string()
            } else {
                "an int past 128 bits".to_string()
            }
        ))),
    }
}

/// A 32-bit signed integer argument (DLPack's device fields), named `what` in its
/// errors: `ValueError` for an int out of range, `TypeError` for anything else (a
/// bool included).
pub(crate) fn i32_arg(value: &Bound<'_, PyAny>, what: &str) -> PyResult<i32> {
    if value.is_instance_of::<pyo3::types::PyBool>() {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "{what} must be an int, got bool"
        )));
    }
    if let Ok(number) = value.extract::<i32>() {
        return Ok(number);
    }
    if value.is_instance_of::<pyo3::types::PyInt>() {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "{what} must fit in 32 bits (DLPack's int32), got {value}"
        )));
    }
    Err(pyo3::exceptions::PyTypeError::new_err(format!(
        "{what} must be an int, got {}",
        type_name(value)
    )))
}

/// The two items of `value`, a tuple of two (the shape DLPack gives `max_version` and
/// `dl_device`); `TypeError` naming `what` and `shape` otherwise.
fn pair<'py>(
    value: &Bound<'py, PyAny>,
    what: &str,
    shape: &str,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let refused = || {
        pyo3::exceptions::PyTypeError::new_err(format!(
            "{what} must be a {shape} tuple, got {}",
            match value.cast::<pyo3::types::PyTuple>() {
                Ok(tuple) => format!("a tuple of {}", tuple.len()),
                Err(_) => type_name(value),
            }
        ))
    };
    let tuple = value
        .cast::<pyo3::types::PyTuple>()
        .map_err(|_| refused())?;
    if tuple.len() != 2 {
        return Err(refused());
    }
    Ok((tuple.get_item(0)?, tuple.get_item(1)?))
}

// `__dlpack__`'s keywords (and `from_dlpack`'s `copy`). Read by PyO3, a version or a
// device past its C type was a bare `OverflowError` ("out of range integral type
// conversion attempted") and a non-bool `copy` a `TypeError` naming no argument.

/// `__dlpack__`'s `max_version`: `None`, or `(major, minor)`, each read as [`size_arg`]
/// does (a version past `u32` is only a version newer than any cubepool knows).
pub(crate) fn dlpack_max_version(value: &Bound<'_, PyAny>) -> PyResult<Option<(u64, u64)>> {
    if value.is_none() {
        return Ok(None);
    }
    let (major, minor) = pair(value, "max_version", "(major, minor)")?;
    Ok(Some((
        size_arg(&major, "max_version[0]")?,
        size_arg(&minor, "max_version[1]")?,
    )))
}

/// `__dlpack__`'s `dl_device`: `None`, or `(device_type, device_id)`, each read as
/// [`i32_arg`] does.
pub(crate) fn dlpack_device(value: &Bound<'_, PyAny>) -> PyResult<Option<(i32, i32)>> {
    if value.is_none() {
        return Ok(None);
    }
    let (device_type, device_id) = pair(value, "dl_device", "(device_type, device_id)")?;
    Ok(Some((
        i32_arg(&device_type, "dl_device[0]")?,
        i32_arg(&device_id, "dl_device[1]")?,
    )))
}

/// The `copy` keyword of `__dlpack__` and `from_dlpack`: `None`, `True` or `False`.
pub(crate) fn dlpack_copy(value: &Bound<'_, PyAny>) -> PyResult<Option<bool>> {
    if value.is_none() {
        return Ok(None);
    }
    // PyO3's own conversion, as before: it takes numpy's booleans too (`np.False_`),
    // and refuses an int such as 2, which now names the keyword.
    value.extract::<bool>().map(Some).map_err(|_| {
        pyo3::exceptions::PyTypeError::new_err(format!(
            "copy must be True, False or None, got {}",
            type_name(value)
        ))
    })
}
