//! Writes seed inputs for the `ib_cm` fuzz target (fuzz/corpus/ib_cm):
//! the MADs a peer sends during the handshakes of tests/manager.rs,
//! framed as the target reads them (control byte, then `0` + 256-byte MAD
//! each). Usage: `cargo run -p ib-cm --example cm_seeds -- DIR`.

#[path = "../tests/common/mod.rs"]
mod common;

use ib_cm::*;
use std::net::IpAddr;
use std::time::Instant;

const HOST: IpAddr = common::B;
const PEER: IpAddr = common::A;

fn local(qpn: u32) -> LocalQp {
    common::local(qpn, 0x4242)
}

fn params(port: u16) -> ConnectParams {
    common::cma_params(local(0x11), 41000, b"", port)
}

fn seed(ctl: u8, mads: &[[u8; MAD_LEN]]) -> Vec<u8> {
    let mut v = vec![ctl];
    for m in mads {
        v.push(0);
        v.extend_from_slice(m);
    }
    v
}

fn main() {
    let dir = std::env::args().nth(1).expect("usage: cm_seeds DIR");
    std::fs::create_dir_all(&dir).unwrap();
    let now = Instant::now();
    let mut seeds: Vec<(&str, Vec<u8>)> = Vec::new();

    // Passive lifecycle against the fuzz target's listener (port 7174):
    // REQ, RTU, DREQ from the peer; the target's manager uses seed = ctl.
    let ctl = 0u8;
    let mut host = CmManager::new(CmConfig::default(), u32::from(ctl));
    host.listen(service_id(RDMA_PS_TCP, 7174)).unwrap();
    let mut peer = CmManager::new(CmConfig::default(), 500);
    let pc = peer.connect(HOST, params(7174), now).unwrap();
    let req = peer.poll_transmit().unwrap().mad;
    host.handle_mad(PEER, &req, now).unwrap();
    let Some(CmEvent::ConnectRequest { conn, .. }) = host.poll_event() else {
        panic!("no REQ event")
    };
    host.accept(conn, local(0x21), now).unwrap();
    let rep = host.poll_transmit().unwrap().mad;
    peer.handle_mad(HOST, &rep, now).unwrap();
    let rtu = peer.poll_transmit().unwrap().mad;
    peer.disconnect(pc, now).unwrap();
    let dreq = peer.poll_transmit().unwrap().mad;
    seeds.push(("passive_req_rtu_dreq", seed(ctl, &[req, rtu, dreq])));
    seeds.push(("passive_req_twice", seed(ctl, &[req, req, rtu])));
    seeds.push(("passive_reject", seed(2, &[req])));
    // Unknown service.
    let mut other = CmManager::new(CmConfig::default(), 600);
    other.connect(HOST, params(9999), now).unwrap();
    let req_unknown = other.poll_transmit().unwrap().mad;
    seeds.push(("unknown_service", seed(0, &[req_unknown])));

    // Active side: the target's manager (ctl bit 0) connects to 7471 with
    // comm ID = ctl; answer with REP (from a peer CM), then DREQ.
    let ctl = 1u8;
    let mut active = CmManager::new(CmConfig::default(), u32::from(ctl));
    active.connect(PEER, params(7471), now).unwrap();
    let areq = active.poll_transmit().unwrap().mad;
    let mut server = CmManager::new(CmConfig::default(), 700);
    server.listen(service_id(RDMA_PS_TCP, 7471)).unwrap();
    server.handle_mad(HOST, &areq, now).unwrap();
    let Some(CmEvent::ConnectRequest { conn, .. }) = server.poll_event() else {
        panic!("no REQ event")
    };
    server.accept(conn, local(0x31), now).unwrap();
    let arep = server.poll_transmit().unwrap().mad;
    active.handle_mad(PEER, &arep, now).unwrap();
    let _rtu = active.poll_transmit().unwrap();
    while server.poll_event().is_some() {}
    server.disconnect(conn, now).unwrap();
    let sdreq = server.poll_transmit().unwrap().mad;
    seeds.push(("active_rep_dreq", seed(ctl | 4, &[arep, arep, sdreq])));
    // REJ of the active REQ, and an MRA.
    let mut rejecter = CmManager::new(CmConfig::default(), 800);
    rejecter.handle_mad(HOST, &areq, now).unwrap();
    let rej = rejecter.poll_transmit().unwrap().mad;
    seeds.push(("active_rej", seed(ctl, &[rej])));
    let mra = CmMad {
        tid: 1,
        msg: CmMessage::Mra(Mra {
            local_comm_id: 700,
            remote_comm_id: 1,
            message_mraed: 0,
            service_timeout: 20,
            private_data: vec![],
        }),
    }
    .encode()
    .unwrap();
    seeds.push(("active_mra_then_timeouts", seed(ctl | 0xf8, &[mra, rej])));
    let drep = CmMad {
        tid: 1,
        msg: CmMessage::Drep(Drep::default()),
    }
    .encode()
    .unwrap();
    let mut truncated = vec![0u8, 100];
    truncated.extend_from_slice(&req[..100]);
    seeds.push((
        "drep_and_truncated",
        [seed(0, &[drep]), truncated[1..].to_vec()].concat(),
    ));
    for (name, data) in seeds {
        std::fs::write(format!("{dir}/{name}"), data).unwrap();
    }
}
