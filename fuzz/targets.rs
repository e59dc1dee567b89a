//! The bodies of cubepool's fuzz targets, one function per target.
//!
//! Shared by the cargo-fuzz binaries (`fuzz/fuzz_targets/*.rs`, built against libFuzzer)
//! and by the stable test `tests/fuzz_corpus.rs`, which runs every corpus file and a
//! bounded number of deterministic mutations through them in `scripts/test`. Each body
//! must never panic on any input: a panic is the bug the fuzzer reports. Where an input
//! is accepted, each also checks what must then hold (a round trip, the invariants).

use cubepool::config::MemoryConfiguration;
use cubepool::tensor::format::{
    read_param_dict, read_tensor, write_param_dict, write_tensor, SliceSource,
};
use cubepool::trace::{at_peak, replay, ReadLimits, ReplayOptions, Replayed, Trace, TraceError};
use cubepool::MemoryDeviceProperties;

/// The pools configuration language: text that parses prints to a canonical text that
/// parses to the same configuration. Returns whether the input parsed.
pub fn config_language(data: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(data) else {
        return false;
    };
    let Ok(config) = MemoryConfiguration::parse(text) else {
        return false;
    };
    let canonical = config.to_string();
    let again = MemoryConfiguration::parse(&canonical)
        .unwrap_or_else(|e| panic!("canonical text {canonical:?} does not parse: {e}"));
    assert_eq!(again, config, "{text:?} -> {canonical:?}");
    assert_eq!(again.to_string(), canonical);
    true
}

/// The trace v1 reader (plain or gzip) and replay: a trace that reads replays through
/// each preset, and through the layout its first byte picks, on virtual storage with a
/// limit its second byte picks, with the peaks and counts consistent and the view at
/// the peak adding up; it writes and reads back as itself (stack frames included). Returns whether
/// the input read as a trace.
pub fn trace_replay(data: &[u8]) -> bool {
    let Ok(trace) = Trace::read(data) else {
        return false;
    };
    let limit = match data.get(1) {
        Some(&b) if b % 2 == 1 => Some(u64::from(b) << 20),
        _ => None,
    };
    let layouts = [
        MemoryConfiguration::default(),
        MemoryConfiguration::SubSlices,
        MemoryConfiguration::ExclusivePages,
    ];
    let pick = usize::from(data.first().copied().unwrap_or(0)) % layouts.len();
    for (index, layout) in layouts.iter().enumerate() {
        let options = ReplayOptions {
            limit: if index == pick { limit } else { None },
            samples: 7,
        };
        let Ok(result) = replay(&trace, layout, MemoryDeviceProperties::default(), options) else {
            continue;
        };
        assert_eq!(result.events, trace.len());
        assert_eq!(result.peak_live, trace.peak_live());
        assert!(result.samples.len() <= 7);
        assert!(result.peak_reserved >= result.final_usage.bytes_reserved);
        if result.failed_reserves == 0 {
            // Every reservation was served: in use is exactly what the trace had live.
            assert_eq!(result.peak_in_use, trace.peak_live());
            assert!(result.peak_in_use <= result.peak_reserved);
        } else {
            assert!(result.first_failed_event.is_some_and(|e| e < trace.len()));
        }
        // The address space at the peak adds up and is the peak the replay measured.
        let replayed = Replayed::Layout {
            configuration: layout.clone(),
            properties: MemoryDeviceProperties::default(),
        };
        let view = at_peak(&trace, &replayed, options.limit, result.peak_reserved_event)
            .expect("the layout built for the replay builds again");
        view.check()
            .unwrap_or_else(|e| panic!("the view at the peak: {e}"));
        assert_eq!(view.reserved, result.peak_reserved);
    }
    // Stack frames, where lines carry them, survive a write and a read.
    let mut written = Vec::new();
    trace.write(&mut written).expect("writing to memory");
    let again = Trace::read(written.as_slice()).expect("a written trace reads back");
    assert_eq!(again, trace);
    let head = trace.prefix(trace.len() / 2);
    assert!(head.peak_live() <= trace.peak_live());
    // The event bound admits exactly the traces that fit it.
    let events = trace.len() as u64;
    let within = |max_events| {
        let limits = ReadLimits {
            max_events: Some(max_events),
            max_bytes: None,
        };
        Trace::read_limited(data, limits)
    };
    assert_eq!(within(events).ok().as_ref(), Some(&trace));
    if events > 0 {
        assert!(matches!(
            within(events - 1),
            Err(TraceError::TooLarge {
                bound: "max_events",
                ..
            })
        ));
    }
    true
}

/// The tensor and parameter-dict readers: what reads writes back to the same bytes
/// (bool's old encoding aside), and reads again to the same tensors. Returns whether
/// either reader accepted the input.
pub fn tensor_readers(data: &[u8]) -> bool {
    let mut accepted = false;
    if let Ok(tensor) = read_tensor(&mut SliceSource::new(data)) {
        let mut out = Vec::new();
        write_tensor(&tensor, &mut out).expect("a tensor that reads writes");
        let again = read_tensor(&mut SliceSource::new(&out)).expect("a written tensor reads");
        assert_eq!(again.shape(), tensor.shape());
        assert_eq!(again.dtype(), tensor.dtype());
        assert_eq!(again.to_bytes().ok(), tensor.to_bytes().ok());
        accepted = true;
    }
    if let Ok(params) = read_param_dict(&mut SliceSource::new(data)) {
        let mut out = Vec::new();
        write_param_dict(&params, &mut out).expect("a dict that reads writes");
        let again = read_param_dict(&mut SliceSource::new(&out)).expect("a written dict reads");
        assert_eq!(again.len(), params.len());
        for ((name, a), (again_name, b)) in params.iter().zip(&again) {
            assert_eq!(name, again_name);
            assert_eq!(a.shape(), b.shape());
            assert_eq!(a.to_bytes().ok(), b.to_bytes().ok());
        }
        accepted = true;
    }
    accepted
}

/// MiniMalloc CSV (`cubepool place`): text that reads (under any header form
/// MiniMalloc's reader takes) writes back to output that reads to the same buffers, and
/// becomes a problem or a typed error; a small one is placed (briefly) and its placement passes the checker and
/// writes one line per buffer. Returns whether the input read.
pub fn placement_csv(data: &[u8]) -> bool {
    use cubepool::placement::csv::{read_csv, write_csv};
    use cubepool::placement::{check_placement, place, PlaceOptions, Problem};
    let Ok(read) = read_csv(data) else {
        return false;
    };
    // What reads, under any header MiniMalloc's reader takes, writes back (half-open,
    // under `id,lower,upper,size,offset`) and reads again to the same buffers.
    let mut written = Vec::new();
    let zeros = vec![0; read.buffers.len()];
    write_csv(&mut written, &read.ids, &read.buffers, &zeros).expect("write to memory");
    assert_eq!(read_csv(&written).as_ref(), Ok(&read));
    let Ok(problem) = Problem::new(read.buffers.clone()) else {
        return true;
    };
    if problem.len() <= 32 {
        let options = PlaceOptions {
            capacity: None,
            time_limit: std::time::Duration::from_millis(1),
        };
        let placed = place(&problem, &options).expect("a placement without capacity");
        let height = check_placement(problem.buffers(), &placed.offsets, None)
            .expect("placements pass the checker");
        assert_eq!(height, placed.height);
        assert!(height >= problem.lower_bound());
        let mut out = Vec::new();
        write_csv(&mut out, &read.ids, &read.buffers, &placed.offsets).expect("write to memory");
        assert_eq!(
            out.iter().filter(|&&c| c == b'\n').count(),
            problem.len() + 1
        );
    }
    true
}

/// The plan file reader and the planned pool: a plan that reads writes back to the same
/// plan, and (when small) a pool following it serves its own phases twice over, then a
/// stream the input's bytes make, with its invariants (no two live blocks share a byte)
/// checked after every operation. Returns whether the input read as a plan.
pub fn plan_file(data: &[u8]) -> bool {
    use cubepool::plan_file::{LoadedPlan, Plan};
    use cubepool::pool::{MemoryPool, PlannedPool};
    let Ok(text) = std::str::from_utf8(data) else {
        return false;
    };
    let Ok(plan) = Plan::from_json(text) else {
        return false;
    };
    assert_eq!(Plan::from_json(&plan.to_json()).as_ref(), Ok(&plan));
    let requests: usize = plan.phases.iter().map(|phase| phase.requests.len()).sum();
    if requests > 64 || plan.height > 1 << 20 {
        return true;
    }
    let mut sizes: Vec<u64> = Vec::new();
    for phase in &plan.phases {
        sizes.extend(phase.requests.iter().map(|&(size, _)| size));
        sizes.push(0); // a step boundary
    }
    sizes.extend(data.iter().take(64).map(|&b| u64::from(b) * 97));
    let loaded = std::sync::Arc::new(LoadedPlan {
        file: "fuzz".into(),
        plan,
    });
    let mut pool = PlannedPool::following(loaded, 4096, 1 << 30, 64);
    let mut storage = cubepool::VirtualStorage::new().with_granularity(4096);
    let mut live = Vec::new();
    for (index, &size) in sizes.iter().chain(sizes.iter()).enumerate() {
        if size == 0 {
            pool.step();
        } else if let Ok(placement) = pool.reserve(&mut storage, size) {
            live.push(placement.slot);
        }
        if index % 3 == 2 && !live.is_empty() {
            let slot = live.swap_remove(index % live.len());
            pool.release_with(&mut storage, slot).expect("a live slot");
        }
        pool.check_invariants()
            .expect("the planned pool's invariants hold");
    }
    true
}

/// The pickle opcode reader of the restricted unpickler (`trace::pickle_ops`, the half
/// without Python): it reads to `STOP` or a typed error, never past the data, and every
/// argument it hands out is exactly the bytes of its opcode (a counted or fixed argument
/// ends where the next opcode starts; a line, one byte before, at its `\n`). Reading the
/// accepted prefix alone gives the same opcodes. Returns whether a `STOP` was reached.
pub fn pickle_ops(data: &[u8]) -> bool {
    use cubepool::trace::pickle_ops::{Op, Ops, Refused};
    let base = data.as_ptr() as usize;
    let mut ops = Ops::new(data);
    let mut read = Vec::new();
    loop {
        let start = ops.position();
        let Ok(op) = ops.next_op() else {
            return false;
        };
        let end = ops.position();
        assert!(start < end && end <= data.len(), "{op:?} at {start}..{end}");
        // Where an argument's bytes must end: at the opcode's end, or before its '\n'.
        let ends_at = |bytes: &[u8], at: usize| {
            let from = bytes.as_ptr() as usize - base;
            assert_eq!(from + bytes.len(), at, "{op:?} at {start}..{end}");
            assert!(from > start, "{op:?}: its argument starts at its opcode");
        };
        match op {
            Op::Long(b) | Op::Unicode(b) | Op::String(b) | Op::Bytes(b) | Op::ByteArray(b) => {
                ends_at(b, end)
            }
            Op::IntLine(b)
            | Op::LongLine(b)
            | Op::FloatLine(b)
            | Op::UnicodeLine(b)
            | Op::StringLine(b) => {
                ends_at(b, end - 1);
                assert_eq!(data[end - 1], b'\n');
            }
            Op::Refused(Refused::Global { name, .. } | Refused::Inst { name, .. }) => {
                ends_at(name, end - 1)
            }
            _ => {}
        }
        read.push((op, start, end));
        if op == Op::Stop {
            break;
        }
    }
    let accepted = &data[..ops.position()];
    let mut again = Ops::new(accepted);
    for &(op, start, end) in &read {
        assert_eq!(again.position(), start);
        let op_again = again.next_op().expect("the accepted prefix reads again");
        assert_eq!(format!("{op_again:?}"), format!("{op:?}"));
        assert_eq!(again.position(), end);
    }
    true
}
