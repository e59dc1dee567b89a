//! The allocator's settings: [`TorchSettings`], read from and printed as
//! `PYTORCH_CUDA_ALLOC_CONF`-style model names, and [`TorchSettingsError`].

use std::fmt;

use super::{LARGE_BUFFER, MAX_REQUEST, MIB};

/// The allocator's settings, as `PYTORCH_CUDA_ALLOC_CONF` spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TorchSettings {
    /// `expandable_segments:True`: one growing address range per pool.
    pub expandable_segments: bool,
    /// `max_split_size_mb`, in bytes: blocks this large are never split (None: no limit,
    /// PyTorch's default).
    pub max_split_size: Option<u64>,
    /// `roundup_power2_divisions` (one value for every size): None or 1 rounds to 512 B.
    pub roundup_power2_divisions: Option<u64>,
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

    /// Sets `roundup_power2_divisions` (a power of two; None: plain 512 B rounding).
    pub fn with_roundup_power2_divisions(
        mut self,
        divisions: Option<u64>,
    ) -> Result<Self, TorchSettingsError> {
        if let Some(divisions) = divisions {
            if !divisions.is_power_of_two() {
                return Err(TorchSettingsError::DivisionsNotPowerOfTwo { divisions });
            }
        }
        self.roundup_power2_divisions = divisions;
        Ok(self)
    }

    /// Reads a model name: `torch` or `torch_expandable` (case and `-` for `_` are
    /// ignored), optionally followed by options in parentheses, each `key=value` or
    /// `key:value` as `PYTORCH_CUDA_ALLOC_CONF` writes them: `expandable_segments`
    /// (True/False), `max_split_size_mb`, `roundup_power2_divisions`.
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
        for option in options.into_iter().flat_map(|o| o.split(',')) {
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
                "roundup_power2_divisions" => {
                    settings = settings
                        .with_roundup_power2_divisions(Some(number("roundup_power2_divisions")?))?
                }
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

/// The name [`TorchSettings::parse`] reads back: `torch`, `torch_expandable`, with the
/// options that differ from the defaults, e.g. `torch(max_split_size_mb=128)`.
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
        if let Some(divisions) = self.roundup_power2_divisions {
            options.push(format!("roundup_power2_divisions={divisions}"));
        }
        if !options.is_empty() {
            write!(f, "({})", options.join(", "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
