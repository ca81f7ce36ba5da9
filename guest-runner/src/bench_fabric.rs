//! `guest-runner bench-fabric` (scripts/bench-fabric.sh): guest-to-guest
//! TCP throughput (iperf3, 1 and 4 streams) between the same two guests,
//! through the vhost-rdma daemon and through QEMU's own `-netdev stream`
//! link (the baseline), as one Markdown table with the ratio; then the
//! in-process fabric benchmark (`cargo bench -p vhost-rdma --bench fabric`).
//!
//! Each path is one matrix cell (guest side: `ci-lib.sh` `cell_iperf`); the
//! table goes to RESULTS/bench.md (and stdout), a chart to bench.svg.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use guest_results::pyjson::Json;

use crate::bench::{self, BenchArgs};
use crate::cells::{Cell, TestRow, BOTH};
use crate::matrix::cell;

/// The bench's options (`scripts/bench-fabric.sh --help`).
#[derive(clap::Args, Debug, Clone)]
pub struct BenchFabricOptions {
    /// kernel, image, QEMU, build, results dir
    #[command(flatten)]
    pub common: BenchArgs,
    /// iperf3 -t
    #[arg(long, default_value_t = 10)]
    pub time: u32,
    /// device form on the daemon path
    #[arg(long, default_value = "pci", value_parser = ["pci", "testdev"])]
    pub form: String,
    /// queue pairs on the daemon path
    #[arg(long, default_value_t = 1)]
    pub queues: u32,
    /// which paths: daemon, stream
    #[arg(long, default_value = "daemon,stream")]
    pub paths: String,
    /// skip the in-process fabric benchmark
    #[arg(long)]
    pub no_cargo_bench: bool,
}

/// iperf3's JSON (`-J`) of a client: the receiver's Mbit/s and the
/// sender's retransmits.
pub fn iperf_rate(json: &str) -> Option<(f64, Option<u64>)> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let end = v.get("end")?;
    let bps = end.get("sum_received")?.get("bits_per_second")?.as_f64()?;
    let retr = end
        .get("sum_sent")
        .and_then(|s| s.get("retransmits"))
        .and_then(serde_json::Value::as_u64);
    Some((bps / 1e6, retr))
}

/// Mbit/s and retransmits of `-P N` on the path whose logs are here.
type Rate<'a> = &'a dyn Fn(&Path, u32) -> Option<(f64, Option<u64>)>;

/// One path's results: its label, the cell's record, its logs dir.
struct PathRun {
    name: String,
    label: String,
    res: Json,
    logs: PathBuf,
}

/// The table: a row per stream count, a column per path, the ratio when
/// both ran.
fn table(runs: &[PathRun], rate: Rate) -> String {
    let both = runs.iter().any(|r| r.name == "daemon") && runs.iter().any(|r| r.name == "stream");
    let mut hdr: Vec<String> = vec!["streams".into()];
    hdr.extend(runs.iter().map(|r| format!("{} Mbit/s (retr)", r.label)));
    if both {
        hdr.push("ratio daemon/stream".into());
    }
    let mut out = vec![
        format!("| {} |", hdr.join(" | ")),
        format!("|{}|", vec!["---"; hdr.len()].join("|")),
    ];
    for n in [1, 4] {
        let mut row = vec![format!("{n} (-P {n})")];
        let mut vals = BTreeMap::new();
        for r in runs {
            let v = rate(&r.logs, n);
            vals.insert(r.name.as_str(), v.map(|x| x.0));
            row.push(match v {
                None => "FAILED".into(),
                Some((mbps, retr)) => {
                    format!("{mbps:.0} ({})", retr.map_or("-".into(), |r| r.to_string()))
                }
            });
        }
        if both {
            row.push(
                match (
                    vals.get("daemon").copied().flatten(),
                    vals.get("stream").copied().flatten(),
                ) {
                    (Some(a), Some(b)) if a > 0.0 && b > 0.0 => format!("{:.2}", a / b),
                    _ => "-".into(),
                },
            );
        }
        out.push(format!("| {} |", row.join(" | ")));
    }
    out.join("\n")
}

/// Runs the bench: 0 when every path and the cargo bench passed, 1 when
/// one did not, 2 on a usage or setup error.
pub fn run(b: BenchFabricOptions) -> i32 {
    crate::boot::install_signal_handlers();
    let timeout = b.common.timeout.unwrap_or(b.time * 2 + 400);
    let paths: Vec<&str> = b.paths.split(',').filter(|p| !p.is_empty()).collect();
    if paths.is_empty() || paths.iter().any(|p| !["daemon", "stream"].contains(p)) {
        return bench::fail(
            "scripts/bench-fabric.sh",
            "--paths: a comma list of daemon, stream",
        );
    }
    let mut cells = BTreeMap::new();
    for p in &paths {
        let mut c = Cell::new(
            &format!("iperf3 -t {} with 1 and 4 streams, path {p}", b.time),
            "cell_iperf",
            ["iperf3-P1", "iperf3-P4"]
                .iter()
                .map(|t| TestRow(t.to_string(), BOTH.to_vec()))
                .collect(),
            timeout,
        );
        if *p == "daemon" {
            c.form = if b.form == "testdev" {
                "testdev"
            } else {
                "pci"
            };
            c.queues = b.queues;
        }
        cells.insert(format!("fabric-{p}"), c);
    }
    let env = vec![("CI_IPERF_SECS".to_string(), b.time.to_string())];
    let (mut run, work) = match bench::prepare("bench-fabric", &b.common, timeout, cells, env) {
        Ok(x) => x,
        Err(e) => return bench::fail("scripts/bench-fabric.sh", e),
    };
    let mut runs = Vec::new();
    for p in &paths {
        let name = format!("fabric-{p}");
        run.o.net = if *p == "daemon" {
            "vhost-user"
        } else {
            "stream"
        }
        .into();
        let res = match cell::run_cell(&run, &b.common.kernel, &name, &work) {
            Ok(r) => r,
            Err(cell::Interrupted) => return bench::fail("scripts/bench-fabric.sh", "interrupted"),
        };
        let label = if *p == "daemon" {
            format!("vhost-rdma daemon ({}, {}q)", b.form, b.queues)
        } else {
            "QEMU -netdev stream".into()
        };
        runs.push(PathRun {
            name: p.to_string(),
            label,
            logs: run.resdir.join(format!("logs/{}-{name}", b.common.kernel)),
            res,
        });
    }
    let _ = std::fs::remove_dir_all(&work);
    let qver = crate::qemu::qemu_version(&run.qemu).map_or_else(|e| e.to_string(), |(_, l)| l);
    let meta: Vec<String> = runs
        .iter()
        .map(|r| {
            let boots: Vec<String> = r
                .res
                .at("boot_s")
                .entries()
                .iter()
                .map(|(g, s)| format!("{g} {s} s"))
                .collect();
            format!(
                "{}: accel {}, boot {}",
                r.label,
                r.res.at("accel"),
                boots.join(", ")
            )
        })
        .collect();
    let rate = |logs: &Path, n: u32| {
        std::fs::read_to_string(logs.join(format!("b.job/iperf-P{n}.json")))
            .ok()
            .and_then(|t| iperf_rate(&t))
    };
    let mut md = vec![
        String::new(),
        format!(
            "## Guest-to-guest TCP throughput (iperf3 -t {}, receiver Mbit/s)",
            b.time
        ),
        String::new(),
        format!("QEMU: {qver}; guests: 1 vCPU each; {}", meta.join("; ")),
        String::new(),
        table(&runs, &rate),
        String::new(),
    ];
    for r in &runs {
        for t in r
            .res
            .at("tests")
            .items()
            .iter()
            .filter(|t| t.at("status").str() != "PASS")
        {
            md.push(format!(
                "- {} {} {}: {}",
                r.name,
                t.at("status"),
                t.at("test"),
                t.at("detail")
            ));
        }
    }
    let text = md.join("\n");
    bench::publish(&run, &text, "guest-to-guest TCP (iperf3)");
    let mut failed = runs.iter().any(|r| r.res.at("status").str() != "PASS");
    if !b.no_cargo_bench {
        println!("## In-process fabric (cargo bench -p vhost-rdma --bench fabric)\n\n```");
        let ok = Command::new("cargo")
            .args(["bench", "-p", "vhost-rdma", "--bench", "fabric"])
            .current_dir(&run.root)
            .status()
            .is_ok_and(|s| s.success());
        println!("```");
        failed |= !ok;
    }
    println!("results: {}", run.resdir.display());
    i32::from(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_receivers_rate_comes_from_iperfs_json() {
        let j = r#"{"end": {"sum_received": {"bits_per_second": 2.5e9},
                            "sum_sent": {"bits_per_second": 2.6e9, "retransmits": 7}}}"#;
        assert_eq!(iperf_rate(j), Some((2500.0, Some(7))));
        assert_eq!(iperf_rate("{}"), None);
    }

    #[test]
    fn the_table_has_the_ratio_when_both_paths_ran() {
        let run = |name: &str| PathRun {
            name: name.into(),
            label: name.into(),
            res: Json::Null,
            logs: PathBuf::from(name),
        };
        let rate = |logs: &Path, n: u32| match (logs.to_str(), n) {
            (Some("daemon"), 1) => Some((900.0, Some(3))),
            (Some("stream"), 1) => Some((1000.0, None)),
            _ => None,
        };
        let t = table(&[run("daemon"), run("stream")], &rate);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "| streams | daemon Mbit/s (retr) | stream Mbit/s (retr) | ratio daemon/stream |"
        );
        assert_eq!(lines[2], "| 1 (-P 1) | 900 (3) | 1000 (-) | 0.90 |");
        assert_eq!(lines[3], "| 4 (-P 4) | FAILED | FAILED | - |");
    }
}
