//! CM state machines back to back: passive and active sides, loss,
//! duplicates, REJ, floods against the limits, disconnects, timeouts.

mod common;

use common::*;
use ib_cm::*;
use std::net::IpAddr;
use std::time::{Duration, Instant};

const PORT: u16 = 7174;

fn params(qpn: u32, psn: u32, port: u16) -> ConnectParams {
    cma_params(local(qpn, psn), 40000, b"app", port)
}

/// Moves MADs from `from` to `to` (peer address `src`), dropping those
/// for which `drop(n)` holds (n counts all MADs moved on this link).
fn pump(
    from: &mut CmManager,
    to: &mut CmManager,
    src: IpAddr,
    now: Instant,
    n: &mut u32,
    drop: &dyn Fn(u32) -> bool,
) -> usize {
    let mut moved = 0;
    while let Some(m) = from.poll_transmit() {
        *n += 1;
        if drop(*n) {
            continue;
        }
        to.handle_mad(src, &m.mad, now).unwrap();
        moved += 1;
    }
    moved
}

fn events(m: &mut CmManager) -> Vec<CmEvent> {
    std::iter::from_fn(|| m.poll_event()).collect()
}

/// Runs both managers until quiet; the passive side accepts every REQ
/// with QPN 0x22 / PSN 0x222. Returns all events of (active, passive).
fn run(
    a: &mut CmManager,
    b: &mut CmManager,
    start: Instant,
    drop_ab: &dyn Fn(u32) -> bool,
    drop_ba: &dyn Fn(u32) -> bool,
) -> (Vec<CmEvent>, Vec<CmEvent>) {
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    let (mut nab, mut nba) = (0, 0);
    let mut now = start;
    for _ in 0..200 {
        let moved = pump(a, b, A, now, &mut nab, drop_ab) + pump(b, a, B, now, &mut nba, drop_ba);
        for e in events(b) {
            if let CmEvent::ConnectRequest { conn, .. } = e {
                b.accept(conn, local(0x22, 0x222), now).unwrap();
            }
            eb.push(e);
        }
        ea.extend(events(a));
        if moved == 0 {
            match [a.poll_timeout(), b.poll_timeout()]
                .into_iter()
                .flatten()
                .min()
            {
                Some(t) => {
                    now = now.max(t);
                    a.handle_timeout(now);
                    b.handle_timeout(now);
                }
                None => break,
            }
        }
    }
    (ea, eb)
}

#[test]
fn passive_and_active_connect_and_disconnect() {
    let now = Instant::now();
    let mut a = CmManager::new(CmConfig::default(), 100);
    let mut b = CmManager::new(CmConfig::default(), 900);
    b.listen(service_id(RDMA_PS_TCP, PORT)).unwrap();
    let conn = a.connect(B, params(0x11, 0x111, PORT), now).unwrap();
    let (ea, eb) = run(&mut a, &mut b, now, &|_| false, &|_| false);
    let CmEvent::ConnectRequest {
        peer,
        service_id: sid,
        remote,
        ..
    } = &eb[0]
    else {
        panic!("{eb:?}")
    };
    assert_eq!((*peer, *sid), (A, service_id(RDMA_PS_TCP, PORT)));
    assert_eq!(
        (remote.qpn, remote.starting_psn, remote.path_mtu),
        (0x11, 0x111, 3)
    );
    let cma = CmaHeader::parse(&remote.private_data).unwrap();
    assert_eq!((cma.src, cma.dst, cma.src_port), (A, B, 40000));
    assert_eq!(&remote.private_data[36..39], b"app");
    assert!(matches!(&eb[1], CmEvent::Established { remote, .. } if remote.qpn == 0x11));
    let [CmEvent::Established { conn: c, remote }] = &ea[..] else {
        panic!("{ea:?}")
    };
    assert_eq!(*c, conn);
    assert_eq!((remote.qpn, remote.starting_psn), (0x22, 0x222));
    assert_eq!(
        (remote.responder_resources, remote.initiator_depth),
        (16, 16)
    );
    assert_eq!(a.counters().established, 1);
    assert_eq!(b.counters().established, 1);

    a.disconnect(conn, now).unwrap();
    let (ea, eb) = run(&mut a, &mut b, now, &|_| false, &|_| false);
    assert!(matches!(&ea[..], [CmEvent::Disconnected { conn: c }] if *c == conn));
    assert!(matches!(&eb[..], [CmEvent::Disconnected { .. }]));
    assert_eq!((a.connection_count(), b.connection_count()), (0, 0));
}

#[test]
fn lossy_link_recovers_every_message() {
    // Drop each of REQ, REP, RTU, DREQ, DREP once (first copy) and more.
    for (drop_ab, drop_ba) in [(1u32, 0u32), (0, 1), (2, 0), (1, 1), (3, 2)] {
        let now = Instant::now();
        let mut a = CmManager::new(CmConfig::default(), 1);
        let mut b = CmManager::new(CmConfig::default(), 2);
        b.listen(service_id(RDMA_PS_TCP, PORT)).unwrap();
        let conn = a.connect(B, params(0x11, 1, PORT), now).unwrap();
        let dab = move |n: u32| n == drop_ab;
        let dba = move |n: u32| n == drop_ba;
        let (ea, eb) = run(&mut a, &mut b, now, &dab, &dba);
        assert!(
            ea.iter().any(|e| matches!(e, CmEvent::Established { .. })),
            "drop {drop_ab}/{drop_ba}: {ea:?}"
        );
        assert!(
            eb.iter().any(|e| matches!(e, CmEvent::Established { .. })),
            "drop {drop_ab}/{drop_ba}: {eb:?}"
        );
        let connect_requests = eb
            .iter()
            .filter(|e| matches!(e, CmEvent::ConnectRequest { .. }))
            .count();
        assert_eq!(connect_requests, 1, "a resent REQ is not a new connection");
        a.disconnect(conn, now).unwrap();
        let (ea, _) = run(&mut a, &mut b, now, &dab, &dba);
        assert!(matches!(&ea[..], [CmEvent::Disconnected { .. }]), "{ea:?}");
        assert_eq!(b.connection_count(), 0);
    }
}

#[test]
fn lost_rtu_is_replaced_by_first_data() {
    let now = Instant::now();
    let mut a = CmManager::new(CmConfig::default(), 1);
    let mut b = CmManager::new(CmConfig::default(), 2);
    b.listen(service_id(RDMA_PS_TCP, PORT)).unwrap();
    a.connect(B, params(0x11, 1, PORT), now).unwrap();
    let (mut nab, mut nba) = (0, 0);
    pump(&mut a, &mut b, A, now, &mut nab, &|_| false);
    let CmEvent::ConnectRequest { conn, .. } = b.poll_event().unwrap() else {
        panic!()
    };
    b.accept(conn, local(0x22, 2), now).unwrap();
    pump(&mut b, &mut a, B, now, &mut nba, &|_| false);
    // The RTU is lost; the QP sees data: established without the RTU.
    assert!(a.poll_transmit().is_some());
    b.notify_established(conn);
    assert!(matches!(b.poll_event(), Some(CmEvent::Established { .. })));
    assert_eq!(b.poll_timeout(), None, "no more REP resends");
}

#[test]
fn unknown_service_gets_rej_and_counts() {
    let now = Instant::now();
    let mut a = CmManager::new(CmConfig::default(), 1);
    let mut b = CmManager::new(CmConfig::default(), 2);
    b.listen(service_id(RDMA_PS_TCP, PORT)).unwrap();
    let conn = a.connect(B, params(0x11, 1, PORT + 1), now).unwrap();
    let (ea, eb) = run(&mut a, &mut b, now, &|_| false, &|_| false);
    assert!(eb.is_empty());
    assert_eq!(
        ea,
        vec![CmEvent::Rejected {
            conn,
            reason: reject_reason::INVALID_SERVICE_ID
        }]
    );
    assert_eq!(b.counters().unknown_service, 1);
    assert_eq!(a.counters().rejects_received, 1);
    assert_eq!((a.connection_count(), b.connection_count()), (0, 0));
}

#[test]
fn rej_mid_handshake_and_consumer_reject() {
    let now = Instant::now();
    // The application rejects.
    let mut a = CmManager::new(CmConfig::default(), 1);
    let mut b = CmManager::new(CmConfig::default(), 2);
    b.listen(service_id(RDMA_PS_TCP, PORT)).unwrap();
    let conn = a.connect(B, params(0x11, 1, PORT), now).unwrap();
    let (mut nab, mut nba) = (0, 0);
    pump(&mut a, &mut b, A, now, &mut nab, &|_| false);
    let Some(CmEvent::ConnectRequest { conn: pc, .. }) = b.poll_event() else {
        panic!()
    };
    b.reject(pc, reject_reason::CONSUMER_DEFINED).unwrap();
    pump(&mut b, &mut a, B, now, &mut nba, &|_| false);
    assert_eq!(
        a.poll_event(),
        Some(CmEvent::Rejected {
            conn,
            reason: reject_reason::CONSUMER_DEFINED
        })
    );
    assert_eq!(b.connection_count(), 0);

    // The active side gives up after the REP (REJ instead of RTU): the
    // passive side drops its half-open connection.
    let conn = a.connect(B, params(0x12, 1, PORT), now).unwrap();
    pump(&mut a, &mut b, A, now, &mut nab, &|_| false);
    let Some(CmEvent::ConnectRequest { conn: pc, .. }) = b.poll_event() else {
        panic!()
    };
    b.accept(pc, local(0x23, 2), now).unwrap();
    a.disconnect(conn, now).unwrap(); // still in REQ sent: REJ
    let rej = a.poll_transmit().unwrap();
    b.handle_mad(A, &rej.mad, now).unwrap();
    assert!(matches!(b.poll_event(), Some(CmEvent::Rejected { conn: c, .. }) if c == pc));
    assert_eq!(b.connection_count(), 0);
    // The REP that crossed the REJ finds nothing and is counted stale.
    let stale = a.counters().stale;
    pump(&mut b, &mut a, B, now, &mut nba, &|_| false);
    assert_eq!(a.counters().stale, stale + 1);
    assert_eq!(a.poll_event(), None);
}

#[test]
fn req_flood_hits_the_pending_limit_and_host_keeps_serving() {
    let now = Instant::now();
    let cfg = CmConfig {
        max_pending_per_listener: 4,
        max_connections: 6,
        ..CmConfig::default()
    };
    let mut b = CmManager::new(cfg, 2);
    b.listen(service_id(RDMA_PS_TCP, PORT)).unwrap();
    let mut flooder = CmManager::new(CmConfig::default(), 5000);
    for i in 0..50 {
        flooder.connect(B, params(0x100 + i, 1, PORT), now).unwrap();
    }
    let mut n = 0;
    pump(&mut flooder, &mut b, A, now, &mut n, &|_| false);
    // Nobody accepts: 4 pending, 46 rejected with NO_RESOURCES.
    assert_eq!(b.connection_count(), 4);
    assert_eq!(b.counters().limit_rejects, 46);
    let mut m = 0;
    pump(&mut b, &mut flooder, B, now, &mut m, &|_| false);
    let rejected = events(&mut flooder)
        .into_iter()
        .filter(|e| {
            matches!(e, CmEvent::Rejected { reason, .. } if *reason == reject_reason::NO_RESOURCES)
        })
        .count();
    assert_eq!(rejected, 46);
    // Pending REQs time out (the accept timeout), then a good client connects.
    let later = now + Duration::from_secs(11);
    b.handle_timeout(later);
    assert_eq!(b.connection_count(), 0);
    assert_eq!(b.counters().timeouts, 4);
    let mut a = CmManager::new(CmConfig::default(), 1);
    while b.poll_event().is_some() {}
    while b.poll_transmit().is_some() {}
    a.connect(B, params(0x11, 1, PORT), later).unwrap();
    let (ea, _) = run(&mut a, &mut b, later, &|_| false, &|_| false);
    assert!(matches!(&ea[..], [CmEvent::Established { .. }]), "{ea:?}");
}

#[test]
fn silent_peer_times_out_after_retries() {
    let now = Instant::now();
    let cfg = CmConfig {
        max_retries: 3,
        ..CmConfig::default()
    };
    let mut a = CmManager::new(cfg.clone(), 1);
    let conn = a.connect(B, params(0x11, 1, PORT), now).unwrap();
    let mut sent = 0;
    let mut t = now;
    while let Some(d) = a.poll_timeout() {
        sent += std::iter::from_fn(|| a.poll_transmit()).count();
        t = d;
        a.handle_timeout(t);
    }
    sent += std::iter::from_fn(|| a.poll_transmit()).count();
    // REQ + 3 resends + the REJ(timeout).
    assert_eq!(sent, 5);
    assert_eq!(a.counters().retransmits, 3);
    assert_eq!(t - now, cfg.response_timeout * 4);
    assert_eq!(
        events(&mut a),
        vec![CmEvent::Failed {
            conn,
            failure: CmFailure::Timeout
        }]
    );
}

#[test]
fn mra_extends_the_wait_without_spending_retries() {
    let now = Instant::now();
    let mut a = CmManager::new(CmConfig::default(), 1);
    let conn = a.connect(B, params(0x11, 1, PORT), now).unwrap();
    let req = CmMad::parse(&a.poll_transmit().unwrap().mad).unwrap();
    let mra = CmMad {
        tid: req.tid,
        msg: CmMessage::Mra(Mra {
            local_comm_id: 77,
            remote_comm_id: conn.0,
            message_mraed: msg::MSG_REQ,
            service_timeout: 22, // ~17 s
            private_data: vec![],
        }),
    };
    a.handle_mad(B, &mra.encode().unwrap(), now).unwrap();
    assert!(a.poll_timeout().unwrap() >= now + Duration::from_secs(17));
    // An MRA from another address is stale and changes nothing.
    let before = a.poll_timeout();
    a.handle_mad(A, &mra.encode().unwrap(), now).unwrap();
    assert_eq!(a.poll_timeout(), before);
    assert_eq!(a.counters().stale, 1);
}

#[test]
fn garbage_and_unexpected_messages_never_break_state() {
    let now = Instant::now();
    let mut b = CmManager::new(CmConfig::default(), 2);
    b.listen(service_id(RDMA_PS_TCP, PORT)).unwrap();
    let mut seed = 0x1234_5678u32;
    for i in 0..5000u32 {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        let len = (seed % 300) as usize;
        let mut buf: Vec<u8> = (0..len)
            .map(|k| (seed.rotate_left(k as u32) ^ k as u32) as u8)
            .collect();
        if buf.len() >= 24 && i % 2 == 0 {
            buf[..4].copy_from_slice(&[1, 7, 2, 3]);
            buf[16] = 0;
            buf[17] = 0x10 + (seed % 8) as u8;
        }
        let _ = b.handle_mad(A, &buf, now);
        for e in events(&mut b) {
            if let CmEvent::ConnectRequest { conn, .. } = e {
                let _ = b.accept(conn, local(0x22, 2), now);
            }
        }
        while b.poll_transmit().is_some() {}
    }
    assert!(b.counters().parse_errors > 1000);
    assert!(b.connection_count() <= CmConfig::default().max_connections);
    // Still serves.
    let mut a = CmManager::new(CmConfig::default(), 1);
    let later = now + Duration::from_secs(60);
    b.handle_timeout(later);
    while b.poll_transmit().is_some() {}
    a.connect(B, params(0x11, 1, PORT), later).unwrap();
    let (ea, _) = run(&mut a, &mut b, later, &|_| false, &|_| false);
    assert!(
        ea.iter().any(|e| matches!(e, CmEvent::Established { .. })),
        "{ea:?}"
    );
}

#[test]
fn dreq_for_unknown_connection_still_gets_drep() {
    let now = Instant::now();
    let mut b = CmManager::new(CmConfig::default(), 2);
    let dreq = CmMad {
        tid: 9,
        msg: CmMessage::Dreq(Dreq {
            local_comm_id: 5,
            remote_comm_id: 6,
            remote_qpn: 0x22,
            private_data: vec![],
        }),
    };
    b.handle_mad(A, &dreq.encode().unwrap(), now).unwrap();
    let out = CmMad::parse(&b.poll_transmit().unwrap().mad).unwrap();
    assert_eq!(out.tid, 9);
    assert!(matches!(
        out.msg,
        CmMessage::Drep(Drep {
            remote_comm_id: 5,
            ..
        })
    ));
    assert_eq!(b.poll_event(), None);
}
