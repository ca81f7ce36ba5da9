//! `guest-runner bench-gve` (ci/bench-gve.sh): TCP receive in a Linux guest
//! through the emulated gVNIC (`kind=gve`, vfio-user) versus through its
//! virtio-net port (vhost-user), in the same guests from the same sender,
//! and devmem receive (into a udmabuf) versus ordinary receive.
//!
//! One matrix cell (guest side: ci/guest/bench.sh `cell_gve_bench`): guest
//! A (2 vCPUs) has virtio-net eth0 and the gVNIC (10.78.0.1), guest B sends.
//! Every receive is validated byte by byte by a receiver of its kind
//! (`stream server`, `devmem-recv`; `--ordinary`: the same receiver on
//! plain TCP); the rates are the receiver's own, accept to last byte. The
//! first two rows are the NIC comparison with the cheap sender
//! (`devmem-send`; the stream rows' `stream client` computes a keyed
//! pattern and is bound by the 1-vCPU sender); the control row runs
//! devmem's receiver and sender on a flow RSS keeps on an ordinary queue.
//! Besides: each cheap row's guests (busy vCPU seconds per GiB, their share
//! of the vCPUs at the row's rate, the receiver's interrupts per MiB, the
//! sender's retransmits: which side bounds the row) and the daemon's CPU
//! per GiB of each transfer. Tables in RESULTS/bench.md (and stdout).

use std::collections::BTreeMap;

use guest_results::daemon_cpu;

use crate::bench::{self, BenchArgs};
use crate::cells::{Cell, Device, PerRole, TestRow, BOTH};
use crate::matrix::cell;

/// The bench's options (`ci/bench-gve.sh --help`).
#[derive(clap::Args, Debug, Clone)]
pub struct BenchGveOptions {
    /// kernel, image, QEMU, build, results dir
    #[command(flatten)]
    pub common: BenchArgs,
    /// bytes of each transfer (K, M, G suffixes)
    #[arg(long, default_value = "128M", value_parser = parse_size)]
    pub bytes: u64,
}

/// `128M` as bytes.
fn parse_size(s: &str) -> Result<u64, String> {
    let (num, shift) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_shl(shift))
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{s}: want a size such as 128M"))
}

/// The transfers, in the order the guests run them: name, what the row
/// says, and what the receiver must report besides `verified=1`.
const TRANSFERS: [(&str, &str, &str); 6] = [
    (
        "cheap-virtio",
        "virtio-net (vhost-user), ordinary TCP (cheap sender)",
        "mode=ordinary",
    ),
    (
        "cheap-gve",
        "gve (vfio-user), ordinary TCP (cheap sender)",
        "mode=ordinary",
    ),
    (
        "stream-virtio",
        "virtio-net, ordinary TCP (stream client: sender-bound)",
        "status=pass",
    ),
    (
        "stream-gve",
        "gve, ordinary TCP (stream client: sender-bound)",
        "status=pass",
    ),
    (
        "devmem",
        "gve, devmem TCP (devmem-recv, udmabuf)",
        "ordinary_bytes=0",
    ),
    (
        "control",
        "gve, ordinary TCP, devmem's receiver and sender (control)",
        "frags=0",
    ),
];

type Row = bench::BenchRow;

fn row<'a>(rows: &'a [Row], proto: &str, role: &str) -> Option<&'a Row> {
    rows.iter().find(|r| {
        r.get("proto").map(String::as_str) == Some(proto)
            && r.get("role").map(String::as_str) == Some(role)
    })
}

fn num(r: Option<&Row>, k: &str) -> Option<f64> {
    r.and_then(|r| r.get(k)).and_then(|v| v.parse().ok())
}

/// Whether the receiver validated transfer `proto` and reported `want`.
pub fn validated(rows: &[Row], proto: &str, want: &str) -> bool {
    let (k, v) = want.split_once('=').unwrap_or((want, ""));
    row(rows, proto, "server").is_some_and(|r| {
        r.get("verified").map(String::as_str) == Some("1")
            && r.get("rc").map(String::as_str) == Some("0")
            && r.get(k).map(String::as_str) == Some(v)
    })
}

fn f(v: Option<f64>, p: usize) -> String {
    v.map_or("?".into(), |v| format!("{v:.p$}"))
}

/// The three tables from both guests' `CI-BENCH` rows and the daemon's CPU
/// per transfer.
pub fn tables(rows: &[Row], bytes: u64, accel: &str, daemon: &[Option<f64>]) -> String {
    let gib = bytes as f64 / f64::from(1u32 << 30);
    let mib = (bytes >> 20) as f64;
    let mut t = vec![
        format!(
            "| receive path (guest A, 2 vCPUs, {accel}) | MiB/s | receiver CPU s/GiB | validated |"
        ),
        "|---|---:|---:|---|".into(),
    ];
    for (name, what, want) in TRANSFERS {
        let r = row(rows, name, "server");
        let ok = if validated(rows, name, want) {
            "yes"
        } else {
            "NO"
        };
        t.push(format!(
            "| {what} | {} | {} | {ok} |",
            f(num(r, "mibps"), 2),
            f(num(r, "cpu_s_per_gib"), 2)
        ));
    }
    t.push(String::new());
    t.push(
        "| cheap sender: NIC of guest A | MiB/s | A busy vCPU s/GiB | A busy (of 2 vCPUs) | A interrupts / MiB \
         | B (sender) busy vCPU s/GiB | B busy (of 1 vCPU) | B retransmitted segments |"
            .into(),
    );
    t.push("|---|---:|---:|---:|---:|---:|---:|---:|".into());
    for (name, nic) in [("cheap-virtio", "virtio"), ("cheap-gve", "gve")] {
        let (a, b) = (row(rows, name, "server"), row(rows, name, "client"));
        let rate = num(a, "mibps");
        let sa = num(a, "busy_ticks").map(|x| x / 100.0 / gib);
        let sb = num(b, "busy_ticks").map(|x| x / 100.0 / gib);
        let share =
            |s: Option<f64>, cpus: f64| s.zip(rate).map(|(s, m)| s * m / 1024.0 / cpus * 100.0);
        t.push(format!(
            "| {nic} | {} | {} | {} % | {} | {} | {} % | {} |",
            f(rate, 2),
            f(sa, 2),
            f(share(sa, 2.0), 0),
            f(num(a, "intr").map(|i| i / mib), 0),
            f(sb, 2),
            f(share(sb, 1.0), 0),
            f(num(b, "retrans"), 0)
        ));
    }
    t.push(String::new());
    t.push("| transfer | daemon CPU s/GiB |".into());
    t.push("|---|---:|".into());
    for (i, (name, _, _)) in TRANSFERS.iter().enumerate() {
        t.push(format!(
            "| {name} | {} |",
            f(daemon.get(i).copied().flatten(), 2)
        ));
    }
    t.join("\n")
}

/// Runs the bench: 0 when every transfer was validated, 1 when one was
/// not, 2 on a usage or setup error.
pub fn run(b: BenchGveOptions) -> i32 {
    crate::boot::install_signal_handlers();
    let timeout = b.common.timeout.unwrap_or(1800);
    let mut tests = vec![TestRow("gve-setup".into(), BOTH.to_vec())];
    tests.extend(
        TRANSFERS
            .iter()
            .map(|(n, _, _)| TestRow(n.to_string(), BOTH.to_vec())),
    );
    let mut c = Cell::new(
        &format!(
            "TCP into guest A through its virtio-net port and through its gVNIC, {} MiB each, \
             the cheap sender and the stream tool; devmem TCP and its control",
            b.bytes >> 20
        ),
        ". /opt/vr/ci/bench.sh; cell_gve_bench",
        tests,
        timeout,
    );
    c.nic = Some(PerRole {
        server: Device::Gve,
        client: Device::Virtio,
    });
    c.gve_opts = "kind=gve,queues=2".into();
    c.server_smp = 2;
    c.daemon_cpu = true;
    let env = vec![("CI_BENCH_BYTES".to_string(), b.bytes.to_string())];
    let cells = BTreeMap::from([("gve-bench".to_string(), c)]);
    let (run, work) = match bench::prepare("bench-gve", &b.common, timeout, cells, env) {
        Ok(x) => x,
        Err(e) => return bench::fail("ci/bench-gve.sh", e),
    };
    let res = match cell::run_cell(&run, &b.common.kernel, "gve-bench", &work) {
        Ok(r) => r,
        Err(cell::Interrupted) => return bench::fail("ci/bench-gve.sh", "interrupted"),
    };
    let _ = std::fs::remove_dir_all(&work);
    let logs = run
        .resdir
        .join(format!("logs/{}-gve-bench", b.common.kernel));
    let rows = bench::guest_rows(&logs);
    let daemon: Vec<Option<f64>> = daemon_cpu::bursts_file(
        &logs.join("daemon-cpu.log"),
        &[b.bytes; TRANSFERS.len()],
        daemon_cpu::clock_ticks(),
    )
    .unwrap_or_default()
    .iter()
    .map(|l| l.split_whitespace().next().and_then(|v| v.parse().ok()))
    .collect();
    let accel = res
        .get("accel")
        .filter(|a| a.truthy())
        .map_or(b.common.setup.accel.clone(), |a| a.str().to_string());
    let text = tables(&rows, b.bytes, &accel, &daemon);
    bench::publish(&run, &text, "TCP receive: gve vs virtio-net");
    let m = |n: &str| f(num(row(&rows, n, "server"), "mibps"), 2);
    println!(
        "bench-gve bytes={} gve_mibps={} virtio_mibps={} devmem_mibps={} gve_ordinary_mibps={} \
         gve_cheap_mibps={} virtio_cheap_mibps={}",
        b.bytes,
        m("stream-gve"),
        m("stream-virtio"),
        m("devmem"),
        m("control"),
        m("cheap-gve"),
        m("cheap-virtio")
    );
    println!("results: {}", run.resdir.display());
    let ok = TRANSFERS
        .iter()
        .all(|(n, _, want)| validated(&rows, n, want));
    if !ok {
        eprintln!(
            "[bench-gve] a transfer was not validated (logs in {})",
            logs.display()
        );
    }
    i32::from(!ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_suffixes() {
        assert_eq!(parse_size("128M"), Ok(128 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("0").is_err() && parse_size("x").is_err());
    }

    #[test]
    fn a_row_is_validated_by_its_own_field() {
        let rows = bench::parse_bench(
            "CI-BENCH busy_ticks=300 intr=5000 retrans=0 listen=10.78.0.1:5302 frags=10 ordinary_bytes=0 \
             mode=devmem verified=1 mibps=20.5 cpu_s_per_gib=3 proto=devmem role=server rc=0\n\
             CI-BENCH busy_ticks=300 listen=10.78.0.1:5303 frags=4 ordinary_bytes=9 verified=1 \
             proto=control role=server rc=0\n",
        );
        assert!(validated(&rows, "devmem", "ordinary_bytes=0"));
        assert!(!validated(&rows, "control", "frags=0"));
        assert!(!validated(&rows, "stream-gve", "status=pass"));
        let t = tables(
            &rows,
            128 << 20,
            "tcg",
            &[None, None, None, None, Some(1.5)],
        );
        assert!(
            t.contains("| gve, devmem TCP (devmem-recv, udmabuf) | 20.50 | 3.00 | yes |"),
            "{t}"
        );
        assert!(t.contains("| devmem | 1.50 |"), "{t}");
    }
}
