//! Helpers shared by the ib-cm tests and the `cm_seeds` example (which
//! includes this file by path, so that its seeds are the handshakes the
//! tests run).
#![allow(dead_code)]

use ib_cm::*;
use std::net::{IpAddr, Ipv4Addr};

/// The active side's address (the CMA header's source).
pub const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
/// The passive side's address.
pub const B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));

/// Our QP: 16 responder resources and initiator depth, RNR retry 7.
pub fn local(qpn: u32, psn: u32) -> LocalQp {
    LocalQp {
        qpn,
        starting_psn: psn,
        responder_resources: 16,
        initiator_depth: 16,
        rnr_retry_count: 7,
        private_data: Vec::new(),
    }
}

/// rdma_cm connect parameters from `A:src_port` to `B:port` for `l`, whose
/// private data is the CMA header followed by `app`.
pub fn cma_params(mut l: LocalQp, src_port: u16, app: &[u8], port: u16) -> ConnectParams {
    let cma = CmaHeader {
        src: A,
        src_port,
        dst: B,
    };
    l.private_data = cma.to_private_data(app).unwrap();
    ConnectParams {
        service_id: service_id(RDMA_PS_TCP, port),
        local: l,
        path_mtu: 3,
        retry_count: 7,
        local_gid: ipv4_mapped_gid([10, 0, 0, 1]),
        remote_gid: ipv4_mapped_gid([10, 0, 0, 2]),
    }
}
