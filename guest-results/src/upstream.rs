//! Upstream test suites run on our devices (issues 26, 28): results and expectations.
//!
//! The matrix's `upstream-rdma` cell runs rdma-core's own `tests/` (pyverbs,
//! unmodified) on the emulated erdma function in one guest and on rdma_rxe in
//! the other (the baseline); `upstream-nic` runs the kernel's NIC selftests
//! (KTAP) on the gVNIC and on virtio-net. This module turns each guest's log
//! into one result per upstream case and judges it against a committed
//! expectations file per suite and device (`ci/upstream/SUITE-DEVICE.expect`).
//!
//! A line there is `PATTERN STATUS REASON`: PATTERN a case id or an fnmatch
//! pattern of ids (the first matching line wins, so exact ids go first),
//! STATUS one of pass, fail, error, skip, killed, missing (or several joined
//! by `|` for a case whose outcome varies between runs, e.g. `pass|killed`),
//! and REASON why (mandatory for anything but pass). A case no line matches
//! is expected to pass. A case whose result differs from its expectation
//! fails the cell, so a case that starts passing fails too until its line is
//! removed: the file stays the true list of what does not pass, and why.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use regex::Regex;
use serde::Serialize;

use crate::pytext::{fnmatch, splitlines, strip, take_chars};

/// The statuses a case can have, in the order the table counts them.
pub const STATUSES: [&str; 6] = ["pass", "fail", "error", "skip", "killed", "missing"];

/// One case's result: (status, detail).
pub type Outcome = (String, String);
/// Results of one device: case id -> outcome.
pub type Results = BTreeMap<String, Outcome>;

fn re(s: &str) -> Regex {
    Regex::new(s).expect("static regex")
}

// "name (tests.mod.Class.name)" starts a case; unittest -v prints " ... RESULT"
// on that line, or on the docstring's line below it.
static START_RE: LazyLock<Regex> =
    LazyLock::new(|| re(r"^(\S+) \((tests\.[^)\s]+)\)(?: \.\.\. (.*))?$"));
static DOC_RESULT_RE: LazyLock<Regex> = LazyLock::new(|| re(r"^.* \.\.\. (.*)$"));
static RESULT_RE: LazyLock<Regex> =
    LazyLock::new(|| re(r"^(ok|FAIL|ERROR|expected failure|unexpected success|skipped (.*))$"));
static SECTION_RE: LazyLock<Regex> =
    LazyLock::new(|| re(r"^(FAIL|ERROR): \S+ \((tests\.[^)\s]+)\)"));
static KILLED_RE: LazyLock<Regex> =
    LazyLock::new(|| re(r"^UPSTREAM-KILLED id=(\S+) rc=(-?\d+) why=(.*)$"));
static CASES_RE: LazyLock<Regex> = LazyLock::new(|| re(r"^UPSTREAM-CASES (\d+)$"));
static KTAP_RE: LazyLock<Regex> = LazyLock::new(|| re(r"^(not )?ok (\d+) (\S+)(?: # (.*))?$"));
static FILE_RE: LazyLock<Regex> = LazyLock::new(|| re(r"^UPSTREAM-FILE (\S+)$"));
// "secs=" (the file's wall time in the guest) is optional: older logs lack it
static FILE_END_RE: LazyLock<Regex> =
    LazyLock::new(|| re(r"^UPSTREAM-FILE-END (\S+) rc=(-?\d+)(?: secs=\d+)?$"));
static FILE_NOT_RUN_RE: LazyLock<Regex> =
    LazyLock::new(|| re(r"^UPSTREAM-FILE-NOT-RUN (\S+) why=(.*)$"));
static PLAN_RE: LazyLock<Regex> = LazyLock::new(|| re(r"^1\.\.(\d+)$"));

/// An expectations file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ExpectError {
    /// The file could not be read (the message is Python's OSError text).
    #[error("{0}")]
    Io(String),
    /// A line that is not `PATTERN STATUS REASON` with known statuses.
    #[error("{path}:{line}: want 'PATTERN STATUS REASON', STATUS one of {}", STATUSES.join(", "))]
    Format { path: String, line: usize },
    /// A line expecting anything but pass without saying why.
    #[error("{path}:{line}: {pattern} is expected to {status} but gives no reason")]
    NoReason {
        path: String,
        line: usize,
        pattern: String,
        status: String,
    },
}

fn outcome(s: &str, d: impl Into<String>) -> Outcome {
    (s.to_string(), d.into())
}

fn int(s: &str) -> i64 {
    s.parse().unwrap_or(0)
}

/// unittest's verdict word -> (status, detail).
fn result(token: &str) -> Option<Outcome> {
    let t = strip(token);
    let m = RESULT_RE.captures(t)?;
    Some(match &m[1] {
        "ok" => outcome("pass", ""),
        "FAIL" => outcome("fail", ""),
        "ERROR" => outcome("error", ""),
        "expected failure" => outcome("pass", "expected failure"),
        "unexpected success" => outcome("fail", "unexpected success"),
        _ => {
            let why = strip(&m[2]).trim_matches(|c| c == '\'' || c == '"');
            outcome("skip", why)
        }
    })
}

/// One guest's rdma-core.ROLE.log -> (results, number of cases listed if the log says).
///
/// Cases that started but printed no verdict are "killed" (with the
/// UPSTREAM-KILLED line's reason when the guest wrote one); cases the
/// traceback sections name FAIL/ERROR take that verdict and its last line.
pub fn parse_log(text: &str) -> (Results, Option<i64>) {
    let lines = splitlines(text);
    let mut res = Results::new();
    let mut listed = None;
    let mut killed: Vec<(String, String)> = Vec::new();
    let mut pending: Option<String> = None; // case id waiting for its verdict
    for line in &lines {
        if let Some(m) = CASES_RE.captures(line) {
            listed = Some(int(&m[1]));
            continue;
        }
        if let Some(m) = KILLED_RE.captures(line) {
            let why = format!("{} (rc={})", &m[3], &m[2]);
            match killed.iter_mut().find(|(c, _)| c == &m[1]) {
                Some(k) => k.1 = why,
                None => killed.push((m[1].to_string(), why)),
            }
            pending = None;
            continue;
        }
        if let Some(m) = START_RE.captures(line) {
            let cid = m[2].to_string();
            res.entry(cid.clone())
                .or_insert_with(|| outcome("killed", "started, no verdict"));
            pending = Some(cid.clone());
            if let Some(r) = m.get(3).and_then(|rest| result(rest.as_str())) {
                res.insert(cid, r);
                pending = None;
            }
            continue;
        }
        let Some(cid) = &pending else { continue };
        let r = result(line).or_else(|| {
            DOC_RESULT_RE
                .captures(line)
                .and_then(|m| result(m.get(1).map_or("", |g| g.as_str())))
        });
        if let Some(r) = r {
            res.insert(cid.clone(), r);
            pending = None;
        }
    }
    // traceback sections: the error's last line says what went wrong
    for (i, line) in lines.iter().enumerate() {
        let Some(m) = SECTION_RE.captures(line) else {
            continue;
        };
        // header, a "-----" rule, the traceback, a blank line; its last line is the exception
        let (mut msg, mut in_tb) = ("", false);
        for nxt in &lines[i + 1..] {
            if nxt.starts_with(&"-".repeat(20)) {
                if in_tb {
                    break;
                }
                in_tb = true;
                continue;
            }
            if nxt.starts_with(&"=".repeat(20)) {
                break;
            }
            if in_tb && !strip(nxt).is_empty() {
                msg = strip(nxt);
            }
        }
        let status = if &m[1] == "FAIL" { "fail" } else { "error" };
        res.insert(m[2].to_string(), outcome(status, take_chars(msg, 300)));
    }
    for (cid, why) in killed {
        if let Some(r) = res.get_mut(&cid) {
            if r.0 == "killed" {
                r.1 = why;
            }
        }
    }
    (res, listed)
}

/// The NIC suite's log (kselftest KTAP per file, between UPSTREAM-FILE and
/// UPSTREAM-FILE-END lines) -> results.
///
/// A case id is the file's directory prefix ("hw/" or none) and the name
/// KTAP prints ("hw/rss_ctx.test_rss_key_indir"). "ok ... # SKIP why" is a
/// skip, "# XFAIL" a pass (an expected failure the suite itself allows),
/// "not ok" a fail with the nearest "# " comment lines above as detail. A
/// file that printed fewer results than its plan, or none, adds the case
/// "FILE" (e.g. "hw/gro_hw.py") as killed (its timeout) or error; a file
/// the guest did not run adds it as missing with the guest's reason.
pub fn parse_ktap_log(text: &str) -> Results {
    let mut res = Results::new();
    let mut cur: Option<String> = None;
    let mut prefix = String::new();
    let mut plan: Option<i64> = None;
    let mut seen = 0i64;
    let mut notes: Vec<String> = Vec::new();
    let mut last = String::new();
    for line in splitlines(text) {
        if let Some(m) = FILE_RE.captures(line) {
            let c = m[1].to_string();
            prefix = match c.rfind('/') {
                Some(i) => format!("{}/", &c[..i]),
                None => String::new(),
            };
            (cur, plan, seen, notes, last) = (Some(c), None, 0, Vec::new(), String::new());
            continue;
        }
        if let Some(m) = FILE_NOT_RUN_RE.captures(line) {
            res.insert(
                m[1].to_string(),
                outcome("missing", format!("not run: {}", &m[2])),
            );
            continue;
        }
        if let Some(m) = FILE_END_RE.captures(line) {
            if let Some(c) = cur.take() {
                let rc = int(&m[2]);
                if plan.is_none_or(|p| seen < p) {
                    let timeout = rc == 124 || rc == 137;
                    let mut why = if timeout {
                        format!("stopped by its timeout (rc={rc})")
                    } else {
                        let p = plan.map_or("?".to_string(), |p| p.to_string());
                        format!("exited rc={rc} after {seen} of {p} results")
                    };
                    if !last.is_empty() {
                        why = format!("{why}: {last}");
                    }
                    res.insert(c, outcome(if timeout { "killed" } else { "error" }, why));
                }
                continue;
            }
        }
        if cur.is_none() {
            continue;
        }
        let s = strip(line);
        if !s.is_empty() {
            last = take_chars(s, 200).to_string();
        }
        if let Some(m) = PLAN_RE.captures(s) {
            if plan.is_none() {
                plan = Some(int(&m[1]));
                continue;
            }
        }
        if let Some(m) = KTAP_RE.captures(s) {
            seen += 1;
            let cid = format!("{prefix}{}", &m[3]);
            let comment = strip(m.get(4).map_or("", |g| g.as_str()));
            let o = if let Some(rest) = comment.strip_prefix("SKIP") {
                let why = rest.trim_matches(|c| c == ' ' || c == ':');
                outcome("skip", if why.is_empty() { "skipped" } else { why })
            } else if let Some(rest) = comment.strip_prefix("XFAIL") {
                outcome(
                    "pass",
                    format!("XFAIL {}", rest.trim_matches(|c| c == ' ' || c == ':')),
                )
            } else if m.get(1).is_some() {
                let tail = &notes[notes.len().saturating_sub(3)..];
                let detail: Vec<&str> = tail
                    .iter()
                    .filter(|n| !n.is_empty())
                    .map(String::as_str)
                    .collect();
                let full = format!("{comment} {}", detail.join(" | "));
                outcome("fail", take_chars(strip(&full), 300))
            } else {
                outcome("pass", "")
            };
            res.insert(cid, o);
            notes.clear();
            continue;
        }
        if let Some(n) = line.strip_prefix("# ") {
            notes.push(strip(n).to_string());
            if notes.len() > 6 {
                notes.drain(..notes.len() - 6);
            }
        }
    }
    res
}

/// (case id, why) of every python3 process death the guest recorded (UPSTREAM-KILLED lines).
pub fn deaths(text: &str) -> Vec<(String, String)> {
    splitlines(text)
        .into_iter()
        .filter_map(|l| KILLED_RE.captures(l))
        .map(|m| (m[1].to_string(), format!("{} (rc={})", &m[3], &m[2])))
        .collect()
}

/// One line of an expectations file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub pattern: String,
    pub status: String,
    pub reason: String,
}

/// Python's `str.split(None, 2)`: at most 3 whitespace-separated parts, the
/// last one keeping its inner whitespace.
fn split3(line: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut rest = crate::pytext::lstrip(line);
    while !rest.is_empty() {
        if parts.len() == 2 {
            parts.push(rest);
            break;
        }
        let end = rest.find(crate::pytext::is_space).unwrap_or(rest.len());
        parts.push(&rest[..end]);
        rest = crate::pytext::lstrip(&rest[end..]);
    }
    parts
}

/// The rules of an expectations file's text (`path` names it in errors).
pub fn parse_expect(path: &str, text: &str) -> Result<Vec<Rule>, ExpectError> {
    let mut rules = Vec::new();
    for (i, raw) in crate::pytext::file_lines(text).into_iter().enumerate() {
        let n = i + 1;
        let line = strip(raw);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let parts = split3(line);
        if parts.len() < 2 || !parts[1].split('|').all(|s| STATUSES.contains(&s)) {
            return Err(ExpectError::Format {
                path: path.into(),
                line: n,
            });
        }
        let reason = parts.get(2).map_or("", |r| strip(r));
        if parts[1] != "pass" && reason.is_empty() {
            return Err(ExpectError::NoReason {
                path: path.into(),
                line: n,
                pattern: parts[0].into(),
                status: parts[1].into(),
            });
        }
        rules.push(Rule {
            pattern: parts[0].into(),
            status: parts[1].into(),
            reason: reason.into(),
        });
    }
    Ok(rules)
}

/// Python's `str(OSError)` for a failed open of `path`.
fn os_error_text(e: &std::io::Error, path: &str) -> String {
    let msg = e.to_string();
    match e.raw_os_error() {
        Some(code) => {
            let text = msg
                .strip_suffix(&format!(" (os error {code})"))
                .unwrap_or(&msg);
            format!("[Errno {code}] {text}: '{path}'")
        }
        None => format!("{msg}: '{path}'"),
    }
}

/// The rules of the expectations file at `path`.
pub fn load_expect(path: &str) -> Result<Vec<Rule>, ExpectError> {
    let bytes = std::fs::read(path).map_err(|e| ExpectError::Io(os_error_text(&e, path)))?;
    parse_expect(path, &String::from_utf8_lossy(&bytes))
}

/// (status, reason) the rules give case `cid` (pass when no rule matches).
pub fn expected<'a>(rules: &'a [Rule], cid: &str) -> (&'a str, &'a str) {
    rules
        .iter()
        .find(|r| r.pattern == cid || fnmatch(cid, &r.pattern))
        .map_or(("pass", ""), |r| (r.status.as_str(), r.reason.as_str()))
}

/// One judged case of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    pub got: String,
    pub detail: String,
    pub want: String,
    pub reason: String,
    pub ok: bool,
}

/// Judged cases of one device, by case id.
pub type Judgement = BTreeMap<String, Judged>;

/// Results against the rules; `all_cases` (every case id the suite listed)
/// adds those with no result as "missing".
pub fn judge<'a>(
    results: &'a Results,
    rules: &[Rule],
    all_cases: impl IntoIterator<Item = &'a String>,
) -> Judgement {
    let mut cases: BTreeSet<&String> = results.keys().collect();
    cases.extend(all_cases);
    let never = outcome("missing", "never started");
    cases
        .into_iter()
        .map(|cid| {
            let (got, detail) = results.get(cid).unwrap_or(&never);
            let (want, reason) = expected(rules, cid);
            let ok = want.split('|').any(|w| w == got);
            let j = Judged {
                got: got.clone(),
                detail: detail.clone(),
                want: want.into(),
                reason: reason.into(),
                ok,
            };
            (cid.clone(), j)
        })
        .collect()
}

/// How tables and rows name a case: rdma-core ids without their "tests." package.
pub fn case_name(cid: &str) -> &str {
    cid.strip_prefix("tests.").unwrap_or(cid)
}

/// One row of the matrix's results.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    pub test: String,
    pub status: String,
    pub secs: u64,
    pub bw: String,
    pub detail: String,
}

impl Row {
    /// A failing row.
    pub fn fail(test: String, detail: String) -> Row {
        Row {
            test,
            status: "FAIL".into(),
            secs: 0,
            bw: String::new(),
            detail,
        }
    }
}

fn all_cases(judged: &[(String, Judgement)]) -> BTreeSet<&String> {
    judged.iter().flat_map(|(_, j)| j.keys()).collect()
}

/// Matrix rows (one per case) of the devices' judgements, in device order:
/// PASS when every device gave what its file expects.
pub fn rows(judged: &[(String, Judgement)], prefix: &str) -> Vec<Row> {
    all_cases(judged)
        .into_iter()
        .map(|cid| {
            let (mut bad, mut parts) = (Vec::new(), Vec::new());
            for (dev, jd) in judged {
                let Some(j) = jd.get(cid) else {
                    bad.push(format!("{dev}: no result"));
                    continue;
                };
                parts.push(format!("{dev} {}", j.got));
                if !j.ok {
                    let d = if j.detail.is_empty() { "-" } else { &j.detail };
                    let mut b = format!("{dev}: got {} ({d}), expected {}", j.got, j.want);
                    if !j.reason.is_empty() {
                        b += &format!(" ({})", j.reason);
                    }
                    bad.push(b);
                }
            }
            let test = format!("{prefix}:{}", case_name(cid));
            if bad.is_empty() {
                Row {
                    test,
                    status: "PASS".into(),
                    secs: 0,
                    bw: String::new(),
                    detail: parts.join(", "),
                }
            } else {
                Row::fail(test, bad.join("; "))
            }
        })
        .collect()
}

/// The committed table: case, one column per device, reason; `notes` are lines printed above it.
pub fn table_md(
    judged: &[(String, Judgement)],
    title: &str,
    command: &str,
    notes: &[String],
) -> String {
    let mut out = vec![
        format!("# {title}"),
        String::new(),
        format!("Command: `{command}`"),
        String::new(),
    ];
    for (dev, jd) in judged {
        let counts: Vec<String> = STATUSES
            .iter()
            .map(|s| (s, jd.values().filter(|j| j.got == *s).count()))
            .filter(|(_, c)| *c > 0)
            .map(|(s, c)| format!("{c} {s}"))
            .collect();
        out.push(format!("- {dev}: {}", counts.join(", ")));
    }
    out.extend(notes.iter().map(|n| format!("- {n}")));
    let devs: Vec<&str> = judged.iter().map(|(d, _)| d.as_str()).collect();
    out.push(String::new());
    out.push(format!("| case | {} | reason |", devs.join(" | ")));
    out.push(format!("|---|{}---|", "---|".repeat(devs.len())));
    for cid in all_cases(judged) {
        let (mut cells, mut reasons) = (Vec::new(), Vec::<String>::new());
        for (dev, jd) in judged {
            let Some(j) = jd.get(cid) else {
                cells.push("-".to_string());
                continue;
            };
            cells.push(if j.ok {
                j.got.clone()
            } else {
                format!("**{}** (expected {})", j.got, j.want)
            });
            let why = if !j.reason.is_empty() {
                j.reason.as_str()
            } else if j.got == "skip" {
                j.detail.as_str()
            } else {
                ""
            };
            if !why.is_empty() && !reasons.iter().any(|r| r == why) {
                reasons.push(if devs.len() > 1 && j.got != "pass" {
                    format!("{dev}: {why}")
                } else {
                    why.to_string()
                });
            }
        }
        let reasons: Vec<String> = reasons.iter().map(|r| r.replace('|', "\\|")).collect();
        out.push(format!(
            "| {} | {} | {} |",
            case_name(cid),
            cells.join(" | "),
            reasons.join("; ")
        ));
    }
    out.join("\n") + "\n"
}
