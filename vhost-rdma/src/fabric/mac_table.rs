//! The hash of the switch's MAC table ([`MacHashKey`]).

use std::collections::HashMap;

/// Multiplicative hashing of MAC addresses, keyed per process: the MAC
/// table is looked up twice per frame and SipHash showed in profiles; the
/// random key keeps a guest from choosing colliding addresses (the table
/// is also bounded by `[limits] mac-table`).
#[derive(Clone, Copy, Debug)]
pub struct MacHashKey(u64);

impl Default for MacHashKey {
    fn default() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(0);
        MacHashKey(h.finish() | 1)
    }
}

impl std::hash::BuildHasher for MacHashKey {
    type Hasher = MacHasher;
    fn build_hasher(&self) -> MacHasher {
        MacHasher(self.0)
    }
}

/// The hasher of [`MacHashKey`].
#[derive(Debug)]
pub struct MacHasher(u64);

impl std::hash::Hasher for MacHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn finish(&self) -> u64 {
        // Fold the high half in: the table indexes by the low bits.
        let m = u128::from(self.0) * 0xa076_1d64_78bd_642f;
        (m as u64) ^ ((m >> 64) as u64)
    }
}

pub(super) type MacTable = HashMap<[u8; 6], usize, MacHashKey>;
