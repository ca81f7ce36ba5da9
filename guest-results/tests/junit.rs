//! The JUnit writer: record and `cargo test` parsing, and `guest-results
//! junit` end to end (the cases of the removed scripts/test_junit.py).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use guest_results::junit::{parse_libtest, parse_records, summary_counts, Case, Counts, Status};
use guest_results::xml::{parse, Element};

const E2E_LOG: &str = "[e2e-vhost] logs: /tmp/x
PASS ping: 3/3 replies
FAIL ib_write_bw: rc=1 \x1b[31mtimeout\x1b[0m
SKIPPED rping: no rdma_cm in this kernel
noise PASS not-a-record: at line start only

== e2e-vhost summary
PASS ping: 3/3 replies
FAIL ib_write_bw: rc=1 timeout
SKIPPED rping: no rdma_cm in this kernel
3 cases: 1 passed, 1 failed, 1 skipped
1 passed, 1 failed, 1 skipped
";

const CARGO_LOG: &str = "   Compiling pci-model v0.1.0
     Running unittests src/lib.rs (/t/debug/deps/pci_model-0123456789abcdef)

running 3 tests
test bar::parses ... ok
test bar::breaks ... FAILED
test slow ... ignored, needs a guest

failures:

---- bar::breaks stdout ----
thread 'bar::breaks' panicked at src/bar.rs:9:5:
assertion `left == right` failed

failures:
    bar::breaks

test result: FAILED. 1 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out

     Running tests/vhost_user.rs (/t/debug/deps/vhost_user-fedcba9876543210)

running 1 test
test connects ... ok

test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out

   Doc-tests pci_model

running 1 test
test pci-model/src/lib.rs - Bar (line 3) ... ok
";

/// A fresh scratch directory for one test (no tempfile crate: a name per
/// test and process is enough, and it is removed first).
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("guest-results-junit-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_guest-results"))
        .arg("junit")
        .args(args)
        .output()
        .expect("guest-results runs")
}

fn root_of(path: &Path) -> Element {
    parse(&std::fs::read_to_string(path).expect("junit file")).expect("well-formed XML")
}

/// (classname, name, status) of every testcase of a JUnit file.
fn cases_of(path: &Path) -> Vec<(String, String, &'static str)> {
    let root = root_of(path);
    let mut tcs = Vec::new();
    root.iter_tag("testcase", &mut tcs);
    tcs.iter()
        .map(|tc| {
            let st = if tc.find("failure").is_some() {
                "FAIL"
            } else if tc.find("skipped").is_some() {
                "SKIP"
            } else {
                "PASS"
            };
            let a = |k| tc.get(k).unwrap_or_default().to_string();
            (a("classname"), a("name"), st)
        })
        .collect()
}

fn p(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temp path")
}

#[test]
fn records_last_wins_and_statuses() {
    let cs = parse_records(E2E_LOG, "e2e-vhost");
    let got: Vec<_> = cs.iter().map(|c| (c.name.as_str(), c.status)).collect();
    assert_eq!(
        got,
        [
            ("ping", Status::Pass),
            ("ib_write_bw", Status::Fail),
            ("rping", Status::Skip)
        ]
    );
    assert_eq!(cs[1].detail, "rc=1 timeout");
    assert_eq!(
        summary_counts(E2E_LOG),
        Some(Counts {
            passed: 1,
            failed: 1,
            skipped: 1
        })
    );
}

#[test]
fn record_name_with_spaces() {
    let cs = parse_records("PASS cargo fmt --check: ok\nFAIL no import cycles\n", "s");
    let got: Vec<_> = cs
        .iter()
        .map(|c| (c.name.as_str(), c.status, c.detail.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("cargo fmt --check", Status::Pass, "ok"),
            ("no import cycles", Status::Fail, "")
        ]
    );
}

#[test]
fn libtest_cases_are_classed_by_binary() {
    let cs = parse_libtest(CARGO_LOG, "cargo");
    let got: Vec<_> = cs
        .iter()
        .map(|c| (c.suite.as_str(), c.name.as_str(), c.status))
        .collect();
    assert_eq!(
        got,
        [
            ("cargo.pci_model", "bar::parses", Status::Pass),
            ("cargo.pci_model", "bar::breaks", Status::Fail),
            ("cargo.pci_model", "slow", Status::Skip),
            ("cargo.vhost_user", "connects", Status::Pass),
            (
                "cargo.doc-pci_model",
                "pci-model/src/lib.rs - Bar (line 3)",
                Status::Pass
            ),
        ]
    );
    assert_eq!(cs[2].detail, "needs a guest");
    assert!(cs[1].output.contains("assertion `left == right` failed"));
    assert!(!cs[1].output.contains("bar::parses"));
    assert!(cs[0].output.is_empty(), "only failures carry output");
}

#[test]
fn cli_writes_one_case_per_test_and_merges() {
    let d = scratch("cli");
    std::fs::write(d.join("e2e.log"), format!("{E2E_LOG}\x00")).expect("write");
    std::fs::write(d.join("cargo.log"), CARGO_LOG).expect("write");
    let other = d.join("other.xml");
    let (doc, _) = guest_results::junit::document(
        &[
            Case::new("matrix.7.3/rxe", "ping", Status::Pass, ""),
            Case::new("matrix.7.3/rxe", "rping", Status::Skip, ""),
        ],
        "vhost-rdma",
        Vec::new(),
    );
    std::fs::write(&other, doc.to_document()).expect("write");
    let out = d.join("all.xml");
    let r = run(&[
        "--out",
        p(&out),
        "--records",
        &format!("e2e-vhost={}", p(&d.join("e2e.log"))),
        "--libtest",
        &format!("cargo={}", p(&d.join("cargo.log"))),
        "--merge",
        p(&other),
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(String::from_utf8_lossy(&r.stdout).contains("10 cases (5 passed, 2 failed, 3 skipped)"));
    let cs = cases_of(&out);
    assert_eq!(cs.len(), 10);
    assert!(cs.contains(&("e2e-vhost".into(), "ib_write_bw".into(), "FAIL")));
    assert!(cs.contains(&("matrix.7.3/rxe".into(), "rping".into(), "SKIP")));
    let root = root_of(&out);
    assert_eq!(
        (root.get("tests"), root.get("failures"), root.get("skipped")),
        (Some("10"), Some("2"), Some("3"))
    );
    let mut tcs = Vec::new();
    root.iter_tag("testcase", &mut tcs);
    let breaks = tcs
        .iter()
        .find(|tc| tc.get("name") == Some("bar::breaks"))
        .expect("bar::breaks is a case");
    let failure = breaks.find("failure").expect("it failed");
    assert!(failure.text.contains("panicked"));
    // the colour escapes are gone from the message
    let ib = tcs
        .iter()
        .find(|tc| tc.get("name") == Some("ib_write_bw"))
        .and_then(|tc| tc.find("failure"))
        .expect("ib_write_bw failed");
    assert_eq!(ib.get("message"), Some("rc=1 timeout"));
}

#[test]
fn summary_mismatch_is_reported() {
    let d = scratch("mismatch");
    let log = d.join("x.log");
    std::fs::write(&log, "PASS a: ok\n2 passed, 0 failed, 0 skipped\n").expect("write");
    let r = run(&[
        "--out",
        p(&d.join("x.xml")),
        "--records",
        &format!("x={}", p(&log)),
    ]);
    assert!(r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("the summary says 2/0/0"));
}

#[test]
fn unreadable_merge_is_a_failure() {
    let d = scratch("badmerge");
    let bad = d.join("bad.xml");
    std::fs::write(&bad, "<testsuites><testsuite>").expect("write");
    let out = d.join("o.xml");
    let r = run(&["--out", p(&out), "--merge", p(&bad)]);
    assert!(r.status.success());
    let st: Vec<_> = cases_of(&out).into_iter().map(|c| c.2).collect();
    assert_eq!(st, ["FAIL"]);
}

#[test]
fn a_bad_suite_argument_is_a_usage_error() {
    let d = scratch("badarg");
    let r = run(&["--out", p(&d.join("o.xml")), "--records", "no-equals-sign"]);
    assert!(!r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("want SUITE=PATH"));
}

#[test]
fn matrix_results_become_one_suite_per_cell() {
    let d = scratch("matrix");
    let results = d.join("results.json");
    std::fs::write(
        &results,
        r#"{"meta": {}, "cells": [
            {"kernel": "7.3", "cell": "rxe", "tests": [
                {"test": "ibv_rc_pingpong", "status": "PASS", "secs": 12, "bw": "", "detail": ""},
                {"test": "ib_write_bw", "status": "FAIL", "secs": 3, "bw": "5.1", "detail": "server rc=1"}]},
            {"kernel": "7.3", "cell": "smcr", "tests": [
                {"test": "tshark", "status": "SKIP", "secs": 0, "bw": "", "detail": "--no-capture"}]}]}"#,
    )
    .expect("write");
    let out = d.join("m.xml");
    let r = run(&[
        "--out",
        p(&out),
        "--name",
        "ci/matrix.sh",
        "--matrix",
        p(&results),
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(
        cases_of(&out),
        [
            ("matrix.7.3/rxe".into(), "ibv_rc_pingpong".into(), "PASS"),
            ("matrix.7.3/rxe".into(), "ib_write_bw".into(), "FAIL"),
            ("matrix.7.3/smcr".into(), "tshark".into(), "SKIP"),
        ]
    );
    let root = root_of(&out);
    assert_eq!(root.get("name"), Some("ci/matrix.sh"));
    let mut tcs = Vec::new();
    root.iter_tag("testcase", &mut tcs);
    assert_eq!(tcs[0].get("time"), Some("12.000"));
    let msg = tcs[1]
        .find("failure")
        .and_then(|f| f.get("message"))
        .unwrap_or_default();
    assert!(msg.contains("5.1 MiB/s"), "{msg}");
    assert_eq!(root.children[0].get("time"), Some("15.000"));
}

#[test]
fn the_document_is_written_as_elementtree_wrote_it() {
    // the exact bytes the removed scripts/junit.py wrote for these cases
    let mut fail = Case::new("s", "t<1>", Status::Fail, "why & \"how\"\n");
    fail.output = "out\x1b[1m\x07".into();
    let (doc, n) = guest_results::junit::document(
        &[fail, Case::new("s", "t2", Status::Skip, "")],
        "vhost-rdma",
        Vec::new(),
    );
    assert_eq!(n.total(), 2);
    assert_eq!(
        doc.to_document(),
        "<?xml version='1.0' encoding='utf-8'?>\n\
         <testsuites name=\"vhost-rdma\" tests=\"2\" failures=\"1\" skipped=\"1\">\n  \
         <testsuite name=\"s\" tests=\"2\" failures=\"1\" skipped=\"1\" errors=\"0\" time=\"0.000\">\n    \
         <testcase classname=\"s\" name=\"t&lt;1&gt;\" time=\"0.000\">\n      \
         <failure message=\"why &amp; &quot;how&quot;&#10;\">out?</failure>\n    \
         </testcase>\n    \
         <testcase classname=\"s\" name=\"t2\" time=\"0.000\">\n      \
         <skipped message=\"\" />\n    \
         </testcase>\n  \
         </testsuite>\n\
         </testsuites>"
    );
}
