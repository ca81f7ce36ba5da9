//! rping and ucmatose over RoCE between two virtual hosts: IB CM MADs on
//! QP1 (REQ/REP/RTU, DREQ/DREP) set up RC QPs; both roles, lossy links,
//! a client started before its server, and hostile CM input.

mod common;

use common::*;
use ib_cm::{service_id, CmMad, CmMessage, Req, GSI_QKEY, MAD_LEN, RDMA_PS_TCP};
use roce_model::{Deth, FrameBuilder, NetParams, Opcode, PacketBuilder};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};
use virtual_host::{ServiceKind, ServiceSpec, VirtualHost};

fn pair(
    server: ServiceKind,
    client: ServiceKind,
    iters: u32,
    size: u32,
    drop_every: usize,
    client_first: bool,
) {
    let mut srv = ServiceSpec::new(server);
    srv.iters = iters;
    srv.size = size;
    let mut cli = client_spec(client, iters);
    cli.size = size;
    let mut p = Pair::new();
    // Nobody listens: the REQs are rejected for a while.
    p.start((srv, cli), client_first, is_roce, |a, _| {
        assert_rejected_unknown_service(a)
    });
    let (ea, eb) = p.run_to_finish(Duration::from_secs(120), drop_every, is_roce);
    assert_eq!(finished(&ea), Some((iters, iters)), "server {ea:?}");
    assert_eq!(finished(&eb), Some((iters, iters)), "client {eb:?}");
    // The CM saw one connection on each side, and it ended with DREQ/DREP.
    run_idle(
        &mut p.a,
        &mut p.b,
        &mut p.now,
        Duration::from_secs(10),
        is_roce,
    );
    let (ga, ca) = p.a.cm_counters();
    let (gb, cb) = p.b.cm_counters();
    assert_eq!((ca.established, cb.established), (1, 1), "{ca:?} {cb:?}");
    assert!(ga.mads_rx >= 2 && gb.mads_rx >= 2, "{ga:?} {gb:?}");
    assert_eq!((ga.bad_mads, gb.bad_mads, ga.bad_qkey), (0, 0, 0));
    assert_eq!(p.a.status().services[0].state, "listening");
    assert_eq!(p.b.status().services[0].state, "done");
    assert_eq!(p.a.status().qps, 0, "the server's QP is gone");
    assert_eq!(p.b.status().qps, 0, "the client's QP is gone");
}

#[test]
fn rping_over_roce_back_to_back() {
    pair(
        ServiceKind::RpingServerRoce,
        ServiceKind::RpingClientRoce,
        10,
        64,
        0,
        false,
    );
}

#[test]
fn rping_over_roce_big_buffers_lossy_link() {
    // Every 7th RoCE frame (MADs included) is lost.
    pair(
        ServiceKind::RpingServerRoce,
        ServiceKind::RpingClientRoce,
        20,
        65535,
        7,
        false,
    );
}

#[test]
fn rping_over_roce_client_before_server() {
    pair(
        ServiceKind::RpingServerRoce,
        ServiceKind::RpingClientRoce,
        5,
        64,
        0,
        true,
    );
}

#[test]
fn ucmatose_over_roce_back_to_back() {
    pair(
        ServiceKind::UcmatoseServerRoce,
        ServiceKind::UcmatoseClientRoce,
        20,
        100,
        0,
        false,
    );
}

#[test]
fn ucmatose_over_roce_lossy_link() {
    pair(
        ServiceKind::UcmatoseServerRoce,
        ServiceKind::UcmatoseClientRoce,
        50,
        1000,
        5,
        false,
    );
}

/// A UD SEND to `host`'s QP1 from a fake peer at `ip`, carrying `mad`.
fn gsi_frame(ip: Ipv4Addr, mac: [u8; 6], qkey: u32, mad: &[u8]) -> Vec<u8> {
    let pkt = PacketBuilder::new(Opcode::UdSendOnly, 1, 7)
        .deth(Deth { qkey, src_qp: 1 })
        .payload(mad);
    FrameBuilder {
        dst_mac: MAC_A,
        src_mac: mac,
        vlan_tci: None,
        net: NetParams::Ipv4 {
            src: ip.octets(),
            dst: IP_A.octets(),
            tos: 0,
            ttl: 64,
            ident: 0,
            udp_src_port: 0xc123,
        },
    }
    .build(&pkt)
    .unwrap()
}

fn req(comm_id: u32, port: u16) -> [u8; MAD_LEN] {
    CmMad {
        tid: u64::from(comm_id),
        msg: CmMessage::Req(Box::new(Req {
            local_comm_id: comm_id,
            service_id: service_id(RDMA_PS_TCP, port),
            local_qpn: 0x40 + comm_id,
            starting_psn: 1,
            responder_resources: 1,
            initiator_depth: 1,
            path_mtu: 3,
            retry_count: 7,
            rnr_retry_count: 7,
            remote_cm_response_timeout: 20,
            local_cm_response_timeout: 20,
            pkey: 0xffff,
            ..Req::default()
        })),
    }
    .encode()
    .unwrap()
}

/// The address of a hostile CM peer.
const PEER: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 66);
const PMAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x66];

/// Host A with an rping server over RoCE, started at `now`.
fn rping_roce_server(now: Instant) -> VirtualHost {
    let mut a = host("a", MAC_A, IP_A, now);
    a.start_service(ServiceSpec::new(ServiceKind::RpingServerRoce), now)
        .unwrap();
    a
}

/// rping client on `b` against `a`'s server: proves `a` still serves.
fn still_serves(a: &mut VirtualHost, now: &mut Instant) {
    let cli = client_spec(ServiceKind::RpingClientRoce, 3);
    let (_, eb) = run_client(a, now, cli, Duration::from_secs(120), is_roce, client_ended);
    assert_eq!(finished(&eb), Some((3, 3)), "{eb:?}");
}

#[test]
fn hostile_cm_input_is_counted_and_the_host_keeps_serving() {
    let mut now = Instant::now();
    let mut a = rping_roce_server(now);
    // Truncated MADs, unknown attributes, wrong class, wrong Q_Key, not a UD SEND.
    let good = req(1, 7174);
    a.handle_frame(&gsi_frame(PEER, PMAC, GSI_QKEY, &good[..100]), now);
    let mut unknown_attr = good;
    unknown_attr[16..18].copy_from_slice(&0x0019u16.to_be_bytes()); // LAP
    a.handle_frame(&gsi_frame(PEER, PMAC, GSI_QKEY, &unknown_attr), now);
    let mut not_cm = good;
    not_cm[1] = 0x81;
    a.handle_frame(&gsi_frame(PEER, PMAC, GSI_QKEY, &not_cm), now);
    a.handle_frame(&gsi_frame(PEER, PMAC, 0x1234, &good), now);
    let (g, c) = a.cm_counters();
    assert_eq!(g.bad_mads, 3, "{g:?}");
    assert_eq!(c.parse_errors, 3, "{c:?}");
    assert_eq!(g.bad_qkey, 1, "{g:?}");
    assert!(
        drain(&mut a).iter().all(|f| !is_roce(f)),
        "nothing answered"
    );
    // A REQ for a port nobody listens on gets a REJ.
    a.handle_frame(&gsi_frame(PEER, PMAC, GSI_QKEY, &req(2, 9999)), now);
    let out: Vec<_> = drain(&mut a).into_iter().filter(|f| is_roce(f)).collect();
    assert_eq!(out.len(), 1);
    let rej = CmMad::parse(&out[0][14 + 20 + 8 + 12 + 8..][..MAD_LEN]).unwrap();
    assert!(
        matches!(rej.msg, CmMessage::Rej(ref r) if r.reason == ib_cm::reject_reason::INVALID_SERVICE_ID),
        "{rej:?}"
    );
    assert_eq!(a.cm_counters().1.unknown_service, 1);
    // A flood of REQs: one is accepted (the service serves one client at a
    // time, the rest are refused by the service or the CM's pending limit).
    for id in 100..400 {
        a.handle_frame(&gsi_frame(PEER, PMAC, GSI_QKEY, &req(id, 7174)), now);
    }
    let rejects = drain(&mut a)
        .into_iter()
        .filter(|f| is_roce(f))
        .filter_map(|f| CmMad::parse(&f[14 + 20 + 8 + 12 + 8..]).ok())
        .filter(|m| matches!(m.msg, CmMessage::Rej(_)))
        .count();
    assert_eq!(rejects, 299, "every REQ but one is rejected");
    assert!(a.status().qps <= 1);
    // Every refusal is a REJ, counted.
    assert_eq!(
        a.cm_counters().1.rejects_sent,
        1 + 299,
        "{:?}",
        a.cm_counters()
    );
    // The half-open connection (the fake peer never sends RTU) times out,
    // the REP resends are bounded, and a real client is served.
    run(
        &mut a,
        &mut host("idle", MAC_B, IP_B, now),
        &mut now,
        Duration::from_secs(30),
        0,
        is_roce,
        |_, _| false,
    );
    assert_eq!(a.status().qps, 0, "{:?}", a.status());
    assert!(a.cm_counters().1.timeouts >= 1);
    still_serves(&mut a, &mut now);
}

#[test]
fn rej_mid_handshake_frees_the_session() {
    let mut now = Instant::now();
    let mut a = rping_roce_server(now);
    a.handle_frame(&gsi_frame(PEER, PMAC, GSI_QKEY, &req(5, 7174)), now);
    let rep = drain(&mut a)
        .into_iter()
        .filter(|f| is_roce(f))
        .find_map(|f| CmMad::parse(&f[14 + 20 + 8 + 12 + 8..]).ok())
        .unwrap();
    let CmMessage::Rep(rep_msg) = &rep.msg else {
        panic!("{rep:?}")
    };
    assert_eq!(a.status().qps, 1);
    // The peer rejects our REP instead of sending the RTU.
    let rej = CmMad {
        tid: rep.tid,
        msg: CmMessage::Rej(ib_cm::Rej {
            local_comm_id: 5,
            remote_comm_id: rep_msg.local_comm_id,
            message_rejected: 1,
            reason: ib_cm::reject_reason::CONSUMER_DEFINED,
            ..ib_cm::Rej::default()
        }),
    }
    .encode()
    .unwrap();
    a.handle_frame(&gsi_frame(PEER, PMAC, GSI_QKEY, &rej), now);
    now += Duration::from_secs(3);
    a.handle_timeout(now);
    assert_eq!(a.status().services[0].sessions_failed, 1);
    assert_eq!(a.status().services[0].state, "listening");
    assert_eq!(a.cm_counters().1.rejects_received, 1);
    still_serves(&mut a, &mut now);
}

/// The PSN direction rxe uses: a CM starting PSN is what its sender
/// receives. A Linux-like active peer announces PSN 0x123456 in its REQ and
/// sends from the PSN our REP announces; our server must accept that SEND
/// and issue its RDMA READ with PSN 0x123456.
#[test]
fn starting_psns_follow_linux() {
    let now = Instant::now();
    let mut a = rping_roce_server(now);
    let mut r = CmMad::parse(&req(9, 7174)).unwrap();
    let CmMessage::Req(q) = &mut r.msg else {
        unreachable!()
    };
    q.starting_psn = 0x12_3456;
    let peer_qpn = q.local_qpn;
    a.handle_frame(&gsi_frame(PEER, PMAC, GSI_QKEY, &r.encode().unwrap()), now);
    let rep = drain(&mut a)
        .into_iter()
        .filter(|f| is_roce(f))
        .find_map(|f| CmMad::parse(&f[14 + 20 + 8 + 12 + 8..]).ok())
        .unwrap();
    let CmMessage::Rep(rep_msg) = rep.msg else {
        panic!("{rep:?}")
    };
    let rtu = CmMad {
        tid: rep.tid,
        msg: CmMessage::Rtu(ib_cm::Rtu {
            local_comm_id: 9,
            remote_comm_id: rep_msg.local_comm_id,
            private_data: vec![],
        }),
    };
    a.handle_frame(
        &gsi_frame(PEER, PMAC, GSI_QKEY, &rtu.encode().unwrap()),
        now,
    );
    // rping's first SEND: {addr, rkey, len} of the client's buffer.
    let mut info = Vec::new();
    info.extend_from_slice(&0x5000u64.to_be_bytes());
    info.extend_from_slice(&0x77u32.to_be_bytes());
    info.extend_from_slice(&64u32.to_be_bytes());
    let send = PacketBuilder::new(Opcode::RcSendOnly, rep_msg.local_qpn, rep_msg.starting_psn)
        .ack_req(true)
        .payload(&info);
    let frame = FrameBuilder {
        dst_mac: MAC_A,
        src_mac: PMAC,
        vlan_tci: None,
        net: NetParams::Ipv4 {
            src: PEER.octets(),
            dst: IP_A.octets(),
            tos: 0,
            ttl: 64,
            ident: 1,
            udp_src_port: 0xc001,
        },
    }
    .build(&send)
    .unwrap();
    a.handle_frame(&frame, now);
    let out: Vec<_> = drain(&mut a).into_iter().filter(|f| is_roce(f)).collect();
    let pkts: Vec<_> = out
        .iter()
        .map(|f| roce_model::RocePacket::parse(&f[42..]).unwrap().bth)
        .collect();
    assert!(
        pkts.iter()
            .any(|b| b.opcode == Opcode::RcAcknowledge && b.psn == rep_msg.starting_psn),
        "our SEND is acknowledged at its own PSN: {pkts:?}"
    );
    assert!(
        pkts.iter().any(|b| b.opcode == Opcode::RcReadRequest
            && b.psn == 0x12_3456
            && b.dest_qp == peer_qpn),
        "the READ uses the REQ's starting PSN: {pkts:?}"
    );
}
