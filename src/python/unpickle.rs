//! cubepool's restricted unpickler: runs the opcodes [`Ops`] reads from a pickle and
//! builds the plain values they make (`None`, bools, ints, floats, str, bytes,
//! bytearray, tuples, lists, dicts, sets, frozensets), and refuses every opcode that
//! would run code or reach outside the pickle ([`Refused`]): globals, calls, states set
//! on objects, copyreg extensions, persistent ids and out-of-band buffers. Nothing
//! callable is ever looked up, so no pickle can run code here.
//!
//! It is the machine of Python's own unpickler (`Lib/pickle.py`): a stack, marks on it,
//! and a memo, so an object the pickle references twice (or that contains itself) is
//! one object, as `pickle.loads` makes it. Unlike the C unpickler it keeps the memo's
//! indices as they come (a vector while they are consecutive, as every pickler writes
//! them, and a map past that), so a `LONG_BINPUT` of index 2^32 - 1 costs one entry,
//! not an array of that many; and every length is checked against the data before a
//! byte is copied ([`Ops`]). The stack, the marks and the memo grow by at most one
//! entry per opcode, so what a pickle builds is bounded by its size, as with Python's.
//!
//! One rule Python's unpickler does not have: a value the machine hashes (a dict key, a
//! set or frozenset member) must be a str, bytes, `None` or a bool ([`check_hashable`]),
//! as every key of a snapshot is. Their hashes are cheap, cached and, for str and bytes,
//! keyed per process, so no pickle can make hashing or comparing keys costly:
//!
//! - Python hashes a tuple by hashing its items, recursively in C and without a bound:
//!   a pickle of a few hundred KB nesting a tuple 200,000 deep as a dict key overflowed
//!   the C stack and killed the interpreter (the pure-Python unpickler cubepool used
//!   before did too), and a tuple of shared tuples (`t1 = (t0, t0)`, ...) hashes for
//!   2^depth steps;
//! - equal keys are compared, and comparing frozensets of tuples of frozensets recurses
//!   and doubles the same way, uninterruptibly;
//! - ints, floats and tuples of them hash the same in every process, so a pickle can
//!   choose thousands of keys of one hash and make a dict's inserts quadratic (20,000
//!   such pairs in 340 KB took 2.6 s, 80,000 took 43 s); an int's hash takes as long
//!   as its digits, and is not cached.

use std::collections::HashMap;

use pyo3::exceptions::PyEOFError;
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyFrozenSet, PyInt, PyList, PySet, PyString,
    PyTuple,
};

use crate::trace::pickle_ops::{Op, Ops, PickleError, Refused};

pyo3::import_exception!(pickle, UnpicklingError);

/// The newest protocol Python writes (`pickle.HIGHEST_PROTOCOL`).
const HIGHEST_PROTOCOL: u8 = 5;

/// Opcodes run between two checks for a signal (Ctrl-C stops a long load).
const SIGNAL_EVERY: u32 = 1 << 20;

/// The most bytes of a global's module or name quoted in a refusal.
const QUOTED: usize = 100;

/// Unpickles `data`, building plain values only.
///
/// Raises `pickle.UnpicklingError` for a refused opcode, a key it does not hash or a
/// malformed pickle, naming the opcode, `EOFError` where the data ends before the pickle
/// does, and what Python raises for a value it cannot build from its text (a `STRING`
/// that is not ASCII: `UnicodeDecodeError`; an `INT` that is no number: `ValueError`).
#[pyfunction]
pub(crate) fn restricted_unpickle<'py>(
    py: Python<'py>,
    data: &[u8],
) -> PyResult<Bound<'py, PyAny>> {
    let mut machine = Machine {
        py,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Memo::default(),
    };
    let mut ops = Ops::new(data);
    let mut until_check = SIGNAL_EVERY;
    loop {
        until_check -= 1;
        if until_check == 0 {
            py.check_signals()?;
            until_check = SIGNAL_EVERY;
        }
        let op = ops.next_op().map_err(read_error)?;
        if let Some(value) = machine.run(op)? {
            return Ok(value);
        }
    }
}

/// The Python exception of a pickle [`Ops`] could not read.
fn read_error(error: PickleError) -> PyErr {
    match error {
        PickleError::Truncated { .. } => PyEOFError::new_err(error.to_string()),
        _ => UnpicklingError::new_err(error.to_string()),
    }
}

/// An `UnpicklingError` with `message`.
fn malformed(message: String) -> PyErr {
    UnpicklingError::new_err(message)
}

/// The memo: values by index.
///
/// Invariant: no index is in both `dense` (indices `0..dense.len()`) and `sparse`, so
/// the memo holds `dense.len() + sparse.len()` values (its `len` in Python, which
/// `MEMOIZE` stores at).
#[derive(Default)]
struct Memo<'py> {
    dense: Vec<Bound<'py, PyAny>>,
    sparse: HashMap<u64, Bound<'py, PyAny>>,
}

impl<'py> Memo<'py> {
    fn len(&self) -> u64 {
        (self.dense.len() + self.sparse.len()) as u64
    }

    fn get(&self, index: u64) -> Option<&Bound<'py, PyAny>> {
        match usize::try_from(index) {
            Ok(i) if i < self.dense.len() => Some(&self.dense[i]),
            _ => self.sparse.get(&index),
        }
    }

    fn put(&mut self, index: u64, value: Bound<'py, PyAny>) {
        let next = self.dense.len() as u64;
        if index < next {
            self.dense[index as usize] = value;
        } else if index == next {
            if !self.sparse.is_empty() {
                self.sparse.remove(&index);
            }
            self.dense.push(value);
        } else {
            self.sparse.insert(index, value);
        }
    }
}

/// The unpickling machine: Python's stack, marks and memo.
struct Machine<'py> {
    py: Python<'py>,
    /// Invariant: the marks are positions in it, in ascending order, at most its length.
    stack: Vec<Bound<'py, PyAny>>,
    marks: Vec<usize>,
    memo: Memo<'py>,
}

impl<'py> Machine<'py> {
    /// Runs one opcode; the pickle's value at `STOP`.
    fn run(&mut self, op: Op<'_>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = self.py;
        let value: Bound<'py, PyAny> = match op {
            Op::Proto(protocol) if protocol > HIGHEST_PROTOCOL => {
                return Err(malformed(format!(
                    "unsupported pickle protocol: {protocol}"
                )))
            }
            Op::Proto(_) | Op::Frame(_) => return Ok(None),
            Op::Stop => return self.pop("STOP").map(Some),
            Op::Mark => {
                self.marks.push(self.stack.len());
                return Ok(None);
            }
            Op::Pop => {
                if self.stack.len() > self.floor() {
                    self.stack.pop();
                } else {
                    self.pop_mark("POP")?;
                }
                return Ok(None);
            }
            Op::PopMark => {
                self.pop_mark("POP_MARK")?;
                return Ok(None);
            }
            Op::Dup => self.top("DUP")?.clone(),
            Op::None => py.None().into_bound(py),
            Op::Bool(b) => PyBool::new(py, b).to_owned().into_any(),
            Op::Int(i) => i.into_pyobject(py)?.into_any(),
            Op::IntLine(b"00") => PyBool::new(py, false).to_owned().into_any(),
            Op::IntLine(b"01") => PyBool::new(py, true).to_owned().into_any(),
            Op::IntLine(line) => int_of_text(py, line)?,
            Op::LongLine(line) => int_of_text(py, line.strip_suffix(b"L").unwrap_or(line))?,
            Op::Long(bytes) => int_of_le_bytes(py, bytes)?,
            Op::FloatLine(line) => py.get_type::<PyFloat>().call1((PyBytes::new(py, line),))?,
            Op::Float(f) => PyFloat::new(py, f).into_any(),
            Op::Unicode(bytes) => match std::str::from_utf8(bytes) {
                Ok(text) => PyString::new(py, text).into_any(),
                // Python writes lone surrogates as UTF-8 too ('surrogatepass').
                Err(_) => decode(py, bytes, "utf-8", "surrogatepass")?,
            },
            Op::UnicodeLine(line) => decode(py, line, "raw-unicode-escape", "strict")?,
            Op::String(bytes) => ascii(py, bytes)?,
            Op::StringLine(line) => {
                let quoted = line.len() >= 2
                    && line[0] == line[line.len() - 1]
                    && matches!(line[0], b'"' | b'\'');
                if !quoted {
                    return Err(malformed(
                        "the STRING opcode argument must be quoted".to_owned(),
                    ));
                }
                let escaped = PyBytes::new(py, &line[1..line.len() - 1]);
                let unescaped = py
                    .import("codecs")?
                    .call_method1("escape_decode", (escaped,))?
                    .get_item(0)?;
                unescaped.call_method1("decode", ("ascii",))?
            }
            Op::Bytes(bytes) => PyBytes::new(py, bytes).into_any(),
            Op::ByteArray(bytes) => PyByteArray::new(py, bytes).into_any(),
            Op::EmptyList => PyList::empty(py).into_any(),
            Op::Append => {
                let value = self.pop("APPEND")?;
                self.below::<PyList>("APPEND")?.append(value)?;
                return Ok(None);
            }
            Op::Appends => {
                let items = self.pop_mark("APPENDS")?;
                let list = self.below::<PyList>("APPENDS")?;
                for item in items {
                    list.append(item)?;
                }
                return Ok(None);
            }
            Op::List => PyList::new(py, self.pop_mark("LIST")?)?.into_any(),
            Op::EmptyTuple => PyTuple::empty(py).into_any(),
            Op::Tuple => PyTuple::new(py, self.pop_mark("TUPLE")?)?.into_any(),
            Op::TupleOf(n) => {
                let n = usize::from(n);
                if self.stack.len() < self.floor() + n {
                    return Err(malformed(format!("TUPLE{n} needs {n} values on the stack")));
                }
                let items = self.stack.split_off(self.stack.len() - n);
                PyTuple::new(py, items)?.into_any()
            }
            Op::EmptyDict => PyDict::new(py).into_any(),
            Op::Dict => {
                let items = self.pop_mark("DICT")?;
                let dict = PyDict::new(py);
                set_pairs(&dict, items, "DICT")?;
                dict.into_any()
            }
            Op::SetItem => {
                let value = self.pop("SETITEM")?;
                let key = self.pop("SETITEM")?;
                check_hashable(&key, "SETITEM")?;
                self.below::<PyDict>("SETITEM")?.set_item(key, value)?;
                return Ok(None);
            }
            Op::SetItems => {
                let items = self.pop_mark("SETITEMS")?;
                set_pairs(self.below::<PyDict>("SETITEMS")?, items, "SETITEMS")?;
                return Ok(None);
            }
            Op::EmptySet => PySet::empty(py)?.into_any(),
            Op::AddItems => {
                let items = self.pop_mark("ADDITEMS")?;
                let set = self.below::<PySet>("ADDITEMS")?;
                for item in items {
                    check_hashable(&item, "ADDITEMS")?;
                    set.add(item)?;
                }
                return Ok(None);
            }
            Op::FrozenSet => {
                let items = self.pop_mark("FROZENSET")?;
                for item in &items {
                    check_hashable(item, "FROZENSET")?;
                }
                PyFrozenSet::new(py, items)?.into_any()
            }
            Op::Get(index) => {
                let found = index.and_then(|index| self.memo.get(index));
                match (found, index) {
                    (Some(value), _) => value.clone(),
                    (None, Some(index)) => {
                        return Err(malformed(format!("Memo value not found at index {index}")))
                    }
                    (None, None) => {
                        return Err(malformed(
                            "Memo value not found at an index past 2^64 - 1".to_owned(),
                        ))
                    }
                }
            }
            Op::Put(index) => {
                let value = self.top("PUT")?.clone();
                self.memo.put(index, value);
                return Ok(None);
            }
            Op::Memoize => {
                let value = self.top("MEMOIZE")?.clone();
                self.memo.put(self.memo.len(), value);
                return Ok(None);
            }
            Op::Refused(refused) => return Err(self.refusal(refused)),
        };
        self.stack.push(value);
        Ok(None)
    }

    /// Where the values above the topmost mark start.
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    /// Pops the value on top, above the topmost mark.
    fn pop(&mut self, opcode: &str) -> PyResult<Bound<'py, PyAny>> {
        if self.stack.len() > self.floor() {
            if let Some(value) = self.stack.pop() {
                return Ok(value);
            }
        }
        Err(malformed(format!("{opcode} with no value on the stack")))
    }

    /// The value on top, above the topmost mark.
    fn top(&self, opcode: &str) -> PyResult<&Bound<'py, PyAny>> {
        match self.stack.last() {
            Some(value) if self.stack.len() > self.floor() => Ok(value),
            _ => Err(malformed(format!("{opcode} with no value on the stack"))),
        }
    }

    /// The values above the topmost mark, taken off with the mark.
    fn pop_mark(&mut self, opcode: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let mark = self
            .marks
            .pop()
            .ok_or_else(|| malformed(format!("{opcode} with no MARK on the stack")))?;
        Ok(self.stack.split_off(mark))
    }

    /// The container on top (below the values an opcode took), of type `T`.
    fn below<T: pyo3::type_object::PyTypeCheck>(&self, opcode: &str) -> PyResult<&Bound<'py, T>> {
        let container = self.top(opcode)?;
        container
            .cast::<T>()
            .map_err(|_| malformed(format!("{opcode} onto a {}", type_name(container))))
    }

    /// The error of a refused opcode, naming the global where the pickle gives it.
    fn refusal(&mut self, refused: Refused<'_>) -> PyErr {
        let global = |module: &str, name: &str| {
            malformed(format!(
                "the pickle references the global {module}.{name}; cubepool reads only plain \
                 containers and scalars and refuses every class or function"
            ))
        };
        match refused {
            Refused::Global { module, name } | Refused::Inst { module, name } => {
                global(&quoted(module), &quoted(name))
            }
            Refused::StackGlobal => {
                let name = self.pop("STACK_GLOBAL").ok();
                let module = self.pop("STACK_GLOBAL").ok();
                let text = |value: Option<Bound<'py, PyAny>>| {
                    value
                        .and_then(|v| v.extract::<String>().ok())
                        .map_or_else(|| "?".to_owned(), |s| quoted(s.as_bytes()))
                };
                global(&text(module), &text(name))
            }
            Refused::Extension(code) => malformed(format!(
                "the pickle uses a copyreg extension code ({code}, a global); cubepool \
                 refuses them"
            )),
            Refused::PersistentId => {
                malformed("the pickle uses a persistent id; cubepool refuses them".to_owned())
            }
            Refused::Call(opcode) => malformed(format!(
                "the pickle calls or builds an object ({opcode}); cubepool reads only plain \
                 containers and scalars"
            )),
            Refused::OutOfBandBuffer => malformed(
                "the pickle uses out-of-band buffers (protocol 5); cubepool refuses them"
                    .to_owned(),
            ),
        }
    }
}

/// At most [`QUOTED`] bytes of `bytes`, as text.
fn quoted(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(QUOTED)]).into_owned();
    if bytes.len() > QUOTED {
        format!("{text}...")
    } else {
        text
    }
}

/// The name of `value`'s type, for a message.
fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |name| name.to_string())
}

/// `bytes.decode(encoding, errors)`.
fn decode<'py>(
    py: Python<'py>,
    bytes: &[u8],
    encoding: &str,
    errors: &str,
) -> PyResult<Bound<'py, PyAny>> {
    PyBytes::new(py, bytes).call_method1("decode", (encoding, errors))
}

/// A Python 2 `str` as Python 3 reads it by default: ASCII text.
fn ascii<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    match std::str::from_utf8(bytes) {
        Ok(text) if bytes.is_ascii() => Ok(PyString::new(py, text).into_any()),
        // Python's own error, naming the byte.
        _ => decode(py, bytes, "ascii", "strict"),
    }
}

/// `int(text, 0)`, as Python reads `INT` and `LONG`.
fn int_of_text<'py>(py: Python<'py>, text: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    py.get_type::<PyInt>().call1((PyBytes::new(py, text), 0))
}

/// The integer of little-endian two's complement `bytes` (`LONG1`, `LONG4`).
fn int_of_le_bytes<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    if bytes.len() <= 8 {
        let fill = if bytes.last().is_some_and(|&b| b & 0x80 != 0) {
            0xff
        } else {
            0
        };
        let mut wide = [fill; 8];
        wide[..bytes.len()].copy_from_slice(bytes);
        return Ok(i64::from_le_bytes(wide).into_pyobject(py)?.into_any());
    }
    let kwargs = PyDict::new(py);
    kwargs.set_item("signed", true)?;
    py.get_type::<PyInt>().call_method(
        "from_bytes",
        (PyBytes::new(py, bytes), "little"),
        Some(&kwargs),
    )
}

/// Sets `items`, key and value in turn, in `dict`.
fn set_pairs<'py>(
    dict: &Bound<'py, PyDict>,
    items: Vec<Bound<'py, PyAny>>,
    opcode: &str,
) -> PyResult<()> {
    if items.len() % 2 != 0 {
        return Err(malformed(format!(
            "{opcode} with an odd number of items ({}): a key without a value",
            items.len()
        )));
    }
    let mut items = items.into_iter();
    while let (Some(key), Some(value)) = (items.next(), items.next()) {
        check_hashable(&key, opcode)?;
        dict.set_item(key, value)?;
    }
    Ok(())
}

/// Refuses a value that `opcode` would hash unless it is a str, bytes, `None` or a bool
/// (see the module doc).
fn check_hashable(value: &Bound<'_, PyAny>, opcode: &str) -> PyResult<()> {
    if value.is_exact_instance_of::<PyString>()
        || value.is_exact_instance_of::<PyBytes>()
        || value.is_none()
        || value.is_exact_instance_of::<PyBool>()
    {
        return Ok(());
    }
    Err(malformed(format!(
        "{opcode} hashes a {} (as a dict key or a set member); cubepool hashes only str, \
         bytes, None and bools, as a snapshot's keys are",
        type_name(value)
    )))
}
