//! Running a helper command (`vhost-rdma ctl ...`) with a time limit, as
//! Python's `subprocess.run(..., timeout=T)` did in the tools this crate
//! replaced: a daemon that stops answering must not hang the caller.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd` (stdin empty, stdout and stderr captured) and waits at most
/// `timeout`; past it the child is killed and the result is an
/// [`std::io::ErrorKind::TimedOut`] error.
pub fn output_within(cmd: &mut Command, timeout: Duration) -> std::io::Result<Output> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // Readers drain the pipes while we wait: a child writing more than a
    // pipe's buffer would otherwise block and look like a timeout.
    let reader = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = reader(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = reader(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("timed out after {} s", timeout.as_secs_f64()),
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ok(Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captures_output_and_status() {
        let o = output_within(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(10),
        )
        .expect("sh runs");
        assert_eq!(o.stdout, b"out\n");
        assert_eq!(o.stderr, b"err\n");
        assert_eq!(o.status.code(), Some(3));
    }

    #[test]
    fn kills_at_the_deadline() {
        let t0 = Instant::now();
        let e = output_within(Command::new("sleep").arg("30"), Duration::from_millis(200))
            .expect_err("times out");
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(t0.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn large_output_does_not_block() {
        let o = output_within(
            Command::new("sh").args(["-c", "head -c 1000000 /dev/zero"]),
            Duration::from_secs(20),
        )
        .expect("sh runs");
        assert_eq!(o.stdout.len(), 1_000_000);
    }
}
