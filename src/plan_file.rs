//! Plan files: a placement of one run's requests that the `planned` pool follows.
//!
//! A plan file is JSON, versioned:
//!
//! ```json
//! {"format": "cubepool-plan", "version": 1, "height": 3072,
//!  "phases": [{"name": "setup", "requests": [[1024, 0]]},
//!             {"name": "step0", "requests": [[2048, 1024], [1024, 0]], "optional": [0]}]}
//! ```
//!
//! Each phase lists its requests in the order a run makes them, each as `[size, offset]`:
//! the `k`-th request of `size` bytes in phase `p` is planned at `offset` of the arena when
//! it is the `k`-th request of that size among the phase's entries. At run time, phase `p`
//! is the part of the run after `p` step boundaries (`mm.step()`, or a trace's phase
//! starts in a replay); phases past the plan's last follow its last one (the steady
//! step), or, where the plan gives a `"cycle"` of `n` phases (1 by default), its last `n`
//! phases in turn: with `m` phases, run phase `p >= m` follows plan phase
//! `m - n + (p - (m - n)) % n` (a cycle of 2 after phases `setup, step0, A, B`: steps
//! 1, 2, 3, 4, ... follow `A, B, A, B, ...`). A cycle lets later steps alternate placements, so
//! that a block each step makes again while the last step's copy still lives can take
//! turns between two regions without either being held for a whole step. `height` is the arena's size: every `offset + size` is at most it. A phase's
//! `"optional"` lists the indices of requests a run may not make (a block the plan's
//! first step kept, which a later step may make again or not): where a live block holds
//! an optional request's bytes, the matching skips it and tries the next of that size.
//! A phase's optional `"ends"` gives, for each request, where its block's planned
//! lifetime ends: the position (among the phase's requests that are not optional) of
//! the first request made after the block is freed; the phase's length or more where
//! the block outlives the phase. Where a request's own entry is held (a block freed
//! late, requests of a size made in another order), the pool may place it at another
//! entry of its size whose planned lifetime does not meet the one it was planned
//! with (see [`crate::pool::PlannedPool`]).
//! An optional `"kept"` lists `[size, offset]` regions planned for blocks the plan's
//! run keeps to its end (optimizer state, a cache, the gradients a step leaves): each
//! region is held from its block's request on, so no later entry of the plan overlaps
//! it. From the plan's cycle on (its last phase, the steady step, by default), a
//! request that its own entry cannot serve may take a kept region of its size whose
//! block a live block no longer holds (a later step requesting such a block again, or
//! in another order). (A hand-made plan whose cycle takes in the phase that first
//! requests a kept block lets an earlier request take that block's region: the plan's
//! own entry then misses, as any entry whose bytes are held does; nothing overlaps.
//! The planner's cycles start after the phase that keeps them.) An optional
//! `"source"` string says where the plan came from, and an optional `"granule"` the
//! arena granule (bytes) the plan was chosen with: the pool takes its granule from the
//! layout (`planned(file=..., granule=...)`), and cubepool's Python layer, given a plan
//! file as a layout, names this one there. An optional `"peaks"` lists `[granule, bytes]`:
//! the most bytes of `granule`-byte granules the plan's blocks touch at once when a run
//! follows it (each granule at most the height rounded up to it). A run that follows the
//! plan maps that much anyway, so the pool keeps idle runs mapped up to it from the
//! start instead of unmapping and mapping them again as it grows (see
//! [`crate::pool::PlannedPool`]).
//!
//! Reading never panics: every malformed file is a [`PlanFileError`] naming the file and
//! a [`PlanProblem`]. Loaded plans are interned ([`load_plan`]): a pool layout names one
//! by a small copyable [`PlanId`], and two loads of the same file with the same content
//! give the same id. Interned plans live as long as the process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use serde::Deserialize;
use thiserror::Error;

// Names and serde's messages from a plan file are cut short in errors, so that a name
// of megabytes makes no message of them.
use crate::config::text::{cut_short, quoted_prefix};

/// The `format` field every plan file carries.
pub const PLAN_FORMAT: &str = "cubepool-plan";
/// The plan file version this build reads and writes.
pub const PLAN_VERSION: u64 = 1;
/// The largest plan file read: 256 MiB. A plan takes about 20 bytes per request (a
/// trace of a million allocations plans in about 20 MB), and what is built from it
/// takes up to about ten times its bytes (a request of six bytes, `[1,0],`, is 16 bytes
/// parsed and its entry in the pool's lookup more), so the bound is also one on memory.
pub const MAX_PLAN_BYTES: u64 = 1 << 28;
/// The most phases a plan may have: 1,048,576. A plan has a phase per step it follows
/// (a few, or, derived on every step, as many as a trace's header can name: some
/// hundreds of thousands in its 16 MiB); an empty phase is eight bytes of file
/// (`["",[]],`) and about a hundred parsed, so a file of nothing else is refused by its
/// count before it takes more than about a hundred MiB.
pub const MAX_PLAN_PHASES: usize = 1 << 20;

/// One phase of a plan: its requests, in the order a run makes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanPhase {
    /// The phase's name (`setup`, `step0`, ...), for messages.
    pub name: String,
    /// Each request as `(size, offset)`, in request order.
    pub requests: Vec<(u64, u64)>,
    /// The indices of the requests a run may not make, ascending.
    pub optional: Vec<usize>,
    /// Where each request's planned lifetime ends (see the module documentation);
    /// empty where the plan does not say.
    pub ends: Vec<usize>,
}

impl PlanPhase {
    /// A phase of `requests` (`(size, offset)` in request order), none optional.
    pub fn new(name: impl Into<String>, requests: Vec<(u64, u64)>) -> Self {
        Self {
            name: name.into(),
            requests,
            optional: Vec::new(),
            ends: Vec::new(),
        }
    }
}

/// A placement of one run's requests, phase by phase (see the [module
/// documentation](self)). Invariant (checked by [`Plan::from_json`]): every request's
/// size is positive and `offset + size <= height`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The bytes of the arena the offsets are in.
    pub height: u64,
    /// The phases, in run order.
    pub phases: Vec<PlanPhase>,
    /// How many of the last phases the steps after the last phase follow in turn (see
    /// the module documentation): 1 (the last phase repeats) by default. Invariant
    /// (checked by [`Plan::from_json`]): from 1 to `max(phases, 1)`; a pool, and
    /// [`Plan::to_json`], clamp a value built otherwise into that range.
    pub cycle: usize,
    /// Regions `(size, offset)` planned for blocks the run keeps to its end (held from
    /// their request on; see the module documentation).
    pub kept: Vec<(u64, u64)>,
    /// Where the plan came from, if said.
    pub source: Option<String>,
    /// The arena granule the plan was chosen with, if said (see the module
    /// documentation; the pool does not read it).
    pub granule: Option<u64>,
    /// `(granule, bytes)`: the most bytes of such granules the plan's blocks touch at
    /// once (see the module documentation). Invariant (checked by [`Plan::from_json`]):
    /// each granule is positive and its bytes at most the height rounded up to it.
    pub peaks: Vec<(u64, u64)>,
}

/// What is wrong with a plan file.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PlanProblem {
    /// A name the pools configuration language cannot write back in
    /// `planned(file=...)` (see [`writable_plan_name`]): a layout following the plan
    /// would print as text that names another file.
    #[error("is a name the pools language cannot write (it holds , ( ) ; = # or a new line, or starts or ends with spaces)")]
    UnwritableName,
    /// The file could not be read.
    #[error("cannot be read: {reason}")]
    Unreadable {
        /// The operating system's reason.
        reason: String,
    },
    /// The text is not the JSON of a plan (syntax, a missing or unknown field, a
    /// value of the wrong type).
    #[error("is not a plan (line {line}, column {column}): {reason}")]
    Json {
        /// The line of the problem, from 1.
        line: usize,
        /// The column of the problem, from 1.
        column: usize,
        /// serde's description of it.
        reason: String,
    },
    /// The `format` field is not `cubepool-plan`.
    #[error("has format {found:?}, expected \"cubepool-plan\"")]
    Format {
        /// The format named.
        found: String,
    },
    /// A version this build does not read.
    #[error("has version {found}; this build reads version 1")]
    Version {
        /// The version named.
        found: u64,
    },
    /// A request (or a kept region: phase `"kept"`) of zero bytes.
    #[error("request {index} of phase {phase:?} has size 0")]
    ZeroSize {
        /// The phase's name.
        phase: String,
        /// The request's index in the phase.
        index: usize,
    },
    /// An optional index that names no request of its phase.
    #[error("phase {phase:?} marks request {index} optional, but has {len} requests")]
    OptionalPastEnd {
        /// The phase's name.
        phase: String,
        /// The index given.
        index: usize,
        /// The phase's number of requests.
        len: usize,
    },
    /// `"ends"` not one per request.
    #[error("phase {phase:?} gives {found} ends for {len} requests")]
    EndsLength {
        /// The phase's name.
        phase: String,
        /// The ends given.
        found: usize,
        /// The phase's number of requests.
        len: usize,
    },
    /// A request (or a kept region: phase `"kept"`) whose bytes end past the arena.
    #[error(
        "request {index} of phase {phase:?} ({size} bytes at offset {offset}) ends past the \
         height {height}"
    )]
    PastHeight {
        /// The phase's name.
        phase: String,
        /// The request's index in the phase.
        index: usize,
        /// Its size.
        size: u64,
        /// Its offset.
        offset: u64,
        /// The plan's height.
        height: u64,
    },
    /// A `"cycle"` of zero phases, or of more phases than the plan has.
    #[error("has a cycle of {cycle} phases, where 1 to max({phases} phases, 1) is allowed")]
    Cycle {
        /// The cycle given.
        cycle: usize,
        /// The plan's number of phases.
        phases: usize,
    },
    /// A peak of mapped bytes past the height (rounded up to its granule), or of a zero
    /// granule.
    #[error("its peak of {bytes} bytes of {granule}-byte granules passes the height {height}")]
    PeakPastHeight {
        /// The granule.
        granule: u64,
        /// The peak.
        bytes: u64,
        /// The plan's height.
        height: u64,
    },
}

/// A plan file that could not be read: the file, and the problem.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("plan file {file}: {problem}")]
pub struct PlanFileError {
    /// The file, as named.
    pub file: String,
    /// What is wrong with it.
    pub problem: PlanProblem,
}

/// The file's JSON, as serde reads it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlan {
    format: String,
    version: u64,
    height: u64,
    #[serde(deserialize_with = "bounded_phases")]
    phases: Vec<RawPhase>,
    #[serde(default)]
    cycle: Option<usize>,
    #[serde(default)]
    kept: Vec<(u64, u64)>,
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    granule: Option<u64>,
    #[serde(default)]
    peaks: Vec<(u64, u64)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPhase {
    name: String,
    requests: Vec<(u64, u64)>,
    #[serde(default)]
    optional: Vec<usize>,
    #[serde(default)]
    ends: Vec<usize>,
}

/// The phases of a plan file, refused past [`MAX_PLAN_PHASES`] as they are read.
fn bounded_phases<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<RawPhase>, D::Error> {
    struct Bounded;
    impl<'de> serde::de::Visitor<'de> for Bounded {
        type Value = Vec<RawPhase>;

        fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(formatter, "a list of at most {MAX_PLAN_PHASES} phases")
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut phases = Vec::new();
            while let Some(phase) = seq.next_element()? {
                if phases.len() == MAX_PLAN_PHASES {
                    return Err(serde::de::Error::custom(format!(
                        "more than {MAX_PLAN_PHASES} phases"
                    )));
                }
                phases.push(phase);
            }
            Ok(phases)
        }
    }
    deserializer.deserialize_seq(Bounded)
}

/// The most characters of serde's description of a problem an error keeps.
const MAX_REASON_CHARS: usize = 300;

impl Plan {
    /// Reads a plan from its JSON text; the error says what is wrong (the caller adds
    /// the file's name).
    pub fn from_json(text: &str) -> Result<Self, PlanProblem> {
        let raw: RawPlan = serde_json::from_str(text).map_err(|error| PlanProblem::Json {
            line: error.line(),
            column: error.column(),
            // serde quotes a value of the wrong type whole: cut short.
            reason: cut_short(&error.to_string(), MAX_REASON_CHARS),
        })?;
        if raw.format != PLAN_FORMAT {
            return Err(PlanProblem::Format {
                found: quoted_prefix(&raw.format),
            });
        }
        if raw.version != PLAN_VERSION {
            return Err(PlanProblem::Version { found: raw.version });
        }
        for phase in &raw.phases {
            if let Some(&index) = phase.optional.iter().find(|&&i| i >= phase.requests.len()) {
                return Err(PlanProblem::OptionalPastEnd {
                    phase: quoted_prefix(&phase.name),
                    index,
                    len: phase.requests.len(),
                });
            }
            if !phase.ends.is_empty() && phase.ends.len() != phase.requests.len() {
                return Err(PlanProblem::EndsLength {
                    phase: quoted_prefix(&phase.name),
                    found: phase.ends.len(),
                    len: phase.requests.len(),
                });
            }
            check_requests(&phase.name, &phase.requests, raw.height)?;
        }
        check_requests(KEPT, &raw.kept, raw.height)?;
        let cycle = raw.cycle.unwrap_or(1);
        if cycle == 0 || cycle > raw.phases.len().max(1) {
            return Err(PlanProblem::Cycle {
                cycle,
                phases: raw.phases.len(),
            });
        }
        for &(granule, bytes) in &raw.peaks {
            // At most the height rounded up to the granule (compared in granules, so
            // that no product overflows).
            if granule == 0 || bytes.div_ceil(granule) > raw.height.div_ceil(granule) {
                return Err(PlanProblem::PeakPastHeight {
                    granule,
                    bytes,
                    height: raw.height,
                });
            }
        }
        Ok(Self {
            height: raw.height,
            phases: raw
                .phases
                .into_iter()
                .map(|phase| {
                    let mut optional = phase.optional;
                    optional.sort_unstable();
                    optional.dedup();
                    PlanPhase {
                        name: phase.name,
                        requests: phase.requests,
                        optional,
                        ends: phase.ends,
                    }
                })
                .collect(),
            cycle,
            kept: raw.kept,
            source: raw.source,
            granule: raw.granule,
            peaks: raw.peaks,
        })
    }

    /// The plan as the JSON text of a plan file (reads back to the same plan).
    pub fn to_json(&self) -> String {
        let phases: Vec<serde_json::Value> = self
            .phases
            .iter()
            .map(|phase| {
                let mut value = serde_json::json!({"name": phase.name, "requests": phase.requests});
                if !phase.optional.is_empty() {
                    value["optional"] = serde_json::json!(phase.optional);
                }
                if !phase.ends.is_empty() {
                    value["ends"] = serde_json::json!(phase.ends);
                }
                value
            })
            .collect();
        let mut value = serde_json::json!({
            "format": PLAN_FORMAT,
            "version": PLAN_VERSION,
            "height": self.height,
            "phases": phases,
        });
        // Clamped as a pool clamps it, so that the file reads back (from_json's range).
        let cycle = self.cycle.clamp(1, self.phases.len().max(1));
        if cycle != 1 {
            value["cycle"] = serde_json::json!(cycle);
        }
        if !self.kept.is_empty() {
            value["kept"] = serde_json::json!(self.kept);
        }
        if let Some(source) = &self.source {
            value["source"] = serde_json::Value::String(source.clone());
        }
        if let Some(granule) = self.granule {
            value["granule"] = serde_json::json!(granule);
        }
        if !self.peaks.is_empty() {
            value["peaks"] = serde_json::json!(self.peaks);
        }
        value.to_string()
    }

    /// Reads the plan file at `path`: a regular file of at most [`MAX_PLAN_BYTES`]
    /// (so a layout naming a device or a pipe fails instead of reading forever).
    pub fn read(path: &str) -> Result<Self, PlanFileError> {
        use std::io::Read;
        let error = |problem| PlanFileError {
            file: path.to_string(),
            problem,
        };
        let unreadable = |reason: String| error(PlanProblem::Unreadable { reason });
        // Opened without waiting (a FIFO's open waits for a writer: a layout naming
        // one waited forever), then looked at: what is read is what was looked at.
        let (file, metadata) = crate::regular_file::open_regular(std::path::Path::new(path))
            .map_err(|e| match e {
                crate::regular_file::OpenRegularError::Io(io) => unreadable(io.to_string()),
                crate::regular_file::OpenRegularError::NotRegular(kind) => {
                    unreadable(format!("it is {kind}, not a regular file"))
                }
            })?;
        if metadata.len() > MAX_PLAN_BYTES {
            return Err(unreadable(format!(
                "it holds {} bytes, more than a plan file may ({MAX_PLAN_BYTES})",
                metadata.len()
            )));
        }
        let mut text = String::new();
        file.take(MAX_PLAN_BYTES)
            .read_to_string(&mut text)
            .map_err(|io| unreadable(crate::regular_file::read_error(io).to_string()))?;
        Self::from_json(&text).map_err(error)
    }

    /// Each phase's planned offsets by size, in request order, each with whether it is
    /// optional and its position among all the phase's requests: what the `planned`
    /// pool looks requests up in.
    pub(crate) fn offsets_by_size(&self) -> Vec<HashMap<u64, Vec<PlanEntry>>> {
        self.phases
            .iter()
            .map(|phase| {
                let mut by_size: HashMap<u64, Vec<PlanEntry>> = HashMap::new();
                let mut position = 0;
                for (index, &(size, offset)) in phase.requests.iter().enumerate() {
                    let optional = phase.optional.binary_search(&index).is_ok();
                    by_size.entry(size).or_default().push(PlanEntry {
                        offset,
                        optional,
                        position,
                        end: phase.ends.get(index).copied(),
                    });
                    position += usize::from(!optional);
                }
                by_size
            })
            .collect()
    }
}

/// The name the errors of a plan's `"kept"` regions give in place of a phase's.
const KEPT: &str = "kept";

/// Checks that every `(size, offset)` of `requests` (a phase's, or the kept regions,
/// named `name`) has a positive size and ends within `height`.
fn check_requests(name: &str, requests: &[(u64, u64)], height: u64) -> Result<(), PlanProblem> {
    for (index, &(size, offset)) in requests.iter().enumerate() {
        if size == 0 {
            return Err(PlanProblem::ZeroSize {
                phase: quoted_prefix(name),
                index,
            });
        }
        if offset.checked_add(size).is_none_or(|end| end > height) {
            return Err(PlanProblem::PastHeight {
                phase: quoted_prefix(name),
                index,
                size,
                offset,
                height,
            });
        }
    }
    Ok(())
}

/// One planned request as the `planned` pool looks it up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlanEntry {
    /// Its offset in the arena.
    pub offset: u64,
    /// Whether a run may not make it.
    pub optional: bool,
    /// Its position among the phase's requests that are not optional (an optional one
    /// has the position of the next that is not).
    pub position: usize,
    /// Where its planned lifetime ends (a position, as `position`), if the plan says.
    pub end: Option<usize>,
}

/// Names an interned plan (see [`load_plan`]); copyable, so pool layouts stay `Copy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlanId(u32);

impl PlanId {
    /// The id as a number (for the configuration language's reader).
    pub(crate) fn index(self) -> u64 {
        u64::from(self.0)
    }

    /// The id of number `index`, as [`PlanId::index`] gave it; an index no plan has
    /// names the first plan interned (the reader only passes back what it got).
    pub(crate) fn from_index(index: u64) -> Self {
        Self(u32::try_from(index).unwrap_or(0))
    }
}

/// A plan with the file it was read from.
#[derive(Debug, PartialEq, Eq)]
pub struct LoadedPlan {
    /// The file, as named in the layout.
    pub file: String,
    /// The plan.
    pub plan: Plan,
}

/// Every plan loaded so far, by id.
fn interned() -> &'static Mutex<Vec<Arc<LoadedPlan>>> {
    static PLANS: OnceLock<Mutex<Vec<Arc<LoadedPlan>>>> = OnceLock::new();
    PLANS.get_or_init(|| Mutex::new(Vec::new()))
}

/// Whether the pools configuration language can write `file` in `planned(file=...)`
/// and read it back as the same name: none of `,` `(` `)` `;` `=` `#` or a new line
/// (the language ends a value there), and no spaces at either end (it strips them).
pub fn writable_plan_name(file: &str) -> bool {
    !file.contains([',', '(', ')', ';', '=', '#', '\n']) && file == file.trim()
}

/// Interns `plan`, read from `file`: the same file and content give the same id. A
/// layout following it prints `file` as its name, which reads back only where
/// [`writable_plan_name`] says so ([`load_plan`] refuses other names).
pub fn intern_plan(file: &str, plan: Plan) -> PlanId {
    let loaded = LoadedPlan {
        file: file.to_string(),
        plan,
    };
    let mut plans = interned()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(index) = plans.iter().position(|known| **known == loaded) {
        return PlanId(index as u32);
    }
    plans.push(Arc::new(loaded));
    PlanId((plans.len() - 1) as u32)
}

/// Reads the plan file at `file` and interns it. A name [`writable_plan_name`]
/// refuses is [`PlanProblem::UnwritableName`]: the layout would not read back.
pub fn load_plan(file: &str) -> Result<PlanId, PlanFileError> {
    if !writable_plan_name(file) {
        return Err(PlanFileError {
            file: file.to_string(),
            problem: PlanProblem::UnwritableName,
        });
    }
    Ok(intern_plan(file, Plan::read(file)?))
}

/// The plan `id` names.
pub fn plan_of(id: PlanId) -> Arc<LoadedPlan> {
    let plans = interned()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // Ids are only made by `intern_plan`, which never removes a plan.
    Arc::clone(&plans[id.0 as usize])
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"format":"cubepool-plan","version":1,"height":3072,
        "phases":[{"name":"setup","requests":[[1024,0]]},
                  {"name":"step0","requests":[[2048,1024],[1024,0]],"optional":[1],"ends":[1,2]}],
        "kept":[[1024,2048]],"granule":4194304,"peaks":[[2048,4096]]}"#;

    #[test]
    fn a_plan_of_too_many_phases_is_refused_as_it_is_read() {
        // 40 million empty phases (320 MB, under the old 1 GiB bound) took 6 GB to
        // build, and aborted where the host had less.
        let phases = |count: usize| {
            let one = r#"["",[]]"#;
            format!(
                r#"{{"format":"cubepool-plan","version":1,"height":1,"phases":[{}]}}"#,
                vec![one; count].join(",")
            )
        };
        assert_eq!(
            Plan::from_json(&phases(MAX_PLAN_PHASES))
                .unwrap()
                .phases
                .len(),
            MAX_PLAN_PHASES
        );
        match Plan::from_json(&phases(MAX_PLAN_PHASES + 1)) {
            Err(PlanProblem::Json { reason, .. }) => {
                assert!(reason.contains("more than 1048576 phases"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_long_name_from_the_file_is_cut_short_in_its_error() {
        // A 5 MB phase name or format made a 5 MB message.
        let name = "n".repeat(1 << 20);
        let text = GOOD
            .replace("\"setup\"", &format!("\"{name}\""))
            .replace("[[1024,0]]},", "[[1024,4096]]},");
        let message = Plan::from_json(&text).unwrap_err().to_string();
        assert!(
            message.len() < 300 && message.contains("(1048576 bytes)"),
            "{}",
            &message[..200]
        );
        let text = GOOD.replace("cubepool-plan", &name);
        let message = Plan::from_json(&text).unwrap_err().to_string();
        assert!(message.len() < 300, "{}", &message[..200]);
        // serde's own message quotes a value of the wrong type whole.
        let text = GOOD.replace("3072", &format!("\"{name}\""));
        let message = Plan::from_json(&text).unwrap_err().to_string();
        assert!(
            message.len() < 500 && message.contains("invalid type"),
            "{}",
            &message[..200]
        );
    }

    #[test]
    fn a_cycle_reads_and_writes_back_and_old_files_repeat_the_last_phase() {
        let plan = Plan::from_json(GOOD).unwrap();
        assert_eq!(
            plan.cycle, 1,
            "a file without a cycle repeats its last phase"
        );
        assert!(
            !plan.to_json().contains("cycle"),
            "and is written as it was"
        );
        let cycled = GOOD.replacen("\"height\":3072,", "\"height\":3072,\"cycle\":2,", 1);
        let plan = Plan::from_json(&cycled).unwrap();
        assert_eq!(plan.cycle, 2);
        assert_eq!(Plan::from_json(&plan.to_json()).unwrap(), plan);
        // A plan built in code with a cycle out of range is written as a pool runs it.
        for (built, written) in [(0, 1), (7, 2)] {
            let odd = Plan {
                cycle: built,
                ..plan.clone()
            };
            let back = Plan::from_json(&odd.to_json()).unwrap();
            assert_eq!(back.cycle, written, "a cycle of {built} built in code");
        }
    }

    #[test]
    fn a_plan_reads_and_writes_back_the_same() {
        let plan = Plan::from_json(GOOD).unwrap();
        assert_eq!(plan.height, 3072);
        assert_eq!(plan.phases[1].requests, vec![(2048, 1024), (1024, 0)]);
        assert_eq!(plan.kept, vec![(1024, 2048)]);
        assert_eq!(plan.granule, Some(4 << 20));
        assert_eq!(plan.peaks, vec![(2048, 4096)]);
        assert_eq!(Plan::from_json(&plan.to_json()).unwrap(), plan);
        let by_size = plan.offsets_by_size();
        let entry = |offset, optional, position, end| PlanEntry {
            offset,
            optional,
            position,
            end,
        };
        assert_eq!(by_size[1][&1024], vec![entry(0, true, 1, Some(2))]);
        assert_eq!(by_size[1][&2048], vec![entry(1024, false, 0, Some(1))]);
        assert_eq!(by_size[0][&1024], vec![entry(0, false, 0, None)]);
    }

    #[test]
    fn bad_plans_name_their_problem() {
        let cases = [
            ("{", "Json"),
            (
                r#"{"format":"x","version":1,"height":1,"phases":[]}"#,
                "Format",
            ),
            (
                r#"{"format":"cubepool-plan","version":2,"height":1,"phases":[]}"#,
                "Version",
            ),
            (
                r#"{"format":"cubepool-plan","version":1,"height":1,"phases":[{"name":"a","requests":[[0,0]]}]}"#,
                "ZeroSize",
            ),
            (
                r#"{"format":"cubepool-plan","version":1,"height":8,"phases":[{"name":"a","requests":[[4,5]]}]}"#,
                "PastHeight",
            ),
            (
                r#"{"format":"cubepool-plan","version":1,"height":18446744073709551615,"phases":[{"name":"a","requests":[[4,18446744073709551614]]}]}"#,
                "PastHeight",
            ),
            (
                r#"{"format":"cubepool-plan","version":1,"height":8,"phases":[{"name":"a","requests":[[4,0]],"ends":[1,2]}]}"#,
                "EndsLength",
            ),
            (
                r#"{"format":"cubepool-plan","version":1,"height":8,"phases":[],"kept":[[0,0]]}"#,
                "ZeroSize { phase: \"kept\"",
            ),
            (
                r#"{"format":"cubepool-plan","version":1,"height":8,"phases":[],"kept":[[4,6]]}"#,
                "PastHeight { phase: \"kept\"",
            ),
            (
                r#"{"format":"cubepool-plan","version":1,"height":1,"phases":[],"x":1}"#,
                "Json",
            ),
            (
                r#"{"format":"cubepool-plan","version":1,"height":3000,"phases":[],"peaks":[[2048,6144]]}"#,
                "PeakPastHeight",
            ),
            (
                r#"{"format":"cubepool-plan","version":1,"height":8,"phases":[],"peaks":[[0,0]]}"#,
                "PeakPastHeight",
            ),
            (
                r#"{"format":"cubepool-plan","version":1,"height":8,"phases":[{"name":"a","requests":[]}],"cycle":0}"#,
                "Cycle",
            ),
            (
                r#"{"format":"cubepool-plan","version":1,"height":8,"phases":[{"name":"a","requests":[]}],"cycle":2}"#,
                "Cycle",
            ),
            (
                r#"{"format":"cubepool-plan","version":1,"height":8,"phases":[],"cycle":2}"#,
                "Cycle",
            ),
            (
                r#"{"format":"cubepool-plan","version":1,"height":8,"phases":[],"cycle":-1}"#,
                "Json",
            ),
        ];
        for (text, kind) in cases {
            let problem = Plan::from_json(text).unwrap_err();
            assert!(
                format!("{problem:?}").starts_with(kind),
                "{text}: {problem:?}"
            );
        }
        let missing = Plan::read("/nonexistent/plan.json").unwrap_err();
        assert!(missing
            .to_string()
            .starts_with("plan file /nonexistent/plan.json"));
    }

    #[test]
    fn interning_gives_one_id_per_file_and_content() {
        let plan = Plan::from_json(GOOD).unwrap();
        let a = intern_plan("a.json", plan.clone());
        assert_eq!(intern_plan("a.json", plan.clone()), a);
        assert_ne!(intern_plan("b.json", plan.clone()), a);
        assert_eq!(plan_of(a).plan, plan);
    }
}

#[cfg(test)]
mod name_tests {
    use super::*;

    #[test]
    fn a_plan_name_the_language_cannot_write_is_refused_before_it_is_read() {
        // A layout following /tmp/run,1/plan.json printed that name, which reads back as
        // /tmp/run (helper-141's find).
        for name in [
            "/tmp/run,1/plan.json",
            "a(b).json",
            "x;y",
            "k=v.json",
            "#p",
            " p.json",
        ] {
            let error = load_plan(name).unwrap_err();
            assert_eq!(error.problem, PlanProblem::UnwritableName, "{name:?}");
            assert!(!writable_plan_name(name));
        }
        assert!(writable_plan_name("/tmp/run 1/plan.json"));
    }
}
