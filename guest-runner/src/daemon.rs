//! The vhost-rdma daemon as the guest tests run it: started with its ports,
//! asked over its control socket, stopped with SIGTERM, its log searched
//! for panics.

use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::qemu::{run_with_timeout, Output};

/// How long a `ctl` request may take before it counts as failed.
pub const CTL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the daemon may take to create its sockets.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A running `vhost-rdma serve`.
pub struct Daemon {
    child: Child,
    binary: PathBuf,
    control: PathBuf,
    log: PathBuf,
}

impl Daemon {
    /// Starts `BINARY serve ARGS` (output to `log`, `NO_COLOR=1`) and waits
    /// until every path in `sockets` exists; an error says why it did not
    /// come up (the daemon is then stopped).
    ///
    /// With `netns`, inside that network namespace (`ip netns exec`): its
    /// sockets are files, so QEMU and `ctl` reach it from the host's
    /// namespace.
    pub fn start(
        netns: Option<&str>,
        binary: &Path,
        args: &[String],
        control: &Path,
        sockets: &[PathBuf],
        log: &Path,
    ) -> anyhow::Result<Self> {
        let out = File::create(log).map_err(|e| anyhow::anyhow!("{}: {e}", log.display()))?;
        let err = out
            .try_clone()
            .map_err(|e| anyhow::anyhow!("{}: {e}", log.display()))?;
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(binary);
                c
            }
            None => Command::new(binary),
        };
        let child = cmd
            .arg("serve")
            .args(args)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| anyhow::anyhow!("cannot start {}: {e}", binary.display()))?;
        let mut d = Daemon {
            child,
            binary: binary.into(),
            control: control.into(),
            log: log.into(),
        };
        let t0 = Instant::now();
        while t0.elapsed() < START_TIMEOUT {
            if sockets.iter().all(|s| s.exists()) {
                return Ok(d);
            }
            if d.exit_code().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        d.stop(Duration::from_secs(10));
        Err(anyhow::anyhow!(
            "the daemon did not create its sockets (see {})",
            log.display()
        ))
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `None` while it runs, else its exit code (a signal as its negated
    /// number).
    pub fn exit_code(&mut self) -> Option<i32> {
        match self.child.try_wait() {
            Ok(Some(st)) => Some(st.code().unwrap_or_else(|| -st.signal().unwrap_or(0))),
            Ok(None) => None,
            Err(_) => Some(-1),
        }
    }

    /// `BINARY ctl --control SOCKET ARGS`; a request that cannot run or
    /// outlives [`CTL_TIMEOUT`] comes back with code -1 and the reason in
    /// `stderr`.
    pub fn ctl(&self, args: &[&str]) -> Output {
        ctl(&self.binary, &self.control, args, CTL_TIMEOUT)
    }

    /// SIGTERM, then SIGKILL after `grace`: `None`, or what went wrong (a
    /// non-zero exit, no exit within the grace).
    pub fn stop(&mut self, grace: Duration) -> Option<String> {
        if let Some(code) = self.exit_code() {
            return (code != 0).then(|| format!("daemon exited with {code} during the run"));
        }
        // SAFETY: a plain kill(2) of our own child's pid.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let t0 = Instant::now();
        while t0.elapsed() < grace {
            if let Some(code) = self.exit_code() {
                return (code != 0).then(|| format!("daemon exited {code} on SIGTERM"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        Some(format!(
            "daemon did not stop within {} s of SIGTERM",
            grace.as_secs()
        ))
    }

    /// Whether the daemon's log shows a panic.
    pub fn panicked(&self) -> bool {
        std::fs::read(&self.log)
            .map(|b| String::from_utf8_lossy(&b).contains("panicked"))
            .unwrap_or(false)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.exit_code().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `BINARY ctl --control CONTROL ARGS` against a daemon the caller did not
/// start (a matrix cell's); a request that cannot run or outlives `timeout`
/// comes back with code -1 and the reason in `stderr`.
pub fn ctl(binary: &Path, control: &Path, args: &[&str], timeout: Duration) -> Output {
    let mut cmd = Command::new(binary);
    cmd.arg("ctl").arg("--control").arg(control).args(args);
    run_with_timeout(&mut cmd, timeout).unwrap_or_else(|| Output {
        code: -1,
        stdout: String::new(),
        stderr: format!(
            "ctl {} did not answer within {} s",
            args.join(" "),
            timeout.as_secs()
        ),
    })
}

/// [`ctl`] with `--json`: the reply, when the request succeeded, as any
/// JSON type (`serde_json::Value`, or guest-results' `Json`, which keeps
/// the daemon's key order).
pub fn ctl_json<T: serde::de::DeserializeOwned>(
    binary: &Path,
    control: &Path,
    args: &[&str],
    timeout: Duration,
) -> Option<T> {
    let args: Vec<&str> = std::iter::once("--json")
        .chain(args.iter().copied())
        .collect();
    let out = ctl(binary, control, &args, timeout);
    (out.code == 0)
        .then(|| serde_json::from_str(&out.stdout).ok())
        .flatten()
}
