//! TCP and UDP segmentation offload (TSO/USO): one super packet in,
//! MSS-sized frames out, each finished as the stack would have sent it.
//!
//! Both offload paths of the project use [`segment`]: the virtio-net TX
//! path of the daemon (TCP GSO, `VIRTIO_NET_HDR_GSO_TCPV4/6`) and the gVNIC
//! device's DQO TSO/USO. They differ only in how they find the headers and
//! what they check before segmenting, so that stays with them:
//!
//! - virtio-net: [`SegmentLayout::tcp`] reads the headers directly, because
//!   the IP length fields of a GSO super packet are not to be trusted (an
//!   IPv4 BIG TCP packet carries total length 0) and the parsed view bounds
//!   TCP by them. Only TCP, and IPv6 without extension headers, as Linux
//!   sends virtio GSO.
//! - gVNIC: the driver says where the headers end; the device fixes the IP
//!   length ([`fix_ip_len`](crate::ip::fix_ip_len)), parses the headers and
//!   takes [`SegmentLayout::from_parsed`], which allows IPv6 extension
//!   headers and UDP (USO).
//!
//! Every segment gets: the original headers; IP length fields for its size;
//! over IPv4 the identification of the super packet plus the segment index
//! and a fresh header checksum; for TCP the sequence number advanced by the
//! payload before it, FIN and PSH only on the last segment and CWR only on
//! the first; for UDP the UDP length; and a TCP/UDP checksum computed from
//! scratch (a computed UDP checksum of 0 is sent as 0xffff).

use crate::checksum::{fill_ipv4_header, finish, finish_udp, ones_sum, pseudo_v4, pseudo_v6};
use crate::ethernet::{ethertype_and_offset, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use crate::ip::{IPPROTO_TCP, IPV4_MIN_HLEN, IPV6_HLEN};
use crate::l4::{
    L4Proto, TCP_CWR, TCP_FIN, TCP_FLAGS_OFFSET, TCP_MIN_HLEN, TCP_PSH, TCP_SEQ_OFFSET, UDP_HLEN,
};
use crate::parse::{ParsedFrame, L3};

/// Where the headers of a super packet are, and what they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentLayout {
    /// Offset of the IP header.
    pub l3: usize,
    /// Offset of the TCP/UDP header.
    pub l4: usize,
    /// Offset of the payload: the end of the headers copied into every
    /// segment.
    pub payload: usize,
    /// IPv6 (else IPv4).
    pub ipv6: bool,
    /// TCP or UDP.
    pub proto: L4Proto,
    /// The final IPv6 destination for the pseudo-header, when it is not the
    /// fixed header's (a type 2 Routing header's address).
    pub final_dst: Option<[u8; 16]>,
}

impl SegmentLayout {
    /// Locates Ethernet (one VLAN tag allowed), IPv4 (with options) or IPv6
    /// (no extension headers) and TCP by reading the bytes, without trusting
    /// the IP length fields. `None` if the frame is not such a TCP packet
    /// or its TCP header does not fit.
    pub fn tcp(frame: &[u8]) -> Option<Self> {
        let (ethertype, l3) = ethertype_and_offset(frame)?;
        let (l4, ipv6) = match ethertype {
            ETHERTYPE_IPV4 => {
                let vihl = *frame.get(l3)?;
                let ihl = usize::from(vihl & 0x0f) * 4;
                if vihl >> 4 != 4 || ihl < IPV4_MIN_HLEN || *frame.get(l3 + 9)? != IPPROTO_TCP {
                    return None;
                }
                (l3 + ihl, false)
            }
            ETHERTYPE_IPV6 => {
                if *frame.get(l3)? >> 4 != 6 || *frame.get(l3 + 6)? != IPPROTO_TCP {
                    return None;
                }
                (l3 + IPV6_HLEN, true)
            }
            _ => return None,
        };
        let doff = usize::from(*frame.get(l4 + 12)? >> 4) * 4;
        if doff < TCP_MIN_HLEN || l4 + doff > frame.len() {
            return None;
        }
        Some(SegmentLayout {
            l3,
            l4,
            payload: l4 + doff,
            ipv6,
            proto: L4Proto::Tcp,
            final_dst: None,
        })
    }

    /// The layout of a parsed frame: `None` without a TCP/UDP layer.
    pub fn from_parsed(p: &ParsedFrame) -> Option<Self> {
        let (l3, l4) = (p.l3?, p.l4?);
        let (ipv6, final_dst) = match l3 {
            L3::V4(_) => (false, None),
            L3::V6(ip) => (true, ip.rt2_address.map(|a| a.octets())),
        };
        Some(SegmentLayout {
            l3: p.l3_offset,
            l4: p.l4_offset,
            payload: p.l4_offset + l4.header_len,
            ipv6,
            proto: l4.proto,
            final_dst,
        })
    }
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Splits `pkt` (headers as `lay` says, then the payload) into segments of
/// at most `mss` payload bytes (one segment for an empty payload), finished
/// as the module documentation lists. The caller has checked `mss` (not 0)
/// and that `lay` describes `pkt`.
///
/// # Panics
///
/// If `mss` is 0 or `lay`'s offsets do not lie inside `pkt` in order.
pub fn segment(pkt: &[u8], lay: &SegmentLayout, mss: usize) -> Vec<Vec<u8>> {
    assert!(mss > 0, "segment: MSS 0");
    assert!(
        lay.l3 + if lay.ipv6 { IPV6_HLEN } else { IPV4_MIN_HLEN } <= lay.l4
            && lay.l4
                + if lay.proto == L4Proto::Tcp {
                    TCP_MIN_HLEN
                } else {
                    UDP_HLEN
                }
                <= lay.payload
            && lay.payload <= pkt.len(),
        "segment: layout {lay:?} does not fit a packet of {} bytes",
        pkt.len()
    );
    let headers = &pkt[..lay.payload];
    let payload = &pkt[lay.payload..];
    let seq_at = lay.l4 + TCP_SEQ_OFFSET;
    let seq0 = u32::from_be_bytes([
        pkt[seq_at],
        pkt[seq_at + 1],
        pkt[seq_at + 2],
        pkt[seq_at + 3],
    ]);
    let ip_id0 = be16(pkt, lay.l3 + 4);
    let nseg = payload.len().div_ceil(mss).max(1);
    let mut out = Vec::with_capacity(nseg);
    for i in 0..nseg {
        let chunk = &payload[(i * mss).min(payload.len())..((i + 1) * mss).min(payload.len())];
        let mut seg = Vec::with_capacity(headers.len() + chunk.len());
        seg.extend_from_slice(headers);
        seg.extend_from_slice(chunk);
        let l3_len = seg.len() - lay.l3;
        if lay.ipv6 {
            put16(&mut seg, lay.l3 + 4, (l3_len - IPV6_HLEN) as u16);
        } else {
            put16(&mut seg, lay.l3 + 2, l3_len as u16);
            put16(&mut seg, lay.l3 + 4, ip_id0.wrapping_add(i as u16));
            let ihl = usize::from(seg[lay.l3] & 0x0f) * 4;
            fill_ipv4_header(&mut seg[lay.l3..lay.l3 + ihl]);
        }
        match lay.proto {
            L4Proto::Tcp => {
                let seq = seq0.wrapping_add((i * mss) as u32);
                seg[seq_at..seq_at + 4].copy_from_slice(&seq.to_be_bytes());
                let mut flags = seg[lay.l4 + TCP_FLAGS_OFFSET];
                if i + 1 != nseg {
                    flags &= !(TCP_FIN | TCP_PSH);
                }
                if i != 0 {
                    flags &= !TCP_CWR;
                }
                seg[lay.l4 + TCP_FLAGS_OFFSET] = flags;
            }
            L4Proto::Udp => {
                let udp_len = (seg.len() - lay.l4) as u16;
                put16(&mut seg, lay.l4 + 4, udp_len);
            }
        }
        fill_l4_checksum(&mut seg, lay);
        out.push(seg);
    }
    out
}

/// The TCP/UDP checksum of one finished segment, over the segment to its
/// end, with the pseudo-header from the IP header (and `lay.final_dst`).
fn fill_l4_checksum(seg: &mut [u8], lay: &SegmentLayout) {
    let len = seg.len() - lay.l4;
    let proto = lay.proto.number();
    let ps = if lay.ipv6 {
        let a = |at: usize| -> [u8; 16] { std::array::from_fn(|i| seg[at + i]) };
        let dst = lay.final_dst.unwrap_or_else(|| a(lay.l3 + 24));
        pseudo_v6(&a(lay.l3 + 8), &dst, proto, len)
    } else {
        let a = |at: usize| -> [u8; 4] { std::array::from_fn(|i| seg[at + i]) };
        pseudo_v4(a(lay.l3 + 12), a(lay.l3 + 16), proto, len)
    };
    let at = lay.l4 + lay.proto.checksum_offset();
    put16(seg, at, 0);
    let acc = ones_sum(&seg[lay.l4..], ps);
    let c = match lay.proto {
        L4Proto::Tcp => finish(acc),
        L4Proto::Udp => finish_udp(acc),
    };
    put16(seg, at, c);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::{FrameBuilder, Ipv6Ext};
    use crate::checksum::{pseudo_header, verify};
    use crate::ip::fix_ip_len;
    use crate::parse::parse;

    fn check(segs: &[Vec<u8>], orig: &[u8], lay: &SegmentLayout, mss: usize) {
        let mut joined = Vec::new();
        for (i, s) in segs.iter().enumerate() {
            let p = parse(s);
            assert_eq!(p.l3_end, s.len(), "IP length");
            let l4 = p.l4.expect("L4");
            let seg = &s[p.l4_offset..];
            let ps = pseudo_header(&p, l4.proto.number(), seg.len()).unwrap();
            assert!(verify(seg, ps), "L4 checksum of segment {i}");
            if !lay.ipv6 {
                let ihl = usize::from(s[lay.l3] & 0x0f) * 4;
                assert!(verify(&s[lay.l3..lay.l3 + ihl], 0), "IPv4 checksum");
                let id = be16(s, lay.l3 + 4);
                assert_eq!(id, be16(orig, lay.l3 + 4).wrapping_add(i as u16));
            }
            let chunk = &s[lay.payload..];
            assert!(chunk.len() <= mss);
            if lay.proto == L4Proto::Tcp {
                let seq = u32::from_be_bytes(s[lay.l4 + 4..lay.l4 + 8].try_into().unwrap());
                assert_eq!(seq, 1u32.wrapping_add(joined.len() as u32));
                let flags = s[lay.l4 + TCP_FLAGS_OFFSET];
                assert_eq!(flags & TCP_PSH != 0, i + 1 == segs.len());
            } else {
                assert_eq!(usize::from(be16(s, lay.l4 + 4)), s.len() - lay.l4);
            }
            joined.extend_from_slice(chunk);
        }
        assert_eq!(joined, orig[lay.payload..]);
    }

    #[test]
    fn tcp_over_ipv4_and_ipv6() {
        let payload: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
        for (s, d) in [("10.0.0.1", "10.0.0.2"), ("2001:db8::1", "2001:db8::2")] {
            let mut b = FrameBuilder::tcp(s.parse().unwrap(), 1, d.parse().unwrap(), 2);
            b.ipv4_options = vec![1, 1, 1, 1];
            let f = b.build(&payload);
            let lay = SegmentLayout::tcp(&f).unwrap();
            assert_eq!(Some(lay), SegmentLayout::from_parsed(&parse(&f)));
            let segs = segment(&f, &lay, 1448);
            assert_eq!(segs.len(), 3);
            check(&segs, &f, &lay, 1448);
            // Empty payload: one segment.
            let f = b.build(b"");
            assert_eq!(segment(&f, &lay, 1448).len(), 1);
        }
    }

    #[test]
    fn udp_over_ipv6_with_routing_header() {
        let mut b = FrameBuilder::udp(
            "2001:db8::1".parse().unwrap(),
            1,
            "2001:db8::2".parse().unwrap(),
            2,
        );
        b.ipv6_ext = vec![Ipv6Ext::Routing2("2001:db8::bb".parse().unwrap())];
        let mut f = b.build(&[5u8; 1000]);
        // A stale length, as a driver may leave it.
        f[14 + 4..14 + 6].copy_from_slice(&[0, 0]);
        assert!(SegmentLayout::tcp(&f).is_none());
        fix_ip_len(&mut f);
        let lay = SegmentLayout::from_parsed(&parse(&f)).unwrap();
        assert!(lay.final_dst.is_some() && lay.proto == L4Proto::Udp);
        let segs = segment(&f, &lay, 300);
        assert_eq!(segs.len(), 4);
        check(&segs, &f, &lay, 300);
    }

    #[test]
    fn big_tcp_length_zero_is_segmented() {
        let mut f = FrameBuilder::tcp(
            "10.0.0.1".parse().unwrap(),
            1,
            "10.0.0.2".parse().unwrap(),
            2,
        )
        .build(&[1u8; 500]);
        f[16..18].copy_from_slice(&[0, 0]);
        let lay = SegmentLayout::tcp(&f).unwrap();
        check(&segment(&f, &lay, 100), &f, &lay, 100);
    }
}
