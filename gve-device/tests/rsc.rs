//! HW-GRO (RSC): in-order TCP segments of one flow handed over in one burst
//! become one coalesced frame, as `gve_rx_dqo.c` reads it (`rsc`,
//! `rsc_seg_len` on the end-of-packet completion; one valid packet built
//! from the header buffer and the data buffers); everything else is not
//! merged; chains are bounded and never outlive the burst.

mod common;

use common::*;
use gve_device::GveConfig;
use pci_model::{PciDevice, RxRefusal};
use std::time::Duration;

const A: [u8; 4] = [10, 0, 0, 1];
const B: [u8; 4] = [10, 0, 0, 2];
const ACK: u8 = 0x10;
const PSH: u8 = 0x08;
const MSS: usize = 1448;

fn up(cfg: GveConfig, ring: u32, buf: u32, hsplit: bool) -> Guest {
    let mut g = Guest::new(cfg);
    g.probe();
    g.open(1, ring, buf, hsplit);
    g.irqs.clear();
    g
}

/// Ethernet + IPv4 + TCP with `opts` (a multiple of 4 bytes), checksums
/// right.
fn seg4(sport: u16, seq: u32, flags: u8, opts: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x42, 0x01, 0x0a, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00];
    let thl = 20 + opts.len();
    let mut ip = vec![0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0];
    ip[2..4].copy_from_slice(&((20 + thl + payload.len()) as u16).to_be_bytes());
    ip.extend_from_slice(&A);
    ip.extend_from_slice(&B);
    let c = csum(&ip, 0);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    let mut tcp = Vec::new();
    tcp.extend_from_slice(&sport.to_be_bytes());
    tcp.extend_from_slice(&5201u16.to_be_bytes());
    tcp.extend_from_slice(&seq.to_be_bytes());
    tcp.extend_from_slice(&77u32.to_be_bytes());
    tcp.extend_from_slice(&[(thl as u8 / 4) << 4, flags, 0x10, 0, 0, 0, 0, 0]);
    tcp.extend_from_slice(opts);
    tcp.extend_from_slice(payload);
    let c = csum(&tcp, pseudo4(A, B, 6, tcp.len()));
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&tcp);
    f
}

/// Ethernet + IPv6 + TCP, checksum right.
fn seg6(seq: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let src = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    let dst = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
    let mut f = vec![0x42, 0x01, 0x0a, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x86, 0xdd];
    let plen = (20 + payload.len()) as u16;
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&plen.to_be_bytes());
    f.extend_from_slice(&[6, 64]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&dst);
    let mut tcp = Vec::new();
    tcp.extend_from_slice(&40000u16.to_be_bytes());
    tcp.extend_from_slice(&5201u16.to_be_bytes());
    tcp.extend_from_slice(&seq.to_be_bytes());
    tcp.extend_from_slice(&77u32.to_be_bytes());
    tcp.extend_from_slice(&[0x50, flags, 0x10, 0, 0, 0, 0, 0]);
    tcp.extend_from_slice(payload);
    let mut acc = 0u64;
    for c in src.chunks(2).chain(dst.chunks(2)) {
        acc += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    let c = csum(&tcp, acc + 6 + tcp.len() as u64);
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&tcp);
    f
}

/// A stream's payload bytes (position-dependent, so order shows).
fn stream(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 + i / 251) as u8).collect()
}

/// `data` cut into `mss` segments of flow `sport` from `seq`; the last
/// one with `last_flags`.
fn segments(sport: u16, seq: u32, data: &[u8], mss: usize, last_flags: u8) -> Vec<Vec<u8>> {
    let n = data.len().div_ceil(mss);
    data.chunks(mss)
        .enumerate()
        .map(|(i, p)| {
            let flags = if i + 1 == n { last_flags } else { ACK };
            seg4(sport, seq + (i * mss) as u32, flags, &[], p)
        })
        .collect()
}

/// The completions of queue 0 as the driver groups them: one list per
/// packet (up to `end_of_packet`), after the edge ran the device's timer
/// (a chain's hold time ends).
fn packets(g: &mut Guest) -> Vec<Vec<RxCompl>> {
    g.run_timers();
    g.packets(0)
}

/// The TCP payload of a frame built by the driver (IPv4, no options).
fn payload4(f: &[u8]) -> &[u8] {
    let thl = usize::from(f[14 + 20 + 12] >> 4) * 4;
    &f[14 + 20 + thl..]
}

#[test]
fn a_flow_becomes_one_coalesced_frame() {
    let mut g = up(GveConfig::default(), 64, 2048, true);
    let data = stream(20 * MSS);
    let frames = segments(40000, 1_000_000, &data, MSS, ACK | PSH);
    assert!(g.receive_burst(&frames).iter().all(Result::is_ok));
    let p = packets(&mut g);
    assert_eq!(p.len(), 1, "twenty segments, one packet");
    let c = &p[0];
    // One completion per buffer: the payload fills 2 KiB buffers.
    assert_eq!(c.len(), data.len().div_ceil(2048));
    let total: usize = c.iter().map(|d| usize::from(d.packet_len)).sum();
    assert_eq!(total, data.len(), "all the payload, nothing else");
    assert!(c[0].split_header && c[0].header_len == 54);
    let eop = c.last().unwrap();
    assert!(eop.rsc, "the driver reads rsc from end_of_packet");
    assert_eq!(usize::from(eop.rsc_seg_len), MSS, "gso_size");
    assert!(eop.l3_l4_processed && !eop.csum_ip_err && !eop.csum_l4_err);
    let pt = usize::from(eop.ptype);
    assert_eq!(
        (g.ptype_map[2 * pt], g.ptype_map[2 * pt + 1]),
        (2, 2),
        "IPv4/TCP: gve_rx_complete_rsc takes SKB_GSO_TCPV4"
    );
    // The packet the driver builds is one valid TCP packet.
    let f = g.assemble(0, c);
    assert_eq!(f.len(), 54 + data.len());
    assert!(checksums_ok(&f), "IP header and TCP checksums");
    assert_eq!(
        usize::from(be16(&f, 16)),
        40 + data.len(),
        "IP total length"
    );
    assert_eq!(
        be32(&f, 38),
        1_000_000,
        "the first segment's sequence number"
    );
    assert_eq!(f[47], ACK | PSH, "PSH from the last segment");
    assert_eq!(payload4(&f), data);
    let s = g.dev.status().counters;
    assert_eq!(
        (s.rx_packets, s.rx_rsc_packets, s.rx_rsc_segments),
        (20, 1, 20)
    );
    // Per queue too: each segment counts as a (split) packet, the headers
    // were written once.
    let q = s.rx_queues[0];
    assert_eq!((q.packets, q.hsplit_packets, q.header_bytes), (20, 20, 54));
    assert_eq!(q.payload_bytes, data.len() as u64);
    // One interrupt for the packet (its block was armed).
    assert_eq!(g.irqs.len(), 1);
}

#[test]
fn chains_are_bounded_and_keep_the_stream_in_order() {
    for (max, ring) in [(None, 512), (Some(10_000u32), 512)] {
        let mut cfg = GveConfig::default();
        if let Some(m) = max {
            cfg.rsc_max_bytes = m;
        }
        let limit = cfg.rsc_max_bytes as usize;
        let mut g = up(cfg, ring, 2048, true);
        let data = stream(100 * MSS);
        let frames = segments(40000, 7, &data, MSS, ACK);
        assert!(g.receive_burst(&frames).iter().all(Result::is_ok));
        let p = packets(&mut g);
        let mut got = Vec::new();
        for c in &p {
            let f = g.assemble(0, c);
            assert!(
                f.len() <= limit,
                "{} bytes in a chain bounded at {limit}",
                f.len()
            );
            assert!(checksums_ok(&f));
            assert_eq!(
                be32(&f, 38),
                7 + got.len() as u32,
                "chains follow each other"
            );
            assert_eq!(c.last().unwrap().rsc, c.len() > 1 || f.len() > 54 + MSS);
            got.extend_from_slice(payload4(&f));
        }
        assert_eq!(got, data, "max {limit}: the stream, whole and in order");
        // By default the IP length bounds a chain (45 segments).
        let want = if max.is_none() { 3 } else { 17 };
        assert_eq!(p.len(), want, "max {limit}: 45 (or 6) segments per chain");
    }
}

#[test]
fn only_in_order_plain_segments_of_one_flow_merge() {
    let p1 = stream(1000);
    let p2 = stream(2000)[1000..].to_vec();
    let head = seg4(40000, 100, ACK, &[], &p1);
    let ts = [1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 3];
    let ts_other = [1, 1, 8, 10, 0, 0, 0, 10, 0, 0, 0, 3];
    let mut bad_csum = seg4(40000, 1100, ACK, &[], &p2);
    let n = bad_csum.len();
    bad_csum[n - 1] ^= 0xff;
    // (name, second frame, merges): each after `head` (or its own first).
    let cases: Vec<(&str, Vec<Vec<u8>>, bool)> = vec![
        (
            "next in order",
            vec![head.clone(), seg4(40000, 1100, ACK, &[], &p2)],
            true,
        ),
        (
            "a gap",
            vec![head.clone(), seg4(40000, 1200, ACK, &[], &p2)],
            false,
        ),
        (
            "a retransmission",
            vec![head.clone(), seg4(40000, 100, ACK, &[], &p1)],
            false,
        ),
        (
            // As GRO: FIN, like PSH, is left out of the comparison and
            // ends the chain.
            "FIN",
            vec![head.clone(), seg4(40000, 1100, ACK | 0x01, &[], &p2)],
            true,
        ),
        (
            "URG",
            vec![head.clone(), seg4(40000, 1100, ACK | 0x20, &[], &p2)],
            false,
        ),
        (
            // GRO compares the flags, it does not want ACK.
            "no ACK on both",
            vec![
                seg4(40000, 100, 0, &[], &p1),
                seg4(40000, 1100, 0, &[], &p2),
            ],
            true,
        ),
        (
            "ACK on one",
            vec![
                seg4(40000, 100, 0, &[], &p1),
                seg4(40000, 1100, ACK, &[], &p2),
            ],
            false,
        ),
        (
            "SYN first",
            vec![
                seg4(40000, 100, 0x02 | ACK, &[], &p1),
                seg4(40000, 1100, ACK, &[], &p2),
            ],
            false,
        ),
        (
            "another flow",
            vec![head.clone(), seg4(40001, 1100, ACK, &[], &p2)],
            false,
        ),
        ("a bad checksum", vec![head.clone(), bad_csum], false),
        (
            "longer than the first",
            vec![head.clone(), seg4(40000, 1100, ACK, &[], &stream(1200))],
            false,
        ),
        (
            "PSH on the first",
            vec![
                seg4(40000, 100, ACK | PSH, &[], &p1),
                seg4(40000, 1100, ACK, &[], &p2),
            ],
            false,
        ),
        (
            "equal timestamps",
            vec![
                seg4(40000, 100, ACK, &ts, &p1),
                seg4(40000, 1100, ACK, &ts, &p2),
            ],
            true,
        ),
        (
            "other timestamps",
            vec![
                seg4(40000, 100, ACK, &ts, &p1),
                seg4(40000, 1100, ACK, &ts_other, &p2),
            ],
            false,
        ),
        (
            // GRO compares options byte for byte, whatever they are.
            "the same MSS option",
            vec![
                seg4(40000, 100, ACK, &[2, 4, 5, 0xb4], &p1),
                seg4(40000, 1100, ACK, &[2, 4, 5, 0xb4], &p2),
            ],
            true,
        ),
    ];
    for (name, frames, merges) in cases {
        let mut g = up(GveConfig::default(), 64, 2048, true);
        assert!(g.receive_burst(&frames).iter().all(Result::is_ok), "{name}");
        let p = packets(&mut g);
        assert_eq!(p.len(), if merges { 1 } else { 2 }, "{name}");
        let rsc: Vec<bool> = p.iter().map(|c| c.last().unwrap().rsc).collect();
        assert_eq!(
            rsc,
            if merges { vec![true] } else { vec![false; 2] },
            "{name}"
        );
        // Whatever happened, the frames arrive as sent or as their merge.
        let built: Vec<Vec<u8>> = p.iter().map(|c| g.assemble(0, c)).collect();
        if merges {
            let f = &built[0];
            assert!(checksums_ok(f), "{name}");
            let mut want = payload4(&frames[0]).to_vec();
            want.extend_from_slice(payload4(&frames[1]));
            assert_eq!(payload4(f), want, "{name}");
        } else {
            assert_eq!(built, frames, "{name}: delivered untouched");
        }
    }
}

#[test]
fn ipv6_flows_coalesce_too() {
    // MTU 1500: 1500 - 40 - 20.
    const MSS6: usize = 1440;
    let mut g = up(GveConfig::default(), 64, 2048, true);
    let data = stream(3 * MSS6);
    let frames: Vec<Vec<u8>> = data
        .chunks(MSS6)
        .enumerate()
        .map(|(i, p)| seg6(5 + (i * MSS6) as u32, ACK, p))
        .collect();
    let r = g.receive_burst(&frames);
    assert!(r.iter().all(Result::is_ok), "{r:?} {:?}", g.dev.counters());
    let p = packets(&mut g);
    assert_eq!(p.len(), 1);
    let eop = p[0].last().unwrap();
    assert!(eop.rsc && usize::from(eop.rsc_seg_len) == MSS6);
    let f = g.assemble(0, &p[0]);
    assert_eq!(
        usize::from(be16(&f, 18)),
        20 + data.len(),
        "IPv6 payload length"
    );
    assert_eq!(&f[14 + 40 + 20..], &data[..]);
}

#[test]
fn nothing_merges_outside_a_burst_without_hold_or_with_rsc_off() {
    let data = stream(2 * MSS);
    let frames = segments(40000, 1, &data, MSS, ACK);
    // One frame at a time (no burst), no hold time: the device holds
    // nothing.
    let mut g = up(
        GveConfig {
            rsc_hold: Duration::ZERO,
            ..Default::default()
        },
        64,
        2048,
        true,
    );
    for f in &frames {
        g.receive(f).unwrap();
    }
    assert_eq!(g.dev.next_timeout(g.now), None);
    assert_eq!(packets(&mut g).len(), 2);
    // A burst without hold time: written out at its end.
    assert!(g.receive_burst(&frames).iter().all(Result::is_ok));
    assert_eq!(g.dev.next_timeout(g.now), None, "nothing held");
    assert_eq!(
        g.rx_completions(0).len(),
        2,
        "one coalesced packet, 2 buffers"
    );
    // The same burst with coalescing configured off.
    let mut g = up(
        GveConfig {
            rsc_max_bytes: 0,
            ..Default::default()
        },
        64,
        2048,
        true,
    );
    assert!(g.receive_burst(&frames).iter().all(Result::is_ok));
    let p = packets(&mut g);
    assert_eq!(p.len(), 2);
    assert!(p.iter().all(|c| !c[0].rsc));
    assert_eq!(g.dev.status().counters.rx_rsc_packets, 0);
}

#[test]
fn a_chain_stops_at_the_buffers_posted() {
    // No header split, 2 KiB buffers, three posted: four segments fit in
    // them coalesced (5846 bytes), the fifth does not, nor alone.
    let mut g = Guest::new(GveConfig::default());
    g.probe();
    g.open(1, 64, 2048, false);
    let posted = g.dev.status().rx_queues[0].buffers_available;
    // Use all but three buffers with small frames first.
    let small = seg4(50000, 1, ACK | PSH, &[], b"x");
    for _ in 0..posted - 3 {
        g.receive(&small).unwrap();
    }
    g.rx_completions(0);
    let data = stream(6 * MSS);
    let frames = segments(40000, 1, &data, MSS, ACK);
    let r = g.receive_burst(&frames);
    assert_eq!(
        r,
        [
            Ok(()),
            Ok(()),
            Ok(()),
            Ok(()),
            Err(RxRefusal::NoBuffers),
            Err(RxRefusal::NoBuffers)
        ]
    );
    let p = packets(&mut g);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].len(), 3, "three buffers");
    let f = g.assemble(0, &p[0]);
    assert_eq!(payload4(&f), &data[..4 * MSS]);
    assert!(checksums_ok(&f));
    // Buffers come back: the refused segments go on from where they were.
    g.post_buffers(0, 8);
    assert!(g.receive_burst(&frames[4..]).iter().all(Result::is_ok));
    let p = packets(&mut g);
    assert_eq!(p.len(), 1);
    let f = g.assemble(0, &p[0]);
    assert_eq!(payload4(&f), &data[4 * MSS..]);
    assert_eq!(be32(&f, 38), 1 + 4 * MSS as u32);
}

/// `frame` as a virtio-net guest's TSO frame leaves it: the TCP checksum
/// only the pseudo-header's sum without the length, the IPv4 header
/// checksum 0.
fn as_tso(mut frame: Vec<u8>) -> Vec<u8> {
    frame[24..26].fill(0);
    let c = !csum(&[], pseudo4(A, B, 6, 0));
    frame[14 + 20 + 16..14 + 20 + 18].copy_from_slice(&c.to_be_bytes());
    frame
}

/// Issue 24, part 4: a TSO frame (a virtio-net sender's 64 KiB write) on a
/// queue with HW-GRO is placed as the one packet its segments would have
/// coalesced into, byte for byte and completion for completion, without
/// being cut up first; what the device cannot take whole it answers
/// `Unsegmented`, having changed nothing.
#[test]
fn a_tso_frame_is_placed_as_its_segments_would_coalesce() {
    let data = stream(40 * MSS);
    let whole = as_tso(seg4(40000, 1_000_000, ACK | PSH, &[], &data));
    let segs = segments(40000, 1_000_000, &data, MSS, ACK | PSH);
    for hsplit in [true, false] {
        let mut a = up(GveConfig::default(), 256, 2048, hsplit);
        assert!(a.receive_burst(&segs).iter().all(Result::is_ok));
        let pa = packets(&mut a);
        let mut b = up(GveConfig::default(), 256, 2048, hsplit);
        b.receive_tso(&whole, MSS as u16).unwrap();
        let pb = packets(&mut b);
        assert_eq!(pa.len(), 1);
        assert_eq!(pb.len(), 1, "one packet");
        assert_eq!(
            format!("{:?}", pa[0]),
            format!("{:?}", pb[0]),
            "completions"
        );
        let f = b.assemble(0, &pb[0]);
        assert_eq!(f, a.assemble(0, &pa[0]), "the packet the driver builds");
        assert!(checksums_ok(&f));
        assert_eq!(payload4(&f), data);
        let (ca, cb) = (a.dev.status().counters, b.dev.status().counters);
        assert_eq!(
            (cb.rx_packets, cb.rx_rsc_packets, cb.rx_rsc_segments),
            (ca.rx_packets, ca.rx_rsc_packets, ca.rx_rsc_segments)
        );
        assert_eq!(cb.rx_rsc_segments, 40);
        assert_eq!((ca.rx_tso_whole, cb.rx_tso_whole), (0, 1));
    }
    // Not whole: HW-GRO off, a segment over the MTU, too few buffers in
    // the whole ring: nothing placed, nothing counted.
    let off = GveConfig {
        rsc_max_bytes: 0,
        ..Default::default()
    };
    for (cfg, mss, ring) in [
        (off, MSS as u16, 256),
        (GveConfig::default(), 9000, 256),
        (GveConfig::default(), MSS as u16, 16),
    ] {
        let mut g = up(cfg, ring, 2048, false);
        let before = format!("{:?}", g.dev.status());
        assert_eq!(g.dev.status().counters.rx_tso_whole, 0);
        assert_eq!(g.receive_tso(&whole, mss), Err(RxRefusal::Unsegmented));
        assert_eq!(format!("{:?}", g.dev.status()), before, "changed nothing");
        assert!(g.rx_completions(0).is_empty());
    }
}
