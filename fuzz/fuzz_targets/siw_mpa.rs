//! MPA Request/Reply parsing (`MpaFrame::parse`) and the negotiation on top.
//!
//! Invariants: a parsed frame re-encodes to the bytes it consumed (the flag
//! byte may differ only for revision 1, whose H bit is reserved) and
//! re-parses equal; every proper prefix of a complete frame is "need more"
//! (`Ok(None)`), never an error or a different frame; the negotiation
//! helpers accept whatever parsed, and a reply built by
//! `responder_reply` for an accepted request parses and is accepted by
//! `initiator_evaluate`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use siw::mpa::{self, FrameKind, MpaConfig, MpaFrame};

fn cfg(b: u8) -> MpaConfig {
    MpaConfig {
        crc_required: b & 1 != 0,
        crc_strict: b & 2 != 0,
        revision: if b & 4 != 0 { 1 } else { 2 },
        ird: u16::from(b >> 4) * 9,
        ord: u16::from(b >> 4) * 7,
        peer_to_peer: b & 8 != 0,
        gso_exp: false,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&c, buf)) = data.split_first() else {
        return;
    };
    let Ok(Some((f, n))) = MpaFrame::parse(buf) else {
        return;
    };
    assert!(n <= buf.len());
    assert_eq!(n, f.encoded_len());
    let enc = f.to_bytes().expect("a parsed frame encodes");
    assert_eq!(enc.len(), n);
    assert_eq!(&enc[..16], &buf[..16]);
    assert!(enc[16] == buf[16] || f.revision == 1, "flags byte changed");
    assert_eq!(&enc[17..], &buf[17..n]);
    let (g, m) = MpaFrame::parse(&enc).expect("re-parse").expect("complete");
    assert_eq!((g, m), (f.clone(), n));
    // Prefixes are incomplete, never errors.
    for cut in [0, 1, 15, 16, 19, 20, n.saturating_sub(1)] {
        if cut < n {
            assert!(
                matches!(MpaFrame::parse(&buf[..cut]), Ok(None)),
                "prefix of {cut} bytes of a valid frame is not 'incomplete'"
            );
        }
    }

    let local = cfg(c);
    match f.kind {
        FrameKind::Request => {
            if let Ok(neg) = mpa::responder_evaluate(&local, &f) {
                let rep = mpa::responder_reply(&local, &neg, b"pd");
                let bytes = rep.to_bytes().expect("reply encodes");
                let (r, _) = MpaFrame::parse(&bytes).unwrap().unwrap();
                assert_eq!(r, rep);
                // The peer that sent `f` must accept our reply.
                let _ = mpa::initiator_evaluate(&local, &f, &r);
            } else {
                let rej = mpa::reject_reply(Some(&f), b"no");
                let bytes = rej.to_bytes().expect("reject encodes");
                let (r, _) = MpaFrame::parse(&bytes).unwrap().unwrap();
                assert!(r.reject);
            }
        }
        FrameKind::Reply => {
            let req = mpa::initiator_request(&local, b"hello");
            let _ = mpa::initiator_evaluate(&local, &req, &f);
        }
    }
});
