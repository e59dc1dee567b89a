//! Size classes of free segments with a two-level bitmap: O(1) good-fit search, and
//! the free lists themselves, shared by the sliced pool and the virtual pool's arena.
//!
//! Sizes map to classes with three mantissa bits per power of two (eight classes per
//! doubling, so a class spans at most 12.5 % of its sizes), like the two-level bitmaps
//! of TLSF and `offset-allocator`. Each class is a list of free segments, most
//! recently freed first; the segments link the lists themselves (their
//! [`FreeLinks`], reached through [`FreeSegments`]), and [`FreeHeads`] holds the first
//! segment of each class. A search ([`FreeHeads::find`]) first looks at a few members
//! of the request's own class (exact-size reuse is the common case in real traces),
//! then takes the first member of the first non-empty larger class, whose members all
//! fit.

use nonmax::NonMaxU32;

/// A segment's index in its pool's segment store. Never `u32::MAX`, so that a
/// [`Link`] is four bytes.
pub(crate) type SegmentIndex = NonMaxU32;

/// A link to a segment: `None` ends a list or a chain.
pub(crate) type Link = Option<SegmentIndex>;

/// The position in a store's `Vec` that `link` names; for `None`, `u32::MAX`, past
/// the end of any store (which holds fewer entries), so that following a link costs
/// one bounds check.
#[inline(always)]
pub(crate) fn position(link: Link) -> usize {
    link.map_or(u32::MAX, |index| index.get()) as usize
}

/// The index of a segment stored at `position` of a store, which holds fewer than
/// `u32::MAX` entries.
#[inline(always)]
pub(crate) fn index_at(position: u32) -> SegmentIndex {
    NonMaxU32::new(position).expect("a segment store holds fewer than 2^32 - 1 entries")
}

/// What a segment is, in one word, instead of a class number that also encodes flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SegmentState {
    /// A reservation holds it.
    Used,
    /// Released last and not yet merged with its free neighbours: free, on no list
    /// (deferred coalescing, see the sliced pool).
    Deferred,
    /// Free, on the list of this size class (below [`CLASSES`]).
    Listed(u16),
    /// Free, spanning a whole page, on the sliced pool's list of free pages.
    WholePage,
    /// No segment: a vacant entry of the virtual pool arena's store.
    Vacant,
}

impl SegmentState {
    /// The state of a segment on the list of `class`.
    #[inline(always)]
    pub(crate) fn listed(class: usize) -> Self {
        // Classes are below `CLASSES`, which fits a `u16`.
        Self::Listed(class as u16)
    }

    /// Whether the segment is free and on a list (a class's or the free pages').
    #[inline(always)]
    pub(crate) fn is_listed(self) -> bool {
        matches!(self, Self::Listed(_) | Self::WholePage)
    }
}

/// A free segment's neighbours on its list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FreeLinks {
    /// The segment before it on its list (`None`: it is first).
    pub(crate) prev: Link,
    /// The segment after it on its list (`None`: it is last).
    pub(crate) next: Link,
}

/// A store of segments that the free lists link through.
pub(crate) trait FreeSegments {
    /// The extent and the list links of the live segment `link` names, or `None`
    /// for `None`.
    fn free_entry(&self, link: Link) -> Option<(u64, &FreeLinks)>;

    /// The list links of the live segment `link` names, or `None` for `None`.
    fn free_links_mut(&mut self, link: Link) -> Option<&mut FreeLinks>;

    /// The state of the live segment at `index`.
    fn state(&self, index: SegmentIndex) -> Option<SegmentState>;
}

/// Puts segment `index` first on the list that starts at `head`; the list then
/// starts at `index`.
#[inline(always)]
pub(crate) fn push_front<S: FreeSegments>(segments: &mut S, head: Link, index: SegmentIndex) {
    if let Some(links) = segments.free_links_mut(Some(index)) {
        *links = FreeLinks {
            prev: None,
            next: head,
        };
    }
    if let Some(head) = segments.free_links_mut(head) {
        head.prev = Some(index);
    }
}

/// Takes segment `index` off its list; returns the list's new first segment when
/// `index` was first (the caller's head to set), else `None`.
#[inline(always)]
pub(crate) fn unlink<S: FreeSegments>(segments: &mut S, index: SegmentIndex) -> Option<Link> {
    let FreeLinks { prev, next } = segments
        .free_entry(Some(index))
        .map(|(_, links)| *links)
        .unwrap_or_default();
    if let Some(after) = segments.free_links_mut(next) {
        after.prev = prev;
    }
    match segments.free_links_mut(prev) {
        Some(before) => {
            before.next = next;
            None
        }
        None => Some(next),
    }
}

/// Walks the list that starts at `head`: every member live, in state `state`, linked
/// back to the one before it, and no more than `most` of them (else it loops).
/// Returns how many there are.
pub(crate) fn check_list<S: FreeSegments>(
    segments: &S,
    head: Link,
    state: SegmentState,
    most: usize,
) -> Result<usize, String> {
    let (mut cursor, mut before, mut count) = (head, None, 0usize);
    while let Some(index) = cursor {
        let (_, links) = segments
            .free_entry(cursor)
            .ok_or_else(|| format!("the free list of {state:?} links to a dead segment"))?;
        count += 1;
        if count > most {
            return Err(format!("the free list of {state:?} loops"));
        }
        if segments.state(index) != Some(state) {
            return Err(format!(
                "the free list of {state:?} holds a segment not of it"
            ));
        }
        if links.prev != before {
            return Err(format!("broken back link on the free list of {state:?}"));
        }
        (before, cursor) = (cursor, links.next);
    }
    Ok(count)
}

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
// The second level of the bitmap is a `u8`, one bit a word; classes fit a `u16`
// (`SegmentState::Listed`); `class_of` masks with `CLASSES - 1`.
const _: () = assert!(WORDS <= 8 && CLASSES <= u16::MAX as usize && CLASSES.is_power_of_two());

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
    heads: Box<[Link; CLASSES]>,
    /// Invariant: bit `c` is set exactly when `heads[c]` is not `None`.
    bitmap: [u64; WORDS],
    /// Invariant: bit `w` is set exactly when `bitmap[w]` is non-zero (the second
    /// level, so a search finds the next non-empty class in two steps).
    words: u8,
}

impl Default for FreeHeads {
    fn default() -> Self {
        Self {
            heads: Box::new([None; CLASSES]),
            bitmap: [0; WORDS],
            words: 0,
        }
    }
}

impl FreeHeads {
    /// The first segment of `class`.
    #[inline]
    pub(crate) fn head(&self, class: usize) -> Link {
        self.heads[class & (CLASSES - 1)]
    }

    /// Makes `index` (`None` for an empty class) the first segment of `class`.
    #[inline]
    pub(crate) fn set_head(&mut self, class: usize, index: Link) {
        let class = class & (CLASSES - 1);
        self.heads[class] = index;
        let (word, bit) = (class / 64, 1u64 << (class % 64));
        if index.is_none() {
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

    /// Puts segment `index` first on the list of `class` (its state is the
    /// caller's to set).
    #[inline(always)]
    pub(crate) fn push<S: FreeSegments>(
        &mut self,
        segments: &mut S,
        class: usize,
        index: SegmentIndex,
    ) {
        push_front(segments, self.head(class), index);
        self.set_head(class, Some(index));
    }

    /// Takes segment `index` off the list of `class`.
    #[inline(always)]
    pub(crate) fn remove<S: FreeSegments>(
        &mut self,
        segments: &mut S,
        class: usize,
        index: SegmentIndex,
    ) {
        if let Some(head) = unlink(segments, index) {
            self.set_head(class, head);
        }
    }

    /// A listed free segment of at least `extent` bytes: one of the first
    /// [`OWN_CLASS_PROBES`] of the request's own class that fits, else the first of
    /// the smallest larger class.
    #[inline]
    pub(crate) fn find<S: FreeSegments>(&self, segments: &S, extent: u64) -> Link {
        let class = class_of(extent);
        let mut cursor = self.head(class);
        for _ in 0..OWN_CLASS_PROBES {
            let Some((found, links)) = segments.free_entry(cursor) else {
                break;
            };
            if found >= extent {
                return cursor;
            }
            cursor = links.next;
        }
        self.head(self.first_from(class + 1)?)
    }

    /// Walks every class's list (see [`check_list`]); returns how many segments
    /// they hold.
    pub(crate) fn check_lists<S: FreeSegments>(
        &self,
        segments: &S,
        most: usize,
    ) -> Result<usize, String> {
        let mut listed = 0;
        for class in 0..CLASSES {
            listed += check_list(
                segments,
                self.head(class),
                SegmentState::listed(class),
                most,
            )?;
        }
        Ok(listed)
    }

    /// Checks both levels of the bitmap against the heads.
    pub(crate) fn check(&self) -> Result<(), String> {
        for (class, &head) in self.heads.iter().enumerate() {
            let bit = self.bitmap[class / 64] >> (class % 64) & 1 == 1;
            if bit != head.is_some() {
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
        let [one, two, three] = [1, 2, 3].map(index_at);
        heads.set_head(class_of(1000), Some(one));
        heads.set_head(class_of(5000), Some(two));
        heads.set_head(300, Some(three));
        assert_eq!(heads.first_from(class_of(1000)), Some(class_of(1000)));
        assert_eq!(heads.first_from(class_of(1000) + 1), Some(class_of(5000)));
        assert_eq!(
            heads.first_from(class_of(5000) + 1),
            Some(300),
            "across words"
        );
        assert_eq!(heads.first_from(301), None);
        heads.set_head(class_of(5000), None);
        assert_eq!(heads.first_from(class_of(1000) + 1), Some(300));
        heads.set_head(300, None);
        assert_eq!(heads.first_from(class_of(1000) + 1), None);
        assert_eq!(heads.head(class_of(1000)), Some(one));
        heads.check().unwrap();
    }
}
