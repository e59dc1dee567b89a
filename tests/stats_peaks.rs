//! The peaks of `inactive_split_bytes` and `inactive_split` against their definition:
//! the largest value the statistics showed after any reserve, release or cleanup since
//! the peaks were last reset (the hot path keeps them as low-water marks per epoch of
//! the storage, see `stats::InactivePeaks`).

use cubepool::handle::SlotRef;
use cubepool::{MemoryConfiguration, MemoryDeviceProperties, MemoryManagement, VirtualStorage};

const MIB: u64 = 1024 * 1024;

/// A small deterministic generator (xorshift), so a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A size from a few bytes to a few MiB, most of them small.
fn size(rng: &mut Rng) -> u64 {
    match rng.below(10) {
        0..=5 => 1 + rng.below(4096),
        6..=8 => 1 + rng.below(3 * MIB),
        _ => 1 + rng.below(12 * MIB),
    }
}

/// Runs random reserves, releases, cleanups and peak resets on `configuration`,
/// checking both peaks after every step; returns how often a peak moved.
fn check(configuration: MemoryConfiguration, seed: u64) -> u64 {
    let mut mm = MemoryManagement::from_configuration(
        VirtualStorage::new(),
        MemoryDeviceProperties {
            max_page_size: 64 * MIB,
            alignment: 32,
        },
        configuration,
    )
    .unwrap();
    let mut rng = Rng(seed);
    let mut live: Vec<SlotRef> = Vec::new();
    let (mut bytes_peak, mut pages_peak, mut moves) = (0, 0, 0);
    for step in 0..3000 {
        match rng.below(100) {
            0..=49 => {
                if let Ok((slot, _)) = mm.reserve_slot(size(&mut rng)) {
                    live.push(slot);
                }
            }
            50..=95 if !live.is_empty() => {
                let index = rng.below(live.len() as u64) as usize;
                mm.release_slot(live.swap_remove(index)).unwrap();
            }
            96..=97 => mm.cleanup(true),
            98 => {
                mm.reset_peak_memory_stats();
                (bytes_peak, pages_peak) = (0, 0);
            }
            _ => {}
        }
        let stats = mm.memory_stats();
        let (bytes, pages) = (stats.inactive_split_bytes, stats.inactive_split);
        if bytes.current > bytes_peak || pages.current > pages_peak {
            moves += 1;
        }
        bytes_peak = bytes_peak.max(bytes.current);
        pages_peak = pages_peak.max(pages.current);
        assert_eq!(bytes.peak, bytes_peak, "bytes at step {step} (seed {seed})");
        assert_eq!(pages.peak, pages_peak, "pages at step {step} (seed {seed})");
    }
    mm.check_invariants().unwrap();
    moves
}

#[test]
fn inactive_peaks_are_the_largest_values_seen() {
    let mut layouts: Vec<MemoryConfiguration> = MemoryConfiguration::PRESETS
        .iter()
        .map(|(_, configuration)| configuration.clone())
        .filter(|configuration| configuration.validate().is_ok())
        .collect();
    layouts.push(MemoryConfiguration::parse("exclusive(max_alloc=16MiB)").unwrap());
    assert!(layouts.len() >= 2);
    for (index, layout) in layouts.into_iter().enumerate() {
        for seed in [1, 0x9e37_79b9_7f4a_7c15] {
            let moves = check(layout.clone(), seed + index as u64);
            assert!(
                moves > 3,
                "layout {index}: the peaks moved only {moves} times"
            );
        }
    }
}
