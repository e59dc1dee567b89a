//! Keyed BLAKE2s-256 (RFC 7693), the MAC of Disco's small frames.
//!
//! Disco's wire (`python/cubepool/disco/wire.py`) tags every frame of up to 64 KiB with
//! keyed BLAKE2s of `seq || payload` (`seq` as 8 big-endian bytes), 32-byte tags. Python's
//! `hashlib.blake2s` computes the same; this wrapper exists so that a worker can open a
//! frame (parse, tag, compare) in one call into the extension instead of a dozen Python
//! operations around `hashlib` (see `src/python/disco_frames.rs`). The hash itself is
//! RustCrypto's `blake2` crate (a MAC is no place for our own code); its output is
//! checked against RFC 7693's keyed test vectors here and against `hashlib.blake2s` for
//! random keys and messages in `tests/python/test_disco_wire.py`, and tags are compared
//! in constant time (`subtle`, through the crate's `verify_slice`).
//!
//! Invariant: [`KeyedBlake2s`] holds the hash's state after the key's block, never
//! updated; every tag of a non-empty message starts from a copy of it, so a tag of a
//! small frame (seq and payload within one 64-byte block) costs one compression, not the
//! two of the crate's MAC, which compresses the key block again for every message. The
//! empty message, where the key block is the last, takes the crate's MAC.

use blake2::digest::core_api::{Block, Buffer, UpdateCore, VariableOutputCore};
use blake2::digest::{CtOutput, KeyInit, Mac, Output};
use blake2::{Blake2sMac256, Blake2sVarCore};

/// Bytes of a tag (BLAKE2s-256's digest).
pub const TAG_BYTES: usize = 32;
/// The longest key BLAKE2s takes.
pub const MAX_KEY_BYTES: usize = 32;

/// Keyed BLAKE2s-256.
#[derive(Clone)]
pub struct KeyedBlake2s {
    /// The hash's state after the key's block (module invariant: never updated).
    after_key: Blake2sVarCore,
    /// The crate's MAC under the key, for the empty message.
    keyed: Blake2sMac256,
}

impl std::fmt::Debug for KeyedBlake2s {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The state is derived from the key: never printed.
        f.write_str("KeyedBlake2s { .. }")
    }
}

impl KeyedBlake2s {
    /// The MAC under `key` (1 to 32 bytes); None for a key of another length.
    pub fn new(key: &[u8]) -> Option<Self> {
        if key.is_empty() || key.len() > MAX_KEY_BYTES {
            return None;
        }
        let keyed = <Blake2sMac256 as KeyInit>::new_from_slice(key).ok()?;
        // RFC 7693 section 3.3: the key, zero-padded to a block, is the first block.
        let mut after_key = Blake2sVarCore::new_with_params(&[], &[], key.len(), TAG_BYTES);
        let mut block = Block::<Blake2sVarCore>::default();
        block[..key.len()].copy_from_slice(key);
        after_key.update_blocks(std::slice::from_ref(&block));
        Some(Self { after_key, keyed })
    }

    /// The tag of the message `head || body`, as the crate's constant-time output.
    fn over(&self, head: &[u8], body: &[u8]) -> CtOutput<Blake2sVarCore> {
        if head.is_empty() && body.is_empty() {
            let tag = self.keyed.clone().finalize().into_bytes();
            return CtOutput::new(tag);
        }
        let mut core = self.after_key.clone();
        let mut buffer = Buffer::<Blake2sVarCore>::default();
        buffer.digest_blocks(head, |blocks| core.update_blocks(blocks));
        buffer.digest_blocks(body, |blocks| core.update_blocks(blocks));
        let mut tag = Output::<Blake2sVarCore>::default();
        core.finalize_variable_core(&mut buffer, &mut tag);
        CtOutput::new(tag)
    }

    /// The tag of the message `head || body`.
    pub fn tag(&self, head: &[u8], body: &[u8]) -> [u8; TAG_BYTES] {
        self.over(head, body).into_bytes().into()
    }

    /// Whether `tag` is the tag of `head || body`, compared in constant time.
    pub fn verify(&self, head: &[u8], body: &[u8], tag: &[u8]) -> bool {
        tag.len() == TAG_BYTES
            && self.over(head, body)
                == CtOutput::new(Output::<Blake2sVarCore>::clone_from_slice(tag))
    }
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
        // in = "" (the empty message: the key block is the last).
        assert_eq!(
            hex(&mac.tag(&[], &[])),
            "48a8997da407876b3d79c0d92325ad3b89cbb754d86ab71aee047ad345fd2c49"
        );
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

    proptest::proptest! {
        /// The tag is the crate's own keyed MAC's (which compresses the key block for
        /// every message), for any key and message, the empty one included.
        #[test]
        fn the_tag_is_the_crates_mac(
            key in proptest::collection::vec(proptest::num::u8::ANY, 1..=32),
            message in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
        ) {
            let mut reference = <Blake2sMac256 as KeyInit>::new_from_slice(&key).unwrap();
            reference.update(&message);
            let expected: [u8; TAG_BYTES] = reference.finalize().into_bytes().into();
            proptest::prop_assert_eq!(KeyedBlake2s::new(&key).unwrap().tag(&message, &[]), expected);
        }
    }

    #[test]
    fn refuses_keys_it_cannot_take() {
        assert!(KeyedBlake2s::new(&[]).is_none());
        assert!(KeyedBlake2s::new(&[7; 33]).is_none());
        assert!(KeyedBlake2s::new(&[7; 32]).is_some());
    }

    #[test]
    fn verifies_its_own_tags_only() {
        let mac = KeyedBlake2s::new(b"key").unwrap();
        let tag = mac.tag(b"seq", b"payload");
        assert!(mac.verify(b"seq", b"payload", &tag));
        let mut flipped = tag;
        flipped[31] ^= 1;
        assert!(!mac.verify(b"seq", b"payload", &flipped));
        assert!(!mac.verify(b"seq", b"payloae", &tag));
        assert!(!mac.verify(b"seq", b"payload", &tag[..16]));
        assert!(!KeyedBlake2s::new(b"other")
            .unwrap()
            .verify(b"seq", b"payload", &tag));
    }
}
