//! Virtual hosts driven with crafted frames and back to back.

mod common;

use common::*;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};
use virtual_host::{EventKind, HostEvent, HostLimits, ServiceKind, ServiceSpec, VirtualHost};

const MAC_G: [u8; 6] = [0x02, 0, 0, 0, 0, 0x99];
const IP_G: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);

fn csum(b: &[u8]) -> u16 {
    let mut s: u32 = 0;
    for c in b.chunks(2) {
        s += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// Fills in the checksum of a TCP segment from `IP_G` to `IP_A`.
fn set_tcp_checksum(tcp: &mut [u8]) {
    tcp[16..18].copy_from_slice(&[0, 0]);
    let mut pseudo = IP_G.octets().to_vec();
    pseudo.extend_from_slice(&IP_A.octets());
    pseudo.extend_from_slice(&[0, 6, 0, tcp.len() as u8]);
    pseudo.extend_from_slice(tcp);
    let c = csum(&pseudo);
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
}

fn arp_request(target: Ipv4Addr) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&MAC_G);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&MAC_G);
    f.extend_from_slice(&IP_G.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&target.octets());
    f
}

fn ipv4_frame(dst_mac: [u8; 6], dst: Ipv4Addr, proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut f = dst_mac.to_vec();
    f.extend_from_slice(&MAC_G);
    f.extend_from_slice(&[0x08, 0x00]);
    let mut ip = vec![0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, proto, 0, 0];
    let total = (20 + l4.len()) as u16;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip.extend_from_slice(&IP_G.octets());
    ip.extend_from_slice(&dst.octets());
    let c = csum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(l4);
    f
}

fn echo_request(dst_mac: [u8; 6], dst: Ipv4Addr, seq: u16) -> Vec<u8> {
    let mut icmp = vec![8, 0, 0, 0, 0x42, 0x42];
    icmp.extend_from_slice(&seq.to_be_bytes());
    icmp.extend_from_slice(b"virtual host ping payload");
    let c = csum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    ipv4_frame(dst_mac, dst, 1, &icmp)
}

#[test]
fn answers_arp_for_its_address_only() {
    let now = Instant::now();
    let mut a = host("a", MAC_A, IP_A, now);
    a.handle_frame(&arp_request(IP_A), now);
    let out = drain(&mut a);
    assert_eq!(out.len(), 1, "one ARP reply");
    let r = &out[0];
    assert_eq!(&r[0..6], &MAC_G);
    assert_eq!(&r[12..14], &[0x08, 0x06]);
    assert_eq!(&r[20..22], &[0, 2], "opcode reply");
    assert_eq!(&r[22..28], &MAC_A);
    assert_eq!(&r[28..32], &IP_A.octets());
    a.handle_frame(&arp_request(Ipv4Addr::new(10, 77, 0, 200)), now);
    assert!(drain(&mut a).is_empty(), "no reply for another address");
}

#[test]
fn answers_ping() {
    let now = Instant::now();
    let mut a = host("a", MAC_A, IP_A, now);
    // The guest ARPs first, as Linux does; the host learns it from that.
    a.handle_frame(&arp_request(IP_A), now);
    drain(&mut a);
    a.handle_frame(&echo_request(MAC_A, IP_A, 7), now);
    let out = drain(&mut a);
    let reply = out
        .iter()
        .find(|f| f.len() > 34 && f[23] == 1)
        .expect("an ICMP frame");
    assert_eq!(&reply[0..6], &MAC_G);
    assert_eq!(&reply[26..30], &IP_A.octets());
    assert_eq!(&reply[30..34], &IP_G.octets());
    assert_eq!(reply[34], 0, "echo reply");
    assert_eq!(&reply[40..42], &7u16.to_be_bytes());
    assert_eq!(&reply[42..], b"virtual host ping payload");
    assert_eq!(csum(&reply[34..]), 0, "ICMP checksum valid");
    assert_eq!(csum(&reply[14..34]), 0, "IP checksum valid");
}

#[test]
fn ignores_frames_for_other_macs_and_survives_garbage() {
    let now = Instant::now();
    let mut a = host("a", MAC_A, IP_A, now);
    a.handle_frame(&echo_request(MAC_B, IP_A, 1), now);
    assert!(drain(&mut a).is_empty());
    assert_eq!(a.counters().rx_not_for_us, 1);
    let mut x: u64 = 0x1234_5678;
    for i in 0..3000 {
        let len = (i * 7) % 1600;
        let mut f: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        if f.len() >= 14 {
            f[0..6].copy_from_slice(&MAC_A);
            // Make a third of them IPv4/UDP 4791 with garbage above UDP:
            // a valid IPv4 header (total length, no fragment) is what
            // sends a frame to the RoCE engines (`wire::parse`), which
            // must then refuse the garbage.
            if i % 3 == 0 && f.len() > 40 {
                f[12] = 8;
                f[13] = 0;
                f[14] = 0x45;
                let ip_len = (f.len() - 14) as u16;
                f[16..18].copy_from_slice(&ip_len.to_be_bytes());
                f[20] = 0;
                f[21] = 0;
                f[23] = 17;
                f[36] = 0x12;
                f[37] = 0xb7;
            }
        }
        a.handle_frame(&f, now);
        drain(&mut a);
    }
    let c = a.counters();
    assert!(c.roce_malformed + c.roce_icrc_errors + c.roce_no_qp > 0);
    assert_eq!(c.roce_rx, 0);
}

#[test]
fn tcp_handshake_to_the_pingpong_port() {
    let now = Instant::now();
    let mut a = host("a", MAC_A, IP_A, now);
    a.start_service(ServiceSpec::new(ServiceKind::PingpongServer), now)
        .unwrap();
    a.handle_frame(&arp_request(IP_A), now);
    drain(&mut a);
    // SYN from 10.77.0.1:40000 to :18515.
    let mut tcp = vec![0u8; 20];
    tcp[0..2].copy_from_slice(&40000u16.to_be_bytes());
    tcp[2..4].copy_from_slice(&18515u16.to_be_bytes());
    tcp[4..8].copy_from_slice(&1000u32.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = 0x02;
    tcp[14..16].copy_from_slice(&8192u16.to_be_bytes());
    set_tcp_checksum(&mut tcp);
    a.handle_frame(&ipv4_frame(MAC_A, IP_A, 6, &tcp), now);
    let out = drain(&mut a);
    let synack = out
        .iter()
        .find(|f| f.len() >= 54 && f[23] == 6)
        .expect("a TCP answer");
    assert_eq!(&synack[34..36], &18515u16.to_be_bytes());
    assert_eq!(synack[47] & 0x12, 0x12, "SYN+ACK");
    assert_eq!(&synack[42..46], &1001u32.to_be_bytes(), "acks our SYN");
    // A SYN to a closed port gets a reset.
    tcp[2..4].copy_from_slice(&18516u16.to_be_bytes());
    set_tcp_checksum(&mut tcp);
    a.handle_frame(&ipv4_frame(MAC_A, IP_A, 6, &tcp), now);
    let out = drain(&mut a);
    assert!(out
        .iter()
        .any(|f| f.len() >= 54 && f[23] == 6 && f[47] & 0x04 != 0));
}

/// [`run`] from `now` between two hosts, with optional loss of every
/// `drop_every`th frame when it is RoCE.
fn run_pair(
    a: &mut VirtualHost,
    b: &mut VirtualHost,
    mut now: Instant,
    limit: Duration,
    drop_every: usize,
    done: impl Fn(&[HostEvent], &[HostEvent]) -> bool,
) -> (Vec<HostEvent>, Vec<HostEvent>) {
    run(a, b, &mut now, limit, drop_every, is_roce, done)
}

fn pingpong_pair(echo_server: bool, drop_every: usize, iters: u32) {
    let mut srv = ServiceSpec::new(ServiceKind::PingpongServer);
    srv.iters = iters;
    srv.echo = echo_server;
    let mut cli = client_spec(ServiceKind::PingpongClient, iters);
    cli.echo = !echo_server;
    let mut p = Pair::new();
    p.start((srv, cli), false, is_roce, nothing_to_check);
    let (ea, eb) = p.run_to_finish(Duration::from_secs(120), drop_every, is_roce);
    let Pair { a, b, .. } = p;
    let (si, sv) = finished(&ea).expect("server finished");
    let (ci, cv) = finished(&eb).expect("client finished");
    assert_eq!((si, ci), (iters, iters));
    if echo_server {
        // The client checks every reply against what it sent.
        assert_eq!((sv, cv), (0, iters));
    } else {
        // The server checks every message but the client's first.
        assert_eq!((sv, cv), (iters - 1, 0));
    }
    let st = a.status();
    assert_eq!(st.services[0].sessions_ok, 1);
    assert_eq!(st.services[0].state, "listening", "server serves again");
    assert_eq!(st.qps + b.status().qps, 0, "session resources released");
    assert_eq!(st.mrs, 0);
    assert_eq!(b.status().services[0].state, "done");
}

#[test]
fn pingpong_server_against_a_tool_like_client() {
    pingpong_pair(false, 0, 200);
}

#[test]
fn pingpong_client_against_a_tool_like_server() {
    pingpong_pair(true, 0, 200);
}

#[test]
fn pingpong_survives_loss() {
    pingpong_pair(false, 13, 100);
    pingpong_pair(true, 17, 100);
}

/// Hosts A, with nothing started, and B, with a tool-like pingpong
/// client of 10 iterations against A.
fn pingpong_client_alone(now: Instant) -> (VirtualHost, VirtualHost) {
    let a = host("a", MAC_A, IP_A, now);
    let mut b = host("b", MAC_B, IP_B, now);
    let cli = echo_client_spec(10);
    b.start_service(cli, now).unwrap();
    (a, b)
}

#[test]
fn client_waits_for_a_late_server() {
    let now = Instant::now();
    let (mut a, mut b) = pingpong_client_alone(now);
    // Nobody listens for 3 s: refused, retried.
    let (_, eb) = run_pair(&mut a, &mut b, now, Duration::from_secs(3), 0, |_, _| false);
    assert_eq!(failed(&eb), None);
    assert_waiting_for_server(&b);
    let later = now + Duration::from_secs(3);
    let mut srv = ServiceSpec::new(ServiceKind::PingpongServer);
    srv.iters = 10;
    a.start_service(srv, later).unwrap();
    let (ea, eb) = run_pair(
        &mut a,
        &mut b,
        later,
        Duration::from_secs(30),
        0,
        |ea, eb| finished(ea).is_some() && finished(eb).is_some(),
    );
    assert_eq!(finished(&ea), Some((10, 9)));
    assert_eq!(finished(&eb), Some((10, 0)));
}

#[test]
fn limits_give_clear_errors() {
    let now = Instant::now();
    let limits = HostLimits {
        max_tcp_sockets: 1,
        ..HostLimits::default()
    };
    let mut a = limited_host("a", MAC_A, IP_A, limits, 1, now);
    a.start_service(ServiceSpec::new(ServiceKind::PingpongServer), now)
        .unwrap();
    let mut s2 = ServiceSpec::new(ServiceKind::PingpongServer);
    s2.port = 18516;
    let e = a.start_service(s2, now).unwrap_err();
    assert!(e.to_string().contains("at most 1 TCP sockets"), "{e}");
    let mut cli = ServiceSpec::new(ServiceKind::PingpongClient);
    cli.peer = None;
    assert!(a.start_service(cli, now).is_err());
    let mut big = ServiceSpec::new(ServiceKind::PingpongServer);
    big.size = 0;
    assert!(a.start_service(big, now).is_err());
    let multicast_mac = host_config("m", [1, 0, 0, 0, 0, 1], IP_A, HostLimits::default(), 1);
    assert!(VirtualHost::new(multicast_mac, now).is_err());
}

#[test]
fn client_reaches_a_peer_that_was_silent_for_a_while() {
    let now = Instant::now();
    let (mut a, mut b) = pingpong_client_alone(now);
    // 90 s with nobody on the wire: ARP requests and SYNs go nowhere.
    let mut t = now;
    let end = now + Duration::from_secs(90);
    while t < end {
        drain(&mut b);
        t = b
            .poll_timeout(t)
            .unwrap_or(end)
            .max(t + Duration::from_millis(1));
        b.handle_timeout(t);
    }
    let st = b.status().services[0].clone();
    assert!(st.last_error.is_none(), "{st:?}");
    let mut srv = ServiceSpec::new(ServiceKind::PingpongServer);
    srv.iters = 10;
    a.start_service(srv, t).unwrap();
    // The client retries at least every 21 s (exchange deadline + 1 s), so
    // it gets there well within 25 s.
    let (ea, _) = run_pair(&mut a, &mut b, t, Duration::from_secs(25), 0, |ea, eb| {
        finished(ea).is_some() && finished(eb).is_some()
    });
    assert_eq!(finished(&ea), Some((10, 9)));
    let started = ea
        .iter()
        .position(|e| matches!(e.kind, EventKind::SessionStarted { .. }));
    assert!(started.is_some());
}

fn perftest_pair(server: ServiceKind, client: ServiceKind, port: u16, drop_every: usize) {
    let mut srv = ServiceSpec::new(server);
    srv.port = port;
    srv.iters = 40;
    // 4 KiB messages keep the debug-build test short; the tools' 64 KiB
    // default runs in the guest test.
    srv.size = 4096;
    let cli = perftest_client_spec(client, port, 40);
    let mut p = Pair::new();
    p.start((srv, cli), false, is_roce, nothing_to_check);
    let (ea, eb) = p.run_to_finish(Duration::from_secs(300), drop_every, is_roce);
    let Pair { a, b, .. } = p;
    let (si, _) = finished(&ea).expect("server finished");
    let (ci, _) = finished(&eb).expect("client finished");
    assert_eq!(ci, 40, "{client} completed every operation");
    assert_eq!(si, 40, "{server} accepted every message");
    let (sa, sb) = (a.status(), b.status());
    assert_eq!(sa.mrs + sb.mrs, 0, "buffers released");
    assert_eq!(sb.services[0].state, "done");
    assert_eq!(sa.services[0].state, "listening");
}

#[test]
fn perftest_clients_against_perftest_servers() {
    use ServiceKind::*;
    for (s, c, port) in [
        (WriteBwServer, WriteBwClient, 18517),
        (SendBwServer, SendBwClient, 18518),
        (ReadBwServer, ReadBwClient, 18519),
        (AtomicBwServer, AtomicBwClient, 18520),
    ] {
        perftest_pair(s, c, port, 0);
        perftest_pair(s, c, port, 29);
    }
}
