//! Keyed BLAKE2s-256 (RFC 7693), the MAC of Disco's small frames.
//!
//! Disco's wire (`python/cubepool/disco/wire.py`) tags every frame of up to 64 KiB with
//! keyed BLAKE2s of `seq || payload` (`seq` as 8 big-endian bytes), 32-byte tags. Python's
//! `hashlib.blake2s` computes the same; this copy exists so that a worker can open a
//! frame (parse, tag, compare) in one call into the extension instead of a dozen Python
//! operations around `hashlib` (see `src/python/disco_frames.rs`). Its output is checked
//! against RFC 7693's test vector here and against `hashlib.blake2s` for random keys and
//! messages in `tests/python/test_disco_wire.py`.
//!
//! Invariant: [`KeyedBlake2s`] holds the state after the key block, which is never the
//! last block (a frame's message is at least its 8 bytes of `seq`), so every tag starts
//! from that state and compresses the message's blocks, the last one flagged final.

/// BLAKE2s's initialisation vector (SHA-256's).
const IV: [u32; 8] = [
    0x6A09_E667,
    0xBB67_AE85,
    0x3C6E_F372,
    0xA54F_F53A,
    0x510E_527F,
    0x9B05_688C,
    0x1F83_D9AB,
    0x5BE0_CD19,
];

/// The message schedule of BLAKE2s's ten rounds.
const SIGMA: [[usize; 16]; 10] = [
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
    [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3],
    [11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4],
    [7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8],
    [9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13],
    [2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9],
    [12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11],
    [13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10],
    [6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5],
    [10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0],
];

/// Bytes of a block.
const BLOCK: usize = 64;
/// Bytes of a tag (BLAKE2s-256's digest).
pub const TAG_BYTES: usize = 32;
/// The longest key BLAKE2s takes.
pub const MAX_KEY_BYTES: usize = 32;

/// The mixing function G on `v[a]`, `v[b]`, `v[c]`, `v[d]` with message words `x`, `y`.
#[inline(always)]
fn mix(v: &mut [u32; 16], [a, b, c, d]: [usize; 4], x: u32, y: u32) {
    v[a] = v[a].wrapping_add(v[b]).wrapping_add(x);
    v[d] = (v[d] ^ v[a]).rotate_right(16);
    v[c] = v[c].wrapping_add(v[d]);
    v[b] = (v[b] ^ v[c]).rotate_right(12);
    v[a] = v[a].wrapping_add(v[b]).wrapping_add(y);
    v[d] = (v[d] ^ v[a]).rotate_right(8);
    v[c] = v[c].wrapping_add(v[d]);
    v[b] = (v[b] ^ v[c]).rotate_right(7);
}

/// The compression function F: `block` into `h`, `counted` bytes so far (this block's
/// included), `last` for the final block.
fn compress(h: &mut [u32; 8], block: &[u8; BLOCK], counted: u64, last: bool) {
    let mut m = [0u32; 16];
    for (word, bytes) in m.iter_mut().zip(block.chunks_exact(4)) {
        *word = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    }
    let mut v = [0u32; 16];
    v[..8].copy_from_slice(h);
    v[8..].copy_from_slice(&IV);
    // The counter's two words (truncation intended: low, then high).
    v[12] ^= counted as u32;
    v[13] ^= (counted >> 32) as u32;
    if last {
        v[14] = !v[14];
    }
    // `& 15` lets the compiler see every index in range: no bounds checks in the rounds.
    let w = |i: usize| m[i & 15];
    for s in &SIGMA {
        mix(&mut v, [0, 4, 8, 12], w(s[0]), w(s[1]));
        mix(&mut v, [1, 5, 9, 13], w(s[2]), w(s[3]));
        mix(&mut v, [2, 6, 10, 14], w(s[4]), w(s[5]));
        mix(&mut v, [3, 7, 11, 15], w(s[6]), w(s[7]));
        mix(&mut v, [0, 5, 10, 15], w(s[8]), w(s[9]));
        mix(&mut v, [1, 6, 11, 12], w(s[10]), w(s[11]));
        mix(&mut v, [2, 7, 8, 13], w(s[12]), w(s[13]));
        mix(&mut v, [3, 4, 9, 14], w(s[14]), w(s[15]));
    }
    for i in 0..8 {
        h[i] ^= v[i] ^ v[i + 8];
    }
}

/// Keyed BLAKE2s-256, ready for messages of at least one byte (module invariant).
#[derive(Clone, Debug)]
pub struct KeyedBlake2s {
    /// The chaining state after the key block.
    keyed: [u32; 8],
}

impl KeyedBlake2s {
    /// The MAC under `key` (1 to 32 bytes); None for a key of another length.
    pub fn new(key: &[u8]) -> Option<Self> {
        if key.is_empty() || key.len() > MAX_KEY_BYTES {
            return None;
        }
        let mut h = IV;
        // Parameter block: digest length, key length, fanout 1, depth 1 (RFC 7693 2.5).
        h[0] ^= 0x0101_0000 ^ ((key.len() as u32) << 8) ^ TAG_BYTES as u32;
        let mut block = [0u8; BLOCK];
        block[..key.len()].copy_from_slice(key);
        compress(&mut h, &block, BLOCK as u64, false);
        Some(Self { keyed: h })
    }

    /// The tag of the message `head || body` (`head` non-empty, as the module requires).
    pub fn tag(&self, head: &[u8], body: &[u8]) -> [u8; TAG_BYTES] {
        let mut h = self.keyed;
        let mut block = [0u8; BLOCK];
        let mut filled = 0;
        let mut counted = BLOCK as u64;
        for mut part in [head, body] {
            while !part.is_empty() {
                if filled == BLOCK {
                    // A full block with more to come: not the last one.
                    counted += BLOCK as u64;
                    compress(&mut h, &block, counted, false);
                    filled = 0;
                }
                let take = part.len().min(BLOCK - filled);
                block[filled..filled + take].copy_from_slice(&part[..take]);
                filled += take;
                part = &part[take..];
            }
        }
        block[filled..].fill(0);
        counted += filled as u64;
        compress(&mut h, &block, counted, true);
        let mut out = [0u8; TAG_BYTES];
        for (bytes, word) in out.chunks_exact_mut(4).zip(h) {
            bytes.copy_from_slice(&word.to_le_bytes());
        }
        out
    }
}

/// Whether two tags are equal, in time that does not depend on where they differ.
pub fn tags_equal(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Keyed vectors (key 00..1f, message 00..(n-1), as the BLAKE2 reference's
    /// `blake2s-kat.txt` lists them; the same as `hashlib.blake2s` gives).
    #[test]
    fn matches_the_reference_keyed_vectors() {
        let key: Vec<u8> = (0..32).collect();
        let mac = KeyedBlake2s::new(&key).unwrap();
        let message: Vec<u8> = (0..=255).collect();
        // in = 00 (one byte).
        assert_eq!(
            hex(&mac.tag(&message[..1], &[])),
            "40d15fee7c328830166ac3f918650f807e7e01e177258cdc0a39b11f598066f1"
        );
        // in = 00..3f (64 bytes: exactly one block, the last).
        assert_eq!(
            hex(&mac.tag(&message[..8], &message[8..64])),
            "8975b0577fd35566d750b362b0897a26c399136df07bababbde6203ff2954ed4"
        );
        // in = 00..fe (255 bytes: blocks split between head and body anywhere).
        let expected = "3fb735061abc519dfe979e54c1ee5bfad0a9d858b3315bad34bde999efd724dd";
        for split in [1, 8, 63, 64, 65, 200] {
            assert_eq!(
                hex(&mac.tag(&message[..split], &message[split..255])),
                expected
            );
        }
    }

    proptest::proptest! {
        /// Where the message is split between `head` and `body` never changes the tag.
        #[test]
        fn the_split_does_not_change_the_tag(
            key in proptest::collection::vec(proptest::num::u8::ANY, 1..=32),
            message in proptest::collection::vec(proptest::num::u8::ANY, 1..300),
            split in 1usize..300,
        ) {
            let mac = KeyedBlake2s::new(&key).unwrap();
            let split = split.min(message.len());
            let whole = mac.tag(&message, &[]);
            proptest::prop_assert_eq!(mac.tag(&message[..split], &message[split..]), whole);
        }
    }

    #[test]
    fn refuses_keys_it_cannot_take() {
        assert!(KeyedBlake2s::new(&[]).is_none());
        assert!(KeyedBlake2s::new(&[7; 33]).is_none());
        assert!(KeyedBlake2s::new(&[7; 32]).is_some());
    }

    #[test]
    fn compares_tags_by_value() {
        assert!(tags_equal(&[1, 2, 3], &[1, 2, 3]));
        assert!(!tags_equal(&[1, 2, 3], &[1, 2, 4]));
        assert!(!tags_equal(&[1, 2, 3], &[1, 2]));
    }
}
