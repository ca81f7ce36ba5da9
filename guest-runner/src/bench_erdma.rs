//! `guest-runner bench-erdma` (ci/bench-erdma.sh): ib_write_bw, then an
//! SMC-Rv2 stream, between two Linux guests with RDMA done by emulated
//! erdma functions (the daemon runs the RC queue pairs) versus the guests'
//! own rxe over virtio-net: the same guests, image, sizes and iterations.
//!
//! Each device is one matrix cell (guest side: ci/guest/bench.sh
//! `cell_erdma_bench`). Per transfer: the client's rate, both guests' busy
//! CPU seconds per GiB (elapsed - idle from /proc/uptime around it) and the
//! daemon's (guest-results' `daemon_cpu`: its user + system time sampled
//! every 0.5 s while the bytes its ports send grow). The table goes to
//! RESULTS/bench.md (and stdout), a chart to bench.svg; the run ends with
//! the two `bench-erdma` summary lines.

use std::collections::BTreeMap;

use guest_results::daemon_cpu;

use crate::bench::{self, BenchArgs};
use crate::cells::{Cell, Device, PerRole, TestRow, BOTH};
use crate::matrix::cell;

/// The bench's options (`ci/bench-erdma.sh --help`).
#[derive(clap::Args, Debug, Clone)]
pub struct BenchErdmaOptions {
    /// kernel, image, QEMU, build, results dir
    #[command(flatten)]
    pub common: BenchArgs,
    /// ib_write_bw -s
    #[arg(long, default_value_t = 65536)]
    pub size: u64,
    /// ib_write_bw -n
    #[arg(long, default_value_t = 2000)]
    pub iters: u64,
    /// MiB of the SMC-R stream
    #[arg(long, default_value_t = 256)]
    pub smc_mib: u64,
}

type Row = bench::BenchRow;

/// One transfer of one device: the client's rate, both guests' busy
/// seconds, whether both sides passed.
#[derive(Debug, Default, PartialEq)]
pub struct Transfer {
    /// The client's MiB/s.
    pub mibps: Option<f64>,
    /// Both guests' busy seconds, added.
    pub busy_s: Option<f64>,
    /// Both roles reported, and passed.
    pub ok: bool,
}

/// The `proto` transfer from both guests' `CI-BENCH` rows.
pub fn transfer(rows: &[Row], proto: &str) -> Transfer {
    let of = |role: &str| {
        rows.iter().find(|r| {
            r.get("proto").map(String::as_str) == Some(proto)
                && r.get("role").map(String::as_str) == Some(role)
        })
    };
    let num =
        |r: Option<&Row>, k: &str| r.and_then(|r| r.get(k)).and_then(|v| v.parse::<f64>().ok());
    let (c, s) = (of("client"), of("server"));
    let passed = |r: Option<&Row>| {
        r.is_some_and(|r| {
            r.get("status").map(String::as_str) == Some("PASS")
                || (r.get("rc").map(String::as_str) == Some("0")
                    && r.get("status").map(String::as_str) == Some("pass"))
        })
    };
    Transfer {
        mibps: num(c, "mibps"),
        busy_s: num(c, "guest_busy_s")
            .zip(num(s, "guest_busy_s"))
            .map(|(a, b)| a + b),
        ok: passed(c) && passed(s),
    }
}

fn f2(v: Option<f64>) -> String {
    v.map_or("?".into(), |v| format!("{v:.2}"))
}

/// Runs the bench: 0 when every transfer passed, 1 when one did not, 2 on
/// a usage or setup error.
pub fn run(b: BenchErdmaOptions) -> i32 {
    crate::boot::install_signal_handlers();
    let timeout = b.common.timeout.unwrap_or(1800);
    let devices = [("erdma", Device::Erdma), ("rxe", Device::Rxe)];
    let mut cells = BTreeMap::new();
    for (name, dev) in devices {
        let mut c = Cell::new(
            &format!(
                "ib_write_bw -s {} -n {}, then a {} MiB SMC-Rv2 stream, over {name} in both guests; \
                 guest and daemon CPU per GiB",
                b.size, b.iters, b.smc_mib
            ),
            ". /opt/vr/ci/bench.sh; cell_erdma_bench",
            [
                if dev == Device::Erdma {
                    "erdma-up"
                } else {
                    "link-add-rxe"
                },
                "smc-ueid",
                "smc-devices",
                "write-bw",
                "bench-smc-1",
            ]
            .iter()
                .map(|t| TestRow(t.to_string(), BOTH.to_vec()))
                .collect(),
            timeout,
        );
        c.rdma = Some(PerRole {
            server: dev,
            client: dev,
        });
        c.daemon_cpu = true;
        cells.insert(format!("bench-{name}"), c);
    }
    let env = vec![
        ("CI_BENCH_SIZE".to_string(), b.size.to_string()),
        ("CI_BENCH_ITERS".into(), b.iters.to_string()),
        ("CI_BENCH_TOTAL_MIB".into(), b.smc_mib.to_string()),
    ];
    let (run, work) = match bench::prepare("bench-erdma", &b.common, timeout, cells, env) {
        Ok(x) => x,
        Err(e) => return bench::fail("ci/bench-erdma.sh", e),
    };
    let (write_bytes, smc_bytes) = (b.size * b.iters, b.smc_mib << 20);
    let mut out: BTreeMap<&str, [(Transfer, Option<f64>); 2]> = BTreeMap::new();
    let mut accel = b.common.setup.accel.clone();
    for (name, _) in devices {
        let cell_name = format!("bench-{name}");
        println!("[bench-erdma] {name} run");
        match cell::run_cell(&run, &b.common.kernel, &cell_name, &work) {
            Ok(res) => {
                if let Some(a) = res.get("accel").filter(|a| a.truthy()) {
                    accel = a.str().to_string();
                }
            }
            Err(cell::Interrupted) => return bench::fail("ci/bench-erdma.sh", "interrupted"),
        }
        let logs = run
            .resdir
            .join(format!("logs/{}-{cell_name}", b.common.kernel));
        let rows = bench::guest_rows(&logs);
        // the two largest bursts of the daemon's traffic, in order: the write, the stream
        let dcpu = daemon_cpu::bursts_file(
            &logs.join("daemon-cpu.log"),
            &[write_bytes, smc_bytes],
            daemon_cpu::clock_ticks(),
        )
        .unwrap_or_default();
        let d = |i: usize| {
            dcpu.get(i)
                .and_then(|l| l.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        };
        out.insert(
            name,
            [
                (transfer(&rows, "write"), d(0)),
                (transfer(&rows, "smc"), d(1)),
            ],
        );
    }
    let _ = std::fs::remove_dir_all(&work);
    let gib = |bytes: u64| bytes as f64 / f64::from(1u32 << 30);
    let per_gib = |t: &Transfer, bytes: u64| t.busy_s.map(|s| s / gib(bytes));
    let (e, r) = (&out["erdma"], &out["rxe"]);
    // one table per transfer: its header, payload, index and row labels
    let part = |head: String, bytes: u64, i: usize, labels: [&str; 2]| {
        let mut t = vec![
            format!(
                "| {head}, {accel} | MiB/s | guest CPU s/GiB (both guests) | daemon CPU s/GiB |"
            ),
            "|---|---:|---:|---:|".to_string(),
        ];
        for (label, x) in labels.iter().zip([&e[i], &r[i]]) {
            t.push(format!(
                "| {label} | {} | {} | {} |",
                f2(x.0.mibps),
                f2(per_gib(&x.0, bytes)),
                f2(x.1)
            ));
        }
        t.join("\n")
    };
    let table = [
        part(
            format!("ib_write_bw, {} B x {}", b.size, b.iters),
            write_bytes,
            0,
            [
                "erdma <-> erdma (QPs in the daemon)",
                "rxe <-> rxe (QPs in the guests)",
            ],
        ),
        part(
            format!("SMC-Rv2 stream, {} MiB, 1 conn", b.smc_mib),
            smc_bytes,
            1,
            ["erdma <-> erdma", "rxe <-> rxe"],
        ),
    ]
    .join("\n\n");
    bench::publish(&run, &table, "erdma vs rxe, ib_write_bw");
    // the summary lines, one per transfer
    let heads = [
        (
            format!("bench-erdma size={} iters={}", b.size, b.iters),
            "mbps",
            write_bytes,
        ),
        (
            format!("bench-erdma-smc mib={}", b.smc_mib),
            "mibps",
            smc_bytes,
        ),
    ];
    for (i, (head, rate, bytes)) in heads.into_iter().enumerate() {
        println!(
            "{head} erdma_{rate}={} rxe_{rate}={} erdma_cpu_s_per_gib={} rxe_cpu_s_per_gib={} \
             erdma_daemon_cpu_s_per_gib={} rxe_daemon_cpu_s_per_gib={}",
            f2(e[i].0.mibps),
            f2(r[i].0.mibps),
            f2(per_gib(&e[i].0, bytes)),
            f2(per_gib(&r[i].0, bytes)),
            f2(e[i].1),
            f2(r[i].1)
        );
    }
    println!("results: {}", run.resdir.display());
    let ok = out.values().all(|t| t.iter().all(|(x, _)| x.ok));
    if !ok {
        eprintln!(
            "[bench-erdma] a transfer failed (logs in {}/logs)",
            run.resdir.display()
        );
    }
    i32::from(!ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transfer_adds_both_guests_and_needs_both_passed() {
        let rows = bench::parse_bench(
            "CI-BENCH proto=write conns=1 role=server status=PASS mibps=0 guest_busy_s=2.5\n\
             CI-BENCH proto=write conns=1 role=client status=PASS mibps=512.5 guest_busy_s=1.5\n\
             CI-BENCH proto=smc conns=1 role=client rc=0 status=pass mibps=80 guest_busy_s=3\n\
             CI-BENCH proto=smc conns=1 role=server rc=1 status=fail mibps=80 guest_busy_s=3\n",
        );
        assert_eq!(
            transfer(&rows, "write"),
            Transfer {
                mibps: Some(512.5),
                busy_s: Some(4.0),
                ok: true
            }
        );
        let smc = transfer(&rows, "smc");
        assert_eq!((smc.mibps, smc.ok), (Some(80.0), false));
        assert_eq!(transfer(&rows, "tcp"), Transfer::default());
    }
}
