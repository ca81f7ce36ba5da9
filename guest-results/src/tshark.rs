//! The host-side test row "tshark" (`guest-results tshark`): a cell's
//! capture decodes as the protocols it should carry, with no malformed
//! packet. It replaced ci/matrix.py's `tshark_test` and gives the same rows.

use std::path::Path;
use std::process::{Command, ExitStatus};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use regex::Regex;

use crate::junit::text_of;
use crate::pyjson::Json;
use crate::pytext::{splitlines, strip, take_chars};

/// Heuristic payload dissectors for ULPs that never run in these cells. The
/// RPC-over-RDMA heuristic claims small perftest/ucmatose SEND payloads
/// (e.g. the 4 bytes 00 00 10 00 of ib_send_bw -R's exchange) and then
/// throws "[Malformed Packet: RPCoRDMA]" on a well-formed iWARP/RoCE frame
/// (seen in the 7.3 siw cell, ci/README.md): a false report about a protocol
/// that is not there, so it is switched off; every dissector of the
/// expected protocols stays on.
pub const TSHARK_OFF: [&str; 4] = [
    "--disable-heuristic",
    "rpcrdma_iwarp",
    "--disable-heuristic",
    "rpcrdma_infiniband",
];

/// How long one tshark run may take (a long capture of a big cell takes
/// minutes on a loaded host).
pub const TIMEOUT: Duration = Duration::from_secs(900);

// `^\s*(\S+)\s+frames:(\d+)` with Python's \s (which also matches
// U+001C..U+001F), over the whole protocol hierarchy output
static FRAMES: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?m)^[\s\x1c-\x1f]*([^\s\x1c-\x1f]+)[\s\x1c-\x1f]+frames:(\d+)")
        .expect("a constant regex")
});

/// A finished tshark run: exit code (negative: the signal) and its output.
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

fn code_of(st: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code().or_else(|| st.signal().map(|s| -s)).unwrap_or(-1)
}

/// Runs a command with a time limit (killed when it runs over: `None`).
fn run(cmd: &mut Command, limit: Duration) -> std::io::Result<Option<Ran>> {
    match crate::run_cmd::output_within(cmd, limit) {
        Ok(o) => Ok(Some(Ran {
            code: code_of(o.status),
            stdout: text_of(&o.stdout),
            stderr: text_of(&o.stderr),
        })),
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Ok(None),
        Err(e) => Err(e),
    }
}

fn on_path(name: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|d| {
            std::fs::metadata(d.join(name))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

fn row(status: &str, secs: i128, detail: String) -> Json {
    let s = |v: &str| Json::Str(v.into());
    Json::Object(vec![
        ("test".into(), s("tshark")),
        ("status".into(), s(status)),
        ("secs".into(), Json::Int(secs)),
        ("bw".into(), s("")),
        ("detail".into(), Json::Str(detail)),
    ])
}

/// The verdict on tshark's output: `phs`, its protocol hierarchy (`-z
/// io,phs`); `malformed`, the frames it marked malformed, one a line.
pub fn judge(phs: &str, malformed: &str, protos: &[String], secs: i128) -> Json {
    // (protocol, frames), first-seen order; a protocol at several levels adds up
    let mut frames: Vec<(&str, i128)> = Vec::new();
    for m in FRAMES.captures_iter(phs) {
        let (Some(p), Some(n)) = (m.get(1), m.get(2)) else {
            continue;
        };
        let n: i128 = n.as_str().parse().unwrap_or(0);
        match frames.iter_mut().find(|(q, _)| *q == p.as_str()) {
            Some(e) => e.1 += n,
            None => frames.push((p.as_str(), n)),
        }
    }
    let count = |p: &str| frames.iter().find(|(q, _)| *q == p).map_or(0, |e| e.1);
    let bad: Vec<&str> = splitlines(malformed)
        .into_iter()
        .filter(|l| !strip(l).is_empty())
        .collect();
    let missing: Vec<&str> = protos
        .iter()
        .filter(|p| count(p) == 0)
        .map(String::as_str)
        .collect();
    let seen = protos
        .iter()
        .map(|p| format!("{p} {}", count(p)))
        .collect::<Vec<_>>()
        .join(", ");
    let total = count("eth");
    if missing.is_empty() && bad.is_empty() {
        return row(
            "PASS",
            secs,
            format!("{total} frames, decoded: {seen}; 0 malformed"),
        );
    }
    let missing = if missing.is_empty() {
        "-".to_string()
    } else {
        missing.join(", ")
    };
    let first = bad.first().map_or(String::new(), |b| {
        format!(", first: {}", take_chars(b, 200))
    });
    row(
        "FAIL",
        secs,
        format!(
            "{total} frames; decoded: {seen}; missing: {missing}; {} malformed{first}",
            bad.len()
        ),
    )
}

/// The row: SKIP without tshark on PATH, FAIL without a capture, when tshark
/// fails or runs over `limit`, or when a protocol is missing or a frame is
/// malformed.
pub fn tshark_row(pcap: &Path, protos: &[String], limit: Duration) -> Json {
    let t0 = Instant::now();
    if !on_path("tshark") {
        return row(
            "SKIP",
            0,
            "tshark is not installed (scripts/install-deps.sh installs it)".into(),
        );
    }
    if std::fs::metadata(pcap).map_or(true, |m| m.len() == 0) {
        return row("FAIL", 0, format!("no capture file {}", pcap.display()));
    }
    let tshark = |extra: &[&str]| {
        let mut c = Command::new("tshark");
        c.arg("-n").args(TSHARK_OFF).arg("-r").arg(pcap).args(extra);
        c
    };
    // One tshark pass, or the row that says why it gave nothing.
    let pass = |extra: &[&str]| match run(&mut tshark(extra), limit) {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err(row(
            "FAIL",
            0,
            format!("tshark took longer than {} s", limit.as_secs()),
        )),
        Err(e) => Err(row("FAIL", 0, format!("tshark did not run: {e}"))),
    };
    let phs = match pass(&["-q", "-z", "io,phs"]) {
        Ok(r) => r,
        Err(failed) => return failed,
    };
    let fields = [
        "-Y",
        "_ws.malformed",
        "-T",
        "fields",
        "-e",
        "frame.number",
        "-e",
        "_ws.col.Protocol",
        "-e",
        "_ws.col.Info",
    ];
    let mal = match pass(&fields) {
        Ok(r) => r,
        Err(failed) => return failed,
    };
    // Python's round(): halves to even
    let secs = t0.elapsed().as_secs_f64().round_ties_even() as i128;
    if phs.code != 0 || mal.code != 0 {
        let both = format!("{}{}", phs.stderr, mal.stderr);
        let err: Vec<&str> = splitlines(&both)
            .into_iter()
            .filter(|l| !strip(l).is_empty() && !l.contains("Running as user"))
            .collect();
        return row(
            "FAIL",
            secs,
            format!(
                "tshark failed (rc {}/{}): {}",
                phs.code,
                mal.code,
                take_chars(&err.join(" "), 300)
            ),
        );
    }
    judge(&phs.stdout, &mal.stdout, protos, secs)
}
