//! The RC engine (`QueuePair::handle_bytes` -> requester/responder/completer)
//! driven by an arbitrary program on a QP in RTS.
//!
//! Operations: feed a packet (optionally forced onto this QP / the RC
//! transport, and with RETH/AtomicETH keys pointed at the registered region),
//! post SEND / WRITE / READ / atomic work requests, post receives, advance
//! time, drain transmissions and completions.
//!
//! Invariants: no panic; every packet the engine emits parses with
//! `RocePacket::parse`, is RC and goes to the peer QP; completions never
//! outnumber posted work requests; handled packets are counted.
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use roce_model::{
    Access, HeaderSet, Memory, QpAttr, QpCaps, QueuePair, RecvWr, RocePacket, SendOp, SendWr, Sge,
    Transport,
};

const QPN: u32 = 0x11;
const PEER: u32 = 0x22;
const IOVA: u64 = 0x10_000;
const LEN: usize = 8192;

fn run(u: &mut Unstructured<'_>) -> Result<()> {
    let mut mem = Memory::new(u.arbitrary::<u8>()? as u64);
    let pd = mem.alloc_pd();
    let keys = mem
        .register(pd, IOVA, vec![0u8; LEN], Access::ALL)
        .expect("register");
    let mut qp = QueuePair::new(
        QPN,
        pd,
        QpCaps {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_sge: 4,
            ..QpCaps::default()
        },
    );
    let attr = QpAttr {
        dest_qpn: PEER,
        sq_psn: 0,
        rq_psn: 0,
        ..QpAttr::default()
    };
    qp.connect(&attr).expect("connect");
    let start = Instant::now();
    let mut now = start;
    let mut posted = 0u64;
    let mut completed = 0u64;
    let mut rx_ok_calls = 0u64;

    for _ in 0..64 {
        if u.is_empty() {
            break;
        }
        match u.int_in_range(0u8..=6)? {
            0 | 1 => {
                let flags: u8 = u.arbitrary()?;
                let len = u.int_in_range(12usize..=1200)?;
                let mut pkt = u.bytes(len)?.to_vec();
                if pkt.len() < 12 {
                    continue;
                }
                if flags & 1 != 0 {
                    pkt[0] &= 0x1f; // RC transport
                }
                if flags & 2 != 0 {
                    pkt[5..8].copy_from_slice(&QPN.to_be_bytes()[1..]);
                }
                if flags & 4 != 0 {
                    pkt[1] &= 0xcf; // TVer 0
                }
                if flags & 8 != 0 {
                    // RETH / AtomicETH right after the BTH for RC: VA then rkey.
                    if let Ok(p) = RocePacket::parse(&pkt) {
                        let h = p.info().headers;
                        if (h.contains(HeaderSet::RETH) || h.contains(HeaderSet::ATOMIC_ETH))
                            && pkt.len() >= 24
                        {
                            let off = u64::from(flags >> 4) * 8;
                            pkt[12..20].copy_from_slice(&(IOVA + off).to_be_bytes());
                            pkt[20..24].copy_from_slice(&keys.rkey.to_be_bytes());
                        }
                    }
                }
                let rx_before = qp.stats().rx_packets;
                let parsed = RocePacket::parse(&pkt);
                let r = qp.handle_bytes(&pkt, now, &mut mem);
                if let Ok(p) = parsed {
                    if p.bth.dest_qp == QPN && p.bth.opcode.transport() == Transport::Rc {
                        assert_eq!(qp.stats().rx_packets, rx_before + 1, "rx not counted");
                    }
                } else {
                    assert!(r.is_err(), "unparseable packet accepted");
                }
                if r.is_ok() {
                    rx_ok_calls += 1;
                }
            }
            2 => {
                let off = u.int_in_range(0u64..=LEN as u64)?;
                let len = u.int_in_range(0u32..=4096)?;
                let len = len.min((LEN as u64 - off) as u32);
                let sge = Sge::new(IOVA + off, len, keys.lkey);
                let op = match u.int_in_range(0u8..=6)? {
                    0 => SendOp::Send,
                    1 => SendOp::SendWithImm {
                        imm: u.arbitrary()?,
                    },
                    2 => SendOp::RdmaWrite {
                        remote_addr: u.arbitrary()?,
                        rkey: u.arbitrary()?,
                    },
                    3 => SendOp::RdmaWriteWithImm {
                        remote_addr: u.arbitrary()?,
                        rkey: u.arbitrary()?,
                        imm: u.arbitrary()?,
                    },
                    4 => SendOp::RdmaRead {
                        remote_addr: u.arbitrary()?,
                        rkey: u.arbitrary()?,
                    },
                    5 => SendOp::SendWithInv {
                        rkey: u.arbitrary()?,
                    },
                    _ => SendOp::Send,
                };
                let sg = if u.arbitrary()? { vec![sge] } else { vec![] };
                if qp.post_send(SendWr::new(posted, op, sg)).is_ok() {
                    posted += 1;
                }
            }
            3 => {
                let off = u.int_in_range(0u64..=LEN as u64)?;
                let len = (u.int_in_range(0u32..=4096)?).min((LEN as u64 - off) as u32);
                if qp
                    .post_recv(RecvWr::new(
                        posted,
                        vec![Sge::new(IOVA + off, len, keys.lkey)],
                    ))
                    .is_ok()
                {
                    posted += 1;
                }
            }
            4 => {
                now += Duration::from_micros(u.int_in_range(0u64..=2_000_000)?);
                if let Some(t) = qp.poll_timeout() {
                    if t <= now {
                        qp.handle_timeout(now);
                    }
                }
            }
            _ => {}
        }
        // Drain transmissions (bounded) and completions.
        for _ in 0..256 {
            let Some(out) = qp.poll_transmit(now, &mem) else {
                break;
            };
            let p = RocePacket::parse(&out)
                .unwrap_or_else(|e| panic!("engine emitted an unparseable packet: {e}"));
            assert_eq!(p.bth.dest_qp, PEER, "emitted to the wrong QP");
            assert_eq!(p.bth.opcode.transport(), Transport::Rc);
        }
        while qp.poll_completion().is_some() {
            completed += 1;
        }
        assert!(
            completed <= posted,
            "{completed} completions for {posted} WRs"
        );
    }
    let _ = rx_ok_calls;
    let _ = qp.is_idle();
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});
