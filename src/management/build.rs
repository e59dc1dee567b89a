//! Building memory management from a configuration and installing new pool layouts;
//! the configuration, properties and mode it was built with.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::{
    Held, InstallMemoryPoolsError, MemoryAllocationMode, MemoryManagement, WholePages,
    WithinReserve,
};
use crate::config::{
    MemoryConfiguration, MemoryDeviceProperties, MemoryPoolOptions, PoolConfigError, PoolType,
};
use crate::errors::ErrorGraph;
use crate::handle::{DescriptorTable, IdBlock};
use crate::pool::{
    AcceptRule, DirectPool, DynamicPool, ExclusivePool, MemoryPool, PersistentPool, PlannedPool,
    RouteTable, SlicedPool, VirtualPool,
};
use crate::stats::{Counters, CountingStorage};
use crate::storage::ComputeStorage;
use crate::usage::MemoryUsage;

/// The route table of `pools`.
fn route_table(pools: &[DynamicPool]) -> RouteTable {
    let rules: Vec<_> = pools.iter().map(MemoryPool::accept_rule).collect();
    RouteTable::new(&rules)
}

fn build_pool(options: &MemoryPoolOptions, properties: &MemoryDeviceProperties) -> DynamicPool {
    let align = properties.alignment;
    match options.pool_type {
        PoolType::SlicedPages {
            page_size,
            max_slice_size,
            max_pool_size,
        } => DynamicPool::Sliced(SlicedPool::new(
            page_size,
            max_slice_size,
            max_pool_size,
            align,
        )),
        PoolType::ExclusivePages { max_alloc_size } => DynamicPool::Exclusive(ExclusivePool::new(
            max_alloc_size,
            align,
            options.dealloc_period,
        )),
        PoolType::Direct { reclaim_at } => {
            DynamicPool::Direct(DirectPool::new(properties.max_page_size, align, reclaim_at))
        }
        PoolType::VirtualPages {
            granule,
            keep,
            small,
            range,
        } => DynamicPool::Virtual(VirtualPool::new(granule, range, small, keep, align)),
        PoolType::Planned { plan, granule } => DynamicPool::Planned(PlannedPool::new(
            plan,
            granule,
            PoolType::VIRTUAL_RANGE,
            align,
        )),
    }
}

/// Checks the effective pools against what `storage` can do, so that a layout it
/// cannot serve is refused when memory management is built, not at the first
/// reservation: a virtual pool's granule must be a multiple of the storage's mapping
/// granularity (a storage without virtual memory fails a virtual pool's reservations
/// with a storage error instead, since the default falls back before this).
fn check_against_storage<S: ComputeStorage>(
    pool_options: &[MemoryPoolOptions],
    storage: &S,
) -> Result<(), PoolConfigError> {
    let Some(memory) = storage.virtual_memory_ref() else {
        return Ok(());
    };
    let granularity = memory.granularity();
    for options in pool_options {
        if let PoolType::VirtualPages { granule, .. } | PoolType::Planned { granule, .. } =
            options.pool_type
        {
            if granularity == 0 || granule % granularity != 0 {
                return Err(PoolConfigError::GranuleNotOfStorage {
                    granule,
                    granularity,
                });
            }
        }
    }
    Ok(())
}

impl<S: ComputeStorage> MemoryManagement<S> {
    /// Memory management over `storage` with the pools of `configuration`.
    pub fn from_configuration(
        storage: S,
        properties: MemoryDeviceProperties,
        configuration: MemoryConfiguration,
    ) -> Result<Self, PoolConfigError> {
        static IDENTITY: AtomicU64 = AtomicU64::new(1);
        let virtual_memory = storage.virtual_memory_ref().is_some();
        let pool_options = configuration.resolve_for(&properties, virtual_memory)?;
        check_against_storage(&pool_options, &storage)?;
        let pools: Vec<_> = pool_options
            .iter()
            .map(|options| build_pool(options, &properties))
            .collect();
        let identity = IDENTITY.fetch_add(1, Ordering::Relaxed);
        Ok(Self {
            name: "default".to_string(),
            identity,
            periodic: pool_options.iter().any(is_periodic),
            within_reserve: WithinReserve::default(),
            align_mask: properties.alignment - 1,
            pool_options,
            route_table: route_table(&pools),
            held: Held {
                storage: CountingStorage::new(storage),
                whole_pages: WholePages::of(&pools),
                pools,
                persistent: PersistentPool::new(properties.max_page_size, properties.alignment),
                errors: ErrorGraph::new(),
                counters: Counters::default(),
                route_cache: Held::<S>::NO_ROUTE,
            },
            properties,
            configuration,
            persistent_windows: 0,
            reserve_count: 0,
            descriptors: DescriptorTable::new(identity),
            ids: IdBlock::default(),
            created: Instant::now(),
            records: Vec::new(),
            next_record: 0,
        })
    }

    /// Names this instance (for reports and logs).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// This instance's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device properties the pools were built for.
    pub fn properties(&self) -> &MemoryDeviceProperties {
        &self.properties
    }

    /// The configuration the pools were built from.
    pub fn configuration(&self) -> &MemoryConfiguration {
        &self.configuration
    }

    /// The accept rule of each dynamic pool, in routing order: which sizes each serves
    /// (routing takes the first pool whose rule serves a size).
    pub fn accept_rules(&self) -> Vec<AcceptRule> {
        self.held
            .pools
            .iter()
            .map(MemoryPool::accept_rule)
            .collect()
    }

    /// The effective options of the dynamic pools, in routing order.
    pub fn pool_options(&self) -> &[MemoryPoolOptions] {
        &self.pool_options
    }

    /// The storage.
    pub fn storage(&self) -> &S {
        &self.held.storage.inner
    }

    /// The current allocation mode.
    pub fn mode(&self) -> MemoryAllocationMode {
        if self.persistent_windows > 0 {
            MemoryAllocationMode::Persistent
        } else {
            MemoryAllocationMode::Auto
        }
    }

    /// Sets the mode: `Persistent` opens a persistent window, `Auto` closes one
    /// (windows nest; the mode is `Persistent` while any is open).
    pub fn set_mode(&mut self, mode: MemoryAllocationMode) {
        // A window may open (see `Held::route_cache`).
        self.held.route_cache = Held::<S>::NO_ROUTE;
        match mode {
            MemoryAllocationMode::Persistent => {
                self.persistent_windows = self.persistent_windows.saturating_add(1)
            }
            MemoryAllocationMode::Auto => {
                self.persistent_windows = self.persistent_windows.saturating_sub(1)
            }
        }
    }

    /// Replaces the dynamic pools with those of `configuration`.
    ///
    /// Runs an explicit cleanup first; then, while any reservation of the dynamic
    /// pools is live, refuses with [`InstallMemoryPoolsError::PoolsInUse`] and changes
    /// nothing more. Otherwise builds the new pools (the old ones hold no page after
    /// the cleanup), resets the high-water marks and restarts the count of
    /// reservations that paces periodic releases, so the new layout behaves as in a
    /// fresh memory management. The persistent pool, its reservations and the records
    /// are untouched. An invalid configuration is refused before anything happens.
    pub fn install_pools(
        &mut self,
        configuration: MemoryConfiguration,
    ) -> Result<(), InstallMemoryPoolsError> {
        let virtual_memory = self.held.storage.virtual_memory_ref().is_some();
        let pool_options = configuration.resolve_for(&self.properties, virtual_memory)?;
        check_against_storage(&pool_options, &self.held.storage.inner)?;
        self.flush_releases();
        for pool in &mut self.held.pools {
            pool.cleanup(&mut self.held.storage, self.reserve_count, true);
        }
        let in_use = self
            .held
            .pools
            .iter()
            .fold(MemoryUsage::default(), |total, pool| {
                total.combine(pool.usage())
            });
        if in_use.number_allocs > 0 || in_use.bytes_reserved > 0 {
            return Err(InstallMemoryPoolsError::PoolsInUse {
                bytes_in_use: in_use.bytes_in_use,
            });
        }
        self.held.pools = pool_options
            .iter()
            .map(|options| build_pool(options, &self.properties))
            .collect();
        self.held.route_cache = Held::<S>::NO_ROUTE;
        self.route_table = route_table(&self.held.pools);
        self.held.whole_pages = WholePages::of(&self.held.pools);
        self.periodic = pool_options.iter().any(is_periodic);
        self.within_reserve.reserved_before_cleanup = 0;
        self.pool_options = pool_options;
        self.configuration = configuration;
        self.held.persistent.reset_peaks();
        // The new pools' periodic releases count reservations from zero, as in a
        // fresh memory management: the same workload then meets the same releases.
        self.reserve_count = 0;
        Ok(())
    }
}

fn is_periodic(options: &MemoryPoolOptions) -> bool {
    match options.pool_type {
        PoolType::ExclusivePages { .. } => options.dealloc_period.is_some(),
        PoolType::Direct { reclaim_at } => reclaim_at.is_some(),
        PoolType::SlicedPages { .. } | PoolType::VirtualPages { .. } | PoolType::Planned { .. } => {
            false
        }
    }
}
