//! Handles dropped on other threads, clones, bindings and recycled descriptors.

use std::sync::mpsc;
use std::thread;

use cubepool::{ManagedMemoryHandle, MemoryUsage};

mod common;
use common::host_memory;

#[test]
fn handles_dropped_on_other_threads_are_freed() {
    let mut mm = host_memory();
    let (send, receive) = mpsc::channel::<Vec<ManagedMemoryHandle>>();
    let dropper = thread::spawn(move || {
        for batch in receive {
            for handle in batch {
                let binding = handle.binding();
                let clone = handle.clone();
                drop(handle);
                drop(clone);
                drop(binding);
            }
        }
    });
    let mut ids = std::collections::HashSet::new();
    for round in 0..200u64 {
        let batch: Vec<_> = (0..50)
            .map(|i| mm.reserve(64 + (round * 50 + i) % 5000).unwrap())
            .collect();
        for handle in &batch {
            assert!(ids.insert(handle.id()), "ids are never reused");
        }
        send.send(batch).unwrap();
        let _ = mm.memory_usage();
        mm.check_invariants().unwrap();
    }
    drop(send);
    dropper.join().unwrap();
    assert_eq!(mm.memory_usage().number_allocs, 0);
    mm.cleanup(true);
    assert_eq!(mm.memory_usage(), MemoryUsage::default());
    mm.check_invariants().unwrap();
}

#[test]
fn handles_outlive_their_memory_management() {
    let mut mm = host_memory();
    let handle = mm.reserve(128).unwrap();
    let binding = handle.binding();
    drop(mm);
    assert_eq!(handle.size(), 128);
    drop(handle);
    assert_eq!(binding.size(), 128);
}

#[test]
fn a_recycled_descriptor_does_not_revive_an_old_handle() {
    let mut mm = host_memory();
    let first = mm.reserve(64).unwrap();
    let first_id = first.id();
    drop(first);
    let second = mm.reserve(64).unwrap();
    assert_ne!(second.id(), first_id);
    assert!(second.can_mut());
    let clone = second.clone();
    assert!(!second.can_mut());
    drop(clone);
    let _binding = second.binding();
    assert!(second.can_mut(), "bindings do not count as handles");
    assert_eq!(mm.memory_usage().number_allocs, 1);
}

#[test]
fn release_frees_a_sole_handle_at_once_and_otherwise_acts_as_a_drop() {
    let mut mm = host_memory();
    let handle = mm.reserve(4096).unwrap();
    mm.release(handle);
    assert_eq!(
        mm.current_usage().number_allocs,
        0,
        "freed without waiting for the next operation"
    );

    let handle = mm.reserve(4096).unwrap();
    let clone = handle.clone();
    mm.release(handle);
    assert_eq!(mm.memory_usage().number_allocs, 1, "the clone keeps it");
    assert!(clone.can_mut());
    mm.release(clone);
    assert_eq!(mm.current_usage().number_allocs, 0);

    let handle = mm.reserve(4096).unwrap();
    let binding = handle.binding();
    mm.release(handle);
    assert_eq!(mm.memory_usage().number_allocs, 1, "the binding keeps it");
    drop(binding);
    assert_eq!(mm.memory_usage().number_allocs, 0);

    // Another instance's handle is only dropped; its own memory management frees it.
    let mut other = host_memory();
    let foreign = other.reserve(4096).unwrap();
    mm.release(foreign);
    assert_eq!(mm.memory_usage().number_allocs, 0);
    assert_eq!(other.memory_usage().number_allocs, 0);
    mm.check_invariants().unwrap();
    other.check_invariants().unwrap();
}

#[test]
fn can_mut_never_says_sole_while_another_handle_lives() {
    // A binding made or dropped on another thread must not make `can_mut` forget the
    // other handle (it once read two counters one after the other).
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let mut mm = host_memory();
    let handle = mm.reserve(64).unwrap();
    let other = handle.clone();
    let rounds = Arc::new(AtomicUsize::new(0));
    const ROUNDS: usize = 200_000;
    let churn = {
        let rounds = Arc::clone(&rounds);
        thread::spawn(move || {
            while rounds.load(Ordering::Relaxed) < ROUNDS {
                let binding = other.binding();
                drop(binding.clone());
                drop(binding);
                rounds.fetch_add(1, Ordering::Relaxed);
            }
            other
        })
    };
    let (mut checks, mut wrong) = (0u64, 0u64);
    while rounds.load(Ordering::Relaxed) < ROUNDS {
        checks += 1;
        wrong += u64::from(handle.can_mut());
    }
    let other = churn.join().unwrap();
    assert_eq!(
        wrong, 0,
        "can_mut said sole {wrong} times in {checks} while a clone lived"
    );
    drop(other);
    assert!(handle.can_mut());
}
