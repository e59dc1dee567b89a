//! Python classes for device properties, pool types and configurations.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use super::errors::{
    byte_size_arg, config_error, config_load_error, config_text_error, invalid_argument,
    opt_byte_size_arg, opt_size_arg,
};
use super::pickling::{reduce_by, reduce_by_new, Reduced};
use crate::config::{
    ConfigTextError, MemoryConfiguration, MemoryDeviceProperties, MemoryPoolOptions,
    PoolConfigError, PoolType,
};

/// The layout `config=None` means: `CUBEPOOL_MEMORY_POOLS`, else `memory.pools` in the
/// nearest `cubepool.toml`, else the build's default.
pub(crate) fn configured(py: Python<'_>) -> PyResult<MemoryConfiguration> {
    MemoryConfiguration::configured().map_err(|e| config_load_error(py, e))
}

/// Reads configuration text. Text with a lone surrogate (which no UTF-8 text holds:
/// Python's stand-in for a byte of a file name that is not UTF-8) is refused with a
/// `PoolConfigError` at the first one, where the grammar does not refuse it first: read
/// as `?`, a plan file's name would have named another file.
fn parse_text(py: Python<'_>, text: &Bound<'_, PyString>) -> PyResult<MemoryConfiguration> {
    parse_text_in(py, text, None)
}

/// [`parse_text`] of text read from a file in `folder`, whose relative plan files it
/// names (`MemoryConfiguration::parse_in_folder`); `None`: the working folder.
fn parse_text_in(
    py: Python<'_>,
    text: &Bound<'_, PyString>,
    folder: Option<&std::path::Path>,
) -> PyResult<MemoryConfiguration> {
    let parse = |text: &str| match folder {
        Some(folder) => MemoryConfiguration::parse_in_folder(text, folder),
        None => MemoryConfiguration::parse(text),
    };
    let parsed = match text.to_str() {
        Ok(text) => parse(text),
        Err(_) => {
            let bytes = text.call_method1("encode", ("utf-8", "replace"))?;
            let replaced = String::from_utf8_lossy(bytes.extract::<&[u8]>()?).into_owned();
            let passed = text.call_method1("encode", ("utf-8", "surrogatepass"))?;
            let surrogate = ConfigTextError {
                position: first_surrogate(passed.extract::<&[u8]>()?),
                error: PoolConfigError::Syntax {
                    expected: "UTF-8 text",
                    found: "a lone surrogate (a byte of a file name that is not UTF-8)".into(),
                },
            };
            parse(&replaced).and(Err(surrogate))
        }
    };
    parsed.map_err(|e| config_text_error(py, &e))
}

/// The position, in characters, of the first lone surrogate in `bytes` (text encoded
/// with Python's `surrogatepass`, which writes a surrogate as a three-byte sequence
/// `ED A0..BF xx`); the number of characters where there is none.
fn first_surrogate(bytes: &[u8]) -> usize {
    let mut position = 0;
    let mut at = 0;
    while let Some(&lead) = bytes.get(at) {
        if lead == 0xED && bytes.get(at + 1).is_some_and(|&next| next >= 0xA0) {
            break;
        }
        at += match lead {
            0x00..=0x7F => 1,
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            _ => 4,
        };
        position += 1;
    }
    position
}

/// The one pool `text` says: one entry of the configuration language, as `str` of a
/// `MemoryPoolOptions` writes it.
fn parse_pool(py: Python<'_>, text: &Bound<'_, PyString>) -> PyResult<MemoryPoolOptions> {
    match parse_text(py, text)? {
        MemoryConfiguration::Custom { pool_options } if pool_options.len() == 1 => {
            Ok(pool_options[0])
        }
        other => Err(invalid_argument(
            py,
            format!(
                "a pool is one entry of the configuration language, such as \
                 \"sliced(page=8MiB, max_slice=4MiB)\"; {:?} is a layout of its own",
                other.to_string()
            ),
        )),
    }
}

/// A layout argument: a `MemoryConfiguration`, None for the configured layout
/// ([`configured`]), or anything else the Python side's one rule for layouts takes
/// (`cubepool.layouts.as_configuration`: a preset name such as `default`, pools-language
/// text, a saved layout file, a `Plan`).
pub(crate) fn config_arg(
    py: Python<'_>,
    config: Option<&Bound<'_, PyAny>>,
) -> PyResult<MemoryConfiguration> {
    let value = match config {
        None => return configured(py),
        Some(value) if value.is_none() => return configured(py),
        Some(value) => value,
    };
    if let Ok(config) = value.cast::<PyMemoryConfiguration>() {
        return Ok(config.get().inner.clone());
    }
    if let Ok(text) = value.cast::<PyString>() {
        // Configuration text and presets read here, with the parser's positions.
        if let Ok(config) = parse_text(py, text) {
            return Ok(config);
        }
    }
    let resolved = py
        .import("cubepool.layouts")?
        .getattr("as_configuration")?
        .call1((value,))?;
    if let Ok(config) = resolved.cast::<PyMemoryConfiguration>() {
        Ok(config.get().inner.clone())
    } else if let Ok(model) = resolved.cast::<super::torch_model::PyTorchAllocatorModel>() {
        let name = model.get().inner.to_string();
        Err(config_error(
            py,
            &PoolConfigError::ComparisonModel { name },
            None,
        ))
    } else {
        Err(PyTypeError::new_err(
            "config must be a MemoryConfiguration, a Plan, a preset name, configuration text, \
             a layout file or None",
        ))
    }
}

/// Limits of the device whose memory is managed: the largest page and the alignment.
#[pyclass(
    name = "MemoryDeviceProperties",
    module = "cubepool._cubepool",
    frozen,
    eq,
    hash,
    skip_from_py_object
)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct PyMemoryDeviceProperties {
    pub(crate) inner: MemoryDeviceProperties,
}

#[pymethods]
impl PyMemoryDeviceProperties {
    #[new]
    #[pyo3(signature = (max_page_size = None, alignment = None))]
    fn new(
        py: Python<'_>,
        max_page_size: Option<&Bound<'_, PyAny>>,
        alignment: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let defaults = MemoryDeviceProperties::default();
        let inner = MemoryDeviceProperties {
            max_page_size: opt_byte_size_arg(max_page_size, "max_page_size")?
                .unwrap_or(defaults.max_page_size),
            alignment: opt_byte_size_arg(alignment, "alignment")?.unwrap_or(defaults.alignment),
        };
        inner.validate().map_err(|e| config_error(py, &e, None))?;
        Ok(Self { inner })
    }

    /// The largest single page, in bytes.
    #[getter]
    fn max_page_size(&self) -> u64 {
        self.inner.max_page_size
    }

    /// The alignment of every slice, in bytes.
    #[getter]
    fn alignment(&self) -> u64 {
        self.inner.alignment
    }

    /// Pickles as its two numbers (`MemoryDeviceProperties(max_page_size, alignment)`):
    /// device properties have no text.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Reduced<'py>> {
        let inner = slf.get().inner;
        let args = PyTuple::new(slf.py(), [inner.max_page_size, inner.alignment])?;
        reduce_by_new(slf.as_any(), args)
    }

    fn __repr__(&self) -> String {
        format!(
            "MemoryDeviceProperties(max_page_size={}, alignment={})",
            self.inner.max_page_size, self.inner.alignment
        )
    }
}

/// The type of one memory pool: sliced pages, exclusive pages, direct buffers or
/// virtual pages.
#[pyclass(
    name = "PoolType",
    module = "cubepool._cubepool",
    frozen,
    eq,
    hash,
    skip_from_py_object
)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct PyPoolType {
    pub(crate) inner: PoolType,
}

#[pymethods]
impl PyPoolType {
    /// Pages of `page_size` bytes carved into slices of at most `max_slice_size` bytes;
    /// with `max_pool_size`, at most that many bytes of pages.
    #[staticmethod]
    #[pyo3(signature = (page_size, max_slice_size, max_pool_size = None))]
    fn sliced_pages(
        page_size: &Bound<'_, PyAny>,
        max_slice_size: &Bound<'_, PyAny>,
        max_pool_size: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        Ok(Self {
            inner: PoolType::SlicedPages {
                page_size: byte_size_arg(page_size, "page_size")?,
                max_slice_size: byte_size_arg(max_slice_size, "max_slice_size")?,
                max_pool_size: opt_byte_size_arg(max_pool_size, "max_pool_size")?,
            },
        })
    }

    /// One allocation per page, for sizes up to `max_alloc_size`.
    #[staticmethod]
    fn exclusive_pages(max_alloc_size: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Self {
            inner: PoolType::ExclusivePages {
                max_alloc_size: byte_size_arg(max_alloc_size, "max_alloc_size")?,
            },
        })
    }

    /// Every allocation its own buffer, reused by exact size; cached free buffers are
    /// released once they exceed `reclaim_at` bytes.
    #[staticmethod]
    #[pyo3(signature = (reclaim_at = None))]
    fn direct(reclaim_at: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        Ok(Self {
            inner: PoolType::Direct {
                reclaim_at: opt_byte_size_arg(reclaim_at, "reclaim_at")?,
            },
        })
    }

    /// Blocks placed best-fit over reserved address space, with memory mapped in
    /// `granule`-byte granules where live blocks are: idle mapped bytes past `keep`
    /// are unmapped (0, the default: at once; None: only the high-water mark of
    /// mapped bytes bounds them), requests up to `small` bytes (1 MiB) get an
    /// address range of their own, each range spans `range` bytes (1 TiB) of address
    /// space. Needs a storage with virtual memory (host memory on Linux, or replays).
    #[staticmethod]
    #[pyo3(
        signature = (granule, keep = Some(0), small = None, range = None),
        text_signature = "(granule, keep=0, small=None, range=None)"
    )]
    fn virtual_pages(
        granule: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = super::args::keep)] keep: Option<u64>,
        small: Option<&Bound<'_, PyAny>>,
        range: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        Ok(Self {
            inner: PoolType::VirtualPages {
                granule: byte_size_arg(granule, "granule")?,
                keep,
                small: opt_byte_size_arg(small, "small")?.unwrap_or(PoolType::VIRTUAL_SMALL),
                range: opt_byte_size_arg(range, "range")?.unwrap_or(PoolType::VIRTUAL_RANGE),
            },
        })
    }

    /// "sliced_pages", "exclusive_pages", "direct", "virtual_pages" or "planned".
    #[getter]
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    /// Reads a pool type written as one entry of the configuration language, such as
    /// "sliced(page=8MiB, max_slice=4MiB)" (without `dealloc_period`, which is an option
    /// of the pool, not of its type).
    #[staticmethod]
    fn parse(py: Python<'_>, text: &Bound<'_, PyString>) -> PyResult<Self> {
        let options = parse_pool(py, text)?;
        if options.dealloc_period.is_some() {
            return Err(invalid_argument(
                py,
                "a pool type has no dealloc_period: read it with MemoryPoolOptions.parse"
                    .to_string(),
            ));
        }
        Ok(Self {
            inner: options.pool_type,
        })
    }

    /// Pickles as its text (`PoolType.parse`).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Reduced<'py>> {
        let options = MemoryPoolOptions {
            pool_type: slf.get().inner,
            dealloc_period: None,
        };
        reduce_by(slf.as_any(), "parse", options.to_string())
    }

    fn __repr__(&self) -> String {
        pool_type_repr(&self.inner)
    }
}

pub(crate) fn pool_type_repr(pool_type: &PoolType) -> String {
    let opt = |value: Option<u64>| value.map_or("None".to_string(), |v| v.to_string());
    match *pool_type {
        PoolType::SlicedPages {
            page_size,
            max_slice_size,
            max_pool_size,
        } => format!(
            "PoolType.sliced_pages(page_size={page_size}, max_slice_size={max_slice_size}, \
             max_pool_size={})",
            opt(max_pool_size)
        ),
        PoolType::ExclusivePages { max_alloc_size } => {
            format!("PoolType.exclusive_pages(max_alloc_size={max_alloc_size})")
        }
        PoolType::Direct { reclaim_at } => {
            format!("PoolType.direct(reclaim_at={})", opt(reclaim_at))
        }
        PoolType::VirtualPages {
            granule,
            keep,
            small,
            range,
        } => format!(
            "PoolType.virtual_pages(granule={granule}, keep={}, small={small}, range={range})",
            opt(keep)
        ),
        PoolType::Planned { plan, granule } => format!(
            "PoolType.parse({:?})",
            MemoryPoolOptions::new(PoolType::Planned { plan, granule }).to_string()
        ),
    }
}

/// Options to create one memory pool: its type and how often free pages are released.
#[pyclass(
    name = "MemoryPoolOptions",
    module = "cubepool._cubepool",
    frozen,
    eq,
    hash,
    skip_from_py_object
)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct PyMemoryPoolOptions {
    pub(crate) inner: MemoryPoolOptions,
}

#[pymethods]
impl PyMemoryPoolOptions {
    #[new]
    #[pyo3(signature = (pool_type, dealloc_period = None))]
    fn new(pool_type: &PyPoolType, dealloc_period: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        Ok(Self {
            inner: MemoryPoolOptions {
                pool_type: pool_type.inner,
                dealloc_period: opt_size_arg(dealloc_period, "dealloc_period")?,
            },
        })
    }

    /// The pool's type.
    #[getter]
    fn pool_type(&self) -> PyPoolType {
        PyPoolType {
            inner: self.inner.pool_type,
        }
    }

    /// Reservations between releases of pages that stayed free, or None.
    #[getter]
    fn dealloc_period(&self) -> Option<u64> {
        self.inner.dealloc_period
    }

    fn __repr__(&self) -> String {
        let period = self
            .inner
            .dealloc_period
            .map_or("None".to_string(), |p| p.to_string());
        format!(
            "MemoryPoolOptions({}, dealloc_period={period})",
            pool_type_repr(&self.inner.pool_type)
        )
    }

    /// Reads a pool written as one entry of the configuration language, such as
    /// "exclusive(max_alloc=2GiB, dealloc_period=5000)" (what `str` of the options gives).
    #[staticmethod]
    fn parse(py: Python<'_>, text: &Bound<'_, PyString>) -> PyResult<Self> {
        Ok(Self {
            inner: parse_pool(py, text)?,
        })
    }

    /// The pool as one entry of the configuration language.
    fn __str__(&self) -> String {
        self.inner.to_string()
    }

    /// Pickles as its text (`MemoryPoolOptions.parse(str(o))`).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Reduced<'py>> {
        reduce_by(slf.as_any(), "parse", slf.get().inner.to_string())
    }
}

/// A pool layout: the `sub_slices` or `exclusive_pages` preset, or a custom list.
#[pyclass(
    name = "MemoryConfiguration",
    module = "cubepool._cubepool",
    frozen,
    eq,
    hash,
    skip_from_py_object
)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct PyMemoryConfiguration {
    pub(crate) inner: MemoryConfiguration,
}

#[pymethods]
impl PyMemoryConfiguration {
    /// cubepool's default layout: one virtual pool of 2 MiB granules that keeps free
    /// granules mapped up to the high-water mark (`compact` where the storage has no
    /// virtual memory).
    #[staticmethod]
    fn virtual_pages(py: Python<'_>) -> PyResult<Self> {
        Self::checked(py, MemoryConfiguration::VirtualPages)
    }

    /// cubepool's layout without virtual memory: 8 MiB sliced pages for sizes up to
    /// 4 MiB, then exclusive pages sized to each larger request.
    #[staticmethod]
    fn compact(py: Python<'_>) -> PyResult<Self> {
        Self::checked(py, MemoryConfiguration::Compact)
    }

    /// CubeCL's default layout: a ladder of sliced pools between exclusive pools.
    #[staticmethod]
    fn sub_slices(py: Python<'_>) -> PyResult<Self> {
        Self::checked(py, MemoryConfiguration::SubSlices)
    }

    /// 24 log-spaced exclusive pools from 32 KiB to the largest page.
    #[staticmethod]
    fn exclusive_pages(py: Python<'_>) -> PyResult<Self> {
        Self::checked(py, MemoryConfiguration::ExclusivePages)
    }

    /// A custom list of pools, tried in order.
    #[staticmethod]
    fn custom(py: Python<'_>, pools: &Bound<'_, PyList>) -> PyResult<Self> {
        let pool_options = pools
            .iter()
            .map(|item| {
                item.cast::<PyMemoryPoolOptions>()
                    .map(|o| o.get().inner)
                    .map_err(|_| PyTypeError::new_err("custom() takes a list of MemoryPoolOptions"))
            })
            .collect::<PyResult<Vec<_>>>()?;
        Self::checked(py, MemoryConfiguration::Custom { pool_options })
    }

    /// The effective pools of this layout for `properties` (default properties when
    /// None): sizes rounded to the alignment, pages shrunk to the largest page.
    #[pyo3(signature = (properties = None))]
    fn pools(
        &self,
        py: Python<'_>,
        properties: Option<&PyMemoryDeviceProperties>,
    ) -> PyResult<Vec<PyMemoryPoolOptions>> {
        let properties = properties.map(|p| p.inner).unwrap_or_default();
        let options = self
            .inner
            .resolve(&properties)
            .map_err(|e| config_error(py, &e, None))?;
        Ok(options
            .into_iter()
            .map(|inner| PyMemoryPoolOptions { inner })
            .collect())
    }

    /// The pools of a custom layout exactly as given (empty for a preset).
    #[getter]
    fn pool_options(&self) -> Vec<PyMemoryPoolOptions> {
        match &self.inner {
            MemoryConfiguration::Custom { pool_options } => pool_options
                .iter()
                .map(|&inner| PyMemoryPoolOptions { inner })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The preset's name ("sub_slices", "exclusive_pages", ...) or "custom".
    #[getter]
    fn preset(&self) -> &'static str {
        self.inner.preset_name().unwrap_or("custom")
    }

    /// Reads a layout written in the pools configuration language: a preset name, or
    /// one pool per entry separated by ";" or new lines, such as
    /// "sliced(page=8MiB, max_slice=512KiB); exclusive(max_alloc=2GiB, dealloc_period=5000)".
    /// Sizes take B, KiB, MiB, GiB, TiB (and KB, MB, GB, TB, powers of 1000).
    ///
    /// With `folder` (the text read from a file there), a relative
    /// `planned(file=...)` names a plan in that folder, and the layout names it by the
    /// joined path; without it, in the working folder.
    ///
    /// Raises PoolConfigError with `kind`, `field` and `position` (the character offset
    /// of the problem).
    #[staticmethod]
    #[pyo3(signature = (text, folder = None))]
    fn parse(
        py: Python<'_>,
        text: &Bound<'_, PyString>,
        folder: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        Ok(Self {
            inner: parse_text_in(py, text, folder.as_deref())?,
        })
    }

    /// The preset names `parse` accepts.
    #[staticmethod]
    fn presets() -> Vec<&'static str> {
        MemoryConfiguration::PRESETS
            .iter()
            .map(|(name, _)| *name)
            .collect()
    }

    /// The layout the environment names, and where it came from: the
    /// CUBEPOOL_MEMORY_POOLS variable, else `memory.pools` in the nearest cubepool.toml
    /// (searched from the working directory up); None when neither names one. This is
    /// what `MemoryManagement(config=None)` and `replay(config=None)` use before the
    /// build's default.
    #[staticmethod]
    fn from_environment(py: Python<'_>) -> PyResult<Option<(Self, String)>> {
        let found =
            MemoryConfiguration::from_environment().map_err(|e| config_load_error(py, e))?;
        Ok(found.map(|(inner, source)| (Self { inner }, source.to_string())))
    }

    /// The layout `memory.pools` says in the `cubepool.toml`-style file `path`, read as
    /// the automatic search reads one (a relative plan file is the file's neighbour);
    /// None when the file has no `memory.pools`. Raises PoolConfigError naming the
    /// file (and OSError where it cannot be read).
    #[staticmethod]
    fn from_toml_file(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Option<Self>> {
        let found = crate::config::environment::read_config_file(&path)
            .map_err(|e| config_load_error(py, e))?;
        Ok(found.map(|(inner, _)| Self { inner }))
    }

    /// The configuration text (`MemoryConfiguration.parse(str(c)) == c`).
    fn __str__(&self) -> String {
        self.inner.to_string()
    }

    /// Pickles as its text (`MemoryConfiguration.parse(str(c))`).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Reduced<'py>> {
        reduce_by(slf.as_any(), "parse", slf.get().inner.to_string())
    }

    fn __repr__(&self) -> String {
        match &self.inner {
            MemoryConfiguration::VirtualPages => "MemoryConfiguration.virtual_pages()".to_string(),
            MemoryConfiguration::Compact => "MemoryConfiguration.compact()".to_string(),
            MemoryConfiguration::SubSlices => "MemoryConfiguration.sub_slices()".to_string(),
            MemoryConfiguration::ExclusivePages => {
                "MemoryConfiguration.exclusive_pages()".to_string()
            }
            MemoryConfiguration::Custom { pool_options } => {
                let pools: Vec<String> = pool_options
                    .iter()
                    .map(|o| PyMemoryPoolOptions { inner: *o }.__repr__())
                    .collect();
                format!("MemoryConfiguration.custom([{}])", pools.join(", "))
            }
        }
    }
}

impl PyMemoryConfiguration {
    /// Refuses layouts that are invalid whatever the device (structural errors and
    /// presets this build lacks); device-specific checks happen when pools are built.
    fn checked(py: Python<'_>, inner: MemoryConfiguration) -> PyResult<Self> {
        inner.validate().map_err(|e| config_error(py, &e, None))?;
        Ok(Self { inner })
    }
}

/// The arena granule the plan file at `path` names (its `"granule"`), None where it
/// names none: the file read and checked as a `planned` pool reads it, within
/// `MAX_PLAN_BYTES`, so that a layout given as a plan file needs no read of its own.
///
/// Raises PoolConfigError (kind `PlanFile`, as `planned(file=...)` raises it) naming
/// the file and what is wrong with it.
#[pyfunction]
pub(crate) fn plan_file_granule(py: Python<'_>, path: &str) -> PyResult<Option<u64>> {
    let plan = py
        .detach(|| crate::plan_file::Plan::read(path))
        .map_err(|error| config_error(py, &PoolConfigError::PlanFile(Box::new(error)), None))?;
    Ok(plan.granule)
}

/// Reads a size: a number of bytes and a unit among B, KiB, MiB, GiB, TiB (powers of
/// 1024) and KB, MB, GB, TB (powers of 1000), in any case, as the pools configuration
/// language writes sizes ("300MiB", "1.5 GiB", "64KB" is 64,000 bytes); no unit means
/// bytes. An int is returned as it is.
///
/// Raises InvalidArgument (a ValueError) naming what is wrong with the text.
#[pyfunction]
#[pyo3(signature = (text, what = "size"))]
pub(crate) fn parse_size(text: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    byte_size_arg(text, what)
}
