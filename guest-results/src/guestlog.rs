//! A matrix cell's guest results ([`judge_guests`]): each guest's
//! out.log (the `CI-TEST` lines ci/ci-lib.sh prints, `CI-ABORT`,
//! `CI-KERNEL`, the `== CI-DIAG` counter sections) and the cell's test rows
//! combined from both guests. It replaced ci/matrix.py's `parse_guest` and
//! `combine` and gives the same rows.

use std::path::PathBuf;
use std::sync::LazyLock;

use regex::Regex;

use crate::pyjson::Json;
use crate::pytext::{is_space, strip};
use crate::upstream::Row;

/// The last `STREAM-RESULT` line of smc-guest-tests' stream output.
pub fn stream_result(text: &str) -> Option<&str> {
    text.lines().rfind(|l| l.starts_with("STREAM-RESULT"))
}

/// Whether a `STREAM-RESULT` line says every byte was verified and the
/// stream passed.
pub fn stream_passed(line: &str) -> bool {
    line.contains(" verified=1") && line.contains(" status=pass")
}

/// The roles of a cell's two guests, in the order rows are built.
pub const ROLES: [&str; 2] = ["server", "client"];

/// One `CI-TEST` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestLine {
    /// The test's name.
    pub test: String,
    /// The role that reported it ("server", "client").
    pub role: String,
    /// PASS, FAIL or SKIP.
    pub status: String,
    /// Seconds it took.
    pub secs: u64,
    /// Bandwidth in MiB/s ("" for none).
    pub bw: String,
    /// Why (the quoted reason).
    pub reason: String,
}

/// What one guest's out.log says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GuestLog {
    /// The `CI-TEST` lines, in order.
    pub lines: Vec<TestLine>,
    /// The last `CI-ABORT` line.
    pub aborted: Option<String>,
    /// The guest's `uname -r` (`CI-KERNEL` line).
    pub kernel: Option<String>,
    /// The CI-DIAG counters (rdma statistic, TCP, eth0's packets, errors,
    /// drops, misses), in the order the log has them.
    pub diag: Vec<(String, i128)>,
}

// Python's \s also matches U+001C..U+001F (str.isspace); these classes keep
// the patterns the Python matrix used matching the same lines.
const S: &str = r"[\s\x1c-\x1f]";
const NS: &str = r"[^\s\x1c-\x1f]";

fn re(s: &str) -> Regex {
    Regex::new(&s.replace("\\S", NS).replace("\\s", S)).expect("a constant regex")
}

static TEST: LazyLock<Regex> = LazyLock::new(|| {
    re(r#"^CI-TEST test=(\S+) role=(\S+) status=(\S+) secs=(\d+)(?: bw=(\S*))? reason="(.*)"\s*$"#)
});
static COUNTER: LazyLock<Regex> = LazyLock::new(|| re(r"^    \S+ \d+$"));
static LINK_HDR: LazyLock<Regex> = LazyLock::new(|| re(r"^\s+(RX|TX):\s+(.*)$"));
static LINK_VALUES: LazyLock<Regex> = LazyLock::new(|| re(r"^\s+[\d\s]+$"));

/// Python's `str.split()`.
fn split(s: &str) -> Vec<&str> {
    s.split(is_space).filter(|w| !w.is_empty()).collect()
}

/// A decimal number (`\\d+` matched it; a non-ASCII digit, which Python's
/// `int()` would also read, makes it no number here).
fn int(s: &str) -> Option<i128> {
    let mut n: i128 = 0;
    for c in s.chars() {
        n = n.checked_mul(10)?.checked_add(c.to_digit(10)?.into())?;
    }
    Some(n)
}

/// Parses one guest's out.log (as text: a missing log is "").
pub fn parse_guest(text: &str) -> GuestLog {
    let mut g = GuestLog::default();
    let mut section: Option<&str> = None;
    let mut hdr: Option<(String, Vec<String>)> = None;
    for raw in text.split_inclusive('\n') {
        let line = raw.trim_end_matches(['\r', '\n']);
        if line.starts_with("== CI-DIAG") {
            section = Some(if line.contains("rdma statistic") {
                "rdma"
            } else if line.contains("tcp counters") {
                "tcp"
            } else if line.contains("ip -s link") {
                "link"
            } else {
                "other"
            });
            continue;
        }
        if matches!(section, Some("rdma" | "tcp")) && COUNTER.is_match(line) {
            let w = split(line);
            if let (Some(k), Some(v)) = (w.first(), w.get(1).and_then(|v| int(v))) {
                set(&mut g.diag, k, v);
                continue;
            }
        }
        if section == Some("link") {
            if let Some(m) = LINK_HDR.captures(line) {
                let names = split(m.get(2).map_or("", |x| x.as_str()));
                hdr = Some((
                    m[1].to_lowercase(),
                    names.into_iter().map(String::from).collect(),
                ));
                continue;
            }
            if LINK_VALUES.is_match(line) {
                if let Some((dir, names)) = hdr.take() {
                    for (k, v) in names.iter().zip(split(line)) {
                        if ["packets", "errors", "dropped", "missed"].contains(&k.as_str()) {
                            if let Some(v) = int(v) {
                                set(&mut g.diag, &format!("eth0_{dir}_{k}"), v);
                            }
                        }
                    }
                    continue;
                }
            }
        }
        if !line.starts_with("    ") && !line.starts_with(' ') {
            section = None;
        }
        if let Some(m) = TEST.captures(line) {
            let s = |i| m.get(i).map_or("", |x| x.as_str()).to_string();
            if let Some(secs) = int(&m[4]).and_then(|n| u64::try_from(n).ok()) {
                g.lines.push(TestLine {
                    test: s(1),
                    role: s(2),
                    status: s(3),
                    secs,
                    bw: s(5),
                    reason: s(6),
                });
            }
        } else if line.starts_with("CI-ABORT") {
            g.aborted = Some(line.to_string());
        } else if let Some(k) = line.strip_prefix("CI-KERNEL ") {
            g.kernel = Some(strip(k).to_string());
        }
    }
    g
}

/// A dict assignment: a key seen before keeps its place.
fn set(diag: &mut Vec<(String, i128)>, k: &str, v: i128) {
    match diag.iter_mut().find(|(old, _)| old == k) {
        Some(e) => e.1 = v,
        None => diag.push((k.to_string(), v)),
    }
}

/// The cell's test rows from both guests' lines: one per test the cell
/// names (in its order, `roles` saying who must report it) and then one per
/// test a guest reported beyond those. A test needs a result from each of
/// its roles; any FAIL fails it; it is SKIP when every result is SKIP. A
/// host-side test (roles `["host"]`) gets a FAIL row the caller replaces.
pub fn combine(
    tests: &[(String, Vec<String>)],
    per_role: &[(String, Vec<TestLine>)],
    aborted: &[(String, String)],
) -> Vec<Row> {
    let lines_of = |r: &str| {
        per_role
            .iter()
            .find(|(role, _)| role == r)
            .map_or(&[][..], |(_, l)| &l[..])
    };
    let mut names: Vec<&str> = tests.iter().map(|(t, _)| t.as_str()).collect();
    for role in ROLES {
        for x in lines_of(role) {
            if !names.contains(&x.test.as_str()) {
                names.push(&x.test);
            }
        }
    }
    let mut rows = Vec::new();
    for name in names {
        let want: Vec<&str> = match tests.iter().rev().find(|(t, _)| t == name) {
            Some((_, roles)) => roles.iter().map(String::as_str).collect(),
            None => ROLES
                .into_iter()
                .filter(|r| lines_of(r).iter().any(|x| x.test == name))
                .collect(),
        };
        if want == ["host"] {
            rows.push(Row::fail(name.into(), "host-side test did not run".into()));
            continue;
        }
        let got: Vec<(&str, Option<&TestLine>)> = want
            .iter()
            .map(|r| (*r, lines_of(r).iter().find(|x| x.test == name)))
            .collect();
        let missing: Vec<&str> = got
            .iter()
            .filter(|(_, x)| x.is_none())
            .map(|(r, _)| *r)
            .collect();
        let present: Vec<&TestLine> = got.iter().filter_map(|(_, x)| *x).collect();
        let mut status = "PASS";
        let mut why = Vec::new();
        if !missing.is_empty() {
            status = "FAIL";
            let ab: Vec<String> = missing
                .iter()
                .filter_map(|r| {
                    aborted
                        .iter()
                        .find(|(role, line)| role == r && !line.is_empty())
                        .map(|(_, line)| format!("{r}: {line}"))
                })
                .collect();
            let tail = if ab.is_empty() {
                " (guest died or timed out)".to_string()
            } else {
                format!(" ({})", ab.join("; "))
            };
            why.push(format!("no result from {}{tail}", missing.join(", ")));
        }
        if present.iter().any(|x| x.status == "FAIL") {
            status = "FAIL";
        } else if missing.is_empty()
            && !present.is_empty()
            && present.iter().all(|x| x.status == "SKIP")
        {
            status = "SKIP";
        }
        for x in &present {
            if x.status != "PASS" || status == "PASS" {
                why.push(format!("{}: {} {}", x.role, x.status, x.reason));
            }
        }
        let client = got
            .iter()
            .find(|(r, _)| *r == "client")
            .and_then(|(_, x)| *x);
        let bw = match client {
            Some(c) if !c.bw.is_empty() => c.bw.clone(),
            _ => present
                .iter()
                .find(|x| !x.bw.is_empty())
                .map_or(String::new(), |x| x.bw.clone()),
        };
        rows.push(Row {
            test: name.into(),
            status: status.into(),
            secs: present.iter().map(|x| x.secs).max().unwrap_or(0),
            bw,
            detail: why.join(" | "),
        });
    }
    rows
}

/// The counters as a JSON object in log order (what results.json keeps).
pub fn diag_json(diag: &[(String, i128)]) -> Json {
    Json::Object(
        diag.iter()
            .map(|(k, v)| (k.clone(), Json::Int(*v)))
            .collect(),
    )
}

/// A row as results.json keeps it (keys in this order: test,
/// status, secs, bw, detail).
pub fn row_json(r: &Row) -> Json {
    let s = |v: &str| Json::Str(v.into());
    Json::Object(vec![
        ("test".into(), s(&r.test)),
        ("status".into(), s(&r.status)),
        ("secs".into(), Json::Int(r.secs.into())),
        ("bw".into(), s(&r.bw)),
        ("detail".into(), s(&r.detail)),
    ])
}

/// One guest's part of a cell for [`judge_guests`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestOut {
    /// "server" or "client".
    pub role: String,
    /// The guest's name ("a", "b").
    pub name: String,
    /// Its out.log (a missing file counts as empty).
    pub log: PathBuf,
}

/// A matrix cell's rows from its guests' out.log: `{"tests", "counters",
/// "guest_kernel"}`. `tests` names each row and the roles that must report
/// it (see [`combine`]); `counters` holds each guest's `CI-DIAG` counters,
/// `guest_kernel` each guest's `CI-KERNEL`.
pub fn judge_guests(tests: &[(String, Vec<String>)], guests: &[GuestOut]) -> Json {
    let mut per_role: Vec<(String, Vec<TestLine>)> = Vec::new();
    let mut aborted = Vec::new();
    let (mut counters, mut kernels) = (Vec::new(), Vec::new());
    for g in guests {
        let text = std::fs::read(&g.log)
            .map(|b| crate::junit::text_of(&b))
            .unwrap_or_default();
        let parsed = parse_guest(&text);
        if !parsed.diag.is_empty() {
            counters.push((g.name.clone(), diag_json(&parsed.diag)));
        }
        let mine = parsed
            .lines
            .into_iter()
            .filter(|x| x.role == g.role)
            .collect();
        per_role.push((g.role.clone(), mine));
        if let Some(a) = parsed.aborted {
            aborted.push((g.role.clone(), a));
        }
        if let Some(k) = parsed.kernel.filter(|k| !k.is_empty()) {
            kernels.push((g.name.clone(), Json::Str(k)));
        }
    }
    let rows = combine(tests, &per_role, &aborted);
    Json::Object(vec![
        (
            "tests".into(),
            Json::Array(rows.iter().map(row_json).collect()),
        ),
        ("counters".into(), Json::Object(counters)),
        ("guest_kernel".into(), Json::Object(kernels)),
    ])
}
