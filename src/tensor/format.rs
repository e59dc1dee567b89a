//! TVM's tensor file format and parameter dicts, byte for byte.
//!
//! A tensor record (little-endian): u64 magic [`TENSOR_MAGIC`], u64 reserved, i32 device
//! type, i32 device id, i32 ndim, u8 dtype code, u8 bits, u16 lanes, i64 x ndim shape, i64
//! data byte size (`ceil(bits / 8) * elements`), then the raw row-major bytes. A parameter
//! dict: u64 magic [`PARAM_DICT_MAGIC`], u64 reserved, u64 N, N x (u64 length + UTF-8 name),
//! u64 N again, N tensor records.
//!
//! The readers never trust a size field: every field is read through a [`Source`], which
//! checks the size against the bytes left (when known) before allocating, and otherwise
//! reads in bounded chunks, so a forged size costs at most the bytes actually supplied.
//! Tensor data is written in host byte order, which is little-endian on every platform
//! cubepool supports.

use std::borrow::Cow;
use std::collections::HashSet;
use std::io::{self, Read};

use super::array::{byte_size, Tensor};
use super::dtype::{code, DataType};
use super::error::{TensorError, TensorFormatError};

/// Magic number of a tensor record (TVM's `kTVMTensorMagic`).
pub const TENSOR_MAGIC: u64 = 0xDD5E_40F0_96B4_A13F;
/// Magic number of a parameter dict (TVM's `kTVMNDArrayListMagic`).
pub const PARAM_DICT_MAGIC: u64 = 0xF7E5_8D4F_0504_9CB7;

/// Largest read performed at once from a stream of unknown length.
const CHUNK: usize = 1 << 20;

/// The fewest bytes a tensor record takes: its 40 bytes before the shape with no
/// shape (0-d) and one element of at least one byte (a tensor with a dimension has 8
/// bytes of shape more, and may have no data).
const MIN_TENSOR_RECORD: u64 = 41;

/// Failure to load a tensor or parameter dict.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The input is malformed.
    #[error(transparent)]
    Format(#[from] TensorFormatError),
    /// The input is well formed but the tensor cannot be created (out of memory).
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

/// A byte source for the readers.
pub trait Source {
    /// Exactly `n` more bytes, or [`TensorFormatError::Truncated`] naming `what` (the
    /// readers check the length: other than `n` bytes reads as truncated).
    fn take(&mut self, n: u64, what: &'static str) -> Result<Cow<'_, [u8]>, TensorFormatError>;
    /// Bytes left, when known.
    fn remaining(&self) -> Option<u64>;
}

/// A source over an in-memory byte string.
#[derive(Debug)]
pub struct SliceSource<'a> {
    data: &'a [u8],
}

impl<'a> SliceSource<'a> {
    /// Reads from `data`.
    pub fn new(data: &'a [u8]) -> SliceSource<'a> {
        SliceSource { data }
    }
}

impl Source for SliceSource<'_> {
    fn take(&mut self, n: u64, what: &'static str) -> Result<Cow<'_, [u8]>, TensorFormatError> {
        let available = self.data.len() as u64;
        let truncated = TensorFormatError::Truncated {
            what,
            needed: n,
            available,
        };
        let n = usize::try_from(n).map_err(|_| truncated)?;
        if n > self.data.len() {
            return Err(TensorFormatError::Truncated {
                what,
                needed: n as u64,
                available,
            });
        }
        let (head, tail) = self.data.split_at(n);
        self.data = tail;
        Ok(Cow::Borrowed(head))
    }
    fn remaining(&self) -> Option<u64> {
        Some(self.data.len() as u64)
    }
}

/// A source over any reader, optionally with a known length (a file's size).
#[derive(Debug)]
pub struct ReadSource<R> {
    inner: R,
    remaining: Option<u64>,
}

impl<R: Read> ReadSource<R> {
    /// Reads from `inner`; `remaining` is its length when known.
    pub fn new(inner: R, remaining: Option<u64>) -> ReadSource<R> {
        ReadSource { inner, remaining }
    }

    /// The reader, back.
    pub fn into_inner(self) -> R {
        self.inner
    }

    /// Fills `buf` as far as the reader allows; returns the bytes read.
    fn fill(&mut self, buf: &mut [u8], what: &'static str) -> Result<usize, TensorFormatError> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.inner.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n.min(buf.len() - filled),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => return Err(TensorFormatError::Io { what, source }),
            }
        }
        Ok(filled)
    }
}

impl<R: Read> Source for ReadSource<R> {
    fn take(&mut self, n: u64, what: &'static str) -> Result<Cow<'_, [u8]>, TensorFormatError> {
        if let Some(left) = self.remaining {
            if n > left {
                return Err(TensorFormatError::Truncated {
                    what,
                    needed: n,
                    available: left,
                });
            }
        }
        // Grow the buffer chunk by chunk: memory follows the bytes that really arrive.
        let mut out = Vec::new();
        while (out.len() as u64) < n {
            let start = out.len();
            let want = usize::try_from(n - start as u64).map_or(CHUNK, |left| left.min(CHUNK));
            if out.try_reserve(want).is_err() {
                let source = io::Error::from(io::ErrorKind::OutOfMemory);
                return Err(TensorFormatError::Io { what, source });
            }
            out.resize(start + want, 0);
            let got = self.fill(&mut out[start..], what)?;
            if got < want {
                return Err(TensorFormatError::Truncated {
                    what,
                    needed: n,
                    available: (start + got) as u64,
                });
            }
        }
        if let Some(left) = self.remaining.as_mut() {
            *left -= n;
        }
        Ok(Cow::Owned(out))
    }
    fn remaining(&self) -> Option<u64> {
        self.remaining
    }
}

/// [`Source::take`], checked: a source (a caller's own implementation of the trait)
/// that hands back other than the `n` bytes asked for is read as truncated, never
/// trusted to have kept its contract.
fn take_exact<'a, S: Source + ?Sized>(
    src: &'a mut S,
    n: u64,
    what: &'static str,
) -> Result<Cow<'a, [u8]>, TensorFormatError> {
    let bytes = src.take(n, what)?;
    if bytes.len() as u64 != n {
        return Err(TensorFormatError::Truncated {
            what,
            needed: n,
            available: bytes.len() as u64,
        });
    }
    Ok(bytes)
}

fn take_array<const N: usize, S: Source + ?Sized>(
    src: &mut S,
    what: &'static str,
) -> Result<[u8; N], TensorFormatError> {
    let bytes = take_exact(src, N as u64, what)?;
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes);
    Ok(out)
}

fn read_u64<S: Source + ?Sized>(src: &mut S, what: &'static str) -> Result<u64, TensorFormatError> {
    take_array::<8, S>(src, what).map(u64::from_le_bytes)
}

fn read_i64<S: Source + ?Sized>(src: &mut S, what: &'static str) -> Result<i64, TensorFormatError> {
    take_array::<8, S>(src, what).map(i64::from_le_bytes)
}

fn read_i32<S: Source + ?Sized>(src: &mut S, what: &'static str) -> Result<i32, TensorFormatError> {
    take_array::<4, S>(src, what).map(i32::from_le_bytes)
}

/// Fails unless the input is exhausted (for in-memory inputs, which hold one object).
pub fn expect_end<S: Source + ?Sized>(
    src: &S,
    what: &'static str,
) -> Result<(), TensorFormatError> {
    match src.remaining() {
        Some(count) if count > 0 => Err(TensorFormatError::TrailingBytes { what, count }),
        _ => Ok(()),
    }
}

fn check_file_dtype(dtype: DataType) -> Result<(), TensorError> {
    // TVM's reader and writer count `ceil(bits / 8)` bytes per element and ignore lanes, so
    // vector types cannot round-trip through the format: refuse them instead of truncating.
    if dtype.lanes != 1 {
        return Err(TensorError::VectorDtypeInFile { dtype });
    }
    Ok(())
}

/// Appends one tensor record to `out`.
pub fn write_tensor(tensor: &Tensor, out: &mut Vec<u8>) -> Result<(), TensorError> {
    let dtype = tensor.dtype();
    check_file_dtype(dtype)?;
    let ndim = i32::try_from(tensor.shape().len()).map_err(|_| TensorError::ShapeOverflow {
        shape: tensor.shape().to_vec(),
        dtype,
    })?;
    let record = 48 + 8 * tensor.shape().len() + tensor.nbytes();
    out.try_reserve(record)
        .map_err(|_| TensorError::OutOfMemory {
            nbytes: record,
            alignment: 1,
        })?;
    out.extend_from_slice(&TENSOR_MAGIC.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(&tensor.device().device_type.to_le_bytes());
    out.extend_from_slice(&tensor.device().device_id.to_le_bytes());
    out.extend_from_slice(&ndim.to_le_bytes());
    out.push(dtype.code);
    out.push(dtype.bits);
    out.extend_from_slice(&dtype.lanes.to_le_bytes());
    for dim in tensor.shape() {
        out.extend_from_slice(&dim.to_le_bytes());
    }
    out.extend_from_slice(&(tensor.nbytes() as i64).to_le_bytes());
    let start = out.len();
    out.resize(start + tensor.nbytes(), 0);
    tensor.region().read_into(&mut out[start..], "save_tensor")
}

/// Reads one tensor record into a fresh CPU tensor. A record that names another device is
/// refused, as TVM refuses it ([`TensorFormatError::NotCpu`]). Both bool encodings are accepted: `(uint, 1 bit)` and `(bool, 8 bits)`.
pub fn read_tensor<S: Source + ?Sized>(src: &mut S) -> Result<Tensor, LoadError> {
    let magic = read_u64(src, "tensor magic")?;
    if magic != TENSOR_MAGIC {
        return Err(TensorFormatError::BadMagic {
            what: "tensor record",
            found: magic,
            expected: TENSOR_MAGIC,
        }
        .into());
    }
    let _reserved = read_u64(src, "tensor reserved field")?;
    let device_type = read_i32(src, "device type")?;
    let device_id = read_i32(src, "device id")?;
    if device_type != super::device::CPU {
        return Err(TensorFormatError::NotCpu {
            device_type,
            device_id,
        }
        .into());
    }
    let ndim = read_i32(src, "ndim")?;
    if !(0..=super::MAX_NDIM as i32).contains(&ndim) {
        return Err(TensorFormatError::InvalidNdim { ndim }.into());
    }
    let [dcode, bits, lanes_lo, lanes_hi] = take_array::<4, S>(src, "dtype")?;
    let lanes = u16::from_le_bytes([lanes_lo, lanes_hi]);
    let unsupported = TensorFormatError::UnsupportedDtype {
        code: dcode,
        bits,
        lanes,
    };
    let dtype = DataType::new(dcode, bits, lanes).map_err(|_| unsupported)?;
    if dtype.lanes != 1 {
        return Err(TensorFormatError::UnsupportedDtype {
            code: dcode,
            bits,
            lanes,
        }
        .into());
    }
    let shape_bytes = take_exact(src, 8 * ndim as u64, "shape")?;
    let shape: Vec<i64> = shape_bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect();
    drop(shape_bytes);
    let expected = match byte_size(&shape, dtype) {
        Ok(n) => n as u64,
        Err(TensorError::NegativeDimension { axis, .. }) => {
            return Err(TensorFormatError::NegativeDimension {
                axis,
                value: shape[axis],
            }
            .into())
        }
        Err(_) => return Err(TensorFormatError::ShapeOverflow { shape, dtype }.into()),
    };
    let declared = read_i64(src, "data byte size")?;
    if u64::try_from(declared) != Ok(expected) {
        return Err(TensorFormatError::SizeMismatch {
            declared,
            expected,
            shape,
            dtype,
        }
        .into());
    }
    let data = take_exact(src, expected, "tensor data")?;
    // The old bool encoding (uint, 1 bit) already normalised to bool (8 bits) above.
    debug_assert!(dtype.code != code::UINT || dtype.bits >= 8);
    Ok(Tensor::from_bytes(&shape, dtype, &data)?)
}

/// The first of `names` that an earlier one repeats: a parameter dict's names are
/// distinct (TVM's reader refuses a repeated one, and so does this one).
fn first_repeated<'a>(mut names: impl ExactSizeIterator<Item = &'a str>) -> Option<&'a str> {
    let mut seen = HashSet::with_capacity(names.len());
    names.find(|name| !seen.insert(*name))
}

/// Appends a parameter dict (names in the order given) to `out`.
pub fn write_param_dict(params: &[(String, Tensor)], out: &mut Vec<u8>) -> Result<(), TensorError> {
    for (_, tensor) in params {
        check_file_dtype(tensor.dtype())?;
    }
    // A name twice makes a file its readers refuse (helper-138's find: written, then
    // refused by `read_param_dict`).
    if let Some(name) = first_repeated(params.iter().map(|(name, _)| name.as_str())) {
        return Err(TensorError::DuplicateParamName {
            name: name.to_owned(),
        });
    }
    out.extend_from_slice(&PARAM_DICT_MAGIC.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(&(params.len() as u64).to_le_bytes());
    for (name, _) in params {
        out.extend_from_slice(&(name.len() as u64).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
    }
    out.extend_from_slice(&(params.len() as u64).to_le_bytes());
    for (_, tensor) in params {
        write_tensor(tensor, out)?;
    }
    Ok(())
}

/// Reads a parameter dict, in file order. Duplicate names are an error.
pub fn read_param_dict<S: Source + ?Sized>(
    src: &mut S,
) -> Result<Vec<(String, Tensor)>, LoadError> {
    let magic = read_u64(src, "parameter dict magic")?;
    if magic != PARAM_DICT_MAGIC {
        return Err(TensorFormatError::BadMagic {
            what: "parameter dict",
            found: magic,
            expected: PARAM_DICT_MAGIC,
        }
        .into());
    }
    let _reserved = read_u64(src, "parameter dict reserved field")?;
    let count = read_u64(src, "name count")?;
    if let Some(left) = src.remaining() {
        // Each entry needs at least its name's 8-byte length and the smallest tensor
        // record: a forged count is refused up front. Checked against the names alone,
        // a file of 2,000,000 short names and a count of tensors one too many took 310
        // MB (11.5 times its size) before the counts were compared (helper-138's find).
        let needed = count
            .saturating_mul(8 + MIN_TENSOR_RECORD)
            .saturating_add(8);
        if needed > left {
            return Err(TensorFormatError::Truncated {
                what: "names and tensors",
                needed,
                available: left,
            }
            .into());
        }
    }
    let mut names = Vec::new();
    for index in 0..count {
        let len = read_u64(src, "name length")?;
        let bytes = take_exact(src, len, "name")?.into_owned();
        let name =
            String::from_utf8(bytes).map_err(|_| TensorFormatError::InvalidName { index })?;
        names.push(name);
    }
    // Each name held once (a set of owned copies held every name twice).
    if let Some(name) = first_repeated(names.iter().map(String::as_str)) {
        return Err(TensorFormatError::DuplicateName {
            name: name.to_owned(),
        }
        .into());
    }
    let tensors = read_u64(src, "tensor count")?;
    if tensors != count {
        return Err(TensorFormatError::CountMismatch {
            names: count,
            tensors,
        }
        .into());
    }
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let tensor = read_tensor(src)?;
        out.push((name, tensor));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Device;

    fn golden() -> Vec<u8> {
        let hex = "3fa1b496f0405edd 0000000000000000 01000000 00000000 01000000 02 20 0100 \
                   0200000000000000 0800000000000000 0000803f 00000040";
        let hex: String = hex.split_whitespace().collect();
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect()
    }

    /// A source that breaks [`Source::take`]'s contract: the golden file's bytes, each
    /// take handing back `skew` bytes more or fewer than asked for.
    struct Skewed {
        data: Vec<u8>,
        at: usize,
        skew: isize,
    }

    impl Source for Skewed {
        fn take(
            &mut self,
            n: u64,
            _what: &'static str,
        ) -> Result<Cow<'_, [u8]>, TensorFormatError> {
            let len = (n as usize).saturating_add_signed(self.skew);
            let end = (self.at + len).min(self.data.len());
            let out = self.data[self.at..end].to_vec();
            self.at = end;
            Ok(Cow::Owned(out))
        }
        fn remaining(&self) -> Option<u64> {
            None
        }
    }

    #[test]
    fn a_source_handing_back_other_than_it_was_asked_is_truncated_not_a_panic() {
        for skew in [-1, 1, 5] {
            let mut short = Skewed {
                data: golden(),
                at: 0,
                skew,
            };
            match read_tensor(&mut short) {
                Err(LoadError::Format(TensorFormatError::Truncated {
                    what,
                    needed,
                    available,
                })) => {
                    assert_eq!(what, "tensor magic", "skew {skew}");
                    assert_eq!(available as i64, needed as i64 + skew as i64, "skew {skew}");
                }
                other => panic!("skew {skew}: {other:?}"),
            }
        }
    }

    fn f32_tensor(values: &[f32]) -> Tensor {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let dtype = DataType::parse("float32").unwrap();
        Tensor::from_bytes(&[values.len() as i64], dtype, &bytes).unwrap()
    }

    #[test]
    fn golden_bytes_round_trip() {
        let mut out = Vec::new();
        write_tensor(&f32_tensor(&[1.0, 2.0]), &mut out).unwrap();
        assert_eq!(out, golden());
        let mut src = SliceSource::new(&out);
        let t = read_tensor(&mut src).unwrap();
        expect_end(&src, "tensor").unwrap();
        assert_eq!(t.shape(), &[2]);
        assert_eq!(t.to_bytes().unwrap(), &golden()[48..]);
        let mut stream = ReadSource::new(&out[..], None);
        assert_eq!(
            read_tensor(&mut stream).unwrap().to_bytes().unwrap(),
            t.to_bytes().unwrap()
        );
    }

    #[test]
    fn both_bool_encodings_load() {
        let mut old = golden();
        old[28] = code::UINT;
        old[29] = 1;
        old[40] = 8; // data byte size: 8 bools
        old[32] = 8; // shape [8]
        let t = read_tensor(&mut SliceSource::new(&old)).unwrap();
        assert_eq!(t.dtype(), DataType::BOOL);
        assert_eq!(t.shape(), &[8]);
        let mut new = Vec::new();
        write_tensor(&t, &mut new).unwrap();
        assert_eq!((new[28], new[29]), (code::BOOL, 8));
        assert_eq!(
            read_tensor(&mut SliceSource::new(&new))
                .unwrap()
                .to_bytes()
                .unwrap(),
            t.to_bytes().unwrap()
        );
    }

    #[test]
    fn a_record_of_another_device_is_refused_as_tvm_refuses_it() {
        let mut cuda = golden();
        cuda[16] = 2; // device type: CUDA
        cuda[20] = 1; // device id 1
        let err = read_tensor(&mut SliceSource::new(&cuda)).unwrap_err();
        assert!(
            matches!(
                err,
                LoadError::Format(TensorFormatError::NotCpu {
                    device_type: 2,
                    device_id: 1
                })
            ),
            "{err}"
        );
        assert!(err
            .to_string()
            .contains("Invalid DLTensor device: can only save as CPU tensor"));
    }

    #[test]
    fn every_prefix_is_rejected_cleanly() {
        let g = golden();
        for cut in 0..g.len() {
            let err = read_tensor(&mut SliceSource::new(&g[..cut])).unwrap_err();
            assert!(
                matches!(err, LoadError::Format(TensorFormatError::Truncated { .. })),
                "{cut}"
            );
            let err = read_tensor(&mut ReadSource::new(&g[..cut], None)).unwrap_err();
            assert!(
                matches!(err, LoadError::Format(TensorFormatError::Truncated { .. })),
                "{cut}"
            );
        }
    }

    #[test]
    fn forged_sizes_do_not_allocate() {
        let mut g = golden();
        g[24..28].copy_from_slice(&i32::MAX.to_le_bytes()); // ndim
        assert!(matches!(
            read_tensor(&mut SliceSource::new(&g)),
            Err(LoadError::Format(TensorFormatError::InvalidNdim {
                ndim: i32::MAX
            }))
        ));
        // At most MAX_NDIM: the shape of as many is read (and found cut short here).
        g[24..28].copy_from_slice(&(crate::tensor::MAX_NDIM as i32).to_le_bytes());
        assert!(matches!(
            read_tensor(&mut SliceSource::new(&g)),
            Err(LoadError::Format(TensorFormatError::Truncated {
                what: "shape",
                ..
            }))
        ));
        let mut g = golden();
        g[32..40].copy_from_slice(&(1i64 << 60).to_le_bytes()); // shape
        g[40..48].copy_from_slice(&(1i64 << 62).to_le_bytes()); // size
        assert!(matches!(
            read_tensor(&mut ReadSource::new(&g[..], None)),
            Err(LoadError::Format(TensorFormatError::Truncated {
                what: "tensor data",
                ..
            }))
        ));
        let mut g = golden();
        g[40..48].copy_from_slice(&12i64.to_le_bytes());
        assert!(matches!(
            read_tensor(&mut SliceSource::new(&g)),
            Err(LoadError::Format(TensorFormatError::SizeMismatch {
                declared: 12,
                ..
            }))
        ));
        // A negative field is told as the file holds it, not as 2^64 less it.
        g[40..48].copy_from_slice(&(-1i64).to_le_bytes());
        let error = read_tensor(&mut SliceSource::new(&g)).unwrap_err();
        assert!(
            error.to_string().contains("data_byte_size is -1 but"),
            "{error}"
        );
        let mut g = golden();
        g[32..40].copy_from_slice(&(-2i64).to_le_bytes());
        assert!(matches!(
            read_tensor(&mut SliceSource::new(&g)),
            Err(LoadError::Format(
                TensorFormatError::NegativeDimension { .. }
            ))
        ));
        let mut g = golden();
        g[0] ^= 1;
        assert!(matches!(
            read_tensor(&mut SliceSource::new(&g)),
            Err(LoadError::Format(TensorFormatError::BadMagic { .. }))
        ));
    }

    proptest::proptest! {
        #[test]
        fn readers_never_panic(
            junk in proptest::collection::vec(proptest::num::u8::ANY, 0..160),
            flips in proptest::collection::vec((0usize..64, proptest::num::u8::ANY), 0..6),
            cut in 0usize..64,
        ) {
            let mut mutated = golden();
            for (pos, value) in flips {
                mutated[pos % 56] = value;
            }
            mutated.truncate(cut.max(1) + 8);
            mutated.extend_from_slice(&junk);
            for data in [&junk[..], &mutated[..]] {
                let _ = read_tensor(&mut SliceSource::new(data));
                let _ = read_tensor(&mut ReadSource::new(data, None));
                let _ = read_param_dict(&mut SliceSource::new(data));
                let _ = read_param_dict(&mut ReadSource::new(data, Some(data.len() as u64)));
            }
        }
    }

    #[test]
    fn param_dict_round_trip_and_errors() {
        let params = vec![
            ("w".to_owned(), f32_tensor(&[1.0, 2.0])),
            (
                "bias".to_owned(),
                Tensor::empty(&[0, 3], DataType::BOOL, Device::CPU0).unwrap(),
            ),
        ];
        let mut out = Vec::new();
        write_param_dict(&params, &mut out).unwrap();
        assert_eq!(&out[..8], &PARAM_DICT_MAGIC.to_le_bytes());
        assert_eq!(
            &out[8..24],
            &[0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]
        );
        let mut src = SliceSource::new(&out);
        let back = read_param_dict(&mut src).unwrap();
        expect_end(&src, "parameter dict").unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].0, "w");
        assert_eq!(back[1].1.shape(), &[0, 3]);
        for cut in 0..out.len() {
            assert!(read_param_dict(&mut SliceSource::new(&out[..cut])).is_err());
        }
        let mut forged = out.clone();
        forged[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(read_param_dict(&mut SliceSource::new(&forged)).is_err());
        // A name twice: refused by the writer, and by the reader of a file that has it
        // (the second name "w" written over "bias", one byte more).
        assert!(matches!(
            write_param_dict(&[params[0].clone(), params[0].clone()], &mut Vec::new()),
            Err(TensorError::DuplicateParamName { name }) if name == "w"
        ));
        let mut dup = Vec::new();
        let renamed = [params[0].clone(), ("x".to_owned(), params[0].1.clone())];
        write_param_dict(&renamed, &mut dup).unwrap();
        let at = dup
            .windows(9)
            .position(|w| w == [1, 0, 0, 0, 0, 0, 0, 0, b'x']);
        dup[at.unwrap() + 8] = b'w';
        assert!(matches!(
            read_param_dict(&mut SliceSource::new(&dup)),
            Err(LoadError::Format(TensorFormatError::DuplicateName { .. }))
        ));
        // A forged count of tensors past what the names' count allows is refused before
        // a name is read: a thousand names and a record each cannot fit in these bytes.
        let mut names = Vec::new();
        names.extend_from_slice(&PARAM_DICT_MAGIC.to_le_bytes());
        names.extend_from_slice(&0u64.to_le_bytes());
        names.extend_from_slice(&1000u64.to_le_bytes());
        for index in 0..1000u32 {
            let name = format!("n{index}");
            names.extend_from_slice(&(name.len() as u64).to_le_bytes());
            names.extend_from_slice(name.as_bytes());
        }
        names.extend_from_slice(&1001u64.to_le_bytes());
        assert!(matches!(
            read_param_dict(&mut SliceSource::new(&names)),
            Err(LoadError::Format(TensorFormatError::Truncated {
                what: "names and tensors",
                ..
            }))
        ));
        let vector = Tensor::empty(&[1], DataType::parse("float32x4").unwrap(), Device::CPU0);
        assert!(write_tensor(&vector.unwrap(), &mut Vec::new()).is_err());
    }
}
