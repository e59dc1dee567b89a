//! The fuzz targets on stable Rust: every file of each target's corpus
//! (`fuzz/corpus/<target>/`), then a bounded number of deterministic mutations of them
//! (bit flips, byte changes, insertions, deletions, truncations, splices), through the
//! same bodies the cargo-fuzz binaries run (`fuzz/targets.rs`). This is the smoke run
//! `scripts/test` does in seconds; the long, coverage-guided run is cargo-fuzz's (see
//! `fuzz/README.md`).

#[path = "../fuzz/targets.rs"]
mod targets;

use std::path::PathBuf;

/// Mutations per target in the smoke run (a few seconds in a debug build).
const MUTATIONS: usize = 20_000;

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    let inputs: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    assert!(
        inputs.len() >= 8,
        "{} holds only {} inputs",
        dir.display(),
        inputs.len()
    );
    inputs
}

/// A small deterministic generator (xorshift64*), so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One mutation of `input`, splicing from `other` sometimes.
fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(7) {
            0 if !out.is_empty() => {
                let i = at.min(out.len() - 1);
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let i = at.min(out.len() - 1);
                // Interesting bytes: the edges of signed and unsigned ranges, digits.
                out[i] = [0, 0xff, 0x7f, 0x80, b'0', b'9', b'-', b'"'][rng.below(8)];
            }
            2 => out.insert(at, rng.next() as u8),
            3 if !out.is_empty() => {
                let end = (at + rng.below(16)).min(out.len());
                out.drain(at.min(end)..end);
            }
            4 => out.truncate(at),
            5 if !other.is_empty() => {
                let start = rng.below(other.len());
                let end = (start + rng.below(64)).min(other.len());
                out.splice(at..at, other[start..end].iter().copied());
            }
            _ => {
                // A long run of digits: the extremes of numbers in text formats.
                let digits: Vec<u8> = (0..rng.below(24))
                    .map(|_| b'0' + rng.below(10) as u8)
                    .collect();
                out.splice(at..at, digits);
            }
        }
    }
    out
}

/// Runs the corpus and the mutations through `body`, which returns whether it accepted
/// an input; both must have accepted some (a body that refuses everything tests
/// nothing past its first check).
fn smoke(target: &str, body: fn(&[u8]) -> bool, seed: u64) {
    let inputs = corpus(target);
    let accepted = inputs.iter().filter(|input| body(input)).count();
    assert!(accepted > 0, "{target}: no corpus input was accepted");
    let mut rng = Rng(seed);
    let mut mutants_accepted = 0;
    for _ in 0..MUTATIONS {
        let input = &inputs[rng.below(inputs.len())];
        let other = &inputs[rng.below(inputs.len())];
        mutants_accepted += usize::from(body(&mutate(&mut rng, input, other)));
    }
    assert!(mutants_accepted > 0, "{target}: no mutation was accepted");
    println!(
        "{target}: {accepted} of {} corpus inputs and {mutants_accepted} of {MUTATIONS} \
         mutations accepted",
        inputs.len()
    );
}

#[test]
fn config_language_corpus_and_mutations() {
    smoke(
        "config_language",
        targets::config_language,
        0x9e37_79b9_7f4a_7c15,
    );
}

#[test]
fn trace_replay_corpus_and_mutations() {
    smoke("trace_replay", targets::trace_replay, 0xd1b5_4a32_d192_ed03);
}

#[test]
fn tensor_readers_corpus_and_mutations() {
    smoke(
        "tensor_readers",
        targets::tensor_readers,
        0x94d0_49bb_1331_11eb,
    );
}

#[test]
fn pickle_ops_corpus_and_mutations() {
    smoke("pickle_ops", targets::pickle_ops, 0x2545_f491_4f6c_dd1d);
}

#[test]
fn placement_csv_corpus_and_mutations() {
    smoke(
        "placement_csv",
        targets::placement_csv,
        0xbf58_476d_1ce4_e5b9,
    );
}

#[test]
fn plan_file_corpus_and_mutations() {
    smoke("plan_file", targets::plan_file, 0x2545_f491_4f6c_dd1d);
}

#[test]
fn the_plan_file_corpus_holds_each_field_read_and_refused() {
    // The seeds of the plan file's optional fields: a cycle the target reads and
    // follows, and cycles it refuses (past the phases, zero), so that mutations start
    // from both sides of the check.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/plan_file");
    let seed = |name: &str| std::fs::read(dir.join(name)).unwrap();
    assert!(
        targets::plan_file(&seed("cycle.json")),
        "a cycle of 2 is read"
    );
    assert!(
        !targets::plan_file(&seed("bad_cycle.json")),
        "a cycle past the phases"
    );
    assert!(
        !targets::plan_file(&seed("zero_cycle.json")),
        "a cycle of 0"
    );
}
