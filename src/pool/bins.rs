//! Size classes of free segments with a two-level bitmap: O(1) good-fit search.
//!
//! Sizes map to classes with three mantissa bits per power of two (eight classes per
//! doubling, so a class spans at most 12.5 % of its sizes), like the two-level bitmaps
//! of TLSF and `offset-allocator`. Each class is a list of free segments, most
//! recently freed first; the segments link the lists themselves (see the sliced
//! pool), and [`FreeHeads`] holds the first segment of each class. A search first
//! looks at a few members of the request's own class (exact-size reuse is the common
//! case in real traces), then takes the first member of the first non-empty larger
//! class, whose members all fit.

/// A free segment's index in its pool's segment arena.
pub(crate) type SegmentIndex = u32;

/// No segment: the end of a list or of a page's chain.
pub(crate) const NONE: SegmentIndex = SegmentIndex::MAX;

/// This many members of the request's own class are looked at, most recently freed
/// first. Each one past the first is another segment read, one after the other. In
/// the benchmarks' steady state of random sizes (10^6 steps, `SubSlices`), the pools
/// end up reserving 26,056 MiB with 4, 26,072 MiB with 8, 26,712 MiB with 2 and
/// 27,584 MiB with 1; 4 took 2.6 ns less a step than 8. The bundled traces peak the
/// same with any of them.
pub(crate) const OWN_CLASS_PROBES: usize = 4;
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

/// The first free segment of each size class, and which classes have one. The heads
/// sit in one array, so a search reads no list before the segment it takes.
#[derive(Debug, Clone)]
pub(crate) struct FreeHeads {
    heads: Box<[SegmentIndex; CLASSES]>,
    /// Invariant: bit `c` is set exactly when `heads[c]` is not `NONE`.
    bitmap: [u64; WORDS],
    /// Invariant: bit `w` is set exactly when `bitmap[w]` is non-zero (the second
    /// level, so a search finds the next non-empty class in two steps).
    words: u8,
}

impl Default for FreeHeads {
    fn default() -> Self {
        Self {
            heads: Box::new([NONE; CLASSES]),
            bitmap: [0; WORDS],
            words: 0,
        }
    }
}

impl FreeHeads {
    /// The first segment of `class`, or `NONE`.
    #[inline]
    pub(crate) fn head(&self, class: usize) -> SegmentIndex {
        self.heads[class & (CLASSES - 1)]
    }

    /// Makes `index` (`NONE` for an empty class) the first segment of `class`.
    #[inline]
    pub(crate) fn set_head(&mut self, class: usize, index: SegmentIndex) {
        let class = class & (CLASSES - 1);
        self.heads[class] = index;
        let (word, bit) = (class / 64, 1u64 << (class % 64));
        if index == NONE {
            self.bitmap[word] &= !bit;
            if self.bitmap[word] == 0 {
                self.words &= !(1 << word);
            }
        } else {
            self.bitmap[word] |= bit;
            self.words |= 1 << word;
        }
    }

    /// The first class from `from` on that has a free segment.
    #[inline]
    pub(crate) fn first_from(&self, from: usize) -> Option<usize> {
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

    /// Checks both levels of the bitmap against the heads.
    pub(crate) fn check(&self) -> Result<(), String> {
        for (class, &head) in self.heads.iter().enumerate() {
            let bit = self.bitmap[class / 64] >> (class % 64) & 1 == 1;
            if bit != (head != NONE) {
                return Err(format!("bitmap bit of class {class} is wrong"));
            }
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
    fn first_from_finds_the_next_class_with_a_head() {
        let mut heads = FreeHeads::default();
        assert_eq!(heads.first_from(0), None);
        heads.set_head(class_of(1000), 1);
        heads.set_head(class_of(5000), 2);
        heads.set_head(300, 3);
        assert_eq!(heads.first_from(class_of(1000)), Some(class_of(1000)));
        assert_eq!(heads.first_from(class_of(1000) + 1), Some(class_of(5000)));
        assert_eq!(
            heads.first_from(class_of(5000) + 1),
            Some(300),
            "across words"
        );
        assert_eq!(heads.first_from(301), None);
        heads.set_head(class_of(5000), NONE);
        assert_eq!(heads.first_from(class_of(1000) + 1), Some(300));
        heads.set_head(300, NONE);
        assert_eq!(heads.first_from(class_of(1000) + 1), None);
        assert_eq!(heads.head(class_of(1000)), 1);
        heads.check().unwrap();
    }
}
