//! `guest-runner bench-smc` (ci/bench-smc.sh): SMC-R against TCP between
//! two guests on the vhost-rdma daemon, as one matrix cell (`smc-bench`).
//!
//! One boot: the daemon (two vhost-user ports) and guests A (server) and B
//! (client), rxe0 and the same UEID in both; then for each connection
//! count `smc-guest-tests stream --proto smc` and `--proto tcp` (client ->
//! server, the same total bytes), barriers between the phases (guest side:
//! ci/guest/bench.sh on ci/guest/ci-lib.sh). Each guest prints a
//! `CI-BENCH key=value ...` line per stream; the Markdown table goes to
//! RESULTS/bench.md (and stdout), the raw rows and the cell's record to
//! bench.json, a chart to bench.svg.

use std::collections::BTreeMap;

use guest_results::pyjson::Json;

use crate::bench::{self, BenchArgs};
use crate::cells::{self, Cell, TestRow};
use crate::matrix::{self, cell};
use crate::setup;

/// The bench's options (`ci/bench-smc.sh --help`).
#[derive(clap::Args, Debug, Clone)]
pub struct BenchSmcOptions {
    /// kernel, image, QEMU, build, results dir
    #[command(flatten)]
    pub common: BenchArgs,
    /// MiB per run, split over the connections
    #[arg(long, default_value_t = 128)]
    pub total: u32,
    /// connection counts
    #[arg(long, default_value = "1,4")]
    pub conns: String,
    /// protocols
    #[arg(long, default_value = "smc,tcp")]
    pub protos: String,
}

type Row = bench::BenchRow;

/// The table: one line per (connections, protocol), and an SMC/TCP ratio
/// line per connection count that has both.
pub fn table(rows: &[Row], total_mib: u32) -> String {
    let num = |r: &Row, k: &str| r.get(k).and_then(|v| v.parse::<f64>().ok());
    let mut by: BTreeMap<(u32, String, String), &Row> = BTreeMap::new();
    for r in rows {
        if let (Some(c), Some(p), Some(role)) = (
            r.get("conns").and_then(|c| c.parse().ok()),
            r.get("proto"),
            r.get("role"),
        ) {
            by.insert((c, p.clone(), role.clone()), r);
        }
    }
    let mut out = vec![
        "| conns | proto | MiB/s | tool CPU s/GiB (client / server) | whole-guest CPU s/GiB (client / server) \
         | client usr/sys/softirq ticks s | server usr/sys/softirq ticks s | secs | mode |"
            .to_string(),
        "|---|---|---|---|---|---|---|---|---|".into(),
    ];
    let f = |v: Option<f64>, p: usize| v.map_or("?".into(), |v| format!("{v:.p$}"));
    let empty = Row::new();
    let conns: std::collections::BTreeSet<u32> = by.keys().map(|k| k.0).collect();
    for c in conns {
        let mut per: BTreeMap<&str, [Option<f64>; 5]> = BTreeMap::new();
        for proto in ["smc", "tcp"] {
            let get = |role: &str| by.get(&(c, proto.to_string(), role.to_string())).copied();
            let (cl, sv) = (get("client"), get("server"));
            if cl.is_none() && sv.is_none() {
                continue;
            }
            let (cl, sv) = (cl.unwrap_or(&empty), sv.unwrap_or(&empty));
            let bytes = num(cl, "bytes")
                .or(num(sv, "bytes"))
                .unwrap_or(f64::from(total_mib) * 1048576.0);
            let gib = bytes / 1073741824.0;
            let mib = num(cl, "mibps").or(num(sv, "mibps"));
            let guest = |r: &Row| {
                num(r, "guest_busy_s")
                    .filter(|_| gib > 0.0)
                    .map(|b| b / gib)
            };
            let d = [
                mib,
                num(cl, "cpu_s_per_gib"),
                num(sv, "cpu_s_per_gib"),
                guest(cl),
                guest(sv),
            ];
            let ok = [cl, sv].iter().all(|r| {
                r.get("rc").map(String::as_str) == Some("0")
                    && r.get("status").map(String::as_str) == Some("pass")
            });
            per.insert(proto, d);
            let split = |r: &Row| {
                ["guest_user_s", "guest_sys_s", "guest_softirq_s"]
                    .iter()
                    .map(|k| r.get(*k).map_or("?", String::as_str))
                    .collect::<Vec<_>>()
                    .join("/")
            };
            let mode = cl
                .get("smc_mode")
                .or(sv.get("smc_mode"))
                .filter(|m| !m.is_empty())
                .map_or("-", String::as_str);
            out.push(format!(
                "| {c} | {proto}{} | {} | {} / {} | {} / {} | {} | {} | {} | {mode} |",
                if ok { "" } else { " **FAIL**" },
                f(d[0], 2),
                f(d[1], 2),
                f(d[2], 2),
                f(d[3], 2),
                f(d[4], 2),
                split(cl),
                split(sv),
                f(num(cl, "secs"), 1),
            ));
        }
        if let (Some(a), Some(b)) = (per.get("smc"), per.get("tcp")) {
            let r = |i: usize| match (a[i], b[i]) {
                (Some(x), Some(y)) if y != 0.0 => format!("{:.2}", x / y),
                _ => "?".into(),
            };
            out.push(format!(
                "| {c} | **SMC/TCP** | {} | {} / {} | {} / {} | | | | |",
                r(0),
                r(1),
                r(2),
                r(3),
                r(4)
            ));
        }
    }
    out.join("\n")
}

/// Runs the bench: exit 0 when the cell passed, 1 when it did not, 2 on a
/// usage or setup error.
pub fn run(b: BenchSmcOptions) -> i32 {
    crate::boot::install_signal_handlers();
    let timeout = b.common.timeout.unwrap_or(2400);
    let conns: Vec<u32> = match b
        .conns
        .split(',')
        .filter(|c| !c.is_empty())
        .map(str::parse)
        .collect()
    {
        Ok(c) => c,
        Err(_) => return bench::fail("ci/bench-smc.sh", "--conns: a comma list of numbers"),
    };
    if conns.is_empty() || conns.iter().any(|c| *c < 1 || !b.total.is_multiple_of(*c)) {
        return bench::fail(
            "ci/bench-smc.sh",
            "--total must divide by every --conns value",
        );
    }
    let protos: Vec<&str> = b.protos.split(',').filter(|p| !p.is_empty()).collect();
    let names: Vec<String> = conns
        .iter()
        .flat_map(|c| protos.iter().map(move |p| format!("bench-{p}-{c}")))
        .collect();
    let both = cells::BOTH.to_vec();
    let mut tests: Vec<TestRow> = ["link-add-rxe", "smc-ueid", "smc-devices"]
        .iter()
        .map(|t| TestRow(t.to_string(), both.clone()))
        .collect();
    tests.extend(names.iter().map(|n| TestRow(n.clone(), both.clone())));
    let what = format!(
        "SMC-R vs TCP stream, {} MiB client->server per run, conns {}, tool CPU (getrusage) and whole-guest CPU (/proc/stat)",
        b.total, b.conns
    );
    let bench_cell = Cell::new(
        &what,
        ". /opt/vr/ci/bench.sh; cell_smc_bench",
        tests,
        timeout,
    );
    let conns_env: Vec<String> = conns.iter().map(u32::to_string).collect();
    let env = vec![
        ("CI_BENCH_CONNS".into(), conns_env.join(" ")),
        ("CI_BENCH_TOTAL_MIB".into(), b.total.to_string()),
        ("CI_BENCH_PROTOS".into(), protos.join(" ")),
    ];
    let cells = BTreeMap::from([("smc-bench".to_string(), bench_cell)]);
    let (run, work) = match bench::prepare("bench-smc", &b.common, timeout, cells, env) {
        Ok(x) => x,
        Err(e) => return bench::fail("ci/bench-smc.sh", e),
    };
    let (resdir, date) = (run.resdir.clone(), setup::date_stamp());
    let res = match cell::run_cell(&run, &b.common.kernel, "smc-bench", &work) {
        Ok(r) => r,
        Err(cell::Interrupted) => return bench::fail("ci/bench-smc.sh", "interrupted"),
    };
    let _ = std::fs::remove_dir_all(&work);
    let logs = resdir.join(format!("logs/{}-smc-bench", b.common.kernel));
    let rows = bench::guest_rows(&logs);
    let kernels: std::collections::BTreeSet<String> = res
        .at("guest_kernel")
        .entries()
        .iter()
        .map(|(_, v)| v.str().to_string())
        .collect();
    let kernels = if kernels.is_empty() {
        b.common.kernel.clone()
    } else {
        kernels.into_iter().collect::<Vec<_>>().join(", ")
    };
    let accel = res
        .get("accel")
        .filter(|a| a.truthy())
        .map_or(b.common.setup.accel.clone(), |a| a.to_string());
    let argv: Vec<String> = std::env::args().skip(2).collect();
    let mut md = vec![
        format!("# SMC-R vs TCP, {date}"),
        String::new(),
        format!(
            "Guests: Linux {kernels}, 1 vCPU, accel {accel}, through the vhost-rdma daemon (virtio-net pci, 1 queue \
             pair); client -> server, {} MiB per run split over the connections, every byte verified; command \
             `ci/bench-smc.sh {}`.",
            b.total,
            argv.join(" ")
        ),
        String::new(),
        "CPU s/GiB: *tool* = getrusage of the smc-guest-tests process (`cpu_s_per_gib`); *whole-guest* = that \
         guest's busy time over the stream run (elapsed - idle - iowait from /proc/uptime, 1 vCPU; includes \
         softirq, kworkers and everything else the guest ran), per GiB moved. The usr/sys/softirq split is from \
         /proc/stat ticks (tick-sampled accounting: under TCG it undercounts, use it for proportions only)."
            .into(),
        String::new(),
        table(&rows, b.total),
        String::new(),
        format!(
            "Cell: {}, wall {} s; logs: {}/",
            res.at("status"),
            res.at("wall_s"),
            logs.display()
        ),
        String::new(),
    ];
    for t in res
        .at("tests")
        .items()
        .iter()
        .filter(|t| t.at("status").str() != "PASS")
    {
        let detail: String = t.at("detail").str().chars().take(400).collect();
        md.push(format!("- {} {}: {detail}", t.at("status"), t.at("test")));
    }
    let text = md.join("\n");
    let rows_json = Json::Array(
        rows.iter()
            .map(|r| {
                Json::Object(
                    r.iter()
                        .map(|(k, v)| (k.clone(), Json::Str(v.clone())))
                        .collect(),
                )
            })
            .collect(),
    );
    let doc = matrix::obj(vec![("rows", rows_json), ("cell", res.clone())]);
    if let Ok(t) = serde_json::to_string_pretty(&doc) {
        let _ = std::fs::write(resdir.join("bench.json"), t);
    }
    bench::publish(&run, &text, "SMC-R vs TCP");
    i32::from(res.at("status").str() != "PASS")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both guests' lines make one row per protocol and a ratio row.
    #[test]
    fn the_table_has_a_ratio_row_per_connection_count() {
        let a = "x\nCI-BENCH proto=smc conns=1 role=server rc=0 status=pass bytes=1073741824 mibps=200 \
                 cpu_s_per_gib=1.5 guest_busy_s=4\n\
                 CI-BENCH proto=tcp conns=1 role=server rc=0 status=pass bytes=1073741824 mibps=100 \
                 cpu_s_per_gib=3 guest_busy_s=8\n";
        let b = "CI-BENCH proto=smc conns=1 role=client rc=0 status=pass bytes=1073741824 mibps=200 \
                 cpu_s_per_gib=1 secs=5.0 smc_mode=SMCR\n\
                 CI-BENCH proto=tcp conns=1 role=client rc=1 status=fail bytes=1073741824 mibps=100 cpu_s_per_gib=2\n";
        let rows: Vec<Row> = bench::parse_bench(a)
            .into_iter()
            .chain(bench::parse_bench(b))
            .collect();
        assert_eq!(rows.len(), 4);
        let t = table(&rows, 128);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 5, "{t}");
        assert_eq!(
            lines[2],
            "| 1 | smc | 200.00 | 1.00 / 1.50 | ? / 4.00 | ?/?/? | ?/?/? | 5.0 | SMCR |"
        );
        assert!(
            lines[3].starts_with("| 1 | tcp **FAIL** | 100.00 | 2.00 / 3.00 |"),
            "{}",
            lines[3]
        );
        assert_eq!(
            lines[4],
            "| 1 | **SMC/TCP** | 2.00 | 0.50 / 0.50 | ? / 0.50 | | | | |"
        );
    }
}
