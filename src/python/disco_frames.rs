//! Disco's small-frame MAC for Python (`cubepool.disco.wire`): keyed BLAKE2s tags, and a
//! whole small frame opened in one call.
//!
//! A Disco worker opens one frame per command; in Python that was a dozen operations
//! around `hashlib` (about 13,700 instructions a frame, callgrind). Here the frame's
//! header is read, its tag computed and compared in constant time, and its payload
//! copied out at once. The frame layout and what is tagged are `wire.py`'s (its module
//! docs); the general case (a large frame, a long header, a cut frame) stays in Python.

use pyo3::exceptions::PyBaseException;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict};

use crate::blake2s::{KeyedBlake2s, TAG_BYTES};

/// Bytes of a frame's length field (big-endian `i32`).
const LENGTH_BYTES: usize = 4;

/// Bytes of the command number after a command's body (`protocol.NUMBER_SIZE`).
const NUMBER_BYTES: usize = 8;

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

    /// The whole frame `seq` carrying `payload` (at most `small_limit` bytes): its 4-byte
    /// big-endian length, its tag, the payload. ValueError for a larger payload.
    fn seal<'py>(
        &self,
        py: Python<'py>,
        seq: u64,
        payload: &[u8],
    ) -> PyResult<Bound<'py, PyBytes>> {
        if payload.len() > self.small_limit {
            return Err(PyValueError::new_err(format!(
                "a small frame carries at most {} bytes, got {}",
                self.small_limit,
                payload.len()
            )));
        }
        let size = TAG_BYTES + payload.len();
        // At most small_limit (64 KiB in wire.py) plus a tag: fits an i32 length.
        let length = i32::try_from(size)
            .map_err(|_| PyValueError::new_err("small_limit is too large for a frame"))?;
        let tag = self.mac.tag(&seq.to_be_bytes(), payload);
        PyBytes::new_with(py, LENGTH_BYTES + size, |frame| {
            frame[..LENGTH_BYTES].copy_from_slice(&length.to_be_bytes());
            frame[LENGTH_BYTES..LENGTH_BYTES + TAG_BYTES].copy_from_slice(&tag);
            frame[LENGTH_BYTES + TAG_BYTES..].copy_from_slice(payload);
            Ok(())
        })
    }

    /// Seals frame `seq` carrying `body` followed by `number` (8 big-endian bytes: a
    /// command's payload, `protocol.encode_command`'s layout) and writes the whole frame
    /// to the blocking socket `fd`, the GIL released while it writes (the controller's
    /// path for a repeated command: one call per worker instead of an encode, a seal and
    /// a write in Python). ValueError when the payload is over `small_limit`;
    /// BlockingIOError when the socket's send timeout passes, OSError when it is closed
    /// (the frame may then be cut: the channel is done). Pending signals run (and may
    /// raise) when a write is interrupted.
    fn send(&self, py: Python<'_>, fd: i32, seq: u64, body: &[u8], number: u64) -> PyResult<()> {
        let payload = body.len() + NUMBER_BYTES;
        if payload > self.small_limit {
            return Err(PyValueError::new_err(format!(
                "a small frame carries at most {} bytes, got {payload}",
                self.small_limit
            )));
        }
        let size = TAG_BYTES + payload;
        let length = i32::try_from(size)
            .map_err(|_| PyValueError::new_err("small_limit is too large for a frame"))?;
        let mut frame = vec![0u8; LENGTH_BYTES + size];
        let (header, rest) = frame.split_at_mut(LENGTH_BYTES + TAG_BYTES);
        rest[..body.len()].copy_from_slice(body);
        rest[body.len()..].copy_from_slice(&number.to_be_bytes());
        let tag = self.mac.tag(&seq.to_be_bytes(), rest);
        header[..LENGTH_BYTES].copy_from_slice(&length.to_be_bytes());
        header[LENGTH_BYTES..].copy_from_slice(&tag);
        let mut written = 0;
        while written < frame.len() {
            let rest = &frame[written..];
            // SAFETY: `rest` is a live, initialised slice for the whole call; `write` reads
            // at most `rest.len()` bytes of it and keeps no pointer after it returns.
            let result = py.detach(|| unsafe { libc::write(fd, rest.as_ptr().cast(), rest.len()) });
            match usize::try_from(result) {
                Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into()),
                Ok(count) => written += count,
                Err(_) => {
                    let error = std::io::Error::last_os_error();
                    if error.kind() != std::io::ErrorKind::Interrupted {
                        return Err(error.into());
                    }
                    py.check_signals()?;
                }
            }
        }
        Ok(())
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
        match self.open_at(py, buffer, start, seq) {
            Opened::Payload(payload, _) => Ok(Some(payload)),
            Opened::NotWhole => Ok(None),
            Opened::TagMismatch => Err(PyValueError::new_err("tag mismatch")),
        }
    }

    /// Opens the whole small frames at `start` of `buffer` in order (from frame `seq`),
    /// and calls `handlers[body]` for each whose body (its payload less the last
    /// `trailer` bytes) is a key of `handlers`, without arguments. Stops after a frame it
    /// does not handle (status 1, its payload given), after a handler that raised (status
    /// 2, the frame's payload and the exception given), at a tag that does not match
    /// (status 3: that frame is not consumed) or where no whole small frame is left
    /// (status 0). Returns `(start, seq, status, payload, exception)`: where the next
    /// frame starts and its number.
    #[allow(clippy::type_complexity)]
    fn dispatch<'py>(
        &self,
        py: Python<'py>,
        buffer: &Bound<'py, PyByteArray>,
        mut start: usize,
        mut seq: u64,
        handlers: &Bound<'py, PyDict>,
        trailer: usize,
    ) -> PyResult<(
        usize,
        u64,
        u8,
        Option<Bound<'py, PyBytes>>,
        Option<Py<PyBaseException>>,
    )> {
        loop {
            let (payload, end) = match self.open_at(py, buffer, start, seq) {
                Opened::Payload(payload, end) => (payload, end),
                Opened::NotWhole => return Ok((start, seq, 0, None, None)),
                Opened::TagMismatch => return Ok((start, seq, 3, None, None)),
            };
            start = end;
            // A channel never numbers 2^64 frames; one that claims to has ended.
            seq = seq
                .checked_add(1)
                .ok_or_else(|| PyValueError::new_err("frame number past 2**64 - 1"))?;
            let bytes = payload.as_bytes();
            let handler = match bytes.len().checked_sub(trailer) {
                Some(body) => handlers.get_item(PyBytes::new(py, &bytes[..body]))?,
                None => None,
            };
            let Some(handler) = handler else {
                return Ok((start, seq, 1, Some(payload), None));
            };
            // The buffer is not borrowed here: the handler may run any Python code.
            if let Err(error) = handler.call0() {
                return Ok((start, seq, 2, Some(payload), Some(error.into_value(py))));
            }
        }
    }
}

/// What [`PySmallFrameMac::open_at`] found at a position of the buffer.
enum Opened<'py> {
    /// The payload of a whole small frame whose tag checks, and where the frame ends.
    Payload(Bound<'py, PyBytes>, usize),
    /// No whole small frame there (cut, large, a long header, or past the end).
    NotWhole,
    /// A whole small frame whose tag does not match.
    TagMismatch,
}

impl PySmallFrameMac {
    /// The frame at `start` of `buffer`, opened as frame `seq` (see [`Opened`]).
    fn open_at<'py>(
        &self,
        py: Python<'py>,
        buffer: &Bound<'py, PyByteArray>,
        start: usize,
        seq: u64,
    ) -> Opened<'py> {
        // SAFETY: the slice is only read while this call holds the GIL and runs no Python
        // code, so nothing can resize or free the bytearray meanwhile; the payload is
        // copied into a new bytes object before the borrow ends.
        let bytes = unsafe { buffer.as_bytes() };
        let Some(rest) = bytes.get(start..) else {
            return Opened::NotWhole;
        };
        let Some(header) = rest.get(..LENGTH_BYTES) else {
            return Opened::NotWhole;
        };
        let size = i32::from_be_bytes([header[0], header[1], header[2], header[3]]);
        let Ok(size) = usize::try_from(size) else {
            return Opened::NotWhole; // a long frame's marker (-1) or garbage: the general path
        };
        if size < TAG_BYTES || size - TAG_BYTES > self.small_limit {
            return Opened::NotWhole;
        }
        let Some(frame) = rest.get(LENGTH_BYTES..LENGTH_BYTES + size) else {
            return Opened::NotWhole; // not all here yet
        };
        let (tag, payload) = frame.split_at(TAG_BYTES);
        if !self.mac.verify(&seq.to_be_bytes(), payload, tag) {
            return Opened::TagMismatch;
        }
        Opened::Payload(PyBytes::new(py, payload), start + LENGTH_BYTES + size)
    }
}
