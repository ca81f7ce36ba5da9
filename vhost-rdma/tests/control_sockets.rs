//! Two daemons started at the same instant without a control path, as
//! e2e-style scripts and systemd template units start them: both must run,
//! each with a control socket of its own, and `ctl` without a path must not
//! talk to one of them by guessing; it lists both and says how to choose.
//! The same with both sharing `$VHOST_RDMA_CONTROL`: one gets it, the other
//! its own socket. Each pair of the real binary is released by one write to
//! a pipe both children wait on just before exec; each case goes on until
//! 50 pairs left that gate within the same millisecond (every pair is
//! checked, those further apart just do not count). A temporary runtime
//! directory (`XDG_RUNTIME_DIR`) keeps the tests away from /run.

mod common;

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Pairs that must leave the start gate within 1 ms of each other.
const PAIRS: usize = 50;
/// Pairs tried at most to get there: on a busy machine the scheduler may
/// run one child of a pair later than the other.
const MAX_TRIES: usize = 20 * PAIRS;

/// The two cases take turns: four daemons starting on two cores would
/// rarely start in the same millisecond.
static ONE_CASE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The two daemons' port names, one port each: what tells them apart in
/// `ctl status`.
const PORTS: [&str; 2] = ["a", "b"];

/// `vhost-rdma` with runtime directory `run` and nothing from the caller's
/// environment that would choose a control socket.
fn bin(run: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vhost-rdma"));
    c.env_remove("VHOST_RDMA_CONTROL")
        .env("XDG_RUNTIME_DIR", run)
        .env("NO_COLOR", "1");
    c
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`, which we then own.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(r, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just created and are owned by no one else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Reads exactly `buf.len()` bytes from `fd`, waiting at most 20 s.
fn read_within(fd: &OwnedFd, buf: &mut [u8]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "children did not reach the start gate");
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut p, 1, left.as_millis() as libc::c_int) } <= 0 {
            continue;
        }
        // SAFETY: reads into the unfilled rest of `buf`.
        let n = unsafe {
            libc::read(
                fd.as_raw_fd(),
                buf[got..].as_mut_ptr().cast(),
                buf.len() - got,
            )
        };
        assert!(n > 0, "start gate pipe closed");
        got += n as usize;
    }
}

/// Spawns both commands so that they exec at the same instant: each child,
/// between fork and exec, says it is ready and blocks reading a gate pipe;
/// once both are ready one write of two bytes opens the gate for both.
/// Returns the children and how far apart (ns) they left the gate.
fn spawn_together(mut cmds: [Command; 2]) -> ([Child; 2], u64) {
    let (ready_r, ready_w) = pipe();
    let (go_r, go_w) = pipe();
    let (left_r, left_w) = pipe();
    let (ready_w, go_r, left_w) = (ready_w.as_raw_fd(), go_r.as_raw_fd(), left_w.as_raw_fd());
    for cmd in &mut cmds {
        // SAFETY: only write, read and clock_gettime (async-signal-safe)
        // run between fork and exec, on descriptors the child inherited.
        unsafe {
            cmd.pre_exec(move || {
                let mut b = [0u8; 1];
                if libc::write(ready_w, b"r".as_ptr().cast(), 1) != 1
                    || libc::read(go_r, b.as_mut_ptr().cast(), 1) != 1
                {
                    return Err(std::io::Error::last_os_error());
                }
                let mut t: libc::timespec = std::mem::zeroed();
                libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t);
                let ns = (t.tv_sec as u64) * 1_000_000_000 + t.tv_nsec as u64;
                libc::write(left_w, ns.to_ne_bytes().as_ptr().cast(), 8);
                Ok(())
            });
        }
    }
    // spawn returns only once the child has exec'd, so each waits in a
    // thread of its own while this one opens the gate.
    let children = std::thread::scope(|s| {
        let spawned: Vec<_> = cmds
            .iter_mut()
            .map(|c| s.spawn(move || c.spawn()))
            .collect();
        read_within(&ready_r, &mut [0; 2]);
        // SAFETY: writes two bytes from a valid buffer.
        let n = unsafe { libc::write(go_w.as_raw_fd(), b"gg".as_ptr().cast(), 2) };
        assert_eq!(n, 2, "opening the start gate");
        spawned
            .into_iter()
            .map(|t| t.join().unwrap().expect("spawning vhost-rdma serve"))
            .collect::<Vec<_>>()
    });
    let mut times = [0u8; 16];
    read_within(&left_r, &mut times);
    let t0 = u64::from_ne_bytes(times[..8].try_into().unwrap());
    let t1 = u64::from_ne_bytes(times[8..].try_into().unwrap());
    let children: [Child; 2] = children.try_into().unwrap();
    (children, t0.abs_diff(t1))
}

/// Two daemons of one run, with their logs.
struct Pair {
    children: [Child; 2],
    logs: [PathBuf; 2],
}

impl Pair {
    fn log(&self, i: usize) -> String {
        std::fs::read_to_string(&self.logs[i]).unwrap_or_default()
    }

    fn pid(&self, i: usize) -> u32 {
        self.children[i].id()
    }

    /// Waits until both daemons have started (logged their port ready);
    /// fails if one exits.
    fn wait_started(&mut self) {
        let t0 = Instant::now();
        let mut started = [false; 2];
        while !started.iter().all(|s| *s) {
            for (i, started) in started.iter_mut().enumerate() {
                if let Some(st) = self.children[i].try_wait().unwrap() {
                    let log = self.log(i);
                    self.stop();
                    panic!("daemon {i} exited ({st}) while starting beside another:\n{log}");
                }
                *started = self.log(i).contains("port ready");
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "daemons did not start:\n{}\n{}",
                self.log(0),
                self.log(1)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn stop(&mut self) {
        for c in &self.children {
            // SAFETY: SIGTERM to our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        }
        for c in &mut self.children {
            let t0 = Instant::now();
            while c.try_wait().unwrap().is_none() {
                if t0.elapsed() > Duration::from_secs(10) {
                    let _ = c.kill();
                    let _ = c.wait();
                    panic!("daemon alive 10 s after SIGTERM");
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// Starts daemons `a` and `b` (one port each, sockets in `dir`, runtime
/// directory `run`) at the same instant, `env` added to both.
fn start_pair(dir: &Path, run: &Path, n: usize, env: &[(&str, &Path)]) -> (Pair, u64) {
    let logs = PORTS.map(|p| dir.join(format!("{p}{n}.log")));
    let cmds = [0, 1].map(|i| {
        let mut c = bin(run);
        c.envs(env.iter().copied())
            .arg("serve")
            .arg("--port")
            .arg(format!(
                "{}={}",
                PORTS[i],
                dir.join(format!("{}{n}.sock", PORTS[i])).display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&logs[i]).unwrap());
        c
    });
    let (children, apart) = spawn_together(cmds);
    let mut pair = Pair { children, logs };
    pair.wait_started();
    (pair, apart)
}

fn ctl(run: &Path, env: &[(&str, &Path)], args: &[&str]) -> Output {
    bin(run)
        .envs(env.iter().copied())
        .arg("ctl")
        .args(args)
        .output()
        .unwrap()
}

/// The port names of `ctl status --json`'s answer; fails if `ctl` fails.
fn status_ports(o: &Output, what: &str) -> Vec<String> {
    assert!(
        o.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect()
}

/// Every daemon answers `ctl --pid` with its own ports.
fn each_reachable_by_pid(pair: &Pair, run: &Path, env: &[(&str, &Path)]) {
    for (i, port) in PORTS.iter().enumerate() {
        let pid = pair.pid(i).to_string();
        let o = ctl(run, env, &["status", "--json", "--pid", &pid]);
        assert_eq!(
            status_ports(&o, &format!("ctl --pid {pid}")),
            [*port],
            "ctl --pid {pid} reached another daemon"
        );
    }
}

/// What is left in the runtime directory's per-daemon socket directory.
fn leftover_sockets(run: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(run.join("vhost-rdma/ctl"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect()
}

/// Runs `case` on fresh pairs until [`PAIRS`] of them left the start gate
/// within 1 ms of each other; fails if that takes more than [`MAX_TRIES`].
fn until_enough_simultaneous(name: &str, mut case: impl FnMut(usize) -> u64) {
    let _turn = ONE_CASE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut simultaneous = 0;
    let mut tries = 0;
    while simultaneous < PAIRS {
        assert!(
            tries < MAX_TRIES,
            "{name}: only {simultaneous} of {tries} pairs left the start gate within 1 ms \
             of each other (machine too busy to test a simultaneous start)"
        );
        if case(tries) < 1_000_000 {
            simultaneous += 1;
        }
        tries += 1;
    }
    eprintln!("{name}: {tries} pairs checked, {simultaneous} of them started within 1 ms");
}

#[test]
fn two_daemons_started_together_both_run_and_ctl_does_not_guess() {
    let dir = common::TempDir::new("ctl-race");
    until_enough_simultaneous("own control sockets", |n| {
        let run = dir.path().join(format!("run{n}"));
        let (mut pair, apart) = start_pair(dir.path(), &run, n, &[]);
        // No flag: two daemons, so no guess; both listed, with how to choose.
        let o = ctl(&run, &[], &["status"]);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(
            o.status.code(),
            Some(1),
            "pair {n}: ctl status with two daemons running answered by itself:\n{}{err}",
            String::from_utf8_lossy(&o.stdout)
        );
        assert!(err.contains("2 vhost-rdma daemons are running"), "{err}");
        assert!(err.contains("--pid PID or --control PATH"), "{err}");
        assert_eq!(err.lines().count(), 1, "not one line: {err}");
        for (i, port) in PORTS.iter().enumerate() {
            let daemon = format!("pid {} (--control ", pair.pid(i));
            assert!(
                err.contains(&daemon),
                "pair {n}: {daemon:?} not listed: {err}"
            );
            assert!(err.contains(&format!(", ports {port})")), "{err}");
        }
        each_reachable_by_pid(&pair, &run, &[]);
        pair.stop();
        assert_eq!(leftover_sockets(&run), Vec::<PathBuf>::new(), "pair {n}");
        // One daemon left: ctl needs no flag.
        if n == 0 {
            let (mut pair, _) = start_pair(dir.path(), &run, MAX_TRIES, &[]);
            pair.children[1].kill().unwrap();
            pair.children[1].wait().unwrap();
            let o = ctl(&run, &[], &["status", "--json"]);
            assert_eq!(status_ports(&o, "ctl status, one daemon"), ["a"]);
            pair.children[0].kill().unwrap();
            pair.children[0].wait().unwrap();
        }
        apart
    });
}

#[test]
fn two_daemons_sharing_vhost_rdma_control_both_run() {
    let dir = common::TempDir::new("ctl-race-env");
    until_enough_simultaneous("shared $VHOST_RDMA_CONTROL", |n| {
        let run = dir.path().join(format!("run{n}"));
        let shared = dir.path().join(format!("shared{n}.sock"));
        let env = [("VHOST_RDMA_CONTROL", shared.as_path())];
        let (mut pair, apart) = start_pair(dir.path(), &run, n, &env);
        // $VHOST_RDMA_CONTROL names one daemon's socket: ctl talks to it.
        let o = ctl(&run, &env, &["status", "--json"]);
        let owner = status_ports(&o, "ctl status with $VHOST_RDMA_CONTROL");
        let owner = PORTS
            .iter()
            .position(|p| owner == [*p])
            .unwrap_or_else(|| panic!("pair {n}: shared socket answers with {owner:?}"));
        let other = 1 - owner;
        let warned = pair.log(other);
        assert!(
            warned.contains("another process serves the shared control socket"),
            "pair {n}: no warning from the daemon that did not get the shared socket:\n{warned}"
        );
        assert!(
            !pair.log(owner).contains("another process serves"),
            "pair {n}"
        );
        each_reachable_by_pid(&pair, &run, &env);
        pair.stop();
        assert!(!shared.exists(), "pair {n}: shared socket left behind");
        assert_eq!(leftover_sockets(&run), Vec::<PathBuf>::new(), "pair {n}");
        apart
    });
}
