//! MiniMalloc's CSV format: `id,lower,upper,size` in, `id,lower,upper,size,offset` out.
//!
//! The reader is strict: the header must be exactly `id,lower,upper,size`; every other
//! line has four fields, a non-empty id without quotes (quoting is not supported) seen
//! once, and three decimal integers below 2^64 with `lower < upper`. Lines may end in
//! `\r\n`; the last line may lack its newline; no line may be blank but a final empty
//! one. Errors name the 1-based line.

use std::collections::HashMap;
use std::io::Write;

use super::problem::Buffer;

/// The header the reader requires.
pub const HEADER: &str = "id,lower,upper,size";

/// Buffers read from CSV, with their ids, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvBuffers {
    /// The `id` of each buffer.
    pub ids: Vec<String>,
    /// The buffers.
    pub buffers: Vec<Buffer>,
}

/// Why CSV text is not a placement problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CsvError {
    /// The text is empty.
    #[error("line 1: the file is empty; expected the header {HEADER:?}")]
    Empty,
    /// The first line is not the header.
    #[error("line 1: the header must be {HEADER:?}, found {found:?}")]
    Header {
        /// The first line as found.
        found: String,
    },
    /// A line is not UTF-8.
    #[error("line {line}: not UTF-8 text")]
    NotUtf8 {
        /// The line.
        line: usize,
    },
    /// A line has the wrong number of fields.
    #[error("line {line}: expected 4 fields (id,lower,upper,size), found {found}")]
    Fields {
        /// The line.
        line: usize,
        /// Fields found.
        found: usize,
    },
    /// An id is empty or quoted.
    #[error("line {line}: the id {id:?} must be non-empty text without quotes")]
    BadId {
        /// The line.
        line: usize,
        /// The id as found.
        id: String,
    },
    /// An id was already used.
    #[error("line {line}: the id {id:?} was already used on line {first}")]
    DuplicateId {
        /// The line.
        line: usize,
        /// The id.
        id: String,
        /// The line it was first used on.
        first: usize,
    },
    /// A number field is not a decimal integer below 2^64.
    #[error(
        "line {line}: {column} must be a non-negative decimal integer below 2^64, found {text:?}"
    )]
    Number {
        /// The line.
        line: usize,
        /// The column's name.
        column: &'static str,
        /// The field as found.
        text: String,
    },
    /// A lifetime is empty or reversed.
    #[error("line {line}: lower {lower} must be below upper {upper}")]
    EmptyLifetime {
        /// The line.
        line: usize,
        /// The lower time.
        lower: u64,
        /// The upper time.
        upper: u64,
    },
}

impl CsvError {
    /// The 1-based line of the problem.
    pub fn line(&self) -> usize {
        match self {
            CsvError::Empty | CsvError::Header { .. } => 1,
            CsvError::NotUtf8 { line }
            | CsvError::Fields { line, .. }
            | CsvError::BadId { line, .. }
            | CsvError::DuplicateId { line, .. }
            | CsvError::Number { line, .. }
            | CsvError::EmptyLifetime { line, .. } => *line,
        }
    }
}

/// Reads MiniMalloc CSV text. A UTF-8 byte order mark at its start (which spreadsheets
/// on Windows write) is passed over, as the trace reader passes it over, and so are
/// blank lines at its end.
pub fn read_csv(data: &[u8]) -> Result<CsvBuffers, CsvError> {
    let data = data.strip_prefix("\u{feff}".as_bytes()).unwrap_or(data);
    if data.is_empty() {
        return Err(CsvError::Empty);
    }
    let mut lines: Vec<&[u8]> = data.split(|&c| c == b'\n').collect();
    // A final newline leaves one empty piece, which is no line; so do blank lines at
    // the end (MiniMalloc's reader stops at the first blank line, so files written for
    // it may end in one). A blank line with lines after it is still refused.
    while lines
        .last()
        .is_some_and(|l| l.strip_suffix(b"\r").unwrap_or(l).is_empty())
    {
        lines.pop();
    }
    let mut out = CsvBuffers {
        ids: Vec::new(),
        buffers: Vec::new(),
    };
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (k, raw) in lines.iter().enumerate() {
        let line = k + 1;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let text = std::str::from_utf8(raw).map_err(|_| CsvError::NotUtf8 { line })?;
        if line == 1 {
            if text != HEADER {
                return Err(CsvError::Header {
                    found: text.chars().take(200).collect(),
                });
            }
            continue;
        }
        let fields: Vec<&str> = text.split(',').collect();
        if fields.len() != 4 {
            return Err(CsvError::Fields {
                line,
                found: fields.len(),
            });
        }
        let id = fields[0];
        if id.is_empty() || id.contains('"') {
            return Err(CsvError::BadId {
                line,
                id: id.chars().take(200).collect(),
            });
        }
        let number = |column: &'static str, text: &str| -> Result<u64, CsvError> {
            let digits = !text.is_empty() && text.bytes().all(|c| c.is_ascii_digit());
            match text.parse::<u64>() {
                Ok(value) if digits => Ok(value),
                _ => Err(CsvError::Number {
                    line,
                    column,
                    text: text.chars().take(200).collect(),
                }),
            }
        };
        let lower = number("lower", fields[1])?;
        let upper = number("upper", fields[2])?;
        let size = number("size", fields[3])?;
        if lower >= upper {
            return Err(CsvError::EmptyLifetime { line, lower, upper });
        }
        if let Some(&first) = seen.get(id) {
            return Err(CsvError::DuplicateId {
                line,
                id: id.to_string(),
                first,
            });
        }
        seen.insert(id.to_string(), line);
        out.ids.push(id.to_string());
        out.buffers.push(Buffer { lower, upper, size });
    }
    if lines.is_empty() {
        return Err(CsvError::Empty);
    }
    Ok(out)
}

/// Writes a placement as `id,lower,upper,size,offset` lines after that header.
pub fn write_csv(
    mut out: impl Write,
    ids: &[String],
    buffers: &[Buffer],
    offsets: &[u64],
) -> std::io::Result<()> {
    writeln!(out, "{HEADER},offset")?;
    for ((id, b), offset) in ids.iter().zip(buffers).zip(offsets) {
        writeln!(out, "{id},{},{},{},{offset}", b.lower, b.upper, b.size)?;
    }
    out.flush()
}
