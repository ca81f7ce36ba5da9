//! DDP/RDMAP header decoding (`ddp::Header::decode`), Read Request bodies and
//! Terminate messages on arbitrary ULPDUs.
//!
//! Invariants: a decoded header re-encodes to `hdr.len()` bytes equal to the
//! input except for the reserved control bits, decodes back to itself, and
//! the rest of the ULPDU is exactly what follows the header; Read Request
//! bodies round-trip byte-exactly; Terminate decode/encode is idempotent and
//! `with_offending` copies a header that decodes to the same header.
#![no_main]

use libfuzzer_sys::fuzz_target;
use siw::ddp::{Header, Opcode, ReadRequest, Terminate, READ_REQ_LEN};

/// Reserved bits of the DDP/RDMAP control word (DDP Rsvd 13..10, RDMAP Rsvd 5..4).
const CTRL_RSVD: u16 = 0x3c30;

fuzz_target!(|data: &[u8]| {
    match Header::decode(data) {
        Ok((h, rest)) => {
            let n = h.len();
            assert!(n == 14 || n == 18);
            assert_eq!(rest, &data[n..]);
            let mut enc = Vec::new();
            h.encode(&mut enc);
            assert_eq!(enc.len(), n);
            let c_in = u16::from_be_bytes([data[0], data[1]]) & !CTRL_RSVD;
            let c_out = u16::from_be_bytes([enc[0], enc[1]]);
            assert_eq!(c_in, c_out, "control word");
            assert_eq!(h.ctrl(), c_out);
            assert_eq!(&enc[2..], &data[2..n]);
            let (h2, r2) = Header::decode(&enc).expect("encoded header decodes");
            assert_eq!(h2, h);
            assert!(r2.is_empty());
            if h.opcode == Opcode::ReadRequest {
                if let Some(rr) = ReadRequest::decode(rest) {
                    let mut b = Vec::new();
                    rr.encode(&mut b);
                    assert_eq!(&b[..], &rest[..READ_REQ_LEN]);
                } else {
                    assert!(rest.len() < READ_REQ_LEN);
                }
            }
            let t = Terminate::new(siw::TermError {
                layer: siw::Layer::Rdmap,
                etype: 1,
                ecode: 2,
            })
            .with_offending(data);
            assert!(t.m && t.d);
            assert_eq!(t.offending_header(), Some(h));
        }
        Err(_) => {
            // A header that does not decode is never copied as one.
            let t = Terminate::new(siw::TermError {
                layer: siw::Layer::Ddp,
                etype: 0,
                ecode: 0,
            })
            .with_offending(data);
            assert!(!t.d && t.offending_header().is_none());
        }
    }
    if let Some(t) = Terminate::decode(data) {
        assert_eq!(t.hdrs, &data[4..]);
        let mut enc = Vec::new();
        t.encode(&mut enc);
        assert_eq!(enc.len(), data.len());
        let t2 = Terminate::decode(&enc).expect("encoded terminate decodes");
        assert_eq!(t2, t, "terminate decode/encode not idempotent");
        let _ = t.offending_header();
    }
});
