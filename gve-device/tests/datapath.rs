//! TX (checksum, TSO, completions), RX (header split, multi-buffer,
//! completions), RSS, flow rules and interrupts.

mod common;

use common::*;
use gve_device::adminq::{opcode, status};
use gve_device::GveConfig;
use pci_model::{PciDevice, RxRefusal};

const A: [u8; 4] = [10, 0, 0, 1];
const B: [u8; 4] = [10, 0, 0, 2];

fn up(cfg: GveConfig, nq: u32, buf: u32, hsplit: bool) -> Guest {
    let mut g = Guest::new(cfg);
    g.probe();
    g.open(nq, 64, buf, hsplit);
    g.irqs.clear();
    g
}

#[test]
fn tx_checksum_offload_and_completion() {
    let mut g = up(GveConfig::default(), 2, 2048, true);
    let mut f = tcp4(A, B, 1000, 80, 7, 0x18, b"hello world");
    // CHECKSUM_PARTIAL: the stack leaves a pseudo-header seed, not the sum.
    f[14 + 20 + 16..14 + 20 + 18].copy_from_slice(&[0x12, 0x34]);
    // Header and payload in two buffers, as linear part + frag.
    g.send(1, &[&f[..54], &f[54..]], None, true, 5, false);
    assert_eq!(g.wire.len(), 1);
    assert!(checksums_ok(&g.wire[0]));
    assert_eq!(&g.wire[0][54..], b"hello world");
    let c = g.tx_completions(1);
    assert_eq!(c, vec![(2, 5, 1)], "packet completion, tag 5, queue 1");
    // TX queue 1's block is ntfy 1 -> vector 1.
    assert_eq!(g.irqs, vec![1]);
    let s = g.dev.status();
    assert_eq!(s.counters.tx_queues[1].packets, 1);
    assert_eq!(s.counters.tx_bytes, f.len() as u64);
}

#[test]
fn tso_segments() {
    let mut g = up(GveConfig::default(), 1, 2048, true);
    let payload: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
    let mut f = tcp4(A, B, 40000, 5201, 1_000_000, 0x18 | 0x01 | 0x80, &payload);
    // BIG TCP style: the length field says nothing useful.
    f[16..18].copy_from_slice(&[0, 0]);
    g.send(
        0,
        &[&f[..54], &f[54..1500], &f[1500..]],
        Some((1000, 54)),
        true,
        9,
        true,
    );
    assert_eq!(g.wire.len(), 3);
    for (i, s) in g.wire.iter().enumerate() {
        assert_eq!(s.len(), 54 + 1000);
        assert!(checksums_ok(s), "segment {i} checksums");
        assert_eq!(be16(s, 16) as usize, 20 + 20 + 1000, "IP total length");
        assert_eq!(be16(s, 18), 0x1234 + i as u16, "IP id increments");
        assert_eq!(be32(s, 38), 1_000_000 + 1000 * i as u32, "TCP seq");
        let flags = s[47];
        assert_eq!(flags & 0x80 != 0, i == 0, "CWR only first");
        assert_eq!(flags & 0x09 != 0, i == 2, "FIN/PSH only last");
        assert_eq!(&s[54..], &payload[1000 * i..1000 * (i + 1)]);
    }
    // Packet completion, then a descriptor completion with the new head
    // (TSO ctx + general ctx + 3 data descriptors = 5).
    assert_eq!(g.tx_completions(0), vec![(2, 9, 0), (4, 5, 0)]);
    assert_eq!(g.dev.status().counters.tx_queues[0].tso_packets, 1);
}

/// Back-pressure: while the edge says its receivers are full, doorbells
/// leave the packets in the ring (no frame, no completion: the driver's
/// ring fills and it stops the queue); the edge's next poll sends them.
#[test]
fn tx_waits_while_the_edge_is_paused() {
    let mut g = up(GveConfig::default(), 1, 2048, false);
    let f = tcp4(A, B, 1, 2, 3, 0x10, b"x");
    g.tx_paused = true;
    g.send(0, &[&f], None, false, 1, false);
    g.send(0, &[&f], None, false, 2, false);
    assert!(g.wire.is_empty(), "sent while paused");
    assert!(g.tx_completions(0).is_empty(), "completed while paused");
    g.tx_paused = false;
    g.poll();
    assert_eq!(g.wire.len(), 2);
    assert_eq!(g.tx_completions(0), vec![(2, 1, 0), (2, 2, 0)]);
}

/// What one poll sends is bounded (`tx_poll_bytes`): the rest stays in the
/// rings, `next_timeout` asks for another poll at once, and queues take
/// turns so none starves under the bound.
#[test]
fn tx_poll_budget_bounds_a_call_and_rotates_queues() {
    let mut g = up(
        GveConfig {
            tx_poll_bytes: 3000,
            ..Default::default()
        },
        2,
        2048,
        false,
    );
    let f = tcp4(A, B, 1, 2, 3, 0x10, &[7; 1000]);
    // Queued while paused: five packets on queue 0 behind one doorbell.
    g.tx_paused = true;
    for tag in 0..5 {
        g.send(0, &[&f], None, false, tag, false);
    }
    assert!(g.wire.is_empty());
    assert_eq!(g.dev.next_timeout(g.now), None, "polled while paused");
    g.tx_paused = false;
    g.poll();
    // 1054-byte frames: the third reaches 3000 and is sent whole.
    assert_eq!(g.wire.len(), 3);
    assert_eq!(g.dev.next_timeout(g.now), Some(g.now), "at once");
    g.poll();
    assert_eq!(g.wire.len(), 5);
    assert_eq!(g.dev.next_timeout(g.now), None, "no work left");
    assert_eq!(g.tx_completions(0).len(), 5);
    // A bound of one packet a poll over two busy queues: they alternate.
    let mut g = up(
        GveConfig {
            tx_poll_bytes: 1,
            ..Default::default()
        },
        2,
        2048,
        false,
    );
    g.tx_paused = true;
    for tag in 0..3 {
        g.send(0, &[&f], None, false, tag, false);
        g.send(1, &[&f], None, false, 10 + tag, false);
    }
    g.tx_paused = false;
    let mut order = Vec::new();
    loop {
        let before = g.wire.len();
        g.poll();
        assert_eq!(g.wire.len(), before + 1, "one packet a poll");
        for q in 0..2 {
            order.extend(g.tx_completions(q).iter().map(|c| c.1));
        }
        if g.dev.next_timeout(g.now).is_none() {
            break;
        }
    }
    let q0: Vec<u16> = order.iter().copied().filter(|&t| t < 10).collect();
    assert_eq!(q0, [0, 1, 2]);
    assert_eq!(order.len(), 6);
    assert!(
        order.windows(2).all(|w| (w[0] < 10) != (w[1] < 10)),
        "queues did not take turns: {order:?}"
    );
}

#[test]
fn tx_completion_generation_wraps() {
    let mut g = up(GveConfig::default(), 1, 2048, false);
    let f = tcp4(A, B, 1, 2, 3, 0x10, b"x");
    // 64-entry rings; each packet uses 2 descriptors and 1 completion.
    for i in 0..100u16 {
        g.send(0, &[&f], None, false, i, false);
        let c = g.tx_completions(0);
        assert_eq!(c, vec![(2, i, 0)], "completion {i}");
    }
    assert_eq!(g.wire.len(), 100);
}

#[test]
fn rx_header_split_multi_buffer() {
    // A 3000-byte payload needs an MTU above 1500.
    let mut g = up(
        GveConfig {
            mtu: 4000,
            ..Default::default()
        },
        1,
        2048,
        true,
    );
    let payload: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    let f = tcp4(A, B, 5201, 40000, 1, 0x18, &payload);
    g.receive(&f).unwrap();
    let c = g.rx_completions(0);
    assert_eq!(c.len(), 2);
    assert!(c[0].split_header && !c[0].eop && !c[0].hbo);
    assert_eq!(c[0].header_len, 54);
    assert_eq!(c[0].packet_len, 2048);
    assert!(!c[1].split_header && c[1].eop);
    assert_eq!(c[1].header_len, 0);
    assert_eq!(c[1].packet_len as usize, 3000 - 2048);
    // Headers in the header buffer, payload in the data buffers.
    assert_eq!(g.read(g.hdr_addr(0, c[0].buf_id), 54), &f[..54]);
    assert_eq!(g.read(g.buf_addr(0, c[0].buf_id), 2048), &payload[..2048]);
    assert_eq!(g.read(g.buf_addr(0, c[1].buf_id), 952), &payload[2048..]);
    // ptype: IPv4/TCP per the device's map; checksums verified.
    let pt = usize::from(c[1].ptype);
    assert_eq!((g.ptype_map[2 * pt], g.ptype_map[2 * pt + 1]), (2, 2));
    assert!(c[1].l3_l4_processed && !c[1].csum_ip_err && !c[1].csum_l4_err);
    // RX queue 0's block is ntfy 4 -> vector 4.
    assert_eq!(g.irqs, vec![4]);
    let s = g.dev.status().counters.rx_queues[0];
    assert_eq!((s.packets, s.hsplit_packets, s.header_bytes), (1, 1, 54));
    assert_eq!(s.payload_bytes, 3000);
}

#[test]
fn rx_small_frames_and_bad_checksum() {
    let mut g = up(GveConfig::default(), 1, 2048, true);
    // Pure ACK: all headers, empty data buffer.
    let ack = tcp4(A, B, 5201, 40000, 1, 0x10, b"");
    g.receive(&ack).unwrap();
    // The same ACK padded to the Ethernet minimum: padding stays with the
    // headers, no data bytes.
    let mut padded = ack.clone();
    padded.resize(60, 0);
    g.receive(&padded).unwrap();
    // ARP (not TCP/UDP): whole frame into the header buffer.
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06]);
    arp.extend_from_slice(&[0; 28]);
    g.receive(&arp).unwrap();
    // Corrupt TCP checksum: delivered, flagged.
    let mut bad = tcp4(A, B, 5201, 40000, 1, 0x18, b"data");
    bad[55] ^= 0xff;
    g.receive(&bad).unwrap();
    let mut c = g.rx_completions(0);
    assert_eq!(c.len(), 4);
    assert!(c[0].split_header && c[0].eop);
    assert_eq!((c[0].header_len, c[0].packet_len), (54, 0));
    assert_eq!((c[1].header_len, c[1].packet_len), (60, 0));
    assert!(c[1].l3_l4_processed && !c[1].csum_l4_err);
    c.remove(1);
    assert_eq!((c[1].header_len, c[1].packet_len), (arp.len() as u16, 0));
    assert_eq!(g.read(g.hdr_addr(0, c[1].buf_id), arp.len()), arp);
    assert!(!c[1].l3_l4_processed);
    assert!(c[2].l3_l4_processed && c[2].csum_l4_err && !c[2].csum_ip_err);
    assert_eq!(g.dev.status().counters.rx_csum_errors, 1);
}

#[test]
fn rx_without_header_split() {
    let mut g = up(GveConfig::default(), 1, 2048, false);
    let f = tcp4(A, B, 5201, 40000, 1, 0x18, &[0xab; 1000]);
    g.receive(&f).unwrap();
    let c = g.rx_completions(0);
    assert_eq!(c.len(), 1);
    assert!(!c[0].split_header && c[0].eop);
    assert_eq!(c[0].packet_len as usize, f.len());
    assert_eq!(g.read(g.buf_addr(0, c[0].buf_id), f.len()), f);
}

#[test]
fn rx_no_buffers_is_backpressure() {
    let mut g = up(GveConfig::default(), 1, 2048, true);
    let f = tcp4(A, B, 5201, 40000, 1, 0x18, b"x");
    // 63 buffers were posted; use them all.
    for _ in 0..63 {
        g.receive(&f).unwrap();
    }
    assert_eq!(g.receive(&f), Err(RxRefusal::NoBuffers));
    assert_eq!(g.rx_completions(0).len(), 63);
    g.post_buffers(0, 10);
    g.receive(&f).unwrap();
    // The completion ring wrapped: generation flipped and still readable.
    let c = g.rx_completions(0);
    assert_eq!(c.len(), 1);
    assert_eq!(g.dev.status().counters.rx_no_buffers, 1);
}

/// A devmem queue out of buffers refuses its own frames only; the edge
/// learns which queue from `rx_queue` and keeps them for that queue.
#[test]
fn a_queue_out_of_buffers_refuses_only_its_frames() {
    let mut g = up(GveConfig::default(), 2, 2048, true);
    assert_eq!(
        flow_rule_cmd(&mut g, 0, 0, B, Some(5201), 1),
        status::PASSED
    );
    let devmem = tcp4(A, B, 2000, 5201, 1, 0x18, b"devmem");
    let other = |sport| tcp4(A, B, sport, 80, 1, 0x18, b"other");
    assert_eq!(g.rx_queue(&devmem), 1);
    // Queue 1 uses up its 63 buffers.
    for _ in 0..63 {
        g.receive(&devmem).unwrap();
    }
    assert_eq!(g.receive(&devmem), Err(RxRefusal::NoBuffers));
    // Frames RSS sends to queue 0 go on.
    let mut sent = 0;
    for sport in 3000..3100u16 {
        let f = other(sport);
        if g.rx_queue(&f) == 0 {
            g.receive(&f).unwrap();
            sent += 1;
        }
    }
    assert!(sent > 10, "RSS put {sent} of 100 flows on queue 0");
    assert_eq!(g.rx_completions(0).len(), sent);
    let c = g.dev.status().counters;
    assert_eq!(
        (c.rx_queues[1].no_buffers, c.rx_queues[0].no_buffers),
        (1, 0)
    );
}

#[test]
fn rss_follows_toeplitz_and_table() {
    let mut g = up(GveConfig::default(), 4, 2048, true);
    let key: Vec<u8> = (0..40u8)
        .map(|i| i.wrapping_mul(13).wrapping_add(1))
        .collect();
    let lut: Vec<u32> = (0..128).map(|i| (i * 7 % 4) as u32).collect();
    assert_eq!(g.configure_rss(Some(&key), Some(&lut), 0), status::PASSED);
    for port in 1000..1040u16 {
        let f = tcp4(A, B, port, 80, 1, 0x18, b"p");
        let mut input = Vec::new();
        input.extend_from_slice(&A);
        input.extend_from_slice(&B);
        input.extend_from_slice(&port.to_be_bytes());
        input.extend_from_slice(&80u16.to_be_bytes());
        let h = toeplitz(&key, &input);
        let want = lut[h as usize % 128] as usize;
        assert_eq!(g.rx_queue(&f), want, "rx_queue says where it goes");
        g.receive(&f).unwrap();
        for q in 0..4 {
            let c = g.rx_completions(q);
            if q == want {
                assert_eq!(c.len(), 1, "port {port} -> queue {want}");
                assert_eq!(c[0].hash, h);
            } else {
                assert!(c.is_empty(), "port {port} landed on {q}, want {want}");
            }
        }
    }
}

/// Issue 28 (`ring_reconfig.py`, after `gro.py`): `ethtool -X default`
/// writes the default table for the four queues running; `ethtool -L rx 1`
/// and `ethtool -G rx 64 tx 64` then re-create one queue of each kind with
/// 64-entry rings. With the RSS_CONFIG option the driver never rewrites the
/// table (and the kernel allows the shrink: the table is not the user's),
/// so the device's default must follow the queue count: every flow reaches
/// the one queue left. A fixed copy sent three flows in four to queues that
/// were gone (`rx_no_queue`): iperf3's control connection came up, its data
/// connections never did.
#[test]
fn rss_default_table_follows_the_queue_count() {
    let mut g = Guest::new(GveConfig::default());
    g.probe();
    g.open(4, 512, 2048, true);
    // ethtool_rxfh_indir_default(i, 4), as `ethtool -X default` sends it.
    let default4: Vec<u32> = (0..128).map(|i| i % 4).collect();
    assert_eq!(g.configure_rss(None, Some(&default4), 0), status::PASSED);
    assert_eq!(g.dev.status().rss.indirection_table, default4);
    // ethtool -L rx 1 tx 1, then ethtool -G down to the minimum, 64.
    g.close();
    g.open(1, 512, 2048, true);
    for ring in [256, 128, 64] {
        g.close();
        g.open(1, ring, 2048, true);
    }
    // iperf3's 16 data connections and more: every SYN reaches queue 0.
    let flows = 40u16;
    for port in 40000..40000 + flows {
        let syn = tcp4(A, B, port, 5201, 1, 0x02, b"");
        assert_eq!(g.rx_queue(&syn), 0);
        assert_eq!(g.receive(&syn), Ok(()), "SYN from port {port}");
    }
    assert_eq!(g.rx_completions(0).len(), usize::from(flows));
    let s = g.dev.status();
    assert_eq!((s.counters.rx_no_queue, s.counters.rx_drops), (0, 0));
    // `ethtool -x` (QUERY_RSS) shows the default for the one queue.
    assert!(
        !s.rss.table_configured,
        "the default table stays the default"
    );
    assert_eq!(s.rss.indirection_table, vec![0; 128]);
    assert_eq!(s.counters.rss_default_tables, 1);
}

/// A table that is not the default (`ethtool -X weight`, `equal 2` on four
/// queues) stays as written across queue re-creation: the kernel keeps the
/// queue count above its entries itself.
#[test]
fn rss_table_set_by_the_user_stays() {
    let mut g = Guest::new(GveConfig::default());
    g.probe();
    g.open(4, 64, 2048, true);
    let equal2: Vec<u32> = (0..128).map(|i| i % 2).collect();
    assert_eq!(g.configure_rss(None, Some(&equal2), 0), status::PASSED);
    g.close();
    g.open(4, 64, 2048, true);
    let s = g.dev.status();
    assert!(s.rss.table_configured);
    assert_eq!(s.rss.indirection_table, equal2);
    assert_eq!(s.counters.rss_default_tables, 0);
    for port in 40000..40040u16 {
        let f = tcp4(A, B, port, 5201, 1, 0x02, b"");
        assert!(g.rx_queue(&f) < 2, "port {port} left queues 0 and 1");
    }
}

#[test]
fn flow_rule_steers_a_flow() {
    let mut g = up(GveConfig::default(), 4, 2048, true);
    assert_eq!(
        flow_rule_cmd(&mut g, 0, 3, B, Some(5201), 3),
        status::PASSED
    );
    assert_eq!(
        flow_rule_cmd(&mut g, 0, 3, B, Some(5201), 2),
        status::ALREADY_EXISTS
    );
    let f = tcp4(A, B, 2000, 5201, 1, 0x18, b"devmem");
    assert_eq!(g.rx_queue(&f), 3, "the rule's queue");
    assert_eq!(g.dev.status().flow_rules[0].hits, 0, "asking is not a hit");
    for sport in 2000..2020u16 {
        g.receive(&tcp4(A, B, sport, 5201, 1, 0x18, b"devmem"))
            .unwrap();
    }
    assert_eq!(g.rx_completions(3).len(), 20);
    let s = g.dev.status();
    assert_eq!(s.flow_rules.len(), 1);
    assert_eq!((s.flow_rules[0].hits, s.counters.flow_rule_hits), (20, 20));
    // QUERY_FLOW_RULES (rules): descriptor + one queried rule.
    let buf = g.alloc(4096, 64);
    let q = |op: u16| {
        cmd(
            opcode::QUERY_FLOW_RULES,
            &[
                &op.to_be_bytes()[..],
                &[0, 0],
                &0u32.to_be_bytes(),
                &4096u64.to_be_bytes(),
                &buf.to_be_bytes(),
            ]
            .concat(),
        )
    };
    assert_eq!(g.adminq_cmd(q(0)), status::PASSED);
    let b = g.read(buf, 16 + 88);
    assert_eq!(
        (be32(&b, 0), be32(&b, 4), be32(&b, 8), be32(&b, 12)),
        (1, 64, 1, 16 + 88)
    );
    assert_eq!(be32(&b, 16), 3, "location");
    assert_eq!(be16(&b, 22), 3, "action");
    assert_eq!(g.adminq_cmd(q(1)), status::PASSED);
    let b = g.read(buf, 20);
    assert_eq!((be32(&b, 8), be32(&b, 12), be32(&b, 16)), (1, 20, 3));
    assert_eq!(g.adminq_cmd(q(2)), status::PASSED);
    // Delete: back to RSS.
    assert_eq!(flow_rule_cmd(&mut g, 1, 3, B, Some(0), 0), status::PASSED);
    assert_eq!(
        flow_rule_cmd(&mut g, 1, 3, B, Some(0), 0),
        status::NOT_FOUND
    );
    assert_eq!(
        flow_rule_cmd(&mut g, 0, 64, B, Some(5201), 3),
        status::OUT_OF_RANGE
    );
    assert_eq!(
        flow_rule_cmd(&mut g, 0, 1, B, Some(5201), 4),
        status::INVALID_ARGUMENT
    );
    assert_eq!(
        flow_rule_cmd(&mut g, 0, 1, B, Some(5201), 1),
        status::PASSED
    );
    assert_eq!(flow_rule_cmd(&mut g, 2, 0, B, Some(0), 0), status::PASSED);
    assert!(g.dev.status().flow_rules.is_empty());
}

#[test]
fn single_rx_queue_restart_for_devmem() {
    let mut g = up(GveConfig::default(), 2, 2048, true);
    assert_eq!(
        flow_rule_cmd(&mut g, 0, 0, B, Some(5201), 1),
        status::PASSED
    );
    // gve_rx_queue_stop: destroy queue 1 alone.
    let destroy = cmd(opcode::DESTROY_RX_QUEUE, &1u32.to_be_bytes());
    assert_eq!(g.adminq_cmd(destroy), status::PASSED);
    let f = tcp4(A, B, 1, 5201, 1, 0x18, b"x");
    assert_eq!(g.receive(&f), Err(RxRefusal::Dropped));
    // gve_rx_queue_start: create it again with fresh rings and post buffers.
    let ntfy = g.rx_ntfy(1);
    g.rx[1].tail = 0;
    g.rx[1].compl_head = 0;
    g.rx[1].cur_gen = false;
    g.write(g.rx[1].compl, &vec![0; 64 * 32]);
    let c = create_rx_cmd(1, &g.rx[1], ntfy);
    assert_eq!(g.adminq_cmd(c), status::PASSED);
    g.post_buffers(1, 63);
    g.receive(&f).unwrap();
    assert_eq!(g.rx_completions(1).len(), 1);
}

#[test]
fn interrupts_auto_mask_and_rearm() {
    let mut g = up(GveConfig::default(), 1, 2048, true);
    let f = tcp4(A, B, 1, 2, 1, 0x18, b"x");
    let vec = g.rx_ntfy(0) as u16;
    let db = g.irq_db[g.rx_ntfy(0) as usize];
    g.receive(&f).unwrap();
    assert_eq!(g.irqs, vec![vec], "fires and auto-masks");
    g.receive(&f).unwrap();
    g.receive(&f).unwrap();
    assert_eq!(g.irqs, vec![vec], "masked: no new interrupt");
    assert_eq!(g.rx_completions(0).len(), 3);
    // NAPI done: GVE_ITR_NO_UPDATE_DQO | GVE_ITR_ENABLE_BIT_DQO.
    g.doorbell(db, (3 << 3) | 1);
    assert_eq!(g.irqs, vec![vec, vec], "pending event fires on re-arm");
    g.doorbell(db, (3 << 3) | 1);
    assert_eq!(g.irqs.len(), 2, "nothing pending, armed only");
    g.receive(&f).unwrap();
    assert_eq!(g.irqs.len(), 3);
    // Clear-PBA drops a pending event.
    g.receive(&f).unwrap();
    g.doorbell(db, (3 << 3) | 2 | 1);
    assert_eq!(g.irqs.len(), 3);
    let s = g.dev.status().counters;
    assert_eq!(s.irqs_raised, 3);
}

#[test]
fn link_change_raises_management_vector() {
    let mut g = up(GveConfig::default(), 1, 2048, true);
    let mem = g.mem.clone();
    let mut io = pci_model::DeviceIo::new(&mem, g.now);
    g.dev.set_link(false, &mut io);
    // 8 notify blocks, management vector last.
    assert_eq!(io.irqs, vec![8]);
    assert_eq!(g.dev.status().device_status & 4, 0);
}

fn v6_l4_ok(f: &[u8], l4_off: usize, proto: u8) -> bool {
    let l4 = &f[l4_off..];
    let mut acc = 0u64;
    for c in f[22..54].chunks(2) {
        acc += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    acc += l4.len() as u64 + u64::from(proto);
    csum(l4, acc) == 0
}

#[test]
fn tso_ipv6_and_uso() {
    use wire::builder::FrameBuilder;
    let mut g = up(GveConfig::default(), 1, 2048, true);
    let s6 = "2001:db8::1".parse().unwrap();
    let d6 = "2001:db8::2".parse().unwrap();
    let payload: Vec<u8> = (0..2500u32).map(|i| (i * 3) as u8).collect();
    let f = FrameBuilder::tcp(s6, 40000, d6, 5201).build(&payload);
    let hl = 14 + 40 + 20;
    g.send(
        0,
        &[&f[..hl], &f[hl..]],
        Some((1200, hl as u32)),
        true,
        1,
        false,
    );
    assert_eq!(g.wire.len(), 3);
    let lens: Vec<usize> = g.wire.iter().map(|s| s.len() - hl).collect();
    assert_eq!(lens, vec![1200, 1200, 100]);
    for s in &g.wire {
        assert_eq!(be16(s, 18) as usize, s.len() - 54, "IPv6 payload length");
        assert!(v6_l4_ok(s, 54, 6));
    }
    g.wire.clear();
    // UDP segmentation offload (SKB_GSO_UDP_L4): header = L4 start + 8.
    let u = FrameBuilder::udp(
        "10.0.0.1".parse().unwrap(),
        4000,
        "10.0.0.2".parse().unwrap(),
        4001,
    )
    .build(&payload);
    g.send(0, &[&u], Some((1000, 42)), true, 2, false);
    assert_eq!(g.wire.len(), 3);
    for (i, s) in g.wire.iter().enumerate() {
        assert!(checksums_ok(s), "UDP segment {i}");
        assert_eq!(be16(s, 38) as usize, s.len() - 34, "UDP length");
        assert_eq!(be16(s, 18), 0x1234 + i as u16);
    }
    assert_eq!(g.tx_completions(0), vec![(2, 1, 0), (2, 2, 0)]);
}

#[test]
fn rx_ipv6_header_split_and_ext_headers() {
    use wire::builder::{FrameBuilder, Ipv6Ext};
    let mut g = up(GveConfig::default(), 1, 2048, true);
    let s6 = "2001:db8::1".parse().unwrap();
    let d6 = "2001:db8::2".parse().unwrap();
    let mut b = FrameBuilder::tcp(s6, 5201, d6, 40000);
    let mut f = b.build(&[7; 500]);
    // Fill in the TCP checksum so the device can verify it.
    let mut acc = 0u64;
    for c in f[22..54].chunks(2) {
        acc += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    acc += (f.len() - 54) as u64 + 6;
    let ck = csum(&f[54..], acc);
    f[54 + 16..54 + 18].copy_from_slice(&ck.to_be_bytes());
    g.receive(&f).unwrap();
    b.ipv6_ext = vec![Ipv6Ext::HopByHop];
    let e = b.build(&[7; 500]);
    g.receive(&e).unwrap();
    let c = g.rx_completions(0);
    assert_eq!(c.len(), 2);
    assert_eq!((c[0].header_len, c[0].packet_len), (74, 500));
    assert!(c[0].l3_l4_processed && !c[0].csum_l4_err);
    let pt = usize::from(c[0].ptype);
    assert_eq!((g.ptype_map[2 * pt], g.ptype_map[2 * pt + 1]), (3, 2));
    // With a Hop-by-Hop header the headers are 8 bytes longer.
    assert_eq!(c[1].header_len, 82);
}

#[test]
fn rx_headers_too_big_for_header_buffer() {
    let mut g = up(
        GveConfig {
            header_buffer_size: 64,
            ..Default::default()
        },
        1,
        2048,
        true,
    );
    // 14 + 20 + 20 = 54 fits; with 20 bytes of IPv4 options it does not.
    let mut f = tcp4(A, B, 1, 2, 3, 0x18, b"abc");
    f.splice(34..34, [1u8; 20]);
    f[14] = 0x4a;
    let tot = (f.len() - 14) as u16;
    f[16..18].copy_from_slice(&tot.to_be_bytes());
    g.receive(&f).unwrap();
    let c = g.rx_completions(0);
    assert!(c[0].split_header && c[0].hbo && c[0].header_len == 0);
    assert_eq!(c[0].packet_len as usize, f.len());
    assert_eq!(g.read(g.buf_addr(0, c[0].buf_id), f.len()), f);
    // IPv4 header checksum is now wrong (options changed): flagged.
    assert!(c[0].csum_ip_err);
}
