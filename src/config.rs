//! Pool layouts: device properties, pool types, presets and their validation.
//!
//! A [`MemoryConfiguration`] names a layout (a preset or a custom list of
//! [`MemoryPoolOptions`]); [`MemoryConfiguration::resolve`] validates it against the
//! [`MemoryDeviceProperties`] and returns the *effective* pool options (sizes rounded to
//! the alignment, pages shrunk to the device's largest page), which is what the pools
//! are built from.
//!
//! Configurations are also written as text in the pools configuration language
//! ([`text`]: `MemoryConfiguration::parse` and `Display`), and loaded from the
//! `CUBEPOOL_MEMORY_POOLS` environment variable or a `cubepool.toml` file
//! ([`environment`]).

pub mod environment;
pub mod text;

pub use environment::{ConfigLoadError, ConfigSource, CONFIG_FILE, ENV_VAR};
pub use text::ConfigTextError;

use thiserror::Error;

/// Whether this build refuses pools that share a page between allocations: the
/// `exclusive-memory-only` feature (CubeCL's flag of the same name).
pub const EXCLUSIVE_MEMORY_ONLY: bool = cfg!(feature = "exclusive-memory-only");

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// The most pages a capped sliced pool may hold (CubeCL's page index is 16 bits).
pub const MAX_PAGES_PER_POOL: u64 = 65_535;
/// The most pools one configuration may hold (CubeCL's pool index is 8 bits, one kept
/// for the persistent pool).
pub const MAX_POOLS: usize = 254;
// A pool's index, and the persistent pool's after every configured one, fit in a `u8`.
const _: () = assert!(MAX_POOLS < u8::MAX as usize);

/// Limits of the device whose memory is managed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemoryDeviceProperties {
    /// The largest single storage allocation (page) the device allows, in bytes.
    pub max_page_size: u64,
    /// The alignment of every slice offset, in bytes; a power of two.
    pub alignment: u64,
}

impl Default for MemoryDeviceProperties {
    fn default() -> Self {
        Self {
            max_page_size: 2 * 1024 * MIB,
            alignment: 64,
        }
    }
}

impl MemoryDeviceProperties {
    /// Checks that the properties can drive a pool layout.
    pub fn validate(&self) -> Result<(), PoolConfigError> {
        if self.max_page_size == 0 {
            return Err(PoolConfigError::ZeroSize {
                field: "max_page_size",
            });
        }
        if self.alignment == 0 {
            return Err(PoolConfigError::ZeroSize { field: "alignment" });
        }
        if !self.alignment.is_power_of_two() {
            return Err(PoolConfigError::AlignmentNotPowerOfTwo {
                alignment: self.alignment,
            });
        }
        if self.alignment > self.max_page_size {
            return Err(PoolConfigError::AlignmentLargerThanPage {
                alignment: self.alignment,
                max_page_size: self.max_page_size,
            });
        }
        Ok(())
    }
}

/// The type of one memory pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolType {
    /// Pages of `page_size` bytes carved into slices of at most `max_slice_size`
    /// bytes (or of more than 80 % of a page when uncapped); at most
    /// `max_pool_size / page_size` pages when capped.
    SlicedPages {
        /// The size of each page in bytes.
        page_size: u64,
        /// The largest slice the pool accepts (besides the near-page rule).
        max_slice_size: u64,
        /// The cap on the bytes the pool may reserve, if any.
        max_pool_size: Option<u64>,
    },
    /// One allocation per page, for sizes up to `max_alloc_size`.
    ExclusivePages {
        /// The largest size the pool accepts.
        max_alloc_size: u64,
    },
    /// Every allocation its own storage buffer, reused by exact size; free buffers are
    /// released once they exceed `reclaim_at` bytes.
    Direct {
        /// The watermark of free cached bytes above which they are released.
        reclaim_at: Option<u64>,
    },
    /// Blocks placed best-fit over reserved address space, with memory mapped in
    /// granules where live blocks are and unmapped by a release policy (needs a
    /// storage with virtual memory; see `pool::VirtualPool`). Serves every size up
    /// to `range`: the storage's memory (or a replay's `limit`) bounds sizes, not a
    /// page.
    VirtualPages {
        /// The bytes of each map (a power of two; CUDA's is 2 MiB).
        granule: u64,
        /// The most mapped bytes that no live block touches kept for reuse; past
        /// it, the longest idle are unmapped (`Some(0)` unmaps as soon as no live
        /// byte is in a mapped run; `None` bounds them only by the high-water mark
        /// of mapped bytes, which idle bytes never raise whatever this is).
        keep: Option<u64>,
        /// Requests up to this many bytes are placed in an address range of their
        /// own, away from larger ones (0: none are).
        small: u64,
        /// The bytes of address space of each range (address space only, no memory).
        range: u64,
    },
    /// A placement of a run's requests followed at run time, with a virtual pool
    /// beside it for the requests it does not cover (see `pool::PlannedPool`; needs a
    /// storage with virtual memory). Serves every size up to the virtual pool's range.
    Planned {
        /// The plan, read from its file when the layout was made (see
        /// [`crate::plan_file`]).
        plan: crate::plan_file::PlanId,
        /// The bytes of each map of the arena and of the virtual pool beside it.
        granule: u64,
    },
}

impl PoolType {
    /// The pool type's name as bindings and dicts write it: "sliced_pages",
    /// "exclusive_pages", "direct", "virtual_pages" or "planned".
    pub fn kind(&self) -> &'static str {
        match self {
            Self::SlicedPages { .. } => "sliced_pages",
            Self::ExclusivePages { .. } => "exclusive_pages",
            Self::Direct { .. } => "direct",
            Self::VirtualPages { .. } => "virtual_pages",
            Self::Planned { .. } => "planned",
        }
    }

    /// The default `keep` of a virtual pool: eager unmapping.
    pub const VIRTUAL_KEEP: Option<u64> = Some(0);
    /// The default `small` of a virtual pool: 1 MiB, PyTorch's small-block limit.
    pub const VIRTUAL_SMALL: u64 = MIB;
    /// The default `range` of a virtual pool: 1 TiB of address space.
    pub const VIRTUAL_RANGE: u64 = 1 << 40;

    /// A virtual pool of `granule`-byte granules with the default release policy,
    /// small-request range and address space.
    pub fn virtual_pages(granule: u64) -> Self {
        Self::VirtualPages {
            granule,
            keep: Self::VIRTUAL_KEEP,
            small: Self::VIRTUAL_SMALL,
            range: Self::VIRTUAL_RANGE,
        }
    }
}

/// Options to create one memory pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemoryPoolOptions {
    /// What kind of pool.
    pub pool_type: PoolType,
    /// How many reservations pass between releases of pages that stayed free
    /// (exclusive pools); `None` releases them only on explicit cleanup.
    pub dealloc_period: Option<u64>,
}

impl MemoryPoolOptions {
    /// Options of a pool with no periodic release.
    pub fn new(pool_type: PoolType) -> Self {
        Self {
            pool_type,
            dealloc_period: None,
        }
    }
}

/// High-level configuration of memory management.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum MemoryConfiguration {
    /// cubepool's default: one virtual pool of 2 MiB granules (CUDA's granularity)
    /// that keeps free granules mapped up to the high-water mark of mapped bytes
    /// (`keep=none`; its peak of mapped bytes is eager unmapping's) and places
    /// requests over 16 MiB in an address range of their own (`small=16MiB`). It
    /// serves every size up to the storage's memory (or a replay's `limit`), with no
    /// page limit. On a storage without virtual memory (`HostStorage` off Linux) it
    /// resolves to [`MemoryConfiguration::Compact`]; see
    /// [`MemoryConfiguration::resolve_for`].
    #[cfg_attr(not(feature = "exclusive-memory-only"), default)]
    VirtualPages,
    /// cubepool's default before the virtual pool, and its fallback where the storage
    /// has no virtual memory: one sliced pool of 8 MiB pages for sizes up to 4 MiB
    /// (and, by the near-page rule, above 6.4 MiB up to a page), then exclusive pages
    /// sized to each larger request, up to `max_page_size`. On the bundled real traces
    /// it reserves 5-43 % less than `SubSlices` (utilization 0.81-0.95).
    Compact,
    /// CubeCL's default: a zero-byte exclusive pool, a ladder of sliced pools with
    /// pages from `max_page_size / 4^k` while at least 32 MiB (slices up to
    /// `page / 2^k`), then a sliced tail pool whose page and largest slice are both
    /// `max_page_size` rounded down to the alignment (as cubecl-runtime 0.10 builds it).
    SubSlices,
    /// 24 log-spaced exclusive pools from 32 KiB to `max_page_size`.
    #[cfg_attr(feature = "exclusive-memory-only", default)]
    ExclusivePages,
    /// An explicit list of pools, tried in order.
    Custom {
        /// The pools, in routing order.
        pool_options: Vec<MemoryPoolOptions>,
    },
}

/// Why a pool layout could not be built (CubeCL's variants, plus property checks).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PoolConfigError {
    /// A custom configuration with no pool.
    #[error("the pool list is empty: a configuration needs at least one pool")]
    EmptyPoolList,
    /// A size field that must be positive is zero.
    #[error("{field} must be greater than zero")]
    ZeroSize {
        /// The name of the field.
        field: &'static str,
    },
    /// A sliced pool whose largest slice exceeds its page.
    #[error("max_slice_size ({}) is larger than page_size ({})", size_in_message(*.max_slice_size), size_in_message(*.page_size))]
    SliceLargerThanPage {
        /// The page size.
        page_size: u64,
        /// The largest slice.
        max_slice_size: u64,
    },
    /// A capped sliced pool whose cap cannot hold one page.
    #[error("max_pool_size ({}) is smaller than page_size ({})", size_in_message(*.max_pool_size), size_in_message(*.page_size))]
    CapSmallerThanPage {
        /// The page size.
        page_size: u64,
        /// The cap.
        max_pool_size: u64,
    },
    /// A capped sliced pool with more pages than a pool can index.
    #[error("max_pool_size allows {pages} pages; a pool holds at most 65535")]
    TooManyPages {
        /// The number of pages the cap allows.
        pages: u64,
    },
    /// More pools than a configuration can index.
    #[error("{count} pools configured; at most 254 are allowed")]
    TooManyPools {
        /// The number of pools.
        count: usize,
    },
    /// A preset this build does not offer.
    #[error("the {preset} preset is unavailable in an exclusive-memory-only build")]
    PresetUnavailable {
        /// The preset's name.
        preset: &'static str,
    },
    /// A sliced pool in an exclusive-memory-only build.
    #[error("sliced pools are unavailable in an exclusive-memory-only build")]
    SlicedPoolsUnavailable,
    /// An alignment that is not a power of two.
    #[error("alignment must be a power of two, got {alignment}")]
    AlignmentNotPowerOfTwo {
        /// The alignment given.
        alignment: u64,
    },
    /// An alignment larger than the largest page.
    #[error("alignment ({}) is larger than max_page_size ({})", size_in_message(*.alignment), size_in_message(*.max_page_size))]
    AlignmentLargerThanPage {
        /// The alignment given.
        alignment: u64,
        /// The largest page.
        max_page_size: u64,
    },
    /// Configuration text that does not follow the language's grammar.
    #[error("expected {expected}, found {found}")]
    Syntax {
        /// What the grammar allows here.
        expected: &'static str,
        /// What the text holds instead, quoted, or "the end of the text".
        found: String,
    },
    /// A bare name that is no preset.
    #[error("unknown preset {name:?}: expected one of {presets}, or pools such as sliced(page=8MiB, max_slice=512KiB)", presets = preset_list())]
    UnknownPreset {
        /// The name given.
        name: String,
    },
    /// The name of a comparison model (`torch`, `torch_expandable`) where a layout is
    /// needed: the models replay traces for comparison and hold no memory.
    #[error("{name:?} is a model of PyTorch's caching allocator for comparing replays (cubepool.replay, compare, plot, sweep, --config), not a pool layout to allocate from; give a preset ({presets}) or pools", presets = preset_list())]
    ComparisonModel {
        /// The name given.
        name: String,
    },
    /// A preset written among pools (a preset is a whole configuration).
    #[error(
        "the preset {preset} is a whole configuration and cannot be listed with other entries"
    )]
    PresetInPoolList {
        /// The preset's name.
        preset: &'static str,
    },
    /// A pool kind the language does not know.
    #[error("unknown pool kind {name:?}: expected sliced, exclusive, direct or virtual")]
    UnknownPoolKind {
        /// The name given.
        name: String,
    },
    /// A field the pool kind does not have.
    #[error("{pool} pools have no field {field:?} (their fields: {fields})")]
    UnknownField {
        /// The pool kind.
        pool: &'static str,
        /// The field given.
        field: String,
        /// The fields the pool kind has, comma separated.
        fields: &'static str,
    },
    /// A required field left out.
    #[error("{pool} pools need {field}")]
    MissingField {
        /// The pool kind.
        pool: &'static str,
        /// The missing field.
        field: &'static str,
    },
    /// A field given twice in one pool.
    #[error("{field} is given twice")]
    DuplicateField {
        /// The field.
        field: &'static str,
    },
    /// A virtual pool in an exclusive-memory-only build (its blocks share granules).
    #[error("virtual pools are unavailable in an exclusive-memory-only build")]
    VirtualPoolsUnavailable,
    /// A virtual pool's granule that is not a power of two.
    #[error("granule must be a power of two, got {granule}")]
    GranuleNotPowerOfTwo {
        /// The granule given.
        granule: u64,
    },
    /// A virtual pool whose address range cannot hold one granule.
    #[error("range ({}) is smaller than granule ({})", size_in_message(*.range), size_in_message(*.granule))]
    RangeSmallerThanGranule {
        /// The granule.
        granule: u64,
        /// The range.
        range: u64,
    },
    /// A virtual pool whose granule the storage cannot map: not a multiple of the
    /// storage's mapping granularity (the host page, CUDA's 2 MiB).
    #[error(
        "granule ({}) is not a multiple of the storage's mapping granularity ({}): give a granule of {} or a multiple of it",
        size_in_message(*.granule), size_in_message(*.granularity), size_in_message(*.granularity)
    )]
    GranuleNotOfStorage {
        /// The pool's effective granule.
        granule: u64,
        /// The storage's mapping granularity.
        granularity: u64,
    },
    /// A planned pool's plan file that cannot be read (boxed: the error stays small).
    #[error("{0}")]
    PlanFile(Box<crate::plan_file::PlanFileError>),
    /// A field value that is not a size (or count) the language reads.
    #[error("{field}: {text:?} {reason}")]
    InvalidValue {
        /// The field.
        field: &'static str,
        /// The value as written.
        text: String,
        /// Why it cannot be read.
        reason: &'static str,
    },
}

/// A size in a message as the pools language writes it, exact and in the largest
/// unit that divides it, with a space before the unit (`16 MiB`, `1000 B`): the units
/// the user wrote rather than a count of bytes.
pub(crate) fn size_in_message(bytes: u64) -> String {
    let text = text::format_size(bytes);
    let unit = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    format!("{} {}", &text[..unit], &text[unit..])
}

/// The preset names, for messages.
fn preset_list() -> String {
    // `default` is accepted too ([`MemoryConfiguration::preset`]), and listed first as
    // the command line lists it.
    std::iter::once("default")
        .chain(MemoryConfiguration::PRESETS.iter().map(|(name, _)| *name))
        .collect::<Vec<_>>()
        .join(", ")
}

impl PoolConfigError {
    /// The CubeCL name of the variant, for error kinds in bindings.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::EmptyPoolList => "EmptyPoolList",
            Self::ZeroSize { .. } => "ZeroSize",
            Self::SliceLargerThanPage { .. } => "SliceLargerThanPage",
            Self::CapSmallerThanPage { .. } => "CapSmallerThanPage",
            Self::TooManyPages { .. } => "TooManyPages",
            Self::TooManyPools { .. } => "TooManyPools",
            Self::PresetUnavailable { .. } => "PresetUnavailable",
            Self::SlicedPoolsUnavailable => "SlicedPoolsUnavailable",
            Self::AlignmentNotPowerOfTwo { .. } => "AlignmentNotPowerOfTwo",
            Self::AlignmentLargerThanPage { .. } => "AlignmentLargerThanPage",
            Self::Syntax { .. } => "Syntax",
            Self::UnknownPreset { .. } => "UnknownPreset",
            Self::ComparisonModel { .. } => "ComparisonModel",
            Self::PresetInPoolList { .. } => "PresetInPoolList",
            Self::UnknownPoolKind { .. } => "UnknownPoolKind",
            Self::UnknownField { .. } => "UnknownField",
            Self::MissingField { .. } => "MissingField",
            Self::DuplicateField { .. } => "DuplicateField",
            Self::InvalidValue { .. } => "InvalidValue",
            Self::VirtualPoolsUnavailable => "VirtualPoolsUnavailable",
            Self::GranuleNotPowerOfTwo { .. } => "GranuleNotPowerOfTwo",
            Self::RangeSmallerThanGranule { .. } => "RangeSmallerThanGranule",
            Self::GranuleNotOfStorage { .. } => "GranuleNotOfStorage",
            Self::PlanFile(_) => "PlanFile",
        }
    }

    /// The configuration field the error is about, if one (the struct field's name,
    /// such as `max_slice_size`, or the field as written in configuration text).
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::ZeroSize { field }
            | Self::MissingField { field, .. }
            | Self::DuplicateField { field }
            | Self::InvalidValue { field, .. } => Some(field),
            Self::UnknownField { field, .. } => Some(field.as_str()),
            Self::SliceLargerThanPage { .. } => Some("max_slice_size"),
            Self::CapSmallerThanPage { .. } | Self::TooManyPages { .. } => Some("max_pool_size"),
            Self::AlignmentNotPowerOfTwo { .. } | Self::AlignmentLargerThanPage { .. } => {
                Some("alignment")
            }
            Self::GranuleNotPowerOfTwo { .. } | Self::GranuleNotOfStorage { .. } => Some("granule"),
            Self::RangeSmallerThanGranule { .. } => Some("range"),
            Self::PlanFile(_) => Some("file"),
            _ => None,
        }
    }
}

impl MemoryConfiguration {
    /// Every preset, under its name in the pools configuration language (and in
    /// Python). A new preset is a new variant, a row here and an arm in
    /// [`MemoryConfiguration::preset_name`].
    pub const PRESETS: &'static [(&'static str, MemoryConfiguration)] = &[
        ("compact", MemoryConfiguration::Compact),
        ("sub_slices", MemoryConfiguration::SubSlices),
        ("exclusive_pages", MemoryConfiguration::ExclusivePages),
        ("virtual_pages", MemoryConfiguration::VirtualPages),
    ];

    /// The name of this preset, or `None` for a custom list of pools.
    pub fn preset_name(&self) -> Option<&'static str> {
        match self {
            Self::VirtualPages => Some("virtual_pages"),
            Self::Compact => Some("compact"),
            Self::SubSlices => Some("sub_slices"),
            Self::ExclusivePages => Some("exclusive_pages"),
            Self::Custom { .. } => None,
        }
    }

    /// The preset called `name`: its language name (`sub_slices`) or CubeCL's
    /// (`SubSlices`); case, `_` and `-` do not matter. `default` names this build's
    /// default layout ([`MemoryConfiguration::default`]), as the command line does.
    pub fn preset(name: &str) -> Option<MemoryConfiguration> {
        let wanted = normalize_name(name);
        if wanted == normalize_name("default") {
            return Some(Self::default());
        }
        Self::PRESETS
            .iter()
            .find(|(preset, _)| normalize_name(preset) == wanted)
            .map(|(_, configuration)| configuration.clone())
    }

    /// Checks what can be checked without a device: the structure of the layout,
    /// each pool's fields, and the presets this build offers. Pools built for any
    /// real device may still refuse it (an alignment larger than a page, ...).
    pub fn validate(&self) -> Result<(), PoolConfigError> {
        self.resolve(&ANY_DEVICE).map(drop)
    }

    /// The pool options of this configuration, validated and made effective for
    /// `properties`: sizes rounded up to the alignment, pages shrunk to
    /// `max_page_size`.
    pub fn resolve(
        &self,
        properties: &MemoryDeviceProperties,
    ) -> Result<Vec<MemoryPoolOptions>, PoolConfigError> {
        self.resolve_for(properties, true)
    }

    /// The pool options of this configuration on a storage that has virtual memory
    /// (`virtual_memory`) or not: as [`MemoryConfiguration::resolve`], except that
    /// the [`MemoryConfiguration::VirtualPages`] preset falls back to
    /// [`MemoryConfiguration::Compact`] where there is none (a custom virtual pool
    /// is kept as asked, and fails on such a storage when it reserves).
    pub fn resolve_for(
        &self,
        properties: &MemoryDeviceProperties,
        virtual_memory: bool,
    ) -> Result<Vec<MemoryPoolOptions>, PoolConfigError> {
        properties.validate()?;
        let options = match self {
            Self::VirtualPages if EXCLUSIVE_MEMORY_ONLY => {
                return Err(PoolConfigError::PresetUnavailable {
                    preset: "VirtualPages",
                })
            }
            Self::VirtualPages if !virtual_memory => compact(properties),
            Self::VirtualPages => virtual_pages(),
            Self::SubSlices if EXCLUSIVE_MEMORY_ONLY => {
                return Err(PoolConfigError::PresetUnavailable {
                    preset: "SubSlices",
                })
            }
            Self::Compact if EXCLUSIVE_MEMORY_ONLY => {
                return Err(PoolConfigError::PresetUnavailable { preset: "Compact" })
            }
            Self::SubSlices => sub_slices(properties),
            Self::Compact => compact(properties),
            Self::ExclusivePages => exclusive_pages(properties),
            Self::Custom { pool_options } => pool_options.clone(),
        };
        if options.is_empty() {
            return Err(PoolConfigError::EmptyPoolList);
        }
        if options.len() > MAX_POOLS {
            return Err(PoolConfigError::TooManyPools {
                count: options.len(),
            });
        }
        options
            .iter()
            .map(|option| effective(option, properties))
            .collect()
    }
}

/// A device that makes no pool invalid on its own: device-independent checks resolve
/// against it.
pub(crate) const ANY_DEVICE: MemoryDeviceProperties = MemoryDeviceProperties {
    max_page_size: u64::MAX / 2,
    alignment: 1,
};

/// `name` lowercased, without `_` and `-`: how preset and pool names are compared.
pub(crate) fn normalize_name(name: &str) -> String {
    name.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

fn round_up(value: u64, alignment: u64) -> u64 {
    value.div_ceil(alignment).saturating_mul(alignment)
}

fn round_down(value: u64, alignment: u64) -> u64 {
    value / alignment * alignment
}

/// Validates one pool and returns its effective options.
pub(crate) fn effective(
    option: &MemoryPoolOptions,
    properties: &MemoryDeviceProperties,
) -> Result<MemoryPoolOptions, PoolConfigError> {
    let align = properties.alignment;
    let max_page = round_down(properties.max_page_size, align);
    if option.dealloc_period == Some(0) {
        return Err(PoolConfigError::ZeroSize {
            field: "dealloc_period",
        });
    }
    let pool_type = match option.pool_type {
        PoolType::SlicedPages {
            page_size,
            max_slice_size,
            max_pool_size,
        } => {
            if EXCLUSIVE_MEMORY_ONLY {
                return Err(PoolConfigError::SlicedPoolsUnavailable);
            }
            if page_size == 0 {
                return Err(PoolConfigError::ZeroSize { field: "page_size" });
            }
            if max_slice_size == 0 {
                return Err(PoolConfigError::ZeroSize {
                    field: "max_slice_size",
                });
            }
            if max_slice_size > page_size {
                return Err(PoolConfigError::SliceLargerThanPage {
                    page_size,
                    max_slice_size,
                });
            }
            if let Some(cap) = max_pool_size {
                if cap == 0 {
                    return Err(PoolConfigError::ZeroSize {
                        field: "max_pool_size",
                    });
                }
                if cap < page_size {
                    return Err(PoolConfigError::CapSmallerThanPage {
                        page_size,
                        max_pool_size: cap,
                    });
                }
                let pages = cap / page_size;
                if pages > MAX_PAGES_PER_POOL {
                    return Err(PoolConfigError::TooManyPages { pages });
                }
            }
            let page = round_up(page_size, align).min(max_page);
            PoolType::SlicedPages {
                page_size: page,
                max_slice_size: round_up(max_slice_size, align).min(page),
                max_pool_size: max_pool_size
                    .map(|cap| (cap / page_size).max(1).saturating_mul(page)),
            }
        }
        PoolType::ExclusivePages { max_alloc_size } => PoolType::ExclusivePages {
            max_alloc_size: round_up(max_alloc_size, align).min(max_page),
        },
        PoolType::Direct { reclaim_at } => PoolType::Direct { reclaim_at },
        PoolType::VirtualPages {
            granule,
            keep,
            small,
            range,
        } => {
            check_granule(granule)?;
            if range < granule {
                return Err(PoolConfigError::RangeSmallerThanGranule { granule, range });
            }
            // Both powers of two: the larger is a multiple of the smaller.
            let granule = granule.max(align);
            PoolType::VirtualPages {
                granule,
                keep,
                small: round_up(small, align),
                range: round_down(range, granule).max(granule),
            }
        }
        PoolType::Planned { plan, granule } => {
            check_granule(granule)?;
            PoolType::Planned {
                plan,
                granule: granule.max(align),
            }
        }
    };
    Ok(MemoryPoolOptions {
        pool_type,
        dealloc_period: option.dealloc_period,
    })
}

/// Checks the granule of a pool that maps memory in granules (virtual or planned), and
/// that this build has such pools.
fn check_granule(granule: u64) -> Result<(), PoolConfigError> {
    if EXCLUSIVE_MEMORY_ONLY {
        return Err(PoolConfigError::VirtualPoolsUnavailable);
    }
    if granule == 0 {
        return Err(PoolConfigError::ZeroSize { field: "granule" });
    }
    if !granule.is_power_of_two() {
        return Err(PoolConfigError::GranuleNotPowerOfTwo { granule });
    }
    Ok(())
}

/// cubepool's `Compact` layout (see [`MemoryConfiguration::Compact`]).
fn compact(properties: &MemoryDeviceProperties) -> Vec<MemoryPoolOptions> {
    let page = (8 * MIB).min(properties.max_page_size);
    vec![
        MemoryPoolOptions::new(PoolType::SlicedPages {
            page_size: page,
            max_slice_size: (4 * MIB).min(page),
            max_pool_size: None,
        }),
        MemoryPoolOptions::new(PoolType::ExclusivePages {
            max_alloc_size: properties.max_page_size,
        }),
    ]
}

/// The granule of the `VirtualPages` preset: CUDA's mapping granularity.
pub const DEFAULT_GRANULE: u64 = 2 * MIB;

/// The `small` of the `VirtualPages` preset: requests over 8 granules (16 MiB) get
/// an address range of their own. Few and large, and mostly whole multiples of the
/// granule, they stay granule-aligned there, so each covers its granules wholly: one
/// chunk each, with no edge granule a small neighbour shares and pins. The many
/// smaller blocks pack the other range. Measured (`virtual_tradeoff.py --beside`):
/// the same utilization as one range for all sizes on all nine traces, and fewer
/// storage calls where many blocks are large (transformer-train 5.1 to 4.9,
/// bert-dynamic 16.0 to 13.4, llama-train 4.2 to 3.7 per 100 allocations).
pub const DEFAULT_SMALL: u64 = 16 * MIB;

/// cubepool's `VirtualPages` layout (see [`MemoryConfiguration::VirtualPages`]):
/// free granules stay mapped up to the high-water mark (`keep: None`), which never
/// raises the peak of mapped bytes above eager unmapping's, and requests over
/// [`DEFAULT_SMALL`] go to a range of their own; see README "The default layout" for
/// the figures behind both.
fn virtual_pages() -> Vec<MemoryPoolOptions> {
    vec![MemoryPoolOptions::new(PoolType::VirtualPages {
        granule: DEFAULT_GRANULE,
        keep: None,
        small: DEFAULT_SMALL,
        range: PoolType::VIRTUAL_RANGE,
    })]
}

/// CubeCL's `SubSlices` ladder (see [`MemoryConfiguration::SubSlices`]).
fn sub_slices(properties: &MemoryDeviceProperties) -> Vec<MemoryPoolOptions> {
    let align = properties.alignment;
    let max_page = properties.max_page_size;
    let mut pools = vec![MemoryPoolOptions::new(PoolType::ExclusivePages {
        max_alloc_size: 0,
    })];
    let mut ladder = Vec::new();
    let mut current = max_page;
    let mut shift = 1u32;
    while current >= 32 * MIB {
        let next = round_up(current / 4, align);
        // A huge alignment can stop the ladder from shrinking: end it there.
        if next >= current {
            break;
        }
        current = next;
        let max_slice = current.checked_shr(shift).unwrap_or(0).max(align);
        ladder.push((current, max_slice));
        shift += 1;
    }
    for &(page_size, max_slice_size) in ladder.iter().rev() {
        pools.push(MemoryPoolOptions::new(PoolType::SlicedPages {
            page_size,
            max_slice_size,
            max_pool_size: None,
        }));
    }
    // CubeCL 0.10 ends the ladder with a sliced pool of whole device pages.
    let tail = round_down(max_page, align);
    pools.push(MemoryPoolOptions::new(PoolType::SlicedPages {
        page_size: tail,
        max_slice_size: tail,
        max_pool_size: None,
    }));
    pools
}

/// CubeCL's `ExclusivePages` buckets (see [`MemoryConfiguration::ExclusivePages`]).
fn exclusive_pages(properties: &MemoryDeviceProperties) -> Vec<MemoryPoolOptions> {
    const MIN_BUCKET: u64 = 32 * KIB;
    const BUCKETS: usize = 24;
    const BASE_DEALLOC_PERIOD: f64 = 5000.0;
    const DEALLOC_SCALE: f64 = 1024.0 * 1024.0 * 1024.0;
    let max_page = properties.max_page_size.max(MIN_BUCKET);
    let (log_min, log_max) = ((MIN_BUCKET as f64).ln(), (max_page as f64).ln());
    let mut sizes: Vec<u64> = (0..BUCKETS)
        .map(|i| {
            let p = i as f64 / (BUCKETS - 1) as f64;
            round_up(
                (log_min + (log_max - log_min) * p).exp() as u64,
                properties.alignment,
            )
        })
        .collect();
    // The last bucket must accept everything up to the largest page, whatever the
    // floating-point rounding did.
    if let Some(last) = sizes.last_mut() {
        *last = (*last).max(properties.max_page_size);
    }
    sizes.dedup();
    sizes
        .into_iter()
        .map(|size| MemoryPoolOptions {
            pool_type: PoolType::ExclusivePages {
                max_alloc_size: size,
            },
            dealloc_period: Some(
                (BASE_DEALLOC_PERIOD * (1.0 + size as f64 / DEALLOC_SCALE).round()) as u64,
            ),
        })
        .collect()
}

/// A best-effort alignment for row-aligned tensors: `elem_size` for unit rows,
/// otherwise the next power of two of the row's bytes, clamped to `[16, buffer_align]`.
pub fn optimal_align(shape: usize, elem_size: usize, buffer_align: usize) -> usize {
    if shape == 1 {
        return elem_size;
    }
    let bytes = shape.saturating_mul(elem_size);
    let pow2 = bytes
        .checked_next_power_of_two()
        .unwrap_or(1 << (usize::BITS - 1));
    pow2.clamp(16, buffer_align.max(16))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_presets_error_lists_default_first_as_it_is_accepted() {
        let error = PoolConfigError::UnknownPreset {
            name: "defualt".into(),
        };
        assert!(
            error
                .to_string()
                .contains("expected one of default, compact, "),
            "{error}"
        );
        assert!(MemoryConfiguration::preset("default").is_some());
    }

    #[test]
    #[cfg(not(feature = "exclusive-memory-only"))]
    fn sub_slices_ladder_for_2_gib_pages() {
        let props = MemoryDeviceProperties {
            max_page_size: 2048 * MIB,
            alignment: 32,
        };
        let pools = MemoryConfiguration::SubSlices.resolve(&props).unwrap();
        let kinds: Vec<_> = pools.iter().map(|p| p.pool_type).collect();
        let sliced = |page, slice| PoolType::SlicedPages {
            page_size: page,
            max_slice_size: slice,
            max_pool_size: None,
        };
        assert_eq!(
            kinds,
            vec![
                PoolType::ExclusivePages { max_alloc_size: 0 },
                sliced(8 * MIB, 512 * KIB),
                sliced(32 * MIB, 4 * MIB),
                sliced(128 * MIB, 32 * MIB),
                sliced(512 * MIB, 256 * MIB),
                sliced(2048 * MIB, 2048 * MIB),
            ]
        );
    }

    #[test]
    fn exclusive_pages_buckets_cover_the_largest_page() {
        let props = MemoryDeviceProperties::default();
        let pools = MemoryConfiguration::ExclusivePages.resolve(&props).unwrap();
        assert!(pools.len() <= 24 && pools.len() > 20);
        assert_eq!(
            pools.last().unwrap().pool_type,
            PoolType::ExclusivePages {
                max_alloc_size: props.max_page_size
            }
        );
    }

    #[test]
    #[cfg(feature = "exclusive-memory-only")]
    fn exclusive_memory_only_refuses_sliced_pools() {
        let props = MemoryDeviceProperties::default();
        assert_eq!(
            MemoryConfiguration::default(),
            MemoryConfiguration::ExclusivePages
        );
        assert_eq!(
            MemoryConfiguration::SubSlices.resolve(&props).unwrap_err(),
            PoolConfigError::PresetUnavailable {
                preset: "SubSlices"
            }
        );
        let sliced = MemoryConfiguration::Custom {
            pool_options: vec![MemoryPoolOptions::new(PoolType::SlicedPages {
                page_size: 1024,
                max_slice_size: 1024,
                max_pool_size: None,
            })],
        };
        assert_eq!(
            sliced.resolve(&props).unwrap_err(),
            PoolConfigError::SlicedPoolsUnavailable
        );
    }

    #[test]
    #[cfg(not(feature = "exclusive-memory-only"))]
    fn validation_names_each_problem() {
        let props = MemoryDeviceProperties::default();
        let custom = |pool_type| MemoryConfiguration::Custom {
            pool_options: vec![MemoryPoolOptions::new(pool_type)],
        };
        let sliced = |page_size, max_slice_size, max_pool_size| PoolType::SlicedPages {
            page_size,
            max_slice_size,
            max_pool_size,
        };
        let err = |c: MemoryConfiguration| c.resolve(&props).unwrap_err();
        assert_eq!(
            err(MemoryConfiguration::Custom {
                pool_options: vec![]
            }),
            PoolConfigError::EmptyPoolList
        );
        assert_eq!(
            err(custom(sliced(0, 0, None))),
            PoolConfigError::ZeroSize { field: "page_size" }
        );
        assert_eq!(
            err(custom(sliced(1024, 2048, None))).kind(),
            "SliceLargerThanPage"
        );
        assert_eq!(
            err(custom(sliced(1024, 1024, Some(512)))).kind(),
            "CapSmallerThanPage"
        );
        assert_eq!(
            err(custom(sliced(64, 64, Some(64 * 70_000)))),
            PoolConfigError::TooManyPages { pages: 70_000 }
        );
        let many = MemoryConfiguration::Custom {
            pool_options: vec![MemoryPoolOptions::new(PoolType::Direct { reclaim_at: None }); 255],
        };
        assert_eq!(err(many), PoolConfigError::TooManyPools { count: 255 });
        let bad_align = MemoryDeviceProperties {
            max_page_size: 1024,
            alignment: 48,
        };
        assert_eq!(
            MemoryConfiguration::SubSlices
                .resolve(&bad_align)
                .unwrap_err(),
            PoolConfigError::AlignmentNotPowerOfTwo { alignment: 48 }
        );
    }

    #[test]
    #[cfg(not(feature = "exclusive-memory-only"))]
    fn extreme_properties_do_not_panic() {
        let huge_align = MemoryDeviceProperties {
            max_page_size: 1 << 26,
            alignment: 1 << 26,
        };
        let pools = MemoryConfiguration::SubSlices.resolve(&huge_align).unwrap();
        assert!(pools.len() >= 2);
        let huge = MemoryDeviceProperties {
            max_page_size: 1 << 63,
            alignment: 1 << 62,
        };
        let custom = MemoryConfiguration::Custom {
            pool_options: vec![MemoryPoolOptions::new(PoolType::SlicedPages {
                page_size: 1,
                max_slice_size: 1,
                max_pool_size: Some(4),
            })],
        };
        assert!(custom.resolve(&huge).is_ok());
        for alignment in [1u64, 64, 1 << 20, 1 << 40, 1 << 62] {
            for max_page_size in [alignment, 1 << 30, 1 << 62, u64::MAX] {
                let props = MemoryDeviceProperties {
                    max_page_size,
                    alignment,
                };
                for config in [
                    MemoryConfiguration::SubSlices,
                    MemoryConfiguration::ExclusivePages,
                ] {
                    let _ = config.resolve(&props);
                }
            }
        }
    }

    #[test]
    fn optimal_align_follows_cubecl() {
        assert_eq!(optimal_align(1, 4, 256), 4);
        assert_eq!(optimal_align(2, 4, 256), 16);
        assert_eq!(optimal_align(10, 4, 256), 64);
        assert_eq!(optimal_align(1000, 4, 256), 256);
    }
}
