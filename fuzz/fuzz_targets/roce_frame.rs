//! `RoceFrame::parse` (Ethernet / IPv4 / IPv6 / GRH / UDP / BTH ..) and
//! `IbFrame::parse` (LRH ..) on arbitrary bytes.
//!
//! Invariants: the transport packet of a parsed frame is a sub-slice of the
//! frame and re-parses identically on its own; ICRC verification is
//! deterministic and, when it succeeds, a one-bit flip of the payload makes it
//! fail (CRC-32 detects every single-bit error).
#![no_main]

use libfuzzer_sys::fuzz_target;
use roce_model::{IbFrame, RoceFrame, RocePacket, ICRC_LEN};

fn within(outer: &[u8], inner: &[u8]) -> Option<usize> {
    let o = outer.as_ptr() as usize;
    let i = inner.as_ptr() as usize;
    (i >= o && i + inner.len() <= o + outer.len()).then(|| i - o)
}

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = RoceFrame::parse(data) {
        let off = within(data, f.packet.raw).expect("packet inside frame");
        let again = RocePacket::parse(f.packet.raw).expect("packet re-parses alone");
        assert_eq!(again, f.packet);
        let ok = f.verify_icrc().is_ok();
        assert_eq!(ok, f.verify_icrc().is_ok());
        if ok && !f.packet.payload.is_empty() {
            let mut m = data.to_vec();
            let at = off + f.packet.raw.len() - ICRC_LEN - f.packet.pad.len() - 1;
            m[at] ^= 0x80;
            let g = RoceFrame::parse(&m).expect("bit flip in payload keeps structure");
            assert!(g.verify_icrc().is_err(), "ICRC misses a payload bit flip");
        }
    }
    if let Ok(f) = IbFrame::parse(data) {
        within(data, f.packet.raw).expect("packet inside frame");
        assert_eq!(
            RocePacket::parse(f.packet.raw).expect("re-parses"),
            f.packet
        );
        let _ = f.verify_icrc();
        let _ = f.verify_vcrc();
        let _ = f.icrc_scope();
    }
});
