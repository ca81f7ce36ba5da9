//! SMC: CLC handshakes over TCP, LLC and CDC messages on the RoCE link.

mod common;

use common::*;
use roce_model::{Opcode, PacketBuilder};
use wire_checker::smc::ClcState;
use wire_checker::{Checker, Rule};

const CL: ([u8; 4], u16) = (A, 50000);
const SV: ([u8; 4], u16) = (B, 12345);
const SMCR: [u8; 4] = [0xe2, 0xd4, 0xc3, 0xd9];

/// A CLC message of `len` bytes: header, zero body, trailer; `f` edits the body.
fn clc(kind: u8, len: usize, f: impl FnOnce(&mut [u8])) -> Vec<u8> {
    let mut m = vec![0u8; len];
    m[..4].copy_from_slice(&SMCR);
    m[4] = kind;
    m[5..7].copy_from_slice(&(len as u16).to_be_bytes());
    m[7] = 0x10; // version 1, SMC-R
    m[len - 4..].copy_from_slice(&SMCR);
    f(&mut m);
    m
}

fn qpn_at_38(q: u32) -> impl FnOnce(&mut [u8]) {
    move |m: &mut [u8]| m[38..41].copy_from_slice(&q.to_be_bytes()[1..])
}

fn handshake(c: &mut Checker) {
    let mut cl = Stream::new(CL, SV, 100);
    let mut sv = Stream::new(SV, CL, 900);
    c.observe(0, "p0", &cl.seg(&clc(1, 52, |_| {})));
    c.observe(1, "p1", &sv.seg(&clc(2, 68, qpn_at_38(QB))));
    c.observe(2, "p0", &cl.seg(&clc(3, 68, qpn_at_38(QA))));
}

fn llc(kind: u8) -> Vec<u8> {
    let mut m = vec![0u8; 44];
    m[0] = kind;
    m[1] = 44;
    m
}

fn cdc(seq: u16, token: u32, prod: (u16, u32), cons: (u16, u32)) -> Vec<u8> {
    let mut m = vec![0u8; 44];
    m[0] = 0xfe;
    m[1] = 44;
    m[2..4].copy_from_slice(&seq.to_be_bytes());
    m[4..8].copy_from_slice(&token.to_be_bytes());
    m[10..12].copy_from_slice(&prod.0.to_be_bytes());
    m[12..16].copy_from_slice(&prod.1.to_be_bytes());
    m[18..20].copy_from_slice(&cons.0.to_be_bytes());
    m[20..24].copy_from_slice(&cons.1.to_be_bytes());
    m
}

fn link_send(psn: u32, m: &[u8]) -> Vec<u8> {
    a2b(PacketBuilder::new(Opcode::RcSendOnly, QB, psn).payload(m))
}

#[test]
fn clean_handshake_and_link_traffic() {
    let mut c = Checker::default();
    handshake(&mut c);
    let frames = [
        link_send(0, &llc(0x01)),
        link_send(1, &llc(0x07)),
        link_send(2, &cdc(1, 0x55, (0, 100), (0, 0))),
        link_send(3, &cdc(2, 0x55, (0, 16000), (0, 50))),
        // The producer cursor wraps.
        link_send(4, &cdc(3, 0x55, (1, 10), (0, 60))),
        link_send(5, &cdc(1, 0x66, (0, 1), (0, 0))),
        ack(5, 6),
    ];
    for (i, f) in frames.iter().enumerate() {
        c.observe(10 + i as u64, "p0", f);
    }
    assert_eq!(c.findings(), vec![]);
    let v = c.flows();
    assert_eq!(v.smc.len(), 1);
    assert_eq!(v.smc[0].state, ClcState::Confirmed);
    assert_eq!(
        (v.smc[0].server_qpn, v.smc[0].client_qpn),
        (Some(QB), Some(QA))
    );
    let smc = v.roce[0].halves[0]
        .smc
        .as_ref()
        .expect("link decoded as SMC-R");
    assert_eq!((smc.llc_messages, smc.cdc_messages), (2, 4));
    assert_eq!(smc.cursors.len(), 2);
    assert_eq!(smc.cursors[0].producer, (1, 10));
}

#[test]
fn cdc_cursor_and_seqno_going_back_and_bad_llc() {
    let mut c = Checker::default();
    handshake(&mut c);
    let frames = [
        link_send(0, &cdc(5, 0x55, (2, 100), (0, 0))),
        link_send(1, &cdc(6, 0x55, (2, 50), (0, 0))), // producer back
        link_send(2, &cdc(4, 0x55, (2, 200), (0, 0))), // seqno back
        link_send(3, &llc(0x0c)),                     // unknown type
    ];
    for (i, f) in frames.iter().enumerate() {
        c.observe(10 + i as u64, "p0", f);
    }
    let f = c.findings();
    assert_eq!(
        rules(&f),
        vec![Rule::CdcCursor, Rule::CdcSeqno, Rule::LlcMessage],
        "{f:#?}"
    );
    assert_eq!(f[0].seq, Some(6));
    assert_eq!(f[0].psn, None);
}

#[test]
fn without_a_clc_handshake_sends_are_not_decoded() {
    let mut c = Checker::default();
    c.observe(0, "p0", &link_send(0, &llc(0x0c)));
    assert_eq!(c.findings(), vec![]);
    assert!(c.flows().roce[0].halves[0].smc.is_none());
}

#[test]
fn decline_is_state_not_a_finding() {
    let mut c = Checker::default();
    let mut cl = Stream::new(CL, SV, 1);
    let mut sv = Stream::new(SV, CL, 1);
    c.observe(0, "p0", &cl.seg(&clc(1, 52, |_| {})));
    c.observe(
        1,
        "p1",
        &sv.seg(&clc(4, 28, |m| {
            m[16..20].copy_from_slice(&0x0303_0008u32.to_be_bytes())
        })),
    );
    // Fallback TCP data is not parsed.
    c.observe(2, "p0", &cl.seg(b"GET / HTTP/1.0\r\n"));
    assert_eq!(c.findings(), vec![]);
    let v = &c.flows().smc[0];
    assert_eq!(v.state, ClcState::Declined);
    assert_eq!(v.decline.as_deref(), Some("0x03030008 NOUEID"));
}

#[test]
fn clc_rule_violations() {
    // Bad trailer.
    let mut c = Checker::default();
    let mut cl = Stream::new(CL, SV, 1);
    c.observe(0, "p0", &cl.seg(&clc(1, 52, |m| m[51] = 0)));
    assert_eq!(rules(&c.findings()), vec![Rule::ClcTrailer]);
    // Accept from the client before any Proposal (split over two segments).
    let mut c = Checker::default();
    let mut cl = Stream::new(CL, SV, 1);
    let m = clc(2, 68, qpn_at_38(1));
    c.observe(0, "p0", &cl.seg(&m[..30]));
    c.observe(1, "p0", &cl.seg(&m[30..]));
    let f = c.findings();
    assert_eq!(rules(&f), vec![Rule::ClcSequence], "{f:#?}");
    assert_eq!(f[0].seq, Some(0));
    // Version 3 and a length too short for an Accept.
    for bad in [clc(1, 52, |m| m[7] = 0x30), clc(2, 40, |_| {})] {
        let mut c = Checker::default();
        let mut cl = Stream::new(CL, SV, 1);
        c.observe(0, "p0", &cl.seg(&bad));
        assert_eq!(rules(&c.findings()), vec![Rule::ClcHeader]);
    }
}

/// An LLC ADD_LINK (v2) announcing `gid_v4` (as an IPv4-mapped GID) and
/// `qpn` for its sender's end of a new link.
fn add_link(gid_v4: [u8; 4], qpn: u32, response: bool) -> Vec<u8> {
    let mut m = vec![0u8; 88];
    m[0] = 0x22;
    m[1] = 88;
    m[3] = if response { 0x80 } else { 0 };
    m[4..10].copy_from_slice(&[0x52, 0x54, 0, 0x77, 1, gid_v4[3]]);
    m[22..24].copy_from_slice(&[0xff, 0xff]);
    m[24..28].copy_from_slice(&gid_v4);
    m[28..31].copy_from_slice(&qpn.to_be_bytes()[1..]);
    m[31] = 2;
    m
}

#[test]
fn second_link_learnt_from_add_link_carries_cdc() {
    const A1: [u8; 4] = [10, 0, 1, 1];
    const B1: [u8; 4] = [10, 0, 1, 2];
    let mut c = Checker::default();
    handshake(&mut c);
    // The new link's CDC before the ADD_LINK exchange is not SMC-R yet.
    let early = builder(A1, B1)
        .build(
            &PacketBuilder::new(Opcode::RcSendOnly, 0x21, 0).payload(&cdc(1, 0x55, (0, 1), (0, 0))),
        )
        .unwrap();
    c.observe(5, "p2", &early);
    // Request on the first link (A -> B), then the response (B -> A).
    c.observe(10, "p0", &link_send(0, &add_link(A1, 0x20, false)));
    assert!(
        c.stats().smc_links_from_add_link == 0,
        "one half of the exchange is not enough"
    );
    c.observe(
        11,
        "p1",
        &b2a(PacketBuilder::new(Opcode::RcSendOnly, QA, 0).payload(&add_link(B1, 0x21, true))),
    );
    assert_eq!(c.stats().smc_links_from_add_link, 1);
    // CDC on the second link is now decoded and credited to the connection.
    for (i, (seq, prod)) in [(2u16, 100u32), (3, 200)].iter().enumerate() {
        let f = builder(A1, B1)
            .build(
                &PacketBuilder::new(Opcode::RcSendOnly, 0x21, 1 + i as u32).payload(&cdc(
                    *seq,
                    0x55,
                    (0, *prod),
                    (0, 0),
                )),
            )
            .unwrap();
        c.observe(20 + i as u64, "p2", &f);
    }
    assert_eq!(c.findings(), vec![]);
    let v = c.flows();
    let second = v
        .roce
        .iter()
        .find(|f| f.connection.contains("10.0.1.1"))
        .expect("second link in flows");
    let smc = second.halves[0]
        .smc
        .as_ref()
        .expect("second link decoded as SMC-R");
    assert_eq!(smc.cdc_messages, 2);
    assert_eq!(smc.cursors[0].producer, (0, 200));
}

#[test]
fn add_link_floods_stay_bounded_and_unanswered_ones_teach_nothing() {
    let mut c = Checker::default();
    handshake(&mut c);
    for i in 0..10_000u32 {
        let gid = [10, 9, (i >> 8) as u8, i as u8];
        c.observe(
            10 + u64::from(i),
            "p0",
            &link_send(i, &add_link(gid, i, false)),
        );
    }
    assert_eq!(c.stats().smc_links_from_add_link, 0);
    // Truncated and foreign messages teach nothing and raise no panic.
    for (i, m) in [vec![0x22, 88, 0], vec![0x02], vec![]].iter().enumerate() {
        c.observe(
            20_000 + i as u64,
            "p1",
            &b2a(PacketBuilder::new(Opcode::RcSendOnly, QA, i as u32).payload(m)),
        );
    }
    assert_eq!(c.stats().smc_links_from_add_link, 0);
    // The answer pairs with the latest request only (a repeated request
    // replaces the older one): one link, with a non-IPv4-mapped GID.
    let mut v6 = add_link([1, 2, 3, 4], 1, true);
    v6[12] = 0xfe;
    c.observe(
        30_000,
        "p1",
        &b2a(PacketBuilder::new(Opcode::RcSendOnly, QA, 3).payload(&v6)),
    );
    assert_eq!(c.stats().smc_links_from_add_link, 1);
}
