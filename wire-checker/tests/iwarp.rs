//! iWARP rules over crafted TCP streams (MPA/DDP bytes from siw's codec).

mod common;

use common::*;
use siw::ddp::{Header, Opcode, ReadRequest, TermError, Terminate};
use siw::mpa::{write_fpdu, FrameKind, MpaFrame};
use wire_checker::{Checker, Rule};

const I: ([u8; 4], u16) = ([10, 0, 0, 1], 40000);
const R: ([u8; 4], u16) = ([10, 0, 0, 2], 4791 + 1);

fn mpa(kind: FrameKind, crc: bool) -> Vec<u8> {
    let mut f = MpaFrame::new(kind, 1);
    f.crc = crc;
    f.to_bytes().unwrap()
}

fn fpdu(h: Header, body: &[u8], crc: bool) -> Vec<u8> {
    let mut hdr = Vec::new();
    h.encode(&mut hdr);
    let mut out = Vec::new();
    write_fpdu(&mut out, &hdr, body, crc);
    out
}

fn send(msn: u32, mo: u32, last: bool, body: &[u8], crc: bool) -> Vec<u8> {
    fpdu(
        Header::untagged(Opcode::Send, last, 0, 0, msn, mo),
        body,
        crc,
    )
}

struct Conn {
    c: Checker,
    i: Stream,
    r: Stream,
    crc: bool,
}

impl Conn {
    fn new(crc: bool) -> Self {
        let mut c = Conn {
            c: Checker::default(),
            i: Stream::new(I, R, 1000),
            r: Stream::new(R, I, 5000),
            crc,
        };
        let req = c.i.seg(&mpa(FrameKind::Request, crc));
        let rep = c.r.seg(&mpa(FrameKind::Reply, false));
        c.c.observe(0, "p0", &req);
        c.c.observe(1, "p1", &rep);
        c
    }
    fn initiator_sends(&mut self, bytes: &[u8]) {
        let f = self.i.seg(bytes);
        self.c.observe(2, "p0", &f);
    }
    fn responder_sends(&mut self, bytes: &[u8]) {
        let f = self.r.seg(bytes);
        self.c.observe(3, "p1", &f);
    }
}

fn clean(crc: bool) -> Conn {
    let mut k = Conn::new(crc);
    let cr = k.crc;
    // A two-segment Send (MSN 1), a one-segment Send (MSN 2) in one TCP segment.
    let mut b = send(1, 0, false, &[1; 100], cr);
    b.extend(send(1, 100, true, &[2; 50], cr));
    b.extend(send(2, 0, true, &[3; 8], cr));
    k.initiator_sends(&b);
    // A Read Request (QN 1, MSN 1) and its two-segment response.
    let rr = ReadRequest {
        sink_stag: 0x100,
        sink_to: 0x4000,
        size: 300,
        src_stag: 0x200,
        src_to: 0,
    };
    let mut body = Vec::new();
    rr.encode(&mut body);
    k.initiator_sends(&fpdu(
        Header::untagged(Opcode::ReadRequest, true, 0, 1, 1, 0),
        &body,
        cr,
    ));
    // The response split across two TCP segments at an odd byte.
    let mut resp = fpdu(
        Header::tagged(Opcode::ReadResponse, false, 0x100, 0x4000),
        &[9; 200],
        cr,
    );
    resp.extend(fpdu(
        Header::tagged(Opcode::ReadResponse, true, 0x100, 0x4000 + 200),
        &[9; 100],
        cr,
    ));
    let (x, y) = resp.split_at(77);
    k.responder_sends(x);
    k.responder_sends(y);
    // The responder's own Send (its MSN 1) and an RDMA Write.
    k.responder_sends(&send(1, 0, true, b"ok", cr));
    k.responder_sends(&fpdu(
        Header::tagged(Opcode::Write, true, 0x300, 0),
        &[5; 64],
        cr,
    ));
    k
}

#[test]
fn clean_iwarp_connection_without_and_with_crc() {
    for crc in [false, true] {
        let k = clean(crc);
        assert_eq!(k.c.findings(), vec![], "crc {crc}");
        let v = k.c.flows().iwarp;
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].state, "established");
        assert_eq!(v[0].crc, Some(crc));
        assert_eq!(v[0].connection, "iwarp#1 10.0.0.1:40000 <-> 10.0.0.2:4792");
        assert_eq!(v[0].dirs[0].next_msn, [3, 2, 1]);
        assert_eq!(v[0].dirs[0].outstanding_reads, 0);
        assert_eq!(v[0].dirs[1].fpdus, 4);
    }
}

#[test]
fn tcp_retransmission_is_skipped() {
    let mut k = Conn::new(false);
    let f = send(1, 0, true, b"abcd", false);
    let seg = k.i.seg(&f);
    k.c.observe(5, "p0", &seg);
    k.c.observe(6, "p0", &seg); // the same segment again
    k.initiator_sends(&send(2, 0, true, b"efgh", false));
    assert_eq!(k.c.findings(), vec![]);
    assert_eq!(k.c.flows().iwarp[0].dirs[0].next_msn[0], 3);
}

#[test]
fn crc_corruption_is_found_and_stops_parsing() {
    let mut k = Conn::new(true);
    k.initiator_sends(&send(1, 0, true, b"abcd", true));
    let mut bad = send(2, 0, true, b"efgh", true);
    bad[10] ^= 1;
    k.initiator_sends(&bad);
    k.initiator_sends(&send(3, 0, true, b"ijkl", true));
    let f = k.c.findings();
    assert_eq!(rules(&f), vec![Rule::MpaCrc], "{f:#?}");
    // Offset of the bad FPDU in the initiator's stream: MPA frame + 1 FPDU.
    assert_eq!(f[0].seq, Some(20 + 28));
    assert_eq!(f[0].direction, "10.0.0.1:40000 -> 10.0.0.2:4792");
    assert!(!k.c.flows().iwarp[0].dirs[0].parsed);
}

#[test]
fn ddp_rules() {
    let mut k = Conn::new(false);
    // MSN 2 first (skips 1).
    k.initiator_sends(&send(2, 0, true, b"abcd", false));
    // Send on queue 1.
    k.initiator_sends(&fpdu(
        Header::untagged(Opcode::Send, true, 0, 1, 1, 0),
        b"abcd",
        false,
    ));
    // A two-segment Send whose second segment has the wrong MO.
    k.initiator_sends(&send(3, 0, false, b"abcd", false));
    k.initiator_sends(&send(3, 9, true, b"abcd", false));
    // A bad DDP version.
    let mut v = send(4, 0, true, b"abcd", false);
    v[2] ^= 0x03;
    k.initiator_sends(&v);
    // Read Response with no Read Request outstanding.
    k.responder_sends(&fpdu(
        Header::tagged(Opcode::ReadResponse, true, 1, 0),
        b"zz",
        false,
    ));
    // A Terminate from the responder.
    let mut t = Vec::new();
    Terminate::new(TermError::ddp_untagged(
        siw::ddp::ddp_ecode::UT_INVALID_MSN_RANGE,
    ))
    .encode(&mut t);
    k.responder_sends(&fpdu(
        Header::untagged(Opcode::Terminate, true, 0, 2, 1, 0),
        &t,
        false,
    ));
    let f = k.c.findings();
    assert_eq!(
        rules(&f),
        vec![
            Rule::DdpMsn,
            Rule::DdpQueue,
            Rule::DdpOffset,
            Rule::DdpHeader,
            Rule::IwarpReadResponse,
            Rule::IwarpTerminate
        ],
        "{f:#?}"
    );
    assert!(f[5].detail.contains("ecode 0x03"), "{}", f[5].detail);
    assert!(k.c.flows().iwarp[0].dirs[1].terminate.is_some());
}

#[test]
fn bad_mpa_handshake_and_stream_gap() {
    let mut c = Checker::default();
    let mut i = Stream::new(I, R, 1);
    let mut r = Stream::new(R, I, 1);
    c.observe(0, "p0", &i.seg(&mpa(FrameKind::Request, false)));
    // The responder answers with a Request key.
    c.observe(1, "p1", &r.seg(&mpa(FrameKind::Request, false)));
    // The initiator's stream jumps ahead 100 bytes.
    i.seq += 100;
    c.observe(2, "p0", &i.seg(&send(1, 0, true, b"x", false)));
    let f = c.findings();
    assert_eq!(
        rules(&f),
        vec![Rule::MpaHandshake, Rule::StreamUnparsed],
        "{f:#?}"
    );
    assert_eq!(c.stats().streams_unparsed, 1);
}

#[test]
fn buffer_is_bounded() {
    let mut c = Checker::new(wire_checker::CheckerConfig {
        max_stream_buffer: 1000,
        ..Default::default()
    });
    let mut i = Stream::new(I, R, 1);
    c.observe(0, "p0", &i.seg(&mpa(FrameKind::Request, false)));
    // No reply ever: the initiator's FPDU bytes pile up until the bound.
    for n in 0..10 {
        c.observe(n + 1, "p0", &i.seg(&[0u8; 300]));
    }
    let f = c.findings();
    assert_eq!(rules(&f), vec![Rule::StreamUnparsed], "{f:#?}");
}

#[test]
fn changed_retransmission_is_found_once() {
    let mut k = Conn::new(false);
    let f = send(1, 0, true, b"abcd", false);
    let seq = k.i.seq;
    let seg = k.i.seg(&f);
    k.c.observe(5, "p0", &seg);
    k.c.observe(6, "p0", &seg); // the same bytes again: fine
                                // Retransmitted with one payload byte changed (MPA length, DDP/RDMAP
                                // header of 18 bytes, "ab": stream byte 20 + 22).
    let mut g = f.clone();
    g[2 + 18 + 2] = b'X';
    k.c.observe(7, "p0", &tcp(I, R, seq, &g));
    // Changed once more: counted, not reported again.
    g[2 + 18 + 3] = b'Y';
    k.c.observe(8, "p0", &tcp(I, R, seq, &g));
    k.initiator_sends(&send(2, 0, true, b"efgh", false));
    let fs = k.c.findings();
    assert_eq!(rules(&fs), vec![Rule::RetransmitDiffers], "{fs:#?}");
    assert_eq!(fs[0].seq, Some(20 + 22));
    assert_eq!(fs[0].port, "p0");
    assert_eq!(fs[0].direction, "10.0.0.1:40000 -> 10.0.0.2:4792");
    assert!(
        fs[0].detail.contains("0x58, first 0x63") && fs[0].detail.contains("first on port p0"),
        "{}",
        fs[0].detail
    );
    let d = &k.c.flows().iwarp[0].dirs[0];
    assert_eq!(
        (
            d.retransmitted,
            d.retransmit_unchecked,
            d.retransmit_differs
        ),
        (3 * f.len() as u64, 0, 2)
    );
    // The stream itself is still parsed from the first sighting.
    assert_eq!(d.next_msn[0], 3);
}

#[test]
fn copy_on_a_second_port_is_compared() {
    let mut k = Conn::new(false);
    let a = k.i.seg(&send(1, 0, true, b"abcd", false));
    let b = k.i.seg(&send(2, 0, true, b"efgh", false));
    // Each frame recorded at the sender's port and at the receiver's.
    k.c.observe(5, "p0", &a);
    k.c.observe(5, "p1", &a);
    k.c.observe(6, "p0", &b);
    let mut b1 = b.clone();
    let n = b1.len();
    b1[n - 5] ^= 0x20; // the fabric delivered "efgH" (the 4 CRC bytes follow)
    k.c.observe(6, "p1", &b1);
    let fs = k.c.findings();
    assert_eq!(rules(&fs), vec![Rule::RetransmitDiffers], "{fs:#?}");
    assert_eq!(fs[0].port, "p1");
    assert!(
        fs[0].detail.contains("first on port p0"),
        "{}",
        fs[0].detail
    );
    // Stream offset of 'h': MPA frame, one 28-byte FPDU, then 2 + 18 + 3.
    assert_eq!(fs[0].seq, Some(20 + 28 + 23));
}

#[test]
fn overlapping_retransmission_compares_the_old_part_and_takes_the_new() {
    let mut k = Conn::new(false);
    let f1 = send(1, 0, true, b"abcd", false);
    let f2 = send(2, 0, true, b"efgh", false);
    let seq = k.i.seq;
    k.initiator_sends(&f1);
    // A retransmission coalescing the first FPDU (one byte changed) with
    // the next, new one.
    let mut both = f1.clone();
    both[17] ^= 1;
    both.extend_from_slice(&f2);
    k.c.observe(9, "p0", &tcp(I, R, seq, &both));
    let fs = k.c.findings();
    assert_eq!(rules(&fs), vec![Rule::RetransmitDiffers], "{fs:#?}");
    assert_eq!(fs[0].seq, Some(20 + 17));
    let d = &k.c.flows().iwarp[0].dirs[0];
    assert_eq!(d.next_msn[0], 3, "the new FPDU was parsed");
    assert_eq!(d.retransmitted, f1.len() as u64);
}

#[test]
fn retransmit_window_bounds_the_comparison() {
    for window in [0, 8] {
        let mut c = Checker::new(wire_checker::CheckerConfig {
            retransmit_window: window,
            ..Default::default()
        });
        let mut i = Stream::new(I, R, 1);
        let mut r = Stream::new(R, I, 1);
        c.observe(0, "p0", &i.seg(&mpa(FrameKind::Request, false)));
        c.observe(1, "p1", &r.seg(&mpa(FrameKind::Reply, false)));
        let f = send(1, 0, true, b"abcdefgh", false);
        let seq = i.seq;
        c.observe(2, "p0", &i.seg(&f));
        // Everything changed: only the last `window` bytes can be compared.
        let g: Vec<u8> = f.iter().map(|b| !b).collect();
        c.observe(3, "p0", &tcp(I, R, seq, &g));
        let fs = c.findings();
        let d = &c.flows().iwarp[0].dirs[0];
        assert_eq!(d.retransmitted, f.len() as u64);
        assert_eq!(d.retransmit_unchecked, (f.len() - window) as u64);
        if window == 0 {
            assert_eq!(fs, vec![]);
        } else {
            assert_eq!(rules(&fs), vec![Rule::RetransmitDiffers], "{fs:#?}");
            // The first byte still kept: the window's start.
            assert_eq!(fs[0].seq, Some(20 + (f.len() - window) as u64));
        }
    }
}
