//! `ReplayResult.from_dict`: a replay result read back from the dict its `to_dict()`
//! writes (a result saved as JSON, or a pickle, which holds that dict).
//!
//! The dict is read through serde: the keys `to_dict()` derives (`utilization`,
//! `complete`, `fragmentation`, `ns_per_event`, `reserved_over_floor`, a pool's
//! `pool_type` text) are passed over and computed again; the rest must be there and agree with each other
//! (failures add up to `failed_reserves`, the timeline's columns have one entry per
//! sample and one series per pool, a pool of a layout names its options).

use serde::Deserialize;

use crate::config::{MemoryConfiguration, MemoryDeviceProperties, MemoryPoolOptions};
use crate::pool::PoolStats;
use crate::trace::{
    Failures, PoolReplay, ReplayResult, Replayed, ReplayedPool, Sample, TorchPool, TorchSettings,
};
use crate::MemoryUsage;

/// A usage as `MemoryUsage.to_dict()` writes it.
#[derive(Deserialize)]
struct UsageDict {
    number_allocs: u64,
    bytes_in_use: u64,
    bytes_padding: u64,
    bytes_reserved: u64,
}

impl From<UsageDict> for MemoryUsage {
    fn from(u: UsageDict) -> Self {
        MemoryUsage {
            number_allocs: u.number_allocs,
            bytes_in_use: u.bytes_in_use,
            bytes_padding: u.bytes_padding,
            bytes_reserved: u.bytes_reserved,
        }
    }
}

#[derive(Deserialize)]
struct FailuresDict {
    too_big: u64,
    pools_full: u64,
    over_limit: u64,
}

/// A pool as `PoolReplay.to_dict()` writes it, with its options' text.
#[derive(Deserialize)]
struct PoolDict {
    kind: String,
    #[serde(default)]
    options: Option<String>,
    reservations: u64,
    peak_reserved: u64,
    peak_in_use: u64,
    pages: u64,
    pages_peak: u64,
    pages_unmapped: u64,
    largest_alloc: u64,
    final_usage: UsageDict,
}

/// A timeline as `Timeline.to_dict()` writes it.
#[derive(Deserialize)]
struct TimelineDict {
    first_event: Vec<usize>,
    events: Vec<usize>,
    t_start: Vec<u64>,
    t_end: Vec<u64>,
    in_use_min: Vec<u64>,
    in_use_max: Vec<u64>,
    in_use_end: Vec<u64>,
    reserved_min: Vec<u64>,
    reserved_max: Vec<u64>,
    reserved_end: Vec<u64>,
    pool_reserved: Vec<Vec<u64>>,
    pool_in_use: Vec<Vec<u64>>,
}

/// What the replay ran through: a layout on a device, or a model of PyTorch's
/// allocator; and the memory limit.
#[derive(Deserialize)]
pub(crate) struct ReplayedDict {
    #[serde(default)]
    layout: Option<String>,
    #[serde(default)]
    max_page_size: Option<u64>,
    #[serde(default)]
    alignment: Option<u64>,
    #[serde(default)]
    torch: Option<String>,
    #[serde(default)]
    limit: Option<u64>,
}

/// The result as `ReplayResult.to_dict()` writes it.
#[derive(Deserialize)]
struct ResultDict {
    events: usize,
    peak_reserved: u64,
    peak_reserved_event: usize,
    peak_in_use: u64,
    peak_in_use_event: usize,
    peak_live: u64,
    seconds: f64,
    failed_reserves: u64,
    failures: FailuresDict,
    first_failed_event: Option<usize>,
    storage_allocations: u64,
    storage_frees: u64,
    final_usage: UsageDict,
    pools: Vec<PoolDict>,
    #[serde(default)]
    timeline: Option<TimelineDict>,
    #[serde(default)]
    replayed: Option<ReplayedDict>,
}

/// What a result read back from a dict ran through, where the dict says it: the
/// layout on its device or the torch model, and the memory limit.
pub(crate) type ReadReplayed = Option<(Replayed, Option<u64>)>;

/// A result read back from `text` (the JSON of a `to_dict()` dict), with what it ran
/// through where the dict says it; `Err` names what is missing or does not agree.
pub(crate) fn result_from_json(text: &str) -> Result<(ReplayResult, ReadReplayed), String> {
    let dict: ResultDict = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let failures = Failures {
        too_big: dict.failures.too_big,
        pools_full: dict.failures.pools_full,
        over_limit: dict.failures.over_limit,
    };
    match failures.checked_total() {
        None => return Err("failures add up to more than 2^64 - 1".to_string()),
        Some(total) if total != dict.failed_reserves => {
            return Err(format!(
                "failures add up to {total}, failed_reserves is {}",
                dict.failed_reserves
            ))
        }
        Some(_) => {}
    }
    if dict.peak_reserved_event > dict.events || dict.peak_in_use_event > dict.events {
        return Err(format!(
            "a peak's event is past the {} events replayed",
            dict.events
        ));
    }
    agree(&dict)?;
    let (samples, mut reserved_series, mut in_use_series) =
        timeline(dict.timeline, dict.pools.len())?;
    let mut pools = Vec::with_capacity(dict.pools.len());
    for (index, pool) in dict.pools.into_iter().enumerate() {
        pools.push(PoolReplay {
            pool: replayed_pool(&pool.kind, pool.options.as_deref())
                .map_err(|e| format!("pools[{index}]: {e}"))?,
            reservations: pool.reservations,
            final_usage: pool.final_usage.into(),
            stats: PoolStats {
                pages: pool.pages,
                pages_peak: pool.pages_peak,
                pages_unmapped: pool.pages_unmapped,
                largest_alloc: pool.largest_alloc,
                bytes_reserved_peak: pool.peak_reserved,
                bytes_in_use_peak: pool.peak_in_use,
            },
            reserved_series: std::mem::take(&mut reserved_series[index]),
            in_use_series: std::mem::take(&mut in_use_series[index]),
        });
    }
    let result = ReplayResult {
        events: dict.events,
        peak_reserved: dict.peak_reserved,
        peak_reserved_event: dict.peak_reserved_event,
        peak_in_use: dict.peak_in_use,
        peak_in_use_event: dict.peak_in_use_event,
        peak_live: dict.peak_live,
        // Computed again as the replay computes it (a ratio read back from JSON text
        // may be off in its last bit).
        utilization: if dict.failed_reserves > 0 {
            f64::NAN
        } else if dict.peak_reserved == 0 {
            1.0
        } else {
            dict.peak_live as f64 / dict.peak_reserved as f64
        },
        seconds: dict.seconds,
        final_usage: dict.final_usage.into(),
        failed_reserves: dict.failed_reserves,
        failures,
        first_failed_event: dict.first_failed_event,
        storage_allocations: dict.storage_allocations,
        storage_frees: dict.storage_frees,
        samples,
        pools,
    };
    let replayed = dict.replayed.map(replayed).transpose()?;
    Ok((result, replayed))
}

/// What every replay's figures satisfy, checked of a dict read back (a figure edited
/// by hand, say): in use within reserved, frees within allocations, each pool within
/// the whole, the pools' final usages adding up to the result's, a time of at least 0.
fn agree(dict: &ResultDict) -> Result<(), String> {
    let at_most = |what: &str, value: u64, bound_name: &str, bound: u64| {
        if value > bound {
            Err(format!("{what} ({value}) exceeds {bound_name} ({bound})"))
        } else {
            Ok(())
        }
    };
    at_most(
        "peak_in_use",
        dict.peak_in_use,
        "peak_reserved",
        dict.peak_reserved,
    )?;
    at_most(
        "storage_frees",
        dict.storage_frees,
        "storage_allocations",
        dict.storage_allocations,
    )?;
    let last = &dict.final_usage;
    at_most(
        "final_usage.bytes_reserved",
        last.bytes_reserved,
        "peak_reserved",
        dict.peak_reserved,
    )?;
    let held = last.bytes_in_use.checked_add(last.bytes_padding);
    at_most(
        "final_usage's bytes in use and padding",
        held.ok_or("final_usage's bytes in use and padding pass 2^64 - 1")?,
        "final_usage.bytes_reserved",
        last.bytes_reserved,
    )?;
    if !(dict.seconds.is_finite() && dict.seconds >= 0.0) {
        return Err(format!(
            "seconds must be a time of at least 0, got {}",
            dict.seconds
        ));
    }
    let (mut reserved, mut in_use) = (0u64, 0u64);
    for (index, pool) in dict.pools.iter().enumerate() {
        let name = |field: &str| format!("pools[{index}].{field}");
        at_most(
            &name("peak_reserved"),
            pool.peak_reserved,
            "peak_reserved",
            dict.peak_reserved,
        )?;
        at_most(
            &name("peak_in_use"),
            pool.peak_in_use,
            "peak_in_use",
            dict.peak_in_use,
        )?;
        reserved = reserved.saturating_add(pool.final_usage.bytes_reserved);
        in_use = in_use.saturating_add(pool.final_usage.bytes_in_use);
    }
    if !dict.pools.is_empty() && (reserved, in_use) != (last.bytes_reserved, last.bytes_in_use) {
        return Err(format!(
            "the pools' final usages add up to {reserved} bytes reserved and {in_use} in use, \
             final_usage says {} and {}",
            last.bytes_reserved, last.bytes_in_use
        ));
    }
    Ok(())
}

/// The samples and per-pool series of `timeline` (none without one), checked: every
/// column one entry per sample, one series per pool.
#[allow(clippy::type_complexity)] // the three parts of a timeline, used once
fn timeline(
    timeline: Option<TimelineDict>,
    pools: usize,
) -> Result<(Vec<Sample>, Vec<Vec<u64>>, Vec<Vec<u64>>), String> {
    let Some(t) = timeline else {
        return Ok((Vec::new(), vec![Vec::new(); pools], vec![Vec::new(); pools]));
    };
    let n = t.first_event.len();
    let lengths = [
        t.events.len(),
        t.t_start.len(),
        t.t_end.len(),
        t.in_use_min.len(),
        t.in_use_max.len(),
        t.in_use_end.len(),
        t.reserved_min.len(),
        t.reserved_max.len(),
        t.reserved_end.len(),
    ];
    if lengths.iter().any(|&len| len != n) {
        return Err(format!(
            "the timeline's columns differ in length (first_event has {n})"
        ));
    }
    if t.pool_reserved.len() != pools || t.pool_in_use.len() != pools {
        return Err(format!(
            "the timeline has series for {} pools, the result has {pools}",
            t.pool_reserved.len()
        ));
    }
    if t.pool_reserved
        .iter()
        .chain(&t.pool_in_use)
        .any(|series| series.len() != n)
    {
        return Err(format!("a pool's series is not {n} samples long"));
    }
    let samples = (0..n)
        .map(|i| Sample {
            first_event: t.first_event[i],
            events: t.events[i],
            t_start: t.t_start[i],
            t_end: t.t_end[i],
            in_use_min: t.in_use_min[i],
            in_use_max: t.in_use_max[i],
            in_use_end: t.in_use_end[i],
            reserved_min: t.reserved_min[i],
            reserved_max: t.reserved_max[i],
            reserved_end: t.reserved_end[i],
        })
        .collect();
    Ok((samples, t.pool_reserved, t.pool_in_use))
}

/// The pool a dict names: its `kind` and, for a pool of a layout, its options' text.
fn replayed_pool(kind: &str, options: Option<&str>) -> Result<ReplayedPool, String> {
    match (kind, options) {
        ("torch_small", None) => Ok(ReplayedPool::Torch(TorchPool::Small)),
        ("torch_large", None) => Ok(ReplayedPool::Torch(TorchPool::Large)),
        (_, Some(text)) => {
            let options = one_pool(text)?;
            let named = options.pool_type.kind();
            if named != kind {
                return Err(format!("kind {kind:?} but options {text:?}"));
            }
            Ok(ReplayedPool::Layout(options))
        }
        (kind, None) => Err(format!(
            "a pool of kind {kind:?} needs its options' text (\"options\")"
        )),
    }
}

/// The one pool `text` says.
fn one_pool(text: &str) -> Result<MemoryPoolOptions, String> {
    match MemoryConfiguration::parse(text).map_err(|e| e.to_string())? {
        MemoryConfiguration::Custom { pool_options } if pool_options.len() == 1 => {
            Ok(pool_options[0])
        }
        _ => Err(format!("{text:?} is not one pool")),
    }
}

/// What a `replayed` dict names.
fn replayed(dict: ReplayedDict) -> Result<(Replayed, Option<u64>), String> {
    let replayed = match (dict.layout, dict.torch) {
        (Some(layout), None) => {
            let defaults = MemoryDeviceProperties::default();
            let properties = MemoryDeviceProperties {
                max_page_size: dict.max_page_size.unwrap_or(defaults.max_page_size),
                alignment: dict.alignment.unwrap_or(defaults.alignment),
            };
            properties.validate().map_err(|e| e.to_string())?;
            Replayed::Layout {
                configuration: MemoryConfiguration::parse(&layout).map_err(|e| e.to_string())?,
                properties,
            }
        }
        (None, Some(torch)) => {
            Replayed::Torch(TorchSettings::parse(&torch).map_err(|e| e.to_string())?)
        }
        _ => return Err("replayed names a layout or a torch model, one of them".to_string()),
    };
    Ok((replayed, dict.limit))
}

/// The `replayed` entries of `to_dict()` for `replayed` under `limit`.
pub(crate) fn replayed_entries(
    replayed: &Replayed,
    limit: Option<u64>,
) -> Vec<(&'static str, serde_json::Value)> {
    let mut entries = match replayed {
        Replayed::Layout {
            configuration,
            properties,
        } => vec![
            ("layout", configuration.to_string().into()),
            ("max_page_size", properties.max_page_size.into()),
            ("alignment", properties.alignment.into()),
        ],
        Replayed::Torch(settings) => vec![("torch", settings.to_string().into())],
    };
    entries.push(("limit", limit.into()));
    entries
}
