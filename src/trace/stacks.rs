//! The allocation stack frames of a trace's allocations, where its source had them
//! (a PyTorch snapshot's `frames` per trace entry).
//!
//! Stacks repeat (one line of a training step allocates the same way every step), and
//! so do frames (every stack of a step starts in the same few functions), so a trace
//! keeps each distinct frame once, each distinct stack once as the indices of its
//! frames, and, per allocation, the index of its stack. A stack of 64 frames of 240
//! characters costs 256 bytes more than the frames it shares with others: a snapshot
//! whose every entry picks its 64 frames from two long ones (130 bytes of pickle an
//! entry, through its memo) made 30 KB of strings an entry when each stack kept its own
//! (5.3 GB for a 22 MB pickle of 60,000 entries).
//! In the v1 format an allocation line carries its stack as an optional `frames` list of
//! strings, innermost frame first; readers that predate the field pass over it.

use std::collections::HashMap;
use std::sync::Arc;

/// The most frames kept per stack (the innermost ones); a stack deeper than this is cut.
pub const MAX_FRAMES: usize = 64;
/// The most characters kept per frame; a longer frame is cut and ends in `...`.
pub const MAX_FRAME_CHARS: usize = 240;

/// What `of` holds for an allocation without a stack.
const NONE: u32 = u32::MAX;

/// The stacks of a trace's allocations.
///
/// Invariants: `of` is empty (no allocation has a stack) or has one entry per
/// allocation; every entry is `NONE` or an index into `stacks`; the stacks are distinct
/// and none is empty; every index in a stack is one of `frames`, which are distinct.
/// The frames and the stacks are shared with the traces made from this one (a prefix, a
/// variant), which differ in `of` only.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stacks {
    frames: Arc<Vec<Arc<str>>>,
    stacks: Arc<Vec<Vec<u32>>>,
    of: Vec<u32>,
}

impl Stacks {
    /// The stack of allocation `id`, innermost frame first; None when it has none.
    pub fn get(&self, id: u32) -> Option<Vec<&str>> {
        let index = *self.of.get(id as usize)?;
        let stack = self.stacks.get(index as usize)?;
        Some(
            stack
                .iter()
                .map(|&frame| &*self.frames[frame as usize])
                .collect(),
        )
    }

    /// Whether no allocation has a stack.
    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }

    /// The distinct stacks.
    pub fn distinct(&self) -> usize {
        self.stacks.len()
    }

    /// The distinct frames of all stacks.
    pub fn distinct_frames(&self) -> usize {
        self.frames.len()
    }

    /// The stacks of the first `allocations` allocations (the stacks no longer used
    /// are kept: they cost nothing a reader sees).
    pub fn prefix(&self, allocations: usize) -> Stacks {
        self.with_of(self.of.iter().copied().take(allocations).collect())
    }

    /// The stacks of a variant's allocations, allocation `i` made where allocation
    /// `sources[i]` of this trace was (the stacks no longer used are kept, as in
    /// [`Stacks::prefix`]).
    pub(crate) fn of_allocations(&self, sources: &[u32]) -> Stacks {
        if self.of.is_empty() {
            return Stacks::default();
        }
        self.with_of(
            sources
                .iter()
                .map(|&source| self.of.get(source as usize).copied().unwrap_or(NONE))
                .collect(),
        )
    }

    /// These frames and stacks with `of` (indices into them) as the allocations'
    /// stacks; none where no allocation has one.
    fn with_of(&self, of: Vec<u32>) -> Stacks {
        if of.iter().all(|&index| index == NONE) {
            return Stacks::default();
        }
        Stacks {
            frames: Arc::clone(&self.frames),
            stacks: Arc::clone(&self.stacks),
            of,
        }
    }
}

/// Builds [`Stacks`] one allocation at a time, keeping each distinct frame and each
/// distinct stack once.
#[derive(Debug, Default)]
pub(crate) struct StacksBuilder {
    stacks: Stacks,
    frame_index: HashMap<Arc<str>, u32>,
    index: HashMap<Vec<u32>, u32>,
}

impl StacksBuilder {
    /// Records the stack of the next allocation, `id` (allocations come in id order):
    /// `frames` cut to [`MAX_FRAMES`] frames of [`MAX_FRAME_CHARS`] characters; no stack
    /// for None or an empty list.
    pub(crate) fn push(&mut self, id: u32, frames: Option<Vec<String>>) {
        let frames = frames.map(cut).filter(|frames| !frames.is_empty());
        let Some(frames) = frames else {
            if !self.stacks.of.is_empty() {
                self.stacks.of.push(NONE);
            }
            return;
        };
        if self.stacks.of.is_empty() {
            self.stacks.of = vec![NONE; id as usize];
        }
        let stack: Vec<u32> = frames.into_iter().map(|frame| self.frame(frame)).collect();
        let next = self.stacks.stacks.len() as u32;
        let index = *self.index.entry(stack).or_insert_with_key(|stack| {
            // The builder's own: not shared until it finishes, so never copied here.
            Arc::make_mut(&mut self.stacks.stacks).push(stack.clone());
            next
        });
        self.stacks.of.push(index);
    }

    /// Records the stack of the next allocation, `id`, as that of the earlier allocation
    /// `like` (none where it has none).
    pub(crate) fn push_like(&mut self, id: u32, like: u32) {
        match self.stacks.of.get(like as usize) {
            Some(&index) if index != NONE => self.stacks.of.push(index),
            _ => self.push(id, None),
        }
    }

    /// The index of `frame` among the distinct frames, added if new.
    fn frame(&mut self, frame: String) -> u32 {
        if let Some(&index) = self.frame_index.get(frame.as_str()) {
            return index;
        }
        let index = self.stacks.frames.len() as u32;
        let frame: Arc<str> = frame.into();
        Arc::make_mut(&mut self.stacks.frames).push(Arc::clone(&frame));
        self.frame_index.insert(frame, index);
        index
    }

    /// The stacks of `allocations` allocations.
    pub(crate) fn finish(mut self, allocations: usize) -> Stacks {
        if !self.stacks.of.is_empty() {
            self.stacks.of.resize(allocations, NONE);
        }
        self.stacks
    }
}

/// `frames` within [`MAX_FRAMES`] and [`MAX_FRAME_CHARS`].
fn cut(mut frames: Vec<String>) -> Vec<String> {
    frames.truncate(MAX_FRAMES);
    for frame in &mut frames {
        if let Some((at, _)) = frame.char_indices().nth(MAX_FRAME_CHARS) {
            frame.truncate(at);
            frame.push_str("...");
        }
    }
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(names: &[&str]) -> Option<Vec<String>> {
        Some(names.iter().map(|n| n.to_string()).collect())
    }

    #[test]
    fn stacks_are_kept_once_and_found_by_id() {
        let mut builder = StacksBuilder::default();
        builder.push(0, None);
        builder.push(1, stack(&["f (a.py:1)", "g (b.py:2)"]));
        builder.push(2, Some(Vec::new()));
        builder.push(3, stack(&["f (a.py:1)", "g (b.py:2)"]));
        builder.push(4, stack(&["h (c.py:3)"]));
        let stacks = builder.finish(6);
        assert_eq!(stacks.distinct(), 2);
        assert_eq!(stacks.distinct_frames(), 3);
        assert_eq!(stacks.get(0), None);
        assert_eq!(stacks.get(1), stacks.get(3));
        assert_eq!(stacks.get(1).unwrap()[1], "g (b.py:2)");
        assert_eq!(stacks.get(2), None);
        assert_eq!(stacks.get(4).unwrap(), ["h (c.py:3)"]);
        assert_eq!(stacks.get(5), None);
        assert_eq!(stacks.get(99), None);
        assert_eq!(stacks.prefix(1), Stacks::default());
        assert_eq!(stacks.prefix(2).get(1), stacks.get(1));
    }

    #[test]
    fn frames_shared_by_stacks_are_kept_once() {
        let mut builder = StacksBuilder::default();
        let long = ["a".repeat(200), "b".repeat(200)];
        // Every allocation a stack of its own, of 64 frames drawn from two.
        for id in 0..100u32 {
            let frames = (0..64).map(|bit| long[((id >> (bit % 7)) & 1) as usize].clone());
            builder.push(id, Some(frames.collect()));
        }
        let stacks = builder.finish(100);
        assert_eq!(stacks.distinct_frames(), 2);
        assert!(stacks.distinct() > 50);
        let third = stacks.get(3).unwrap();
        assert_eq!(third.len(), 64);
        assert_eq!(third[0], long[1]);
        assert_eq!(third[2], long[0]);
    }

    #[test]
    fn no_stack_at_all_keeps_nothing() {
        let mut builder = StacksBuilder::default();
        builder.push(0, None);
        builder.push(1, None);
        let stacks = builder.finish(2);
        assert!(stacks.is_empty());
        assert_eq!(stacks, Stacks::default());
    }

    #[test]
    fn deep_stacks_and_long_frames_are_cut() {
        let mut builder = StacksBuilder::default();
        let deep: Vec<String> = (0..MAX_FRAMES + 5).map(|i| i.to_string()).collect();
        builder.push(0, Some(deep));
        builder.push(1, Some(vec!["é".repeat(MAX_FRAME_CHARS + 1)]));
        let stacks = builder.finish(2);
        assert_eq!(stacks.get(0).unwrap().len(), MAX_FRAMES);
        let long = stacks.get(1).unwrap()[0];
        assert_eq!(long.chars().count(), MAX_FRAME_CHARS + 3);
        assert!(long.ends_with("..."));
    }
}
