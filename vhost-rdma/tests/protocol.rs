//! Protocol-level tests of one port: negotiation, queue count, config space,
//! counters for connect/disconnect. No traffic between ports.

mod common;

use common::{feat, port_mac, GuestOpts, TestFabric, TestGuest, ARRIVE};
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::Frontend;
use vhost::VhostBackend;
use vhost_rdma::config::PortSpec;
use vhost_rdma::DeviceForm;

#[test]
fn offers_the_specified_features() {
    let fab = TestFabric::start(1, 2);
    let g = fab.connect(0, feat::ALL);
    let missing = feat::DAEMON_OFFERS & !g.offered;
    assert_eq!(
        missing, 0,
        "features not offered: {missing:#x} (offered {:#x})",
        g.offered
    );
    for p in [
        VhostUserProtocolFeatures::MQ,
        VhostUserProtocolFeatures::REPLY_ACK,
    ] {
        assert!(g.protocol.contains(p), "protocol feature {p:?} not offered");
    }
    // CONFIG is only offered in the TestDevice form (QEMU's virtio-net-pci owns
    // config space and masks CONFIG for vhost-user net anyway); see
    // test_device_form_has_ctrl_queue_and_config_space.
    assert_eq!(
        g.queue_num,
        Some(4),
        "VirtioNetPci with 2 queue pairs: rx0 tx0 rx1 tx1"
    );
    assert_eq!(g.features, feat::ALL);
    // The virtio-net-pci form leaves the control queue to QEMU.
    assert_eq!(
        g.offered & feat::CTRL_VQ,
        0,
        "CTRL_VQ offered in VirtioNetPci form"
    );
}

#[test]
fn test_device_form_has_ctrl_queue_and_config_space() {
    let fab = TestFabric::start_with(1, |i, dir| {
        let mut p = TestFabric::port_config(dir, i, 2);
        p.spec = PortSpec::virtio_net(DeviceForm::TestDevice);
        p
    });
    let mut opts = GuestOpts::new(2, feat::ALL | feat::CTRL_VQ);
    opts.ctrl_queue = true;
    let mut g = TestGuest::connect_with(fab.socket(0), opts).expect("connect");
    assert!(g.protocol.contains(VhostUserProtocolFeatures::CONFIG));
    assert_eq!(
        g.queue_num,
        Some(5),
        "TestDevice with 2 queue pairs: 4 data queues + ctrl"
    );
    assert!(
        g.has(feat::CTRL_VQ),
        "CTRL_VQ not offered in TestDevice form"
    );
    let cfg = g.read_config(0, 8).expect("GET_CONFIG");
    assert_eq!(cfg[0..6], port_mac(0), "config space MAC");
    let status = u16::from_le_bytes([cfg[6], cfg[7]]);
    assert_eq!(status & 1, 1, "VIRTIO_NET_S_LINK_UP");
    let cfg = g.read_config(8, 2).expect("GET_CONFIG max_virtqueue_pairs");
    assert_eq!(
        u16::from_le_bytes([cfg[0], cfg[1]]),
        2,
        "max_virtqueue_pairs"
    );
}

#[test]
fn refuses_unoffered_features() {
    let fab = TestFabric::start(1, 1);
    let fe = Frontend::connect(fab.socket(0), 3).unwrap();
    fe.set_owner().unwrap();
    let offered = fe.get_features().unwrap();
    // Bit 41 (VIRTIO_F_NOTIFICATION_DATA is 38; 41 is unassigned) is not offered.
    let bogus = offered | (1 << 41);
    let r = fe.set_features(bogus).and_then(|_| fe.get_features());
    // Without REPLY_ACK the failure shows as a closed connection on the next request.
    assert!(
        r.is_err(),
        "SET_FEATURES with an unoffered bit was accepted"
    );
    drop(fe);
    // The port is usable again afterwards.
    let g = fab.connect(0, feat::ALL);
    // MQ is only offered with more than one queue pair.
    assert_eq!(g.features & !feat::MQ, feat::ALL & !feat::MQ);
}

#[test]
fn single_queue_pair_port_needs_no_mq() {
    let fab = TestFabric::start(1, 1);
    let g = fab.connect(0, feat::ALL);
    assert_eq!(g.queue_num, Some(2));
    let missing = feat::DAEMON_OFFERS & !feat::MQ & !g.offered;
    assert_eq!(missing, 0, "features not offered: {missing:#x}");
}

#[test]
fn connection_counters() {
    let fab = TestFabric::start(2, 1);
    assert!(!fab.stats(0).connected);
    let g = fab.connect(0, feat::ALL);
    let (s, ok) = fab.wait_stats(0, ARRIVE, |s| s.connected && s.connections == 1);
    assert!(ok, "{s:?}");
    assert!(!fab.stats(1).connected);
    drop(g);
    let (s, ok) = fab.wait_stats(0, ARRIVE, |s| !s.connected);
    assert!(ok, "{s:?}");
    let _g = fab.connect(0, feat::MINIMAL);
    let (s, ok) = fab.wait_stats(0, ARRIVE, |s| s.connected && s.connections == 2);
    assert!(ok, "{s:?}");
}

#[test]
fn second_frontend_while_one_is_connected_does_not_break_the_first() {
    let fab = TestFabric::start(2, 1);
    let mut a = fab.connect(0, feat::ALL);
    let mut b = fab.connect(1, feat::ALL);
    a.post_rx(0, 8, 2048);
    b.post_rx(0, 8, 2048);
    // A second frontend on A's socket: it may be refused or left waiting, but
    // the established session must keep working.
    let intruder = std::thread::spawn({
        let path = fab.socket(0).to_path_buf();
        move || {
            if let Ok(fe) = Frontend::connect(&path, 3) {
                let _ = fe.set_owner();
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        }
    });
    let f = common::packet::tagged_frame(fab.mac(1), fab.mac(0), 1, 100);
    a.send(0, &f, &common::TxOpts::default());
    let r = b
        .recv(0, ARRIVE)
        .expect("A->B while a second frontend knocks");
    assert!(r.data == f);
    intruder.join().unwrap();
    let f = common::packet::tagged_frame(fab.mac(0), fab.mac(1), 2, 100);
    b.send(0, &f, &common::TxOpts::default());
    let r = a
        .recv(0, ARRIVE)
        .expect("B->A after the second frontend left");
    assert!(r.data == f);
}

#[test]
fn test_device_control_queue_commands() {
    ctrl_case(feat::ALL | feat::CTRL_VQ);
}

#[test]
fn test_device_control_queue_commands_without_event_idx() {
    ctrl_case((feat::ALL | feat::CTRL_VQ) & !feat::EVENT_IDX);
}

fn ctrl_case(features: u64) {
    const OK: u8 = 0;
    const ERR: u8 = 1;
    let fab = TestFabric::start_with(2, |i, dir| {
        let mut p = TestFabric::port_config(dir, i, 2);
        p.spec = PortSpec::virtio_net(DeviceForm::TestDevice);
        p
    });
    let mut opts = GuestOpts::new(2, features);
    opts.ctrl_queue = true;
    let mut a = TestGuest::connect_with(fab.socket(0), opts.clone()).expect("connect A");
    let mut b = TestGuest::connect_with(fab.socket(1), opts).expect("connect B");
    // VIRTIO_NET_CTRL_MQ / VQ_PAIRS_SET
    assert_eq!(
        a.ctrl(4, 0, &3u16.to_le_bytes(), ARRIVE),
        Some(ERR),
        "3 pairs > max 2"
    );
    let r = a.ctrl(4, 0, &0u16.to_le_bytes(), ARRIVE);
    assert_eq!(
        r,
        Some(ERR),
        "0 pairs (ctrl queue kicks sent/suppressed/calls: {:?})",
        a.notify_counts(4)
    );
    assert_eq!(
        a.ctrl(4, 0, &2u16.to_le_bytes(), ARRIVE),
        Some(OK),
        "2 pairs"
    );
    assert_eq!(
        b.ctrl(4, 0, &2u16.to_le_bytes(), ARRIVE),
        Some(OK),
        "2 pairs"
    );
    // Unknown class
    assert_eq!(a.ctrl(0x7f, 0, &[], ARRIVE), Some(ERR), "unknown class");
    // VIRTIO_NET_CTRL_MAC / ADDR_SET changes the MAC in config space
    let new_mac = [0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0x01];
    assert_eq!(a.ctrl(1, 1, &new_mac, ARRIVE), Some(OK), "MAC_ADDR_SET");
    let cfg = a.read_config(0, 6).expect("GET_CONFIG");
    assert_eq!(cfg[..], new_mac, "config space MAC after MAC_ADDR_SET");
    // Traffic on both queue pairs still works.
    for qp in 0..2 {
        a.post_rx(qp, 16, 2048);
        b.post_rx(qp, 16, 2048);
    }
    let f = common::packet::tagged_frame(port_mac(1), new_mac, 1, 100);
    a.send(1, &f, &common::TxOpts::default());
    let r = b.recv_any(ARRIVE).expect("A qp1 -> B");
    assert!(r.data == f);
    let f = common::packet::tagged_frame(new_mac, port_mac(1), 2, 100);
    b.send(1, &f, &common::TxOpts::default());
    let r = a.recv_any(ARRIVE).expect("B qp1 -> A's new MAC");
    assert!(r.data == f);
}
