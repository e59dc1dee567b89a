//! Error families of the tensor module: rule violations ([`TensorError`]) and malformed
//! tensor files ([`TensorFormatError`]).

use super::{DataType, Device};

/// Breaking one of TVM's tensor rules (shapes, sizes, views, devices, alignment).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TensorError {
    /// A dtype string that is not a TVM dtype cubepool supports.
    #[error("unknown dtype {name:?} (expected bool, int8..int64, uint8..uint64, float16/32/64 or bfloat16, optionally with an xN lane suffix)")]
    UnknownDtype {
        /// The string given.
        name: String,
    },
    /// A vector dtype (more than one lane) given to the tensor file format, which has
    /// none: TVM's reader and writer count `ceil(bits / 8)` bytes an element and
    /// ignore lanes.
    #[error("the tensor file format cannot hold {dtype} (lanes={}): it has no vector types (TVM's format counts ceil(bits / 8) bytes an element and ignores lanes)", .dtype.lanes)]
    VectorDtypeInFile {
        /// The tensor's dtype.
        dtype: DataType,
    },
    /// A `(code, bits, lanes)` triple cubepool tensors cannot hold.
    #[error("unsupported dtype (code={code}, bits={bits}, lanes={lanes})")]
    UnsupportedDtype {
        /// DLPack type code.
        code: u8,
        /// Bits per lane.
        bits: u8,
        /// Lanes.
        lanes: u16,
    },
    /// A device string or ordinal that does not parse.
    #[error("invalid device {name:?} (expected a name such as \"cpu\" or \"cpu:0\")")]
    InvalidDevice {
        /// The device as given.
        name: String,
    },
    /// A DLPack device type with no name.
    #[error("unknown type = {device_type}")]
    UnknownDeviceType {
        /// The device type.
        device_type: i32,
    },
    /// Allocation or access on a device other than `cpu:0`.
    #[error("device {device} is not supported: cubepool tensors live in host memory (cpu:0)")]
    UnsupportedDevice {
        /// The device asked for.
        device: Device,
    },
    /// A negative dimension.
    #[error("shape {shape:?} has a negative dimension at axis {axis}")]
    NegativeDimension {
        /// The shape.
        shape: Vec<i64>,
        /// The offending axis.
        axis: usize,
    },
    /// A shape of more dimensions than a tensor may have ([`MAX_NDIM`](super::MAX_NDIM)).
    #[error(
        "a tensor has at most {} dimensions; this shape has {ndim}",
        super::MAX_NDIM
    )]
    TooManyDimensions {
        /// The shape's dimensions.
        ndim: usize,
    },
    /// A shape whose byte size does not fit in memory.
    #[error("shape {shape:?} of {dtype} is too large: its byte size overflows")]
    ShapeOverflow {
        /// The shape.
        shape: Vec<i64>,
        /// The element type.
        dtype: DataType,
    },
    /// Copies whose two sides differ in byte size (TVM's `CopyFromTo`, `CopyFromBytes`,
    /// `CopyToBytes` rule).
    #[error("{op}: The size in bytes must exactly match: source has {source_bytes} bytes, destination has {destination_bytes} bytes")]
    SizeMismatch {
        /// The operation.
        op: &'static str,
        /// Bytes on the source side.
        source_bytes: usize,
        /// Bytes on the destination side.
        destination_bytes: usize,
    },
    /// A buffer that is not C-contiguous where one is needed.
    #[error("{op}: the buffer must be C-contiguous")]
    NotContiguous {
        /// The operation.
        op: &'static str,
    },
    /// A buffer whose items are not plain numbers or bytes: Python object pointers
    /// (numpy's `object` dtype, ctypes' `py_object`), pointers or structures. Its bytes
    /// are never read or written as a tensor's: raw bytes written over object pointers
    /// would be freed as objects.
    #[error("{op}: the buffer must hold numbers or bytes, not items of format {format:?}")]
    NotPlainBuffer {
        /// The operation.
        op: &'static str,
        /// The buffer's struct-module format, as exported.
        format: String,
    },
    /// A view that does not fit inside its source (TVM's `CreateView` message).
    #[error("View with shape {shape:?} and datatype {dtype} would have a size of {view_bytes} bytes.  This would occupy bytes {begin} <= i_byte < {end} within the backing array.  However, the Tensor being viewed only contains {source_bytes} bytes (shape = {source_shape:?}, dtype= {source_dtype}).")]
    ViewOutOfBounds {
        /// The view shape.
        shape: Vec<i64>,
        /// The view dtype.
        dtype: DataType,
        /// Bytes the view needs.
        view_bytes: usize,
        /// First byte of the view, relative to the source.
        begin: u64,
        /// One past the last byte, relative to the source (saturating).
        end: u64,
        /// Bytes in the source.
        source_bytes: usize,
        /// The source's shape.
        source_shape: Vec<i64>,
        /// The source's dtype.
        source_dtype: DataType,
    },
    /// Writing into a read-only tensor (imported from a read-only DLPack producer).
    #[error("{op}: the destination tensor is read-only")]
    ReadOnly {
        /// The operation.
        op: &'static str,
    },
    /// Memory not aligned as required.
    #[error("{what} at address {address:#x} is not aligned to {alignment} bytes")]
    Misaligned {
        /// What was misaligned.
        what: &'static str,
        /// The address.
        address: usize,
        /// The alignment needed.
        alignment: usize,
    },
    /// Backing memory smaller than asked for.
    #[error("{what} has {actual} bytes but {required} bytes were requested")]
    BackingTooSmall {
        /// What was too small.
        what: &'static str,
        /// Bytes it has.
        actual: usize,
        /// Bytes needed.
        required: usize,
    },
    /// Backing memory on the wrong device.
    #[error("{what} is on {actual} but the pool allocates on {expected}")]
    WrongDevice {
        /// What was on the wrong device.
        what: &'static str,
        /// Where it is.
        actual: Device,
        /// Where it should be.
        expected: Device,
    },
    /// Backing memory that cannot be written.
    #[error("{what} is read-only; backing memory must be writable")]
    ReadOnlyBacking {
        /// What was read-only.
        what: &'static str,
    },
    /// Backing that overlaps backing the pool holds (handed out or cached): adopted, the
    /// two would be handed to two tensors over the same bytes.
    #[error("{what} at {address:#x} ({nbytes} bytes) overlaps backing the pool holds already: two tensors would share its bytes")]
    BackingHeld {
        /// What was given.
        what: &'static str,
        /// Its first byte.
        address: usize,
        /// Its bytes.
        nbytes: usize,
    },
    /// An alignment that is zero or not a power of two.
    #[error("alignment {alignment} is not a power of two")]
    InvalidAlignment {
        /// The alignment.
        alignment: usize,
    },
    /// A pool page size of zero.
    #[error("page_size must be positive, got {page_size}")]
    InvalidPageSize {
        /// The page size.
        page_size: usize,
    },
    /// The host allocator failed.
    #[error("out of memory allocating {nbytes} bytes aligned to {alignment}")]
    OutOfMemory {
        /// Bytes asked for.
        nbytes: usize,
        /// Alignment asked for.
        alignment: usize,
    },
    /// A panic on another thread poisoned an internal lock.
    #[error("internal lock of {what} poisoned by a panic on another thread")]
    LockPoisoned {
        /// The locked object.
        what: &'static str,
    },
    /// A parameter dict given the same name twice, which its readers (this one and
    /// TVM's) refuse.
    #[error("a parameter dict names {name:?} twice: its readers refuse it")]
    DuplicateParamName {
        /// The name.
        name: String,
    },
}

/// A truncated, corrupted or hostile tensor or parameter-dict file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TensorFormatError {
    /// The input ends before a field.
    #[error("truncated input: {what} needs {needed} bytes but only {available} remain")]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Bytes it needs.
        needed: u64,
        /// Bytes left in the input.
        available: u64,
    },
    /// A wrong magic number.
    #[error("invalid {what}: magic number is {found:#018x}, expected {expected:#018x}")]
    BadMagic {
        /// Which format.
        what: &'static str,
        /// The magic read.
        found: u64,
        /// The magic expected.
        expected: u64,
    },
    /// A tensor record that names a device other than the CPU: TVM saves only CPU
    /// tensors and refuses to load others, with this message.
    #[error("Invalid DLTensor device: can only save as CPU tensor (the record names device type {device_type}, id {device_id})")]
    NotCpu {
        /// The record's device type (1 is the CPU).
        device_type: i32,
        /// The record's device id.
        device_id: i32,
    },
    /// A negative `ndim`, or one past [`MAX_NDIM`](super::MAX_NDIM).
    #[error("invalid tensor record: ndim is {ndim} (at most {})", super::MAX_NDIM)]
    InvalidNdim {
        /// The ndim field.
        ndim: i32,
    },
    /// A dtype triple cubepool cannot hold.
    #[error("invalid tensor record: unsupported dtype (code={code}, bits={bits}, lanes={lanes})")]
    UnsupportedDtype {
        /// Type code.
        code: u8,
        /// Bits.
        bits: u8,
        /// Lanes.
        lanes: u16,
    },
    /// A negative dimension.
    #[error("invalid tensor record: dimension {axis} is {value}")]
    NegativeDimension {
        /// The axis.
        axis: usize,
        /// The value.
        value: i64,
    },
    /// A shape whose byte size overflows.
    #[error("invalid tensor record: shape {shape:?} of {dtype} overflows the address space")]
    ShapeOverflow {
        /// The shape.
        shape: Vec<i64>,
        /// The dtype.
        dtype: DataType,
    },
    /// The data_byte_size field disagrees with shape and dtype.
    #[error("invalid tensor record: data_byte_size is {declared} but shape {shape:?} of {dtype} needs {expected} bytes")]
    SizeMismatch {
        /// The field, as the file holds it (a signed 64-bit count).
        declared: i64,
        /// What shape and dtype need.
        expected: u64,
        /// The shape.
        shape: Vec<i64>,
        /// The dtype.
        dtype: DataType,
    },
    /// Bytes left over after the record.
    #[error("{count} trailing bytes after the {what}")]
    TrailingBytes {
        /// What was read.
        what: &'static str,
        /// Bytes left.
        count: u64,
    },
    /// A parameter name that is not UTF-8.
    #[error("invalid parameter dict: name #{index} is not valid UTF-8")]
    InvalidName {
        /// Index of the name.
        index: u64,
    },
    /// A name present twice.
    #[error("invalid parameter dict: duplicate name {name:?}")]
    DuplicateName {
        /// The name.
        name: String,
    },
    /// Name and tensor counts that differ.
    #[error("invalid parameter dict: {names} names but {tensors} tensors")]
    CountMismatch {
        /// Names.
        names: u64,
        /// Tensors.
        tensors: u64,
    },
    /// The underlying reader failed.
    #[error("I/O error while reading {what}: {source}")]
    Io {
        /// The field being read.
        what: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// The Python exception class each error becomes (the bindings map these onto
/// `cubepool._errors`; kept here so the mapping is tested without Python).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExceptionClass {
    /// `cubepool.CubepoolError`.
    Cubepool,
    /// `cubepool.TensorError` (also a `ValueError`).
    Tensor,
    /// `cubepool.TensorFormatError` (also a `ValueError`).
    TensorFormat,
    /// Builtin `MemoryError`.
    Memory,
    /// Builtin `OSError`.
    Os,
}

/// The class each tensor error becomes: one exhaustive match.
impl TensorError {
    /// The Python exception class of this error.
    pub fn exception_class(&self) -> ExceptionClass {
        match self {
            TensorError::UnknownDtype { .. }
            | TensorError::UnsupportedDtype { .. }
            | TensorError::VectorDtypeInFile { .. }
            | TensorError::DuplicateParamName { .. }
            | TensorError::InvalidDevice { .. }
            | TensorError::UnknownDeviceType { .. }
            | TensorError::UnsupportedDevice { .. }
            | TensorError::NegativeDimension { .. }
            | TensorError::TooManyDimensions { .. }
            | TensorError::ShapeOverflow { .. }
            | TensorError::SizeMismatch { .. }
            | TensorError::NotContiguous { .. }
            | TensorError::NotPlainBuffer { .. }
            | TensorError::ViewOutOfBounds { .. }
            | TensorError::ReadOnly { .. }
            | TensorError::Misaligned { .. }
            | TensorError::BackingTooSmall { .. }
            | TensorError::BackingHeld { .. }
            | TensorError::WrongDevice { .. }
            | TensorError::ReadOnlyBacking { .. }
            | TensorError::InvalidAlignment { .. }
            | TensorError::InvalidPageSize { .. } => ExceptionClass::Tensor,
            TensorError::OutOfMemory { .. } => ExceptionClass::Memory,
            TensorError::LockPoisoned { .. } => ExceptionClass::Cubepool,
        }
    }
}

/// The class each format error becomes: one exhaustive match.
impl TensorFormatError {
    /// The Python exception class of this error.
    pub fn exception_class(&self) -> ExceptionClass {
        match self {
            TensorFormatError::Truncated { .. }
            | TensorFormatError::BadMagic { .. }
            | TensorFormatError::NotCpu { .. }
            | TensorFormatError::InvalidNdim { .. }
            | TensorFormatError::UnsupportedDtype { .. }
            | TensorFormatError::NegativeDimension { .. }
            | TensorFormatError::ShapeOverflow { .. }
            | TensorFormatError::SizeMismatch { .. }
            | TensorFormatError::TrailingBytes { .. }
            | TensorFormatError::InvalidName { .. }
            | TensorFormatError::DuplicateName { .. }
            | TensorFormatError::CountMismatch { .. } => ExceptionClass::TensorFormat,
            TensorFormatError::Io { source, .. }
                if source.kind() == std::io::ErrorKind::OutOfMemory =>
            {
                ExceptionClass::Memory
            }
            TensorFormatError::Io { .. } => ExceptionClass::Os,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{DataType, Device};

    #[test]
    fn every_variant_has_its_class() {
        let dt = DataType::UINT8;
        let cases = [
            (
                TensorError::UnknownDtype { name: "x".into() },
                ExceptionClass::Tensor,
            ),
            (
                TensorError::UnsupportedDtype {
                    code: 5,
                    bits: 64,
                    lanes: 1,
                },
                ExceptionClass::Tensor,
            ),
            (
                TensorError::InvalidDevice { name: "x".into() },
                ExceptionClass::Tensor,
            ),
            (
                TensorError::DuplicateParamName { name: "x".into() },
                ExceptionClass::Tensor,
            ),
            (
                TensorError::UnknownDeviceType { device_type: 0 },
                ExceptionClass::Tensor,
            ),
            (
                TensorError::UnsupportedDevice {
                    device: Device::CPU0,
                },
                ExceptionClass::Tensor,
            ),
            (
                TensorError::NegativeDimension {
                    shape: vec![-1],
                    axis: 0,
                },
                ExceptionClass::Tensor,
            ),
            (
                TensorError::ShapeOverflow {
                    shape: vec![],
                    dtype: dt,
                },
                ExceptionClass::Tensor,
            ),
            (
                TensorError::SizeMismatch {
                    op: "x",
                    source_bytes: 1,
                    destination_bytes: 2,
                },
                ExceptionClass::Tensor,
            ),
            (
                TensorError::NotContiguous { op: "x" },
                ExceptionClass::Tensor,
            ),
            (
                TensorError::ViewOutOfBounds {
                    shape: vec![],
                    dtype: dt,
                    view_bytes: 1,
                    begin: 0,
                    end: 1,
                    source_bytes: 0,
                    source_shape: vec![],
                    source_dtype: dt,
                },
                ExceptionClass::Tensor,
            ),
            (TensorError::ReadOnly { op: "x" }, ExceptionClass::Tensor),
            (
                TensorError::Misaligned {
                    what: "x",
                    address: 1,
                    alignment: 2,
                },
                ExceptionClass::Tensor,
            ),
            (
                TensorError::BackingTooSmall {
                    what: "x",
                    actual: 1,
                    required: 2,
                },
                ExceptionClass::Tensor,
            ),
            (
                TensorError::WrongDevice {
                    what: "x",
                    actual: Device::CPU0,
                    expected: Device::CPU0,
                },
                ExceptionClass::Tensor,
            ),
            (
                TensorError::ReadOnlyBacking { what: "x" },
                ExceptionClass::Tensor,
            ),
            (
                TensorError::InvalidAlignment { alignment: 3 },
                ExceptionClass::Tensor,
            ),
            (
                TensorError::InvalidPageSize { page_size: 0 },
                ExceptionClass::Tensor,
            ),
            (
                TensorError::OutOfMemory {
                    nbytes: 1,
                    alignment: 1,
                },
                ExceptionClass::Memory,
            ),
            (
                TensorError::LockPoisoned { what: "x" },
                ExceptionClass::Cubepool,
            ),
        ];
        for (err, class) in cases {
            assert_eq!(err.exception_class(), class, "{err}");
        }
        let formats = [
            (
                TensorFormatError::Truncated {
                    what: "x",
                    needed: 1,
                    available: 0,
                },
                ExceptionClass::TensorFormat,
            ),
            (
                TensorFormatError::BadMagic {
                    what: "x",
                    found: 0,
                    expected: 1,
                },
                ExceptionClass::TensorFormat,
            ),
            (
                TensorFormatError::InvalidNdim { ndim: -1 },
                ExceptionClass::TensorFormat,
            ),
            (
                TensorFormatError::NotCpu {
                    device_type: 2,
                    device_id: 0,
                },
                ExceptionClass::TensorFormat,
            ),
            (
                TensorFormatError::UnsupportedDtype {
                    code: 9,
                    bits: 1,
                    lanes: 1,
                },
                ExceptionClass::TensorFormat,
            ),
            (
                TensorFormatError::NegativeDimension { axis: 0, value: -1 },
                ExceptionClass::TensorFormat,
            ),
            (
                TensorFormatError::ShapeOverflow {
                    shape: vec![],
                    dtype: dt,
                },
                ExceptionClass::TensorFormat,
            ),
            (
                TensorFormatError::SizeMismatch {
                    declared: 1,
                    expected: 2,
                    shape: vec![],
                    dtype: dt,
                },
                ExceptionClass::TensorFormat,
            ),
            (
                TensorFormatError::TrailingBytes {
                    what: "x",
                    count: 1,
                },
                ExceptionClass::TensorFormat,
            ),
            (
                TensorFormatError::InvalidName { index: 0 },
                ExceptionClass::TensorFormat,
            ),
            (
                TensorFormatError::DuplicateName { name: "x".into() },
                ExceptionClass::TensorFormat,
            ),
            (
                TensorFormatError::CountMismatch {
                    names: 1,
                    tensors: 2,
                },
                ExceptionClass::TensorFormat,
            ),
            (
                TensorFormatError::Io {
                    what: "x",
                    source: std::io::Error::other("x"),
                },
                ExceptionClass::Os,
            ),
        ];
        for (err, class) in formats {
            assert_eq!(err.exception_class(), class, "{err}");
        }
    }
}
