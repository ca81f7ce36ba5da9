//! `guest-runner soak` (scripts/soak.sh, issue 8): one vhost-rdma daemon,
//! four Linux 7.3 guests, N minutes.
//!
//! Pair 1 (guests a = server, b = client): SMC-R streams over rxe (UEID
//! set), every byte verified, one stream round after another. Pair 2
//! (guests c = server, d = client): siw on eth0 (rping -V, verbs
//! write/read) and rxe on eth1 (ib_write_bw, verbs send/write/read), in a
//! loop. The daemon drops 0.5 % and reorders 1 % of the RoCEv2 frames (UDP
//! 4791) its ports receive (`ctl faults add`).
//!
//! The runner samples the daemon's memory every few seconds; after the
//! warm-up the mean of the next 30 s is the baseline, the mean of the last
//! 30 s before the stop the end value. Judged is the daemon's own memory,
//! VmRSS less RssShmem (heap, stacks, its mapped binary): VmRSS also counts
//! the pages of the guests' shared memory the daemon touched, which grow as
//! the guests hand out buffers in new pages and are returned when they
//! disconnect (reported, not judged). Pass = own memory within the
//! tolerance of the baseline, every transfer passed on both sides (the
//! data-verified ones counted separately), the daemon alive with the same
//! pid for the whole run and no panic in its log.
//!
//! Guest side: ci/guest/soak-lib.sh on top of ci/guest/ci-lib.sh.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use regex::Regex;
use serde::Serialize;

use crate::boot::{check_signal, install_signal_handlers, kill_proc};
use crate::daemon::Daemon;
use crate::setup::{build_binaries, copy, date_stamp, last_line, repo_root, target_dir};
use guest_results::flakes::KNOWN_SIW_RACES;
use guest_results::guestlog::{parse_guest, TestLine};

/// The soak's options (`scripts/soak.sh --help`).
#[derive(clap::Args, Debug, Clone)]
pub struct SoakOptions {
    /// soak length after both pairs started
    #[arg(long, default_value_t = 10.0)]
    pub minutes: f64,
    /// seconds before the RSS baseline (default: 120, at most a third of the soak)
    #[arg(long)]
    pub warmup: Option<f64>,
    /// RSS sampling period in seconds
    #[arg(long, default_value_t = 3.0)]
    pub sample_secs: f64,
    /// allowed change of the daemon's own RSS (VmRSS - RssShmem: heap, stacks and mapped
    /// binary, without the guests' shared memory) in %
    #[arg(long, default_value_t = 10.0)]
    pub rss_tolerance: f64,
    /// ... or this many KiB if larger
    #[arg(long, default_value_t = 0)]
    pub rss_slack_kib: u64,
    /// pair 2's siw: the daemon's mpa-settle workaround for Linux siw's connection-setup races
    /// (0 = off)
    #[arg(long, default_value_t = 300)]
    pub siw_settle_ms: u64,
    /// drop probability on the RoCE path
    #[arg(long, default_value_t = 0.005)]
    pub drop: f64,
    /// reorder probability on the RoCE path
    #[arg(long, default_value_t = 0.01)]
    pub reorder: f64,
    /// SMC-R bytes per connection and direction per round
    #[arg(long, default_value = "4M")]
    pub smc_bytes: String,
    /// image (7.3), QEMU, accelerator, build
    #[command(flatten)]
    pub setup: crate::setup::GuestSetup,
    /// pairs to run: 1 (SMC-R), 2 (siw + rxe) or 1,2
    #[arg(long, default_value = "1,2")]
    pub pairs: String,
    /// switch the daemon's protocol checker off (A/B runs)
    #[arg(long)]
    pub no_checker: bool,
    /// seconds the guests may take to finish after the stop before they are killed
    #[arg(long, default_value_t = 900.0)]
    pub stop_grace: f64,
    /// results dir (default ci/results/soak-<date>, gitignored)
    #[arg(long)]
    pub results: Option<PathBuf>,
}

/// One guest of the soak.
struct Guest {
    name: &'static str,
    role: &'static str,
    ip: &'static str,
    mac: &'static str,
    pair: u8,
    /// Pair 2's second NIC (rxe): port name, address, MAC.
    nic1: Option<(&'static str, &'static str, &'static str)>,
}

const GUESTS: [Guest; 4] = [
    Guest {
        name: "a",
        role: "server",
        ip: "10.77.0.1",
        mac: "52:54:00:77:02:0a",
        pair: 1,
        nic1: None,
    },
    Guest {
        name: "b",
        role: "client",
        ip: "10.77.0.2",
        mac: "52:54:00:77:02:0b",
        pair: 1,
        nic1: None,
    },
    Guest {
        name: "c",
        role: "server",
        ip: "10.77.0.3",
        mac: "52:54:00:77:02:0c",
        pair: 2,
        nic1: Some(("c1", "10.77.1.3", "52:54:00:77:02:1c")),
    },
    Guest {
        name: "d",
        role: "client",
        ip: "10.77.0.4",
        mac: "52:54:00:77:02:0d",
        pair: 2,
        nic1: Some(("d1", "10.77.1.4", "52:54:00:77:02:1d")),
    },
];

/// The guest function each pair runs (ci/guest/soak-lib.sh).
fn pair_call(pair: u8) -> &'static str {
    if pair == 1 {
        "soak_pair_smcr"
    } else {
        "soak_pair_rdma"
    }
}

/// What a soak guest's out.log says.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SoakLog {
    /// Its `CI-TEST` lines.
    pub lines: Vec<TestLine>,
    /// Its last `CI-ABORT` line.
    pub aborted: Option<String>,
    /// Rounds it finished (its `SOAK-DONE rounds=N` line), `None` without one.
    pub rounds: Option<u64>,
}

/// Parses a soak guest's out.log: the matrix's reading of the `CI-TEST`
/// and `CI-ABORT` lines (`guest_results::guestlog`), and soak-lib.sh's
/// closing `SOAK-DONE rounds=N`.
pub fn parse_log(text: &str) -> SoakLog {
    let g = parse_guest(text);
    let rounds = text.lines().rev().find_map(|l| {
        let rest = l.strip_prefix("SOAK-DONE")?;
        Some(
            rest.split_once("rounds=")
                .and_then(|(_, n)| n.split_whitespace().next()?.parse().ok())
                .unwrap_or(0),
        )
    });
    SoakLog {
        lines: g.lines,
        aborted: g.aborted,
        rounds,
    }
}

/// One transfer of a pair, both sides combined.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Transfer {
    /// 1 or 2.
    pub pair: u8,
    /// The transfer's name (`smc-3`, `verbs-siw-2-write`, ...).
    pub test: String,
    /// PASS, FAIL (a side failed or did not report) or SKIP (both skipped).
    pub status: String,
    /// The bandwidth a side reported.
    pub bw: String,
    /// Why it failed (or the passing side's note), at most 400 characters.
    pub detail: String,
    /// The failure names a known siw race.
    pub known_siw_race: bool,
    /// The tool checks the data (SMC-R streams, rping -V, verbs), not only
    /// completions.
    pub verified: bool,
}

/// Combines a pair's server and client lines into one row per transfer.
pub fn combine(pair: u8, server: &[TestLine], client: &[TestLine]) -> Vec<Transfer> {
    let mut names: Vec<&str> = Vec::new();
    for l in server.iter().chain(client) {
        if !names.contains(&l.test.as_str()) {
            names.push(&l.test);
        }
    }
    names
        .into_iter()
        .map(|n| {
            let sides = [
                ("server", server.iter().find(|l| l.test == n)),
                ("client", client.iter().find(|l| l.test == n)),
            ];
            let st: Vec<&str> = sides
                .iter()
                .map(|(_, s)| s.map_or("MISSING", |s| s.status.as_str()))
                .collect();
            let status = if st.iter().all(|s| *s == "SKIP") {
                "SKIP"
            } else if st.iter().any(|s| *s == "FAIL" || *s == "MISSING") {
                "FAIL"
            } else {
                "PASS"
            };
            let why = if status == "PASS" {
                sides
                    .iter()
                    .find_map(|(_, s)| s.map(|s| s.reason.clone()))
                    .unwrap_or_default()
            } else {
                sides
                    .iter()
                    .filter(|(_, s)| s.is_none_or(|s| s.status != "PASS"))
                    .map(|(role, s)| {
                        format!("{role}: {}", s.map_or("no result line", |s| &s.reason))
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            Transfer {
                pair,
                test: n.into(),
                status: status.into(),
                bw: sides
                    .iter()
                    .find_map(|(_, s)| s.filter(|s| !s.bw.is_empty()).map(|s| s.bw.clone()))
                    .unwrap_or_default(),
                known_siw_race: KNOWN_SIW_RACES.iter().any(|k| why.contains(k)),
                detail: why.chars().take(400).collect(),
                verified: ["smc-", "rping-siw-", "verbs-"]
                    .iter()
                    .any(|p| n.starts_with(p)),
            }
        })
        .collect()
}

/// Setup steps of the guests (link-add, UEID, devices): reported as
/// problems when they fail, not counted as transfers.
fn is_setup(test: &str) -> bool {
    ["link-add", "smc-ueid", "smc-devices"]
        .iter()
        .any(|p| test.starts_with(p))
}

/// One memory sample of the daemon.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Seconds since both pairs started (`None` before).
    pub soak_s: Option<f64>,
    /// VmRSS, RssAnon, RssShmem in KiB.
    pub kib: [u64; 3],
}

/// The daemon's memory over the run.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct RssSummary {
    /// Samples taken.
    pub samples: usize,
    /// Largest VmRSS.
    pub max_vmrss_kib: u64,
    /// Largest RssAnon.
    pub max_anon_kib: u64,
    /// Means of the baseline and end windows: VmRSS, RssAnon, RssShmem and
    /// own (VmRSS - RssShmem), in KiB.
    pub baseline_kib: Option<[i64; 4]>,
    /// See `baseline_kib`.
    pub end_kib: Option<[i64; 4]>,
    /// Samples in the baseline window.
    pub baseline_samples: usize,
    /// Samples in the end window.
    pub end_samples: usize,
}

impl RssSummary {
    /// Change of column `i` from baseline to end, in % (`None` without
    /// both, or from 0).
    pub fn change_pct(&self, i: usize) -> Option<f64> {
        let (b, e) = (self.baseline_kib?[i], self.end_kib?[i]);
        (b != 0).then(|| (e - b) as f64 / b as f64 * 100.0)
    }
}

/// The baseline (30 s after `warmup`) and end (the 30 s before `soak_s`)
/// of the samples.
pub fn summarize_rss(samples: &[Sample], warmup: f64, soak_s: f64) -> RssSummary {
    let window = |lo: f64, hi: f64| -> Vec<&Sample> {
        samples
            .iter()
            .filter(|s| s.soak_s.is_some_and(|t| lo <= t && t < hi))
            .collect()
    };
    let mean = |rows: &[&Sample]| -> Option<[i64; 4]> {
        if rows.is_empty() {
            return None;
        }
        let m = |i: usize| {
            (rows.iter().map(|s| s.kib[i] as f64).sum::<f64>() / rows.len() as f64)
                .round_ties_even() as i64
        };
        let (v, a, s) = (m(0), m(1), m(2));
        Some([v, a, s, v - s])
    };
    let base = window(warmup, warmup + 30.0);
    let end = window(soak_s - 30.0, soak_s);
    let (baseline_kib, end_kib) = match (mean(&base), mean(&end)) {
        (Some(b), Some(e)) => (Some(b), Some(e)),
        _ => (None, None),
    };
    RssSummary {
        samples: samples.len(),
        max_vmrss_kib: samples.iter().map(|s| s.kib[0]).max().unwrap_or(0),
        max_anon_kib: samples.iter().map(|s| s.kib[1]).max().unwrap_or(0),
        baseline_kib,
        end_kib,
        baseline_samples: base.len(),
        end_samples: end.len(),
    }
}

/// The daemon's own memory judged: `None`, or the problem.
pub fn judge_rss(
    r: &RssSummary,
    tolerance_pct: f64,
    slack_kib: u64,
    warmup: f64,
) -> Option<String> {
    let (Some(b), Some(e)) = (r.baseline_kib, r.end_kib) else {
        return Some("not enough RSS samples for a baseline and an end value".into());
    };
    let (b, e) = (b[3], e[3]);
    let allowed = (b as f64 * tolerance_pct / 100.0).max(slack_kib as f64);
    ((e - b).unsigned_abs() as f64 > allowed).then(|| {
        format!(
            "daemon's own RSS (VmRSS - RssShmem) changed {:+} KiB ({:+.1} %, baseline {b} KiB \
             after {warmup:.0}s, end {e} KiB), more than {allowed:.0} KiB",
            e - b,
            r.change_pct(3).unwrap_or(0.0)
        )
    })
}

/// `smc-3` -> `smc`, `verbs-siw-3-write` -> `verbs-siw-write`: the kind of
/// a transfer, for the table.
fn kind_of(test: &str) -> String {
    static ROUND: std::sync::LazyLock<Regex> =
        std::sync::LazyLock::new(|| Regex::new(r"-\d+(-|$)").expect("a constant regex"));
    ROUND.replace_all(test, "$1").into_owned()
}

#[derive(Default)]
struct Kind {
    n: usize,
    pass: usize,
    fail: usize,
    skip: usize,
    race: usize,
    verified: bool,
}

/// The Markdown table of transfers per pair and kind.
pub fn kinds_table(transfers: &[Transfer]) -> String {
    let mut kinds: BTreeMap<(u8, String), Kind> = BTreeMap::new();
    for t in transfers {
        let k = kinds
            .entry((t.pair, kind_of(&t.test)))
            .or_insert_with(|| Kind {
                verified: t.verified,
                ..Kind::default()
            });
        k.n += 1;
        match t.status.as_str() {
            "PASS" => k.pass += 1,
            "FAIL" => {
                k.fail += 1;
                k.race += usize::from(t.known_siw_race);
            }
            _ => k.skip += 1,
        }
    }
    let mut s = String::from(
        "| pair | transfer | run | passed | failed | skipped | data verified |\n|---|---|---|---|---|---|---|\n",
    );
    for ((pair, k), d) in &kinds {
        let race = if d.race > 0 {
            format!(" ({} known siw race)", d.race)
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "| {pair} | {k} | {} | {} | {}{race} | {} | {} |",
            d.n,
            d.pass,
            d.fail,
            d.skip,
            if d.verified { "yes" } else { "no (completion)" }
        );
    }
    s
}

/// VmRSS, RssAnon and RssShmem of `pid` in KiB (`None` once it is gone).
fn rss_kib(pid: u32) -> Option<[u64; 3]> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let get = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    };
    Some([get("VmRSS")?, get("RssAnon")?, get("RssShmem")?])
}

fn read_u64(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Writes `text` so that a guest reading the file never sees half of it.
fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, path)
}

fn say(msg: impl std::fmt::Display) {
    eprintln!("[soak] {msg}");
}

/// Runs the soak: exit status 0 (pass), 1 (fail) or 2 (setup error).
pub fn run(o: SoakOptions) -> i32 {
    match run_soak(&o) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            say(e);
            2
        }
    }
}

fn parse_pairs(s: &str) -> Result<Vec<u8>, String> {
    let mut pairs: Vec<u8> = s
        .split(',')
        .filter(|p| !p.is_empty())
        .map(|p| p.trim().parse().ok().filter(|p| *p == 1 || *p == 2))
        .collect::<Option<_>>()
        .ok_or("--pairs: a comma list of 1 and 2")?;
    pairs.sort_unstable();
    pairs.dedup();
    if pairs.is_empty() {
        return Err("--pairs: a comma list of 1 and 2".into());
    }
    Ok(pairs)
}

fn run_soak(o: &SoakOptions) -> anyhow::Result<bool> {
    let pairs = parse_pairs(&o.pairs).map_err(anyhow::Error::msg)?;
    let guests: Vec<&Guest> = GUESTS.iter().filter(|g| pairs.contains(&g.pair)).collect();
    let soak_s = o.minutes * 60.0;
    let warmup = o.warmup.unwrap_or((soak_s / 3.0).min(120.0));
    if warmup + 60.0 > soak_s {
        return Err(anyhow::anyhow!(
            "--warmup {warmup:.0}s leaves less than 60 s of soak after the baseline"
        ));
    }
    let root = repo_root();
    let date = date_stamp();
    let resdir = o
        .results
        .clone()
        .unwrap_or_else(|| root.join("ci/results").join(format!("soak-{date}")));
    std::fs::create_dir_all(&resdir).map_err(|e| anyhow::anyhow!("{}: {e}", resdir.display()))?;
    let work = PathBuf::from(crate::paths::mkdtemp("vr-soak.")?);
    say(format!(
        "results: {}; work dir: {}",
        resdir.display(),
        work.display()
    ));
    let tdir = target_dir(&root, "release");
    if !o.setup.no_build {
        say("cargo build --release -p vhost-rdma -p smc-guest-tests");
        if !build_binaries(&root, "release", Some(&resdir.join("build.log"))) {
            return Err(anyhow::anyhow!(
                "cargo build failed: {}",
                resdir.join("build.log").display()
            ));
        }
    }
    let daemon_bin = tdir.join("vhost-rdma");
    let sgt = tdir.join("smc-guest-tests");
    let qemu = o.setup.qemu.clone().or_else(|| {
        last_line(
            &mut Command::new(root.join("scripts/setup-qemu.sh")),
            &work.join("qemu.log"),
        )
    });
    let image = o.setup.image.clone().or_else(|| {
        last_line(
            Command::new(root.join("scripts/build-guest-image.sh")).args(["--kernel", "7.3"]),
            &work.join("image.log"),
        )
    });
    for (what, p) in [
        ("daemon", Some(daemon_bin.display().to_string())),
        ("smc-guest-tests", Some(sgt.display().to_string())),
        ("qemu", qemu.clone()),
    ] {
        if p.as_deref().and_then(crate::paths::which).is_none() {
            return Err(anyhow::anyhow!("missing {what}: {p:?}"));
        }
    }
    let (Some(qemu), Some(image)) = (
        qemu,
        image.filter(|i| Path::new(i).join("bzImage").is_file()),
    ) else {
        anyhow::bail!("no QEMU or no 7.3 guest image (bzImage)");
    };

    // What the guests see in /opt/vr.
    let vrbin = work.join("vrbin");
    for d in ["bin", "ci"] {
        std::fs::create_dir_all(vrbin.join(d))?;
    }
    copy(&sgt, &vrbin.join("bin/smc-guest-tests"))?;
    for lib in ["ci-lib.sh", "soak-lib.sh"] {
        copy(
            &root.join("ci/guest").join(lib),
            &vrbin.join("ci").join(lib),
        )?;
    }
    copy(
        &root.join("scripts/guest/rdma-lib.sh"),
        &vrbin.join("ci/rdma-lib.sh"),
    )?;

    // The daemon: a port per NIC (pair 2 has a second NIC per guest for rxe).
    let mut ports: Vec<(&str, &str)> = Vec::new();
    for g in &guests {
        ports.push((g.name, g.mac));
        if let Some((n, _, mac)) = g.nic1 {
            ports.push((n, mac));
        }
    }
    let sock = |n: &str| work.join(format!("{n}.sock"));
    let control = work.join("ctl.sock");
    let mut args = vec!["--control".to_string(), control.display().to_string()];
    for (n, mac) in &ports {
        args.push("--port".into());
        args.push(format!(
            "{n}={},mac={mac},queues=1,form=pci",
            sock(n).display()
        ));
    }
    let mut sockets: Vec<PathBuf> = ports.iter().map(|(n, _)| sock(n)).collect();
    sockets.push(control.clone());
    install_signal_handlers();
    let mut daemon = Daemon::start(
        None,
        &daemon_bin,
        &args,
        &control,
        &sockets,
        &resdir.join("daemon.log"),
    )?;
    let mut problems: Vec<String> = Vec::new();
    let ctl = |args: &[&str], what: String, problems: &mut Vec<String>| {
        let r = daemon.ctl(args);
        if r.code != 0 {
            problems.push(format!("{what}: {}", r.stderr.trim()));
        }
    };
    for (i, (name, _)) in ports.iter().enumerate() {
        for (action, extra) in [
            ("drop", vec!["--prob".to_string(), o.drop.to_string()]),
            (
                "reorder",
                vec![
                    "--prob".into(),
                    o.reorder.to_string(),
                    "--window".into(),
                    "3".into(),
                    "--hold-ms".into(),
                    "10".into(),
                ],
            ),
        ] {
            let seed = (100 + 10 * i + action.len()).to_string();
            let mut a = vec![
                "faults",
                "add",
                "--port",
                name,
                "--dir",
                "ingress",
                "--action",
                action,
                "--proto",
                "udp",
                "--dst-port",
                "4791",
                "--seed",
                &seed,
            ];
            a.extend(extra.iter().map(String::as_str));
            ctl(&a, format!("ctl faults add {name} {action}"), &mut problems);
        }
    }
    if o.siw_settle_ms > 0 && ports.iter().any(|(n, _)| *n == "c") {
        // The documented Linux siw workaround (docs/faults-and-captures.md),
        // as in the matrix's siw cells.
        let ms = o.siw_settle_ms.to_string();
        ctl(
            &[
                "faults",
                "add",
                "--port",
                "c",
                "--dir",
                "both",
                "--proto",
                "tcp",
                "--action",
                "mpa-settle",
                "--delay-ms",
                &ms,
            ],
            "ctl faults add c mpa-settle".into(),
            &mut problems,
        );
    }
    if o.no_checker {
        ctl(&["checker", "off"], "ctl checker off".into(), &mut problems);
    }
    let pid = daemon.pid();
    say(format!(
        "daemon pid {pid}; faults on the RoCE path: drop {} %, reorder {} %",
        o.drop * 100.0,
        o.reorder * 100.0
    ));

    // The guests. Tool and stream timeouts well below the barrier timeout:
    // a transfer that hangs is killed, counted as failed, and the pair goes
    // on with its next round instead of losing its barriers.
    let env = [
        ("CI_TOOL_TIMEOUT", "240"),
        ("CI_VERBS_SIZE", "61441"),
        ("CI_VERBS_ITERS", "4"),
        ("CI_STREAM_TIMEOUT", "240"),
        ("CI_BARRIER_TIMEOUT", "420"),
        ("SOAK_SMC_BYTES", o.smc_bytes.as_str()),
        ("SOAK_PERFTEST_ITERS", "100"),
    ];
    let me = std::env::current_exe()?;
    let mut rg = Command::new(me);
    rg.arg("boot").args([
        "--qemu",
        &qemu,
        "--image",
        &image,
        "--accel",
        &o.setup.accel,
        "--timeout",
        &((soak_s + 1800.0) as u64).to_string(),
        "--guest-bin",
        &vrbin.display().to_string(),
        "--net",
        "vhost-user",
        "--form",
        "pci",
        "--queues",
        "1",
        "--logdir",
        &work.display().to_string(),
        "--no-fail-fast",
    ]);
    for g in &guests {
        let Some(peer) = guests.iter().find(|p| p.pair == g.pair && p.name != g.name) else {
            return Err(anyhow::anyhow!("guest {} has no peer", g.name));
        };
        let mut job = format!(
            "ROLE={} SELF={} PEER={} CELL=7.3/soak-pair{}\n",
            g.role, g.ip, peer.ip, g.pair
        );
        if let (Some(n1), Some(p1)) = (g.nic1, peer.nic1) {
            let _ = writeln!(job, "SELF1={} PEER1={}", n1.1, p1.1);
        }
        job.push_str("export ROLE SELF PEER CELL SELF1 PEER1\n");
        for (k, v) in env {
            let _ = writeln!(job, "{k}={v}; export {k}");
        }
        let _ = writeln!(
            job,
            "echo \"CI-KERNEL $(uname -r)\"\n. /opt/vr/ci/ci-lib.sh\n. /opt/vr/ci/soak-lib.sh\n{}\nexit 0",
            pair_call(g.pair)
        );
        let script = work.join(format!("{}.sh", g.name));
        std::fs::write(&script, job)?;
        let mut spec = format!(
            "{},ip={}/24,sock={},mac={},cmd={}",
            g.name,
            g.ip,
            sock(g.name).display(),
            g.mac,
            script.display()
        );
        if let Some((n1, ip1, mac1)) = g.nic1 {
            let _ = write!(
                spec,
                ",ip1={ip1}/24,sock1={},mac1={mac1}",
                sock(n1).display()
            );
        }
        rg.arg("--guest").arg(spec);
    }
    let rg_log = std::fs::File::create(resdir.join("run-guests.log"))?;
    let rg_log2 = rg_log.try_clone()?;
    let t_start = Instant::now();
    let mut rgp: Child = rg
        .stdout(rg_log)
        .stderr(rg_log2)
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start the guests: {e}"))?;

    // The run: sample, start the clock when both pairs run, stop them in
    // time.
    let mut samples: Vec<Sample> = Vec::new();
    let mut csv = String::from(
        "wall_s,soak_s,vmrss_kib,rss_anon_kib,rss_shmem_kib,rounds_pair1,rounds_pair2\n",
    );
    let csv_path = resdir.join("rss.csv");
    let job = |g: &str, f: &str| work.join(format!("{g}.job")).join(f);
    let mut soak_t0: Option<Instant> = None;
    let mut stop_time: Option<Instant> = None;
    let mut interrupted = false;
    let rg_code = loop {
        if let Ok(Some(st)) = rgp.try_wait() {
            break st.code().unwrap_or(-1);
        }
        let t = Instant::now();
        while t.elapsed().as_secs_f64() < o.sample_secs {
            if check_signal().is_err() {
                interrupted = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if interrupted {
            kill_proc(&mut rgp, 30.0);
            break 130;
        }
        let now = Instant::now();
        let rounds: BTreeMap<u8, u64> = pairs
            .iter()
            .map(|p| {
                let r = guests
                    .iter()
                    .filter(|g| g.pair == *p)
                    .map(|g| read_u64(&job(g.name, "round")))
                    .max()
                    .unwrap_or(0);
                (*p, r)
            })
            .collect();
        if soak_t0.is_none() && guests.iter().all(|g| read_u64(&job(g.name, "round")) >= 1) {
            soak_t0 = Some(now);
            say(format!(
                "both pairs started round 1 after {:.0}s of boot and setup; soak {soak_s:.0}s, \
                 RSS baseline after {warmup:.0}s",
                now.duration_since(t_start).as_secs_f64()
            ));
        }
        if let Some(code) = daemon.exit_code() {
            problems.push(format!("daemon exited with {code} during the run"));
            kill_proc(&mut rgp, 30.0);
            break rgp.wait().ok().and_then(|s| s.code()).unwrap_or(-1);
        }
        let st = soak_t0.map(|t0| now.duration_since(t0).as_secs_f64());
        let kib = rss_kib(pid);
        if let Some(kib) = kib {
            samples.push(Sample { soak_s: st, kib });
        }
        let _ = writeln!(
            csv,
            "{:.1},{},{},{},{}",
            now.duration_since(t_start).as_secs_f64(),
            st.map_or(String::new(), |s| format!("{s:.1}")),
            kib.map_or(",,".into(), |k| format!("{},{},{}", k[0], k[1], k[2])),
            rounds.get(&1).map_or(String::new(), u64::to_string),
            rounds.get(&2).map_or(String::new(), u64::to_string),
        );
        let _ = std::fs::write(&csv_path, &csv);
        if let Some(stop) = stop_time {
            if now.duration_since(stop).as_secs_f64() > o.stop_grace {
                problems.push(format!(
                    "guests still running {:.0}s after the stop (hung?): stopped them",
                    o.stop_grace
                ));
                kill_proc(&mut rgp, 30.0);
                break rgp.wait().ok().and_then(|s| s.code()).unwrap_or(-1);
            }
        }
        if soak_t0.is_none() && stop_time.is_none() && now.duration_since(t_start).as_secs() > 900 {
            problems.push("the pairs did not both start within 15 min of boot".into());
            for g in &guests {
                let _ = write_atomic(&job(g.name, "stop"), "1\n");
            }
            stop_time = Some(now);
        }
        if st.is_some_and(|s| s >= soak_s) && stop_time.is_none() {
            // Above any round either guest may be about to start (soak-lib.sh).
            let mut at = Vec::new();
            for p in &pairs {
                let stop_at = rounds[p] + 2;
                at.push(format!("pair {p}: {stop_at}"));
                for g in guests.iter().filter(|g| g.pair == *p) {
                    let _ = write_atomic(&job(g.name, "stop"), &format!("{stop_at}\n"));
                }
            }
            stop_time = Some(now);
            say(format!(
                "time is up: pairs stop before rounds {}; waiting for the running rounds",
                at.join(", ")
            ));
        }
    };
    let daemon_up = daemon.exit_code().is_none();
    if let Some(code) = daemon.exit_code() {
        if !problems.iter().any(|p| p.contains("daemon exited")) {
            problems.push(format!("daemon exited with {code} during the run"));
        }
    }
    // The daemon's own view at the end.
    for what in ["status", "checker"] {
        let r = daemon.ctl(&["--json", what]);
        let _ = std::fs::write(
            resdir.join(format!("daemon-{what}.json")),
            if r.code == 0 { r.stdout } else { r.stderr },
        );
    }
    let r = daemon.ctl(&["faults", "list"]);
    let _ = std::fs::write(resdir.join("faults.txt"), r.stdout + &r.stderr);
    if daemon_up {
        if let Some(p) = daemon.stop(Duration::from_secs(15)) {
            problems.push(p);
        }
    }
    if daemon.panicked() {
        problems.push("daemon panicked (daemon.log)".into());
    }
    if interrupted {
        anyhow::bail!("interrupted: guests and daemon stopped");
    }
    if rg_code != 0 {
        problems.push(format!(
            "run-guests exit {rg_code} (a guest failed or timed out; run-guests.log)"
        ));
    }

    // The transfers.
    let mut rows = Vec::new();
    let mut rounds_done: BTreeMap<&str, u64> = BTreeMap::new();
    for pair in &pairs {
        let mut per_role: BTreeMap<&str, Vec<TestLine>> = BTreeMap::new();
        for g in guests.iter().filter(|g| g.pair == *pair) {
            let text = std::fs::read(job(g.name, "out.log"))
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            let log = parse_log(&text);
            if let Some(a) = log.aborted {
                problems.push(format!("guest {}: {a}", g.name));
            }
            match log.rounds {
                Some(n) => {
                    rounds_done.insert(g.name, n);
                }
                None => problems.push(format!(
                    "guest {} did not finish its rounds (no SOAK-DONE line)",
                    g.name
                )),
            }
            per_role.insert(g.role, log.lines);
        }
        let side = |r: &str| per_role.get(r).map_or(&[][..], Vec::as_slice);
        rows.extend(combine(*pair, side("server"), side("client")));
    }
    let (setup, transfers): (Vec<Transfer>, Vec<Transfer>) =
        rows.into_iter().partition(|r| is_setup(&r.test));
    for r in setup.iter().filter(|r| r.status != "PASS") {
        problems.push(format!(
            "setup {} (pair {}): {} {}",
            r.test, r.pair, r.status, r.detail
        ));
    }
    let count = |f: &dyn Fn(&Transfer) -> bool| transfers.iter().filter(|t| f(t)).count();
    let n_pass = count(&|t| t.status == "PASS");
    let n_fail = count(&|t| t.status == "FAIL");
    let n_skip = count(&|t| t.status == "SKIP");
    let n_verified = count(&|t| t.status == "PASS" && t.verified);
    let n_race = count(&|t| t.status == "FAIL" && t.known_siw_race);

    let rss = summarize_rss(&samples, warmup, soak_s);
    problems.extend(judge_rss(&rss, o.rss_tolerance, o.rss_slack_kib, warmup));
    if transfers.is_empty() {
        problems.push("no transfers ran".into());
    }
    let ok = problems.is_empty() && n_fail == 0;

    // The report.
    let kib = |v: Option<[i64; 4]>, i: usize| v.map_or("?".into(), |v| v[i].to_string());
    let pct = |i: usize| rss.change_pct(i).map_or("?".into(), |p| format!("{p:.2}"));
    let mut md = format!("# soak {date}: {}\n\n", if ok { "PASS" } else { "FAIL" });
    let _ = writeln!(
        md,
        "- pairs {}{}; {} min soak ({soak_s:.0}s after both pairs started; wall {:.0}s), {} guests \
         (7.3, {image}), one daemon (pid {pid}, up for the whole run: {}, never restarted), faults \
         on UDP 4791 ingress of every port: drop {} %, reorder {} % (window 3)",
        o.pairs,
        if o.no_checker { ", checker off" } else { "" },
        o.minutes,
        t_start.elapsed().as_secs_f64(),
        guests.len(),
        if daemon_up { "yes" } else { "NO" },
        o.drop * 100.0,
        o.reorder * 100.0
    );
    let _ = writeln!(
        md,
        "- transfers: {} run, {n_pass} passed, {n_fail} failed{}, {n_skip} skipped; {n_verified} \
         passed with their data verified (ib_write_bw checks completion only)",
        transfers.len(),
        if n_race > 0 {
            format!(" ({n_race} on a known siw race)")
        } else {
            String::new()
        }
    );
    let _ = writeln!(md, "- rounds: {rounds_done:?}");
    let _ = writeln!(
        md,
        "- daemon's own RSS (VmRSS - RssShmem, judged): baseline {} KiB (mean of {} samples \
         {warmup:.0}-{:.0}s), end {} KiB (mean of {} samples, last 30 s), change {} % (limit ±{} %{}); \
         of it heap (RssAnon) {} -> {} KiB, max {} KiB",
        kib(rss.baseline_kib, 3),
        rss.baseline_samples,
        warmup + 30.0,
        kib(rss.end_kib, 3),
        rss.end_samples,
        pct(3),
        o.rss_tolerance,
        if o.rss_slack_kib > 0 {
            format!(" or {} KiB", o.rss_slack_kib)
        } else {
            String::new()
        },
        kib(rss.baseline_kib, 1),
        kib(rss.end_kib, 1),
        rss.max_anon_kib
    );
    let _ = writeln!(
        md,
        "- daemon VmRSS (reported): {} -> {} KiB ({} %), of which guest shared memory touched \
         (RssShmem) {} -> {} KiB; max VmRSS {} KiB; {} samples (rss.csv)\n",
        kib(rss.baseline_kib, 0),
        kib(rss.end_kib, 0),
        pct(0),
        kib(rss.baseline_kib, 2),
        kib(rss.end_kib, 2),
        rss.max_vmrss_kib,
        rss.samples
    );
    md.push_str(&kinds_table(&transfers));
    md.push('\n');
    for t in transfers.iter().filter(|t| t.status == "FAIL") {
        let _ = writeln!(md, "- FAIL pair {} {}: {}", t.pair, t.test, t.detail);
    }
    for p in &problems {
        let _ = writeln!(md, "- problem: {p}");
    }
    let _ = std::fs::write(resdir.join("summary.md"), &md);
    // Charts beside the table (a failed plot never fails the soak).
    let gr = root.join("scripts/guest-results");
    let _ = Command::new(&gr)
        .arg("plot")
        .arg(resdir.join("summary.md"))
        .arg(resdir.join("summary.svg"))
        .args(["--title", &format!("soak {date}: transfers")])
        .status();
    let _ = Command::new(&gr)
        .args(["plot", "--csv"])
        .arg(&csv_path)
        .arg(resdir.join("rss.svg"))
        .args([
            "--x",
            "wall_s",
            "--y",
            "vmrss_kib,rss_anon_kib,rss_shmem_kib",
            "--title",
            &format!("soak {date}: daemon memory (KiB)"),
        ])
        .status();
    let summary = serde_json::json!({
        "pass": ok, "minutes": o.minutes, "warmup_s": warmup, "rss": rss,
        "rounds": rounds_done, "transfers": transfers, "setup": setup, "problems": problems,
    });
    let _ = std::fs::write(
        resdir.join("summary.json"),
        serde_json::to_string_pretty(&summary).unwrap_or_default(),
    );
    // Keep the guests' consoles, scripts and job dirs; drop the work dir.
    for g in &guests {
        for f in [format!("{}.console.log", g.name), format!("{}.sh", g.name)] {
            let _ = std::fs::copy(work.join(&f), resdir.join(&f));
        }
        let _ = Command::new("cp")
            .arg("-a")
            .arg(work.join(format!("{}.job", g.name)))
            .arg(&resdir)
            .status();
    }
    let _ = std::fs::remove_dir_all(&work);
    println!("{md}");
    println!("results: {}", resdir.display());
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(test: &str, status: &str, reason: &str) -> TestLine {
        TestLine {
            test: test.into(),
            role: "server".into(),
            status: status.into(),
            secs: 0,
            bw: String::new(),
            reason: reason.into(),
        }
    }

    #[test]
    fn a_log_gives_its_lines_abort_and_rounds() {
        let log = parse_log(
            "noise\nCI-TEST test=smc-1 role=server status=PASS secs=3 bw=12.5 reason=\"ok\"\n\
             CI-ABORT barrier x timed out\nSOAK-DONE rounds=7\n",
        );
        assert_eq!(log.lines.len(), 1);
        assert_eq!(log.lines[0].bw, "12.5");
        assert_eq!(log.aborted.as_deref(), Some("CI-ABORT barrier x timed out"));
        assert_eq!(log.rounds, Some(7));
        assert_eq!(parse_log("").rounds, None);
    }

    #[test]
    fn combine_fails_a_missing_side_and_names_known_races() {
        let server = [
            line("smc-1", "PASS", "4M verified"),
            line("rping-siw-1", "FAIL", "siw rejected the MPA reply"),
        ];
        let client = [
            line("smc-1", "PASS", "x"),
            line("rping-siw-1", "PASS", ""),
            line("ib-write-bw-1", "SKIP", "n/a"),
        ];
        let rows = combine(2, &server, &client);
        let by: BTreeMap<&str, &Transfer> = rows.iter().map(|r| (r.test.as_str(), r)).collect();
        assert_eq!(by["smc-1"].status, "PASS");
        assert_eq!(by["smc-1"].detail, "4M verified");
        assert!(by["smc-1"].verified);
        let r = by["rping-siw-1"];
        assert_eq!((r.status.as_str(), r.known_siw_race), ("FAIL", true));
        assert_eq!(r.detail, "server: siw rejected the MPA reply");
        let w = by["ib-write-bw-1"];
        assert_eq!(w.status, "FAIL", "the server never reported it");
        assert_eq!(w.detail, "server: no result line; client: n/a");
        assert!(!w.verified);
    }

    #[test]
    fn kinds_fold_round_numbers() {
        assert_eq!(kind_of("smc-3"), "smc");
        assert_eq!(kind_of("verbs-siw-3-write"), "verbs-siw-write");
        let t = combine(
            1,
            &[line("smc-1", "PASS", ""), line("smc-2", "FAIL", "")],
            &[line("smc-1", "PASS", ""), line("smc-2", "PASS", "")],
        );
        let table = kinds_table(&t);
        assert!(
            table.contains("| 1 | smc | 2 | 1 | 1 | 0 | yes |"),
            "{table}"
        );
    }

    #[test]
    fn rss_is_judged_on_the_daemons_own_memory() {
        let s = |t: f64, v: u64, a: u64, sh: u64| Sample {
            soak_s: Some(t),
            kib: [v, a, sh],
        };
        // Shared memory grows (guests' buffers), own memory stays: pass.
        let samples: Vec<Sample> = (0..60)
            .map(|i| {
                let t = i as f64 * 3.0;
                s(t, 10_000 + i * 100, 5_000, 1_000 + i * 100)
            })
            .collect();
        let r = summarize_rss(&samples, 60.0, 180.0);
        assert_eq!(r.baseline_samples, 10);
        assert_eq!(r.end_samples, 10);
        assert_eq!(r.baseline_kib.unwrap()[3], 9_000);
        assert!(judge_rss(&r, 10.0, 0, 60.0).is_none());
        // Own memory grows by 20 %: fail, unless the slack allows it.
        let grown: Vec<Sample> = samples
            .iter()
            .map(|x| {
                let t = x.soak_s.unwrap();
                let extra = if t >= 150.0 { 1_800 } else { 0 };
                s(t, x.kib[0] + extra, 5_000, x.kib[2])
            })
            .collect();
        let r = summarize_rss(&grown, 60.0, 180.0);
        let p = judge_rss(&r, 10.0, 0, 60.0).expect("20 % is too much");
        assert!(p.contains("+1800 KiB"), "{p}");
        assert!(judge_rss(&r, 10.0, 2_000, 60.0).is_none());
        assert!(judge_rss(&summarize_rss(&[], 60.0, 180.0), 10.0, 0, 60.0).is_some());
    }

    #[test]
    fn pairs_are_checked() {
        assert_eq!(parse_pairs("2,1,1").unwrap(), [1, 2]);
        assert!(parse_pairs("3").is_err());
        assert!(parse_pairs("").is_err());
    }
}
