//! Pool options as plain data, for layouts saved as JSON and sent to other processes.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::config::PyMemoryPoolOptions;
use crate::config::PoolType;

/// The fields of one pool's options as a dict: `kind` ("sliced_pages",
/// "exclusive_pages", "direct" or "virtual_pages"), the pool type's sizes by their argument names, and
/// `dealloc_period`; `PoolType.<kind>(**sizes)` rebuilds the type.
#[pyfunction]
pub(crate) fn pool_spec<'py>(
    py: Python<'py>,
    options: &PyMemoryPoolOptions,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    match options.inner.pool_type {
        PoolType::SlicedPages {
            page_size,
            max_slice_size,
            max_pool_size,
        } => {
            dict.set_item("kind", "sliced_pages")?;
            dict.set_item("page_size", page_size)?;
            dict.set_item("max_slice_size", max_slice_size)?;
            dict.set_item("max_pool_size", max_pool_size)?;
        }
        PoolType::ExclusivePages { max_alloc_size } => {
            dict.set_item("kind", "exclusive_pages")?;
            dict.set_item("max_alloc_size", max_alloc_size)?;
        }
        PoolType::Direct { reclaim_at } => {
            dict.set_item("kind", "direct")?;
            dict.set_item("reclaim_at", reclaim_at)?;
        }
        PoolType::VirtualPages {
            granule,
            keep,
            small,
            range,
        } => {
            dict.set_item("kind", "virtual_pages")?;
            dict.set_item("granule", granule)?;
            dict.set_item("keep", keep)?;
            dict.set_item("small", small)?;
            dict.set_item("range", range)?;
        }
        PoolType::Planned { plan, granule } => {
            dict.set_item("kind", "planned")?;
            dict.set_item("file", &crate::plan_file::plan_of(plan).file)?;
            dict.set_item("granule", granule)?;
        }
    }
    dict.set_item("dealloc_period", options.inner.dealloc_period)?;
    Ok(dict)
}
