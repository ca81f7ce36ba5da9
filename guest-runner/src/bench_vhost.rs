//! `guest-runner bench-vhost` (ci/bench-vhost.sh): ib_write_bw guest ->
//! guest vs guest -> virtual host, in one run.
//!
//! One boot of two Linux guests with rxe through the daemon, plus a virtual
//! host vh (10.77.0.10, virtual-host crate) on the same fabric with a
//! write-bw-server service. Guest B (the client) runs the unmodified
//! `ib_write_bw -d rxe0 -x GID -n N -s S` first against guest A's server,
//! then, with the same size and iterations, against the virtual host; each
//! guest's busy CPU seconds around its runs (elapsed - idle, so softirq and
//! kworkers, where rxe does its work, count). One matrix cell (guest side:
//! ci/guest/bench.sh `cell_vhost_bench`); the host's session is judged as in
//! the virtual-host cells.
//!
//! Before the guests boot (so that they do not share the CPU with it) it
//! runs the in-process engine benchmark, `cargo bench -p roce-model --bench
//! engine`, and prints its table beside the guests' (`--no-engine` skips it).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::json;

use crate::bench::{self, BenchArgs};
use crate::cells::{Cell, Device, PerRole, TestRow, BOTH};
use crate::matrix::cell;
use crate::virtual_hosts::{Service, VirtualHosts, VH};

/// The bench's options (`ci/bench-vhost.sh --help`).
#[derive(clap::Args, Debug, Clone)]
pub struct BenchVhostOptions {
    /// kernel, image, QEMU, build, results dir
    #[command(flatten)]
    pub common: BenchArgs,
    /// ib_write_bw -s
    #[arg(long, default_value_t = 65536)]
    pub size: u64,
    /// ib_write_bw -n
    #[arg(long, default_value_t = 1000)]
    pub iters: u64,
    /// ib_write_bw -u, both runs (20, ~4 s: a TCG guest can stall longer
    /// than the default 67 ms and rxe then fails the run with RETRY_EXC_ERR)
    #[arg(long, default_value_t = 20)]
    pub qp_timeout: u32,
    /// skip the in-process engine benchmark
    #[arg(long)]
    pub no_engine: bool,
}

/// The perftest result row of a tool log for `size` and `iters`: peak and
/// average MiB/s and Mpps.
pub fn perftest_row(log: &str, size: u64, iters: u64) -> Option<[f64; 3]> {
    log.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 5 || f[0] != size.to_string() || f[1] != iters.to_string() {
            return None;
        }
        let n = |i: usize| f[i].parse::<f64>().ok();
        Some([n(2)?, n(3)?, n(4)?])
    })
}

fn f(v: Option<f64>, p: usize) -> String {
    v.map_or("?".into(), |v| format!("{v:.p$}"))
}

/// Runs the bench: 0 when both runs and the host's session passed, 1 when
/// one did not, 2 on a usage or setup error.
pub fn run(b: BenchVhostOptions) -> i32 {
    crate::boot::install_signal_handlers();
    let timeout = b.common.timeout.unwrap_or(1800);
    let hosts = VirtualHosts {
        services: vec![Service {
            host: "vh",
            kind: "write-bw-server".into(),
            opts: vec![
                ("port", json!(18600)),
                ("size", json!(b.size)),
                ("iters", json!(b.iters)),
            ],
            row: "write-bw-vhost".into(),
            iters: b.iters,
            verified: None,
        }],
    };
    let mut c = Cell::new(
        &format!(
            "ib_write_bw -s {} -n {} -u {} from guest B over rxe: to guest A, then to the virtual host",
            b.size, b.iters, b.qp_timeout
        ),
        ". /opt/vr/ci/bench.sh; cell_vhost_bench",
        vec![
            TestRow("link-add-rxe".into(), BOTH.to_vec()),
            TestRow("write-bw".into(), BOTH.to_vec()),
            TestRow("write-bw-vhost".into(), vec![crate::cells::Role::Client]),
        ],
        timeout,
    );
    c.rdma = Some(PerRole {
        server: Device::Rxe,
        client: Device::Rxe,
    });
    c.virtual_hosts = Some(hosts);
    let env = vec![
        ("CI_BENCH_SIZE".to_string(), b.size.to_string()),
        ("CI_BENCH_ITERS".into(), b.iters.to_string()),
        ("CI_BENCH_QP_TIMEOUT".into(), b.qp_timeout.to_string()),
        ("CI_VHOST".into(), VH.into()),
    ];
    let cells = BTreeMap::from([("vhost-bench".to_string(), c)]);
    let (run, work) = match bench::prepare("bench-vhost", &b.common, timeout, cells, env) {
        Ok(x) => x,
        Err(e) => return bench::fail("ci/bench-vhost.sh", e),
    };
    let mut engine = String::new();
    if !b.no_engine {
        println!(
            "[bench-vhost] in-process engine benchmark (cargo bench -p roce-model --bench engine)"
        );
        match Command::new("cargo")
            .args(["bench", "-q", "-p", "roce-model", "--bench", "engine"])
            .current_dir(&run.root)
            .output()
        {
            Ok(o) if o.status.success() => engine = String::from_utf8_lossy(&o.stdout).into_owned(),
            _ => eprintln!("[bench-vhost] the engine benchmark failed"),
        }
    }
    let res = match cell::run_cell(&run, &b.common.kernel, "vhost-bench", &work) {
        Ok(r) => r,
        Err(cell::Interrupted) => return bench::fail("ci/bench-vhost.sh", "interrupted"),
    };
    let _ = std::fs::remove_dir_all(&work);
    let logs = run
        .resdir
        .join(format!("logs/{}-vhost-bench", b.common.kernel));
    let read =
        |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    let rows = bench::guest_rows(&logs);
    let busy = |proto: &str, role: &str| {
        rows.iter()
            .find(|r| {
                r.get("proto").map(String::as_str) == Some(proto)
                    && r.get("role").map(String::as_str) == Some(role)
            })
            .and_then(|r| r.get("guest_busy_s"))
            .and_then(|v| v.parse::<f64>().ok())
    };
    let gib = (b.size * b.iters) as f64 / f64::from(1u32 << 30);
    let host_counted = res
        .at("tests")
        .items()
        .iter()
        .find(|t| t.at("test").str() == "write-bw-vhost")
        .map(|t| {
            t.at("detail")
                .str()
                .rsplit("; ")
                .next()
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_default();
    let accel = res
        .get("accel")
        .filter(|a| a.truthy())
        .map_or(b.common.setup.accel.clone(), |a| a.str().to_string());
    let mut md = vec![
        format!(
            "ib_write_bw -s {} -n {} -u {} (RC, rxe, RoCE v2), guest B -> target; accel {accel}; 1 vCPU guests.",
            b.size, b.iters, b.qp_timeout
        ),
        "MiB/s and msg/s: the client's perftest row (BW average, MsgRate); CPU: guest busy seconds \
         (elapsed - idle) over the run per GiB moved."
            .into(),
        String::new(),
        "| target | tool | MiB/s | peak MiB/s | msg/s | client guest CPU s/GiB | server guest CPU s/GiB | host counted |"
            .into(),
        "|---|---|---|---|---|---|---|---|".into(),
    ];
    let mut rates = BTreeMap::new();
    for (proto, label, log) in [
        ("write", "guest A (rxe)", "b.job/write-bw.client.log"),
        ("vhost", "virtual host", "b.job/write-bw-vhost.client.log"),
    ] {
        let row = perftest_row(&read(&logs.join(log)), b.size, b.iters);
        let test = if proto == "write" {
            "write-bw"
        } else {
            "write-bw-vhost"
        };
        let status = res
            .at("tests")
            .items()
            .iter()
            .find(|t| t.at("test").str() == test)
            .map_or("?".to_string(), |t| t.at("status").str().to_string());
        rates.insert(proto, row.map(|r| r[1]));
        let per = |v: Option<f64>| v.map(|s| s / gib);
        md.push(format!(
            "| {label} | {status} | {} | {} | {} | {} | {} | {} |",
            f(row.map(|r| r[1]), 2),
            f(row.map(|r| r[0]), 2),
            f(row.map(|r| r[2] * 1e6), 0),
            f(per(busy(proto, "client")), 2),
            if proto == "write" {
                f(per(busy("write", "server")), 2)
            } else {
                "n/a (daemon)".into()
            },
            if proto == "write" { "-" } else { &host_counted }
        ));
    }
    if let (Some(Some(g)), Some(Some(v))) = (rates.get("write"), rates.get("vhost")) {
        md.push(format!("\nvirtual host / guest throughput: {:.2}", v / g));
    }
    let table = md.join("\n");
    if !engine.is_empty() {
        println!("## In-process RC engine, engine to engine (cargo bench -p roce-model --bench engine, same run)\n\n```");
        for l in engine.lines().filter(|l| {
            ["workload", "memcpy", "SEND", "RDMA"]
                .iter()
                .any(|p| l.starts_with(p))
        }) {
            println!("{l}");
        }
        println!("```\n\n## ib_write_bw from guest B: to guest A vs to the virtual host\n");
    }
    bench::publish(&run, &table, "ib_write_bw from guest B");
    println!("results: {}", run.resdir.display());
    i32::from(res.at("status").str() != "PASS")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_result_row_is_the_one_of_the_size_and_iterations() {
        let log = " #bytes #iterations BW peak[MiB/sec] BW average[MiB/sec] MsgRate[Mpps]\n \
                   65536 1000 120.50 118.25 0.001892\n";
        assert_eq!(
            perftest_row(log, 65536, 1000),
            Some([120.5, 118.25, 0.001892])
        );
        assert_eq!(perftest_row(log, 4096, 1000), None);
    }
}
