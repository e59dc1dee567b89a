//! TVM data types (`DLDataType`): a type code, a bit width and a lane count.

use std::fmt;

use super::error::TensorError;

/// DLPack's type codes (`DLDataTypeCode`), as TVM writes them in its files.
pub mod code {
    /// Signed integer.
    pub const INT: u8 = 0;
    /// Unsigned integer (also the old encoding of `bool`, with 1 bit).
    pub const UINT: u8 = 1;
    /// IEEE floating point.
    pub const FLOAT: u8 = 2;
    /// Brain floating point (`bfloat16`).
    pub const BFLOAT: u8 = 4;
    /// Complex numbers (not supported by cubepool tensors).
    pub const COMPLEX: u8 = 5;
    /// Boolean, one byte per element.
    pub const BOOL: u8 = 6;
}

/// A tensor element type in TVM's `DLDataType` layout.
///
/// Invariant (for values built by [`DataType::new`] or [`DataType::parse`]): the type is one
/// of the supported scalar types (`int8..int64`, `uint8..uint64`, `float16/32/64`, `bfloat16`,
/// `bool`) and `lanes >= 1`, so an element always occupies a whole number of bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DataType {
    /// DLPack type code (see [`code`]).
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Vector lanes per element (1 for scalars).
    pub lanes: u16,
}

impl DataType {
    /// `bool`, stored as one byte per element (DLPack `kDLBool`, 8 bits).
    pub const BOOL: DataType = DataType {
        code: code::BOOL,
        bits: 8,
        lanes: 1,
    };
    /// `uint8`, the type of backing buffers.
    pub const UINT8: DataType = DataType {
        code: code::UINT,
        bits: 8,
        lanes: 1,
    };

    /// Validates a raw `(code, bits, lanes)` triple.
    ///
    /// The old bool encoding `(uint, 1 bit)` is accepted and normalised to [`DataType::BOOL`]:
    /// both are one byte per element.
    pub fn new(code: u8, bits: u8, lanes: u16) -> Result<DataType, TensorError> {
        let unsupported = TensorError::UnsupportedDtype { code, bits, lanes };
        if lanes == 0 {
            return Err(unsupported);
        }
        let ok = match code {
            code::INT => matches!(bits, 8 | 16 | 32 | 64),
            code::UINT if bits == 1 && lanes == 1 => return Ok(DataType::BOOL),
            code::UINT => matches!(bits, 8 | 16 | 32 | 64),
            code::FLOAT => matches!(bits, 16 | 32 | 64),
            code::BFLOAT => bits == 16,
            code::BOOL => bits == 8,
            _ => false,
        };
        if ok {
            Ok(DataType { code, bits, lanes })
        } else {
            Err(unsupported)
        }
    }

    /// Parses a TVM dtype string: `"float32"`, `"bfloat16"`, `"int8"`, `"uint64"`, `"bool"`,
    /// with an optional lane suffix (`"float32x4"`).
    pub fn parse(name: &str) -> Result<DataType, TensorError> {
        let unknown = || TensorError::UnknownDtype {
            name: name.to_owned(),
        };
        let (base, lanes) = match name.split_once('x') {
            Some((base, lanes)) => {
                let lanes: u16 = lanes.parse().map_err(|_| unknown())?;
                (base, lanes)
            }
            None => (name, 1),
        };
        if lanes == 0 {
            return Err(unknown());
        }
        let (code, bits) = match base {
            "bool" => (code::BOOL, 8),
            "bfloat16" => (code::BFLOAT, 16),
            _ => {
                let (code, digits) = if let Some(d) = base.strip_prefix("uint") {
                    (code::UINT, d)
                } else if let Some(d) = base.strip_prefix("int") {
                    (code::INT, d)
                } else if let Some(d) = base.strip_prefix("float") {
                    (code::FLOAT, d)
                } else {
                    return Err(unknown());
                };
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(unknown());
                }
                (code, digits.parse::<u8>().map_err(|_| unknown())?)
            }
        };
        match DataType::new(code, bits, lanes) {
            // `uint1` would silently become bool: not a name TVM users write for bool.
            Ok(dt) if !(code == code::UINT && bits == 1) => Ok(dt),
            _ => Err(unknown()),
        }
    }

    /// Bytes per element: `ceil(bits * lanes / 8)`, as TVM's `GetDataSize` computes it.
    pub fn itemsize(self) -> usize {
        (usize::from(self.bits) * usize::from(self.lanes)).div_ceil(8)
    }

    /// Bytes per lane (the scalar width).
    pub fn lane_bytes(self) -> usize {
        usize::from(self.bits).div_ceil(8)
    }

    /// The natural alignment of one lane, a power of two.
    pub fn natural_alignment(self) -> usize {
        self.lane_bytes().max(1).next_power_of_two()
    }

    /// The alignment TVM's `Empty` uses: `max(64, bits / 8 * lanes)`, rounded up to a power
    /// of two.
    pub fn alloc_alignment(self) -> usize {
        self.itemsize()
            .max(super::ALLOC_ALIGNMENT)
            .next_power_of_two()
    }

    /// The struct-module format character of one lane for the buffer protocol.
    ///
    /// `bfloat16` has no format character: it is exported as `'H'` (its raw 16 bits).
    pub fn format_char(self) -> &'static str {
        match (self.code, self.bits) {
            (code::INT, 8) => "b",
            (code::INT, 16) => "h",
            (code::INT, 32) => "i",
            (code::INT, 64) => "q",
            (code::UINT, 16) => "H",
            (code::UINT, 32) => "I",
            (code::UINT, 64) => "Q",
            (code::FLOAT, 16) => "e",
            (code::FLOAT, 32) => "f",
            (code::FLOAT, 64) => "d",
            (code::BFLOAT, 16) => "H",
            (code::BOOL, _) => "?",
            _ => "B",
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.code {
            code::BOOL => f.write_str("bool")?,
            code::INT => write!(f, "int{}", self.bits)?,
            code::UINT => write!(f, "uint{}", self.bits)?,
            code::FLOAT => write!(f, "float{}", self.bits)?,
            code::BFLOAT => write!(f, "bfloat{}", self.bits)?,
            other => write!(f, "code{other}_{}", self.bits)?,
        }
        if self.lanes != 1 {
            write!(f, "x{}", self.lanes)?;
        }
        Ok(())
    }
}

/// Whether a buffer of struct-module format `format` holds plain numbers or bytes, whose
/// bytes a tensor may read and write: codes of numbers (`?bBhHiIlLqQnNefdg`, complex
/// `Zf`/`Zd`/`Zg`), characters and byte strings (`cuwspx`), with byte orders, repeat
/// counts, subarray shapes (`(2,3)d`) and structures of those (`T{<i:a:d:b:}`, as numpy
/// and ctypes export structured items). Refused: Python objects (`O`: an object array's
/// items are pointers the array owns, so bytes written over them would later be freed
/// as objects), pointers (`&`, `P`, and ctypes' string pointers `z` and `Z` alone,
/// which ctypes follows when an item is read), function pointers and anything else.
pub fn is_plain_buffer_format(format: &[u8]) -> bool {
    const PLAIN: &[u8] = b"?bBhHiIlLqQnNefdgcuwspx";
    let mut depth = 0usize;
    let mut items = 0usize;
    let mut at = 0;
    while let Some(&code) = format.get(at) {
        match code {
            b'@' | b'=' | b'<' | b'>' | b'!' | b'0'..=b'9' | b'(' | b')' | b',' | b' ' => {}
            b'T' if format.get(at + 1) == Some(&b'{') => {
                depth += 1;
                at += 1;
            }
            b'}' if depth > 0 => depth -= 1,
            // A field's name, `:name:`, after its item.
            b':' => match format[at + 1..].iter().position(|&c| c == b':') {
                Some(length) => at += length + 1,
                None => return false,
            },
            b'Z' if matches!(format.get(at + 1), Some(b'f' | b'd' | b'g')) => {
                items += 1;
                at += 1;
            }
            code if PLAIN.contains(&code) => items += 1,
            _ => return false,
        }
        at += 1;
    }
    depth == 0 && items > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_round_trips_every_supported_name() {
        for name in [
            "bool",
            "int8",
            "int16",
            "int32",
            "int64",
            "uint8",
            "uint16",
            "uint32",
            "uint64",
            "float16",
            "float32",
            "float64",
            "bfloat16",
            "float32x4",
            "int8x3",
        ] {
            let dt = DataType::parse(name).unwrap();
            assert_eq!(dt.to_string(), name);
        }
    }

    #[test]
    fn parse_rejects_garbage() {
        for name in [
            "",
            "float",
            "float8",
            "int7",
            "uint1",
            "float32x0",
            "float32x",
            "x4",
            "bool16",
            "bfloat32",
            "complex64",
            "int+8",
            "float32x70000",
        ] {
            assert!(DataType::parse(name).is_err(), "{name}");
        }
    }

    #[test]
    fn sizes_and_alignment() {
        let f32 = DataType::parse("float32").unwrap();
        assert_eq!(
            (
                f32.itemsize(),
                f32.alloc_alignment(),
                f32.natural_alignment()
            ),
            (4, 64, 4)
        );
        let big = DataType::parse("float64x24").unwrap();
        assert_eq!((big.itemsize(), big.alloc_alignment()), (192, 256));
        assert_eq!(DataType::BOOL.itemsize(), 1);
        assert_eq!(DataType::new(code::UINT, 1, 1).unwrap(), DataType::BOOL);
        assert!(DataType::new(code::COMPLEX, 64, 1).is_err());
        assert!(DataType::new(code::FLOAT, 32, 0).is_err());
    }

    #[test]
    fn numbers_bytes_and_their_structures_are_plain_objects_and_pointers_are_not() {
        let plain = [
            "B",
            "<d",
            "@i",
            "=q",
            "Zd",
            "<Zf",
            "?",
            "e",
            "16s",
            "4w",
            "<u",
            "c",
            ">H",
            "T{<i:a:=d:b:}",
            "T{B:a:xxxi:b:}",
            "(2,3)d",
            "T{<i:a:T{<h:c:}:d:}",
        ];
        for format in plain {
            assert!(is_plain_buffer_format(format.as_bytes()), "{format}");
        }
        let other = [
            "O",
            "<O",
            "&i",
            "P",
            "<P",
            "<z",
            "<Z",
            "Z",
            "T{<i:a:O:b:}",
            "T{O:x:}",
            "T{<i:a:",
            "T{<i:a:<z:s:}",
            "",
            "<",
            "X{}",
            "T{}",
            ":a:",
        ];
        for format in other {
            assert!(!is_plain_buffer_format(format.as_bytes()), "{format}");
        }
    }
}
