//! The device-fault judge, its table and the device-trace row (the cases of
//! ci/test_matrix.py's FaultJudgeTest and TraceTest, which tested the
//! Python these replaced).

use guest_results::faults::{judge_case, judge_rows, table_md, trace_row, FaultCase, Judge};
use guest_results::pyjson::Json;

fn case(name: &str, kind: &str, expect: &[&str], recovers: bool) -> FaultCase {
    FaultCase {
        case: name.into(),
        kind: kind.into(),
        driver: "gve_rx_dqo.c: gve_rx_dqo".into(),
        expect: expect.iter().map(|x| x.to_string()).collect(),
        recovers,
        no_hits: None,
    }
}

fn rx_error() -> FaultCase {
    case(
        "rx-error",
        "rx-error",
        &[r"rx_desc_err_dropped_pkt \+[1-9]"],
        true,
    )
}

fn stuck() -> FaultCase {
    case(
        "cmdq-timeout",
        "cmdq-timeout",
        &[r"Couldn't create QP"],
        false,
    )
}

fn row_of(test: &str, status: &str, detail: &str) -> Json {
    let s = |v: &str| Json::Str(v.into());
    Json::Object(vec![
        ("test".into(), s(test)),
        ("status".into(), s(status)),
        ("secs".into(), Json::Int(9)),
        ("bw".into(), s("")),
        ("detail".into(), s(detail)),
    ])
}

/// A guest's row for the case, as guest-results guests builds it.
fn row(detail: &str, status: &str, test: &str) -> Json {
    row_of(test, status, &format!("server: {status} {detail}"))
}

fn judge(r: &Json, c: FaultCase) -> (String, String) {
    let j = judge_case(r, &Judge::new(c).expect("the regexes compile"));
    (j.at("status").to_string(), j.at("detail").to_string())
}

#[test]
fn evidence_hits_and_recovery_pass() {
    let (st, det) = judge(
        &row(
            "hits=1 recovered=yes during=pass after=pass evidence: dmesg: ; stats: \
             rx_desc_err_dropped_pkt +1 tx_dropped +0",
            "PASS",
            "fault-rx-error",
        ),
        rx_error(),
    );
    assert_eq!(st, "PASS", "{det}");
    assert!(
        det.starts_with("kind rx-error: server: PASS hits=1"),
        "{det}"
    );
}

#[test]
fn missing_evidence_no_hit_or_no_recovery_fail() {
    for (det, why) in [
        (
            "hits=1 recovered=yes evidence: stats: rx_desc_err_dropped_pkt +0",
            "expected evidence not seen: /rx_desc_err_dropped_pkt \\+[1-9]/",
        ),
        (
            "hits=0 recovered=yes evidence: stats: rx_desc_err_dropped_pkt +1",
            "the fault rule never fired (hits=0)",
        ),
        (
            "hits=? recovered=yes evidence: stats: rx_desc_err_dropped_pkt +1",
            "the fault rule never fired (hits=?)",
        ),
        (
            "hits=1 recovered=no evidence: stats: rx_desc_err_dropped_pkt +1",
            "traffic did not recover after the fault was cleared",
        ),
        (
            "hits=1 evidence: stats: rx_desc_err_dropped_pkt +1",
            "no recovered=yes|no in the result",
        ),
    ] {
        let (st, d) = judge(&row(det, "PASS", "fault-rx-error"), rx_error());
        assert_eq!(st, "FAIL", "{det}");
        assert!(d.contains(why), "{d}");
        // the reasons come first, the guest's own detail after them
        assert!(d.ends_with(&format!(" | server: PASS {det}")), "{d}");
    }
}

#[test]
fn a_driver_that_does_not_recover_is_a_finding_not_a_silent_pass() {
    let det = "hits=1 recovered=no evidence: ibv_rc_pingpong rc=1: Couldn't create QP";
    let (st, d) = judge(&row(det, "PASS", "fault-cmdq-timeout"), stuck());
    assert_eq!(st, "PASS", "{d}");
    assert!(
        d.contains("finding: the 7.3 driver does not recover"),
        "{d}"
    );
    // recovering where the driver cannot is a wrong expectation (or a changed driver): FAIL
    let (st, d) = judge(
        &row(&det.replace("=no", "=yes"), "PASS", "fault-cmdq-timeout"),
        stuck(),
    );
    assert_eq!(st, "FAIL");
    assert!(d.contains("expected not to"), "{d}");
}

#[test]
fn a_kind_the_device_counts_no_hits_for_is_judged_by_its_evidence() {
    let mut c = case("qp-stall", "qp-stall", &["stalled=yes"], true);
    c.no_hits = Some("no hit counter".into());
    let (st, d) = judge(
        &row(
            "hits=0 recovered=yes evidence: stalled=yes",
            "PASS",
            "fault-qp-stall",
        ),
        c.clone(),
    );
    assert_eq!(st, "PASS", "{d}");
    assert!(d.contains("hits not judged: no hit counter"), "{d}");
    let (st, _) = judge(
        &row(
            "hits=0 recovered=yes evidence: stalled=no",
            "PASS",
            "fault-qp-stall",
        ),
        c,
    );
    assert_eq!(st, "FAIL");
}

#[test]
fn a_case_the_guest_failed_or_never_reported_stays_failed() {
    let (st, d) = judge(
        &row(
            "hits=1 recovered=yes problems: ctl device-fault add failed; evidence: \
             rx_desc_err_dropped_pkt +1",
            "FAIL",
            "fault-rx-error",
        ),
        rx_error(),
    );
    assert_eq!(st, "FAIL");
    assert!(d.contains("the guest reported the case as FAIL"), "{d}");
    let missing = row_of(
        "fault-rx-error",
        "FAIL",
        "no result from server (guest died or timed out)",
    );
    let j = Judge::new(rx_error()).expect("compiles");
    assert_eq!(judge_case(&missing, &j), missing);
}

#[test]
fn only_fault_rows_are_judged() {
    let rows = [
        row_of("gve-setup", "PASS", "server: PASS up"),
        row("hits=0 recovered=yes", "PASS", "fault-rx-error"),
    ];
    let judged = judge_rows(&rows, &[Judge::new(rx_error()).expect("compiles")]);
    assert_eq!(judged[0], rows[0]);
    assert_eq!(judged[1].at("status").str(), "FAIL");
}

#[test]
fn a_regex_that_does_not_compile_is_an_error() {
    let e = Judge::new(case("x", "x", &["(unclosed"], true))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.starts_with("fault case x: expect /(unclosed/"), "{e}");
}

#[test]
fn table_has_one_row_per_case_with_the_evidence() {
    let j = Judge::new(rx_error()).expect("compiles");
    let rows = [judge_case(
        &row(
            "hits=1 recovered=yes evidence: stats: rx_desc_err_dropped_pkt +2",
            "PASS",
            "fault-rx-error",
        ),
        &j,
    )];
    let mut other = rx_error();
    other.case = "rx-other".into();
    let md = table_md(
        "7.3",
        "gve-faults",
        &rows,
        &[rx_error(), other],
        "ci/matrix.sh --cells 7.3/gve-faults",
    );
    assert_eq!(
        md,
        "## 7.3/gve-faults: what each fault does to the 7.3 driver\n\n\
         Command: `ci/matrix.sh --cells 7.3/gve-faults`\n\n\
         | kind | case | driver path (7.3) | guest evidence (this run) | recovered after clear | verdict |\n\
         |---|---|---|---|---|---|\n\
         | `rx-error` | rx-error | gve_rx_dqo.c: gve_rx_dqo | stats: rx_desc_err_dropped_pkt +2 | yes | PASS |\n\
         | `rx-error` | rx-other | gve_rx_dqo.c: gve_rx_dqo | no row | ? | FAIL |\n"
    );
}

#[test]
fn trace_files_must_exist_and_name_the_driver_commands() {
    let d = std::env::temp_dir().join(format!("guest-results-trace-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    let want = [(
        "trace-gve-probe.txt".to_string(),
        vec!["DESCRIBE_DEVICE".to_string(), "CREATE_TX_QUEUE".to_string()],
    )];
    let r = trace_row(&d, &want);
    assert_eq!(r.at("status").str(), "FAIL");
    assert_eq!(r.at("detail").str(), "trace-gve-probe.txt: missing");
    let f = d.join("trace-gve-probe.txt");
    std::fs::write(
        &f,
        "0.001 reg-write device_status\n0.002 cmd GVE_ADMINQ_DESCRIBE_DEVICE -> PASSED\n",
    )
    .expect("write");
    let r = trace_row(&d, &want);
    assert_eq!(r.at("status").str(), "FAIL");
    assert_eq!(
        r.at("detail").str(),
        "trace-gve-probe.txt: 2 records, lacks CREATE_TX_QUEUE"
    );
    std::fs::write(
        &f,
        "0.001 reg-write device_status\n0.002 cmd GVE_ADMINQ_DESCRIBE_DEVICE -> PASSED\n\n\
         0.003 cmd GVE_ADMINQ_CREATE_TX_QUEUE queue_id=0 -> PASSED\n",
    )
    .expect("write");
    let r = trace_row(&d, &want);
    assert_eq!(r.at("status").str(), "PASS", "{}", r.at("detail"));
    assert_eq!(
        r.at("detail").str(),
        "trace-gve-probe.txt: 3 records, names DESCRIBE_DEVICE, CREATE_TX_QUEUE"
    );
    // no trace expected is no evidence: FAIL
    assert_eq!(trace_row(&d, &[]).at("status").str(), "FAIL");
    let _ = std::fs::remove_dir_all(&d);
}
