//! vhost-rdma TX offloads: virtio-net header parse (`NetHdr::parse`),
//! `offload::validate`, `offload::finish_csum`, `offload::segment_tcp` on a
//! guest-supplied header + frame.
//!
//! Invariants: the header round-trips byte-exactly; whatever `validate`
//! accepts, `finish_csum` / `segment_tcp` accept too (no panic, no error);
//! a finished checksum verifies (ones-complement sum over the checksummed
//! range plus the pseudo-header seed is 0xffff); TSO segments carry the
//! original payload in order, each at most `gso_size`, with the original
//! headers' length, valid TCP (and IPv4 header) checksums, consecutive
//! sequence numbers and correct IP length fields.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vhost_rdma::offload;
use vhost_rdma::virtio_net::{NetHdr, NET_HDR_LEN};
use wire::checksum::{fold, ones_sum};
use wire::tso::SegmentLayout;

const GSO_NONE: u8 = 0;
const GSO_TCPV4: u8 = 1;
const GSO_TCPV6: u8 = 4;

fuzz_target!(|data: &[u8]| {
    if data.len() < NET_HDR_LEN {
        return;
    }
    let (h, frame) = data.split_at(NET_HDR_LEN);
    let h: &[u8; NET_HDR_LEN] = h.try_into().unwrap();
    let hdr = NetHdr::parse(h);
    let nb = u16::from_le_bytes([h[10], h[11]]);
    assert_eq!(&hdr.to_bytes(nb), h, "virtio-net header round trip");
    let hb = hdr.to_hash_bytes(nb);
    assert_eq!(&hb[..NET_HDR_LEN], h);

    let valid = offload::validate(frame, &hdr);
    if valid.is_err() {
        // Whatever validate refuses must not get through segmentation either.
        if hdr.gso_kind() == GSO_TCPV4 || hdr.gso_kind() == GSO_TCPV6 {
            if !hdr.needs_csum() {
                assert!(offload::segment_tcp(frame, &hdr).is_err());
            }
        }
        return;
    }

    if hdr.needs_csum() {
        let mut f = frame.to_vec();
        let start = usize::from(hdr.csum_start);
        let at = start + usize::from(hdr.csum_offset);
        let seed = u16::from_be_bytes([f[at], f[at + 1]]);
        offload::finish_csum(&mut f, hdr.csum_start, hdr.csum_offset)
            .expect("finish_csum refuses what validate accepted");
        assert_eq!(&f[..at], &frame[..at]);
        assert_eq!(&f[at + 2..], &frame[at + 2..]);
        if hdr.csum_offset % 2 == 0 {
            let s = fold(ones_sum(&f[start..], u64::from(seed)));
            assert_eq!(s, 0xffff, "finished checksum does not verify");
        }
    }

    match hdr.gso_kind() {
        GSO_NONE => {}
        GSO_TCPV4 | GSO_TCPV6 => {
            let segs = offload::segment_tcp(frame, &hdr)
                .expect("segment_tcp refuses what validate accepted");
            let lay = SegmentLayout::tcp(frame).expect("layout");
            let mss = usize::from(hdr.gso_size);
            let payload = &frame[lay.payload..];
            let mut joined = Vec::new();
            let seq0 = u32::from_be_bytes(frame[lay.l4 + 4..lay.l4 + 8].try_into().unwrap());
            assert!(!segs.is_empty());
            for s in &segs {
                assert!(s.len() >= lay.payload);
                let chunk = &s[lay.payload..];
                assert!(chunk.len() <= mss);
                let seq = u32::from_be_bytes(s[lay.l4 + 4..lay.l4 + 8].try_into().unwrap());
                assert_eq!(seq, seq0.wrapping_add(joined.len() as u32));
                joined.extend_from_slice(chunk);
                // TCP checksum with the pseudo-header.
                let tcp_len = (s.len() - lay.l4) as u64;
                let acc = if lay.ipv6 {
                    ones_sum(&s[lay.l3 + 8..lay.l3 + 40], 0) + tcp_len + 6
                } else {
                    ones_sum(&s[lay.l3 + 12..lay.l3 + 20], 0) + tcp_len + 6
                };
                assert_eq!(fold(ones_sum(&s[lay.l4..], acc)), 0xffff, "TCP checksum");
                if lay.ipv6 {
                    let plen = u16::from_be_bytes([s[lay.l3 + 4], s[lay.l3 + 5]]);
                    assert_eq!(usize::from(plen), s.len() - lay.l3 - 40);
                } else {
                    let tot = u16::from_be_bytes([s[lay.l3 + 2], s[lay.l3 + 3]]);
                    assert_eq!(usize::from(tot), s.len() - lay.l3);
                    assert_eq!(
                        fold(ones_sum(&s[lay.l3..lay.l4], 0)),
                        0xffff,
                        "IPv4 checksum"
                    );
                }
            }
            assert_eq!(joined, payload, "segments lost or reordered payload");
        }
        k => panic!("validate accepted GSO type {k}"),
    }
});
