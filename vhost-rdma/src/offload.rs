//! Checksum and segmentation offloads done in software, so that a frame a guest
//! sent with a partial checksum or as one large GSO packet reaches a receiver
//! that did not negotiate those features as correct, finished frames.

use crate::virtio_net::NetHdr;
use thiserror::Error;
use virtio_bindings::bindings::virtio_net::{
    VIRTIO_NET_HDR_GSO_NONE, VIRTIO_NET_HDR_GSO_TCPV4, VIRTIO_NET_HDR_GSO_TCPV6,
};
use wire::checksum::{finish, finish_udp, ones_sum};
use wire::tso::SegmentLayout;

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
    let acc = ones_sum(&frame[start..], 0);
    // A UDP checksum of zero means "none"; RFC 768 sends all ones instead.
    let c = if csum_offset == 6 {
        finish_udp(acc)
    } else {
        finish(acc)
    };
    frame[at..at + 2].copy_from_slice(&c.to_be_bytes());
    Ok(())
}

/// Splits a TCP GSO frame into MSS-sized, fully checksummed frames
/// ([`wire::tso::segment`]) after checking the GSO type and size. The
/// headers are found by [`SegmentLayout::tcp`], which does not trust the IP
/// length fields of a GSO super-frame (an IPv4 BIG TCP frame carries total
/// length 0), so the parsed view ([`FrameView`](crate::frame::FrameView))
/// is not used here.
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
    let lay = SegmentLayout::tcp(frame).ok_or(OffloadError::GsoHeaders("TCP"))?;
    if lay.ipv6 != want_v6 {
        return Err(OffloadError::GsoHeaders(if want_v6 {
            "TCPv6"
        } else {
            "TCPv4"
        }));
    }
    Ok(wire::tso::segment(frame, &lay, usize::from(hdr.gso_size)))
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
            let lay = SegmentLayout::tcp(frame).ok_or(OffloadError::GsoHeaders("TCP"))?;
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
    use wire::checksum::fold;

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
        let lay = SegmentLayout::tcp(seg).unwrap();
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
