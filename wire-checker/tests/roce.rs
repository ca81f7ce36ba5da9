//! RoCE rules on crafted frame sequences (built with roce-model's codec).

mod common;

use common::*;
use roce_model::{Aeth, AethSyndrome, AtomicAckEth, AtomicEth, NakCode, Opcode, PacketBuilder};
use wire_checker::{Checker, CheckerConfig, Rule};

/// A clean RC conversation: SENDs, a 3-packet WRITE, a 3-packet READ, an
/// atomic, ACKs with MSN counting up, a NAK sequence error followed by a
/// go-back-N retransmission, an RNR NAK and a duplicate ACK.
fn clean_stream() -> Vec<Vec<u8>> {
    let mtu = vec![0xabu8; 1024];
    let tail = vec![0xcdu8; 452];
    let mut v = vec![
        send_only(100, b"hello"),
        ack(100, 1),
        send_only(101, &[1; 64]),
        // WRITE of 2500 bytes: FIRST 1024, MIDDLE 1024, LAST 452.
        a2b(PacketBuilder::new(Opcode::RcWriteFirst, QB, 102)
            .reth(reth(2500))
            .payload(&mtu)),
        a2b(PacketBuilder::new(Opcode::RcWriteMiddle, QB, 103).payload(&mtu)),
        a2b(PacketBuilder::new(Opcode::RcWriteLast, QB, 104)
            .ack_req(true)
            .payload(&tail)),
        ack(104, 3),
        // READ of 3000 bytes: PSNs 105..=107.
        a2b(PacketBuilder::new(Opcode::RcReadRequest, QB, 105).reth(reth(3000))),
    ];
    let aeth = |msn| Aeth {
        syndrome: AethSyndrome::Ack { credits: 31 },
        msn,
    };
    let rtail = vec![0xeeu8; 3000 - 2048];
    v.push(b2a(PacketBuilder::new(
        Opcode::RcReadResponseFirst,
        QA,
        105,
    )
    .aeth(aeth(4))
    .payload(&mtu)));
    v.push(b2a(PacketBuilder::new(
        Opcode::RcReadResponseMiddle,
        QA,
        106,
    )
    .payload(&mtu)));
    v.push(b2a(PacketBuilder::new(Opcode::RcReadResponseLast, QA, 107)
        .aeth(aeth(4))
        .payload(&rtail)));
    // Atomic at 108.
    v.push(a2b(PacketBuilder::new(Opcode::RcFetchAdd, QB, 108)
        .atomic_eth(AtomicEth {
            va: 0x2000,
            rkey: 0x77,
            swap_add: 1,
            compare: 0,
        })));
    v.push(b2a(PacketBuilder::new(
        Opcode::RcAtomicAcknowledge,
        QA,
        108,
    )
    .aeth(aeth(5))
    .atomic_ack_eth(AtomicAckEth { orig: 41 })));
    // 109, 110 sent; the responder saw 110 first (109 lost downstream):
    // NAK seq err with PSN 109, go-back-N resend of 109 and 110.
    v.push(send_only(109, b"a"));
    v.push(send_only(110, b"b"));
    v.push(nak(109, 5, NakCode::PsnSequenceError));
    v.push(send_only(109, b"a"));
    v.push(send_only(110, b"b"));
    v.push(ack(110, 7));
    // RNR NAK, then the retry succeeds; a duplicate ACK for an old PSN.
    v.push(send_only(111, b"c"));
    v.push(rnr(111, 7));
    v.push(send_only(111, b"c"));
    v.push(ack(111, 8));
    v.push(ack(111, 8));
    v
}

#[test]
fn clean_rc_conversation_has_no_findings_and_is_one_connection() {
    let mut c = Checker::default();
    feed(&mut c, &clean_stream());
    assert_eq!(c.findings(), vec![], "a clean run reports nothing");
    let flows = c.flows();
    assert_eq!(flows.roce.len(), 1, "{flows:#?}");
    let conn = &flows.roce[0];
    assert!(conn.paired);
    assert_eq!(
        conn.connection,
        "roce#1 10.0.0.1/qp0x11 <-> 10.0.0.2/qp0x12"
    );
    let req = &conn.halves[0];
    assert_eq!(req.direction, "10.0.0.1 -> 10.0.0.2 qp0x12");
    assert_eq!(req.next_psn, Some(112));
    assert_eq!(
        req.retransmits, 3,
        "109, 110 after the NAK, 111 after the RNR NAK"
    );
    assert_eq!(req.pmtu, Some(1024));
    assert_eq!(req.outstanding_reads, 0);
    let resp = &conn.halves[1];
    assert_eq!(resp.naks_seq, 1);
    assert_eq!(resp.naks_rnr, 1);
    assert_eq!(resp.dup_acks, 1);
    assert_eq!(resp.msn, Some(8));
    assert_eq!(resp.read_responses, 3);
}

#[test]
fn icrc_corruption_and_psn_gap_are_exactly_two_findings() {
    let mut c = Checker::default();
    let frames = vec![
        send_only(0, b"x"),
        send_only(1, b"x"),
        break_icrc(send_only(2, b"x")),
        send_only(3, b"x"),
        // PSN 4 never emitted.
        send_only(5, b"x"),
        send_only(6, b"x"),
        ack(6, 6),
    ];
    feed(&mut c, &frames);
    let f = c.findings();
    assert_eq!(rules(&f), vec![Rule::Icrc, Rule::PsnGap], "{f:#?}");
    assert_eq!(f[0].psn, Some(2));
    assert_eq!(f[1].psn, Some(5));
    for x in &f {
        assert_eq!(x.direction, "10.0.0.1 -> 10.0.0.2 qp0x12");
        assert!(
            x.connection.starts_with("roce#1 10.0.0.1/"),
            "{}",
            x.connection
        );
        assert_eq!(x.port, "p0");
    }
    assert!(f[1].detail.contains("expected 0x000004"), "{}", f[1].detail);
    assert_eq!(c.flows().roce[0].halves[0].icrc_errors, 1);
}

#[test]
fn opcode_sequencing() {
    let mut c = Checker::default();
    let mtu = vec![0u8; 256];
    feed(
        &mut c,
        &[
            send_only(0, b"x"),
            // MIDDLE without FIRST.
            a2b(PacketBuilder::new(Opcode::RcSendMiddle, QB, 1).payload(&mtu)),
            send_only(2, b"x"),
            // FIRST, then a WRITE ONLY inside the unfinished SEND.
            a2b(PacketBuilder::new(Opcode::RcSendFirst, QB, 3).payload(&mtu)),
            a2b(PacketBuilder::new(Opcode::RcWriteOnly, QB, 4)
                .reth(reth(4))
                .payload(&[1; 4])),
        ],
    );
    let f = c.findings();
    assert_eq!(
        rules(&f),
        vec![Rule::OpcodeSequence, Rule::OpcodeSequence],
        "{f:#?}"
    );
    assert_eq!((f[0].psn, f[1].psn), (Some(1), Some(4)));
}

#[test]
fn payload_length_rules() {
    let mut c = Checker::default();
    let mtu = vec![0u8; 1024];
    feed(
        &mut c,
        &[
            // FIRST of 1000 bytes: not a path MTU.
            a2b(PacketBuilder::new(Opcode::RcSendFirst, QB, 0).payload(&[0; 1000])),
            a2b(PacketBuilder::new(Opcode::RcSendLast, QB, 1).payload(&[0; 4])),
            // A WRITE whose packets carry 1024 + 8 bytes for a RETH of 2000.
            a2b(PacketBuilder::new(Opcode::RcWriteFirst, QB, 2)
                .reth(reth(2000))
                .payload(&mtu)),
            a2b(PacketBuilder::new(Opcode::RcWriteLast, QB, 3).payload(&[0; 8])),
            // ONLY larger than the PMTU learnt (1024).
            send_only(4, &vec![0; 2048]),
        ],
    );
    let f = c.findings();
    assert_eq!(
        rules(&f),
        vec![
            Rule::PayloadLength,
            Rule::PayloadLength,
            Rule::PayloadLength
        ],
        "{f:#?}"
    );
    assert_eq!(
        f.iter().map(|f| f.psn).collect::<Vec<_>>(),
        vec![Some(0), Some(3), Some(4)]
    );
}

#[test]
fn ack_for_unsent_psn_and_msn_backwards() {
    let mut c = Checker::default();
    feed(
        &mut c,
        &[
            send_only(10, b"x"),
            send_only(11, b"x"),
            ack(11, 2),
            // ACK beyond anything sent.
            ack(20, 3),
            // MSN going back.
            ack(11, 1),
        ],
    );
    let f = c.findings();
    assert_eq!(
        rules(&f),
        vec![Rule::AckPsnRange, Rule::MsnBackwards],
        "{f:#?}"
    );
    assert_eq!(f[0].psn, Some(20));
    assert_eq!(f[0].direction, "10.0.0.2 -> 10.0.0.1 qp0x11");
}

#[test]
fn read_response_outside_the_read() {
    let mut c = Checker::default();
    let aeth = Aeth {
        syndrome: AethSyndrome::Ack { credits: 31 },
        msn: 1,
    };
    feed(
        &mut c,
        &[
            send_only(0, b"x"),
            ack(0, 1),
            a2b(PacketBuilder::new(Opcode::RcReadRequest, QB, 1).reth(reth(16))),
            send_only(2, b"x"),
            // A read response with the SEND's PSN.
            b2a(PacketBuilder::new(Opcode::RcReadResponseOnly, QA, 2)
                .aeth(aeth)
                .payload(&[0; 16])),
            // Right PSN, wrong length.
            b2a(PacketBuilder::new(Opcode::RcReadResponseOnly, QA, 1)
                .aeth(aeth)
                .payload(&[0; 8])),
            // LAST without FIRST.
            b2a(PacketBuilder::new(Opcode::RcReadResponseLast, QA, 1)
                .aeth(aeth)
                .payload(&[0; 8])),
        ],
    );
    let f = c.findings();
    assert_eq!(
        rules(&f),
        vec![
            Rule::ReadResponseRange,
            Rule::PayloadLength,
            Rule::OpcodeSequence
        ],
        "{f:#?}"
    );
}

#[test]
fn unknown_pmtu_read_allows_any_psn_count_a_pmtu_can_give() {
    // READ of 4096 bytes before any PMTU is known: 1 to 16 PSNs.
    for next in [1u32, 4, 16] {
        let mut c = Checker::default();
        feed(
            &mut c,
            &[
                a2b(PacketBuilder::new(Opcode::RcReadRequest, QB, 0).reth(reth(4096))),
                send_only(next, b"x"),
            ],
        );
        assert_eq!(c.findings(), vec![], "next request at {next}");
    }
    let mut c = Checker::default();
    feed(
        &mut c,
        &[
            a2b(PacketBuilder::new(Opcode::RcReadRequest, QB, 0).reth(reth(4096))),
            send_only(17, b"x"),
        ],
    );
    assert_eq!(rules(&c.findings()), vec![Rule::PsnGap]);
}

#[test]
fn psn_wraps_without_findings() {
    let mut c = Checker::default();
    let frames: Vec<_> = [0xff_fffe, 0xff_ffff, 0, 1]
        .into_iter()
        .map(|p| send_only(p, b"w"))
        .chain([ack(1, 4)])
        .collect();
    feed(&mut c, &frames);
    assert_eq!(c.findings(), vec![]);
    assert_eq!(c.flows().roce[0].halves[0].next_psn, Some(2));
}

#[test]
fn malformed_packet_is_reported_with_its_psn() {
    let mut c = Checker::default();
    let mut f = send_only(7, b"abcd");
    // BTH byte 1: pad count 3 with a 4-byte payload is fine for the codec,
    // but TVer 5 is not.
    f[14 + 20 + 8 + 1] |= 0x05;
    feed(&mut c, &[f]);
    let fs = c.findings();
    assert_eq!(rules(&fs), vec![Rule::Malformed], "{fs:#?}");
    assert_eq!(fs[0].psn, Some(7));
}

#[test]
fn state_is_bounded() {
    let mut c = Checker::new(CheckerConfig {
        max_flows: 2,
        max_findings: 3,
        ..CheckerConfig::default()
    });
    // Ten destination QPs: ten halves, at most 4 kept.
    for q in 0..10u32 {
        let f = a2b(PacketBuilder::new(Opcode::RcSendOnly, 0x100 + q, 0).payload(b"x"));
        c.observe(u64::from(q), "p0", &f);
    }
    let n: usize = c.flows().roce.iter().map(|x| x.halves.len()).sum();
    assert!(n <= 4, "{n} halves kept");
    assert!(c.stats().flows_evicted >= 6);
    // Five bad ICRCs: three kept, two dropped.
    for p in 1..6 {
        c.observe(100 + p, "p0", &break_icrc(send_only(p as u32, b"x")));
    }
    assert_eq!(c.findings().len(), 3);
    let s = c.stats();
    assert_eq!((s.findings, s.findings_dropped), (5, 2));
    c.clear_findings();
    assert!(c.findings().is_empty());
}

#[test]
fn arbitrary_bytes_never_panic() {
    let mut c = Checker::default();
    let base = send_only(1, b"payload!");
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..20_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut f = base.clone();
        // Flip a few bytes past the UDP port and cut the frame somewhere.
        for k in 0..3 {
            let at = 14 + 20 + 4 + ((x >> (k * 16)) as usize % (f.len() - 38));
            f[at] ^= (x >> (k * 8)) as u8;
        }
        let cut = (x >> 40) as usize % (f.len() + 1);
        f.truncate(cut.max(14));
        c.observe(i, "p0", &f);
    }
    assert!(c.stats().frames == 20_000);
}

#[test]
fn qpn_reuse_with_a_new_start_psn_is_a_restart_not_a_gap() {
    let mut c = Checker::default();
    feed(
        &mut c,
        &[
            send_only(100, b"x"),
            send_only(101, b"x"),
            ack(101, 500),
            // A new connection on the same QPNs, random start PSN, MSN from 1.
            send_only(0x80_0000, b"y"),
            ack(0x80_0000, 1),
            send_only(0x80_0001, b"y"),
            ack(0x80_0001, 2),
        ],
    );
    assert_eq!(c.findings(), vec![]);
    let v = c.flows();
    let h = &v.roce[0].halves[0];
    assert_eq!(h.restarts, 1);
    assert_eq!(h.next_psn, Some(0x80_0002));
    assert!(v.roce[0].paired, "paired again by the new ACKs");
}
