//! The device-fault cells ([`judge_cell`], [`trace_row`]):
//! each fault case's row judged against what the case expects, the driver
//! developer's table, and the device-trace row. They replaced ci/matrix.py's
//! `judge_fault_case`, `fault_table_md` and `trace_test` and give the same
//! rows and text.

use std::path::Path;
use std::sync::LazyLock;

use regex::Regex;
use serde::Deserialize;
use thiserror::Error;

use crate::pyjson::Json;
use crate::pytext::{splitlines, strip};

/// One fault case of a cell (the matrix's fault cells).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct FaultCase {
    /// The case's name; its row is `fault-CASE`.
    pub case: String,
    /// The fault kind armed through `ctl device-fault`.
    pub kind: String,
    /// The driver path it exercises (for the table).
    pub driver: String,
    /// Regexes that must all match the row's detail (the guest's evidence).
    pub expect: Vec<String>,
    /// Whether traffic must recover after the fault is cleared (false: the
    /// driver is known not to, a finding).
    pub recovers: bool,
    /// Why the device keeps no hit count for this kind (then hits are not
    /// judged, only the evidence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_hits: Option<String>,
}

/// A fault case's expectation regex that does not compile.
#[derive(Debug, Error)]
#[error("fault case {case}: expect /{pattern}/: {source}")]
pub struct PatternError {
    /// The case.
    pub case: String,
    /// The regex.
    pub pattern: String,
    /// Why it does not compile.
    pub source: regex::Error,
}

/// A case with its regexes compiled.
pub struct Judge {
    case: FaultCase,
    expect: Vec<(String, Regex)>,
}

impl Judge {
    /// Compiles the case's regexes.
    pub fn new(case: FaultCase) -> Result<Self, PatternError> {
        let expect = case
            .expect
            .iter()
            .map(|x| {
                Regex::new(x)
                    .map(|r| (x.clone(), r))
                    .map_err(|source| PatternError {
                        case: case.case.clone(),
                        pattern: x.clone(),
                        source,
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Judge { case, expect })
    }

    /// The case.
    pub fn case(&self) -> &FaultCase {
        &self.case
    }
}

fn re(s: &str) -> Regex {
    Regex::new(s).expect("a constant regex")
}

static HITS: LazyLock<Regex> = LazyLock::new(|| re(r"\bhits=(\d+)"));
static RECOVERED: LazyLock<Regex> = LazyLock::new(|| re(r"\brecovered=(yes|no)\b"));
// Python's `$` (no MULTILINE) also matches before a final newline
static EVIDENCE: LazyLock<Regex> = LazyLock::new(|| re(r"evidence: (.*?)(?: \| |\n?\z)"));

fn with(row: &Json, status: &str, detail: String) -> Json {
    let mut kv = row.entries().to_vec();
    for (k, v) in [("status", status.to_string()), ("detail", detail)] {
        match kv.iter_mut().find(|(old, _)| old == k) {
            Some(e) => e.1 = Json::Str(v),
            None => kv.push((k.into(), Json::Str(v))),
        }
    }
    Json::Object(kv)
}

/// A fault case's row judged: the rule fired (`hits=N`, N > 0, unless the
/// kind keeps no hit count), every expected evidence regex matches, and
/// traffic recovered after the clear exactly when the driver is expected to
/// recover. A case the driver does not recover from passes only when it
/// does not recover, and says so as a finding. A row without the guest's
/// result stays as it is.
pub fn judge_case(row: &Json, j: &Judge) -> Json {
    let case = &j.case;
    let det = row.at("detail").str();
    let failed = row.at("status").str() == "FAIL";
    if failed && det.contains("no result from") {
        return row.clone();
    }
    let mut why = Vec::new();
    let hits = HITS
        .captures(det)
        .and_then(|m| m.get(1))
        .map(|m| m.as_str());
    let no_hits = case.no_hits.as_deref().filter(|s| !s.is_empty());
    if no_hits.is_none() && hits.is_none_or(|h| h.chars().all(|c| c.to_digit(10) == Some(0))) {
        why.push(format!(
            "the fault rule never fired (hits={})",
            hits.unwrap_or("?")
        ));
    }
    let missing: Vec<String> = j
        .expect
        .iter()
        .filter(|(_, r)| !r.is_match(det))
        .map(|(x, _)| format!("/{x}/"))
        .collect();
    if !missing.is_empty() {
        why.push(format!(
            "expected evidence not seen: {}",
            missing.join(", ")
        ));
    }
    let rec = RECOVERED
        .captures(det)
        .and_then(|m| m.get(1))
        .map(|m| m.as_str() == "yes");
    match rec {
        None => why.push("no recovered=yes|no in the result".into()),
        Some(true) if !case.recovers => why.push(
            "traffic recovered after the clear, but the 7.3 driver was expected not to".into(),
        ),
        Some(false) if case.recovers => {
            why.push("traffic did not recover after the fault was cleared".into())
        }
        _ => {}
    }
    if failed {
        why.push("the guest reported the case as FAIL".into());
    }
    let mut lead = format!("kind {}: ", case.kind);
    if let Some(n) = no_hits {
        lead += &format!("(hits not judged: {n}) ");
    }
    if !case.recovers && rec == Some(false) {
        lead += "finding: the 7.3 driver does not recover; ";
    }
    if why.is_empty() {
        with(row, "PASS", format!("{lead}{det}"))
    } else {
        with(row, "FAIL", format!("{lead}{} | {det}", why.join("; ")))
    }
}

/// Every `fault-CASE` row judged by its case; other rows as they are.
pub fn judge_rows(rows: &[Json], judges: &[Judge]) -> Vec<Json> {
    rows.iter()
        .map(|r| {
            let test = r.at("test").str();
            // the last case of a name, as a dict built from the list keeps it
            match judges
                .iter()
                .rev()
                .find(|j| format!("fault-{}", j.case.case) == test)
            {
                Some(j) => judge_case(r, j),
                None => r.clone(),
            }
        })
        .collect()
}

/// The driver developer's table (docs/driver-bench.md) from one run: kind,
/// case, driver path, the evidence the guest showed, recovered or not, the
/// row's verdict.
pub fn table_md(kernel: &str, cell: &str, rows: &[Json], cases: &[FaultCase], cmd: &str) -> String {
    let mut out = vec![
        format!("## {kernel}/{cell}: what each fault does to the {kernel} driver"),
        String::new(),
        format!("Command: `{cmd}`"),
        String::new(),
        "| kind | case | driver path (7.3) | guest evidence (this run) | recovered after clear | verdict |"
            .into(),
        "|---|---|---|---|---|---|".into(),
    ];
    for c in cases {
        let name = format!("fault-{}", c.case);
        // the last row of a name, as a dict built from the rows keeps it
        let row = rows.iter().rev().find(|r| r.at("test").str() == name);
        let (det, status) = match row {
            Some(r) => (
                r.get("detail").map_or(String::new(), Json::to_string),
                r.at("status").to_string(),
            ),
            None => ("no row".into(), "FAIL".into()),
        };
        let ev = EVIDENCE
            .captures(&det)
            .and_then(|m| m.get(1))
            .map(|m| m.as_str().to_string());
        let rec = RECOVERED
            .captures(&det)
            .and_then(|m| m.get(1))
            .map_or("?", |m| m.as_str());
        let recd = format!(
            "{rec}{}",
            if c.recovers {
                ""
            } else {
                " (expected: no - a driver finding)"
            }
        );
        let text = ev.unwrap_or_else(|| det.clone()).replace('|', "/");
        out.push(format!(
            "| `{}` | {} | {} | {text} | {recd} | {status} |",
            c.kind, c.case, c.driver
        ));
    }
    out.join("\n") + "\n"
}

/// The host row "device-trace": every trace file of the cell exists in
/// `dir`, has records, and names the driver interactions expected in it.
/// `traces`: file name -> names, in order.
pub fn trace_row(dir: &Path, traces: &[(String, Vec<String>)]) -> Json {
    let (mut bad, mut good) = (Vec::new(), Vec::new());
    for (file, names) in traces {
        let Ok(bytes) = std::fs::read(dir.join(file)) else {
            bad.push(format!("{file}: missing"));
            continue;
        };
        let text = crate::junit::text_of(&bytes);
        let records = splitlines(&text)
            .into_iter()
            .filter(|l| !strip(l).is_empty())
            .count();
        let lacking: Vec<&str> = names
            .iter()
            .filter(|n| !text.contains(n.as_str()))
            .map(String::as_str)
            .collect();
        if records == 0 || !lacking.is_empty() {
            let lacking = if lacking.is_empty() {
                "-".to_string()
            } else {
                lacking.join(", ")
            };
            bad.push(format!("{file}: {records} records, lacks {lacking}"));
        } else {
            good.push(format!(
                "{file}: {records} records, names {}",
                names.join(", ")
            ));
        }
    }
    let status = if !traces.is_empty() && bad.is_empty() {
        "PASS"
    } else {
        "FAIL"
    };
    bad.extend(good);
    let s = |v: &str| Json::Str(v.into());
    Json::Object(vec![
        ("test".into(), s("device-trace")),
        ("status".into(), s(status)),
        ("secs".into(), Json::Int(0)),
        ("bw".into(), s("")),
        ("detail".into(), s(&bad.join("; "))),
    ])
}

/// A fault cell's rows judged ([`judge_rows`]) against its `cases`, and the
/// driver developer's table ([`table_md`]); an error when a case's regex
/// does not compile.
pub fn judge_cell(
    cases: &[FaultCase],
    rows: &[Json],
    kernel: &str,
    cell: &str,
    command: &str,
) -> Result<(Vec<Json>, String), PatternError> {
    let judges = cases
        .iter()
        .cloned()
        .map(Judge::new)
        .collect::<Result<Vec<_>, _>>()?;
    let judged = judge_rows(rows, &judges);
    let table = table_md(kernel, cell, &judged, cases, command);
    Ok((judged, table))
}
