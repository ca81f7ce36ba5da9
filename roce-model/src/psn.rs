//! 24-bit packet sequence numbers with wrapping arithmetic (IBA 9.7.1, rxe `psn_compare`).
//!
//! PSNs live on a circle of 2²⁴ values; comparisons are only meaningful
//! within ±2²³ of each other, so [`Psn`] deliberately does not implement
//! `Ord`: use [`Psn::cmp_wrapping`] / [`psn_compare`].

use core::cmp::Ordering;

/// Mask of the 24 PSN bits.
pub const PSN_MASK: u32 = 0x00ff_ffff;

/// Wrapping compare as in rxe: `((a - b) << 8) as i32`. Negative if `a` is
/// before `b`, zero if equal, positive if after (within a window of ±2²³).
pub const fn psn_compare(a: u32, b: u32) -> i32 {
    (a.wrapping_sub(b) << 8) as i32
}

/// A 24-bit PSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// Wrap `v` to 24 bits.
    pub const fn new(v: u32) -> Psn {
        Psn(v & PSN_MASK)
    }
    /// The raw 24-bit value.
    pub const fn value(self) -> u32 {
        self.0
    }
    /// `self + n` modulo 2²⁴.
    pub const fn add(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_add(n))
    }
    /// `self - n` modulo 2²⁴.
    pub const fn sub(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_sub(n))
    }
    /// The next PSN.
    pub const fn next(self) -> Psn {
        self.add(1)
    }
    /// Signed distance `self - other` in the range `-2²³ ..= 2²³ - 1`.
    pub const fn diff(self, other: Psn) -> i32 {
        psn_compare(self.0, other.0) >> 8
    }
    /// Wrapping comparison (see [`psn_compare`]).
    pub fn cmp_wrapping(self, other: Psn) -> Ordering {
        psn_compare(self.0, other.0).cmp(&0)
    }
    /// Is `self` strictly before `other`?
    pub const fn is_before(self, other: Psn) -> bool {
        psn_compare(self.0, other.0) < 0
    }
    /// Is `self` strictly after `other`?
    pub const fn is_after(self, other: Psn) -> bool {
        psn_compare(self.0, other.0) > 0
    }
    /// Number of packets (PSNs) a message of `len` bytes uses at `pmtu`:
    /// `max(1, ceil(len / pmtu))` — also what an RDMA READ request consumes.
    pub const fn packets_for(len: u64, pmtu: u32) -> u32 {
        if len == 0 || pmtu == 0 {
            1
        } else {
            len.div_ceil(pmtu as u64) as u32
        }
    }
}

impl From<Psn> for u32 {
    fn from(p: Psn) -> u32 {
        p.0
    }
}

impl core::fmt::Display for Psn {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps() {
        let top = Psn::new(PSN_MASK);
        assert_eq!(top.next(), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), top);
        assert_eq!(Psn::new(0x1_000_005).value(), 5);
        assert!(top.is_before(Psn::new(0)));
        assert!(Psn::new(0).is_after(top));
        assert_eq!(Psn::new(3).diff(top), 4);
        assert_eq!(top.diff(Psn::new(3)), -4);
        assert_eq!(Psn::new(7).cmp_wrapping(Psn::new(7)), Ordering::Equal);
    }

    #[test]
    fn window_edges() {
        let a = Psn::new(0);
        // 2^23 - 1 ahead is "after", 2^23 ahead flips to "before".
        assert!(a.add((1 << 23) - 1).is_after(a));
        assert!(a.add(1 << 23).is_before(a));
        assert_eq!(a.add((1 << 23) - 1).diff(a), (1 << 23) - 1);
        assert_eq!(a.add(1 << 23).diff(a), -(1 << 23));
        // psn_compare ignores bits above 24.
        assert_eq!(psn_compare(0x0100_0001, 1), 0);
    }

    #[test]
    fn antisymmetric_sample() {
        for &(x, y) in &[
            (0u32, 1u32),
            (5, 0xff_fff0),
            (0x80_0000, 0x7f_ffff),
            (123, 123),
        ] {
            let (a, b) = (Psn::new(x), Psn::new(y));
            if a.diff(b) != -(1 << 23) {
                assert_eq!(a.cmp_wrapping(b), b.cmp_wrapping(a).reverse());
            }
        }
    }

    #[test]
    fn packet_counts() {
        assert_eq!(Psn::packets_for(0, 1024), 1);
        assert_eq!(Psn::packets_for(1, 1024), 1);
        assert_eq!(Psn::packets_for(1024, 1024), 1);
        assert_eq!(Psn::packets_for(1025, 1024), 2);
        assert_eq!(Psn::packets_for(1 << 31, 4096), 1 << 19);
    }
}
