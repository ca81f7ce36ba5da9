//! What the checker costs per frame: a table of ns/frame for a non-RoCE
//! frame (classification only), RoCE SEND ONLY frames of 64 and 1024
//! bytes through `Checker::observe`, and `roce-model`'s ICRC check alone on
//! the same frames, all measured in this run.
//!
//! `cargo bench -p wire-checker --bench observe`

#[path = "../tests/common/mod.rs"]
mod common;

use roce_model::{Opcode, PacketBuilder, RoceFrame};
use std::hint::black_box;
use std::time::Instant;
use wire_checker::Checker;

/// A RoCE SEND ONLY from A to B (QP QB) with `len` bytes of payload.
fn frame(psn: u32, len: usize) -> Vec<u8> {
    let payload = vec![0x5a; len];
    common::a2b(PacketBuilder::new(Opcode::RcSendOnly, common::QB, psn).payload(&payload))
}

/// ns per call of `f(0..n)`, the best of 3 passes (the machine is shared).
fn time(n: u64, mut f: impl FnMut(u64)) -> f64 {
    (0..3)
        .map(|_| {
            let t = Instant::now();
            for i in 0..n {
                f(i);
            }
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .fold(f64::MAX, f64::min)
}

fn main() {
    // One pass over distinct PSNs (no wrap: every frame is a new request).
    let n = 16_384u64;
    // An ICMP-ish IPv4 frame: not RoCE, not TCP.
    let mut other = frame(0, 64);
    other[14 + 9] = 1;
    let small: Vec<Vec<u8>> = (0..n as u32).map(|p| frame(p, 64)).collect();
    let big: Vec<Vec<u8>> = (0..n as u32).map(|p| frame(p, 1024)).collect();
    let mut rows = Vec::new();
    rows.push((
        "classify, non-RoCE frame",
        time(n, |_| {
            black_box(wire_checker::classify(black_box(&other)));
        }),
    ));
    for (name, set) in [("64 B", &small), ("1024 B", &big)] {
        let icrc = time(n, |i| {
            let f = &set[i as usize];
            black_box(RoceFrame::parse(f).unwrap().verify_icrc().is_ok());
        });
        // A fresh checker per pass: every frame is a new request in order.
        let mut c = Checker::default();
        let obs = time(n, |i| {
            if i == 0 {
                c = Checker::default();
            }
            c.observe(i, "p0", &set[i as usize]);
        });
        assert!(c.findings().is_empty(), "a clean stream");
        rows.push((
            if name == "64 B" {
                "parse + ICRC only, 64 B"
            } else {
                "parse + ICRC only, 1024 B"
            },
            icrc,
        ));
        rows.push((
            if name == "64 B" {
                "Checker::observe, 64 B SEND ONLY"
            } else {
                "Checker::observe, 1024 B SEND ONLY"
            },
            obs,
        ));
    }
    println!("{:<36} {:>10} {:>12}", "what", "ns/frame", "Mframes/s");
    for (what, ns) in rows {
        println!("{what:<36} {ns:>10.1} {:>12.2}", 1e3 / ns);
    }
}
