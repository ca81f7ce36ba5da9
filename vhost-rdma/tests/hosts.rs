//! No-VM tests of virtual hosts in the daemon: a test guest on a port gets
//! ARP, ping and TCP answers from a `--host`, and the control socket shows
//! and drives the host.

mod common;

use common::packet::inet_csum;
use common::{feat, port_mac, serve_hosts, virtual_hosts, TempDir, TestGuest, ARRIVE};
use std::net::Ipv4Addr;
use vhost_rdma::config::HostSpec;
use vhost_rdma::control::{request, Request};
use vhost_rdma::ports::host::ServiceRequest;
use vhost_rdma::Server;

const GUEST_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const HOST_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 10);

fn arp_request(src: [u8; 6], target: Ipv4Addr) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&GUEST_IP.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&target.octets());
    f.resize(60, 0);
    f
}

fn ipv4_frame(src: [u8; 6], dst_mac: [u8; 6], proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut f = dst_mac.to_vec();
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x08, 0x00]);
    let mut ip = vec![0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, proto, 0, 0];
    ip[2..4].copy_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
    ip.extend_from_slice(&GUEST_IP.octets());
    ip.extend_from_slice(&HOST_IP.octets());
    let c = inet_csum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(l4);
    f
}

struct Setup {
    server: Option<Server>,
    guest: TestGuest,
    ctl: std::path::PathBuf,
    _dir: TempDir,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = self.guest.stop();
        if let Some(s) = self.server.take() {
            let _ = s.shutdown();
        }
    }
}

fn setup() -> Setup {
    let dir = TempDir::new("hosts");
    let host: HostSpec = format!("vh={HOST_IP}/24,service=pingpong-server")
        .parse()
        .unwrap();
    let (server, port, ctl) = serve_hosts(dir.path(), vec![host]);
    let mut guest = TestGuest::connect(&port.socket, 1, feat::MINIMAL).unwrap();
    guest.post_rx(0, 64, 2048);
    Setup {
        server: Some(server),
        guest,
        ctl,
        _dir: dir,
    }
}

/// The next frame of `ethertype` (skipping anything else the host says).
fn recv_type(g: &mut TestGuest, ethertype: u16, proto: Option<u8>) -> Vec<u8> {
    let end = std::time::Instant::now() + ARRIVE;
    while std::time::Instant::now() < end {
        if let Some(f) = g.recv_any(ARRIVE) {
            let d = f.data;
            if d.len() >= 14
                && u16::from_be_bytes([d[12], d[13]]) == ethertype
                && proto.is_none_or(|p| d.get(23) == Some(&p))
            {
                return d;
            }
        }
    }
    panic!("no frame of type {ethertype:#x} arrived");
}

#[test]
fn guest_gets_arp_ping_and_tcp_answers_from_a_virtual_host() {
    let mut s = setup();
    let me = port_mac(0);
    s.guest
        .send(0, &arp_request(me, HOST_IP), &Default::default());
    let r = recv_type(&mut s.guest, 0x0806, None);
    assert_eq!(&r[0..6], &me, "ARP reply to the guest");
    assert_eq!(&r[20..22], &[0, 2], "ARP reply opcode");
    assert_eq!(&r[28..32], &HOST_IP.octets());
    let mut host_mac = [0u8; 6];
    host_mac.copy_from_slice(&r[22..28]);

    // Ping.
    let mut icmp = vec![8, 0, 0, 0, 0x42, 0x42, 0, 9];
    icmp.extend_from_slice(b"hello virtual host");
    let c = inet_csum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    s.guest
        .send(0, &ipv4_frame(me, host_mac, 1, &icmp), &Default::default());
    let r = recv_type(&mut s.guest, 0x0800, Some(1));
    assert_eq!(r[34], 0, "echo reply");
    assert_eq!(&r[40..42], &[0, 9], "sequence");
    assert_eq!(&r[42..60], b"hello virtual host");
    assert_eq!(inet_csum(&r[34..]), 0, "ICMP checksum");

    // TCP SYN to the pingpong server's port.
    let mut tcp = vec![0u8; 20];
    tcp[0..2].copy_from_slice(&40000u16.to_be_bytes());
    tcp[2..4].copy_from_slice(&18515u16.to_be_bytes());
    tcp[4..8].copy_from_slice(&5000u32.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = 0x02;
    tcp[14..16].copy_from_slice(&8192u16.to_be_bytes());
    let mut pseudo = GUEST_IP.octets().to_vec();
    pseudo.extend_from_slice(&HOST_IP.octets());
    pseudo.extend_from_slice(&[0, 6, 0, 20]);
    pseudo.extend_from_slice(&tcp);
    let c = inet_csum(&pseudo);
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
    s.guest
        .send(0, &ipv4_frame(me, host_mac, 6, &tcp), &Default::default());
    let r = recv_type(&mut s.guest, 0x0800, Some(6));
    assert_eq!(r[47] & 0x12, 0x12, "SYN+ACK");
    assert_eq!(&r[42..46], &5001u32.to_be_bytes());

    // The control socket lists the host and its counters.
    let st = request(&s.ctl, &Request::Status)
        .unwrap()
        .into_status()
        .unwrap();
    let p = st.ports.iter().find(|p| p.name == "vh").expect("host port");
    assert_eq!(p.form, "host");
    assert!(p.totals.rx_frames >= 3 && p.totals.tx_frames >= 3, "{p:?}");
    assert_eq!(st.hosts.len(), 1);
    let h = &st.hosts[0];
    assert_eq!(h.address, "10.77.0.10/24");
    assert!(h.rx_frames >= 3);
    assert_eq!(h.services.len(), 1);
    assert_eq!(h.services[0].kind, "pingpong-server");
}

#[test]
fn control_socket_starts_and_stops_services_with_clear_errors() {
    let s = setup();
    let start = |kind: &str, peer: Option<Ipv4Addr>| {
        request(
            &s.ctl,
            &Request::HostStart {
                host: "vh".into(),
                service: ServiceRequest {
                    kind: kind.into(),
                    peer,
                    ..ServiceRequest::default()
                },
            },
        )
        .unwrap()
    };
    let r = start("nope", None);
    assert!(!r.ok && r.error.unwrap().contains("known services"));
    let r = start("pingpong-client", None);
    assert!(!r.ok && r.error.unwrap().contains("peer"));
    let r = request(
        &s.ctl,
        &Request::HostStart {
            host: "nohost".into(),
            service: ServiceRequest {
                kind: "pingpong-server".into(),
                ..ServiceRequest::default()
            },
        },
    )
    .unwrap();
    assert!(!r.ok && r.error.unwrap().contains("no virtual host"));
    // A client towards the (silent) guest: it starts and waits.
    let r = start("pingpong-client", Some(GUEST_IP));
    assert!(r.ok, "{r:?}");
    let id = r.service_id().unwrap();
    let hosts = virtual_hosts(&s.ctl);
    assert!(hosts[0].services.iter().any(|v| v.id == id));
    let stop = || {
        request(
            &s.ctl,
            &Request::HostStop {
                host: "vh".into(),
                id,
            },
        )
        .unwrap()
    };
    let r = stop();
    assert!(r.ok, "{r:?}");
    let r = stop();
    assert!(!r.ok && r.error.unwrap().contains("no service"));
    let hosts = virtual_hosts(&s.ctl);
    assert_eq!(hosts[0].services.len(), 1);
    assert_eq!(hosts[0].qps, 0, "the stopped client's QP is gone");
}

/// Two virtual hosts in one daemon, switched by the fabric: the host threads,
/// their timers and the control socket carry whole sessions.
#[test]
fn two_virtual_hosts_run_sessions_through_the_daemon() {
    let dir = TempDir::new("hosts2");
    let a: HostSpec = "vha=10.77.0.20/24,service=pingpong-server".parse().unwrap();
    let b: HostSpec = "vhb=10.77.0.21/24".parse().unwrap();
    let (server, _, ctl) = serve_hosts(dir.path(), vec![a, b]);
    let start = |host: &str, kind: &str, peer: Option<Ipv4Addr>, port: Option<u16>, echo: bool| {
        let r = request(
            &ctl,
            &Request::HostStart {
                host: host.into(),
                service: ServiceRequest {
                    kind: kind.into(),
                    peer,
                    port,
                    iters: Some(100),
                    size: Some(4096),
                    echo,
                    ..ServiceRequest::default()
                },
            },
        )
        .unwrap();
        assert!(r.ok, "{r:?}");
    };
    // vha's pingpong server runs 1000 iterations by default: start one with 100.
    start("vha", "pingpong-server", None, Some(18600), false);
    start("vha", "write-bw-server", None, Some(18601), false);
    start(
        "vhb",
        "pingpong-client",
        Some(Ipv4Addr::new(10, 77, 0, 20)),
        Some(18600),
        true,
    );
    start(
        "vhb",
        "write-bw-client",
        Some(Ipv4Addr::new(10, 77, 0, 20)),
        Some(18601),
        false,
    );
    let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let done = |kind: &str, hosts: &[vhost_rdma::ports::host::HostStats]| {
        hosts
            .iter()
            .flat_map(|h| h.services.iter())
            .filter(|s| s.kind == kind && s.sessions_ok >= 1)
            .map(|s| s.last_iterations)
            .next()
    };
    let mut hosts = Vec::new();
    while std::time::Instant::now() < end {
        hosts = virtual_hosts(&ctl);
        if ["pingpong-client", "write-bw-client", "write-bw-server"]
            .iter()
            .all(|k| done(k, &hosts).is_some())
            && hosts[0]
                .services
                .iter()
                .any(|s| s.port == 18600 && s.sessions_ok == 1)
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(done("pingpong-client", &hosts), Some(100), "{hosts:#?}");
    assert_eq!(done("write-bw-client", &hosts), Some(100), "{hosts:#?}");
    assert_eq!(done("write-bw-server", &hosts), Some(100), "{hosts:#?}");
    let srv = hosts[0]
        .services
        .iter()
        .find(|s| s.port == 18600)
        .expect("pingpong server on 18600");
    assert_eq!(
        (srv.sessions_ok, srv.last_iterations, srv.last_verified),
        (1, 100, 99)
    );
    assert!(hosts
        .iter()
        .all(|h| h.roce_icrc_errors == 0 && h.roce_malformed == 0));
    server.shutdown().unwrap();
}
