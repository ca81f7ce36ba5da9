//! perftest `-R` over RoCE (rdma_cm with the IB CM, as an rxe guest runs
//! it) between two virtual hosts: our client against our server for
//! `ib_write_bw`, `ib_send_bw`, `ib_read_bw` and `ib_atomic_bw`, over a lossy link, a
//! client started before its server, and a second client refused while a
//! session runs. The guest end to end (the guest matrix's `vhost-rxe` cell) runs them
//! against the real tools.

mod common;

use common::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use virtual_host::{ServiceKind, ServiceSpec, VirtualHost};

fn spec(kind: ServiceKind, iters: u32, size: u32) -> ServiceSpec {
    let mut s = ServiceSpec::new(kind);
    s.rdma_cm = true;
    s.roce = true;
    s.size = size;
    s.iters = iters;
    s
}

fn pair(
    server: ServiceKind,
    client: ServiceKind,
    iters: u32,
    size: u32,
    drop_every: usize,
    client_first: bool,
) {
    let srv = spec(server, iters, size);
    let mut cli = spec(client, iters, size);
    cli.peer = Some(IP_A);
    let mut p = Pair::new();
    p.start((srv, cli), client_first, is_roce, |a, b| {
        // Nobody listens: the REQs are rejected for a while.
        assert_rejected_unknown_service(a);
        assert_waiting_for_server(b);
    });
    let (ea, eb) = p.run_to_finish(Duration::from_secs(300), drop_every, is_roce);
    // The client counts its completed operations, the server what arrived:
    // WRITE messages placed, READ requests answered, receives completed.
    assert_eq!(finished(&eb), Some((iters, 0)), "client {eb:?}");
    assert_eq!(finished(&ea), Some((iters, 0)), "server {ea:?}");
    settle(&mut p.a, &mut p.b, &mut p.now);
}

/// Both sides close; two CM connections a side (control, data), no bad
/// MADs, no QP or MR left, the server listens again.
fn settle(a: &mut VirtualHost, b: &mut VirtualHost, now: &mut Instant) {
    run_idle(a, b, now, Duration::from_secs(40), is_roce);
    let (ga, ca) = a.cm_counters();
    let (gb, cb) = b.cm_counters();
    assert_eq!((ca.established, cb.established), (2, 2), "{ca:?} {cb:?}");
    assert_eq!((ga.bad_mads, gb.bad_mads), (0, 0), "{ga:?} {gb:?}");
    let (sa, sb) = (a.status(), b.status());
    assert_eq!(sa.services[0].state, "listening");
    assert_eq!(sa.services[0].sessions_ok, 1);
    assert_eq!(sb.services[0].state, "done");
    assert_eq!((sa.qps, sb.qps), (0, 0), "QPs left");
    assert_eq!((sa.mrs, sb.mrs), (0, 0), "MRs left");
    assert_eq!((sa.tcp_sockets, sb.tcp_sockets), (0, 0), "no TCP over RoCE");
}

#[test]
fn write_bw_over_roce_back_to_back() {
    pair(
        ServiceKind::WriteBwServer,
        ServiceKind::WriteBwClient,
        200,
        65536,
        0,
        false,
    );
}

#[test]
fn read_bw_over_roce_back_to_back() {
    pair(
        ServiceKind::ReadBwServer,
        ServiceKind::ReadBwClient,
        100,
        65536,
        0,
        false,
    );
}

#[test]
fn send_bw_over_roce_more_sends_than_receives() {
    // 2000 SENDs with 512 receives and no credits over RoCE: the client
    // relies on RNR retry as perftest does.
    pair(
        ServiceKind::SendBwServer,
        ServiceKind::SendBwClient,
        2000,
        1024,
        0,
        false,
    );
}

#[test]
fn write_bw_over_roce_lossy_link() {
    // Every 7th RoCE frame (MADs included) is lost.
    pair(
        ServiceKind::WriteBwServer,
        ServiceKind::WriteBwClient,
        50,
        16384,
        7,
        false,
    );
}

#[test]
fn send_bw_over_roce_lossy_link() {
    pair(
        ServiceKind::SendBwServer,
        ServiceKind::SendBwClient,
        300,
        4096,
        13,
        false,
    );
}

#[test]
fn read_bw_over_roce_lossy_link() {
    pair(
        ServiceKind::ReadBwServer,
        ServiceKind::ReadBwClient,
        50,
        16384,
        11,
        false,
    );
}

#[test]
fn atomic_bw_over_roce_back_to_back() {
    pair(
        ServiceKind::AtomicBwServer,
        ServiceKind::AtomicBwClient,
        300,
        8,
        0,
        false,
    );
}

#[test]
fn atomic_bw_over_roce_lossy_link() {
    // Lost atomics and lost atomic ACKs: replayed from the responder's
    // cache, executed once (the server counts exactly `iters`).
    pair(
        ServiceKind::AtomicBwServer,
        ServiceKind::AtomicBwClient,
        100,
        8,
        9,
        false,
    );
}

#[test]
fn atomic_bw_rdma_cm_needs_roce() {
    let now = Instant::now();
    let mut a = host("a", MAC_A, IP_A, now);
    let mut s = spec(ServiceKind::AtomicBwServer, 10, 8);
    s.roce = false;
    let e = a.start_service(s, now).expect_err("iWARP atomics refused");
    assert!(e.to_string().contains("no atomics"), "{e}");
}

#[test]
fn write_bw_over_roce_client_started_first() {
    pair(
        ServiceKind::WriteBwServer,
        ServiceKind::WriteBwClient,
        100,
        4096,
        0,
        true,
    );
}

/// RTUs seen by [`second_rtu`].
static RTUS: AtomicUsize = AtomicUsize::new(0);

/// The second CM RTU on the link (the data connection's): a MAD (UDP 4791
/// to QP1) with attribute ID 0x0014.
fn second_rtu(f: &[u8]) -> bool {
    let mad = 14 + 20 + 8 + 12 + 8;
    let is_rtu = is_roce(f)
        && f.len() >= mad + 18
        && f[47..50] == [0, 0, 1]
        && f[mad + 16..mad + 18] == [0x00, 0x14];
    is_rtu && RTUS.fetch_add(1, Ordering::SeqCst) == 1
}

#[test]
fn read_bw_over_roce_data_rtu_lost() {
    // The client's RTU for the data connection is lost: its next control
    // item arrives before our data QP is established (and READ sends
    // nothing on the data QP until the keys are exchanged). The server
    // waits for the CM (REP resent, RTU resent) instead of failing.
    let mut now = Instant::now();
    let mut a = host("a", MAC_A, IP_A, now);
    let mut b = host("b", MAC_B, IP_B, now);
    a.start_service(spec(ServiceKind::ReadBwServer, 50, 4096), now)
        .unwrap();
    let mut cli = spec(ServiceKind::ReadBwClient, 50, 4096);
    cli.peer = Some(IP_A);
    b.start_service(cli, now).unwrap();
    let (ea, eb) = run(
        &mut a,
        &mut b,
        &mut now,
        Duration::from_secs(300),
        1,
        second_rtu,
        both_finished_or_failed,
    );
    assert!(RTUS.load(Ordering::SeqCst) >= 2, "no second RTU seen");
    assert_eq!(failed(&ea), None, "server events {ea:?}");
    assert_eq!(failed(&eb), None, "client events {eb:?}");
    assert_eq!(finished(&ea), Some((50, 0)), "server {ea:?}");
    assert_eq!(finished(&eb), Some((50, 0)), "client {eb:?}");
}

#[test]
fn roce_needs_rdma_cm() {
    let now = Instant::now();
    let mut a = host("a", MAC_A, IP_A, now);
    let mut s = ServiceSpec::new(ServiceKind::WriteBwServer);
    s.roce = true;
    let e = a.start_service(s, now).unwrap_err().to_string();
    assert!(e.contains("rdma-cm"), "{e}");
}
