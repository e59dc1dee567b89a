//! Disco's small-frame MAC for Python (`cubepool.disco.wire`): keyed BLAKE2s tags, and a
//! whole small frame opened in one call.
//!
//! A Disco worker opens one frame per command; in Python that was a dozen operations
//! around `hashlib` (about 13,700 instructions a frame, callgrind). Here the frame's
//! header is read, its tag computed and compared in constant time, and its payload
//! copied out at once. The frame layout and what is tagged are `wire.py`'s (its module
//! docs); the general case (a large frame, a long header, a cut frame) stays in Python.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};

use crate::blake2s::{tags_equal, KeyedBlake2s, TAG_BYTES};

/// Bytes of a frame's length field (big-endian `i32`).
const LENGTH_BYTES: usize = 4;

/// Keyed BLAKE2s-256 of `seq || payload` (`seq` as 8 big-endian bytes): the tag of Disco's
/// frames of up to `small_limit` bytes of payload, under one direction's small-frame key.
#[pyclass(name = "SmallFrameMac", module = "cubepool._cubepool", frozen)]
pub struct PySmallFrameMac {
    mac: KeyedBlake2s,
    /// The largest payload this MAC tags (wire.py's one-shot limit).
    small_limit: usize,
}

#[pymethods]
impl PySmallFrameMac {
    /// A MAC under `key` (1 to 32 bytes) for payloads of up to `small_limit` bytes;
    /// ValueError for another key length.
    #[new]
    fn new(key: &[u8], small_limit: usize) -> PyResult<Self> {
        let mac = KeyedBlake2s::new(key).ok_or_else(|| {
            PyValueError::new_err(format!(
                "a BLAKE2s key has 1 to 32 bytes, got {}",
                key.len()
            ))
        })?;
        Ok(Self { mac, small_limit })
    }

    /// The 32-byte tag of frame `seq` carrying `payload`.
    fn tag<'py>(&self, py: Python<'py>, seq: u64, payload: &[u8]) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.mac.tag(&seq.to_be_bytes(), payload))
    }

    /// The payload of the frame at `start` of `buffer` once its tag checks, as frame `seq`;
    /// None unless a whole frame with a 4-byte length and at most `small_limit` bytes of
    /// payload is there (Python's general path takes the rest). ValueError when the tag
    /// does not match.
    fn open<'py>(
        &self,
        py: Python<'py>,
        buffer: &Bound<'py, PyByteArray>,
        start: usize,
        seq: u64,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        // SAFETY: the slice is only read while this call holds the GIL and runs no Python
        // code, so nothing can resize or free the bytearray meanwhile; the payload is
        // copied into a new bytes object before the borrow ends.
        let bytes = unsafe { buffer.as_bytes() };
        let Some(rest) = bytes.get(start..) else {
            return Ok(None);
        };
        let Some(header) = rest.get(..LENGTH_BYTES) else {
            return Ok(None);
        };
        let size = i32::from_be_bytes([header[0], header[1], header[2], header[3]]);
        let Ok(size) = usize::try_from(size) else {
            return Ok(None); // a long frame's marker (-1) or garbage: the general path
        };
        if size < TAG_BYTES || size - TAG_BYTES > self.small_limit {
            return Ok(None);
        }
        let Some(frame) = rest.get(LENGTH_BYTES..LENGTH_BYTES + size) else {
            return Ok(None); // not all here yet
        };
        let (tag, payload) = frame.split_at(TAG_BYTES);
        if !tags_equal(tag, &self.mac.tag(&seq.to_be_bytes(), payload)) {
            return Err(PyValueError::new_err("tag mismatch"));
        }
        Ok(Some(PyBytes::new(py, payload)))
    }
}
