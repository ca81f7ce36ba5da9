//! The host rows judged from the daemon's reports: checker-clean and
//! loss-evidence (ci/matrix.py's checker_clean_test and loss_evidence_test
//! before).

use guest_results::hostrows::{checker_clean, loss_evidence};
use guest_results::pyjson::Json;

fn json(s: &str) -> Json {
    serde_json::from_str(s).expect("test JSON")
}

fn status_detail(row: &Json) -> (String, String) {
    (row.at("status").to_string(), row.at("detail").to_string())
}

#[test]
fn checker_clean_needs_a_report_without_findings() {
    assert_eq!(
        status_detail(&checker_clean(&Json::Null)),
        ("FAIL".into(), "no checker report from the daemon".into())
    );
    assert_eq!(
        status_detail(&checker_clean(&json(
            r#"{"findings": 3, "rules": {"rc-psn-order": 2, "it's": 1}}"#
        ))),
        (
            "FAIL".into(),
            // the rules as Python printed the dict
            r#"3 finding(s): {'rc-psn-order': 2, "it's": 1} (checker-findings.json)"#.into()
        )
    );
    assert_eq!(
        status_detail(&checker_clean(&json(r#"{"findings": 0, "rules": {}}"#))),
        ("PASS".into(), "no finding".into())
    );
}

const FAULTS: &str = r#"{"faults": {"rules": [
    {"id": 1, "description": "drop 1% udp/4791", "matched": 900, "acted": 9, "rule": {"action": "drop"}},
    {"id": 2, "description": "siw settle", "matched": 4, "acted": 4, "rule": {"action": "mpa-settle"}}]}}"#;

#[test]
fn loss_evidence_needs_every_rule_acting_and_retransmissions() {
    let counters = json(
        r#"{"b": {"duplicate_request": 4, "eth0_rx_dropped": 9, "rcvd_seq_err": 0},
            "a": {"TcpRetransSegs": 2}, "daemon:ar": {"rx_frames": 5}}"#,
    );
    let (st, det) = status_detail(&loss_evidence(&json(FAULTS), &counters));
    assert_eq!(st, "PASS", "{det}");
    // the mpa-settle rule is not a loss rule; zero and other counters are left out; guests sorted
    assert_eq!(
        det,
        "rule 1 (drop 1% udp/4791): matched 900 acted 9; guest retransmission counters: \
         a: TcpRetransSegs=2, b: duplicate_request=4, daemon:ar: "
    );
    // no retransmission counted: FAIL
    let (st, det) = status_detail(&loss_evidence(&json(FAULTS), &json(r#"{"a": {"x": 1}}"#)));
    assert_eq!(st, "FAIL");
    assert!(det.ends_with("guest retransmission counters: a: "), "{det}");
    let (_, det) = status_detail(&loss_evidence(&json(FAULTS), &Json::Null));
    assert!(
        det.ends_with("guest retransmission counters: none"),
        "{det}"
    );
    // a rule that never acted: FAIL, even with retransmissions
    let idle = FAULTS.replace(r#""acted": 9"#, r#""acted": 0"#);
    let (st, _) = status_detail(&loss_evidence(&json(&idle), &counters));
    assert_eq!(st, "FAIL");
}

#[test]
fn loss_evidence_without_a_fault_list_fails() {
    for faults in ["null", "{}", r#"{"faults": null}"#, r#"{"rules": []}"#] {
        assert_eq!(
            status_detail(&loss_evidence(&json(faults), &Json::Null)),
            ("FAIL".into(), "no fault list from the daemon".into()),
            "{faults}"
        );
    }
    // the bare list (not wrapped in the status) is read as well
    let bare = r#"[{"id": 7, "matched": 1, "acted": 1}]"#;
    let (st, det) = status_detail(&loss_evidence(
        &json(bare),
        &json(r#"{"a": {"rc_retries": 3}}"#),
    ));
    assert_eq!(st, "PASS", "{det}");
    assert!(det.starts_with("rule 7 (?): matched 1 acted 1"), "{det}");
}
