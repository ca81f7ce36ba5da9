//! `guest-runner rss-host` against a fake daemon and a scripted guest A:
//! the step handshake, the checks, and the failure paths (no QEMU needed;
//! the matrix's rss cell runs it against the real daemon and guests).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// A stand-in for `vhost-rdma ctl --control SOCK [--json] ARGS`: answers
/// from JSON files in $FAKE_STATE; fails everything when $FAKE_FAIL is set.
const FAKE_DAEMON: &str = r#"#!/bin/sh
shift 3
[ -n "$FAKE_FAIL" ] && { echo "cannot connect" >&2; exit 1; }
[ "$1" = --json ] && shift
case "$*" in
    "flow-rule add"*--drop*) echo '{"rule_id": 2}' ;;
    "flow-rule add"*) echo '{"rule_id": 1}' ;;
    "flow-rule list"*) cat "$FAKE_STATE/rules.json" ;;
    *--predict*) cat "$FAKE_STATE/predict.json" ;;
    *--clear-flows*) echo '{}' ;;
    rss*) cat "$FAKE_STATE/rss.json" ;;
    *) echo "fake: unknown ctl $*" >&2; exit 2 ;;
esac
"#;

const KEY: &str = "5a:7f:10:35:ce:e3:84:59";

fn name(proto: &str, port: u16) -> String {
    format!("10.77.0.2:5201-10.77.0.1:{port}/{proto}")
}

/// The test flows and the queue the fake model gives each.
fn flows() -> Vec<(&'static str, u16, u64)> {
    vec![
        ("tcp", 41001, 0),
        ("tcp", 41004, 1),
        ("udp", 42001, 2),
        ("udp", 42004, 3),
    ]
}
const MOVE_PORT: u16 = 41100;
const MOVE_QUEUE: u64 = 1;

struct Rig {
    dir: PathBuf,
    job_a: PathBuf,
    job_b: PathBuf,
    state: PathBuf,
}

impl Rig {
    fn new(tag: &str) -> Rig {
        let dir =
            std::env::temp_dir().join(format!("guest-results-rss-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (job_a, job_b, state) = (dir.join("a.job"), dir.join("b.job"), dir.join("state"));
        for d in [&job_a, &job_b, &state] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        let fake = dir.join("vhost-rdma");
        std::fs::write(&fake, FAKE_DAEMON).expect("write fake");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let fl: Vec<Value> = flows().iter().map(|(p, s, _)| json!([p, s])).collect();
        std::fs::write(
            dir.join("flows.json"),
            json!({"key": KEY, "flows": fl, "move_sport": MOVE_PORT}).to_string(),
        )
        .expect("flows.json");
        Rig {
            dir,
            job_a,
            job_b,
            state,
        }
    }

    fn spawn(&self, fail: bool) -> Child {
        let mut c = Command::new(env!("CARGO_BIN_EXE_guest-runner"));
        c.arg("rss-host")
            .arg(self.dir.join("vhost-rdma"))
            .arg(self.dir.join("ctl.sock"))
            .arg(&self.job_a)
            .arg(&self.job_b)
            .arg(self.dir.join("flows.json"))
            .args(["--step-timeout", "30"])
            .env("FAKE_STATE", &self.state)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if fail {
            c.env("FAKE_FAIL", "1");
        }
        c.spawn().expect("spawn rss-host")
    }

    fn state(&self, file: &str, v: Value) {
        std::fs::write(self.state.join(file), v.to_string()).expect("state");
    }

    /// Guest A's side of a step: request, then wait for the ack's text.
    fn step(&self, step: &str) -> String {
        std::fs::write(self.job_a.join(format!("{step}.req")), "").expect("req");
        let ack = self.job_a.join(format!("{step}.ack"));
        let t0 = Instant::now();
        while !ack.exists() {
            assert!(t0.elapsed() < Duration::from_secs(30), "no ack for {step}");
            std::thread::sleep(Duration::from_millis(50));
        }
        std::fs::read_to_string(ack).expect("ack")
    }

    fn ethtool_x(&self, step: &str, table: &[u64]) {
        let mut s = String::from("RX flow hash indirection table for eth0 with 4 RX ring(s):\n");
        for (i, row) in table.chunks(8).enumerate() {
            let cells: Vec<String> = row.iter().map(|x| format!("{x:>5}")).collect();
            s += &format!("{:>5}: {}\n", i * 8, cells.join(" "));
        }
        s += &format!(
            "RSS hash key:\n{}\nRSS hash function:\n    toeplitz: on\n",
            KEY.to_uppercase()
        );
        std::fs::write(self.job_a.join(format!("x-{step}.txt")), s).expect("ethtool dump");
    }
}

fn spread(n: u64) -> Vec<u64> {
    (0..128).map(|i| i % n).collect()
}

fn status(table: &[u64], flows: Value, rule_drops: u64) -> Value {
    json!({"rss_negotiated": true, "hash_report_negotiated": true, "mode": "rss",
           "indirection_table": table, "key": KEY.replace(':', ""), "active_queue_pairs": 4,
           "max_tx_vq": 4, "hash_types": 0x1ff, "hash_type_names": ["IPv4", "TCPv4"],
           "flows": flows, "rule_drops": rule_drops})
}

fn hash(port: u16) -> u64 {
    u64::from(port) * 0x1000_0001 % 0xffff_ffff
}

/// A FLOW line whose deltas peak on `queue`.
fn flow_line(n: &str, rc: u32, queue: Option<u64>) -> String {
    let after: Vec<String> = (0..4)
        .map(|q| if Some(q) == queue { "500" } else { "3" }.to_string())
        .collect();
    format!(
        "FLOW {n} rc={rc} before=[0 0 0 0 ] after=[{} ]\n",
        after.join(" ")
    )
}

fn finish(child: Child) -> (i32, String) {
    let out = child.wait_with_output().expect("wait");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn every_check_passes_on_a_consistent_run() {
    let r = Rig::new("pass");
    let child = r.spawn(false);
    for (step, table) in [
        ("default", spread(4)),
        ("equal2", spread(2)),
        ("hkey", spread(4)),
    ] {
        r.ethtool_x(step, &table);
        r.state("rss.json", status(&table, json!([]), 0));
        if step == "hkey" {
            let mut p: Vec<Value> = flows()
                .iter()
                .map(|(pr, s, q)| json!({"flow": name(pr, *s), "queue": q, "how": "rss (toeplitz)",
                                         "hash_value": hash(*s), "hash_report": 2, "hash_report_name": "TCPv4"}))
                .collect();
            p.push(
                json!({"flow": name("tcp", MOVE_PORT), "queue": MOVE_QUEUE, "how": "rss",
                          "hash_value": 7, "hash_report": 2, "hash_report_name": "TCPv4"}),
            );
            r.state("predict.json", json!({"predictions": p}));
        }
        assert_eq!(r.step(step), "");
    }
    // flows: each peaks on its predicted queue, in the guest and the daemon
    let log: String = flows()
        .iter()
        .map(|(p, s, q)| flow_line(&name(p, *s), 0, Some(*q)))
        .collect();
    std::fs::write(r.job_a.join("out.log"), &log).expect("out.log");
    let seen: Vec<Value> = flows()
        .iter()
        .map(|(p, s, q)| {
            json!({"flow": name(p, *s), "queue": q, "hash_value": hash(*s), "hash_report": 2,
                                "frames": 100, "hash_reported": 100, "how": "rss"})
        })
        .collect();
    r.state("rss.json", status(&spread(4), json!(seen), 0));
    let target = (MOVE_QUEUE + 1) % 4;
    assert_eq!(r.step("flows"), format!("{target}\n"));
    let rules: Value = serde_json::from_str(
        &std::fs::read_to_string(r.job_a.join("rules.json")).expect("rules.json"),
    )
    .expect("json");
    assert_eq!(rules, json!({"move_id": 1, "drop_id": 2, "target": target}));
    // rules: the moved flow on the target queue, the dropped one timed out
    let log =
        log + &flow_line(&name("tcp", MOVE_PORT), 0, Some(target)) + &flow_line("drop", 1, None);
    std::fs::write(r.job_a.join("out.log"), log).expect("out.log");
    r.state(
        "rules.json",
        json!({"rules": [{"id": 1, "hits": 40}, {"id": 2, "hits": 3}]}),
    );
    let dropped =
        json!([{"flow": "10.77.0.2:5202-10.77.0.1:40000/tcp", "queue": null, "how": "rule 2"}]);
    r.state("rss.json", status(&spread(4), dropped, 3));
    assert_eq!(r.step("rules"), "");
    let (code, out) = finish(child);
    assert!(!out.contains("CHECK-FAIL"), "{out}");
    assert_eq!(code, 0, "{out}");
    // 5 per ethtool step + 2 (default) + 1 (equal2) + 2 and 5 predictions (hkey)
    // + 5 x 4 flows + 1 + 7 rules checks
    assert_eq!(
        out.lines().filter(|l| l.starts_with("CHECK-OK   ")).count(),
        5 * 3 + 2 + 1 + 2 + 5 + 20 + 1 + 7,
        "{out}"
    );
    assert!(
        out.contains("[rss-host] hash types 0x1ff IPv4 TCPv4"),
        "{out}"
    );
    assert!(out.contains(&format!("CHECK-OK   {}: daemon steered to queue 1 with hash {:#010x} report 2 == model (1, {:#010x}, TCPv4)",
        name("tcp", 41004), hash(41004), hash(41004))), "{out}");
    assert!(r.job_b.join("stop").exists(), "B released");
    let _ = std::fs::remove_dir_all(&r.dir);
}

#[test]
fn a_wrong_daemon_table_fails_its_checks() {
    let r = Rig::new("wrong");
    let child = r.spawn(false);
    r.ethtool_x("default", &spread(4));
    r.state("rss.json", status(&spread(4), json!([]), 0));
    r.step("default");
    // the guest set equal 2 but the daemon kept 4 queues
    r.ethtool_x("equal2", &spread(2));
    r.step("equal2");
    std::fs::write(r.job_a.join("abort"), "").expect("abort");
    let (code, out) = finish(child);
    assert_eq!(code, 1);
    assert!(
        out.contains(
            "CHECK-FAIL equal2: guest RETA == daemon table (daemon [0, 1, 2, 3, 0, 1, 2, 3]...)"
        ),
        "{out}"
    );
    assert!(
        out.contains("CHECK-FAIL equal2: ethtool -X equal 2 -> daemon table 0,1,0,1..."),
        "{out}"
    );
    assert!(out.contains("CHECK-FAIL guest reached step hkey"), "{out}");
    assert!(r.job_b.join("stop").exists());
    let _ = std::fs::remove_dir_all(&r.dir);
}

#[test]
fn a_failing_ctl_aborts_both_guests() {
    let r = Rig::new("ctlfail");
    let child = r.spawn(true);
    r.ethtool_x("default", &spread(4));
    std::fs::write(r.job_a.join("default.req"), "").expect("req");
    let (code, out) = finish(child);
    assert_eq!(code, 1);
    assert!(
        out.contains("CHECK-FAIL host helper: ctl rss --port a: cannot connect"),
        "{out}"
    );
    assert!(r.job_a.join("abort").exists() && r.job_b.join("stop").exists());
    assert!(!Path::new(&r.job_a.join("default.ack")).exists());
    let _ = std::fs::remove_dir_all(&r.dir);
}
