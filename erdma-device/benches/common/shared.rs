//! What the erdma benches share (`benches/datapath.rs`, and the daemon's
//! `erdma_fabric` bench by `#[path]`): how many messages a case sends, and
//! the reference, `memcpy` of the same sizes in the same run.

use std::hint::black_box;
use std::time::Instant;

/// CPU time of this thread, in ns (the scheduler's own account).
pub fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `memcpy` of `size` bytes between two 64 KiB buffers, repeated for at
/// least 1 GiB (a shorter run is dominated by timer noise); returns
/// (seconds per byte, CPU ns per byte).
pub fn memcpy(size: usize) -> (f64, f64) {
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

/// Messages of `size` bytes a case sends: `ERDMA_BENCH_MIB` (default 256)
/// MiB of payload at 64 KiB, 1/64 of it at 64 B, at least one `batch`.
pub fn messages(size: u32, batch: usize) -> usize {
    let mib: usize = std::env::var("ERDMA_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let bytes = if size == 64 {
        (mib << 20) / 64
    } else {
        mib << 20
    };
    (bytes / size as usize).max(batch)
}

/// A case's figures from `count` messages of `size` bytes in `secs` seconds
/// and `cpu` CPU ns: (GB/s, CPU ns per byte, `memcpy` GB/s of that size,
/// measured now).
pub fn rates(count: usize, size: u32, secs: f64, cpu: u64) -> (f64, f64, f64) {
    let total = count as f64 * f64::from(size);
    let gbs = total / secs / 1e9;
    let ns_per_byte = cpu as f64 / total;
    let mgbs = 1.0 / memcpy(size as usize).0 / 1e9;
    (gbs, ns_per_byte, mgbs)
}
