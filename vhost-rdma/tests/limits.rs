//! `[limits]`: every table a guest or a control client can grow stops at its
//! configured bound with a clear error and a counter, and the daemon keeps
//! working.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering::Relaxed;

use common::packet::tagged_frame;
use common::{feat, TestFabric, TxOpts, ARRIVE};
use vhost_rdma::config::Limits;
use vhost_rdma::control::{request, Request};
use vhost_rdma::faults::{Dir, FaultAction, FaultSpec};
use vhost_rdma::match_spec::MatchSpec;
use vhost_rdma::steering::FlowRuleSpec;
use vhost_rdma::DaemonConfig;

fn fabric(n: usize, limits: Limits) -> TestFabric {
    TestFabric::start_limits(n, |i, d| TestFabric::port_config(d, i, 2), true, limits)
}

fn status(fab: &TestFabric) -> vhost_rdma::control::Status {
    let r = request(&fab.control_socket(), &Request::Status).unwrap();
    r.into_status().expect("status reply")
}

#[test]
fn mac_table_limit() {
    let limits = Limits {
        mac_table: 3,
        ..Limits::default()
    };
    let fab = fabric(2, limits);
    let mut a = fab.connect(0, feat::ALL);
    let mut b = fab.connect(1, feat::ALL);
    b.post_rx(0, 64, 2048);
    b.post_rx(1, 64, 2048);
    // Port 0's guest sends from 6 spoofed source MACs.
    for i in 0..6u8 {
        let src = [0x02, 0, 0, 0, 0x77, i];
        a.send(
            0,
            &tagged_frame(fab.mac(1), src, u64::from(i), 100),
            &TxOpts::default(),
        );
    }
    assert!(a.wait_tx(0, ARRIVE));
    let full = fab
        .server
        .as_ref()
        .unwrap()
        .fabric()
        .mac_table_full
        .load(Relaxed);
    assert!(
        full >= 3,
        "MACs beyond the 3-entry table were learned ({full} refused)"
    );
    assert_eq!(status(&fab).mac_table_full, full);
    // The switch still forwards (unlearned sources flood, known ones unicast).
    let got = b.recv_from(&[0, 1], 6, ARRIVE);
    assert_eq!(got.len(), 6, "frames lost at a full MAC table");
}

#[test]
fn control_connection_limit() {
    let limits = Limits {
        control_connections: 2,
        ..Limits::default()
    };
    let fab = fabric(1, limits);
    let sock = fab.control_socket();
    // Two connections held open (each proven served by a reply).
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut c = UnixStream::connect(&sock).unwrap();
        c.write_all(b"{\"cmd\":\"status\"}\n").unwrap();
        let mut line = String::new();
        let mut r = BufReader::new(c.try_clone().unwrap());
        r.read_line(&mut line).unwrap();
        assert!(line.contains("\"ok\":true"), "{line}");
        held.push((c, r));
    }
    let c = UnixStream::connect(&sock).unwrap();
    let mut line = String::new();
    BufReader::new(c).read_line(&mut line).unwrap();
    assert!(
        line.contains("too many control connections (at most 2, [limits] control-connections)"),
        "{line}"
    );
    // A held connection still works and shows the refusal.
    let (c, r) = &mut held[0];
    c.write_all(b"{\"cmd\":\"status\"}\n").unwrap();
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.contains("\"control_refused\":1"), "{line}");
    drop(held);
    // Freed slots are usable again.
    assert!(common::wait_until(ARRIVE, || request(
        &sock,
        &Request::Status
    )
    .is_ok_and(|r| r.ok)));
}

#[test]
fn fault_rule_limit() {
    let limits = Limits {
        fault_rules: 2,
        ..Limits::default()
    };
    let fab = fabric(1, limits);
    let add = || {
        request(
            &fab.control_socket(),
            &Request::FaultAdd {
                rule: Box::new(FaultSpec {
                    port: "p0".into(),
                    dir: Dir::Both,
                    action: FaultAction::LinkDown,
                    every: Some(1000),
                    ..FaultSpec::default()
                }),
            },
        )
        .unwrap()
    };
    assert!(add().ok);
    assert!(add().ok);
    let r = add();
    assert!(!r.ok);
    let e = r.error.unwrap();
    assert!(
        e.contains("too many fault rules (at most 2, [limits] fault-rules)"),
        "{e}"
    );
    assert_eq!(status(&fab).fault_rules_refused, 1);
}

#[test]
fn flow_rule_limit() {
    let limits = Limits {
        flow_rules: 2,
        ..Limits::default()
    };
    let fab = fabric(1, limits.clone());
    let add = |dport: u16| {
        request(
            &fab.control_socket(),
            &Request::FlowRuleAdd {
                port: "p0".into(),
                rule: FlowRuleSpec {
                    fields: MatchSpec {
                        proto: Some("tcp".into()),
                        dst_port: Some(dport),
                        ..MatchSpec::default()
                    },
                    queue: Some(1),
                    ..FlowRuleSpec::default()
                },
            },
        )
        .unwrap()
    };
    assert!(add(1).ok);
    assert!(add(2).ok);
    let r = add(3);
    assert!(!r.ok);
    let e = r.error.unwrap();
    assert!(
        e.contains("too many flow rules on port p0 (at most 2, [limits] flow-rules)"),
        "{e}"
    );
    assert_eq!(status(&fab).flow_rules_refused, 1);

    // Configured rules count against the same limit.
    let mut p = vhost_rdma::PortConfig::new("a", "/tmp/a.sock");
    p.queue_pairs = 2;
    p.flow_rules = (0..3)
        .map(|i| FlowRuleSpec {
            fields: MatchSpec {
                dst_port: Some(i),
                proto: Some("udp".into()),
                ..MatchSpec::default()
            },
            queue: Some(0),
            ..FlowRuleSpec::default()
        })
        .collect();
    let cfg = DaemonConfig {
        ports: vec![p],
        limits,
        ..DaemonConfig::default()
    };
    let e = cfg.validate().unwrap_err().to_string();
    assert!(
        e.contains("3 flow rules configured, [limits] flow-rules is 2"),
        "{e}"
    );
}

#[test]
fn capture_file_limit() {
    let limits = Limits {
        capture_max_bytes: 4096,
        ..Limits::default()
    };
    let fab = fabric(2, limits);
    let file = fab.dir().join("cap.pcapng");
    let sock = fab.control_socket();
    let r = request(
        &sock,
        &Request::CaptureStart {
            file: file.clone(),
            port: None,
            snaplen: None,
        },
    )
    .unwrap();
    assert!(r.ok, "{:?}", r.error);
    let mut a = fab.connect(0, feat::ALL);
    let mut b = fab.connect(1, feat::ALL);
    b.post_rx(0, 64, 2048);
    b.post_rx(1, 64, 2048);
    for i in 0..10 {
        a.send(
            0,
            &tagged_frame(fab.mac(1), fab.mac(0), i, 1000),
            &TxOpts::default(),
        );
    }
    assert!(a.wait_tx(0, ARRIVE));
    assert_eq!(
        b.recv_from(&[0, 1], 10, ARRIVE).len(),
        10,
        "capture limit cost frames"
    );
    let r = request(&sock, &Request::CaptureStop).unwrap();
    assert!(r.ok, "{:?}", r.error);
    let st = r.into_capture().expect("capture status");
    assert!(st.limited > 0, "{st:?}");
    let e = st.error.clone().unwrap_or_default();
    assert!(
        e.contains("capture file reached [limits] capture-max-bytes = 4096"),
        "{e}"
    );
    let len = std::fs::metadata(&file).unwrap().len();
    assert!(
        len <= 4096 && len == st.bytes,
        "file {len} bytes, status {st:?}"
    );
}

/// `[limits] stuck-guest-ms`: a guest that posts no RX buffers while
/// frames arrive for it is reported stuck once (`stuck_reports`), with the
/// frames dropped meanwhile, in `ctl status`; the report clears once it
/// posts buffers and takes the frames.
#[test]
fn stuck_guest_is_named_then_cleared() {
    let limits = Limits {
        stuck_guest_ms: 300,
        ..Limits::default()
    };
    // One queue pair each; port 1 keeps at most 8 frames for its guest.
    let fab = TestFabric::start_limits(
        2,
        |i, d| {
            let mut c = TestFabric::port_config(d, i, 1);
            if i == 1 {
                c.rx_queue_frames = 8;
            }
            c
        },
        true,
        limits,
    );
    let mut a = fab.connect(0, feat::ALL);
    // Port 1's guest connects, enables its rings, and posts no RX buffer.
    let mut b = fab.connect(1, feat::ALL);
    let port1 = |fab: &TestFabric| status(fab).ports.into_iter().find(|p| p.name == "p1");
    let send = |a: &mut common::TestGuest, from: u64, n: u64| {
        for i in from..from + n {
            a.send(
                0,
                &tagged_frame(fab.mac(1), fab.mac(0), i, 200),
                &TxOpts::default(),
            );
        }
        assert!(a.wait_tx(0, ARRIVE), "port 0's TX stalled");
    };
    send(&mut a, 0, 4);
    // Frames wait, but not yet for the threshold: not stuck.
    let p = port1(&fab).expect("port p1");
    assert_eq!(p.stuck, None, "reported before the threshold: {p:?}");
    std::thread::sleep(std::time::Duration::from_millis(400));
    // More frames than the queue holds: the drops notice the stall.
    send(&mut a, 4, 40);
    let ok = common::wait_until(ARRIVE, || {
        port1(&fab).is_some_and(|p| p.stuck.as_ref().is_some_and(|s| s.guest.dropped > 0))
    });
    let p = port1(&fab).expect("port p1");
    assert!(ok, "stuck guest not reported with its drops: {p:?}");
    let s = p.stuck.clone().unwrap();
    assert!(s.guest.for_ms >= 300, "{s:?}");
    assert_eq!(
        s.guest.dropped, p.totals.rx_drops,
        "{s:?} vs {} drops",
        p.totals.rx_drops
    );
    assert!(
        s.text
            .starts_with("guest on port p1 has taken no frames for ")
            && s.text.ends_with(&format!("{} dropped", s.guest.dropped)),
        "{}",
        s.text
    );
    // Reported once, however many drops and status requests since.
    send(&mut a, 44, 20);
    let p = port1(&fab).expect("port p1");
    assert!(p.stuck.is_some());
    assert_eq!(p.stuck_reports, 1, "reported more than once: {p:?}");
    // Port 0's guest is fine: no report there.
    let p0 = status(&fab)
        .ports
        .into_iter()
        .find(|p| p.name == "p0")
        .unwrap();
    assert_eq!((&p0.stuck, p0.stuck_reports), (&None, 0));
    // The guest posts buffers and takes the waiting frames: the report clears.
    b.post_rx(0, 64, 2048);
    let got = b.recv_from(&[0], 8, ARRIVE);
    assert!(!got.is_empty(), "no waiting frame delivered");
    assert!(
        common::wait_until(ARRIVE, || port1(&fab).is_some_and(|p| p.stuck.is_none())),
        "report not cleared: {:?}",
        port1(&fab)
    );
    // It stays cleared while the guest takes frames.
    send(&mut a, 64, 4);
    assert_eq!(b.recv_from(&[0], 4, ARRIVE).len(), 4);
    let p = port1(&fab).expect("port p1");
    assert_eq!((&p.stuck, p.stuck_reports), (&None, 1), "{p:?}");
}
