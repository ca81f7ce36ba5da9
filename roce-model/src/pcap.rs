//! Test support (feature `testdata`): the golden captures, read through
//! [`wire::capture`], and ERF record decoding, for tests that replay the real-hardware frames in this
//! crate's `testdata/` directory. It is shared by this crate's and `wire-checker`'s
//! test suites.
//!
//! Unlike the codec, these helpers panic on malformed files: they read
//! trusted golden captures and a panic is the test failure.

use std::path::PathBuf;
use wire::capture::CaptureReader;

/// Link type of Ethernet.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Link type of Endace ERF records.
pub const LINKTYPE_ERF: u32 = 197;
/// ERF record type for InfiniBand.
pub const ERF_TYPE_INFINIBAND: u8 = 21;

/// Read one file of the golden captures in this crate's `testdata/`
/// (`$ROCE_TESTDATA` overrides the directory); panics when it cannot be read.
pub fn testdata(name: &str) -> Vec<u8> {
    let dir = std::env::var_os("ROCE_TESTDATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata"));
    let p = dir.join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

/// A classic pcap file: link type and records (captured bytes).
pub struct Pcap {
    /// Link type from the file header (`LINKTYPE_*`).
    pub linktype: u32,
    /// Captured bytes of each record, in file order.
    pub records: Vec<Vec<u8>>,
}

/// Read a capture (classic pcap or pcapng, through [`wire::capture`]) whose
/// frames all share the first interface's link type.
pub fn read_pcap(data: &[u8]) -> Pcap {
    let mut r = CaptureReader::new(data).unwrap_or_else(|e| panic!("bad capture: {e}"));
    let linktype = r
        .interfaces()
        .first()
        .map(|i| u32::from(i.linktype))
        .unwrap_or_else(|| panic!("capture without an interface"));
    let mut records = Vec::new();
    while let Some(p) = r
        .next_packet()
        .unwrap_or_else(|e| panic!("bad capture: {e}"))
    {
        records.push(p.data);
    }
    Pcap { linktype, records }
}

/// One ERF record: type, and the payload (after extension headers), cut to `wlen`.
pub struct Erf<'a> {
    /// Record type without the extension-header bit (e.g. [`ERF_TYPE_INFINIBAND`]).
    pub rtype: u8,
    /// ERF flags byte.
    pub flags: u8,
    /// Wire length from the record header.
    pub wlen: usize,
    /// Record body after extension headers, cut to `wlen`.
    pub payload: &'a [u8],
}

/// Decode an ERF record header (16 bytes, extension headers when type bit 7 is set).
pub fn parse_erf(rec: &[u8]) -> Erf<'_> {
    assert!(rec.len() >= 16, "short ERF record");
    let rtype = rec[8];
    let flags = rec[9];
    let wlen = usize::from(u16::from_be_bytes([rec[14], rec[15]]));
    let mut off = 16;
    let mut more = rtype & 0x80 != 0;
    while more {
        more = rec[off] & 0x80 != 0;
        off += 8;
    }
    let body = &rec[off..];
    let payload = &body[..wlen.min(body.len())];
    Erf {
        rtype: rtype & 0x7f,
        flags,
        wlen,
        payload,
    }
}
