//! The `vhost-rdma` binary as a user runs it: flags anywhere on the `ctl`
//! line, the control socket from the environment, one-line errors with exit
//! status 1, sockets a live daemon serves left alone, prompt shutdown.

mod common;

use common::{ctl, daemon_cmd};

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Starts `serve` with one port and a control socket in `dir`; waits until
/// the control socket answers.
fn serve(dir: &Path, port_sock: &str) -> Child {
    serve_with(dir, port_sock, &[])
}

/// [`serve`] with `extra` arguments.
fn serve_with(dir: &Path, port_sock: &str, extra: &[&str]) -> Child {
    let mut child = daemon_cmd()
        .arg("serve")
        .args(extra)
        .arg("--port")
        .arg(format!("a={}", dir.join(port_sock).display()))
        .arg("--control")
        .arg(dir.join("ctl.sock"))
        .arg("--capture-dir")
        .arg(dir)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        let o = ctl(dir, &["status"]);
        if o.status.success() {
            return child;
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("serve exited early: {st}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("daemon did not answer on its control socket");
}

fn stop(mut child: Child) -> Duration {
    common::terminate(&mut child, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("daemon still alive 10 s after SIGTERM"))
}

#[test]
fn json_and_control_anywhere_and_from_the_environment() {
    let dir = common::TempDir::new("cli-json");
    let d = serve(dir.path(), "a.sock");
    for args in [
        &["status", "--json"][..],
        &["--json", "status"],
        &["capture", "status", "--json"],
        &["faults", "list", "--json"],
        &["rss", "--port", "a", "--json"],
    ] {
        let o = ctl(dir.path(), args);
        assert!(
            o.status.success(),
            "ctl {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("ctl {args:?} printed no JSON ({e})"));
        assert!(v.is_object(), "ctl {args:?}: {v}");
    }
    // --control after the subcommand wins over the environment.
    let o = daemon_cmd()
        .args(["ctl", "status", "--control"])
        .arg(dir.path().join("ctl.sock"))
        .env("VHOST_RDMA_CONTROL", "/nonexistent/ctl.sock")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    stop(d);
}

#[test]
fn user_errors_are_one_line_and_exit_1_even_with_backtraces_on() {
    let o = daemon_cmd()
        .args(["ctl", "--control", "/nonexistent/ctl.sock", "status"])
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("vhost-rdma: ") && err.contains("/nonexistent/ctl.sock"),
        "{err}"
    );
    assert!(!err.contains("backtrace"), "{err}");
}

#[test]
fn a_live_daemons_socket_is_not_taken_over_and_shutdown_is_prompt() {
    let dir = common::TempDir::new("cli-takeover");
    let first = serve(dir.path(), "a.sock");
    // A second daemon on the same port socket refuses to start.
    let o = daemon_cmd()
        .args(["serve", "--port"])
        .arg(format!("a={}", dir.path().join("a.sock").display()))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not taking it over"), "{err}");
    assert!(
        ctl(dir.path(), &["status"]).status.success(),
        "first daemon disturbed"
    );
    // Whatever happens to its paths, SIGTERM ends the daemon promptly, and
    // it removes only sockets that are still its own.
    std::fs::remove_file(dir.path().join("a.sock")).unwrap();
    std::fs::write(dir.path().join("a.sock"), b"someone else's").unwrap();
    let took = stop(first);
    assert!(took < Duration::from_secs(2), "shutdown took {took:?}");
    assert_eq!(
        std::fs::read(dir.path().join("a.sock")).unwrap(),
        b"someone else's"
    );
    assert!(
        !dir.path().join("ctl.sock").exists(),
        "own control socket left behind"
    );
}

#[test]
fn logs_to_a_pipe_are_plain_text() {
    let dir = common::TempDir::new("cli-logs");
    let mut d = serve(dir.path(), "a.sock");
    let mut stderr = d.stderr.take().unwrap();
    stop(d);
    let mut log = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut log).unwrap();
    assert!(log.contains("listening"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "terminal escapes in a piped log: {log:?}"
    );
}

/// Waits until `ctl status --json` (control socket `ctl_sock`) answers.
fn wait_status(child: &mut Child, ctl_sock: &Path) -> serde_json::Value {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        let o = daemon_cmd()
            .args(["ctl", "status", "--json", "--control"])
            .arg(ctl_sock)
            .output()
            .unwrap();
        if o.status.success() {
            return serde_json::from_slice(&o.stdout).unwrap();
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("serve exited early: {st}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    panic!("daemon did not answer on {}", ctl_sock.display());
}

/// Whether `ctl status` shows port `name` with a guest connected.
fn connected(ctl_sock: &Path, name: &str) -> bool {
    let o = daemon_cmd()
        .args(["ctl", "status", "--json", "--control"])
        .arg(ctl_sock)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    v["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|p| p["name"] == name && p["connected"] == true)
}

/// A listening socket at `path` that a child gets as descriptor 3, as QEMU
/// (`--fd`) or systemd (socket activation) would pass it.
fn with_fd3(cmd: &mut Command, listener: &std::os::unix::net::UnixListener) {
    use std::os::unix::io::AsRawFd;
    use std::os::unix::process::CommandExt;
    let fd = listener.as_raw_fd();
    // SAFETY: only dup2 and fcntl (async-signal-safe) run between fork and
    // exec. dup2 clears close-on-exec on its copy; when the listener already
    // is descriptor 3, dup2 does nothing and fcntl clears the flag.
    unsafe {
        cmd.pre_exec(move || {
            let r = if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 3)
            };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[test]
fn print_capabilities_is_qemus_json() {
    let o = daemon_cmd().arg("--print-capabilities").output().unwrap();
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["type"], "net");
    assert!(v["features"].is_array(), "{v}");
}

#[test]
fn socket_path_serves_one_port_and_ctl_finds_the_default_control_socket() {
    let dir = common::TempDir::new("cli-sockpath");
    // The runtime directory decides where `serve` puts its own control
    // socket and where `ctl` looks for it.
    let run = dir.path().join("run");
    let sock = dir.path().join("vm.sock");
    let mut d = daemon_cmd()
        .arg("--socket-path")
        .arg(&sock)
        .args(["--socket-mode", "0660"])
        .env("XDG_RUNTIME_DIR", &run)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ctl_sock = run.join(format!("vhost-rdma/ctl/{}.sock", d.id()));
    wait_status(&mut d, &ctl_sock);
    let o = daemon_cmd()
        .args(["ctl", "status", "--json"])
        .env("XDG_RUNTIME_DIR", &run)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ports"][0]["name"], "net0", "{v}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);
    let _g = common::TestGuest::connect(&sock, 1, common::feat::MINIMAL).unwrap();
    assert!(connected(&ctl_sock, "net0"));
    stop(d);
    assert!(!sock.exists() && !ctl_sock.exists(), "sockets left behind");
}

#[test]
fn an_inherited_fd_is_served_and_left_to_its_owner() {
    let dir = common::TempDir::new("cli-fd");
    let sock = dir.path().join("qemu-made.sock");
    let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let ctl_sock = dir.path().join("ctl.sock");
    let mut cmd = daemon_cmd();
    cmd.args(["--fd", "3", "--control"])
        .arg(&ctl_sock)
        .stderr(Stdio::null());
    with_fd3(&mut cmd, &l);
    let mut d = cmd.spawn().unwrap();
    let v = wait_status(&mut d, &ctl_sock);
    assert_eq!(v["ports"][0]["socket"], sock.display().to_string(), "{v}");
    let g = common::TestGuest::connect(&sock, 1, common::feat::MINIMAL).unwrap();
    assert!(connected(&ctl_sock, "net0"));
    drop(g);
    let took = stop(d);
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    // The path is the caller's, and the socket still listens for the next
    // daemon (no shutdown(2) on a shared listener).
    assert!(sock.exists());
    l.set_nonblocking(true).unwrap();
    let _c = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    assert!(l.accept().is_ok(), "the inherited listener was shut down");
}

#[test]
fn systemd_socket_activation_gives_named_ports_their_sockets() {
    let dir = common::TempDir::new("cli-activation");
    let sock = dir.path().join("systemd-made.sock");
    let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let ctl_sock = dir.path().join("ctl.sock");
    // LISTEN_PID must be the daemon's pid: a shell exports its own and
    // execs the daemon, keeping that pid.
    let mut cmd = Command::new("sh");
    cmd.env_remove("VHOST_RDMA_CONTROL")
        .arg("-c")
        .arg("export LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=b; exec \"$@\"")
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_vhost-rdma"))
        .args(["serve", "--port"])
        .arg(format!("a={}", dir.path().join("a.sock").display()))
        .arg("--port")
        .arg(format!("b={}", dir.path().join("unused.sock").display()))
        .arg("--control")
        .arg(&ctl_sock)
        .stderr(Stdio::null());
    with_fd3(&mut cmd, &l);
    let mut d = cmd.spawn().unwrap();
    let v = wait_status(&mut d, &ctl_sock);
    let b = v["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "b")
        .unwrap()
        .clone();
    assert_eq!(b["socket"], sock.display().to_string(), "{v}");
    assert!(!dir.path().join("unused.sock").exists());
    assert!(dir.path().join("a.sock").exists(), "port a not bound");
    let _g = common::TestGuest::connect(&sock, 1, common::feat::MINIMAL).unwrap();
    assert!(connected(&ctl_sock, "b"));
    stop(d);
    assert!(sock.exists(), "systemd's socket path removed");
}

#[test]
fn usage_errors_keep_status_2_and_user_errors_say_error() {
    let o = daemon_cmd().args(["ctl", "stauts"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let o = daemon_cmd()
        .args(["serve", "--fd", "999"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("vhost-rdma: error: ") && last.contains("fd 999"),
        "{err}"
    );
}

#[test]
fn qemu_description_file_matches_the_binary() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../contrib/50-vhost-rdma.json");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let caps = daemon_cmd().arg("--print-capabilities").output().unwrap();
    let caps: serde_json::Value = serde_json::from_slice(&caps.stdout).unwrap();
    assert_eq!(v["type"], caps["type"], "{v}");
    assert!(v["description"].as_str().is_some_and(|d| !d.is_empty()));
    let bin = v["binary"].as_str().unwrap();
    assert!(
        bin.starts_with('/') && bin.ends_with("/vhost-rdma"),
        "{bin}"
    );
    // Only the keys QEMU's vhost-user.json defines for a description.
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 3, "{keys:?}");
}

/// The CPUs thread `tid` of process `pid` may run on (`Cpus_allowed_list`).
fn cpus_allowed(pid: u32, tid: &str) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|v| v.trim().to_string())
}

#[test]
fn cpu_affinity_pins_every_thread_and_refuses_unusable_lists() {
    let allowed = vhost_rdma::affinity::CpuList::allowed().unwrap();
    let cpu = allowed.cpus()[allowed.cpus().len() - 1];
    let dir = common::TempDir::new("cli-affinity");
    let child = serve_with(dir.path(), "a.sock", &["--cpu-affinity", &cpu.to_string()]);
    let pid = child.id();
    let tids: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    // The main thread, the control socket's, the port's listener at least.
    assert!(tids.len() >= 3, "{tids:?}");
    for t in &tids {
        if let Some(c) = cpus_allowed(pid, t) {
            assert_eq!(c, cpu.to_string(), "thread {t}");
        }
    }
    stop(child);
    // A list of no CPU this process may use: a one-line error, nothing served.
    let o = daemon_cmd()
        .args(["serve", "--cpu-affinity", "1023", "--port"])
        .arg(format!("a={}", dir.path().join("b.sock").display()))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("none of CPUs 1023 may be used"), "{err}");
    assert!(!dir.path().join("b.sock").exists());
    // Bad syntax is a usage error.
    let o = daemon_cmd()
        .args(["serve", "--cpu-affinity", "2-1"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a CPU list"));
}
