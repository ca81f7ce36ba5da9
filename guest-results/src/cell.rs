//! One `upstream` matrix cell: every device's log judged against its
//! expectations file, as rows, notes and the Markdown table.

use std::path::Path;

use serde::Serialize;

use crate::pytext::{file_lines, strip};
use crate::upstream::{self, Judgement, Results, Row};

/// Which upstream suite a cell ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suite {
    /// rdma-core's `tests/` (unittest -v output).
    RdmaCore,
    /// The kernel's NIC selftests (KTAP).
    Nic,
}

impl Suite {
    /// The name rows, expectation files and logs use.
    pub fn name(self) -> &'static str {
        match self {
            Suite::RdmaCore => "rdma-core",
            Suite::Nic => "nic",
        }
    }
}

/// One guest's part of the cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// The guest's name (rows name it when it reported nothing).
    pub guest: String,
    /// The device under test: "erdma", "rxe", "gve", "virtio"; also picks
    /// `SUITE-DEVICE.expect`.
    pub dev: String,
    /// The guest's log of the suite (a missing file counts as empty).
    pub log: String,
    /// rdma-core: the file listing every case id the suite has (those never
    /// started are "missing").
    pub cases: Option<String>,
}

/// What the cell judged: the rows, the notes above the table, the table.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// One row per case (after a FAIL row per unusable expectations file or
    /// guest without results), as the matrix appends them.
    pub rows: Vec<Row>,
    /// Python process deaths and what became of the case.
    pub notes: Vec<String>,
    /// (device, cases that passed), in device order.
    pub passed: Vec<(String, usize)>,
    /// The Markdown table.
    #[serde(skip)]
    pub markdown: String,
}

fn read_lossy(path: &str) -> Option<String> {
    std::fs::read(path)
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// Judges one cell: each device's log against `EXPECT_DIR/SUITE-DEV.expect`.
pub fn judge_cell(
    suite: Suite,
    expect_dir: &Path,
    devices: &[Device],
    title: &str,
    command: &str,
) -> Verdict {
    let name = suite.name();
    let (mut bad, mut notes) = (Vec::new(), Vec::new());
    let mut parsed: Vec<(String, Results, Vec<upstream::Rule>, Vec<String>)> = Vec::new();
    for d in devices {
        let text = read_lossy(&d.log).unwrap_or_default();
        let results = match suite {
            Suite::RdmaCore => {
                let (results, _) = upstream::parse_log(&text);
                for (cid, why) in upstream::deaths(&text) {
                    let verdict = results.get(&cid).map_or("missing", |r| r.0.as_str());
                    let fate = if verdict == "killed" {
                        "killed for good (it died again on its own)".to_string()
                    } else {
                        format!("rerun alone in a fresh process: {verdict}")
                    };
                    notes.push(format!(
                        "{}: python3 died during {}: {why}; {fate}",
                        d.dev,
                        upstream::case_name(&cid)
                    ));
                }
                results
            }
            Suite::Nic => upstream::parse_ktap_log(&text),
        };
        let listed: Vec<String> = d
            .cases
            .as_deref()
            .and_then(read_lossy)
            .map(|t| {
                file_lines(&t)
                    .into_iter()
                    .map(strip)
                    .filter(|l| l.starts_with("tests."))
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        let path = expect_dir.join(format!("{name}-{}.expect", d.dev));
        let rules = upstream::load_expect(&path.to_string_lossy()).unwrap_or_else(|e| {
            bad.push(Row::fail(format!("{name}-expect-{}", d.dev), e.to_string()));
            Vec::new()
        });
        if results.is_empty() {
            bad.push(Row::fail(
                format!("{name}-results-{}", d.dev),
                format!("no {name} results from {} ({})", d.guest, d.log),
            ));
        }
        parsed.push((d.dev.clone(), results, rules, listed));
    }
    // every device is judged on every case any of them reported: a case one
    // device lacks is "missing" there, and its expectations must say why
    let union: std::collections::BTreeSet<String> = parsed
        .iter()
        .flat_map(|(_, r, _, ls)| r.keys().chain(ls.iter()).cloned())
        .collect();
    let judged: Vec<(String, Judgement)> = parsed
        .iter()
        .map(|(dev, r, rules, _)| (dev.clone(), upstream::judge(r, rules, &union)))
        .collect();
    let mut rows = bad;
    rows.extend(upstream::rows(&judged, name));
    let markdown = upstream::table_md(&judged, title, command, &notes);
    let passed = judged
        .iter()
        .map(|(dev, j)| (dev.clone(), j.values().filter(|x| x.got == "pass").count()))
        .collect();
    Verdict {
        rows,
        notes,
        passed,
        markdown,
    }
}
