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
//! 64 B; `ERDMA_BENCH_ONLY=WRITE-65536`: that case alone, for a profiler).
//! Prints one `erdma-bench` line per case.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "common/shared.rs"]
mod shared;

use std::time::Instant;

use common::rc::*;
use common::*;
use erdma_device::wqe::op;

/// Registered buffer: 32 pages (two 64 KiB halves).
const PAGES: u64 = 32;
/// Work requests in flight per batch (SQ of 256 WQEBBs, 2 per WRITE SQE).
const BATCH: usize = 64;

/// Moves frames between the two devices until neither has any to send.
fn shuttle(a: &mut Side, b: &mut Side) {
    while exchange(a, b) > 0 || !a.d.tx.is_empty() || !b.d.tx.is_empty() {}
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Write,
    Send,
}

/// Runs `count` messages of `size` bytes; returns (seconds, CPU ns).
fn run(op: Op, size: u32, count: usize) -> (f64, u64) {
    let depths = (1024, 256, 256);
    let mut a = rc::side(Driver::new(MAC_A), IP_A, false, 2, depths, PAGES);
    let mut b = rc::side(Driver::new(MAC_B), IP_B, false, 3, depths, PAGES);
    connect(&mut a, &mut b);
    // A's source: the first 64 KiB half, a known pattern.
    let pattern: Vec<u8> = (0..65536u32).map(|i| (i * 7 + 3) as u8).collect();
    a.d.mem_write(a.buf, &pattern);
    let sink = VA + 65536;
    let t0 = Instant::now();
    let c0 = shared::thread_cpu_ns();
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
                Op::Write => write_sqe(op::WRITE, size, VA, sink, STAG, 0),
                Op::Send => send_sqe(op::SEND, size, VA, STAG, 0),
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
    let cpu = shared::thread_cpu_ns() - c0;
    let secs = t0.elapsed().as_secs_f64();
    let landed = b.d.mem_read(b.buf + 65536, size as usize);
    assert_eq!(landed, pattern[..size as usize], "payload at the receiver");
    (secs, cpu)
}

fn main() {
    println!(
        "{:<6} {:>7} {:>9} {:>11} {:>12} {:>14} {:>9}",
        "op", "size", "messages", "GB/s", "CPU ns/B", "memcpy GB/s", "vs memcpy"
    );
    for (op, name) in [(Op::Write, "WRITE"), (Op::Send, "SEND")] {
        for size in [64u32, 65536] {
            let only = std::env::var("ERDMA_BENCH_ONLY").unwrap_or_default();
            if !only.is_empty() && only != format!("{name}-{size}") {
                continue;
            }
            let count = shared::messages(size, BATCH);
            // One warm-up batch, then the measurement.
            run(op, size, BATCH);
            let (secs, cpu) = run(op, size, count);
            let (gbs, ns_per_byte, mgbs) = shared::rates(count, size, secs, cpu);
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
