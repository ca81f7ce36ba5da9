//! Engine-to-engine throughput over an in-memory wire, next to this
//! machine's memcpy bandwidth. Plain `main`, no harness:
//! `cargo bench -p roce-model --bench engine`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use roce_model::*;

struct Side {
    qp: QueuePair,
    mem: Memory,
    pd: ProtectionDomain,
}

fn pair(mtu: Mtu) -> (Side, Side) {
    let mk = |qpn, seed| {
        let mut mem = Memory::new(seed);
        let pd = mem.alloc_pd();
        let caps = QpCaps {
            max_send_wr: 1024,
            max_recv_wr: 1024,
            max_sge: 4,
            ..QpCaps::default()
        };
        Side {
            qp: QueuePair::new(qpn, pd, caps),
            mem,
            pd,
        }
    };
    let (mut a, mut b) = (mk(1, 1), mk(2, 2));
    let attr = QpAttr {
        pmtu: mtu,
        dest_qpn: 2,
        ..QpAttr::default()
    };
    a.qp.connect(&attr).unwrap();
    b.qp.connect(&QpAttr {
        dest_qpn: 1,
        ..attr
    })
    .unwrap();
    (a, b)
}

/// Fixed IPv4 + UDP headers for the optional ICRC seal / verify.
const IP: [u8; 20] = [
    0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
];
const UDP: [u8; 8] = [0xc0, 0, 0x12, 0xb7, 0, 0, 0, 0];

/// Hand one packet across, optionally sealing and verifying the ICRC.
fn hop(mut p: Vec<u8>, to: &mut Side, now: Instant, icrc: bool) {
    if icrc {
        let scope = IcrcScope::Ipv4 { ip: &IP, udp: &UDP };
        scope.seal(&mut p).unwrap();
        scope.verify(&p).unwrap();
    }
    let _ = to.qp.handle_bytes(&p, now, &mut to.mem);
}

/// Move packets both ways until both sides are quiet; returns packets moved.
fn pump(a: &mut Side, b: &mut Side, now: Instant, icrc: bool) -> u64 {
    let mut n = 0;
    loop {
        let mut moved = false;
        while let Some(p) = a.qp.poll_transmit(now, &a.mem) {
            hop(p, b, now, icrc);
            n += 1;
            moved = true;
        }
        while let Some(p) = b.qp.poll_transmit(now, &b.mem) {
            hop(p, a, now, icrc);
            n += 1;
            moved = true;
        }
        if !moved {
            return n;
        }
    }
}

struct Row {
    name: String,
    ops: u64,
    bytes: u64,
    packets: u64,
    elapsed: Duration,
}

fn send_rate(total: u64, depth: u64) -> Row {
    let (mut a, mut b) = pair(Mtu::Mtu1024);
    let src = a
        .mem
        .register(a.pd, 0x1000, vec![7u8; 64], Access::NONE)
        .unwrap();
    let dst = b
        .mem
        .register(b.pd, 0x1000, vec![0u8; 64], Access::LOCAL_WRITE)
        .unwrap();
    let now = Instant::now();
    let (mut posted, mut done, mut packets) = (0u64, 0u64, 0u64);
    let t0 = Instant::now();
    while done < total {
        while posted < total && posted - done < depth {
            b.qp.post_recv(RecvWr::new(posted, vec![Sge::new(0x1000, 64, dst.lkey)]))
                .unwrap();
            a.qp.post_send(SendWr::new(
                posted,
                SendOp::Send,
                vec![Sge::new(0x1000, 64, src.lkey)],
            ))
            .unwrap();
            posted += 1;
        }
        packets += pump(&mut a, &mut b, now, false);
        while let Some(c) = a.qp.poll_completion() {
            assert_eq!(c.status, WcStatus::Success);
            done += 1;
        }
        while let Some(c) = b.qp.poll_completion() {
            assert_eq!(c.status, WcStatus::Success);
        }
    }
    Row {
        name: format!("SEND 64 B, {depth} in flight"),
        ops: total,
        bytes: total * 64,
        packets,
        elapsed: t0.elapsed(),
    }
}

fn bulk(read: bool, icrc: bool, mtu: Mtu, msg: usize, total: u64, depth: u64) -> Row {
    let (mut a, mut b) = pair(mtu);
    let pattern: Vec<u8> = (0..msg).map(|i| i as u8).collect();
    let local = a
        .mem
        .register(a.pd, 0x10_0000, pattern.clone(), Access::LOCAL_WRITE)
        .unwrap();
    let remote = b
        .mem
        .register(
            b.pd,
            0x20_0000,
            vec![0u8; msg],
            Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    let now = Instant::now();
    let (mut posted, mut done, mut packets) = (0u64, 0u64, 0u64);
    let sge = Sge::new(0x10_0000, msg as u32, local.lkey);
    let t0 = Instant::now();
    while done < total {
        while posted < total && posted - done < depth {
            let op = if read {
                SendOp::RdmaRead {
                    remote_addr: 0x20_0000,
                    rkey: remote.rkey,
                }
            } else {
                SendOp::RdmaWrite {
                    remote_addr: 0x20_0000,
                    rkey: remote.rkey,
                }
            };
            a.qp.post_send(SendWr::new(posted, op, vec![sge])).unwrap();
            posted += 1;
        }
        packets += pump(&mut a, &mut b, now, icrc);
        while let Some(c) = a.qp.poll_completion() {
            assert_eq!(c.status, WcStatus::Success);
            done += 1;
        }
    }
    let elapsed = t0.elapsed();
    if !read {
        assert_eq!(b.mem.read(remote.rkey, 0x20_0000, msg).unwrap(), pattern);
    }
    Row {
        name: format!(
            "RDMA {} {} KiB, PMTU {}{}",
            if read { "READ" } else { "WRITE" },
            msg / 1024,
            mtu.bytes(),
            if icrc { " +ICRC" } else { "" }
        ),
        ops: total,
        bytes: total * msg as u64,
        packets,
        elapsed,
    }
}

fn memcpy(size: usize, reps: u32) -> Row {
    let src: Vec<u8> = (0..size).map(|i| (i * 7) as u8).collect();
    let mut dst = vec![0u8; size];
    dst.copy_from_slice(&src); // fault the pages in
    let t0 = Instant::now();
    for _ in 0..reps {
        dst.copy_from_slice(black_box(&src));
        black_box(&mut dst);
    }
    Row {
        name: format!("memcpy {} MiB", size >> 20),
        ops: u64::from(reps),
        bytes: u64::from(reps) * size as u64,
        packets: 0,
        elapsed: t0.elapsed(),
    }
}

fn main() {
    // Debug builds (`cargo test --all-targets` runs this main) use a small workload.
    let quick = cfg!(debug_assertions) || std::env::var_os("QUICK").is_some();
    let k = if quick { 1 } else { 10 };
    let rows = [
        memcpy(64 << 20, 2 * k as u32),
        send_rate(20_000 * k, 64),
        bulk(false, false, Mtu::Mtu4096, 64 << 10, 400 * k, 8),
        bulk(false, false, Mtu::Mtu1024, 64 << 10, 200 * k, 8),
        bulk(false, true, Mtu::Mtu4096, 64 << 10, 100 * k, 8),
        bulk(true, false, Mtu::Mtu4096, 64 << 10, 400 * k, 8),
    ];
    println!(
        "{:<40} {:>10} {:>14} {:>12} {:>10}",
        "workload", "ops", "ops/s", "GB/s", "Mpkt/s"
    );
    for r in &rows {
        let s = r.elapsed.as_secs_f64();
        println!(
            "{:<40} {:>10} {:>14.0} {:>12.2} {:>10.2}",
            r.name,
            r.ops,
            r.ops as f64 / s,
            r.bytes as f64 / s / 1e9,
            r.packets as f64 / s / 1e6,
        );
    }
}
