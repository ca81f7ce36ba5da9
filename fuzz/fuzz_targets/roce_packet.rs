//! `RocePacket::parse` (BTH .. ICRC) on arbitrary bytes.
//!
//! Invariants: a parsed packet is structurally consistent, rebuilds with
//! `PacketBuilder` to the same length, payload and BTH key fields,
//! the rebuilt bytes parse to the same packet, and a sealed rebuild verifies
//! its ICRC while a one-bit flip in the payload does not.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roce_model::{IcrcScope, RocePacket, ICRC_LEN};

fuzz_target!(|data: &[u8]| {
    let Ok(p) = RocePacket::parse(data) else {
        return;
    };
    let info = p.info();
    assert_eq!(p.raw, data);
    assert_eq!(p.bth.tver, 0);
    assert_eq!(p.pad.len(), usize::from(p.bth.pad_cnt));
    assert_eq!((p.payload.len() + p.pad.len()) % 4, 0);
    assert_eq!(p.ext.present(), info.headers);
    p.ext
        .check_for(p.bth.opcode)
        .expect("parsed headers match the opcode");
    if let Some(n) = info.payload.fixed_len() {
        assert_eq!(p.payload.len(), n);
    }

    let b = p.to_builder();
    let rebuilt = b.build_unsealed().expect("a parsed packet rebuilds");
    assert_eq!(rebuilt.len(), data.len(), "rebuilt length");
    // The payload is reproduced exactly (headers may differ in reserved bits,
    // pad bytes are zero and the ICRC a placeholder in the rebuild).
    let end = data.len() - ICRC_LEN - p.pad.len();
    let hdr_len = end - p.payload.len();
    assert_eq!(hdr_len, 12 + info.ext_len());
    assert_eq!(&rebuilt[hdr_len..end], p.payload, "rebuilt payload bytes");
    // Opcode, P_Key, destination QP and PSN are reproduced bit for bit.
    assert_eq!(rebuilt[0], data[0]);
    assert_eq!(&rebuilt[2..4], &data[2..4]);
    assert_eq!(&rebuilt[5..8], &data[5..8]);
    assert_eq!(&rebuilt[9..12], &data[9..12]);
    let q = RocePacket::parse(&rebuilt).expect("rebuilt packet parses");
    assert_eq!(q.bth, p.bth);
    assert_eq!(q.ext, p.ext);
    assert_eq!(q.payload, p.payload);

    let grh = [0x60u8; 40];
    let scope = IcrcScope::Grh(&grh);
    let mut sealed = b.build(&scope).expect("seal");
    let s = RocePacket::parse(&sealed).expect("sealed parses");
    s.verify_icrc(&scope).expect("sealed ICRC verifies");
    if !p.payload.is_empty() {
        let at = data.len() - ICRC_LEN - p.pad.len() - 1;
        sealed[at] ^= 0x01;
        let s = RocePacket::parse(&sealed).expect("still parses");
        assert!(
            s.verify_icrc(&scope).is_err(),
            "ICRC misses a payload bit flip"
        );
    }
});
