//! Python's `random.random()` in Rust: the Mersenne Twister MT19937 continued from a
//! state that `random.Random.getstate()` gives, drawing the same doubles in the same
//! order, so a planner can draw millions of them without a Python loop and still make
//! the replica a seed has always made.
//!
//! The generator and its tempering are those of Matsumoto and Nishimura's reference
//! `mt19937ar.c`, which CPython's `_randommodule.c` copies; a double is
//! `genrand_res53()`: 27 and 26 high bits of two outputs, as CPython draws it.

use thiserror::Error;

/// Words of the generator's state.
pub const STATE_WORDS: usize = 624;
const SHIFT: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER: u32 = 0x8000_0000;
const LOWER: u32 = 0x7fff_ffff;

/// Why a state is not one the generator can continue from.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum TwisterStateError {
    /// Not 624 words and a position, as `getstate()[1]` holds.
    #[error(
        "a Mersenne Twister state is {expected} numbers (624 words and a position), got {got}"
    )]
    Length {
        /// 625.
        expected: usize,
        /// What was given.
        got: usize,
    },
    /// A position past the state's words.
    #[error("the state's position is {0}, but at most 624")]
    Position(u64),
}

/// A Mersenne Twister continued from a saved state.
///
/// Invariant: `index <= STATE_WORDS`; at `STATE_WORDS` the next draw regenerates the
/// words first.
#[derive(Clone)]
pub struct Twister {
    words: [u32; STATE_WORDS],
    index: usize,
}

impl Twister {
    /// The generator whose state is `state`: 624 words then the position, as in
    /// Python's `random.Random().getstate()[1]`.
    pub fn from_python_state(state: &[u32]) -> Result<Self, TwisterStateError> {
        let Some((&position, words)) = state.split_last() else {
            return Err(TwisterStateError::Length {
                expected: STATE_WORDS + 1,
                got: 0,
            });
        };
        let words: [u32; STATE_WORDS] =
            words.try_into().map_err(|_| TwisterStateError::Length {
                expected: STATE_WORDS + 1,
                got: state.len(),
            })?;
        let index = position as usize;
        if index > STATE_WORDS {
            return Err(TwisterStateError::Position(u64::from(position)));
        }
        Ok(Self { words, index })
    }

    /// The next 32 random bits (`genrand_uint32`).
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= STATE_WORDS {
            self.regenerate();
        }
        let mut y = self.words[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// The next double in [0, 1) with 53 random bits, as Python's `random()`.
    pub fn next_f64(&mut self) -> f64 {
        let a = self.next_u32() >> 5;
        let b = self.next_u32() >> 6;
        (f64::from(a) * 67_108_864.0 + f64::from(b)) * (1.0 / 9_007_199_254_740_992.0)
    }

    fn regenerate(&mut self) {
        let twist = |upper: u32, lower: u32, far: u32| {
            let y = (upper & UPPER) | (lower & LOWER);
            far ^ (y >> 1) ^ if y & 1 == 1 { MATRIX_A } else { 0 }
        };
        for k in 0..STATE_WORDS {
            let next = self.words[(k + 1) % STATE_WORDS];
            let far = self.words[(k + SHIFT) % STATE_WORDS];
            self.words[k] = twist(self.words[k], next, far);
        }
        self.index = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `init_genrand(seed)` of the reference code, as a saved state at position 624.
    fn seeded(seed: u32) -> Twister {
        let mut words = [0u32; STATE_WORDS];
        words[0] = seed;
        for i in 1..STATE_WORDS {
            let prev = words[i - 1];
            words[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        let mut state = words.to_vec();
        state.push(STATE_WORDS as u32);
        Twister::from_python_state(&state).unwrap()
    }

    #[test]
    fn draws_the_reference_outputs() {
        // The first outputs of mt19937ar.c after init_genrand(5489), its default seed.
        let mut twister = seeded(5489);
        let first: Vec<u32> = (0..3).map(|_| twister.next_u32()).collect();
        assert_eq!(first, vec![3_499_211_612, 581_869_302, 3_890_346_734]);
        // The 10,000th output, a check over many regenerations (C++ std::mt19937).
        let mut twister = seeded(5489);
        let tenth_thousand = (0..10_000).map(|_| twister.next_u32()).last();
        assert_eq!(tenth_thousand, Some(4_123_659_995));
    }

    #[test]
    fn doubles_lie_in_the_unit_interval() {
        let mut twister = seeded(1);
        assert!((0..10_000)
            .map(|_| twister.next_f64())
            .all(|x| (0.0..1.0).contains(&x)));
    }

    #[test]
    fn refuses_states_that_are_not_ones() {
        assert_eq!(
            Twister::from_python_state(&[1, 2]).err(),
            Some(TwisterStateError::Length {
                expected: 625,
                got: 2
            })
        );
        let mut state = vec![0u32; STATE_WORDS];
        state.push(625);
        assert_eq!(
            Twister::from_python_state(&state).err(),
            Some(TwisterStateError::Position(625))
        );
        assert!(Twister::from_python_state(&[]).is_err());
    }
}
