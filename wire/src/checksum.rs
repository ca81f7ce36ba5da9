//! The Internet checksum (RFC 1071): one's-complement sums, folding, the IPv4
//! header checksum, TCP/UDP pseudo-headers over IPv4 and IPv6, and filling
//! the TCP/UDP checksum of a frame.
//!
//! Sums are kept unfolded in a `u64` ([`ones_sum`]) so that pieces (a
//! pseudo-header, a header, a payload) can be added in any order and folded
//! once ([`fold`]); [`finish`] folds and complements.

use std::net::Ipv6Addr;

use crate::l4::L4Proto;
use crate::parse::{parse, ParsedFrame, L3};

/// One's-complement sum of `data` as big-endian 16-bit words (an odd last
/// byte is the high byte of a word), added to `acc`. Not folded.
pub fn ones_sum(data: &[u8], mut acc: u64) -> u64 {
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        // Summing the 32-bit halves of big-endian words keeps the carries in
        // the upper bits; 2^16 = 1 modulo 0xffff, so folding gives the same
        // result as summing 16-bit words.
        let v = u64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        acc = acc.wrapping_add(v >> 32).wrapping_add(v & 0xffff_ffff);
    }
    let rest = chunks.remainder();
    let mut pairs = rest.chunks_exact(2);
    for c in &mut pairs {
        acc += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = pairs.remainder() {
        acc += u64::from(*last) << 8;
    }
    acc
}

/// Folds a one's-complement sum to 16 bits (not complemented).
pub fn fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// Folds and complements: the checksum field value for a sum that covered
/// the checksummed bytes with the field zero. A sum over bytes that include
/// a correct checksum finishes to 0.
pub fn finish(acc: u64) -> u16 {
    !fold(acc)
}

/// [`finish`] for UDP: a computed 0 is sent as 0xffff, since 0 means "no
/// checksum" (RFC 768; RFC 8200 makes it mandatory over IPv6).
pub fn finish_udp(acc: u64) -> u16 {
    match finish(acc) {
        0 => 0xffff,
        c => c,
    }
}

/// Internet checksum of `data`.
pub fn checksum(data: &[u8]) -> u16 {
    finish(ones_sum(data, 0))
}

/// Whether `data` (a header or segment with its checksum field, plus
/// `pseudo` for L4) sums to all ones, i.e. carries a correct checksum.
pub fn verify(data: &[u8], pseudo: u64) -> bool {
    fold(ones_sum(data, pseudo)) == 0xffff
}

/// Computes the IPv4 header checksum of `hdr` (the header with options) and
/// writes it into bytes 10..12. Does nothing if `hdr` is shorter than 20
/// bytes.
pub fn fill_ipv4_header(hdr: &mut [u8]) {
    if hdr.len() < 20 {
        return;
    }
    hdr[10..12].copy_from_slice(&[0, 0]);
    let c = checksum(hdr);
    hdr[10..12].copy_from_slice(&c.to_be_bytes());
}

/// Pseudo-header sum (RFC 793/768) for an IPv4 TCP/UDP segment of `len`
/// bytes.
pub fn pseudo_v4(src: [u8; 4], dst: [u8; 4], proto: u8, len: usize) -> u64 {
    ones_sum(&dst, ones_sum(&src, 0)) + u64::from(proto) + len as u64
}

/// Pseudo-header sum (RFC 8200 8.1) for an IPv6 upper-layer packet of `len`
/// bytes; `dst` is the final destination.
pub fn pseudo_v6(src: &[u8; 16], dst: &[u8; 16], proto: u8, len: usize) -> u64 {
    ones_sum(dst, ones_sum(src, 0)) + u64::from(proto) + len as u64
}

/// Pseudo-header sum for a segment of `len` bytes of `proto` in the parsed
/// frame `p`; `None` for a frame without an IP layer. Over IPv6 with a type
/// 2 Routing header the final destination is the address carried in it
/// (RFC 6275 6.4).
pub fn pseudo_header(p: &ParsedFrame, proto: u8, len: usize) -> Option<u64> {
    Some(match p.l3? {
        L3::V4(ip) => pseudo_v4(ip.src.octets(), ip.dst.octets(), proto, len),
        L3::V6(ip) => {
            let dst: Ipv6Addr = ip.rt2_address.unwrap_or(ip.dst);
            pseudo_v6(&ip.src.octets(), &dst.octets(), proto, len)
        }
    })
}

/// Writes the TCP/UDP checksum of the first L4 header of `frame`, computed
/// from scratch over the segment up to the end of the IP datagram. Returns
/// false (frame untouched) when [`parse`] finds no TCP/UDP header to
/// finish.
pub fn fill_l4(frame: &mut [u8]) -> bool {
    let p = parse(frame);
    let Some(l4) = p.l4 else {
        return false;
    };
    let (start, end) = (p.l4_offset, p.l3_end);
    let at = start + l4.proto.checksum_offset();
    if end > frame.len() || at + 2 > end {
        return false;
    }
    let Some(ps) = pseudo_header(&p, l4.proto.number(), end - start) else {
        return false;
    };
    frame[at..at + 2].copy_from_slice(&[0, 0]);
    let acc = ones_sum(&frame[start..end], ps);
    let c = match l4.proto {
        L4Proto::Udp => finish_udp(acc),
        L4Proto::Tcp => finish(acc),
    };
    frame[at..at + 2].copy_from_slice(&c.to_be_bytes());
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::FrameBuilder;

    /// The plain 16-bit word sum the fast one must agree with.
    fn slow(data: &[u8]) -> u16 {
        let mut acc = 0u64;
        for c in data.chunks(2) {
            acc += u64::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
        fold(acc)
    }

    #[test]
    fn fast_sum_agrees_with_word_sum() {
        let data: Vec<u8> = (0..300u32).map(|i| (i * 37 + 11) as u8).collect();
        for n in 0..data.len() {
            assert_eq!(fold(ones_sum(&data[..n], 0)), slow(&data[..n]), "{n}");
        }
        assert_eq!(fold(ones_sum(&[0xff; 64], 0)), 0xffff);
        assert_eq!(fold(ones_sum(&[], 0)), 0);
    }

    #[test]
    fn ipv4_header_checksum() {
        // A real IPv4 header with its checksum.
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(finish(ones_sum(&h, 0)), 0);
        assert!(verify(&h, 0));
        let mut g = h;
        fill_ipv4_header(&mut g);
        assert_eq!(g, h);
        g[10] = 0;
        assert!(!verify(&g, 0));
        assert_eq!(checksum(&g[..10]), !slow(&g[..10]));
    }

    #[test]
    fn l4_checksums_verify() {
        for (src, dst) in [("10.0.0.1", "10.0.0.2"), ("2001:db8::1", "2001:db8::2")] {
            for udp in [false, true] {
                let (s, d) = (src.parse().unwrap(), dst.parse().unwrap());
                let b = if udp {
                    FrameBuilder::udp(s, 1, d, 2)
                } else {
                    FrameBuilder::tcp(s, 1, d, 2)
                };
                let mut f = b.build(b"hello, world");
                assert!(fill_l4(&mut f));
                let p = parse(&f);
                let l4 = p.l4.unwrap();
                let seg = &f[p.l4_offset..p.l3_end];
                let ps = pseudo_header(&p, l4.proto.number(), seg.len()).unwrap();
                assert!(verify(seg, ps));
            }
        }
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&crate::ethernet::ETHERTYPE_ARP.to_be_bytes());
        assert!(!fill_l4(&mut arp));
    }

    #[test]
    fn udp_zero_is_sent_as_all_ones() {
        assert_eq!(finish_udp(0xffff), 0xffff);
        assert_eq!(finish(0xffff), 0);
        assert_eq!(finish_udp(0x1234), !0x1234);
    }
}
