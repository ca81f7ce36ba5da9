//! The unittest-log and KTAP parsers, the expectations files and the judge
//! (the cases of the removed ci/test_upstream.py, plus expectation-file
//! errors), and one cell judged end to end.

use std::path::PathBuf;

use guest_results::cell::{judge_cell, Device, Suite};
use guest_results::upstream::{
    deaths, expected, judge, load_expect, parse_expect, parse_ktap_log, parse_log, rows, table_md,
    ExpectError,
};

const LOG: &str = "UPSTREAM-CASES 6
UPSTREAM-ROUND 1 cases=6
test_a (tests.test_x.XTest.test_a) ... ok
test_b (tests.test_x.XTest.test_b)
Check something with a docstring ... skipped 'Device does not support it'
test_c (tests.test_x.XTest.test_c) ... some output the test printed
FAIL
test_d (tests.test_y.YTest.test_d) ... ERROR
test_e (tests.test_y.YTest.test_e) ... UPSTREAM-END 1 rc=139
UPSTREAM-KILLED id=tests.test_y.YTest.test_e rc=139 why=python3 exited 139
UPSTREAM-ROUND 2 cases=1

======================================================================
FAIL: test_c (tests.test_x.XTest.test_c)
----------------------------------------------------------------------
Traceback (most recent call last):
  File \"x.py\", line 3, in test_c
AssertionError: 1 != 2

======================================================================
ERROR: test_d (tests.test_y.YTest.test_d)
----------------------------------------------------------------------
Traceback (most recent call last):
pyverbs.pyverbs_error.PyverbsRDMAError: Failed to create CQ. Errno: 22, Invalid argument

----------------------------------------------------------------------
Ran 4 tests in 1.0s
";

fn o(s: &str, d: &str) -> (String, String) {
    (s.into(), d.into())
}

#[test]
fn every_verdict() {
    let (res, listed) = parse_log(LOG);
    assert_eq!(listed, Some(6));
    assert_eq!(res["tests.test_x.XTest.test_a"], o("pass", ""));
    assert_eq!(
        res["tests.test_x.XTest.test_b"],
        o("skip", "Device does not support it")
    );
    assert_eq!(
        res["tests.test_x.XTest.test_c"],
        o("fail", "AssertionError: 1 != 2")
    );
    assert_eq!(res["tests.test_y.YTest.test_d"].0, "error");
    assert!(res["tests.test_y.YTest.test_d"].1.contains("Errno: 22"));
    assert_eq!(
        res["tests.test_y.YTest.test_e"],
        o("killed", "python3 exited 139 (rc=139)")
    );
    assert_eq!(
        deaths(LOG),
        vec![(
            "tests.test_y.YTest.test_e".to_string(),
            "python3 exited 139 (rc=139)".to_string()
        )]
    );
}

#[test]
fn a_killed_case_rerun_takes_its_new_verdict() {
    let (res, _) = parse_log(&format!("{LOG}test_e (tests.test_y.YTest.test_e) ... ok\n"));
    assert_eq!(res["tests.test_y.YTest.test_e"], o("pass", ""));
}

const KTAP: &str = "UPSTREAM-FILE stats.py
TAP version 13
1..3
ok 1 stats.check_pause
# Check failed 1 != 2 rx_packets
not ok 2 stats.check_fec
ok 3 stats.check_rmon # SKIP no rmon stats
# Totals: pass:1 fail:1 xfail:0 xpass:0 skip:1 error:0

UPSTREAM-FILE-END stats.py rc=1
UPSTREAM-FILE hw/gro_hw.py
TAP version 13
1..2
ok 1 gro_hw.test_a # XFAIL device does not coalesce
UPSTREAM-FILE-END hw/gro_hw.py rc=124 secs=300
UPSTREAM-FILE hw/csum.py
Traceback (most recent call last):
ModuleNotFoundError: No module named 'yaml'
UPSTREAM-FILE-END hw/csum.py rc=1
UPSTREAM-FILE-NOT-RUN ping.py why=oopses the driver
";

#[test]
fn ktap_cases_files_and_timeouts() {
    let res = parse_ktap_log(KTAP);
    assert_eq!(res["stats.check_pause"], o("pass", ""));
    assert_eq!(res["stats.check_fec"].0, "fail");
    assert!(res["stats.check_fec"].1.contains("1 != 2"));
    assert_eq!(res["stats.check_rmon"], o("skip", "no rmon stats"));
    assert!(!res.contains_key("stats.py")); // all 3 results came
    assert_eq!(
        res["hw/gro_hw.test_a"],
        o("pass", "XFAIL device does not coalesce")
    );
    assert_eq!(res["hw/gro_hw.py"].0, "killed"); // 1 of 2 results, then the timeout
    assert_eq!(
        res["hw/csum.py"],
        o(
            "error",
            "exited rc=1 after 0 of ? results: ModuleNotFoundError: No module named 'yaml'"
        )
    );
    assert_eq!(res["ping.py"], o("missing", "not run: oopses the driver"));
}

struct Tmp(PathBuf);

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tmpdir(tag: &str) -> Tmp {
    let d = std::env::temp_dir().join(format!("guest-results-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Tmp(d)
}

fn rules(text: &str) -> Vec<guest_results::upstream::Rule> {
    parse_expect("t.expect", text).unwrap()
}

#[test]
fn reason_is_mandatory_and_statuses_known() {
    let e = parse_expect("t.expect", "tests.test_x.* skip\n").unwrap_err();
    assert!(matches!(e, ExpectError::NoReason { line: 1, .. }));
    assert_eq!(
        e.to_string(),
        "t.expect:1: tests.test_x.* is expected to skip but gives no reason"
    );
    let e = parse_expect(
        "t.expect",
        "# c\n\ntests.test_x.XTest.test_a maybe because\n",
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "t.expect:3: want 'PATTERN STATUS REASON', STATUS one of pass, fail, error, skip, killed, missing"
    );
    assert!(matches!(
        parse_expect("t", "lonely\n"),
        Err(ExpectError::Format { line: 1, .. })
    ));
    assert!(matches!(
        parse_expect("t", "a pass|maybe why\n"),
        Err(ExpectError::Format { .. })
    ));
    assert_eq!(rules("a pass\n")[0].reason, ""); // pass needs no reason
    assert_eq!(rules("a  fail   two  words \n")[0].reason, "two  words");
}

#[test]
fn a_missing_expect_file_says_so_like_python() {
    let e = load_expect("/nonexistent/x.expect").unwrap_err();
    assert_eq!(
        e.to_string(),
        "[Errno 2] No such file or directory: '/nonexistent/x.expect'"
    );
}

#[test]
fn first_match_wins_and_default_is_pass() {
    let r = rules("# comment\ntests.test_x.XTest.test_b fail driver bug, see docs\ntests.test_x.* skip not on this device\n");
    assert_eq!(
        expected(&r, "tests.test_x.XTest.test_b"),
        ("fail", "driver bug, see docs")
    );
    assert_eq!(expected(&r, "tests.test_x.XTest.test_z").0, "skip");
    assert_eq!(expected(&r, "tests.test_q.Q.test_a"), ("pass", ""));
}

#[test]
fn alternatives() {
    let r = rules("tests.test_y.* error|killed varies between runs\n");
    let (res, _) = parse_log(LOG);
    let j = judge(&res, &r, []);
    assert!(j["tests.test_y.YTest.test_d"].ok);
    assert!(j["tests.test_y.YTest.test_e"].ok);
    assert!(!j["tests.test_x.XTest.test_b"].ok); // skip, expected pass
}

#[test]
fn changed_results_fail_both_ways() {
    let (res, _) = parse_log(LOG);
    let r = rules(concat!(
        "tests.test_x.XTest.test_a fail used to fail\n", // now passes: must fail the row
        "tests.test_x.XTest.test_b skip no such feature\n", // as expected
        "tests.test_x.XTest.test_c fail known\n",
        "tests.test_y.YTest.test_d error known\n",
        "tests.test_y.YTest.test_e killed known crash\n",
    ));
    let mut listed: Vec<String> = res.keys().cloned().collect();
    listed.push("tests.test_z.Z.test_never".into());
    let j = judge(&res, &r, &listed);
    assert!(!j["tests.test_x.XTest.test_a"].ok);
    assert!(j["tests.test_x.XTest.test_b"].ok);
    assert!(j["tests.test_y.YTest.test_e"].ok);
    assert_eq!(j["tests.test_z.Z.test_never"].got, "missing");
    assert!(!j["tests.test_z.Z.test_never"].ok);
    let both = vec![("erdma".to_string(), j.clone()), ("rxe".to_string(), j)];
    let rs = rows(&both, "rdma-core");
    let row = |t: &str| rs.iter().find(|r| r.test == t).unwrap().clone();
    assert_eq!(row("rdma-core:test_x.XTest.test_a").status, "FAIL");
    assert_eq!(
        row("rdma-core:test_x.XTest.test_a").detail,
        "erdma: got pass (-), expected fail (used to fail); rxe: got pass (-), expected fail (used to fail)"
    );
    assert_eq!(row("rdma-core:test_x.XTest.test_b").status, "PASS");
    assert_eq!(
        row("rdma-core:test_x.XTest.test_b").detail,
        "erdma skip, rxe skip"
    );
    let md = table_md(&both, "t", "cmd", &[]);
    assert!(md.contains(
        "| test_x.XTest.test_b | skip | skip | erdma: no such feature; rxe: no such feature |"
    ));
    assert!(md.starts_with(
        "# t\n\nCommand: `cmd`\n\n- erdma: 1 pass, 1 fail, 1 error, 1 skip, 1 killed, 1 missing\n"
    ));
}

#[test]
fn a_cell_end_to_end() {
    let t = tmpdir("cell");
    let d = &t.0;
    std::fs::write(d.join("a.log"), LOG).unwrap();
    std::fs::write(d.join("a.cases"), "tests.test_z.Z.test_never\nnot a case\n").unwrap();
    std::fs::write(
        d.join("rdma-core-erdma.expect"),
        "tests.test_x.XTest.test_b skip no such feature\ntests.test_x.XTest.test_c fail known\n\
         tests.test_y.YTest.test_d error known\ntests.test_y.YTest.test_e killed known crash\n\
         tests.test_z.* missing never run\ntests.test_stale.* fail a stale line matches nothing: harmless\n",
    )
    .unwrap();
    std::fs::write(d.join("rdma-core-rxe.expect"), "tests.* skip\n").unwrap(); // no reason
    let dev = |g: &str, dev: &str, log: &str, cases: Option<&str>| Device {
        guest: g.into(),
        dev: dev.into(),
        log: d.join(log).to_string_lossy().into(),
        cases: cases.map(|c| d.join(c).to_string_lossy().into()),
    };
    let v = judge_cell(
        Suite::RdmaCore,
        d,
        &[
            dev("a", "erdma", "a.log", Some("a.cases")),
            dev("b", "rxe", "b.log", None),
        ],
        "T",
        "C",
    );
    let tests: Vec<(&str, &str)> = v
        .rows
        .iter()
        .map(|r| (r.test.as_str(), r.status.as_str()))
        .collect();
    assert_eq!(tests[0], ("rdma-core-expect-rxe", "FAIL"));
    assert!(v.rows[0]
        .detail
        .ends_with("rdma-core-rxe.expect:1: tests.* is expected to skip but gives no reason"));
    assert_eq!(tests[1], ("rdma-core-results-rxe", "FAIL"));
    assert_eq!(
        v.rows[1].detail,
        format!("no rdma-core results from b ({}/b.log)", d.display())
    );
    // rxe has no results: every case is missing there, which its (unusable) file does not expect
    assert!(tests[2..].iter().all(|(_, s)| *s == "FAIL"));
    assert_eq!(tests.len(), 2 + 6);
    let never = v
        .rows
        .iter()
        .find(|r| r.test == "rdma-core:test_z.Z.test_never")
        .unwrap();
    assert_eq!(
        never.detail,
        "rxe: got missing (never started), expected pass"
    );
    assert_eq!(v.notes, ["erdma: python3 died during test_y.YTest.test_e: python3 exited 139 (rc=139); killed for good (it died again on its own)"]);
    assert_eq!(v.passed, [("erdma".to_string(), 1), ("rxe".to_string(), 0)]);
    assert!(v
        .markdown
        .contains("- rxe: 6 missing\n- erdma: python3 died during"));
}
