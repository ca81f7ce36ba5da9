//! Frame builders for the checker tests (RoCE frames come from
//! `roce-model`'s builder, so their ICRCs are right unless a test breaks
//! them; MPA/DDP bytes come from `siw`'s codec).
#![allow(dead_code)]

use roce_model::{
    Aeth, AethSyndrome, FrameBuilder, NakCode, NetParams, Opcode, PacketBuilder, Reth,
};
use wire_checker::{Checker, Finding, Rule};

pub const A: [u8; 4] = [10, 0, 0, 1];
pub const B: [u8; 4] = [10, 0, 0, 2];
/// QPN of A's queue pair (B's packets go to it) and of B's.
pub const QA: u32 = 0x11;
pub const QB: u32 = 0x12;

pub fn builder(src: [u8; 4], dst: [u8; 4]) -> FrameBuilder {
    FrameBuilder {
        dst_mac: [2, 0, 0, 0, 0, dst[3]],
        src_mac: [2, 0, 0, 0, 0, src[3]],
        vlan_tci: None,
        net: NetParams::Ipv4 {
            src,
            dst,
            tos: 0,
            ttl: 64,
            ident: 0,
            udp_src_port: 0xc000 | u16::from(src[3]),
        },
    }
}

/// A frame from A to B (QP QB) with a correct ICRC.
pub fn a2b(p: PacketBuilder<'_>) -> Vec<u8> {
    builder(A, B).build(&p).unwrap()
}

/// A frame from B to A (QP QA) with a correct ICRC.
pub fn b2a(p: PacketBuilder<'_>) -> Vec<u8> {
    builder(B, A).build(&p).unwrap()
}

pub fn send_only(psn: u32, payload: &[u8]) -> Vec<u8> {
    a2b(PacketBuilder::new(Opcode::RcSendOnly, QB, psn)
        .ack_req(true)
        .payload(payload))
}

pub fn ack(psn: u32, msn: u32) -> Vec<u8> {
    b2a(
        PacketBuilder::new(Opcode::RcAcknowledge, QA, psn).aeth(Aeth {
            syndrome: AethSyndrome::Ack { credits: 31 },
            msn,
        }),
    )
}

pub fn nak(psn: u32, msn: u32, code: NakCode) -> Vec<u8> {
    b2a(
        PacketBuilder::new(Opcode::RcAcknowledge, QA, psn).aeth(Aeth {
            syndrome: AethSyndrome::Nak { code },
            msn,
        }),
    )
}

pub fn rnr(psn: u32, msn: u32) -> Vec<u8> {
    b2a(
        PacketBuilder::new(Opcode::RcAcknowledge, QA, psn).aeth(Aeth {
            syndrome: AethSyndrome::RnrNak { timer: 1 },
            msn,
        }),
    )
}

pub fn reth(len: u32) -> Reth {
    Reth {
        va: 0x1000,
        rkey: 0x77,
        len,
    }
}

/// Breaks the ICRC of a frame (last 4 bytes).
pub fn break_icrc(mut f: Vec<u8>) -> Vec<u8> {
    let n = f.len();
    f[n - 1] ^= 0x5a;
    f
}

/// Feeds frames at 1 µs steps on port `p0`.
pub fn feed(c: &mut Checker, frames: &[Vec<u8>]) {
    for (i, f) in frames.iter().enumerate() {
        c.observe(i as u64 * 1000, "p0", f);
    }
}

pub fn rules(f: &[Finding]) -> Vec<Rule> {
    f.iter().map(|f| f.rule).collect()
}

/// Ethernet + IPv4 + TCP from `wire`'s builder with sequence number `seq`
/// (the TCP checksum is left 0: the checker does not verify it).
pub fn tcp(src: ([u8; 4], u16), dst: ([u8; 4], u16), seq: u32, payload: &[u8]) -> Vec<u8> {
    let mut b = wire::builder::FrameBuilder::tcp(src.0.into(), src.1, dst.0.into(), dst.1);
    b.dst_mac = [2, 0, 0, 0, 0, dst.0[3]];
    b.src_mac = [2, 0, 0, 0, 0, src.0[3]];
    let mut f = b.build(payload);
    // Ethernet (14) + IPv4 without options (20), then ports (4): the sequence number.
    f[38..42].copy_from_slice(&seq.to_be_bytes());
    f
}

/// One direction of a TCP connection: hands out segments with running
/// sequence numbers.
pub struct Stream {
    pub src: ([u8; 4], u16),
    pub dst: ([u8; 4], u16),
    pub seq: u32,
}

impl Stream {
    pub fn new(src: ([u8; 4], u16), dst: ([u8; 4], u16), seq: u32) -> Self {
        Stream { src, dst, seq }
    }
    pub fn seg(&mut self, payload: &[u8]) -> Vec<u8> {
        let f = tcp(self.src, self.dst, self.seq, payload);
        self.seq = self.seq.wrapping_add(payload.len() as u32);
        f
    }
}
