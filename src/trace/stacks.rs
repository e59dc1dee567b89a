//! The allocation stack frames of a trace's allocations, where its source had them
//! (a PyTorch snapshot's `frames` per trace entry).
//!
//! Stacks repeat (one line of a training step allocates the same way every step), so a
//! trace keeps each distinct stack once and, per allocation, the index of its stack.
//! In the v1 format an allocation line carries its stack as an optional `frames` list of
//! strings, innermost frame first; readers that predate the field pass over it.

use std::collections::HashMap;

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
/// and none is empty.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stacks {
    stacks: Vec<Vec<String>>,
    of: Vec<u32>,
}

impl Stacks {
    /// The stack of allocation `id`, innermost frame first; None when it has none.
    pub fn get(&self, id: u32) -> Option<&[String]> {
        let index = *self.of.get(id as usize)?;
        self.stacks.get(index as usize).map(Vec::as_slice)
    }

    /// Whether no allocation has a stack.
    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }

    /// The distinct stacks.
    pub fn distinct(&self) -> usize {
        self.stacks.len()
    }

    /// The stacks of the first `allocations` allocations (the stacks no longer used
    /// are kept: they cost nothing a reader sees).
    pub fn prefix(&self, allocations: usize) -> Stacks {
        let of: Vec<u32> = self.of.iter().copied().take(allocations).collect();
        if of.iter().all(|&index| index == NONE) {
            return Stacks::default();
        }
        Stacks {
            stacks: self.stacks.clone(),
            of,
        }
    }
}

/// Builds [`Stacks`] one allocation at a time, keeping each distinct stack once.
#[derive(Debug, Default)]
pub struct StacksBuilder {
    stacks: Stacks,
    index: HashMap<Vec<String>, u32>,
}

impl StacksBuilder {
    /// Records the stack of the next allocation, `id` (allocations come in id order):
    /// `frames` cut to [`MAX_FRAMES`] frames of [`MAX_FRAME_CHARS`] characters; no stack
    /// for None or an empty list.
    pub fn push(&mut self, id: u32, frames: Option<Vec<String>>) {
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
        let next = self.stacks.stacks.len() as u32;
        let index = *self.index.entry(frames).or_insert_with_key(|frames| {
            self.stacks.stacks.push(frames.clone());
            next
        });
        self.stacks.of.push(index);
    }

    /// The stacks of `allocations` allocations.
    pub fn finish(mut self, allocations: usize) -> Stacks {
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
        let long = &stacks.get(1).unwrap()[0];
        assert_eq!(long.chars().count(), MAX_FRAME_CHARS + 3);
        assert!(long.ends_with("..."));
    }
}
