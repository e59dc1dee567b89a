//! MiniMalloc's CSV format: buffers with lifetimes in, `id,lower,upper,size,offset` out.
//!
//! The header names the columns, in any order, as MiniMalloc's reader
//! (google/minimalloc `src/converter.cc`, `FromCsv`) names them:
//!
//! | column | aliases | what it holds |
//! |---|---|---|
//! | `id` | `buffer`, `buffer_id` | the buffer's name: non-empty, without quotes, used once |
//! | `lower` | `begin`, `start` | the first time the buffer lives |
//! | `upper` | `end` | the time after its last (`upper`), or its last time (`end`, inclusive: upper = end + 1, as MiniMalloc reads it) |
//! | `size` | | its bytes |
//! | `alignment` | | optional; only `1`, or an empty field, is read (cubepool places at any byte) |
//! | `hint` | | optional; only a negative number (MiniMalloc writes `-1` for "no hint"), or an empty field, is read (cubepool takes no offset hints) |
//! | `gaps` | | optional; only an empty field (or spaces) is read (a buffer lives its whole lifetime) |
//! | `offset` | | optional; ignored, so a placement's output can be placed again |
//!
//! So the current header `id,lower,upper,size`, MiniMalloc's older benchmark headers
//! `buffer,start,end,size` and `id,begin,end,size`, and this reader's own output
//! `id,lower,upper,size,offset` all read. A column by no such name is refused (where
//! MiniMalloc's reader passes over it: here a misspelt optional column would be read
//! as absent), and so are two columns for the same thing (`id` and `buffer`, `upper`
//! and `end`); so is a header
//! without the four required. Times and sizes are decimal integers below 2^64; an `end`
//! must be below 2^64 - 1 (its upper time, end + 1, is below 2^64).
//!
//! The output is always `id,lower,upper,size,offset` with half-open lifetimes: an `end`
//! input is written back as its upper time, end + 1, under `upper`; an id read from
//! `buffer` or `buffer_id` under `id`; `alignment`, `hint` and `gaps` are not written.
//!
//! Every data line has as many fields as the header (quoting is not supported). Lines
//! may end in `\r\n`; the last line may lack its newline; no line may be blank but the
//! last ones. Errors name the 1-based line (and the column, where one is at fault).

use std::collections::HashMap;
use std::io::Write;

use super::problem::Buffer;

/// The header the reader's usual input has (and its output, with `,offset`).
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
    #[error("line 1: the file is empty; expected a header such as {HEADER:?}")]
    Empty,
    /// A header names a column MiniMalloc's reader does not.
    #[error(
        "line 1: the header's column {position}, {column:?}, is not one of MiniMalloc's: \
         id (or buffer, buffer_id), lower (or begin, start), upper (or end, inclusive), \
         size, alignment, hint, gaps, offset"
    )]
    UnknownColumn {
        /// The 1-based position of the column in the header.
        position: usize,
        /// The column's name as found.
        column: String,
    },
    /// A header names the same column twice, or a column and its alias.
    #[error("line 1: {}", duplicate_message(column, first))]
    DuplicateColumn {
        /// The later column's name.
        column: &'static str,
        /// The earlier column's name (the same, or an alias of it).
        first: &'static str,
    },
    /// A header lacks a required column.
    #[error("line 1: the header {found:?} has no {column} column (MiniMalloc's CSV needs id, lower, upper and size)")]
    MissingColumn {
        /// The column missing, by its usual name.
        column: &'static str,
        /// The header as found.
        found: String,
    },
    /// A line is not UTF-8.
    #[error("line {line}: not UTF-8 text")]
    NotUtf8 {
        /// The line.
        line: usize,
    },
    /// A line has a different number of fields than the header.
    #[error("line {line}: expected {expected} fields ({header}), found {found}")]
    Fields {
        /// The line.
        line: usize,
        /// Fields the header has.
        expected: usize,
        /// The header.
        header: String,
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
        /// The column's name, as the header spells it.
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
    /// An inclusive `end` is before the lifetime's start.
    #[error(
        "line {line}: {lower_column} {lower} must be at most end {end} (end is the last time \
         the buffer lives)"
    )]
    EndBeforeLower {
        /// The line.
        line: usize,
        /// The lower column's name, as the header spells it.
        lower_column: &'static str,
        /// The lower time.
        lower: u64,
        /// The end (the last time).
        end: u64,
    },
    /// An inclusive `end` of 2^64 - 1, whose upper time (end + 1) is past 64 bits.
    #[error(
        "line {line}: {column} must be below 2^64 - 1, found {end}: an end is the last time \
         a buffer lives, and its upper time, {column} + 1, must be below 2^64"
    )]
    EndOverflow {
        /// The line.
        line: usize,
        /// The column's name (`end`).
        column: &'static str,
        /// The end as found.
        end: u64,
    },
    /// An `alignment`, `hint` or `gaps` field asks what cubepool cannot honour.
    #[error(
        "line {line}: {column} {text:?} is not supported: {}",
        unsupported_why(column)
    )]
    Unsupported {
        /// The line.
        line: usize,
        /// The column's name.
        column: &'static str,
        /// The field as found.
        text: String,
    },
}

fn duplicate_message(column: &str, first: &str) -> String {
    if column == first {
        format!("the header names the column {column:?} twice")
    } else {
        format!("the header's columns {first:?} and {column:?} are the same column (aliases)")
    }
}

fn unsupported_why(column: &str) -> &'static str {
    match column {
        ALIGNMENT => {
            "cubepool places buffers at any byte and does not support alignment; only an \
             alignment of 1, or an empty field, is read"
        }
        HINT => {
            "cubepool takes no offset hints; only a negative hint (MiniMalloc's -1 for \"no \
             hint\"), or an empty field, is read"
        }
        _ => {
            "cubepool does not support gaps (a buffer lives its whole lifetime); the field \
             must be empty"
        }
    }
}

impl CsvError {
    /// The 1-based line of the problem.
    pub fn line(&self) -> usize {
        match self {
            CsvError::Empty
            | CsvError::UnknownColumn { .. }
            | CsvError::DuplicateColumn { .. }
            | CsvError::MissingColumn { .. } => 1,
            CsvError::NotUtf8 { line }
            | CsvError::Fields { line, .. }
            | CsvError::BadId { line, .. }
            | CsvError::DuplicateId { line, .. }
            | CsvError::Number { line, .. }
            | CsvError::EmptyLifetime { line, .. }
            | CsvError::EndBeforeLower { line, .. }
            | CsvError::EndOverflow { line, .. }
            | CsvError::Unsupported { line, .. } => *line,
        }
    }
}

const ALIGNMENT: &str = "alignment";
const HINT: &str = "hint";
const GAPS: &str = "gaps";

/// What a column holds; each may appear once, under one of its names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Id,
    Lower,
    /// `upper` (half-open) or `end` (inclusive): one column either way.
    Upper,
    Size,
    Alignment,
    Hint,
    Gaps,
    Offset,
}

/// Every column name MiniMalloc's reader knows, with what it holds.
const NAMES: [(&str, Role); 13] = [
    ("id", Role::Id),
    ("buffer", Role::Id),
    ("buffer_id", Role::Id),
    ("lower", Role::Lower),
    ("begin", Role::Lower),
    ("start", Role::Lower),
    ("upper", Role::Upper),
    ("end", Role::Upper),
    ("size", Role::Size),
    (ALIGNMENT, Role::Alignment),
    (HINT, Role::Hint),
    (GAPS, Role::Gaps),
    ("offset", Role::Offset),
];

/// A column's place on a line and its name as the header spells it.
#[derive(Debug, Clone, Copy)]
struct Column {
    at: usize,
    name: &'static str,
}

/// Where a header puts each column.
#[derive(Debug)]
struct Columns {
    count: usize,
    header: String,
    id: usize,
    lower: Column,
    upper: Column,
    /// Whether the upper column is an inclusive `end`.
    inclusive: bool,
    size: Column,
    alignment: Option<usize>,
    hint: Option<usize>,
    gaps: Option<usize>,
}

impl Columns {
    fn read(header: &str) -> Result<Self, CsvError> {
        let mut found: [Option<Column>; 8] = [None; 8];
        let mut count = 0;
        for (at, name) in header.split(',').enumerate() {
            count += 1;
            let Some(&(name, role)) = NAMES.iter().find(|(known, _)| *known == name) else {
                return Err(CsvError::UnknownColumn {
                    position: at + 1,
                    column: name.chars().take(200).collect(),
                });
            };
            let slot = &mut found[role as usize];
            if let Some(first) = slot {
                return Err(CsvError::DuplicateColumn {
                    column: name,
                    first: first.name,
                });
            }
            *slot = Some(Column { at, name });
        }
        let required = |role: Role, column: &'static str| {
            found[role as usize].ok_or_else(|| CsvError::MissingColumn {
                column,
                found: header.to_string(),
            })
        };
        let id = required(Role::Id, "id")?;
        let lower = required(Role::Lower, "lower")?;
        let upper = required(Role::Upper, "upper")?;
        let size = required(Role::Size, "size")?;
        let optional = |role: Role| found[role as usize].map(|c| c.at);
        Ok(Columns {
            count,
            // Every name is a known one, none twice: at most some 60 bytes.
            header: header.to_string(),
            id: id.at,
            lower,
            upper,
            inclusive: upper.name == "end",
            size,
            alignment: optional(Role::Alignment),
            hint: optional(Role::Hint),
            gaps: optional(Role::Gaps),
        })
    }
}

/// Whether an `alignment`, `hint` or `gaps` field asks nothing of the placement.
fn asks_nothing(column: &str, text: &str) -> bool {
    match column {
        ALIGNMENT => alignment_is_none(text),
        HINT => hint_is_none(text),
        _ => gaps_are_none(text),
    }
}

/// Whether an `alignment` field asks nothing: `1` (in decimal digits) or empty.
fn alignment_is_none(text: &str) -> bool {
    text.is_empty() || (text.bytes().all(|c| c.is_ascii_digit()) && text.parse() == Ok(1u64))
}

/// Whether a `hint` field asks nothing: empty, or a negative decimal integer (MiniMalloc
/// reads a hint below 0 as none, and writes -1 for none).
fn hint_is_none(text: &str) -> bool {
    let negative = text
        .strip_prefix('-')
        .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|c| c.is_ascii_digit()));
    text.is_empty() || (negative && text.parse::<i64>().is_ok_and(|v| v < 0))
}

/// Whether a `gaps` field asks nothing: empty or spaces (MiniMalloc splits it at spaces
/// and skips empty pieces).
fn gaps_are_none(text: &str) -> bool {
    text.bytes().all(|c| c == b' ')
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
    let mut columns: Option<Columns> = None;
    let mut fields: Vec<&str> = Vec::new();
    for (k, raw) in lines.iter().enumerate() {
        let line = k + 1;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let text = std::str::from_utf8(raw).map_err(|_| CsvError::NotUtf8 { line })?;
        let Some(columns) = &columns else {
            columns = Some(Columns::read(text)?);
            continue;
        };
        fields.clear();
        fields.extend(text.split(','));
        if fields.len() != columns.count {
            return Err(CsvError::Fields {
                line,
                expected: columns.count,
                header: columns.header.clone(),
                found: fields.len(),
            });
        }
        let id = fields[columns.id];
        if id.is_empty() || id.contains('"') {
            return Err(CsvError::BadId {
                line,
                id: id.chars().take(200).collect(),
            });
        }
        let number = |column: Column| -> Result<u64, CsvError> {
            let text = fields[column.at];
            let digits = !text.is_empty() && text.bytes().all(|c| c.is_ascii_digit());
            match text.parse::<u64>() {
                Ok(value) if digits => Ok(value),
                _ => Err(CsvError::Number {
                    line,
                    column: column.name,
                    text: text.chars().take(200).collect(),
                }),
            }
        };
        let lower = number(columns.lower)?;
        let upper = number(columns.upper)?;
        let size = number(columns.size)?;
        let upper = if columns.inclusive {
            if lower > upper {
                return Err(CsvError::EndBeforeLower {
                    line,
                    lower_column: columns.lower.name,
                    lower,
                    end: upper,
                });
            }
            upper.checked_add(1).ok_or(CsvError::EndOverflow {
                line,
                column: columns.upper.name,
                end: upper,
            })?
        } else {
            upper
        };
        if lower >= upper {
            return Err(CsvError::EmptyLifetime { line, lower, upper });
        }
        let optional = [
            (columns.alignment, ALIGNMENT),
            (columns.hint, HINT),
            (columns.gaps, GAPS),
        ];
        for (at, column) in optional {
            if let Some(at) = at {
                if !asks_nothing(column, fields[at]) {
                    return Err(CsvError::Unsupported {
                        line,
                        column,
                        text: fields[at].chars().take(200).collect(),
                    });
                }
            }
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

/// Writes a placement as `id,lower,upper,size,offset` lines after that header, with
/// half-open lifetimes (whatever header the buffers were read under).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn buffer(lower: u64, upper: u64, size: u64) -> Buffer {
        Buffer { lower, upper, size }
    }

    fn read(text: &str) -> Result<CsvBuffers, CsvError> {
        read_csv(text.as_bytes())
    }

    /// Every header MiniMalloc reads gives the same buffers: its names in any order,
    /// the aliases, an inclusive `end`, and the optional columns where they ask nothing.
    #[test]
    fn every_minimalloc_header_form_reads() {
        let expected = CsvBuffers {
            ids: vec!["a".into(), "b".into()],
            buffers: vec![buffer(0, 3, 16), buffer(1, 2, 8)],
        };
        let forms = [
            "id,lower,upper,size\na,0,3,16\nb,1,2,8\n",
            // MiniMalloc's first benchmark files: inclusive ends.
            "buffer,start,end,size\na,0,2,16\nb,1,1,8\n",
            "id,begin,end,size\na,0,2,16\nb,1,1,8\n",
            "buffer_id,lower,upper,size\na,0,3,16\nb,1,2,8\n",
            "id,start,upper,size\na,0,3,16\nb,1,2,8\n",
            "id,begin,upper,size\na,0,3,16\nb,1,2,8\n",
            "buffer,lower,end,size\na,0,2,16\nb,1,1,8\n",
            // Any order.
            "size,upper,lower,id\n16,3,0,a\n8,2,1,b\n",
            "end,size,buffer,start\n2,16,a,0\n1,8,b,1\n",
            // Its output, and the optional columns asking nothing.
            "id,lower,upper,size,offset\na,0,3,16,0\nb,1,2,8,16\n",
            "id,lower,upper,size,offset\na,0,3,16,x\nb,1,2,8,\n",
            "id,lower,upper,size,alignment\na,0,3,16,1\nb,1,2,8,\n",
            "id,lower,upper,size,alignment\na,0,3,16,01\nb,1,2,8,1\n",
            "id,lower,upper,size,hint\na,0,3,16,-1\nb,1,2,8,\n",
            "id,lower,upper,size,hint\na,0,3,16,-7\nb,1,2,8,-1\n",
            "id,lower,upper,size,gaps\na,0,3,16,\nb,1,2,8,  \n",
            "gaps,hint,alignment,offset,id,start,end,size\n,-1,1,0,a,0,2,16\n,,,16,b,1,1,8\n",
            "\u{feff}buffer,start,end,size\r\na,0,2,16\r\nb,1,1,8\r\n\r\n",
        ];
        for form in forms {
            assert_eq!(read(form), Ok(expected.clone()), "{form:?}");
        }
        // A header alone is no buffers, in every form.
        assert_eq!(read("buffer,start,end,size\n").unwrap().buffers, []);
    }

    /// An `end` is inclusive: the output's upper is end + 1, and reading the output
    /// gives the same buffers.
    #[test]
    fn an_end_is_written_back_as_its_half_open_upper() {
        let read_end = read("buffer,start,end,size\nx,4,4,8\ny,0,9,1\n").unwrap();
        assert_eq!(read_end.buffers, [buffer(4, 5, 8), buffer(0, 10, 1)]);
        let mut out = Vec::new();
        write_csv(&mut out, &read_end.ids, &read_end.buffers, &[0, 8]).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text, "id,lower,upper,size,offset\nx,4,5,8,0\ny,0,10,1,8\n");
        assert_eq!(read(&text), Ok(read_end));
    }

    /// Errors at the header name its column; errors on a line name the line and, where
    /// one is at fault, the column as the header spells it.
    #[test]
    fn header_and_field_errors_name_the_line_and_column() {
        let max = u64::MAX;
        let cases: Vec<(String, usize, &str)> = vec![
            (
                "id,from,to,size\n".into(),
                1,
                "column 2, \"from\", is not one of",
            ),
            (
                "id,lower,upper,size,colour\n".into(),
                1,
                "column 5, \"colour\"",
            ),
            ("ID,lower,upper,size\n".into(), 1, "\"ID\""),
            ("id,lower,upper,size \n".into(), 1, "\"size \""),
            ("\na,0,1,2\n".into(), 1, "column 1, \"\""),
            (
                "id,lower,upper,size,id\n".into(),
                1,
                "names the column \"id\" twice",
            ),
            (
                "buffer,id,lower,upper,size\n".into(),
                1,
                "\"buffer\" and \"id\" are the same",
            ),
            (
                "id,lower,upper,end,size\n".into(),
                1,
                "\"upper\" and \"end\"",
            ),
            (
                "id,begin,start,end,size\n".into(),
                1,
                "\"begin\" and \"start\"",
            ),
            ("id,lower,size\n".into(), 1, "has no upper column"),
            ("buffer,start,end\n".into(), 1, "has no size column"),
            ("lower,upper,size\n".into(), 1, "has no id column"),
            ("id,upper,size,offset\n".into(), 1, "has no lower column"),
            (
                "buffer,start,end,size\na,0,1\n".into(),
                2,
                "expected 4 fields (buffer,start,end,size), found 3",
            ),
            (
                "id,lower,upper,size,offset\na,0,1,2\n".into(),
                2,
                "expected 5 fields (id,lower,upper,size,offset), found 4",
            ),
            (
                "buffer,start,end,size\na,x,1,2\n".into(),
                2,
                "start must be",
            ),
            ("buffer,start,end,size\na,0,-1,2\n".into(), 2, "end must be"),
            (
                "id,begin,end,size\na,0,1,2\nb,3,2,1\n".into(),
                3,
                "begin 3 must be at most end 2",
            ),
            (
                format!("id,start,end,size\na,0,{max},2\n"),
                2,
                "end must be below 2^64 - 1, found 18446744073709551615",
            ),
            (
                "id,lower,upper,size,alignment\na,0,1,2,8\n".into(),
                2,
                "alignment \"8\" is not supported",
            ),
            (
                "id,lower,upper,size,alignment\na,0,1,2,0\n".into(),
                2,
                "does not support alignment",
            ),
            (
                "id,lower,upper,size,alignment\na,0,1,2,x\n".into(),
                2,
                "alignment \"x\"",
            ),
            (
                "id,lower,upper,size,hint\na,0,1,2,0\n".into(),
                2,
                "hint \"0\" is not supported",
            ),
            (
                "id,lower,upper,size,hint\na,0,1,2,-0\n".into(),
                2,
                "hint \"-0\"",
            ),
            (
                "id,lower,upper,size,hint\na,0,1,2,64\n".into(),
                2,
                "takes no offset hints",
            ),
            (
                "id,lower,upper,size,hint\na,0,1,2,-99999999999999999999\n".into(),
                2,
                "hint",
            ),
            ("id,lower,upper,size,hint\na,0,1,2,- 1\n".into(), 2, "hint"),
            (
                "id,lower,upper,size,gaps\na,0,1,2,1-2\n".into(),
                2,
                "gaps \"1-2\" is not supported",
            ),
            (
                "buffer,start,end,size\na,0,1,2\na,0,1,2\n".into(),
                3,
                "already used on line 2",
            ),
            ("buffer,start,end,size\n\"a\",0,1,2\n".into(), 2, "quotes"),
            ("size,id,lower,upper\n2,,0,1\n".into(), 2, "non-empty"),
        ];
        for (text, line, says) in cases {
            let error = read(&text).unwrap_err();
            assert_eq!(error.line(), line, "{text:?}: {error}");
            let message = error.to_string();
            assert!(message.contains(says), "{text:?}: {message}");
            assert!(message.starts_with(&format!("line {line}: ")), "{message}");
        }
        // The largest end that reads: its upper is 2^64 - 1.
        let top = read(&format!("id,start,end,size\na,0,{},2\n", max - 1)).unwrap();
        assert_eq!(top.buffers, [buffer(0, max, 2)]);
    }
}
