//! TVM-style tensors on host memory: compact row-major [`Tensor`]s, the
//! [`TensorMemoryPool`], TVM's copy and view rules, and TVM's tensor file format.
//!
//! Pure Rust; the Python skin (buffer protocol, DLPack, exceptions) lives in
//! `crate::python::tensor`.

pub mod array;
pub mod device;
pub mod dtype;
pub mod error;
pub mod format;
pub mod pool;
pub mod storage;

pub use array::{byte_size, copy_from_to, Tensor};
pub use device::{device_type_to_str, Device};
pub use dtype::{is_plain_buffer_format, DataType};
pub use error::{TensorError, TensorFormatError};
pub use format::{LoadError, PARAM_DICT_MAGIC, TENSOR_MAGIC};
pub use pool::{PoolConfig, TensorMemoryPool};
pub use storage::{Backing, HostBuffer};

/// Number of bytes each allocation must align to (TVM's `kAllocAlignment`).
pub const ALLOC_ALIGNMENT: usize = 64;
/// The most dimensions a tensor may have: numpy's and the buffer protocol's
/// (`PyBUF_MAX_NDIM`). Every tensor's shape is checked against it ([`byte_size`], which
/// every constructor calls), and every way in refuses more before it reads a shape (a
/// shape from Python, a DLPack import, a tensor file), so that whatever cubepool holds it
/// can also export, write and read back.
pub const MAX_NDIM: usize = 64;
/// Alignment of temporary allocations (TVM's `kTempAllocaAlignment`).
pub const TEMP_ALLOCA_ALIGNMENT: usize = 64;
/// Largest allocation placed on the stack (TVM's `kMaxStackAlloca`).
pub const MAX_STACK_ALLOCA: usize = 1024;
/// Default alignment inside workspace buffers (TVM's `kDefaultWorkspaceAlignment`).
pub const DEFAULT_WORKSPACE_ALIGNMENT: usize = 1;
