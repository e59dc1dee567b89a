//! The allocator's settings: [`TorchSettings`], read from and printed as
//! `PYTORCH_CUDA_ALLOC_CONF`-style model names, and [`TorchSettingsError`].

use std::fmt;

use super::{LARGE_BUFFER, MAX_REQUEST, MIB};

/// The size intervals of `roundup_power2_divisions` (PyTorch's
/// `kRoundUpPowerOfTwoIntervals`): interval `i` holds the sizes in [2^i MiB,
/// 2^(i+1) MiB), interval 0 every size under 2 MiB too, interval 15 every size from
/// 32 GiB ([`roundup_interval`]).
pub const ROUNDUP_INTERVALS: usize = 16;

/// The interval of `roundup_power2_divisions` that rounds `size` (PyTorch's
/// `roundup_power2_divisions(size)`): floor(log2(size)) - 20, clamped to 0..=15.
pub fn roundup_interval(size: u64) -> usize {
    let log = size.checked_ilog2().unwrap_or(0) as usize;
    log.saturating_sub(20).min(ROUNDUP_INTERVALS - 1)
}

/// The allocator's settings, as `PYTORCH_CUDA_ALLOC_CONF` spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TorchSettings {
    /// `expandable_segments:True`: one growing address range per pool.
    pub expandable_segments: bool,
    /// `max_split_size_mb`, in bytes: blocks this large are never split (None: no limit,
    /// PyTorch's default).
    pub max_split_size: Option<u64>,
    /// `roundup_power2_divisions`, one entry per size interval ([`roundup_interval`]):
    /// a size is rounded to the next of that many steps between the powers of two
    /// around it; 0 or 1 rounds to 512 B (PyTorch's default: 0 throughout). The setters
    /// keep each entry 0 or a power of two, as PyTorch does.
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
}

/// A model name or option that [`TorchSettings::parse`] or the setters refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TorchSettingsError {
    /// A name that is no comparison model.
    #[error("unknown model {name:?}: expected torch or torch_expandable, optionally with options such as torch(max_split_size_mb=128)")]
    UnknownModel {
        /// The name given.
        name: String,
    },
    /// An option the model does not have.
    #[error("unknown option {option:?} of the torch model: expected expandable_segments, max_split_size_mb or roundup_power2_divisions")]
    UnknownOption {
        /// The option given.
        option: String,
    },
    /// An option whose value is not of its kind.
    #[error("{option} takes {expected}, got {value:?}")]
    InvalidValue {
        /// The option.
        option: &'static str,
        /// What it takes.
        expected: &'static str,
        /// The value given.
        value: String,
    },
    /// `max_split_size_mb` under 20 (PyTorch refuses those: `parseMaxSplitSize`'s
    /// `val >= kLargeBuffer / kMB`; before its `AcceleratorAllocatorConfig` it refused 20
    /// too).
    #[error("max_split_size_mb must be at least 20 (as in PyTorch), got {mb}")]
    MaxSplitSizeTooSmall {
        /// The value given, in MiB.
        mb: u64,
    },
    /// `roundup_power2_divisions` that is no power of two (PyTorch refuses those).
    #[error("roundup_power2_divisions must be a power of two, got {divisions}")]
    DivisionsNotPowerOfTwo {
        /// The value given.
        divisions: u64,
    },
    /// A `roundup_power2_divisions` entry (`INTERVAL:DIVISIONS` of the list form, or an
    /// interval of the table given whole) whose divisions are neither 0 nor a power of
    /// two (PyTorch refuses those).
    #[error("roundup_power2_divisions entry {interval}:{divisions}: the divisions must be 0 or a power of two")]
    EntryDivisionsInvalid {
        /// The entry's interval, as given (`256`, `>`).
        interval: String,
        /// The divisions given.
        divisions: u64,
    },
    /// A `roundup_power2_divisions` list entry whose interval (in MiB) is no power of
    /// two (PyTorch refuses those).
    #[error("roundup_power2_divisions entry {interval_mb}: the interval must be a power of two (in MiB) or '>'")]
    IntervalNotPowerOfTwo {
        /// The interval given, in MiB.
        interval_mb: u64,
    },
    /// Text that is not `NAME` or `NAME(option=value, ...)`.
    #[error("expected {expected} in {text:?}")]
    Syntax {
        /// What was expected.
        expected: &'static str,
        /// The text.
        text: String,
    },
}

impl TorchSettings {
    /// The names of the comparison models [`TorchSettings::parse`] reads.
    pub const NAMES: [&'static str; 2] = ["torch", "torch_expandable"];

    /// PyTorch's defaults with `expandable_segments:True`.
    pub fn expandable() -> Self {
        Self {
            expandable_segments: true,
            ..Self::default()
        }
    }

    /// Sets `max_split_size_mb` (at least 20, as PyTorch requires; None: no limit).
    pub fn with_max_split_size_mb(mut self, mb: Option<u64>) -> Result<Self, TorchSettingsError> {
        self.max_split_size = match mb {
            None => None,
            Some(mb) if mb < LARGE_BUFFER / MIB => {
                return Err(TorchSettingsError::MaxSplitSizeTooSmall { mb })
            }
            // Sizes past MAX_REQUEST all behave alike: every request is under the limit.
            Some(mb) => Some(mb.saturating_mul(MIB).min(MAX_REQUEST * 2)),
        };
        Ok(self)
    }

    /// Sets `roundup_power2_divisions` for every size, as its scalar form
    /// (`roundup_power2_divisions:4`) does: a power of two; None: plain 512 B rounding
    /// (every entry 0, PyTorch's default).
    pub fn with_roundup_power2_divisions(
        mut self,
        divisions: Option<u64>,
    ) -> Result<Self, TorchSettingsError> {
        if let Some(divisions) = divisions {
            if !divisions.is_power_of_two() {
                return Err(TorchSettingsError::DivisionsNotPowerOfTwo { divisions });
            }
        }
        self.roundup_power2_divisions = [divisions.unwrap_or(0); ROUNDUP_INTERVALS];
        Ok(self)
    }

    /// Sets `roundup_power2_divisions` interval by interval ([`roundup_interval`]), as
    /// the list form and a snapshot's `allocator_settings` give them: each entry 0 or a
    /// power of two.
    pub fn with_roundup_power2_divisions_table(
        mut self,
        table: [u64; ROUNDUP_INTERVALS],
    ) -> Result<Self, TorchSettingsError> {
        for (index, &divisions) in table.iter().enumerate() {
            if divisions != 0 && !divisions.is_power_of_two() {
                return Err(TorchSettingsError::EntryDivisionsInvalid {
                    interval: (1u64 << index).to_string(),
                    divisions,
                });
            }
        }
        self.roundup_power2_divisions = table;
        Ok(self)
    }

    /// The `roundup_power2_divisions` that round `size` (its interval's entry).
    pub fn roundup_power2_divisions_for(&self, size: u64) -> u64 {
        self.roundup_power2_divisions[roundup_interval(size)]
    }

    /// The one `roundup_power2_divisions` of every interval, where they are all the
    /// same (0 at PyTorch's default); None where they differ.
    pub fn uniform_roundup_power2_divisions(&self) -> Option<u64> {
        let [first, rest @ ..] = &self.roundup_power2_divisions;
        rest.iter().all(|d| d == first).then_some(*first)
    }

    /// Reads a model name: `torch` or `torch_expandable` (case and `-` for `_` are
    /// ignored), optionally followed by options in parentheses, each `key=value` or
    /// `key:value` as `PYTORCH_CUDA_ALLOC_CONF` writes them: `expandable_segments`
    /// (True/False), `max_split_size_mb`, `roundup_power2_divisions` (one power of two
    /// for every size, or PyTorch's list `[256:1,512:2,>:8]`, whose commas stay inside
    /// its brackets: each entry `INTERVAL_MB:DIVISIONS`, the interval a power of two
    /// (its index log2 of it, at most 15) or `>`; the first numeric entry fills the
    /// intervals below its own too, `>` those after the last numeric entry's, as
    /// PyTorch's `c10/core/AllocatorConfig.cpp` reads it).
    pub fn parse(text: &str) -> Result<Self, TorchSettingsError> {
        let text = text.trim();
        let syntax = |expected| TorchSettingsError::Syntax {
            expected,
            text: text.to_string(),
        };
        let (name, options) = match text.find('(') {
            Some(open) => {
                let inner = text[open + 1..]
                    .strip_suffix(')')
                    .ok_or_else(|| syntax("')' at the end"))?;
                (&text[..open], Some(inner))
            }
            None => (text, None),
        };
        let mut settings = match name.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "torch" => Self::default(),
            "torch_expandable" => Self::expandable(),
            _ => {
                return Err(TorchSettingsError::UnknownModel {
                    name: name.trim().to_string(),
                })
            }
        };
        for option in split_options(options.unwrap_or(""), text)? {
            if option.trim().is_empty() {
                continue;
            }
            let (key, value) = option
                .split_once(['=', ':'])
                .ok_or_else(|| syntax("option=value"))?;
            let (key, value) = (key.trim(), value.trim());
            let number = |option: &'static str| {
                value
                    .parse::<u64>()
                    .map_err(|_| TorchSettingsError::InvalidValue {
                        option,
                        expected: "a whole number",
                        value: value.to_string(),
                    })
            };
            match key {
                "expandable_segments" => {
                    // Exactly as PyTorch's `toBool` takes them: `true` is refused there.
                    settings.expandable_segments = match value {
                        "True" => true,
                        "False" => false,
                        _ => {
                            return Err(TorchSettingsError::InvalidValue {
                                option: "expandable_segments",
                                expected: "True or False",
                                value: value.to_string(),
                            })
                        }
                    }
                }
                "max_split_size_mb" => {
                    settings =
                        settings.with_max_split_size_mb(Some(number("max_split_size_mb")?))?
                }
                "roundup_power2_divisions" => match value.strip_prefix('[') {
                    Some(list) => {
                        let list = list
                            .strip_suffix(']')
                            .ok_or_else(|| syntax("']' closing roundup_power2_divisions' list"))?;
                        let table = parse_divisions_list(list, settings.roundup_power2_divisions)?;
                        settings = settings.with_roundup_power2_divisions_table(table)?;
                    }
                    None => {
                        settings = settings.with_roundup_power2_divisions(Some(number(
                            "roundup_power2_divisions",
                        )?))?
                    }
                },
                other => {
                    return Err(TorchSettingsError::UnknownOption {
                        option: other.to_string(),
                    })
                }
            }
        }
        Ok(settings)
    }

    /// `max_split_size_mb` as given (None: no limit).
    pub fn max_split_size_mb(&self) -> Option<u64> {
        self.max_split_size.map(|bytes| bytes / MIB)
    }
}

/// Splits the options of a model name at its commas, except those inside a `[...]` list.
fn split_options<'a>(options: &'a str, text: &str) -> Result<Vec<&'a str>, TorchSettingsError> {
    let syntax = |expected| TorchSettingsError::Syntax {
        expected,
        text: text.to_string(),
    };
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (at, c) in options.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| syntax("'[' before ']'"))?
            }
            ',' if depth == 0 => {
                parts.push(&options[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(syntax("']' closing '['"));
    }
    parts.push(&options[start..]);
    Ok(parts)
}

/// Reads the list form of `roundup_power2_divisions` (the text between its brackets)
/// onto `table`, as PyTorch's `AcceleratorAllocatorConfig::parseRoundUpPower2Divisions`
/// (`c10/core/AllocatorConfig.cpp`, the source followed here) reads it onto its own:
///
/// * each entry is `INTERVAL:DIVISIONS`, the divisions 0 or a power of two;
/// * a numeric interval is in MiB and a power of two; its index is log2 of it, at most
///   15 ([`roundup_interval`]: `256` is the sizes in [256, 512) MiB); the first numeric
///   entry fills every interval below its own with its divisions too; each sets its
///   own interval;
/// * `>` fills the intervals after the last numeric entry's (after interval 0 where
///   none came before) to the end.
///
/// Intervals no entry sets keep their value (0, plain 512 B rounding, in a fresh
/// table). A trailing comma is taken, as PyTorch's tokenizer takes it. (PyTorch's
/// older `CUDAAllocatorConfig::parseRoundUpPower2Divisions` filled from the last
/// numeric entry's interval itself, so `[256:1,>:8]` gave 256 MiB 8 divisions there and
/// 1 here, as PyTorch does now; a snapshot's `allocator_settings` gives the table
/// itself.)
fn parse_divisions_list(
    list: &str,
    mut table: [u64; ROUNDUP_INTERVALS],
) -> Result<[u64; ROUNDUP_INTERVALS], TorchSettingsError> {
    let mut entries: Vec<&str> = list.split(',').map(str::trim).collect();
    if entries.last() == Some(&"") {
        entries.pop();
    }
    let (mut first, mut last_index) = (true, 0usize);
    for entry in entries {
        let bad = |expected| TorchSettingsError::InvalidValue {
            option: "roundup_power2_divisions",
            expected,
            value: entry.to_string(),
        };
        let (interval, divisions) = entry
            .split_once(':')
            .ok_or_else(|| bad("list entries INTERVAL_MB:DIVISIONS"))?;
        let (interval, divisions) = (interval.trim(), divisions.trim());
        let divisions: u64 = divisions
            .parse()
            .map_err(|_| bad("list entries whose divisions are whole numbers"))?;
        if divisions != 0 && !divisions.is_power_of_two() {
            return Err(TorchSettingsError::EntryDivisionsInvalid {
                interval: interval.to_string(),
                divisions,
            });
        }
        if interval == ">" {
            for slot in table.iter_mut().skip(last_index + 1) {
                *slot = divisions;
            }
            continue;
        }
        let interval_mb: u64 = interval
            .parse()
            .map_err(|_| bad("list entries whose intervals are whole numbers of MiB or '>'"))?;
        if !interval_mb.is_power_of_two() {
            return Err(TorchSettingsError::IntervalNotPowerOfTwo { interval_mb });
        }
        let index = (interval_mb.ilog2() as usize).min(ROUNDUP_INTERVALS - 1);
        if first {
            table[..index].fill(divisions);
            first = false;
        }
        table[index] = divisions;
        last_index = index;
    }
    Ok(table)
}

/// A table of `roundup_power2_divisions` that are not all the same in the list form,
/// which [`parse_divisions_list`] reads back onto a fresh table: the first run of equal
/// entries as one entry at its last interval (the first entry fills those below), each
/// later entry that is not 0 (0 is what a fresh table holds), and a last run that is
/// not 0 as `>` after the entry just before it.
fn divisions_list(table: &[u64; ROUNDUP_INTERVALS]) -> String {
    let run = table.iter().take_while(|&&d| d == table[0]).count();
    let last = table[ROUNDUP_INTERVALS - 1];
    let tail = ROUNDUP_INTERVALS - table.iter().rev().take_while(|&&d| d == last).count();
    let mut entries = vec![format!("{}:{}", 1u64 << (run - 1), table[0])];
    let end = if last == 0 { ROUNDUP_INTERVALS } else { tail };
    for (index, &divisions) in table.iter().enumerate().take(end).skip(run) {
        if divisions != 0 || (last != 0 && index + 1 == tail) {
            entries.push(format!("{}:{divisions}", 1u64 << index));
        }
    }
    if last != 0 {
        entries.push(format!(">:{last}"));
    }
    format!("[{}]", entries.join(","))
}

/// The name [`TorchSettings::parse`] reads back: `torch`, `torch_expandable`, with the
/// options that differ from the defaults, e.g. `torch(max_split_size_mb=128)`;
/// `roundup_power2_divisions` as one number where every interval has it, else as
/// PyTorch's list (`[256:1,>:8]`).
impl fmt::Display for TorchSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.expandable_segments {
            "torch_expandable"
        } else {
            "torch"
        })?;
        let mut options = Vec::new();
        if let Some(mb) = self.max_split_size_mb() {
            options.push(format!("max_split_size_mb={mb}"));
        }
        match self.uniform_roundup_power2_divisions() {
            Some(0) => {}
            Some(divisions) => options.push(format!("roundup_power2_divisions={divisions}")),
            None => options.push(format!(
                "roundup_power2_divisions={}",
                divisions_list(&self.roundup_power2_divisions)
            )),
        }
        if !options.is_empty() {
            write!(f, "({})", options.join(", "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
