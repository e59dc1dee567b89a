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
//! byte is copied ([`Ops`]).
//!
//! What a pickle builds is bounded by its size, and by a small multiple of it. The
//! stack, the marks and the memo grow by at most one entry (8 bytes) per opcode, but an
//! opcode of one byte (`]`, `}`) builds an object of 56 to 64: 10 MiB of `]` (in a
//! gzip of 10 KB) took 88 bytes of memory per byte of pickle, 950 MB at peak through
//! `load_trace`, all built before anything was refused. So a load builds at most one
//! object for every [`BYTES_PER_OBJECT`] (2) bytes of pickle (and at least
//! [`LEAST_OBJECTS`]), counted before each is built (an int CPython keeps, `None`, a
//! bool, the empty tuple and a memo's copy are none), and is refused with an
//! `UnpicklingError` past that. Why 2: Python's pickler spends at least two bytes on
//! every object it makes an unpickler build (the opcode and the memo's, or an int's
//! argument), so no pickle it writes with its memo (the default) is refused; one
//! without (`pickletools.optimize`, or a `Pickler` in `fast` mode) of nothing but empty
//! containers or 1-tuples spends one, and past [`LEAST_OBJECTS`] is refused; snapshots build one object for every
//! 9 to 28 bytes (7.6 in the smallest corpus file), measured on the corpus, on
//! `bench_unpickle`'s and on snapshots written as PyTorch writes them (frame dicts
//! shared). Measured peaks (resident memory above the process's before the load): 10
//! MiB of `]` or `}` now 36 bytes a byte (420 MB through `load_trace`), `}2` repeated
//! 40, a real snapshot's 3.4 to 8.5. The importer also passes `max_objects`, 16 for
//! each entry its `max_events` allows (never fewer than 65,536, `_pickle.py`): 64
//! million objects by default, 4.7 GB at peak
//! for any pickle (measured on 200 MiB of `]`), where 1 GiB of `]` (`max_bytes`'s
//! default) would have taken some 90 GB.
//!
//! Memory running out is a `MemoryError`, never a panic or an abort: the stack, the
//! marks and the memo grow with `try_reserve`, every object is made by a CPython
//! constructor whose NULL is taken as the exception it sets (PyO3's own constructors
//! panic on it: a 160 MiB str under a limit raised a `PanicException`, and a panic left
//! the process hanging), and the text of every error is made where it is raised.
//! 64 million marks or 12 million lists under an address-space limit aborted the
//! process (SIGABRT, a `Vec` failing to grow); they are now a `MemoryError`.
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
use std::ffi::CStr;

use pyo3::exceptions::PyEOFError;
use pyo3::ffi;
use pyo3::panic::PanicException;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{
    PyBool, PyBytes, PyDict, PyFrozenSet, PyInt, PyList, PySet, PyString, PyTuple, PyType,
};
use pyo3::PyTypeInfo;

use crate::trace::pickle_ops::{Op, Ops, PickleError, Refused};

/// The newest protocol Python writes (`pickle.HIGHEST_PROTOCOL`).
const HIGHEST_PROTOCOL: u8 = 5;

/// Opcodes run between two checks for a signal (Ctrl-C stops a long load).
const SIGNAL_EVERY: u32 = 1 << 20;

/// The most bytes of a global's module or name quoted in a refusal.
const QUOTED: usize = 100;

/// The bytes of pickle each object built must come with: a pickle of `n` bytes builds at
/// most `n / BYTES_PER_OBJECT` objects (and at least [`LEAST_OBJECTS`]; see the module
/// doc). Python's pickler spends at least two bytes on every object it makes an unpickler
/// build, so no pickle it writes with its memo is refused.
const BYTES_PER_OBJECT: usize = 2;

/// The objects any pickle may build, however short (about 5 MB of them at most).
const LEAST_OBJECTS: u64 = 1 << 16;

/// How the error past `max_objects` starts (the importer names its own bound instead).
const PAST_MAX_OBJECTS: &str = "the pickle builds more than max_objects=";

/// `pickle.UnpicklingError`, imported once (fallibly: no error of a load can panic).
static UNPICKLING_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// Unpickles `data`, building plain values only.
///
/// Raises `pickle.UnpicklingError` for a refused opcode, a key it does not hash, a pickle
/// that would build more objects than its size allows (see the module doc) or a malformed
/// pickle, naming the opcode; `EOFError` where the data ends before the pickle does;
/// `MemoryError` where memory runs out (nothing here panics or aborts on it); and what
/// Python raises for a value it cannot build from its text (a `STRING` that is not ASCII:
/// `UnicodeDecodeError`; an `INT` that is no number: `ValueError`).
///
/// `max_objects` bounds the objects built further (the importer derives it from its
/// bound on entries); past it the `UnpicklingError`'s message starts with
/// [`PAST_MAX_OBJECTS`].
#[pyfunction]
#[pyo3(signature = (data, max_objects=None))]
pub(crate) fn restricted_unpickle<'py>(
    py: Python<'py>,
    data: &[u8],
    max_objects: Option<u64>,
) -> PyResult<Bound<'py, PyAny>> {
    // The types an error of this load needs, made now, while memory is there: PyO3
    // creates its PanicException type the first time it fetches any exception.
    unpickling_error(py)?;
    py.get_type::<PanicException>();
    let mut machine = Machine {
        py,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Memo::default(),
        built: 0,
        budget: Budget::new(data.len(), max_objects),
    };
    let mut ops = Ops::new(data);
    let mut until_check = SIGNAL_EVERY;
    loop {
        until_check -= 1;
        if until_check == 0 {
            py.check_signals()?;
            until_check = SIGNAL_EVERY;
        }
        let op = ops.next_op().map_err(|error| read_error(py, error))?;
        if let Some(value) = machine.run(op)? {
            return Ok(value);
        }
    }
}

/// The `pickle.UnpicklingError` type.
fn unpickling_error(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    UNPICKLING_ERROR
        .get_or_try_init(py, || {
            let module = owned(py, unsafe {
                ffi::PyImport_Import(new_str(py, "pickle")?.as_ptr())
            })?;
            Ok::<_, PyErr>(
                module
                    .getattr(new_str(py, "UnpicklingError")?)?
                    .cast_into::<PyType>()?
                    .unbind(),
            )
        })
        .map(|ty| ty.bind(py))
}

/// An exception of `ty` with `message`, its text made now (PyO3 would make it where it
/// raises the error, and panic if that failed); a `MemoryError` where it cannot be made.
fn error_of(py: Python<'_>, ty: &Bound<'_, PyType>, message: &str) -> PyErr {
    match new_str(py, message) {
        Ok(text) => PyErr::from_type(ty.clone(), text.unbind()),
        Err(err) => err,
    }
}

/// An `UnpicklingError` with `message`.
fn malformed(py: Python<'_>, message: &str) -> PyErr {
    match unpickling_error(py) {
        Ok(ty) => error_of(py, ty, message),
        Err(err) => err,
    }
}

/// The `MemoryError` of an allocation that failed.
fn no_memory(py: Python<'_>) -> PyErr {
    // CPython raises it from an instance it keeps for the purpose.
    unsafe { ffi::PyErr_NoMemory() };
    PyErr::fetch(py)
}

/// The Python exception of a pickle [`Ops`] could not read.
fn read_error(py: Python<'_>, error: PickleError) -> PyErr {
    let message = error.to_string();
    match error {
        PickleError::Truncated { .. } => error_of(py, &PyEOFError::type_object(py), &message),
        _ => malformed(py, &message),
    }
}

// The constructors of the values, each returning the exception CPython sets where it
// cannot make one (a `MemoryError`) where PyO3's would panic.

/// The object CPython returned, or the exception it set where it returned NULL.
fn owned(py: Python<'_>, ptr: *mut ffi::PyObject) -> PyResult<Bound<'_, PyAny>> {
    // SAFETY: `ptr` is a new reference from a CPython constructor, or NULL with an
    // exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, ptr) }
}

/// A length as CPython takes it (no pickle's data is longer than `isize::MAX`).
fn ssize(py: Python<'_>, len: usize) -> PyResult<ffi::Py_ssize_t> {
    ffi::Py_ssize_t::try_from(len).map_err(|_| no_memory(py))
}

fn new_str<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyString>> {
    let len = ssize(py, text.len())?;
    let ptr = unsafe { ffi::PyUnicode_FromStringAndSize(text.as_ptr().cast(), len) };
    Ok(owned(py, ptr)?.cast_into::<PyString>()?)
}

fn new_bytes<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    let len = ssize(py, bytes.len())?;
    owned(py, unsafe {
        ffi::PyBytes_FromStringAndSize(bytes.as_ptr().cast(), len)
    })
}

fn new_bytearray<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    let len = ssize(py, bytes.len())?;
    owned(py, unsafe {
        ffi::PyByteArray_FromStringAndSize(bytes.as_ptr().cast(), len)
    })
}

fn new_int(py: Python<'_>, value: i64) -> PyResult<Bound<'_, PyAny>> {
    owned(py, unsafe { ffi::PyLong_FromLongLong(value) })
}

fn new_float(py: Python<'_>, value: f64) -> PyResult<Bound<'_, PyAny>> {
    owned(py, unsafe { ffi::PyFloat_FromDouble(value) })
}

fn new_dict(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    Ok(owned(py, unsafe { ffi::PyDict_New() })?.cast_into::<PyDict>()?)
}

/// A list (`list`) or tuple of `items`, made by `new` and filled by `set`.
fn new_sequence<'py>(
    py: Python<'py>,
    items: impl ExactSizeIterator<Item = Bound<'py, PyAny>>,
    new: unsafe extern "C" fn(ffi::Py_ssize_t) -> *mut ffi::PyObject,
    set: unsafe extern "C" fn(*mut ffi::PyObject, ffi::Py_ssize_t, *mut ffi::PyObject) -> i32,
) -> PyResult<Bound<'py, PyAny>> {
    let len = ssize(py, items.len())?;
    let sequence = owned(py, unsafe { new(len) })?;
    for (index, item) in (0..len).zip(items) {
        // SAFETY: `sequence` is new, of `len` empty slots; `set` takes the reference.
        if unsafe { set(sequence.as_ptr(), index, item.into_ptr()) } != 0 {
            return Err(PyErr::fetch(py));
        }
    }
    Ok(sequence)
}

fn new_list<'py>(
    py: Python<'py>,
    items: impl ExactSizeIterator<Item = Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    new_sequence(py, items, ffi::PyList_New, ffi::PyList_SetItem)
}

fn new_tuple<'py>(
    py: Python<'py>,
    items: impl ExactSizeIterator<Item = Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    new_sequence(py, items, ffi::PyTuple_New, ffi::PyTuple_SetItem)
}

/// `callable(*args)`, the arguments' tuple made fallibly.
fn call<'py, const N: usize>(
    callable: &Bound<'py, PyAny>,
    args: [Bound<'py, PyAny>; N],
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = callable.py();
    let args = new_tuple(py, args.into_iter())?;
    let kwargs = kwargs.map_or(std::ptr::null_mut(), |kwargs| kwargs.as_ptr());
    owned(py, unsafe {
        ffi::PyObject_Call(callable.as_ptr(), args.as_ptr(), kwargs)
    })
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

    /// Stores `value` at `index`; `MemoryError` where the memo cannot grow.
    fn put(&mut self, index: u64, value: Bound<'py, PyAny>) -> PyResult<()> {
        let py = value.py();
        let next = self.dense.len() as u64;
        if index < next {
            self.dense[index as usize] = value;
        } else if index == next {
            self.dense.try_reserve(1).map_err(|_| no_memory(py))?;
            if !self.sparse.is_empty() {
                self.sparse.remove(&index);
            }
            self.dense.push(value);
        } else {
            if !self.sparse.contains_key(&index) {
                self.sparse.try_reserve(1).map_err(|_| no_memory(py))?;
            }
            self.sparse.insert(index, value);
        }
        Ok(())
    }
}

/// The unpickling machine: Python's stack, marks and memo, and the count of the objects
/// it has built against its budget.
struct Machine<'py> {
    py: Python<'py>,
    /// Invariant: the marks are positions in it, in ascending order, at most its length.
    stack: Vec<Bound<'py, PyAny>>,
    marks: Vec<usize>,
    memo: Memo<'py>,
    /// The objects built so far, at most `budget.objects`.
    built: u64,
    budget: Budget,
}

/// The most objects a load builds, and why.
struct Budget {
    objects: u64,
    /// The pickle's length, where it sets `objects`; `None` where `max_objects` does.
    size: Option<usize>,
}

impl Budget {
    fn new(size: usize, max_objects: Option<u64>) -> Budget {
        let by_size = LEAST_OBJECTS.max((size / BYTES_PER_OBJECT) as u64);
        match max_objects {
            Some(most) if most < by_size => Budget {
                objects: most,
                size: None,
            },
            _ => Budget {
                objects: by_size,
                size: Some(size),
            },
        }
    }

    /// Why no more objects are built.
    fn exceeded(&self) -> String {
        match self.size {
            Some(size) => format!(
                "the pickle builds more than {} objects, one for every {BYTES_PER_OBJECT} of \
                 its {size} bytes (a pickle Python's pickler writes with its memo, as \
                 PyTorch's snapshots are, builds fewer); refused before building more",
                self.objects
            ),
            None => format!("{PAST_MAX_OBJECTS}{} objects", self.objects),
        }
    }
}

impl<'py> Machine<'py> {
    /// Runs one opcode; the pickle's value at `STOP`.
    fn run(&mut self, op: Op<'_>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = self.py;
        // Each arm that makes a new object counts it ([`Machine::build`]) before making
        // it; `None`, bools, the empty tuple, small ints and a memo's or `DUP`'s copy are
        // not new objects.
        let value: Bound<'py, PyAny> = match op {
            Op::Proto(protocol) if protocol > HIGHEST_PROTOCOL => {
                return Err(malformed(
                    py,
                    &format!("unsupported pickle protocol: {protocol}"),
                ))
            }
            Op::Proto(_) | Op::Frame(_) => return Ok(None),
            Op::Stop => return self.pop("STOP").map(Some),
            Op::Mark => {
                self.marks.try_reserve(1).map_err(|_| no_memory(py))?;
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
                let mark = self.pop_mark("POP_MARK")?;
                self.stack.truncate(mark);
                return Ok(None);
            }
            Op::Dup => self.top("DUP")?.clone(),
            Op::None => py.None().into_bound(py),
            Op::Bool(b) => PyBool::new(py, b).to_owned().into_any(),
            Op::Int(i) => self.int(i)?,
            Op::IntLine(b"00") => PyBool::new(py, false).to_owned().into_any(),
            Op::IntLine(b"01") => PyBool::new(py, true).to_owned().into_any(),
            Op::IntLine(line) => {
                self.build()?;
                int_of_text(py, line)?
            }
            Op::LongLine(line) => {
                self.build()?;
                int_of_text(py, line.strip_suffix(b"L").unwrap_or(line))?
            }
            Op::Long(bytes) => match le_i64(bytes) {
                Some(i) => self.int(i)?,
                None => {
                    self.build()?;
                    int_of_le_bytes(py, bytes)?
                }
            },
            Op::FloatLine(line) => {
                self.build()?;
                let text = new_bytes(py, line)?;
                owned(py, unsafe { ffi::PyFloat_FromString(text.as_ptr()) })?
            }
            Op::Float(f) => {
                self.build()?;
                new_float(py, f)?
            }
            Op::Unicode(bytes) => {
                self.build()?;
                match std::str::from_utf8(bytes) {
                    Ok(text) => new_str(py, text)?.into_any(),
                    // Python writes lone surrogates as UTF-8 too ('surrogatepass').
                    Err(_) => decode(py, bytes, c"utf-8", c"surrogatepass")?,
                }
            }
            Op::UnicodeLine(line) => {
                self.build()?;
                decode(py, line, c"raw-unicode-escape", c"strict")?
            }
            Op::String(bytes) => {
                self.build()?;
                ascii(py, bytes)?
            }
            Op::StringLine(line) => {
                let quoted = line.len() >= 2
                    && line[0] == line[line.len() - 1]
                    && matches!(line[0], b'"' | b'\'');
                if !quoted {
                    return Err(malformed(py, "the STRING opcode argument must be quoted"));
                }
                self.build()?;
                let codecs = owned(py, unsafe {
                    ffi::PyImport_Import(new_str(py, "codecs")?.as_ptr())
                })?;
                let escape_decode = codecs.getattr(new_str(py, "escape_decode")?)?;
                let escaped = new_bytes(py, &line[1..line.len() - 1])?;
                let unescaped = call(&escape_decode, [escaped], None)?
                    .cast_into::<PyTuple>()?
                    .get_item(0)?;
                ascii(py, unescaped.cast::<PyBytes>()?.as_bytes())?
            }
            Op::Bytes(bytes) => {
                self.build()?;
                new_bytes(py, bytes)?
            }
            Op::ByteArray(bytes) => {
                self.build()?;
                new_bytearray(py, bytes)?
            }
            Op::EmptyList => {
                self.build()?;
                new_list(py, std::iter::empty())?
            }
            Op::Append => {
                let value = self.pop("APPEND")?;
                self.top_as::<PyList>("APPEND")?.append(value)?;
                return Ok(None);
            }
            Op::Appends => {
                let mark = self.pop_mark("APPENDS")?;
                let list = self.below::<PyList>(mark, "APPENDS")?;
                for item in self.stack.drain(mark..) {
                    list.append(item)?;
                }
                return Ok(None);
            }
            Op::List => {
                let mark = self.pop_mark("LIST")?;
                self.build()?;
                new_list(py, self.stack.drain(mark..))?
            }
            Op::EmptyTuple => PyTuple::empty(py).into_any(),
            Op::Tuple => {
                let mark = self.pop_mark("TUPLE")?;
                if mark < self.stack.len() {
                    self.build()?;
                }
                new_tuple(py, self.stack.drain(mark..))?
            }
            Op::TupleOf(n) => {
                let n = usize::from(n);
                if self.stack.len() < self.floor() + n {
                    return Err(malformed(
                        py,
                        &format!("TUPLE{n} needs {n} values on the stack"),
                    ));
                }
                self.build()?;
                let start = self.stack.len() - n;
                new_tuple(py, self.stack.drain(start..))?
            }
            Op::EmptyDict => {
                self.build()?;
                new_dict(py)?.into_any()
            }
            Op::Dict => {
                let mark = self.pop_mark("DICT")?;
                self.build()?;
                let dict = new_dict(py)?;
                set_pairs(&dict, self.stack.drain(mark..), "DICT")?;
                dict.into_any()
            }
            Op::SetItem => {
                let value = self.pop("SETITEM")?;
                let key = self.pop("SETITEM")?;
                check_hashable(&key, "SETITEM")?;
                self.top_as::<PyDict>("SETITEM")?.set_item(key, value)?;
                return Ok(None);
            }
            Op::SetItems => {
                let mark = self.pop_mark("SETITEMS")?;
                let dict = self.below::<PyDict>(mark, "SETITEMS")?;
                set_pairs(&dict, self.stack.drain(mark..), "SETITEMS")?;
                return Ok(None);
            }
            Op::EmptySet => {
                self.build()?;
                PySet::empty(py)?.into_any()
            }
            Op::AddItems => {
                let mark = self.pop_mark("ADDITEMS")?;
                let set = self.below::<PySet>(mark, "ADDITEMS")?;
                for item in self.stack.drain(mark..) {
                    check_hashable(&item, "ADDITEMS")?;
                    set.add(item)?;
                }
                return Ok(None);
            }
            Op::FrozenSet => {
                let mark = self.pop_mark("FROZENSET")?;
                for item in &self.stack[mark..] {
                    check_hashable(item, "FROZENSET")?;
                }
                self.build()?;
                PyFrozenSet::new(py, self.stack.drain(mark..))?.into_any()
            }
            Op::Get(index) => {
                let found = index.and_then(|index| self.memo.get(index));
                match (found, index) {
                    (Some(value), _) => value.clone(),
                    (None, Some(index)) => {
                        return Err(malformed(
                            py,
                            &format!("Memo value not found at index {index}"),
                        ))
                    }
                    (None, None) => {
                        return Err(malformed(
                            py,
                            "Memo value not found at an index past 2^64 - 1",
                        ))
                    }
                }
            }
            Op::Put(index) => {
                let value = self.top("PUT")?.clone();
                self.memo.put(index, value)?;
                return Ok(None);
            }
            Op::Memoize => {
                let value = self.top("MEMOIZE")?.clone();
                self.memo.put(self.memo.len(), value)?;
                return Ok(None);
            }
            Op::Refused(refused) => return Err(self.refusal(refused)),
        };
        self.stack.try_reserve(1).map_err(|_| no_memory(py))?;
        self.stack.push(value);
        Ok(None)
    }

    /// Counts one more object about to be built; an `UnpicklingError`, before it is
    /// built, past the budget.
    fn build(&mut self) -> PyResult<()> {
        if self.built >= self.budget.objects {
            return Err(malformed(self.py, &self.budget.exceeded()));
        }
        self.built += 1;
        Ok(())
    }

    /// The int `i`, counted unless CPython keeps it (-5 to 256 are one object each).
    fn int(&mut self, i: i64) -> PyResult<Bound<'py, PyAny>> {
        if !(-5..=256).contains(&i) {
            self.build()?;
        }
        new_int(self.py, i)
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
        Err(malformed(
            self.py,
            &format!("{opcode} with no value on the stack"),
        ))
    }

    /// The value on top, above the topmost mark.
    fn top(&self, opcode: &str) -> PyResult<&Bound<'py, PyAny>> {
        match self.stack.last() {
            Some(value) if self.stack.len() > self.floor() => Ok(value),
            _ => Err(malformed(
                self.py,
                &format!("{opcode} with no value on the stack"),
            )),
        }
    }

    /// Takes off the topmost mark: where the values above it start (the caller takes
    /// them, as Python's unpickler does with the mark).
    fn pop_mark(&mut self, opcode: &str) -> PyResult<usize> {
        self.marks
            .pop()
            .ok_or_else(|| malformed(self.py, &format!("{opcode} with no MARK on the stack")))
    }

    /// The container on top, of type `T`.
    fn top_as<T: pyo3::type_object::PyTypeCheck>(&self, opcode: &str) -> PyResult<&Bound<'py, T>> {
        let container = self.top(opcode)?;
        container.cast::<T>().map_err(|_| {
            malformed(
                self.py,
                &format!("{opcode} onto a {}", type_name(container)),
            )
        })
    }

    /// The container of type `T` just below `mark` (a mark [`Machine::pop_mark`] has
    /// taken off), above the marks left.
    fn below<T: pyo3::type_object::PyTypeCheck>(
        &self,
        mark: usize,
        opcode: &str,
    ) -> PyResult<Bound<'py, T>> {
        match mark.checked_sub(1).map(|i| &self.stack[i]) {
            Some(container) if mark > self.floor() => {
                container.cast::<T>().cloned().map_err(|_| {
                    malformed(
                        self.py,
                        &format!("{opcode} onto a {}", type_name(container)),
                    )
                })
            }
            _ => Err(malformed(
                self.py,
                &format!("{opcode} with no value on the stack"),
            )),
        }
    }

    /// The error of a refused opcode, naming the global where the pickle gives it.
    fn refusal(&mut self, refused: Refused<'_>) -> PyErr {
        let py = self.py;
        let global = |module: &str, name: &str| {
            malformed(
                py,
                &format!(
                    "the pickle references the global {module}.{name}; cubepool reads only \
                     plain containers and scalars and refuses every class or function"
                ),
            )
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
            Refused::Extension(code) => malformed(
                py,
                &format!(
                    "the pickle uses a copyreg extension code ({code}, a global); cubepool \
                     refuses them"
                ),
            ),
            Refused::PersistentId => {
                malformed(py, "the pickle uses a persistent id; cubepool refuses them")
            }
            Refused::Call(opcode) => malformed(
                py,
                &format!(
                    "the pickle calls or builds an object ({opcode}); cubepool reads only \
                     plain containers and scalars"
                ),
            ),
            Refused::OutOfBandBuffer => malformed(
                py,
                "the pickle uses out-of-band buffers (protocol 5); cubepool refuses them",
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
    encoding: &CStr,
    errors: &CStr,
) -> PyResult<Bound<'py, PyAny>> {
    let len = ssize(py, bytes.len())?;
    owned(py, unsafe {
        ffi::PyUnicode_Decode(
            bytes.as_ptr().cast(),
            len,
            encoding.as_ptr(),
            errors.as_ptr(),
        )
    })
}

/// A Python 2 `str` as Python 3 reads it by default: ASCII text.
fn ascii<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    match std::str::from_utf8(bytes) {
        Ok(text) if bytes.is_ascii() => Ok(new_str(py, text)?.into_any()),
        // Python's own error, naming the byte.
        _ => decode(py, bytes, c"ascii", c"strict"),
    }
}

/// `int(text, 0)`, as Python reads `INT` and `LONG`.
fn int_of_text<'py>(py: Python<'py>, text: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    let int = py.get_type::<PyInt>();
    call(int.as_any(), [new_bytes(py, text)?, new_int(py, 0)?], None)
}

/// The integer of little-endian two's complement `bytes` (`LONG1`, `LONG4`) where it fits
/// in an `i64`.
fn le_i64(bytes: &[u8]) -> Option<i64> {
    if bytes.len() > 8 {
        return None;
    }
    let fill = if bytes.last().is_some_and(|&b| b & 0x80 != 0) {
        0xff
    } else {
        0
    };
    let mut wide = [fill; 8];
    wide[..bytes.len()].copy_from_slice(bytes);
    Some(i64::from_le_bytes(wide))
}

/// `int.from_bytes(bytes, "little", signed=True)`: the integer of little-endian two's
/// complement `bytes` (`LONG1`, `LONG4`) past an `i64`.
fn int_of_le_bytes<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    let int = py.get_type::<PyInt>();
    let from_bytes = int.getattr(new_str(py, "from_bytes")?)?;
    let kwargs = new_dict(py)?;
    kwargs.set_item(new_str(py, "signed")?, PyBool::new(py, true))?;
    call(
        &from_bytes,
        [new_bytes(py, bytes)?, new_str(py, "little")?.into_any()],
        Some(&kwargs),
    )
}

/// Sets `items`, key and value in turn, in `dict`.
fn set_pairs<'py>(
    dict: &Bound<'py, PyDict>,
    mut items: impl ExactSizeIterator<Item = Bound<'py, PyAny>>,
    opcode: &str,
) -> PyResult<()> {
    if items.len() % 2 != 0 {
        return Err(malformed(
            dict.py(),
            &format!(
                "{opcode} with an odd number of items ({}): a key without a value",
                items.len()
            ),
        ));
    }
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
    Err(malformed(
        value.py(),
        &format!(
            "{opcode} hashes a {} (as a dict key or a set member); cubepool hashes only \
             str, bytes, None and bools, as a snapshot's keys are",
            type_name(value)
        ),
    ))
}
