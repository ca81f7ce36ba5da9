//! Test support (feature `testdata`): a tiny classic-pcap reader with ERF
//! record decoding, for tests that replay the real-hardware frames in this
//! crate's `testdata/` directory. It is shared by this crate's and `wire-checker`'s
//! test suites.
//!
//! Unlike the codec, these helpers panic on malformed files: they read
//! trusted golden captures and a panic is the test failure.

use std::path::PathBuf;

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

/// Parse a classic pcap (either byte order, µs or ns timestamps).
pub fn read_pcap(data: &[u8]) -> Pcap {
    assert!(data.len() >= 24, "short pcap header");
    let magic = u32::from_le_bytes(data[0..4].try_into().unwrap());
    let le = match magic {
        0xa1b2_c3d4 | 0xa1b2_3c4d => true,
        0xd4c3_b2a1 | 0x4d3c_b2a1 => false,
        m => panic!("not a classic pcap: magic {m:#x}"),
    };
    let rd = |b: &[u8]| {
        let a: [u8; 4] = b.try_into().unwrap();
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let linktype = rd(&data[20..24]) & 0x0fff_ffff;
    let mut records = Vec::new();
    let mut off = 24;
    while off + 16 <= data.len() {
        let incl = rd(&data[off + 8..off + 12]) as usize;
        off += 16;
        assert!(off + incl <= data.len(), "truncated pcap record");
        records.push(data[off..off + incl].to_vec());
        off += incl;
    }
    assert_eq!(off, data.len(), "trailing bytes in pcap");
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
