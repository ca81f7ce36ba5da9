//! perftest `-R` (rdma_cm over iWARP) services back to back: our client
//! against our server for `ib_write_bw`, `ib_send_bw` and `ib_read_bw`, CRC
//! off and on, over a lossy link, and a client started before its server.
//! The guest end to end (the guest matrix's `vhost-siw` cell) runs them against
//! the real tools.

mod common;

use common::*;
use std::time::{Duration, Instant};
use virtual_host::{ServiceKind, ServiceSpec};

fn pair(
    server: ServiceKind,
    client: ServiceKind,
    crc: (bool, bool),
    iters: u32,
    size: u32,
    drop_every: usize,
    client_first: bool,
) {
    let mut srv = ServiceSpec::new(server);
    srv.rdma_cm = true;
    srv.mpa_crc = crc.0;
    srv.size = size;
    srv.iters = iters;
    let mut cli = client_spec(client, iters);
    cli.rdma_cm = true;
    cli.mpa_crc = crc.1;
    cli.size = size;
    let mut p = Pair::new();
    p.start((srv, cli), client_first, is_tcp, |_, b| {
        assert_waiting_for_server(b)
    });
    let (ea, eb) = p.run_to_finish(Duration::from_secs(300), drop_every, is_tcp);
    // The client counts its completed operations, the server what arrived:
    // WRITE messages placed, READ requests answered, receives completed.
    assert_eq!(finished(&eb), Some((iters, 0)), "client {eb:?}");
    assert_eq!(finished(&ea), Some((iters, 0)), "server {ea:?}");
    // Two iWARP connections a side (control and data), CRC on both if
    // either side asked for it.
    let crc_n = if crc.0 || crc.1 { 2 } else { 0 };
    for h in [&p.a, &p.b] {
        let c = h.iwarp_counters();
        assert_eq!(c.connected, 2, "{c:?}");
        assert_eq!(c.connected_crc, crc_n, "{c:?}");
        assert_eq!(
            (
                c.mpa_errors,
                c.crc_errors,
                c.terminates_sent,
                c.terminates_received
            ),
            (0, 0, 0, 0),
            "{c:?}"
        );
    }
    // Both close; the server listens again with only its listening socket.
    run_idle(
        &mut p.a,
        &mut p.b,
        &mut p.now,
        Duration::from_secs(40),
        is_tcp,
    );
    let sa = p.a.status();
    assert_eq!(sa.services[0].state, "listening");
    assert_eq!(sa.services[0].sessions_ok, 1);
    assert_eq!(sa.tcp_sockets, 1, "only the listening socket");
    let sb = p.b.status();
    assert_eq!(sb.services[0].state, "done");
    assert_eq!(sb.tcp_sockets, 0, "the client's sockets are gone");
}

#[test]
fn write_bw_rdma_cm_back_to_back() {
    pair(
        ServiceKind::WriteBwServer,
        ServiceKind::WriteBwClient,
        (false, false),
        200,
        65536,
        0,
        false,
    );
}

#[test]
fn read_bw_rdma_cm_back_to_back_with_crc() {
    pair(
        ServiceKind::ReadBwServer,
        ServiceKind::ReadBwClient,
        (true, false),
        100,
        65536,
        0,
        false,
    );
}

#[test]
fn send_bw_rdma_cm_back_to_back_needs_credits() {
    // 2000 SENDs with 512 receives: the client must wait for credits.
    pair(
        ServiceKind::SendBwServer,
        ServiceKind::SendBwClient,
        (false, true),
        2000,
        1024,
        0,
        false,
    );
}

#[test]
fn write_bw_rdma_cm_over_a_lossy_link() {
    pair(
        ServiceKind::WriteBwServer,
        ServiceKind::WriteBwClient,
        (true, true),
        50,
        16384,
        11,
        false,
    );
}

#[test]
fn send_bw_rdma_cm_client_started_first() {
    pair(
        ServiceKind::SendBwServer,
        ServiceKind::SendBwClient,
        (false, false),
        100,
        4096,
        0,
        true,
    );
}

#[test]
fn rdma_cm_is_refused_for_other_kinds() {
    let now = Instant::now();
    let mut a = host("a", MAC_A, IP_A, now);
    for kind in [ServiceKind::AtomicBwServer, ServiceKind::RpingServer] {
        let mut s = ServiceSpec::new(kind);
        s.rdma_cm = true;
        let e = a.start_service(s, now).unwrap_err().to_string();
        assert!(e.contains("rdma-cm"), "{e}");
    }
}
