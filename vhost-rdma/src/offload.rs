//! Checksum and segmentation offloads done in software, so that a frame a guest
//! sent with a partial checksum or as one large GSO packet reaches a receiver
//! that did not negotiate those features as correct, finished frames.

use crate::virtio_net::NetHdr;
use thiserror::Error;
use virtio_bindings::bindings::virtio_net::{
    VIRTIO_NET_HDR_GSO_NONE, VIRTIO_NET_HDR_GSO_TCPV4, VIRTIO_NET_HDR_GSO_TCPV6,
};

/// Why a frame's offload request cannot be honoured.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum OffloadError {
    #[error("checksum start {start} + offset {offset} outside frame of {len} bytes")]
    CsumOutOfRange { start: u16, offset: u16, len: usize },
    #[error("unsupported GSO type {0}")]
    GsoType(u8),
    #[error("GSO size {0} is too small")]
    GsoSize(u16),
    #[error("GSO frame is not a well-formed {0} packet")]
    GsoHeaders(&'static str),
}

/// Ones-complement sum over `data`, added to `acc` (not folded).
pub fn ones_sum(data: &[u8], mut acc: u64) -> u64 {
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        // Summing 32-bit halves of BE words keeps the carries in the upper bits.
        let v = u64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        acc = acc.wrapping_add(v >> 32).wrapping_add(v & 0xffff_ffff);
    }
    let rest = chunks.remainder();
    let mut i = 0;
    while i + 1 < rest.len() {
        acc += u64::from(u16::from_be_bytes([rest[i], rest[i + 1]]));
        i += 2;
    }
    if i < rest.len() {
        acc += u64::from(rest[i]) << 8;
    }
    acc
}

/// Folds a ones-complement sum to 16 bits (not inverted).
pub fn fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// Finishes a partial checksum as the virtio spec defines it: sum from
/// `csum_start` to the end (the field already holds the pseudo-header sum) and
/// store the complement at `csum_start + csum_offset`.
pub fn finish_csum(
    frame: &mut [u8],
    csum_start: u16,
    csum_offset: u16,
) -> Result<(), OffloadError> {
    let start = usize::from(csum_start);
    let at = start + usize::from(csum_offset);
    if start > frame.len() || at + 2 > frame.len() {
        return Err(OffloadError::CsumOutOfRange {
            start: csum_start,
            offset: csum_offset,
            len: frame.len(),
        });
    }
    let mut c = !fold(ones_sum(&frame[start..], 0));
    // A UDP checksum of zero means "none"; RFC 768 sends all ones instead.
    if c == 0 && csum_offset == 6 {
        c = 0xffff;
    }
    frame[at..at + 2].copy_from_slice(&c.to_be_bytes());
    Ok(())
}

/// Offsets of the headers of a TCP packet inside an Ethernet frame.
#[derive(Debug, Clone, Copy)]
pub struct TcpLayout {
    pub l3: usize,
    pub l4: usize,
    pub payload: usize,
    pub ipv6: bool,
}

/// Locates Ethernet (optionally one VLAN tag), IPv4/IPv6 and TCP headers.
///
/// This reads the bytes itself instead of the parsed view
/// ([`FrameView`](crate::frame::FrameView)): the view bounds TCP by the IP
/// length fields, and those of a GSO super-frame are not to be trusted (an
/// IPv4 BIG TCP frame carries total length 0; segmentation rewrites them
/// anyway), so the view would refuse frames this accepts.
pub fn tcp_layout(frame: &[u8]) -> Option<TcpLayout> {
    let mut l3 = 14;
    let mut ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    if ethertype == 0x8100 {
        ethertype = u16::from_be_bytes([*frame.get(16)?, *frame.get(17)?]);
        l3 = 18;
    }
    let (l4, ipv6) = match ethertype {
        0x0800 => {
            let vihl = *frame.get(l3)?;
            let ihl = usize::from(vihl & 0x0f) * 4;
            if vihl >> 4 != 4 || ihl < 20 || *frame.get(l3 + 9)? != 6 {
                return None;
            }
            (l3 + ihl, false)
        }
        0x86dd => {
            if *frame.get(l3)? >> 4 != 6 || *frame.get(l3 + 6)? != 6 {
                return None;
            }
            (l3 + 40, true)
        }
        _ => return None,
    };
    let doff = usize::from(*frame.get(l4 + 12)? >> 4) * 4;
    if doff < 20 || l4 + doff > frame.len() {
        return None;
    }
    Some(TcpLayout {
        l3,
        l4,
        payload: l4 + doff,
        ipv6,
    })
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// Full TCP checksum of a finished segment (pseudo-header included).
fn tcp_checksum(seg: &mut [u8], lay: &TcpLayout) {
    let tcp_len = seg.len() - lay.l4;
    put16(seg, lay.l4 + 16, 0);
    let mut acc = if lay.ipv6 {
        ones_sum(&seg[lay.l3 + 8..lay.l3 + 40], 0) + tcp_len as u64 + 6
    } else {
        ones_sum(&seg[lay.l3 + 12..lay.l3 + 20], 0) + tcp_len as u64 + 6
    };
    acc = ones_sum(&seg[lay.l4..], acc);
    put16(seg, lay.l4 + 16, !fold(acc));
}

fn ipv4_header_checksum(seg: &mut [u8], l3: usize, l4: usize) {
    put16(seg, l3 + 10, 0);
    let c = !fold(ones_sum(&seg[l3..l4], 0));
    put16(seg, l3 + 10, c);
}

/// Splits a TCP GSO frame into MSS-sized, fully checksummed frames.
pub fn segment_tcp(frame: &[u8], hdr: &NetHdr) -> Result<Vec<Vec<u8>>, OffloadError> {
    let want_v6 = match u32::from(hdr.gso_kind()) {
        VIRTIO_NET_HDR_GSO_TCPV4 => false,
        VIRTIO_NET_HDR_GSO_TCPV6 => true,
        other => return Err(OffloadError::GsoType(other as u8)),
    };
    // Linux never goes below 48-byte MSS; a tiny one would turn one frame into
    // thousands.
    if hdr.gso_size < 32 {
        return Err(OffloadError::GsoSize(hdr.gso_size));
    }
    let lay = tcp_layout(frame).ok_or(OffloadError::GsoHeaders("TCP"))?;
    if lay.ipv6 != want_v6 {
        return Err(OffloadError::GsoHeaders(if want_v6 {
            "TCPv6"
        } else {
            "TCPv4"
        }));
    }
    let mss = usize::from(hdr.gso_size);
    let headers = &frame[..lay.payload];
    let payload = &frame[lay.payload..];
    let seq0 = u32::from_be_bytes([
        frame[lay.l4 + 4],
        frame[lay.l4 + 5],
        frame[lay.l4 + 6],
        frame[lay.l4 + 7],
    ]);
    let flags0 = frame[lay.l4 + 13];
    let ip_id0 = if lay.ipv6 {
        0
    } else {
        u16::from_be_bytes([frame[lay.l3 + 4], frame[lay.l3 + 5]])
    };
    let nseg = payload.len().div_ceil(mss).max(1);
    let mut out = Vec::with_capacity(nseg);
    for i in 0..nseg {
        let chunk = &payload[(i * mss).min(payload.len())..((i + 1) * mss).min(payload.len())];
        let mut seg = Vec::with_capacity(headers.len() + chunk.len());
        seg.extend_from_slice(headers);
        seg.extend_from_slice(chunk);
        let seq = seq0.wrapping_add((i * mss) as u32);
        seg[lay.l4 + 4..lay.l4 + 8].copy_from_slice(&seq.to_be_bytes());
        let last = i + 1 == nseg;
        let mut flags = flags0;
        if !last {
            flags &= !(0x01 | 0x08); // FIN, PSH only on the last segment
        }
        if i > 0 {
            flags &= !0x80; // CWR only on the first
        }
        seg[lay.l4 + 13] = flags;
        if lay.ipv6 {
            let plen = (seg.len() - lay.l3 - 40) as u16;
            put16(&mut seg, lay.l3 + 4, plen);
        } else {
            let tot = (seg.len() - lay.l3) as u16;
            put16(&mut seg, lay.l3 + 2, tot);
            put16(&mut seg, lay.l3 + 4, ip_id0.wrapping_add(i as u16));
            ipv4_header_checksum(&mut seg, lay.l3, lay.l4);
        }
        tcp_checksum(&mut seg, &lay);
        out.push(seg);
    }
    Ok(out)
}

/// Validates the offload request of a frame as sent by a guest.
pub fn validate(frame: &[u8], hdr: &NetHdr) -> Result<(), OffloadError> {
    if hdr.needs_csum() {
        let at = usize::from(hdr.csum_start) + usize::from(hdr.csum_offset);
        if at + 2 > frame.len() {
            return Err(OffloadError::CsumOutOfRange {
                start: hdr.csum_start,
                offset: hdr.csum_offset,
                len: frame.len(),
            });
        }
    }
    match u32::from(hdr.gso_kind()) {
        VIRTIO_NET_HDR_GSO_NONE => Ok(()),
        VIRTIO_NET_HDR_GSO_TCPV4 | VIRTIO_NET_HDR_GSO_TCPV6 => {
            if hdr.gso_size < 32 {
                return Err(OffloadError::GsoSize(hdr.gso_size));
            }
            let lay = tcp_layout(frame).ok_or(OffloadError::GsoHeaders("TCP"))?;
            if lay.ipv6 != (u32::from(hdr.gso_kind()) == VIRTIO_NET_HDR_GSO_TCPV6) {
                return Err(OffloadError::GsoHeaders("TCP of the announced IP version"));
            }
            Ok(())
        }
        other => Err(OffloadError::GsoType(other as u8)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp4_frame(payload: usize) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 20 + payload];
        f[12] = 0x08;
        f[14] = 0x45;
        let tot = (20 + 20 + payload) as u16;
        f[16..18].copy_from_slice(&tot.to_be_bytes());
        f[14 + 8] = 64;
        f[14 + 9] = 6;
        f[26..30].copy_from_slice(&[10, 0, 0, 1]);
        f[30..34].copy_from_slice(&[10, 0, 0, 2]);
        f[34..36].copy_from_slice(&1234u16.to_be_bytes());
        f[36..38].copy_from_slice(&80u16.to_be_bytes());
        f[38..42].copy_from_slice(&1000u32.to_be_bytes());
        f[46] = 5 << 4;
        f[47] = 0x18; // PSH|ACK
        for (i, b) in f[54..].iter_mut().enumerate() {
            *b = (i * 7) as u8;
        }
        f
    }

    fn verify_tcp4(seg: &[u8]) {
        let lay = tcp_layout(seg).unwrap();
        assert_eq!(
            fold(ones_sum(&seg[lay.l3..lay.l4], 0)),
            0xffff,
            "IP checksum"
        );
        let tcp_len = (seg.len() - lay.l4) as u64;
        let acc = ones_sum(&seg[lay.l3 + 12..lay.l3 + 20], 0) + tcp_len + 6;
        assert_eq!(fold(ones_sum(&seg[lay.l4..], acc)), 0xffff, "TCP checksum");
    }

    #[test]
    fn segments_carry_consecutive_sequence_numbers_and_valid_checksums() {
        let f = tcp4_frame(3000);
        let hdr = NetHdr {
            gso_type: VIRTIO_NET_HDR_GSO_TCPV4 as u8,
            gso_size: 1448,
            ..Default::default()
        };
        let segs = segment_tcp(&f, &hdr).unwrap();
        assert_eq!(segs.len(), 3);
        let mut seq = 1000u32;
        let mut data = Vec::new();
        for (i, s) in segs.iter().enumerate() {
            verify_tcp4(s);
            assert_eq!(u32::from_be_bytes(s[38..42].try_into().unwrap()), seq);
            let psh = s[47] & 0x08 != 0;
            assert_eq!(psh, i == 2);
            seq += (s.len() - 54) as u32;
            data.extend_from_slice(&s[54..]);
        }
        assert_eq!(data, f[54..]);
    }

    #[test]
    fn finish_csum_matches_full_computation() {
        let mut f = tcp4_frame(101);
        // seed the pseudo-header sum as Linux does for CHECKSUM_PARTIAL
        let tcp_len = (f.len() - 34) as u64;
        let pseudo = fold(ones_sum(&f[26..34], 0) + tcp_len + 6);
        f[50..52].copy_from_slice(&pseudo.to_be_bytes());
        finish_csum(&mut f, 34, 16).unwrap();
        f[24..26].copy_from_slice(&[0, 0]);
        let c = !fold(ones_sum(&f[14..34], 0));
        f[24..26].copy_from_slice(&c.to_be_bytes());
        verify_tcp4(&f);
    }

    #[test]
    fn bad_offload_requests_are_refused() {
        let f = tcp4_frame(10);
        let h = NetHdr {
            flags: 1,
            csum_start: 60,
            csum_offset: 16,
            ..Default::default()
        };
        assert!(validate(&f, &h).is_err());
        let h = NetHdr {
            gso_type: 3,
            gso_size: 1000,
            ..Default::default()
        };
        assert_eq!(validate(&f, &h), Err(OffloadError::GsoType(3)));
        let h = NetHdr {
            gso_type: 1,
            gso_size: 1,
            ..Default::default()
        };
        assert_eq!(validate(&f, &h), Err(OffloadError::GsoSize(1)));
        let h = NetHdr {
            gso_type: 4,
            gso_size: 1000,
            ..Default::default()
        };
        assert!(validate(&f, &h).is_err());
        assert!(validate(
            &[0u8; 20],
            &NetHdr {
                gso_type: 1,
                gso_size: 100,
                ..Default::default()
            }
        )
        .is_err());
    }
}
