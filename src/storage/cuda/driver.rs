//! The CUDA driver API, loaded at run time: `libcuda.so.1` is opened with `dlopen` when a
//! CUDA storage is first asked for, and the few entry points cubepool calls are
//! declared here by hand (their C signatures from `cuda.h`, CUDA 12).
//!
//! Nothing links against CUDA, so the crate builds, and every host test passes, on a
//! machine with no GPU and no CUDA; a missing driver is a [`CudaError`] only when a CUDA
//! storage is made.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::OnceLock;

use super::CudaError;

/// `CUresult`: 0 is success.
pub(crate) type CuResult = c_int;
/// `CUdeviceptr`.
pub(crate) type DevicePtr = u64;
/// `CUmemGenericAllocationHandle`.
pub(crate) type MemHandle = u64;
/// `CUcontext`, `CUstream`, `CUevent`: opaque pointers.
pub(crate) type Opaque = *mut c_void;

/// `CUDA_SUCCESS`.
pub(crate) const SUCCESS: CuResult = 0;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub(crate) const ERROR_OUT_OF_MEMORY: CuResult = 2;
/// `CUDA_ERROR_NOT_READY` (an event query whose work is still running).
pub(crate) const ERROR_NOT_READY: CuResult = 600;

/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
const ALLOCATION_TYPE_PINNED: c_int = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_TYPE_DEVICE: c_int = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
const ACCESS_READWRITE: c_int = 3;
/// `CU_EVENT_DISABLE_TIMING`.
pub(crate) const EVENT_DISABLE_TIMING: c_uint = 2;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct MemLocation {
    kind: c_int,
    id: c_int,
}

/// `CUmemAllocationProp` (32 bytes on 64-bit hosts).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct AllocationProp {
    kind: c_int,
    requested_handle_types: c_int,
    location: MemLocation,
    win32_handle_meta_data: *mut c_void,
    /// `allocFlags`: compressionType, gpuDirectRDMACapable, usage (u16), reserved[4].
    alloc_flags: [u8; 8],
}

impl AllocationProp {
    /// Pinned device memory on device `ordinal`, no shareable handle, no compression.
    pub(crate) fn device(ordinal: c_int) -> Self {
        Self {
            kind: ALLOCATION_TYPE_PINNED,
            requested_handle_types: 0,
            location: MemLocation {
                kind: LOCATION_TYPE_DEVICE,
                id: ordinal,
            },
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: [0; 8],
        }
    }
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct AccessDesc {
    location: MemLocation,
    flags: c_int,
}

impl AccessDesc {
    /// Read and write access from device `ordinal`.
    pub(crate) fn read_write(ordinal: c_int) -> Self {
        Self {
            location: MemLocation {
                kind: LOCATION_TYPE_DEVICE,
                id: ordinal,
            },
            flags: ACCESS_READWRITE,
        }
    }
}

/// Declares [`Driver`]'s entry points from one list: the field, the exported symbol and
/// the C signature of each.
macro_rules! driver_api {
    ($($field:ident = $symbol:literal : fn($($arg:ty),*);)*) => {
        /// The driver's entry points, resolved once from the loaded library (which is
        /// never closed, so they stay valid for the life of the process).
        pub(crate) struct Driver {
            $(
                #[doc = concat!("`", $symbol, "`.")]
                pub(crate) $field: unsafe extern "C" fn($($arg),*) -> CuResult,
            )*
        }

        impl Driver {
            /// Resolves every entry point from the `dlopen` handle `library`.
            fn resolve(library: *mut c_void, path: &str) -> Result<Self, CudaError> {
                Ok(Self {
                    $(
                        // SAFETY: the symbol is the driver's function of this C
                        // signature (cuda.h, CUDA 12); a null symbol was refused.
                        $field: unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> CuResult>(
                                symbol(library, $symbol, path)?,
                            )
                        },
                    )*
                })
            }
        }
    };
}

driver_api! {
    init = "cuInit": fn(c_uint);
    device_get_count = "cuDeviceGetCount": fn(*mut c_int);
    device_get = "cuDeviceGet": fn(*mut c_int, c_int);
    primary_ctx_retain = "cuDevicePrimaryCtxRetain": fn(*mut Opaque, c_int);
    ctx_get_current = "cuCtxGetCurrent": fn(*mut Opaque);
    ctx_set_current = "cuCtxSetCurrent": fn(Opaque);
    ctx_synchronize = "cuCtxSynchronize": fn();
    get_error_name = "cuGetErrorName": fn(CuResult, *mut *const c_char);
    mem_alloc = "cuMemAlloc_v2": fn(*mut DevicePtr, usize);
    mem_free = "cuMemFree_v2": fn(DevicePtr);
    mem_get_info = "cuMemGetInfo_v2": fn(*mut usize, *mut usize);
    granularity = "cuMemGetAllocationGranularity": fn(*mut usize, *const AllocationProp, c_int);
    address_reserve = "cuMemAddressReserve": fn(*mut DevicePtr, usize, usize, DevicePtr, u64);
    address_free = "cuMemAddressFree": fn(DevicePtr, usize);
    mem_create = "cuMemCreate": fn(*mut MemHandle, usize, *const AllocationProp, u64);
    mem_release = "cuMemRelease": fn(MemHandle);
    mem_map = "cuMemMap": fn(DevicePtr, usize, usize, MemHandle, u64);
    mem_unmap = "cuMemUnmap": fn(DevicePtr, usize);
    mem_set_access = "cuMemSetAccess": fn(DevicePtr, usize, *const AccessDesc, usize);
    event_create = "cuEventCreate": fn(*mut Opaque, c_uint);
    event_destroy = "cuEventDestroy_v2": fn(Opaque);
    event_record = "cuEventRecord": fn(Opaque, Opaque);
    event_query = "cuEventQuery": fn(Opaque);
    event_synchronize = "cuEventSynchronize": fn(Opaque);
}

/// The address of `name` in `library`; [`CudaError::MissingSymbol`] when absent.
fn symbol(library: *mut c_void, name: &'static str, path: &str) -> Result<*mut c_void, CudaError> {
    let missing = || CudaError::MissingSymbol {
        symbol: name,
        library: path.to_string(),
    };
    let c_name = CString::new(name).map_err(|_| missing())?;
    // SAFETY: `library` is a live dlopen handle and `c_name` a NUL-terminated string.
    let address = unsafe { libc::dlsym(library, c_name.as_ptr()) };
    if address.is_null() {
        return Err(missing());
    }
    Ok(address)
}

/// The last `dlerror` message, or a placeholder.
fn dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until the next call.
    let message = unsafe { libc::dlerror() };
    if message.is_null() {
        return "unknown dlopen error".to_string();
    }
    // SAFETY: non-null, NUL-terminated (above).
    unsafe { CStr::from_ptr(message) }
        .to_string_lossy()
        .into_owned()
}

/// The library the driver is loaded from: `CUBEPOOL_LIBCUDA` when set (another path
/// to the driver), else `libcuda.so.1`, the name the NVIDIA driver installs.
pub fn library_path() -> String {
    std::env::var("CUBEPOOL_LIBCUDA").unwrap_or_else(|_| "libcuda.so.1".to_string())
}

/// Loads the driver from `path` as a CUDA storage would (every entry point resolved,
/// `cuInit` called) without keeping it: what a CUDA storage would fail with, ahead of
/// time.
pub fn probe_driver(path: &str) -> Result<(), CudaError> {
    Driver::load(path).map(drop)
}

impl Driver {
    /// Opens `path` and resolves every entry point, then calls `cuInit(0)`.
    ///
    /// [`CudaError::DriverNotFound`] when the library cannot be opened,
    /// [`CudaError::MissingSymbol`] when it lacks an entry point (not a CUDA 12
    /// driver), [`CudaError::Call`] when `cuInit` fails (no device, driver too old).
    pub(crate) fn load(path: &str) -> Result<Self, CudaError> {
        let c_path = CString::new(path).map_err(|_| CudaError::DriverNotFound {
            library: path.to_string(),
            reason: "the path contains a NUL byte".to_string(),
        })?;
        // SAFETY: a NUL-terminated path; the handle is never closed, so symbols
        // resolved from it stay valid.
        let library = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if library.is_null() {
            return Err(CudaError::DriverNotFound {
                library: path.to_string(),
                reason: dl_error(),
            });
        }
        let driver = Self::resolve(library, path)?;
        // SAFETY: cuInit's signature; flags must be 0.
        let code = unsafe { (driver.init)(0) };
        driver.check(code, "cuInit")?;
        Ok(driver)
    }

    /// The driver of this process, loaded on first use from [`library_path`] (a failure
    /// is remembered: the process does not retry).
    pub(crate) fn global() -> Result<&'static Driver, CudaError> {
        static DRIVER: OnceLock<Result<Driver, CudaError>> = OnceLock::new();
        DRIVER
            .get_or_init(|| Driver::load(&library_path()))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// `Ok` for `CUDA_SUCCESS`, else [`CudaError::Call`] naming `call` and the code.
    pub(crate) fn check(&self, code: CuResult, call: &'static str) -> Result<(), CudaError> {
        if code == SUCCESS {
            return Ok(());
        }
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName writes a static string pointer (or leaves it null).
        let named = unsafe { (self.get_error_name)(code, &mut name) };
        let name = if named == SUCCESS && !name.is_null() {
            // SAFETY: a static NUL-terminated string from the driver.
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned()
        } else {
            format!("CUresult {code}")
        };
        Err(CudaError::Call { call, code, name })
    }
}

// SAFETY: the table holds only function pointers into a library that is never unloaded;
// the driver API is thread-safe.
unsafe impl Send for Driver {}
// SAFETY: as above.
unsafe impl Sync for Driver {}
