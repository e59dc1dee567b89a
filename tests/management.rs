//! The scenarios the core issue names, on real host memory.
// These scenarios use sliced pools, which exclusive-memory-only builds refuse.
#![cfg(not(feature = "exclusive-memory-only"))]

use cubepool::{
    HostStorage, MemoryAllocationMode, MemoryConfiguration, MemoryDeviceProperties,
    MemoryManagement, MemoryPoolOptions, MemoryUsage, PoolError, PoolType,
};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

fn sliced(page_size: u64, max_slice_size: u64, max_pool_size: Option<u64>) -> MemoryPoolOptions {
    MemoryPoolOptions::new(PoolType::SlicedPages {
        page_size,
        max_slice_size,
        max_pool_size,
    })
}

fn memory(pools: Vec<MemoryPoolOptions>, alignment: u64) -> MemoryManagement<HostStorage> {
    MemoryManagement::from_configuration(
        HostStorage::new(),
        MemoryDeviceProperties {
            max_page_size: 2048 * MIB,
            alignment,
        },
        MemoryConfiguration::Custom {
            pool_options: pools,
        },
    )
    .unwrap()
}

fn usage(
    number_allocs: u64,
    bytes_in_use: u64,
    bytes_padding: u64,
    bytes_reserved: u64,
) -> MemoryUsage {
    MemoryUsage {
        number_allocs,
        bytes_in_use,
        bytes_padding,
        bytes_reserved,
    }
}

#[test]
fn two_held_reserves_share_one_page() {
    let mut mm = memory(vec![sliced(2048, 2048, None)], 32);
    let _a = mm.reserve(512).unwrap();
    let _b = mm.reserve(512).unwrap();
    assert_eq!(mm.memory_usage(), usage(2, 1024, 0, 2048));
    mm.check_invariants().unwrap();
}

#[test]
fn two_large_slices_need_two_pages() {
    let mut mm = memory(vec![sliced(1024, 1024, None)], 32);
    let _a = mm.reserve(768).unwrap();
    let _b = mm.reserve(768).unwrap();
    assert_eq!(mm.memory_usage().bytes_reserved, 2048);
}

#[test]
fn a_full_capped_pool_refuses_and_reserves_nothing_more() {
    let mut mm = memory(vec![sliced(1024, 1024, Some(2048))], 32);
    let a = mm.reserve(1024).unwrap();
    let _b = mm.reserve(1024).unwrap();
    let err = mm.reserve(1024).unwrap_err();
    assert!(
        matches!(
            err,
            PoolError::PoolCapacityExceeded {
                size: 1024,
                capacity: 2048,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(mm.memory_usage().bytes_reserved, 2048);
    drop(a);
    let _c = mm.reserve(1024).unwrap();
    assert_eq!(mm.memory_usage(), usage(2, 2048, 0, 2048));
    mm.check_invariants().unwrap();
}

#[test]
fn a_full_capped_pool_passes_the_request_on() {
    let mut mm = memory(
        vec![sliced(MIB, MIB, Some(MIB)), sliced(4 * MIB, 4 * MIB, None)],
        32,
    );
    let a = mm.reserve(MIB).unwrap();
    let b = mm.reserve(MIB).unwrap();
    assert_eq!(mm.resource(&a).unwrap().pool, Some(0));
    assert_eq!(mm.resource(&b).unwrap().pool, Some(1));
}

#[test]
fn sub_slices_routes_by_the_near_page_rule() {
    let mut mm = MemoryManagement::from_configuration(
        HostStorage::new(),
        MemoryDeviceProperties {
            max_page_size: 2048 * MIB,
            alignment: 32,
        },
        MemoryConfiguration::SubSlices,
    )
    .unwrap();
    let a = mm.reserve(7 * MIB).unwrap();
    let b = mm.reserve(MIB).unwrap();
    assert_eq!(
        mm.resource(&a).unwrap().pool,
        Some(1),
        "7 MiB fills most of an 8 MiB page"
    );
    assert_eq!(
        mm.resource(&b).unwrap().pool,
        Some(2),
        "1 MiB goes to the 32 MiB pages"
    );
    assert_eq!(mm.memory_usage(), usage(2, 8 * MIB, 0, 40 * MIB));
}

#[test]
fn a_zero_byte_reserve_reserves_nothing() {
    let mut mm = memory(vec![sliced(1024, 1024, None)], 32);
    let h = mm.reserve(0).unwrap();
    assert_eq!(h.size(), 0);
    assert_eq!(mm.memory_usage().bytes_reserved, 0);
    assert_eq!(mm.resource(&h).unwrap().size, 0);
}

#[test]
fn explicit_cleanup_frees_only_fully_free_pages() {
    let mut mm = memory(vec![sliced(1024, 1024, None)], 32);
    let a = mm.reserve(600).unwrap();
    let b = mm.reserve(600).unwrap();
    let c = mm.reserve(100).unwrap(); // shares a's page
    drop(a);
    drop(b);
    mm.cleanup(true);
    assert_eq!(mm.memory_usage(), usage(1, 100, 28, 1024));
    drop(c);
    mm.cleanup(true);
    assert_eq!(mm.memory_usage(), usage(0, 0, 0, 0));
    mm.check_invariants().unwrap();
}

#[test]
fn a_binding_keeps_memory_in_use() {
    let mut mm = memory(vec![sliced(1024, 1024, None)], 32);
    let h = mm.reserve(256).unwrap();
    let binding = h.binding();
    assert!(h.can_mut(), "bindings do not count as handles");
    let h2 = h.clone();
    assert!(!h.can_mut());
    drop(h);
    drop(h2);
    assert_eq!(mm.memory_usage().bytes_in_use, 256);
    assert_eq!(mm.resource(&binding).unwrap().size, 256);
    drop(binding);
    assert_eq!(mm.memory_usage().bytes_in_use, 0);
}

#[test]
fn lookups_check_identity() {
    let mut a = memory(vec![sliced(1024, 1024, None)], 32);
    let mut b = memory(vec![sliced(1024, 1024, None)], 32);
    let h = a.reserve(64).unwrap();
    let _same_slot = b.reserve(64).unwrap();
    assert!(matches!(b.resource(&h), Err(PoolError::NotFound { .. })));
}

#[test]
fn persistent_mode_reuses_an_exact_size_buffer() {
    let mut mm = memory(vec![sliced(1024, 1024, None)], 32);
    mm.set_mode(MemoryAllocationMode::Persistent);
    let a = mm.reserve(100).unwrap();
    let first = mm.resource(&a).unwrap();
    assert_eq!(
        first.pool,
        Some(1),
        "the persistent pool follows the dynamic pools"
    );
    drop(a);
    let b = mm.reserve(100).unwrap();
    let second = mm.resource(&b).unwrap();
    assert_eq!(
        (second.storage_id, second.address),
        (first.storage_id, first.address)
    );
    mm.set_mode(MemoryAllocationMode::Auto);
    assert_eq!(mm.mode(), MemoryAllocationMode::Auto);
    assert_eq!(mm.memory_usage().bytes_reserved, 128);
}

/// A free persistent buffer of a size serves the next reserve of that size after its
/// window closed, even when the route cache names a dynamic pool for the size.
#[test]
fn a_free_persistent_buffer_serves_its_size_after_the_window() {
    let mut mm = memory(vec![sliced(1024, 1024, None)], 32);
    drop(mm.reserve(100).unwrap());
    mm.set_mode(MemoryAllocationMode::Persistent);
    let persistent = mm.reserve(100).unwrap();
    let kept = mm.resource(&persistent).unwrap();
    assert_eq!(kept.pool, Some(1), "reserved in the persistent pool");
    drop(persistent);
    mm.set_mode(MemoryAllocationMode::Auto);
    let reused = mm.reserve(100).unwrap();
    let resource = mm.resource(&reused).unwrap();
    assert_eq!(
        (resource.pool, resource.storage_id, resource.address),
        (Some(1), kept.storage_id, kept.address),
        "the free persistent buffer is reused"
    );
    let next = mm.reserve(100).unwrap();
    assert_eq!(
        mm.resource(&next).unwrap().pool,
        Some(0),
        "with no free persistent buffer left, the dynamic pool serves"
    );
}

/// The route cache's hit looks at neither the mode nor the persistent pool, so
/// opening a window and freeing a persistent buffer must empty it: a size cached for
/// a dynamic pool goes to the persistent pool in a window, and to a persistent buffer
/// of its size freed (dropped or released) while it was cached.
#[test]
fn a_cached_route_yields_to_a_window_and_to_a_freed_persistent_buffer() {
    let mut mm = memory(vec![sliced(1024, 1024, None)], 32);
    let cached = mm.reserve(100).unwrap();
    assert_eq!(
        mm.resource(&cached).unwrap().pool,
        Some(0),
        "the dynamic pool"
    );
    mm.set_mode(MemoryAllocationMode::Persistent);
    let mut persistent = mm.reserve(100).unwrap();
    assert_eq!(mm.resource(&persistent).unwrap().pool, Some(1), "a window");
    mm.set_mode(MemoryAllocationMode::Auto);
    let mut held = vec![cached];
    for release in [false, true] {
        // The persistent buffer is live: 100 bytes are routed (and cached) for the
        // dynamic pool.
        let dynamic = mm.reserve(100).unwrap();
        assert_eq!(mm.resource(&dynamic).unwrap().pool, Some(0));
        held.push(dynamic);
        if release {
            mm.release(persistent);
        } else {
            drop(persistent);
        }
        persistent = mm.reserve(100).unwrap();
        assert_eq!(
            mm.resource(&persistent).unwrap().pool,
            Some(1),
            "the freed persistent buffer serves (released: {release})"
        );
    }
}

#[test]
fn persistent_windows_nest() {
    let mut mm = memory(vec![sliced(1024, 1024, None)], 32);
    mm.set_mode(MemoryAllocationMode::Persistent);
    mm.set_mode(MemoryAllocationMode::Persistent);
    mm.set_mode(MemoryAllocationMode::Auto);
    assert_eq!(mm.mode(), MemoryAllocationMode::Persistent);
    mm.set_mode(MemoryAllocationMode::Auto);
    assert_eq!(mm.mode(), MemoryAllocationMode::Auto);
}

#[test]
fn a_freed_padded_slice_is_reused_for_the_same_request() {
    let mut mm = memory(vec![sliced(1024, 1024, None)], 64);
    let a = mm.reserve(100).unwrap();
    let _b = mm.reserve(100).unwrap();
    let first = mm.resource(&a).unwrap();
    drop(a);
    let c = mm.reserve(100).unwrap();
    assert_eq!(mm.resource(&c).unwrap().address, first.address);
    assert_eq!(mm.memory_usage(), usage(2, 200, 56, 1024));
}

#[test]
fn exclusive_pages_fit_the_request_and_do_not_hold_large_pages() {
    let pools = vec![MemoryPoolOptions::new(PoolType::ExclusivePages {
        max_alloc_size: 64 * MIB,
    })];
    let mut mm = memory(pools, 64);
    let big = mm.reserve(MIB).unwrap();
    assert_eq!(
        mm.memory_usage().bytes_reserved,
        MIB,
        "no running-average inflation"
    );
    drop(big);
    let small = mm.reserve(100).unwrap();
    assert_eq!(
        mm.memory_usage().bytes_reserved,
        MIB + 128,
        "100 B never holds a 1 MiB page"
    );
    drop(small);
    let again = mm.reserve(MIB - 1000).unwrap();
    let usage = mm.memory_usage();
    assert_eq!(
        usage.bytes_reserved,
        MIB + 128,
        "a page within 1/8 is reused"
    );
    drop(again);
    mm.cleanup(true);
    assert_eq!(mm.memory_usage().bytes_reserved, 0);
}

#[test]
fn no_accepting_pool_is_buffer_too_big() {
    let mut mm = memory(vec![sliced(1024, 512, Some(1024))], 32);
    assert!(matches!(
        mm.reserve(600),
        Err(PoolError::BufferTooBig { size: 600, .. })
    ));
}

#[test]
fn out_of_memory_is_an_error_not_an_abort() {
    let pools = vec![MemoryPoolOptions::new(PoolType::Direct {
        reclaim_at: None,
    })];
    let mut mm = MemoryManagement::from_configuration(
        HostStorage::new(),
        MemoryDeviceProperties {
            max_page_size: u64::MAX / 2,
            alignment: 64,
        },
        MemoryConfiguration::Custom {
            pool_options: pools,
        },
    )
    .unwrap();
    let kept = mm.reserve(64).unwrap();
    assert!(matches!(
        mm.reserve(u64::MAX / 4),
        Err(PoolError::OutOfMemory { .. })
    ));
    assert_eq!(
        mm.resource(&kept).unwrap().size,
        64,
        "nothing already allocated is lost"
    );
}

#[test]
fn periodic_release_of_exclusive_pages() {
    let pools = vec![MemoryPoolOptions {
        pool_type: PoolType::ExclusivePages {
            max_alloc_size: MIB,
        },
        dealloc_period: Some(10),
    }];
    let mut mm = memory(pools, 64);
    drop(mm.reserve(1000).unwrap());
    let keep = mm.reserve(64 * KIB).unwrap();
    for _ in 0..20 {
        drop(mm.reserve(64 * KIB).unwrap());
    }
    assert_eq!(
        mm.memory_usage().bytes_reserved,
        2 * 64 * KIB,
        "the 1000 B page was released"
    );
    drop(keep);
}

#[test]
fn a_failed_reserve_leaves_nothing_in_the_error_graph() {
    // Unlike a failed bind, a failed reserve names no id anyone holds: a record of it
    // could never be read nor leave the graph.
    let mut mm = memory(vec![sliced(KIB, KIB, Some(KIB))], 32);
    let _held = mm.reserve(KIB).unwrap();
    for _ in 0..3 {
        assert!(matches!(
            mm.reserve(512),
            Err(PoolError::PoolCapacityExceeded { .. })
        ));
        assert!(matches!(
            mm.reserve_located(512),
            Err(PoolError::PoolCapacityExceeded { .. })
        ));
    }
    assert!(mm.error_graph().is_empty());
    assert_eq!(mm.memory_usage().number_allocs, 1);
}

#[test]
fn a_failed_bind_records_the_id_as_unallocated() {
    use cubepool::errors::AllocId;
    // One capped page of 1 KiB: a second reservation of 1 KiB cannot fit.
    let mut mm = memory(vec![sliced(KIB, KIB, Some(KIB))], 32);
    let _held = mm.reserve(KIB).unwrap();
    for bind_located in [false, true] {
        let handle = mm.handle();
        let id = handle.id();
        let failed = if bind_located {
            mm.bind_located(id, 512).map(|_| ())
        } else {
            mm.bind(id, 512).map(|_| ())
        };
        assert!(matches!(
            failed,
            Err(PoolError::PoolCapacityExceeded { .. })
        ));
        let (size, why) = mm.error_graph().unallocated(AllocId(id.0)).unwrap();
        assert_eq!(size, 512);
        assert!(why.contains("capacity"), "{why}");
    }
    mm.check_invariants().unwrap();
}

/// One step of a workload run through handles and through slots side by side.
#[derive(Debug, Clone)]
enum Step {
    Reserve(u64),
    /// Frees the live reservation at this index (modulo the number live).
    Free(usize),
    /// Enters (true) or leaves a persistent window.
    Persistent(bool),
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    // Sizes spread over the pools' boundaries: zero, small, near pages, large.
    let size = prop_oneof![
        Just(0u64),
        1u64..=4 * KIB,
        (0u32..=22).prop_map(|shift| 1u64 << shift),
        (1u64..=3 * MIB).prop_map(|s| s | 1),
    ];
    prop_oneof![
        6 => size.prop_map(Step::Reserve),
        5 => any::<usize>().prop_map(Step::Free),
        1 => any::<bool>().prop_map(Step::Persistent),
    ]
}

/// The layouts the routing paths differ on: the default, CubeCL's ladder, and a capped
/// pool that passes requests on, with a periodic exclusive pool behind it.
fn layout(index: usize) -> MemoryManagement<HostStorage> {
    let configuration = match index {
        0 => MemoryConfiguration::Compact,
        1 => MemoryConfiguration::SubSlices,
        _ => MemoryConfiguration::Custom {
            pool_options: vec![
                sliced(64 * KIB, 16 * KIB, Some(128 * KIB)),
                MemoryPoolOptions {
                    pool_type: PoolType::ExclusivePages {
                        max_alloc_size: 4 * MIB,
                    },
                    dealloc_period: Some(7),
                },
            ],
        },
    };
    MemoryManagement::from_configuration(
        HostStorage::new(),
        MemoryDeviceProperties {
            max_page_size: 64 * MIB,
            alignment: 32,
        },
        configuration,
    )
    .unwrap()
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Handles take their own reserve path (`bind`): it must place every reservation
    /// where `reserve_slot` does, fail where it fails, and book the same usage.
    #[test]
    fn handles_and_slots_make_the_same_placements(
        index in 0usize..3,
        steps in proptest::collection::vec(step(), 1..120),
    ) {
        use cubepool::MemoryHandle;
        let mut by_handle = layout(index);
        let mut by_slot = layout(index);
        let mut handles = Vec::new();
        let mut slots = Vec::new();
        for (n, step) in steps.into_iter().enumerate() {
            match step {
                Step::Reserve(size) => match (by_handle.reserve(size), by_slot.reserve_slot(size)) {
                    (Ok(handle), Ok((slot_ref, _))) => {
                        proptest::prop_assert_eq!(handle.address_of().1, slot_ref, "step {}", n);
                        handles.push(handle);
                        slots.push(slot_ref);
                    }
                    (Err(a), Err(b)) => proptest::prop_assert_eq!(a.to_string(), b.to_string()),
                    (a, b) => proptest::prop_assert!(false, "step {}: {:?} vs {:?}", n, a.map(|_| ()), b.map(|_| ())),
                },
                Step::Free(i) if !slots.is_empty() => {
                    let i = i % slots.len();
                    let handle = handles.swap_remove(i);
                    // Both ways of giving a handle back.
                    if n % 2 == 0 { drop(handle) } else { by_handle.release(handle) }
                    by_slot.release_slot(slots.swap_remove(i)).unwrap();
                }
                Step::Free(_) => {}
                Step::Persistent(on) => {
                    let mode = if on { MemoryAllocationMode::Persistent } else { MemoryAllocationMode::Auto };
                    by_handle.set_mode(mode);
                    by_slot.set_mode(mode);
                }
            }
            proptest::prop_assert_eq!(by_handle.memory_usage(), by_slot.memory_usage(), "step {}", n);
        }
        by_handle.check_invariants().unwrap();
        by_slot.check_invariants().unwrap();
    }
}

/// `locate` reports a slot's bytes as `resource` and `reserve_located` do, from the
/// pool's placement (dynamic, persistent and zero-byte slots alike), and refuses a slot
/// given back.
#[test]
fn locate_reports_the_placement_of_a_slot_and_refuses_a_released_one() {
    let mut mm = memory(vec![sliced(1024, 1024, None)], 32);
    let (dynamic, placement) = mm.reserve_slot(100).unwrap();
    let resource = mm.locate(dynamic).unwrap();
    assert_eq!(
        (
            resource.pool,
            resource.storage_id,
            resource.offset,
            resource.size
        ),
        (Some(0), Some(placement.storage.id.0), placement.offset, 100)
    );
    assert_eq!(
        resource.address,
        placement.storage.address + placement.offset
    );

    mm.set_mode(MemoryAllocationMode::Persistent);
    let (persistent, _) = mm.reserve_slot(64).unwrap();
    let (handle, located) = mm.reserve_located(64).unwrap();
    mm.set_mode(MemoryAllocationMode::Auto);
    assert_eq!(mm.locate(persistent).unwrap().pool, Some(1));
    assert_eq!(mm.resource(&handle).unwrap(), located);
    assert_eq!(
        located.pool,
        Some(1),
        "the persistent pool follows the dynamic one"
    );

    let (empty, _) = mm.reserve_slot(0).unwrap();
    let nothing = mm.locate(empty).unwrap();
    assert_eq!(
        (
            nothing.pool,
            nothing.storage_id,
            nothing.size,
            nothing.address
        ),
        (None, None, 0, 0)
    );

    mm.release_slot(dynamic).unwrap();
    match mm.locate(dynamic) {
        Err(PoolError::NotFound { reason }) => {
            assert!(reason.contains("of pool 0 is not reserved"), "{reason}")
        }
        other => panic!("a released slot is not found, got {other:?}"),
    }
    mm.release_slot(persistent).unwrap();
    mm.release_slot(empty).unwrap();
    drop(handle);
    mm.check_invariants().unwrap();
}

/// `handle::Location`, the former name of `SlotRef`, still names it.
#[test]
fn the_former_name_location_still_names_a_slot_ref() {
    let mut mm = memory(vec![sliced(1024, 1024, None)], 32);
    let (slot, _) = mm.reserve_slot(100).unwrap();
    let former: cubepool::handle::Location = slot;
    let current: cubepool::handle::SlotRef = former;
    mm.release_slot(current).unwrap();
    assert_eq!(mm.memory_usage().number_allocs, 0);
}

/// `release_slot` of a live handle's slot frees the reservation (a `SlotRef` is a key,
/// not a capability: see its doc); the handle's own release then finds nothing to free.
/// That is the caller's misuse, so it is no panic, in a debug build as in a release one
/// (a `debug_assert!` fired on it), and the books stay consistent.
#[test]
fn a_handle_whose_slot_was_released_by_slot_then_drops_without_a_panic() {
    use cubepool::MemoryHandle;

    let mut mm = memory(vec![sliced(1024, 1024, None)], 32);
    let given_back = mm.reserve(100).unwrap();
    let dropped = mm.reserve(100).unwrap();
    // Given back with `release`, which frees at once.
    let (_, slot) = given_back.address_of();
    mm.release_slot(slot).unwrap();
    assert!(mm.locate(slot).is_err(), "release_slot freed the slot");
    mm.release(given_back);
    assert_eq!(mm.memory_usage().number_allocs, 1);
    // Dropped, which the next operation frees.
    let (_, slot) = dropped.address_of();
    mm.release_slot(slot).unwrap();
    drop(dropped);
    let kept = mm.reserve(100).unwrap();
    mm.check_invariants().unwrap();
    assert_eq!(mm.memory_usage().number_allocs, 1);
    drop(kept);
    mm.cleanup(true);
    mm.check_invariants().unwrap();
    assert_eq!(mm.memory_usage().number_allocs, 0);
}
