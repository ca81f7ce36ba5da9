//! The `vhost-rdma` binary as a user runs it: flags anywhere on the `ctl`
//! line, the control socket from the environment, one-line errors with exit
//! status 1, sockets a live daemon serves left alone, prompt shutdown.

mod common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vhost-rdma"));
    c.env_remove("VHOST_RDMA_CONTROL").env_remove("NO_COLOR");
    c
}

/// Starts `serve` with one port and a control socket in `dir`; waits until
/// the control socket answers.
fn serve(dir: &Path, port_sock: &str) -> Child {
    let mut child = bin()
        .args(["serve", "--port"])
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

fn ctl(dir: &Path, args: &[&str]) -> Output {
    bin()
        .arg("ctl")
        .args(args)
        .env("VHOST_RDMA_CONTROL", dir.join("ctl.sock"))
        .output()
        .unwrap()
}

fn stop(mut child: Child) -> Duration {
    let t0 = Instant::now();
    // SAFETY: sending SIGTERM to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    while t0.elapsed() < Duration::from_secs(10) {
        if child.try_wait().unwrap().is_some() {
            return t0.elapsed();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("daemon still alive 10 s after SIGTERM");
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
    let o = bin()
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
    let o = bin()
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
    let o = bin()
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
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
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
