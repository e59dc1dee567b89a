//! What code outside the crate can do with a `Trace`: read it through its accessors,
//! and make one only through the checked readers and `TraceBuilder`, so that every
//! trace it holds keeps the invariants the replay and the analyses index by.

use cubepool::trace::format::TraceBuilder;
use cubepool::trace::{
    Coverage, Phase, Recording, ReservedPoint, Trace, TraceError, TraceEvent, TraceHeader,
};

const TEXT: &str = "{\"format\":\"cubepool-trace\",\"version\":1,\"workload\":\"w\",\
                    \"model\":\"m\",\"phases\":[{\"name\":\"setup\",\"first_event\":0},\
                    {\"name\":\"step0\",\"first_event\":2}]}\n\
                    {\"t\":1,\"op\":\"alloc\",\"id\":7,\"size\":64,\"frames\":[\"f\",\"g\"]}\n\
                    {\"t\":2,\"op\":\"alloc\",\"id\":9,\"size\":100}\n\
                    {\"t\":3,\"op\":\"free\",\"id\":7}\n\
                    {\"t\":4,\"op\":\"alloc\",\"id\":7,\"size\":10}\n";

#[test]
fn the_accessors_read_the_dense_trace_the_reader_made() {
    let trace = Trace::read(TEXT.as_bytes()).unwrap();
    assert_eq!(trace.header().workload, "w");
    assert_eq!(trace.header().model, "m");
    assert_eq!(trace.header().phases.len(), 2);
    // The reader renames the file's ids 7, 9, 7 to the dense 0, 1, 2.
    assert_eq!(
        trace.events(),
        &[
            TraceEvent::Alloc {
                t: 1,
                id: 0,
                size: 64
            },
            TraceEvent::Alloc {
                t: 2,
                id: 1,
                size: 100
            },
            TraceEvent::Free { t: 3, id: 0 },
            TraceEvent::Alloc {
                t: 4,
                id: 2,
                size: 10
            },
        ]
    );
    assert_eq!(trace.allocations(), 3);
    assert_eq!(trace.sizes(), &[64, 100, 10]);
    assert_eq!(trace.sizes().len(), trace.allocations() as usize);
    assert_eq!(trace.peak_live(), 164);
    assert_eq!(trace.stacks().get(0), Some(vec!["f", "g"]));
    assert_eq!(trace.stacks().get(1), None);
    assert_eq!(trace.len(), trace.events().len());
}

#[test]
fn a_builder_makes_the_trace_the_reader_makes_of_the_same_events() {
    let read = Trace::read(TEXT.as_bytes()).unwrap();
    let mut builder = TraceBuilder::new(read.header().clone());
    builder
        .alloc_with_frames(1, 7, 64, Some(vec!["f".into(), "g".into()]))
        .unwrap();
    builder.alloc(2, 9, 100).unwrap();
    builder.free(3, 7).unwrap();
    builder.alloc(4, 7, 10).unwrap();
    let built = builder.finish().unwrap();
    assert_eq!(built, read);
    // What it writes reads back as itself.
    let mut written = Vec::new();
    built.write(&mut written).unwrap();
    assert_eq!(Trace::read(written.as_slice()).unwrap(), built);
}

#[test]
fn a_builder_refuses_events_that_would_break_the_invariants() {
    let mut builder = TraceBuilder::new(TraceHeader::default());
    builder.alloc(5, 1, 64).unwrap();
    // A free of an id that is not live, an id allocated twice while live, and a time
    // before the previous event's are each refused, naming what is wrong.
    let error = builder.free(6, 2).unwrap_err();
    assert!(error.contains("free of id 2, which is not live"), "{error}");
    let error = builder.alloc(6, 1, 8).unwrap_err();
    assert!(
        error.contains("alloc of id 1, which is already live"),
        "{error}"
    );
    let error = builder.free(4, 1).unwrap_err();
    assert!(error.contains("time goes backwards"), "{error}");
    // The refused events left nothing behind.
    assert_eq!(builder.len(), 1);
    let trace = builder.finish().unwrap();
    assert_eq!(
        (trace.allocations(), trace.sizes(), trace.peak_live()),
        (1, &[64][..], 64)
    );
}

/// Two events: an alloc and its free.
fn builder_with(header: TraceHeader) -> TraceBuilder {
    let mut builder = TraceBuilder::new(header);
    builder.alloc(1, 0, 64).unwrap();
    builder.free(2, 0).unwrap();
    builder
}

fn phase(name: &str, first_event: usize) -> Phase {
    Phase {
        name: name.into(),
        first_event,
        t: 0,
    }
}

/// Checks that `builder`'s `finish` refuses its header at the header's line, with a
/// message that says `what`.
fn assert_header_refused(builder: TraceBuilder, what: &str) {
    match builder.finish() {
        Err(TraceError::Parse { line: 1, message }) => {
            assert!(message.starts_with("malformed header: "), "{message}");
            assert!(message.contains(what), "{message}");
            // No file was read: the reader's hint would mislead.
            assert!(!message.contains("cut short"), "{message}");
        }
        other => panic!("expected a malformed header at line 1, got {other:?}"),
    }
}

#[test]
fn a_builder_refuses_a_header_whose_phases_or_recording_do_not_fit_its_events() {
    // A phase past the last event (a phase may start at the end, holding none).
    let past = TraceHeader {
        phases: vec![phase("setup", 0), phase("step0", 3)],
        ..TraceHeader::default()
    };
    assert_header_refused(
        builder_with(past),
        "phase \"step0\" starts at event 3, past the trace's 2 events",
    );
    // Phases out of order.
    let unordered = TraceHeader {
        phases: vec![phase("step0", 1), phase("setup", 0)],
        ..TraceHeader::default()
    };
    assert_header_refused(
        builder_with(unordered),
        "phase \"setup\" starts at event 0, before the phase \"step0\"",
    );
    // A recorded point past the last event.
    let point = |event| ReservedPoint {
        event,
        t: 0,
        reserved: 1 << 20,
    };
    let recorded = TraceHeader {
        recorded: Some(Recording {
            source: "test".into(),
            device: "cuda:0".into(),
            covers: Coverage::Start,
            expandable_segments: None,
            points: vec![point(0), point(5)],
            settings: None,
        }),
        ..TraceHeader::default()
    };
    assert_header_refused(
        builder_with(recorded),
        "recorded point 1 is at event 5, past the trace's 2 events",
    );
    // `set_header` is checked by `finish` as the header given to `new` is.
    let mut builder = builder_with(TraceHeader::default());
    builder.set_header(TraceHeader {
        phases: vec![phase("late", 9)],
        ..TraceHeader::default()
    });
    assert_header_refused(builder, "phase \"late\" starts at event 9");
    // A header that fits is kept, phases at the end included.
    let fits = TraceHeader {
        phases: vec![phase("setup", 0), phase("end", 2)],
        ..TraceHeader::default()
    };
    let trace = builder_with(fits.clone()).finish().unwrap();
    assert_eq!(trace.header(), &fits);
}

#[test]
fn check_header_refuses_as_finish_does_and_keeps_the_builder_to_finish_under_another() {
    let mut builder = builder_with(TraceHeader {
        phases: vec![phase("late", 9)],
        ..TraceHeader::default()
    });
    match builder.check_header() {
        Err(TraceError::Parse { line: 1, message }) => {
            assert!(
                message.contains("phase \"late\" starts at event 9"),
                "{message}"
            );
        }
        other => panic!("expected a malformed header at line 1, got {other:?}"),
    }
    assert_eq!(builder.len(), 2, "the events stay");
    let late = builder.set_header(TraceHeader::default());
    assert_eq!(
        late.phases,
        vec![phase("late", 9)],
        "set_header returns the old one"
    );
    builder.check_header().unwrap();
    assert_eq!(builder.finish().unwrap().events().len(), 2);
}

/// `TEXT` with its header's fields after the version replaced by `fields` (JSON).
fn text_with(fields: &str) -> String {
    let (_, events) = TEXT.split_once('\n').unwrap();
    format!("{{\"format\":\"cubepool-trace\",\"version\":1,{fields}}}\n{events}")
}

/// `TEXT` with its header's phases replaced by `phases` (a JSON list).
fn text_with_phases(phases: &str) -> String {
    text_with(&format!("\"phases\":{phases}"))
}

/// `TEXT` with a recording of points (`[event, t, reserved]`) at `events`.
fn text_with_points(events: &[usize]) -> String {
    let points: Vec<String> = events
        .iter()
        .map(|event| format!("[{event},0,1]"))
        .collect();
    text_with(&format!(
        "\"recorded\":{{\"source\":\"t\",\"device\":\"cuda:0\",\"covers\":\"start\",\
         \"points\":[{}]}}",
        points.join(",")
    ))
}

/// The message of `text`'s refusal at the header's line.
fn header_refusal(text: &str) -> String {
    match Trace::read(text.as_bytes()) {
        Err(TraceError::Parse { line: 1, message }) => message,
        other => panic!("expected a malformed header at line 1, got {other:?}"),
    }
}

#[test]
fn the_reader_hints_at_a_file_cut_short_only_where_the_header_names_events_past_its_end() {
    let past = header_refusal(&text_with_phases(
        r#"[{"name":"setup","first_event":0},{"name":"s","first_event":9}]"#,
    ));
    assert!(past.contains("past the trace's 4 events"), "{past}");
    assert!(past.ends_with("(a file cut short?)"), "{past}");
    let point_past = header_refusal(&text_with_points(&[0, 9]));
    assert!(
        point_past.contains("recorded point 1 is at event 9, past"),
        "{point_past}"
    );
    assert!(point_past.ends_with("(a file cut short?)"), "{point_past}");
    // Out of order: no hint, also where a later phase or point is past the end too.
    let unordered = r#"[{"name":"b","first_event":2},{"name":"a","first_event":1}]"#;
    let unordered_and_past = concat!(
        r#"[{"name":"b","first_event":2},{"name":"a","first_event":1},"#,
        r#"{"name":"c","first_event":9}]"#
    );
    for (text, what) in [
        (text_with_phases(unordered), "before the phase \"b\""),
        (
            text_with_phases(unordered_and_past),
            "before the phase \"b\"",
        ),
        (
            text_with_points(&[2, 1, 9]),
            "recorded point 1 is at event 1, before",
        ),
    ] {
        let message = header_refusal(&text);
        assert!(message.contains(what), "{message}");
        assert!(!message.contains("cut short"), "{message}");
    }
}

/// A trace of `events` allocations with a phase at each (a profiler trace of that many
/// steps converts to such a header) and `notes` of that many bytes.
fn trace_with_phases(events: usize, notes: usize) -> Trace {
    let header = TraceHeader {
        workload: "many steps".into(),
        notes: "n".repeat(notes),
        phases: (0..events)
            .map(|step| phase(&format!("ProfilerStep#{step}"), step))
            .collect(),
        ..TraceHeader::default()
    };
    let mut builder = TraceBuilder::new(header);
    for id in 0..events as u64 {
        builder.alloc(id, id, 64).unwrap();
    }
    builder.finish().unwrap()
}

#[test]
fn a_header_of_megabytes_of_phases_reads_back() {
    // 40,000 phases: a header line of about 2 MiB, over an event line's bound.
    let trace = trace_with_phases(40_000, 0);
    let mut text = Vec::new();
    trace.write(&mut text).unwrap();
    let header_line = text.split(|&b| b == b'\n').next().unwrap().len() as u64;
    assert!(
        header_line > cubepool::trace::format::MAX_LINE_BYTES,
        "{header_line}"
    );
    assert_eq!(Trace::read(text.as_slice()).unwrap(), trace);
}

#[test]
fn a_header_past_the_readers_bound_is_refused_by_the_writer_and_the_reader() {
    let bound = cubepool::trace::format::MAX_HEADER_BYTES as usize;
    let trace = trace_with_phases(2, bound);
    let mut text = Vec::new();
    let error = trace.write(&mut text).unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidData);
    assert!(
        error.to_string().contains("no reader would read it back"),
        "{error}"
    );
    assert!(text.is_empty(), "nothing is written");
    // A file with such a header (written by other means) is refused by its line bound.
    let line = format!(
        "{{\"format\":\"cubepool-trace\",\"version\":1,\"notes\":\"{}\"}}\n",
        "n".repeat(bound)
    );
    let refused = Trace::read(line.as_bytes()).unwrap_err().to_string();
    assert!(refused.contains("header line longer than"), "{refused}");
}

#[test]
fn a_header_at_the_bound_with_its_newline_reads_back_and_one_byte_more_is_refused() {
    let bound = cubepool::trace::format::MAX_HEADER_BYTES as usize;
    let with_notes = |notes: usize| {
        let mut builder = TraceBuilder::new(TraceHeader {
            notes: "n".repeat(notes),
            ..TraceHeader::default()
        });
        builder.alloc(0, 0, 8).unwrap();
        builder.finish().unwrap()
    };
    let header_line = |trace: &Trace| {
        let mut text = Vec::new();
        trace.write(&mut text).map(|()| text)
    };
    let base = header_line(&with_notes(0)).unwrap();
    let base_line = base.iter().position(|&b| b == b'\n').unwrap();
    // The line and its newline exactly at the bound.
    let fits = with_notes(bound - 1 - base_line);
    let text = header_line(&fits).unwrap();
    assert_eq!(text.iter().position(|&b| b == b'\n').unwrap() + 1, bound);
    assert_eq!(Trace::read(text.as_slice()).unwrap(), fits);
    let over = with_notes(bound - base_line);
    assert!(
        header_line(&over).is_err(),
        "one byte more is refused by the writer"
    );
}

#[test]
fn an_event_line_keeps_the_bound_of_a_line() {
    let bound = cubepool::trace::format::MAX_LINE_BYTES as usize;
    let text = format!(
        "{{\"format\":\"cubepool-trace\",\"version\":1}}\n\
         {{\"t\":1,\"op\":\"alloc\",\"id\":0,\"size\":8,\"pad\":\"{}\"}}\n",
        "x".repeat(bound)
    );
    let refused = Trace::read(text.as_bytes()).unwrap_err().to_string();
    assert!(refused.contains("line longer than"), "{refused}");
    assert!(!refused.contains("header line"), "{refused}");
}
