//! A driver that lies: bad addresses, lengths, opcodes, doorbells, resets
//! in the middle of traffic. The model answers with status codes and
//! counters, never a panic.

mod common;

use common::xorshift::Rng;
use common::*;
use gve_device::adminq::{opcode, status};
use gve_device::{layout, regs, GveConfig, GveDevice};
use pci_model::{DeviceIo, PciDevice, RxRefusal};

const A: [u8; 4] = [10, 0, 0, 1];
const B: [u8; 4] = [10, 0, 0, 2];
const OUTSIDE: u64 = 0x10;

fn up(nq: u32, hsplit: bool) -> Guest {
    let mut g = Guest::new(GveConfig::default());
    g.probe();
    g.open(nq, 64, 2048, hsplit);
    g.irqs.clear();
    g
}

#[test]
fn admin_queue_outside_memory() {
    let mut g = Guest::new(GveConfig::default());
    g.bar_write(
        layout::BAR_REGS,
        regs::ADMINQ_LENGTH,
        &4096u16.to_be_bytes(),
    );
    g.reg_w32(regs::ADMINQ_BASE_HI, 0);
    g.reg_w32(regs::ADMINQ_BASE_LO, 0x1000);
    g.reg_w32(regs::DRIVER_STATUS, 1);
    g.reg_w32(regs::ADMINQ_DOORBELL, 2);
    // Both commands counted as executed (failed), so the driver's wait ends.
    assert_eq!(g.reg_r32(regs::ADMINQ_EVENT_COUNTER), 2);
    let c = g.dev.status().counters;
    assert_eq!((c.admin_failed, c.dma_errors), (2, 2));
    // A base at the top of the address space: wraps, refused, no overflow.
    g.reg_w32(regs::ADMINQ_BASE_HI, u32::MAX);
    g.reg_w32(regs::ADMINQ_BASE_LO, 0xffff_ff00);
    g.reg_w32(regs::ADMINQ_DOORBELL, 40);
    assert_eq!(g.reg_r32(regs::ADMINQ_EVENT_COUNTER), 40);
    assert_eq!(g.dev.status().counters.dma_errors, 40);
}

#[test]
fn admin_queue_bad_setup_and_doorbells() {
    let mut g = Guest::new(GveConfig::default());
    // Doorbell before any admin queue.
    g.reg_w32(regs::ADMINQ_DOORBELL, 1);
    // Length not a power-of-two number of commands.
    g.bar_write(layout::BAR_REGS, regs::ADMINQ_LENGTH, &100u16.to_be_bytes());
    g.reg_w32(regs::ADMINQ_BASE_LO, (MEM_BASE + 0x1000) as u32);
    g.reg_w32(regs::ADMINQ_DOORBELL, 1);
    assert_eq!(g.dev.status().counters.admin_bad_doorbell, 2);
    // A producer count far ahead of the ring.
    g.adminq_setup();
    g.reg_w32(regs::ADMINQ_DOORBELL, 1000);
    g.reg_w32(regs::ADMINQ_DOORBELL, u32::MAX);
    assert_eq!(g.reg_r32(regs::ADMINQ_EVENT_COUNTER), 0);
    assert_eq!(g.dev.status().counters.admin_bad_doorbell, 4);
    // Unknown registers, wrong widths.
    g.bar_write(layout::BAR_REGS, regs::DEVICE_STATUS, &[0; 4]);
    g.bar_write(layout::BAR_REGS, regs::DRIVER_STATUS, &[0; 2]);
    g.bar_write(layout::BAR_REGS, 0x800, &[0; 8]);
    g.bar_write(1, 0, &[0; 4]);
    let _ = g.bar_read(layout::BAR_REGS, u64::MAX - 1, 8);
    assert_eq!(g.dev.status().counters.bad_register_accesses, 5);
    // The queue still works.
    g.describe();
}

#[test]
fn bad_commands() {
    let mut g = Guest::new(GveConfig::default());
    g.probe();
    assert_eq!(g.adminq_cmd(cmd(0x77, &[])), status::UNIMPLEMENTED);
    assert_eq!(g.dev.status().counters.admin_unknown_opcode, 1);
    // DESCRIBE_DEVICE: bad version, short buffer, buffer outside memory.
    let ok = g.alloc(4096, 64);
    assert_eq!(
        g.adminq_cmd(describe_cmd(ok, 2, 4096)),
        status::INVALID_ARGUMENT
    );
    assert_eq!(
        g.adminq_cmd(describe_cmd(ok, 1, 16)),
        status::INVALID_ARGUMENT
    );
    assert_eq!(
        g.adminq_cmd(describe_cmd(OUTSIDE, 1, 4096)),
        status::INVALID_ARGUMENT
    );
    assert_eq!(
        g.adminq_cmd(describe_cmd(u64::MAX - 8, 1, 4096)),
        status::INVALID_ARGUMENT
    );
    // Extended command: wrong inner length, unknown inner opcode, outside.
    assert_eq!(
        g.adminq_cmd(extended_cmd(0x101, 4096, ok)),
        status::INVALID_ARGUMENT
    );
    assert_eq!(
        g.adminq_cmd(extended_cmd(0x999, 92, ok)),
        status::UNIMPLEMENTED
    );
    assert_eq!(
        g.adminq_cmd(extended_cmd(0x101, 92, OUTSIDE)),
        status::INVALID_ARGUMENT
    );
    // Flow rule with an unknown flow type / opcode.
    let mut rule = vec![0u8; 92];
    rule[4..6].copy_from_slice(&77u16.to_be_bytes());
    g.write(ok, &rule);
    assert_eq!(
        g.adminq_cmd(extended_cmd(0x101, 92, ok)),
        status::INVALID_ARGUMENT
    );
    rule[0..2].copy_from_slice(&9u16.to_be_bytes());
    g.write(ok, &rule);
    assert_eq!(
        g.adminq_cmd(extended_cmd(0x101, 92, ok)),
        status::INVALID_ARGUMENT
    );
    // GET_PTYPE_MAP too short / outside.
    let pm = |len: u64, addr: u64| {
        cmd(
            opcode::GET_PTYPE_MAP,
            &[&len.to_be_bytes()[..], &addr.to_be_bytes()].concat(),
        )
    };
    assert_eq!(g.adminq_cmd(pm(100, ok)), status::INVALID_ARGUMENT);
    assert_eq!(g.adminq_cmd(pm(2048, OUTSIDE)), status::INVALID_ARGUMENT);
    // CONFIGURE_RSS: wrong sizes, queue beyond max, unknown hash bits.
    let before = g.dev.status().rss;
    assert_eq!(
        g.configure_rss(Some(&[1; 16]), None, 0),
        status::INVALID_ARGUMENT
    );
    assert_eq!(
        g.configure_rss(None, Some(&[0; 64]), 0),
        status::INVALID_ARGUMENT
    );
    assert_eq!(
        g.configure_rss(Some(&[1; 40]), Some(&[9; 128]), 0),
        status::INVALID_ARGUMENT
    );
    assert_eq!(
        g.configure_rss(None, None, 0xffff),
        status::INVALID_ARGUMENT
    );
    assert_eq!(g.dev.status().rss, before, "failed commands change nothing");
    // QUERY_* with tiny or outside buffers.
    let qr = cmd(
        opcode::QUERY_RSS,
        &[&16u64.to_be_bytes()[..], &ok.to_be_bytes()].concat(),
    );
    assert_eq!(g.adminq_cmd(qr), status::INVALID_ARGUMENT);
    let qf = cmd(
        opcode::QUERY_FLOW_RULES,
        &[
            &[0, 0, 0, 0][..],
            &0u32.to_be_bytes(),
            &4096u64.to_be_bytes(),
            &OUTSIDE.to_be_bytes(),
        ]
        .concat(),
    );
    assert_eq!(g.adminq_cmd(qf), status::INVALID_ARGUMENT);
    assert!(g.dev.status().last_admin_error.is_some());
}

#[test]
fn bad_queue_commands() {
    let mut g = Guest::new(GveConfig::default());
    g.adminq_setup();
    g.describe();
    let r = g.alloc_tx_ring(64);
    // Before CONFIGURE_DEVICE_RESOURCES.
    assert_eq!(
        g.adminq_cmd(create_tx_cmd(0, &r, 0)),
        status::FAILED_PRECONDITION
    );
    // Bad resources: wrong format, too many blocks, irq dbs outside memory.
    let res = |irq_db: u64, n: u32, fmt: u8| {
        let mut p = Vec::new();
        p.extend_from_slice(&0u64.to_be_bytes());
        p.extend_from_slice(&irq_db.to_be_bytes());
        p.extend_from_slice(&0u32.to_be_bytes());
        p.extend_from_slice(&n.to_be_bytes());
        p.extend_from_slice(&64u32.to_be_bytes());
        p.extend_from_slice(&0u32.to_be_bytes());
        p.push(fmt);
        cmd(opcode::CONFIGURE_DEVICE_RESOURCES, &p)
    };
    let dbs = g.alloc(64 * 8, 64);
    assert_eq!(g.adminq_cmd(res(dbs, 8, 2)), status::INVALID_ARGUMENT);
    assert_eq!(g.adminq_cmd(res(dbs, 9, 3)), status::INVALID_ARGUMENT);
    assert_eq!(g.adminq_cmd(res(OUTSIDE, 8, 3)), status::INVALID_ARGUMENT);
    assert!(!g.dev.status().resources_configured);
    assert_eq!(g.adminq_cmd(res(dbs, 8, 3)), status::PASSED);
    assert_eq!(g.adminq_cmd(res(dbs, 8, 3)), status::FAILED_PRECONDITION);
    // Queue id out of range, bad ntfy, bad ring size, resources outside.
    assert_eq!(g.adminq_cmd(create_tx_cmd(4, &r, 0)), status::OUT_OF_RANGE);
    assert_eq!(
        g.adminq_cmd(create_tx_cmd(0, &r, 8)),
        status::INVALID_ARGUMENT
    );
    let odd = TxRing {
        size: 48,
        ..TxRing { ..r }
    };
    assert_eq!(
        g.adminq_cmd(create_tx_cmd(0, &odd, 0)),
        status::INVALID_ARGUMENT
    );
    let huge = TxRing {
        size: 1 << 15,
        ..odd
    };
    assert_eq!(
        g.adminq_cmd(create_tx_cmd(0, &huge, 0)),
        status::INVALID_ARGUMENT
    );
    let out = TxRing {
        res: OUTSIDE,
        size: 64,
        ..huge
    };
    assert_eq!(
        g.adminq_cmd(create_tx_cmd(0, &out, 0)),
        status::INVALID_ARGUMENT
    );
    let good = TxRing {
        res: g.alloc(64, 64),
        ..out
    };
    assert_eq!(g.adminq_cmd(create_tx_cmd(0, &good, 0)), status::PASSED);
    assert_eq!(
        g.adminq_cmd(create_tx_cmd(0, &good, 0)),
        status::ALREADY_EXISTS
    );
    let destroy = |q: u32| cmd(opcode::DESTROY_TX_QUEUE, &q.to_be_bytes());
    assert_eq!(g.adminq_cmd(destroy(0)), status::PASSED);
    assert_eq!(g.adminq_cmd(destroy(0)), status::NOT_FOUND);
    assert_eq!(g.adminq_cmd(destroy(u32::MAX)), status::NOT_FOUND);
    let rdestroy = cmd(opcode::DESTROY_RX_QUEUE, &7u32.to_be_bytes());
    assert_eq!(g.adminq_cmd(rdestroy), status::NOT_FOUND);
    // RX: QPL id, oversized buffers.
    let rx = RxRing {
        compl: g.alloc(64 * 32, 64),
        bufq: g.alloc(64 * 32, 64),
        res: g.alloc(64, 64),
        hdr_bufs: 0,
        data: 0,
        size: 64,
        buf_len: 65535,
        hdr_len: 128,
        tail: 0,
        compl_head: 0,
        cur_gen: false,
        db: 0,
        next_buf_id: 0,
    };
    assert_eq!(
        g.adminq_cmd(create_rx_cmd(0, &rx, 4)),
        status::INVALID_ARGUMENT
    );
    let rx = RxRing {
        buf_len: 2048,
        hdr_len: 4000,
        ..rx
    };
    assert_eq!(
        g.adminq_cmd(create_rx_cmd(0, &rx, 4)),
        status::INVALID_ARGUMENT
    );
}

#[test]
fn out_of_range_doorbells() {
    let mut g = up(1, true);
    let before = g.dev.status().counters.bad_doorbells;
    g.doorbell(layout::TX_DB_BASE + 3, 1); // queue not created
    g.doorbell(layout::TX_DB_BASE, 64); // beyond ring
    g.doorbell(layout::RX_DB_BASE + 127, 1);
    g.doorbell(layout::RX_DB_BASE, 1000);
    g.doorbell(100, 1); // no such notify block
    g.doorbell(1000, 1); // nothing there
    assert_eq!(g.dev.status().counters.bad_doorbells, before + 6);
    let bad = g.dev.status().counters.bad_register_accesses;
    g.bar_write(layout::BAR_DOORBELLS, 2, &[1, 0, 0, 0]); // misaligned
    g.bar_write(layout::BAR_DOORBELLS, 0, &[1, 0]); // 16-bit
    assert_eq!(g.dev.status().counters.bad_register_accesses, bad + 2);
}

#[test]
fn tx_descriptors_pointing_outside() {
    let mut g = up(1, true);
    // A data descriptor whose buffer is outside memory.
    let ring = g.tx[0].ring;
    let mut d = [0u8; 16];
    d[0..8].copy_from_slice(&OUTSIDE.to_le_bytes());
    d[8] = 0xc | 0x20;
    d[12..14].copy_from_slice(&42u16.to_le_bytes());
    d[14..16].copy_from_slice(&100u16.to_le_bytes());
    g.write(ring, &d);
    // An unknown dtype.
    let mut e = [0u8; 16];
    e[8] = 0x1f | 0x20;
    g.write(ring + 16, &e);
    d[8] = 0xc | 0x20;
    d[0..8].copy_from_slice(&(MEM_BASE + 0x2000).to_le_bytes());
    d[12..14].copy_from_slice(&43u16.to_le_bytes());
    g.write(ring + 32, &d);
    // A TSO packet with an absurd MSS.
    let mut t = [0u8; 16];
    t[0] = 46;
    t[4] = 10;
    t[6] = 54;
    t[8] = 0x5 | 0x20;
    g.write(ring + 48, &t);
    let f = tcp4(A, B, 1, 2, 3, 0x10, b"");
    let buf = g.alloc(100, 64);
    g.write(buf, &f);
    d[0..8].copy_from_slice(&buf.to_le_bytes());
    d[12..14].copy_from_slice(&44u16.to_le_bytes());
    d[14..16].copy_from_slice(&100u16.to_le_bytes());
    g.write(ring + 64, &d);
    g.tx[0].tail = 5;
    g.doorbell(g.tx[0].db, 5);
    assert!(g.wire.is_empty() || g.wire.len() == 1);
    // Every packet is completed, good or not: the driver's tags come back.
    let tags: Vec<u16> = g.tx_completions(0).iter().map(|c| c.1).collect();
    assert_eq!(tags, vec![42, 43, 44]);
    let c = g.dev.status().counters;
    assert!(c.dma_errors >= 1 && c.bad_tx_descriptors >= 2);
    assert!(c.tx_drops >= 2);
}

/// Issue 24 (4): non-TSO packets up to 256 KiB went out as single frames,
/// far past the MTU, and a TSO MSS too large for the MTU made oversized
/// segments. Such packets are dropped (still completed) and counted.
#[test]
fn tx_frames_longer_than_the_mtu_are_dropped() {
    let mut g = up(1, true);
    let mtu = usize::from(g.dev.config().mtu);
    let tagged = |f: &[u8]| {
        let mut t = f[..12].to_vec();
        t.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
        t.extend_from_slice(&f[12..]);
        t
    };
    // Exactly MTU bytes of L3 (+ Ethernet header, + a VLAN tag) go out;
    // one byte more does not.
    let fit = tcp4(A, B, 1, 2, 3, 0x18, &vec![7; mtu - 40]);
    let over = tcp4(A, B, 1, 2, 3, 0x18, &vec![7; mtu - 39]);
    assert_eq!(fit.len(), 14 + mtu);
    g.send(0, &[&fit], None, true, 1, false);
    g.send(0, &[&over], None, true, 2, false);
    g.send(0, &[&tagged(&fit)], None, true, 3, false);
    g.send(0, &[&tagged(&over)], None, true, 4, false);
    // A 64 KiB packet without TSO, in buffers the driver could give.
    let big = tcp4(A, B, 1, 2, 3, 0x18, &vec![7; 65_000]);
    let frags: Vec<&[u8]> = big.chunks(16_000).collect();
    g.send(0, &frags, None, false, 5, false);
    // TSO: an MSS of 9000 (in the driver's [88, 9728]) on a 1500 MTU makes
    // 9054-byte segments: dropped; 1460 makes full-sized ones.
    let t = tcp4(A, B, 1, 2, 3, 0x18, &vec![9; 20_000]);
    let tf = [&t[..54], &t[54..10_054], &t[10_054..]];
    g.send(0, &tf, Some((9000, 54)), true, 6, false);
    g.send(0, &tf, Some((1460, 54)), true, 7, false);
    let lens: Vec<usize> = g.wire.iter().map(Vec::len).collect();
    assert_eq!(&lens[..2], &[14 + mtu, 18 + mtu], "{lens:?}");
    assert_eq!(lens.len(), 2 + 20_000usize.div_ceil(1460), "{lens:?}");
    assert!(lens[2..].iter().all(|&l| l <= 14 + mtu), "{lens:?}");
    // Every packet is completed, sent or not.
    let tags: Vec<u16> = g.tx_completions(0).iter().map(|c| c.1).collect();
    assert_eq!(tags, vec![1, 2, 3, 4, 5, 6, 7]);
    let c = g.dev.status().counters;
    assert_eq!(c.tx_oversize, 4, "{c:?}");
    assert_eq!(c.tx_drops, 4, "{c:?}");
}

#[test]
fn ring_addresses_outside_memory() {
    let mut g = Guest::new(GveConfig::default());
    g.probe();
    // TX ring and completion ring outside memory.
    let r = TxRing {
        ring: OUTSIDE,
        compl: u64::MAX - 16,
        res: g.alloc(64, 64),
        size: 64,
        tail: 0,
        compl_head: 0,
        cur_gen: false,
        db: 0,
    };
    assert_eq!(g.adminq_cmd(create_tx_cmd(0, &r, 0)), status::PASSED);
    g.doorbell(layout::TX_DB_BASE, 5);
    // RX completion ring outside; buffer queue posting outside buffers.
    let mut rx = RxRing {
        compl: u64::MAX - 64,
        bufq: g.alloc(64 * 32, 64),
        res: g.alloc(64, 64),
        hdr_bufs: OUTSIDE,
        data: OUTSIDE,
        size: 64,
        buf_len: 2048,
        hdr_len: 128,
        tail: 0,
        compl_head: 0,
        cur_gen: false,
        db: layout::RX_DB_BASE,
        next_buf_id: 0,
    };
    assert_eq!(g.adminq_cmd(create_rx_cmd(0, &rx, 4)), status::PASSED);
    rx.db = layout::RX_DB_BASE;
    g.rx.push(rx);
    g.post_buffers(0, 10);
    let f = tcp4(A, B, 1, 2, 3, 0x18, b"payload");
    assert_eq!(g.receive(&f), Ok(()));
    // Buffer queue itself outside memory.
    let rx2 = RxRing {
        bufq: OUTSIDE,
        ..RxRing {
            ..g.rx.pop().unwrap()
        }
    };
    let destroy = cmd(opcode::DESTROY_RX_QUEUE, &0u32.to_be_bytes());
    assert_eq!(g.adminq_cmd(destroy), status::PASSED);
    assert_eq!(g.adminq_cmd(create_rx_cmd(0, &rx2, 4)), status::PASSED);
    g.doorbell(layout::RX_DB_BASE, 5);
    assert_eq!(g.receive(&f), Err(RxRefusal::Dropped));
    let c = g.dev.status().counters;
    assert!(c.dma_errors >= 3, "{c:?}");
}

#[test]
fn oversize_and_runt_frames() {
    let mut g = up(1, true);
    assert_eq!(g.receive(&[0; 10]), Err(RxRefusal::Dropped));
    assert_eq!(g.receive(&vec![0; 9000]), Err(RxRefusal::Dropped));
    assert_eq!(g.dev.status().counters.rx_oversize, 2);
    // Garbage that is long enough is delivered, not parsed.
    g.receive(&[0xee; 200]).unwrap();
    assert_eq!(g.rx_completions(0).len(), 1);
}

#[test]
fn reset_mid_traffic() {
    let mut g = up(2, true);
    let f = tcp4(A, B, 1, 2, 3, 0x18, b"payload");
    g.receive(&f).unwrap();
    // Descriptors written but not yet doorbelled when the reset lands.
    g.send(0, &[&f], None, true, 1, false);
    g.reg_w32(regs::DRIVER_STATUS, regs::driver_status::RESET);
    assert_eq!(g.receive(&f), Err(RxRefusal::NotReady));
    g.doorbell(g.tx[0].db, 3);
    g.doorbell(g.rx[0].db, 3);
    g.doorbell(g.irq_db[0], 1);
    g.reg_w32(regs::ADMINQ_DOORBELL, 5);
    let c = g.dev.status().counters;
    assert_eq!(c.resets, 1);
    assert!(c.bad_doorbells >= 3 && c.admin_bad_doorbell >= 1);
    // Function-level reset from the edge, also mid-traffic.
    let mut g = up(2, true);
    g.receive(&f).unwrap();
    g.dev.reset();
    assert_eq!(g.receive(&f), Err(RxRefusal::NotReady));
    assert_eq!(g.reg_r32(regs::DEVICE_STATUS), regs::device_status::LINK);
    assert!(g.dev.status().counters.rx_packets >= 1, "counters stay");
}

#[test]
fn random_driver_does_not_panic() {
    for seed in 1..6u64 {
        let mut g = up(2, seed % 2 == 0);
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let adminq = g.adminq;
        for _ in 0..3000 {
            let r = rng.next();
            match r % 8 {
                0 => {
                    let off = (rng.next() % 0x40) & !3;
                    let v = rng.next() as u32;
                    // Avoid the reset bit most of the time so queues live.
                    let v = if off == regs::DRIVER_STATUS && r % 5 != 0 {
                        1
                    } else {
                        v
                    };
                    g.bar_write(layout::BAR_REGS, off, &v.to_be_bytes());
                }
                1 => {
                    let off = rng.next() % 0x1000;
                    let len = [1usize, 2, 4, 8][(rng.next() % 4) as usize];
                    let v = rng.next().to_le_bytes();
                    g.bar_write(layout::BAR_DOORBELLS, off, &v[..len]);
                }
                2 => {
                    // A random command with random fields, and addresses
                    // that are sometimes inside guest memory.
                    let mut c = [0u8; 64];
                    for b in c.iter_mut() {
                        *b = rng.next() as u8;
                    }
                    c[0..4].copy_from_slice(&((rng.next() % 0x14) as u32).to_be_bytes());
                    if r % 3 == 0 {
                        let a = MEM_BASE + rng.next() % (MEM_SIZE as u64);
                        c[8..16].copy_from_slice(&a.to_be_bytes());
                        c[16..24].copy_from_slice(&a.to_be_bytes());
                    }
                    let slot = u64::from(g.prod % 64);
                    g.write(adminq + slot * 64, &c);
                    g.prod = g.prod.wrapping_add(1);
                    let p = g.prod;
                    g.reg_w32(regs::ADMINQ_DOORBELL, p);
                }
                3 | 4 => {
                    let len = (rng.next() % 2000) as usize;
                    let mut f: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                    if r % 2 == 0 && len > 60 {
                        let t = tcp4(A, B, rng.next() as u16, 5201, 1, 0x18, &f[..len - 60]);
                        f = t;
                    }
                    let _ = g.receive(&f);
                }
                5 => {
                    // Random TX descriptors.
                    let q = (rng.next() % 2) as usize;
                    let idx = rng.next() % 64;
                    let mut d = [0u8; 16];
                    for b in d.iter_mut() {
                        *b = rng.next() as u8;
                    }
                    if r % 2 == 0 {
                        let a = MEM_BASE + rng.next() % (MEM_SIZE as u64);
                        d[0..8].copy_from_slice(&a.to_le_bytes());
                    }
                    let ring = g.tx[q].ring;
                    g.write(ring + idx * 16, &d);
                    g.doorbell(layout::TX_DB_BASE + q as u32, (rng.next() % 64) as u32);
                }
                6 => {
                    let q = (rng.next() % 2) as usize;
                    let n = (rng.next() % 40) as u32;
                    g.post_buffers(q, n);
                    let _ = g.rx_completions(q);
                }
                _ => {
                    let _ = g.bar_read(
                        (rng.next() % 3) as u8,
                        rng.next() % 0x2000,
                        [1usize, 2, 4, 8][(rng.next() % 4) as usize],
                    );
                }
            }
        }
        let s = g.dev.status();
        assert!(s.flow_rules.len() <= 64);
        assert!(s.tx_queues.len() <= 4 && s.rx_queues.len() <= 4);
    }
}

#[test]
fn model_alone_without_driver() {
    // Every entry point on a fresh device.
    let mem = pci_model::VecMemory::new(0, 4096);
    let mut d = GveDevice::new(GveConfig {
        max_tx_queues: 0,
        max_rx_queues: 100_000,
        header_buffer_size: 9999,
        ..Default::default()
    });
    let mut io = DeviceIo::new(&mem, std::time::Instant::now());
    assert_eq!(
        d.receive(&[0; 64], &wire::parse(&[0; 64]), &mut io),
        Err(RxRefusal::NotReady)
    );
    d.poll(&mut io);
    d.reset();
    assert!(d.msix().unwrap().vectors <= 2 * layout::MAX_QUEUES as u16 + 1);
    assert_eq!(d.config().max_tx_queues, 1);
}
