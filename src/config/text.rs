//! The pools configuration language: a [`MemoryConfiguration`] written as text, and
//! read back.
//!
//! A configuration is a preset name, or one pool per entry, entries separated by `;`
//! or new lines, tried in order:
//!
//! ```text
//! sub_slices
//! sliced(page=8MiB, max_slice=512KiB); sliced(page=32MiB, max_slice=4MiB, cap=256MiB)
//! exclusive(max_alloc=2GiB, dealloc_period=5000); direct(reclaim_at=1GiB)
//! ```
//!
//! | pool        | fields (required first)                                   |
//! |-------------|-----------------------------------------------------------|
//! | `sliced`    | `page`, `max_slice`, then `cap`, `dealloc_period`          |
//! | `exclusive` | `max_alloc`, then `dealloc_period`                         |
//! | `direct`    | `reclaim_at`, `dealloc_period` (both optional)             |
//! | `virtual`   | `granule`, then `keep`, `small`, `range`, `dealloc_period` |
//! | `planned`   | `file`, then `granule` (default 2 MiB)                     |
//!
//! The struct names (`page_size`, `max_slice_size`, `max_pool_size`,
//! `max_alloc_size`) are accepted too, and an optional field may be written `none`.
//! Sizes are whole bytes: a number (`_` may group digits, a decimal point is allowed
//! when the result is whole) and a unit among `B`, `KiB`, `MiB`, `GiB`, `TiB` (powers of
//! 1024) and `KB`, `MB`, `GB`, `TB` (powers of 1000), in any case; no unit means bytes.
//! `dealloc_period` is a count of reservations and takes no unit. A planned pool's
//! `file` is the path of a plan file (see [`crate::plan_file`]), read when the text is;
//! it may not hold `,`, `(`, `)`, `;`, `=`, `#` or a new line. `#` starts a comment
//! that runs to the end of the line.
//!
//! Writing a configuration ([`fmt::Display`]) gives the canonical text, which reads back
//! to the same configuration: `MemoryConfiguration::parse(&c.to_string()) == Ok(c)`
//! for every configuration that [`MemoryConfiguration::validate`] accepts.
//!
//! Reading never panics: every malformed text is a [`ConfigTextError`] with the
//! character offset of the problem and a [`PoolConfigError`] that names it.

use std::fmt;
use std::str::FromStr;

use std::path::Path;

use thiserror::Error;

use super::{
    effective, normalize_name, MemoryConfiguration, MemoryPoolOptions, PoolConfigError, PoolType,
    ANY_DEVICE, MAX_POOLS,
};

/// Why configuration text could not be read: the problem, and where it is.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{error} (at character {position})")]
pub struct ConfigTextError {
    /// The offset of the problem, in characters (not bytes) from the start of the text.
    pub position: usize,
    /// The problem.
    pub error: PoolConfigError,
}

impl MemoryConfiguration {
    /// Reads a configuration written in the pools configuration language (see the
    /// [module documentation](self)); the result passes
    /// [`MemoryConfiguration::validate`].
    pub fn parse(text: &str) -> Result<Self, ConfigTextError> {
        Parser {
            text,
            pos: 0,
            folder: None,
        }
        .configuration()
    }

    /// [`MemoryConfiguration::parse`] of text read from a file in `folder`: a relative
    /// `planned(file=...)` names a plan in that folder, not in the working one (as a
    /// `cubepool.toml` or a layout file means it wherever the command runs), and the
    /// layout names it by the joined path. A joined path the language cannot carry
    /// (a folder whose name holds `,` `(` `)` `;` `=` `#`, or is not UTF-8) is
    /// refused as the plan file's error.
    pub fn parse_in_folder(text: &str, folder: &Path) -> Result<Self, ConfigTextError> {
        Parser {
            text,
            pos: 0,
            folder: Some(folder),
        }
        .configuration()
    }
}

impl FromStr for MemoryConfiguration {
    type Err = ConfigTextError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

impl fmt::Display for MemoryConfiguration {
    /// The canonical text of the configuration: the preset's name, or its pools
    /// separated by `"; "`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(name) = self.preset_name() {
            return f.write_str(name);
        }
        if let Self::Custom { pool_options } = self {
            for (index, options) in pool_options.iter().enumerate() {
                if index > 0 {
                    f.write_str("; ")?;
                }
                write!(f, "{options}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for MemoryPoolOptions {
    /// The pool as one entry of the configuration language, such as
    /// `sliced(page=8MiB, max_slice=512KiB)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut fields: Vec<String> = Vec::new();
        let kind = match self.pool_type {
            PoolType::SlicedPages {
                page_size,
                max_slice_size,
                max_pool_size,
            } => {
                fields.push(format!("page={}", format_size(page_size)));
                fields.push(format!("max_slice={}", format_size(max_slice_size)));
                if let Some(cap) = max_pool_size {
                    fields.push(format!("cap={}", format_size(cap)));
                }
                "sliced"
            }
            PoolType::ExclusivePages { max_alloc_size } => {
                fields.push(format!("max_alloc={}", format_size(max_alloc_size)));
                "exclusive"
            }
            PoolType::Direct { reclaim_at } => {
                if let Some(mark) = reclaim_at {
                    fields.push(format!("reclaim_at={}", format_size(mark)));
                }
                "direct"
            }
            PoolType::VirtualPages {
                granule,
                keep,
                small,
                range,
            } => {
                fields.push(format!("granule={}", format_size(granule)));
                // Defaults are left out: they read back the same.
                if keep != PoolType::VIRTUAL_KEEP {
                    fields.push(format!("keep={}", keep.map_or("none".into(), format_size)));
                }
                for (name, value, default) in [
                    ("small", small, PoolType::VIRTUAL_SMALL),
                    ("range", range, PoolType::VIRTUAL_RANGE),
                ] {
                    if value != default {
                        fields.push(format!("{name}={}", format_size(value)));
                    }
                }
                "virtual"
            }
            PoolType::Planned { plan, granule } => {
                fields.push(format!("file={}", crate::plan_file::plan_of(plan).file));
                if granule != super::DEFAULT_GRANULE {
                    fields.push(format!("granule={}", format_size(granule)));
                }
                "planned"
            }
        };
        if let Some(period) = self.dealloc_period {
            fields.push(format!("dealloc_period={period}"));
        }
        write!(f, "{kind}({})", fields.join(", "))
    }
}

/// A size as the language writes it: exact, in the largest unit that divides it
/// (`512KiB`, `2GiB`, `1MB`, `1000B`).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 8] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("TB", 1_000_000_000_000),
        ("GB", 1_000_000_000),
        ("MB", 1_000_000),
        ("KB", 1_000),
    ];
    if bytes > 0 {
        for (unit, scale) in UNITS {
            if bytes % scale == 0 {
                return format!("{}{unit}", bytes / scale);
            }
        }
    }
    format!("{bytes}B")
}

/// Reads a size such as `512KiB`, `1.5 GiB`, `64MB` or `4096`; the error says why
/// the text is not one (it reads after the quoted text in messages).
pub fn parse_size(text: &str) -> Result<u64, &'static str> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '_' || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = (&text[..split], text[split..].trim_start());
    let scale: u128 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ if number.is_empty() => return Err("is not a size (write a number such as 512KiB)"),
        _ => return Err("has an unknown unit (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"),
    };
    let (whole, fraction) = match number.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (number, None),
    };
    if !digits_ok(whole) || fraction.is_some_and(|f| !digits_ok(f)) {
        return Err("is not a size (write a number such as 512KiB)");
    }
    let too_large = "does not fit in 64 bits";
    // The fraction's bytes: its digits times the unit, carried from the last digit
    // to the first as in long multiplication, each digit of the product after the
    // point required to be 0. Exact for any number of digits (where the value of the
    // digits as one integer would overflow past 38 of them), and the carry stays
    // below 10 times the unit.
    let mut carry: u128 = 0;
    for digit in fraction
        .unwrap_or("")
        .bytes()
        .rev()
        .filter(u8::is_ascii_digit)
    {
        let product = u128::from(digit - b'0') * scale + carry;
        if product % 10 != 0 {
            return Err("is not a whole number of bytes");
        }
        carry = product / 10;
    }
    let mut whole_value: u128 = 0;
    for digit in whole.bytes().filter(u8::is_ascii_digit) {
        whole_value = whole_value
            .checked_mul(10)
            .and_then(|value| value.checked_add(u128::from(digit - b'0')))
            .ok_or(too_large)?;
    }
    let bytes = whole_value
        .checked_mul(scale)
        .and_then(|bytes| bytes.checked_add(carry))
        .ok_or(too_large)?;
    u64::try_from(bytes).map_err(|_| too_large)
}

/// Whether `text` is digits, with `_` only between digits.
fn digits_ok(text: &str) -> bool {
    !text.is_empty()
        && !text.starts_with('_')
        && !text.ends_with('_')
        && !text.contains("__")
        && text.chars().all(|c| c.is_ascii_digit() || c == '_')
}

/// Reads a count such as `5000` or `5_000`.
fn parse_count(text: &str) -> Result<u64, &'static str> {
    let text = text.trim();
    if !digits_ok(text) {
        return Err(
            if text.starts_with(|c: char| c.is_ascii_digit()) && !text.contains('.') {
                "is a count of reservations and takes no unit"
            } else {
                "is not a count (write a whole number such as 5000)"
            },
        );
    }
    text.chars()
        .filter(char::is_ascii_digit)
        .try_fold(0u64, |n, c| {
            n.checked_mul(10)?.checked_add(u64::from(c as u8 - b'0'))
        })
        .ok_or("does not fit in 64 bits")
}

/// What a field's value is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Value {
    Size,
    Count,
    /// A plan file's path: the file is read and interned, and its id is the value.
    PlanFile,
}

/// One field of a pool kind: its name in the language, the struct field's name
/// (also accepted, and the name validation errors use), its value, and whether it
/// is required.
struct Field {
    name: &'static str,
    long: &'static str,
    value: Value,
    required: bool,
}

const fn field(name: &'static str, long: &'static str, value: Value, required: bool) -> Field {
    Field {
        name,
        long,
        value,
        required,
    }
}

const DEALLOC: Field = field("dealloc_period", "dealloc_period", Value::Count, false);
const SLICED: [Field; 4] = [
    field("page", "page_size", Value::Size, true),
    field("max_slice", "max_slice_size", Value::Size, true),
    field("cap", "max_pool_size", Value::Size, false),
    DEALLOC,
];
const EXCLUSIVE: [Field; 2] = [
    field("max_alloc", "max_alloc_size", Value::Size, true),
    DEALLOC,
];
const DIRECT: [Field; 2] = [
    field("reclaim_at", "reclaim_at", Value::Size, false),
    DEALLOC,
];
const VIRTUAL: [Field; 5] = [
    field("granule", "granule", Value::Size, true),
    field("keep", "keep", Value::Size, false),
    field("small", "small", Value::Size, false),
    field("range", "range", Value::Size, false),
    DEALLOC,
];
const PLANNED: [Field; 2] = [
    field("file", "file", Value::PlanFile, true),
    field("granule", "granule", Value::Size, false),
];

#[derive(Clone, Copy)]
enum Kind {
    Sliced,
    Exclusive,
    Direct,
    Virtual,
    Planned,
}

/// Whether `name` names a comparison model of [`crate::trace::torch_model`] (which is
/// no layout: the error says so instead of "unknown preset").
fn is_comparison_model(name: &str) -> bool {
    let name = name.to_ascii_lowercase().replace('-', "_");
    crate::trace::TorchSettings::NAMES.contains(&name.as_str())
}

impl Kind {
    fn named(name: &str) -> Option<Kind> {
        match normalize_name(name).as_str() {
            "sliced" | "slicedpages" => Some(Kind::Sliced),
            "exclusive" | "exclusivepages" => Some(Kind::Exclusive),
            "direct" => Some(Kind::Direct),
            "virtual" | "virtualpages" => Some(Kind::Virtual),
            "planned" => Some(Kind::Planned),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Sliced => "sliced",
            Kind::Exclusive => "exclusive",
            Kind::Direct => "direct",
            Kind::Virtual => "virtual",
            Kind::Planned => "planned",
        }
    }

    fn fields(self) -> &'static [Field] {
        match self {
            Kind::Sliced => &SLICED,
            Kind::Exclusive => &EXCLUSIVE,
            Kind::Direct => &DIRECT,
            Kind::Virtual => &VIRTUAL,
            Kind::Planned => &PLANNED,
        }
    }

    fn field_list(self) -> &'static str {
        match self {
            Kind::Sliced => "page, max_slice, cap, dealloc_period",
            Kind::Exclusive => "max_alloc, dealloc_period",
            Kind::Direct => "reclaim_at, dealloc_period",
            Kind::Virtual => "granule, keep, small, range, dealloc_period",
            Kind::Planned => "file, granule",
        }
    }
}

/// One entry of a configuration, with the byte offsets its errors point at.
enum Entry {
    Preset {
        start: usize,
        name: &'static str,
        configuration: MemoryConfiguration,
    },
    Pool {
        start: usize,
        options: MemoryPoolOptions,
        /// Struct field names and the offsets of their values.
        positions: Vec<(&'static str, usize)>,
    },
}

/// A cursor over the text; `pos` is a byte offset on a character boundary.
struct Parser<'a> {
    text: &'a str,
    pos: usize,
    /// The folder relative plan files are read from (`None`: the working folder).
    folder: Option<&'a Path>,
}

type Parsed<T> = Result<T, ConfigTextError>;

impl<'a> Parser<'a> {
    /// The plan file `raw` names, joined to the text's folder where it is relative
    /// (see [`MemoryConfiguration::parse_in_folder`]); an error's reason where the
    /// joined path cannot be written back in the language.
    fn plan_path(&self, raw: &str) -> Result<String, &'static str> {
        let Some(folder) = self.folder.filter(|_| Path::new(raw).is_relative()) else {
            return Ok(raw.to_string());
        };
        if folder.as_os_str().is_empty() || folder == Path::new(".") {
            // The working folder: the name as given.
            return Ok(raw.to_string());
        }
        let joined = folder.join(raw);
        let joined = joined
            .to_str()
            .ok_or("names a plan in a folder whose name is not UTF-8 text")?;
        if !crate::plan_file::writable_plan_name(joined) {
            return Err(
                "names a plan in a folder whose name the pools language cannot \
                 write (it holds , ( ) ; = # or a new line, or starts or ends with spaces)",
            );
        }
        Ok(joined.to_string())
    }

    fn peek(&self) -> Option<char> {
        self.text[self.pos..].chars().next()
    }

    fn bump(&mut self) {
        if let Some(c) = self.peek() {
            self.pos += c.len_utf8();
        }
    }

    /// Skips spaces, tabs and comments, but not new lines.
    fn skip_blank(&mut self) {
        while let Some(c) = self.peek() {
            if c == '#' {
                while self.peek().is_some_and(|c| c != '\n') {
                    self.bump();
                }
            } else if c.is_whitespace() && c != '\n' {
                self.bump();
            } else {
                break;
            }
        }
    }

    /// Skips white space (new lines included) and comments.
    fn skip_space(&mut self) {
        self.skip_runs(Self::skip_blank, '\n');
    }

    /// Skips white space, comments and entry separators.
    fn skip_separators(&mut self) {
        self.skip_runs(Self::skip_space, ';');
    }

    /// Skips what `skip` skips and a `separator` after it, again and again, until
    /// neither is next.
    fn skip_runs(&mut self, skip: fn(&mut Self), separator: char) {
        loop {
            skip(self);
            if self.peek() != Some(separator) {
                break;
            }
            self.bump();
        }
    }

    fn ident(&mut self) -> Option<(usize, &'a str)> {
        let start = self.pos;
        if !self
            .peek()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        {
            return None;
        }
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            self.bump();
        }
        Some((start, &self.text[start..self.pos]))
    }

    /// What the text holds at the cursor, for messages.
    fn found(&self) -> String {
        match self.peek() {
            None => "the end of the text".to_string(),
            Some('\n') => "a new line".to_string(),
            Some(c) => format!("{c:?}"),
        }
    }

    fn error(&self, at: usize, error: PoolConfigError) -> ConfigTextError {
        ConfigTextError {
            position: self.text.get(..at).map_or(0, |head| head.chars().count()),
            error,
        }
    }

    fn syntax(&self, expected: &'static str) -> ConfigTextError {
        self.error(
            self.pos,
            PoolConfigError::Syntax {
                expected,
                found: self.found(),
            },
        )
    }

    fn configuration(mut self) -> Parsed<MemoryConfiguration> {
        let mut entries = Vec::new();
        loop {
            self.skip_separators();
            if self.peek().is_none() {
                break;
            }
            entries.push(self.entry()?);
            self.skip_blank();
            match self.peek() {
                None | Some(';') | Some('\n') => {}
                Some(_) => return Err(self.syntax("';' or a new line between entries")),
            }
        }
        self.finish(entries)
    }

    /// Checks the entries together and builds the configuration.
    fn finish(&self, entries: Vec<Entry>) -> Parsed<MemoryConfiguration> {
        if entries.is_empty() {
            return Err(self.error(self.pos, PoolConfigError::EmptyPoolList));
        }
        let count = entries.len();
        let mut pool_options = Vec::with_capacity(count);
        for (index, entry) in entries.into_iter().enumerate() {
            match entry {
                Entry::Preset {
                    start,
                    name,
                    configuration,
                } => {
                    if count > 1 {
                        return Err(
                            self.error(start, PoolConfigError::PresetInPoolList { preset: name })
                        );
                    }
                    configuration
                        .validate()
                        .map_err(|error| self.error(start, error))?;
                    return Ok(configuration);
                }
                Entry::Pool {
                    start,
                    options,
                    positions,
                } => {
                    if index == MAX_POOLS {
                        return Err(self.error(start, PoolConfigError::TooManyPools { count }));
                    }
                    effective(&options, &ANY_DEVICE).map_err(|error| {
                        let at = error
                            .field()
                            .and_then(|field| {
                                positions
                                    .iter()
                                    .find(|(name, _)| *name == field)
                                    .map(|p| p.1)
                            })
                            .unwrap_or(start);
                        self.error(at, error)
                    })?;
                    pool_options.push(options);
                }
            }
        }
        Ok(MemoryConfiguration::Custom { pool_options })
    }

    fn entry(&mut self) -> Parsed<Entry> {
        let Some((start, name)) = self.ident() else {
            return Err(self.syntax("a pool (sliced, exclusive, direct) or a preset name"));
        };
        self.skip_blank();
        if is_comparison_model(name) {
            return Err(self.error(
                start,
                PoolConfigError::ComparisonModel {
                    name: name.to_string(),
                },
            ));
        }
        if self.peek() == Some('(') {
            self.bump();
            let kind = Kind::named(name).ok_or_else(|| {
                self.error(
                    start,
                    PoolConfigError::UnknownPoolKind {
                        name: name.to_string(),
                    },
                )
            })?;
            return self.pool(start, kind);
        }
        if let Some(configuration) = MemoryConfiguration::preset(name) {
            let name = configuration.preset_name().unwrap_or("preset");
            return Ok(Entry::Preset {
                start,
                name,
                configuration,
            });
        }
        if Kind::named(name).is_some() {
            return Err(self.syntax("'(' and the pool's fields after the pool kind"));
        }
        Err(self.error(
            start,
            PoolConfigError::UnknownPreset {
                name: quoted_prefix(name),
            },
        ))
    }

    /// Reads the fields of a pool, after its `(`.
    fn pool(&mut self, start: usize, kind: Kind) -> Parsed<Entry> {
        let mut values: Vec<(&'static Field, Option<u64>, usize)> = Vec::new();
        loop {
            self.skip_space();
            if self.peek() == Some(')') {
                self.bump();
                break;
            }
            let Some((at, name)) = self.ident() else {
                return Err(self.syntax("a field name or ')'"));
            };
            let wanted = name.to_ascii_lowercase().replace('-', "_");
            let field = kind
                .fields()
                .iter()
                .find(|f| f.name == wanted || f.long == wanted)
                .ok_or_else(|| {
                    self.error(
                        at,
                        PoolConfigError::UnknownField {
                            pool: kind.name(),
                            field: name.to_string(),
                            fields: kind.field_list(),
                        },
                    )
                })?;
            if values.iter().any(|(seen, _, _)| std::ptr::eq(*seen, field)) {
                return Err(self.error(at, PoolConfigError::DuplicateField { field: field.name }));
            }
            self.skip_space();
            if self.peek() != Some('=') {
                return Err(self.syntax("'=' after the field name"));
            }
            self.bump();
            self.skip_space();
            let value_at = self.pos;
            let value = self.value(field)?;
            values.push((field, value, value_at));
            self.skip_space();
            match self.peek() {
                Some(',') => self.bump(),
                Some(')') => {
                    self.bump();
                    break;
                }
                _ => return Err(self.syntax("',' or ')' after a field")),
            }
        }
        for field in kind.fields() {
            let given = values.iter().find(|(f, _, _)| std::ptr::eq(*f, field));
            if field.required && given.is_none() {
                return Err(self.error(
                    start,
                    PoolConfigError::MissingField {
                        pool: kind.name(),
                        field: field.name,
                    },
                ));
            }
        }
        let get = |name: &str| {
            values
                .iter()
                .find(|(f, _, _)| f.name == name)
                .and_then(|(_, value, _)| *value)
        };
        let pool_type = match kind {
            Kind::Sliced => PoolType::SlicedPages {
                page_size: get("page").unwrap_or(0),
                max_slice_size: get("max_slice").unwrap_or(0),
                max_pool_size: get("cap"),
            },
            Kind::Exclusive => PoolType::ExclusivePages {
                max_alloc_size: get("max_alloc").unwrap_or(0),
            },
            Kind::Direct => PoolType::Direct {
                reclaim_at: get("reclaim_at"),
            },
            Kind::Virtual => PoolType::VirtualPages {
                granule: get("granule").unwrap_or(0),
                // Left out: the default; `none`: no bound.
                keep: values
                    .iter()
                    .find(|(f, _, _)| f.name == "keep")
                    .map_or(PoolType::VIRTUAL_KEEP, |(_, value, _)| *value),
                small: get("small").unwrap_or(PoolType::VIRTUAL_SMALL),
                range: get("range").unwrap_or(PoolType::VIRTUAL_RANGE),
            },
            Kind::Planned => PoolType::Planned {
                // Required, so read above.
                plan: crate::plan_file::PlanId::from_index(get("file").unwrap_or(0)),
                granule: get("granule").unwrap_or(super::DEFAULT_GRANULE),
            },
        };
        Ok(Entry::Pool {
            start,
            options: MemoryPoolOptions {
                pool_type,
                dealloc_period: get("dealloc_period"),
            },
            positions: values.iter().map(|(f, _, at)| (f.long, *at)).collect(),
        })
    }

    /// Reads the value of `field` (`None` for `none`).
    fn value(&mut self, field: &'static Field) -> Parsed<Option<u64>> {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|c| !matches!(c, ',' | ')' | '(' | ';' | '\n' | '#' | '='))
        {
            self.bump();
        }
        let raw = self.text[start..self.pos].trim_end();
        if raw.is_empty() {
            return Err(self.syntax("a value"));
        }
        let invalid = |reason| {
            self.error(
                start,
                PoolConfigError::InvalidValue {
                    field: field.name,
                    text: quoted_prefix(raw),
                    reason,
                },
            )
        };
        if raw.eq_ignore_ascii_case("none") {
            return if field.required {
                Err(invalid("is not allowed: the field is required"))
            } else {
                Ok(None)
            };
        }
        let parsed = match field.value {
            Value::Size => parse_size(raw),
            Value::Count => parse_count(raw),
            Value::PlanFile => {
                let file = self.plan_path(raw).map_err(invalid)?;
                return crate::plan_file::load_plan(&file)
                    .map(|id| Some(id.index()))
                    .map_err(|error| {
                        self.error(start, PoolConfigError::PlanFile(Box::new(error)))
                    });
            }
        };
        parsed.map(Some).map_err(invalid)
    }
}

/// The most characters of a user's name that an error message repeats.
const MAX_NAME_IN_MESSAGE: usize = 64;

/// `name`, or its first [`MAX_NAME_IN_MESSAGE`] characters and how long it was, so a
/// hostile megabyte-long name makes a short message.
pub(crate) fn quoted_prefix(name: &str) -> String {
    cut_short(name, MAX_NAME_IN_MESSAGE)
}

/// `text`, or its first `chars` characters and how long it was.
pub(crate) fn cut_short(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        None => text.to_string(),
        Some((cut, _)) => format!("{}... ({} bytes)", &text[..cut], text.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;
    const GIB: u64 = 1024 * MIB;

    #[cfg(not(feature = "exclusive-memory-only"))]
    fn sliced(page: u64, slice: u64, cap: Option<u64>) -> MemoryPoolOptions {
        MemoryPoolOptions::new(PoolType::SlicedPages {
            page_size: page,
            max_slice_size: slice,
            max_pool_size: cap,
        })
    }

    fn error(text: &str) -> ConfigTextError {
        MemoryConfiguration::parse(text).unwrap_err()
    }

    #[test]
    fn sizes_read_binary_and_decimal_units() {
        assert_eq!(parse_size("512KiB"), Ok(512 * KIB));
        assert_eq!(parse_size("8 mib"), Ok(8 * MIB));
        assert_eq!(parse_size("1.5GiB"), Ok(3 * GIB / 2));
        assert_eq!(parse_size("64MB"), Ok(64_000_000));
        assert_eq!(parse_size("1_000"), Ok(1000));
        assert_eq!(parse_size("3B"), Ok(3));
        assert_eq!(parse_size("0.3B"), Err("is not a whole number of bytes"));
        assert!(parse_size("16EiB").is_err() && parse_size("1XB").is_err());
        assert_eq!(parse_size("99999999999TiB"), Err("does not fit in 64 bits"));
        assert!(parse_size("1..2").is_err() && parse_size("_1").is_err());
        assert!(parse_size("").is_err() && parse_size("MiB").is_err());
    }

    /// A fraction is read exactly whatever its number of digits: a tiny fraction of a
    /// byte is not a whole number of bytes (it was "does not fit in 64 bits" past 38
    /// digits, when the digits were read as one integer), zeros after the last digit
    /// change nothing, and the smallest fraction of a unit that is a byte reads as one.
    #[test]
    fn fractions_of_any_length_read_exactly() {
        let zeros = "0".repeat(60);
        let not_whole = Err("is not a whole number of bytes");
        assert_eq!(parse_size(&format!("0.{zeros}1")), not_whole);
        assert_eq!(parse_size(&format!("0.{zeros}1TiB")), not_whole);
        assert_eq!(parse_size(&format!("1.{zeros}")), Ok(1));
        assert_eq!(parse_size(&format!("1.5{zeros}KiB")), Ok(1536));
        assert_eq!(parse_size(&format!("0{zeros}2.25KiB")), Ok(2304));
        // 2^-40 TiB is one byte: 40 digits after the point.
        assert_eq!(
            parse_size("0.0000000000009094947017729282379150390625TiB"),
            Ok(1)
        );
        assert_eq!(parse_size("0.000_000_000_001TB"), Ok(1));
        assert_eq!(parse_size("0.1KB"), Ok(100));
        assert_eq!(parse_size("1.0001KB"), not_whole);
        assert_eq!(parse_size("18446744073709551615.0"), Ok(u64::MAX));
        assert_eq!(
            parse_size("18446744073709551616"),
            Err("does not fit in 64 bits")
        );
        assert_eq!(
            parse_size("16777215.999999TiB"),
            Err("is not a whole number of bytes")
        );
        assert_eq!(
            parse_size("16777215.99999904632568359375TiB"),
            Ok(u64::MAX - (1 << 20) + 1)
        );
        assert_eq!(parse_size("16777215.999999046325683593751TiB"), not_whole);
        assert_eq!(parse_size("16777216TiB"), Err("does not fit in 64 bits"));
    }

    #[test]
    fn sizes_are_written_exactly() {
        assert_eq!(format_size(0), "0B");
        assert_eq!(format_size(512 * KIB), "512KiB");
        assert_eq!(format_size(2 * GIB), "2GiB");
        assert_eq!(format_size(1_000_000), "1MB");
        assert_eq!(format_size(1000), "1KB");
        assert_eq!(format_size(1001), "1001B");
        assert_eq!(format_size(u64::MAX), format!("{}B", u64::MAX));
    }

    #[test]
    #[cfg(not(feature = "exclusive-memory-only"))]
    fn the_issue_example_reads_and_round_trips() {
        let text = "sliced(page=8MiB, max_slice=512KiB); sliced(page=32MiB, max_slice=4MiB, \
                    cap=256MiB); exclusive(max_alloc=2GiB, dealloc_period=5000)";
        let config = MemoryConfiguration::parse(text).unwrap();
        assert_eq!(
            config,
            MemoryConfiguration::Custom {
                pool_options: vec![
                    sliced(8 * MIB, 512 * KIB, None),
                    sliced(32 * MIB, 4 * MIB, Some(256 * MIB)),
                    MemoryPoolOptions {
                        pool_type: PoolType::ExclusivePages {
                            max_alloc_size: 2 * GIB
                        },
                        dealloc_period: Some(5000),
                    },
                ]
            }
        );
        assert_eq!(config.to_string(), text);
        assert_eq!(MemoryConfiguration::parse(&config.to_string()), Ok(config));
    }

    #[test]
    fn presets_read_by_either_name() {
        for name in ["exclusive_pages", "ExclusivePages", " exclusive-pages ;\n"] {
            assert_eq!(
                MemoryConfiguration::parse(name),
                Ok(MemoryConfiguration::ExclusivePages)
            );
        }
        assert_eq!(
            MemoryConfiguration::ExclusivePages.to_string(),
            "exclusive_pages"
        );
        // `default` is the name the command line gives the build's default layout.
        for name in ["default", "Default"] {
            assert_eq!(
                MemoryConfiguration::parse(name),
                Ok(MemoryConfiguration::default())
            );
        }
        let err = error("fancy");
        assert_eq!((err.position, err.error.kind()), (0, "UnknownPreset"));
        assert!(
            err.to_string().contains("sub_slices, exclusive_pages"),
            "{err}"
        );
    }

    #[test]
    fn comparison_models_are_refused_as_layouts_by_name() {
        for text in [
            "torch",
            "torch_expandable",
            "Torch-Expandable",
            "torch(max_split_size_mb=64)",
        ] {
            let err = error(text);
            assert_eq!(
                (err.position, err.error.kind()),
                (0, "ComparisonModel"),
                "{text}"
            );
            assert!(err.to_string().contains("not a pool layout"), "{err}");
        }
    }

    #[test]
    fn entries_split_on_new_lines_and_comments_are_ignored() {
        let text = "# small pools first\nexclusive(max_alloc=1KiB)  # tiny\n\ndirect()\n";
        assert_eq!(
            MemoryConfiguration::parse(text),
            Ok(MemoryConfiguration::Custom {
                pool_options: vec![
                    MemoryPoolOptions::new(PoolType::ExclusivePages {
                        max_alloc_size: KIB
                    }),
                    MemoryPoolOptions::new(PoolType::Direct { reclaim_at: None }),
                ]
            })
        );
    }

    #[test]
    fn errors_point_at_the_problem_and_name_it() {
        let cases: [(&str, usize, &str, Option<&str>); 12] = [
            ("", 0, "EmptyPoolList", None),
            ("exclusive(max_alloc=1KiB", 24, "Syntax", None),
            ("exclusive(max_alloc=1KiB) direct()", 26, "Syntax", None),
            ("bogus(x=1)", 0, "UnknownPoolKind", None),
            ("direct(page=1)", 7, "UnknownField", Some("page")),
            ("exclusive()", 0, "MissingField", Some("max_alloc")),
            (
                "exclusive(max_alloc=1, max_alloc=2)",
                23,
                "DuplicateField",
                Some("max_alloc"),
            ),
            (
                "exclusive(max_alloc=12XB)",
                20,
                "InvalidValue",
                Some("max_alloc"),
            ),
            (
                "direct(dealloc_period=5s)",
                22,
                "InvalidValue",
                Some("dealloc_period"),
            ),
            ("exclusive_pages; direct()", 0, "PresetInPoolList", None),
            (
                "direct(dealloc_period=0)",
                22,
                "ZeroSize",
                Some("dealloc_period"),
            ),
            ("sliced", 6, "Syntax", None),
        ];
        for (text, position, kind, field) in cases {
            let err = error(text);
            assert_eq!(
                (err.position, err.error.kind(), err.error.field()),
                (position, kind, field),
                "{text:?}: {err}"
            );
        }
    }

    #[test]
    #[cfg(not(feature = "exclusive-memory-only"))]
    fn validation_errors_point_at_the_field() {
        let err = error("sliced(page=1KiB, max_slice=2KiB)");
        assert_eq!(
            (err.position, err.error.kind()),
            (28, "SliceLargerThanPage")
        );
        let err = error("sliced(page=1KiB, max_slice=1KiB, cap=512B)");
        assert_eq!((err.position, err.error.kind()), (38, "CapSmallerThanPage"));
    }

    #[test]
    #[cfg(feature = "exclusive-memory-only")]
    fn exclusive_memory_only_builds_refuse_sliced_text() {
        let err = error("direct(); sliced(page=1KiB, max_slice=1KiB)");
        assert_eq!(
            (err.position, err.error.kind()),
            (10, "SlicedPoolsUnavailable")
        );
        let err = error("sub_slices");
        assert_eq!((err.position, err.error.kind()), (0, "PresetUnavailable"));
    }

    #[test]
    #[cfg(not(feature = "exclusive-memory-only"))]
    fn virtual_pools_read_with_defaults_and_write_what_differs() {
        let config = MemoryConfiguration::parse("virtual(granule=2MiB)").unwrap();
        assert_eq!(
            config,
            MemoryConfiguration::Custom {
                pool_options: vec![MemoryPoolOptions::new(PoolType::virtual_pages(2 * MIB))]
            }
        );
        assert_eq!(config.to_string(), "virtual(granule=2MiB)");
        for text in [
            "virtual(granule=64KiB, keep=64MiB, small=0B, range=4TiB)",
            "virtual(granule=2MiB, keep=none)",
        ] {
            let config = MemoryConfiguration::parse(text).unwrap();
            assert_eq!(config.to_string(), text);
        }
        for (text, position, kind, field) in [
            ("virtual()", 0, "MissingField", Some("granule")),
            (
                "virtual(granule=3MiB)",
                16,
                "GranuleNotPowerOfTwo",
                Some("granule"),
            ),
            (
                "virtual(granule=2MiB, range=1MiB)",
                28,
                "RangeSmallerThanGranule",
                Some("range"),
            ),
            ("virtual(granule=0)", 16, "ZeroSize", Some("granule")),
        ] {
            let err = error(text);
            assert_eq!(
                (err.position, err.error.kind(), err.error.field()),
                (position, kind, field),
                "{text:?}: {err}"
            );
        }
    }

    #[test]
    fn positions_count_characters_not_bytes() {
        let err = error("# é\nbogus()");
        assert_eq!(err.position, 4);
        assert_eq!(error("direct(reclaim_at=é)").position, 18);
    }

    #[test]
    fn too_many_pools_names_the_first_extra_entry() {
        let text = vec!["direct()"; MAX_POOLS + 1].join(";");
        let err = error(&text);
        assert_eq!(err.error, PoolConfigError::TooManyPools { count: 255 });
        assert_eq!(err.position, 9 * MAX_POOLS);
    }
}

#[cfg(test)]
mod folder_tests {
    use super::*;

    /// The plan file a layout read in `folder` would load, or the reason it is refused.
    fn planned_in(folder: &str) -> Result<String, ConfigTextError> {
        let parser = Parser {
            text: "",
            pos: 0,
            folder: Some(Path::new(folder)),
        };
        parser
            .plan_path("plan.json")
            .map_err(|reason| ConfigTextError {
                position: 0,
                error: PoolConfigError::Syntax {
                    expected: "a plan path",
                    found: reason.into(),
                },
            })
    }

    #[test]
    fn a_relative_plan_file_is_joined_to_the_folder_of_its_text() {
        assert_eq!(planned_in("proj").unwrap(), "proj/plan.json");
        assert_eq!(planned_in("/srv/proj").unwrap(), "/srv/proj/plan.json");
        // The working folder keeps the name as given.
        assert_eq!(planned_in(".").unwrap(), "plan.json");
        assert_eq!(planned_in("").unwrap(), "plan.json");
        // A folder the language cannot write back is refused, not joined into a name
        // whose text would read as another layout.
        for folder in ["a,b", "x(1)", "p;q", "k=v", "h#", " lead"] {
            assert!(planned_in(folder).is_err(), "{folder:?}");
        }
        let absolute = Parser {
            text: "",
            pos: 0,
            folder: Some(Path::new("proj")),
        };
        assert_eq!(
            absolute.plan_path("/abs/plan.json").unwrap(),
            "/abs/plan.json"
        );
    }
}
