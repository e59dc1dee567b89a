//! The configuration to use when none is given: the `CUBEPOOL_MEMORY_POOLS`
//! environment variable, else `memory.pools` in the nearest `cubepool.toml`.
//!
//! Precedence, first wins:
//!
//! 1. an explicit configuration (an argument);
//! 2. the `CUBEPOOL_MEMORY_POOLS` environment variable, when set and not blank;
//! 3. `memory.pools` in the nearest `cubepool.toml`, searched from the working
//!    directory up to the root (the nearest file decides: when it has no
//!    `memory.pools`, the search stops there);
//! 4. the build's default ([`MemoryConfiguration::default`]).
//!
//! The environment wins over the file, as it does for most tools, so that one run
//! can try a layout without editing a checked-in file. Both hold text in the pools
//! configuration language ([`super::text`]); in the file, `memory.pools` may also be
//! an array of strings, one pool per string:
//!
//! ```toml
//! [memory]
//! pools = ["sliced(page=8MiB, max_slice=512KiB)", "exclusive(max_alloc=2GiB)"]
//! ```

use std::fmt;
use std::path::{Path, PathBuf};

use thiserror::Error;

use super::text::ConfigTextError;
use super::{MemoryConfiguration, PoolConfigError, MAX_POOLS};

/// The environment variable holding a configuration.
pub const ENV_VAR: &str = "CUBEPOOL_MEMORY_POOLS";

/// The file holding a configuration under `memory.pools`.
pub const CONFIG_FILE: &str = "cubepool.toml";

/// The largest `cubepool.toml` read (1 MiB): a layout takes a few lines, so a larger
/// file is a mistake, and refusing it keeps a stray file from costing its size in
/// memory at every `MemoryManagement()`.
pub const MAX_CONFIG_FILE_BYTES: u64 = 1 << 20;

/// Where a configuration was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    /// The `CUBEPOOL_MEMORY_POOLS` environment variable.
    Environment,
    /// `memory.pools` in a `cubepool.toml`.
    File {
        /// The file.
        path: PathBuf,
        /// The index of the string in `memory.pools`, when it is an array.
        entry: Option<usize>,
    },
}

impl fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Environment => write!(f, "{ENV_VAR}"),
            Self::File {
                path,
                entry: Some(entry),
            } => write!(f, "{}: memory.pools[{entry}]", path.display()),
            Self::File { path, entry: None } => write!(f, "{}: memory.pools", path.display()),
        }
    }
}

/// Why the configured layout could not be read.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConfigLoadError {
    /// The configuration text is malformed or invalid.
    #[error("{origin}: {error}")]
    Text {
        /// Where the text came from.
        origin: ConfigSource,
        /// The problem and its position in the text.
        error: ConfigTextError,
    },
    /// The file could not be read.
    #[error("cannot read {}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        error: std::io::Error,
    },
    /// The file is not a regular file (a FIFO, a device, a socket), not UTF-8 text,
    /// or larger than [`MAX_CONFIG_FILE_BYTES`].
    #[error("{}: {message}", path.display())]
    NotText {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The file is not TOML.
    #[error("{}: not valid TOML: {message}", path.display())]
    Toml {
        /// The file.
        path: PathBuf,
        /// What the TOML parser says.
        message: String,
        /// The character offset of the problem in the file, if known.
        position: Option<usize>,
    },
    /// `memory` or `memory.pools` holds the wrong type of value.
    #[error("{}: {key} must be {expected}, found {found}", path.display())]
    WrongType {
        /// The file.
        path: PathBuf,
        /// The key (`memory` or `memory.pools`).
        key: &'static str,
        /// What the key must hold.
        expected: &'static str,
        /// The TOML type found.
        found: &'static str,
    },
}

impl ConfigLoadError {
    /// A short name of the problem, for error kinds in bindings (the
    /// [`PoolConfigError::kind`] for text errors).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Text { error, .. } => error.error.kind(),
            Self::Io { .. } => "Io",
            Self::NotText { .. } => "NotText",
            Self::Toml { .. } => "InvalidToml",
            Self::WrongType { .. } => "WrongType",
        }
    }

    /// The character offset of the problem in the configuration text (for text
    /// errors) or in the file (for TOML errors), if known.
    pub fn position(&self) -> Option<usize> {
        match self {
            Self::Text { error, .. } => Some(error.position),
            Self::Toml { position, .. } => *position,
            _ => None,
        }
    }

    /// Where the configuration was read from, for messages.
    pub fn origin(&self) -> String {
        match self {
            Self::Text { origin, .. } => origin.to_string(),
            Self::Io { path, .. }
            | Self::NotText { path, .. }
            | Self::Toml { path, .. }
            | Self::WrongType { path, .. } => path.display().to_string(),
        }
    }
}

impl MemoryConfiguration {
    /// The configuration the environment names (the `CUBEPOOL_MEMORY_POOLS` variable,
    /// else `memory.pools` in the nearest `cubepool.toml` from the working directory
    /// up), with where it came from; `None` when neither names one. See the
    /// [module documentation](self) for the precedence.
    /// A value that is not UTF-8 is refused at its first such byte: read with a
    /// replacement character, a plan file's name would name another file.
    pub fn from_environment() -> Result<Option<(Self, ConfigSource)>, ConfigLoadError> {
        let variable = match std::env::var_os(ENV_VAR) {
            None => None,
            Some(value) => match value.into_string() {
                Ok(text) => Some(text),
                Err(value) => return Err(not_utf8_variable(value.as_encoded_bytes())),
            },
        };
        let directory = std::env::current_dir().ok();
        Self::from_sources(variable.as_deref(), directory.as_deref())
    }

    /// [`MemoryConfiguration::from_environment`] with the variable's value and the
    /// directory to search from given explicitly.
    pub fn from_sources(
        variable: Option<&str>,
        directory: Option<&Path>,
    ) -> Result<Option<(Self, ConfigSource)>, ConfigLoadError> {
        if let Some(text) = variable.filter(|text| !text.trim().is_empty()) {
            let configuration = Self::parse(text).map_err(|error| ConfigLoadError::Text {
                origin: ConfigSource::Environment,
                error,
            })?;
            return Ok(Some((configuration, ConfigSource::Environment)));
        }
        match directory.and_then(find_config_file) {
            Some(path) => read_config_file(&path),
            None => Ok(None),
        }
    }

    /// The configuration the environment names, else the build's default.
    pub fn configured() -> Result<Self, ConfigLoadError> {
        Ok(Self::from_environment()?
            .map(|(configuration, _)| configuration)
            .unwrap_or_default())
    }
}

/// The error of a `CUBEPOOL_MEMORY_POOLS` value that is not UTF-8 (`bytes`, as the OS
/// gave them), at its first character that is not.
fn not_utf8_variable(bytes: &[u8]) -> ConfigLoadError {
    let valid = std::str::from_utf8(bytes).map_or_else(|e| e.valid_up_to(), |_| bytes.len());
    let position = String::from_utf8_lossy(&bytes[..valid]).chars().count();
    ConfigLoadError::Text {
        origin: ConfigSource::Environment,
        error: ConfigTextError {
            position,
            error: PoolConfigError::Syntax {
                expected: "UTF-8 text",
                found: "a byte that is not UTF-8".into(),
            },
        },
    }
}

/// The nearest `cubepool.toml` in `directory` or one of its ancestors. A folder of
/// that name (or a link to one) is passed over; anything else of that name (a FIFO, a
/// device, a socket, a link to nothing) is the nearest, which [`read_config_file`]
/// then refuses, so that a farther file is never read in its place unsaid.
pub fn find_config_file(directory: &Path) -> Option<PathBuf> {
    directory
        .ancestors()
        .map(|dir| dir.join(CONFIG_FILE))
        .find(|path| path.symlink_metadata().is_ok() && !path.is_dir())
}

fn type_name(value: &toml::Value) -> &'static str {
    match value {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a float",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a date-time",
        toml::Value::Array(_) => "an array",
        toml::Value::Table(_) => "a table",
    }
}

/// The text of a configuration file: at most [`MAX_CONFIG_FILE_BYTES`], UTF-8.
fn read_text(path: &Path) -> Result<String, ConfigLoadError> {
    use std::io::Read;
    let io = |error| ConfigLoadError::Io {
        path: path.to_path_buf(),
        error,
    };
    let not_text = |message| ConfigLoadError::NotText {
        path: path.to_path_buf(),
        message,
    };
    use crate::regular_file::{open_regular, OpenRegularError};
    let file = match open_regular(path) {
        Ok((file, _)) => file,
        Err(OpenRegularError::Io(error)) => return Err(io(error)),
        Err(OpenRegularError::NotRegular(kind)) => {
            return Err(not_text(format!("{kind}, not a regular file")))
        }
    };
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| io(crate::regular_file::read_error(error)))?;
    if bytes.len() as u64 > MAX_CONFIG_FILE_BYTES {
        return Err(not_text(format!(
            "larger than {MAX_CONFIG_FILE_BYTES} bytes, too large for a configuration file"
        )));
    }
    String::from_utf8(bytes).map_err(|error| {
        not_text(format!(
            "not UTF-8 text (invalid byte at offset {})",
            error.utf8_error().valid_up_to()
        ))
    })
}

/// Reads `memory.pools` from a `cubepool.toml`; `None` when the file has none. A
/// relative `planned(file=...)` in it names a plan beside the file
/// ([`MemoryConfiguration::parse_in_folder`]).
pub fn read_config_file(
    path: &Path,
) -> Result<Option<(MemoryConfiguration, ConfigSource)>, ConfigLoadError> {
    let text = read_text(path)?;
    let table: toml::Table = text.parse().map_err(|error: toml::de::Error| {
        let position = error
            .span()
            .and_then(|span| text.get(..span.start))
            .map(|head| head.chars().count());
        ConfigLoadError::Toml {
            path: path.to_path_buf(),
            message: error.message().trim().to_string(),
            position,
        }
    })?;
    let wrong = |key, expected, value: &toml::Value| ConfigLoadError::WrongType {
        path: path.to_path_buf(),
        key,
        expected,
        found: type_name(value),
    };
    let Some(memory) = table.get("memory") else {
        return Ok(None);
    };
    let toml::Value::Table(memory) = memory else {
        return Err(wrong("memory", "a table", memory));
    };
    let Some(pools) = memory.get("pools") else {
        return Ok(None);
    };
    let source = |entry| ConfigSource::File {
        path: path.to_path_buf(),
        entry,
    };
    // A relative plan file is the file's neighbour, wherever the command runs.
    let folder = path.parent().unwrap_or(Path::new(""));
    let parse = |text: &str| MemoryConfiguration::parse_in_folder(text, folder);
    let text_error = |entry, error| ConfigLoadError::Text {
        origin: source(entry),
        error,
    };
    let expected = "a string or an array of strings";
    let configuration = match pools {
        toml::Value::String(text) => parse(text).map_err(|error| text_error(None, error))?,
        toml::Value::Array(entries) => {
            let mut pool_options = Vec::new();
            for (index, entry) in entries.iter().enumerate() {
                let toml::Value::String(text) = entry else {
                    return Err(wrong("memory.pools", expected, entry));
                };
                let parsed = parse(text).map_err(|e| text_error(Some(index), e))?;
                match parsed {
                    MemoryConfiguration::Custom { pool_options: more } => pool_options.extend(more),
                    preset if entries.len() == 1 => return Ok(Some((preset, source(Some(0))))),
                    preset => {
                        let error = PoolConfigError::PresetInPoolList {
                            preset: preset.preset_name().unwrap_or("preset"),
                        };
                        return Err(text_error(
                            Some(index),
                            ConfigTextError { position: 0, error },
                        ));
                    }
                }
                if pool_options.len() > MAX_POOLS {
                    let error = PoolConfigError::TooManyPools {
                        count: pool_options.len(),
                    };
                    return Err(text_error(
                        Some(index),
                        ConfigTextError { position: 0, error },
                    ));
                }
            }
            if pool_options.is_empty() {
                let error = PoolConfigError::EmptyPoolList;
                return Err(text_error(None, ConfigTextError { position: 0, error }));
            }
            MemoryConfiguration::Custom { pool_options }
        }
        other => return Err(wrong("memory.pools", expected, other)),
    };
    Ok(Some((configuration, source(None))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{MemoryPoolOptions, PoolType};

    /// A fresh directory tree under the system's temporary directory.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "cubepool-config-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        dir
    }

    fn direct() -> MemoryConfiguration {
        MemoryConfiguration::Custom {
            pool_options: vec![MemoryPoolOptions::new(PoolType::Direct {
                reclaim_at: None,
            })],
        }
    }

    #[test]
    fn the_variable_wins_over_the_file_and_the_nearest_file_wins() {
        let dir = scratch("precedence");
        std::fs::write(dir.join(CONFIG_FILE), "[memory]\npools = \"direct()\"\n").unwrap();
        let start = dir.join("a/b");
        let (config, source) = MemoryConfiguration::from_sources(None, Some(&start))
            .unwrap()
            .unwrap();
        assert_eq!(config, direct());
        assert_eq!(
            source,
            ConfigSource::File {
                path: dir.join(CONFIG_FILE),
                entry: None
            }
        );
        let (config, source) =
            MemoryConfiguration::from_sources(Some("exclusive_pages"), Some(&start))
                .unwrap()
                .unwrap();
        assert_eq!(
            (config, source),
            (
                MemoryConfiguration::ExclusivePages,
                ConfigSource::Environment
            )
        );
        // A blank variable counts as unset.
        assert!(MemoryConfiguration::from_sources(Some("  "), Some(&start))
            .unwrap()
            .is_some());
        // The nearest file decides, even without memory.pools.
        std::fs::write(dir.join("a").join(CONFIG_FILE), "[other]\nx = 1\n").unwrap();
        assert!(MemoryConfiguration::from_sources(None, Some(&start))
            .unwrap()
            .is_none());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn arrays_hold_one_pool_per_string() {
        let dir = scratch("array");
        let path = dir.join(CONFIG_FILE);
        std::fs::write(
            &path,
            "memory.pools = [\"exclusive(max_alloc=1KiB)\", \"direct()\"]\n",
        )
        .unwrap();
        let (config, _) = read_config_file(&path).unwrap().unwrap();
        assert_eq!(config.to_string(), "exclusive(max_alloc=1KiB); direct()");
        std::fs::write(&path, "memory.pools = [\"direct()\", \"direct(x=1)\"]\n").unwrap();
        let err = read_config_file(&path).unwrap_err();
        assert_eq!((err.kind(), err.position()), ("UnknownField", Some(7)));
        assert!(err.to_string().contains("memory.pools[1]"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn bad_files_are_typed_errors() {
        let dir = scratch("bad");
        let path = dir.join(CONFIG_FILE);
        for (text, kind) in [
            ("[memory\npools = 1", "InvalidToml"),
            ("memory = 3", "WrongType"),
            ("memory.pools = 3", "WrongType"),
            ("memory.pools = [3]", "WrongType"),
            ("memory.pools = []", "EmptyPoolList"),
            ("memory.pools = \"direct(\"", "Syntax"),
            (
                "memory.pools = [\"direct()\", \"exclusive_pages\"]",
                "PresetInPoolList",
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = read_config_file(&path).unwrap_err();
            assert_eq!(err.kind(), kind, "{text}: {err}");
        }
        std::fs::write(&path, b"memory.pools = \"direct()\"\n\xff\n").unwrap();
        let err = read_config_file(&path).unwrap_err();
        assert_eq!(err.kind(), "NotText");
        assert!(err.to_string().contains(CONFIG_FILE), "{err}");
        assert!(err.to_string().contains("offset 26"), "{err}");
        let huge = vec![b'#'; MAX_CONFIG_FILE_BYTES as usize + 1];
        std::fs::write(&path, huge).unwrap();
        let err = read_config_file(&path).unwrap_err();
        assert_eq!(err.kind(), "NotText");
        assert!(err.to_string().contains("too large"), "{err}");
        std::fs::write(&path, "x = 1\n[memory\n").unwrap();
        // The parser points past the first line, at the unclosed table header.
        let position = read_config_file(&path).unwrap_err().position();
        assert!(position.is_some_and(|p| p >= 6), "{position:?}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_nearer_fifo_or_dangling_link_is_refused_where_a_farther_file_was_read() {
        let dir = scratch("fifo");
        std::fs::write(dir.join(CONFIG_FILE), "[memory]\npools = \"direct()\"\n").unwrap();
        // A folder of the name is no configuration: the search passes it over.
        std::fs::create_dir(dir.join("a/b").join(CONFIG_FILE)).unwrap();
        let start = dir.join("a/b");
        let (config, _) = MemoryConfiguration::from_sources(None, Some(&start))
            .unwrap()
            .unwrap();
        assert_eq!(config, direct());
        // A FIFO of the name is the nearest: refused, not waited on, not passed over.
        let fifo = dir.join("a").join(CONFIG_FILE);
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|status| status.success()), "mkfifo {fifo:?}");
        let err = MemoryConfiguration::from_sources(None, Some(&start)).unwrap_err();
        assert_eq!(err.kind(), "NotText");
        assert_eq!(
            err.to_string(),
            format!("{}: a FIFO, not a regular file", fifo.display())
        );
        // A link to nothing is the nearest too: its error names it.
        std::fs::remove_file(&fifo).unwrap();
        std::os::unix::fs::symlink(dir.join("gone"), &fifo).unwrap();
        let err = MemoryConfiguration::from_sources(None, Some(&start)).unwrap_err();
        assert_eq!(err.kind(), "Io");
        assert!(err.to_string().contains(&*fifo.to_string_lossy()), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_bad_variable_names_its_source() {
        let err = MemoryConfiguration::from_sources(Some("direct(nope=1)"), None).unwrap_err();
        assert_eq!((err.kind(), err.position()), ("UnknownField", Some(7)));
        assert!(
            err.to_string().starts_with("CUBEPOOL_MEMORY_POOLS: "),
            "{err}"
        );
    }
}
