//! `guest-runner boot` (scripts/run-guests): boots N QEMU guests, each
//! running one job, and returns the combined result.
//!
//! Per guest NAME the log directory gets `NAME.job/` (9p tag `job`: `run.sh`,
//! the guest's `out.log`), `NAME.console.log`, `NAME.qemu.log` (QEMU's
//! stderr), `NAME.qemu-cmd.sh`, with `--monitor` `NAME.mon`, and after a
//! retried early panic `NAME.console.panic.log`; the run adds `summary.json`
//! and, when it probes KVM, `kvm-probe/`.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::options::BootOptions;
use crate::paths::{abspath, local_time, mkdtemp, which};
use crate::qemu::{
    build_qemu_cmd, fmt_cmd, has_device, msix_off, qemu_version, GuestDirs, Machine, Version,
};
use crate::spec::{default_stream_links, parse_guest_spec, GuestSpec, NicSpec, Role};
use crate::{console, kernel, log, Error};

/// Seconds the KVM probe guest gets to boot and report.
pub const PROBE_TIMEOUT: f64 = 20.0;
/// A TCG guest's kernel can panic in its first milliseconds (seen once in
/// 7.3's IOAPIC setup, mask_ioapic_irq, at 0.016 s), before any of our
/// devices is touched. Such a guest is booted once more; anything later, or a
/// second panic, is a failure.
pub const BOOT_RETRIES: u32 = 1;
// ------------------------------------------------------------------ signals

static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
}

pub(crate) fn install_signal_handlers() {
    for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe {
            libc::signal(s, on_signal as *const () as libc::sighandler_t);
        }
    }
}

/// `Err(Interrupted)` once SIGINT, SIGTERM or SIGHUP arrived.
pub(crate) fn check_signal() -> Result<(), Error> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => Ok(()),
        libc::SIGINT => Err(Error::Interrupted("SIGINT")),
        libc::SIGHUP => Err(Error::Interrupted("SIGHUP")),
        _ => Err(Error::Interrupted("SIGTERM")),
    }
}

fn sleep_s(s: f64) {
    std::thread::sleep(Duration::from_secs_f64(s));
}

// ------------------------------------------------------------------ guests

/// A guest's state from the runner's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Not started.
    Pending,
    /// QEMU runs.
    Running,
    /// Reported VR-RESULT (rc says how the job went).
    Done,
    /// No VR-RESULT within its timeout.
    Timeout,
    /// QEMU exited without VR-RESULT.
    Crash,
    /// Stopped by the runner (another guest failed, a signal, a setup error).
    Killed,
}

impl Status {
    fn name(self) -> &'static str {
        match self {
            Status::Pending => "PENDING",
            Status::Running => "RUNNING",
            Status::Done => "DONE",
            Status::Timeout => "TIMEOUT",
            Status::Crash => "CRASH",
            Status::Killed => "KILLED",
        }
    }
}

/// What the console reader saw.
#[derive(Debug, Default)]
struct Console {
    tail: Vec<String>,
    booted: Option<Instant>,
    rc: Option<i64>,
    result_at: Option<Instant>,
}

/// The console state, also after a panic on the reader thread: what it
/// recorded until then is still the best account of the guest.
fn lock(con: &Mutex<Console>) -> MutexGuard<'_, Console> {
    con.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Guest {
    spec: GuestSpec,
    child: Option<Child>,
    qemu_cmd: Vec<String>,
    console_path: String,
    stderr_path: String,
    monitor_path: Option<String>,
    job_dir: String,
    t_start: Option<Instant>,
    con: Arc<Mutex<Console>>,
    status: Status,
    detail: String,
    reader: Option<JoinHandle<()>>,
    exit_deadline: Option<Instant>,
    boot_retries: u32,
}

impl Guest {
    fn new(spec: GuestSpec, dir: &str) -> Self {
        let name = spec.name.clone();
        Guest {
            spec,
            child: None,
            qemu_cmd: vec![],
            console_path: format!("{dir}/{name}.console.log"),
            stderr_path: format!("{dir}/{name}.qemu.log"),
            monitor_path: None,
            job_dir: String::new(),
            t_start: None,
            con: Arc::default(),
            status: Status::Pending,
            detail: String::new(),
            reader: None,
            exit_deadline: None,
            boot_retries: 0,
        }
    }

    fn finished(&self) -> bool {
        !matches!(self.status, Status::Pending | Status::Running)
    }

    fn rc(&self) -> Option<i64> {
        lock(&self.con).rc
    }

    fn ok(&self) -> bool {
        self.status == Status::Done && self.rc() == Some(0)
    }

    fn rc_text(&self) -> String {
        self.rc().map_or("None".into(), |r| r.to_string())
    }

    /// The last `n` non-blank lines of QEMU's stderr.
    fn stderr_tail(&self, n: usize) -> Vec<String> {
        let Ok(b) = fs::read(&self.stderr_path) else {
            return vec![];
        };
        let text = String::from_utf8_lossy(&b);
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(n)..]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    /// Starts QEMU `cmd` with the console on its stdout.
    fn start(&mut self, cmd: Vec<String>) -> Result<(), Error> {
        let dir = Path::new(&self.console_path)
            .parent()
            .unwrap_or(Path::new("."));
        let setup = |e: std::io::Error| Error::Setup(format!("guest {}: {e}", self.spec.name));
        fs::write(
            dir.join(format!("{}.qemu-cmd.sh", self.spec.name)),
            format!("#!/bin/sh\n{}\n", fmt_cmd(&cmd)),
        )
        .map_err(setup)?;
        File::create(&self.console_path).map_err(setup)?;
        let errf = File::create(&self.stderr_path).map_err(setup)?;
        let mut c = Command::new(&cmd[0]);
        c.args(&cmd[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(errf);
        // SAFETY: setsid and prctl are async-signal-safe; nothing else runs
        // between fork and exec.
        unsafe {
            c.pre_exec(|| {
                libc::setsid();
                // die with SIGKILL when the runner (this thread) dies
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        self.t_start = Some(Instant::now());
        let mut child = c
            .spawn()
            .map_err(|e| Error::Setup(format!("cannot start {}: {e}", cmd[0])))?;
        let out = child.stdout.take().expect("piped stdout");
        self.child = Some(child);
        self.qemu_cmd = cmd;
        self.status = Status::Running;
        self.con = Arc::default();
        let con = Arc::clone(&self.con);
        let path = self.console_path.clone();
        self.reader = Some(std::thread::spawn(move || read_console(out, &path, &con)));
        Ok(())
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    fn kill(&mut self, grace: f64) {
        if let Some(c) = self.child.as_mut() {
            kill_proc(c, grace);
        }
    }

    fn join_reader(&mut self) {
        let t0 = Instant::now();
        while self.reader.as_ref().is_some_and(|r| !r.is_finished())
            && t0.elapsed() < Duration::from_secs(2)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        if self.reader.as_ref().is_some_and(JoinHandle::is_finished) {
            let _ = self.reader.take().map(JoinHandle::join);
        }
    }

    /// Advances the guest's state; true when it just finished.
    fn poll(&mut self, now: Instant, timeout: f64) -> bool {
        if self.finished() {
            return false;
        }
        let Some(child) = self.child.as_mut() else {
            return false;
        };
        if let Ok(Some(st)) = child.try_wait() {
            use std::os::unix::process::ExitStatusExt;
            let code = st.code().unwrap_or_else(|| -st.signal().unwrap_or(0));
            self.join_reader();
            if self.rc().is_some() {
                self.status = Status::Done;
            } else {
                self.status = Status::Crash;
                let err = self.stderr_tail(5);
                self.detail = format!("QEMU exited with status {code} and no VR-RESULT");
                if !err.is_empty() {
                    self.detail += &format!(": {}", err.join(" | "));
                }
            }
            return true;
        }
        if self.rc().is_some() {
            // result printed; the guest powers off by itself, give it a moment
            match self.exit_deadline {
                None => self.exit_deadline = Some(now + Duration::from_secs(10)),
                Some(d) if now > d => {
                    self.kill(3.0);
                    self.status = Status::Done;
                    return true;
                }
                Some(_) => {}
            }
            return false;
        }
        if self
            .t_start
            .is_some_and(|t| now.duration_since(t).as_secs_f64() > timeout)
        {
            self.kill(3.0);
            self.join_reader();
            self.status = Status::Timeout;
            let booted = lock(&self.con).booted.is_some();
            self.detail = format!(
                "no VR-RESULT after {timeout:.0} s{}",
                if booted {
                    ""
                } else {
                    " (never printed VR-BOOTED)"
                }
            );
            return true;
        }
        false
    }

    /// Whether QEMU exited after a kernel panic before the guest booted.
    fn early_panic(&self) -> bool {
        let con = lock(&self.con);
        self.status == Status::Crash
            && con.booted.is_none()
            && con.tail.iter().any(|l| l.contains("Kernel panic"))
    }

    /// Boots a guest that panicked before booting once more, keeping the
    /// panicked console as NAME.console.panic.log.
    fn boot_again(&mut self) -> Result<(), Error> {
        self.boot_retries += 1;
        let mut kept = self
            .console_path
            .replace(".console.log", ".console.panic.log");
        if fs::rename(&self.console_path, &kept).is_err() {
            kept = self.console_path.clone();
        }
        log(format!(
            "{}: kernel panic before VR-BOOTED ({kept}): booting it again (a TCG early-boot flake, retry {} of {BOOT_RETRIES})",
            self.spec.name, self.boot_retries
        ));
        self.exit_deadline = None;
        self.detail.clear();
        self.start(self.qemu_cmd.clone())
    }
}

fn read_console(out: std::process::ChildStdout, path: &str, con: &Mutex<Console>) {
    let mut file = OpenOptions::new().append(true).create(true).open(path).ok();
    let mut r = BufReader::new(out);
    let mut line = Vec::new();
    while matches!(r.read_until(b'\n', &mut line), Ok(n) if n > 0) {
        if let Some(f) = file.as_mut() {
            let _ = f.write_all(&line);
        }
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        let mut c = lock(con);
        c.tail.push(String::from_utf8_lossy(text).into_owned());
        if c.tail.len() > 200 {
            c.tail.drain(..100);
        }
        if c.booted.is_none() && console::is_booted(text) {
            c.booted = Some(Instant::now());
        }
        if c.rc.is_none() {
            if let Some(rc) = console::result_rc(text) {
                c.rc = Some(rc);
                c.result_at = Some(Instant::now());
            }
        }
        line.clear();
    }
}

/// Waits for `child` (a `guest-runner boot` of a cell or the demo), calling
/// `tick` every `period`: its exit code, or `None` when SIGINT, SIGTERM or
/// SIGHUP came first (the child is then stopped: it stops its QEMUs).
pub(crate) fn wait_guests(
    child: &mut Child,
    period: Duration,
    mut tick: impl FnMut(),
) -> Option<i32> {
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st.code().unwrap_or(-1));
        }
        if check_signal().is_err() {
            kill_proc(child, 20.0);
            let _ = child.wait();
            return None;
        }
        tick();
        std::thread::sleep(period);
    }
}

/// Stops a QEMU and its session: SIGTERM, after `grace` seconds SIGKILL.
pub(crate) fn kill_proc(c: &mut Child, grace: f64) {
    if !matches!(c.try_wait(), Ok(None)) {
        return;
    }
    let pid = c.id() as libc::pid_t;
    let signal = |sig| {
        // SAFETY: plain syscalls on the child's pid / process group.
        unsafe {
            if libc::killpg(pid, sig) != 0 {
                libc::kill(pid, sig);
            }
        }
    };
    let wait = |c: &mut Child, secs: f64| {
        let t0 = Instant::now();
        while t0.elapsed().as_secs_f64() < secs {
            if !matches!(c.try_wait(), Ok(None)) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    };
    signal(libc::SIGTERM);
    if !wait(c, grace) {
        signal(libc::SIGKILL);
        wait(c, 5.0);
    }
}

fn wait_for_path(path: &str, secs: f64, mut alive: impl FnMut() -> bool) -> Result<bool, Error> {
    let t0 = Instant::now();
    while !Path::new(path).exists() {
        check_signal()?;
        if !alive() || t0.elapsed().as_secs_f64() > secs {
            return Ok(false);
        }
        sleep_s(0.05);
    }
    Ok(true)
}

fn fmt_s(a: Option<Instant>, b: Option<Instant>) -> String {
    match (a, b) {
        (Some(a), Some(b)) => format!("{:.1}", b.duration_since(a).as_secs_f64()),
        _ => "-".into(),
    }
}

fn round2(a: Option<Instant>, b: Option<Instant>) -> Option<f64> {
    Some((b?.duration_since(a?).as_secs_f64() * 100.0).round() / 100.0)
}

// ------------------------------------------------------------------ accel probe

/// The KVM probe's verdict, cached in `$VHOST_RDMA_CACHE/accel-probe.json`
/// (default `~/.cache/vhost-rdma`) under `"KERNEL_RELEASE|QEMU_VERSION_LINE"`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Verdict {
    /// `kvm` or `tcg`.
    pub accel: String,
    /// Why.
    pub reason: String,
    /// When the probe ran (local time).
    #[serde(default)]
    pub when: Option<String>,
}

/// The cache directory (`$VHOST_RDMA_CACHE` or `~/.cache/vhost-rdma`).
pub fn cache_dir() -> String {
    match std::env::var("VHOST_RDMA_CACHE") {
        Ok(d) if !d.is_empty() => d,
        _ => format!(
            "{}/.cache/vhost-rdma",
            std::env::var("HOME").unwrap_or_else(|_| "/".into())
        ),
    }
}

fn probe_cache_path() -> String {
    format!("{}/accel-probe.json", cache_dir())
}

/// The probe cache's key for this host kernel and QEMU.
pub fn probe_cache_key(qemu_line: &str) -> String {
    // SAFETY: uname fills the struct; its fields are NUL-terminated.
    let release = unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        libc::uname(&mut u);
        std::ffi::CStr::from_ptr(u.release.as_ptr())
            .to_string_lossy()
            .into_owned()
    };
    format!("{release}|{qemu_line}")
}

fn load_probe_cache() -> BTreeMap<String, serde_json::Value> {
    fs::read(probe_cache_path())
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

fn save_probe_cache(key: &str, v: &Verdict) -> std::io::Result<()> {
    let mut data = load_probe_cache();
    data.insert(key.into(), serde_json::to_value(v)?);
    fs::create_dir_all(cache_dir())?;
    let tmp = format!("{}.{}", probe_cache_path(), std::process::id());
    write_json(&tmp, &data)?;
    fs::rename(&tmp, probe_cache_path())
}

/// `value` as JSON with one-space indentation.
fn write_json(path: &str, value: &impl serde::Serialize) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(
        &mut buf,
        serde_json::ser::PrettyFormatter::with_indent(b" "),
    );
    value.serialize(&mut ser)?;
    fs::write(path, buf)
}

// ------------------------------------------------------------------ the run

#[derive(serde::Serialize)]
struct GuestSummary<'a> {
    name: &'a str,
    status: &'a str,
    rc: Option<i64>,
    detail: &'a str,
    boot_s: Option<f64>,
    run_s: Option<f64>,
    console: &'a str,
    job_dir: &'a str,
}

#[derive(serde::Serialize)]
struct Summary<'a> {
    accel: &'a str,
    logdir: &'a str,
    guests: Vec<GuestSummary<'a>>,
}

struct Runner<'a> {
    o: &'a BootOptions,
    m: Machine<'a>,
    qline: String,
    logdir: String,
    guests: Vec<Guest>,
    probe: Option<Guest>,
    accel: String,
}

impl Runner<'_> {
    fn net_of<'g>(&'g self, g: &'g GuestSpec) -> &'g str {
        g.opts.net.as_deref().unwrap_or(&self.o.net)
    }

    fn cmd_of(
        &self,
        g: &Guest,
        accel: &str,
        guest_bin: Option<&str>,
    ) -> Result<Vec<String>, Error> {
        let dirs = GuestDirs {
            job_dir: &g.job_dir,
            monitor: g.monitor_path.as_deref(),
            guest_bin,
        };
        build_qemu_cmd(&g.spec, dirs, accel, &self.m)
    }

    fn cleanup(&mut self) {
        for g in self.guests.iter_mut().chain(self.probe.as_mut()) {
            g.kill(2.0);
        }
    }

    /// Boots a tiny guest under KVM whose run.sh exits 0: (ok, reason).
    fn probe_kvm(&mut self) -> Result<(bool, String), Error> {
        if !Path::new("/dev/kvm").exists() {
            return Ok((false, "no /dev/kvm".into()));
        }
        // SAFETY: access reads a NUL-terminated path.
        if unsafe { libc::access(c"/dev/kvm".as_ptr(), libc::R_OK | libc::W_OK) } != 0 {
            return Ok((false, "/dev/kvm not accessible (permissions)".into()));
        }
        let pdir = format!("{}/kvm-probe", self.logdir);
        let spec = GuestSpec {
            name: "kvmprobe".into(),
            cmd_file: None,
            nics: vec![NicSpec::default()],
            opts: crate::spec::GuestOpts {
                net: Some("none".into()),
                mem: Some(256),
                ..Default::default()
            },
        };
        let mut g = Guest::new(spec, &pdir);
        g.job_dir = format!("{pdir}/job");
        fs::create_dir_all(&g.job_dir)
            .and_then(|_| fs::write(format!("{}/run.sh", g.job_dir), "exit 0\n"))
            .map_err(|e| Error::Usage(format!("{pdir}: {e}")))?;
        let cmd = self.cmd_of(&g, "kvm", None)?;
        g.start(cmd)?;
        let t0 = Instant::now();
        let g = self.probe.insert(g);
        while !g.finished() {
            check_signal()?;
            g.poll(Instant::now(), PROBE_TIMEOUT);
            sleep_s(0.1);
        }
        let dt = t0.elapsed().as_secs_f64();
        if g.ok() {
            return Ok((
                true,
                format!("KVM probe guest booted and exited rc=0 in {dt:.1} s"),
            ));
        }
        let err = g.stderr_tail(3).join(" | ");
        let why = match ["KVM internal error", "emulation failure"]
            .iter()
            .filter_map(|m| err.find(m))
            .min()
        {
            Some(at) => err[at..].split('|').next().unwrap_or("").trim().to_string(),
            None if g.status == Status::Timeout => format!(
                "probe guest did not finish within {PROBE_TIMEOUT:.0} s{}",
                if lock(&g.con).booted.is_some() {
                    ""
                } else {
                    ", never reached VR-BOOTED"
                }
            ),
            None => format!("{} {}", g.status.name(), g.detail),
        };
        Ok((false, format!("KVM probe failed: {why}")))
    }

    fn choose_accel(&mut self) -> Result<(String, String), Error> {
        if self.o.accel != "auto" {
            return Ok((self.o.accel.clone(), "requested with --accel".into()));
        }
        let key = probe_cache_key(&self.qline);
        if !self.o.reprobe {
            if let Some(v) = load_probe_cache()
                .get(&key)
                .and_then(|v| serde_json::from_value::<Verdict>(v.clone()).ok())
            {
                let when = v.when.as_deref().unwrap_or("?");
                let why = format!(
                    "cached probe verdict ({}, {when}): {}",
                    probe_cache_path(),
                    v.reason
                );
                return Ok((v.accel, why));
            }
        }
        if self.o.dry_run {
            return Ok(("tcg".into(), "dry run: no probe (assuming tcg)".into()));
        }
        log(format!(
            "probing KVM (tiny guest, up to {PROBE_TIMEOUT:.0} s) ..."
        ));
        let (ok, reason) = self.probe_kvm()?;
        let v = Verdict {
            accel: if ok { "kvm" } else { "tcg" }.into(),
            reason: reason.clone(),
            when: Some(local_time()),
        };
        if let Err(e) = save_probe_cache(&key, &v) {
            log(format!("warning: cannot write probe cache: {e}"));
        }
        Ok((
            v.accel,
            reason + if ok { "" } else { "; falling back to TCG" },
        ))
    }

    /// Everything after the log directory exists; `Ok(Some(code))` for a
    /// run that ends without guests (--probe-only, --dry-run).
    fn main_phase(&mut self) -> Result<Option<i32>, Error> {
        let o = self.o;
        if o.probe_only {
            let (accel, why) = self.choose_accel()?;
            log(format!("accel: {accel} ({why})"));
            println!("{accel}");
            return Ok(Some(0));
        }
        if o.guest.is_empty() {
            return Err(Error::Usage("no --guest given".into()));
        }
        let mut specs: Vec<GuestSpec> = vec![];
        for (i, s) in o.guest.iter().enumerate() {
            let g = parse_guest_spec(s, i)?;
            if specs.iter().any(|x| x.name == g.name) {
                return Err(Error::Usage(format!("duplicate guest name {}", g.name)));
            }
            specs.push(g);
        }
        default_stream_links(&mut specs, &o.net, &self.logdir)?;
        let uses_testdev = specs.iter().any(|g| {
            self.net_of(g) == "vhost-user" && g.opts.form.as_deref().unwrap_or(&o.form) == "testdev"
        });
        if uses_testdev {
            if self.m.qver < (10, 2, 0) {
                return Err(Error::Usage(format!(
                    "--form testdev needs QEMU >= 10.2; {} is {}",
                    o.qemu, self.qline
                )));
            }
            if !o.dry_run && !has_device(&o.qemu, "vhost-user-test-device-pci") {
                return Err(Error::Usage(format!(
                    "{} has no vhost-user-test-device-pci device",
                    o.qemu
                )));
            }
        }
        for spec in specs {
            let mut g = Guest::new(spec, &self.logdir);
            let name = g.spec.name.clone();
            g.job_dir = format!("{}/{name}.job", self.logdir);
            let io = |e: std::io::Error| Error::Usage(format!("guest {name}: {}: {e}", g.job_dir));
            fs::create_dir_all(&g.job_dir).map_err(io)?;
            let dst = format!("{}/run.sh", g.job_dir);
            match &g.spec.cmd_file {
                Some(f) if !Path::new(f).is_file() => {
                    return Err(Error::Usage(format!(
                        "guest {name}: cmd file {f} not found"
                    )));
                }
                Some(f) => fs::copy(f, &dst).map(|_| ()).map_err(io)?,
                None => fs::write(&dst, "echo no command given; exit 0\n").map_err(io)?,
            }
            let _ = fs::remove_file(format!("{}/out.log", g.job_dir));
            if o.monitor {
                g.monitor_path = Some(format!("{}/{name}.mon", self.logdir));
            }
            self.guests.push(g);
        }
        let (accel, why) = self.choose_accel()?;
        self.accel = accel.clone();
        log(format!("accel: {accel} ({why})"));
        log(format!(
            "qemu: {} ({}); logdir: {}",
            o.qemu, self.qline, self.logdir
        ));
        let pci_vhost = self.guests.iter().any(|g| {
            self.net_of(&g.spec) == "vhost-user"
                && g.spec.opts.form.as_deref().unwrap_or(&o.form) == "pci"
        });
        if o.msix == "auto" && msix_off(&o.msix, &accel, self.m.qver) && pci_vhost {
            log("note: virtio-net-pci gets vectors=0 (INTx): QEMU < 8 under TCG segfaults in vhost_net_start \
                 with MSI-X (--msix on to force it)");
        }
        if o.dry_run {
            for g in &self.guests {
                let cmd = self.cmd_of(g, &accel, o.guest_bin.as_deref())?;
                println!("# guest {}", g.spec.name);
                println!("{}", fmt_cmd(&cmd));
            }
            return Ok(Some(0));
        }
        self.run_guests()?;
        Ok(None)
    }

    fn run_guests(&mut self) -> Result<(), Error> {
        let o = self.o;
        let is_server = |g: &Guest| {
            g.spec
                .nics
                .iter()
                .any(|n| n.stream.as_ref().is_some_and(|s| s.role == Role::Server))
        };
        // stream servers first (they create the socket the clients connect to)
        let mut order: Vec<usize> = (0..self.guests.len())
            .filter(|&i| is_server(&self.guests[i]))
            .collect();
        order.extend((0..self.guests.len()).filter(|&i| !is_server(&self.guests[i])));
        for g in self.guests.iter().filter(|g| is_server(g)) {
            for s in g
                .spec
                .nics
                .iter()
                .filter_map(|n| n.stream.as_ref())
                .filter(|s| s.role == Role::Server)
            {
                let _ = fs::remove_file(&s.path);
            }
        }
        for &i in &order {
            check_signal()?;
            // vhost-user sockets are created by the daemon, stream sockets by
            // the server guest: wait for them
            let g = &self.guests[i];
            let name = g.spec.name.clone();
            let vhost = self.net_of(&g.spec) == "vhost-user";
            let waits: Vec<(String, Option<Option<usize>>)> = g
                .spec
                .nics
                .iter()
                .flat_map(|n| {
                    let sock = n
                        .sock
                        .clone()
                        .filter(|_| vhost && n.stream.is_none())
                        .map(|p| (p, None));
                    let client = n
                        .stream
                        .clone()
                        .filter(|s| s.role == Role::Client)
                        .map(|s| {
                            let server = self.guests.iter().position(|x| {
                                x.spec.nics.iter().any(|m| {
                                    m.stream
                                        .as_ref()
                                        .is_some_and(|t| t.role == Role::Server && t.path == s.path)
                                })
                            });
                            (s.path, Some(server))
                        });
                    sock.into_iter().chain(client)
                })
                .collect();
            for (path, stream_server) in waits {
                let Some(server) = stream_server else {
                    if !wait_for_path(&path, o.sock_wait, || true)? {
                        return Err(Error::Setup(format!(
                            "guest {name}: vhost-user socket {path} did not appear within {:?} s (is the daemon running?)",
                            o.sock_wait
                        )));
                    }
                    continue;
                };
                let guests = &mut self.guests;
                let alive = || {
                    server.is_none_or(|j| {
                        guests[j]
                            .child
                            .as_mut()
                            .is_none_or(|c| matches!(c.try_wait(), Ok(None)))
                    })
                };
                if !wait_for_path(&path, 30.0, alive)? {
                    return Err(Error::Setup(format!(
                        "guest {name}: stream socket {path} did not appear (server guest failed to start? see its .qemu.log)"
                    )));
                }
            }
            let cmd = self.cmd_of(&self.guests[i], &self.accel, o.guest_bin.as_deref())?;
            let g = &mut self.guests[i];
            g.start(cmd)?;
            log(format!(
                "started {} (pid {}), console: {}",
                g.spec.name,
                g.pid(),
                g.console_path
            ));
        }
        let mut failed_first: Option<usize> = None;
        loop {
            check_signal()?;
            let now = Instant::now();
            for i in 0..self.guests.len() {
                let g = &mut self.guests[i];
                let timeout = g.spec.opts.timeout.map_or(o.timeout, |t| t as f64);
                if !g.poll(now, timeout) {
                    continue;
                }
                if g.early_panic() && g.boot_retries < BOOT_RETRIES {
                    g.boot_again()?;
                    continue;
                }
                if o.verbose || !g.ok() {
                    log(format!(
                        "{}: {} rc={} {}",
                        g.spec.name,
                        g.status.name(),
                        g.rc_text(),
                        g.detail
                    ));
                } else {
                    log(format!("{}: rc={}", g.spec.name, g.rc_text()));
                }
                if !g.ok() && failed_first.is_none() {
                    failed_first = Some(i);
                }
            }
            if self.guests.iter().all(Guest::finished) {
                return Ok(());
            }
            if let (Some(f), false) = (failed_first, o.no_fail_fast) {
                let why = format!(
                    "stopped because {} failed ({})",
                    self.guests[f].spec.name,
                    self.guests[f].status.name()
                );
                for g in self.guests.iter_mut().filter(|g| !g.finished()) {
                    g.kill(3.0);
                    g.status = Status::Killed;
                    g.detail = why.clone();
                }
                return Ok(());
            }
            sleep_s(0.1);
        }
    }

    /// The per-guest table, the failures' console and stderr tails, summary.json.
    fn summary(&self) {
        let mut rows: Vec<[String; 6]> =
            vec![["guest", "accel", "boot_s", "run_s", "rc", "status"].map(String::from)];
        for g in &self.guests {
            let c = lock(&g.con);
            let status = match g.status {
                Status::Done if c.rc == Some(0) => "ok",
                Status::Done => "FAIL",
                s => s.name(),
            };
            rows.push([
                g.spec.name.clone(),
                self.accel.clone(),
                fmt_s(g.t_start, c.booted),
                fmt_s(c.booted, c.result_at),
                c.rc.map_or("-".into(), |r| r.to_string()),
                status.into(),
            ]);
        }
        let w: Vec<usize> = (0..6)
            .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for (i, r) in rows.iter().enumerate() {
            let line: Vec<String> = r.iter().zip(&w).map(|(c, &w)| format!("{c:<w$}")).collect();
            out += line.join("  ").trim_end();
            out += "\n";
            if i == 0 {
                out += &w
                    .iter()
                    .map(|&w| "-".repeat(w))
                    .collect::<Vec<_>>()
                    .join("  ");
                out += "\n";
            }
        }
        for g in self.guests.iter().filter(|g| !g.ok()) {
            let st = if g.status == Status::Done {
                format!("FAIL rc={}", g.rc_text())
            } else {
                g.status.name().into()
            };
            let detail = if g.detail.is_empty() {
                String::new()
            } else {
                format!(": {}", g.detail)
            };
            out += &format!(
                "--- {}: {st}{detail}\n--- last console lines ({}):\n",
                g.spec.name, g.console_path
            );
            let c = lock(&g.con);
            let n = if self.o.tail == 0 {
                c.tail.len()
            } else {
                self.o.tail.min(c.tail.len())
            };
            for l in &c.tail[c.tail.len() - n..] {
                out += &format!("    {l}\n");
            }
            let err = g.stderr_tail(5);
            if !err.is_empty() {
                out += &format!("--- QEMU stderr ({}):\n", g.stderr_path);
                for l in err {
                    out += &format!("    {l}\n");
                }
            }
        }
        print!("{out}");
        let _ = std::io::stdout().flush();
        let guests = self
            .guests
            .iter()
            .map(|g| {
                let c = lock(&g.con);
                GuestSummary {
                    name: &g.spec.name,
                    status: g.status.name(),
                    rc: c.rc,
                    detail: &g.detail,
                    boot_s: round2(g.t_start, c.booted),
                    run_s: round2(c.booted, c.result_at),
                    console: &g.console_path,
                    job_dir: &g.job_dir,
                }
            })
            .collect();
        let s = Summary {
            accel: &self.accel,
            logdir: &self.logdir,
            guests,
        };
        if let Err(e) = write_json(&format!("{}/summary.json", self.logdir), &s) {
            log(format!("warning: cannot write summary.json: {e}"));
        }
    }
}

/// Runs `guest-runner boot` with options `o`; returns the exit status: 0
/// when every guest reported rc=0, 1 when one did not, 2 on a usage or setup
/// error, 130 after SIGINT, SIGTERM or SIGHUP (its QEMUs are stopped).
pub fn run(o: BootOptions) -> i32 {
    match run_inner(o) {
        Ok(code) => code,
        Err(e) => {
            log(format!("error: {e}"));
            2
        }
    }
}

fn run_inner(mut o: BootOptions) -> Result<i32, Error> {
    let kernel = o
        .kernel
        .clone()
        .filter(|k| !k.is_empty())
        .or_else(|| o.image.as_ref().map(|i| format!("{i}/bzImage")));
    let rootfs = o
        .rootfs
        .clone()
        .filter(|k| !k.is_empty())
        .or_else(|| o.image.as_ref().map(|i| format!("{i}/rootfs.ext4")));
    let (Some(kernel), Some(rootfs)) = (kernel, rootfs) else {
        return Err(Error::Usage(
            "give --image DIR or --kernel and --rootfs".into(),
        ));
    };
    let byo = o.kernel.as_ref().is_some_and(|k| !k.is_empty());
    let kversion = kernel::check_bzimage(&kernel).map_err(|e| {
        let how = if byo {
            " (--kernel)".into()
        } else {
            format!(" (--image {})", o.image.as_deref().unwrap_or("None"))
        };
        Error::Usage(format!("{e}{how}"))
    })?;
    if !Path::new(&rootfs).is_file() {
        return Err(Error::Usage(format!("rootfs {rootfs} not found")));
    }
    let (kernel, rootfs) = (abspath(&kernel), abspath(&rootfs));
    if byo {
        log(format!("kernel: {kernel} ({kversion})"));
        for w in kernel::warnings_for(&kernel) {
            log(format!("warning: {w}"));
        }
    }
    let initrd = o.initrd.as_deref().filter(|i| !i.is_empty()).map(abspath);
    if let Some(b) = o.guest_bin.as_deref().filter(|b| !b.is_empty()) {
        if !Path::new(b).is_dir() {
            return Err(Error::Usage(format!("--guest-bin {b} is not a directory")));
        }
        o.guest_bin = Some(abspath(b));
    } else {
        o.guest_bin = None;
    }
    o.qemu = which(&o.qemu).ok_or_else(|| Error::Usage(format!("QEMU {} not found", o.qemu)))?;
    let (qver, qline): (Version, String) = qemu_version(&o.qemu)?;
    let logdir = match o.logdir.as_deref().filter(|l| !l.is_empty()) {
        Some(l) => {
            let l = abspath(l);
            fs::create_dir_all(&l).map_err(|e| Error::Usage(format!("--logdir {l}: {e}")))?;
            l
        }
        None => mkdtemp("run-guests.")
            .map_err(|e| Error::Usage(format!("cannot make a log directory: {e}")))?,
    };
    install_signal_handlers();
    let m = Machine {
        opts: &o,
        kernel,
        rootfs,
        initrd,
        qver,
    };
    let mut r = Runner {
        o: &o,
        m,
        qline,
        logdir,
        guests: vec![],
        probe: None,
        accel: "?".into(),
    };
    let res = r.main_phase();
    let started = |r: &mut Runner, why: &str| {
        for g in r
            .guests
            .iter_mut()
            .filter(|g| g.child.is_some() && !g.finished())
        {
            g.status = Status::Killed;
            g.detail = why.into();
        }
        r.guests.iter().any(|g| g.child.is_some())
    };
    match res {
        Ok(Some(code)) => {
            r.cleanup();
            Ok(code)
        }
        Ok(None) => {
            r.cleanup();
            r.summary();
            let ok = r.guests.iter().all(Guest::ok);
            println!(
                "RUN-GUESTS {} logdir={}",
                if ok { "OK" } else { "FAILED" },
                r.logdir
            );
            Ok(if ok { 0 } else { 1 })
        }
        Err(Error::Setup(e)) => {
            r.cleanup();
            log(format!("error: {e}"));
            if started(&mut r, "setup error") {
                r.summary();
            }
            Ok(2)
        }
        Err(Error::Interrupted(sig)) => {
            log(format!("interrupted ({sig}); stopping guests"));
            r.cleanup();
            started(&mut r, &format!("interrupted by {sig}"));
            r.summary();
            Ok(130)
        }
        Err(e) => {
            log(format!("error: {e}"));
            r.cleanup();
            Ok(2)
        }
    }
}
