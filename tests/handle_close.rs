//! The close protocol of handle descriptors: a memory management dropped while its
//! handles live on (on other threads, dropped at the same time) frees its descriptor
//! block exactly once, after the last handle. One test per binary, because the
//! block count is process-wide.

use std::sync::{Arc, Barrier};
use std::thread;

use cubepool::handle::live_descriptor_blocks;

mod common;
use common::host_memory;

#[test]
fn descriptor_blocks_are_freed_once_after_the_last_handle_in_any_order() {
    let before = live_descriptor_blocks();

    // No handle left: the memory management frees its block when dropped.
    let mut mm = host_memory();
    drop(mm.reserve(64).unwrap());
    let _ = mm.memory_usage();
    drop(mm.reserve(64).unwrap());
    drop(mm);
    assert_eq!(live_descriptor_blocks(), before);

    // Handles outlive it: the last one frees the block.
    let mut mm = host_memory();
    let handle = mm.reserve(64).unwrap();
    let binding = handle.binding();
    drop(mm);
    assert_eq!(live_descriptor_blocks(), before + 1);
    drop(handle);
    assert_eq!(
        live_descriptor_blocks(),
        before + 1,
        "the binding still holds it"
    );
    assert_eq!(binding.size(), 64);
    drop(binding);
    assert_eq!(live_descriptor_blocks(), before);

    // Races: threads drop handles (some released, some pending, some live) while the
    // memory management is dropped on this thread.
    for round in 0..200 {
        let mut mm = host_memory();
        let mut handles: Vec<_> = (0..96).map(|i| mm.reserve(64 + i).unwrap()).collect();
        // Some released and drained, some released and pending on the list.
        handles.drain(..16);
        let _ = mm.memory_usage();
        handles.drain(..16);
        let clones: Vec<_> = handles.iter().step_by(3).map(Clone::clone).collect();
        let barrier = Arc::new(Barrier::new(3));
        let mut workers = Vec::new();
        for batch in [handles, clones] {
            let barrier = Arc::clone(&barrier);
            workers.push(thread::spawn(move || {
                barrier.wait();
                for (i, handle) in batch.into_iter().enumerate() {
                    if i % 2 == 0 {
                        drop(handle.binding());
                    }
                    drop(handle);
                }
            }));
        }
        barrier.wait();
        if round % 2 == 0 {
            thread::yield_now();
        }
        drop(mm);
        for worker in workers {
            worker.join().unwrap();
        }
        assert_eq!(
            live_descriptor_blocks(),
            before,
            "round {round}: the block was not freed exactly once"
        );
    }
}
