//! The one pickling rule of the Python classes: an object pickles as the text (or other
//! plain value) its class rebuilds it from, and unpickles through that class's own
//! `parse` (layouts, pools, pool types, models), `from_jsonl` (traces), `from_dict`
//! (reports) or constructor (device properties, which have no text), so a pickle holds
//! nothing a reader could not write by hand.

use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// What `__reduce__` returns: the rebuilding callable and its one argument.
pub(crate) type Reduced<'py> = (Bound<'py, PyAny>, Bound<'py, PyTuple>);

/// `__reduce__` of `slf` rebuilt by `type(slf).<rebuild>(value)`: `parse` with the text
/// for the layout classes, `from_dict` with `to_dict()` for the reports, `from_jsonl`
/// with the v1 text for traces.
pub(crate) fn reduce_by<'py, T>(
    slf: &Bound<'py, PyAny>,
    rebuild: &str,
    value: T,
) -> PyResult<Reduced<'py>>
where
    T: IntoPyObject<'py>,
{
    let rebuild = slf.get_type().getattr(rebuild)?;
    Ok((rebuild, PyTuple::new(slf.py(), [value])?))
}

/// `__reduce__` of `slf` rebuilt by its class's constructor, `type(slf)(*args)`: for
/// a value with no text, whose constructor takes plain numbers.
pub(crate) fn reduce_by_new<'py>(
    slf: &Bound<'py, PyAny>,
    args: Bound<'py, PyTuple>,
) -> PyResult<Reduced<'py>> {
    Ok((slf.get_type().into_any(), args))
}
