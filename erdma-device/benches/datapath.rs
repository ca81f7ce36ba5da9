//! The erdma data path without a VM: two model devices back to back, each
//! driven by the tests' kernel-driver stand-in (`tests/common`), frames
//! handed from one to the other as the fabric would. RDMA WRITE and SEND at
//! 64 B and 64 KiB; GB/s of payload and CPU ns per payload byte of the
//! thread that runs both devices (and the stand-in drivers, whose guest
//! memory is a `Vec` behind a mutex), against `memcpy` of the same sizes
//! in the same run. Every run checks the last message's bytes at the
//! receiver.
//!
//! `cargo bench -p erdma-device --bench datapath` (`ERDMA_BENCH_MIB=N`:
//! payload per measurement, default 256 MiB for 64 KiB, 1/64 of it for
//! 64 B). Prints one `erdma-bench` line per case.

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;
use std::time::Instant;

use common::*;
use erdma_device::wqe::op;

const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
const IP_A: [u8; 4] = [10, 0, 0, 1];
const IP_B: [u8; 4] = [10, 0, 0, 2];
const STAG: u32 = 0x100;
/// Guest virtual address of the registered buffer on both sides.
const VA: u64 = 0x7000_0000;
/// Registered buffer: 32 pages (two 64 KiB halves).
const PAGES: u64 = 32;
/// Work requests in flight per batch (SQ of 256 WQEBBs, 2 per WRITE SQE).
const BATCH: usize = 64;

struct Side {
    d: Driver,
    qp: KQp,
    buf: u64,
}

fn side(mac: [u8; 6], ip: [u8; 4], qpn: u32) -> Side {
    let mut d = Driver::new(mac);
    d.probe(2);
    assert_eq!(d.set_gid(0, v4_gid(ip)).status, 0);
    assert_eq!(d.create_cq(1, 1024, 1).status, 0);
    let (c, qp) = d.create_qp(qpn, false, 1, 256, 256);
    assert_eq!(c.status, 0);
    let buf = d.alloc(PAGES * 4096, 4096);
    let pages: Vec<u64> = (0..PAGES).map(|i| buf + 4096 * i).collect();
    assert_eq!(
        d.reg_mr(STAG, 1, VA, PAGES * 4096, &pages, 0x1f, true)
            .status,
        0
    );
    Side {
        d,
        qp: qp.expect("QP"),
        buf,
    }
}

fn connect(a: &mut Side, b: &mut Side) {
    let (qa, qb) = (a.qp.qpn, b.qp.qpn);
    for (s, peer_q, mac, ip) in [(&mut *a, qb, MAC_B, IP_B), (&mut *b, qa, MAC_A, IP_A)] {
        let av = AvSpec {
            flow_label: 0,
            tclass: 0,
            hop_limit: 64,
            sl: 0,
            udp_sport: 0xc001,
            sgid_index: 0,
            dmac: mac,
            dgid: v4_gid(ip),
        };
        let q = s.qp.qpn;
        assert_eq!(s.d.modify_qp(q, 1, 1, None, 0, 0, 0, 0).status, 0);
        assert_eq!(
            s.d.modify_qp(q, 2, 1 | 4 | 16 | 32, Some(&av), peer_q, 0, 0, 0)
                .status,
            0
        );
        assert_eq!(s.d.modify_qp(q, 3, 1 | 8, None, 0, 0, 0, 0).status, 0);
    }
}

fn write_sqe(len: u32, laddr: u64, remote: u64) -> Vec<u8> {
    let mut s = vec![0u8; 48];
    s[..8].copy_from_slice(&sqe_hdr(op::WRITE, 1, true, false).to_le_bytes());
    s[12..16].copy_from_slice(&len.to_le_bytes());
    s[16..20].copy_from_slice(&STAG.to_le_bytes());
    s[20..24].copy_from_slice(&(remote as u32).to_le_bytes());
    s[24..28].copy_from_slice(&((remote >> 32) as u32).to_le_bytes());
    s[32..40].copy_from_slice(&laddr.to_le_bytes());
    s[40..44].copy_from_slice(&len.to_le_bytes());
    s[44..48].copy_from_slice(&STAG.to_le_bytes());
    s
}

fn send_sqe(len: u32, addr: u64) -> Vec<u8> {
    let mut s = vec![0u8; 32];
    s[..8].copy_from_slice(&sqe_hdr(op::SEND, 1, true, false).to_le_bytes());
    s[12..16].copy_from_slice(&len.to_le_bytes());
    s[16..24].copy_from_slice(&addr.to_le_bytes());
    s[24..28].copy_from_slice(&len.to_le_bytes());
    s[28..32].copy_from_slice(&STAG.to_le_bytes());
    s
}

/// CPU time of this thread, in ns (the scheduler's own account).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Moves frames between the two devices until neither has any to send.
fn shuttle(a: &mut Side, b: &mut Side) {
    loop {
        a.d.poll();
        let fa = std::mem::take(&mut a.d.tx);
        for f in &fa {
            let _ = b.d.receive(f);
        }
        b.d.poll();
        let fb = std::mem::take(&mut b.d.tx);
        for f in &fb {
            let _ = a.d.receive(f);
        }
        if fa.is_empty() && fb.is_empty() && a.d.tx.is_empty() && b.d.tx.is_empty() {
            return;
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Write,
    Send,
}

/// Runs `count` messages of `size` bytes; returns (seconds, CPU ns).
fn run(op: Op, size: u32, count: usize) -> (f64, u64) {
    let mut a = side(MAC_A, IP_A, 2);
    let mut b = side(MAC_B, IP_B, 3);
    connect(&mut a, &mut b);
    // A's source: the first 64 KiB half, a known pattern.
    let pattern: Vec<u8> = (0..65536u32).map(|i| (i * 7 + 3) as u8).collect();
    a.d.mem_write(a.buf, &pattern);
    let sink = VA + 65536;
    let t0 = Instant::now();
    let c0 = thread_cpu_ns();
    let mut done = 0;
    while done < count {
        let n = BATCH.min(count - done);
        if op == Op::Send {
            for _ in 0..n {
                b.d.post_recv(&mut b.qp, sink, size, STAG);
            }
        }
        for _ in 0..n {
            let sqe = match op {
                Op::Write => write_sqe(size, VA, sink),
                Op::Send => send_sqe(size, VA),
            };
            a.d.post_sqe(&mut a.qp, sqe);
        }
        let mut got = 0;
        while got < n {
            shuttle(&mut a, &mut b);
            while let Some(wc) = a.d.poll_cq(1) {
                assert_eq!(wc.syndrome, 0, "send CQE status");
                got += 1;
            }
            if got < n {
                // Nothing in flight and not done: a timer (retransmit) is due.
                a.d.now += std::time::Duration::from_millis(500);
                b.d.now += std::time::Duration::from_millis(500);
            }
        }
        if op == Op::Send {
            let mut recvd = 0;
            while recvd < n {
                let wc = b.d.poll_cq(1).expect("receive CQE");
                assert_eq!(wc.syndrome, 0, "receive CQE status");
                recvd += 1;
            }
        }
        done += n;
    }
    let cpu = thread_cpu_ns() - c0;
    let secs = t0.elapsed().as_secs_f64();
    let landed = b.d.mem_read(b.buf + 65536, size as usize);
    assert_eq!(landed, pattern[..size as usize], "payload at the receiver");
    (secs, cpu)
}

/// `memcpy` of `size` bytes between two 64 KiB buffers, repeated for at
/// least 1 GiB (a shorter run is dominated by timer noise); returns
/// (seconds per byte, CPU ns per byte).
fn memcpy(size: usize) -> (f64, f64) {
    let count = ((1usize << 30) / size).max(1);
    let src: Vec<u8> = (0..65536u32).map(|i| i as u8).collect();
    let mut dst = vec![0u8; 65536];
    let t0 = Instant::now();
    let c0 = thread_cpu_ns();
    for i in 0..count {
        let at = (i * 64) % (65536 - size + 1);
        dst[at..at + size].copy_from_slice(black_box(&src[..size]));
        black_box(&mut dst);
    }
    let total = (count * size) as f64;
    (
        t0.elapsed().as_secs_f64() / total,
        (thread_cpu_ns() - c0) as f64 / total,
    )
}

fn main() {
    let mib: usize = std::env::var("ERDMA_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    println!(
        "{:<6} {:>7} {:>9} {:>11} {:>12} {:>14} {:>9}",
        "op", "size", "messages", "GB/s", "CPU ns/B", "memcpy GB/s", "vs memcpy"
    );
    for (op, name) in [(Op::Write, "WRITE"), (Op::Send, "SEND")] {
        for size in [64u32, 65536] {
            let bytes = if size == 64 {
                (mib << 20) / 64
            } else {
                mib << 20
            };
            let count = (bytes / size as usize).max(BATCH);
            // One warm-up batch, then the measurement.
            run(op, size, BATCH);
            let (secs, cpu) = run(op, size, count);
            let total = count as f64 * f64::from(size);
            let gbs = total / secs / 1e9;
            let ns_per_byte = cpu as f64 / total;
            let (msecs_per_byte, _) = memcpy(size as usize);
            let mgbs = 1.0 / msecs_per_byte / 1e9;
            println!(
                "{:<6} {:>7} {:>9} {:>11.3} {:>12.3} {:>14.2} {:>8.1}%",
                name,
                size,
                count,
                gbs,
                ns_per_byte,
                mgbs,
                100.0 * gbs / mgbs
            );
            println!(
                "erdma-bench op={name} size={size} messages={count} gbps={gbs:.4} cpu_ns_per_byte={ns_per_byte:.4} memcpy_gbps={mgbs:.3}"
            );
        }
    }
}
