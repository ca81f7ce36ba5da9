//! Issue 7: multiqueue steering in the test-device form. RSS configured over
//! the control queue steers flows to the queue the devmem-nic model predicts
//! and the 20-byte RX header carries its hash; flow rules added through the
//! control socket move a flow or drop it (counted).

mod common;

use common::{feat, port_mac, GuestOpts, TestFabric, TestGuest, TxOpts, ARRIVE, QUIET};
use devmem_nic::{hash_types, Nic, NicConfig, RssConfig};
use std::net::IpAddr;
use vhost_rdma::config::PortSpec;
use vhost_rdma::control::{request, Request};
use vhost_rdma::match_spec::MatchSpec;
use vhost_rdma::steering::FlowRuleSpec;
use vhost_rdma::DeviceForm;
use wire::builder::FrameBuilder;

const OK: u8 = 0;
const ERR: u8 = 1;
const RSS_FEATURES: u64 = feat::ALL | feat::CTRL_VQ | feat::RSS | feat::HASH_REPORT;

/// Port 0: test-device form, 4 queue pairs (the RSS guest); port 1:
/// virtio-net-pci, 1 queue pair (traffic source).
fn fabric() -> TestFabric {
    TestFabric::start_full(
        2,
        |i, dir| {
            let mut p = TestFabric::port_config(dir, i, if i == 0 { 4 } else { 1 });
            if i == 0 {
                p.spec = PortSpec::virtio_net(DeviceForm::TestDevice);
            }
            p
        },
        true,
    )
}

fn connect_rss_guest(fab: &TestFabric, features: u64) -> TestGuest {
    let mut opts = GuestOpts::new(4, features);
    opts.ctrl_queue = true;
    let mut g = TestGuest::connect_with(fab.socket(0), opts).expect("connect RSS guest");
    for qp in 0..4 {
        g.post_rx(qp, 64, 2048);
    }
    // The fabric only steers to RX queues the guest has enabled (seen by
    // their worker after the first kick).
    let port = fab.server.as_ref().unwrap().fabric().ports[0].clone();
    assert!(
        common::wait_until(ARRIVE, || port
            .rx_queues()
            .iter()
            .all(|q| q.enabled.load(std::sync::atomic::Ordering::Relaxed))),
        "RX queues not enabled"
    );
    g
}

fn key() -> Vec<u8> {
    (0..40u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect()
}

/// `struct virtio_net_rss_config`.
fn rss_config(
    hash_types: u32,
    table: &[u16],
    unclassified: u16,
    max_tx_vq: u16,
    key: &[u8],
) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&hash_types.to_le_bytes());
    b.extend_from_slice(&((table.len() - 1) as u16).to_le_bytes());
    b.extend_from_slice(&unclassified.to_le_bytes());
    for q in table {
        b.extend_from_slice(&q.to_le_bytes());
    }
    b.extend_from_slice(&max_tx_vq.to_le_bytes());
    b.push(key.len() as u8);
    b.extend_from_slice(key);
    b
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Flows from the source (port 1) to the RSS guest (port 0).
fn flow_frame(tcp: bool, sport: u16, dport: u16, tag: u8) -> Vec<u8> {
    let (a, b) = (ip("10.9.0.2"), ip("10.9.0.1"));
    let mut fb = if tcp {
        FrameBuilder::tcp(a, sport, b, dport)
    } else {
        FrameBuilder::udp(a, sport, b, dport)
    };
    fb.dst_mac = port_mac(0);
    fb.src_mac = port_mac(1);
    fb.build(&[tag; 32])
}

fn flows() -> Vec<(bool, u16, u16)> {
    let mut v = Vec::new();
    for i in 0..8u16 {
        v.push((true, 40000 + 7 * i, 5201));
        v.push((false, 50000 + 13 * i, 4789 + i));
    }
    v
}

fn flow_name(tcp: bool, sport: u16, dport: u16) -> String {
    format!(
        "10.9.0.2:{sport}-10.9.0.1:{dport}/{}",
        if tcp { "tcp" } else { "udp" }
    )
}

fn rss_status(fab: &TestFabric, predict: Vec<String>) -> vhost_rdma::steering::RssStatus {
    let r = request(
        &fab.control_socket(),
        &Request::Rss {
            port: "p0".into(),
            predict,
            clear_flows: false,
        },
    )
    .expect("control request");
    assert!(r.ok, "rss request refused: {:?}", r.error);
    r.into_rss().expect("rss status")
}

/// Receives one frame (any queue) and returns it.
fn recv(g: &mut TestGuest, what: &str) -> common::RxFrame {
    g.recv_any(ARRIVE)
        .unwrap_or_else(|| panic!("{what}: nothing arrived"))
}

#[test]
fn test_device_offers_rss_and_hash_report_with_config_fields() {
    let fab = fabric();
    let mut g = connect_rss_guest(&fab, RSS_FEATURES);
    assert!(g.has(feat::RSS), "RSS not offered");
    assert!(g.has(feat::HASH_REPORT), "HASH_REPORT not offered");
    assert!(g.has(feat::MQ | feat::CTRL_VQ));
    let c = g.read_config(16, 8).expect("GET_CONFIG");
    assert_eq!(c[1], 40, "rss_max_key_size");
    assert_eq!(
        u16::from_le_bytes([c[2], c[3]]),
        128,
        "rss_max_indirection_table_length"
    );
    assert_eq!(
        u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
        hash_types::ALL,
        "supported_hash_types"
    );
    // The virtio-net-pci form does not offer them (QEMU owns that device).
    let b = fab.connect(1, feat::ALL | feat::RSS | feat::HASH_REPORT);
    assert_eq!(b.features & (feat::RSS | feat::HASH_REPORT), 0);
}

#[test]
fn rss_config_steers_flows_to_the_model_queue_with_its_hash() {
    let fab = fabric();
    let mut a = connect_rss_guest(&fab, RSS_FEATURES);
    let mut b = fab.connect(1, feat::ALL);
    b.post_rx(0, 64, 2048);

    let types = hash_types::IPV4 | hash_types::TCPV4 | hash_types::UDPV4;
    let table: Vec<u16> = (0..128u16).map(|i| (i * 3 + 1) % 4).collect();
    let cfg = rss_config(types, &table, 2, 4, &key());
    assert_eq!(a.ctrl(4, 1, &cfg, ARRIVE), Some(OK), "RSS_CONFIG");

    // The model with the same configuration, built independently.
    let mut model = Nic::new(NicConfig {
        num_queues: 4,
        ..NicConfig::default()
    })
    .unwrap();
    let (rss, max_tx) = RssConfig::from_virtio_bytes(&cfg).unwrap();
    assert_eq!(max_tx, 4);
    model.set_rss(Some(rss)).unwrap();

    let st = rss_status(&fab, vec![]);
    assert_eq!(st.mode, "rss");
    assert_eq!(st.indirection_table, table);
    assert_eq!(st.hash_types, types);
    assert_eq!(
        st.key,
        key().iter().map(|x| format!("{x:02x}")).collect::<String>()
    );
    assert_eq!(st.active_queue_pairs, 4);

    let mut seen = [0u32; 4];
    for (i, (tcp, sport, dport)) in flows().into_iter().enumerate() {
        let f = flow_frame(tcp, sport, dport, i as u8);
        let d = model.classify(&f);
        let want_q = d.queue.unwrap();
        b.send(0, &f, &TxOpts::default());
        let r = recv(&mut a, &flow_name(tcp, sport, dport));
        assert_eq!(r.data, f, "frame {i} changed");
        assert_eq!(
            r.qp,
            want_q,
            "flow {} on queue {} (model: {want_q})",
            flow_name(tcp, sport, dport),
            r.qp
        );
        assert_eq!(
            r.hash,
            Some((d.hash_value, d.hash_report.code())),
            "hash of flow {}",
            flow_name(tcp, sport, dport)
        );
        assert_eq!(d.hash_report.code(), if tcp { 2 } else { 3 });
        seen[usize::from(r.qp)] += 1;
    }
    assert!(
        seen.iter().filter(|&&n| n > 0).count() >= 3,
        "16 flows should spread over the queues: {seen:?}"
    );

    // Non-IP frames: no hash type applies -> the unclassified queue, report NONE.
    let arp = common::packet::eth_frame(port_mac(0), port_mac(1), 0x0806, &[0u8; 28]);
    b.send(0, &arp, &TxOpts::default());
    let r = recv(&mut a, "ARP");
    assert_eq!((r.qp, r.hash), (2, Some((0, 0))), "unclassified");

    // The daemon's prediction agrees with the model, and its flow table with
    // what the guest got.
    let names: Vec<String> = flows()
        .into_iter()
        .map(|(t, s, d)| flow_name(t, s, d))
        .collect();
    let st = rss_status(&fab, names.clone());
    for (p, (tcp, sport, dport)) in st.predictions.iter().zip(flows()) {
        let d = model.classify(&flow_frame(tcp, sport, dport, 0));
        assert_eq!(p.queue, d.queue, "{}", p.flow);
        assert_eq!(p.hash_value, d.hash_value, "{}", p.flow);
        let seen = st
            .flows
            .iter()
            .find(|f| f.flow == p.flow)
            .expect("flow tracked");
        assert_eq!((seen.queue, seen.hash_value), (p.queue, p.hash_value));
        assert_eq!(seen.hash_reported, 1);
    }
    let reported: u64 = st.queues.iter().map(|q| q.hash_reported).sum();
    assert_eq!(reported, 16, "{:?}", st.queues);
    let by_rss: u64 = st.queues.iter().map(|q| q.rss).sum();
    assert_eq!(by_rss, 16);

    // The 20-byte header on TX: A's frames reach B (12-byte header) intact.
    let f = common::packet::tagged_frame(port_mac(1), port_mac(0), 77, 200);
    a.send(3, &f, &TxOpts::default());
    let r = b.recv(0, ARRIVE).expect("A -> B with a 20-byte TX header");
    assert_eq!(r.data, f);
    assert_eq!(r.hash, None);
}

#[test]
fn flow_rules_from_the_control_socket_move_and_drop_flows() {
    let fab = fabric();
    let mut a = connect_rss_guest(&fab, RSS_FEATURES);
    let mut b = fab.connect(1, feat::ALL);
    let table: Vec<u16> = (0..128u16).map(|i| i % 4).collect();
    let types = hash_types::IPV4 | hash_types::TCPV4 | hash_types::UDPV4;
    assert_eq!(
        a.ctrl(4, 1, &rss_config(types, &table, 0, 4, &key()), ARRIVE),
        Some(OK)
    );
    let ctl = fab.control_socket();
    let moved = (true, 40001u16, 5201u16);
    let dropped = (false, 50001u16, 4789u16);
    let name = |f: (bool, u16, u16)| flow_name(f.0, f.1, f.2);
    let before = rss_status(&fab, vec![name(moved), name(dropped)]);
    let rss_q = before.predictions[0].queue.unwrap();
    let target = (rss_q + 1) % 4;

    let add = |rule: FlowRuleSpec| {
        let r = request(
            &ctl,
            &Request::FlowRuleAdd {
                port: "p0".into(),
                rule,
            },
        )
        .unwrap();
        assert!(r.ok, "{:?}", r.error);
        r.rule_id().unwrap()
    };
    let move_id = add(FlowRuleSpec {
        fields: MatchSpec {
            proto: Some("tcp".into()),
            src_port: Some(moved.1),
            dst_port: Some(moved.2),
            ..MatchSpec::default()
        },
        queue: Some(target),
        ..FlowRuleSpec::default()
    });
    let drop_id = add(FlowRuleSpec {
        fields: MatchSpec {
            proto: Some("udp".into()),
            dst_ip: Some("10.9.0.1/32".into()),
            dst_port: Some(dropped.2),
            ..MatchSpec::default()
        },
        drop: true,
        priority: 5,
        ..FlowRuleSpec::default()
    });
    // Refused: a queue the port does not have, an unknown port, a dup id.
    for (port, rule) in [
        (
            "p0",
            FlowRuleSpec {
                queue: Some(4),
                ..FlowRuleSpec::default()
            },
        ),
        (
            "nope",
            FlowRuleSpec {
                drop: true,
                ..FlowRuleSpec::default()
            },
        ),
        (
            "p0",
            FlowRuleSpec {
                id: Some(move_id),
                drop: true,
                ..FlowRuleSpec::default()
            },
        ),
    ] {
        let r = request(
            &ctl,
            &Request::FlowRuleAdd {
                port: port.into(),
                rule,
            },
        )
        .unwrap();
        assert!(!r.ok);
    }

    let p = rss_status(&fab, vec![name(moved), name(dropped)]);
    assert_eq!(p.predictions[0].queue, Some(target));
    assert_eq!(p.predictions[0].how, format!("rule {move_id}"));
    assert_eq!(p.predictions[1].queue, None);

    for i in 0..5u8 {
        let f = flow_frame(moved.0, moved.1, moved.2, i);
        b.send(0, &f, &TxOpts::default());
        let r = recv(&mut a, "moved flow");
        assert_eq!(r.qp, target, "rule moves the flow");
        // The hash is still reported (the rule only chose the queue).
        assert_eq!(r.hash.map(|h| h.0), Some(before.predictions[0].hash_value));
        b.send(
            0,
            &flow_frame(dropped.0, dropped.1, dropped.2, i),
            &TxOpts::default(),
        );
    }
    assert!(b.wait_tx(0, ARRIVE));
    let extra = a.drain_all(QUIET);
    assert!(
        extra.is_empty(),
        "dropped flow arrived: {} frames",
        extra.len()
    );

    let st = rss_status(&fab, vec![]);
    assert_eq!(st.rule_drops, 5);
    assert_eq!(st.queues[usize::from(target)].rule, 5);
    let r = request(&ctl, &Request::FlowRuleList { port: "p0".into() }).unwrap();
    let rules = r.into_rules().unwrap();
    assert_eq!(rules.len(), 2);
    // Evaluation order: priority 0 before 5.
    assert_eq!((rules[0].id, rules[0].hits), (move_id, 5));
    assert_eq!((rules[1].id, rules[1].hits), (drop_id, 5));

    // Without the rules the flows follow RSS again.
    for id in [move_id, drop_id] {
        let r = request(
            &ctl,
            &Request::FlowRuleDel {
                port: "p0".into(),
                id,
            },
        )
        .unwrap();
        assert!(r.ok);
    }
    b.send(
        0,
        &flow_frame(moved.0, moved.1, moved.2, 9),
        &TxOpts::default(),
    );
    assert_eq!(recv(&mut a, "moved flow after del").qp, rss_q);
    b.send(
        0,
        &flow_frame(dropped.0, dropped.1, dropped.2, 9),
        &TxOpts::default(),
    );
    let r = recv(&mut a, "dropped flow after del");
    assert_eq!(Some(r.qp), before.predictions[1].queue);
}

#[test]
fn hash_config_without_rss_reports_hashes_and_keeps_flow_hash_queues() {
    let fab = fabric();
    let mut a = connect_rss_guest(&fab, feat::ALL | feat::CTRL_VQ | feat::HASH_REPORT);
    assert!(!a.has(feat::RSS));
    let mut b = fab.connect(1, feat::ALL);
    // Without RSS the queue count comes from VQ_PAIRS_SET as before.
    assert_eq!(a.ctrl(4, 0, &4u16.to_le_bytes(), ARRIVE), Some(OK));
    // RSS_CONFIG needs VIRTIO_NET_F_RSS.
    let table: Vec<u16> = vec![0; 128];
    assert_eq!(
        a.ctrl(4, 1, &rss_config(7, &table, 0, 4, &key()), ARRIVE),
        Some(ERR)
    );
    // Before HASH_CONFIG: 20-byte header, no hash.
    let f = flow_frame(true, 1000, 2000, 1);
    b.send(0, &f, &TxOpts::default());
    let r0 = recv(&mut a, "before HASH_CONFIG");
    assert_eq!(r0.hash, Some((0, 0)));

    let mut hc = Vec::new();
    hc.extend_from_slice(&(hash_types::TCPV4 | hash_types::IPV4).to_le_bytes());
    hc.extend_from_slice(&[0u8; 8]);
    hc.push(40);
    hc.extend_from_slice(&key());
    assert_eq!(a.ctrl(4, 2, &hc, ARRIVE), Some(OK), "HASH_CONFIG");
    let mut model = Nic::new(NicConfig {
        num_queues: 4,
        ..NicConfig::default()
    })
    .unwrap();
    model
        .set_hash_config(Some(
            devmem_nic::HashConfig::from_virtio_bytes(&hc).unwrap(),
        ))
        .unwrap();
    for (tcp, sport, dport) in flows() {
        let f = flow_frame(tcp, sport, dport, 3);
        b.send(0, &f, &TxOpts::default());
        let r = recv(&mut a, "hash-only");
        let d = model.classify(&f);
        assert_eq!(r.hash, Some((d.hash_value, d.hash_report.code())));
        // UDP is not enabled: IPv4 2-tuple.
        assert_eq!(d.hash_report.code(), if tcp { 2 } else { 1 });
        let fnv = vhost_rdma::fabric::flow_hash(&f) as usize % 4;
        assert_eq!(usize::from(r.qp), fnv, "flow-hash queue kept without RSS");
    }
    let st = rss_status(&fab, vec![]);
    assert_eq!(st.mode, "hash-only");
    assert_eq!(st.hash_types, hash_types::TCPV4 | hash_types::IPV4);
    assert!(st.indirection_table.is_empty());
    let flow_hashed: u64 = st.queues.iter().map(|q| q.flow_hash).sum();
    let reported: u64 = st.queues.iter().map(|q| q.hash_reported).sum();
    assert_eq!((flow_hashed, reported), (17, 16));
}

#[test]
fn hostile_rss_and_hash_payloads_are_refused_and_the_port_keeps_working() {
    let fab = fabric();
    let mut a = connect_rss_guest(&fab, RSS_FEATURES);
    let mut b = fab.connect(1, feat::ALL);
    let good_table: Vec<u16> = (0..128u16).map(|i| i % 4).collect();
    let mut bad: Vec<Vec<u8>> = vec![
        vec![],
        vec![0xff; 3],
        vec![0xff; 9],
        rss_config(7, &good_table, 0, 4, &[0u8; 41]),
        rss_config(7, &good_table, 0, 5, &key()),
        rss_config(7, &good_table, 0, 0, &key()),
        rss_config(7, &good_table, 4, 4, &key()),
        rss_config(
            7,
            &(0..128u16).map(|i| i % 5).collect::<Vec<_>>(),
            0,
            4,
            &key(),
        ),
        rss_config(7, &good_table[..100], 0, 4, &key()),
        rss_config(1 << 12, &good_table, 0, 4, &key()),
    ];
    // Mask claiming 32768 entries with a short payload; truncated key.
    let mut m = rss_config(7, &good_table, 0, 4, &key());
    m[4..6].copy_from_slice(&0x7fffu16.to_le_bytes());
    bad.push(m);
    let mut t = rss_config(7, &good_table, 0, 4, &key());
    t.truncate(t.len() - 5);
    bad.push(t);
    for (i, p) in bad.iter().enumerate() {
        assert_eq!(a.ctrl(4, 1, p, ARRIVE), Some(ERR), "bad RSS_CONFIG {i}");
    }
    for p in [vec![], vec![0u8; 12], {
        let mut h = vec![0u8; 12];
        h.push(200);
        h
    }] {
        assert_eq!(a.ctrl(4, 2, &p, ARRIVE), Some(ERR), "bad HASH_CONFIG");
    }
    assert_eq!(rss_status(&fab, vec![]).mode, "off");
    assert_eq!(fab.stats(0).ctrl_errors as usize, bad.len() + 3);
    // Still forwarding (flow hash, 1 queue pair active until configured).
    let f = flow_frame(true, 1, 2, 5);
    b.send(0, &f, &TxOpts::default());
    assert_eq!(recv(&mut a, "after hostile payloads").data, f);
    let good = rss_config(7, &good_table, 0, 2, &key());
    assert_eq!(a.ctrl(4, 1, &good, ARRIVE), Some(OK));
    assert_eq!(rss_status(&fab, vec![]).active_queue_pairs, 2);
}
