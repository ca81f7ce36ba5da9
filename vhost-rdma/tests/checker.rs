//! No-VM end-to-end tests of the live protocol checker (issue 6): one test
//! guest sends a crafted RoCE RC stream to another through the daemon, the
//! other answers with ACKs, and `flows` / `findings` are read over the
//! control socket.

mod common;

use common::{TestFabric, TestGuest, TxOpts, ARRIVE, QUIET};
use roce_model::{Aeth, AethSyndrome, FrameBuilder, NakCode, NetParams, Opcode, PacketBuilder};
use std::path::Path;
use vhost_rdma::checker::FindingsReply;
use vhost_rdma::control::{request, Request};
use vhost_rdma::faults::{Dir, FaultAction, FaultSpec};
use wire_checker::{FlowsView, Rule};

/// QPN of the guest on port 0 (B's packets go to it) and of the guest on port 1.
const QA: u32 = 0x11;
const QB: u32 = 0x12;

fn builder(fab: &TestFabric, from: usize) -> FrameBuilder {
    let ip = |i: usize| [10, 0, 0, 1 + i as u8];
    FrameBuilder {
        dst_mac: fab.mac(1 - from),
        src_mac: fab.mac(from),
        vlan_tci: None,
        net: NetParams::Ipv4 {
            src: ip(from),
            dst: ip(1 - from),
            tos: 0,
            ttl: 64,
            ident: 0,
            udp_src_port: 0xc000 + from as u16,
        },
    }
}

fn send_only(fab: &TestFabric, psn: u32) -> Vec<u8> {
    let payload = [psn as u8; 64];
    builder(fab, 0)
        .build(
            &PacketBuilder::new(Opcode::RcSendOnly, QB, psn)
                .ack_req(true)
                .payload(&payload),
        )
        .unwrap()
}

fn aeth_frame(fab: &TestFabric, psn: u32, syndrome: AethSyndrome, msn: u32) -> Vec<u8> {
    builder(fab, 1)
        .build(&PacketBuilder::new(Opcode::RcAcknowledge, QA, psn).aeth(Aeth { syndrome, msn }))
        .unwrap()
}

fn ack(fab: &TestFabric, psn: u32, msn: u32) -> Vec<u8> {
    aeth_frame(fab, psn, AethSyndrome::Ack { credits: 31 }, msn)
}

fn tx(g: &mut TestGuest, f: &[u8]) {
    g.send(0, f, &TxOpts::default());
    assert!(g.wait_tx(0, ARRIVE), "TX not returned");
}

fn flows(ctl: &Path) -> FlowsView {
    let r = request(ctl, &Request::Flows).unwrap();
    assert!(r.ok, "{:?}", r.error);
    r.into_flows().unwrap()
}

fn findings(ctl: &Path, clear: bool) -> FindingsReply {
    let r = request(ctl, &Request::Findings { clear }).unwrap();
    assert!(r.ok, "{:?}", r.error);
    r.into_findings().unwrap()
}

/// A sends SEND ONLYs with `psns` (corrupting the ICRC of `bad_icrc`), B
/// ACKs the last one; returns how many frames B received.
fn run(
    fab: &TestFabric,
    a: &mut TestGuest,
    b: &mut TestGuest,
    psns: &[u32],
    bad_icrc: Option<u32>,
) -> usize {
    for &p in psns {
        let mut f = send_only(fab, p);
        if bad_icrc == Some(p) {
            let n = f.len();
            f[n - 2] ^= 0x40;
        }
        tx(a, &f);
    }
    let got = b.drain_all(QUIET).len();
    let last = *psns.last().unwrap();
    tx(b, &ack(fab, last, last + 1));
    assert!(a.recv(0, ARRIVE).is_some(), "ACK reached A");
    got
}

#[test]
fn clean_run_has_no_findings_and_shows_the_connection() {
    let (fab, mut a, mut b) = TestFabric::pair(true);
    let ctl = fab.control_socket();
    let got = run(&fab, &mut a, &mut b, &(0..8).collect::<Vec<_>>(), None);
    assert_eq!(got, 8);
    let f = findings(&ctl, false);
    assert_eq!(f.findings, vec![], "clean run");
    assert_eq!(f.total, 0);
    let v = flows(&ctl);
    assert_eq!(v.roce.len(), 1, "{v:#?}");
    let c = &v.roce[0];
    assert!(c.paired);
    assert_eq!(c.connection, "roce#1 10.0.0.1/qp0x11 <-> 10.0.0.2/qp0x12");
    assert_eq!(c.halves[0].port, "p0");
    assert_eq!(c.halves[0].next_psn, Some(8));
    assert_eq!(c.halves[0].messages, 8);
    assert_eq!(c.halves[1].port, "p1");
    assert_eq!(c.halves[1].last_ack_psn, Some(7));
    assert_eq!(c.halves[1].msn, Some(8));
    // Counters in `status`.
    let s = request(&ctl, &Request::Status)
        .unwrap()
        .into_status()
        .unwrap();
    let ch = s.checker.unwrap();
    assert!(ch.enabled);
    assert_eq!(ch.stats.roce_packets, 9);
}

#[test]
fn bad_icrc_and_psn_gap_are_exactly_the_findings() {
    let (fab, mut a, mut b) = TestFabric::pair(true);
    let ctl = fab.control_socket();
    // PSN 3 with a bad ICRC; PSN 5 never sent.
    run(&fab, &mut a, &mut b, &[0, 1, 2, 3, 4, 6, 7], Some(3));
    let f = findings(&ctl, false);
    let rules: Vec<Rule> = f.findings.iter().map(|x| x.rule).collect();
    assert_eq!(rules, vec![Rule::Icrc, Rule::PsnGap], "{:#?}", f.findings);
    for (x, psn) in f.findings.iter().zip([3, 6]) {
        assert_eq!(x.psn, Some(psn));
        // Raised before B's ACK paired the halves: A's QPN is not known yet,
        // the connection id is the one `flows` shows.
        assert_eq!(x.connection, "roce#1 10.0.0.1/qp? <-> 10.0.0.2/qp0x12");
        assert_eq!(x.direction, "10.0.0.1 -> 10.0.0.2 qp0x12");
        assert_eq!(x.port, "p0");
    }
    assert_eq!(
        flows(&ctl).roce[0].connection,
        "roce#1 10.0.0.1/qp0x11 <-> 10.0.0.2/qp0x12"
    );
    // The CLI renders both views (human and --json).
    let ctl_out = |args: &[&str]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_vhost-rdma"))
            .arg("ctl")
            .arg("--control")
            .arg(&ctl)
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let text = String::from_utf8(o.stdout).unwrap();
        println!("$ vhost-rdma ctl {}\n{text}", args.join(" "));
        text
    };
    let text = ctl_out(&["findings"]);
    assert!(
        text.contains("[icrc] roce#1") && text.contains("[psn-gap] roce#1"),
        "{text}"
    );
    assert!(text.contains("2 finding(s) shown"), "{text}");
    let text = ctl_out(&["flows"]);
    assert!(
        text.contains("roce#1 10.0.0.1/qp0x11 <-> 10.0.0.2/qp0x12 [rc]"),
        "{text}"
    );
    let j: serde_json::Value = serde_json::from_str(&ctl_out(&["--json", "findings"])).unwrap();
    assert_eq!(j["findings"][1]["rule"], "psn-gap");
    assert!(ctl_out(&["status"]).contains("checker on:"));
    // --clear returns them once, then they are gone (counters stay).
    assert_eq!(findings(&ctl, true).findings.len(), 2);
    let after = findings(&ctl, false);
    assert!(after.findings.is_empty());
    assert_eq!(after.total, 2);
}

#[test]
fn injected_faults_show_as_counters_not_findings() {
    let (fab, mut a, mut b) = TestFabric::pair(true);
    let ctl = fab.control_socket();
    let fabric = fab.server.as_ref().unwrap().fabric().clone();
    // The fabric corrupts PSN 2's ICRC on its way to B: B's rxe would drop it,
    // NAK PSN 2 when PSN 3 arrives, and A would go back to PSN 2.
    fabric
        .faults
        .add(FaultSpec {
            port: "p1".into(),
            dir: Dir::Egress,
            psn: Some("2".into()),
            icrc: true,
            every: Some(2),
            action: FaultAction::Corrupt,
            ..FaultSpec::default()
        })
        .unwrap();
    for p in [0, 1, 2] {
        tx(&mut a, &send_only(&fab, p));
    }
    // Every 2nd match: the first PSN 2 passes; send it again to be hit.
    tx(&mut a, &send_only(&fab, 2));
    tx(&mut a, &send_only(&fab, 3));
    tx(
        &mut b,
        &aeth_frame(
            &fab,
            2,
            AethSyndrome::Nak {
                code: NakCode::PsnSequenceError,
            },
            2,
        ),
    );
    tx(&mut a, &send_only(&fab, 2));
    tx(&mut a, &send_only(&fab, 3));
    tx(&mut b, &ack(&fab, 3, 4));
    let _ = b.drain_all(QUIET);
    let status = fabric.faults.status();
    assert_eq!(status.rules[0].acted, 1, "the fault hit one frame");
    let f = findings(&ctl, false);
    assert_eq!(f.findings, vec![], "faults are not protocol violations");
    let v = flows(&ctl);
    let c = &v.roce[0];
    assert_eq!(c.halves[0].retransmits, 3, "PSN 2 twice, PSN 3 once");
    assert_eq!(c.halves[0].icrc_errors, 0, "the tap saw A's intact frames");
    assert_eq!(c.halves[1].naks_seq, 1);
}

#[test]
fn checker_can_be_switched_off() {
    let (fab, mut a, mut b) = TestFabric::pair(true);
    let ctl = fab.control_socket();
    let r = request(
        &ctl,
        &Request::Checker {
            enabled: Some(false),
        },
    )
    .unwrap();
    assert!(!r.into_checker().unwrap().enabled);
    run(&fab, &mut a, &mut b, &[0, 5], Some(0));
    assert!(findings(&ctl, false).findings.is_empty());
    assert!(flows(&ctl).roce.is_empty());
    request(
        &ctl,
        &Request::Checker {
            enabled: Some(true),
        },
    )
    .unwrap();
    // The first packet seen sets the baseline PSN.
    run(&fab, &mut a, &mut b, &[10, 11], None);
    assert_eq!(findings(&ctl, false).findings.len(), 0);
    run(&fab, &mut a, &mut b, &[13], None);
    let f = findings(&ctl, false);
    assert_eq!(
        f.findings.iter().map(|x| x.rule).collect::<Vec<_>>(),
        vec![Rule::PsnGap]
    );
}
