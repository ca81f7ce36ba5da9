//! Frames per second through the daemon in-process: two in-process vhost-user
//! front ends (the test harness's `TestGuest`) on two ports of one `Server`;
//! A sends bursts, B receives and re-posts buffers. This measures the whole
//! daemon path (descriptor walking, copies, switching, notifications) plus the
//! harness's own guest-side work, on the same machine in the same run.
//!
//! Run: `cargo bench -p vhost-rdma --bench fabric`

#[path = "../tests/common/mod.rs"]
mod common;

use common::packet::tagged_frame;
use common::{feat, TestFabric, TxOpts, ARRIVE};
use std::time::{Duration, Instant};

const BURST: usize = 64;

fn run(len: usize, min_time: Duration) -> (u64, f64) {
    let fab = TestFabric::start(2, 1);
    let features = feat::ALL & !feat::MQ;
    let mut a = fab.connect(0, features);
    let mut b = fab.connect(1, features);
    let (ma, mb) = (fab.mac(0), fab.mac(1));
    // Teach the switch where A lives so B's direction needs no flooding.
    b.post_rx(0, 256, 2048);
    a.post_rx(0, 8, 2048);
    let frames: Vec<Vec<u8>> = (0..BURST)
        .map(|i| tagged_frame(mb, ma, i as u64, len))
        .collect();
    let opts = TxOpts::default();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < min_time {
        a.send_burst(0, &frames, &opts);
        let got = b.recv_n(0, BURST, ARRIVE);
        assert_eq!(got.len(), BURST, "frames lost in the benchmark");
        n += got.len() as u64;
        b.post_rx(0, BURST, 2048);
        a.wait_tx(0, ARRIVE);
    }
    let secs = start.elapsed().as_secs_f64();
    let s = fab.stats(1);
    assert_eq!(s.rx_drops, 0, "drops during the benchmark");
    (n, secs)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick")
        || std::env::var_os("VHOST_RDMA_BENCH_QUICK").is_some();
    let t = if quick {
        Duration::from_millis(500)
    } else {
        Duration::from_secs(3)
    };
    println!("| frame size | frames | seconds | frames/s | Gbit/s |");
    println!("|---:|---:|---:|---:|---:|");
    for len in [64usize, 1500] {
        let (n, secs) = run(len, t);
        let fps = n as f64 / secs;
        println!(
            "| {len} B | {n} | {secs:.2} | {fps:.0} | {:.2} |",
            fps * len as f64 * 8.0 / 1e9
        );
    }
}
