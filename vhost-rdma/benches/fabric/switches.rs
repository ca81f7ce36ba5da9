//! The two switches under comparison, each a separate process whose CPU time
//! (user + system of every thread, `/proc/PID/stat`) is read around the
//! timed loop: the `vhost-rdma serve` daemon, and `dpdk-testpmd` with two
//! `net_vhost` ports in io forwarding mode.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// User + system CPU time of process `pid` (all its threads), in ns.
pub fn cpu_ns(pid: u32) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after "(comm)": state is field 3, utime 14, stime 15.
    let rest = &s[s.rfind(')').context("malformed stat")? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>()? + f[12].parse::<u64>()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(ticks * 1_000_000_000 / hz)
}

/// Context switches (voluntary + involuntary) of the live threads of `pid`.
pub fn ctx_switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|s| {
            s.lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// The number of threads of `pid`.
pub fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

/// The state letter of process `pid` (`R`, `S`, `T`, ...).
fn proc_state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s[s.rfind(')')? + 2..].chars().next()
}

/// A running switch with two vhost-user sockets (port 0 and port 1).
pub struct Switch {
    pub name: &'static str,
    pub sockets: [PathBuf; 2],
    /// MACs to address port 1 from port 0 (dst, src); irrelevant to testpmd.
    pub macs: ([u8; 6], [u8; 6]),
    child: Child,
    stdin: Option<ChildStdin>,
    log: PathBuf,
    /// testpmd: remove its EAL runtime directory after it exits.
    eal_prefix: bool,
    stopped: bool,
}

impl Switch {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn cpu_ns(&self) -> Result<u64> {
        cpu_ns(self.pid())
    }

    /// Freezes the switch (SIGSTOP) so that a polling switch takes no CPU
    /// while the other one is measured; waits until it is stopped.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
        let t = Instant::now() + Duration::from_secs(2);
        while Instant::now() < t && proc_state(self.pid()) != Some('T') {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Lets a paused switch run again (SIGCONT).
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, sig: libc::c_int) {
        if !self.stopped {
            // SAFETY: signalling our own child, which we have not reaped.
            unsafe { libc::kill(self.pid() as libc::pid_t, sig) };
        }
    }

    /// The last lines of the switch's output, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    /// Waits until both sockets exist (the switch listens).
    fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while !self.sockets.iter().all(|s| s.exists()) {
            if let Some(st) = self.child.try_wait()? {
                bail!(
                    "{} exited ({st}) before listening:\n{}",
                    self.name,
                    self.log_tail(30)
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} did not create its sockets in {timeout:?}:\n{}",
                    self.name,
                    self.log_tail(30)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Stops the switch (newline on stdin for testpmd, SIGTERM, SIGKILL as
    /// a last resort) and reaps it. Also done on drop.
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        // SAFETY: signalling our own child, which we have not reaped.
        unsafe { libc::kill(self.pid() as libc::pid_t, libc::SIGCONT) };
        if let Some(mut i) = self.stdin.take() {
            let _ = i.write_all(b"\n");
        }
        let pid = self.pid() as libc::pid_t;
        'outer: for (sig, wait) in [(0, 3000u64), (libc::SIGTERM, 3000), (libc::SIGKILL, 3000)] {
            if sig != 0 {
                // SAFETY: signalling our own child, which we have not reaped.
                unsafe { libc::kill(pid, sig) };
            }
            let t = Instant::now() + Duration::from_millis(wait);
            while Instant::now() < t {
                if let Ok(Some(_)) = self.child.try_wait() {
                    break 'outer;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.wait();
        if self.eal_prefix {
            remove_runtime_dir();
        }
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        self.stop();
    }
}

fn log_tail(p: &Path, lines: usize) -> String {
    let s = std::fs::read_to_string(p).unwrap_or_default();
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

fn mac_str(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// `vhost-rdma serve` with ports a and b in `dir`.
/// The CPU a switch forwards on when it is given one: the last, where
/// testpmd's forwarding lcore polls (`-l 0,LAST`) and where the daemon is
/// pinned with `--cpu-affinity`.
pub fn forwarding_cpu() -> usize {
    let ncpu = std::thread::available_parallelism().map_or(2, |n| n.get());
    ncpu.max(2) - 1
}

/// Starts `vhost-rdma serve` with two ports, its threads pinned to `cpu`
/// (`--cpu-affinity`) when given.
pub fn start_daemon(bin: &Path, dir: &Path, cpu: Option<usize>) -> Result<Switch> {
    let (ma, mb) = (
        [0x52, 0x54, 0, 0x13, 0, 0x0a],
        [0x52, 0x54, 0, 0x13, 0, 0x0b],
    );
    let sockets = [dir.join("ours-a.sock"), dir.join("ours-b.sock")];
    let log = dir.join("daemon.log");
    let out = std::fs::File::create(&log)?;
    let mut cmd = Command::new(bin);
    cmd.arg("serve");
    if let Some(c) = cpu {
        cmd.arg("--cpu-affinity").arg(c.to_string());
    }
    let child = cmd
        .arg("--port")
        .arg(format!("a={},mac={}", sockets[0].display(), mac_str(ma)))
        .arg("--port")
        .arg(format!("b={},mac={}", sockets[1].display(), mac_str(mb)))
        .arg("--control")
        .arg(dir.join("ctl.sock"))
        .arg("--capture-dir")
        .arg(dir)
        .env(
            "VHOST_RDMA_LOG",
            std::env::var("VHOST_RDMA_LOG").unwrap_or("warn".into()),
        )
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut s = Switch {
        name: "vhost-rdma serve",
        sockets,
        macs: (mb, ma),
        child,
        stdin: None,
        log,
        eal_prefix: false,
        stopped: false,
    };
    s.wait_ready(Duration::from_secs(10))?;
    Ok(s)
}

/// The dpdk-testpmd to use: `$DPDK_TESTPMD`, else `dpdk-testpmd` on PATH.
pub fn find_testpmd() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DPDK_TESTPMD") {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("dpdk-testpmd"))
            .find(|p| p.is_file())
    })
}

/// The testpmd command line (EAL options, then `--`, then testpmd's), for
/// the report: `sock0`/`sock1` are the two vhost-user sockets.
pub fn testpmd_args(sock0: &Path, sock1: &Path) -> Vec<String> {
    // Main lcore 0 (sleeps in read(2) waiting for Enter) and one forwarding
    // lcore, the last CPU, which busy-polls both ports.
    let lcores = format!("0,{}", forwarding_cpu());
    [
        "-l",
        &lcores,
        "--no-huge",
        "-m",
        "512",
        "--no-pci",
        // --in-memory conflicts with --no-huge (legacy memory); no shared
        // config instead, under a prefix of our own that stop() removes.
        "--no-shconf",
        "--no-telemetry",
        &format!("--file-prefix={}", file_prefix()),
        "--vdev",
        &format!("net_vhost0,iface={},queues=1", sock0.display()),
        "--vdev",
        &format!("net_vhost1,iface={},queues=1", sock1.display()),
        "--",
        "--nb-cores=1",
        "--rxq=1",
        "--txq=1",
        "--forward-mode=io",
        "--auto-start",
        "--total-num-mbufs=32768",
        "--no-mlockall",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// testpmd's EAL file prefix (a directory in /var/run/dpdk or
/// $XDG_RUNTIME_DIR/dpdk, removed when the switch stops).
fn file_prefix() -> String {
    format!("vhost-rdma-bench-{}", std::process::id())
}

fn remove_runtime_dir() {
    let p = file_prefix();
    let mut dirs = vec![PathBuf::from("/var/run/dpdk").join(&p)];
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR") {
        dirs.push(PathBuf::from(x).join("dpdk").join(&p));
    }
    for d in dirs {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// dpdk-testpmd as a vhost-user switch between two net_vhost ports (the
/// sockets are testpmd's: it is the vhost-user backend, the benchmark's
/// guests connect to it).
pub fn start_testpmd(bin: &Path, dir: &Path) -> Result<Switch> {
    let sockets = [dir.join("dpdk0.sock"), dir.join("dpdk1.sock")];
    let log = dir.join("testpmd.log");
    let out = std::fs::File::create(&log)?;
    let mut child = Command::new(bin)
        .args(testpmd_args(&sockets[0], &sockets[1]))
        .stdin(Stdio::piped())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let stdin = child.stdin.take();
    let mut s = Switch {
        name: "dpdk-testpmd",
        sockets,
        macs: ([0x02, 0, 0, 0, 0, 0x01], [0x02, 0, 0, 0, 0, 0x02]),
        child,
        stdin,
        log,
        eal_prefix: true,
        stopped: false,
    };
    s.wait_ready(Duration::from_secs(30))?;
    Ok(s)
}

/// The DPDK version the dpkg database knows (Debian's package), if any.
pub fn dpdk_version() -> String {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", "dpdk-dev"])
        .output()
        .ok()
        .filter(|o| o.status.success() && !o.stdout.is_empty())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_else(|| "unknown".into())
}

/// `nproc`, the CPU model and the kernel, for the report.
pub fn machine() -> String {
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown".to_string(), |(_, m)| m.trim().to_string());
    let online = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mem_kb: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    format!(
        "nproc {nproc} ({online} online), CPU \"{model}\", {} GiB RAM, Linux {}",
        (mem_kb + (1 << 19)) >> 20,
        kernel.trim()
    )
}
