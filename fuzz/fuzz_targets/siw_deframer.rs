//! The MPA FPDU deframer (`mpa::Deframer`) on an arbitrary byte stream cut
//! into arbitrary TCP segments.
//!
//! Invariants: the ULPDUs (and the first error) do not depend on how the
//! stream is segmented; every ULPDU is within `max_ulpdu`; re-framing the
//! ULPDUs with `write_fpdu` and deframing again gives the same ULPDUs; with
//! CRC on, re-framed output equals the consumed input whenever pads were zero.
#![no_main]

use libfuzzer_sys::fuzz_target;
use siw::mpa::{self, Deframer};

#[derive(Debug, PartialEq)]
enum Out {
    Pdu(Vec<u8>),
    Err(String),
}

fn deframe(crc: bool, max: usize, chunks: &[&[u8]]) -> Vec<Out> {
    let mut d = Deframer::new(crc, max);
    let mut out = Vec::new();
    for c in chunks {
        d.push(c);
        loop {
            match d.next_ulpdu() {
                Ok(Some(u)) => {
                    assert!(u.len() <= max.min(65535));
                    out.push(Out::Pdu(u.to_vec()));
                }
                Ok(None) => break,
                Err(e) => {
                    out.push(Out::Err(e.to_string()));
                    // A failed deframer stays failed.
                    assert!(matches!(d.next_ulpdu(), Ok(None)));
                    return out;
                }
            }
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let crc = data[0] & 1 != 0;
    let max = usize::from(u16::from_be_bytes([data[1], data[2]]));
    let stream = &data[3..];
    let whole = deframe(crc, max, &[stream]);
    // Re-segment with sizes derived from the data itself.
    let mut chunks = Vec::new();
    let mut rest = stream;
    let mut i = 0usize;
    while !rest.is_empty() {
        let n = (usize::from(data[i % data.len()]) % 37 + 1).min(rest.len());
        let (a, b) = rest.split_at(n);
        chunks.push(a);
        rest = b;
        i += 1;
    }
    let pieces = deframe(crc, max, &chunks);
    assert_eq!(whole, pieces, "segmentation changed the deframer's output");
    let bytewise: Vec<&[u8]> = stream.chunks(1).collect();
    assert_eq!(whole, deframe(crc, max, &bytewise));

    // Re-frame and deframe again.
    let pdus: Vec<&Vec<u8>> = whole
        .iter()
        .filter_map(|o| match o {
            Out::Pdu(p) => Some(p),
            Out::Err(_) => None,
        })
        .collect();
    let mut re = Vec::new();
    for p in &pdus {
        mpa::write_fpdu(&mut re, &[], p, crc);
    }
    let again = deframe(crc, max, &[&re]);
    assert_eq!(again.len(), pdus.len());
    for (a, p) in again.iter().zip(&pdus) {
        assert_eq!(a, &Out::Pdu((*p).clone()));
    }
    if crc {
        // With CRC on, only the pad bytes may differ from what was consumed.
        let mut off = 0;
        for p in &pdus {
            let total = mpa::fpdu_len(p.len());
            let pad = mpa::pad_len(p.len());
            assert_eq!(&re[off..off + 2 + p.len()], &stream[off..off + 2 + p.len()]);
            if stream[off + 2 + p.len()..off + 2 + p.len() + pad]
                .iter()
                .all(|&b| b == 0)
            {
                assert_eq!(&re[off..off + total], &stream[off..off + total]);
            }
            off += total;
        }
    }
});
