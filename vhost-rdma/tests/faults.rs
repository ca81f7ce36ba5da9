//! No-VM tests of fault injection and captures (issue 6): in-process guests
//! on a two-port fabric, rules installed through the fabric or the control
//! socket, captures parsed by a small pcapng reader (and by tshark when it
//! is installed).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::packet::{frame_tag, tagged_frame};
use common::{feat, TestFabric, TestGuest, TxOpts, ARRIVE, QUIET};
use roce_model::{FrameBuilder, NetParams, Opcode, PacketBuilder, RoceFrame};
use vhost_rdma::control::{request, Request};
use vhost_rdma::fabric::Fabric;
use vhost_rdma::faults::{Dir, FaultAction, FaultSpec};
use vhost_rdma::match_spec::MatchSpec;

fn fabric_of(f: &TestFabric) -> Arc<Fabric> {
    f.server.as_ref().unwrap().fabric().clone()
}

fn spec(port: &str, dir: Dir, action: FaultAction) -> FaultSpec {
    FaultSpec {
        port: port.into(),
        dir,
        action,
        ..FaultSpec::default()
    }
}

/// Sends tagged frames `tags` from `a` to port 1's MAC, one at a time.
fn send_tags(fab: &TestFabric, a: &mut TestGuest, tags: impl IntoIterator<Item = u64>) {
    for t in tags {
        let f = tagged_frame(fab.mac(1), fab.mac(0), t, 200);
        a.send(0, &f, &TxOpts::default());
        assert!(a.wait_tx(0, ARRIVE), "TX of frame {t} not returned");
    }
}

/// Tags of everything that arrives within `wait`.
fn recv_tags(g: &mut TestGuest, wait: Duration) -> Vec<u64> {
    g.drain_all(wait)
        .iter()
        .filter_map(|r| frame_tag(&r.data))
        .collect()
}

fn rule_counters(fab: &Fabric, id: u32) -> (u64, u64) {
    let s = fab.faults.status();
    let r = s.rules.iter().find(|r| r.id == id).expect("rule listed");
    (r.matched, r.acted)
}

#[test]
fn drop_every_second_frame() {
    let (fab, mut a, mut b) = TestFabric::pair(false);
    let f = fabric_of(&fab);
    let id = f
        .faults
        .add(FaultSpec {
            every: Some(2),
            ..spec("p1", Dir::Egress, FaultAction::Drop)
        })
        .unwrap();
    send_tags(&fab, &mut a, 0..20);
    let got = recv_tags(&mut b, QUIET * 2);
    assert_eq!(got, (0..20).step_by(2).collect::<Vec<_>>());
    assert_eq!(rule_counters(&f, id), (20, 10));
    // The guest's own frames are not egress of p1.
    assert_eq!(fab.stats(1).totals.rx_frames, 10);
}

fn prob_run(seed: u64) -> Vec<u64> {
    let (fab, mut a, mut b) = TestFabric::pair(false);
    let f = fabric_of(&fab);
    let id = f
        .faults
        .add(FaultSpec {
            prob: Some(0.3),
            seed: Some(seed),
            ..spec("p0", Dir::Ingress, FaultAction::Drop)
        })
        .unwrap();
    send_tags(&fab, &mut a, 0..60);
    let got = recv_tags(&mut b, QUIET * 2);
    let (m, acted) = rule_counters(&f, id);
    assert_eq!(m, 60);
    assert_eq!(got.len() as u64, 60 - acted);
    got
}

#[test]
fn probabilistic_drop_is_reproducible() {
    let one = prob_run(42);
    let two = prob_run(42);
    assert_eq!(one, two, "same seed, same frames: same drops");
    assert!(
        one.len() > 20 && one.len() < 58,
        "30 % loss of 60 frames left {}",
        one.len()
    );
    let other = prob_run(7);
    assert_ne!(one, other, "another seed drops other frames");
}

#[test]
fn duplicate_delivers_twice() {
    let (fab, mut a, mut b) = TestFabric::pair(false);
    let f = fabric_of(&fab);
    let id = f
        .faults
        .add(spec("p1", Dir::Egress, FaultAction::Dup))
        .unwrap();
    send_tags(&fab, &mut a, 0..5);
    let got = recv_tags(&mut b, QUIET * 2);
    assert_eq!(got, vec![0, 0, 1, 1, 2, 2, 3, 3, 4, 4]);
    assert_eq!(rule_counters(&f, id), (5, 5));
}

#[test]
fn reorder_window_shuffles_without_loss() {
    let (fab, mut a, mut b) = TestFabric::pair(false);
    let f = fabric_of(&fab);
    f.faults
        .add(FaultSpec {
            window: Some(4),
            hold_ms: Some(1500),
            seed: Some(3),
            ..spec("p1", Dir::Egress, FaultAction::Reorder)
        })
        .unwrap();
    // 18 frames: four full windows and a partial one released by hold-ms.
    let t0 = Instant::now();
    send_tags(&fab, &mut a, 0..18);
    let mut got = Vec::new();
    while got.len() < 18 && t0.elapsed() < ARRIVE {
        got.extend(recv_tags(&mut b, Duration::from_millis(100)));
    }
    assert!(
        t0.elapsed() >= Duration::from_millis(1500),
        "the partial batch waits for hold-ms"
    );
    let mut sorted = got.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        (0..18).collect::<Vec<_>>(),
        "all arrive once: {got:?}"
    );
    assert_ne!(got, sorted, "order changed");
    for w in got[..16].chunks(4).enumerate() {
        let (i, c) = w;
        let mut c = c.to_vec();
        c.sort();
        let want: Vec<u64> = (i as u64 * 4..i as u64 * 4 + 4).collect();
        assert_eq!(c, want, "reordering stays within a window");
    }
}

#[test]
fn delay_holds_frames() {
    let (fab, mut a, mut b) = TestFabric::pair(false);
    let f = fabric_of(&fab);
    f.faults
        .add(FaultSpec {
            delay_ms: Some(250),
            jitter_ms: Some(20),
            ..spec("p1", Dir::Egress, FaultAction::Delay)
        })
        .unwrap();
    let t0 = Instant::now();
    send_tags(&fab, &mut a, 0..3);
    let early = recv_tags(&mut b, Duration::from_millis(150));
    assert!(early.is_empty(), "arrived before the delay: {early:?}");
    let mut got = Vec::new();
    while got.len() < 3 && t0.elapsed() < ARRIVE {
        got.extend(recv_tags(&mut b, Duration::from_millis(50)));
    }
    let el = t0.elapsed();
    got.sort();
    assert_eq!(got, vec![0, 1, 2]);
    assert!(el >= Duration::from_millis(250), "arrived after {el:?}");
}

/// `mpa-settle` (the Linux siw workaround): after an MPA Reply passes, the
/// connection's data segments in both directions wait until `delay-ms` after
/// it; whatever else goes between the same two IP hosts queues behind them
/// (a new connection's SYN must not overtake them); everything arrives in
/// order. Other host pairs and non-TCP frames pass.
#[test]
fn mpa_settle_holds_data_behind_an_mpa_reply_in_order() {
    use common::packet::{tcp_frame, Flow, L4Csum};
    let (fab, mut a, mut b) = TestFabric::pair(false);
    let f = fabric_of(&fab);
    let id = f
        .faults
        .add(FaultSpec {
            delay_ms: Some(300),
            ..spec("p0", Dir::Both, FaultAction::MpaSettle)
        })
        .unwrap();
    let (ma, mb) = (fab.mac(0), fab.mac(1));
    let to_b = Flow::v4(ma, mb, 40000, 7174);
    let to_a = Flow::v4(mb, ma, 7174, 40000);
    let syn_b = Flow::v4(ma, mb, 40001, 7174);
    let mut far = Flow::v4(ma, mb, 40002, 7174);
    far.src_ip = vec![10, 9, 9, 9];
    const ACK: u8 = 0x10;
    const PSH: u8 = 0x08;
    const SYN: u8 = 0x02;
    let seg = |fl: &Flow, seq: u32, flags: u8, data: &[u8]| {
        tcp_frame(fl, seq, flags, data, L4Csum::Full).0
    };
    // Data before any Reply passes at once (the MPA Request itself).
    let req = seg(&to_b, 1, ACK | PSH, b"MPA ID Req Frame\x80\x00\x00\x00");
    a.send(0, &req, &TxOpts::default());
    let got = b.recv_n(0, 1, ARRIVE);
    assert!(
        got.len() == 1 && got[0].data == req,
        "MPA Request delayed or lost"
    );
    // b's Reply passes at once.
    let mut reply = b"MPA ID Rep Frame".to_vec();
    reply.extend_from_slice(&[0x40, 0, 0, 0]);
    let reply = seg(&to_a, 1, ACK | PSH, &reply);
    let t0 = Instant::now();
    b.send(0, &reply, &TxOpts::default());
    let got = a.recv_n(0, 1, ARRIVE);
    assert!(
        got.len() == 1 && got[0].data == reply,
        "MPA Reply delayed or lost"
    );
    // Data right behind it, both ways, is held; so are an ACK and another
    // connection's SYN between the same hosts, behind it. Another host pair
    // and a non-IP frame pass.
    let d_ab: Vec<Vec<u8>> = (0..3u8)
        .map(|i| seg(&to_b, 100 + u32::from(i), ACK | PSH, &[i; 40]))
        .collect();
    let d_ba = seg(&to_a, 200, ACK | PSH, &[9; 60]);
    let ack = seg(&to_b, 103, ACK, &[]);
    let syn = seg(&syn_b, 5, SYN, &[]);
    let other_pair = seg(&far, 5, ACK | PSH, &[7; 30]);
    for d in &d_ab {
        a.send(0, d, &TxOpts::default());
    }
    b.send(0, &d_ba, &TxOpts::default());
    a.send(0, &ack, &TxOpts::default());
    a.send(0, &syn, &TxOpts::default());
    a.send(0, &other_pair, &TxOpts::default());
    send_tags(&fab, &mut a, [77]);
    let early = b.drain_all(Duration::from_millis(150));
    assert!(
        t0.elapsed() < Duration::from_millis(300),
        "test too slow to judge"
    );
    let early: Vec<&Vec<u8>> = early.iter().map(|r| &r.data).collect();
    assert_eq!(
        early.len(),
        2,
        "only the other host pair and the tagged frame pass at once"
    );
    assert!(early.contains(&&other_pair));
    assert!(
        a.drain_all(Duration::from_millis(10)).is_empty(),
        "b's data passed during the settle time"
    );
    // After the settle time: everything held, in order.
    let mut late_b = Vec::new();
    while late_b.len() < 5 && t0.elapsed() < ARRIVE {
        late_b.extend(b.drain_all(Duration::from_millis(50)));
    }
    assert!(
        t0.elapsed() >= Duration::from_millis(300),
        "released early: {:?}",
        t0.elapsed()
    );
    let late_b: Vec<Vec<u8>> = late_b.into_iter().map(|r| r.data).collect();
    let mut want = d_ab.clone();
    want.push(ack);
    want.push(syn);
    assert_eq!(
        late_b, want,
        "held segments a->b arrive complete and in order"
    );
    let late_a = a.recv_n(0, 1, ARRIVE);
    assert!(
        late_a.len() == 1 && late_a[0].data == d_ba,
        "held segment b->a"
    );
    // Once settled, the connection's data passes at once.
    let d = seg(&to_b, 300, ACK | PSH, &[3; 20]);
    let t1 = Instant::now();
    a.send(0, &d, &TxOpts::default());
    let got = b.recv_n(0, 1, ARRIVE);
    assert!(got.len() == 1 && got[0].data == d);
    assert!(
        t1.elapsed() < Duration::from_millis(250),
        "held after settling"
    );
    let (matched, acted) = rule_counters(&f, id);
    assert_eq!(acted, 6, "6 segments held (matched {matched})");
    assert_eq!(
        f.faults.status().delayed,
        0,
        "nothing left in the timer queue"
    );
    // Clear errors for what the workaround does not take.
    let e = f
        .faults
        .add(spec("p0", Dir::Both, FaultAction::MpaSettle))
        .unwrap_err();
    assert!(e.to_string().contains("delay-ms"), "{e}");
    let e = f
        .faults
        .add(FaultSpec {
            delay_ms: Some(100),
            prob: Some(0.5),
            ..spec("p0", Dir::Both, FaultAction::MpaSettle)
        })
        .unwrap_err();
    assert!(e.to_string().contains("prob"), "{e}");
}

fn roce_frame(fab: &TestFabric, qpn: u32, psn: u32, payload: &[u8]) -> Vec<u8> {
    roce_frame_op(fab, Opcode::RcSendOnly, qpn, psn, payload)
}

fn roce_frame_op(fab: &TestFabric, op: Opcode, qpn: u32, psn: u32, payload: &[u8]) -> Vec<u8> {
    let b = FrameBuilder {
        dst_mac: fab.mac(1),
        src_mac: fab.mac(0),
        vlan_tci: None,
        net: NetParams::Ipv4 {
            src: [10, 0, 0, 1],
            dst: [10, 0, 0, 2],
            tos: 0,
            ttl: 64,
            ident: 1,
            udp_src_port: 49152,
        },
    };
    let mut p = PacketBuilder::new(op, qpn, psn).payload(payload);
    if op == Opcode::RcAcknowledge {
        p = PacketBuilder::new(op, qpn, psn).aeth(roce_model::Aeth {
            syndrome: roce_model::AethSyndrome::Ack { credits: 31 },
            msn: 1,
        });
    }
    b.build(&p).expect("RoCE frame")
}

#[test]
fn corrupt_icrc_of_matching_roce_frames() {
    let (fab, mut a, mut b) = TestFabric::pair(false);
    let f = fabric_of(&fab);
    let id = f
        .faults
        .add(FaultSpec {
            opcode: Some("RC_SEND_ONLY".into()),
            qpn: Some(0x11),
            psn: Some("100-200".into()),
            icrc: true,
            ..spec("p1", Dir::Egress, FaultAction::Corrupt)
        })
        .unwrap();
    let hit = roce_frame(&fab, 0x11, 150, &[7u8; 64]);
    let other_qp = roce_frame(&fab, 0x12, 150, &[7u8; 64]);
    let other_psn = roce_frame(&fab, 0x11, 5, &[7u8; 64]);
    for x in [&hit, &other_qp, &other_psn] {
        RoceFrame::parse(x).unwrap().verify_icrc().unwrap();
        a.send(0, x, &TxOpts::default());
        assert!(a.wait_tx(0, ARRIVE));
    }
    let got = b.drain_all(QUIET * 2);
    assert_eq!(got.len(), 3);
    let r = &got[0].data;
    assert_eq!(r.len(), hit.len());
    let icrc = hit.len() - 4;
    assert_eq!(r[..icrc], hit[..icrc], "bytes before the ICRC intact");
    assert_ne!(r[icrc..], hit[icrc..], "ICRC changed");
    assert!(
        RoceFrame::parse(r).unwrap().verify_icrc().is_err(),
        "ICRC must fail"
    );
    assert!(got[1].data == other_qp, "other QP untouched");
    assert!(got[2].data == other_psn, "PSN outside the range untouched");
    assert_eq!(rule_counters(&f, id), (1, 1));
}

#[test]
fn corrupt_offset_flips_one_byte() {
    let (fab, mut a, mut b) = TestFabric::pair(false);
    let f = fabric_of(&fab);
    f.faults
        .add(FaultSpec {
            offset: Some(30),
            xor: Some(0x01),
            ..spec("p0", Dir::Ingress, FaultAction::Corrupt)
        })
        .unwrap();
    let frame = tagged_frame(fab.mac(1), fab.mac(0), 9, 100);
    a.send(0, &frame, &TxOpts::default());
    let r = b.recv_any(ARRIVE).expect("frame");
    let diff: Vec<usize> = (0..frame.len())
        .filter(|&i| frame[i] != r.data[i])
        .collect();
    assert_eq!(diff, vec![30]);
    assert_eq!(r.data[30], frame[30] ^ 1);
}

#[test]
fn rate_limit_drops_the_excess() {
    let (fab, mut a, mut b) = TestFabric::pair(false);
    let f = fabric_of(&fab);
    let id = f
        .faults
        .add(FaultSpec {
            fps: Some(0.5),
            burst: Some(5.0),
            ..spec("p0", Dir::Ingress, FaultAction::Rate)
        })
        .unwrap();
    let frames: Vec<Vec<u8>> = (0..30)
        .map(|t| tagged_frame(fab.mac(1), fab.mac(0), t, 100))
        .collect();
    a.send_burst(0, &frames, &TxOpts::default());
    assert!(a.wait_tx(0, ARRIVE));
    let got = recv_tags(&mut b, QUIET * 2);
    assert!(
        (5..=7).contains(&got.len()),
        "burst 5 at 0.5/s: {} passed",
        got.len()
    );
    assert_eq!(rule_counters(&f, id), (30, 30 - got.len() as u64));
}

#[test]
fn link_down_and_up_through_the_control_socket() {
    let (fab, mut a, mut b) = TestFabric::pair(true);
    let sock = fab.control_socket();
    let r = request(
        &sock,
        &Request::Link {
            port: "p1".into(),
            up: false,
        },
    )
    .unwrap();
    assert!(r.ok, "{:?}", r.error);
    send_tags(&fab, &mut a, 0..5);
    // And the other way: frames p1's guest sends are cut too.
    let back = tagged_frame(fab.mac(0), fab.mac(1), 99, 100);
    b.send(0, &back, &TxOpts::default());
    assert!(b.wait_tx(0, ARRIVE));
    assert!(recv_tags(&mut b, QUIET).is_empty());
    assert!(recv_tags(&mut a, QUIET).is_empty());
    let st = request(&sock, &Request::FaultList)
        .unwrap()
        .into_faults()
        .unwrap();
    let l = st.links.iter().find(|l| l.port == "p1").unwrap();
    assert!(!l.up);
    assert_eq!(l.drops, 6, "5 towards it, 1 from it");
    let r = request(
        &sock,
        &Request::Link {
            port: "p1".into(),
            up: true,
        },
    )
    .unwrap();
    assert!(r.ok);
    send_tags(&fab, &mut a, 10..13);
    assert_eq!(recv_tags(&mut b, QUIET), vec![10, 11, 12]);
    assert!(
        !request(
            &sock,
            &Request::Link {
                port: "nope".into(),
                up: true
            }
        )
        .unwrap()
        .ok
    );
}

#[test]
fn control_socket_adds_lists_and_deletes_rules() {
    let (fab, mut a, mut b) = TestFabric::pair(true);
    let sock = fab.control_socket();
    let r = request(
        &sock,
        &Request::FaultAdd {
            rule: Box::new(FaultSpec {
                every: Some(1),
                ..spec("p1", Dir::Both, FaultAction::LinkDown)
            }),
        },
    )
    .unwrap();
    assert!(r.ok, "{:?}", r.error);
    let id = r.fault_id().unwrap();
    send_tags(&fab, &mut a, 0..2);
    assert!(recv_tags(&mut b, QUIET).is_empty());
    let l = request(&sock, &Request::FaultList)
        .unwrap()
        .into_faults()
        .unwrap();
    assert_eq!(l.rules.len(), 1);
    assert_eq!((l.rules[0].matched, l.rules[0].acted), (2, 2));
    assert!(l.rules[0].description.contains("link-down"));
    let r = request(&sock, &Request::FaultDel { id }).unwrap();
    assert!(r.ok && r.into_faults().unwrap().rules.is_empty());
    send_tags(&fab, &mut a, 5..6);
    assert_eq!(recv_tags(&mut b, QUIET), vec![5]);
    // Bad rules are refused with a reason.
    for bad in [
        FaultSpec {
            prob: Some(1.5),
            ..spec("p1", Dir::Both, FaultAction::Drop)
        },
        spec("nope", Dir::Both, FaultAction::Drop),
        spec("p1", Dir::Both, FaultAction::Delay),
        FaultSpec {
            opcode: Some("NOT_AN_OPCODE".into()),
            ..spec("p1", Dir::Both, FaultAction::Drop)
        },
    ] {
        let r = request(
            &sock,
            &Request::FaultAdd {
                rule: Box::new(bad.clone()),
            },
        )
        .unwrap();
        assert!(!r.ok && r.error.is_some(), "{bad:?} accepted");
    }
}

#[test]
fn rules_are_bounded() {
    let (fab, _a, _b) = TestFabric::pair(false);
    let f = fabric_of(&fab);
    for _ in 0..vhost_rdma::faults::MAX_FAULT_RULES {
        f.faults
            .add(FaultSpec {
                fields: MatchSpec {
                    dst_port: Some(1),
                    ..MatchSpec::default()
                },
                ..spec("p0", Dir::Both, FaultAction::Drop)
            })
            .unwrap();
    }
    let e = f
        .faults
        .add(spec("p0", Dir::Both, FaultAction::Drop))
        .unwrap_err();
    assert!(e.to_string().contains("too many fault rules"), "{e}");
}

#[test]
fn faults_from_the_config_file_apply_at_start() {
    let dir = common::TempDir::new("faultcfg");
    let text = format!(
        "[[port]]\nname = \"p0\"\nsocket = \"{0}/p0.sock\"\nmac = \"52:54:00:00:00:10\"\n\
         [[port]]\nname = \"p1\"\nsocket = \"{0}/p1.sock\"\nmac = \"52:54:00:00:00:11\"\n\
         [[fault]]\nport = \"p1\"\ndir = \"egress\"\naction = \"drop\"\nevery = 3\nseed = 5\n",
        dir.path().display()
    );
    let cfg = vhost_rdma::DaemonConfig::from_toml(&text).unwrap();
    assert_eq!(cfg.faults.len(), 1);
    let server = vhost_rdma::Server::start(cfg).unwrap();
    let st = server.fabric().faults.status();
    assert_eq!(st.rules.len(), 1);
    assert_eq!(st.rules[0].seed, 5);
    assert_eq!(st.rules[0].rule.every, Some(3));
    server.shutdown().unwrap();
    let bad = text.replace("every = 3", "every = 3\nbogus = 1");
    assert!(vhost_rdma::DaemonConfig::from_toml(&bad).is_err());
}

// ---- captures ----

#[derive(Debug, Default)]
struct Pcapng {
    /// (if_name, snaplen, linktype)
    ifaces: Vec<(String, u32, u16)>,
    /// (iface, flags, orig_len, data, ts_ns)
    packets: Vec<(u32, u32, u32, Vec<u8>, u64)>,
}

/// The capture read back with the daemon's own reader (strict: a bad block
/// length, a missing section header or a packet of an undescribed
/// interface fails the test).
fn read_pcapng(path: &Path) -> Pcapng {
    use wire::capture::CaptureReader;
    let mut r = CaptureReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let mut out = Pcapng::default();
    while let Some(p) = r.next_packet().unwrap() {
        out.packets
            .push((p.iface as u32, p.flags, p.orig_len, p.data, p.ts_ns));
    }
    out.ifaces = r
        .interfaces()
        .iter()
        .map(|i| (i.name.clone(), i.snaplen, i.linktype))
        .collect();
    out
}

fn capture_start(sock: &Path, file: &Path, port: Option<&str>, snaplen: Option<u32>) {
    let r = request(
        sock,
        &Request::CaptureStart {
            file: file.to_path_buf(),
            port: port.map(String::from),
            snaplen,
        },
    )
    .unwrap();
    assert!(r.ok, "capture start: {:?}", r.error);
}

fn capture_stop(sock: &Path) -> vhost_rdma::capture::CaptureStatus {
    let r = request(sock, &Request::CaptureStop).unwrap();
    assert!(r.ok, "capture stop: {:?}", r.error);
    r.into_capture().unwrap()
}

#[test]
fn capture_of_the_whole_fabric_parses() {
    let (fab, mut a, mut b) = TestFabric::pair(true);
    let sock = fab.control_socket();
    let file = fab.dir().join("all.pcapng");
    capture_start(&sock, &file, None, None);
    // A second start is refused while one runs.
    let r = request(
        &sock,
        &Request::CaptureStart {
            file: fab.dir().join("x.pcapng"),
            port: None,
            snaplen: None,
        },
    )
    .unwrap();
    assert!(!r.ok);
    let f1 = tagged_frame(fab.mac(1), fab.mac(0), 1, 300);
    let f2 = tagged_frame(fab.mac(0), fab.mac(1), 2, 400);
    a.send(0, &f1, &TxOpts::default());
    assert!(b.recv_any(ARRIVE).is_some());
    b.send(0, &f2, &TxOpts::default());
    assert!(a.recv_any(ARRIVE).is_some());
    let st = capture_stop(&sock);
    assert!(!st.running);
    assert_eq!((st.records, st.dropped), (4, 0));
    let status = request(&sock, &Request::CaptureStatus)
        .unwrap()
        .into_capture()
        .unwrap();
    assert_eq!(status.records, 4);
    let p = read_pcapng(&file);
    let names: Vec<&str> = p.ifaces.iter().map(|i| i.0.as_str()).collect();
    assert_eq!(names, vec!["p0", "p1"]);
    assert!(p.ifaces.iter().all(|i| i.2 == 1), "Ethernet link type");
    // f1: in on p0, out on p1; f2: in on p1, out on p0.
    let want = [(0, 1, &f1), (1, 2, &f1), (1, 1, &f2), (0, 2, &f2)];
    assert_eq!(p.packets.len(), 4);
    for (pk, (iface, flags, data)) in p.packets.iter().zip(want) {
        assert_eq!((pk.0, pk.1), (iface, flags));
        assert!(pk.3 == *data, "frame bytes");
        assert_eq!(pk.2 as usize, data.len());
    }
    assert!(p.packets.windows(2).all(|w| w[0].4 <= w[1].4), "timestamps");
}

#[test]
fn capture_of_one_port_with_snaplen() {
    let (fab, mut a, mut b) = TestFabric::pair(true);
    let sock = fab.control_socket();
    let file = fab.dir().join("p1.pcapng");
    capture_start(&sock, &file, Some("p1"), Some(32));
    send_tags(&fab, &mut a, 0..3);
    assert_eq!(recv_tags(&mut b, QUIET).len(), 3);
    capture_stop(&sock);
    let p = read_pcapng(&file);
    assert_eq!(p.ifaces, vec![("p1".to_string(), 32, 1)]);
    assert_eq!(p.packets.len(), 3, "only p1's egress");
    for (i, pk) in p.packets.iter().enumerate() {
        assert_eq!(pk.1, 2, "outbound");
        assert_eq!(pk.2, 200, "original length");
        let full = tagged_frame(fab.mac(1), fab.mac(0), i as u64, 200);
        assert_eq!(pk.3, full[..32].to_vec());
    }
}

fn tshark() -> Option<std::path::PathBuf> {
    ["/usr/bin/tshark", "/usr/local/bin/tshark"]
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.exists())
}

#[test]
fn tshark_decodes_captured_roce() {
    let Some(ts) = tshark() else {
        eprintln!(
            "\n*** SKIPPED tshark_decodes_captured_roce: tshark is not installed \
             (apt-get install -y tshark) ***\n"
        );
        return;
    };
    let (fab, mut a, mut b) = TestFabric::pair(true);
    let sock = fab.control_socket();
    let file = fab.dir().join("roce.pcapng");
    capture_start(&sock, &file, None, None);
    let frames = [
        roce_frame_op(&fab, Opcode::RcSendOnly, 0x11, 1, &[1u8; 64]),
        roce_frame_op(&fab, Opcode::RcSendFirst, 0x11, 2, &[2u8; 256]),
        roce_frame_op(&fab, Opcode::RcSendLast, 0x11, 3, &[3u8; 16]),
        roce_frame_op(&fab, Opcode::RcAcknowledge, 0x12, 3, &[]),
    ];
    for f in &frames {
        a.send(0, f, &TxOpts::default());
        assert!(b.recv_any(ARRIVE).is_some());
    }
    capture_stop(&sock);
    let out = std::process::Command::new(ts)
        .arg("-r")
        .arg(&file)
        .arg("-V")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "tshark failed: {err}");
    assert!(!text.contains("Malformed"), "malformed packets:\n{text}");
    assert!(
        !text.contains("Expert Info (Error"),
        "dissector errors:\n{text}"
    );
    let per: BTreeMap<&str, usize> = [
        "InfiniBand",
        "Base Transport Header",
        "Interface name: p0",
        "Interface name: p1",
    ]
    .iter()
    .map(|k| (*k, text.matches(k).count()))
    .collect();
    assert!(
        per["InfiniBand"] >= 8,
        "InfiniBand decoded in every frame: {per:?}\n{err}"
    );
    assert!(per["Base Transport Header"] >= 8, "{per:?}");
    assert!(
        per["Interface name: p0"] >= 4 && per["Interface name: p1"] >= 4,
        "{per:?}"
    );
    for op in [
        "SEND Only",
        "SEND First",
        "SEND Last",
        "Acknowledge",
        "(inbound)",
        "(outbound)",
    ] {
        assert!(text.contains(op), "opcode {op} decoded:\n{text}");
    }
}

#[test]
fn link_down_shows_in_test_device_config_space() {
    let fab = TestFabric::start_with(1, |i, dir| {
        let mut p = TestFabric::port_config(dir, i, 1);
        p.spec = vhost_rdma::config::PortSpec::virtio_net(vhost_rdma::DeviceForm::TestDevice);
        p
    });
    let mut opts = common::GuestOpts::new(1, feat::ALL | feat::CTRL_VQ);
    opts.ctrl_queue = true;
    let mut g = TestGuest::connect_with(fab.socket(0), opts).expect("connect");
    let status = |g: &mut TestGuest| {
        let c = g.read_config(6, 2).expect("GET_CONFIG status");
        u16::from_le_bytes([c[0], c[1]]) & 1
    };
    assert_eq!(status(&mut g), 1, "VIRTIO_NET_S_LINK_UP");
    let f = fabric_of(&fab);
    f.faults.set_link("p0", false).unwrap();
    assert_eq!(status(&mut g), 0, "link down clears LINK_UP");
    f.faults.set_link("p0", true).unwrap();
    assert_eq!(status(&mut g), 1, "link up sets it again");
}

#[test]
fn released_frames_continue_through_later_rules() {
    let (fab, mut a, mut b) = TestFabric::pair(false);
    let f = fabric_of(&fab);
    f.faults
        .add(FaultSpec {
            delay_ms: Some(100),
            ..spec("p1", Dir::Egress, FaultAction::Delay)
        })
        .unwrap();
    let dup = f
        .faults
        .add(spec("p1", Dir::Egress, FaultAction::Dup))
        .unwrap();
    let t0 = Instant::now();
    send_tags(&fab, &mut a, 0..2);
    let mut got = Vec::new();
    while got.len() < 4 && t0.elapsed() < ARRIVE {
        got.extend(recv_tags(&mut b, Duration::from_millis(50)));
    }
    assert!(t0.elapsed() >= Duration::from_millis(100));
    got.sort();
    assert_eq!(got, vec![0, 0, 1, 1], "delayed, then duplicated");
    assert_eq!(rule_counters(&f, dup), (2, 2));
    assert_eq!(f.faults.status().delayed, 0);
}

/// `capture start` refuses `file` with an error containing `why`, and leaves
/// `victim` (a file outside the capture directory, or in it) as it was.
fn capture_refused(sock: &Path, file: &Path, why: &str, victim: &Path, content: &[u8]) {
    let r = request(
        sock,
        &Request::CaptureStart {
            file: file.to_path_buf(),
            port: None,
            snaplen: None,
        },
    )
    .unwrap();
    assert!(!r.ok, "capture into {} was accepted", file.display());
    let e = r.error.unwrap_or_default();
    assert!(
        e.contains(why),
        "error for {}: {e:?} (want {why:?})",
        file.display()
    );
    assert_eq!(
        std::fs::read(victim).unwrap(),
        content,
        "{} changed",
        victim.display()
    );
    // Nothing runs after a refusal: a later capture can start.
    let st = request(sock, &Request::CaptureStatus).unwrap();
    assert!(
        !st.into_capture().is_some_and(|c| c.running),
        "a refused capture runs"
    );
}

#[test]
fn captures_never_replace_files_nor_leave_the_capture_dir() {
    let (fab, _a, _b) = TestFabric::pair(true);
    let sock = fab.control_socket();
    let capdir = fab.dir(); // the test fabric's --capture-dir
    let outside = common::TempDir::new("capture-outside");
    let precious = outside.path().join("precious");
    std::fs::write(&precious, b"precious").unwrap();
    let existing = capdir.join("existing.pcapng");
    std::fs::write(&existing, b"keep me").unwrap();

    // An existing file in the capture directory, by name and by full path.
    capture_refused(
        &sock,
        Path::new("existing.pcapng"),
        "exists",
        &existing,
        b"keep me",
    );
    capture_refused(&sock, &existing, "exists", &existing, b"keep me");
    // A path outside the capture directory, absolute or climbing out.
    capture_refused(
        &sock,
        &precious,
        "capture directory",
        &precious,
        b"precious",
    );
    let climb = Path::new("..")
        .join(outside.path().file_name().unwrap())
        .join("precious");
    capture_refused(&sock, &climb, "capture directory", &precious, b"precious");
    capture_refused(
        &sock,
        &outside.path().join("new.pcapng"),
        "capture directory",
        &precious,
        b"precious",
    );
    assert!(!outside.path().join("new.pcapng").exists());
    // A symlink in the capture directory to a file outside it.
    let link = capdir.join("link.pcapng");
    std::os::unix::fs::symlink(&precious, &link).unwrap();
    capture_refused(
        &sock,
        Path::new("link.pcapng"),
        "exists",
        &precious,
        b"precious",
    );
    capture_refused(&sock, &link, "exists", &precious, b"precious");
    // A dangling symlink is not followed either (no file appears at its target).
    let dangling = capdir.join("dangling.pcapng");
    std::os::unix::fs::symlink(outside.path().join("created.pcapng"), &dangling).unwrap();
    capture_refused(
        &sock,
        Path::new("dangling.pcapng"),
        "exists",
        &precious,
        b"precious",
    );
    assert!(!outside.path().join("created.pcapng").exists());
    // A symlinked directory inside the capture directory that leaves it.
    let out_dir = capdir.join("out");
    std::os::unix::fs::symlink(outside.path(), &out_dir).unwrap();
    capture_refused(
        &sock,
        &out_dir.join("x.pcapng"),
        "capture directory",
        &precious,
        b"precious",
    );
    capture_refused(
        &sock,
        Path::new("out/x.pcapng"),
        "capture directory",
        &precious,
        b"precious",
    );
    assert!(!outside.path().join("x.pcapng").exists());

    // A new name in the capture directory works, by name or by full path.
    capture_start(&sock, Path::new("fresh.pcapng"), None, None);
    let st = capture_stop(&sock);
    assert_eq!(
        st.file.as_deref().map(Path::new),
        Some(
            capdir
                .canonicalize()
                .unwrap()
                .join("fresh.pcapng")
                .as_path()
        )
    );
    capture_start(&sock, &capdir.join("fresh2.pcapng"), None, None);
    capture_stop(&sock);
    assert!(capdir.join("fresh2.pcapng").metadata().unwrap().len() > 0);
}

#[test]
fn control_socket_is_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let (fab, _a, _b) = TestFabric::pair(true);
    let mode = std::fs::metadata(fab.control_socket())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "control socket mode {mode:o}");
}
