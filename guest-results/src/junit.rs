//! JUnit XML from the project's test output (`guest-results junit`, used by
//! scripts/test.sh --junit and ci/matrix.sh --junit; it replaced
//! scripts/junit.py and writes the same bytes for the same inputs).
//!
//! Inputs: result records (`PASS NAME: detail` / `FAIL ...` / `SKIPPED ...`
//! lines, as scripts/test.sh and the check scripts print them), `cargo
//! test` output, a matrix run's results.json, and other JUnit files whose
//! `<testsuite>`s are copied in.

use std::sync::LazyLock;

use regex::Regex;

use crate::pytext::{splitlines, strip, take_chars};
use crate::xml::Element;

/// A test case's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Passed.
    Pass,
    /// Failed.
    Fail,
    /// Skipped (or ignored).
    Skip,
    /// Anything else a results file said: written as a plain test case and
    /// counted nowhere (as scripts/junit.py did).
    Other,
}

impl Status {
    /// "PASS", "FAIL", "SKIP" (and "SKIPPED"); anything else is [`Status::Other`].
    pub fn parse(s: &str) -> Self {
        match s {
            "PASS" => Status::Pass,
            "FAIL" => Status::Fail,
            "SKIP" | "SKIPPED" => Status::Skip,
            _ => Status::Other,
        }
    }
}

/// One test case.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    /// The `<testsuite>` (and classname) it goes to.
    pub suite: String,
    /// The test's name.
    pub name: String,
    /// Its outcome.
    pub status: Status,
    /// One line about it (the failure's or skip's message).
    pub detail: String,
    /// Seconds it took.
    pub secs: f64,
    /// Captured output (a failed cargo test's stdout section).
    pub output: String,
}

impl Case {
    /// A case with no time and no output.
    pub fn new(suite: &str, name: &str, status: Status, detail: &str) -> Self {
        Case {
            suite: suite.into(),
            name: name.into(),
            status,
            detail: detail.into(),
            secs: 0.0,
            output: String::new(),
        }
    }
}

/// Passed, failed and skipped counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Cases that passed.
    pub passed: usize,
    /// Cases that failed.
    pub failed: usize,
    /// Cases that were skipped.
    pub skipped: usize,
}

impl Counts {
    fn add(&mut self, s: Status) {
        match s {
            Status::Pass => self.passed += 1,
            Status::Fail => self.failed += 1,
            Status::Skip => self.skipped += 1,
            Status::Other => {}
        }
    }

    /// All cases counted.
    pub fn total(&self) -> usize {
        self.passed + self.failed + self.skipped
    }
}

fn re(s: &str) -> Regex {
    Regex::new(s).expect("a constant regex")
}

static RECORD: LazyLock<Regex> =
    LazyLock::new(|| re(r"^(PASS|FAIL|SKIPPED|SKIP)\s+(\S.*?)(?::\s+(.*))?\s*$"));
static LIBTEST: LazyLock<Regex> = LazyLock::new(|| {
    re(r"^test (.+?)(?: - should panic)? \.\.\. (ok|FAILED|ignored)(?:, (.*))?\s*$")
});
static RUNNING: LazyLock<Regex> = LazyLock::new(|| {
    re(r"^\s*Running (?:unittests )?(\S+)(?: \((?:.*/)?([^/]+?)(?:-[0-9a-f]{16})?\))?\s*$")
});
static SUMMARY: LazyLock<Regex> =
    LazyLock::new(|| re(r"^(\d+) passed, (\d+) failed(?:, (\d+) skipped)?"));
static SECTION: LazyLock<Regex> = LazyLock::new(|| re(r"(?m)^---- (\S+) stdout ----$"));
// characters XML 1.0 cannot carry (terminal escapes, NULs in guest consoles)
static BAD_XML: LazyLock<Regex> =
    LazyLock::new(|| re("[\x00-\x08\x0b\x0c\x0e-\x1f\u{fffe}\u{ffff}]"));
static ANSI: LazyLock<Regex> = LazyLock::new(|| re(r"\x1b\[[0-9;?]*[A-Za-z]"));

/// Drops terminal colour escapes and replaces what XML cannot carry by `?`.
pub fn clean(s: &str) -> String {
    BAD_XML
        .replace_all(&ANSI.replace_all(s, ""), "?")
        .into_owned()
}

/// Reads a log as Python's text mode does (`errors="replace"`, universal
/// newlines), so line splitting matches what the records were judged on.
pub fn text_of(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .replace("\r\n", "\n")
        .replace('\r', "\n")
}

/// Cases from PASS/FAIL/SKIPPED record lines; the last record of a name wins
/// (a script may repeat every record in its closing summary) and keeps the
/// place of the first.
pub fn parse_records(text: &str, suite: &str) -> Vec<Case> {
    let mut cases: Vec<Case> = Vec::new();
    for line in splitlines(text) {
        let line = clean(line);
        let Some(m) = RECORD.captures(&line) else {
            continue;
        };
        let name = &m[2];
        let c = Case::new(
            suite,
            name,
            Status::parse(&m[1]),
            m.get(3).map_or("", |d| d.as_str()),
        );
        match cases.iter_mut().find(|c| c.name == name) {
            Some(old) => *old = c,
            None => cases.push(c),
        }
    }
    cases
}

/// (passed, failed, skipped) of the last "N passed, M failed, K skipped"
/// line, to check the records against.
pub fn summary_counts(text: &str) -> Option<Counts> {
    let mut last = None;
    for line in splitlines(text) {
        if let Some(m) = SUMMARY.captures(line) {
            let n = |i| m.get(i).and_then(|x| x.as_str().parse().ok()).unwrap_or(0);
            last = Some(Counts {
                passed: n(1),
                failed: n(2),
                skipped: n(3),
            });
        }
    }
    last
}

/// Cases from `cargo test` output, each classed by its test binary
/// (`SUITE.BINARY`, `SUITE.doc-CRATE`); a failure carries its
/// "---- NAME stdout ----" section.
pub fn parse_libtest(text: &str, suite: &str) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut binary = suite.to_string();
    for line in splitlines(text) {
        let line = clean(line);
        if let Some(m) = RUNNING.captures(&line) {
            let bin = m.get(2).map(|x| x.as_str()).filter(|x| !x.is_empty());
            // "Running `...`" lines of build scripts name no binary path
            if m[1].contains('/') || bin.is_some() {
                binary = format!("{suite}.{}", bin.unwrap_or(&m[1]));
                continue;
            }
        }
        if line.starts_with("   Doc-tests ") {
            let krate = line.split_whitespace().last().unwrap_or("");
            binary = format!("{suite}.doc-{krate}");
            continue;
        }
        if let Some(m) = LIBTEST.captures(&line) {
            let status = match &m[2] {
                "ok" => Status::Pass,
                "FAILED" => Status::Fail,
                _ => Status::Skip,
            };
            cases.push(Case::new(
                &binary,
                &m[1],
                status,
                m.get(3).map_or("", |d| d.as_str()),
            ));
        }
    }
    // the captured output of failed tests: "---- NAME stdout ----" up to the
    // next such section (the last one up to the "failures:" list)
    let all = clean(text);
    let heads: Vec<_> = SECTION.captures_iter(&all).collect();
    let mut out: Vec<(&str, String)> = Vec::new();
    for (i, h) in heads.iter().enumerate() {
        let (Some(whole), Some(name)) = (h.get(0), h.get(1)) else {
            continue;
        };
        let end = heads
            .get(i + 1)
            .and_then(|n| n.get(0))
            .map_or(all.len(), |n| n.start());
        let body = &all[whole.end()..end];
        let body = body.split("\nfailures:\n").next().unwrap_or("");
        out.retain(|(n, _)| *n != name.as_str());
        out.push((name.as_str(), strip(body).to_string()));
    }
    for c in cases.iter_mut().filter(|c| c.status == Status::Fail) {
        if let Some((_, o)) = out.iter().find(|(n, _)| *n == c.name) {
            c.output = o.clone();
        }
    }
    cases
}

/// Cases of a matrix run (its results.json's "cells"): one `<testsuite>`
/// `matrix.KERNEL/CELL` per cell, one case per test row, the bandwidth (if
/// any) after the detail.
pub fn matrix_cases(cells: &[serde_json::Value]) -> Vec<Case> {
    let s = |v: Option<&serde_json::Value>| v.and_then(|v| v.as_str()).unwrap_or("").to_string();
    let mut cases = Vec::new();
    for r in cells {
        let suite = format!("matrix.{}/{}", s(r.get("kernel")), s(r.get("cell")));
        let tests = r.get("tests").and_then(|t| t.as_array());
        for t in tests.into_iter().flatten() {
            let bw = s(t.get("bw"));
            let mut detail = s(t.get("detail"));
            if !bw.is_empty() {
                detail += &format!(" ({bw} MiB/s)");
            }
            let mut c = Case::new(
                &suite,
                &s(t.get("test")),
                Status::parse(&s(t.get("status"))),
                &detail,
            );
            c.secs = t.get("secs").and_then(|x| x.as_f64()).unwrap_or(0.0);
            cases.push(c);
        }
    }
    cases
}

fn case_status(tc: &Element) -> Status {
    if tc.find("failure").is_some() || tc.find("error").is_some() {
        Status::Fail
    } else if tc.find("skipped").is_some() {
        Status::Skip
    } else {
        Status::Pass
    }
}

/// The `<testsuites>` document: one `<testsuite>` per suite of `cases` (in
/// first-seen order), then the `merged` ones as they are; and the counts of
/// both.
pub fn document(cases: &[Case], name: &str, merged: Vec<Element>) -> (Element, Counts) {
    let mut root = Element::new("testsuites");
    root.set("name", name);
    let mut suites: Vec<(&str, Vec<&Case>)> = Vec::new();
    for c in cases {
        match suites.iter_mut().find(|(s, _)| *s == c.suite) {
            Some((_, cs)) => cs.push(c),
            None => suites.push((&c.suite, vec![c])),
        }
    }
    let mut n = Counts::default();
    for (sname, cs) in suites {
        let mut ts = Element::new("testsuite");
        let count = |st| cs.iter().filter(|c| c.status == st).count().to_string();
        ts.set("name", sname);
        ts.set("tests", cs.len().to_string());
        ts.set("failures", count(Status::Fail));
        ts.set("skipped", count(Status::Skip));
        ts.set("errors", "0");
        ts.set(
            "time",
            format!("{:.3}", cs.iter().map(|c| c.secs).sum::<f64>()),
        );
        for c in cs {
            n.add(c.status);
            let mut tc = Element::new("testcase");
            tc.set("classname", sname);
            tc.set("name", clean(&c.name));
            tc.set("time", format!("{:.3}", c.secs));
            let detail = clean(&c.detail);
            let message = take_chars(&detail, 1000);
            match c.status {
                Status::Fail => {
                    let mut f = Element::new("failure");
                    f.set(
                        "message",
                        if message.is_empty() {
                            "failed"
                        } else {
                            message
                        },
                    );
                    f.text = if c.output.is_empty() {
                        detail.clone()
                    } else {
                        clean(&c.output)
                    };
                    tc.children.push(f);
                }
                Status::Skip => {
                    let mut s = Element::new("skipped");
                    s.set("message", message);
                    tc.children.push(s);
                }
                _ if !c.output.is_empty() => {
                    let mut o = Element::new("system-out");
                    o.text = clean(&c.output);
                    tc.children.push(o);
                }
                _ => {}
            }
            ts.children.push(tc);
        }
        root.children.push(ts);
    }
    for ts in merged {
        let mut tcs = Vec::new();
        ts.iter_tag("testcase", &mut tcs);
        for tc in tcs {
            n.add(case_status(tc));
        }
        root.children.push(ts);
    }
    root.set("tests", n.total().to_string());
    root.set("failures", n.failed.to_string());
    root.set("skipped", n.skipped.to_string());
    root.indent();
    (root, n)
}

/// The `<testsuite>` elements of a JUnit document (wherever they are in it).
pub fn testsuites_of(doc: &str) -> Result<Vec<Element>, crate::xml::ParseError> {
    let root = crate::xml::parse(doc)?;
    let mut found = Vec::new();
    root.iter_tag("testsuite", &mut found);
    Ok(found.into_iter().cloned().collect())
}
