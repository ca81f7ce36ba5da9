//! Header/data split placement, thresholds, pool exhaustion.

mod common;

use std::collections::HashSet;

use common::{assert_covers, nic_with_buffers, pattern, v4, v6, Memory, Rng};
use devmem_nic::{Delivery, DropReason, HdsConfig, Nic, NicError, Placement, QueueConfig};
use wire::builder::{FrameBuilder, Ipv6Ext};
use wire::l4::L4Proto;
use wire::parse;

const SIZES: [usize; 7] = [1, 2, 100, 1448, 4096, 9000, 65000];
const HDR: usize = 256;
const BUF: usize = 4096;

fn builders() -> Vec<(&'static str, FrameBuilder, usize)> {
    let mut ext = FrameBuilder::udp(v6("2001:db8::1"), 4791, v6("2001:db8::2"), 4791);
    ext.ipv6_ext = vec![
        Ipv6Ext::HopByHop,
        Ipv6Ext::HomeAddress("2001:db8::9".parse().unwrap()),
    ];
    let mut vlan = FrameBuilder::tcp(v4([192, 168, 1, 1]), 33000, v4([192, 168, 1, 2]), 5201);
    vlan.vlan_tci = Some(100);
    vlan.ipv4_options = vec![1, 1, 1, 1];
    vlan.transport = wire::builder::Transport::Tcp {
        src_port: 33000,
        dst_port: 5201,
        options: vec![1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2], // NOP NOP timestamps
    };
    vec![
        (
            "tcp4",
            FrameBuilder::tcp(v4([10, 0, 0, 1]), 40000, v4([10, 0, 0, 2]), 5201),
            54,
        ),
        (
            "tcp6",
            FrameBuilder::tcp(v6("fd00::1"), 40000, v6("fd00::2"), 5201),
            74,
        ),
        (
            "udp4",
            FrameBuilder::udp(v4([10, 0, 0, 1]), 40000, v4([10, 0, 0, 2]), 4791),
            42,
        ),
        ("udp6+ext", ext, 14 + 40 + 8 + 24 + 8),
        ("tcp4+vlan+opts", vlan, 18 + 24 + 32),
    ]
}

fn placed(nic: &mut Nic, frame: &[u8]) -> Placement {
    match nic.receive(frame).delivery {
        Delivery::Placed(p) => p,
        Delivery::Dropped(r) => panic!("dropped: {r:?}"),
    }
}

#[test]
fn split_every_size_reassembles() {
    for (name, b, hlen) in builders() {
        let mut nic = nic_with_buffers(1, QueueConfig::default(), 4, 64);
        let mut mem = Memory::default();
        for size in SIZES {
            let payload = pattern(size);
            let frame = b.build(&payload);
            let p = placed(&mut nic, &frame);
            assert_covers(&p, frame.len());
            assert_eq!(p.split_at, Some(hlen), "{name} {size}");
            assert_eq!(p.payload.len(), size.div_ceil(BUF), "{name} {size}");
            mem.write(&frame, &p, HDR, BUF);
            let (h, d) = mem.read(&p);
            // Every payload byte is in payload buffers, none in the header.
            assert_eq!(d, payload, "{name} {size}: payload differs");
            assert_eq!(h, frame[..hlen], "{name} {size}: header differs");
            // The header buffer alone still parses to the same flow.
            let ph = parse(&h);
            let pf = parse(&frame);
            assert_eq!(ph.l4, pf.l4, "{name} {size}");
            assert!(ph.l4.is_some());
            nic.recycle(&p).unwrap();
            mem.release(&p);
        }
        let c = nic.queue_counters(0).unwrap();
        assert_eq!((c.frames, c.split_frames), (7, 7));
    }
}

#[test]
fn threshold_semantics() {
    let b = FrameBuilder::tcp(v4([10, 0, 0, 1]), 1, v4([10, 0, 0, 2]), 2);
    for (thresh, expect_split) in [
        (0, [true, true, true, true, true, true, true]),
        (1, [false, true, true, true, true, true, true]),
        (100, [false, false, false, true, true, true, true]),
        (1448, [false, false, false, false, true, true, true]),
        (65000, [false; 7]),
    ] {
        let qc = QueueConfig {
            hds: HdsConfig {
                enabled: true,
                thresh,
            },
            ..QueueConfig::default()
        };
        let mut nic = nic_with_buffers(1, qc, 4, 64);
        for (size, split) in SIZES.into_iter().zip(expect_split) {
            let frame = b.build(&pattern(size));
            let p = placed(&mut nic, &frame);
            assert_covers(&p, frame.len());
            assert_eq!(p.split_at.is_some(), split, "thresh {thresh} size {size}");
            if !split {
                if frame.len() <= HDR {
                    // Small unsplit frame: whole frame in the header buffer.
                    assert_eq!(p.header.as_ref().unwrap().frame_range, 0..frame.len());
                    assert!(p.payload.is_empty());
                } else {
                    // Large unsplit frame: whole frame in payload buffers.
                    assert!(p.header.is_none());
                    assert_eq!(p.payload.len(), frame.len().div_ceil(BUF));
                }
            }
            nic.recycle(&p).unwrap();
        }
    }
}

#[test]
fn zero_payload_padding_non_ip_and_hds_off() {
    let mut nic = nic_with_buffers(1, QueueConfig::default(), 4, 64);
    let b = FrameBuilder::tcp(v4([10, 0, 0, 1]), 1, v4([10, 0, 0, 2]), 2);
    // Pure ACK: nothing to split even with thresh 0.
    let ack = b.build(&[]);
    let p = placed(&mut nic, &ack);
    assert_eq!((p.split_at, p.payload.len()), (None, 0));
    nic.recycle(&p).unwrap();
    // Padded pure ACK (60 bytes on the wire): padding does not cause a split.
    let mut padded = ack.clone();
    padded.resize(60, 0);
    let p = placed(&mut nic, &padded);
    assert_eq!(p.split_at, None);
    assert_eq!(p.header.as_ref().unwrap().frame_range, 0..60);
    nic.recycle(&p).unwrap();
    // Padded 1-byte segment: split after TCP; the payload buffer holds the
    // byte and the padding (a NIC DMAs the whole frame).
    let mut one = b.build(&[0xab]);
    one.resize(60, 0);
    let p = placed(&mut nic, &one);
    assert_eq!(p.split_at, Some(54));
    assert_eq!(p.payload[0].frame_range, 54..60);
    assert_eq!(parse(&one).l4_payload_len(), Some(1));
    nic.recycle(&p).unwrap();
    // Non-IP: never split.
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06]);
    arp.extend_from_slice(&[0; 28]);
    let p = placed(&mut nic, &arp);
    assert_eq!(p.split_at, None);
    assert_eq!(p.header.as_ref().unwrap().frame_range, 0..arp.len());
    nic.recycle(&p).unwrap();
    let mut big = arp[..14].to_vec();
    big[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    big.extend_from_slice(&pattern(5000));
    let p = placed(&mut nic, &big);
    assert_eq!(
        (p.split_at, p.header.is_none(), p.payload.len()),
        (None, true, 2)
    );
    nic.recycle(&p).unwrap();
    // Other IP protocol: split at the end of L3.
    let gre = FrameBuilder::new(
        v4([1, 2, 3, 4]),
        v4([5, 6, 7, 8]),
        wire::builder::Transport::Other(47),
    )
    .build(&pattern(300));
    let p = placed(&mut nic, &gre);
    assert_eq!(p.split_at, Some(34));
    nic.recycle(&p).unwrap();
    // IPv6 fragment: split at the end of the fragment header.
    let mut f6 = FrameBuilder::tcp(v6("fd00::1"), 1, v6("fd00::2"), 2);
    f6.ipv6_ext = vec![Ipv6Ext::Fragment {
        offset: 10,
        more: true,
    }];
    let p = placed(&mut nic, &f6.build(&pattern(100)));
    assert_eq!(p.split_at, Some(14 + 40 + 8));
    nic.recycle(&p).unwrap();

    // HDS off: everything in payload buffers, header pool untouched.
    nic.queue_mut(0).unwrap().set_hds(HdsConfig {
        enabled: false,
        thresh: 0,
    });
    for size in SIZES {
        let frame = b.build(&pattern(size));
        let p = placed(&mut nic, &frame);
        assert_covers(&p, frame.len());
        assert!(p.header.is_none() && p.split_at.is_none());
        nic.recycle(&p).unwrap();
    }
    assert_eq!(nic.queue(0).unwrap().header_pool.available(), 4);
}

#[test]
fn too_big() {
    let qc = QueueConfig {
        header_buf_size: 64,
        max_payload_buffers: 8,
        ..QueueConfig::default()
    };
    let mut nic = nic_with_buffers(1, qc, 4, 64);
    // IPv6 + TCP headers (74 bytes) do not fit a 64-byte header buffer.
    let t6 = FrameBuilder::tcp(v6("fd00::1"), 1, v6("fd00::2"), 2).build(b"x");
    assert_eq!(
        nic.receive(&t6).delivery,
        Delivery::Dropped(DropReason::TooBig)
    );
    // 65000 bytes need 16 payload buffers; at most 8 allowed.
    let t4 = FrameBuilder::tcp(v4([1, 1, 1, 1]), 1, v4([2, 2, 2, 2]), 2);
    let big = t4.build(&pattern(65000));
    assert_eq!(
        nic.receive(&big).delivery,
        Delivery::Dropped(DropReason::TooBig)
    );
    // Frames above max_frame_len.
    let mut nic = nic_with_buffers(1, QueueConfig::default(), 4, 64);
    let mut huge = t4.build(&pattern(65000));
    huge.resize(70000, 0);
    assert_eq!(
        nic.receive(&huge).delivery,
        Delivery::Dropped(DropReason::TooBig)
    );
    let c = *nic.queue_counters(0).unwrap();
    assert_eq!((c.drop_too_big, c.frames), (1, 0));
    assert_eq!(
        nic.queue(0).unwrap().payload_pool.available(),
        64,
        "nothing taken"
    );
}

#[test]
fn pool_exhaustion_drops_and_never_reuses_held_buffers() {
    // 2 header buffers, 3 payload buffers of 4096 bytes.
    let mut nic = nic_with_buffers(1, QueueConfig::default(), 2, 3);
    let b = FrameBuilder::tcp(v4([10, 0, 0, 1]), 1, v4([10, 0, 0, 2]), 2);
    let mut mem = Memory::default();

    let f9000 = b.build(&pattern(9000));
    let p1 = placed(&mut nic, &f9000); // 1 header + 3 payload
    mem.write(&f9000, &p1, HDR, BUF);
    let f1 = b.build(&[7]);
    // No payload buffer left: dropped, counted, and no header buffer taken.
    assert_eq!(
        nic.receive(&f1).delivery,
        Delivery::Dropped(DropReason::NoPayloadBuffer)
    );
    assert_eq!(nic.queue(0).unwrap().header_pool.available(), 1);
    // Re-posting a held buffer is refused.
    let held = p1.payload[0].buffer;
    assert_eq!(nic.post_payload(0, held), Err(NicError::InUse(held)));
    // The original data is still intact.
    assert_eq!(mem.read(&p1).1, pattern(9000));

    // Recycle one payload buffer: the 1-byte frame now fits.
    nic.queue_mut(0)
        .unwrap()
        .payload_pool
        .recycle(held)
        .unwrap();
    mem.payload.remove(&held);
    let p2 = placed(&mut nic, &f1);
    assert_eq!(
        p2.payload[0].buffer, held,
        "only the recycled buffer was free"
    );
    mem.write(&f1, &p2, HDR, BUF);
    // Both header buffers held now: a small frame has nowhere to go.
    let ack = b.build(&[]);
    assert_eq!(
        nic.receive(&ack).delivery,
        Delivery::Dropped(DropReason::NoHeaderBuffer)
    );
    let c = *nic.queue_counters(0).unwrap();
    assert_eq!(
        (c.frames, c.drop_no_payload_buffer, c.drop_no_header_buffer),
        (2, 1, 1)
    );
    assert_eq!(nic.counters().drop_queue, 2);

    // Randomized: keep up to N frames held, recycle in random order, and
    // check that no placement ever uses a held buffer.
    let mut nic = nic_with_buffers(2, QueueConfig::default(), 8, 24);
    let mut rng = Rng(0x5eed);
    let mut live: Vec<Placement> = Vec::new();
    let mut held: HashSet<(u16, bool, u32)> = HashSet::new();
    let (mut ok, mut dropped) = (0, 0);
    for _ in 0..3000 {
        if !live.is_empty() && rng.below(3) == 0 {
            let p = live.swap_remove(rng.below(live.len()));
            nic.recycle(&p).unwrap();
            if let Some(s) = &p.header {
                assert!(held.remove(&(p.queue, true, s.buffer)));
            }
            for s in &p.payload {
                assert!(held.remove(&(p.queue, false, s.buffer)));
            }
        }
        let size = [0, 1, 100, 1448, 9000, 20000][rng.below(6)];
        let frame = b.build(&pattern(size));
        let q = rng.below(2) as u16;
        // Pick the queue directly to stress both queues' pools.
        let out = nic.queue_mut(q).unwrap().place(&frame, &parse(&frame));
        match out {
            Ok(p) => {
                ok += 1;
                assert_covers(&p, frame.len());
                if let Some(s) = &p.header {
                    assert!(
                        held.insert((q, true, s.buffer)),
                        "header {} reused",
                        s.buffer
                    );
                }
                for s in &p.payload {
                    assert!(
                        held.insert((q, false, s.buffer)),
                        "payload {} reused",
                        s.buffer
                    );
                }
                live.push(p);
            }
            Err(r) => {
                dropped += 1;
                assert!(matches!(
                    r,
                    DropReason::NoHeaderBuffer | DropReason::NoPayloadBuffer
                ));
            }
        }
    }
    assert!(ok > 500 && dropped > 100, "ok {ok} dropped {dropped}");
    let total_drops: u64 = (0..2)
        .map(|q| {
            let c = nic.queue_counters(q).unwrap();
            c.drop_no_header_buffer + c.drop_no_payload_buffer
        })
        .sum();
    assert_eq!(total_drops, dropped);
}

#[test]
fn split_header_keeps_l4_identity() {
    // Sanity for consumers: the header buffer of a split TCP frame holds a
    // complete TCP header.
    let mut nic = nic_with_buffers(1, QueueConfig::default(), 1, 4);
    let frame =
        FrameBuilder::tcp(v4([10, 0, 0, 1]), 1234, v4([10, 0, 0, 2]), 5201).build(&pattern(1448));
    let p = placed(&mut nic, &frame);
    let h = &frame[p.header.unwrap().frame_range];
    let l4 = parse(h).l4.unwrap();
    assert_eq!(
        (l4.proto, l4.src_port, l4.dst_port),
        (L4Proto::Tcp, 1234, 5201)
    );
}
