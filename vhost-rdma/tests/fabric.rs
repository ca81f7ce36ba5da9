//! No-VM tests of the daemon: in-process frontends (`TestGuest`) on several
//! ports of one `Server`, checking what arrives where, byte for byte.

mod common;

use std::time::Duration;

use common::guest::{GSO_ECN, GSO_TCPV4, GSO_TCPV6, HDR_F_NEEDS_CSUM};
use common::packet::{
    complete_csum, frame_tag, parse, pattern, tagged_frame, tcp_frame, tso_frame, udp_frame, Flow,
    L4Csum, BROADCAST, TCP_ACK, TCP_CWR, TCP_FIN, TCP_PSH,
};
use common::{
    feat, port_mac, wait_until, Layout, NetHdr, RxFrame, TestFabric, TestGuest, TxOpts, ARRIVE,
    QUIET,
};

/// Sends `frame` from `a` and expects exactly it (one frame) at `b`.
fn expect_cross(a: &mut TestGuest, b: &mut TestGuest, frame: &[u8], opts: &TxOpts, what: &str) {
    a.send(0, frame, opts);
    let r = b
        .recv_any(ARRIVE)
        .unwrap_or_else(|| panic!("{what}: frame did not arrive"));
    assert_eq!(r.data.len(), frame.len(), "{what}: length");
    assert!(r.data == frame, "{what}: payload differs");
    assert_eq!(r.hdr.gso_type, 0, "{what}: gso_type on a plain frame");
    assert_eq!(
        r.hdr.flags & HDR_F_NEEDS_CSUM,
        0,
        "{what}: NEEDS_CSUM on a plain frame"
    );
    assert!(a.wait_tx(0, ARRIVE), "{what}: TX chain not returned");
}

#[test]
fn frames_cross_intact_with_every_descriptor_layout() {
    let fab = TestFabric::start(2, 1);
    let layouts = [
        Layout::Single,
        Layout::HdrSeparate,
        Layout::Chained(3),
        Layout::Chained(40), // pieces of a few bytes: the header is split
        Layout::Pieces(vec![1, 11, 3, 500]),
        Layout::Indirect(1),
        Layout::Indirect(7),
    ];
    // A full-featured guest talking to a minimal one (no MRG_RXBUF, no EVENT_IDX).
    let mut a = fab.connect(0, feat::ALL);
    let mut b = fab.connect(1, feat::MINIMAL | feat::INDIRECT_DESC);
    a.post_rx(0, 64, 2048);
    b.post_rx(0, 64, 2048);
    let (ma, mb) = (fab.mac(0), fab.mac(1));
    for (i, l) in layouts.iter().enumerate() {
        for len in [60, 61, 777, 1514] {
            let f = tagged_frame(mb, ma, (i * 10000 + len) as u64, len);
            expect_cross(
                &mut a,
                &mut b,
                &f,
                &TxOpts::layout(l.clone()),
                &format!("A->B {l:?} len {len}"),
            );
            let f = tagged_frame(ma, mb, (i * 10000 + len + 5000) as u64, len);
            expect_cross(
                &mut b,
                &mut a,
                &f,
                &TxOpts::layout(l.clone()),
                &format!("B->A {l:?} len {len}"),
            );
        }
    }
    let (sa, sb) = (fab.stats(0), fab.stats(1));
    let n = (layouts.len() * 4) as u64;
    assert_eq!(sa.totals.tx_frames, n, "A tx_frames: {sa:?}");
    assert_eq!(sb.totals.rx_frames, n, "B rx_frames: {sb:?}");
    assert_eq!(sb.totals.tx_frames, n, "B tx_frames: {sb:?}");
    assert_eq!(sa.totals.tx_errors + sb.totals.tx_errors, 0);
    assert_eq!(sa.totals.rx_drops + sb.totals.rx_drops, 0);
    a.check_idle().unwrap();
    b.check_idle().unwrap();
}

/// A daemon confined to one CPU wakes a receiver only when the sender's
/// batch ends: frames still cross, one and many at a time.
#[test]
fn frames_cross_without_the_early_wake() {
    let fab = TestFabric::start(2, 1);
    if let Some(s) = &fab.server {
        s.fabric().set_early_wake(false);
    }
    let mut a = fab.connect(0, feat::ALL);
    let mut b = fab.connect(1, feat::ALL);
    a.post_rx(0, 128, 2048);
    b.post_rx(0, 128, 2048);
    let (ma, mb) = (fab.mac(0), fab.mac(1));
    for i in 0..5u64 {
        let f = tagged_frame(mb, ma, i, 100);
        expect_cross(&mut a, &mut b, &f, &TxOpts::default(), &format!("A->B {i}"));
        let f = tagged_frame(ma, mb, 100 + i, 100);
        expect_cross(&mut b, &mut a, &f, &TxOpts::default(), &format!("B->A {i}"));
    }
    // 40 in one pass: a push at 32 and the rest at the end, one wake.
    let burst: Vec<Vec<u8>> = (0..40u64)
        .map(|i| tagged_frame(mb, ma, 1000 + i, 80))
        .collect();
    for f in &burst {
        a.send(0, f, &TxOpts::default());
    }
    for (i, f) in burst.iter().enumerate() {
        let r = b
            .recv_any(ARRIVE)
            .unwrap_or_else(|| panic!("frame {i} of the burst did not arrive"));
        assert!(
            r.data == *f,
            "frame {i} of the burst differs or is out of order"
        );
    }
}

#[test]
fn rx_chains_of_several_descriptors_and_indirect_rx() {
    // A non-mergeable receiver posting multi-descriptor and indirect RX chains
    // (the header itself split across descriptors), like Linux "big packets".
    let fab = TestFabric::start(2, 1);
    let mut a = fab.connect(0, feat::ALL);
    let mut b = fab.connect(1, feat::MINIMAL | feat::INDIRECT_DESC);
    b.post_rx_chains(0, 4, &[4, 8, 100, 1500], false);
    b.post_rx_chains(0, 4, &[4, 8, 100, 1500], true);
    for i in 0..8u64 {
        let f = tagged_frame(fab.mac(1), fab.mac(0), i, 1514);
        a.send(0, &f, &TxOpts::default());
        let r = b
            .recv(0, ARRIVE)
            .expect("frame into a multi-descriptor RX chain");
        assert!(r.data == f, "frame {i} corrupted");
        assert_eq!(r.used_lens, vec![12 + 1514]);
    }
}

#[test]
fn mergeable_rx_plain_frame_spans_small_buffers() {
    let fab = TestFabric::start(2, 1);
    let mut a = fab.connect(0, feat::ALL);
    let mut b = fab.connect(1, feat::ALL);
    b.post_rx(0, 64, 256);
    let f = tagged_frame(fab.mac(1), fab.mac(0), 42, 1514);
    a.send(0, &f, &TxOpts::default());
    let r = b.recv(0, ARRIVE).expect("frame");
    assert!(r.data == f, "merged frame corrupted");
    let want = (12 + 1514usize).div_ceil(256);
    assert_eq!(r.buffers, want, "buffers used");
    assert_eq!(r.hdr.num_buffers as usize, want, "num_buffers");
    assert!(
        r.used_lens[..want - 1].iter().all(|&l| l == 256),
        "{:?}",
        r.used_lens
    );
}

#[test]
fn mergeable_rx_gso_frame_into_4k_buffers() {
    let fab = TestFabric::start(2, 1);
    let mut a = fab.connect(0, feat::ALL);
    let mut b = fab.connect(1, feat::ALL);
    assert!(b.has(feat::GUEST_TSO4 | feat::MRG_RXBUF | feat::GUEST_CSUM));
    b.post_rx(0, 40, 4096);
    let flow = Flow::v4(fab.mac(0), fab.mac(1), 40000, 5001);
    let payload = pattern(60000, 3);
    let (f, hdr) = tso_frame(&flow, 1000, TCP_ACK | TCP_PSH, &payload, 1448);
    a.send(
        0,
        &f,
        &TxOpts {
            hdr,
            layout: Layout::Chained(17),
        },
    );
    let r = b.recv(0, ARRIVE).expect("GSO frame");
    assert_eq!(
        r.hdr.gso_type, GSO_TCPV4,
        "receiver negotiated GUEST_TSO4 + MRG_RXBUF: expected the GSO frame as-is, got {:?} ({} bytes)",
        r.hdr,
        r.data.len()
    );
    assert_eq!(r.hdr.gso_size, 1448);
    let want = (12 + f.len()).div_ceil(4096);
    assert_eq!(r.buffers, want, "buffers");
    assert_eq!(r.hdr.num_buffers as usize, want, "num_buffers");
    assert_eq!(r.data.len(), f.len());
    if r.hdr.flags & HDR_F_NEEDS_CSUM != 0 {
        assert_eq!((r.hdr.csum_start, r.hdr.csum_offset), (34, 16));
        assert!(r.data == f, "GSO frame payload differs");
    } else {
        // The device may have finished the checksum; everything else is unchanged.
        assert!(
            r.data == complete_csum(&f, &hdr),
            "GSO frame differs from the sent one"
        );
    }
    let p = parse(&r.data).unwrap();
    assert_eq!(p.payload, payload);
}

fn csum_case(b_features: u64, name: &str) {
    let fab = TestFabric::start(2, 1);
    let mut a = fab.connect(0, feat::ALL);
    let mut b = fab.connect(1, b_features);
    assert!(a.has(feat::CSUM));
    b.post_rx(0, 64, 2048);
    let (ma, mb) = (fab.mac(0), fab.mac(1));
    let cases: Vec<(&str, Vec<u8>, NetHdr)> = vec![
        {
            let (f, h) = udp_frame(
                &Flow::v4(ma, mb, 1234, 53),
                &pattern(333, 1),
                L4Csum::Partial,
            );
            ("udp4", f, h)
        },
        {
            let (f, h) = udp_frame(
                &Flow::v6(ma, mb, 1234, 53),
                &pattern(1001, 2),
                L4Csum::Partial,
            );
            ("udp6", f, h)
        },
        {
            let (f, h) = tcp_frame(
                &Flow::v4(ma, mb, 40000, 80),
                7,
                TCP_ACK,
                &pattern(1400, 3),
                L4Csum::Partial,
            );
            ("tcp4", f, h)
        },
        {
            let (f, h) = tcp_frame(
                &Flow::v6(ma, mb, 40000, 80),
                7,
                TCP_ACK,
                &pattern(999, 4),
                L4Csum::Partial,
            );
            ("tcp6", f, h)
        },
        {
            // odd length payload
            let (f, h) = tcp_frame(
                &Flow::v4(ma, mb, 40001, 80),
                9,
                TCP_ACK | TCP_PSH,
                &pattern(1, 5),
                L4Csum::Partial,
            );
            ("tcp4-1byte", f, h)
        },
    ];
    let guest_csum = b.has(feat::GUEST_CSUM);
    for (what, f, hdr) in cases {
        assert!(
            !parse(&f).unwrap().l4_csum_ok,
            "test frame must start unfinished"
        );
        a.send(
            0,
            &f,
            &TxOpts {
                hdr,
                layout: Layout::HdrSeparate,
            },
        );
        let r = b
            .recv(0, ARRIVE)
            .unwrap_or_else(|| panic!("{name}/{what}: nothing arrived"));
        let p = parse(&r.data).unwrap_or_else(|e| panic!("{name}/{what}: {e}"));
        if guest_csum && r.hdr.flags & HDR_F_NEEDS_CSUM != 0 {
            assert_eq!(
                (r.hdr.csum_start, r.hdr.csum_offset),
                (hdr.csum_start, hdr.csum_offset),
                "{name}/{what}: csum_start/offset changed"
            );
            assert!(r.data == f, "{name}/{what}: partial frame changed");
        } else {
            if !guest_csum {
                assert_eq!(
                    r.hdr.flags, 0,
                    "{name}/{what}: flags must be 0 without GUEST_CSUM"
                );
            }
            assert!(
                p.l4_csum_ok,
                "{name}/{what}: L4 checksum wrong: field {:#06x}",
                p.l4_csum
            );
            assert!(
                r.data == complete_csum(&f, &hdr),
                "{name}/{what}: bytes differ"
            );
        }
    }
}

#[test]
fn needs_csum_finished_for_receiver_without_guest_csum() {
    csum_case(feat::MINIMAL, "minimal receiver");
    csum_case(
        feat::ALL & !(feat::GUEST_CSUM | feat::GUEST_TSO4 | feat::GUEST_TSO6),
        "mergeable receiver without GUEST_CSUM",
    );
}

#[test]
fn needs_csum_partial_or_finished_for_receiver_with_guest_csum() {
    csum_case(feat::ALL, "full receiver");
}

/// Checks that `segs` is the correct segmentation of the TSO frame `orig`.
fn check_segments(orig: &[u8], hdr: &NetHdr, segs: &[RxFrame], guest_csum: bool, what: &str) {
    let o = parse(orig).unwrap();
    let mss = hdr.gso_size as usize;
    let n = o.payload.len().div_ceil(mss);
    assert_eq!(
        segs.len(),
        n,
        "{what}: expected {n} segments of mss {mss}, got {} ({:?})",
        segs.len(),
        segs.iter()
            .map(|s| (s.data.len(), s.hdr))
            .collect::<Vec<_>>()
    );
    let mut payload = Vec::new();
    for (i, s) in segs.iter().enumerate() {
        let w = format!("{what}: segment {i}");
        assert_eq!(s.hdr.gso_type, 0, "{w}: gso_type must be NONE");
        let data = if s.hdr.flags & HDR_F_NEEDS_CSUM != 0 {
            // Allowed only for a receiver with GUEST_CSUM: finish it ourselves.
            assert!(
                guest_csum,
                "{w}: NEEDS_CSUM set for a receiver without GUEST_CSUM"
            );
            assert_eq!(
                (s.hdr.csum_start, s.hdr.csum_offset),
                (hdr.csum_start, hdr.csum_offset),
                "{w}: csum_start/offset"
            );
            complete_csum(&s.data, &s.hdr)
        } else {
            if !guest_csum {
                assert_eq!(s.hdr.flags, 0, "{w}: flags must be 0 without GUEST_CSUM");
            }
            s.data.clone()
        };
        let p = parse(&data).unwrap_or_else(|e| panic!("{w}: {e}"));
        let seglen = if i + 1 < n {
            mss
        } else {
            o.payload.len() - mss * (n - 1)
        };
        assert_eq!(p.payload.len(), seglen, "{w}: payload length");
        assert_eq!(
            s.data.len(),
            hdr.hdr_len as usize + seglen,
            "{w}: frame length"
        );
        assert_eq!(p.dst_mac, o.dst_mac, "{w}: dst mac");
        assert_eq!(p.src_mac, o.src_mac, "{w}: src mac");
        assert_eq!(
            (p.src_ip.clone(), p.dst_ip.clone()),
            (o.src_ip.clone(), o.dst_ip.clone())
        );
        assert_eq!((p.sport, p.dport), (o.sport, o.dport), "{w}: ports");
        if p.v4 {
            assert_eq!(p.ip_len_field, 20 + 20 + seglen, "{w}: IPv4 total length");
            assert!(p.ip_csum_ok, "{w}: IPv4 header checksum");
        } else {
            assert_eq!(p.ip_len_field, 20 + seglen, "{w}: IPv6 payload length");
        }
        assert_eq!(
            p.tcp_seq,
            o.tcp_seq.wrapping_add((i * mss) as u32),
            "{w}: sequence number"
        );
        let last = i + 1 == n;
        let mut want_flags = o.tcp_flags;
        if !last {
            want_flags &= !(TCP_FIN | TCP_PSH);
        }
        if i > 0 {
            want_flags &= !TCP_CWR;
        }
        assert_eq!(p.tcp_flags, want_flags, "{w}: TCP flags");
        assert!(p.l4_csum_ok, "{w}: TCP checksum wrong ({:#06x})", p.l4_csum);
        payload.extend_from_slice(&p.payload);
    }
    assert!(payload == o.payload, "{what}: reassembled payload differs");
}

fn tso_case(b_features: u64, v6: bool, ecn: bool, name: &str) {
    let fab = TestFabric::start(2, 1);
    let mut a = fab.connect(0, feat::ALL);
    let mut b = fab.connect(1, b_features);
    assert!(a.has(feat::HOST_TSO4 | feat::HOST_TSO6 | feat::CSUM));
    b.post_rx(0, 128, 2048);
    let (ma, mb) = (fab.mac(0), fab.mac(1));
    let flow = if v6 {
        Flow::v6(ma, mb, 40000, 5001)
    } else {
        Flow::v4(ma, mb, 40000, 5001)
    };
    let payload = pattern(10000, 9);
    let flags = TCP_ACK | TCP_PSH | TCP_FIN | TCP_CWR;
    let (f, mut hdr) = tso_frame(&flow, 0xffff_f000, flags, &payload, 1448);
    assert_eq!(hdr.gso_type, if v6 { GSO_TCPV6 } else { GSO_TCPV4 });
    if ecn {
        hdr.gso_type |= GSO_ECN;
    }
    a.send(
        0,
        &f,
        &TxOpts {
            hdr,
            layout: Layout::Chained(4),
        },
    );
    let n = payload.len().div_ceil(1448);
    let segs = b.recv_n(0, n, ARRIVE);
    check_segments(&f, &hdr, &segs, b.has(feat::GUEST_CSUM), name);
    assert!(
        b.drain_all(QUIET).is_empty(),
        "{name}: extra frames after segments"
    );
    let sb = fab.stats(1);
    assert_eq!(sb.totals.rx_frames, n as u64, "{name}: B rx_frames {sb:?}");
}

#[test]
fn tso4_segmented_for_receiver_without_guest_tso() {
    tso_case(feat::MINIMAL, false, false, "tso4 -> minimal");
    tso_case(
        feat::ALL & !(feat::GUEST_TSO4 | feat::GUEST_TSO6),
        false,
        false,
        "tso4 -> csum+mrg, no GUEST_TSO",
    );
    tso_case(feat::MINIMAL, false, true, "tso4+ECN -> minimal");
}

#[test]
fn tso6_segmented_for_receiver_without_guest_tso() {
    tso_case(feat::MINIMAL, true, false, "tso6 -> minimal");
    tso_case(
        feat::ALL & !(feat::GUEST_TSO4 | feat::GUEST_TSO6),
        true,
        false,
        "tso6 -> csum+mrg, no GUEST_TSO",
    );
}

#[test]
fn two_queue_pairs_all_work() {
    let fab = TestFabric::start(2, 2);
    let mut a = fab.connect(0, feat::ALL);
    let mut b = fab.connect(1, feat::ALL);
    assert_eq!(a.queue_num, Some(4), "GET_QUEUE_NUM for 2 queue pairs");
    for qp in 0..2 {
        a.post_rx(qp, 64, 2048);
        b.post_rx(qp, 64, 2048);
    }
    let (ma, mb) = (fab.mac(0), fab.mac(1));
    // 32 UDP flows, sent alternately on A's two TX queues.
    let mut sent = Vec::new();
    for i in 0..32u16 {
        let (f, _) = udp_frame(
            &Flow::v4(ma, mb, 1000 + i, 2000 + i * 7),
            &pattern(100, i as u8),
            L4Csum::Full,
        );
        a.send(i % 2, &f, &TxOpts::default());
        sent.push(f);
    }
    let got = b.recv_from(&[0, 1], 32, ARRIVE);
    assert_eq!(got.len(), 32, "frames arrived across B's queue pairs");
    for f in &sent {
        assert!(
            got.iter().any(|r| &r.data == f),
            "a frame is missing or corrupted"
        );
    }
    assert!(a.wait_tx(0, ARRIVE) && a.wait_tx(1, ARRIVE));
    let per_qp: Vec<usize> = (0..2)
        .map(|q| got.iter().filter(|r| r.qp == q).count())
        .collect();
    // And the other way, B's qp1 TX.
    let (f, _) = udp_frame(&Flow::v4(mb, ma, 9, 9), &pattern(64, 0), L4Csum::Full);
    b.send(1, &f, &TxOpts::default());
    let r = a.recv_from(&[0, 1], 1, ARRIVE);
    assert!(r.len() == 1 && r[0].data == f, "B qp1 -> A");
    let sa = fab.stats(0);
    assert_eq!(
        sa.queues.len(),
        2,
        "per-queue stats for 2 queue pairs: {sa:?}"
    );
    assert_eq!(sa.queues[0].tx_frames, 16, "A qp0 tx: {sa:?}");
    assert_eq!(sa.queues[1].tx_frames, 16, "A qp1 tx: {sa:?}");
    assert!(
        per_qp[1] > 0 && per_qp[0] > 0,
        "B received {per_qp:?} frames on (qp0, qp1): RX on both queue pairs should be used \
         (32 flows sent from both A queue pairs)"
    );
}

#[test]
fn full_rx_ring_counts_drops_and_keeps_delivered_frames_intact() {
    const FRAMES: u64 = 100;
    let fab = TestFabric::start_with(2, |i, dir| {
        let mut p = TestFabric::port_config(dir, i, 1);
        p.rx_queue_frames = 16;
        p
    });
    let mut a = fab.connect(0, feat::ALL);
    let mut b = fab.connect(1, feat::ALL);
    b.post_rx(0, 8, 2048);
    let (ma, mb) = (fab.mac(0), fab.mac(1));
    let frames: Vec<Vec<u8>> = (0..FRAMES).map(|t| tagged_frame(mb, ma, t, 600)).collect();
    for chunk in frames.chunks(20) {
        a.send_burst(0, chunk, &TxOpts::default());
    }
    assert!(a.wait_tx(0, ARRIVE), "A's TX chains not all returned");
    let mut got = b.recv_n(0, 8, ARRIVE);
    assert_eq!(got.len(), 8, "the 8 posted buffers should fill");
    // Give the device time to notice it cannot deliver the rest. Besides the
    // 8 delivered and the 16 queued (a frame in the worker's hand counts as
    // queued), a stalled receiver's queue takes a headroom of what each
    // sending thread of the fabric (2 ports x 1 queue pair + the fault
    // timer) may have staged unseen, at most the 16-frame limit each, meant
    // for senders that found room at the same moment.
    const HELD: u64 = 8 + 16 + 3 * 16;
    let (s, _) = fab.wait_stats(1, ARRIVE, |s| s.totals.rx_drops >= FRAMES - HELD);
    assert!(
        s.totals.rx_drops >= FRAMES - HELD,
        "with 8 RX buffers, a 16-frame pending queue and a headroom of 48 \
         at least {} drops expected: {s:?}",
        FRAMES - HELD
    );
    // Now give plenty of buffers: whatever was pending comes, nothing else.
    b.post_rx(0, 200, 2048);
    got.extend(b.drain_all(Duration::from_secs(1)));
    let s = fab.stats(1);
    assert_eq!(
        got.len() as u64 + s.totals.rx_drops,
        FRAMES,
        "every frame is either delivered or counted as a drop ({} delivered): {s:?}",
        got.len()
    );
    assert_eq!(
        s.totals.rx_frames,
        got.len() as u64,
        "rx_frames counter: {s:?}"
    );
    assert_eq!(fab.stats(0).totals.tx_frames, FRAMES);
    let mut last = None;
    for r in &got {
        let t = frame_tag(&r.data).expect("delivered frame is not one we sent");
        assert!(r.data == frames[t as usize], "frame {t} corrupted");
        assert!(
            last < Some(t),
            "frames out of order or duplicated: {last:?} then {t}"
        );
        last = Some(t);
    }
    // The port still works afterwards.
    let f = tagged_frame(mb, ma, 1000, 100);
    expect_cross(&mut a, &mut b, &f, &TxOpts::default(), "after drops");
}

/// Back-pressure: a receiver that is slow but keeps reading makes the sender
/// wait (its TX chains stay in the ring) instead of losing frames; a
/// receiver that stops reading does not stall a third port.
#[test]
fn slow_receiver_gets_back_pressure_not_drops() {
    const FRAMES: u64 = 600;
    let fab = TestFabric::start_with(3, |i, dir| {
        let mut p = TestFabric::port_config(dir, i, 1);
        p.rx_queue_frames = 16;
        p
    });
    let mut a = fab.connect(0, feat::ALL);
    let mut b = fab.connect(1, feat::ALL);
    let mut c = fab.connect(2, feat::ALL);
    let (ma, mb, mc) = (fab.mac(0), fab.mac(1), fab.mac(2));
    // Let the switch learn A, B and C so A's frames are unicast.
    a.post_rx(0, 16, 2048);
    a.send(
        0,
        &tagged_frame(BROADCAST, ma, 900_002, 100),
        &TxOpts::default(),
    );
    b.post_rx(0, 4, 2048);
    c.post_rx(0, 4, 2048);
    assert!(
        b.recv(0, ARRIVE).is_some() && c.recv(0, ARRIVE).is_some(),
        "broadcast from A"
    );
    b.send(0, &tagged_frame(ma, mb, 900_000, 100), &TxOpts::default());
    c.send(0, &tagged_frame(ma, mc, 900_001, 100), &TxOpts::default());
    assert_eq!(a.recv_n(0, 2, ARRIVE).len(), 2, "learning frames");
    let frames: Vec<Vec<u8>> = (0..FRAMES).map(|t| tagged_frame(mb, ma, t, 700)).collect();
    assert!(
        b.drain_all(QUIET).is_empty(),
        "B got frames before the test"
    );
    // B reads in small steps, far slower than A sends (like a guest, it has
    // buffers posted from the start).
    b.post_rx(0, 8, 2048);
    let mut got = Vec::new();
    let mut sent = 0usize;
    while (got.len() as u64) < FRAMES {
        if sent < frames.len() {
            // Never let A's ring fill up: this one thread plays both guests,
            // and a blocked send would stop B from reading.
            let n = (frames.len() - sent).min(30);
            a.reap_tx(0);
            if a.tx_outstanding(0) < 60 {
                a.send_burst(0, &frames[sent..sent + n], &TxOpts::default());
                sent += n;
            }
        }
        let r = b.recv_n(0, 8, ARRIVE);
        b.post_rx(0, r.len(), 2048);
        assert!(
            !r.is_empty(),
            "B stopped receiving after {} frames: {:?} / A: {:?}",
            got.len(),
            fab.stats(1),
            fab.stats(0)
        );
        got.extend(r);
    }
    let (sb, sa) = (fab.stats(1), fab.stats(0));
    assert_eq!(
        sb.totals.rx_drops, 0,
        "a slow but live receiver must not lose frames: {sb:?}"
    );
    assert!(sa.tx_pauses > 0, "the sender never paused: {sa:?}");
    for (i, r) in got.iter().enumerate() {
        assert!(r.data == frames[i], "frame {i} corrupted or out of order");
    }
    assert!(a.wait_tx(0, ARRIVE), "A's TX chains not all returned");
    // C never reads: A keeps flowing to B regardless (C stalls only itself).
    // More than C's queue takes: 16 frames and a headroom of 3 x 16.
    let to_c: Vec<Vec<u8>> = (0..128)
        .map(|t| tagged_frame(mc, ma, 10_000 + t, 700))
        .collect();
    a.send_burst(0, &to_c, &TxOpts::default());
    let f = tagged_frame(mb, ma, 20_000, 300);
    a.send(0, &f, &TxOpts::default());
    b.post_rx(0, 8, 2048);
    let r = b
        .recv(0, ARRIVE)
        .expect("A->B blocked by a receiver that stopped reading");
    assert!(r.data == f);
    let (sc, _) = fab.wait_stats(2, ARRIVE, |s| s.totals.rx_drops > 0);
    assert!(
        sc.totals.rx_drops > 0,
        "frames to the stalled receiver must be dropped and counted: {sc:?}"
    );
}

/// Sends one frame B->C and C->B and checks both arrive (the first ones may
/// also be flooded to A; A has no RX buffers posted so they are dropped there).
fn b_c_traffic(fab: &TestFabric, b: &mut TestGuest, c: &mut TestGuest, tag: u64) {
    let f = tagged_frame(fab.mac(2), fab.mac(1), tag, 200);
    b.send(0, &f, &TxOpts::default());
    let r = c
        .recv_any(ARRIVE)
        .unwrap_or_else(|| panic!("B->C frame {tag} lost"));
    assert!(r.data == f, "B->C frame {tag} corrupted");
    let f = tagged_frame(fab.mac(1), fab.mac(2), tag + 1, 200);
    c.send(0, &f, &TxOpts::default());
    let r = b
        .recv_any(ARRIVE)
        .unwrap_or_else(|| panic!("C->B frame {tag} lost"));
    assert!(r.data == f, "C->B frame {tag} corrupted");
}

#[test]
fn malformed_chains_are_refused_and_other_ports_keep_working() {
    let fab = TestFabric::start(3, 1);
    let mut a = fab.connect(0, feat::ALL);
    let mut b = fab.connect(1, feat::ALL);
    let mut c = fab.connect(2, feat::ALL);
    b.post_rx(0, 128, 2048);
    c.post_rx(0, 128, 2048);
    b_c_traffic(&fab, &mut b, &mut c, 0);
    // A's malformed frames would be broadcast if accepted.
    let bcast = tagged_frame(BROADCAST, fab.mac(0), 0xbad, 100);
    type Bad = fn(&mut TestGuest, &[u8]) -> u16;
    let bad: Vec<(&str, Bad)> = vec![
        ("address beyond guest memory", |g, _| g.send_bad_addr(0)),
        ("buffer straddling the end of guest memory", |g, _| {
            g.send_straddling(0)
        }),
        ("len 0xffff_ffff", |g, _| g.send_huge_len(0)),
        ("descriptor loop", |g, f| g.send_loop(0, f)),
        ("indirect table loop", |g, f| g.send_indirect_loop(0, f)),
        ("nested indirect", |g, f| g.send_nested_indirect(0, f)),
        ("chain shorter than the header", |g, _| g.send_short_hdr(0)),
        ("device-writable descriptor in TX", |g, f| {
            g.send_write_only(0, f)
        }),
    ];
    for (i, (what, send)) in bad.iter().enumerate() {
        let before = fab.stats(0).totals.tx_errors;
        send(&mut a, &bcast);
        let (s, ok) = fab.wait_stats(0, ARRIVE, |s| s.totals.tx_errors > before);
        assert!(ok, "{what}: tx_errors did not grow: {s:?}");
        b_c_traffic(&fab, &mut b, &mut c, 100 * (i as u64 + 1));
    }
    let leaked: Vec<RxFrame> = b
        .drain_all(QUIET)
        .into_iter()
        .chain(c.drain_all(QUIET))
        .collect();
    assert!(
        leaked.is_empty(),
        "parts of refused chains reached other ports: {:?}",
        leaked.iter().map(|r| r.data.len()).collect::<Vec<_>>()
    );
    let s = fab.stats(0);
    assert_eq!(
        s.totals.tx_frames, 0,
        "no malformed frame counts as sent: {s:?}"
    );
    assert!(s.totals.tx_errors >= bad.len() as u64, "{s:?}");
    for i in [1, 2] {
        let s = fab.stats(i);
        assert_eq!(s.totals.tx_errors, 0, "port {i}: {s:?}");
    }
}

#[test]
fn bad_headers_are_refused_returned_and_the_port_keeps_working() {
    let fab = TestFabric::start(2, 1);
    let mut a = fab.connect(0, feat::ALL);
    let mut b = fab.connect(1, feat::ALL);
    b.post_rx(0, 64, 2048);
    let (ma, mb) = (fab.mac(0), fab.mac(1));
    let (tcp, _) = tcp_frame(
        &Flow::v4(ma, mb, 1, 2),
        0,
        TCP_ACK,
        &pattern(3000, 0),
        L4Csum::Partial,
    );
    let garbage = [
        (
            "gso_type garbage",
            NetHdr {
                gso_type: 0x55,
                gso_size: 1000,
                hdr_len: 54,
                ..NetHdr::needs_csum(34, 16)
            },
        ),
        ("csum_start beyond the frame", NetHdr::needs_csum(60000, 16)),
        (
            "csum_offset beyond the frame",
            NetHdr::needs_csum(34, 40000),
        ),
        (
            "TSO with gso_size 0",
            NetHdr {
                gso_type: GSO_TCPV4,
                gso_size: 0,
                hdr_len: 54,
                ..NetHdr::needs_csum(34, 16)
            },
        ),
        (
            "TCPV4 GSO on an IPv6/UDP frame",
            NetHdr {
                gso_type: GSO_TCPV4,
                gso_size: 500,
                hdr_len: 54,
                ..NetHdr::needs_csum(54, 6)
            },
        ),
    ];
    let (udp6, _) = udp_frame(&Flow::v6(ma, mb, 1, 2), &pattern(3000, 1), L4Csum::Partial);
    for (i, (what, hdr)) in garbage.iter().enumerate() {
        let before = fab.stats(0).totals.tx_errors;
        let f = if i == 4 { &udp6 } else { &tcp };
        a.send(0, f, &TxOpts::hdr(*hdr));
        assert!(
            a.wait_tx(0, ARRIVE),
            "{what}: chain not returned to the guest"
        );
        let (s, ok) = fab.wait_stats(0, ARRIVE, |s| s.totals.tx_errors > before);
        assert!(ok, "{what}: tx_errors did not grow: {s:?}");
        let stray = b.drain_all(QUIET);
        assert!(
            stray.is_empty(),
            "{what}: refused frame reached B ({:?})",
            stray
                .iter()
                .map(|r| (r.hdr, r.data.len()))
                .collect::<Vec<_>>()
        );
        let ok_frame = tagged_frame(mb, ma, i as u64, 300);
        expect_cross(
            &mut a,
            &mut b,
            &ok_frame,
            &TxOpts::default(),
            &format!("after {what}"),
        );
    }
}

#[test]
fn port_keeps_working_after_descriptor_level_errors() {
    // Policy check: a malformed chain is skipped (returned with len 0) and the
    // queue goes on, rather than the queue or port being stopped.
    let fab = TestFabric::start(2, 1);
    let mut a = fab.connect(0, feat::ALL);
    let mut b = fab.connect(1, feat::ALL);
    b.post_rx(0, 64, 2048);
    let f = tagged_frame(fab.mac(1), fab.mac(0), 1, 100);
    a.send_bad_addr(0);
    a.send_huge_len(0);
    a.send_loop(0, &f);
    let returned = a.wait_tx(0, ARRIVE);
    let g = tagged_frame(fab.mac(1), fab.mac(0), 2, 100);
    a.send(0, &g, &TxOpts::default());
    let r = b.recv(0, ARRIVE);
    assert!(
        r.as_ref().is_some_and(|r| r.data == g),
        "valid frame after malformed chains did not arrive (malformed chains returned: {returned})"
    );
    assert!(
        returned,
        "malformed chains were never returned to the used ring"
    );
}

#[test]
fn disconnect_and_reconnect_resumes_traffic() {
    let fab = TestFabric::start(2, 1);
    let (ma, mb) = (fab.mac(0), fab.mac(1));
    let mut b = fab.connect(1, feat::ALL);
    b.post_rx(0, 128, 2048);
    for round in 0..3u64 {
        let mut a = fab.connect(0, feat::ALL);
        let (s, ok) = fab.wait_stats(0, ARRIVE, |s| s.connected);
        assert!(ok, "round {round}: A not reported connected: {s:?}");
        assert_eq!(s.connections, round + 1, "round {round}: {s:?}");
        a.post_rx(0, 16, 2048);
        let f = tagged_frame(mb, ma, round, 300);
        expect_cross(
            &mut a,
            &mut b,
            &f,
            &TxOpts::default(),
            &format!("round {round} A->B"),
        );
        let f = tagged_frame(ma, mb, round + 100, 300);
        expect_cross(
            &mut b,
            &mut a,
            &f,
            &TxOpts::default(),
            &format!("round {round} B->A"),
        );
        if round == 1 {
            // Like QEMU on guest stop: GET_VRING_BASE on every ring first.
            // The RX base must count exactly the buffers the device used: a
            // buffer it popped but did not fill would be lost for the guest.
            let bases = a.stop().expect("GET_VRING_BASE");
            assert_eq!(
                bases[0],
                u32::from(a.used_seen(0)),
                "rx ring base after stop"
            );
            assert_eq!(
                bases[1],
                u32::from(a.avail_idx(1)),
                "tx ring base after stop"
            );
        }
        drop(a);
        let (s, ok) = fab.wait_stats(0, ARRIVE, |s| !s.connected);
        assert!(ok, "round {round}: A still connected after drop: {s:?}");
        // Traffic towards the absent A must not disturb anything.
        b.send(0, &tagged_frame(ma, mb, 999, 100), &TxOpts::default());
        assert!(b.wait_tx(0, ARRIVE));
    }
    // B unaffected by A's reconnects.
    let f = tagged_frame(mb, mb, 7, 100);
    b.send(0, &f, &TxOpts::default());
    assert!(b.wait_tx(0, ARRIVE));
    assert!(
        b.drain_all(QUIET).is_empty(),
        "a frame to our own MAC must not come back"
    );
}

#[test]
fn reconnect_with_different_features_and_ring_sizes() {
    let fab = TestFabric::start(2, 1);
    let mut b = fab.connect(1, feat::ALL);
    b.post_rx(0, 64, 2048);
    let (ma, mb) = (fab.mac(0), fab.mac(1));
    for (round, (features, qsize)) in [
        (feat::ALL, 256u16),
        (feat::MINIMAL, 64),
        (feat::ALL & !feat::EVENT_IDX, 1024),
    ]
    .into_iter()
    .enumerate()
    {
        let mut opts = common::GuestOpts::new(1, features);
        opts.queue_size = qsize;
        let mut a = TestGuest::connect_with(fab.socket(0), opts).expect("connect");
        a.post_rx(0, 8, 2048);
        let f = tagged_frame(mb, ma, round as u64, 1514);
        expect_cross(
            &mut a,
            &mut b,
            &f,
            &TxOpts::default(),
            &format!("round {round}"),
        );
        let (g, _) = udp_frame(&Flow::v4(mb, ma, 5, 6), &pattern(500, 1), L4Csum::Partial);
        b.send(0, &g, &TxOpts::hdr(NetHdr::needs_csum(34, 6)));
        let r = a.recv(0, ARRIVE).expect("B->A");
        let p = parse(&r.data).unwrap();
        if a.has(feat::GUEST_CSUM) && r.hdr.flags & HDR_F_NEEDS_CSUM != 0 {
            assert!(r.data == g);
        } else {
            assert!(
                p.l4_csum_ok,
                "round {round}: checksum not finished for a receiver without GUEST_CSUM"
            );
        }
    }
}

#[test]
fn learning_switch_floods_unknown_and_forwards_learned_unicast() {
    let fab = TestFabric::start(3, 1);
    let mut g: Vec<TestGuest> = (0..3).map(|i| fab.connect(i, feat::ALL)).collect();
    for x in g.iter_mut() {
        x.post_rx(0, 64, 2048);
    }
    let m: Vec<[u8; 6]> = (0..3).map(port_mac).collect();

    // Broadcast from A reaches B and C, not A.
    let f = tagged_frame(BROADCAST, m[0], 1, 100);
    g[0].send(0, &f, &TxOpts::default());
    for i in [1, 2] {
        let r = g[i]
            .recv_any(ARRIVE)
            .unwrap_or_else(|| panic!("broadcast missing at {i}"));
        assert!(r.data == f);
    }
    assert!(
        g[0].drain_all(QUIET).is_empty(),
        "broadcast came back to its sender"
    );

    // Unknown unicast floods.
    let unknown = [0x02, 0, 0, 0, 0, 0x99];
    let f = tagged_frame(unknown, m[0], 2, 100);
    g[0].send(0, &f, &TxOpts::default());
    for i in [1, 2] {
        let r = g[i]
            .recv_any(ARRIVE)
            .unwrap_or_else(|| panic!("unknown unicast not flooded to {i}"));
        assert!(r.data == f);
    }

    // B sends: its MAC is learned; frames to it go only to B.
    let f = tagged_frame(BROADCAST, m[1], 3, 100);
    g[1].send(0, &f, &TxOpts::default());
    for i in [0, 2] {
        assert!(
            g[i].recv_any(ARRIVE).is_some(),
            "B's broadcast missing at {i}"
        );
    }
    for t in 0..5 {
        let f = tagged_frame(m[1], m[0], 10 + t, 100);
        g[0].send(0, &f, &TxOpts::default());
        let r = g[1].recv_any(ARRIVE).expect("unicast to B");
        assert!(r.data == f);
    }
    let stray = g[2].drain_all(QUIET);
    assert!(
        stray.is_empty(),
        "C received {} frames addressed to B's learned MAC",
        stray.len()
    );

    // A MAC that is not any port's configured MAC (e.g. a bridge inside guest B)
    // is learned from traffic too.
    let inner = [0x02, 0, 0, 0, 0, 0x42];
    let f = tagged_frame(BROADCAST, inner, 20, 100);
    g[1].send(0, &f, &TxOpts::default());
    for i in [0, 2] {
        assert!(
            g[i].recv_any(ARRIVE).is_some(),
            "broadcast from inner MAC missing at {i}"
        );
    }
    let f = tagged_frame(inner, m[0], 21, 100);
    g[0].send(0, &f, &TxOpts::default());
    let r = g[1].recv_any(ARRIVE).expect("unicast to learned inner MAC");
    assert!(r.data == f);
    assert!(
        g[2].drain_all(QUIET).is_empty(),
        "C received a frame for a MAC learned on B"
    );

    // The MAC moves: the inner host now talks from C.
    let f = tagged_frame(BROADCAST, inner, 30, 100);
    g[2].send(0, &f, &TxOpts::default());
    for i in [0, 1] {
        assert!(g[i].recv_any(ARRIVE).is_some());
    }
    let f = tagged_frame(inner, m[0], 31, 100);
    g[0].send(0, &f, &TxOpts::default());
    let r = g[2]
        .recv_any(ARRIVE)
        .expect("unicast follows the moved MAC");
    assert!(r.data == f);
    assert!(
        g[1].drain_all(QUIET).is_empty(),
        "B still gets frames for a MAC that moved to C"
    );
    assert!(wait_until(ARRIVE, || fab.stats(2).totals.rx_frames >= 4));
}

#[test]
fn oversized_frame_for_small_buffers_is_dropped_not_truncated() {
    // No MRG_RXBUF, no GUEST_TSO: a 4000-byte frame cannot fit a 2048-byte buffer.
    let fab = TestFabric::start(2, 1);
    let mut a = fab.connect(0, feat::ALL);
    let mut b = fab.connect(1, feat::MINIMAL);
    b.post_rx(0, 4, 2048);
    let big = tagged_frame(fab.mac(1), fab.mac(0), 1, 4000);
    a.send(0, &big, &TxOpts::default());
    assert!(a.wait_tx(0, ARRIVE));
    let (s, ok) = fab.wait_stats(1, ARRIVE, |s| s.totals.rx_drops >= 1);
    assert!(ok, "oversized frame not counted as a drop: {s:?}");
    let got = b.drain_all(QUIET);
    assert!(
        got.is_empty(),
        "a 4000-byte frame was delivered into 2048-byte buffers: {:?}",
        got.iter()
            .map(|r| (r.data.len(), r.used_lens.clone()))
            .collect::<Vec<_>>()
    );
    let f = tagged_frame(fab.mac(1), fab.mac(0), 2, 1514);
    expect_cross(
        &mut a,
        &mut b,
        &f,
        &TxOpts::default(),
        "normal frame after the drop",
    );
    assert_eq!(fab.stats(1).totals.rx_frames, 1);
}

#[test]
fn offloads_the_sender_did_not_negotiate_are_refused() {
    let fab = TestFabric::start(2, 1);
    let mut a = fab.connect(0, feat::MINIMAL); // no CSUM, no HOST_TSO
    let mut b = fab.connect(1, feat::ALL);
    b.post_rx(0, 32, 4096);
    let flow = Flow::v4(fab.mac(0), fab.mac(1), 1, 2);
    let (f, hdr) = tso_frame(&flow, 0, TCP_ACK, &pattern(5000, 0), 1000);
    a.send(0, &f, &TxOpts::hdr(hdr));
    assert!(a.wait_tx(0, ARRIVE));
    let (s, ok) = fab.wait_stats(0, ARRIVE, |s| s.totals.tx_errors >= 1);
    assert!(ok, "GSO from a guest without HOST_TSO4 accepted: {s:?}");
    assert!(
        b.drain_all(QUIET).is_empty(),
        "un-negotiated GSO frame delivered"
    );
}

#[test]
fn ring_indices_wrap_around_u16() {
    // Rings start at index 65000: avail/used indices cross 65535 -> 0.
    let fab = TestFabric::start(2, 1);
    for features in [feat::ALL, feat::MINIMAL] {
        let mut opts = common::GuestOpts::new(1, features);
        opts.initial_idx = 65000;
        opts.queue_size = 64;
        let mut a = TestGuest::connect_with(fab.socket(0), opts.clone()).expect("connect A");
        let mut b = TestGuest::connect_with(fab.socket(1), opts).expect("connect B");
        let (ma, mb) = (fab.mac(0), fab.mac(1));
        for round in 0..30u64 {
            b.post_rx(0, 40, 2048);
            let frames: Vec<Vec<u8>> = (0..40)
                .map(|i| tagged_frame(mb, ma, round * 100 + i, 128))
                .collect();
            a.send_burst(0, &frames, &TxOpts::default());
            let got = b.recv_n(0, 40, ARRIVE);
            assert_eq!(got.len(), 40, "round {round} (features {features:#x})");
            for (r, f) in got.iter().zip(&frames) {
                assert!(&r.data == f, "round {round}: frame corrupted or reordered");
            }
        }
        assert!(a.avail_idx(1) < 65000, "the TX avail index did not wrap");
    }
}

#[test]
fn concurrent_senders_stress() {
    // A and C blast B at the same time from their own threads while B receives
    // in a third: every frame is delivered intact, in per-sender order, or counted.
    const N: u64 = 2000;
    let fab = TestFabric::start_with(3, |i, dir| {
        let mut p = TestFabric::port_config(dir, i, 1);
        p.rx_queue_frames = 1024;
        p
    });
    let mb = fab.mac(1);
    let mut b = fab.connect(1, feat::ALL);
    b.post_rx(0, 256, 2048);
    let senders: Vec<_> = [0usize, 2]
        .into_iter()
        .map(|i| {
            let mut g = fab.connect(i, feat::ALL);
            let src = fab.mac(i);
            std::thread::spawn(move || {
                for chunk in 0..N / 50 {
                    let frames: Vec<Vec<u8>> = (0..50)
                        .map(|k| {
                            tagged_frame(
                                mb,
                                src,
                                ((i as u64) << 32) | (chunk * 50 + k),
                                64 + (k as usize * 29) % 1400,
                            )
                        })
                        .collect();
                    g.send_burst(0, &frames, &TxOpts::default());
                }
                assert!(
                    g.wait_tx(0, Duration::from_secs(30)),
                    "sender {i}: TX not drained"
                );
                g
            })
        })
        .collect();
    let mut got: Vec<RxFrame> = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut idle = 0;
    while std::time::Instant::now() < deadline && idle < 10 {
        let rs = b.recv_n(0, 128, Duration::from_millis(100));
        if rs.is_empty() {
            if senders.iter().all(|s| s.is_finished()) {
                idle += 1;
            }
            continue;
        }
        b.post_rx(0, rs.iter().map(|r| r.buffers).sum(), 2048);
        got.extend(rs);
    }
    let gs: Vec<TestGuest> = senders.into_iter().map(|t| t.join().unwrap()).collect();
    let s = fab.stats(1);
    assert_eq!(
        got.len() as u64 + s.totals.rx_drops,
        2 * N,
        "delivered {} + dropped {} != sent: {s:?}",
        got.len(),
        s.totals.rx_drops
    );
    let mut last = [None::<u64>; 3];
    for r in &got {
        let t = frame_tag(&r.data).expect("foreign frame at B");
        let (who, seq) = ((t >> 32) as usize, t & 0xffff_ffff);
        let want = tagged_frame(mb, fab.mac(who), t, 64 + ((seq % 50) as usize * 29) % 1400);
        assert!(r.data == want, "frame {who}/{seq} corrupted");
        assert!(
            last[who] < Some(seq),
            "sender {who}: {:?} then {seq}",
            last[who]
        );
        last[who] = Some(seq);
    }
    drop(gs);
}

#[test]
fn mergeable_rx_waits_for_enough_buffers() {
    // A 60 KB GSO frame needs 15 x 4 KiB buffers; only 5 are posted at first.
    // The device must never hand over a partial frame: either it waits for
    // more buffers or it drops (and counts) the frame.
    let fab = TestFabric::start(2, 1);
    let mut a = fab.connect(0, feat::ALL);
    let mut b = fab.connect(1, feat::ALL);
    b.post_rx(0, 5, 4096);
    let flow = Flow::v4(fab.mac(0), fab.mac(1), 40000, 5001);
    let (f, hdr) = tso_frame(&flow, 1, TCP_ACK, &pattern(60000, 1), 1448);
    a.send(0, &f, &TxOpts::hdr(hdr));
    assert!(a.wait_tx(0, ARRIVE));
    let early = b.drain_all(QUIET);
    assert!(
        early.is_empty(),
        "delivered with only 5 buffers: {:?}",
        early.iter().map(|r| r.buffers).collect::<Vec<_>>()
    );
    b.post_rx(0, 20, 4096);
    let small = tagged_frame(fab.mac(1), fab.mac(0), 5, 100);
    a.send(0, &small, &TxOpts::default());
    let got = b.drain_all(Duration::from_secs(1));
    let s = fab.stats(1);
    match got.len() {
        2 => {
            assert!(
                got[0].data == f && got[0].hdr.gso_type == GSO_TCPV4,
                "big frame corrupted"
            );
            assert_eq!(got[0].hdr.num_buffers, 15);
            assert!(got[1].data == small);
        }
        1 => {
            assert!(got[0].data == small, "unexpected frame");
            assert_eq!(
                s.totals.rx_drops, 1,
                "big frame neither delivered nor counted: {s:?}"
            );
        }
        n => panic!(
            "{n} frames delivered: {:?}",
            got.iter().map(|r| r.data.len()).collect::<Vec<_>>()
        ),
    }
}
