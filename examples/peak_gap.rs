//! Where the default's mapped-but-not-live bytes are at its peak: the diagnosis of
//! issue 28's placement (the traces where eager unmapping reaches no more than the
//! default, so placement, not release, limits utilization).
//!
//! `cargo run --release --example peak_gap -- [LAYOUT] TRACE...` replays each trace
//! (`.jsonl` or `.jsonl.gz`) through the layout (default: the default layout) on
//! `VirtualStorage` and follows the 2 MiB granules live blocks touch (the eager
//! policy's mapped bytes, which are the default's peak by construction). At the
//! first event where they peak, it splits the gap (granules touched minus the bytes
//! live blocks asked for) into:
//!
//! - `rounding`: extents past the sizes asked for;
//! - `large edges`: free bytes of granules in the large range (blocks over 16 MiB),
//!   which are the partly used first and last granules of large blocks;
//! - `small multi-granule edges`: free bytes of small-range granules that a block
//!   spanning more than one granule touches in part (its edge granules);
//! - `small lone` / `small shared`: free bytes of small-range granules touched only
//!   by blocks that lie within one granule, pinned by one block or by several;
//!
//! and the packing bound of each range (its live extents rounded up to whole
//! granules: what any placement in that range needs at that moment), with the
//! utilization it would give at that event (the replay's utilization divides the
//! peak of live bytes, which may come at another event, by the peak mapped).
//! With `PEAK_GAP_HOLES` set in the environment it also lists every free run between
//! live small-range blocks at the peak: its bytes, the bytes of it in touched
//! granules, and the sizes of the blocks on either side.
//!
//! The parts assume a virtual layout of 2 MiB granules, the default's alignment
//! (64 bytes) and its size split: a range holding any block over 16 MiB counts as
//! the large one, so a layout with one range for all sizes shows its gap as `large
//! edges` once it holds such a block.
//!
//! What it found (issue 28, the four traces below 0.95): the gap at the peak is
//! almost all free bytes in the partly used edge granules of multi-granule blocks,
//! the holes that blocks which died between live ones left (gpt2-generate 1.7 of 1.7
//! MiB, vit-train 7.0 of 8.1, calibrate-layers 5.7 of 5.7, bert-dynamic 3.0 of 5.9
//! with 2.9 in large blocks' edges); rounding is nil and no granule is pinned by one
//! sub-granule block alone. gpt2-generate is at its packing bound (28.3 MiB live need
//! 30 MiB of granules: 0.943); the others' bounds at that event are 0.999, 0.977 and
//! 0.978. Rules tried against them, each replayed on all 13 traces with
//! `examples/default_calls.rs`, and dropped (each lost more than 0.002 somewhere, or
//! won nowhere): the fewest new granules among up to 8 fitting segments of the
//! request's class and the next (no utilization changed); the same over up to 64
//! segments of any larger class (vit-train 0.940 -> 0.910, long-context-train 0.995 ->
//! 0.986, gpt2-train 0.971 -> 0.966), and for sub-granule blocks only (vit-train
//! 0.910, calibrate-layers 0.920); multi-granule blocks at the end of their free
//! segment (calibrate-layers 0.898, vit-train 0.925); the smallest, lowest fitting
//! segment of up to 16 per class (long-context-train 0.991, nothing gained). Packing
//! toward touched granules spends the large free segments that best fit keeps whole.
//! The one lead: a block of at most 64 KiB whose best fit would cut a free segment of
//! 1 MiB or more of a larger class goes to the start of the largest free segment
//! instead (worst fit for tiny blocks, so the holes that mid-size blocks come back to
//! stay whole): calibrate-layers 0.943 -> 0.967, transformer-train 0.983 -> 0.987, no
//! other trace of the 15 changed; but 64 KiB / 512 KiB loses unet-diffusion 0.010 and
//! 256 KiB / 1 MiB vit-train 0.015, and on scaled and perturbed copies of the traces
//! (`virtual_tradeoff.py`'s `scaled`, `plan.perturb`) it wins up to 0.061 on 9 of 45
//! but loses 0.003-0.008 on 5 (seq2seq-train, long-context-train, unet-diffusion):
//! not kept, as it rests on two constants.

use cubepool::config::{
    MemoryConfiguration, MemoryDeviceProperties, DEFAULT_GRANULE, DEFAULT_SMALL,
};
use cubepool::storage::VirtualStorage;
use cubepool::trace::{Trace, TraceEvent};
use cubepool::MemoryManagement;
use std::collections::HashMap;

/// The default's granule.
const GRANULE: u64 = DEFAULT_GRANULE;
/// The default's size split: larger requests go to the large range.
const SMALL_MAX: u64 = DEFAULT_SMALL;

/// A live block: its range, offset, extent and the bytes asked for.
#[derive(Clone, Copy)]
struct Live {
    range: u64,
    offset: u64,
    extent: u64,
    size: u64,
}

impl Live {
    /// The granules the block touches.
    fn granules(&self) -> std::ops::Range<u64> {
        if self.extent == 0 {
            return 0..0;
        }
        self.offset / GRANULE..(self.offset + self.extent).div_ceil(GRANULE)
    }
}

/// The gap's parts at the peak, in bytes.
#[derive(Default, Debug)]
struct Split {
    mapped: u64,
    live: u64,
    rounding: u64,
    large_edges: u64,
    small_multi_edge: u64,
    small_lone: u64,
    small_shared: u64,
    /// Per range kind (small, large): live extents rounded up to whole granules.
    packed: [u64; 2],
    /// Per range kind: the granules touched.
    touched: [u64; 2],
    /// With `PEAK_GAP_HOLES` set: the free runs between live small blocks.
    holes: Vec<String>,
}

fn split(blocks: &HashMap<u32, Live>, large: &HashMap<u64, bool>) -> Split {
    // Per (range, granule): covered bytes, blocks, whether a multi-granule block touches it.
    let mut granules: HashMap<(u64, u64), (u64, u32, bool)> = HashMap::new();
    let mut result = Split::default();
    let mut extents = [0u64; 2];
    for block in blocks.values() {
        result.live += block.size;
        result.rounding += block.extent - block.size;
        let kind = usize::from(large[&block.range]);
        extents[kind] += block.extent;
        let multi = block.granules().end - block.granules().start > 1;
        for granule in block.granules() {
            let start = (granule * GRANULE).max(block.offset);
            let end = ((granule + 1) * GRANULE).min(block.offset + block.extent);
            let entry = granules.entry((block.range, granule)).or_default();
            entry.0 += end - start;
            entry.1 += 1;
            entry.2 |= multi;
        }
    }
    for (&(range, _), &(covered, count, multi)) in &granules {
        let free = GRANULE - covered;
        result.mapped += GRANULE;
        let kind = usize::from(large[&range]);
        result.touched[kind] += GRANULE;
        if large[&range] {
            result.large_edges += free;
        } else if multi {
            result.small_multi_edge += free;
        } else if count == 1 {
            result.small_lone += free;
        } else {
            result.small_shared += free;
        }
    }
    if std::env::var_os("PEAK_GAP_HOLES").is_some() {
        let mut sorted: Vec<&Live> = blocks.values().filter(|b| !large[&b.range]).collect();
        sorted.sort_by_key(|b| b.offset);
        for pair in sorted.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let (s, e) = (a.offset + a.extent, b.offset);
            if e > s {
                let wasted = if s / GRANULE == (e - 1) / GRANULE {
                    e - s
                } else {
                    (s.next_multiple_of(GRANULE) - s) + (e - e / GRANULE * GRANULE)
                };
                result.holes.push(format!(
                    "  hole at {:.2} MiB: {} bytes, wasted {} (before: {} B, after: {} B)",
                    s as f64 / 1048576.0,
                    e - s,
                    wasted,
                    a.size,
                    b.size
                ));
            }
        }
    }
    result.packed = extents.map(|extent| extent.div_ceil(GRANULE) * GRANULE);
    result
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / f64::from(1 << 20))
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let layout = if args.first().is_some_and(|a| !a.contains(".jsonl")) {
        MemoryConfiguration::parse(&args.remove(0)).expect("a valid layout")
    } else {
        MemoryConfiguration::default()
    };
    if args.is_empty() {
        eprintln!("usage: peak_gap [LAYOUT] TRACE...");
        std::process::exit(2);
    }
    println!(
        "trace: mapped at peak (MiB) = live + rounding + large edges + small multi-granule \
         edges + small lone + small shared; packing bound small/large; touched small/large"
    );
    for path in &args {
        let trace = Trace::load(path).unwrap_or_else(|error| {
            eprintln!("cannot load {path}: {error}");
            std::process::exit(1);
        });
        let properties = MemoryDeviceProperties::default();
        let alignment = properties.alignment;
        let mut memory =
            MemoryManagement::from_configuration(VirtualStorage::new(), properties, layout.clone())
                .expect("a valid layout");
        let mut locations = HashMap::new();
        let mut blocks: HashMap<u32, Live> = HashMap::new();
        let mut large: HashMap<u64, bool> = HashMap::new();
        let mut touched: HashMap<(u64, u64), u32> = HashMap::new();
        let mut best: Option<Split> = None;
        let mut peak = 0usize;
        let touch = |touched: &mut HashMap<(u64, u64), u32>, block: &Live, add: bool| {
            for granule in block.granules() {
                let count = touched.entry((block.range, granule)).or_default();
                if add {
                    *count += 1;
                } else {
                    *count -= 1;
                    if *count == 0 {
                        touched.remove(&(block.range, granule));
                    }
                }
            }
        };
        for event in trace.events() {
            match *event {
                TraceEvent::Alloc { id, size, .. } => {
                    let (location, placement) = memory.reserve_slot(size).expect("reserve");
                    let extent = size.next_multiple_of(alignment);
                    let block = Live {
                        range: placement.storage.id.0,
                        offset: placement.offset,
                        extent,
                        size,
                    };
                    let is_large = large.entry(block.range).or_insert(false);
                    *is_large |= size > SMALL_MAX;
                    touch(&mut touched, &block, true);
                    blocks.insert(id, block);
                    locations.insert(id, location);
                    if touched.len() > peak {
                        peak = touched.len();
                        best = Some(split(&blocks, &large));
                    }
                }
                TraceEvent::Free { id, .. } => {
                    if let Some(location) = locations.remove(&id) {
                        let _ = memory.release_slot(location);
                        if let Some(block) = blocks.remove(&id) {
                            touch(&mut touched, &block, false);
                        }
                    }
                }
            }
        }
        let name = path.rsplit('/').next().unwrap_or(path);
        let Some(s) = best else { continue };
        for hole in &s.holes {
            println!("{hole}");
        }
        println!(
            "{name}: {} = {} + {} + {} + {} + {} + {}; packed {}/{}; touched {}/{}; \
             utilization at peak {:.3}, if packed per range {:.3}",
            mib(s.mapped),
            mib(s.live),
            mib(s.rounding),
            mib(s.large_edges),
            mib(s.small_multi_edge),
            mib(s.small_lone),
            mib(s.small_shared),
            mib(s.packed[0]),
            mib(s.packed[1]),
            mib(s.touched[0]),
            mib(s.touched[1]),
            s.live as f64 / s.mapped as f64,
            s.live as f64 / (s.packed[0] + s.packed[1]) as f64,
        );
    }
}
