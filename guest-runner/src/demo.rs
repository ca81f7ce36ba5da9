//! `guest-runner demo` (scripts/demo.sh): what vhost-rdma is for, on one
//! machine, with no RDMA hardware.
//!
//! It installs what is missing, builds the daemon and the guest tool, takes
//! (or builds) a Linux 7.3 guest image and QEMU 11.1, starts the daemon
//! with two guest ports, an emulated erdma function and gVNIC (vfio-user)
//! and a virtual host vh (10.77.0.10) with RDMA tool services, records the
//! fabric to a pcapng and boots two unmodified guests: a (10.77.0.1:
//! erdma_0 on its virtio-net eth0, gVNIC eth1) and b (10.77.0.2: siw0, then
//! rxe0). Then, step by step, each with its time and a verdict from
//! verified output (the guests' side: scripts/demo-guest.sh):
//!
//! 1. boot both guests, devices up (progress from their consoles)
//! 2. rping -V b (siw) -> vh over iWARP
//! 3. SMC-R v2 between the guests (erdma_0 <-> rxe0), every byte verified,
//!    `smc_mode=smcr`, the CLC handshake seen by the daemon's checker
//! 4. ibv_rc_pingpong a (erdma) -> vh and b (rxe) -> vh, echoes verified by vh
//! 5. rping -V b (rxe) -> vh over RoCE (rdma_cm over the IB CM)
//! 6. TCP from b to a's gVNIC with header split, every byte verified
//! 7. the daemon's view: `ctl flows`, checker findings, erdma counters
//! 8. a tshark summary of the capture
//! 9. a table of the steps with their times
//!
//! Without vfio-user-pci in QEMU, guest a uses rxe0 and step 6 is skipped.
//!
//! The steps' protocol: each guest touches `/job/ready-N` and waits for
//! `/job/go-N`, which the host creates when both are there; it runs its part
//! and writes `/job/end-N` (`rc=RC DETAIL`); the host then judges the step
//! from the tool logs the guests leave in `/job` and from the daemon
//! (guest-results' `demo_view`). Lines starting with `DEMO: ` are progress.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use guest_results::demo_view as view;
use guest_results::guestlog::{stream_passed, stream_result};

use crate::boot::{check_signal, install_signal_handlers};
use crate::daemon::{self, Daemon};
use crate::setup::{self, GuestSetup};
use crate::virtual_hosts::VH;

/// The demo's options (`scripts/demo.sh --help`).
#[derive(clap::Args, Debug, Clone)]
pub struct DemoOptions {
    /// image, QEMU, accelerator, build
    #[command(flatten)]
    pub setup: GuestSetup,
    /// SMC-R and gVNIC streams, per direction
    #[arg(long, default_value = "32M")]
    pub bytes: String,
    /// queue pairs of the virtio-net ports
    #[arg(long, default_value_t = 1)]
    pub queues: u32,
    /// virtio-net port form
    #[arg(long, default_value = "pci", value_parser = ["pci", "testdev"])]
    pub form: String,
    /// release or debug binaries
    #[arg(long, default_value = "release")]
    pub profile: String,
    /// boot this guest kernel (a bzImage with the drivers built in) instead
    /// of the image's (docs/guest-tests.md, "Bring your own kernel")
    #[arg(long)]
    pub kernel: Option<String>,
    /// guest kernel command-line additions (e.g. "loglevel=8 gve.debug=1")
    #[arg(long)]
    pub append: Option<String>,
    /// guest a uses rxe0 instead of the erdma function
    #[arg(long)]
    pub no_erdma: bool,
    /// no gVNIC in guest a (step 6 skipped)
    #[arg(long)]
    pub no_gve: bool,
    /// per guest, boot to end (seconds)
    #[arg(long, default_value_t = 900)]
    pub timeout: u32,
    /// where logs and the capture go (default: a new dir under $TMPDIR)
    #[arg(long)]
    pub logdir: Option<PathBuf>,
    /// keep the logs (and the capture) when every step passed
    #[arg(long)]
    pub keep_logs: bool,
}

const NSTEPS: usize = 9;
const A: &str = "10.77.0.1";
const B: &str = "10.77.0.2";
const MAC_A: &str = "52:54:00:77:00:01";
const MAC_B: &str = "52:54:00:77:00:02";
const MAC_G: &str = "52:54:00:77:00:11";

/// What the virtual host vh ([`VH`]) serves: two pingpong servers (a's and
/// b's), rping over RoCE and over iWARP.
const HOST_SERVICES: &str = r#"[[host.service]]
kind = "pingpong-server"   # guest a (erdma_0)
port = 18515
iters = 1000
[[host.service]]
kind = "pingpong-server"   # guest b (rxe0)
port = 18516
iters = 1000
[[host.service]]
kind = "rping-server-roce" # port 7174, IB CM over RoCE
[[host.service]]
kind = "rping-server"      # port 7174, iWARP (TCP)
"#;

#[derive(Default)]
struct Step {
    started: Option<Instant>,
    verdict: Option<(&'static str, u64, String)>,
}

/// Why the demo stopped before its steps ran.
struct SetupFailed(String);

struct Demo {
    o: DemoOptions,
    t0: Instant,
    last_out: Instant,
    d: PathBuf,
    bin: PathBuf,
    titles: [String; NSTEPS + 1],
    steps: [Step; NSTEPS + 1],
    prep: Vec<(u64, String)>,
    counts: [u32; 3],
    dev_a: &'static str,
    use_erdma: bool,
    use_gve: bool,
    cap: PathBuf,
    setup_error: Option<String>,
    background: Vec<Child>,
    daemon: Option<Daemon>,
}

/// `rc` of a guest's `/job/end-N` (`rc=RC DETAIL`), and the detail.
fn end_of(job: &Path, n: usize) -> Option<(String, String)> {
    let text = std::fs::read_to_string(job.join(format!("end-{n}"))).ok()?;
    let line = text.lines().next()?.strip_prefix("rc=")?;
    let (rc, detail) = line.split_once(' ').unwrap_or((line, ""));
    Some((rc.to_string(), detail.to_string()))
}

fn endrc(job: &Path, n: usize) -> String {
    end_of(job, n).map_or_else(String::new, |e| e.0)
}

/// The last `STREAM-RESULT` line of a tool log.
fn result_of(log: &Path) -> String {
    stream_result(&read(log)).unwrap_or("").to_string()
}

/// rc 0, every byte verified and passed (and `smc_mode=smcr` with `smcr`).
fn stream_ok(log: &Path, rc: &str, smcr: bool) -> bool {
    let r = result_of(log);
    rc == "0" && stream_passed(&r) && (!smcr || r.contains("smc_mode=smcr"))
}

/// `KEY=VALUE` of a result line: the value.
fn field(line: &str, key: &str) -> String {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or("")
        .to_string()
}

/// The `status=`, `verified=`, `smc_mode=` words of a result line.
fn result_words(line: &str) -> String {
    line.split_whitespace()
        .filter(|w| {
            ["status=", "verified=", "smc_mode="]
                .iter()
                .any(|k| w.starts_with(k))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn nums(line: &str) -> Vec<i64> {
    line.split_whitespace()
        .map(|w| w.parse().unwrap_or(0))
        .collect()
}

fn read(path: &Path) -> String {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

impl Demo {
    fn out(&mut self, line: &str) {
        println!("{line}");
        let _ = std::io::stdout().flush();
        self.last_out = Instant::now();
    }

    fn el(&self) -> u64 {
        self.t0.elapsed().as_secs()
    }

    fn prog(&mut self, what: &str) {
        let line = format!("   [{:4} s] {what}", self.el());
        self.out(&line);
    }

    fn say(&self, what: &str) {
        eprintln!("[demo] {what}");
    }

    fn step_start(&mut self, n: usize, what: &str) {
        self.steps[n].started = Some(Instant::now());
        let line = format!("== step {n}/{NSTEPS}: {what} (elapsed {} s)", self.el());
        self.out("");
        self.out(&line);
    }

    fn verdict(&mut self, n: usize, status: &'static str, detail: &str) {
        let secs = self.steps[n].started.map_or(0, |t| t.elapsed().as_secs());
        self.steps[n].verdict = Some((status, secs, detail.to_string()));
        let i = ["PASS", "FAIL", "SKIP"]
            .iter()
            .position(|s| *s == status)
            .unwrap_or(1);
        self.counts[i] += 1;
        self.out(&format!("   => {status} ({secs} s): {detail}"));
    }

    /// PASS with `ok` when `why` is empty, else FAIL with the reasons.
    fn judged(&mut self, n: usize, why: &[String], ok: &str) {
        if why.is_empty() {
            self.verdict(n, "PASS", ok);
        } else {
            self.verdict(n, "FAIL", &why.join(";"));
        }
    }

    fn ctl(&self, args: &[&str]) -> crate::qemu::Output {
        daemon::ctl(
            &self.bin,
            &self.d.join("ctl.sock"),
            args,
            daemon::CTL_TIMEOUT,
        )
    }

    /// `ctl --json ARGS` saved to `file` in the log dir (the views read it).
    fn ctl_json_to(&self, args: &[&str], file: &str) -> PathBuf {
        let mut a = vec!["--json"];
        a.extend(args);
        let o = self.ctl(&a);
        let path = self.d.join(file);
        let _ = std::fs::write(&path, if o.code == 0 { o.stdout } else { String::new() });
        path
    }

    fn job(&self, g: &str) -> PathBuf {
        self.d.join(format!("{g}.job"))
    }

    fn stop_background(&mut self) {
        for c in self.background.drain(..) {
            // each runs in its own process group: the whole build stops
            // SAFETY: kill(2) of a process group we started.
            unsafe {
                libc::kill(-(c.id() as libc::pid_t), libc::SIGTERM);
            }
        }
        if let Some(mut dm) = self.daemon.take() {
            dm.stop(Duration::from_secs(10));
        }
    }

    /// The table, the logs, the exit status.
    fn finish(&mut self) -> i32 {
        self.stop_background();
        let total = self.el();
        self.out("");
        self.out(&format!(
            "== step {NSTEPS}/{NSTEPS}: {} (elapsed {total} s)",
            self.titles[NSTEPS]
        ));
        let row = |a: &str, b: &str, c: &str, d: &str| format!("   {a:<4} {b:<52} {c:<6} {d:>6}");
        self.out(&row("step", "what", "result", "secs"));
        for (secs, what) in self.prep.clone() {
            self.out(&row("-", &what, "done", &secs.to_string()));
        }
        for n in 1..NSTEPS {
            if self.steps[n].verdict.is_none() {
                let why = self
                    .setup_error
                    .clone()
                    .unwrap_or_else(|| "not reached".into());
                self.steps[n].verdict = Some(("FAIL", 0, why));
                self.counts[1] += 1;
            }
            let (st, secs, _) = self.steps[n]
                .verdict
                .clone()
                .unwrap_or(("FAIL", 0, String::new()));
            let line = row(&n.to_string(), &self.titles[n], st, &secs.to_string());
            self.out(&line);
        }
        self.out(&row(
            "",
            "total (wall time of the demo)",
            "",
            &total.to_string(),
        ));
        for n in 1..NSTEPS {
            if let Some((st, _, detail)) = self.steps[n].verdict.clone() {
                if st != "PASS" {
                    self.out(&format!("   step {n} {st}: {detail}"));
                }
            }
        }
        let [p, f, s] = self.counts;
        self.out(&format!("   {p} passed, {f} failed, {s} skipped"));
        if f > 0 || self.o.keep_logs {
            let cap = self
                .cap
                .file_name()
                .map_or(String::new(), |c| format!(", {}", c.to_string_lossy()));
            let line = format!(
                "   logs: {} (daemon.log, a.job/ and b.job/: the guests' tool logs, a.console.log and b.console.log{cap})",
                self.d.display()
            );
            self.out(&line);
        } else {
            let _ = std::fs::remove_dir_all(&self.d);
            self.out("   logs removed (--keep-logs keeps them, with the capture for Wireshark)");
        }
        i32::from(f > 0)
    }

    fn fail_all(&mut self, why: &str) -> i32 {
        self.say(why);
        self.setup_error = Some(why.to_string());
        self.finish()
    }

    fn prep_done(&mut self, t: Instant, what: &str) {
        self.prep.push((t.elapsed().as_secs(), what.to_string()));
    }

    /// Judges step `n` from the guests' files and the daemon.
    fn judge(&mut self, n: usize) {
        let hosts = self.ctl_json_to(&["hosts"], "hosts.json");
        let (ja, jb) = (self.job("a"), self.job("b"));
        let mut why: Vec<String> = Vec::new();
        let bytes = self.o.bytes.clone();
        match n {
            1 => {
                for (g, j) in [("a", &ja), ("b", &jb)] {
                    if endrc(j, 1) != "0" {
                        let detail = end_of(j, 1).map_or(String::new(), |e| e.1);
                        why.push(format!("guest {g}: device setup failed ({detail})"));
                    }
                }
                let (da, db) = (
                    end_of(&ja, 1).map_or(String::new(), |e| e.1),
                    end_of(&jb, 1).map_or(String::new(), |e| e.1),
                );
                self.judged(1, &why, &format!("a: {da}; b: {db}; SMC UEID set on both"));
            }
            3 => {
                for (g, j) in [("a", &ja), ("b", &jb)] {
                    let log = j.join(format!("smcr.{g}.log"));
                    if !stream_ok(&log, &endrc(j, 3), true) {
                        why.push(format!(
                            "guest {g}: rc={} {}",
                            endrc(j, 3),
                            result_words(&result_of(&log))
                        ));
                    }
                }
                let flows = self.ctl_json_to(&["flows"], "flows-smc.json");
                let smc = view::smc(&flows);
                let (x, s) = smc.split_once(' ').unwrap_or((&smc, ""));
                if x.parse::<u64>().unwrap_or(0) < 1 {
                    why.push(format!(
                        "the checker saw no confirmed SMC-R v2 handshake ({s})"
                    ));
                }
                let r = result_of(&ja.join("smcr.a.log"));
                let ok = format!(
                    "{bytes} each way verified on both sides, smc_mode=smcr, {} MiB/s; checker: {s}",
                    field(&r, "mibps")
                );
                self.judged(3, &why, &ok);
            }
            4 => {
                let mut lines = Vec::new();
                for (g, port, j) in [("a", "18515", &ja), ("b", "18516", &jb)] {
                    let log = read(&j.join(format!("pingpong.{g}.log")));
                    let iters = log.lines().find(|l| l.starts_with("1000 iters in"));
                    if iters.is_none() || endrc(j, 4) != "0" {
                        why.push(format!(
                            "guest {g}: rc={}, {}",
                            endrc(j, 4),
                            log.lines().last().unwrap_or("")
                        ));
                    }
                    lines.push(iters.unwrap_or("").to_string());
                    let svc = view::service(&hosts, "pingpong-server", port);
                    let v = nums(&svc);
                    let (ok, ver) = (
                        v.first().copied().unwrap_or(0),
                        v.get(3).copied().unwrap_or(0),
                    );
                    if ok < 1 || ver != 999 {
                        let err = svc.split_whitespace().nth(4).unwrap_or("");
                        why.push(format!(
                            "vh :{port}: {ok} sessions ok, {ver} of 999 echoes verified ({err})"
                        ));
                    }
                }
                let ok = format!(
                    "a ({}): {}; b (rxe0): {}; vh verified 999 echoes of each",
                    self.dev_a, lines[0], lines[1]
                );
                self.judged(4, &why, &ok);
            }
            2 | 5 => {
                let (log, kind, what) = if n == 2 {
                    ("rping-iwarp.b.log", "rping-server", "iWARP, siw0")
                } else {
                    ("rping-roce.b.log", "rping-server-roce", "RoCE, rxe0")
                };
                let text = read(&jb.join(log));
                let cnt = text
                    .lines()
                    .filter(|l| l.starts_with("ping data: rdma-ping-"))
                    .count();
                if cnt < 10 {
                    why.push(format!("guest b: {cnt} of 10 verified pings"));
                }
                if let Some(l) = text
                    .lines()
                    .find(|l| l.to_lowercase().contains("data mismatch"))
                {
                    why.push(format!("guest b: {l}"));
                }
                if endrc(&jb, n) != "0" {
                    why.push(format!("guest b: rc={}", endrc(&jb, n)));
                }
                let svc = view::service(&hosts, kind, "7174");
                let v = nums(&svc);
                let at = |i: usize| v.get(i).copied().unwrap_or(0);
                if at(0) < 1 || at(2) != 10 || at(3) != 10 {
                    let err = svc.split_whitespace().nth(4).unwrap_or("");
                    why.push(format!(
                        "vh {kind}: {} sessions ok, {} pings, {} verified ({err})",
                        at(0),
                        at(2),
                        at(3)
                    ));
                }
                let ok = format!(
                    "b ({what}): {cnt} pings, each echo compared (-V); vh {kind} verified {} of {}",
                    at(3),
                    at(2)
                );
                self.judged(n, &why, &ok);
            }
            6 => {
                if end_of(&ja, 6).is_some_and(|e| e.1 == "skip") {
                    self.verdict(
                        6,
                        "SKIP",
                        "no gVNIC (--no-gve or QEMU without vfio-user-pci)",
                    );
                    return;
                }
                for (g, j) in [("a", &ja), ("b", &jb)] {
                    let log = j.join(format!("gve.{g}.log"));
                    if !stream_ok(&log, &endrc(j, 6), false) {
                        why.push(format!(
                            "guest {g}: rc={} {}",
                            endrc(j, 6),
                            result_words(&result_of(&log))
                        ));
                    }
                }
                let status = self.ctl_json_to(&["status"], "status-gve.json");
                let v = nums(&view::gve(&status));
                let at = |i: usize| v.get(i).copied().unwrap_or(0);
                if at(0) <= 1000 {
                    why.push(format!("the gVNIC split only {} packets", at(0)));
                }
                let r = result_of(&ja.join("gve.a.log"));
                let ok = format!(
                    "{bytes} each way verified, {} MiB/s; gVNIC RX: {} packets, {} header-split ({} header + {} payload bytes)",
                    field(&r, "mibps"),
                    at(3),
                    at(0),
                    at(1),
                    at(2)
                );
                self.judged(6, &why, &ok);
            }
            _ => {}
        }
    }

    /// Step 7, the daemon's view (host only; the guests wait until it is done).
    fn daemon_view(&mut self) {
        self.step_start(7, &self.titles[7].clone());
        let show = |me: &mut Demo, cmd: &str, text: &str| {
            me.out(&format!("   $ vhost-rdma ctl {cmd}"));
            for l in text.lines() {
                me.out(&format!("     {l}"));
            }
        };
        let flows = self.ctl(&["flows"]);
        let _ = std::fs::write(self.d.join("flows.txt"), &flows.stdout);
        show(self, "flows", &(flows.stdout + &flows.stderr));
        let fj = self.ctl_json_to(&["flows"], "flows.json");
        let v = nums(&view::flows(&fj));
        let at = |i: usize| v.get(i).copied().unwrap_or(0);
        let (rc, smcl, iw, v2) = (at(0), at(1), at(2), at(3));
        let findings = self.ctl(&["findings"]);
        show(self, "findings", &(findings.stdout + &findings.stderr));
        let fdj = self.ctl_json_to(&["findings"], "findings.json");
        let total = view::findings(&fdj);
        let status = self.ctl(&["status"]);
        let _ = std::fs::write(self.d.join("status.txt"), &status.stdout);
        let sj = self.ctl_json_to(&["status"], "status.json");
        self.out("   $ vhost-rdma ctl status   (ports, checker, erdma function; full output in status.txt)");
        let head: Vec<String> = status
            .stdout
            .lines()
            .scan(false, |done, l| {
                if *done {
                    return None;
                }
                *done = l.starts_with("checker ");
                Some(l.to_string())
            })
            .collect();
        for l in head {
            self.out(&format!("     {l}"));
        }
        if self.use_erdma {
            for l in view::erdma(&sj).lines() {
                self.out(&format!("     {l}"));
            }
        }
        let hosts = self.ctl(&["hosts"]);
        let _ = std::fs::write(self.d.join("hosts.txt"), &hosts.stdout);
        for l in hosts.stdout.lines().filter(|l| l.starts_with("  service ")) {
            self.out(&format!("     vh {}", &l[2..]));
        }
        let mut why = Vec::new();
        if total.trim() != "0" {
            why.push(format!("{} checker finding(s)", total.trim()));
        }
        if v2 < 1 {
            why.push("no confirmed SMC-R v2 session in flows".into());
        }
        if smcl < 1 {
            why.push("no RoCE connection carrying an SMC-R link in flows".into());
        }
        if rc < 4 {
            why.push(format!(
                "only {rc} RC connections in flows (SMC-R link, 2 pingpongs, rping)"
            ));
        }
        if iw < 1 {
            why.push("no iWARP connection in flows".into());
        }
        let ok = format!(
            "{rc} RoCE RC connections ({smcl} carrying the SMC-R link group), {iw} iWARP, {v2} SMC-R v2 session(s); 0 findings"
        );
        self.judged(7, &why, &ok);
    }

    fn step_what(&self, n: usize) -> String {
        let (dev, bytes) = (self.dev_a, &self.o.bytes);
        match n {
            2 => "rping -V: b (siw0) -> vh:7174 over iWARP, 10 pings".into(),
            3 => format!(
                "SMC-R v2 between the guests: a ({dev}) server, b (rxe0, replacing siw0) client, {bytes} each way"
            ),
            4 => format!(
                "ibv_rc_pingpong: a ({dev}) -> vh:18515 and b (rxe0) -> vh:18516, 1000 x 4 KiB"
            ),
            5 => "rping -V: b (rxe0) -> vh:7174 over RoCE, 10 pings".into(),
            6 if self.use_gve => format!(
                "TCP: b -> a's gVNIC (10.77.1.1, header split), {bytes} each way"
            ),
            _ => self.titles[n].clone(),
        }
    }
}

/// What the guests and the host have shown so far, for the progress lines.
#[derive(Default)]
struct Watch {
    cur: usize,
    view_done: bool,
    ticks: u64,
    lines: BTreeMap<&'static str, usize>,
    stages: BTreeMap<String, bool>,
}

impl Watch {
    fn once(&mut self, key: String) -> bool {
        self.stages.insert(key, true).is_none()
    }

    /// Console milestones of guest `g`, once each.
    fn boot_stages(&mut self, me: &mut Demo, g: &str) {
        let rg = read(&me.d.join("run-guests.log"));
        if let Some(accel) = rg.lines().find_map(|l| l.split("accel: ").nth(1)) {
            if self.once(format!("{g}.q")) {
                let a = accel.split_whitespace().next().unwrap_or("").to_uppercase();
                me.prog(&format!("{g}: QEMU {a}, 1 vCPU, 512 MiB"));
            }
        }
        let con = read(&me.d.join(format!("{g}.console.log")));
        if let Some(l) = con.lines().find(|l| l.contains("Linux version")) {
            if self.once(format!("{g}.k")) {
                let v = l
                    .split("Linux version ")
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next())
                    .unwrap_or("?");
                me.prog(&format!("{g}: kernel {v} booting"));
            }
        }
        if let Some(l) = con.lines().find(|l| l.contains("Run /sbin/vr-init")) {
            if self.once(format!("{g}.i")) {
                let t = l
                    .trim_start_matches('[')
                    .split(']')
                    .next()
                    .unwrap_or("?")
                    .trim();
                me.prog(&format!(
                    "{g}: kernel up after {t} s (guest clock), init running"
                ));
            }
        }
    }

    /// New `DEMO: ` lines of guest `g`.
    fn guest_lines(&mut self, me: &mut Demo, g: &'static str) {
        let text = read(&me.job(g).join("out.log"));
        let lines: Vec<&str> = text.lines().collect();
        let seen = self.lines.entry(g).or_insert(0);
        let new: Vec<String> = lines
            .iter()
            .skip(*seen)
            .filter_map(|l| l.strip_prefix("DEMO: "))
            .map(|l| format!("{g}: {l}"))
            .collect();
        *seen = lines.len();
        for l in new {
            me.prog(&l);
        }
    }

    /// The virtual host's new events (sessions started, finished).
    fn host_events(&mut self, me: &mut Demo) {
        let hosts = me.ctl_json_to(&["hosts"], "hosts-live.json");
        if let Ok(ev) = view::events(&hosts, &me.d.join("events-seen.json")) {
            for l in ev.lines().filter(|l| !l.is_empty()) {
                me.prog(l);
            }
        }
    }

    fn tick(&mut self, me: &mut Demo) {
        self.ticks += 1;
        if self.cur == 1 {
            self.boot_stages(me, "a");
            self.boot_stages(me, "b");
        }
        self.guest_lines(me, "a");
        self.guest_lines(me, "b");
        if self.ticks.is_multiple_of(2) {
            self.host_events(me);
        }
        let (ja, jb) = (me.job("a"), me.job("b"));
        // a guest whose run ended releases the other from its waits
        for (done, other) in [(&ja, &jb), (&jb, &ja)] {
            if read(&done.join("out.log")).contains("VR-RESULT") && other.is_dir() {
                let _ = std::fs::write(other.join("abort"), "");
            }
        }
        let cur = self.cur;
        if cur <= 7 {
            if me.steps[cur].started.is_none() {
                let ready = |j: &Path| j.join(format!("ready-{cur}")).exists();
                if ready(&ja) && ready(&jb) {
                    if cur == 7 {
                        me.daemon_view();
                        self.view_done = true;
                    } else {
                        let what = me.step_what(cur);
                        me.step_start(cur, &what);
                        me.ctl_json_to(&["status"], "status-base.json");
                    }
                    let _ = std::fs::write(ja.join(format!("go-{cur}")), "");
                    let _ = std::fs::write(jb.join(format!("go-{cur}")), "");
                    if cur == 7 {
                        self.cur = 8;
                    }
                }
            } else if ja.join(format!("end-{cur}")).exists()
                && jb.join(format!("end-{cur}")).exists()
            {
                self.guest_lines(me, "a");
                self.guest_lines(me, "b");
                self.host_events(me);
                me.judge(cur);
                self.cur += 1;
            }
        }
        if me.last_out.elapsed() >= Duration::from_secs(8) {
            let what = if self.cur == 1 {
                let last = |g: &str| {
                    read(&me.d.join(format!("{g}.console.log")))
                        .lines()
                        .last()
                        .unwrap_or("")
                        .chars()
                        .take(50)
                        .collect::<String>()
                };
                format!("booting: a: {}, b: {}", last("a"), last("b"))
            } else if let Some(t) = me.steps.get(self.cur).and_then(|s| s.started) {
                let live = me.ctl_json_to(&["status"], "status-live.json");
                format!(
                    "step {}, {} s in: {}",
                    self.cur,
                    t.elapsed().as_secs(),
                    view::rates(&live, &me.d.join("status-base.json"))
                )
            } else {
                format!("waiting for the guests to reach step {}", self.cur)
            };
            me.prog(&what);
        }
    }
}

/// Starts a provisioning script in its own process group (so that the
/// whole build stops with it), stdout to `out`, stderr to `log`.
fn background(script: &Path, args: &[&str], out: &Path, log: &Path) -> Option<Child> {
    let o = std::fs::File::create(out).ok()?;
    let e = std::fs::File::create(log).ok()?;
    Command::new(script)
        .args(args)
        .stdin(Stdio::null())
        .stdout(o)
        .stderr(e)
        .process_group(0)
        .spawn()
        .ok()
}

fn last_line_of(path: &Path) -> Option<String> {
    read(path)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_string())
}

/// Runs the demo; its exit status.
pub fn run(o: DemoOptions) -> i32 {
    let root = setup::repo_root();
    let d = o.logdir.clone().unwrap_or_else(|| {
        crate::paths::mkdtemp("vhost-rdma-demo.").map_or_else(
            |_| std::env::temp_dir().join("vhost-rdma-demo"),
            PathBuf::from,
        )
    });
    let _ = std::fs::create_dir_all(&d);
    let titles = [
        "",
        "boot both guests, devices up",
        "rping -V against the virtual host over iWARP",
        "SMC-R v2 between the guests",
        "ibv_rc_pingpong against the virtual host",
        "rping -V against the virtual host over RoCE",
        "TCP to a's gVNIC, header split",
        "the daemon's view: flows, findings, erdma counters",
        "tshark summary of the capture",
        "summary",
    ]
    .map(String::from);
    let target = setup::target_dir(&root, &o.profile);
    let mut me = Demo {
        t0: Instant::now(),
        last_out: Instant::now(),
        bin: target.join("vhost-rdma"),
        titles,
        steps: Default::default(),
        prep: Vec::new(),
        counts: [0; 3],
        dev_a: "erdma_0",
        use_erdma: !o.no_erdma,
        use_gve: !o.no_gve,
        cap: d.join("demo.pcapng"),
        setup_error: None,
        background: Vec::new(),
        daemon: None,
        d,
        o,
    };
    install_signal_handlers();
    match prepare(&mut me, &root, &target) {
        Ok((image, qemu, kernel)) => run_steps(&mut me, &root, &target, &image, &qemu, kernel),
        Err(SetupFailed(why)) => me.fail_all(&why),
    }
}

/// Prerequisites, binaries, the guest image and QEMU (each phase's time in
/// the table): the image, QEMU and the checked `--kernel`.
fn prepare(
    me: &mut Demo,
    root: &Path,
    target: &Path,
) -> Result<(String, String, Option<String>), SetupFailed> {
    let scripts = root.join("scripts");
    let mut kernel = None;
    if let Some(k) = me.o.kernel.clone() {
        let v =
            crate::kernel::check_bzimage(&k).map_err(|e| SetupFailed(format!("--kernel: {e}")))?;
        let k = std::fs::canonicalize(&k).map_or(k, |p| p.display().to_string());
        me.say(&format!("guest kernel (--kernel): {k}, Linux {v}"));
        for w in crate::kernel::warnings_for(&k) {
            eprintln!("warning: {w}");
        }
        kernel = Some(k);
    }
    let build = !me.o.setup.no_build;
    if build {
        let t = Instant::now();
        me.say("installing missing prerequisites (scripts/install-deps.sh)");
        let ok = Command::new(scripts.join("install-deps.sh"))
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return Err(SetupFailed("scripts/install-deps.sh failed".into()));
        }
        me.prep_done(t, "prerequisites (scripts/install-deps.sh)");
    }
    // The guest image (on a cold run the kernel build, most of the demo's
    // minutes) and QEMU are made in the background while cargo builds: each
    // uses the cores the other leaves idle (downloads, linking).
    let t_img = Instant::now();
    let (image_out, qemu_out) = (me.d.join("image.out"), me.d.join("qemu.out"));
    if me.o.setup.image.is_none() {
        me.say("guest image: Linux 7.3 + Debian userland (scripts/build-guest-image.sh --kernel 7.3), beside the build");
        let c = background(
            &scripts.join("build-guest-image.sh"),
            &["--kernel", "7.3"],
            &image_out,
            &me.d.join("image.log"),
        )
        .ok_or_else(|| SetupFailed("cannot start scripts/build-guest-image.sh".into()))?;
        me.background.push(c);
    }
    if me.o.setup.qemu.is_none() {
        if let Some(c) = background(
            &scripts.join("setup-qemu.sh"),
            &[],
            &qemu_out,
            &me.d.join("qemu.log"),
        ) {
            me.background.push(c);
        }
    }
    if build {
        let t = Instant::now();
        let profile = me.o.profile.clone();
        me.say(&format!(
            "building vhost-rdma and smc-guest-tests ({profile})"
        ));
        // cargo's output is the user's progress: on the terminal
        let ok = setup::build_binaries(root, &profile, None);
        if !ok || check_signal().is_err() {
            return Err(SetupFailed("cargo build failed".into()));
        }
        me.prep_done(t, &format!("cargo build ({profile})"));
    }
    if !me.background.is_empty() {
        me.say("waiting for the guest image (and QEMU); its progress:");
        let log = me.d.join("image.log");
        let mut shown = 0;
        let mut failed = Vec::new();
        for mut c in std::mem::take(&mut me.background) {
            let rc = loop {
                let text = read(&log);
                for l in text.lines().skip(shown) {
                    println!("   {l}");
                }
                shown = text.lines().count();
                if check_signal().is_err() {
                    me.background.push(c);
                    return Err(SetupFailed("interrupted".into()));
                }
                match c.try_wait() {
                    Ok(Some(st)) => break st.success(),
                    Ok(None) => std::thread::sleep(Duration::from_millis(500)),
                    Err(_) => break false,
                }
            };
            if !rc {
                failed.push(c.id());
            }
        }
        if !failed.is_empty() {
            me.say(&format!(
                "a background build failed: see {} and {}",
                me.d.join("image.log").display(),
                me.d.join("qemu.log").display()
            ));
        }
        me.prep_done(t_img, "guest kernel, root and QEMU (beside the build)");
    }
    let image =
        me.o.setup
            .image
            .clone()
            .or_else(|| last_line_of(&image_out))
            .filter(|i| {
                Path::new(i).join("bzImage").exists() && Path::new(i).join("rootfs.ext4").exists()
            })
            .ok_or_else(|| {
                SetupFailed(format!(
                    "no guest image (see {})",
                    me.d.join("image.log").display()
                ))
            })?;
    let qemu = me
        .o
        .setup
        .qemu
        .clone()
        .or_else(|| last_line_of(&qemu_out))
        .filter(|q| Path::new(q).exists())
        .ok_or_else(|| SetupFailed(format!("no QEMU (see {})", me.d.join("qemu.log").display())))?;
    me.say(&format!("image: {image}, qemu: {qemu}"));
    for b in ["vhost-rdma", "smc-guest-tests"] {
        if !target.join(b).exists() {
            return Err(SetupFailed(format!(
                "no {} (run without --no-build)",
                target.join(b).display()
            )));
        }
    }
    Ok((image, qemu, kernel))
}

fn run_steps(
    me: &mut Demo,
    root: &Path,
    target: &Path,
    image: &str,
    qemu: &str,
    kernel: Option<String>,
) -> i32 {
    let d = me.d.clone();
    let has_vfio = Command::new(qemu)
        .args(["-machine", "none", "-device", "help"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("\"vfio-user-pci\""));
    if (me.use_erdma || me.use_gve) && !has_vfio {
        me.say(&format!(
            "NOTE: {qemu} has no vfio-user-pci (QEMU >= 10.1): no erdma function (guest a uses rxe0), no gVNIC (step 6 skipped)"
        ));
        me.use_erdma = false;
        me.use_gve = false;
    }
    if !me.use_gve {
        me.titles[6] = "TCP to a's gVNIC (no gVNIC: skipped)".into();
    }
    if !me.use_erdma {
        me.dev_a = "rxe0";
        me.titles[7] = "the daemon's view: flows, findings, ports".into();
    }
    // the daemon: ports a, b (virtio-net), r (erdma on a), g (gVNIC) and the
    // virtual host with its services
    let host = format!("[[host]]\nname = \"vh\"\naddress = \"{VH}/24\"\n{HOST_SERVICES}");
    let _ = std::fs::write(d.join("demo.toml"), host);
    let sock = |n: &str| d.join(format!("{n}.sock")).display().to_string();
    let (q, form) = (me.o.queues, me.o.form.clone());
    let mut args: Vec<String> = vec![
        "--config".into(),
        d.join("demo.toml").display().to_string(),
        "--port".into(),
        format!("a={},mac={MAC_A},queues={q},form={form}", sock("a")),
        "--port".into(),
        format!("b={},mac={MAC_B},queues={q},form={form}", sock("b")),
    ];
    if me.use_erdma {
        args.extend([
            "--port".into(),
            format!("r={},kind=erdma,netdev=a", sock("r")),
        ]);
    }
    if me.use_gve {
        args.extend([
            "--port".into(),
            format!("g={},kind=gve,queues=1,mac={MAC_G}", sock("g")),
        ]);
    }
    args.extend([
        "--control".into(),
        d.join("ctl.sock").display().to_string(),
        "--capture-dir".into(),
        d.display().to_string(),
    ]);
    let shown: Vec<String> = args
        .iter()
        .map(|a| a.replace(&format!("{}/", d.display()), ""))
        .collect();
    me.say(&format!(
        "starting the daemon: vhost-rdma serve {}",
        shown.join(" ")
    ));
    me.say(&format!(
        "  (files in {}; virtual host vh {VH}: pingpong-server :18515 and :18516, rping-server-roce and rping-server :7174)",
        d.display()
    ));
    let sockets = [d.join("ctl.sock"), d.join("a.sock"), d.join("b.sock")];
    match Daemon::start(
        None,
        &me.bin,
        &args,
        &d.join("ctl.sock"),
        &sockets,
        &d.join("daemon.log"),
    ) {
        Ok(dm) => me.daemon = Some(dm),
        Err(e) => return me.fail_all(&e.to_string()),
    }
    let _ = std::fs::remove_file(&me.cap);
    let cap = me.cap.display().to_string();
    let started = me.ctl(&["capture", "start", "--file", &cap, "--snaplen", "512"]);
    let _ = std::fs::write(
        d.join("capture-start.txt"),
        started.stdout + &started.stderr,
    );
    if started.code == 0 {
        me.say("recording every port to demo.pcapng (ctl capture start --snaplen 512)");
    } else {
        let why = last_line_of(&d.join("capture-start.txt")).unwrap_or_default();
        me.say(&format!("capture did not start: {why}"));
    }
    // the guests' jobs (scripts/demo-guest.sh in /opt/vr)
    let vrbin = d.join("vrbin");
    let _ = std::fs::create_dir_all(vrbin.join("bin"));
    let copies = [
        (
            target.join("smc-guest-tests"),
            vrbin.join("bin/smc-guest-tests"),
        ),
        (
            root.join("scripts/demo-guest.sh"),
            vrbin.join("demo-guest.sh"),
        ),
        (
            root.join("scripts/guest/rdma-lib.sh"),
            vrbin.join("rdma-lib.sh"),
        ),
    ];
    for (from, to) in &copies {
        if let Err(e) = setup::copy(from, to) {
            return me.fail_all(&e.to_string());
        }
    }
    for g in ["a", "b"] {
        let job = format!(
            "export DEMO_BYTES={} DEMO_ERDMA={} DEMO_GVE={} DEMO_QUEUES={q} DEMO_WAIT={}\nexec sh /opt/vr/demo-guest.sh {g}\n",
            me.o.bytes,
            u8::from(me.use_erdma),
            u8::from(me.use_gve),
            me.o.timeout
        );
        let _ = std::fs::write(d.join(format!("{g}.sh")), job);
    }
    let mut vfio = String::new();
    if me.use_erdma {
        vfio += &format!(",vfio={}", sock("r"));
    }
    if me.use_gve {
        vfio += &format!(",vfio={}", sock("g"));
    }
    let me_exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("guest-runner"));
    let mut boot = Command::new(me_exe);
    boot.arg("boot").args([
        "--qemu",
        qemu,
        "--image",
        image,
        "--accel",
        &me.o.setup.accel,
        "--timeout",
        &me.o.timeout.to_string(),
        "--guest-bin",
        &vrbin.display().to_string(),
        "--net",
        "vhost-user",
        "--form",
        &form,
        "--queues",
        &q.to_string(),
        "--logdir",
        &d.display().to_string(),
    ]);
    if let Some(k) = &kernel {
        boot.args(["--kernel", k]);
    }
    if let Some(a) = &me.o.append {
        boot.args(["--append", a]);
    }
    boot.arg("--guest").arg(format!(
        "a,ip={A}/24,sock={},mac={MAC_A}{vfio},cmd={}",
        sock("a"),
        d.join("a.sh").display()
    ));
    boot.arg("--guest").arg(format!(
        "b,ip={B}/24,sock={},mac={MAC_B},cmd={}",
        sock("b"),
        d.join("b.sh").display()
    ));
    me.step_start(
        1,
        "boot both guests (TCG unless KVM boots them), bring up their devices",
    );
    let _ = std::fs::write(d.join("events-seen.json"), "");
    let child = std::fs::File::create(d.join("run-guests.log"))
        .and_then(|f| Ok((f.try_clone()?, f)))
        .and_then(|(o, e)| boot.stdin(Stdio::null()).stdout(o).stderr(e).spawn());
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return me.fail_all(&format!("cannot start the guests: {e}")),
    };
    let mut w = Watch {
        cur: 1,
        ..Default::default()
    };
    let Some(rc) = crate::boot::wait_guests(&mut child, Duration::from_secs(1), || w.tick(me))
    else {
        me.setup_error = Some("interrupted".into());
        return me.finish();
    };
    w.tick(me);
    // steps the guests never finished
    for n in w.cur..=6 {
        if me.steps[n].started.is_some() {
            me.judge(n);
        } else {
            let why = format!(
                "not reached (the guests' run exited {rc}; see {}, {})",
                d.join("a.console.log").display(),
                d.join("b.console.log").display()
            );
            me.steps[n].verdict = Some(("FAIL", 0, why));
            me.counts[1] += 1;
        }
    }
    if !w.view_done {
        me.daemon_view();
    }
    capture_step(me);
    me.finish()
}

/// Step 8: the capture, through tshark's protocol hierarchy.
fn capture_step(me: &mut Demo) {
    me.step_start(8, &me.titles[8].clone());
    let stop = me.ctl(&["capture", "stop"]);
    let stop_text = stop.stdout + &stop.stderr;
    if let Some(mut dm) = me.daemon.take() {
        if dm.panicked() {
            me.out("   daemon panicked:");
            let log = read(&me.d.join("daemon.log"));
            let p: Vec<&str> = log.lines().filter(|l| l.contains("panicked")).collect();
            for l in &p[p.len().saturating_sub(3)..] {
                me.out(&format!("     {l}"));
            }
        }
        dm.stop(Duration::from_secs(10));
    }
    let cap = me.cap.clone();
    if crate::paths::which("tshark").is_none() {
        me.verdict(
            8,
            "SKIP",
            &format!(
                "tshark is not installed (apt-get install tshark); the capture is {}",
                cap.display()
            ),
        );
        me.o.keep_logs = true;
        return;
    }
    if std::fs::metadata(&cap).map_or(true, |m| m.len() == 0) {
        let why = last_line_of(&me.d.join("capture-start.txt")).unwrap_or_default();
        me.verdict(8, "FAIL", &format!("no capture file ({why})"));
        return;
    }
    let size = std::fs::metadata(&cap).map_or(0, |m| m.len());
    let summary: Vec<&str> = stop_text
        .lines()
        .filter(|l| {
            let l = l.to_lowercase();
            l.contains("frames") || l.contains("dropped")
        })
        .take(2)
        .collect();
    me.out(&format!(
        "   demo.pcapng: {:.1} MiB; {}",
        size as f64 / 1048576.0,
        summary
            .join(" ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    ));
    me.out("   $ tshark -r demo.pcapng -q -z io,phs   (inbound frames only: each frame as its sender sent it)");
    // tshark's RPC-over-RDMA and Thrift guesses misread SMC-R LLC messages
    // and TCP data: off (a tshark without those names gets a second try)
    let phs = |heur: bool| {
        let mut c = Command::new("tshark");
        c.arg("-r").arg(&cap).arg("-q");
        if heur {
            c.args([
                "--disable-heuristic",
                "rpcrdma_infiniband",
                "--disable-heuristic",
                "thrift_tcp",
            ]);
        }
        c.args(["-z", "io,phs,frame.packet_flags_direction == 1"]);
        c.output()
    };
    let mut o = phs(true);
    if let Ok(out) = &o {
        let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
        if !out.status.success() && (err.contains("heuristic") || err.contains("no such protocol"))
        {
            o = phs(false);
        }
    }
    let (ok, text, err) = match o {
        Ok(out) => (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ),
        Err(e) => (false, String::new(), e.to_string()),
    };
    let _ = std::fs::write(me.d.join("tshark-phs.txt"), &text);
    // the hierarchy without the banner, at most 24 lines
    let rows: Vec<String> = text
        .lines()
        .filter(|l| {
            l.contains("frames:")
                && l.trim_start()
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_lowercase())
        })
        .take(24)
        .map(|l| format!("     {l}"))
        .collect();
    for l in rows {
        me.out(&l);
    }
    let v = nums(&view::phs(&text));
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    let (roce, smcr, clc, iwarp, malformed) = (at(0), at(1), at(2), at(3), at(4));
    let mut why = Vec::new();
    if !ok {
        let last = err
            .lines()
            .rfind(|l| !l.contains("dangerous"))
            .unwrap_or("");
        why.push(format!("tshark failed: {last}"));
    }
    if roce == 0 {
        why.push("no RoCEv2 (InfiniBand over UDP 4791) frames decoded".into());
    }
    if iwarp == 0 {
        why.push("no iWARP (MPA) decoded".into());
    }
    let pass = format!(
        "RoCEv2 {roce} frames ({smcr} carry SMC-R), SMC CLC {clc}, iWARP {iwarp}; tshark calls {malformed} malformed; open demo.pcapng in Wireshark"
    );
    me.judged(8, &why, &pass);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guest_end_file_reads_as_rc_and_detail() {
        let dir = std::env::temp_dir().join(format!("demo-test-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        std::fs::write(dir.join("end-1"), "rc=0 erdma_0 gid=1 gve=eth1\n").expect("write");
        std::fs::write(dir.join("end-3"), "rc=1\n").expect("write");
        assert_eq!(
            end_of(&dir, 1),
            Some(("0".into(), "erdma_0 gid=1 gve=eth1".into()))
        );
        assert_eq!(endrc(&dir, 3), "1");
        assert_eq!(endrc(&dir, 4), "");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_stream_passes_with_every_word() {
        let dir = std::env::temp_dir().join(format!("demo-stream-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let log = dir.join("s.log");
        std::fs::write(
            &log,
            "x\nSTREAM-RESULT verified=1 status=pass mibps=3.5 smc_mode=smcr\n",
        )
        .expect("write");
        assert!(stream_ok(&log, "0", true));
        assert!(!stream_ok(&log, "1", false));
        assert_eq!(field(&result_of(&log), "mibps"), "3.5");
        std::fs::write(&log, "STREAM-RESULT verified=1 status=pass smc_mode=tcp\n").expect("write");
        assert!(!stream_ok(&log, "0", true));
        assert!(stream_ok(&log, "0", false));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
