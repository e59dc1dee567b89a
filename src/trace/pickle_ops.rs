//! The opcodes of a pickle, read one at a time and run by nothing here: the reading half
//! of cubepool's restricted unpickler for PyTorch memory snapshots. The other half, in
//! the Python bindings, builds plain containers and scalars from the opcodes this
//! yields and refuses every [`Refused`] one, so no code named by a pickle ever runs.
//!
//! The format is Python's (`Lib/pickle.py`, protocols 0 to 5; `pickletools` documents
//! every opcode): a stream of one-byte opcodes, each followed by an argument of a fixed
//! size, a length and that many bytes, or a line ending in `\n`. [`Ops`] reads them in
//! order until `STOP`, checking that every argument lies inside the data before it
//! hands out a slice of it, so a length field never makes anything allocate: a forged
//! length is [`PickleError::Truncated`]. `FRAME` is read and passed over (frames only
//! tell a reader how much to buffer; the opcodes run on across them as if there were
//! none, as the C unpickler reads data it holds whole).

use thiserror::Error;

/// Why a pickle could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PickleError {
    /// The data ends inside an opcode's argument, or before a `STOP`.
    #[error("the data ends inside {opcode} at byte {at} (a pickle cut short)")]
    Truncated {
        /// The opcode whose argument is cut short (`STOP` when none follows).
        opcode: &'static str,
        /// Where the opcode starts.
        at: usize,
    },
    /// A byte that is no pickle opcode.
    #[error("invalid opcode {byte:#04x} at byte {at}")]
    UnknownOpcode {
        /// The byte read.
        byte: u8,
        /// Where it is.
        at: usize,
    },
    /// A signed length field below zero.
    #[error("{opcode} at byte {at} has a negative length")]
    NegativeLength {
        /// The opcode.
        opcode: &'static str,
        /// Where it starts.
        at: usize,
    },
    /// A memo index written as text that is not a decimal number below 2^64.
    #[error("{opcode} at byte {at} has a memo index that is not a number")]
    BadMemoIndex {
        /// The opcode.
        opcode: &'static str,
        /// Where it starts.
        at: usize,
    },
}

/// An opcode that would run code or reach outside the pickle: refused by cubepool's
/// unpickler, which builds plain values only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refused<'a> {
    /// `GLOBAL` (`c`): a module and a name, each a line.
    Global {
        /// The module, as written.
        module: &'a [u8],
        /// The name, as written.
        name: &'a [u8],
    },
    /// `INST` (`i`): a class by module and name, called with the items since the mark.
    Inst {
        /// The module, as written.
        module: &'a [u8],
        /// The name, as written.
        name: &'a [u8],
    },
    /// `STACK_GLOBAL`: a module and a name taken from the stack.
    StackGlobal,
    /// `EXT1`, `EXT2`, `EXT4`: a global by its copyreg extension code.
    Extension(u32),
    /// `PERSID` or `BINPERSID`: an object outside the pickle.
    PersistentId,
    /// `REDUCE`, `BUILD`, `OBJ`, `NEWOBJ`, `NEWOBJ_EX`: a call (of a global) or a state
    /// set on an object; named by the opcode.
    Call(&'static str),
    /// `NEXT_BUFFER` or `READONLY_BUFFER`: protocol 5's out-of-band buffers.
    OutOfBandBuffer,
}

/// One opcode with its argument (a later protocol may add opcodes).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Op<'a> {
    /// `PROTO`: the protocol the pickle was written with.
    Proto(u8),
    /// `FRAME`: the size of the frame that follows (a hint only).
    Frame(u64),
    /// `STOP`: the end; the value on top of the stack is the pickle's.
    Stop,
    /// `MARK`: pushes a mark on the stack.
    Mark,
    /// `POP`: drops the top of the stack (or the topmost mark, when nothing is above it).
    Pop,
    /// `POP_MARK`: drops everything down to the topmost mark, and the mark.
    PopMark,
    /// `DUP`: pushes the top of the stack again.
    Dup,
    /// `NONE`.
    None,
    /// `NEWTRUE`, `NEWFALSE`.
    Bool(bool),
    /// `BININT`, `BININT1`, `BININT2`.
    Int(i64),
    /// `INT` (`I`): a line Python reads with `int(line, 0)`, or `00`/`01` for a bool.
    IntLine(&'a [u8]),
    /// `LONG` (`L`): a line Python reads with `int(line, 0)` after a trailing `L`.
    LongLine(&'a [u8]),
    /// `LONG1`, `LONG4`: an integer of these bytes, little-endian two's complement.
    Long(&'a [u8]),
    /// `FLOAT` (`F`): a line Python reads with `float(line)`.
    FloatLine(&'a [u8]),
    /// `BINFLOAT`.
    Float(f64),
    /// `BINUNICODE`, `SHORT_BINUNICODE`, `BINUNICODE8`: UTF-8 (surrogates allowed).
    Unicode(&'a [u8]),
    /// `UNICODE` (`V`): a line in Python's raw-unicode-escape encoding.
    UnicodeLine(&'a [u8]),
    /// `BINSTRING`, `SHORT_BINSTRING`: a Python 2 `str`, read as ASCII text.
    String(&'a [u8]),
    /// `STRING` (`S`): a quoted Python 2 `str` literal, escapes and all.
    StringLine(&'a [u8]),
    /// `BINBYTES`, `SHORT_BINBYTES`, `BINBYTES8`.
    Bytes(&'a [u8]),
    /// `BYTEARRAY8`.
    ByteArray(&'a [u8]),
    /// `EMPTY_LIST`.
    EmptyList,
    /// `APPEND`: pops a value and appends it to the list below it.
    Append,
    /// `APPENDS`: appends the items since the topmost mark to the list below it.
    Appends,
    /// `LIST`: a list of the items since the topmost mark.
    List,
    /// `EMPTY_TUPLE`.
    EmptyTuple,
    /// `TUPLE`: a tuple of the items since the topmost mark.
    Tuple,
    /// `TUPLE1`, `TUPLE2`, `TUPLE3`: a tuple of the top 1, 2 or 3 items.
    TupleOf(u8),
    /// `EMPTY_DICT`.
    EmptyDict,
    /// `DICT`: a dict of the key, value pairs since the topmost mark.
    Dict,
    /// `SETITEM`: pops a value and a key and sets them in the dict below.
    SetItem,
    /// `SETITEMS`: sets the pairs since the topmost mark in the dict below it.
    SetItems,
    /// `EMPTY_SET`.
    EmptySet,
    /// `ADDITEMS`: adds the items since the topmost mark to the set below it.
    AddItems,
    /// `FROZENSET`: a frozenset of the items since the topmost mark.
    FrozenSet,
    /// `GET`, `BINGET`, `LONG_BINGET`: pushes the memo's value at this index (`None`:
    /// a text index past 2^64, which no memo holds).
    Get(Option<u64>),
    /// `PUT`, `BINPUT`, `LONG_BINPUT`: stores the top of the stack in the memo.
    Put(u64),
    /// `MEMOIZE`: stores the top of the stack at the memo's next index.
    Memoize,
    /// An opcode cubepool's unpickler refuses.
    Refused(Refused<'a>),
}

/// The opcodes of a pickle, in order, up to and including `STOP`.
#[derive(Debug, Clone)]
pub struct Ops<'a> {
    data: &'a [u8],
    /// The next byte to read. Invariant: at most `data.len()`.
    at: usize,
    /// Where the opcode being read starts.
    start: usize,
}

impl<'a> Ops<'a> {
    /// The opcodes of `data`, from its first byte.
    pub fn new(data: &'a [u8]) -> Self {
        Self {
            data,
            at: 0,
            start: 0,
        }
    }

    /// Where the next opcode starts: after `STOP`, the bytes the pickle took.
    pub fn position(&self) -> usize {
        self.at
    }

    /// Reads the next opcode. After `STOP` the caller stops: the bytes after it are
    /// not the pickle's (Python's `pickle.loads` leaves them unread too).
    pub fn next_op(&mut self) -> Result<Op<'a>, PickleError> {
        self.start = self.at;
        let Some(&code) = self.data.get(self.at) else {
            return Err(self.truncated("STOP"));
        };
        self.at += 1;
        Ok(match code {
            b'\x80' => Op::Proto(self.fixed::<1>("PROTO")?[0]),
            b'\x95' => Op::Frame(u64::from_le_bytes(self.fixed("FRAME")?)),
            b'.' => Op::Stop,
            b'(' => Op::Mark,
            b'0' => Op::Pop,
            b'1' => Op::PopMark,
            b'2' => Op::Dup,
            b'N' => Op::None,
            b'\x88' => Op::Bool(true),
            b'\x89' => Op::Bool(false),
            b'J' => Op::Int(i32::from_le_bytes(self.fixed("BININT")?).into()),
            b'K' => Op::Int(self.fixed::<1>("BININT1")?[0].into()),
            b'M' => Op::Int(u16::from_le_bytes(self.fixed("BININT2")?).into()),
            b'I' => Op::IntLine(self.line("INT")?),
            b'L' => Op::LongLine(self.line("LONG")?),
            b'\x8a' => Op::Long(self.counted_u8("LONG1")?),
            b'\x8b' => Op::Long(self.counted_i32("LONG4")?),
            b'F' => Op::FloatLine(self.line("FLOAT")?),
            b'G' => Op::Float(f64::from_be_bytes(self.fixed("BINFLOAT")?)),
            b'X' => Op::Unicode(self.counted_u32("BINUNICODE")?),
            b'\x8c' => Op::Unicode(self.counted_u8("SHORT_BINUNICODE")?),
            b'\x8d' => Op::Unicode(self.counted_u64("BINUNICODE8")?),
            b'V' => Op::UnicodeLine(self.line("UNICODE")?),
            b'T' => Op::String(self.counted_i32("BINSTRING")?),
            b'U' => Op::String(self.counted_u8("SHORT_BINSTRING")?),
            b'S' => Op::StringLine(self.line("STRING")?),
            b'B' => Op::Bytes(self.counted_u32("BINBYTES")?),
            b'C' => Op::Bytes(self.counted_u8("SHORT_BINBYTES")?),
            b'\x8e' => Op::Bytes(self.counted_u64("BINBYTES8")?),
            b'\x96' => Op::ByteArray(self.counted_u64("BYTEARRAY8")?),
            b']' => Op::EmptyList,
            b'a' => Op::Append,
            b'e' => Op::Appends,
            b'l' => Op::List,
            b')' => Op::EmptyTuple,
            b't' => Op::Tuple,
            b'\x85' => Op::TupleOf(1),
            b'\x86' => Op::TupleOf(2),
            b'\x87' => Op::TupleOf(3),
            b'}' => Op::EmptyDict,
            b'd' => Op::Dict,
            b's' => Op::SetItem,
            b'u' => Op::SetItems,
            b'\x8f' => Op::EmptySet,
            b'\x90' => Op::AddItems,
            b'\x91' => Op::FrozenSet,
            b'g' => Op::Get(self.memo_line("GET")?),
            b'h' => Op::Get(Some(self.fixed::<1>("BINGET")?[0].into())),
            b'j' => Op::Get(Some(u32::from_le_bytes(self.fixed("LONG_BINGET")?).into())),
            b'p' => match self.memo_line("PUT")? {
                Some(index) => Op::Put(index),
                None => return Err(self.bad_memo_index("PUT")),
            },
            b'q' => Op::Put(self.fixed::<1>("BINPUT")?[0].into()),
            b'r' => Op::Put(u32::from_le_bytes(self.fixed("LONG_BINPUT")?).into()),
            b'\x94' => Op::Memoize,
            b'c' => Op::Refused(Refused::Global {
                module: self.line("GLOBAL")?,
                name: self.line("GLOBAL")?,
            }),
            b'i' => Op::Refused(Refused::Inst {
                module: self.line("INST")?,
                name: self.line("INST")?,
            }),
            b'\x93' => Op::Refused(Refused::StackGlobal),
            b'\x82' => Op::Refused(Refused::Extension(self.fixed::<1>("EXT1")?[0].into())),
            b'\x83' => Op::Refused(Refused::Extension(
                u16::from_le_bytes(self.fixed("EXT2")?).into(),
            )),
            b'\x84' => Op::Refused(Refused::Extension(u32::from_le_bytes(self.fixed("EXT4")?))),
            b'P' => {
                self.line("PERSID")?;
                Op::Refused(Refused::PersistentId)
            }
            b'Q' => Op::Refused(Refused::PersistentId),
            b'R' => Op::Refused(Refused::Call("REDUCE")),
            b'b' => Op::Refused(Refused::Call("BUILD")),
            b'o' => Op::Refused(Refused::Call("OBJ")),
            b'\x81' => Op::Refused(Refused::Call("NEWOBJ")),
            b'\x92' => Op::Refused(Refused::Call("NEWOBJ_EX")),
            b'\x97' | b'\x98' => Op::Refused(Refused::OutOfBandBuffer),
            byte => {
                return Err(PickleError::UnknownOpcode {
                    byte,
                    at: self.start,
                })
            }
        })
    }

    fn truncated(&self, opcode: &'static str) -> PickleError {
        PickleError::Truncated {
            opcode,
            at: self.start,
        }
    }

    fn bad_memo_index(&self, opcode: &'static str) -> PickleError {
        PickleError::BadMemoIndex {
            opcode,
            at: self.start,
        }
    }

    /// The next `n` bytes, or `Truncated` where fewer are left.
    fn take(&mut self, n: u64, opcode: &'static str) -> Result<&'a [u8], PickleError> {
        let left = self.data.len() - self.at;
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= left)
            .ok_or_else(|| self.truncated(opcode))?;
        let bytes = &self.data[self.at..self.at + n];
        self.at += n;
        Ok(bytes)
    }

    fn fixed<const N: usize>(&mut self, opcode: &'static str) -> Result<[u8; N], PickleError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N as u64, opcode)?);
        Ok(out)
    }

    fn counted_u8(&mut self, opcode: &'static str) -> Result<&'a [u8], PickleError> {
        let n = self.fixed::<1>(opcode)?[0];
        self.take(n.into(), opcode)
    }

    fn counted_u32(&mut self, opcode: &'static str) -> Result<&'a [u8], PickleError> {
        let n = u32::from_le_bytes(self.fixed(opcode)?);
        self.take(n.into(), opcode)
    }

    fn counted_i32(&mut self, opcode: &'static str) -> Result<&'a [u8], PickleError> {
        let n = i32::from_le_bytes(self.fixed(opcode)?);
        let n = u64::try_from(n).map_err(|_| PickleError::NegativeLength {
            opcode,
            at: self.start,
        })?;
        self.take(n, opcode)
    }

    fn counted_u64(&mut self, opcode: &'static str) -> Result<&'a [u8], PickleError> {
        let n = u64::from_le_bytes(self.fixed(opcode)?);
        self.take(n, opcode)
    }

    /// The bytes up to the next `\n`, which is read and left out.
    fn line(&mut self, opcode: &'static str) -> Result<&'a [u8], PickleError> {
        let rest = &self.data[self.at..];
        let end = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| self.truncated(opcode))?;
        self.at += end + 1;
        Ok(&rest[..end])
    }

    /// A memo index written as a decimal line (Python reads it with `int(line)`):
    /// `None` where it is a number past 2^64 - 1, which no memo can hold.
    fn memo_line(&mut self, opcode: &'static str) -> Result<Option<u64>, PickleError> {
        let line = self.line(opcode)?.trim_ascii();
        let digits = line.strip_prefix(b"+").unwrap_or(line);
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return Err(self.bad_memo_index(opcode));
        }
        Ok(digits.iter().try_fold(0u64, |n, &d| {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(data: &[u8]) -> Result<Vec<Op<'_>>, PickleError> {
        let mut ops = Ops::new(data);
        let mut out = Vec::new();
        loop {
            let op = ops.next_op()?;
            out.push(op);
            if op == Op::Stop {
                return Ok(out);
            }
        }
    }

    #[test]
    fn reads_a_protocol_4_dict_as_python_writes_it() {
        // pickle.dumps({"a": [1, -2, 300, 2.5]}, protocol=4)
        let data = b"\x80\x04\x95\x1f\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01a\x94]\x94(K\x01J\xfe\xff\xff\xffM,\x01G@\x04\x00\x00\x00\x00\x00\x00es.";
        assert_eq!(
            ops(data).unwrap(),
            [
                Op::Proto(4),
                Op::Frame(31),
                Op::EmptyDict,
                Op::Memoize,
                Op::Unicode(b"a"),
                Op::Memoize,
                Op::EmptyList,
                Op::Memoize,
                Op::Mark,
                Op::Int(1),
                Op::Int(-2),
                Op::Int(300),
                Op::Float(2.5),
                Op::Appends,
                Op::SetItem,
                Op::Stop,
            ]
        );
    }

    #[test]
    fn a_length_past_the_data_is_truncated_without_allocating() {
        // BINUNICODE8 of 2^64 - 1 bytes, and BINBYTES of 4 GiB - 1, in a few bytes.
        let huge = b"\x8d\xff\xff\xff\xff\xff\xff\xff\xffab.";
        assert_eq!(
            ops(huge),
            Err(PickleError::Truncated {
                opcode: "BINUNICODE8",
                at: 0
            })
        );
        let data = b"N\x80\x05B\xff\xff\xff\xff.";
        assert_eq!(
            ops(data),
            Err(PickleError::Truncated {
                opcode: "BINBYTES",
                at: 3
            })
        );
        assert!(matches!(
            ops(b"}"),
            Err(PickleError::Truncated { opcode: "STOP", .. })
        ));
        assert!(matches!(
            ops(b"J\x01\x02"),
            Err(PickleError::Truncated {
                opcode: "BININT",
                ..
            })
        ));
        assert!(matches!(
            ops(b"I12"),
            Err(PickleError::Truncated { opcode: "INT", .. })
        ));
    }

    #[test]
    fn negative_lengths_unknown_bytes_and_bad_indices_are_named() {
        assert_eq!(
            ops(b"T\xff\xff\xff\xffx."),
            Err(PickleError::NegativeLength {
                opcode: "BINSTRING",
                at: 0
            })
        );
        assert_eq!(
            ops(b"N\xff."),
            Err(PickleError::UnknownOpcode { byte: 0xff, at: 1 })
        );
        assert_eq!(
            ops(b"Np-1\n."),
            Err(PickleError::BadMemoIndex {
                opcode: "PUT",
                at: 1
            })
        );
        let huge_put = [b"Np".as_slice(), &[b'9'; 30], b"\n."].concat();
        assert!(matches!(
            ops(&huge_put),
            Err(PickleError::BadMemoIndex { .. })
        ));
        // A GET past 2^64 names an index no memo holds; the builder says so.
        let huge_get = [b"g".as_slice(), &[b'9'; 30], b"\n."].concat();
        assert_eq!(ops(&huge_get).unwrap()[0], Op::Get(None));
        assert_eq!(ops(b"g +12 \n.").unwrap()[0], Op::Get(Some(12)));
    }

    #[test]
    fn every_opcode_that_reaches_outside_the_pickle_is_refused() {
        fn refused(data: &[u8]) -> Op<'_> {
            ops(data).unwrap()[0]
        }
        assert_eq!(
            refused(b"cos\nsystem\n."),
            Op::Refused(Refused::Global {
                module: b"os",
                name: b"system"
            })
        );
        assert_eq!(
            refused(b"ibuiltins\nlist\n."),
            Op::Refused(Refused::Inst {
                module: b"builtins",
                name: b"list"
            })
        );
        assert_eq!(refused(b"\x93."), Op::Refused(Refused::StackGlobal));
        assert_eq!(refused(b"\x82\x07."), Op::Refused(Refused::Extension(7)));
        assert_eq!(
            refused(b"\x83\x01\x02."),
            Op::Refused(Refused::Extension(0x201))
        );
        assert_eq!(refused(b"Pid\n."), Op::Refused(Refused::PersistentId));
        assert_eq!(refused(b"Q."), Op::Refused(Refused::PersistentId));
        for (code, name) in [
            (b'R', "REDUCE"),
            (b'b', "BUILD"),
            (b'o', "OBJ"),
            (0x81, "NEWOBJ"),
            (0x92, "NEWOBJ_EX"),
        ] {
            assert_eq!(refused(&[code, b'.']), Op::Refused(Refused::Call(name)));
        }
        assert_eq!(refused(b"\x97."), Op::Refused(Refused::OutOfBandBuffer));
        assert_eq!(refused(b"\x98."), Op::Refused(Refused::OutOfBandBuffer));
    }

    #[test]
    fn position_after_stop_is_the_bytes_the_pickle_took() {
        let mut ops = Ops::new(b"N.trailing");
        assert_eq!(ops.next_op(), Ok(Op::None));
        assert_eq!(ops.next_op(), Ok(Op::Stop));
        assert_eq!(ops.position(), 2);
    }
}
