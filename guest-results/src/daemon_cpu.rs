//! `guest-results daemon-cpu`: the daemon's CPU time per GiB moved, for the
//! guest benches (ci/bench-erdma.sh; ci/daemon_cpu.py before issue 26).
//!
//! - [`sample`]: every 0.5 s until the daemon exits, one line
//!   "<seconds> <cpu ticks> <bytes>": seconds since sampling started, the
//!   process's user + system time in clock ticks (USER_HZ, /proc/PID/stat)
//!   and the bytes its ports sent (virtio-net ports' `tx_bytes` plus erdma
//!   functions' `tx_bytes`, from `vhost-rdma ctl status --json`).
//! - [`bursts`]: splits such samples into bursts of traffic (bytes growing;
//!   a burst ends after 2 s without growth), takes as many of the largest as
//!   there are payloads, in time order, and gives per burst "<cpu s per GiB>
//!   <bytes>": the daemon's CPU over the burst divided by that burst's
//!   payload.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::run_cmd::output_within;

/// Why sampling or judging failed.
#[derive(Debug, thiserror::Error)]
pub enum DaemonCpuError {
    /// Reading the samples or writing them failed.
    #[error("{path}: {source}")]
    Io {
        /// the file
        path: PathBuf,
        /// the I/O error
        source: std::io::Error,
    },
    /// A samples line is not three numbers.
    #[error("{path} line {line}: want \"<seconds> <cpu ticks> <bytes>\", got {text:?}")]
    Line {
        /// the samples file
        path: PathBuf,
        /// 1-based line number
        line: usize,
        /// the line
        text: String,
    },
    /// A payload of 0 bytes gives no CPU per GiB.
    #[error("payload 0: the CPU per GiB needs the bytes each burst moved")]
    ZeroPayload,
}

/// Bytes a burst must grow by between two samples (256 KiB) to count as
/// traffic: the daemon's own chatter (ARP, keepalives) stays below it.
const GROWTH: f64 = (256u32 << 10) as f64;
/// Seconds without growth that end a burst.
const QUIET_S: f64 = 2.0;
/// Seconds between samples.
const PERIOD: Duration = Duration::from_millis(500);

/// Clock ticks per second of /proc/PID/stat's times (USER_HZ).
pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf reads a constant of the C library; no memory is passed.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    // USER_HZ is 100 on every architecture the daemon runs on: a failing
    // sysconf (-1) falls back to it rather than dividing by a negative.
    if hz > 0 {
        hz as f64
    } else {
        100.0
    }
}

/// The process's user + system time in clock ticks (fields 14 and 15 of
/// /proc/PID/stat; the command name before them may hold spaces and ")").
pub fn cpu_ticks(pid: u32) -> std::io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "malformed /proc/PID/stat");
    let (_, rest) = stat.rsplit_once(')').ok_or_else(bad)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> std::io::Result<u64> {
        f.get(i).and_then(|s| s.parse().ok()).ok_or_else(bad)
    };
    Ok(field(11)? + field(12)?) // utime, stime
}

/// The bytes the daemon's ports sent, from `ctl status --json`: every
/// port's `tx_bytes` plus every device's `erdma.counters.tx_bytes`.
pub fn sent_bytes(status: &Value) -> u64 {
    let tx = |v: &Value| v.get("tx_bytes").and_then(Value::as_u64).unwrap_or(0);
    let list = |k: &str| {
        status
            .get(k)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let ports: u64 = list("ports").iter().map(tx).sum();
    let erdma: u64 = list("devices")
        .iter()
        .map(|d| d.get("erdma").and_then(|e| e.get("counters")).map_or(0, tx))
        .sum();
    ports + erdma
}

/// One sample: CPU ticks and sent bytes, or why not (the daemon may be gone).
fn one_sample(pid: u32, daemon: &Path, control: &Path) -> Option<(u64, u64)> {
    let ticks = cpu_ticks(pid).ok()?;
    let out = output_within(
        Command::new(daemon)
            .arg("ctl")
            .arg("--control")
            .arg(control)
            .args(["status", "--json"]),
        Duration::from_secs(10),
    )
    .ok()?;
    let st: Value = serde_json::from_slice(&out.stdout).ok()?;
    Some((ticks, sent_bytes(&st)))
}

/// Writes a sample line to `out` every 0.5 s until process `pid` exits. A
/// sample that fails while the process lives (the control socket not up
/// yet, a busy daemon) is retried at the next period.
pub fn sample(pid: u32, daemon: &Path, control: &Path, out: &Path) -> Result<(), DaemonCpuError> {
    let io = |source| DaemonCpuError::Io {
        path: out.to_path_buf(),
        source,
    };
    let mut f = std::fs::File::create(out).map_err(io)?;
    let t0 = Instant::now();
    loop {
        let secs = t0.elapsed().as_secs_f64();
        match one_sample(pid, daemon, control) {
            Some((ticks, bytes)) => {
                // one write per line and unbuffered: the file is whole whenever the bench reads it
                f.write_all(format!("{secs:.3} {ticks} {bytes}\n").as_bytes())
                    .map_err(io)?;
            }
            None if !Path::new(&format!("/proc/{pid}")).exists() => return Ok(()),
            None => {}
        }
        std::thread::sleep(PERIOD);
    }
}

/// Parses a samples file: one "<seconds> <cpu ticks> <bytes>" per non-blank line.
pub fn parse_samples(path: &Path, text: &str) -> Result<Vec<[f64; 3]>, DaemonCpuError> {
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = || DaemonCpuError::Line {
            path: path.to_path_buf(),
            line: i + 1,
            text: line.to_string(),
        };
        let v: Vec<f64> = line
            .split_whitespace()
            .map(|s| s.parse().map_err(|_| bad()))
            .collect::<Result<_, _>>()?;
        match v[..] {
            [a, b, c, ..] => rows.push([a, b, c]),
            _ => return Err(bad()),
        }
    }
    Ok(rows)
}

/// The bursts of traffic in `rows` as (first, last) sample indices, in time order.
fn find_bursts(rows: &[[f64; 3]]) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    let (mut start, mut last, mut quiet) = (None, 0, 0.0);
    for i in 1..rows.len() {
        if rows[i][2] - rows[i - 1][2] > GROWTH {
            start.get_or_insert(i - 1);
            quiet = 0.0;
            last = i;
        } else if let Some(s) = start {
            quiet += rows[i][0] - rows[i - 1][0];
            if quiet >= QUIET_S {
                found.push((s, last));
                start = None;
            }
        }
    }
    if let Some(s) = start {
        found.push((s, last));
    }
    found
}

/// One output line per payload: "<cpu s per GiB> <bytes>" of the largest
/// bursts in time order, "0 0" for each payload without a burst. `hz` is
/// the samples' clock ticks per second.
pub fn bursts(rows: &[[f64; 3]], payloads: &[u64], hz: f64) -> Result<Vec<String>, DaemonCpuError> {
    if payloads.contains(&0) {
        return Err(DaemonCpuError::ZeroPayload);
    }
    let size = |&(a, b): &(usize, usize)| rows[b][2] - rows[a][2];
    let mut found = find_bursts(rows);
    // stable: of equal bursts the earlier wins, as in the Python tool
    found.sort_by(|x, y| size(y).total_cmp(&size(x)));
    found.truncate(payloads.len());
    found.sort_unstable();
    let mut out: Vec<String> = found
        .iter()
        .zip(payloads)
        .map(|(&(a, b), &payload)| {
            let cpu_s = (rows[b][1] - rows[a][1]) / hz;
            let gib = payload as f64 / f64::from(1u32 << 30);
            format!("{:.2} {}", cpu_s / gib, (rows[b][2] - rows[a][2]) as i64)
        })
        .collect();
    out.resize(payloads.len(), "0 0".into());
    Ok(out)
}

/// [`bursts`] of a samples file.
pub fn bursts_file(path: &Path, payloads: &[u64], hz: f64) -> Result<Vec<String>, DaemonCpuError> {
    let text = std::fs::read_to_string(path).map_err(|source| DaemonCpuError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    bursts(&parse_samples(path, &text)?, payloads, hz)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples at 0.5 s: idle, a 1 GiB burst, 2.5 s quiet, a 100 MiB burst
    /// (still running at the end), with CPU ticks growing during both.
    fn samples() -> Vec<[f64; 3]> {
        let mut rows = Vec::new();
        let (mut t, mut ticks, mut bytes) = (0.0, 1000.0, 5000.0);
        let mut push = |dt: f64, dticks: f64, dbytes: f64| {
            t += dt;
            ticks += dticks;
            bytes += dbytes;
            rows.push([t, ticks, bytes]);
        };
        push(0.0, 0.0, 0.0);
        push(0.5, 1.0, 100.0); // chatter, no burst
        for _ in 0..4 {
            push(0.5, 25.0, (1u64 << 28) as f64); // 4 x 256 MiB
        }
        for _ in 0..5 {
            push(0.5, 1.0, 1000.0); // 2.5 s quiet: the burst ends
        }
        for _ in 0..2 {
            push(0.5, 10.0, (50u64 << 20) as f64);
        }
        rows
    }

    #[test]
    fn two_bursts_in_time_order() {
        let rows = samples();
        assert_eq!(find_bursts(&rows), [(1, 5), (10, 12)]);
        // 100 ticks over 1 GiB; 20 ticks over 100 MiB at HZ 100
        let out = bursts(&rows, &[1 << 30, 100 << 20], 100.0).expect("bursts");
        assert_eq!(out, ["1.00 1073741824", "2.05 104857600"]);
    }

    #[test]
    fn the_largest_bursts_win_and_missing_ones_are_zero() {
        let rows = samples();
        // one payload: the 1 GiB burst, not the later 100 MiB one
        assert_eq!(
            bursts(&rows, &[1 << 30], 100.0).expect("bursts"),
            ["1.00 1073741824"]
        );
        // three payloads, two bursts
        let out = bursts(&rows, &[1 << 30, 100 << 20, 1], 100.0).expect("bursts");
        assert_eq!(out[2], "0 0");
        assert!(matches!(
            bursts(&rows, &[0], 100.0),
            Err(DaemonCpuError::ZeroPayload)
        ));
    }

    #[test]
    fn parse_rejects_short_lines() {
        let p = Path::new("x");
        assert_eq!(
            parse_samples(p, "1 2 3\n\n4.5 6 7\n").expect("parse").len(),
            2
        );
        assert!(matches!(
            parse_samples(p, "1 2 3\n1 2\n"),
            Err(DaemonCpuError::Line { line: 2, .. })
        ));
        assert!(parse_samples(p, "1 x 3\n").is_err());
    }

    #[test]
    fn status_bytes() {
        let st: Value = serde_json::from_str(
            r#"{"ports": [{"tx_bytes": 10}, {"name": "b"}, {"tx_bytes": 5}],
                "devices": [{"erdma": {"counters": {"tx_bytes": 100}}}, {"kind": "gve"}]}"#,
        )
        .expect("json");
        assert_eq!(sent_bytes(&st), 115);
        assert_eq!(sent_bytes(&Value::Null), 0);
    }

    #[test]
    fn own_cpu_ticks() {
        let t = cpu_ticks(std::process::id()).expect("own stat");
        assert!(t < 1 << 40);
        assert!(clock_ticks() > 0.0);
    }
}
