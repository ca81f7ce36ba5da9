//! One L2-L4 parse per frame on every path through the daemon (issue 26):
//! `wire::parse_calls()` (feature `parse-count`, on for these tests)
//! counts every `wire::parse` in the process, on any thread, while N
//! frames go along each path in turn:
//!
//! - virtio-net port to virtio-net port (the receiver has two queue pairs:
//!   RSS reads the view);
//! - virtio-net port to a gve device port (flooded: the gve has sent
//!   nothing to be learned from), where the pump hands the device the view;
//! - virtio-net port to an erdma function (RoCEv2 to its netdev's MAC);
//! - VXLAN uplink ingress to a virtio-net port;
//! - virtio-net port to a virtual host (RoCEv2 to its address).
//!
//! Each path must count exactly N. The test fails when a receiver parses
//! again what the fabric parsed: without the view the fabric hands on with
//! the frame (`Frame::view`), the flooded gve path counts 3N (the fabric,
//! then the gve's and the erdma function's pumps each parse their copy). The devices' own half (a gve driven by its
//! driver parsed every frame again in `receive` and `rx_queue` before they
//! took the view) is counted in `gve-device/tests/parse_once.rs`.
//!
//! One `#[test]` in its own binary: the counter is process-wide, so no
//! other test may parse meanwhile, and the paths run one after another.

mod common;

use common::{feat, init_logging, wait_until, GuestOpts, TempDir, TestFabric, TestGuest, QUIET};
use roce_model::{FrameBuilder, NetParams, Opcode, PacketBuilder};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::Duration;
use vhost_rdma::config::{DaemonConfig, DeviceForm, HostSpec, PortConfig, PortSpec};
use vhost_rdma::Server;

/// Frames per path.
const N: u64 = 20;
/// Time allowed for a path's frames to be parsed where they are going.
const ARRIVE: Duration = Duration::from_secs(5);
const VNI: u32 = 4242;

/// `wire::parse` calls while `send` runs and the frames travel: waits
/// until N were counted (or `ARRIVE` passed), then a quiet spell for any
/// parse too many.
fn parses_of(send: impl FnOnce()) -> u64 {
    let before = wire::parse_calls();
    send();
    wait_until(ARRIVE, || wire::parse_calls() - before >= N);
    std::thread::sleep(QUIET);
    wire::parse_calls() - before
}

fn udp(src: [u8; 6], dst: [u8; 6], sport: u16) -> Vec<u8> {
    let mut b = wire::builder::FrameBuilder::udp(
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        sport,
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
        9000,
    );
    b.src_mac = src;
    b.dst_mac = dst;
    b.build(&[0x5a; 100])
}

fn roce(src: [u8; 6], dst: [u8; 6], dst_ip: [u8; 4], psn: u32) -> Vec<u8> {
    let b = FrameBuilder {
        dst_mac: dst,
        src_mac: src,
        vlan_tci: None,
        net: NetParams::Ipv4 {
            src: [10, 0, 0, 1],
            dst: dst_ip,
            tos: 0,
            ttl: 64,
            ident: 1,
            udp_src_port: 49152,
        },
    };
    let p = PacketBuilder::new(Opcode::RcSendOnly, 0x99, psn).payload(&[7; 64]);
    b.build(&p).expect("RoCE frame")
}

fn vxlan(inner: &[u8]) -> Vec<u8> {
    let v = VNI.to_be_bytes();
    let mut d = vec![0x08, 0, 0, 0, v[1], v[2], v[3], 0];
    d.extend_from_slice(inner);
    d
}

#[test]
fn every_path_parses_each_frame_once() {
    init_logging();
    let dir = TempDir::new("parse-once");
    let vtep = UdpSocket::bind("127.0.0.1:0").unwrap();
    let local: SocketAddr = {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap()
    };
    let a_port = TestFabric::port_config(dir.path(), 0, 1);
    // The test-device form: it has the control queue the guest sets the
    // queue pairs on.
    let mut b_port = TestFabric::port_config(dir.path(), 1, 2);
    b_port.spec = PortSpec::virtio_net(DeviceForm::TestDevice);
    let (a_mac, b_mac) = (a_port.mac.0, b_port.mac.0);
    let mut gve = PortConfig::gve("g", dir.path().join("g.sock"));
    gve.queue_pairs = 1;
    let erdma = PortConfig::erdma("r", dir.path().join("r.sock"), "p1");
    let uplink: PortConfig = format!(
        "up,kind=vxlan,local={local},vni={VNI},remote={}",
        vtep.local_addr().unwrap()
    )
    .parse()
    .unwrap();
    let host = HostSpec::new("h", Ipv4Addr::new(10, 0, 0, 9), 24);
    let host_mac = host.mac.0;
    let server = Server::start(DaemonConfig {
        ports: vec![a_port.clone(), b_port.clone(), gve, erdma, uplink],
        hosts: vec![host],
        ..DaemonConfig::default()
    })
    .expect("Server::start");

    let mut a = TestGuest::connect(&a_port.socket, 1, feat::MINIMAL).unwrap();
    a.post_rx(0, 256, 2048);
    let mut opts = GuestOpts::new(2, feat::ALL | feat::CTRL_VQ);
    opts.ctrl_queue = true;
    let mut b = TestGuest::connect_with(&b_port.socket, opts).unwrap();
    for qp in 0..2 {
        b.post_rx(qp, 128, 2048);
    }
    // Both queue pairs in use: the fabric steers by the flow hash, which
    // reads the view.
    assert_eq!(b.ctrl(4, 0, &2u16.to_le_bytes(), ARRIVE), Some(0), "MQ");
    let fabric = server.fabric().ports[1].clone();
    assert!(
        wait_until(ARRIVE, || fabric
            .rx_queues()
            .iter()
            .all(|q| q.enabled.load(std::sync::atomic::Ordering::Relaxed))),
        "B's RX queues not enabled"
    );
    // The switch learns B's and the host's MACs (the host answers A's
    // ARP request); what that parses is not counted.
    b.send(0, &udp(b_mac, a_mac, 1), &Default::default());
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&a_mac);
    arp.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    arp.extend_from_slice(&a_mac);
    arp.extend_from_slice(&[10, 0, 0, 1]);
    arp.extend_from_slice(&[0; 6]);
    arp.extend_from_slice(&[10, 0, 0, 9]);
    arp.resize(60, 0);
    a.send(0, &arp, &Default::default());
    assert!(
        wait_until(ARRIVE, || a
            .drain_all(Duration::from_millis(50))
            .iter()
            .any(|f| f.data[6..12] == host_mac)),
        "the virtual host answered ARP"
    );
    std::thread::sleep(QUIET);
    b.drain_all(Duration::from_millis(50));

    // virtio-net to virtio-net.
    let n = parses_of(|| {
        for i in 0..N as u16 {
            a.send(0, &udp(a_mac, b_mac, 1000 + i), &Default::default());
        }
    });
    let got = b.drain_all(QUIET).len() as u64;
    assert_eq!((n, got), (N, N), "virtio-net -> virtio-net: parses, frames");

    // To the gve device port (and, flooded, to every other port; the
    // fabric parses once for all the copies).
    let far = [2, 0, 0, 0, 0, 0x77];
    let n = parses_of(|| {
        for i in 0..N as u16 {
            a.send(0, &udp(a_mac, far, 2000 + i), &Default::default());
        }
    });
    assert_eq!(n, N, "virtio-net -> gve (flooded)");
    b.drain_all(QUIET);

    // To the erdma function paired with B's port: RoCEv2 to B's MAC.
    let n = parses_of(|| {
        for psn in 0..N as u32 {
            a.send(
                0,
                &roce(a_mac, b_mac, [10, 0, 0, 2], psn),
                &Default::default(),
            );
        }
    });
    assert_eq!(n, N, "virtio-net -> erdma");
    assert!(b.drain_all(QUIET).is_empty(), "RoCEv2 went to the function");

    // VXLAN uplink ingress to B.
    let n = parses_of(|| {
        for i in 0..N as u16 {
            vtep.send_to(&vxlan(&udp(far, b_mac, 3000 + i)), local)
                .unwrap();
        }
    });
    let got = b.drain_all(QUIET).len() as u64;
    assert_eq!((n, got), (N, N), "uplink -> virtio-net: parses, frames");

    // To the virtual host: RoCEv2 to its address (no such QP: counted and
    // dropped after the RDMA engine read the frame).
    let n = parses_of(|| {
        for psn in 0..N as u32 {
            a.send(
                0,
                &roce(a_mac, host_mac, [10, 0, 0, 9], psn),
                &Default::default(),
            );
        }
    });
    assert_eq!(n, N, "virtio-net -> virtual host");

    let _ = a.stop();
    let _ = b.stop();
    server.shutdown().unwrap();
}
