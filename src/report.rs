//! Reports of what the pools hold, records of them at named moments, and the
//! measured plans derived from them.
//!
//! A [`MemoryReport`] is the read side of a measured memory plan: run a workload,
//! read the pools' high-water marks, and [`MemoryReport::plan`] a layout capped at
//! them; installed before the same workload runs again, that layout serves it within
//! a hard budget.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::config::{
    MemoryConfiguration, MemoryPoolOptions, PoolConfigError, PoolType, MAX_PAGES_PER_POOL,
};
use crate::pool::PoolStats;
use crate::usage::MemoryUsage;

/// The shape of the pool a [`MemoryPoolReport`] describes, with its effective
/// configuration (after alignment rounding and page-size shrinking).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum MemoryPoolKind {
    /// Pages carved into slices.
    Sliced {
        /// The size of each page.
        page_size: u64,
        /// The largest slice the pool accepts (besides the near-page rule of uncapped
        /// pools).
        max_slice_size: u64,
        /// The cap on the bytes of the pool's pages, if any.
        max_pool_size: Option<u64>,
    },
    /// One reservation per page.
    Exclusive {
        /// The largest reservation the pool accepts.
        max_alloc_size: u64,
    },
    /// One storage buffer per reservation, reused by exact size.
    Direct {
        /// The cached free bytes above which cached buffers are released.
        reclaim_at: Option<u64>,
    },
    /// Blocks in reserved address ranges, mapped in granules on demand.
    Virtual {
        /// The bytes of each map.
        granule: u64,
        /// The most idle mapped bytes kept for reuse (`None`: bounded only by the
        /// high-water mark of mapped bytes).
        keep: Option<u64>,
        /// The largest request placed in the range of small requests.
        small: u64,
        /// The bytes of address space of each range.
        range: u64,
    },
    /// A placement followed at run time, with a virtual pool beside it. The report
    /// does not name the plan file, so no layout is rebuilt from it.
    Planned {
        /// The bytes of each map.
        granule: u64,
    },
    /// The persistent pool: exact-size reuse, released only on explicit cleanup.
    Persistent,
}

impl MemoryPoolKind {
    /// The kind of a dynamic pool built from these (effective) options.
    pub fn of(options: &MemoryPoolOptions) -> Self {
        match options.pool_type {
            PoolType::SlicedPages {
                page_size,
                max_slice_size,
                max_pool_size,
            } => Self::Sliced {
                page_size,
                max_slice_size,
                max_pool_size,
            },
            PoolType::ExclusivePages { max_alloc_size } => Self::Exclusive { max_alloc_size },
            PoolType::Direct { reclaim_at } => Self::Direct { reclaim_at },
            PoolType::VirtualPages {
                granule,
                keep,
                small,
                range,
            } => Self::Virtual {
                granule,
                keep,
                small,
                range,
            },
            PoolType::Planned { granule, .. } => Self::Planned { granule },
        }
    }

    /// The pool type to build this pool again; `None` for the persistent pool, which
    /// no configuration lists.
    pub fn pool_type(&self) -> Option<PoolType> {
        match *self {
            Self::Sliced {
                page_size,
                max_slice_size,
                max_pool_size,
            } => Some(PoolType::SlicedPages {
                page_size,
                max_slice_size,
                max_pool_size,
            }),
            Self::Exclusive { max_alloc_size } => Some(PoolType::ExclusivePages { max_alloc_size }),
            Self::Direct { reclaim_at } => Some(PoolType::Direct { reclaim_at }),
            Self::Virtual {
                granule,
                keep,
                small,
                range,
            } => Some(PoolType::VirtualPages {
                granule,
                keep,
                small,
                range,
            }),
            Self::Planned { .. } | Self::Persistent => None,
        }
    }
}

impl fmt::Display for MemoryPoolKind {
    /// The pool as the configuration language writes it (`persistent` for the
    /// persistent pool).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self, self.pool_type()) {
            (_, Some(pool_type)) => write!(f, "{}", MemoryPoolOptions::new(pool_type)),
            (Self::Planned { granule }, None) => {
                write!(
                    f,
                    "planned(granule={})",
                    crate::config::text::format_size(*granule)
                )
            }
            (_, None) => f.write_str("persistent"),
        }
    }
}

/// [`MemoryUsage`] as reports serialize it.
#[derive(Serialize, Deserialize)]
#[serde(remote = "MemoryUsage", deny_unknown_fields)]
struct UsageFields {
    number_allocs: u64,
    bytes_in_use: u64,
    bytes_padding: u64,
    bytes_reserved: u64,
}

/// A snapshot of one pool: its shape, its usage, and the high-water marks a memory
/// plan is derived from (since the peaks were last reset).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryPoolReport {
    /// The pool's shape and effective configuration.
    pub kind: MemoryPoolKind,
    /// The pool's usage now.
    #[serde(with = "UsageFields")]
    pub usage: MemoryUsage,
    /// Pages (storage buffers) held now.
    pub pages: u64,
    /// The most pages held at once: for a sliced pool, the pages the workload needed
    /// at its peak.
    pub pages_peak: u64,
    /// Pages released back to the storage so far.
    pub pages_unmapped: u64,
    /// The largest reservation served, in bytes asked for.
    pub largest_alloc: u64,
    /// Reservations between periodic releases of free pages, if the pool has them
    /// (the rest of the pool's configuration).
    pub dealloc_period: Option<u64>,
    /// The most bytes the pool held from the storage at once.
    pub bytes_reserved_peak: u64,
    /// The most bytes of live reservations at once.
    pub bytes_in_use_peak: u64,
}

impl MemoryPoolReport {
    /// The report of a pool of `kind` from its usage and statistics.
    pub fn new(
        kind: MemoryPoolKind,
        dealloc_period: Option<u64>,
        usage: MemoryUsage,
        stats: PoolStats,
    ) -> Self {
        Self {
            kind,
            usage,
            pages: stats.pages,
            pages_peak: stats.pages_peak,
            pages_unmapped: stats.pages_unmapped,
            largest_alloc: stats.largest_alloc,
            dealloc_period,
            bytes_reserved_peak: stats.bytes_reserved_peak,
            bytes_in_use_peak: stats.bytes_in_use_peak,
        }
    }

    /// The options to build this pool again as it is (no cap added); `None` for the
    /// persistent pool, which no configuration lists, and for a planned pool, whose
    /// kind keeps its granule but not its plan.
    pub fn options(&self) -> Option<MemoryPoolOptions> {
        self.kind.pool_type().map(|pool_type| MemoryPoolOptions {
            pool_type,
            dealloc_period: self.dealloc_period,
        })
    }

    /// The options of this pool capped at its high-water mark plus `headroom` (a
    /// fraction, at least 0); see [`MemoryReport::plan`].
    fn planned(&self, headroom: f64) -> Option<MemoryPoolOptions> {
        let mut options = self.options()?;
        if let MemoryPoolKind::Sliced {
            page_size,
            max_slice_size,
            max_pool_size,
        } = self.kind
        {
            // An uncapped pool that served a near-page request (larger than its
            // largest slice) must stay uncapped: a capped pool refuses such requests,
            // so they would route elsewhere.
            let near_page = max_pool_size.is_none() && self.largest_alloc > max_slice_size;
            // A pool that held more pages than a cap can count stays uncapped too.
            let countable = self.pages_peak <= MAX_PAGES_PER_POOL;
            if !near_page && countable && page_size > 0 {
                let peak = self.pages_peak.max(1);
                let extra = (peak as f64 * headroom).ceil();
                let extra = if extra < u64::MAX as f64 {
                    extra as u64
                } else {
                    u64::MAX
                };
                let mut pages = peak.saturating_add(extra).min(MAX_PAGES_PER_POOL);
                if let Some(cap) = max_pool_size {
                    // Never more than the pool allowed: a pool that was full passes
                    // requests on, and must do so again.
                    pages = pages.min((cap / page_size).max(1));
                }
                if let Some(cap) = pages.checked_mul(page_size) {
                    options.pool_type = PoolType::SlicedPages {
                        page_size,
                        max_slice_size,
                        max_pool_size: Some(cap),
                    };
                }
            }
        }
        Some(options)
    }
}

/// Why a plan could not be made from a report.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum PlanError {
    /// A headroom that is negative or not a number.
    #[error("headroom must be a finite fraction of at least 0 (0.1 adds 10 %), got {headroom}")]
    InvalidHeadroom {
        /// The headroom given.
        headroom: f64,
    },
    /// The report describes pools no configuration can build (a report read from
    /// a hand-edited file, say).
    #[error("the report's pools do not make a valid configuration: {0}")]
    InvalidPools(#[from] PoolConfigError),
    /// The report holds a planned pool, which it cannot build again: its kind keeps
    /// the pool's granule, not the plan it follows.
    #[error("pool {index} is a planned pool, which a report cannot build again (it keeps the pool's granule, not its plan file): use the layout the pools were made with, e.g. planned(file=...)")]
    PlannedPool {
        /// The pool's index among the dynamic pools.
        index: usize,
    },
}

impl PlanError {
    /// A short name of the problem, for error kinds in bindings.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InvalidHeadroom { .. } => "InvalidHeadroom",
            Self::InvalidPools(error) => error.kind(),
            Self::PlannedPool { .. } => "PlannedPool",
        }
    }
}

/// A report of every pool of one memory management: the read side of a measured
/// memory plan.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryReport {
    /// One entry per dynamic pool, in routing order.
    pub dynamic: Vec<MemoryPoolReport>,
    /// The persistent pool.
    pub persistent: MemoryPoolReport,
}

impl MemoryReport {
    /// The usage of every pool together.
    pub fn usage(&self) -> MemoryUsage {
        self.dynamic
            .iter()
            .fold(self.persistent.usage, |usage, pool| {
                usage.combine(pool.usage)
            })
    }

    /// The configuration of the dynamic pools as they are (the effective options).
    /// A planned pool, which a report cannot build again, is
    /// [`PlanError::PlannedPool`]: leaving it out would route its requests elsewhere.
    pub fn configuration(&self) -> Result<MemoryConfiguration, PlanError> {
        self.refuse_planned()?;
        Ok(MemoryConfiguration::Custom {
            pool_options: self
                .dynamic
                .iter()
                .filter_map(MemoryPoolReport::options)
                .collect(),
        })
    }

    /// [`PlanError::PlannedPool`] for the first planned pool of the report.
    fn refuse_planned(&self) -> Result<(), PlanError> {
        match self
            .dynamic
            .iter()
            .position(|pool| matches!(pool.kind, MemoryPoolKind::Planned { .. }))
        {
            Some(index) => Err(PlanError::PlannedPool { index }),
            None => Ok(()),
        }
    }

    /// A layout whose pools are capped at the high-water marks of this report, plus
    /// `headroom` (a fraction: 0.25 allows a quarter more pages).
    ///
    /// Each sliced pool is capped at `ceil(pages_peak * (1 + headroom))` pages (at
    /// least one, never more than a cap it already had). Exclusive, direct and virtual
    /// pools keep their options: they have no cap (a virtual pool's mapped granules
    /// follow its live blocks). Every pool keeps its place, so routing is unchanged.
    ///
    /// The guarantee: the same workload (the same reserves and releases, from a
    /// fresh memory management, or since the peaks were reset on one with no live
    /// dynamic memory) run under the plan on the same device properties makes the
    /// same decisions, step by step, as the run this report measured. A capped pool
    /// refuses only when it would pass its peak, which that run never did, so no
    /// capacity error arises that the measured run did not have, and the plan
    /// reserves exactly the bytes the measured run reserved. Two cases keep a sliced
    /// pool uncapped so that this holds: an uncapped pool that served a near-page
    /// request (its `largest_alloc` exceeds its largest slice; capped pools refuse
    /// those), and a pool whose peak exceeds the 65535 pages a cap can count. The
    /// guarantee assumes the measured run had no failed reservations. A report with a
    /// planned pool is [`PlanError::PlannedPool`] (see [`MemoryReport::configuration`]).
    pub fn plan(&self, headroom: f64) -> Result<MemoryConfiguration, PlanError> {
        if !(headroom.is_finite() && headroom >= 0.0) {
            return Err(PlanError::InvalidHeadroom { headroom });
        }
        self.refuse_planned()?;
        let configuration = MemoryConfiguration::Custom {
            pool_options: self
                .dynamic
                .iter()
                .filter_map(|pool| pool.planned(headroom))
                .collect(),
        };
        configuration.validate()?;
        Ok(configuration)
    }
}

/// A size for people: `0 B`, `512 B`, `1.5 KiB`, `12.3 MiB`.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A count for people: its digits in groups of three (`2,846`), as the tables print
/// counts.
pub(crate) fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl fmt::Display for MemoryReport {
    /// A table: one row per pool (the persistent pool is `P`), then the total.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kinds: Vec<String> = self
            .dynamic
            .iter()
            .chain([&self.persistent])
            .map(|pool| pool.kind.to_string())
            .collect();
        let width = kinds.iter().map(String::len).max().unwrap_or(0).max(4);
        writeln!(
            f,
            "{:>4}  {:<width$}  {:>7}  {:>10}  {:>10}  {:>10}  {:>5}  {:>5}  {:>8}  {:>10}",
            "pool",
            "kind",
            "allocs",
            "in use",
            "reserved",
            "peak",
            "pages",
            "peak",
            "released",
            "largest",
        )?;
        let rows = self.dynamic.iter().chain([&self.persistent]);
        for (index, (pool, kind)) in rows.zip(&kinds).enumerate() {
            let name = if index == self.dynamic.len() {
                "P".to_string()
            } else {
                index.to_string()
            };
            writeln!(
                f,
                "{name:>4}  {kind:<width$}  {:>7}  {:>10}  {:>10}  {:>10}  {:>5}  {:>5}  {:>8}  {:>10}",
                pool.usage.number_allocs,
                human_size(pool.usage.bytes_in_use),
                human_size(pool.usage.bytes_reserved),
                human_size(pool.bytes_reserved_peak),
                pool.pages,
                pool.pages_peak,
                pool.pages_unmapped,
                human_size(pool.largest_alloc),
            )?;
        }
        let total = self.usage();
        write!(
            f,
            "{:>4}  {:<width$}  {:>7}  {:>10}  {:>10}",
            "",
            "total",
            total.number_allocs,
            human_size(total.bytes_in_use),
            human_size(total.bytes_reserved),
        )
    }
}

/// A [`MemoryReport`] recorded at a moment the caller named.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryRecord {
    /// What the caller was doing: `model loaded`, `after step 3`.
    pub label: String,
    /// The record's number: 0 for the first record of a memory management, then 1, 2...
    pub sequence: u64,
    /// When it was recorded, on a monotonic clock, since the memory management was
    /// created (serialized as seconds).
    #[serde(with = "seconds")]
    pub time: Duration,
    /// The pools at that moment.
    pub report: MemoryReport,
}

impl fmt::Display for MemoryRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "record {} {:?} at {:.6} s",
            self.sequence,
            self.label,
            self.time.as_secs_f64()
        )?;
        write!(f, "{}", self.report)
    }
}

/// A [`Duration`] as a number of seconds.
mod seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(value.as_secs_f64())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let seconds = f64::deserialize(d)?;
        Duration::try_from_secs_f64(seconds).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(kind: MemoryPoolKind, pages_peak: u64, largest_alloc: u64) -> MemoryPoolReport {
        MemoryPoolReport {
            kind,
            usage: MemoryUsage::default(),
            pages: 0,
            pages_peak,
            pages_unmapped: 0,
            largest_alloc,
            dealloc_period: None,
            bytes_reserved_peak: 0,
            bytes_in_use_peak: 0,
        }
    }

    fn sliced(page_size: u64, max_slice_size: u64, cap: Option<u64>) -> MemoryPoolKind {
        MemoryPoolKind::Sliced {
            page_size,
            max_slice_size,
            max_pool_size: cap,
        }
    }

    fn report(dynamic: Vec<MemoryPoolReport>) -> MemoryReport {
        MemoryReport {
            dynamic,
            persistent: pool(MemoryPoolKind::Persistent, 0, 0),
        }
    }

    #[cfg(not(feature = "exclusive-memory-only"))]
    fn caps(configuration: &MemoryConfiguration) -> Vec<Option<u64>> {
        let MemoryConfiguration::Custom { pool_options } = configuration else {
            panic!("plans are custom layouts");
        };
        pool_options
            .iter()
            .map(|options| match options.pool_type {
                PoolType::SlicedPages { max_pool_size, .. } => max_pool_size,
                _ => None,
            })
            .collect()
    }

    #[test]
    #[cfg(not(feature = "exclusive-memory-only"))]
    fn plans_cap_sliced_pools_at_their_peak_pages() {
        let report = report(vec![
            pool(sliced(1024, 256, None), 3, 200),
            pool(sliced(1024, 256, None), 0, 0),
            pool(sliced(1024, 256, None), 2, 1000),
            pool(sliced(1024, 256, Some(4096)), 4, 256),
            pool(
                MemoryPoolKind::Exclusive {
                    max_alloc_size: 1 << 20,
                },
                9,
                1 << 20,
            ),
        ]);
        let plan = report.plan(0.0).unwrap();
        // Peak pages; at least one page; the near-page pool stays uncapped; a full
        // capped pool keeps its cap; exclusive pools have no cap.
        assert_eq!(
            caps(&plan),
            vec![Some(3072), Some(1024), None, Some(4096), None]
        );
        assert_eq!(
            caps(&report.plan(0.5).unwrap()),
            vec![Some(5 * 1024), Some(2048), None, Some(4096), None]
        );
    }

    #[test]
    fn bad_headroom_is_an_error() {
        let exclusive = MemoryPoolKind::Exclusive { max_alloc_size: 64 };
        let report = report(vec![pool(exclusive, 1, 1)]);
        for headroom in [-0.1, f64::NAN, f64::INFINITY] {
            assert_eq!(report.plan(headroom).unwrap_err().kind(), "InvalidHeadroom");
        }
        assert_eq!(
            report.plan(0.0).unwrap().to_string(),
            "exclusive(max_alloc=64B)"
        );
        // A report with no dynamic pool (read from an edited file) plans nothing.
        let empty = self::report(vec![]);
        assert_eq!(empty.plan(0.0).unwrap_err().kind(), "EmptyPoolList");
    }

    #[test]
    fn reports_round_trip_through_json() {
        let record = MemoryRecord {
            label: "after step".into(),
            sequence: 2,
            time: Duration::from_millis(1500),
            report: report(vec![pool(sliced(1024, 256, Some(2048)), 1, 5)]),
        };
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["time"], 1.5);
        assert_eq!(json["report"]["dynamic"][0]["kind"]["type"], "sliced");
        assert_eq!(json["report"]["persistent"]["kind"]["type"], "persistent");
        let back: MemoryRecord = serde_json::from_value(json).unwrap();
        assert_eq!(back, record);
    }

    #[test]
    fn the_table_has_a_row_per_pool_and_a_total() {
        let table = report(vec![pool(sliced(8 << 20, 512 << 10, None), 1, 5)]).to_string();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4, "{table}");
        assert!(
            lines[1].contains("sliced(page=8MiB, max_slice=512KiB)"),
            "{table}"
        );
        assert!(
            lines[2].trim_start().starts_with("P  persistent"),
            "{table}"
        );
        assert!(lines[3].contains("total"), "{table}");
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_size(0), "0 B");
        assert_eq!(human_size(1536), "1.5 KiB");
        assert_eq!(human_size(3 << 30), "3.0 GiB");
        assert_eq!(human_size(u64::MAX), "16.0 EiB");
    }
}
