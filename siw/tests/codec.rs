//! Codec round trips (proptest) and fixed byte vectors.

use proptest::prelude::*;
use siw::ddp::{DdpHdr, Header, Layer, Opcode, ReadRequest, TermError, Terminate};
use siw::mpa::{self, Deframer, FrameKind, IrdOrd, MpaConfig, MpaFrame};

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

const REQ_KEY: &str = "4d50412049442052657120467261 6d65";
const REP_KEY: &str = "4d50412049442052657020467261 6d65";

#[test]
fn mpa_request_rev2_no_crc() {
    let cfg = MpaConfig::default(); // IRD = ORD = 16, CRC off
    let f = mpa::initiator_request(&cfg, b"abc");
    let want = hex(&format!("{REQ_KEY} 10 02 0007 0010 0010 616263"));
    assert_eq!(f.to_bytes().unwrap(), want);
    assert_eq!(MpaFrame::parse(&want).unwrap(), Some((f, want.len())));
}

#[test]
fn mpa_request_rev2_crc_p2p() {
    let cfg = MpaConfig {
        crc_required: true,
        ird: 4,
        ord: 8,
        peer_to_peer: true,
        ..MpaConfig::default()
    };
    let f = mpa::initiator_request(&cfg, b"");
    // IRD word: P2P | 4; ORD word: WRITE_RTR | READ_RTR | 8.
    assert_eq!(
        f.to_bytes().unwrap(),
        hex(&format!("{REQ_KEY} 50 02 0004 8004 c008"))
    );
}

#[test]
fn mpa_reply_with_crc_and_ird_ord() {
    let rcfg = MpaConfig {
        ird: 8,
        ord: 4,
        ..MpaConfig::default()
    };
    let req = mpa::initiator_request(
        &MpaConfig {
            crc_required: true,
            ird: 4,
            ord: 8,
            peer_to_peer: true,
            ..MpaConfig::default()
        },
        b"",
    );
    let n = mpa::responder_evaluate(&rcfg, &req).unwrap();
    let rep = mpa::responder_reply(&rcfg, &n, b"ok");
    // Responder: IRD = max(8, peer ORD 8) = 8 with P2P; ORD = min(4, peer IRD 4) = 4 with WRITE_RTR.
    assert_eq!(
        rep.to_bytes().unwrap(),
        hex(&format!("{REP_KEY} 50 02 0006 8008 8004 6f6b"))
    );
}

#[test]
fn mpa_reply_rev1_plain_and_reject() {
    let mut f = MpaFrame::new(FrameKind::Reply, 1);
    assert_eq!(f.to_bytes().unwrap(), hex(&format!("{REP_KEY} 00 01 0000")));
    f.reject = true;
    f.private_data = b"no".to_vec();
    assert_eq!(
        f.to_bytes().unwrap(),
        hex(&format!("{REP_KEY} 20 01 0002 6e6f"))
    );
}

#[test]
fn mpa_tolerates_gso_exp_and_reserved_bits() {
    let b = hex(&format!("{REQ_KEY} 1f 02 0004 0001 0002"));
    let (f, n) = MpaFrame::parse(&b).unwrap().unwrap();
    assert_eq!(n, 24);
    assert!(f.gso_exp);
    assert_eq!(f.reserved, 7);
    assert_eq!(f.ird_ord.unwrap().ord, 2);
}

#[test]
fn mpa_rejects_bad_input() {
    assert_eq!(MpaFrame::parse(b"MPA ID Xeq"), Err(mpa::MpaError::BadKey));
    assert_eq!(MpaFrame::parse(b"MPA ID R"), Ok(None));
    let b = hex(&format!("{REQ_KEY} 00 03 0000"));
    assert_eq!(MpaFrame::parse(&b), Err(mpa::MpaError::Revision(3)));
    let b = hex(&format!("{REQ_KEY} 00 01 0201"));
    assert_eq!(
        MpaFrame::parse(&b),
        Err(mpa::MpaError::PrivateDataTooLong(513))
    );
    let b = hex(&format!("{REQ_KEY} 10 02 0002 0000"));
    assert_eq!(MpaFrame::parse(&b), Err(mpa::MpaError::MissingIrdOrd));
    let mut f = MpaFrame::new(FrameKind::Request, 2);
    f.ird_ord = Some(IrdOrd::default());
    f.private_data = vec![0; 509];
    assert!(f.to_bytes().is_err());
}

#[test]
fn fpdu_fixed_vectors() {
    // Zero-length RDMA Write (the RTR siw sends), STag 1, TO 0, with CRC.
    let mut h = Vec::new();
    Header::tagged(Opcode::Write, true, 1, 0).encode(&mut h);
    let mut out = Vec::new();
    mpa::write_fpdu(&mut out, &h, &[], true);
    assert_eq!(out, hex("000e c140 00000001 0000000000000000 ebd34c5f"));
    // Without CRC the field is present and zero.
    out.clear();
    mpa::write_fpdu(&mut out, &h, &[], false);
    assert_eq!(out, hex("000e c140 00000001 0000000000000000 00000000"));
    // Send "hello", MSN 1: 23-byte ULPDU, 3 pad bytes.
    h.clear();
    Header::untagged(Opcode::Send, true, 0, 0, 1, 0).encode(&mut h);
    out.clear();
    mpa::write_fpdu(&mut out, &h, b"hello", true);
    assert_eq!(
        out,
        hex("0017 4143 00000000 00000000 00000001 00000000 68656c6c6f 000000 b990b10c")
    );
    let mut d = Deframer::new(true, 65535);
    d.push(&out);
    let u = d.next_ulpdu().unwrap().unwrap();
    let (hd, p) = Header::decode(u).unwrap();
    assert_eq!(p, b"hello");
    assert_eq!(hd.opcode, Opcode::Send);
}

#[test]
fn deframer_detects_crc_error_and_stays_failed() {
    let mut out = Vec::new();
    mpa::write_fpdu(&mut out, &[0x41, 0x43], b"data", true);
    out[4] ^= 0x80;
    let mut d = Deframer::new(true, 65535);
    d.push(&out);
    assert!(matches!(d.next_ulpdu(), Err(mpa::FrameError::Crc { .. })));
    assert_eq!(d.next_ulpdu(), Ok(None));
}

fn arb_ird_ord() -> impl Strategy<Value = IrdOrd> {
    (0u16..0x4000, 0u16..0x4000, any::<[bool; 4]>()).prop_map(|(ird, ord, b)| IrdOrd {
        ird,
        ord,
        peer_to_peer: b[0],
        send_rtr: b[1],
        write_rtr: b[2],
        read_rtr: b[3],
    })
}

fn arb_frame() -> impl Strategy<Value = MpaFrame> {
    (
        any::<bool>(),
        any::<[bool; 4]>(),
        0u8..8,
        1u8..=2,
        proptest::option::of(arb_ird_ord()),
        proptest::collection::vec(any::<u8>(), 0..=508),
    )
        .prop_map(|(req, b, reserved, revision, io, pd)| MpaFrame {
            kind: if req {
                FrameKind::Request
            } else {
                FrameKind::Reply
            },
            markers: b[0],
            crc: b[1],
            reject: b[2] && !req,
            gso_exp: b[3],
            reserved,
            revision,
            ird_ord: if revision == 2 { io } else { None },
            private_data: pd,
        })
}

fn arb_opcode() -> impl Strategy<Value = Opcode> {
    (0u8..8).prop_map(|v| Opcode::from_u8(v).unwrap())
}

fn arb_header() -> impl Strategy<Value = Header> {
    (
        arb_opcode(),
        any::<bool>(),
        any::<u32>(),
        any::<u64>(),
        any::<[u32; 4]>(),
    )
        .prop_map(|(op, last, stag, to, u)| {
            if op.is_tagged() {
                Header::tagged(op, last, stag, to)
            } else {
                Header::untagged(op, last, u[0], u[1], u[2], u[3])
            }
        })
}

proptest! {
    #[test]
    fn mpa_frame_round_trip(f in arb_frame()) {
        let b = f.to_bytes().unwrap();
        prop_assert_eq!(b.len(), f.encoded_len());
        prop_assert_eq!(MpaFrame::parse(&b).unwrap(), Some((f, b.len())));
        // Every strict prefix is "incomplete", never an error.
        for cut in [0, 1, 15, 16, 19, b.len() - 1] {
            prop_assert_eq!(MpaFrame::parse(&b[..cut]).unwrap(), None);
        }
    }

    #[test]
    fn ird_ord_round_trip(io in arb_ird_ord()) {
        prop_assert_eq!(IrdOrd::decode(io.encode()), io);
    }

    #[test]
    fn header_round_trip(h in arb_header(), payload in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut b = Vec::new();
        h.encode(&mut b);
        prop_assert_eq!(b.len(), h.len());
        b.extend_from_slice(&payload);
        let (d, p) = Header::decode(&b).unwrap();
        prop_assert_eq!(d, h);
        prop_assert_eq!(p, &payload[..]);
        match h.ddp {
            DdpHdr::Tagged { .. } => prop_assert!(h.opcode.is_tagged()),
            DdpHdr::Untagged { .. } => prop_assert!(!h.opcode.is_tagged()),
        }
    }

    #[test]
    fn read_request_round_trip(a in any::<(u32, u64, u32, u32, u64)>()) {
        let rr = ReadRequest { sink_stag: a.0, sink_to: a.1, size: a.2, src_stag: a.3, src_to: a.4 };
        let mut b = Vec::new();
        rr.encode(&mut b);
        prop_assert_eq!(ReadRequest::decode(&b), Some(rr));
    }

    #[test]
    fn terminate_round_trip(layer in 0u8..16, etype in 0u8..16, ecode in any::<u8>(),
                            flags in any::<[bool; 3]>(), hdrs in proptest::collection::vec(any::<u8>(), 0..48)) {
        let t = Terminate {
            error: TermError { layer: Layer::from_u8(layer), etype, ecode },
            m: flags[0], d: flags[1], r: flags[2], hdrs,
        };
        let mut b = Vec::new();
        t.encode(&mut b);
        prop_assert_eq!(Terminate::decode(&b), Some(t));
    }

    #[test]
    fn deframer_random_segmentation(
        ulpdus in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 2..300), 1..20),
        cuts in proptest::collection::vec(1usize..97, 1..50),
        crc in any::<bool>(),
    ) {
        let mut stream = Vec::new();
        for u in &ulpdus {
            mpa::write_fpdu(&mut stream, &u[..2], &u[2..], crc);
        }
        prop_assert_eq!(stream.len(), ulpdus.iter().map(|u| mpa::fpdu_len(u.len())).sum::<usize>());
        let mut d = Deframer::new(crc, 65535);
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut pos = 0;
        let mut i = 0;
        while pos < stream.len() {
            let n = cuts[i % cuts.len()].min(stream.len() - pos);
            i += 1;
            d.push(&stream[pos..pos + n]);
            pos += n;
            while let Some(u) = d.next_ulpdu().unwrap() {
                got.push(u.to_vec());
            }
        }
        prop_assert_eq!(got, ulpdus);
        prop_assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn deframer_bounds_length(len in 101usize..65536) {
        let mut d = Deframer::new(false, 100);
        d.push(&(len as u16).to_be_bytes());
        let is_too_long = matches!(d.next_ulpdu(), Err(mpa::FrameError::TooLong { .. }));
        prop_assert!(is_too_long);
    }
}
