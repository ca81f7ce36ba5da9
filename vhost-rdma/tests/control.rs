//! The control protocol over a real socket: the version rule and the shape
//! of replies as scripts read them (raw JSON lines, not the Rust types).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

use common::TestFabric;
use vhost_rdma::control::{request, Request, PROTOCOL_VERSION};

/// One port and a control socket.
fn fabric() -> TestFabric {
    TestFabric::start_full(1, |i, d| TestFabric::port_config(d, i, 2), true)
}

/// Sends raw request lines on one connection; returns the reply lines.
fn exchange(fab: &TestFabric, lines: &[&str]) -> Vec<serde_json::Value> {
    let mut c = UnixStream::connect(fab.control_socket()).unwrap();
    let mut r = BufReader::new(c.try_clone().unwrap());
    lines
        .iter()
        .map(|l| {
            c.write_all(format!("{l}\n").as_bytes()).unwrap();
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            serde_json::from_str(&line).unwrap()
        })
        .collect()
}

#[test]
fn a_newer_protocol_version_is_refused_and_counted() {
    let fab = fabric();
    let replies = exchange(
        &fab,
        &[
            r#"{"cmd":"status","version":2}"#,
            r#"{"cmd":"something-new","version":3}"#,
            r#"{"cmd":"status"}"#,
            r#"{"cmd":"status","version":1}"#,
        ],
    );
    for (r, v) in replies[..2].iter().zip([2, 3]) {
        assert_eq!(r["ok"], false, "{r}");
        assert_eq!(
            r["error"],
            format!(
                "control protocol version {v} is not spoken by this daemon (it speaks version 1 only); use the vhost-rdma ctl of the daemon's release"
            )
        );
        assert_eq!(r["version"], 1);
    }
    for r in &replies[2..] {
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(r["version"], 1);
        // What scripts read (`.status.ports`, counters beside it).
        assert!(r["status"]["ports"].is_array(), "{r}");
        assert_eq!(r["status"]["control_version_refused"], 2, "{r}");
    }
    // The library client names its version and reads the counter too.
    let r = request(&fab.control_socket(), &Request::Status).unwrap();
    assert_eq!(r.version, PROTOCOL_VERSION);
    assert_eq!(r.into_status().unwrap().control_version_refused, 2);
}

#[test]
fn replies_keep_their_keys() {
    let fab = fabric();
    let replies = exchange(
        &fab,
        &[
            r#"{"cmd":"fault-list"}"#,
            r#"{"cmd":"flow-rule-list","port":"nope"}"#,
            r#"{"cmd":"capture-stop"}"#,
            r#"{"cmd":"nope"}"#,
        ],
    );
    assert_eq!(replies[0]["ok"], true);
    assert!(replies[0]["faults"]["rules"].is_array(), "{}", replies[0]);
    for r in &replies[1..] {
        assert_eq!(r["ok"], false, "{r}");
        // A refusal is ok, error and version, nothing else.
        assert_eq!(r.as_object().unwrap().len(), 3, "{r}");
    }
    assert_eq!(replies[2]["error"], "no capture runs");
    assert!(
        replies[3]["error"]
            .as_str()
            .unwrap()
            .starts_with("bad request: unknown variant `nope`"),
        "{}",
        replies[3]
    );
}
