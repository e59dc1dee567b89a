//! [`TensorMemoryPool`]: a cache of backing buffers for compact tensors (TVM's
//! `TensorMemoryPool`, after its `PooledAllocator`, without its known flaws).
//!
//! Backing sizes round up to `page_size` and are cached in exact-size buckets, reused last
//! in, first out. Unlike TVM, reuse checks the alignment the new tensor needs, the cache has
//! an optional byte bound (oldest entries go first), and `clear` never forgets the buffers
//! that are checked out, so `used_memory` stays exact.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::array::{byte_size, Tensor};
use super::error::TensorError;
use super::storage::{LeasedBacking, ReleaseHook};
use super::{DataType, Device};

/// Pool settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Backing sizes round up to a multiple of this (TVM default 4096).
    pub page_size: usize,
    /// The device backing is allocated on (only `cpu:0`).
    pub device: Device,
    /// At most this many bytes stay cached; `None` for no bound (TVM's behaviour).
    pub max_cached_bytes: Option<usize>,
}

impl Default for PoolConfig {
    fn default() -> PoolConfig {
        PoolConfig {
            page_size: 4096,
            device: Device::CPU0,
            max_cached_bytes: None,
        }
    }
}

/// One cached backing buffer.
struct Cached {
    /// The bucket (rounded request size) it serves.
    size: usize,
    backing: Tensor,
}

/// Books of a pool, under its mutex.
///
/// Invariants: every sequence number in `buckets` names an entry of `entries` of that
/// bucket's size, and vice versa; `cached_bytes` is the sum of `entries`' backing sizes;
/// `checked_out_bytes` is the sum of backing sizes of leases not yet returned; `held`
/// holds the bytes of every backing of more than 0 bytes that is cached or leased, as
/// `start -> end` of disjoint ranges.
#[derive(Default)]
struct Books {
    /// The bytes of the backing the pool holds, so that backing given to it twice (or
    /// two views of one buffer) is refused, not handed to two tensors.
    held: BTreeMap<usize, usize>,
    next_seq: u64,
    /// Cached buffers by age (oldest first), for eviction.
    entries: BTreeMap<u64, Cached>,
    /// Sequence numbers by bucket size, most recent last (LIFO reuse).
    buckets: HashMap<usize, Vec<u64>>,
    cached_bytes: usize,
    checked_out_bytes: usize,
    checked_out: usize,
}

/// The bytes of `backing`, as `start..end` (empty for a backing of 0 bytes).
fn bytes_of(backing: &Tensor) -> std::ops::Range<usize> {
    let start = backing.data_ptr() as usize;
    start..start.saturating_add(backing.nbytes())
}

impl Books {
    /// Records that the pool holds `backing`; false (nothing recorded) where its bytes
    /// overlap backing it holds already.
    fn hold(&mut self, backing: &Tensor) -> bool {
        let bytes = bytes_of(backing);
        if bytes.is_empty() {
            return true;
        }
        let overlaps = self
            .held
            .range(..bytes.end)
            .next_back()
            .is_some_and(|(_, &end)| end > bytes.start);
        if !overlaps {
            self.held.insert(bytes.start, bytes.end);
        }
        !overlaps
    }

    /// Forgets `backing`, which leaves the pool.
    fn let_go(&mut self, backing: &Tensor) {
        let bytes = bytes_of(backing);
        if !bytes.is_empty() {
            self.held.remove(&bytes.start);
        }
    }

    fn remove(&mut self, seq: u64) -> Option<Cached> {
        let entry = self.entries.remove(&seq)?;
        if let Some(bucket) = self.buckets.get_mut(&entry.size) {
            bucket.retain(|&s| s != seq);
            if bucket.is_empty() {
                self.buckets.remove(&entry.size);
            }
        }
        debug_assert!(self.cached_bytes >= entry.backing.nbytes());
        self.cached_bytes = self.cached_bytes.saturating_sub(entry.backing.nbytes());
        Some(entry)
    }

    fn check_invariants(&self) -> Result<(), String> {
        let listed: usize = self.buckets.values().map(Vec::len).sum();
        if listed != self.entries.len() {
            return Err(format!(
                "{listed} bucketed vs {} entries",
                self.entries.len()
            ));
        }
        for (size, seqs) in &self.buckets {
            for seq in seqs {
                match self.entries.get(seq) {
                    Some(e) if e.size == *size => {}
                    _ => return Err(format!("bucket {size} names stale entry {seq}")),
                }
            }
        }
        if let Some(entry) = self.entries.values().find(|e| {
            let bytes = bytes_of(&e.backing);
            !bytes.is_empty() && self.held.get(&bytes.start) != Some(&bytes.end)
        }) {
            return Err(format!(
                "cached backing at {:#x} is not among the bytes held",
                entry.backing.data_ptr() as usize
            ));
        }
        let sum: usize = self.entries.values().map(|e| e.backing.nbytes()).sum();
        if sum != self.cached_bytes {
            return Err(format!(
                "cached_bytes {} but entries hold {sum}",
                self.cached_bytes
            ));
        }
        Ok(())
    }
}

/// What every clone of a [`TensorMemoryPool`] and every lease it handed out share: the
/// settings and the books of cached buffers.
struct TensorPoolState {
    config: PoolConfig,
    books: Mutex<Books>,
}

impl TensorPoolState {
    fn lock(&self) -> Result<MutexGuard<'_, Books>, TensorError> {
        self.books.lock().map_err(|_| TensorError::LockPoisoned {
            what: "TensorMemoryPool",
        })
    }
}

/// Returns a lease's backing to its pool.
struct ReturnToPool {
    shared: Arc<TensorPoolState>,
    size: usize,
}

impl ReleaseHook for ReturnToPool {
    fn release(&self, backing: Tensor) {
        // Buffers leaving the cache are dropped after the lock is released: dropping one may
        // run arbitrary code (a Python buffer release), which must not run under our lock.
        let mut evicted = Vec::new();
        {
            let mut books = self
                .shared
                .books
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let n = backing.nbytes();
            debug_assert!(books.checked_out_bytes >= n && books.checked_out >= 1);
            books.checked_out_bytes = books.checked_out_bytes.saturating_sub(n);
            books.checked_out = books.checked_out.saturating_sub(1);
            match self.shared.config.max_cached_bytes {
                Some(bound) if n > bound => {
                    books.let_go(&backing);
                    evicted.push(backing);
                }
                bound => {
                    if let Some(bound) = bound {
                        while books.cached_bytes.saturating_add(n) > bound {
                            let Some((&oldest, _)) = books.entries.first_key_value() else {
                                break;
                            };
                            if let Some(entry) = books.remove(oldest) {
                                books.let_go(&entry.backing);
                                evicted.push(entry.backing);
                            }
                        }
                    }
                    let seq = books.next_seq;
                    books.next_seq = books.next_seq.wrapping_add(1);
                    books.cached_bytes = books.cached_bytes.saturating_add(n);
                    books.buckets.entry(self.size).or_default().push(seq);
                    books.entries.insert(
                        seq,
                        Cached {
                            size: self.size,
                            backing,
                        },
                    );
                }
            }
        }
        drop(evicted);
    }
}

/// What one `empty` call needs from the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Bytes the tensor needs.
    pub nbytes: usize,
    /// Backing size: `nbytes` rounded up to the page size (the cache bucket).
    pub size: usize,
    /// Alignment the backing must have: `max(64, itemsize)`.
    pub alignment: usize,
}

/// A thread-safe cache of backing buffers handing out compact tensors.
///
/// Cloning gives another handle to the same pool. Tensors handed out keep the pool's books
/// alive and return their backing to the cache when the last tensor, view or export of it
/// is dropped.
#[derive(Clone)]
pub struct TensorMemoryPool {
    shared: Arc<TensorPoolState>,
}

impl std::fmt::Debug for TensorMemoryPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorMemoryPool")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl TensorMemoryPool {
    /// A pool with `config`; the page size must be positive and the device `cpu:0`.
    pub fn new(config: PoolConfig) -> Result<TensorMemoryPool, TensorError> {
        if config.page_size == 0 {
            return Err(TensorError::InvalidPageSize {
                page_size: config.page_size,
            });
        }
        config.device.require_cpu()?;
        Ok(TensorMemoryPool {
            shared: Arc::new(TensorPoolState {
                config,
                books: Mutex::new(Books::default()),
            }),
        })
    }

    /// The settings.
    pub fn config(&self) -> PoolConfig {
        self.shared.config
    }

    /// Sizes and alignment for a tensor of `shape` and `dtype`.
    pub fn request(&self, shape: &[i64], dtype: DataType) -> Result<Request, TensorError> {
        let nbytes = byte_size(shape, dtype)?;
        let page = self.shared.config.page_size;
        let size = nbytes
            .div_ceil(page)
            .checked_mul(page)
            .filter(|&s| s <= isize::MAX as usize)
            .ok_or_else(|| TensorError::ShapeOverflow {
                shape: shape.to_vec(),
                dtype,
            })?;
        Ok(Request {
            nbytes,
            size,
            alignment: dtype.alloc_alignment(),
        })
    }

    /// A compact tensor of `shape` and `dtype`, reusing cached backing when an entry of the
    /// right size and alignment exists, else allocating with `alloc(size, alignment, device)`.
    /// When `alloc` fails with an error `is_oom` accepts, the cache is released and the
    /// allocation retried once (TVM's behaviour). The result of `alloc` is validated.
    pub fn empty_with<E, A, O>(
        &self,
        shape: &[i64],
        dtype: DataType,
        mut alloc: A,
        is_oom: O,
    ) -> Result<Tensor, E>
    where
        E: From<TensorError>,
        A: FnMut(usize, usize, Device) -> Result<Tensor, E>,
        O: Fn(&E) -> bool,
    {
        let req = self.request(shape, dtype)?;
        let lease = match self.take_cached(req)? {
            Some(lease) => lease,
            None => {
                let device = self.shared.config.device;
                let backing = match alloc(req.size, req.alignment, device) {
                    Err(e) if is_oom(&e) => {
                        self.clear()?;
                        alloc(req.size, req.alignment, device)?
                    }
                    other => other?,
                };
                self.adopt(backing, req)?
            }
        };
        Ok(lease.create_view(shape, dtype, 0)?)
    }

    /// [`TensorMemoryPool::empty_with`] using fresh host memory.
    pub fn empty(&self, shape: &[i64], dtype: DataType) -> Result<Tensor, TensorError> {
        self.empty_with(shape, dtype, default_alloc, |e| {
            matches!(e, TensorError::OutOfMemory { .. })
        })
    }

    /// A bounded view of `backing` (TVM's `TensorMemoryPool::CreateView`): same rules as
    /// [`Tensor::create_view`], and the view keeps the backing alive.
    pub fn create_view(
        &self,
        backing: &Tensor,
        shape: &[i64],
        dtype: DataType,
        byte_offset: u64,
    ) -> Result<Tensor, TensorError> {
        backing.create_view(shape, dtype, byte_offset)
    }

    /// Takes the most recently cached backing of the request's size whose address meets its
    /// alignment, as a lease.
    /// A request whose alignment is not a power of two is refused
    /// ([`TensorError::InvalidAlignment`]).
    pub fn take_cached(&self, req: Request) -> Result<Option<Tensor>, TensorError> {
        check_alignment(req.alignment)?;
        let taken = {
            let mut books = self.shared.lock()?;
            let seq = books.buckets.get(&req.size).and_then(|seqs| {
                seqs.iter().rev().copied().find(|seq| {
                    books.entries.get(seq).is_some_and(|e| {
                        e.backing.data_ptr() as usize % req.alignment == 0
                            && e.backing.nbytes() >= req.nbytes
                    })
                })
            });
            match seq.and_then(|seq| books.remove(seq)) {
                Some(entry) => {
                    books.checked_out_bytes = books
                        .checked_out_bytes
                        .saturating_add(entry.backing.nbytes());
                    books.checked_out = books.checked_out.saturating_add(1);
                    Some(entry.backing)
                }
                None => None,
            }
        };
        taken
            .map(|backing| self.lease(backing, req.size))
            .transpose()
    }

    /// Checks a freshly allocated backing against the request and the pool's device, and
    /// leases it.
    pub fn adopt(&self, backing: Tensor, req: Request) -> Result<Tensor, TensorError> {
        validate_backing(&backing, req, self.shared.config.device)?;
        {
            let mut books = self.shared.lock()?;
            if !books.hold(&backing) {
                return Err(TensorError::BackingHeld {
                    what: "alloc_backing result",
                    address: backing.data_ptr() as usize,
                    nbytes: backing.nbytes(),
                });
            }
            books.checked_out_bytes = books.checked_out_bytes.saturating_add(backing.nbytes());
            books.checked_out = books.checked_out.saturating_add(1);
        }
        self.lease(backing, req.size)
    }

    /// Wraps checked-out backing in a lease that returns it to the cache when dropped.
    fn lease(&self, backing: Tensor, size: usize) -> Result<Tensor, TensorError> {
        let len = backing.nbytes() as i64;
        let device = backing.device();
        let hook = ReturnToPool {
            shared: self.shared.clone(),
            size,
        };
        let lease = Arc::new(LeasedBacking::new(backing, hook));
        // Cannot fail (a u8 tensor exactly as long as its backing); if it did, dropping the
        // lease would return the backing and keep the books right.
        Tensor::from_backing(lease, 0, &[len], DataType::UINT8, device)
    }

    /// Releases every cached backing; checked-out backing stays valid and returns later.
    pub fn clear(&self) -> Result<(), TensorError> {
        let released = {
            let mut books = self.shared.lock()?;
            books.buckets.clear();
            books.cached_bytes = 0;
            let released = std::mem::take(&mut books.entries);
            for entry in released.values() {
                books.let_go(&entry.backing);
            }
            released
        };
        drop(released);
        Ok(())
    }

    /// Bytes held by the pool: cached plus checked-out backing.
    pub fn used_memory(&self) -> Result<usize, TensorError> {
        let books = self.shared.lock()?;
        Ok(books.cached_bytes.saturating_add(books.checked_out_bytes))
    }

    /// Bytes of cached (idle) backing.
    pub fn cached_bytes(&self) -> Result<usize, TensorError> {
        Ok(self.shared.lock()?.cached_bytes)
    }

    /// Number of backing buffers checked out to live tensors.
    pub fn checked_out(&self) -> Result<usize, TensorError> {
        Ok(self.shared.lock()?.checked_out)
    }

    /// Number of cached backing buffers.
    pub fn cached_count(&self) -> Result<usize, TensorError> {
        Ok(self.shared.lock()?.entries.len())
    }

    /// Checks the pool's internal invariants (for tests).
    pub fn check_invariants(&self) -> Result<(), String> {
        let books = self.shared.lock().map_err(|e| e.to_string())?;
        books.check_invariants()?;
        if let Some(bound) = self.shared.config.max_cached_bytes {
            if books.cached_bytes > bound {
                return Err(format!(
                    "cache holds {} > bound {bound}",
                    books.cached_bytes
                ));
            }
        }
        Ok(())
    }
}

/// Fresh host backing: `uint8[nbytes]` aligned to `alignment` on `device` (`cpu:0`).
pub fn default_alloc(
    nbytes: usize,
    alignment: usize,
    device: Device,
) -> Result<Tensor, TensorError> {
    device.require_cpu()?;
    check_alignment(alignment)?;
    let buffer = super::storage::HostBuffer::new(nbytes, alignment)?;
    Tensor::from_backing(
        Arc::new(buffer),
        0,
        &[nbytes as i64],
        DataType::UINT8,
        device,
    )
}

/// Refuses an alignment that is not a power of two (0 included): a [`Request`] is plain
/// data a caller may build, and its alignment divides addresses.
fn check_alignment(alignment: usize) -> Result<(), TensorError> {
    if alignment == 0 || !alignment.is_power_of_two() {
        return Err(TensorError::InvalidAlignment { alignment });
    }
    Ok(())
}

/// Checks that `backing` can serve `req` on `device`: large enough, aligned, writable.
/// A request whose alignment is not a power of two is refused
/// ([`TensorError::InvalidAlignment`]).
pub fn validate_backing(backing: &Tensor, req: Request, device: Device) -> Result<(), TensorError> {
    check_alignment(req.alignment)?;
    if backing.device() != device {
        return Err(TensorError::WrongDevice {
            what: "alloc_backing result",
            actual: backing.device(),
            expected: device,
        });
    }
    if backing.readonly() {
        return Err(TensorError::ReadOnlyBacking {
            what: "alloc_backing result",
        });
    }
    if backing.nbytes() < req.size {
        return Err(TensorError::BackingTooSmall {
            what: "alloc_backing result",
            actual: backing.nbytes(),
            required: req.size,
        });
    }
    let address = backing.data_ptr() as usize;
    if req.nbytes > 0 && address % req.alignment != 0 {
        return Err(TensorError::Misaligned {
            what: "alloc_backing result",
            address,
            alignment: req.alignment,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32() -> DataType {
        DataType::parse("float32").unwrap()
    }

    fn pool(bound: Option<usize>) -> TensorMemoryPool {
        TensorMemoryPool::new(PoolConfig {
            max_cached_bytes: bound,
            ..PoolConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn reuse_is_lifo_and_exact_size() {
        let p = pool(None);
        let a = p.empty(&[10], f32()).unwrap();
        let addr = a.data_ptr();
        assert_eq!(p.used_memory().unwrap(), 4096);
        drop(a);
        assert_eq!(
            (p.used_memory().unwrap(), p.cached_bytes().unwrap()),
            (4096, 4096)
        );
        let b = p.empty(&[1000], f32()).unwrap();
        assert_eq!(b.data_ptr(), addr, "same bucket reuses the backing");
        let c = p.empty(&[1025], f32()).unwrap();
        assert_ne!(c.data_ptr(), addr);
        assert_eq!(p.used_memory().unwrap(), 4096 + 8192);
        p.check_invariants().unwrap();
    }

    #[test]
    fn views_hold_the_lease() {
        let p = pool(None);
        let a = p.empty(&[4], f32()).unwrap();
        let v = a.create_view(&[2], f32(), 8).unwrap();
        drop(a);
        assert_eq!(p.cached_bytes().unwrap(), 0);
        drop(v);
        assert_eq!(p.cached_bytes().unwrap(), 4096);
        p.check_invariants().unwrap();
    }

    #[test]
    fn clear_keeps_live_tensors_and_books() {
        let p = pool(None);
        let live = p.empty(&[4], f32()).unwrap();
        drop(p.empty(&[4], f32()).unwrap());
        assert_eq!(p.used_memory().unwrap(), 8192);
        p.clear().unwrap();
        assert_eq!(p.used_memory().unwrap(), 4096);
        live.region().write(&[7; 16], "t").unwrap();
        drop(live);
        assert_eq!(
            (p.used_memory().unwrap(), p.cached_count().unwrap()),
            (4096, 1)
        );
        p.clear().unwrap();
        assert_eq!(p.used_memory().unwrap(), 0);
        p.check_invariants().unwrap();
    }

    #[test]
    fn bounded_cache_evicts_oldest() {
        let p = pool(Some(8192));
        let ts: Vec<_> = (0..3).map(|_| p.empty(&[1], f32()).unwrap()).collect();
        let big = p.empty(&[4096], f32()).unwrap();
        drop(big);
        assert_eq!(
            p.cached_bytes().unwrap(),
            0,
            "larger than the bound: freed at once"
        );
        drop(ts);
        assert_eq!(p.cached_bytes().unwrap(), 8192);
        assert_eq!(p.used_memory().unwrap(), 8192);
        p.check_invariants().unwrap();
    }

    #[test]
    fn reuse_respects_alignment_and_validation() {
        let p = pool(None);
        // A 4096-byte backing at an address aligned to 64 but not 128.
        let raw = default_alloc(4096 + 64, 128, Device::CPU0).unwrap();
        let off = raw.create_view(&[4096], DataType::UINT8, 64).unwrap();
        let req = p.request(&[1], f32()).unwrap();
        let lease = p.adopt(off, req).unwrap();
        drop(lease);
        assert_eq!(p.cached_count().unwrap(), 1);
        let wide = DataType::parse("float64x16").unwrap(); // needs 128
        let t = p.empty(&[1], wide).unwrap();
        assert_eq!(t.data_ptr() as usize % 128, 0);
        assert_eq!(
            p.cached_count().unwrap(),
            1,
            "misaligned entry was not reused"
        );
        let small = default_alloc(100, 64, Device::CPU0).unwrap();
        assert!(matches!(
            p.adopt(small, req),
            Err(TensorError::BackingTooSmall { .. })
        ));
        let mis = raw.create_view(&[4096], DataType::UINT8, 1).unwrap();
        assert!(matches!(
            p.adopt(mis, req),
            Err(TensorError::Misaligned { .. })
        ));
        assert!(TensorMemoryPool::new(PoolConfig {
            page_size: 0,
            ..PoolConfig::default()
        })
        .is_err());
    }

    #[test]
    fn backing_given_twice_is_refused_not_handed_to_two_tensors() {
        // One buffer adopted twice (or a view of it) was cached twice: two `empty` calls
        // then handed out two tensors over the same bytes.
        let p = pool(None);
        let req = p.request(&[1024], f32()).unwrap();
        let raw = default_alloc(8192, 64, Device::CPU0).unwrap();
        let whole = raw.create_view(&[4096], DataType::UINT8, 0).unwrap();
        let lease = p.adopt(whole.clone(), req).unwrap();
        let held =
            |backing: Tensor| matches!(p.adopt(backing, req), Err(TensorError::BackingHeld { .. }));
        assert!(held(whole.clone()), "the same backing, leased");
        assert!(held(
            raw.create_view(&[4096], DataType::UINT8, 2048).unwrap()
        ));
        drop(lease);
        assert!(held(whole.clone()), "the same backing, cached");
        // A backing beside it is another's, and one let go of may come back.
        let beside = raw.create_view(&[4096], DataType::UINT8, 4096).unwrap();
        drop(p.adopt(beside, req).unwrap());
        let (a, b) = (
            p.empty(&[1024], f32()).unwrap(),
            p.empty(&[1024], f32()).unwrap(),
        );
        assert_ne!(a.data_ptr(), b.data_ptr());
        drop((a, b));
        p.clear().unwrap();
        drop(p.adopt(whole, req).unwrap());
        p.check_invariants().unwrap();
    }

    #[test]
    fn oom_retries_after_clearing() {
        let p = pool(None);
        drop(p.empty(&[1], f32()).unwrap());
        let mut calls = 0;
        let wide = DataType::parse("float64x16").unwrap();
        let t = p.empty_with(
            &[100],
            wide,
            |n, a, d| {
                calls += 1;
                if calls == 1 {
                    Err(TensorError::OutOfMemory {
                        nbytes: n,
                        alignment: a,
                    })
                } else {
                    default_alloc(n, a, d)
                }
            },
            |e| matches!(e, TensorError::OutOfMemory { .. }),
        );
        assert!(t.is_ok());
        assert_eq!(calls, 2);
        assert_eq!(
            p.cached_bytes().unwrap(),
            0,
            "cache released before the retry"
        );
    }

    proptest::proptest! {
        /// Random empty/view/drop/clear against a shadow model: live tensors never overlap
        /// (unless one is a view of the other), keep their contents, and the books balance.
        #[test]
        fn model(ops in proptest::collection::vec((0u8..4, 0usize..3000, 0usize..1000), 1..80)) {
            let p = TensorMemoryPool::new(PoolConfig {
                page_size: 256,
                max_cached_bytes: Some(2048),
                ..PoolConfig::default()
            }).unwrap();
            // (tensor, fill byte, family id): views share their source's family.
            let mut live: Vec<(Tensor, u8, usize)> = Vec::new();
            let mut next = 0usize;
            for (op, size, pick) in ops {
                match op {
                    0 => {
                        let t = p.empty(&[size as i64], DataType::UINT8).unwrap();
                        let fill = (next % 251) as u8 + 1;
                        t.region().write(&vec![fill; t.nbytes()], "t").unwrap();
                        live.push((t, fill, next));
                        next += 1;
                    }
                    1 if !live.is_empty() => {
                        let (src, fill, fam) = live[pick % live.len()].clone();
                        let len = (size % (src.nbytes() + 1)) as i64;
                        let view = p.create_view(&src, &[len], DataType::UINT8, 0).unwrap();
                        live.push((view, fill, fam));
                    }
                    2 if !live.is_empty() => {
                        live.swap_remove(pick % live.len());
                    }
                    3 => p.clear().unwrap(),
                    _ => {}
                }
                p.check_invariants().unwrap();
                for (t, fill, _) in &live {
                    proptest::prop_assert!(t.to_bytes().unwrap().iter().all(|b| b == fill));
                }
                for (i, (a, _, fa)) in live.iter().enumerate() {
                    for (b, _, fb) in &live[i + 1..] {
                        if fa == fb || a.nbytes() == 0 || b.nbytes() == 0 {
                            continue;
                        }
                        let (a0, b0) = (a.data_ptr() as usize, b.data_ptr() as usize);
                        proptest::prop_assert!(a0 + a.nbytes() <= b0 || b0 + b.nbytes() <= a0);
                    }
                }
            }
            drop(live);
            proptest::prop_assert_eq!(p.checked_out().unwrap(), 0);
            proptest::prop_assert_eq!(p.used_memory().unwrap(), p.cached_bytes().unwrap());
            p.clear().unwrap();
            proptest::prop_assert_eq!(p.used_memory().unwrap(), 0);
        }
    }

    #[test]
    fn requests_with_an_alignment_that_is_no_power_of_two_are_refused() {
        // A `Request` is plain data: an alignment of 0 divided an address by zero in
        // `take_cached` and `adopt`. It is a typed error, and the cached backing stays.
        let p = pool(None);
        drop(p.empty(&[16], DataType::UINT8).unwrap());
        assert_eq!(p.cached_count().unwrap(), 1);
        for alignment in [0, 3, 96] {
            let req = Request {
                nbytes: 16,
                size: 4096,
                alignment,
            };
            assert!(matches!(
                p.take_cached(req),
                Err(TensorError::InvalidAlignment { alignment: a }) if a == alignment
            ));
            let backing = default_alloc(4096, 64, Device::CPU0).unwrap();
            assert!(matches!(
                p.adopt(backing, req),
                Err(TensorError::InvalidAlignment { alignment: a }) if a == alignment
            ));
        }
        assert_eq!(p.cached_count().unwrap(), 1);
        assert_eq!(p.checked_out().unwrap(), 0);
        p.check_invariants().unwrap();
    }

    #[test]
    fn threads_share_one_pool() {
        let p = pool(Some(1 << 16));
        std::thread::scope(|s| {
            for i in 0..4 {
                let p = p.clone();
                s.spawn(move || {
                    for j in 0..200 {
                        let t = p.empty(&[(i * 300 + j) as i64 % 2000], f32()).unwrap();
                        t.region().write(&vec![i as u8; t.nbytes()], "t").unwrap();
                        assert!(t.to_bytes().unwrap().iter().all(|&b| b == i as u8));
                    }
                });
            }
        });
        p.check_invariants().unwrap();
        assert_eq!(p.checked_out().unwrap(), 0);
        assert_eq!(p.used_memory().unwrap(), p.cached_bytes().unwrap());
    }
}
