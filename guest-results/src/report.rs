//! A matrix run's Markdown report (`guest-results report`): results.md from
//! results.json, and `--combine`, one report from several runs (the shards
//! of one run). It replaced ci/matrix.py's `fmt_md` and `combine_runs` and
//! writes the same text.

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::pyjson::Json;

/// Why a report could not be made.
#[derive(Debug, Error)]
pub enum ReportError {
    /// A results file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// A results file is not JSON.
    #[error("{path}: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: serde_json::Error,
    },
    /// A results file lacks what every run writes.
    #[error("{path}: no {what}")]
    Missing {
        /// The file.
        path: PathBuf,
        /// The missing member.
        what: &'static str,
    },
}

/// One run's results.json: its "meta" and its "cells" (one result record
/// per cell, as the matrix runner writes them).
#[derive(Debug, Clone)]
pub struct Run {
    /// date, host, accel, qemu_version, commit, command, summary, ...
    pub meta: Json,
    /// The cells' result records.
    pub cells: Vec<Json>,
}

/// Reads a run's results.json (`path`, or `path/results.json` for a
/// directory).
pub fn load_run(path: &Path) -> Result<Run, ReportError> {
    let file = if path.is_dir() {
        path.join("results.json")
    } else {
        path.to_path_buf()
    };
    let text = std::fs::read_to_string(&file).map_err(|source| ReportError::Read {
        path: file.clone(),
        source,
    })?;
    let j: Json = serde_json::from_str(&text).map_err(|source| ReportError::Json {
        path: file.clone(),
        source,
    })?;
    let missing = |what| ReportError::Missing {
        path: file.clone(),
        what,
    };
    let meta = j.get("meta").cloned().ok_or_else(|| missing("meta"))?;
    let cells = match j.get("cells") {
        Some(Json::Array(c)) => c.clone(),
        _ => return Err(missing("cells")),
    };
    Ok(Run { meta, cells })
}

/// Passed, failed and skipped tests over all cells.
pub fn count_tests(cells: &[Json]) -> (usize, usize, usize) {
    let n = |s: &str| {
        cells
            .iter()
            .flat_map(|r| r.at("tests").items())
            .filter(|t| t.at("status").str() == s)
            .count()
    };
    (n("PASS"), n("FAIL"), n("SKIP"))
}

fn name(r: &Json) -> String {
    format!("{}/{}", r.at("kernel"), r.at("cell"))
}

/// `key=value ...` of an object's entries.
fn kv<'a>(c: impl Iterator<Item = &'a (String, Json)>) -> String {
    c.map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The entries of an object sorted by key (Python's `sorted(d.items())`).
fn sorted(j: &Json) -> Vec<&(String, Json)> {
    let mut e: Vec<_> = j.entries().iter().collect();
    e.sort_by(|a, b| a.0.cmp(&b.0));
    e
}

/// results.md of a run: its cells and tests, the guest and daemon counters,
/// the siw workaround, reruns, problems and kept logs, the summary line.
pub fn markdown(results: &[Json], meta: &Json) -> String {
    let mut out = vec![
        format!(
            "# vhost-rdma guest RDMA / SMC-R matrix, {}",
            meta.at("date")
        ),
        String::new(),
    ];
    let mut nets: Vec<String> = results
        .iter()
        .map(|r| match r.get("net") {
            Some(n) => n.to_string(),
            None => "vhost-user".into(),
        })
        .collect();
    nets.sort();
    nets.dedup();
    let or_dash = |s: String| if s.is_empty() { "-".into() } else { s };
    out.push(format!(
        "Guest link: {} (vhost-user = through the vhost-rdma daemon; stream = QEMU -netdev stream, no daemon)",
        or_dash(nets.join(", "))
    ));
    out.push(String::new());
    out.push(format!(
        "Host: {}; accel {}; QEMU {}; commit {}; command `{}`",
        meta.at("host"),
        meta.at("accel"),
        meta.at("qemu_version"),
        meta.at("commit"),
        meta.at("command")
    ));
    out.push(String::new());
    let mut kv_: Vec<String> = results
        .iter()
        .flat_map(|r| {
            r.at("guest_kernel")
                .entries()
                .iter()
                .map(|(_, v)| v.to_string())
        })
        .collect();
    kv_.sort();
    kv_.dedup();
    out.push(format!(
        "Guest kernels (uname -r): {}",
        or_dash(kv_.join(", "))
    ));
    out.push(String::new());
    out.push("## Cells".into());
    out.push(String::new());
    out.push(
        "| cell | status | wall s | boot s (a/b) | tests pass/fail/skip | throughput |".into(),
    );
    out.push("|---|---|---|---|---|---|".into());
    for r in results {
        let (p, f, s) = count_tests(std::slice::from_ref(r));
        let tp: Vec<String> = r
            .at("tests")
            .items()
            .iter()
            .filter(|t| t.at("bw").truthy())
            .map(|t| format!("{} {} MiB/s", t.at("test"), t.at("bw")))
            .collect();
        let boot: Vec<String> = ["a", "b"]
            .iter()
            .map(|g| match r.at("boot_s").get(g) {
                Some(v) => v.to_string(),
                None => "?".into(),
            })
            .collect();
        let mut st = r.at("status").to_string();
        if r.at("reruns").truthy() {
            st += &format!(
                " after {} rerun(s), known flake",
                r.at("reruns").items().len()
            );
        }
        out.push(format!(
            "| {} | **{st}** | {} | {} | {p}/{f}/{s} | {} |",
            name(r),
            r.at("wall_s"),
            boot.join("/"),
            or_dash(tp.join(", "))
        ));
    }
    out.push(String::new());
    out.push("## Tests".into());
    out.push(String::new());
    out.push("| cell | test | status | secs | BW | detail |".into());
    out.push("|---|---|---|---|---|---|".into());
    for r in results {
        for t in r.at("tests").items() {
            let bw = if t.at("bw").truthy() {
                format!("{} MiB/s", t.at("bw"))
            } else {
                String::new()
            };
            out.push(format!(
                "| {} | {} | {} | {} | {bw} | {} |",
                name(r),
                t.at("test"),
                t.at("status"),
                t.at("secs"),
                t.at("detail").to_string().replace('|', "/")
            ));
        }
    }
    let cnt: Vec<&Json> = results
        .iter()
        .filter(|r| r.at("counters").truthy())
        .collect();
    if !cnt.is_empty() {
        out.extend([
            String::new(),
            "## Guest counters at the end of each cell".into(),
            String::new(),
            "`rdma statistic show link` (non-zero; duplicate_request / out_of_seq_request / *retry* \
             point at retransmissions) and eth0 drops, A = server side, B = client side."
                .into(),
            String::new(),
        ]);
        for r in cnt {
            for (g, c) in sorted(r.at("counters")) {
                // eth0's packet counts are noise next to its drops and errors
                let shown = c.entries().iter().filter(|(k, _)| {
                    !k.starts_with("eth0_")
                        || ["dropped", "errors", "missed"]
                            .iter()
                            .any(|e| k.ends_with(e))
                });
                out.push(format!("- {} {g}: {}", name(r), kv(shown)));
            }
        }
    }
    let dcs: Vec<&Json> = results
        .iter()
        .filter(|r| r.at("daemon_counters").truthy())
        .collect();
    if !dcs.is_empty() {
        out.extend([
            String::new(),
            "## Daemon counters at the end of each cell".into(),
            String::new(),
            "`vhost-rdma ctl status` per port (a = server guest, b = client guest).".into(),
            String::new(),
        ]);
        for r in dcs {
            for (port, c) in sorted(r.at("daemon_counters")) {
                out.push(format!(
                    "- {} port {port}: {}",
                    name(r),
                    kv(c.entries().iter())
                ));
            }
        }
    }
    let ws: Vec<&Json> = results
        .iter()
        .filter(|r| r.at("siw_settle").truthy() || r.at("what").str().contains("mpa-settle"))
        .collect();
    if !ws.is_empty() {
        out.extend([
            String::new(),
            "## Daemon workaround in the siw cells".into(),
            String::new(),
            "The guest kernel's siw has two connection-setup races (ci/README.md); these cells ran with the \
             daemon's documented `mpa-settle` rule (docs/faults-and-captures.md, \"Linux siw workaround\"), \
             which holds TCP data behind an MPA Reply for a while. Without it (`--siw-settle-ms 0`) the races \
             fail siw cells on a loaded host."
                .into(),
            String::new(),
        ]);
        for r in ws {
            let how = if r.at("siw_settle").truthy() {
                r.at("siw_settle").to_string()
            } else {
                "mpa-settle rule installed".into()
            };
            out.push(format!("- {}: {how}", name(r)));
        }
    }
    let rr: Vec<(&Json, &Json)> = results
        .iter()
        .flat_map(|r| r.at("reruns").items().iter().map(move |x| (r, x)))
        .collect();
    if !rr.is_empty() {
        out.extend([
            String::new(),
            "## Reruns (known flakes)".into(),
            String::new(),
            "A cell whose every failure is a recognised flake - one of the two diagnosed races in the guest \
             kernel's siw connection setup (siw cells, ci/README.md), or perftest failing to calibrate its \
             clock on a loaded host - is rerun, at most `--siw-reruns` times. Earlier attempts:"
                .into(),
            String::new(),
        ]);
        for (r, x) in rr {
            let logs = if x.at("logs").truthy() {
                format!("; logs `{}/`", x.at("logs"))
            } else {
                String::new()
            };
            out.push(format!(
                "- {} attempt {} ({} s): {}{logs}",
                name(r),
                x.at("attempt"),
                x.at("wall_s"),
                x.at("race")
            ));
        }
    }
    let probs: Vec<String> = results
        .iter()
        .flat_map(|r| {
            r.at("problems")
                .items()
                .iter()
                .map(move |p| format!("- {}: {p}", name(r)))
        })
        .collect();
    if !probs.is_empty() {
        out.extend([String::new(), "## Cell problems".into(), String::new()]);
        out.extend(probs);
    }
    let logs: Vec<&Json> = results.iter().filter(|r| r.at("logs").truthy()).collect();
    if !logs.is_empty() {
        out.extend([String::new(), "## Logs kept".into(), String::new()]);
        for r in logs {
            out.push(format!(
                "- {} ({}): `{}/`",
                name(r),
                r.at("status"),
                r.at("logs")
            ));
        }
    }
    out.extend([String::new(), meta.at("summary").to_string(), String::new()]);
    out.join("\n")
}

/// The order runs list cells in: kernels, then cells, each by its place in
/// the given order (unknown ones last, in the order they came).
pub struct CellOrder {
    /// Kernel versions in order ("7.3", "6.12").
    pub kernels: Vec<String>,
    /// Cell names in order.
    pub cells: Vec<String>,
}

impl CellOrder {
    fn key(&self, r: &Json) -> (usize, usize) {
        let at = |list: &[String], v: &str| list.iter().position(|x| x == v).unwrap_or(99);
        (
            at(&self.kernels, r.at("kernel").str()),
            at(&self.cells, r.at("cell").str()),
        )
    }
}

/// What `--combine` made: the report and the counts.
pub struct Combined {
    /// The Markdown.
    pub markdown: String,
    /// The summary line ("N passed, M failed, K skipped").
    pub summary: String,
    /// Whether any test failed.
    pub failed: bool,
}

/// One report from several runs (e.g. the shards of one run): a later run's
/// cell replaces an earlier run's same kernel/cell; the Cells and Tests
/// tables are those one run of all the cells gives (same rows, same
/// order), after a "Source runs" section naming every run and the cells
/// taken from it. The host, QEMU and commit are the last run's; `date` is
/// the report's.
pub fn combine(runs: &[Run], order: &CellOrder, date: &str) -> Combined {
    // (kernel, cell) -> (run number, record), first-seen order kept
    let mut cells: Vec<((String, String), usize, &Json)> = Vec::new();
    let mut sources = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        let m = &run.meta;
        sources.push(format!(
            "{}, commit {}, `{}`: {}",
            m.at("date"),
            m.at("commit"),
            m.at("command"),
            m.at("summary")
        ));
        for r in &run.cells {
            let key = (r.at("kernel").to_string(), r.at("cell").to_string());
            match cells.iter_mut().find(|(k, _, _)| *k == key) {
                Some(e) => {
                    e.1 = i + 1;
                    e.2 = r;
                }
                None => cells.push((key, i + 1, r)),
            }
        }
    }
    // a stable sort: cells the order does not know stay in first-seen order
    cells.sort_by_key(|(_, _, r)| order.key(r));
    let sources: Vec<String> = sources
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let taken: Vec<String> = cells
                .iter()
                .filter(|(_, run, _)| *run == i + 1)
                .map(|(_, _, r)| name(r))
                .collect();
            let taken = if taken.is_empty() {
                "none (all replaced)".into()
            } else {
                taken.join(", ")
            };
            format!("{}. {text}; cells: {taken}", i + 1)
        })
        .collect();
    let results: Vec<Json> = cells.iter().map(|(_, _, r)| (*r).clone()).collect();
    let (p, f, s) = count_tests(&results);
    let summary = format!("{p} passed, {f} failed, {s} skipped");
    let mut meta = runs
        .last()
        .map_or(Json::Object(Vec::new()), |r| r.meta.clone());
    let command = (1..=runs.len())
        .map(|i| format!("run {i}"))
        .collect::<Vec<_>>()
        .join(" + ");
    if let Json::Object(kv) = &mut meta {
        for (k, v) in [("date", date), ("command", &command), ("summary", &summary)] {
            match kv.iter_mut().find(|(old, _)| old == k) {
                Some(e) => e.1 = Json::Str(v.to_string()),
                None => kv.push((k.to_string(), Json::Str(v.to_string()))),
            }
        }
    }
    let md = markdown(&results, &meta).replacen(
        "\n## Cells\n",
        &format!(
            "\n## Source runs (each cell from the last run that ran it)\n\n{}\n\n## Cells\n",
            sources.join("\n")
        ),
        1,
    );
    Combined {
        markdown: md,
        summary,
        failed: f > 0,
    }
}
