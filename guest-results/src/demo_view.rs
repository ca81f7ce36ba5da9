//! The few facts the demo (`guest-runner demo`, scripts/demo.sh) reads out
//! of the daemon's `ctl --json` replies and out of tshark's protocol
//! hierarchy, one line of plain words each: what it prints and compares.
//!
//! A reply that is missing or not JSON reads as empty: the demo asks while
//! the daemon may be starting or gone, and an empty answer ("0 ...") is the
//! verdict it then needs, not an error.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

/// Why a view could not be produced (only the seen-events file can fail:
/// it is the one thing this module writes).
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    /// Writing the seen-events file failed.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

fn load(path: &Path) -> Value {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null)
}

fn list(v: &Value) -> &[Value] {
    v.as_array().map_or(&[], Vec::as_slice)
}

fn u(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// A counter that older daemons may not report: the number, or `?`.
fn opt(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_u64)
        .map_or_else(|| "?".to_string(), |n| n.to_string())
}

/// Whether a reply's field counts as set (present, not null, false, 0 or
/// empty), as the demo's checks have always read them.
fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::String(t)) => !t.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / 1_048_576.0)
}

/// `svc HOSTS KIND PORT`: "ok failed iterations verified error" of the
/// virtual host's service KIND on PORT (`0 0 0 0 no-such-service`).
pub fn service(hosts: &Path, kind: &str, port: &str) -> String {
    let hosts = load(hosts);
    for h in list(&hosts) {
        for svc in h.get("services").map_or(&[][..], list) {
            let p = svc.get("port").map(Value::to_string).unwrap_or_default();
            if s(svc, "kind") == kind && p == port {
                let err = s(svc, "last_error");
                return format!(
                    "{} {} {} {} {}",
                    u(svc, "sessions_ok"),
                    u(svc, "sessions_failed"),
                    u(svc, "last_iterations"),
                    u(svc, "last_verified"),
                    if err.is_empty() { "-" } else { err }
                );
            }
        }
    }
    "0 0 0 0 no-such-service".into()
}

/// `events HOSTS SEEN`: the hosts' events not shown yet, one line each
/// ("HOST: EVENT"); SEEN keeps how many of each host's events were shown
/// (an event list shorter than that means the host restarted: all again).
pub fn events(hosts: &Path, seen_file: &Path) -> Result<String, ViewError> {
    let mut seen: BTreeMap<String, usize> =
        serde_json::from_value(load(seen_file)).unwrap_or_default();
    let hosts = load(hosts);
    let mut out = Vec::new();
    for h in list(&hosts) {
        let name = s(h, "name").to_string();
        let ev = h.get("events").map_or(&[][..], list);
        let mut n = seen.get(&name).copied().unwrap_or(0);
        if n > ev.len() {
            n = 0;
        }
        for e in &ev[n..] {
            let text = e.as_str().map_or_else(|| e.to_string(), str::to_string);
            out.push(format!("{name}: {text}"));
        }
        seen.insert(name, ev.len());
    }
    let text = serde_json::to_string(&seen).unwrap_or_else(|_| "{}".into());
    std::fs::write(seen_file, text).map_err(|source| ViewError::Write {
        path: seen_file.display().to_string(),
        source,
    })?;
    Ok(out.join("\n"))
}

/// `rates STATUS BASE`: what each port moved since BASE ("fabric: a sent
/// X/got Y, ..." for ports past 0.1 MiB, else "fabric: quiet"); nothing
/// without a status.
pub fn rates(status: &Path, base: &Path) -> String {
    let cur = load(status);
    let ports = match cur.get("ports").and_then(Value::as_array) {
        Some(p) if !cur.as_object().is_some_and(|o| o.is_empty()) => p,
        _ => return String::new(),
    };
    let base = load(base);
    let before: BTreeMap<&str, &Value> = base
        .get("ports")
        .map_or(&[][..], list)
        .iter()
        .map(|p| (s(p, "name"), p))
        .collect();
    let mut parts = Vec::new();
    for p in ports {
        let b = before.get(s(p, "name")).copied().unwrap_or(&Value::Null);
        let tx = u(p, "tx_bytes").saturating_sub(u(b, "tx_bytes"));
        let rx = u(p, "rx_bytes").saturating_sub(u(b, "rx_bytes"));
        if tx + rx >= 104_858 {
            parts.push(format!("{} sent {}/got {}", s(p, "name"), mib(tx), mib(rx)));
        }
    }
    if parts.is_empty() {
        "fabric: quiet".into()
    } else {
        format!("fabric: {}", parts.join(", "))
    }
}

fn confirmed_smcr_v2(flows: &Value) -> Vec<&Value> {
    flows
        .get("smc")
        .map_or(&[][..], list)
        .iter()
        .filter(|x| s(x, "kind") == "SMC-R" && u(x, "version") == 2 && s(x, "state") == "confirmed")
        .collect()
}

/// `smc FLOWS`: "N TEXT": how many SMC-R v2 sessions the checker saw
/// confirmed, and the last one (or the states it did see).
pub fn smc(flows: &Path) -> String {
    let f = load(flows);
    let ok = confirmed_smcr_v2(&f);
    let Some(last) = ok.last() else {
        let seen: Vec<String> = f
            .get("smc")
            .map_or(&[][..], list)
            .iter()
            .map(|x| format!("{} v{} {}", s(x, "kind"), u(x, "version"), s(x, "state")))
            .collect();
        return format!("0 states seen: {}", seen.join(", "));
    };
    let qpn = |k: &str| {
        last.get(k)
            .and_then(Value::as_u64)
            .map_or_else(|| "-".to_string(), |v| format!("{v:#x}"))
    };
    let first = if truthy(last.get("first_contact")) {
        ", first contact"
    } else {
        ""
    };
    format!(
        "{} {} [SMC-R v2 confirmed{first}] link QPs: server {}, client {}",
        ok.len(),
        s(last, "connection"),
        qpn("server_qpn"),
        qpn("client_qpn")
    )
}

/// `flows FLOWS`: "RC_CONNS SMC_LINK_CONNS IWARP SMC_V2_CONFIRMED".
pub fn flows(flows: &Path) -> String {
    let f = load(flows);
    let rc: Vec<&Value> = f
        .get("roce")
        .map_or(&[][..], list)
        .iter()
        .filter(|c| s(c, "transport") == "rc")
        .collect();
    let smc_links = rc
        .iter()
        .filter(|c| {
            c.get("halves")
                .map_or(&[][..], list)
                .iter()
                .any(|h| truthy(h.get("smc")))
        })
        .count();
    format!(
        "{} {} {} {}",
        rc.len(),
        smc_links,
        f.get("iwarp").map_or(&[][..], list).len(),
        confirmed_smcr_v2(&f).len()
    )
}

/// `findings FINDINGS`: the checker's total (`?` without one).
pub fn findings(findings: &Path) -> String {
    opt(&load(findings), "total")
}

/// `erdma STATUS`: the erdma functions' counters, three lines each.
pub fn erdma(status: &Path) -> String {
    let st = load(status);
    let mut out = Vec::new();
    for dev in st.get("devices").map_or(&[][..], list) {
        if s(dev, "kind") != "erdma" {
            continue;
        }
        let e = dev.get("erdma").unwrap_or(&Value::Null);
        let c = e.get("counters").unwrap_or(&Value::Null);
        let mtu = e
            .get("path_mtu")
            .filter(|v| !v.is_null())
            .map_or_else(|| "None".to_string(), Value::to_string);
        out.push(format!(
            "erdma function {}: path MTU {mtu}, live QPs {} CQs {} MRs {}; commands ok {} failed {}",
            s(dev, "port"),
            u(c, "qps_live"),
            u(c, "cqs_live"),
            u(c, "mrs_live"),
            u(c, "cmd_common_ok") + u(c, "cmd_rdma_ok"),
            u(c, "cmd_common_failed") + u(c, "cmd_rdma_failed")
        ));
        out.push(format!(
            "  WQEs executed {}, RQEs consumed {}, CQEs written {}, interrupts {}, doorbells {}",
            u(c, "wqes_executed"),
            u(c, "rqes_consumed"),
            u(c, "cqes_written"),
            u(c, "irqs"),
            u(c, "doorbells")
        ));
        out.push(format!(
            "  RoCEv2 frames sent {} ({}), received {} ({}), dropped {} ({} not RoCE); RC retries {}, timeouts {}, duplicates {}",
            u(c, "tx_frames"),
            mib(u(c, "tx_bytes")),
            u(c, "rx_frames"),
            mib(u(c, "rx_bytes")),
            u(c, "rx_dropped"),
            opt(c, "rx_drop_not_roce"),
            opt(c, "rc_retries"),
            opt(c, "rc_timeouts"),
            opt(c, "rc_duplicates")
        ));
    }
    out.join("\n")
}

/// `gve STATUS`: "SPLIT_PACKETS HEADER_BYTES PAYLOAD_BYTES RX_PACKETS" of
/// the first gVNIC, summed over its receive queues.
pub fn gve(status: &Path) -> String {
    let st = load(status);
    for dev in st.get("devices").map_or(&[][..], list) {
        if s(dev, "kind") != "gve" {
            continue;
        }
        let q = dev
            .get("gve")
            .and_then(|g| g.get("counters"))
            .and_then(|c| c.get("rx_queues"))
            .map_or(&[][..], list);
        let sum = |k: &str| q.iter().map(|x| u(x, k)).sum::<u64>();
        return format!(
            "{} {} {} {}",
            sum("hsplit_packets"),
            sum("header_bytes"),
            sum("payload_bytes"),
            sum("packets")
        );
    }
    "0 0 0 0".into()
}

/// `phs FILE`: from tshark's protocol hierarchy (`-z io,phs`), "ROCE SMC_R
/// CLC IWARP MALFORMED" frame counts. The hierarchy nests by two spaces per
/// level; a count belongs to the protocol path ending in the given tail.
pub fn phs(text: &str) -> String {
    const TAILS: [(&str, &str); 4] = [
        ("roce", "udp/infiniband"),
        ("smcr", "udp/infiniband/smc"),
        ("clc", "tcp/smc"),
        ("iwarp", "tcp/iwarp_mpa"),
    ];
    let mut stack: Vec<&str> = Vec::new();
    let mut got: BTreeMap<&str, u64> = BTreeMap::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let Some(frames) = parts.get(1).and_then(|p| p.strip_prefix("frames:")) else {
            continue;
        };
        let depth = (line.len() - line.trim_start_matches(' ').len()) / 2;
        stack.truncate(depth);
        stack.push(parts[0]);
        let path = stack.join("/");
        let n: u64 = frames.parse().unwrap_or(0);
        for (key, tail) in TAILS {
            if path.ends_with(tail) {
                *got.entry(key).or_default() += n;
            }
        }
        if parts[0] == "_ws.malformed" {
            *got.entry("malformed").or_default() += n;
        }
    }
    ["roce", "smcr", "clc", "iwarp", "malformed"]
        .iter()
        .map(|k| got.get(k).copied().unwrap_or(0).to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str, text: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("demo-view-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn service_finds_kind_and_port_and_reads_missing_as_none() {
        let h = tmp(
            "hosts.json",
            r#"[{"name":"vh","services":[
                {"kind":"pingpong-server","port":18515,"sessions_ok":1,"sessions_failed":0,"last_iterations":1000,"last_verified":999,"last_error":null},
                {"kind":"rping-server","port":7174,"sessions_ok":2,"sessions_failed":1,"last_iterations":10,"last_verified":9,"last_error":"data mismatch"}]}]"#,
        );
        assert_eq!(service(&h, "pingpong-server", "18515"), "1 0 1000 999 -");
        assert_eq!(
            service(&h, "rping-server", "7174"),
            "2 1 10 9 data mismatch"
        );
        assert_eq!(
            service(&h, "rping-server", "7175"),
            "0 0 0 0 no-such-service"
        );
        assert_eq!(
            service(Path::new("/nonexistent"), "x", "1"),
            "0 0 0 0 no-such-service"
        );
    }

    #[test]
    fn events_are_shown_once_and_again_after_a_restart() {
        let seen = tmp("seen.json", "");
        let h = tmp("h1.json", r#"[{"name":"vh","events":["a","b"]}]"#);
        assert_eq!(events(&h, &seen).unwrap(), "vh: a\nvh: b");
        let h = tmp("h2.json", r#"[{"name":"vh","events":["a","b","c"]}]"#);
        assert_eq!(events(&h, &seen).unwrap(), "vh: c");
        assert_eq!(events(&h, &seen).unwrap(), "");
        let h = tmp("h3.json", r#"[{"name":"vh","events":["z"]}]"#);
        assert_eq!(events(&h, &seen).unwrap(), "vh: z");
    }

    #[test]
    fn rates_count_what_moved_since_the_base() {
        let base = tmp(
            "base.json",
            r#"{"ports":[{"name":"a","tx_bytes":1000,"rx_bytes":0}]}"#,
        );
        let cur = tmp(
            "cur.json",
            r#"{"ports":[{"name":"a","tx_bytes":2098152,"rx_bytes":209715},{"name":"b","tx_bytes":10,"rx_bytes":10}]}"#,
        );
        assert_eq!(rates(&cur, &base), "fabric: a sent 2.0 MiB/got 0.2 MiB");
        assert_eq!(rates(&base, &base), "fabric: quiet");
        assert_eq!(rates(Path::new("/nonexistent"), &base), "");
    }

    #[test]
    fn smc_and_flows_count_confirmed_v2_sessions_and_link_connections() {
        let f = tmp(
            "flows.json",
            r#"{"smc":[{"kind":"SMC-R","version":2,"state":"proposed","connection":"x"},
                       {"kind":"SMC-R","version":2,"state":"confirmed","connection":"10.77.0.2:1 > 10.77.0.1:2","first_contact":true,"server_qpn":17,"client_qpn":null}],
                "roce":[{"transport":"rc","halves":[{"smc":true},{}]},{"transport":"rc","halves":[{}]},{"transport":"ud","halves":[]}],
                "iwarp":[{}]}"#,
        );
        assert_eq!(
            smc(&f),
            "1 10.77.0.2:1 > 10.77.0.1:2 [SMC-R v2 confirmed, first contact] link QPs: server 0x11, client -"
        );
        assert_eq!(flows(&f), "2 1 1 1");
        let none = tmp(
            "flows0.json",
            r#"{"smc":[{"kind":"SMC-R","version":2,"state":"proposed"}]}"#,
        );
        assert_eq!(smc(&none), "0 states seen: SMC-R v2 proposed");
        assert_eq!(flows(&none), "0 0 0 0");
    }

    #[test]
    fn device_counters_and_findings() {
        let st = tmp(
            "status.json",
            r#"{"devices":[{"kind":"gve","gve":{"counters":{"rx_queues":[
                    {"hsplit_packets":3,"header_bytes":100,"payload_bytes":1000,"packets":4},
                    {"hsplit_packets":1,"header_bytes":10,"payload_bytes":5,"packets":1}]}}},
                {"kind":"erdma","port":"r","erdma":{"path_mtu":1024,"counters":{"qps_live":2,"cmd_common_ok":3,"cmd_rdma_ok":4,"tx_bytes":1048576,"rc_retries":5}}}]}"#,
        );
        assert_eq!(gve(&st), "4 110 1005 5");
        let e = erdma(&st);
        assert!(e.starts_with(
            "erdma function r: path MTU 1024, live QPs 2 CQs 0 MRs 0; commands ok 7 failed 0\n"
        ));
        assert!(e.contains("RoCEv2 frames sent 0 (1.0 MiB), received 0 (0.0 MiB), dropped 0 (? not RoCE); RC retries 5, timeouts ?"));
        assert_eq!(findings(&tmp("f.json", r#"{"total":0}"#)), "0");
        assert_eq!(findings(Path::new("/nonexistent")), "?");
    }

    #[test]
    fn phs_sums_frames_by_protocol_path() {
        let text = "===\nProtocol Hierarchy Statistics\n\
eth                                      frames:100 bytes:1\n  \
ip                                     frames:100 bytes:1\n    \
udp                                  frames:60 bytes:1\n      \
infiniband                         frames:60 bytes:1\n        \
smc                              frames:20 bytes:1\n    \
tcp                                  frames:40 bytes:1\n      \
iwarp_mpa                          frames:7 bytes:1\n      \
smc                                frames:2 bytes:1\n      \
_ws.malformed                      frames:1 bytes:1\n";
        assert_eq!(phs(text), "60 20 2 7 1");
    }
}
