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
//! pattern and is bound by the 1-vCPU sender), run `--rounds` times each
//! with the order swapped every round and judged by medians, since one
//! transfer of each moves by a third with the host's other work; the
//! control row runs
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
    /// how many times the cheap sender runs on each NIC (1..=20): rounds
    /// after the first swap which NIC goes first, so that the comparison
    /// is of medians over paired rounds, not of one transfer each
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub rounds: u32,
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

/// The cheap sender's two rows: NIC (the transfer's name is `cheap-NIC`,
/// `cheap-NIC-K` in round K > 1) and what the row says.
const CHEAP: [(&str, &str); 2] = [
    (
        "virtio",
        "virtio-net (vhost-user), ordinary TCP (cheap sender)",
    ),
    ("gve", "gve (vfio-user), ordinary TCP (cheap sender)"),
];

/// The transfers after the cheap rounds: name, what the row says, and what
/// the receiver must report besides `verified=1`.
const LATER: [(&str, &str, &str); 4] = [
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

/// The cheap sender's transfer on `nic` in round `k` (from 1).
fn cheap_name(nic: &str, k: u32) -> String {
    if k == 1 {
        format!("cheap-{nic}")
    } else {
        format!("cheap-{nic}-{k}")
    }
}

/// Every transfer's name and what its receiver must report, in the order
/// the guests run them (ci/guest/bench.sh `cell_gve_bench`): round 1
/// virtio-net first, then each round swaps the order.
fn transfers(rounds: u32) -> Vec<(String, &'static str)> {
    let mut v = Vec::new();
    for k in 1..=rounds {
        let order = if k % 2 == 0 {
            ["gve", "virtio"]
        } else {
            ["virtio", "gve"]
        };
        v.extend(
            order
                .iter()
                .map(|nic| (cheap_name(nic, k), "mode=ordinary")),
        );
    }
    v.extend(LATER.iter().map(|(n, _, want)| (n.to_string(), *want)));
    v
}

/// Median of `v` (None when empty).
fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The cheap rows' rates per round: (virtio, gve) MiB/s, for each round
/// whose two receivers both reported one.
fn cheap_rounds(rows: &[Row], rounds: u32) -> Vec<(u32, f64, f64)> {
    (1..=rounds)
        .filter_map(|k| {
            let rate = |nic| num(row(rows, &cheap_name(nic, k), "server"), "mibps");
            Some((k, rate("virtio")?, rate("gve")?))
        })
        .collect()
}

/// The NIC comparison over the rounds: the medians, the median and
/// geometric mean of the paired ratios, and how many rounds gve was at
/// least as fast.
struct Comparison {
    virtio_median: f64,
    gve_median: f64,
    ratio_median: f64,
    ratio_geomean: f64,
    gve_ahead: usize,
    rounds: usize,
}

/// [`Comparison`] of `cheap_rounds`' rows; None without a complete round.
fn compare(r: &[(u32, f64, f64)]) -> Option<Comparison> {
    let ratios: Vec<f64> = r.iter().map(|(_, v, g)| g / v).collect();
    Some(Comparison {
        virtio_median: median(r.iter().map(|x| x.1).collect())?,
        gve_median: median(r.iter().map(|x| x.2).collect())?,
        ratio_geomean: (ratios.iter().map(|x| x.ln()).sum::<f64>() / ratios.len() as f64).exp(),
        ratio_median: median(ratios)?,
        gve_ahead: r.iter().filter(|(_, v, g)| g >= v).count(),
        rounds: r.len(),
    })
}

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

/// The tables from both guests' `CI-BENCH` rows and the daemon's CPU per
/// transfer (in [`transfers`]' order).
pub fn tables(
    rows: &[Row],
    bytes: u64,
    rounds: u32,
    accel: &str,
    daemon: &[Option<f64>],
) -> String {
    let gib = bytes as f64 / f64::from(1u32 << 30);
    let mib = (bytes >> 20) as f64;
    let all = transfers(rounds);
    let want = |name: &str| all.iter().find(|t| t.0 == name).map_or("", |t| t.1);
    let valid = |name: &str| validated(rows, name, want(name));
    let yes = |ok: bool| if ok { "yes" } else { "NO" };
    let by_round = cheap_rounds(rows, rounds);
    let cmp = compare(&by_round);
    let mut t = vec![
        format!(
            "| receive path (guest A, 2 vCPUs, {accel}) | MiB/s | receiver CPU s/GiB | validated |"
        ),
        "|---|---:|---:|---|".into(),
    ];
    for (i, (nic, what)) in CHEAP.iter().enumerate() {
        // The cheap rows: the median over the rounds (round 1's CPU).
        let r = row(rows, &cheap_name(nic, 1), "server");
        let rate = cmp
            .as_ref()
            .map(|c| [c.virtio_median, c.gve_median][i])
            .or(num(r, "mibps"));
        t.push(format!(
            "| {what}, median of {rounds} | {} | {} | {} |",
            f(rate, 2),
            f(num(r, "cpu_s_per_gib"), 2),
            yes((1..=rounds).all(|k| valid(&cheap_name(nic, k))))
        ));
    }
    for (name, what, _) in LATER {
        let r = row(rows, name, "server");
        t.push(format!(
            "| {what} | {} | {} | {} |",
            f(num(r, "mibps"), 2),
            f(num(r, "cpu_s_per_gib"), 2),
            yes(valid(name))
        ));
    }
    t.push(String::new());
    t.push(
        "| cheap sender, round | first | virtio-net MiB/s | gve MiB/s | gve / virtio-net |".into(),
    );
    t.push("|---|---|---:|---:|---:|".into());
    for (k, v, g) in &by_round {
        t.push(format!(
            "| {k} | {} | {v:.2} | {g:.2} | {:.0} % |",
            if k % 2 == 0 { "gve" } else { "virtio-net" },
            100.0 * g / v
        ));
    }
    if let Some(c) = &cmp {
        t.push(format!(
            "| median | | {:.2} | {:.2} | {:.0} % (geometric mean {:.0} %; gve at least as fast in {} of {}) |",
            c.virtio_median,
            c.gve_median,
            100.0 * c.ratio_median,
            100.0 * c.ratio_geomean,
            c.gve_ahead,
            c.rounds
        ));
    }
    t.push(String::new());
    t.push(
        "| cheap sender, round 1: NIC of guest A | MiB/s | A busy vCPU s/GiB | A busy (of 2 vCPUs) | A interrupts / MiB \
         | B (sender) busy vCPU s/GiB | B busy (of 1 vCPU) | B retransmitted segments |"
            .into(),
    );
    t.push("|---|---:|---:|---:|---:|---:|---:|---:|".into());
    for (nic, _) in CHEAP {
        let name = cheap_name(nic, 1);
        let (a, b) = (row(rows, &name, "server"), row(rows, &name, "client"));
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
    for (i, (name, _)) in all.iter().enumerate() {
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
    let all = transfers(b.rounds);
    let mut tests = vec![TestRow("gve-setup".into(), BOTH.to_vec())];
    tests.extend(all.iter().map(|(n, _)| TestRow(n.clone(), BOTH.to_vec())));
    let mut c = Cell::new(
        &format!(
            "TCP into guest A through its virtio-net port and through its gVNIC, {} MiB each, \
             the cheap sender ({} rounds) and the stream tool; devmem TCP and its control",
            b.bytes >> 20,
            b.rounds
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
    let env = vec![
        ("CI_BENCH_BYTES".to_string(), b.bytes.to_string()),
        ("CI_BENCH_ROUNDS".to_string(), b.rounds.to_string()),
    ];
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
        &vec![b.bytes; all.len()],
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
    let text = tables(&rows, b.bytes, b.rounds, &accel, &daemon);
    bench::publish(&run, &text, "TCP receive: gve vs virtio-net");
    let m = |n: &str| f(num(row(&rows, n, "server"), "mibps"), 2);
    let cmp = compare(&cheap_rounds(&rows, b.rounds));
    let c = |pick: fn(&Comparison) -> f64, p| f(cmp.as_ref().map(pick), p);
    println!(
        "bench-gve bytes={} rounds={} gve_mibps={} virtio_mibps={} devmem_mibps={} gve_ordinary_mibps={} \
         gve_cheap_mibps={} virtio_cheap_mibps={} gve_over_virtio={} gve_ahead={}",
        b.bytes,
        b.rounds,
        m("stream-gve"),
        m("stream-virtio"),
        m("devmem"),
        m("control"),
        c(|c| c.gve_median, 2),
        c(|c| c.virtio_median, 2),
        c(|c| c.ratio_median, 3),
        cmp.as_ref().map_or("?".into(), |c| format!("{}/{}", c.gve_ahead, c.rounds)),
    );
    println!("results: {}", run.resdir.display());
    let ok = all.iter().all(|(n, want)| validated(&rows, n, want));
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
            1,
            "tcg",
            &[None, None, None, None, Some(1.5)],
        );
        assert!(
            t.contains("| gve, devmem TCP (devmem-recv, udmabuf) | 20.50 | 3.00 | yes |"),
            "{t}"
        );
        assert!(t.contains("| devmem | 1.50 |"), "{t}");
    }

    #[test]
    fn rounds_alternate_and_are_compared_by_medians() {
        let names: Vec<String> = transfers(3).into_iter().map(|t| t.0).collect();
        assert_eq!(
            names[..6],
            [
                "cheap-virtio",
                "cheap-gve",
                "cheap-gve-2",
                "cheap-virtio-2",
                "cheap-virtio-3",
                "cheap-gve-3"
            ]
        );
        assert_eq!(
            names[6..],
            ["stream-virtio", "stream-gve", "devmem", "control"]
        );
        let line = |name: &str, mibps: f64| {
            format!(
                "CI-BENCH mode=ordinary verified=1 mibps={mibps} proto={name} role=server rc=0\n"
            )
        };
        let text: String = [
            ("cheap-virtio", 100.0),
            ("cheap-gve", 90.0),
            ("cheap-gve-2", 120.0),
            ("cheap-virtio-2", 100.0),
            ("cheap-virtio-3", 200.0),
            ("cheap-gve-3", 210.0),
        ]
        .iter()
        .map(|(n, m)| line(n, *m))
        .collect();
        let rows = bench::parse_bench(&text);
        let c = compare(&cheap_rounds(&rows, 3)).expect("three rounds");
        assert_eq!((c.virtio_median, c.gve_median), (100.0, 120.0));
        assert!((c.ratio_median - 1.05).abs() < 1e-9, "{}", c.ratio_median);
        assert_eq!((c.gve_ahead, c.rounds), (2, 3));
        let t = tables(&rows, 128 << 20, 3, "tcg", &[]);
        assert!(t.contains("| 2 | gve | 100.00 | 120.00 | 120 % |"), "{t}");
        assert!(
            t.contains("| gve (vfio-user), ordinary TCP (cheap sender), median of 3 | 120.00 |"),
            "{t}"
        );
        // A round whose receiver reported no rate is left out, not zero.
        let rows = bench::parse_bench(&text.replace("mibps=210", "rc=0"));
        assert_eq!(compare(&cheap_rounds(&rows, 3)).map(|c| c.rounds), Some(2));
    }
}
