//! `wire::capture::CaptureReader` over an arbitrary file: the input is what
//! `vhost-rdma check-capture FILE` reads, and a user may hand it any file.
//!
//! Invariants: no panic; every packet's interface index is one the reader
//! listed; captured bytes never exceed the block limit; reading stops (an
//! error or the end) within as many records as the input has bytes, so a
//! malformed length can never loop; and a capture written by the daemon's
//! own blocks (`pcapng::{shb, idb, epb}`) from fuzzer frames reads back
//! exactly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wire::capture::{pcapng, CaptureReader, MAX_BLOCK};

fuzz_target!(|data: &[u8]| {
    if let Ok(mut r) = CaptureReader::new(data) {
        let mut n = 0usize;
        while let Ok(Some(p)) = r.next_packet() {
            assert!(p.iface < r.interfaces().len());
            assert!(p.data.len() <= MAX_BLOCK);
            n += 1;
            assert!(n <= data.len(), "more records than input bytes");
        }
    }

    // Round trip: the input cut into frames (first byte: frame length) is
    // written as the daemon writes a capture and must read back unchanged.
    let mut file = pcapng::shb("fuzz");
    file.extend(pcapng::idb("p0", 65535));
    let mut frames = Vec::new();
    let mut rest = data;
    while let Some((&len, tail)) = rest.split_first() {
        let len = usize::from(len).min(tail.len());
        let (frame, tail) = tail.split_at(len);
        let ts = frames.len() as u64 * 1_000;
        file.extend(pcapng::epb(
            0,
            ts,
            frame,
            frame.len() as u32,
            pcapng::FLAG_INBOUND,
        ));
        frames.push(frame);
        rest = tail;
    }
    let mut r = CaptureReader::new(&file[..]).expect("own header reads");
    for (i, f) in frames.iter().enumerate() {
        let p = r
            .next_packet()
            .expect("own block reads")
            .expect("one per frame");
        assert_eq!(
            (p.iface, p.ts_ns, p.flags),
            (0, i as u64 * 1_000, pcapng::FLAG_INBOUND)
        );
        assert_eq!(&p.data[..], *f);
    }
    assert!(r.next_packet().expect("clean end").is_none());
});
