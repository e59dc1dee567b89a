//! Size classes of free segments with a two-level bitmap: O(1) good-fit search, and
//! the free lists themselves, shared by the sliced pool and the virtual pool's arena.
//!
//! Sizes map to classes with three mantissa bits per power of two (eight classes per
//! doubling, so a class spans at most 12.5 % of its sizes), like the two-level bitmaps
//! of TLSF and `offset-allocator`. Each class is a list of free segments, most
//! recently freed first; the segments link the lists themselves (their
//! [`FreeLinks`], reached through [`FreeSegments`]), and [`FreeHeads`] holds the first
//! segment of each class, and its last. A search ([`FreeHeads::find`]) first looks at a
//! few members of the request's own class (exact-size reuse is the common case in real
//! traces), then takes the first member of the first non-empty larger class, whose
//! members all fit. The virtual pool's arena searches with
//! [`FreeHeads::find_sparing_recent`], which takes the last member of that class instead
//! (the one freed longest ago) when every member is more than [`SPARE_RATIO`] times the
//! request, and otherwise the first unless one of the few after it is no larger than
//! what splitting the first would leave (then the smallest such).

/// A segment's index in its pool's segment store: below `u32::MAX`, the value that
/// [`Link`] keeps for "no segment", so an index is always a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct SegmentIndex(u32);

impl SegmentIndex {
    /// The index at `position` of a store, or `None` for `u32::MAX` (a store holds
    /// fewer entries than that).
    #[inline(always)]
    pub(crate) const fn new(position: u32) -> Option<Self> {
        if position == u32::MAX {
            None
        } else {
            Some(Self(position))
        }
    }

    /// The index of the entry at `position` of a store that holds it: below the
    /// store's length, which stays below `u32::MAX` (the pools' `Slab` and the arena's
    /// store refuse to grow past it), so it is an index and needs no check (debug
    /// builds check). For ids a store handed out, on the hot paths.
    #[inline(always)]
    pub(crate) const fn stored(position: u32) -> Self {
        debug_assert!(
            position != u32::MAX,
            "a store holds fewer than 2^32 - 1 entries"
        );
        Self(position)
    }

    /// The position in the store.
    #[inline(always)]
    pub(crate) const fn get(self) -> u32 {
        self.0
    }
}

/// A link to a segment, or none: the end of a list or a chain.
///
/// It holds what `Option<SegmentIndex>` would, in four bytes, and is read only
/// through [`Link::get`] (an `Option`) or [`Link::position`], so no code compares it
/// to a sentinel. Why not `Option<nonmax::NonMaxU32>` (offset-allocator's links):
/// `NonMaxU32` stores `!index`, so every link followed is decoded by one more
/// dependent instruction, where here "none" is `u32::MAX`, past the end of any
/// store, and following a link is one bounds check on the raw index, as the pools'
/// hot paths were written for. (Measured with `replay_ab`: the two are within noise
/// of each other on the shared traces; this one keeps the code a bounds check.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Link(u32);

impl Link {
    /// No segment.
    pub(crate) const NONE: Self = Self(u32::MAX);

    /// A link to segment `index`.
    #[inline(always)]
    pub(crate) const fn to(index: SegmentIndex) -> Self {
        Self(index.0)
    }

    /// The segment linked to, if any.
    #[inline(always)]
    pub(crate) const fn get(self) -> Option<SegmentIndex> {
        SegmentIndex::new(self.0)
    }

    /// Whether the link names no segment.
    #[inline(always)]
    pub(crate) const fn is_none(self) -> bool {
        self.0 == u32::MAX
    }

    /// Whether the link names a segment.
    #[inline(always)]
    pub(crate) const fn is_some(self) -> bool {
        !self.is_none()
    }

    /// The position in a store's `Vec` that the link names: past the end of any
    /// store for [`Link::NONE`], so `entries.get(link.position())` is `None` for it.
    #[inline(always)]
    pub(crate) const fn position(self) -> usize {
        self.0 as usize
    }

    /// The segment a link names that was just followed to a live entry of a store,
    /// or that its holder's invariant says names one: [`Link::NONE`] is past every
    /// store, so this link is not it, and [`Link::get`]'s check is redundant (debug
    /// builds still check).
    #[inline(always)]
    pub(crate) const fn followed(self) -> SegmentIndex {
        SegmentIndex::stored(self.0)
    }

    /// Takes the link, leaving [`Link::NONE`].
    #[inline(always)]
    pub(crate) fn take(&mut self) -> Option<SegmentIndex> {
        std::mem::replace(self, Self::NONE).get()
    }
}

impl From<SegmentIndex> for Link {
    #[inline(always)]
    fn from(index: SegmentIndex) -> Self {
        Self::to(index)
    }
}

/// The index of a segment stored at `position` of a store, which holds fewer than
/// `u32::MAX` entries.
#[inline(always)]
pub(crate) fn index_at(position: u32) -> SegmentIndex {
    SegmentIndex::new(position).expect("a segment store holds fewer than 2^32 - 1 entries")
}

/// What a segment is, in one word, instead of a class number that also encodes flags:
/// used, deferred, listed on a class (with the class), a whole free page, or vacant.
///
/// It is one `u16` underneath, read only through the constants, [`SegmentState::listed`],
/// [`SegmentState::class`], [`SegmentState::is_listed`] and [`SegmentState::view`] (an
/// enum, for a `match`), so no code outside this type sees the encoding. Why not the
/// enum itself: the enum is a tag and a payload, so telling two states apart is two
/// compares and a branch, and its niche made the sliced pool's slab entries 56 bytes
/// (64 with padding). One word compares in one instruction, the listed states are
/// the codes up to [`SegmentState::WHOLE_PAGE`] (one compare), and entries are 64
/// bytes without padding, so a link becomes an address by a shift. (Callgrind on
/// `replay_ab`, compact layout, gpt2-train: 3,098,476 instructions with the padded
/// enum, 3,082,699 with this, all else equal.)
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentState(u16);

/// A [`SegmentState`] decoded, for a `match`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StateView {
    /// A reservation holds it.
    Used,
    /// Released last and not yet merged with its free neighbours: free, on no list
    /// (deferred coalescing, see the sliced pool).
    Deferred,
    /// Free, on the list of this size class (below [`CLASSES`]).
    Listed(usize),
    /// Free, spanning a whole page, on the sliced pool's list of free pages.
    WholePage,
    /// No segment: a vacant entry of the virtual pool arena's store.
    Vacant,
}

impl SegmentState {
    // The encoding: a class below `CLASSES` is itself; the other states follow.
    /// Free, spanning a whole page, on the sliced pool's list of free pages.
    pub(crate) const WHOLE_PAGE: Self = Self(CLASSES as u16);
    /// Released last and not yet merged with its free neighbours: free, on no list
    /// (deferred coalescing, see the sliced pool).
    pub(crate) const DEFERRED: Self = Self(CLASSES as u16 + 1);
    /// A reservation holds it.
    pub(crate) const USED: Self = Self(CLASSES as u16 + 2);
    /// No segment: a vacant entry of the virtual pool arena's store.
    pub(crate) const VACANT: Self = Self(CLASSES as u16 + 3);

    /// The state of a segment on the list of `class` (below [`CLASSES`]).
    #[inline(always)]
    pub(crate) const fn listed(class: usize) -> Self {
        // Masked: a class is below `CLASSES` (a power of two), so this keeps it, and
        // no class ever reads as another state.
        Self((class & (CLASSES - 1)) as u16)
    }

    /// The class of the list the segment is on, when it is on a class's list.
    #[inline(always)]
    pub(crate) const fn class(self) -> Option<usize> {
        if (self.0 as usize) < CLASSES {
            Some(self.0 as usize)
        } else {
            None
        }
    }

    /// Whether the segment is free and on a list (a class's or the free pages').
    #[inline(always)]
    pub(crate) const fn is_listed(self) -> bool {
        self.0 <= Self::WHOLE_PAGE.0
    }

    /// The state decoded.
    pub(crate) const fn view(self) -> StateView {
        match self {
            Self::WHOLE_PAGE => StateView::WholePage,
            Self::DEFERRED => StateView::Deferred,
            Self::USED => StateView::Used,
            Self::VACANT => StateView::Vacant,
            Self(class) => StateView::Listed(class as usize),
        }
    }
}

impl std::fmt::Debug for SegmentState {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.view().fmt(formatter)
    }
}

/// A free segment's neighbours on its list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FreeLinks {
    /// The segment before it on its list ([`Link::NONE`]: it is first).
    pub(crate) prev: Link,
    /// The segment after it on its list ([`Link::NONE`]: it is last).
    pub(crate) next: Link,
}

impl FreeLinks {
    /// The links of a segment on no list, holding `value` instead (the bytes a used
    /// segment's reservation asked for): its low 32 bits in `prev`, its high in
    /// `next`. Read back whole by [`FreeLinks::held`].
    #[inline(always)]
    pub(crate) const fn holding(value: u64) -> Self {
        Self {
            prev: Link(value as u32),
            next: Link((value >> 32) as u32),
        }
    }

    /// The value [`FreeLinks::holding`] stored.
    #[inline(always)]
    pub(crate) const fn held(self) -> u64 {
        self.prev.0 as u64 | (self.next.0 as u64) << 32
    }
}

impl Default for FreeLinks {
    /// On no list.
    fn default() -> Self {
        Self {
            prev: Link::NONE,
            next: Link::NONE,
        }
    }
}

/// A store of segments that the free lists link through. Each free-list operation
/// reaches a segment once, through one of these.
pub(crate) trait FreeSegments {
    /// The extent, state and list links of the live segment `link` names, or `None`
    /// for [`Link::NONE`].
    fn free_entry(&self, link: Link) -> Option<(u64, SegmentState, FreeLinks)>;

    /// The state and list links of the live segment `link` names, or `None` for
    /// [`Link::NONE`].
    fn free_entry_mut(&mut self, link: Link) -> Option<(&mut SegmentState, &mut FreeLinks)>;
}

/// Puts free segment `index`, on no list, first on the list that starts at `head`,
/// in state `state` (the list's); the list then starts at `index`.
#[inline(always)]
pub(crate) fn push_front<S: FreeSegments>(
    segments: &mut S,
    head: Link,
    index: SegmentIndex,
    state: SegmentState,
) {
    if let Some((listed, links)) = segments.free_entry_mut(Link::to(index)) {
        *listed = state;
        *links = FreeLinks {
            prev: Link::NONE,
            next: head,
        };
    }
    if let Some((_, head)) = segments.free_entry_mut(head) {
        head.prev = Link::to(index);
    }
}

/// Takes listed segment `index` off its list (its state stays the list's). Returns
/// that state, the list's new first segment when `index` was first (the caller's head
/// to set), and its neighbours on the list before (the list's new last segment is the
/// one before it, when it was last).
#[inline(always)]
fn unlink<S: FreeSegments>(
    segments: &mut S,
    index: SegmentIndex,
) -> (SegmentState, Option<Link>, FreeLinks) {
    let Some((_, state, links)) = segments.free_entry(Link::to(index)) else {
        return (SegmentState::VACANT, None, FreeLinks::default());
    };
    let FreeLinks { prev, next } = links;
    if let Some((_, after)) = segments.free_entry_mut(next) {
        after.prev = prev;
    }
    match segments.free_entry_mut(prev) {
        Some((_, before)) => {
            before.next = next;
            (state, None, links)
        }
        None => (state, Some(next), links),
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
    let (mut cursor, mut before, mut count) = (head, Link::NONE, 0usize);
    while cursor.is_some() {
        let (_, listed, links) = segments
            .free_entry(cursor)
            .ok_or_else(|| format!("the free list of {state:?} links to a dead segment"))?;
        count += 1;
        if count > most {
            return Err(format!("the free list of {state:?} loops"));
        }
        if listed != state {
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
// The second level of the bitmap is a `u8`, one bit a word; classes and the four
// other states fit a `u16` (`SegmentState`); `class_of` masks with `CLASSES - 1`.
const _: () = assert!(WORDS <= 8 && CLASSES + 4 <= u16::MAX as usize && CLASSES.is_power_of_two());

/// The size class of `size`: exact below 8, then eight classes per power of two.
/// Always below `CLASSES` (the mask only tells the compiler so). From 8 on the
/// exponent is 3 to 63, so the wrapping arithmetic below never wraps (it spares the
/// hot paths of both pools the overflow checks of the build).
#[inline]
pub(crate) fn class_of(size: u64) -> usize {
    if size < 8 {
        return size as usize;
    }
    let exponent = 63 - u64::from(size.leading_zeros());
    let mantissa = (size >> exponent.wrapping_sub(3)) & 7;
    (exponent
        .wrapping_sub(2)
        .wrapping_mul(8)
        .wrapping_add(mantissa)) as usize
        & (CLASSES - 1)
}

/// How many times a request the segments of a larger class must all exceed for
/// [`FreeHeads::find_sparing_recent`] to take the class's member listed longest ago:
/// a request this small is negligible against the segment it splits (a per-channel
/// statistic beside an activation: their ratio is the activation's token count, 768 in
/// `calibrate-layers`), so where it goes costs it nothing, while the segment freed
/// last is the one a recurring tensor of that size fits. Chosen on ten variants of
/// `calibrate-layers` (`virtual_tradeoff.py --variants`): every power of two from 2
/// to 256 mends them (1,024 does not: their ratios lie between 570 and 1,040); 2 to
/// 128 also move other traces' figures, both ways, by up to 0.03 on single variants,
/// and 256 moves only spec-decode's (up) and unet-diffusion's (down by 0.001)
/// besides, and no trace's utilization or storage calls as recorded.
pub(crate) const SPARE_RATIO: u64 = 256;

/// Whether every size of `class` is more than [`SPARE_RATIO`] times `extent`: then
/// [`FreeHeads::find_sparing_recent`] takes the class's member listed longest ago.
#[inline(always)]
pub(crate) fn spares_recent(class: usize, extent: u64) -> bool {
    class_bounds(class).is_some_and(|(low, _)| extent.saturating_mul(SPARE_RATIO) < low)
}

/// The smallest size of the class of `size` ([`class_of`]): `size` with the bits below
/// its three mantissa bits cleared (every size below 16 is a class of its own). A
/// shift, where [`class_bounds`] of the class takes its exponent apart again.
#[inline(always)]
pub(crate) fn class_floor(size: u64) -> u64 {
    // `| 1`: 0 is a class of its own too, and has a highest bit then.
    let shift = (63 - (size | 1).leading_zeros()).saturating_sub(3);
    size >> shift << shift
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
    /// Invariant: `tails[c]` names the last segment of class `c`'s list (the one
    /// listed longest ago), and is [`Link::NONE`] exactly when `heads[c]` is.
    tails: Box<[Link; CLASSES]>,
    /// Invariant: bit `c` is set exactly when `heads[c]` names a segment.
    bitmap: [u64; WORDS],
    /// Invariant: bit `w` is set exactly when `bitmap[w]` is non-zero (the second
    /// level, so a search finds the next non-empty class in two steps).
    words: u8,
}

impl Default for FreeHeads {
    fn default() -> Self {
        Self {
            heads: Box::new([Link::NONE; CLASSES]),
            tails: Box::new([Link::NONE; CLASSES]),
            bitmap: [0; WORDS],
            words: 0,
        }
    }
}

impl FreeHeads {
    /// The first segment of `class`.
    #[inline(always)]
    pub(crate) fn head(&self, class: usize) -> Link {
        self.heads[class & (CLASSES - 1)]
    }

    /// Makes `index` ([`Link::NONE`] for an empty class) the first segment of
    /// `class`.
    #[inline(always)]
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
    #[inline(always)]
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

    /// Puts free segment `index`, on no list, first on the list of `class`.
    #[inline(always)]
    pub(crate) fn push<S: FreeSegments>(
        &mut self,
        segments: &mut S,
        class: usize,
        index: SegmentIndex,
    ) {
        let head = self.head(class);
        push_front(segments, head, index, SegmentState::listed(class));
        if head.is_none() {
            self.tails[class & (CLASSES - 1)] = Link::to(index);
        }
        self.set_head(class, Link::to(index));
    }

    /// Takes listed segment `index` off its list. A segment not on a class's list
    /// (a whole free page, on the sliced pool's list of its own) is taken off its
    /// list too; when it was first there, the list's new first segment is returned,
    /// for the caller to keep.
    #[inline(always)]
    pub(crate) fn remove<S: FreeSegments>(
        &mut self,
        segments: &mut S,
        index: SegmentIndex,
    ) -> Option<Link> {
        let (state, head, links) = unlink(segments, index);
        let Some(class) = state.class() else {
            return head;
        };
        if links.next.is_none() {
            // The last of its class: the one before it is the last now.
            self.tails[class] = links.prev;
        }
        if let Some(head) = head {
            self.set_head(class, head);
        }
        None
    }

    /// A listed free segment of at least `extent` bytes: one of the first
    /// [`OWN_CLASS_PROBES`] of the request's own class that fits, else the first of
    /// the smallest larger class (`None` when no listed segment fits).
    #[inline]
    pub(crate) fn find<S: FreeSegments>(&self, segments: &S, extent: u64) -> Option<SegmentIndex> {
        let class = class_of(extent);
        if let Some(found) = self.probe_own_class(segments, class, extent) {
            return Some(found);
        }
        // The bitmap's invariant: the head of a class with its bit set names a segment.
        self.first_from(class + 1)
            .map(|larger| self.head(larger).followed())
    }

    /// As [`FreeHeads::find`], except that when every member of the larger class it
    /// takes from is more than [`SPARE_RATIO`] times `extent` ([`spares_recent`]), it
    /// takes the last member, the one listed longest ago, instead of the first.
    ///
    /// Why: a block placed in a segment leaves a rest that no longer holds what the
    /// segment held. Iterative workloads free a tensor and soon reserve one of the same
    /// size again (the next batch's or the next layer's activation), and the segment
    /// freed last is the one such a request fits exactly. Taking it for a negligible
    /// request (a per-channel statistic kept across batches) pins a hole just too
    /// small for the next activation, which then lands on new granules: on variants of
    /// layer-wise calibration (`benches/python/virtual_tradeoff.py --variants`) the
    /// holes freed last went this way batch after batch, and the default fell to 0.059
    /// below `torch_expandable` (model). The segment listed longest ago is the one the
    /// workload has come back for least. A request nearer the class's sizes keeps the
    /// first member: it may well be the tensor that segment held, come back, and
    /// taking the oldest for it moved other traces' figures both ways (see
    /// [`SPARE_RATIO`]).
    ///
    /// A request that is not negligible takes the first member (freed or cut last)
    /// unless one of the [`OWN_CLASS_PROBES`] - 1 after it is no larger than the rest
    /// splitting the first would leave, then the smallest such: a member already cut
    /// to that size, where the first may be a hole freed whole, which the tensor of its
    /// size comes back for. Splitting the cut member instead leaves the same kind of
    /// rest and keeps the whole hole. Found on a Mamba-style model whose recurrence
    /// runs a step per token (`benches/traces/ssm-train`): each step's small
    /// temporaries (1/16 of a hole) split the hole a recurring state tensor had just
    /// freed while rests cut from the same holes sat behind it on the list, and with
    /// sizes varied and scaled 4 to 128 times (a GPU's scale) the default fell up to
    /// 0.089 below `torch_expandable` (model) on 16 of 84 replays; with this rule on
    /// none. Of the 41 traces held before, as captured, one's utilization moved (a
    /// wider capture, 0.003 down; `benches/traces/README.md`). A member alone in its
    /// class is taken without being read (either rule takes it), and the walk is taken
    /// only when the rest can be as small as a member of the class (the class's
    /// smallest size, off the first member's): the replays of the shared traces run
    /// 0.5-0.9 % fewer instructions than before the rule (1.1-1.6 % more without the
    /// first shortcut; callgrind), the FIFO step of `examples/peer_loops.rs` the same
    /// and its steady state's 0.3 % more.
    #[inline]
    pub(crate) fn find_sparing_recent<S: FreeSegments>(
        &self,
        segments: &S,
        extent: u64,
    ) -> Option<SegmentIndex> {
        let class = class_of(extent);
        if let Some(found) = self.probe_own_class(segments, class, extent) {
            return Some(found);
        }
        // The bitmap's invariant: the head (and so the tail) of a class with its bit
        // set names a segment.
        self.first_from(class + 1)
            .map(|larger| self.split_member(segments, larger, extent))
    }

    /// The member of larger class `class` (which has one) that a request of `extent`
    /// bytes splits: the last when the request spares the recent
    /// ([`spares_recent`]), else the first, unless one of the [`OWN_CLASS_PROBES`] - 1
    /// after it is no larger than what splitting the first would leave; then the
    /// smallest such, the first listed among equals.
    #[inline(always)]
    fn split_member<S: FreeSegments>(
        &self,
        segments: &S,
        class: usize,
        extent: u64,
    ) -> SegmentIndex {
        let first = self.head(class);
        // A member alone: taken whichever way (no read of it here).
        if self.tails[class] == first {
            return first.followed();
        }
        let Some((size, _, links)) = segments.free_entry(first) else {
            return first.followed();
        };
        // The class's smallest size, off its first member (what `spares_recent` finds
        // from the class).
        let low = class_floor(size);
        if extent.saturating_mul(SPARE_RATIO) < low {
            return self.tails[class].followed();
        }
        // Every member of a larger class holds the request: the rest does not wrap.
        let (mut bound, mut taken) = (size.wrapping_sub(extent), first.followed());
        // A rest below the class's sizes: no member is that small (no walk).
        if bound < low {
            return taken;
        }
        let mut cursor = links.next;
        for _ in 1..OWN_CLASS_PROBES {
            let Some((size, _, links)) = segments.free_entry(cursor) else {
                break;
            };
            if size <= bound {
                (bound, taken) = (size.wrapping_sub(1), cursor.followed());
            }
            cursor = links.next;
        }
        taken
    }

    /// One of the first [`OWN_CLASS_PROBES`] members of `class` that holds `extent`
    /// bytes, if any.
    #[inline(always)]
    fn probe_own_class<S: FreeSegments>(
        &self,
        segments: &S,
        class: usize,
        extent: u64,
    ) -> Option<SegmentIndex> {
        let mut cursor = self.head(class);
        for _ in 0..OWN_CLASS_PROBES {
            let (found, _, links) = segments.free_entry(cursor)?;
            if found >= extent {
                return Some(cursor.followed());
            }
            cursor = links.next;
        }
        None
    }

    /// The last segment of `class` ([`Link::NONE`] for an empty class).
    #[inline(always)]
    pub(crate) fn tail(&self, class: usize) -> Link {
        self.tails[class & (CLASSES - 1)]
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
            // The tail is the list's last member.
            let tail = self.tail(class);
            let last = match segments.free_entry(tail) {
                Some((_, _, links)) => links.next.is_none(),
                None => self.head(class).is_none(),
            };
            let listed_here = segments
                .free_entry(tail)
                .is_none_or(|(_, state, _)| state == SegmentState::listed(class));
            if !last || !listed_here {
                return Err(format!("the tail of class {class} is not its last member"));
            }
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

    /// The floor of a size's class is the class's smallest size, found by a shift: on
    /// every size to 2^16, and around every power of two and class edge above.
    #[test]
    fn class_floor_is_the_smallest_size_of_the_class() {
        let edges = (4..64).flat_map(|exponent| {
            (0u64..8).flat_map(move |mantissa| {
                let low = (8 + mantissa) << (exponent - 3);
                [low - 1, low, low + 1]
            })
        });
        for size in (0..1 << 16).chain(edges).chain([u64::MAX]) {
            let class = class_of(size);
            let (low, high) = class_bounds(class).expect("a class of sizes");
            assert_eq!(class_floor(size), low, "size {size}, class {class}");
            assert!(low <= size && size <= high);
        }
    }

    /// A used segment's links hold the bytes asked for, every `u64` back whole.
    #[test]
    fn free_links_hold_any_size() {
        for value in [
            0,
            1,
            64,
            u64::from(u32::MAX),
            1 << 32,
            (1 << 40) + 3,
            u64::MAX,
        ] {
            assert_eq!(FreeLinks::holding(value).held(), value);
        }
    }

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
    fn a_link_is_an_index_or_none_and_none_is_past_every_store() {
        let index = index_at(7);
        assert_eq!(Link::to(index).get(), Some(index));
        assert_eq!(Link::to(index).position(), 7);
        assert!(Link::NONE.is_none() && Link::NONE.get().is_none());
        assert!(Link::NONE.position() >= u32::MAX as usize);
        assert_eq!(SegmentIndex::new(u32::MAX), None, "u32::MAX is no index");
        let mut link = Link::to(index);
        assert_eq!(link.take(), Some(index));
        assert!(link.is_none());
        assert_eq!(std::mem::size_of::<Link>(), 4);
    }

    #[test]
    fn a_segment_state_decodes_to_what_it_was_made_as() {
        let named = [
            (SegmentState::USED, StateView::Used),
            (SegmentState::DEFERRED, StateView::Deferred),
            (SegmentState::WHOLE_PAGE, StateView::WholePage),
            (SegmentState::VACANT, StateView::Vacant),
        ];
        for (state, view) in named {
            assert_eq!(state.view(), view);
            assert_eq!(state.class(), None, "{view:?} is on no class's list");
            assert_eq!(state.is_listed(), view == StateView::WholePage);
        }
        for class in 0..CLASSES {
            let state = SegmentState::listed(class);
            assert_eq!(state.view(), StateView::Listed(class));
            assert_eq!(state.class(), Some(class));
            assert!(state.is_listed());
            assert!(
                named.iter().all(|&(other, _)| other != state),
                "class {class}"
            );
        }
        assert_eq!(format!("{:?}", SegmentState::listed(9)), "Listed(9)");
        assert_eq!(std::mem::size_of::<SegmentState>(), 2);
    }

    #[test]
    fn a_followed_link_and_a_stored_position_are_the_index_they_name() {
        let index = index_at(41);
        assert_eq!(Link::to(index).followed(), index);
        assert_eq!(SegmentIndex::stored(41), index);
    }

    #[test]
    fn first_from_finds_the_next_class_with_a_head() {
        let mut heads = FreeHeads::default();
        assert_eq!(heads.first_from(0), None);
        let [one, two, three] = [1, 2, 3].map(index_at);
        heads.set_head(class_of(1000), Link::to(one));
        heads.set_head(class_of(5000), Link::to(two));
        heads.set_head(300, Link::to(three));
        assert_eq!(heads.first_from(class_of(1000)), Some(class_of(1000)));
        assert_eq!(heads.first_from(class_of(1000) + 1), Some(class_of(5000)));
        assert_eq!(
            heads.first_from(class_of(5000) + 1),
            Some(300),
            "across words"
        );
        assert_eq!(heads.first_from(301), None);
        heads.set_head(class_of(5000), Link::NONE);
        assert_eq!(heads.first_from(class_of(1000) + 1), Some(300));
        heads.set_head(300, Link::NONE);
        assert_eq!(heads.first_from(class_of(1000) + 1), None);
        assert_eq!(heads.head(class_of(1000)), Link::to(one));
        heads.check().unwrap();
    }
}
