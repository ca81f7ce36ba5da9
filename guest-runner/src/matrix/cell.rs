//! One matrix cell, start to verdict: its own daemon (two virtio-net ports,
//! and the cell's erdma functions or gVNICs), the host helpers the cell
//! needs (capture cap, ctl broker, failover driver, stuck-guest watch),
//! two guests through `guest-runner boot`, then the rows: the guests'
//! (guest-results' `guestlog`), the host's (tshark, checker, loss
//! evidence, device traces, failover evidence), the fault cases' and the
//! upstream suites' verdicts.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use guest_results::cell::{judge_cell, Device as UpstreamDevice, Suite};
use guest_results::guestlog::{judge_guests, row_json, GuestOut};
use guest_results::pyjson::Json;
use guest_results::upstream::Row;
use guest_results::{faults, flakes, hostrows, tshark};

use crate::boot::check_signal;
use crate::cells::{self, erdma_port, gve_port, Cell, Device, Role, Upstream, BOTH};
use crate::daemon::{self, Daemon};
use crate::setup;
use crate::virtual_hosts::VirtualHosts;

use super::uplinks::Uplinks;
use super::{obj, s, say, vxlan, Run};

/// How long one `ctl` request of the matrix may take.
const CTL_TIMEOUT: Duration = Duration::from_secs(20);

/// The siw cells' default `mpa-settle` delay (ms): the daemon's workaround
/// for the guest kernel's siw connection-setup races.
pub const SIW_SETTLE_MS: u64 = 300;

/// Guest `a` (server) and `b` (client): name, address, MAC.
fn guest(role: Role) -> (&'static str, &'static str, &'static str) {
    match role {
        Role::Client => ("b", "10.77.0.2", "52:54:00:77:01:0b"),
        _ => ("a", "10.77.0.1", "52:54:00:77:01:0a"),
    }
}

/// The second virtio-net NIC of cells with two: port name, address, MAC.
fn guest_nic1(role: Role) -> (&'static str, &'static str, &'static str) {
    match role {
        Role::Client => ("b1", "10.77.0.12", "52:54:00:77:01:1b"),
        _ => ("a1", "10.77.0.11", "52:54:00:77:01:1a"),
    }
}

fn gve_mac(role: Role) -> &'static str {
    match role {
        Role::Client => "52:54:00:77:02:0b",
        _ => "52:54:00:77:02:0a",
    }
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Server => "server",
        Role::Client => "client",
        Role::Host => "host",
    }
}

/// Phase 1 of smc-noueid (UEID on the server only): the decline code
/// depends on whether the client kernel has an SMC-D loopback device (7.3:
/// CONFIG_DIBS_LO, declined NOUEID; 6.12: no SMCv2 device without a UEID,
/// NOSMCDEV).
fn noueid_phase1_code(kernel: &str) -> &'static str {
    if kernel == "6.12" {
        "0x03030000"
    } else {
        "0x03030008"
    }
}

/// A test row.
pub fn row(test: &str, status: &str, detail: &str) -> Json {
    row_json(&Row {
        test: test.into(),
        status: status.into(),
        secs: 0,
        bw: String::new(),
        detail: detail.into(),
    })
}

/// A FAIL row per row of `cell`, all for `why`.
pub fn fail_rows(cell: &Cell, why: &str) -> Vec<Json> {
    cell.test_names().map(|t| row(t, "FAIL", why)).collect()
}

/// The cell's fault rules: the siw workaround first (siw cells, unless
/// `--siw-settle-ms 0`; siw-conn shows the races unless it is given), then
/// the cell's own.
pub fn cell_faults(name: &str, cell: &Cell, siw_settle_ms: Option<u64>) -> Vec<serde_json::Value> {
    let mut rules = cell.faults.clone();
    let ms = match (name, siw_settle_ms) {
        ("siw-conn", ms) => ms.unwrap_or(0),
        (_, ms) => ms.unwrap_or(SIW_SETTLE_MS),
    };
    if name.split('-').next() == Some("siw") && ms > 0 {
        rules.insert(
            0,
            serde_json::json!({"port": "a", "dir": "both", "proto": "tcp",
                               "action": "mpa-settle", "delay-ms": ms}),
        );
    }
    rules
}

/// A guest's job script: who it is, the cell's environment, the cell's
/// `ci-lib.sh` call.
pub fn job_script(
    role: Role,
    cell_name: &str,
    cell: &Cell,
    kernel: &str,
    env: &[(String, String)],
) -> String {
    let (_, self_ip, _) = guest(role);
    let peer = if role == Role::Server {
        Role::Client
    } else {
        Role::Server
    };
    let mut vars: Vec<(String, String)> = env.to_vec();
    vars.push(("CI_NOUEID_CODE".into(), noueid_phase1_code(kernel).into()));
    vars.extend(cell.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    if let Some(r) = cell.rdma {
        vars.push(("CI_RDMA".into(), r.of(role).name().into()));
    }
    if let Some(n) = cell.nic {
        vars.push(("CI_NIC".into(), n.of(role).name().into()));
    }
    let mut extra = String::new();
    for (var, val) in vars.iter().filter(|(_, v)| !v.is_empty()) {
        extra += &format!("{var}={}; export {var}\n", crate::qemu::shell_quote(val));
    }
    format!(
        "ROLE={} SELF={self_ip} PEER={} CELL={kernel}/{cell_name}\n\
         export ROLE SELF PEER CELL\n\
         {extra}\
         echo \"CI-KERNEL $(uname -r)\"\n\
         . /opt/vr/ci/ci-lib.sh\n\
         {}\n\
         exit 0\n",
        role_name(role),
        if cell.one_guest {
            crate::virtual_hosts::VH
        } else {
            guest(peer).1
        },
        cell.call
    )
}

/// The daemon's arguments for a cell (after `serve`) and the sockets it
/// must create.
fn daemon_args(
    d: &Path,
    cell: &Cell,
    roles: &[Role],
    faults: bool,
    readme_gve: Option<&str>,
) -> (Vec<String>, Vec<PathBuf>) {
    let mut args = Vec::new();
    if faults {
        args.extend([
            "--config".into(),
            d.join("daemon.toml").display().to_string(),
        ]);
    }
    let mut sockets = Vec::new();
    let sock = |n: &str| d.join(format!("{n}.sock"));
    for &role in roles {
        let mut nics = vec![guest(role)];
        if cell.nics > 1 {
            nics.push(guest_nic1(role));
        }
        for (name, _, mac) in nics {
            args.push("--port".into());
            args.push(format!(
                "{name}={},mac={mac},queues={},form={}",
                sock(name).display(),
                cell.queues,
                cell.form
            ));
        }
        sockets.push(sock(guest(role).0));
        if cell.rdma.is_some_and(|r| r.of(role) == Device::Erdma) {
            let p = erdma_port(role);
            let opts = if cell.erdma_opts.is_empty() {
                String::new()
            } else {
                format!(",{}", cell.erdma_opts)
            };
            args.push("--port".into());
            args.push(format!(
                "{p}={},kind=erdma,netdev={}{opts}",
                sock(p).display(),
                guest(role).0
            ));
            sockets.push(sock(p));
        }
        if cell.nic.is_some_and(|n| n.of(role) == Device::Gve) {
            let p = gve_port(role);
            args.push("--port".into());
            args.push(match readme_gve {
                Some(opts) => format!("{p}={}{opts}", sock(p).display()),
                None if !cell.gve_opts.is_empty() => format!(
                    "{p}={},{},mac={}",
                    sock(p).display(),
                    cell.gve_opts,
                    gve_mac(role)
                ),
                None => format!(
                    "{p}={},kind=gve,queues={},mtu=9000,gro-hold-us=10000,nic-timestamp=on,mac={}",
                    sock(p).display(),
                    cell.gve_queues,
                    gve_mac(role)
                ),
            });
            sockets.push(sock(p));
        }
    }
    args.extend([
        "--control".into(),
        d.join("ctl.sock").display().to_string(),
        "--capture-dir".into(),
        d.display().to_string(),
    ]);
    (args, sockets)
}

/// Seconds per guest, boot to result: `--timeout` or the cell's.
fn cell_timeout(r: &Run, cell: &Cell) -> u32 {
    if r.o.timeout > 0 {
        r.o.timeout
    } else {
        cell.timeout
    }
}

/// The `[[fault]]` tables of the daemon's config file
/// (docs/faults-and-captures.md).
fn fault_toml(rules: &[serde_json::Value]) -> String {
    let mut out = String::new();
    for r in rules {
        out += "[[fault]]\n";
        for (k, v) in r.as_object().into_iter().flatten() {
            out += &format!("{k} = {v}\n");
        }
        out += "\n";
    }
    out
}

/// `vhost-rdma ctl --json ARGS` against the cell's daemon, the reply with
/// its keys in the daemon's order, or `None`.
fn ctl_json(bin: &Path, d: &Path, args: &[&str]) -> Option<Json> {
    daemon::ctl_json(bin, &d.join("ctl.sock"), args, CTL_TIMEOUT)
}

fn write_json(path: &Path, v: &Json) {
    if let Ok(text) = serde_json::to_string_pretty(v) {
        let _ = std::fs::write(path, text);
    }
}

/// Echoes the guests' CI-TEST / SKIPPED / BARRIER / CI-ABORT / VR-RESULT
/// console lines (every line with `--verbose`) while a cell runs, and keeps
/// what the stuck-guest watch needs: when a line last came, the first
/// barrier abort.
struct ConsoleWatch {
    d: PathBuf,
    verbose: bool,
    pos: [u64; 2],
    state: Arc<Mutex<WatchState>>,
}

#[derive(Default)]
struct WatchState {
    last_line: Option<Instant>,
    /// (guest, barrier label) of the first CI-ABORT line.
    aborted: Option<(String, String)>,
}

const CONSOLE_KEYS: [&str; 5] = ["CI-TEST", "SKIPPED", "BARRIER", "CI-ABORT", "VR-RESULT"];

impl ConsoleWatch {
    fn poll(&mut self) {
        for (i, g) in ["a", "b"].iter().enumerate() {
            let Ok(mut f) = std::fs::File::open(self.d.join(format!("{g}.console.log"))) else {
                continue;
            };
            let mut data = Vec::new();
            if f.seek(SeekFrom::Start(self.pos[i])).is_err() || f.read_to_end(&mut data).is_err() {
                continue;
            }
            // only complete lines
            let cut = data.iter().rposition(|b| *b == b'\n').map_or(0, |p| p + 1);
            self.pos[i] += cut as u64;
            for line in String::from_utf8_lossy(&data[..cut]).lines() {
                let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                st.last_line = Some(Instant::now());
                if line.starts_with("CI-ABORT") && st.aborted.is_none() {
                    let label = line
                        .split_once("label=")
                        .map_or("?", |(_, l)| l.trim())
                        .to_string();
                    st.aborted = Some((g.to_string(), label));
                }
                if self.verbose || CONSOLE_KEYS.iter().any(|k| line.contains(k)) {
                    let l: String = line.trim_end().chars().take(300).collect();
                    println!("    [{g}] {l}");
                }
            }
        }
    }
}

/// How long both guests may print nothing before the stuck-guest watch
/// looks: longer than the longest tool timeout a cell's guests use (a
/// stream may run quietly for CI_STREAM_TIMEOUT s; ci-lib.sh's defaults),
/// plus the barrier timeout.
fn quiet_limit(r: &Run, cell: &Cell) -> u64 {
    let env_num = |k: &str, dflt: u64| {
        cell.env
            .get(k)
            .or_else(|| r.job_env.iter().find(|(n, _)| n == k).map(|(_, v)| v))
            .and_then(|v| v.parse().ok())
            .unwrap_or(dflt)
    };
    env_num("CI_STREAM_TIMEOUT", 1800).max(env_num("CI_TOOL_TIMEOUT", 180)) + 600
}

/// A thread that stops when its flag is set, checking every `period`.
struct Helper {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Helper {
    fn spawn(f: impl FnOnce(Arc<AtomicBool>) + Send + 'static) -> Helper {
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        Helper {
            stop,
            thread: Some(std::thread::spawn(move || f(s2))),
        }
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sleeps up to `secs` unless `stop` is set first; whether it was.
fn wait_stop(stop: &AtomicBool, secs: f64) -> bool {
    let t0 = Instant::now();
    while t0.elapsed().as_secs_f64() < secs {
        if stop.load(Ordering::SeqCst) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.load(Ordering::SeqCst)
}

/// A helper subcommand of this binary (ctl broker, failover driver, rss
/// host), run from the cell's start until its verdicts; its output in `log`
/// if given, else on the matrix's own.
fn spawn_helper<S: AsRef<std::ffi::OsStr>>(args: &[S], log: Option<&Path>) -> Option<Child> {
    let me = std::env::current_exe().ok()?;
    let mut cmd = Command::new(me);
    cmd.args(args).stdin(Stdio::null());
    if let Some(log) = log {
        let f = std::fs::File::create(log).ok()?;
        cmd.stderr(f.try_clone().ok()?).stdout(f);
    }
    cmd.spawn().ok()
}

/// The options of the README's gVNIC port line (`--port
/// g=/run/vhost-rdma/g.sock,kind=gve...`): what follows its socket.
fn readme_gve(root: &Path) -> anyhow::Result<String> {
    const LINE: &str = "--port g=/run/vhost-rdma/g.sock";
    let text = std::fs::read_to_string(root.join("README.md"))
        .map_err(|e| anyhow::anyhow!("README.md: {e}"))?;
    let at = text
        .find(&format!("{LINE},kind=gve"))
        .ok_or_else(|| anyhow::anyhow!("README.md shows no '{LINE},kind=gve...' line"))?;
    let word = text[at + LINE.len()..]
        .split_whitespace()
        .next()
        .unwrap_or_default();
    Ok(word.to_string())
}

/// The gve cell's rows with the device's half: its split packets, its RSS
/// table and key, its flow rule's hits and queue 1's packets (the
/// server's status snapshots, `/job/status-*.json`), and `readme-port`.
fn gve_device_rows(tests: Vec<Json>, d: &Path, readme: Option<&str>) -> Vec<Json> {
    let snap = |f: &str| -> serde_json::Value {
        std::fs::read_to_string(d.join("a.job").join(f))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .map(|v| v["devices"][0]["gve"].clone())
            .unwrap_or_default()
    };
    let (live, devmem) = (snap("status-live.json"), snap("status-devmem.json"));
    let int = |v: &serde_json::Value| v.as_i64().unwrap_or(-1);
    let split: i64 = live["counters"]["rx_queues"]
        .as_array()
        .map_or(-1, |q| q.iter().map(|x| int(&x["hsplit_packets"])).sum());
    let table = live["rss"]["indirection_table"]
        .as_array()
        .map_or(0, Vec::len);
    let key = live["rss"]["key"].as_array().map_or(0, Vec::len);
    let configured = live["rss"]["table_configured"] == serde_json::json!(true);
    let hits: i64 = live["flow_rules"]
        .as_array()
        .map_or(-1, |r| r.iter().map(|x| int(&x["hits"])).sum());
    let q1 = int(&live["counters"]["rx_queues"][1]["packets"]);
    let dq1 = int(&devmem["counters"]["rx_queues"][1]["hsplit_packets"]);
    let checks: [(&str, bool, String); 4] = [
        ("header-split", split > 1000, format!("device: {split} split packets")),
        (
            "rss",
            (table, configured, key) == (128, true, 40),
            format!("device: {table}-entry table, configured {configured}, {key}-byte key (want 128, true, 40)"),
        ),
        ("ntuple", hits > 0 && q1 > 0, format!("device: rule hits {hits}, queue 1 packets {q1}")),
        // 64 MiB / MSS 1448 = 46 347 segments, each split
        ("devmem-rx", dq1 >= 46000, format!("device: queue 1 split {dq1} packets (want >= 46000)")),
    ];
    tests
        .into_iter()
        .map(|t| {
            let test = t.at("test").str().to_string();
            if test == "readme-port" {
                return match readme {
                    None => row(
                        &test,
                        "FAIL",
                        "README.md has no gve port line (see problems)",
                    ),
                    Some(o) if o.contains("queues=") => row(
                        &test,
                        "FAIL",
                        &format!(
                            "the README's gve line sets queues= ({o}): no longer the defaults"
                        ),
                    ),
                    Some(o) => row(
                        &test,
                        "PASS",
                        &format!(
                            "--port ag=SOCKET{o}: the README's line, its socket in the cell's dir"
                        ),
                    ),
                };
            }
            let Some((_, ok, seen)) = checks.iter().find(|(n, _, _)| *n == test) else {
                return t;
            };
            with_host_half(t, *ok, seen)
        })
        .collect()
}

/// `guest-runner rss-host` for the rss cell, its lines in `d/rss-host.log`.
fn spawn_rss_host(bin: &Path, d: &Path, cell: &Cell) -> Option<Child> {
    let flows = d.join("flows.json");
    std::fs::write(&flows, cells::rss_flows(cell).to_string()).ok()?;
    let args = [
        Path::new("rss-host"),
        bin,
        &d.join("ctl.sock"),
        &d.join("a.job"),
        &d.join("b.job"),
        &flows,
    ];
    spawn_helper(&args, Some(&d.join("rss-host.log")))
}

/// The rss cell's host row: `guest-runner rss-host`'s exit and its checks.
fn rss_host_row(child: Option<Child>, d: &Path) -> Json {
    let Some(mut child) = child else {
        return row("rss-host", "FAIL", "guest-runner rss-host did not start");
    };
    // it ends once the server's last step is acked; a guest that never got there leaves it waiting
    let t0 = Instant::now();
    let code = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st.code(),
            _ if t0.elapsed() > Duration::from_secs(10) => {
                crate::boot::kill_proc(&mut child, 2.0);
                break None;
            }
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let log = std::fs::read_to_string(d.join("rss-host.log")).unwrap_or_default();
    let ok = log.lines().filter(|l| l.starts_with("CHECK-OK")).count();
    let bad: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with("CHECK-FAIL"))
        .collect();
    match code {
        Some(0) => row("rss-host", "PASS", &format!("{ok} checks passed")),
        c => row(
            "rss-host",
            "FAIL",
            &format!(
                "rss-host exit {c:?}: {ok} checks passed, {} failed: {}",
                bad.len(),
                bad.join("; ")
            ),
        ),
    }
}

/// SIGTERM to a helper process, SIGKILL after `grace` seconds.
fn end_process(child: Option<Child>, grace: f64) {
    if let Some(mut c) = child {
        crate::boot::kill_proc(&mut c, grace);
        let _ = c.wait();
    }
}

/// SIGTERM to `pid` (the guests' runner: it stops its QEMUs).
pub(super) fn sigterm(pid: u32) {
    // SAFETY: a plain kill(2) of our own child's pid.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGTERM);
    }
}

/// Why a cell stopped early: the matrix was interrupted.
pub struct Interrupted;

/// Runs one cell; its result record (results.json's `cells` entry).
pub fn run_cell(r: &Run, kernel: &str, name: &str, work: &Path) -> Result<Json, Interrupted> {
    let d = work.join(format!("{kernel}-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    let _ = std::fs::create_dir_all(&d);
    let cell = &r.cells[name];
    let faults = cell_faults(name, cell, r.o.siw_settle_ms);
    let mut what = cell.what.clone();
    if let Some(ms) = faults
        .iter()
        .find(|f| f["action"] == "mpa-settle")
        .map(|f| f["delay-ms"].clone())
    {
        what += &format!(" [daemon siw workaround: mpa-settle {ms} ms]");
    }
    println!("\n== cell {kernel}/{name}: {what}");
    let t0 = Instant::now();
    let net = r.o.net.as_str();
    let vhost = net == "vhost-user";
    let mut problems: Vec<String> = Vec::new();
    // later keys of the record, in the order they are learnt
    let mut extra: Vec<(&str, Json)> = Vec::new();
    let mut boot_s: Vec<(String, Json)> = Vec::new();
    let mut guest_kernel: Vec<(String, Json)> = Vec::new();
    let mut tests: Vec<Json>;
    let mut accel = None;
    // --net stream: QEMU's own virtio-net, no daemon: tells daemon issues from guest ones
    if cell.rdma.is_some() && !vhost {
        problems.push("the erdma function needs the daemon (--net vhost-user)".into());
    }
    let mut dm = None;
    let mut start_err = None;
    let mut underlay: Option<vxlan::Underlay> = None;
    let mut lab: Option<Uplinks> = None;
    let mut skip_why = None;
    let readme = cell.readme_gve.then(|| readme_gve(&r.root));
    if let Some(Err(e)) = &readme {
        problems.push(e.to_string());
    }
    let readme_opts = readme.as_ref().and_then(|x| x.as_deref().ok());
    if vhost {
        let mut config = fault_toml(&faults);
        if let Some(vh) = &cell.virtual_hosts {
            config += &vh.config_toml(cell_timeout(r, cell));
        }
        if !config.is_empty() {
            let _ = std::fs::write(d.join("daemon.toml"), config);
        }
        // a vxlan pair: daemon A serves the server, B (started below) the client
        let roles = if cell.vxlan_pair {
            cells::SERVER
        } else {
            cell.roles()
        };
        let (mut args, sockets) = daemon_args(
            &d,
            cell,
            roles,
            !faults.is_empty() || cell.virtual_hosts.is_some(),
            readme_opts,
        );
        if cell.vxlan_pair {
            match vxlan::Underlay::new(&d) {
                Ok(u) => {
                    println!("   underlay: {}", u.describe());
                    extra.push(("underlay", s(&u.describe())));
                    args.extend(["--port".into(), u.uplink_arg(true)]);
                    underlay = Some(u);
                }
                Err(e) => start_err = Some(format!("the VXLAN underlay: {e}")),
            }
        }
        if cell.uplinks && start_err.is_none() {
            if !crate::paths::is_root() {
                skip_why = Some("needs root (network namespaces, TAP devices)".to_string());
            } else {
                match Uplinks::new(&d, &r.vrbin.join("bin/smc-guest-tests")) {
                    Ok(u) => {
                        args.extend(u.daemon_args());
                        lab = Some(u);
                    }
                    Err(e) => start_err = Some(format!("the uplinks' namespaces: {e}")),
                }
            }
        }
        let netns = underlay
            .as_ref()
            .and_then(|u| u.netns())
            .or(lab.as_ref().map(|u| u.daemon_netns()));
        if start_err.is_none() && skip_why.is_none() {
            match Daemon::start(
                netns,
                &r.daemon_bin,
                &args,
                &d.join("ctl.sock"),
                &sockets,
                &d.join("daemon.log"),
            ) {
                Ok(x) => dm = Some(x),
                Err(e) => start_err = Some(e.to_string()),
            }
        }
        if let (Some(u), Some(_)) = (lab.as_ref(), &dm) {
            if let Err(e) = u.attach_tap() {
                start_err = Some(format!("the TAP uplink: {e}"));
            }
        }
        if let (Some(u), None) = (underlay.as_mut(), &start_err) {
            let (b_args, b_sockets) = daemon_args(&d, cell, &[Role::Client], false, None);
            let port_b = b_args.get(1).cloned().unwrap_or_default();
            let sock_b = b_sockets.first().cloned().unwrap_or_default();
            if let Err(e) = u.start_b(&r.daemon_bin, &d, &port_b, sock_b) {
                start_err = Some(format!("daemon B: {e}"));
            }
        }
    } else if cell.vxlan_pair || cell.uplinks {
        problems.push("the cell's uplinks need the daemon (--net vhost-user)".into());
    }
    if let Some(why) = skip_why {
        tests = cell.tests.iter().map(|t| row(&t.0, "SKIP", &why)).collect();
    } else if let Some(err) = start_err {
        problems.push(err.clone());
        tests = fail_rows(cell, &err);
    } else {
        // the uplinks' host rows, then the clients wait for the guest
        let mut lab_rows = Vec::new();
        if let Some(u) = lab.as_mut() {
            say("the uplinks' host rows (namespaces A and B, no guest yet)");
            lab_rows = u.host_rows(&r.daemon_bin, &d);
            u.start_peers(&r.daemon_bin, &d, cell_timeout(r, cell));
        }
        let bin = &r.daemon_bin;
        let pcap = d.join("fabric.pcapng");
        let capped = Arc::new(Mutex::new(None::<i128>));
        let mut cap = None;
        if cell.capture && r.o.capture && vhost {
            let snap = r.o.capture_snaplen.to_string();
            // captures never replace a file: a rerun's cell starts a new one
            let _ = std::fs::remove_file(&pcap);
            let mut args = vec!["capture", "start", "--file"];
            let p = pcap.display().to_string();
            args.push(&p);
            if r.o.capture_snaplen > 0 {
                args.extend(["--snaplen", &snap]);
            }
            if ctl_json(bin, &d, &args).is_none() {
                problems.push("ctl capture start failed".into());
            } else {
                // stop the capture once it holds --capture-max-records records, so a long
                // SMC-R stream does not leave tshark a gigabyte to read
                let (bin, d2, max, capped) = (
                    bin.clone(),
                    d.clone(),
                    r.o.capture_max_records,
                    capped.clone(),
                );
                cap = Some(Helper::spawn(move |stop| {
                    while !wait_stop(&stop, 2.0) {
                        let Some(st) = ctl_json(&bin, &d2, &["capture", "status"]) else {
                            continue;
                        };
                        let n = match st.get("records") {
                            Some(Json::Int(n)) => *n,
                            _ => 0,
                        };
                        if n >= i128::from(max) {
                            ctl_json(&bin, &d2, &["capture", "stop"]);
                            *capped.lock().unwrap_or_else(|e| e.into_inner()) = Some(n);
                            return;
                        }
                    }
                }));
            }
        }
        // until the daemon exits
        let cpu_sampler = match (&dm, cell.daemon_cpu) {
            (Some(dm), true) => {
                let (pid, bin, ctl, out) = (
                    dm.pid(),
                    bin.clone(),
                    d.join("ctl.sock"),
                    d.join("daemon-cpu.log"),
                );
                Some(std::thread::spawn(move || {
                    guest_results::daemon_cpu::sample(pid, &bin, &ctl, &out)
                }))
            }
            _ => None,
        };
        let mut broker = None;
        if cell.ctl_broker && vhost {
            broker = spawn_helper(
                &[
                    "ctl-broker".into(),
                    "--dir".into(),
                    d.display().to_string(),
                    "--daemon".into(),
                    bin.display().to_string(),
                ],
                None,
            );
            // the gVNIC's probe happens at boot: its trace starts before the guests do
            if cells::fault_traces(name)
                .iter()
                .any(|(f, _)| *f == "trace-gve-probe.txt")
                && ctl_json(
                    bin,
                    &d,
                    &[
                        "trace",
                        "start",
                        "--port",
                        gve_port(Role::Server),
                        "--file",
                        "trace-gve-probe.txt",
                    ],
                )
                .is_none()
            {
                problems.push("ctl trace start --port ag failed".into());
            }
        }
        let qemu = if cell.stock_qemu {
            let q = setup::last_line(
                Command::new(r.root.join("scripts/setup-qemu.sh")).arg("--system"),
                &d.join("qemu-system.log"),
            )
            .filter(|q| crate::paths::which(q).is_some())
            .unwrap_or_else(|| {
                problems.push("scripts/setup-qemu.sh --system found no QEMU".into());
                r.qemu.clone()
            });
            let version =
                crate::qemu::qemu_version(&q).map_or_else(|e| e.to_string(), |(_, line)| line);
            extra.push(("qemu_version", s(&version)));
            q
        } else {
            r.qemu.clone()
        };
        let me = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("guest-runner"));
        let timeout = cell_timeout(r, cell);
        let mut rg = Command::new(&me);
        rg.arg("boot").args([
            "--qemu",
            &qemu,
            "--image",
            &r.image,
            "--accel",
            &r.o.accel,
            "--timeout",
            &timeout.to_string(),
            "--guest-bin",
            &r.vrbin.display().to_string(),
            "--net",
            net,
            "--form",
            cell.form,
            "--queues",
            &cell.queues.to_string(),
            "--logdir",
            &d.display().to_string(),
            "--monitor",
        ]);
        if let Some(k) = &r.kernel_image {
            rg.args(["--kernel", k]);
        }
        if cell.form == "testdev" {
            // virtio-net's config space: mac, status, max queue pairs, mtu,
            // speed, duplex, rss (24 bytes, as the daemon serves it)
            rg.args(["--config-size", "24"]);
        }
        if !r.o.append.is_empty() {
            rg.args(["--append", &r.o.append]);
        }
        for &role in cell.roles() {
            let (gname, ip, mac) = guest(role);
            let script = d.join(format!("{gname}.sh"));
            let _ = std::fs::write(&script, job_script(role, name, cell, kernel, &r.job_env));
            let sock = if vhost {
                format!("sock={},", d.join(format!("{gname}.sock")).display())
            } else {
                String::new()
            };
            let nic1 = if cell.nics > 1 {
                let (n1, ip1, mac1) = guest_nic1(role);
                format!(
                    "ip1={ip1}/24,sock1={},mac1={mac1},",
                    d.join(format!("{n1}.sock")).display()
                )
            } else {
                String::new()
            };
            let mut vfio = String::new();
            if vhost && cell.rdma.is_some_and(|x| x.of(role) == Device::Erdma) {
                vfio = format!(
                    "vfio={},",
                    d.join(format!("{}.sock", erdma_port(role))).display()
                );
            }
            if vhost && cell.nic.is_some_and(|x| x.of(role) == Device::Gve) {
                vfio = format!(
                    "vfio={},",
                    d.join(format!("{}.sock", gve_port(role))).display()
                );
            }
            let smp = if role == Role::Server && cell.server_smp > 1 {
                format!("smp={},", cell.server_smp)
            } else {
                String::new()
            };
            rg.arg("--guest").arg(format!(
                "{gname},ip={ip}/24,{sock}{nic1}{vfio}{smp}mac={mac},cmd={}",
                script.display()
            ));
        }
        let state = Arc::new(Mutex::new(WatchState {
            last_line: Some(Instant::now()),
            aborted: None,
        }));
        let mut watch = ConsoleWatch {
            d: d.clone(),
            verbose: r.o.verbose,
            pos: [0, 0],
            state: state.clone(),
        };
        let fo_out = d.join("failover-evidence.json");
        let fo = if cell.failover && vhost {
            spawn_helper(
                &[
                    "failover-driver".into(),
                    "--dir".into(),
                    d.display().to_string(),
                    "--daemon".into(),
                    bin.display().to_string(),
                    "--up-after".into(),
                    "30".into(),
                    "--out".into(),
                    fo_out.display().to_string(),
                ],
                None,
            )
        } else {
            None
        };
        let rss = (cell.rss_host && vhost).then(|| spawn_rss_host(bin, &d, cell));
        let rg_log = d.join("run-guests.log");
        let child = std::fs::File::create(&rg_log)
            .and_then(|f| Ok((f.try_clone()?, f)))
            .and_then(|(o, e)| rg.stdin(Stdio::null()).stdout(o).stderr(e).spawn());
        let (rc, diagnosis) = match child {
            Err(e) => {
                problems.push(format!("cannot start the guests: {e}"));
                (-1, None)
            }
            Ok(mut child) => {
                let silence = quiet_limit(r, cell);
                let stuck =
                    vhost.then(|| stuck_watch(bin, &d, silence, 120.0, state.clone(), child.id()));
                let mut tail = r.o.verbose.then(|| Tail::new(&rg_log));
                let mut last_poll = Instant::now();
                let rc = crate::boot::wait_guests(&mut child, Duration::from_millis(100), || {
                    if last_poll.elapsed() >= Duration::from_secs(2) {
                        watch.poll();
                        last_poll = Instant::now();
                    }
                    if let Some(t) = tail.as_mut() {
                        t.echo();
                    }
                });
                let Some(rc) = rc else {
                    // interrupted: the guests are stopped; the helpers and the daemon too
                    if let Some(mut s) = stuck {
                        s.0.stop();
                    }
                    end_process(broker, 5.0);
                    end_process(fo, 5.0);
                    end_process(rss.flatten(), 1.0);
                    if let Some(mut c) = cap {
                        c.stop();
                    }
                    if let Some(mut dm) = dm {
                        dm.stop(Duration::from_secs(10));
                    }
                    return Err(Interrupted);
                };
                watch.poll();
                if let Some(t) = tail.as_mut() {
                    t.echo();
                }
                let diagnosis = stuck.and_then(|mut s| {
                    s.0.stop();
                    s.1.lock().unwrap_or_else(|e| e.into_inner()).take()
                });
                (rc, diagnosis)
            }
        };
        if let Some(diag) = diagnosis {
            problems.push(diag);
        }
        if rc != 0 {
            problems.push(format!("run-guests exit {rc}"));
        }
        if vhost {
            if let Some(dc) = daemon_counters(bin, &d) {
                extra.push(("daemon_counters", dc));
            }
        }
        let uplink_mtu = underlay.as_mut().map(|u| u.finish(bin, &d, &mut problems));
        if let Some(u) = lab.as_mut() {
            u.finish_peers(bin, &d);
        }
        let hosts = if vhost && cell.virtual_hosts.is_some() {
            let h = ctl_json(bin, &d, &["hosts"]);
            if let Some(h) = &h {
                write_json(&d.join("hosts.json"), h);
            }
            h
        } else {
            None
        };
        end_process(fo, 60.0);
        if broker.is_some() {
            // it answers what is left once more
            end_process(broker, 30.0);
            if let Some(dfl) = ctl_json(bin, &d, &["device-fault", "list"]) {
                write_json(&d.join("device-faults.json"), &dfl);
            }
            // the device traces stay with the results, passed or not
            let tdest = r.resdir.join("traces").join(format!("{kernel}-{name}"));
            let mut traces = Vec::new();
            let mut names: Vec<String> = std::fs::read_dir(&d)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|f| f.starts_with("trace-"))
                .collect();
            names.sort();
            for f in names {
                let _ = std::fs::create_dir_all(&tdest);
                let _ = std::fs::copy(d.join(&f), tdest.join(&f));
                traces.push(s(&format!("traces/{kernel}-{name}/{f}")));
            }
            if !traces.is_empty() {
                extra.push(("traces", Json::Array(traces)));
            }
        }
        // a cell may also add its loss rules at run time (vxlan-rdma, through the broker)
        let loss_rows = cell.test_names().any(|t| t == "loss-evidence");
        let fault_list = if (faults.is_empty() && !loss_rows) || !vhost {
            None
        } else {
            ctl_json(bin, &d, &["faults", "list"])
        };
        if let Some(fl) = &fault_list {
            write_json(&d.join("faults.json"), fl);
            let inner = fl.get("faults").filter(|f| f.truthy()).unwrap_or(fl);
            for rule in inner.at("rules").items() {
                if rule.at("rule").at("action").str() == "mpa-settle" {
                    let msg = format!(
                        "mpa-settle rule: {} TCP frames matched, {} data segments held behind an MPA Reply",
                        rule.at("matched"),
                        rule.at("acted")
                    );
                    println!("   {msg}");
                    extra.push(("siw_settle", s(&msg)));
                }
            }
        }
        if let Some(mut c) = cap {
            c.stop();
            ctl_json(bin, &d, &["capture", "stop"]);
        }
        let capped_at = *capped.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = capped_at {
            extra.push(("capture_capped_at", Json::Int(n)));
        }
        let checker = if vhost { checker_report(bin, &d) } else { None };
        if let Some(ck) = &checker {
            // reported, not judged: a finding is a protocol rule broken on the wire
            extra.push(("checker", ck.clone()));
            let rules = ck.at("rules");
            let rules = if rules.entries().is_empty() {
                String::new()
            } else {
                rules.repr()
            };
            println!("   checker: {} finding(s) {rules}", ck.at("findings"));
        }
        if let Some(mut dm) = dm.take() {
            if dm.exit_code().is_some() {
                problems.push("daemon died during the run".into());
            } else if let Some(p) = dm.stop(Duration::from_secs(10)) {
                problems.push(p);
            }
        }
        if let Some(Ok(Err(e))) = cpu_sampler.map(std::thread::JoinHandle::join) {
            problems.push(format!("the daemon's CPU sampler: {e}"));
        }
        if let Ok(log) = std::fs::read(d.join("daemon.log")) {
            let log = String::from_utf8_lossy(&log);
            let bad: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("panicked") || l.contains("ERROR"))
                .collect();
            if bad.iter().any(|l| l.contains("panicked")) {
                problems.push("daemon panicked".into());
            }
            if !bad.is_empty() {
                let last = bad[bad.len().saturating_sub(10)..]
                    .iter()
                    .map(|l| s(l.trim_end()));
                extra.push(("daemon_errors", Json::Array(last.collect())));
            }
        }
        let g = guest_rows(cell, &d);
        if !g.at("counters").entries().is_empty() {
            extra.push(("counters", g.at("counters").clone()));
        }
        guest_kernel.extend(g.at("guest_kernel").entries().iter().cloned());
        tests = g.at("tests").items().to_vec();
        let host_rows = host_rows(
            r,
            name,
            cell,
            &d,
            &pcap,
            capped_at,
            &fo_out,
            checker.as_ref(),
            fault_list.as_ref(),
            &extra,
        );
        tests = tests
            .into_iter()
            .map(|t| {
                host_rows
                    .iter()
                    .find(|(n, _)| n == t.at("test").str())
                    .map_or(t, |(_, h)| h.clone())
            })
            .collect();
        if let Some(vh) = &cell.virtual_hosts {
            tests = virtual_host_rows(vh, tests, hosts.as_ref());
        }
        if cell.readme_gve {
            tests = gve_device_rows(tests, &d, readme_opts);
        }
        if let Some(u) = &lab {
            tests = u.guest_rows(tests);
            for t in lab_rows {
                if let Some(x) = tests.iter_mut().find(|x| x.at("test") == t.at("test")) {
                    *x = t;
                }
            }
        }
        if let Some(t) = uplink_mtu {
            if let Some(x) = tests
                .iter_mut()
                .find(|x| x.at("test").str() == "uplink-mtu")
            {
                *x = t;
            }
        }
        if let Some(child) = rss {
            let t = rss_host_row(child, &d);
            if let Some(x) = tests.iter_mut().find(|x| x.at("test").str() == "rss-host") {
                *x = t;
            }
        }
        let cases = cells::fault_cases(name);
        if !cases.is_empty() {
            let dest = r.resdir.join(format!("faults-{kernel}-{name}.md"));
            let cmd = format!("ci/matrix.sh --cells {kernel}/{name}");
            match faults::judge_cell(&cases, &tests, kernel, name, &cmd) {
                Ok((judged, table)) => {
                    tests = judged;
                    let _ = std::fs::write(&dest, table);
                }
                Err(e) => tests.push(row("fault-verdict", "FAIL", &format!("fault cases: {e}"))),
            }
            extra.push(("fault_table", s(&format!("faults-{kernel}-{name}.md"))));
            let traces = extra.iter().find(|(k, _)| *k == "traces").map(|(_, v)| {
                v.items()
                    .iter()
                    .map(|t| t.str().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            });
            println!(
                "   fault table: {}{}",
                dest.display(),
                traces.map_or(String::new(), |t| format!("; traces: {t}"))
            );
        }
        if let Some(suite) = cell.upstream {
            tests.extend(upstream_rows(r, kernel, name, cell, suite, &d));
        }
        if let Ok(text) = std::fs::read_to_string(d.join("summary.json")) {
            if let Ok(sj) = serde_json::from_str::<Json>(&text) {
                accel = sj.get("accel").cloned();
                for g in sj.at("guests").items() {
                    boot_s.push((
                        g.at("name").str().to_string(),
                        g.get("boot_s").cloned().unwrap_or(Json::Null),
                    ));
                }
            }
        }
        for (gname, gk) in &guest_kernel {
            if !gk.str().starts_with(&format!("{kernel}.")) {
                problems.push(format!(
                    "guest {gname} runs kernel {}, not {kernel}",
                    gk.str()
                ));
            }
        }
    }
    let wall_s = (t0.elapsed().as_secs_f64() * 10.0).round() / 10.0;
    let failed = tests.iter().any(|t| t.at("status").str() == "FAIL") || !problems.is_empty();
    let status = if failed { "FAIL" } else { "PASS" };
    for t in tests.iter().filter(|t| t.at("status").str() == "SKIP") {
        println!(
            "\n*** SKIPPED {kernel}/{name} {}: {} ***\n",
            t.at("test").str(),
            t.at("detail").str()
        );
    }
    let mut logs = Json::Null;
    if failed || r.o.keep_logs {
        logs = s(&keep_logs(r, kernel, name, &d, failed));
    }
    let _ = std::fs::remove_dir_all(&d);
    let count = |st: &str| tests.iter().filter(|t| t.at("status").str() == st).count();
    println!(
        "{status} {kernel}/{name}: {} passed, {} failed, {} skipped, wall {}s{}",
        count("PASS"),
        count("FAIL"),
        count("SKIP"),
        guest_results::pyjson::py_float(wall_s),
        if problems.is_empty() {
            String::new()
        } else {
            format!("; problems: {}", problems.join("; "))
        }
    );
    for t in &tests {
        let bw = t.at("bw");
        let bw = if bw.truthy() {
            format!(" {bw} MiB/s")
        } else {
            String::new()
        };
        let detail: String = t.at("detail").str().chars().take(200).collect();
        println!(
            "    {:4} {:16} {:>4}s{bw}  {detail}",
            t.at("status").str(),
            t.at("test").str(),
            t.at("secs").to_string()
        );
    }
    let mut rec = vec![
        ("kernel", s(kernel)),
        ("cell", s(name)),
        ("what", s(&what)),
        ("status", s(status)),
        ("wall_s", Json::Float(wall_s)),
        ("boot_s", Json::Object(boot_s)),
        ("guest_kernel", Json::Object(guest_kernel)),
        ("tests", Json::Array(tests)),
        (
            "problems",
            Json::Array(problems.iter().map(|p| s(p)).collect()),
        ),
        ("logs", logs),
        ("net", s(net)),
    ];
    rec.extend(extra);
    if let Some(a) = accel {
        rec.push(("accel", a));
    }
    Ok(obj(rec))
}

/// Echoes what a file gains (`--verbose`: run-guests' output).
struct Tail {
    path: PathBuf,
    pos: u64,
}

impl Tail {
    fn new(path: &Path) -> Tail {
        Tail {
            path: path.into(),
            pos: 0,
        }
    }

    fn echo(&mut self) {
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return;
        };
        let mut data = Vec::new();
        if f.seek(SeekFrom::Start(self.pos)).is_err() || f.read_to_end(&mut data).is_err() {
            return;
        }
        let cut = data.iter().rposition(|b| *b == b'\n').map_or(0, |p| p + 1);
        self.pos += cut as u64;
        for line in String::from_utf8_lossy(&data[..cut]).lines() {
            println!("    {line}");
        }
    }
}

/// When one guest gives up at a barrier (CI-ABORT: its peer never
/// arrived), or neither prints a line for longer than any tool timeout,
/// finds out why (`guest-runner stuck-diagnosis`: the suspects' CPU use,
/// their ports' counters, where their CPU is) and stops the guests instead
/// of waiting for the cell's whole time limit. After a barrier abort it
/// first waits `grace` s: the peer may still finish on its own.
fn stuck_watch(
    daemon_bin: &Path,
    d: &Path,
    silence: u64,
    grace: f64,
    state: Arc<Mutex<WatchState>>,
    guests_pid: u32,
) -> (Helper, Arc<Mutex<Option<String>>>) {
    let out = Arc::new(Mutex::new(None));
    let (out2, d, bin) = (out.clone(), d.to_path_buf(), daemon_bin.to_path_buf());
    let helper = Helper::spawn(move |stop| {
        let (guests, why) = loop {
            if wait_stop(&stop, 2.0) {
                return;
            }
            let st = state.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((who, label)) = &st.aborted {
                let other = if who == "a" { "b" } else { "a" };
                let why = format!("guest {other} never reached barrier '{label}' ({who} gave up)");
                drop(st);
                if wait_stop(&stop, grace) {
                    return;
                }
                break (vec![other.to_string()], why);
            }
            if st
                .last_line
                .is_some_and(|t| t.elapsed().as_secs() > silence)
            {
                let why = format!(
                    "neither guest printed a line for {silence} s (longer than any tool timeout)"
                );
                break (vec!["a".into(), "b".into()], why);
            }
        };
        let o = crate::stuck::StuckOptions {
            dir: d,
            daemon: bin,
            window: "5".into(),
            why: why.clone(),
            guests,
        };
        let diag = crate::stuck::diagnose(&o);
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let diag = if diag.trim().is_empty() {
            format!("{why}: the stuck-guest diagnosis failed")
        } else {
            diag.trim().to_string()
        };
        println!("    [host] {diag}");
        *out2.lock().unwrap_or_else(|e| e.into_inner()) = Some(diag);
        sigterm(guests_pid);
    });
    (helper, out)
}

/// `ctl status` of the cell's daemon (saved as daemon-status.json): each
/// port's error counters, and the erdma functions' RC recovery counters and
/// device errors.
fn daemon_counters(bin: &Path, d: &Path) -> Option<Json> {
    let st = ctl_json(bin, d, &["status"])?;
    write_json(&d.join("daemon-status.json"), &st);
    const KEYS: [&str; 7] = [
        "tx_frames",
        "rx_frames",
        "rx_drops",
        "rx_errors",
        "tx_errors",
        "tx_pauses",
        "ctrl_errors",
    ];
    let mut out: Vec<(String, Json)> = Vec::new();
    for p in st.at("ports").items() {
        let c = KEYS
            .iter()
            .map(|k| (k.to_string(), p.get(k).cloned().unwrap_or(Json::Null)))
            .collect();
        out.push((p.at("name").str().to_string(), Json::Object(c)));
    }
    for dev in st.at("devices").items() {
        let port = dev.get("port").map_or("?", |p| p.str()).to_string();
        let picked: Vec<(String, Json)> = dev
            .at("erdma")
            .at("counters")
            .entries()
            .iter()
            .filter(|(k, _)| {
                k.starts_with("rc_")
                    || ["dma_errors", "bad_wqes", "rx_dropped"].contains(&k.as_str())
            })
            .cloned()
            .collect();
        match out.iter_mut().find(|(n, _)| *n == port) {
            Some((_, Json::Object(c))) => {
                for (k, v) in picked {
                    match c.iter_mut().find(|(n, _)| *n == k) {
                        Some(e) => e.1 = v,
                        None => c.push((k, v)),
                    }
                }
            }
            _ => out.push((port, Json::Object(picked))),
        }
    }
    Some(Json::Object(out))
}

/// The protocol checker's view of the cell (`ctl findings` and `ctl flows`,
/// saved as checker-findings.json / checker-flows.json):
/// `{"findings": N, "rules": {rule: count}}`.
fn checker_report(bin: &Path, d: &Path) -> Option<Json> {
    let mut findings = None;
    for what in ["findings", "flows"] {
        let v = ctl_json(bin, d, &[what])?;
        write_json(&d.join(format!("checker-{what}.json")), &v);
        if what == "findings" {
            findings = Some(v);
        }
    }
    let f = findings?;
    let mut rules: Vec<(String, Json)> = Vec::new();
    for x in f.at("findings").items() {
        let rule = x.at("rule").str().to_string();
        match rules.iter_mut().find(|(r, _)| *r == rule) {
            Some((_, Json::Int(n))) => *n += 1,
            _ => rules.push((rule, Json::Int(1))),
        }
    }
    let total = f.get("total").cloned().unwrap_or(Json::Int(0));
    Some(obj(vec![
        ("findings", total),
        ("rules", Json::Object(rules)),
    ]))
}

/// The cell's rows from both guests' out.log: a test needs a CI-TEST line
/// from each role the cell names for it, any FAIL fails it, all SKIP skips
/// it; a host-side test gets a FAIL row the host rows replace.
fn guest_rows(cell: &Cell, d: &Path) -> Json {
    let tests: Vec<(String, Vec<String>)> = cell
        .tests
        .iter()
        .map(|t| {
            (
                t.0.clone(),
                t.1.iter().map(|r| role_name(*r).to_string()).collect(),
            )
        })
        .collect();
    let guests: Vec<GuestOut> = cell
        .roles()
        .iter()
        .map(|&role| {
            let name = guest(role).0;
            GuestOut {
                role: role_name(role).into(),
                name: name.into(),
                log: d.join(format!("{name}.job/out.log")),
            }
        })
        .collect();
    judge_guests(&tests, &guests)
}

/// A virtual-host cell's rows with the hosts' halves: a guest row whose
/// service's session falls short fails, naming why; `mpa-crc-negotiated`
/// counts the hosts' CRC connections. `hosts` is `ctl --json hosts` (none:
/// every such row fails).
fn virtual_host_rows(vh: &VirtualHosts, tests: Vec<Json>, hosts: Option<&Json>) -> Vec<Json> {
    let none = Json::Array(Vec::new());
    let hosts = hosts.unwrap_or(&none);
    tests
        .into_iter()
        .map(|t| {
            let test = t.at("test").str();
            if test == "mpa-crc-negotiated" {
                let (ok, detail) = vh.crc_row(hosts);
                return row(test, if ok { "PASS" } else { "FAIL" }, &detail);
            }
            let Some((why, seen)) = vh.judge(test, hosts) else {
                return t;
            };
            if t.at("status").str() == "SKIP" {
                return t;
            }
            let note = if why.is_empty() { seen } else { why.join("; ") };
            with_host_half(t, why.is_empty(), &note)
        })
        .collect()
}

/// Row `t` with the host's half of its verdict: FAIL unless the host's
/// check passed (`ok`), its `note` after the guests' detail.
pub(super) fn with_host_half(t: Json, ok: bool, note: &str) -> Json {
    let status = if ok { t.at("status").str() } else { "FAIL" }.to_string();
    let detail = format!("{}; {note}", t.at("detail").str());
    with_key(with_key(t, "status", s(&status)), "detail", s(&detail))
}

/// The host-judged rows of a cell, by test name: tshark (the capture
/// decodes as the cell's protocols), failover-evidence, checker-clean,
/// loss-evidence (every fault rule acted and the guests counted
/// retransmissions), device-trace.
#[allow(clippy::too_many_arguments)]
fn host_rows(
    r: &Run,
    name: &str,
    cell: &Cell,
    d: &Path,
    pcap: &Path,
    capped_at: Option<i128>,
    fo_out: &Path,
    checker: Option<&Json>,
    fault_list: Option<&Json>,
    extra: &[(&str, Json)],
) -> Vec<(String, Json)> {
    let vhost = r.o.net == "vhost-user";
    let mut out = Vec::new();
    if cell.capture {
        let t = if !r.o.capture {
            row("tshark", "SKIP", "--no-capture given")
        } else if !vhost {
            row("tshark", "SKIP", "--net stream: no daemon, no capture")
        } else {
            let protos: Vec<String> = cells::capture_protos(name)
                .iter()
                .map(|p| p.to_string())
                .collect();
            let mut t = tshark::tshark_row(pcap, &protos, Duration::from_secs(900));
            if let (Some(n), Json::Object(o)) = (capped_at, &mut t) {
                if let Some((_, Json::Str(det))) = o.iter_mut().find(|(k, _)| k == "detail") {
                    det.push_str(&format!(" (capture stopped at {n} records)"));
                }
            }
            t
        };
        out.push(("tshark".into(), t));
    }
    if cell.failover {
        let t = if !vhost {
            row(
                "failover-evidence",
                "SKIP",
                "--net stream: no daemon to take a link down",
            )
        } else {
            std::fs::read_to_string(fo_out)
                .map_err(|e| e.to_string())
                .and_then(|t| serde_json::from_str::<Json>(&t).map_err(|e| e.to_string()))
                .unwrap_or_else(|e| {
                    row(
                        "failover-evidence",
                        "FAIL",
                        &format!("the failover driver wrote no row: {e}"),
                    )
                })
        };
        out.push(("failover-evidence".into(), t));
    }
    if cell.checker_clean {
        out.push((
            "checker-clean".into(),
            hostrows::checker_clean(checker.unwrap_or(&Json::Null)),
        ));
    }
    if !cell.faults.is_empty() || cell.test_names().any(|t| t == "loss-evidence") {
        // the erdma functions' RC engines run in the daemon: their recovery counters are its own
        let mut cnt: Vec<(String, Json)> = extra
            .iter()
            .find(|(k, _)| *k == "counters")
            .map(|(_, v)| v.entries().to_vec())
            .unwrap_or_default();
        if let Some((_, dc)) = extra.iter().find(|(k, _)| *k == "daemon_counters") {
            for (port, c) in dc.entries() {
                if c.entries().iter().any(|(k, _)| k.starts_with("rc_")) {
                    cnt.push((format!("daemon:{port}"), c.clone()));
                }
            }
        }
        let row = hostrows::loss_evidence(fault_list.unwrap_or(&Json::Null), &Json::Object(cnt));
        out.push(("loss-evidence".into(), row));
    }
    let traces = cells::fault_traces(name);
    if !traces.is_empty() {
        let t = if vhost {
            let traces: Vec<(String, Vec<String>)> = traces
                .iter()
                .map(|(f, n)| (f.to_string(), n.iter().map(|x| x.to_string()).collect()))
                .collect();
            faults::trace_row(d, &traces)
        } else {
            row("device-trace", "SKIP", "--net stream: no daemon")
        };
        out.push(("device-trace".into(), t));
    }
    out
}

/// One row per upstream case of an `upstream` cell, judged against
/// ci/upstream/SUITE-DEVICE.expect; the table goes to the results dir as
/// upstream-KERNEL-CELL.md.
fn upstream_rows(
    r: &Run,
    kernel: &str,
    name: &str,
    cell: &Cell,
    suite: Upstream,
    d: &Path,
) -> Vec<Json> {
    let (suite, devices) = match suite {
        Upstream::RdmaCore => (Suite::RdmaCore, cell.rdma),
        Upstream::Nic => (Suite::Nic, cell.nic),
    };
    let sname = suite.name();
    let dest = r.resdir.join(format!("upstream-{kernel}-{name}.md"));
    let devices: Vec<UpstreamDevice> = BOTH
        .iter()
        .map(|&role| {
            let g = guest(role).0;
            let dev = devices.map_or("?", |x| x.of(role).name());
            UpstreamDevice {
                guest: g.into(),
                dev: dev.into(),
                log: d
                    .join(format!("{g}.job/{sname}.{}.log", role_name(role)))
                    .display()
                    .to_string(),
                cases: (suite == Suite::RdmaCore).then(|| {
                    d.join(format!("{g}.job/{sname}-cases.{}", role_name(role)))
                        .display()
                        .to_string()
                }),
            }
        })
        .collect();
    let v = judge_cell(
        suite,
        &r.root.join("ci/upstream"),
        &devices,
        &format!("{sname} tests on {kernel}/{name}"),
        &format!("ci/matrix.sh --cells {kernel}/{name}"),
    );
    let _ = std::fs::write(&dest, &v.markdown);
    for n in &v.notes {
        println!("   {n}");
    }
    let passed: Vec<String> = v
        .passed
        .iter()
        .map(|(dev, n)| format!("{dev} {n} pass"))
        .collect();
    println!(
        "   upstream {sname}: {}; table {}",
        passed.join(", "),
        dest.display()
    );
    v.rows.iter().map(row_json).collect()
}

/// Keeps a cell's logs in the results dir (failed cells, or `--keep-logs`):
/// consoles, the daemon's log and views, the jobs' dirs, and the fabric's
/// capture of a failed cell. Returns their place, relative to the results.
fn keep_logs(r: &Run, kernel: &str, name: &str, d: &Path, failed: bool) -> String {
    let rel = format!("logs/{kernel}-{name}");
    let dest = r.resdir.join(&rel);
    let _ = std::fs::remove_dir_all(&dest);
    let _ = std::fs::create_dir_all(&dest);
    let mut keep = vec![
        "a.console.log",
        "b.console.log",
        "daemon.log",
        "daemon-status.json",
        "run-guests.log",
        "summary.json",
        "stuck-flows.json",
        "a.sh",
        "b.sh",
        "a.qemu-cmd.sh",
        "b.qemu-cmd.sh",
        "faults.json",
        "daemon.toml",
        "checker-findings.json",
        "checker-flows.json",
        "ctl-broker.log",
        "device-faults.json",
        "daemon-cpu.log",
        "daemon-b.log",
    ];
    if failed {
        // the wire of a failed cell (malformed frames, a broken stream)
        keep.push("fabric.pcapng");
    }
    for f in keep {
        if d.join(f).exists() {
            let _ = std::fs::copy(d.join(f), dest.join(f));
        }
    }
    for g in ["a", "b"] {
        let jd = d.join(format!("{g}.job"));
        if jd.is_dir() {
            let _ = crate::setup::copy_tree(&jd, &dest.join(format!("{g}.job")));
        }
    }
    if failed {
        for g in ["a", "b"] {
            let cl = d.join(format!("{g}.console.log"));
            if let Ok(b) = std::fs::read(&cl) {
                println!("--- {g} console tail ({}/{g}.console.log):", dest.display());
                let text = String::from_utf8_lossy(&b);
                let lines: Vec<&str> = text.lines().collect();
                for l in &lines[lines.len().saturating_sub(30)..] {
                    println!("    {}", l.trim_end());
                }
            }
        }
    }
    rel
}

/// [`run_cell`], rerun (at most `--siw-reruns` times) while the cell fails
/// only by recognised flakes (guest-results' `flakes`: the siw
/// connection-setup races, perftest's clock calibration on a loaded host).
/// Every earlier attempt stays in the record (`reruns`) with its logs.
pub fn run_cell_with_reruns(
    r: &Run,
    kernel: &str,
    name: &str,
    work: &Path,
) -> Result<Json, Interrupted> {
    let mut reruns: Vec<Json> = Vec::new();
    loop {
        let mut res = run_cell(r, kernel, name, work)?;
        if res.at("status").str() != "FAIL" || reruns.len() >= r.o.siw_reruns {
            return Ok(with_key(res, "reruns", Json::Array(reruns)));
        }
        let Some(why) = flakes::failed_only_by_known_flakes(res.at("tests").items(), name) else {
            return Ok(with_key(res, "reruns", Json::Array(reruns)));
        };
        let n = reruns.len() + 1;
        if let Some(logs) = res
            .get("logs")
            .map(|l| l.str().to_string())
            .filter(|l| !l.is_empty())
        {
            let dst = format!("{logs}-attempt{n}");
            let _ = std::fs::remove_dir_all(r.resdir.join(&dst));
            let _ = std::fs::rename(r.resdir.join(&logs), r.resdir.join(&dst));
            res = with_key(res, "logs", s(&dst));
        }
        let failed: Vec<Json> = res
            .at("tests")
            .items()
            .iter()
            .filter(|t| t.at("status").str() == "FAIL")
            .cloned()
            .collect();
        reruns.push(obj(vec![
            ("attempt", Json::Int(n as i128)),
            ("failed", Json::Array(failed)),
            ("race", s(&why)),
            ("logs", res.get("logs").cloned().unwrap_or(Json::Null)),
            ("wall_s", res.get("wall_s").cloned().unwrap_or(Json::Null)),
        ]));
        println!(
            "\n*** RERUN {kernel}/{name}: attempt {n} failed only by a known flake ({why}); \
             rerunning the cell ({n}/{}) ***\n",
            r.o.siw_reruns
        );
        if check_signal().is_err() {
            return Err(Interrupted);
        }
    }
}

/// `rec` with `key` set (in place when it has it, else appended).
pub fn with_key(rec: Json, key: &str, v: Json) -> Json {
    let Json::Object(mut o) = rec else { return rec };
    match o.iter_mut().find(|(k, _)| k == key) {
        Some(e) => e.1 = v,
        None => o.push((key.into(), v)),
    }
    Json::Object(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The daemon of an erdma cell has a virtio-net port and an erdma
    /// function per guest, the function paired with its guest's port; a
    /// gVNIC cell's gVNIC has the cell's queues.
    #[test]
    fn a_cells_daemon_has_the_cells_ports() {
        let m = cells::cells();
        let (args, socks) = daemon_args(Path::new("/w"), &m["erdma-rxe"], BOTH, false, None);
        let ports: Vec<&String> = args.iter().skip(1).step_by(2).take(3).collect();
        assert_eq!(
            ports[0],
            "a=/w/a.sock,mac=52:54:00:77:01:0a,queues=1,form=pci"
        );
        assert_eq!(ports[1], "ar=/w/ar.sock,kind=erdma,netdev=a");
        assert_eq!(
            ports[2],
            "b=/w/b.sock,mac=52:54:00:77:01:0b,queues=1,form=pci"
        );
        assert_eq!(
            socks,
            [
                PathBuf::from("/w/a.sock"),
                "/w/ar.sock".into(),
                "/w/b.sock".into()
            ]
        );
        let (args, _) = daemon_args(Path::new("/w"), &m["gve-faults"], BOTH, false, None);
        assert!(
            args.iter()
                .any(|a| a.starts_with("ag=/w/ag.sock,kind=gve,queues=")),
            "{args:?}"
        );
        assert!(!args.iter().any(|a| a == "--config"));
    }

    /// The siw cells get the workaround first unless it is turned off;
    /// siw-conn only when it is asked for.
    #[test]
    fn the_siw_workaround_is_the_first_rule_of_the_siw_cells() {
        let m = cells::cells();
        let f = cell_faults("siw-lossy", &m["siw-lossy"], None);
        assert_eq!(f[0]["action"], "mpa-settle");
        assert_eq!(f[0]["delay-ms"], 300);
        assert_eq!(f.len(), m["siw-lossy"].faults.len() + 1);
        assert!(cell_faults("siw", &m["siw"], Some(0)).is_empty());
        assert!(cell_faults("siw-conn", &m["siw-conn"], None).is_empty());
        assert_eq!(
            cell_faults("siw-conn", &m["siw-conn"], Some(50))[0]["delay-ms"],
            50
        );
        assert!(cell_faults("rxe", &m["rxe"], None).is_empty());
        let toml = fault_toml(&f[..1]);
        assert!(
            toml.starts_with("[[fault]]\n") && toml.contains("action = \"mpa-settle\"\n"),
            "{toml}"
        );
    }

    /// A job script names the guest, its peer and the cell, exports the
    /// cell's environment (quoted) and calls the cell's function.
    #[test]
    fn a_job_script_carries_the_cells_environment() {
        let m = cells::cells();
        let env = vec![
            ("CI_SMC_BYTES".to_string(), "64M".to_string()),
            ("CI_EMPTY".into(), String::new()),
        ];
        let j = job_script(Role::Client, "erdma-rxe", &m["erdma-rxe"], "7.3", &env);
        assert!(
            j.starts_with("ROLE=client SELF=10.77.0.2 PEER=10.77.0.1 CELL=7.3/erdma-rxe\n"),
            "{j}"
        );
        assert!(j.contains("CI_SMC_BYTES=64M; export CI_SMC_BYTES\n"));
        assert!(j.contains("CI_RDMA=rxe; export CI_RDMA\n"));
        assert!(j.contains("CI_NOUEID_CODE=0x03030008;"));
        assert!(!j.contains("CI_EMPTY"));
        assert!(j.ends_with(&format!("{}\nexit 0\n", m["erdma-rxe"].call)));
    }

    /// A barrier abort makes the watch diagnose the other guest and stop
    /// the guests' runner; a cell that ends first is left alone.
    #[test]
    fn a_barrier_abort_is_diagnosed_and_stops_the_guests() {
        let dir = crate::paths::tests::TempDir::new();
        let d = PathBuf::from(dir.path(""));
        std::fs::write(
            d.join("a.console.log"),
            "CI-ABORT barrier label=stream-start\n",
        )
        .unwrap();
        let state = Arc::new(Mutex::new(WatchState::default()));
        let mut watch = ConsoleWatch {
            d: d.clone(),
            verbose: false,
            pos: [0, 0],
            state: state.clone(),
        };
        watch.poll();
        assert_eq!(
            state.lock().unwrap().aborted,
            Some(("a".to_string(), "stream-start".to_string()))
        );
        let mut guests = Command::new("sleep").arg("60").spawn().unwrap();
        let bin = Path::new("/nonexistent/vhost-rdma");
        let (mut h, out) = stuck_watch(bin, &d, 3600, 0.0, state, guests.id());
        let t0 = Instant::now();
        while out.lock().unwrap().is_none() && t0.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(100));
        }
        h.stop();
        let diag = out.lock().unwrap().clone().unwrap_or_default();
        assert!(
            diag.contains("guest b never reached barrier 'stream-start' (a gave up)"),
            "{diag}"
        );
        assert!(
            !guests.wait().unwrap().success(),
            "the guests' runner was stopped"
        );
        // a cell that ends before anything is seen: no diagnosis
        let quiet = Arc::new(Mutex::new(WatchState {
            last_line: Some(Instant::now()),
            aborted: None,
        }));
        let (mut h, out) = stuck_watch(bin, &d, 3600, 0.0, quiet, u32::MAX);
        h.stop();
        assert!(out.lock().unwrap().is_none());
    }

    /// A record's key is replaced where it is, or appended.
    #[test]
    fn with_key_keeps_the_records_order() {
        let r = obj(vec![("a", Json::Int(1)), ("b", Json::Int(2))]);
        let r = with_key(with_key(r, "a", Json::Int(3)), "c", Json::Null);
        let keys: Vec<&str> = r.entries().iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c"]);
        assert_eq!(r.at("a"), &Json::Int(3));
    }
}
