//! Host-side rows of a matrix cell judged from what the daemon reported
//! (checker-clean, loss-evidence), for `guest-runner matrix`. They
//! replaced the Python matrix's `checker_clean_test` and `loss_evidence_test` and
//! give the same rows.

use crate::pyjson::Json;

/// The rdma statistic counters that count retransmissions or their
/// triggers (rxe), the TCP ones (siw), and the erdma functions' RC engine
/// ones (the daemon's status).
pub const RETRANS_COUNTERS: [&str; 12] = [
    "duplicate_request",
    "out_of_seq_request",
    "rcvd_seq_err",
    "completer_retry_err",
    "retry_exceeded_err",
    "rnr_nak_retry_err",
    "TcpRetransSegs",
    "TcpExtTCPOFOQueue",
    "rc_retries",
    "rc_timeouts",
    "rc_seq_naks_sent",
    "rc_duplicates",
];

fn row(test: &str, pass: bool, detail: String) -> Json {
    let s = |v: &str| Json::Str(v.into());
    Json::Object(vec![
        ("test".into(), s(test)),
        ("status".into(), s(if pass { "PASS" } else { "FAIL" })),
        ("secs".into(), Json::Int(0)),
        ("bw".into(), s("")),
        ("detail".into(), Json::Str(detail)),
    ])
}

/// The row "checker-clean" of a clean erdma cell: the daemon's protocol
/// checker saw no rule broken. `ck`: `{"findings": N, "rules": {RULE: N}}`
/// (null: no report).
pub fn checker_clean(ck: &Json) -> Json {
    if *ck == Json::Null {
        return row(
            "checker-clean",
            false,
            "no checker report from the daemon".into(),
        );
    }
    if ck.at("findings").truthy() {
        return row(
            "checker-clean",
            false,
            format!(
                "{} finding(s): {} (checker-findings.json)",
                ck.at("findings"),
                ck.at("rules")
            ),
        );
    }
    row("checker-clean", true, "no finding".into())
}

fn number(v: &Json) -> f64 {
    match v {
        Json::Int(i) => *i as f64,
        Json::Float(x) => *x,
        Json::Bool(b) => f64::from(u8::from(*b)),
        _ => 0.0,
    }
}

/// The row "loss-evidence" of a lossy cell: every fault rule acted (the
/// siw `mpa-settle` workaround is not a loss rule), and the guests (or the
/// daemon's erdma functions) counted retransmissions. `faults`: `ctl --json
/// faults list` (its status wrapping the list, or the list); `counters`:
/// GUEST -> counter -> value.
pub fn loss_evidence(faults: &Json, counters: &Json) -> Json {
    // `ctl --json faults list` wraps the status
    let faults = if faults.truthy() {
        faults.get("faults").unwrap_or(faults)
    } else {
        faults
    };
    let rules = match faults {
        Json::Object(_) => faults.at("rules").items(),
        other => other.items(),
    };
    let rules: Vec<&Json> = rules
        .iter()
        .filter(|r| r.at("rule").at("action").str() != "mpa-settle")
        .collect();
    if rules.is_empty() {
        return row(
            "loss-evidence",
            false,
            "no fault list from the daemon".into(),
        );
    }
    let acted: Vec<String> = rules
        .iter()
        .map(|r| {
            let desc = r
                .get("description")
                .map_or("?".to_string(), Json::to_string);
            format!(
                "rule {} ({desc}): matched {} acted {}",
                r.at("id"),
                r.at("matched"),
                r.at("acted")
            )
        })
        .collect();
    let idle = rules.iter().any(|r| !r.at("acted").truthy());
    let mut rt: Vec<(&str, Vec<(&str, &Json)>)> = counters
        .entries()
        .iter()
        .map(|(g, c)| {
            let kept = c
                .entries()
                .iter()
                .filter(|(k, v)| RETRANS_COUNTERS.contains(&k.as_str()) && v.truthy())
                .map(|(k, v)| (k.as_str(), v))
                .collect();
            (g.as_str(), kept)
        })
        .collect();
    rt.sort_by(|a, b| a.0.cmp(b.0));
    let total: f64 = rt
        .iter()
        .flat_map(|(_, c)| c.iter().map(|(_, v)| number(v)))
        .sum();
    let seen = rt
        .iter()
        .map(|(g, c)| {
            let kv: Vec<String> = c.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("{g}: {}", kv.join(" "))
        })
        .collect::<Vec<_>>()
        .join(", ");
    let seen = if seen.is_empty() { "none".into() } else { seen };
    row(
        "loss-evidence",
        !idle && total > 0.0,
        format!(
            "{}; guest retransmission counters: {seen}",
            acted.join("; ")
        ),
    )
}
