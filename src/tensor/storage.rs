//! Where tensor bytes live, and the only raw memory access of the tensor module.
//!
//! A [`Backing`] is an owner of bytes (host allocation, a pool lease, a Python buffer
//! export, an imported DLPack tensor). Tensors hold an `Arc<dyn Backing>`, so the bytes stay
//! valid while any tensor, view or export refers to them. [`Region`] is a bounds-checked
//! window into a backing; every read and write goes through it.
#![allow(unsafe_code)]

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::Arc;

use super::array::Tensor;
use super::error::TensorError;

/// An owner of a fixed range of bytes.
///
/// # Safety
///
/// Implementors guarantee that [`Backing::as_ptr`] returns the same pointer for the whole
/// life of the value, that it points to [`Backing::len`] bytes valid for reads (and, unless
/// [`Backing::readonly`] is true, for writes) until the value is dropped, and that those
/// bytes are not freed or reused while it lives. Several tensors may alias the bytes: all
/// access goes through raw pointer copies, never through Rust references.
pub unsafe trait Backing: Send + Sync + 'static {
    /// First byte.
    fn as_ptr(&self) -> *mut u8;
    /// Number of bytes.
    fn len(&self) -> usize;
    /// Whether the bytes are empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether writing is forbidden.
    fn readonly(&self) -> bool {
        false
    }
}

/// Zero-initialised, aligned host memory owned by Rust.
///
/// Invariant: `ptr` was returned by `alloc_zeroed(layout)` when `layout.size() > 0`, and is a
/// dangling pointer aligned to `layout.align()` when the size is zero.
#[derive(Debug)]
pub struct HostBuffer {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer is plain bytes with a single owner; all access is through raw copies
// that the `Backing` contract allows from any thread.
unsafe impl Send for HostBuffer {}
// SAFETY: as above; `&HostBuffer` only exposes the pointer value.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Allocates `len` zeroed bytes aligned to `alignment` (a power of two).
    pub fn new(len: usize, alignment: usize) -> Result<HostBuffer, TensorError> {
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(TensorError::InvalidAlignment { alignment });
        }
        let oom = TensorError::OutOfMemory {
            nbytes: len,
            alignment,
        };
        let layout = Layout::from_size_align(len, alignment).map_err(|_| oom)?;
        if len == 0 {
            // A zero-sized buffer needs no memory: a dangling pointer with the right
            // alignment (never dereferenced, since every region of it is empty).
            let ptr = NonNull::new(std::ptr::without_provenance_mut::<u8>(alignment))
                .ok_or(TensorError::InvalidAlignment { alignment })?;
            return Ok(HostBuffer { ptr, layout });
        }
        // SAFETY: `layout` has a non-zero size, checked above.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(TensorError::OutOfMemory {
            nbytes: len,
            alignment,
        })?;
        Ok(HostBuffer { ptr, layout })
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if self.layout.size() > 0 {
            // SAFETY: `ptr` came from `alloc_zeroed(self.layout)` (struct invariant) and is
            // freed exactly once, here.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
        }
    }
}

// SAFETY: the allocation lives exactly as long as the `HostBuffer` and never moves; it is
// `layout.size()` bytes, readable and writable.
unsafe impl Backing for HostBuffer {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.layout.size()
    }
}

/// A bounds-checked window `[offset, offset + len)` into a backing.
///
/// Invariant: `offset + len <= backing.len()` (checked by [`Region::new`]).
#[derive(Clone, Copy)]
pub struct Region<'a> {
    backing: &'a Arc<dyn Backing>,
    offset: usize,
    len: usize,
}

impl<'a> Region<'a> {
    /// A window of `len` bytes at `offset`, or `None` when it does not fit.
    pub fn new(backing: &'a Arc<dyn Backing>, offset: usize, len: usize) -> Option<Region<'a>> {
        let end = offset.checked_add(len)?;
        (end <= backing.len()).then_some(Region {
            backing,
            offset,
            len,
        })
    }

    /// An empty window at the start of `backing`.
    pub fn empty(backing: &'a Arc<dyn Backing>) -> Region<'a> {
        Region {
            backing,
            offset: 0,
            len: 0,
        }
    }

    /// Bytes in the window.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Address of the first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        // `wrapping_add` keeps this safe; the offset is in bounds by the struct invariant.
        self.backing.as_ptr().wrapping_add(self.offset)
    }

    /// Copies this window into `dst` (same length; the two may overlap).
    pub fn copy_to(&self, dst: Region<'_>, op: &'static str) -> Result<(), TensorError> {
        if self.len != dst.len {
            return Err(TensorError::SizeMismatch {
                op,
                source_bytes: self.len,
                destination_bytes: dst.len,
            });
        }
        if dst.backing.readonly() {
            return Err(TensorError::ReadOnly { op });
        }
        if self.len > 0 {
            // SAFETY: both windows lie inside live backings (struct invariant; the `Backing`
            // contract keeps them valid while borrowed), the destination is writable
            // (checked above), and `ptr::copy` allows overlap.
            unsafe { std::ptr::copy(self.as_ptr(), dst.as_ptr(), self.len) };
        }
        Ok(())
    }

    /// Copies the window into `dst`, which must be exactly as long.
    pub fn read_into(&self, dst: &mut [u8], op: &'static str) -> Result<(), TensorError> {
        if dst.len() != self.len {
            return Err(TensorError::SizeMismatch {
                op,
                source_bytes: self.len,
                destination_bytes: dst.len(),
            });
        }
        if self.len > 0 {
            // SAFETY: the window is inside a live backing (struct invariant); `dst` is a Rust
            // slice of the same length, and `ptr::copy` tolerates overlap should the caller
            // have handed in memory a backing also reaches.
            unsafe { std::ptr::copy(self.as_ptr(), dst.as_mut_ptr(), self.len) };
        }
        Ok(())
    }

    /// Copies the window out into a fresh vector; fails (instead of aborting) when the
    /// vector cannot be allocated.
    pub fn to_vec(&self) -> Result<Vec<u8>, TensorError> {
        let mut out = Vec::new();
        out.try_reserve_exact(self.len)
            .map_err(|_| TensorError::OutOfMemory {
                nbytes: self.len,
                alignment: 1,
            })?;
        out.resize(self.len, 0);
        self.read_into(&mut out, "to_vec")?;
        Ok(out)
    }

    /// Copies `data` (exactly `len` bytes) into the window.
    pub fn write(&self, data: &[u8], op: &'static str) -> Result<(), TensorError> {
        if data.len() != self.len {
            return Err(TensorError::SizeMismatch {
                op,
                source_bytes: data.len(),
                destination_bytes: self.len,
            });
        }
        if self.backing.readonly() {
            return Err(TensorError::ReadOnly { op });
        }
        if self.len > 0 {
            // SAFETY: the window is inside a live, writable backing; `data` is a Rust slice,
            // which cannot alias memory that only raw pointers reach (backings are never
            // borrowed as slices), and `ptr::copy` would tolerate overlap anyway.
            unsafe { std::ptr::copy(data.as_ptr(), self.as_ptr(), self.len) };
        }
        Ok(())
    }
}

/// Called with a leased tensor's backing when the last user of the lease lets go.
pub trait ReleaseHook: Send + Sync + 'static {
    /// Takes the backing back.
    fn release(&self, backing: Tensor);
}

/// A backing that borrows the bytes of another tensor (a pool's backing buffer) and hands
/// that tensor to a [`ReleaseHook`] when dropped, i.e. when no tensor, view or export uses
/// the lease any more.
///
/// Invariant: `tensor` is `Some` until `drop`.
pub struct LeasedBacking<H: ReleaseHook> {
    tensor: Option<Tensor>,
    hook: H,
}

impl<H: ReleaseHook> LeasedBacking<H> {
    /// Leases the bytes of `tensor` until the returned value is dropped.
    pub fn new(tensor: Tensor, hook: H) -> LeasedBacking<H> {
        LeasedBacking {
            tensor: Some(tensor),
            hook,
        }
    }
}

impl<H: ReleaseHook> Drop for LeasedBacking<H> {
    fn drop(&mut self) {
        if let Some(tensor) = self.tensor.take() {
            self.hook.release(tensor);
        }
    }
}

// SAFETY: the leased tensor holds an `Arc` of its own backing, so its bytes stay valid
// (that backing's contract) until the tensor is handed to the hook in `drop`; pointer and
// length are those of the tensor's bounds-checked region, which never change.
unsafe impl<H: ReleaseHook> Backing for LeasedBacking<H> {
    fn as_ptr(&self) -> *mut u8 {
        self.tensor
            .as_ref()
            .map_or(std::ptr::null_mut(), Tensor::data_ptr)
    }
    fn len(&self) -> usize {
        self.tensor.as_ref().map_or(0, Tensor::nbytes)
    }
    fn readonly(&self) -> bool {
        self.tensor.as_ref().is_none_or(Tensor::readonly)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_buffer_alignment_and_zeroing() {
        for align in [1, 8, 64, 4096] {
            let b = HostBuffer::new(100, align).unwrap();
            assert_eq!(b.as_ptr() as usize % align, 0);
            let b: Arc<dyn Backing> = Arc::new(b);
            assert_eq!(
                Region::new(&b, 0, 100).unwrap().to_vec().unwrap(),
                vec![0; 100]
            );
        }
        let empty = HostBuffer::new(0, 64).unwrap();
        assert_eq!(empty.as_ptr() as usize % 64, 0);
        assert!(HostBuffer::new(8, 3).is_err());
        assert!(HostBuffer::new(8, 0).is_err());
        assert!(HostBuffer::new(usize::MAX - 10, 64).is_err());
    }

    #[test]
    fn regions_are_bounded_and_copy_with_overlap() {
        let b: Arc<dyn Backing> = Arc::new(HostBuffer::new(16, 64).unwrap());
        assert!(Region::new(&b, 8, 9).is_none());
        assert!(Region::new(&b, usize::MAX, 2).is_none());
        let all = Region::new(&b, 0, 16).unwrap();
        all.write(&(0u8..16).collect::<Vec<_>>(), "t").unwrap();
        let lo = Region::new(&b, 0, 8).unwrap();
        let hi = Region::new(&b, 4, 8).unwrap();
        lo.copy_to(hi, "t").unwrap();
        assert_eq!(
            all.to_vec().unwrap(),
            [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15]
        );
        assert!(lo.write(&[1, 2], "t").is_err());
    }
}
