//! iWARP on virtual hosts: rping client and server back to back (CRC on and
//! off, lossy links), and hostile peers (garbage MPA, markers, bad CRC).

mod common;

use common::*;
use std::time::{Duration, Instant};
use virtual_host::{HostEvent, ServiceKind, ServiceSpec, VirtualHost};

fn rping_pair(server_crc: bool, client_crc: bool, size: u32, iters: u32, drop_every: usize) {
    let mut srv = ServiceSpec::new(ServiceKind::RpingServer);
    srv.mpa_crc = server_crc;
    srv.size = size;
    let mut cli = client_spec(ServiceKind::RpingClient, iters);
    cli.size = size;
    cli.mpa_crc = client_crc;
    let mut p = Pair::new();
    p.start((srv, cli), false, is_tcp, nothing_to_check);
    let (ea, eb) = p.run_to_finish(Duration::from_secs(120), drop_every, is_tcp);
    // The server checks each buffer it READs against rping's pattern; the
    // client checks that its sink got its source back by RDMA WRITE.
    assert_eq!(finished(&ea), Some((iters, iters)), "server {ea:?}");
    assert_eq!(finished(&eb), Some((iters, iters)), "client {eb:?}");
    let sa = p.a.status();
    assert_eq!(sa.services[0].sessions_ok, 1);
    assert_eq!(p.a.iwarp_counters().connected, 1);
    assert_eq!(p.b.iwarp_counters().connected, 1);
    // CRC is on when either side asks for it, on both ends.
    let crc = u64::from(server_crc || client_crc);
    assert_eq!(p.a.iwarp_counters().connected_crc, crc);
    assert_eq!(p.b.iwarp_counters().connected_crc, crc);
    let errs = p.a.iwarp_counters();
    assert_eq!(
        (errs.mpa_errors, errs.crc_errors, errs.terminates_sent),
        (0, 0, 0)
    );
    // The server listens again once the connection is gone.
    run_idle(
        &mut p.a,
        &mut p.b,
        &mut p.now,
        Duration::from_secs(10),
        is_tcp,
    );
    assert_eq!(p.a.status().services[0].state, "listening");
    assert_eq!(p.b.status().services[0].state, "done");
    assert_eq!(p.a.status().tcp_sockets, 1, "only the listening socket");
}

#[test]
fn rping_back_to_back_without_crc() {
    rping_pair(false, false, 64, 10, 0);
}

#[test]
fn rping_back_to_back_with_crc_asked_by_the_client() {
    rping_pair(false, true, 64, 10, 0);
}

#[test]
fn rping_back_to_back_with_crc_asked_by_the_server() {
    rping_pair(true, false, 64, 10, 0);
}

#[test]
fn rping_large_buffers_over_a_lossy_link() {
    // 64 KiB buffers span many FPDUs and TCP segments; every 11th TCP
    // frame is lost and retransmitted.
    rping_pair(true, true, 65535, 5, 11);
}

#[test]
fn rping_client_waits_for_a_late_server() {
    let mut now = Instant::now();
    let mut a = host("a", MAC_A, IP_A, now);
    let mut b = host("b", MAC_B, IP_B, now);
    let cli = client_spec(ServiceKind::RpingClient, 3);
    b.start_service(cli, now).unwrap();
    run_idle(&mut a, &mut b, &mut now, Duration::from_secs(3), is_tcp);
    let st = &b.status().services[0];
    assert!(
        ["waiting-for-server", "connecting"].contains(&st.state.as_str()),
        "{st:?}"
    );
    assert_eq!(st.sessions_failed, 0);
    a.start_service(ServiceSpec::new(ServiceKind::RpingServer), now)
        .unwrap();
    let (ea, eb) = run(
        &mut a,
        &mut b,
        &mut now,
        Duration::from_secs(60),
        0,
        is_tcp,
        |ea, eb| finished(ea).is_some() && finished(eb).is_some(),
    );
    assert_eq!(finished(&ea), Some((3, 3)));
    assert_eq!(finished(&eb), Some((3, 3)));
}

#[test]
fn rping_sizes_out_of_range_are_refused() {
    let now = Instant::now();
    let mut a = host("a", MAC_A, IP_A, now);
    for size in [22, 65536] {
        let mut s = ServiceSpec::new(ServiceKind::RpingServer);
        s.size = size;
        assert!(a.start_service(s, now).is_err(), "size {size}");
    }
    assert_eq!(a.status().tcp_sockets, 0);
}

// ---------------------------------------------------------------------------
// A raw TCP peer (smoltcp) for hostile input.
// ---------------------------------------------------------------------------

/// A TCP client that sends what the test scripts.
struct RawPeer {
    tcp: TcpClient,
    /// Bytes to send once connected.
    out: Vec<u8>,
    /// Bytes received.
    got: Vec<u8>,
    /// Optional iWARP engine driven over the stream; `corrupt` flips a byte
    /// of its first FPDU after the MPA exchange.
    engine: Option<siw::Connection>,
    corrupt: bool,
}

impl RawPeer {
    fn new(now: Instant, port: u16) -> Self {
        let mut tcp = TcpClient::new(now, IP_P);
        tcp.connect(port, 50000);
        RawPeer {
            tcp,
            out: Vec::new(),
            got: Vec::new(),
            engine: None,
            corrupt: false,
        }
    }
}

impl TcpScript for RawPeer {
    fn client(&mut self) -> &mut TcpClient {
        &mut self.tcp
    }

    fn step(&mut self, now: Instant) {
        for _ in 0..8 {
            self.tcp.poll(now);
            let s = self.tcp.sock();
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = s.recv_slice(&mut buf) {
                self.got.extend_from_slice(&buf[..n]);
                if let Some(e) = self.engine.as_mut() {
                    e.handle_bytes(&buf[..n]);
                }
            }
            if let Some(e) = self.engine.as_mut() {
                if let Some(mut b) = e.poll_transmit() {
                    if self.corrupt && e.is_connected() && b.len() > 8 {
                        let i = b.len() - 6;
                        b[i] ^= 0xff;
                        self.corrupt = false;
                    }
                    self.out.extend_from_slice(&b);
                }
            }
            if s.can_send() && !self.out.is_empty() {
                let n = s.send_slice(&self.out).unwrap_or(0);
                self.out.drain(..n);
            }
        }
    }
}

fn server_host(now: Instant, crc: bool) -> VirtualHost {
    let mut a = host("a", MAC_A, IP_A, now);
    let mut srv = ServiceSpec::new(ServiceKind::RpingServer);
    srv.mpa_crc = crc;
    a.start_service(srv, now).unwrap();
    a
}

/// Runs server `a` against hostile peer `p` until its session fails (30 s
/// at most), then 5 s more so the last bytes (reply, Terminate, FIN)
/// arrive. Returns the server's events up to the failure.
fn run_until_server_fails(
    a: &mut VirtualHost,
    p: &mut RawPeer,
    now: &mut Instant,
) -> Vec<HostEvent> {
    let (ea, _) = run(a, p, now, Duration::from_secs(30), 0, is_tcp, |ea, _| {
        failed(ea).is_some()
    });
    run_idle(a, p, now, Duration::from_secs(5), is_tcp);
    ea
}

/// After a hostile peer, a well-behaved rping client is still served.
fn still_serves(a: &mut VirtualHost, now: &mut Instant) {
    let cli = client_spec(ServiceKind::RpingClient, 2);
    let (_, eb) = run_client(a, now, cli, Duration::from_secs(60), is_tcp, client_ended);
    assert_eq!(finished(&eb), Some((2, 2)), "{eb:?}");
}

#[test]
fn garbage_instead_of_an_mpa_request_fails_the_session_cleanly() {
    let mut now = Instant::now();
    let mut a = server_host(now, false);
    let mut p = RawPeer::new(now, 7174);
    p.out = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0".to_vec();
    let ea = run_until_server_fails(&mut a, &mut p, &mut now);
    let reason = failed(&ea).expect("session failed");
    assert!(reason.contains("MPA"), "{reason}");
    assert_eq!(a.iwarp_counters().mpa_errors, 1);
    assert_eq!(a.status().services[0].sessions_failed, 1);
    still_serves(&mut a, &mut now);
}

#[test]
fn an_mpa_request_with_markers_is_rejected() {
    let mut now = Instant::now();
    let mut a = server_host(now, false);
    let mut p = RawPeer::new(now, 7174);
    let mut req = siw::mpa::MpaFrame::new(siw::mpa::FrameKind::Request, 1);
    req.markers = true;
    req.encode(&mut p.out).unwrap();
    let ea = run_until_server_fails(&mut a, &mut p, &mut now);
    assert!(failed(&ea).is_some());
    // The reply is a reject (R flag, bit 0x20 of the flags byte after the key).
    let (rep, _) = siw::mpa::MpaFrame::parse(&p.got)
        .expect("reply parses")
        .expect("a whole reply");
    assert!(rep.reject, "{rep:?}");
    assert_eq!(a.iwarp_counters().mpa_errors, 1);
    still_serves(&mut a, &mut now);
}

#[test]
fn a_bad_crc_gets_a_terminate_and_is_counted() {
    let mut now = Instant::now();
    let mut a = server_host(now, false);
    let mut p = RawPeer::new(now, 7174);
    let cfg = virtual_host::iwarp::engine_config(true, 1, 1);
    let mut e = siw::Connection::initiator(cfg, &[], now).unwrap();
    let stag = e.register_mr(vec![7; 16], siw::Access::NONE);
    e.post_send(
        1,
        siw::WorkRequest::Send {
            local: siw::Sge {
                stag,
                addr: 0,
                len: 16,
            },
            solicited: false,
            invalidate: None,
        },
    )
    .unwrap();
    p.engine = Some(e);
    p.corrupt = true;
    let ea = run_until_server_fails(&mut a, &mut p, &mut now);
    let reason = failed(&ea).expect("session failed");
    assert!(reason.to_lowercase().contains("terminate"), "{reason}");
    assert_eq!(a.iwarp_counters().crc_errors, 1);
    // The peer's engine got the Terminate (LLP layer, CRC error).
    let mut got_term = false;
    let e = p.engine.as_mut().unwrap();
    while let Some(ev) = e.poll_event() {
        if let siw::Event::Error(siw::ConnError::RemoteTerminate(t)) = ev {
            assert_eq!(t.error.layer, siw::Layer::Llp);
            assert_eq!(t.error.ecode, siw::ddp::llp_ecode::RECEIVED_CRC);
            got_term = true;
        }
    }
    assert!(got_term, "no Terminate reached the peer");
    still_serves(&mut a, &mut now);
}

#[test]
fn a_peer_that_never_speaks_times_out() {
    let mut now = Instant::now();
    let mut a = server_host(now, false);
    let mut p = RawPeer::new(now, 7174);
    let (ea, _) = run(
        &mut a,
        &mut p,
        &mut now,
        Duration::from_secs(60),
        0,
        is_tcp,
        |ea, _| failed(ea).is_some(),
    );
    assert!(failed(&ea).is_some());
    assert_eq!(a.iwarp_counters().setup_timeouts, 1);
    still_serves(&mut a, &mut now);
}

#[test]
fn ucmatose_back_to_back() {
    for crc in [false, true] {
        let mut srv = ServiceSpec::new(ServiceKind::UcmatoseServer);
        srv.mpa_crc = crc;
        srv.iters = 20;
        let cli = client_spec(ServiceKind::UcmatoseClient, 20);
        let mut p = Pair::new();
        p.start((srv, cli), false, is_tcp, nothing_to_check);
        let (ea, eb) = p.run_to_finish(Duration::from_secs(60), 0, is_tcp);
        // Each side received every message with the right length.
        assert_eq!(finished(&ea), Some((20, 20)));
        assert_eq!(finished(&eb), Some((20, 20)));
    }
}

#[test]
fn ucmatose_message_size_mismatch_fails() {
    let srv = ServiceSpec::new(ServiceKind::UcmatoseServer);
    let mut cli = ServiceSpec::new(ServiceKind::UcmatoseClient);
    cli.peer = Some(IP_A);
    cli.size = 50;
    let mut p = Pair::new();
    p.start((srv, cli), false, is_tcp, nothing_to_check);
    let (_, eb) = run(
        &mut p.a,
        &mut p.b,
        &mut p.now,
        Duration::from_secs(60),
        0,
        is_tcp,
        |_, eb| failed(eb).is_some(),
    );
    // The server's 100-byte messages do not fit the client's 50-byte receives.
    assert!(failed(&eb).is_some(), "{eb:?}");
}
