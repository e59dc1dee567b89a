//! Size-class bins of free segments with a bitmap: O(1) good-fit search.
//!
//! Sizes map to classes with three mantissa bits per power of two (eight classes per
//! doubling, so a class spans at most 12.5 % of its sizes), like the two-level bitmaps
//! of TLSF and `offset-allocator`. A search first looks at a few members of the
//! request's own class (exact-size reuse is the common case in real traces), then
//! takes the most recently freed member of the first non-empty larger class, whose
//! members all fit.

/// A free segment's index in its pool's segment arena.
pub(crate) type SegmentIndex = u32;

/// Where a free segment sits in its [`FreeBins`]: its class and its position in the
/// class's bin. The segment stores it, so taking it out recomputes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BinSlot {
    /// The size class of the segment's extent: below `CLASSES` for a slot the bins
    /// made (a pool may use larger values for places of its own, and never hands
    /// those to the bins).
    pub(crate) class: u16,
    /// The position in the class's bin.
    pub(crate) position: u32,
}

/// Bins this many members deep are searched in the request's own class.
const OWN_CLASS_PROBES: usize = 8;
/// The number of size classes (the last few hold no size).
pub(crate) const CLASSES: usize = 512;
const WORDS: usize = CLASSES / 64;

/// The size class of `size`: exact below 8, then eight classes per power of two.
/// Always below `CLASSES` (the mask only tells the compiler so).
#[inline]
pub(crate) fn class_of(size: u64) -> usize {
    if size < 8 {
        return size as usize;
    }
    let exponent = 63 - u64::from(size.leading_zeros());
    let mantissa = (size >> (exponent - 3)) & 7;
    ((exponent - 2) * 8 + mantissa) as usize & (CLASSES - 1)
}

/// The smallest and largest size of `class`, or `None` for a class no size maps to.
pub(crate) fn class_bounds(class: usize) -> Option<(u64, u64)> {
    if class < 16 {
        return Some((class as u64, class as u64));
    }
    let (exponent, mantissa) = (class / 8 + 2, class as u64 % 8);
    if exponent > 63 {
        return None;
    }
    let step = 1u64 << (exponent - 3);
    let low = (8 + mantissa) << (exponent - 3);
    Some((low, low + (step - 1)))
}

/// Free segments by size class. Each member remembers its position in its bin, so any
/// member is removed in O(1).
#[derive(Debug, Clone)]
pub(crate) struct FreeBins {
    bins: Box<[Vec<(SegmentIndex, u64)>; CLASSES]>,
    /// Invariant: bit `c` is set exactly when `bins[c]` is non-empty.
    bitmap: [u64; WORDS],
    /// Invariant: bit `w` is set exactly when `bitmap[w]` is non-zero (the second
    /// level, so a search finds the next non-empty class in two steps).
    words: u8,
    len: usize,
}

impl Default for FreeBins {
    fn default() -> Self {
        Self {
            bins: Box::new(std::array::from_fn(|_| Vec::new())),
            bitmap: [0; WORDS],
            words: 0,
            len: 0,
        }
    }
}

impl FreeBins {
    /// Adds a free segment of `extent` bytes; returns where it sits, which the caller
    /// stores for [`FreeBins::remove`].
    #[inline]
    pub(crate) fn insert(&mut self, id: SegmentIndex, extent: u64) -> BinSlot {
        let class = class_of(extent);
        let bin = &mut self.bins[class];
        bin.push((id, extent));
        self.bitmap[class / 64] |= 1 << (class % 64);
        self.words |= 1 << (class / 64);
        self.len += 1;
        BinSlot {
            class: class as u16,
            position: (bin.len() - 1) as u32,
        }
    }

    /// Removes the member at `slot`. Returns the member that moved into its position
    /// (whose stored position the caller must update), if any.
    #[inline]
    pub(crate) fn remove(&mut self, slot: BinSlot) -> Option<SegmentIndex> {
        debug_assert!(usize::from(slot.class) < CLASSES, "not a slot of the bins");
        let (class, position) = (usize::from(slot.class) & (CLASSES - 1), slot.position);
        let bin = &mut self.bins[class];
        let last = bin.pop()?;
        self.len -= 1;
        if bin.is_empty() {
            self.bitmap[class / 64] &= !(1 << (class % 64));
            if self.bitmap[class / 64] == 0 {
                self.words &= !(1 << (class / 64));
            }
        }
        // The last member moves into the vacated position (unless it was the one).
        let slot = bin.get_mut(position as usize)?;
        *slot = last;
        Some(last.0)
    }

    /// Changes the extent of the member at `slot` to `new`, in place, when that member
    /// is the last (most recently freed) of its class and `new` is in the same class:
    /// the outcome of removing it and inserting it again. Returns whether it did.
    #[inline]
    pub(crate) fn resize_last(&mut self, slot: BinSlot, new: u64) -> bool {
        debug_assert!(usize::from(slot.class) < CLASSES, "not a slot of the bins");
        let class = usize::from(slot.class) & (CLASSES - 1);
        if class != class_of(new) {
            return false;
        }
        let bin = &mut self.bins[class];
        if bin.len() != slot.position as usize + 1 {
            return false;
        }
        match bin.last_mut() {
            Some(last) => {
                last.1 = new;
                true
            }
            None => false,
        }
    }

    /// A free segment of at least `extent` bytes, with its extent and position.
    #[inline]
    pub(crate) fn find(&self, extent: u64) -> Option<(SegmentIndex, u64, u32)> {
        let class = class_of(extent);
        let own = &self.bins[class];
        let probed = own.len().saturating_sub(OWN_CLASS_PROBES);
        for position in (probed..own.len()).rev() {
            let (id, size) = own[position];
            if size >= extent {
                return Some((id, size, position as u32));
            }
        }
        let larger = self.first_set(class + 1)?;
        let bin = &self.bins[larger];
        let position = bin.len() - 1;
        let (id, size) = bin[position];
        Some((id, size, position as u32))
    }

    fn first_set(&self, from: usize) -> Option<usize> {
        if from >= CLASSES {
            return None;
        }
        let word = from / 64;
        let bits = self.bitmap[word] & (!0u64 << (from % 64));
        if bits != 0 {
            return Some(word * 64 + bits.trailing_zeros() as usize);
        }
        // The next non-empty word above `word`, from the second level.
        let above = u32::from(self.words) & (!0u32 << (word + 1));
        if above == 0 {
            return None;
        }
        let word = above.trailing_zeros() as usize;
        Some(word * 64 + self.bitmap[word].trailing_zeros() as usize)
    }

    /// The number of free segments.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether `id` of `extent` sits at `slot`, in the class of `extent`.
    pub(crate) fn holds(&self, id: SegmentIndex, extent: u64, slot: BinSlot) -> bool {
        let class = class_of(extent);
        usize::from(slot.class) == class
            && self.bins[class].get(slot.position as usize) == Some(&(id, extent))
    }

    /// Checks the bitmap and the count.
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut len = 0;
        for (class, bin) in self.bins.iter().enumerate() {
            let bit = self.bitmap[class / 64] >> (class % 64) & 1 == 1;
            if bit == bin.is_empty() {
                return Err(format!("bitmap bit of class {class} is wrong"));
            }
            if bin.iter().any(|&(_, extent)| class_of(extent) != class) {
                return Err(format!("a segment sits in the wrong class {class}"));
            }
            len += bin.len();
        }
        if len != self.len {
            return Err("free bin count drifted".into());
        }
        for (word, bits) in self.bitmap.iter().enumerate() {
            if (*bits != 0) != (self.words >> word & 1 == 1) {
                return Err(format!("second-level bit of word {word} is wrong"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_monotone_and_tight() {
        let mut previous = 0;
        for size in 0..100_000u64 {
            let class = class_of(size);
            assert!(class >= previous && class <= previous + 1, "at {size}");
            previous = class;
        }
        assert!(class_of(u64::MAX) < CLASSES);
    }

    #[test]
    fn class_bounds_invert_class_of() {
        for class in 0..CLASSES {
            match class_bounds(class) {
                Some((low, high)) => {
                    assert_eq!(class_of(low), class, "low end of {class}");
                    assert_eq!(class_of(high), class, "high end of {class}");
                    if low > 0 {
                        assert_eq!(class_of(low - 1), class - 1, "below {class}");
                    }
                    if let Some(above) = high.checked_add(1) {
                        assert_eq!(class_of(above), class + 1, "above {class}");
                    }
                }
                None => assert!(class > class_of(u64::MAX), "class {class} is empty"),
            }
        }
    }

    #[test]
    fn find_returns_a_fitting_segment() {
        let mut bins = FreeBins::default();
        let id = |index: SegmentIndex| index;
        let first = bins.insert(id(1), 1000);
        let second = bins.insert(id(2), 1100);
        bins.insert(id(3), 5000);
        assert_eq!(bins.find(1050).map(|f| f.0), Some(id(2)));
        assert_eq!(bins.find(1200).map(|f| f.0), Some(id(3)));
        assert_eq!(bins.find(6000), None);
        assert_eq!(bins.remove(first), None, "the last member of its class");
        let fourth = bins.insert(id(4), 1050);
        assert_eq!(fourth.class, second.class, "1050 and 1100 share a class");
        assert_eq!(
            bins.remove(second),
            Some(id(4)),
            "1050 moved into position 0"
        );
        let moved = BinSlot {
            position: 0,
            ..fourth
        };
        assert!(bins.holds(id(4), 1050, moved));
        assert!(
            !bins.holds(id(4), 1050, fourth),
            "nothing at position 1 now"
        );
        bins.check().unwrap();
    }
}
