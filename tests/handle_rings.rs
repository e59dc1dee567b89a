//! Release rings: each thread hands dropped handles back through a ring of its own
//! per memory management. Rings and descriptor blocks are counted process-wide, so
//! each test runs on a thread of its own, one at a time, and checks that the
//! counts come back to where they were.

use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use cubepool::handle::{live_descriptor_blocks, live_release_rings};
use cubepool::{
    ManagedMemoryHandle, MemoryConfiguration, MemoryDeviceProperties, MemoryManagement,
    MemoryUsage, VirtualStorage,
};

/// Memory management with the default layout over synthetic storage (address ranges
/// without bytes): the rings do not depend on the storage, and this one makes no
/// system call, so the tests run under Miri too (which maps no memory).
fn memory() -> MemoryManagement<VirtualStorage> {
    MemoryManagement::from_configuration(
        VirtualStorage::new(),
        MemoryDeviceProperties::default(),
        MemoryConfiguration::default(),
    )
    .unwrap()
}

/// Rings and blocks alive now.
fn counts() -> (usize, usize) {
    (live_release_rings(), live_descriptor_blocks())
}

/// `full`, or `miri` when the tests run under Miri (which checks the unsafe code and
/// its memory orderings, a thousand times slower).
fn rounds(full: u64, miri: u64) -> u64 {
    if cfg!(miri) {
        miri
    } else {
        full
    }
}

/// Runs `test` on a thread of its own (whose rings go with it), one test at a time
/// (the counts are process-wide), and checks that every ring and block it made is
/// freed. `test` is given the counts from before.
fn isolated(test: impl FnOnce((usize, usize)) + Send + 'static) {
    static TURN: Mutex<()> = Mutex::new(());
    let _turn = TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let before = counts();
    thread::spawn(move || test(before)).join().unwrap();
    assert_eq!(counts(), before, "every ring and block is freed");
}

#[test]
fn a_thread_gets_one_ring_per_memory_management_and_frees_it_on_exit() {
    isolated(|before| {
        let mut first = memory();
        let mut second = memory();
        for size in 1..rounds(500, 20) {
            drop(first.reserve(size).unwrap());
            drop(second.reserve(size).unwrap());
        }
        assert_eq!(live_release_rings(), before.0 + 2, "one ring per table");
        assert_eq!(first.memory_usage().number_allocs, 0);
        assert_eq!(second.memory_usage().number_allocs, 0);
        first.check_invariants().unwrap();
        second.check_invariants().unwrap();
    });
}

#[test]
fn a_handle_dropped_after_its_table_closed_frees_the_block_at_once() {
    isolated(|before| {
        let mut mm = memory();
        let early = mm.reserve(64).unwrap();
        let late = mm.reserve(64).unwrap();
        drop(early);
        assert_eq!(live_release_rings(), before.0 + 1);
        drop(mm);
        assert_eq!(live_descriptor_blocks(), before.1 + 1, "`late` keeps it");
        drop(late);
        assert_eq!(
            counts(),
            before,
            "the closed table's ring is left and the block freed by the last handle"
        );
    });
}

#[test]
fn a_thread_that_outlives_many_tables_keeps_at_most_one_ring_of_a_closed_one() {
    isolated(|before| {
        for _ in 0..rounds(100, 4) {
            // A new block often gets the address of the one just freed, which a ring
            // of this thread still names: the hand-back must not take that ring.
            let mut mm = memory();
            drop(mm.reserve(64).unwrap());
            assert_eq!(
                mm.memory_usage().number_allocs,
                0,
                "the drop reached this table"
            );
            drop(mm);
        }
        // The last table's ring is left only when the thread hands back again.
        assert!(live_release_rings() <= before.0 + 1);
        assert_eq!(live_descriptor_blocks(), before.1);
    });
}

#[test]
fn a_full_ring_falls_back_to_the_release_list_and_loses_nothing() {
    isolated(|_| {
        let mut mm = memory();
        // Far more than a ring holds, dropped between two operations.
        let handles: Vec<_> = (0..rounds(5000, 600))
            .map(|i| mm.reserve(64 + i).unwrap())
            .collect();
        drop(handles);
        assert_eq!(mm.memory_usage().number_allocs, 0);
        mm.check_invariants().unwrap();
        mm.cleanup(true);
        assert_eq!(mm.memory_usage(), MemoryUsage::default());
    });
}

#[test]
fn rings_of_threads_that_exit_are_drained_and_freed_by_the_table() {
    isolated(|before| {
        let mut mm = memory();
        for round in 0..rounds(50, 3) {
            let handles: Vec<_> = (0..40)
                .map(|i| mm.reserve(64 + round + i).unwrap())
                .collect();
            thread::spawn(move || drop(handles)).join().unwrap();
            // The thread left its ring with descriptors on it; the table drains them.
            assert_eq!(mm.memory_usage().number_allocs, 0, "round {round}");
            mm.check_invariants().unwrap();
        }
        assert_eq!(
            live_release_rings(),
            before.0,
            "each exited thread's ring is freed"
        );
    });
}

thread_local! {
    /// Handles a thread keeps until its thread-local values are destroyed.
    static KEPT: std::cell::RefCell<Vec<ManagedMemoryHandle>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

#[test]
fn handles_dropped_while_a_thread_exits_are_still_freed() {
    isolated(|_| {
        let mut mm = memory();
        for _ in 0..rounds(20, 2) {
            let handles: Vec<_> = (0..rounds(40, 8))
                .map(|i| mm.reserve(64 + i).unwrap())
                .collect();
            thread::spawn(move || {
                let mut handles = handles;
                // One dropped now (the thread gets a ring), the rest when its
                // thread-local values are destroyed, before or after its rings.
                drop(handles.pop());
                KEPT.with(|kept| kept.borrow_mut().extend(handles));
            })
            .join()
            .unwrap();
            assert_eq!(mm.memory_usage().number_allocs, 0);
        }
        mm.check_invariants().unwrap();
    });
}

#[test]
fn closing_while_threads_hand_back_frees_every_ring_and_block_once() {
    for round in 0..rounds(2000, 6) {
        isolated(move |_| {
            let mut mm = memory();
            let mut first: Vec<_> = (0..rounds(96, 16))
                .map(|i| mm.reserve(64 + i).unwrap())
                .collect();
            let second = first.split_off(first.len() / 2);
            let barrier = Arc::new(Barrier::new(3));
            let workers: Vec<_> = [first, second]
                .into_iter()
                .map(|batch| {
                    let barrier = Arc::clone(&barrier);
                    thread::spawn(move || {
                        let mut batch = batch;
                        // A ring before the race, so pushes land on it during the close.
                        drop(batch.pop());
                        barrier.wait();
                        drop(batch);
                    })
                })
                .collect();
            barrier.wait();
            if round % 2 == 0 {
                let _ = mm.memory_usage();
            }
            drop(mm);
            for worker in workers {
                worker.join().unwrap();
            }
        });
    }
}
