//! [`Tensor`]: a compact row-major view of a [`Backing`], with TVM's copy and view rules.

use std::fmt;
use std::sync::Arc;

use super::error::TensorError;
use super::storage::{Backing, HostBuffer, Region};
use super::{DataType, Device};

/// Bytes needed by `shape` elements of `dtype`, with TVM's `GetDataSize` rule
/// (`ceil(bits * lanes / 8)` per element). Fails on negative dimensions, on more than
/// [`MAX_NDIM`](super::MAX_NDIM) of them (every tensor's shape passes here) and on sizes
/// that do not fit in `isize::MAX` bytes.
pub fn byte_size(shape: &[i64], dtype: DataType) -> Result<usize, TensorError> {
    if shape.len() > super::MAX_NDIM {
        return Err(TensorError::TooManyDimensions { ndim: shape.len() });
    }
    let overflow = || TensorError::ShapeOverflow {
        shape: shape.to_vec(),
        dtype,
    };
    // The fields are public: a `DataType` built from them, not by `DataType::new`, may
    // break its invariant (0 bits, 0 lanes), and would be a tensor of no bytes a file
    // could not hold.
    DataType::new(dtype.code, dtype.bits, dtype.lanes)?;
    if let Some(axis) = shape.iter().position(|&dim| dim < 0) {
        return Err(TensorError::NegativeDimension {
            shape: shape.to_vec(),
            axis,
        });
    }
    // A zero-size tensor is fine whatever its other dimensions, in any order: a zero
    // after a huge dimension once came too late, the product having overflowed first.
    if shape.contains(&0) {
        return Ok(0);
    }
    let mut bytes = dtype.itemsize();
    for &dim in shape {
        let dim = usize::try_from(dim).map_err(|_| overflow())?;
        bytes = bytes.checked_mul(dim).ok_or_else(overflow)?;
    }
    if bytes > isize::MAX as usize {
        return Err(overflow());
    }
    Ok(bytes)
}

/// Row-major strides (in elements) of a compact tensor of `shape`.
pub fn row_major_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for axis in (0..shape.len().saturating_sub(1)).rev() {
        strides[axis] = strides[axis + 1].saturating_mul(shape[axis + 1]);
    }
    strides
}

/// Whether `strides` (in elements) describe the compact row-major layout of `shape`
/// (strides of axes of length 1, and of empty tensors, do not matter).
pub fn is_compact(shape: &[i64], strides: &[i64]) -> bool {
    if shape.len() != strides.len() {
        return false;
    }
    if shape.contains(&0) {
        return true;
    }
    let mut expected = 1i64;
    for (&dim, &stride) in shape.iter().zip(strides).rev() {
        if dim != 1 && stride != expected {
            return false;
        }
        expected = expected.saturating_mul(dim);
    }
    true
}

/// A compact row-major tensor over shared bytes.
///
/// Invariants: `byte_offset + nbytes <= backing.len()` and `nbytes == byte_size(shape, dtype)`
/// (checked by [`Tensor::from_backing`], the only constructor). Cloning shares the bytes.
#[derive(Clone)]
pub struct Tensor {
    backing: Arc<dyn Backing>,
    byte_offset: usize,
    shape: Arc<[i64]>,
    dtype: DataType,
    device: Device,
    nbytes: usize,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("shape", &self.shape)
            .field("dtype", &self.dtype.to_string())
            .field("device", &self.device.to_string())
            .field("byte_offset", &self.byte_offset)
            .field("nbytes", &self.nbytes)
            .finish()
    }
}

impl Tensor {
    /// A tensor over `backing`, starting `byte_offset` bytes into it.
    pub fn from_backing(
        backing: Arc<dyn Backing>,
        byte_offset: usize,
        shape: &[i64],
        dtype: DataType,
        device: Device,
    ) -> Result<Tensor, TensorError> {
        let nbytes = byte_size(shape, dtype)?;
        if Region::new(&backing, byte_offset, nbytes).is_none() {
            return Err(TensorError::BackingTooSmall {
                what: "backing buffer",
                actual: backing.len().saturating_sub(byte_offset),
                required: nbytes,
            });
        }
        Ok(Tensor {
            backing,
            byte_offset,
            shape: shape.into(),
            dtype,
            device,
            nbytes,
        })
    }

    /// A fresh, zero-filled tensor aligned to `max(64, itemsize)` (TVM's `Empty`).
    pub fn empty(shape: &[i64], dtype: DataType, device: Device) -> Result<Tensor, TensorError> {
        device.require_cpu()?;
        let nbytes = byte_size(shape, dtype)?;
        let buffer = HostBuffer::new(nbytes, dtype.alloc_alignment())?;
        Tensor::from_backing(Arc::new(buffer), 0, shape, dtype, device)
    }

    /// A fresh tensor holding a copy of `data` (exactly the tensor's byte size).
    pub fn from_bytes(shape: &[i64], dtype: DataType, data: &[u8]) -> Result<Tensor, TensorError> {
        let tensor = Tensor::empty(shape, dtype, Device::CPU0)?;
        tensor.region().write(data, "load")?;
        Ok(tensor)
    }

    /// The shape.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }
    /// The element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }
    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }
    /// Offset of the first byte inside the backing.
    pub fn byte_offset(&self) -> usize {
        self.byte_offset
    }
    /// Size in bytes.
    pub fn nbytes(&self) -> usize {
        self.nbytes
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.nbytes.checked_div(self.dtype.itemsize()).unwrap_or(0)
    }
    /// Whether the bytes may not be written.
    pub fn readonly(&self) -> bool {
        self.backing.readonly()
    }
    /// The owner of the bytes.
    pub fn backing(&self) -> &Arc<dyn Backing> {
        &self.backing
    }
    /// Address of the first element.
    pub fn data_ptr(&self) -> *mut u8 {
        self.region().as_ptr()
    }
    /// The tensor's bytes as a bounds-checked region.
    pub fn region(&self) -> Region<'_> {
        // `None` is unreachable by the struct invariant; an empty window keeps this
        // panic-free all the same.
        Region::new(&self.backing, self.byte_offset, self.nbytes)
            .unwrap_or_else(|| Region::empty(&self.backing))
    }
    /// Row-major strides in elements.
    pub fn strides(&self) -> Vec<i64> {
        row_major_strides(&self.shape)
    }

    /// A view of `shape` and `dtype` starting `relative_byte_offset` bytes into this tensor,
    /// sharing (and keeping alive) its bytes. The view must fit inside this tensor
    /// (TVM's `CreateView`).
    pub fn create_view(
        &self,
        shape: &[i64],
        dtype: DataType,
        relative_byte_offset: u64,
    ) -> Result<Tensor, TensorError> {
        let view_bytes = byte_size(shape, dtype)?;
        let end = relative_byte_offset.saturating_add(view_bytes as u64);
        if end > self.nbytes as u64 {
            return Err(TensorError::ViewOutOfBounds {
                shape: shape.to_vec(),
                dtype,
                view_bytes,
                begin: relative_byte_offset,
                end,
                source_bytes: self.nbytes,
                source_shape: self.shape.to_vec(),
                source_dtype: self.dtype,
            });
        }
        // `end <= nbytes`, so the offset fits in usize and the sum stays in the backing.
        let offset = self.byte_offset + relative_byte_offset as usize;
        Tensor::from_backing(self.backing.clone(), offset, shape, dtype, self.device)
    }

    /// A fresh copy on `device` (TVM's `CopyTo`: always a new allocation).
    pub fn copy_to(&self, device: Device) -> Result<Tensor, TensorError> {
        let out = Tensor::empty(&self.shape, self.dtype, device)?;
        self.region().copy_to(out.region(), "copy_to")?;
        Ok(out)
    }

    /// The tensor's bytes, copied out.
    pub fn to_bytes(&self) -> Result<Vec<u8>, TensorError> {
        self.region().to_vec()
    }
}

/// Copies `src` into `dst`; their byte sizes must match exactly (dtypes and shapes may
/// differ, as in TVM's `CopyFromTo`). Overlapping views are handled like `memmove`.
pub fn copy_from_to(src: &Tensor, dst: &Tensor) -> Result<(), TensorError> {
    src.region().copy_to(dst.region(), "copy_from_to")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32() -> DataType {
        DataType::parse("float32").unwrap()
    }

    #[test]
    fn compactness() {
        assert!(is_compact(&[2, 3], &[3, 1]));
        assert!(!is_compact(&[2, 3], &[1, 2]));
        assert!(is_compact(&[2, 1], &[1, 99]));
        assert!(is_compact(&[0, 3], &[7, 7]));
        assert!(!is_compact(&[2], &[1, 1]));
        assert_eq!(row_major_strides(&[2, 3, 4]), vec![12, 4, 1]);
    }

    #[test]
    fn byte_size_rules() {
        assert_eq!(byte_size(&[2, 3], f32()).unwrap(), 24);
        assert_eq!(byte_size(&[], f32()).unwrap(), 4);
        assert_eq!(byte_size(&[0, i64::MAX], f32()).unwrap(), 0);
        assert_eq!(byte_size(&[i64::MAX, 0], f32()).unwrap(), 0);
        assert_eq!(byte_size(&[1 << 62, 1 << 62, 0], f32()).unwrap(), 0);
        assert!(matches!(
            byte_size(&[2, -1], f32()),
            Err(TensorError::NegativeDimension { axis: 1, .. })
        ));
        assert!(matches!(
            byte_size(&[0, -1], f32()),
            Err(TensorError::NegativeDimension { .. })
        ));
        assert!(matches!(
            byte_size(&[i64::MAX, 2], f32()),
            Err(TensorError::ShapeOverflow { .. })
        ));
        // At most MAX_NDIM dimensions, as every way in takes (a file, DLPack, Python).
        let ones = [1i64; crate::tensor::MAX_NDIM + 1];
        assert_eq!(byte_size(&ones[1..], f32()).unwrap(), 4);
        assert!(matches!(
            byte_size(&ones, f32()),
            Err(TensorError::TooManyDimensions { ndim: 65 })
        ));
        assert!(byte_size(&[1 << 62, 2], DataType::UINT8).is_err());
        assert_eq!(byte_size(&[1 << 62], DataType::UINT8).unwrap(), 1 << 62);
        // A dtype made from its public fields with 0 bits or 0 lanes made a tensor of 0
        // bytes whatever its shape (written to a file it could not be read back).
        for (bits, lanes) in [(0, 1), (32, 0)] {
            let broken = DataType {
                code: crate::tensor::dtype::code::FLOAT,
                bits,
                lanes,
            };
            assert!(matches!(
                byte_size(&[i64::MAX, 3], broken),
                Err(TensorError::UnsupportedDtype { .. })
            ));
        }
    }

    #[test]
    fn empty_is_aligned_and_zeroed() {
        let t = Tensor::empty(&[3], DataType::parse("float64x16").unwrap(), Device::CPU0).unwrap();
        assert_eq!(t.data_ptr() as usize % 128, 0);
        assert_eq!(t.to_bytes().unwrap(), vec![0; 3 * 128]);
        assert!(Tensor::empty(&[1], f32(), Device::parse("cuda:0").unwrap()).is_err());
    }

    #[test]
    fn views_share_bytes_and_must_fit() {
        let t = Tensor::empty(&[4], f32(), Device::CPU0).unwrap();
        let v = t.create_view(&[2], f32(), 8).unwrap();
        v.region().write(&[1; 8], "t").unwrap();
        assert_eq!(&t.to_bytes().unwrap()[8..], &[1; 8]);
        assert_eq!(v.byte_offset(), 8);
        let vv = v.create_view(&[4], DataType::UINT8, 4).unwrap();
        assert_eq!(vv.byte_offset(), 12);
        let err = t.create_view(&[3], f32(), 8).unwrap_err();
        assert_eq!(
            err.to_string(),
            "View with shape [3] and datatype float32 would have a size of 12 bytes.  This would \
             occupy bytes 8 <= i_byte < 20 within the backing array.  However, the Tensor being \
             viewed only contains 16 bytes (shape = [4], dtype= float32)."
        );
        assert!(t.create_view(&[1], f32(), u64::MAX).is_err());
        drop(t);
        assert_eq!(v.to_bytes().unwrap(), vec![1; 8]);
    }

    #[test]
    fn copies_check_byte_sizes() {
        let a = Tensor::from_bytes(&[2], f32(), &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        let b = Tensor::empty(&[8], DataType::UINT8, Device::CPU0).unwrap();
        copy_from_to(&a, &b).unwrap();
        assert_eq!(b.to_bytes().unwrap(), a.to_bytes().unwrap());
        let c = Tensor::empty(&[3], f32(), Device::CPU0).unwrap();
        let err = copy_from_to(&a, &c).unwrap_err();
        assert!(err
            .to_string()
            .contains("The size in bytes must exactly match"));
        let d = a.copy_to(Device::CPU0).unwrap();
        assert_ne!(d.data_ptr(), a.data_ptr());
        assert_eq!(d.to_bytes().unwrap(), a.to_bytes().unwrap());
        assert_eq!(a.strides(), vec![1]);
        let m = Tensor::empty(&[2, 3, 4], f32(), Device::CPU0).unwrap();
        assert_eq!(m.strides(), vec![12, 4, 1]);
    }
}
