//! IB CM MADs (`ib_cm::CmMad::parse`) and the CM state machine
//! (`ib_cm::CmManager`) fed with them.
//!
//! Input: one control byte, then MADs of up to 256 bytes (a length byte
//! each). Each MAD is parsed; whatever parses re-encodes to a MAD that
//! parses equal. Every MAD also goes to a manager that listens on rping's
//! service, accepts or rejects REQs by the control bits, has an active
//! connection of its own and advances time between MADs.
//!
//! Invariants: no panic; connections never exceed `max_connections`;
//! every MAD the manager emits is 256 bytes and parses; parse errors are
//! counted.
#![no_main]

use ib_cm::{
    ipv4_mapped_gid, service_id, CmConfig, CmEvent, CmMad, CmManager, ConnectParams, LocalQp,
    RDMA_PS_TCP,
};
use libfuzzer_sys::fuzz_target;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

const PEER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));

fn local(qpn: u32) -> LocalQp {
    LocalQp {
        qpn,
        starting_psn: 1,
        responder_resources: 4,
        initiator_depth: 4,
        rnr_retry_count: 7,
        private_data: vec![],
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, mut rest)) = data.split_first() else {
        return;
    };
    let cfg = CmConfig {
        max_connections: 4,
        max_pending_per_listener: 2,
        max_queued_mads: 8,
        max_queued_events: 8,
        ..CmConfig::default()
    };
    let max = cfg.max_connections;
    let mut m = CmManager::new(cfg, u32::from(ctl));
    m.listen(service_id(RDMA_PS_TCP, 7174)).unwrap();
    let start = Instant::now();
    let mut now = start;
    if ctl & 1 != 0 {
        let _ = m.connect(
            PEER,
            ConnectParams {
                service_id: service_id(RDMA_PS_TCP, 7471),
                local: local(0x11),
                path_mtu: 3,
                retry_count: 7,
                local_gid: ipv4_mapped_gid([10, 0, 0, 2]),
                remote_gid: ipv4_mapped_gid([10, 0, 0, 1]),
            },
            now,
        );
    }
    let mut errors = 0u64;
    let mut i = 0u32;
    while let Some((&len, tail)) = rest.split_first() {
        let n = usize::from(len).min(tail.len());
        // Short length bytes mean "a whole MAD".
        let n = if len < 8 { tail.len().min(256) } else { n };
        let (mad, next) = tail.split_at(n);
        rest = next;
        i += 1;
        if let Ok(p) = CmMad::parse(mad) {
            let wire = p.encode().expect("a parsed MAD encodes");
            assert_eq!(CmMad::parse(&wire).expect("re-parse"), p);
        }
        if m.handle_mad(PEER, mad, now).is_err() {
            errors += 1;
        }
        while let Some(e) = m.poll_event() {
            match e {
                CmEvent::ConnectRequest { conn, .. } => {
                    if (ctl >> 1) & 1 != 0 {
                        let _ = m.reject(conn, 28);
                    } else {
                        let _ = m.accept(conn, local(0x20 + i), now);
                    }
                }
                CmEvent::Established { conn, .. } if (ctl >> 2) & 1 != 0 => {
                    let _ = m.disconnect(conn, now);
                }
                _ => {}
            }
        }
        while let Some(out) = m.poll_transmit() {
            assert_eq!(out.mad.len(), 256);
            CmMad::parse(&out.mad).expect("our MADs parse");
        }
        assert!(m.connection_count() <= max);
        now += Duration::from_millis(u64::from(ctl >> 3) * 100);
        m.handle_timeout(now);
    }
    assert_eq!(m.counters().parse_errors, errors);
});
